//! Whose is a container's cgroup? Decided once, before its `runc create`, from what exists
//! then — never from the cgroup's name.
//!
//! `delete` after a crash kills every process in a container's cgroups (v2 `cgroup.kill`, or
//! freeze and SIGKILL the subtree) and removes the directories, when `runc delete --force` has
//! not. That is only right for cgroups the container's runc made. A spec may name a cgroup
//! that exists and is shared (a containerd API client creating task `system.slice` with
//! cgroupsPath `/system.slice`, or `kubepods.slice`, or `3` for a `session-3.scope`): runc joins
//! it, and a rule by name ("the last component is the container's ID") took it for the
//! container's own — `delete` then killed containerd, sshd and everything else in it.
//!
//! runc itself kills only the container's processes (its init, whose PID namespace ends with
//! it; `delete --force`) and removes only paths it created. So: before `runc create` the shim
//! records which of the container's cgroup directories already exist ([`survey`]), in its
//! task record and its pod's record, and `delete` treats a container's cgroups as its own
//! ([`CgroupsAtCreate::made_by_runc`]) only when none did. Anything else — a directory that
//! existed, a path that cannot be resolved, a record of an older shim that did not survey —
//! gets `runc delete --force` and nothing more.

use std::path::{Component, Path, PathBuf};

/// What the container's cgroup directories were just before its `runc create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupsAtCreate {
    /// The directories that existed already, in any hierarchy, with what they held.
    #[serde(default)]
    pub existed: Vec<ExistingCgroup>,
    /// The cgroupsPath could not be turned into directories (none given, `..`, a systemd
    /// form runc would refuse): nothing is known, so nothing is the container's own.
    #[serde(default)]
    pub unresolved: bool,
}

/// A cgroup directory that existed before the container's `runc create`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExistingCgroup {
    pub dir: PathBuf,
    /// It held processes or child cgroups then (for the report: a shared cgroup in use).
    pub populated: bool,
}

impl CgroupsAtCreate {
    /// Whether runc made every directory of the container's cgroups: only then are they the
    /// container's own, to kill in and remove.
    pub fn made_by_runc(&self) -> bool {
        !self.unresolved && self.existed.is_empty()
    }

    /// Why the container's cgroups are not its own, for `delete`'s report.
    pub fn why_not_own(&self) -> String {
        if self.unresolved {
            return "its cgroupsPath named no directory the shim could check before runc create"
                .into();
        }
        let dirs: Vec<String> = self
            .existed
            .iter()
            .map(|e| {
                let held = if e.populated {
                    " (holding processes or cgroups)"
                } else {
                    ""
                };
                format!("{}{held}", e.dir.display())
            })
            .collect();
        format!("its cgroup existed before runc create: {}", dirs.join(", "))
    }
}

/// Records which directories of `cgroups_path` (a spec's `linux.cgroupsPath`) exist under the
/// hierarchy mount points `roots`, before `runc create`.
pub fn survey(cgroups_path: Option<&str>, roots: &[PathBuf]) -> CgroupsAtCreate {
    let Some(dirs) = cgroups_path.and_then(|p| dirs_of(p, roots)) else {
        return CgroupsAtCreate {
            unresolved: true,
            ..Default::default()
        };
    };
    let existed = dirs
        .into_iter()
        .filter(|d| d.is_dir())
        .map(|dir| ExistingCgroup {
            populated: populated(&dir),
            dir,
        })
        .collect();
    CgroupsAtCreate {
        existed,
        unresolved: false,
    }
}

/// The directories `cgroups_path` names under each of `roots`, as runc resolves it:
/// cgroupfs `/a/b` (or `a/b`) is `<root>/a/b`; systemd's `slice:prefix:name` is the expanded
/// slice with `<prefix>-<name>.scope` below it (`name` itself when it is a `.slice`; an empty
/// slice is `system.slice`, runc's default). `None` for a path that names no directory below
/// the roots (empty, `/`, through `..`) or a slice runc would refuse.
pub fn dirs_of(cgroups_path: &str, roots: &[PathBuf]) -> Option<Vec<PathBuf>> {
    let rel = if crate::host::systemd::names::is_systemd_cgroups_path(cgroups_path) {
        let mut parts = cgroups_path.splitn(3, ':');
        let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
        let slice = if slice.is_empty() {
            "system.slice"
        } else {
            slice
        };
        let unit = if name.ends_with(".slice") {
            name.to_string()
        } else {
            format!("{prefix}-{name}.scope")
        };
        if unit.contains('/') {
            return None;
        }
        crate::host::systemd::names::expand_slice(slice)
            .ok()?
            .join(unit)
    } else {
        PathBuf::from(cgroups_path)
    };
    let rel = rel.strip_prefix("/").unwrap_or(&rel).to_path_buf();
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(roots.iter().map(|r| r.join(&rel)).collect())
}

