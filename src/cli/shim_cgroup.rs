//! `ShimCgroup`: `start` moves the shim daemon into the cgroup named by
//! `containerd.runc.v1.Options.shim_cgroup`, as `containerd-shim-runc-v2`'s `start` does
//! (`manager_linux.go`): on a unified (v2-only) host into that cgroup of the cgroup2
//! hierarchy (`cgroup2.Load(path).AddProc`); otherwise, hybrid hosts included, into that
//! cgroup of every v1 hierarchy where it exists (`cgroup1.Load(StaticPath(path)).AddProc`),
//! failing when it exists in none.
//!
//! The daemon moves right after it is spawned, before `start` answers: nothing can ask it to
//! fork a container or a pause process before that answer.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::host::cgroups::{CgroupMount, cgroup_mounts, is_unified};
use crate::records::error::{Context, Error, Result};

/// The cgroup hierarchies of the host (a parameter so tests use a fake cgroupfs).
#[derive(Debug, Clone)]
pub struct Host {
    /// `/sys/fs/cgroup` is cgroup2 (no v1 hierarchies).
    pub unified: bool,
    pub mounts: Vec<CgroupMount>,
}

impl Host {
    /// This machine, from `/sys/fs/cgroup` and `/proc/self/mountinfo`.
    pub fn system() -> Host {
        Host {
            unified: is_unified(Path::new("/sys/fs/cgroup")),
            mounts: cgroup_mounts(
                &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            ),
        }
    }
}

/// Moves `pid` into cgroup `path` (absolute, as in the options: `/shims` or
/// `/system.slice/shims`); returns the `cgroup.procs` files written.
pub fn join(host: &Host, path: &str, pid: u32) -> Result<Vec<PathBuf>> {
    let rel = relative(path)?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    for m in host.mounts.iter().filter(|m| m.unified == host.unified) {
        let dir = m.mountpoint.join(rel);
        if !dirs.contains(&dir) && dir.is_dir() {
            dirs.push(dir);
        }
    }
    if dirs.is_empty() {
        let kind = if host.unified { "cgroup2" } else { "cgroup v1" };
        return Err(Error::not_found(format!(
            "cgroup {path:?} exists in no {kind} hierarchy"
        )));
    }
    let mut written = Vec::new();
    for dir in dirs {
        let procs = dir.join("cgroup.procs");
        // Never create: a cgroup directory always has the file, anything else is not a cgroup.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .and_then(|mut f| f.write_all(pid.to_string().as_bytes()))
            .with_context(|| format!("write {}", procs.display()))?;
        written.push(procs);
    }
    Ok(written)
}

/// `path` without its leading `/`; only plain components (no `.`, `..`, empty parts).
fn relative(path: &str) -> Result<&Path> {
    let bad = || {
        Error::invalid(format!(
            "ShimCgroup {path:?} must be an absolute cgroup path without '.' or '..' parts"
        ))
    };
    let rest = path.strip_prefix('/').ok_or_else(bad)?;
    if rest.is_empty() {
        return Ok(Path::new("")); // the root cgroup
    }
    if rest
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(bad());
    }
    Ok(Path::new(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroupfs: one directory per hierarchy under a temp dir.
    fn fake(root: &Path, names: &[&str], unified: bool) -> Host {
        let mounts = names
            .iter()
            .map(|n| {
                let mountpoint = root.join(n);
                std::fs::create_dir_all(&mountpoint).unwrap();
                CgroupMount {
                    unified: *n == "unified" || unified,
                    controllers: vec![n.to_string()],
                    mountpoint,
                }
            })
            .collect();
        Host { unified, mounts }
    }

    fn make_cgroup(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), b"").unwrap();
    }

    #[test]
    fn v1_every_hierarchy_where_the_cgroup_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        // Hybrid like this host: v1 hierarchies plus cgroup2 at unified/.
        let host = fake(r, &["cpu", "memory", "pids", "systemd", "unified"], false);
        for h in ["cpu", "memory", "systemd", "unified"] {
            make_cgroup(&r.join(h).join("shims/a"));
        }
        let written = join(&host, "/shims/a", 4242).unwrap();
        assert_eq!(
            written,
            ["cpu", "memory", "systemd"]
                .iter()
                .map(|h| r.join(h).join("shims/a/cgroup.procs"))
                .collect::<Vec<_>>()
        );
        for p in &written {
            assert_eq!(std::fs::read_to_string(p).unwrap(), "4242");
        }
        // Not in pids (absent there), and the unified hierarchy is not a v1 one (as Go).
        assert!(!r.join("pids/shims").exists());
        assert_eq!(
            std::fs::read_to_string(r.join("unified/shims/a/cgroup.procs")).unwrap(),
            ""
        );
    }

    #[test]
    fn v2_the_unified_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let host = fake(tmp.path(), &["unified"], true);
        make_cgroup(&tmp.path().join("unified/system.slice/shims"));
        let written = join(&host, "/system.slice/shims", 7).unwrap();
        assert_eq!(written.len(), 1);
        assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), "7");
    }

    #[test]
    fn a_missing_cgroup_is_an_error_and_nothing_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let host = fake(tmp.path(), &["cpu", "memory"], false);
        let e = join(&host, "/nope", 1).unwrap_err();
        assert!(
            e.to_string().contains("exists in no cgroup v1 hierarchy"),
            "{e}"
        );
        assert!(!tmp.path().join("cpu/nope").exists());
        // A directory without cgroup.procs is not a cgroup: the write fails, nothing created.
        std::fs::create_dir_all(tmp.path().join("cpu/plain")).unwrap();
        assert!(join(&host, "/plain", 1).is_err());
        assert!(!tmp.path().join("cpu/plain/cgroup.procs").exists());
    }

    #[test]
    fn only_plain_absolute_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let host = fake(tmp.path(), &["cpu"], false);
        make_cgroup(&tmp.path().join("cpu/x"));
        for bad in ["x", "/../x", "/x/..", "/x/./y", "//x", "/x//y", ""] {
            let e = join(&host, bad, 1).unwrap_err();
            assert!(e.to_string().contains("absolute cgroup path"), "{bad}: {e}");
        }
        // "/" is the root cgroup.
        std::fs::write(tmp.path().join("cpu/cgroup.procs"), b"").unwrap();
        assert_eq!(
            join(&host, "/", 9).unwrap(),
            vec![tmp.path().join("cpu/cgroup.procs")]
        );
    }
}
