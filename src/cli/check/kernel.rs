//! The kernel facilities the shim uses, each probed by using it (`super::node::Syscall`),
//! and `cgroup.kill` looked for in the unified hierarchy:
//!
//! | facility | since | used for | without it |
//! | --- | --- | --- | --- |
//! | `openat2` (`RESOLVE_IN_ROOT`) | 5.6 | every rootfs mount target (`crate::host::mount`) | no container starts: blocking |
//! | `pidfd_open`, `CLONE_PIDFD` | 5.3 | the pause and every process the shim waits for | blocking |
//! | `memfd_create` + seals, `execveat` | 3.19 | the pause program | blocking |
//! | `cgroup.kill` | 5.14 | `delete` after a crash, cgroup v2 | each pid is signalled (a forking process may escape) |
//! | `mount_setattr` (idmapped mounts) | 5.12 | user-namespaced pods | they are refused |
//! | `close_range` | 5.9 | the pause child's inherited fds | closed one by one |

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::node::{Node, Support, Syscall};
use super::report::{Finding, Status};

/// What was found.
#[derive(Debug, Clone)]
pub struct Facts {
    pub release: String,
    pub probes: Vec<(Syscall, Support)>,
    /// `None`: cgroup.kill is not used here (no cgroup v2-only host); else whether a
    /// non-root cgroup of the unified hierarchy has it.
    pub cgroup_kill: Option<bool>,
}

const PROBES: [Syscall; 5] = [
    Syscall::Openat2,
    Syscall::PidfdOpen,
    Syscall::MemfdSeals,
    Syscall::MountSetattr,
    Syscall::CloseRange,
];

/// Probes the kernel; `unified` is the cgroup v2 mount point on a v2-only host (the only
/// place the shim uses `cgroup.kill`).
pub fn gather(node: &dyn Node, unified: Option<&Path>) -> Facts {
    Facts {
        release: node.kernel_release(),
        probes: PROBES.iter().map(|p| (*p, node.syscall(*p))).collect(),
        cgroup_kill: unified.map(|root| has_cgroup_kill(node, root)),
    }
}

/// `cgroup.kill` exists in every non-root cgroup of a kernel that has it (not in the root):
/// looked for in this process's cgroup, else in the root's first child.
fn has_cgroup_kill(node: &dyn Node, root: &Path) -> bool {
    let own = node
        .read(Path::new("/proc/self/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_string()))
        .filter(|p| p != "/");
    let dir = match own {
        Some(p) => root.join(p.trim_start_matches('/')),
        None => {
            let mut children: Vec<PathBuf> = node
                .list_dir(root)
                .unwrap_or_default()
                .into_iter()
                .map(|n| root.join(n))
                .filter(|p| node.exists(&p.join("cgroup.procs")))
                .collect();
            children.sort();
            match children.into_iter().next() {
                Some(c) => c,
                None => return false,
            }
        }
    };
    node.exists(&dir.join("cgroup.kill"))
}

fn key(p: Syscall) -> &'static str {
    match p {
        Syscall::Openat2 => "openat2",
        Syscall::PidfdOpen => "pidfd",
        Syscall::MemfdSeals => "memfd_seals",
        Syscall::MountSetattr => "mount_setattr",
        Syscall::CloseRange => "close_range",
    }
}

pub fn facts_json(f: &Facts) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("release".into(), json!(f.release));
    for (p, s) in &f.probes {
        m.insert(key(*p).into(), json!(*s == Support::Yes));
    }
    m.insert("cgroup_kill".into(), json!(f.cgroup_kill));
    Value::Object(m)
}

