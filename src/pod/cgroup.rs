//! The pause process's cgroup and the pod cgroup (`linux.cgroup_parent`) above it.
//!
//! containerd's runc path runs the pause container in `<cgroup_parent>/<sandbox id>` (the
//! cgroupsPath CRI gives it) and each container in `<cgroup_parent>/<container id>`; the pod
//! cgroup itself holds no process. We do the same with the cgroupfs driver: the pause process
//! goes into the leaf `<cgroup_parent>/<sandbox id>`, in every v1 hierarchy or in the unified
//! tree (v2). On v2 that is required, not only parity: a cgroup with processes cannot have
//! children with domain controllers ("no internal processes"), so a pause process in the pod
//! cgroup would keep every container from starting. As runc does (`fs2.CreateCgroupPath`), the
//! controllers a cgroup offers are enabled in the `cgroup.subtree_control` of every ancestor of
//! the leaf, so the pod cgroup and the containers beside the pause get memory, cpu, pids, ...
//! We create what is missing. On teardown we remove the pause's own cgroup (the leaf, where we
//! made it) and nothing above it: a pod cgroup or other parent made for want of one is shared
//! with the kubelet and every other pod under it, as runc's fs manager leaves the parents its
//! `mkdir -p` made (its `Destroy` removes only the container's own paths). subtree_control is
//! left as it is, as runc leaves it.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use crate::records::error::{Context, Error, Result};

/// Directories of the pause process's cgroup and which of them we created.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodCgroup {
    /// The pause process's cgroup directory (`<cgroup_parent>/<sandbox id>`) in each hierarchy.
    pub dirs: Vec<PathBuf>,
    /// Directories this shim created, deepest last. Only those that are the pause's own
    /// cgroup are ever removed ([`remove`]).
    pub created: Vec<PathBuf>,
    /// The pod cgroup (`cgroup_parent`, absolute in the cgroup namespace: `/kubepods/pod1`),
    /// whose statistics are the pod's; none when the pod has no cgroup_parent.
    #[serde(default)]
    pub pod: Option<PathBuf>,
    /// The systemd scope the pause process was put in (systemd cgroup driver: a `.slice`
    /// cgroup_parent, see [`crate::host::systemd::scope`]); stopped on teardown and by `delete`.
    #[serde(default)]
    pub scope: Option<crate::host::systemd::scope::PodScope>,
}

/// Mount points of the cgroup hierarchies to use: the unified one on v2-only hosts, else
/// every v1 hierarchy.
pub fn hierarchies(mountinfo: &str, unified: bool) -> Vec<PathBuf> {
    crate::host::cgroups::cgroup_mounts(mountinfo)
        .into_iter()
        .filter(|m| m.unified == unified)
        .map(|m| m.mountpoint)
        .collect()
}

/// The pause process's cgroup for pod cgroup `parent` and sandbox `id`: `<parent>/<id>`, as
/// containerd's CRI names the runc path's pause container cgroup.
pub fn pause_cgroup(parent: &Path, id: &str) -> PathBuf {
    parent.join(id)
}

