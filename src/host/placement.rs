//! Is a container's process where runc put it? After `runc create` (before the container's
//! own code runs), after `runc start` and after `runc exec`, the process must sit in the
//! container's own cgroup, or in a cgroup below it, in every hierarchy runc's state says the
//! container joined (`state.json`'s `cgroup_paths`: hierarchy → directory).
//!
//! Below it counts as in place because that is where runc itself puts processes of a
//! container that runs its own cgroups: docker:dind's entrypoint, systemd as a container's
//! init, a kind node move every process of their cgroup into a child (`init`) and enable
//! controllers in their `cgroup.subtree_control`; on cgroup v2 the kernel then refuses new
//! processes in the container's cgroup (no internal processes), and runc's `setnsProcess`
//! puts an exec'd process into the init's cgroup instead (runc issue 2356, the same in 1.1
//! and 1.3). An init that moves itself into a child at once is the same shape after `runc
//! start`. A descendant is still under every limit and device policy of the container's
//! cgroup (v1 children cannot widen their parent's devices list; a v2 parent's BPF program
//! keeps running for its descendants), so nothing is escaped by it.
//!
//! Anywhere else (a parent, a sibling, the root), the container runs
//! under another cgroup's limits — with systemd on cgroup v1, in an allow-all devices cgroup
//! (see [`crate::host::systemd::devices`] for how systemd 252 moves a container's init into its pod
//! slice's devices cgroup) — and the caller must fail the operation and take the process down
//! rather than run it there. runc itself never checks this.
//!
//! A process that has already exited (gone, or a zombie) is no misplacement: nothing runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::host::cgroups::cgroup_mounts;
use crate::records::error::{Context, Error, Result};

/// A process outside the cgroup runc says its container joined, and outside every cgroup below it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "process {pid} is not in its container's cgroup in the {hierarchy} hierarchy: runc's state \
     says {}, /proc/{pid}/cgroup says {}",
    expected.display(),
    actual.display()
)]
pub struct Misplaced {
    pub pid: i32,
    /// runc's name of the hierarchy: a v1 controller, `name=systemd`, or `unified`.
    pub hierarchy: String,
    /// Where runc's state says the container's processes belong.
    pub expected: PathBuf,
    /// Where the process is.
    pub actual: PathBuf,
}

impl From<Misplaced> for Error {
    fn from(m: Misplaced) -> Self {
        Error::internal(m.to_string())
    }
}

/// `cgroup_paths` of container `id`'s runc state under runc root `root`.
pub fn runc_cgroup_paths(root: &Path, id: &str) -> Result<BTreeMap<String, PathBuf>> {
    #[derive(serde::Deserialize)]
    struct State {
        #[serde(default)]
        cgroup_paths: BTreeMap<String, PathBuf>,
    }
    let file = root.join(id).join("state.json");
    let raw = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
    let state: State = serde_json::from_slice(&raw)
        .map_err(|e| Error::internal(format!("parse {}: {e}", file.display())))?;
    Ok(state.cgroup_paths)
}

/// Checks that `pid` is in every cgroup of `joined` (runc's `cgroup_paths`).
pub fn check(pid: i32, joined: &BTreeMap<String, PathBuf>) -> Result<()> {
    if joined.is_empty() {
        return Ok(());
    }
    let cgroup = match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(s) => s,
        Err(e) if process_gone(&e) => return Ok(()),
        Err(e) => return Err(Error::from(e).context(format!("read /proc/{pid}/cgroup"))),
    };
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    match misplaced(pid, joined, &cgroup, &mountinfo) {
        // What an exited process shows is not where it ran: only a live one counts.
        Some(m) if is_running(pid) => Err(m.into()),
        _ => Ok(()),
    }
}

