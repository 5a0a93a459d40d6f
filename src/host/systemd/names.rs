//! systemd's names for cgroups: slice expansion, the `slice:prefix:name` cgroupsPath form,
//! and the pod's scope name.

use std::path::PathBuf;

/// The cgroup directory of slice unit `slice`, relative to the cgroup root, as systemd lays
/// it out and runc's `ExpandSlice` computes it: `a-b-c.slice` is
/// `/a.slice/a-b.slice/a-b-c.slice`, `-.slice` is the root. Refused as runc refuses: no
/// `.slice` suffix, a `/`, or an empty dash-separated part (`a--b.slice`, `-a.slice`).
pub fn expand_slice(slice: &str) -> Result<PathBuf, String> {
    const SUFFIX: &str = ".slice";
    let invalid = || Err(format!("invalid slice name: {slice:?}"));
    let Some(name) = slice.strip_suffix(SUFFIX) else {
        return invalid();
    };
    if slice.contains('/') {
        return invalid();
    }
    if name == "-" {
        return Ok(PathBuf::from("/"));
    }
    let mut path = PathBuf::from("/");
    let mut prefix = String::new();
    for part in name.split('-') {
        if part.is_empty() {
            return invalid();
        }
        path.push(format!("{prefix}{part}{SUFFIX}"));
        prefix.push_str(part);
        prefix.push('-');
    }
    Ok(path)
}

/// Whether an OCI `linux.cgroupsPath` has systemd's `slice:prefix:name` form (what
/// containerd's CRI writes when the pod's cgroup_parent is a `.slice`), which runc reads only
/// with `--systemd-cgroup`. A cgroupfs path never has it: it is absolute, or a relative path
/// without two colons.
pub fn is_systemd_cgroups_path(path: &str) -> bool {
    !path.starts_with('/') && path.split(':').count() == 3
}

/// The transient scope of sandbox `id`'s pause process: the name containerd's CRI gives the
/// runc path's pause container (`cri-containerd:<id>` under the pod slice, so runc names it
/// `cri-containerd-<id>.scope`).
pub fn pod_scope_name(id: &str) -> String {
    format!("cri-containerd-{id}.scope")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_expand_as_systemd_lays_them_out() {
        for (slice, path) in [
            ("-.slice", "/"),
            ("system.slice", "/system.slice"),
            (
                "kubepods-besteffort-pod1a2b.slice",
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice",
            ),
            (
                "kubepods-burstable-pod5f2a_b1c3.slice",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f2a_b1c3.slice",
            ),
        ] {
            assert_eq!(expand_slice(slice).unwrap(), PathBuf::from(path), "{slice}");
        }
    }

    #[test]
    fn malformed_slices_are_refused_as_runc_refuses_them() {
        for bad in [
            "",
            ".slice",
            "a",
            "a.scope",
            "a/b.slice",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "/a.slice",
        ] {
            let e = expand_slice(bad).unwrap_err();
            assert!(e.contains("invalid slice name"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_systemd_cgroups_path_form_is_told_from_cgroupfs_paths() {
        assert!(is_systemd_cgroups_path(
            "kubepods-besteffort-pod1.slice:cri-containerd:c1"
        ));
        assert!(is_systemd_cgroups_path(":cri-containerd:c1"));
        assert!(is_systemd_cgroups_path("system.slice:docker:abc"));
        assert!(!is_systemd_cgroups_path("/kubepods/besteffort/pod1/c1"));
        assert!(!is_systemd_cgroups_path("/a:b:c"));
        assert!(!is_systemd_cgroups_path("kubepods/c1"));
        assert!(!is_systemd_cgroups_path("a:b"));
        assert!(!is_systemd_cgroups_path(""));
    }

    #[test]
    fn the_pod_scope_is_named_as_containerd_names_the_pause_containers() {
        assert_eq!(pod_scope_name("ab12"), "cri-containerd-ab12.scope");
    }
}