/// Creates `cgroup` (the pause's cgroup, a cgroupfs path such as `/kubepods/pod1/<id>`) in
/// every hierarchy of `roots` and moves `pid` into it; its parent is recorded as the pod
/// cgroup. `unified`: the roots are cgroup2, so controllers are enabled down the path first.
/// On failure, what was created is removed again.
pub fn join(roots: &[PathBuf], unified: bool, cgroup: &Path, pid: i32) -> Result<PodCgroup> {
    let rel = relative(cgroup)?;
    let pod = Path::new("/").join(rel.parent().unwrap_or(Path::new("")));
    let mut cg = PodCgroup {
        pod: (pod != Path::new("/")).then_some(pod),
        ..Default::default()
    };
    // The hierarchies `pid` was moved into so far.
    let mut joined: Vec<&PathBuf> = Vec::new();
    let r = (|| -> Result<()> {
        for root in roots {
            let dir = root.join(rel);
            let mut missing = Vec::new();
            let mut d = dir.as_path();
            while d != root.as_path() && !d.exists() {
                missing.push(d.to_path_buf());
                d = match d.parent() {
                    Some(p) => p,
                    None => break,
                };
            }
            for m in missing.iter().rev() {
                std::fs::create_dir(m).with_context(|| format!("create cgroup {}", m.display()))?;
                cg.created.push(m.clone());
            }
            if !unified {
                // Every level, ours or not, top down: runc's cpusetEnsureParent.
                let mut level = root.clone();
                for part in rel.components() {
                    level.push(part);
                    inherit_cpuset(&level);
                }
            }
            if unified {
                enable_controllers(root, rel)?;
            }
            set_sandbox_cpu_share(&dir);
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("move pause into cgroup {}", dir.display()))?;
            joined.push(root);
            cg.dirs.push(dir);
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(cg),
        Err(e) => {
            // A cgroup with a process in it cannot be removed (EBUSY): move the pid out of the
            // hierarchies it already joined (to their root) before removing what we made.
            for root in joined {
                if let Err(m) = std::fs::write(root.join("cgroup.procs"), pid.to_string()) {
                    log::warn!(
                        "undo pod cgroup: move {pid} back to {}: {m}",
                        root.display()
                    );
                }
            }
            let leaf = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            for left in remove(&cg, leaf) {
                log::warn!("undo pod cgroup: {left}");
            }
            Err(e)
        }
    }
}

/// The CPU share containerd gives the runc path's pause container (`WithDefaultSandboxShares`:
/// `cpu.shares` 2), as runc writes it: `cpu.shares` 2 in a v1 cpu hierarchy, `cpu.weight` 1
/// (runc's conversion of 2 shares) on v2. Where the controller is not there (not enabled, not
/// mounted), nothing: runc's fs drivers skip an absent controller the same way.
fn set_sandbox_cpu_share(dir: &Path) {
    for (file, value) in [
        ("cpu.shares", SANDBOX_CPU_SHARES),
        ("cpu.weight", SANDBOX_CPU_WEIGHT),
    ] {
        let f = dir.join(file);
        if f.exists()
            && let Err(e) = std::fs::write(&f, value)
        {
            log::warn!("pause cgroup: write {value} to {}: {e}", f.display());
        }
    }
}

/// `cpu.shares` of the pause's cgroup on v1 (containerd's `DefaultSandboxCPUshares`).
pub const SANDBOX_CPU_SHARES: &str = "2";
/// `cpu.weight` of the pause's cgroup on v2: runc's `ConvertCPUSharesToCgroupV2Value(2)`.
pub const SANDBOX_CPU_WEIGHT: &str = "1";

/// `cgroup` without its leading `/`; only plain components and at least one of them.
fn relative(cgroup: &Path) -> Result<&Path> {
    let rel = cgroup.strip_prefix("/").unwrap_or(cgroup);
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Error::invalid(format!(
            "cgroup {} must be a path below the cgroup root without '.' or '..' parts",
            cgroup.display()
        )));
    }
    Ok(rel)
}

/// cgroup v2: in every cgroup from `root` down to the parent of `root/rel`, enables the
/// controllers that cgroup offers (`cgroup.controllers`) in its `cgroup.subtree_control`, as
/// runc's `fs2.CreateCgroupPath` does, so that the leaf and its siblings get them too.
fn enable_controllers(root: &Path, rel: &Path) -> Result<()> {
    let mut dir = root.to_path_buf();
    enable_in(&dir)?;
    for part in rel.parent().into_iter().flat_map(Path::components) {
        dir.push(part);
        enable_in(&dir)?;
    }
    Ok(())
}