/// Whether reading `/proc/<pid>/<file>` failed because the process is gone: ENOENT once its
/// directory went, ESRCH when it was reaped after the file was opened (seen after `runc exec`
/// of a command that exits at once: its `/proc/<pid>/cgroup` answered ESRCH on Linux 6.1). A
/// process that is gone runs nowhere: nothing to check.
fn process_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether `pid` exists and is not exiting: a task that has begun to exit (`PF_EXITING`,
/// set before the kernel moves it to the root cgroups in `cgroup_exit`) or is a zombie shows
/// cgroups it no longer runs in. Read after `/proc/<pid>/cgroup`: the flag is never cleared.
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_says_running(&s))
        .unwrap_or(false)
}

/// `PF_EXITING` of the kernel's task flags (`include/linux/sched.h`).
const PF_EXITING: u64 = 0x4;

/// From the text of `/proc/<pid>/stat`: not a zombie (or dead), not exiting.
fn stat_says_running(stat: &str) -> Option<bool> {
    // pid (comm) state ppid pgrp session tty_nr tpgid flags ...; comm may hold anything.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?;
    let flags: u64 = fields.get(6)?.parse().ok()?;
    Some(!matches!(*state, "Z" | "X" | "x") && flags & PF_EXITING == 0)
}

/// The first hierarchy of `joined` where `cgroup` (the text of `/proc/<pid>/cgroup`) puts the
/// process elsewhere, the directories resolved through the cgroup mounts of `mountinfo`.
/// runc's keys: a v1 controller (`memory`, `cpu`, ...), `name=systemd`, and `""` for the
/// unified hierarchy (v2, or the hybrid one). A hierarchy the process has no line for, or
/// that is not mounted here, cannot be compared and is skipped.
pub fn misplaced(
    pid: i32,
    joined: &BTreeMap<String, PathBuf>,
    cgroup: &str,
    mountinfo: &str,
) -> Option<Misplaced> {
    let mounts = cgroup_mounts(mountinfo);
    for (key, expected) in joined {
        let unified = key.is_empty();
        let wanted = key.strip_prefix("name=").unwrap_or(key);
        let line = cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            let hit = if unified {
                ctrls.is_empty()
            } else {
                ctrls
                    .split(',')
                    .any(|c| c.strip_prefix("name=").unwrap_or(c) == wanted)
            };
            hit.then_some(path)
        });
        let Some(rel) = line else {
            log::debug!("pid {pid}: no /proc line for the {key:?} hierarchy");
            continue;
        };
        let mount = mounts.iter().find(|m| {
            m.unified == unified && (unified || m.controllers.iter().any(|c| c == wanted))
        });
        let Some(mount) = mount else {
            log::debug!("pid {pid}: the {key:?} hierarchy is not mounted here");
            continue;
        };
        // A hierarchy mounted from below its root (a container without its own cgroup
        // namespace) shows the mount's root in /proc/<pid>/cgroup; a process outside that
        // root is outside every directory under the mount point.
        let root = mount_root(mountinfo, &mount.mountpoint);
        let actual = match Path::new(rel).strip_prefix(&root) {
            Ok(below) => mount.mountpoint.join(below),
            Err(_) => PathBuf::from(rel),
        };
        // Component-wise: `<ctr>/init` is below `<ctr>`, `<ctr>-x` is not.
        if !normalized(&actual).starts_with(normalized(expected)) {
            return Some(Misplaced {
                pid,
                hierarchy: if unified {
                    "unified".into()
                } else {
                    key.clone()
                },
                expected: expected.clone(),
                actual,
            });
        }
    }
    None
}

