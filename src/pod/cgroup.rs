//! The pod cgroup (`linux.cgroup_parent`) that holds the pause process.
//!
//! With the cgroupfs driver the pod cgroup is a directory in every hierarchy (v1) or in the
//! unified tree (v2). We create what is missing, put the pause process in it, and on teardown
//! remove only the directories we created (the kubelet may own the parents).

use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Result};

/// Directories of the pod cgroup and which of them we created.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodCgroup {
    /// The pod cgroup directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
    /// Directories this shim created, deepest last.
    pub created: Vec<PathBuf>,
}

/// Mount points of the cgroup hierarchies to use: the unified one on v2-only hosts, else
/// every v1 hierarchy.
pub fn hierarchies(mountinfo: &str, unified: bool) -> Vec<PathBuf> {
    crate::cgroups::cgroup_mounts(mountinfo)
        .into_iter()
        .filter(|m| m.unified == unified)
        .map(|m| m.mountpoint)
        .collect()
}

/// Creates `parent` (a cgroupfs path such as `/kubepods/pod1`) in every hierarchy and moves
/// `pid` into it. On failure, what was created is removed again.
pub fn join(roots: &[PathBuf], parent: &Path, pid: i32) -> Result<PodCgroup> {
    let rel = parent.strip_prefix("/").unwrap_or(parent);
    let mut cg = PodCgroup::default();
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
                inherit_cpuset(m);
            }
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
            for left in remove(&cg) {
                log::warn!("undo pod cgroup: {left}");
            }
            Err(e)
        }
    }
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes; copy the parent's so a
/// process can join it (as runc does).
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

/// Removes the directories we created, deepest first. Busy ones (processes still inside)
/// are reported.
pub fn remove(cg: &PodCgroup) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut created = cg.created.clone();
    created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in created {
        match std::fs::remove_dir(&d) {
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

    /// A join that fails in its second hierarchy leaves nothing in the first, where the
    /// process had already been moved (a real cgroup hierarchy: rmdir is EBUSY while it is in).
    #[test]
    #[ignore = "needs root"]
    fn a_partial_join_removes_every_directory_it_made() {
        let unified = crate::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
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
        std::fs::create_dir_all(other.path().join(&top).join("pod/cgroup.procs")).unwrap();
        let r = join(
            &[real.clone(), other.path().to_path_buf()],
            &Path::new("/").join(&top).join("pod"),
            pid,
        );
        let left = real.join(&top).exists();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir(real.join(&top).join("pod"));
        let _ = std::fs::remove_dir(real.join(&top));
        assert!(r.is_err());
        assert!(!left, "{} was left behind", real.join(&top).display());
    }

    #[test]
    fn join_creates_only_missing_dirs_and_remove_takes_only_those() {
        // A plain directory stands in for a hierarchy root: cgroup.procs is then a file.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("kubepods")).unwrap();
        let cg = join(
            &[root.path().to_path_buf()],
            Path::new("/kubepods/pod1/inner"),
            42,
        )
        .unwrap();
        assert_eq!(
            cg.created,
            vec![
                root.path().join("kubepods/pod1"),
                root.path().join("kubepods/pod1/inner")
            ]
        );
        assert_eq!(
            std::fs::read_to_string(root.path().join("kubepods/pod1/inner/cgroup.procs")).unwrap(),
            "42"
        );
        // rmdir fails on the non-empty stand-in; a real cgroupfs directory has no files to delete.
        std::fs::remove_file(root.path().join("kubepods/pod1/inner/cgroup.procs")).unwrap();
        assert!(remove(&cg).is_empty());
        assert!(root.path().join("kubepods").exists());
        assert!(!root.path().join("kubepods/pod1").exists());
    }
}