/// Enables in `dir`'s subtree_control what `dir` offers and has not enabled yet. Each one is
/// written alone: a controller the kernel refuses there (e.g. one that needs a threaded
/// subtree) is skipped with a warning rather than failing the pod, as runc skips unavailable
/// ones; a refusal of every one (a cgroup that holds processes: EBUSY) is an error.
fn enable_in(dir: &Path) -> Result<()> {
    let offered = read_words(&dir.join("cgroup.controllers"));
    let enabled = read_words(&dir.join("cgroup.subtree_control"));
    let wanted: Vec<&String> = offered.iter().filter(|c| !enabled.contains(c)).collect();
    let mut refused = Vec::new();
    for c in &wanted {
        // O_APPEND: the same as a plain write on cgroupfs (`echo +memory >> ...`); on the
        // plain files of the unit tests every write stays visible.
        let r = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("cgroup.subtree_control"))
            .and_then(|mut f| f.write_all(format!("+{c}").as_bytes()));
        if let Err(e) = r {
            refused.push(format!("{c}: {e}"));
        }
    }
    if !wanted.is_empty() && refused.len() == wanted.len() {
        return Err(
            Error::from(std::io::Error::other(refused.join(", "))).context(format!(
                "enable controllers in {}/cgroup.subtree_control",
                dir.display()
            )),
        );
    }
    if !refused.is_empty() {
        log::warn!(
            "{}/cgroup.subtree_control: not enabled: {}",
            dir.display(),
            refused.join(", ")
        );
    }
    Ok(())
}

fn read_words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// A v1 cpuset cgroup with no CPUs or no memory nodes (a new one starts so; one made by
/// someone else may have been left so) takes no process (ENOSPC): an empty `cpuset.cpus` or
/// `cpuset.mems` gets the parent's, as runc's `cpusetCopyIfNeeded` does for every level of
/// the path (`cpusetEnsureParent`, top down) and the leaf. Set ones are left as they are.
fn inherit_cpuset(dir: &Path) {
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(f);
        if !own.exists() {
            continue;
        }
        if std::fs::read_to_string(&own)
            .map(|s| s.trim().is_empty())
            .unwrap_or(false)
            && let Some(parent) = dir.parent()
            && let Ok(v) = std::fs::read_to_string(parent.join(f))
        {
            let _ = std::fs::write(&own, v.trim());
        }
    }
}