pub fn judge(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    let release = &f.release;
    for (p, s) in &f.probes {
        let (id, what, since, missing_status, missing) = match p {
            Syscall::Openat2 => (
                "kernel.openat2",
                "openat2(RESOLVE_IN_ROOT)",
                "5.6",
                Status::Block,
                "no container can start: every rootfs mount target is resolved with it",
            ),
            Syscall::PidfdOpen => (
                "kernel.pidfd",
                "pidfd_open / CLONE_PIDFD",
                "5.3",
                Status::Block,
                "the pause process and every wait of the shim need process descriptors",
            ),
            Syscall::MemfdSeals => (
                "kernel.memfd-seals",
                "sealed memfd",
                "3.19",
                Status::Block,
                "the pause program runs from a sealed memfd",
            ),
            Syscall::MountSetattr => (
                "kernel.idmapped-mounts",
                "mount_setattr (idmapped mounts)",
                "5.12",
                Status::Warn,
                "user-namespaced pods (hostUsers: false) are refused",
            ),
            Syscall::CloseRange => (
                "kernel.close-range",
                "close_range",
                "5.9",
                Status::Info,
                "the pause child closes inherited descriptors one by one",
            ),
        };
        out.push(match s {
            Support::Yes => Finding::new(id, Status::Ok, format!("{what} works")),
            Support::No(why) => Finding::new(
                id,
                missing_status,
                format!("{what} does not work on kernel {release}: {why}"),
            )
            .detail(format!(
                "Linux {since} or later has it; without it {missing}"
            ))
            .fix(if missing_status == Status::Block {
                format!("run a kernel >= {since} (rsandbox needs Linux 5.6, 5.14 for everything)")
            } else {
                String::new()
            }),
        });
    }
    out.push(match f.cgroup_kill {
        None => Finding::new(
            "kernel.cgroup-kill",
            Status::Info,
            "cgroup.kill is not used here (cgroup v1: the freezer holds a cgroup's processes while they are killed)",
        ),
        Some(true) => Finding::new("kernel.cgroup-kill", Status::Ok, "cgroup.kill works"),
        Some(false) => Finding::new(
            "kernel.cgroup-kill",
            Status::Warn,
            format!("no cgroup.kill on kernel {release} (Linux 5.14)"),
        )
        .detail("after a shim crash, `delete` signals each process of a container's cgroup instead: one that forks meanwhile may escape"),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    fn status(fs: &[Finding], id: &str) -> Status {
        fs.iter().find(|f| f.id == id).unwrap().status
    }

    #[test]
    fn a_current_kernel_has_everything() {
        let mut n = FakeNode {
            release: "6.1.0-41-amd64".into(),
            ..Default::default()
        };
        n.file("/proc/self/cgroup", "0::/system.slice/kubelet.service\n")
            .file(
                "/sys/fs/cgroup/system.slice/kubelet.service/cgroup.kill",
                "",
            );
        let f = gather(&n, Some(Path::new("/sys/fs/cgroup")));
        let fs = judge(&f);
        assert!(fs.iter().all(|f| f.status == Status::Ok), "{fs:#?}");
        assert_eq!(facts_json(&f)["cgroup_kill"], true);
        assert_eq!(facts_json(&f)["openat2"], true);
    }

    /// A 5.4 kernel (Ubuntu 20.04's): no openat2, no idmapped mounts, no close_range, no
    /// cgroup.kill; pidfd_open works.
    #[test]
    fn a_5_4_kernel_blocks_on_openat2_and_warns_on_the_rest() {
        let mut n = FakeNode {
            release: "5.4.0-216-generic".into(),
            ..Default::default()
        };
        for p in [Syscall::Openat2, Syscall::MountSetattr, Syscall::CloseRange] {
            n.syscalls.insert(
                p,
                Support::No("Function not implemented (os error 38)".into()),
            );
        }
        // This process sits in the root cgroup: the root's first child is looked at.
        n.file("/proc/self/cgroup", "0::/\n")
            .file("/sys/fs/cgroup/init.scope/cgroup.procs", "1\n");
        let f = gather(&n, Some(Path::new("/sys/fs/cgroup")));
        let fs = judge(&f);
        assert_eq!(status(&fs, "kernel.openat2"), Status::Block);
        assert_eq!(status(&fs, "kernel.pidfd"), Status::Ok);
        assert_eq!(status(&fs, "kernel.idmapped-mounts"), Status::Warn);
        assert_eq!(status(&fs, "kernel.close-range"), Status::Info);
        assert_eq!(status(&fs, "kernel.cgroup-kill"), Status::Warn);
        let openat2 = fs.iter().find(|f| f.id == "kernel.openat2").unwrap();
        assert!(openat2.summary.contains("5.4.0-216-generic"), "{openat2:?}");
        assert!(openat2.detail.contains("5.6"), "{openat2:?}");
    }

    #[test]
    fn cgroup_kill_is_not_judged_on_cgroup_v1() {
        let n = FakeNode::default();
        let fs = judge(&gather(&n, None));
        assert_eq!(status(&fs, "kernel.cgroup-kill"), Status::Info);
    }
}