/// Whether cgroup directory `dir` holds a process or a child cgroup.
fn populated(dir: &Path) -> bool {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    procs
        || std::fs::read_dir(dir)
            .map(|rd| rd.flatten().any(|e| e.path().is_dir()))
            .unwrap_or(false)
}

/// Every cgroup hierarchy's mount point (each v1 controller and the unified one): runc makes
/// a container's directory in each it joins, the unified one of a hybrid host included.
pub fn all_hierarchies() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    crate::host::cgroups::cgroup_mounts(&mountinfo)
        .into_iter()
        .map(|m| m.mountpoint)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> Vec<PathBuf> {
        vec![
            PathBuf::from("/sys/fs/cgroup/memory"),
            PathBuf::from("/sys/fs/cgroup/unified"),
        ]
    }

    #[test]
    fn cgroupfs_and_systemd_paths_resolve_as_runc_resolves_them() {
        assert_eq!(
            dirs_of("/k8s.io/c1", &roots()).unwrap(),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/k8s.io/c1"),
                PathBuf::from("/sys/fs/cgroup/unified/k8s.io/c1")
            ]
        );
        assert_eq!(
            dirs_of("system.slice", &roots()).unwrap()[0],
            PathBuf::from("/sys/fs/cgroup/memory/system.slice")
        );
        assert_eq!(
            dirs_of("kubepods-besteffort-pod1.slice:cri-containerd:c1", &roots()).unwrap()[0],
            PathBuf::from(
                "/sys/fs/cgroup/memory/kubepods.slice/kubepods-besteffort.slice/\
                 kubepods-besteffort-pod1.slice/cri-containerd-c1.scope"
            )
        );
        assert_eq!(
            dirs_of(":runc:c1", &roots()).unwrap()[0],
            PathBuf::from("/sys/fs/cgroup/memory/system.slice/runc-c1.scope")
        );
        assert_eq!(
            dirs_of("system.slice:x:user.slice", &roots()).unwrap()[0],
            PathBuf::from("/sys/fs/cgroup/memory/system.slice/user.slice")
        );
        for bad in [
            "",
            "/",
            "/k8s.io/../../etc",
            "a--b.slice:p:c",
            "s.slice:p:a/b",
        ] {
            assert_eq!(dirs_of(bad, &roots()), None, "{bad:?}");
        }
    }

    /// The shared-cgroup shapes of issue 33: a cgroup that exists (in use or not) is not the
    /// container's own whatever its name; one that does not exist yet will be runc's.
    #[test]
    fn only_a_cgroup_that_did_not_exist_before_create_is_the_container_s() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = vec![tmp.path().join("memory"), tmp.path().join("pids")];
        for r in &roots {
            std::fs::create_dir_all(r.join("system.slice/sshd.service")).unwrap();
            std::fs::write(r.join("system.slice/cgroup.procs"), "").unwrap();
            std::fs::create_dir_all(r.join("idle")).unwrap();
            std::fs::write(r.join("idle/cgroup.procs"), "\n").unwrap();
            std::fs::create_dir_all(r.join("busy")).unwrap();
            std::fs::write(r.join("busy/cgroup.procs"), "42\n").unwrap();
        }
        let fresh = survey(Some("/default/c1"), &roots);
        assert!(fresh.made_by_runc(), "{fresh:?}");

        let shared = survey(Some("/system.slice"), &roots);
        assert!(!shared.made_by_runc());
        assert_eq!(shared.existed.len(), 2);
        assert!(shared.existed.iter().all(|e| e.populated), "{shared:?}");
        let why = shared.why_not_own();
        assert!(why.contains("existed before runc create"), "{why}");
        assert!(why.contains("system.slice (holding processes"), "{why}");

        let busy = survey(Some("busy"), &roots);
        assert!(busy.existed.iter().all(|e| e.populated), "{busy:?}");
        // Even an empty one: runc did not make it, so its removal is not ours.
        let idle = survey(Some("/idle"), &roots);
        assert!(!idle.made_by_runc());
        assert!(idle.existed.iter().all(|e| !e.populated), "{idle:?}");

        for unknown in [None, Some("/k8s.io/../system.slice"), Some("/")] {
            let s = survey(unknown, &roots);
            assert!(s.unresolved && !s.made_by_runc(), "{unknown:?}");
            assert!(s.why_not_own().contains("no directory"), "{unknown:?}");
        }
    }

    #[test]
    fn the_record_round_trips() {
        let s = CgroupsAtCreate {
            existed: vec![ExistingCgroup {
                dir: "/sys/fs/cgroup/memory/system.slice".into(),
                populated: true,
            }],
            unresolved: false,
        };
        let back: CgroupsAtCreate =
            serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