/// Removes the cgroups of pod `id`'s pause that we created, deepest first: only those that are
/// its own by [`crate::host::cgroups::is_own_cgroup`] (`<cgroup_parent>/<id>`, or the scope's
/// `cri-containerd-<id>.scope` in the v1 hierarchies systemd does not manage), never a pod
/// cgroup or another parent `join` had to make (records written before this rule list those
/// too). Busy ones (processes still inside) are reported.
pub fn remove(cg: &PodCgroup, id: &str) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut created: Vec<&PathBuf> = cg
        .created
        .iter()
        .filter(|d| crate::host::cgroups::is_own_cgroup(d, id))
        .collect();
    created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in created {
        match std::fs::remove_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(Error::from(e).context(format!("remove cgroup {}", d.display()))),
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hierarchies_pick_v1_or_v2_mounts() {
        let mi = "\
26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
28 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
30 25 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 1 8:1 / / rw - ext4 /dev/vda rw";
        assert_eq!(
            hierarchies(mi, false),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/pids")
            ]
        );
        assert_eq!(
            hierarchies(mi, true),
            vec![PathBuf::from("/sys/fs/cgroup/unified")]
        );
    }

    /// A join that fails in its second hierarchy leaves no pause cgroup in the first, where the
    /// process had already been moved (a real cgroup hierarchy: rmdir is EBUSY while it is in).
    #[test]
    #[ignore = "needs root"]
    fn a_partial_join_removes_every_directory_it_made() {
        let unified = crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let real = hierarchies(&mountinfo, unified)
            .into_iter()
            .next()
            .expect("a cgroup hierarchy");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let top = format!("rsandbox-partial-join-{pid}");
        // The second "hierarchy" refuses the move: its cgroup.procs is a directory.
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(other.path().join(&top).join("pod/sb/cgroup.procs")).unwrap();
        let r = join(
            &[real.clone(), other.path().to_path_buf()],
            unified,
            &Path::new("/").join(&top).join("pod/sb"),
            pid,
        );
        let left = real.join(&top).join("pod/sb").exists();
        let parents = real.join(&top).join("pod").is_dir();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir(real.join(&top).join("pod/sb"));
        let _ = std::fs::remove_dir(real.join(&top).join("pod"));
        let _ = std::fs::remove_dir(real.join(&top));
        assert!(r.is_err());
        assert!(
            !left,
            "{} was left behind",
            real.join(&top).join("pod/sb").display()
        );
        // The parents it had to make are not the pod's own (see `remove`): they stay.
        assert!(parents);
    }

    #[test]
    fn pause_cgroup_is_a_child_of_the_pod_cgroup() {
        assert_eq!(
            pause_cgroup(Path::new("/kubepods/besteffort/pod1"), "sb1"),
            PathBuf::from("/kubepods/besteffort/pod1/sb1")
        );
    }

    #[test]
    fn join_creates_only_missing_dirs_and_remove_takes_only_those() {
        // A plain directory stands in for a hierarchy root: cgroup.procs is then a file.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("kubepods")).unwrap();
        let cg = join(
            &[root.path().to_path_buf()],
            false,
            Path::new("/kubepods/pod1/sb1"),
            42,
        )
        .unwrap();
        assert_eq!(
            cg.created,
            vec![
                root.path().join("kubepods/pod1"),
                root.path().join("kubepods/pod1/sb1")
            ]
        );
        assert_eq!(cg.dirs, vec![root.path().join("kubepods/pod1/sb1")]);
        assert_eq!(cg.pod, Some(PathBuf::from("/kubepods/pod1")));
        // The process is in the leaf; the pod cgroup holds none.
        assert_eq!(
            std::fs::read_to_string(root.path().join("kubepods/pod1/sb1/cgroup.procs")).unwrap(),
            "42"
        );
        assert!(!root.path().join("kubepods/pod1/cgroup.procs").exists());
        // rmdir fails on the non-empty stand-in; a real cgroupfs directory has no files to delete.
        std::fs::remove_file(root.path().join("kubepods/pod1/sb1/cgroup.procs")).unwrap();
        assert!(remove(&cg, "sb1").is_empty());
        // The pause's own cgroup goes; the pod cgroup join had to make stays (issue 27 item
        // 11: it is the kubelet's and every other pod's parent), as do the parents above it.
        assert!(!root.path().join("kubepods/pod1/sb1").exists());
        assert!(root.path().join("kubepods/pod1").is_dir());
        assert!(root.path().join("kubepods").is_dir());
    }

    #[test]
    fn join_into_an_existing_pod_cgroup_creates_and_removes_only_the_leaf() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("kubepods/pod1")).unwrap();
        let cg = join(
            &[root.path().to_path_buf()],
            false,
            Path::new("/kubepods/pod1/sb1"),
            7,
        )
        .unwrap();
        assert_eq!(cg.created, vec![root.path().join("kubepods/pod1/sb1")]);
        std::fs::remove_file(root.path().join("kubepods/pod1/sb1/cgroup.procs")).unwrap();
        assert!(remove(&cg, "sb1").is_empty());
        assert!(root.path().join("kubepods/pod1").is_dir());
        assert!(!root.path().join("kubepods/pod1/sb1").exists());
    }

    /// A cpuset hierarchy whose pod cgroup exists with empty cpus and mems (not ours): every
    /// level gets its parent's, top down, as runc's cpusetEnsureParent does; a set one keeps
    /// its own. (Without it the kernel refuses the pause: ENOSPC.)
    #[test]
    fn empty_cpusets_on_the_way_get_their_parent_s_as_runc_copies_them() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let level = |rel: &str, cpus: &str, mems: &str| {
            let d = r.join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpuset.cpus"), cpus).unwrap();
            std::fs::write(d.join("cpuset.mems"), mems).unwrap();
        };
        level("", "0-3\n", "0\n");
        level("kubepods.slice", "0-2\n", "0\n");
        level("kubepods.slice/kubepods-pod1.slice", "", "\n");
        level(
            "kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope",
            "",
            "",
        );
        join(
            &[r.to_path_buf()],
            false,
            Path::new("/kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope"),
            7,
        )
        .unwrap();
        let read = |rel: &str, f: &str| std::fs::read_to_string(r.join(rel).join(f)).unwrap();
        assert_eq!(read("kubepods.slice", "cpuset.cpus"), "0-2\n", "set: kept");
        for rel in [
            "kubepods.slice/kubepods-pod1.slice",
            "kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope",
        ] {
            assert_eq!(read(rel, "cpuset.cpus"), "0-2", "{rel}");
            assert_eq!(read(rel, "cpuset.mems"), "0", "{rel}");
        }
    }

    /// The same in the real cpuset hierarchy (v1 hosts only): a pod cgroup someone made and
    /// left empty (mkdir alone gives no CPUs there) takes the pause after the copy; without it
    /// the kernel refuses the move with ENOSPC.
    #[test]
    #[ignore = "needs root and a v1 cpuset hierarchy"]
    fn a_real_empty_cpuset_pod_cgroup_takes_the_pause() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let Some(cpuset) = crate::host::cgroups::cgroup_mounts(&mountinfo)
            .into_iter()
            .find(|m| m.controllers.iter().any(|c| c == "cpuset"))
            .map(|m| m.mountpoint)
        else {
            crate::testutil::skip("v1-cpuset", "no v1 cpuset hierarchy");
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let top = format!("rsandbox-empty-cpuset-{pid}");
        std::fs::create_dir_all(cpuset.join(&top).join("pod")).unwrap();
        let empty = std::fs::read_to_string(cpuset.join(&top).join("pod/cpuset.cpus")).unwrap();
        let r = join(
            std::slice::from_ref(&cpuset),
            false,
            &Path::new("/").join(&top).join("pod/sb"),
            pid,
        );
        let procs = std::fs::read_to_string(cpuset.join(&top).join("pod/sb/cgroup.procs"));
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir(cpuset.join(&top).join("pod/sb"));
        let _ = std::fs::remove_dir(cpuset.join(&top).join("pod"));
        let _ = std::fs::remove_dir(cpuset.join(&top));
        assert_eq!(
            empty.trim(),
            "",
            "mkdir gave CPUs: the test proves nothing here"
        );
        r.unwrap();
        assert_eq!(procs.unwrap().trim(), pid.to_string());
    }

    /// Issue 27 item 11: at pod teardown in a Kubernetes run (cgroupfs driver, v1 hybrid) the
    /// shim tried to remove `kubepods` parents it had made in the `devices` and unified
    /// hierarchies (a record lists every directory `join` made) and got EBUSY while other pods
    /// lived there. Only the pause's own cgroup (`<parent>/<id>`, or the systemd scope's
    /// `cri-containerd-<id>.scope` in a v1 hierarchy systemd does not manage) is removed; a
    /// record written before this rule, listing parents, loses none of them.
    #[test]
    fn teardown_removes_the_pause_s_own_cgroups_and_never_a_parent() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let dirs = [
            "devices/kubepods",
            "devices/kubepods/besteffort",
            "devices/kubepods/besteffort/pod1",
            "devices/kubepods/besteffort/pod1/sb1",
            "unified/kubepods",
            "unified/kubepods/besteffort",
            "unified/kubepods/besteffort/pod1",
            "cpuset/kubepods.slice",
            "cpuset/kubepods.slice/kubepods-pod1.slice",
            "cpuset/kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope",
        ];
        for d in dirs {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        // Another pod's cgroup under the same parents.
        std::fs::create_dir_all(r.join("devices/kubepods/besteffort/pod2/sb2")).unwrap();
        let cg = PodCgroup {
            dirs: vec![r.join("devices/kubepods/besteffort/pod1/sb1")],
            created: dirs.iter().map(|d| r.join(d)).collect(),
            ..Default::default()
        };
        assert!(remove(&cg, "sb1").is_empty());
        for (d, gone) in [
            ("devices/kubepods/besteffort/pod1/sb1", true),
            (
                "cpuset/kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope",
                true,
            ),
            ("devices/kubepods/besteffort/pod1", false),
            ("devices/kubepods", false),
            ("unified/kubepods/besteffort/pod1", false),
            ("unified/kubepods", false),
            ("cpuset/kubepods.slice/kubepods-pod1.slice", false),
            ("devices/kubepods/besteffort/pod2/sb2", false),
        ] {
            assert_eq!(!r.join(d).exists(), gone, "{d}");
        }
    }

    /// The pause's cgroup gets the CPU share containerd gives the runc path's pause container,
    /// as runc writes it (v1 `cpu.shares` 2, v2 `cpu.weight` 1), where the controller is.
    #[test]
    fn the_pause_cgroup_gets_the_sandbox_cpu_share() {
        let root = tempfile::tempdir().unwrap();
        let (v1, v2, none) = (
            root.path().join("cpu"),
            root.path().join("unified"),
            root.path().join("pids"),
        );
        std::fs::create_dir_all(v1.join("pod1/sb1")).unwrap();
        std::fs::write(v1.join("pod1/sb1/cpu.shares"), "1024").unwrap();
        std::fs::create_dir_all(v2.join("pod1/sb1")).unwrap();
        std::fs::write(v2.join("pod1/sb1/cpu.weight"), "100").unwrap();
        std::fs::create_dir_all(none.join("pod1/sb1")).unwrap();
        join(
            &[v1.clone(), v2.clone(), none.clone()],
            false,
            Path::new("/pod1/sb1"),
            7,
        )
        .unwrap();
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(v1.join("pod1/sb1/cpu.shares")), SANDBOX_CPU_SHARES);
        assert_eq!(read(v2.join("pod1/sb1/cpu.weight")), SANDBOX_CPU_WEIGHT);
        assert!(!none.join("pod1/sb1/cpu.shares").exists());
        assert!(!none.join("pod1/sb1/cpu.weight").exists());
    }

    /// A stand-in cgroup2 directory: what it offers and what it has enabled.
    fn fake_v2(dir: &Path, offered: &str, enabled: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), offered).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), enabled).unwrap();
    }

    #[test]
    fn v2_enables_offered_controllers_in_every_ancestor_but_not_in_the_leaf() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fake_v2(r, "cpu memory pids\n", "cpu\n");
        fake_v2(&r.join("kubepods"), "cpu memory pids\n", "");
        fake_v2(&r.join("kubepods/pod1"), "cpu memory\n", "");
        fake_v2(&r.join("kubepods/pod1/sb1"), "cpu memory\n", "");
        join(&[r.to_path_buf()], true, Path::new("/kubepods/pod1/sb1"), 9).unwrap();
        // `cpu` was already enabled at the root: only the others are written there.
        assert_eq!(
            std::fs::read_to_string(r.join("cgroup.subtree_control")).unwrap(),
            "cpu\n+memory+pids"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("kubepods/cgroup.subtree_control")).unwrap(),
            "+cpu+memory+pids"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("kubepods/pod1/cgroup.subtree_control")).unwrap(),
            "+cpu+memory"
        );
        // The leaf holds the process and enables nothing.
        assert_eq!(
            std::fs::read_to_string(r.join("kubepods/pod1/sb1/cgroup.subtree_control")).unwrap(),
            ""
        );
        assert_eq!(
            std::fs::read_to_string(r.join("kubepods/pod1/sb1/cgroup.procs")).unwrap(),
            "9"
        );
    }

    #[test]
    fn v2_top_level_pod_cgroup_enables_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fake_v2(r, "memory\n", "");
        fake_v2(&r.join("pod1"), "memory\n", "");
        let cg = join(&[r.to_path_buf()], true, Path::new("/pod1/sb1"), 3).unwrap();
        assert_eq!(cg.pod, Some(PathBuf::from("/pod1")));
        assert_eq!(
            std::fs::read_to_string(r.join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("pod1/cgroup.subtree_control")).unwrap(),
            "+memory"
        );
    }

    #[test]
    fn v2_refusing_every_controller_fails_and_removes_the_pause_cgroup() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fake_v2(r, "memory\n", "");
        // subtree_control as a directory: every write fails, as EBUSY would.
        std::fs::remove_file(r.join("cgroup.subtree_control")).unwrap();
        std::fs::create_dir(r.join("cgroup.subtree_control")).unwrap();
        let e = join(&[r.to_path_buf()], true, Path::new("/pod1/sb1"), 3).unwrap_err();
        assert!(e.to_string().contains("enable controllers"), "{e}");
        // The pause's cgroup goes; the pod cgroup it had to make is no pod's own to remove.
        assert!(!r.join("pod1/sb1").exists());
        assert!(r.join("pod1").is_dir());
    }

    #[test]
    fn join_rejects_paths_that_leave_the_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["/", "", "/a/../b"] {
            let e = join(&[root.path().to_path_buf()], false, Path::new(bad), 1).unwrap_err();
            assert!(
                e.to_string().contains("below the cgroup root"),
                "{bad}: {e}"
            );
        }
    }
}