/// The root (4th field of `/proc/self/mountinfo`) of the cgroup mount at `mountpoint`: `/`
/// unless the hierarchy is mounted from one of its cgroups.
fn mount_root(mountinfo: &str, mountpoint: &Path) -> PathBuf {
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let root = f.get(3)?;
            (right.starts_with("cgroup") && f.get(4).map(Path::new) == Some(mountpoint))
                .then(|| PathBuf::from(root))
        })
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// `p` without a trailing `/` (the root cgroup reads as `/`).
fn normalized(p: &Path) -> PathBuf {
    p.components().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's layout: cgroup v1 hybrid, cpu and cpuacct apart.
    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const SCOPE: &str = "/kubepods.slice/kubepods-besteffort.slice/\
                         kubepods-besteffort-pod1.slice/cri-containerd-c1.scope";
    const SLICE: &str = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";

    fn joined(keys: &[(&str, &str)]) -> BTreeMap<String, PathBuf> {
        keys.iter()
            .map(|(k, dir)| (k.to_string(), format!("/sys/fs/cgroup/{dir}{SCOPE}").into()))
            .collect()
    }

    fn v1_joined() -> BTreeMap<String, PathBuf> {
        joined(&[
            ("cpu", "cpu"),
            ("cpuacct", "cpuacct"),
            ("memory", "memory"),
            ("devices", "devices"),
            ("name=systemd", "systemd"),
            ("", "unified"),
        ])
    }

    fn proc_cgroup(devices: &str) -> String {
        format!(
            "9:name=systemd:{SCOPE}\n5:devices:{devices}\n4:memory:{SCOPE}\n2:cpuacct:{SCOPE}\n\
             1:cpu:{SCOPE}\n0::{SCOPE}\n"
        )
    }

    #[test]
    fn a_process_in_its_scope_everywhere_is_in_place() {
        assert_eq!(
            misplaced(7, &v1_joined(), &proc_cgroup(SCOPE), MOUNTINFO),
            None
        );
    }

    /// systemd's migration on v1: the init in the pod slice's devices cgroup.
    #[test]
    fn an_init_in_the_pod_slice_s_devices_cgroup_is_named_with_both_paths() {
        let m = misplaced(7, &v1_joined(), &proc_cgroup(SLICE), MOUNTINFO).unwrap();
        assert_eq!(m.hierarchy, "devices");
        assert_eq!(
            m.expected,
            PathBuf::from(format!("/sys/fs/cgroup/devices{SCOPE}"))
        );
        assert_eq!(
            m.actual,
            PathBuf::from(format!("/sys/fs/cgroup/devices{SLICE}"))
        );
        let e = Error::from(m);
        assert_eq!(e.kind(), crate::records::error::Kind::Internal);
        let text = e.to_string();
        assert!(text.contains("process 7"), "{text}");
        assert!(text.contains("devices hierarchy"), "{text}");
        assert!(
            text.contains(&format!("says /sys/fs/cgroup/devices{SCOPE},")),
            "{text}"
        );
        assert!(
            text.ends_with(&format!("says /sys/fs/cgroup/devices{SLICE}")),
            "{text}"
        );
    }

    #[test]
    fn joined_controllers_name_systemd_and_the_unified_hierarchy_are_compared() {
        // cpu,cpuacct mounted together, as most hosts have them
        let mountinfo = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        let j = joined(&[
            ("cpu", "cpu,cpuacct"),
            ("cpuacct", "cpu,cpuacct"),
            ("name=systemd", "systemd"),
            ("", "unified"),
        ]);
        let good = format!("3:cpu,cpuacct:{SCOPE}\n1:name=systemd:{SCOPE}\n0::{SCOPE}\n");
        assert_eq!(misplaced(7, &j, &good, mountinfo), None);
        for (line, hierarchy) in [
            (
                format!("3:cpu,cpuacct:{SLICE}\n1:name=systemd:{SCOPE}\n0::{SCOPE}\n"),
                "cpu",
            ),
            (
                format!(
                    "3:cpu,cpuacct:{SCOPE}\n1:name=systemd:/system.slice/containerd.service\n0::{SCOPE}\n"
                ),
                "name=systemd",
            ),
            (
                format!("3:cpu,cpuacct:{SCOPE}\n1:name=systemd:{SCOPE}\n0::/\n"),
                "unified",
            ),
        ] {
            let m = misplaced(7, &j, &line, mountinfo).unwrap();
            assert_eq!(m.hierarchy, hierarchy, "{line}");
        }
    }

    /// A container that runs its own cgroups (docker:dind, systemd as init): runc puts an
    /// exec'd process into the child its init moved to. That is in place; a sibling whose
    /// name only begins with the container's, the parent and the root are not.
    #[test]
    fn a_descendant_of_the_container_s_cgroup_is_in_place_and_a_sibling_is_not() {
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let j: BTreeMap<String, PathBuf> = [(
            String::new(),
            PathBuf::from(format!("/sys/fs/cgroup{SCOPE}")),
        )]
        .into();
        for inside in [
            format!("0::{SCOPE}/init\n"),
            format!("0::{SCOPE}/init.scope/deeper\n"),
            format!("0::{SCOPE}/\n"),
        ] {
            assert_eq!(misplaced(7, &j, &inside, mountinfo), None, "{inside}");
        }
        for outside in [
            format!("0::{SCOPE}2\n"),
            format!("0::{SCOPE}-init\n"),
            format!("0::{SLICE}\n"),
            format!("0::{SLICE}/other.scope/init\n"),
            "0::/\n".to_string(),
        ] {
            let m = misplaced(7, &j, &outside, mountinfo);
            assert!(m.is_some(), "{outside}");
        }
        // v1: the devices escape of systemd's migration (the pod slice, a parent) is still
        // caught when the other hierarchies are below the scope.
        let v1 = format!(
            "9:name=systemd:{SCOPE}/init\n5:devices:{SLICE}\n4:memory:{SCOPE}/init\n\
             2:cpuacct:{SCOPE}\n1:cpu:{SCOPE}\n0::{SCOPE}/init\n"
        );
        let m = misplaced(7, &v1_joined(), &v1, MOUNTINFO).unwrap();
        assert_eq!(m.hierarchy, "devices");
        let below = format!(
            "9:name=systemd:{SCOPE}/init\n5:devices:{SCOPE}/init\n4:memory:{SCOPE}/init\n\
             2:cpuacct:{SCOPE}\n1:cpu:{SCOPE}\n0::{SCOPE}/init\n"
        );
        assert_eq!(misplaced(7, &v1_joined(), &below, MOUNTINFO), None);
    }

    /// cgroup v2: one hierarchy, runc's key "".
    #[test]
    fn on_v2_the_one_hierarchy_is_compared() {
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let j: BTreeMap<String, PathBuf> = [(
            String::new(),
            PathBuf::from(format!("/sys/fs/cgroup{SCOPE}")),
        )]
        .into();
        assert_eq!(misplaced(7, &j, &format!("0::{SCOPE}\n"), mountinfo), None);
        let m = misplaced(7, &j, &format!("0::{SLICE}\n"), mountinfo).unwrap();
        assert_eq!(m.hierarchy, "unified");
        assert_eq!(m.actual, PathBuf::from(format!("/sys/fs/cgroup{SLICE}")));
    }

    /// A hierarchy mounted from one of its cgroups (a container sharing the host's cgroup
    /// namespace): /proc shows the full path, the mount starts at its root.
    #[test]
    fn a_mount_of_a_sub_cgroup_is_resolved_through_its_root() {
        let mountinfo = "\
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let j: BTreeMap<String, PathBuf> = [(
            "memory".to_string(),
            PathBuf::from(format!("/sys/fs/cgroup/memory{SCOPE}")),
        )]
        .into();
        let inside = format!("4:memory:/docker/abc{SCOPE}\n");
        assert_eq!(misplaced(7, &j, &inside, mountinfo), None);
        let m = misplaced(7, &j, &format!("4:memory:/docker/abc{SLICE}\n"), mountinfo).unwrap();
        assert_eq!(
            m.actual,
            PathBuf::from(format!("/sys/fs/cgroup/memory{SLICE}"))
        );
        // outside the mounted cgroup altogether
        let m = misplaced(7, &j, &format!("4:memory:{SCOPE}\n"), mountinfo).unwrap();
        assert_eq!(m.actual, PathBuf::from(SCOPE));
    }

    /// What cannot be compared (no such line, no such mount) is skipped, not failed.
    #[test]
    fn unknown_hierarchies_are_skipped() {
        let j = joined(&[("rdma", "rdma"), ("memory", "memory")]);
        assert_eq!(
            misplaced(7, &j, &format!("4:memory:{SCOPE}\n"), MOUNTINFO),
            None
        );
        let j = joined(&[("hugetlb", "hugetlb")]);
        assert_eq!(
            misplaced(7, &j, &format!("8:hugetlb:{SLICE}\n"), MOUNTINFO),
            None
        );
    }

    /// Exiting tasks (the kernel has moved them, or is moving them, to the root cgroups)
    /// and zombies do not count; `comm` may contain `)` and spaces.
    /// A process reaped between the open and the read of its `/proc` file answers ESRCH: it is
    /// gone, as one whose directory is missing; other errors are errors.
    #[test]
    fn a_reaped_process_is_gone_and_other_errors_are_not() {
        use std::io::Error as E;
        assert!(process_gone(&E::from_raw_os_error(libc::ESRCH)));
        assert!(process_gone(&E::from_raw_os_error(libc::ENOENT)));
        assert!(!process_gone(&E::from_raw_os_error(libc::EACCES)));
        assert!(!process_gone(&E::from_raw_os_error(libc::EIO)));
    }

    #[test]
    fn exiting_and_dead_processes_are_not_running() {
        let stat = |state: &str, flags: u64| {
            format!("42 (a) b) c) {state} 1 42 42 0 -1 {flags} 300 0 0 0 1 2 3 4 20 0 1 0 5")
        };
        assert_eq!(stat_says_running(&stat("S", 0x400100)), Some(true));
        assert_eq!(stat_says_running(&stat("R", 0x400104)), Some(false));
        assert_eq!(stat_says_running(&stat("Z", 0x40804c)), Some(false));
        assert_eq!(stat_says_running(&stat("X", 0)), Some(false));
        assert_eq!(stat_says_running("42 (a"), None);
    }

    #[test]
    fn runc_s_state_gives_the_joined_cgroups() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("c1")).unwrap();
        std::fs::write(
            root.path().join("c1/state.json"),
            format!(
                r#"{{"id":"c1","init_process_pid":7,"config":{{"cgroups":{{}}}},
                   "cgroup_paths":{{"devices":"/sys/fs/cgroup/devices{SCOPE}","":"/sys/fs/cgroup/unified{SCOPE}"}}}}"#
            ),
        )
        .unwrap();
        let paths = runc_cgroup_paths(root.path(), "c1").unwrap();
        assert_eq!(paths.len(), 2);
        assert_eq!(
            paths["devices"],
            PathBuf::from(format!("/sys/fs/cgroup/devices{SCOPE}"))
        );
        let e = runc_cgroup_paths(root.path(), "c2").unwrap_err();
        assert!(e.to_string().contains("c2/state.json"), "{e}");
    }

    /// The live check on this test process: its own cgroups are where it is; a made-up
    /// expectation is not, and a pid that does not exist is no misplacement.
    #[test]
    fn the_live_check_reads_proc() {
        let me = std::process::id() as i32;
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let paths = crate::host::cgroups::CgroupPaths::parse(&cgroup, &mountinfo, false);
        let mut joined: BTreeMap<String, PathBuf> = paths.v1.into_iter().collect();
        if joined.is_empty() {
            let unified = crate::host::cgroups::CgroupPaths::parse(&cgroup, &mountinfo, true);
            joined.extend(unified.v2.map(|p| (String::new(), p)));
        }
        // name= keys are runc's spelling
        if let Some(p) = joined.remove("systemd") {
            joined.insert("name=systemd".into(), p);
        }
        check(me, &joined).unwrap();
        let (key, dir) = joined.iter().next().unwrap();
        let wrong: BTreeMap<String, PathBuf> = [(key.clone(), dir.join("elsewhere"))].into();
        let e = check(me, &wrong).unwrap_err();
        assert!(
            e.to_string().contains("is not in its container's cgroup"),
            "{e}"
        );
        check(i32::MAX, &wrong).unwrap();
    }
}
