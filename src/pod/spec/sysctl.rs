//! Pod sysctls: names (dot and slash form), their `/proc/sys` paths, containerd's podsandbox
//! defaults, and which ones a pod may set.
//!
//! [`sysctl_path`] is the one place a sysctl name becomes a file: the pause process writes the
//! pod's sysctls through it too. A leaf: it knows nothing of the pod spec (the caller says which
//! namespaces are the node's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest sysctl name we accept.
pub const MAX_SYSCTL_NAME_LEN: usize = 256;
/// Longest sysctl value we accept (values are single-line strings like `0 2147483647`).
pub const MAX_SYSCTL_VALUE_LEN: usize = 1024;
/// Most sysctls a pod may set.
pub const MAX_SYSCTLS: usize = 256;

/// Which of containerd's podsandbox default sysctls apply (CRI config
/// `enable_unprivileged_ports` / `enable_unprivileged_icmp`, both `true` by default in
/// containerd 2.x on Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysctlDefaults {
    /// Add `net.ipv4.ip_unprivileged_port_start=0`.
    pub unprivileged_ports: bool,
    /// Add `net.ipv4.ping_group_range=0 2147483647`.
    pub unprivileged_icmp: bool,
}

impl Default for SysctlDefaults {
    fn default() -> Self {
        SysctlDefaults {
            unprivileged_ports: true,
            unprivileged_icmp: true,
        }
    }
}

impl SysctlDefaults {
    /// What this host allows, read once when the daemon starts (see [`SysctlDefaults::from_host`]).
    pub fn detect() -> SysctlDefaults {
        SysctlDefaults::from_host(
            std::fs::read_to_string("/proc/self/uid_map")
                .ok()
                .as_deref(),
            Path::new(PORT_START_PATH).exists(),
        )
    }

    /// containerd's defaults, minus what this host would refuse:
    /// * `ping_group_range` when the shim runs inside a user namespace (`uid_map`, see
    ///   [`in_user_ns`]): GIDs outside the namespace's mapping make the kernel reject the write
    ///   (EINVAL), which would fail every pod; containerd skips it there too;
    /// * `ip_unprivileged_port_start` when the kernel has no such sysctl (before Linux 4.11,
    ///   `port_start_exists` false): the write would fail with ENOENT.
    pub fn from_host(uid_map: Option<&str>, port_start_exists: bool) -> SysctlDefaults {
        SysctlDefaults {
            unprivileged_ports: port_start_exists,
            unprivileged_icmp: !uid_map.is_some_and(in_user_ns),
        }
    }
}

/// Where the kernel (4.11+) keeps `net.ipv4.ip_unprivileged_port_start`.
const PORT_START_PATH: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// The pod's own sysctls plus containerd's podsandbox defaults, sorted by name.
///
/// Rule (containerd 2.1 `sandboxContainerSpec`): only for pods NOT on the host network, and
/// only for names the user did not set:
/// * `net.ipv4.ip_unprivileged_port_start = "0"` if `defaults.unprivileged_ports`;
/// * `net.ipv4.ping_group_range = "0 2147483647"` if `defaults.unprivileged_icmp` (containerd
///   additionally skips it inside a user namespace and for user-namespaced pods; the former
///   is [`SysctlDefaults::detect`], the latter [`super::PodSpec::effective_sysctls`]).
pub fn with_defaults(
    user: &BTreeMap<String, String>,
    host_network: bool,
    defaults: SysctlDefaults,
) -> Vec<(String, String)> {
    let mut out = user.clone();
    if !host_network {
        if defaults.unprivileged_ports {
            out.entry("net.ipv4.ip_unprivileged_port_start".into())
                .or_insert_with(|| "0".into());
        }
        if defaults.unprivileged_icmp {
            out.entry("net.ipv4.ping_group_range".into())
                .or_insert_with(|| "0 2147483647".into());
        }
    }
    out.into_iter().collect()
}

/// Whether this process is in a non-initial user namespace (see [`in_user_ns`]).
pub fn running_in_user_ns() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|s| in_user_ns(&s))
}

/// Whether a `/proc/<pid>/uid_map` belongs to a non-initial user namespace (same test as moby's
/// `userns.RunningInUserNS`: anything but the identity map of the full range).
pub fn in_user_ns(uid_map: &str) -> bool {
    let fields: Vec<&str> = uid_map.split_whitespace().collect();
    fields != ["0", "0", "4294967295"]
}

/// Sysctl names (dot form) namespaced by the IPC namespace (the kubelet's list:
/// `kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`).
fn is_ipc_sysctl(name: &str) -> bool {
    name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name == "kernel.sem"
        || name.starts_with("fs.mqueue.")
}

/// Sysctl names (dot form) namespaced by the network namespace.
fn is_net_sysctl(name: &str) -> bool {
    name.starts_with("net.")
}

/// Converts a sysctl name to the dot-separated form, following sysctl(8)/sysctl.d(5) (and the
/// kubelet's and runc's validators): the first separator decides; if it is `/`, dots and slashes
/// are interchanged, so `net/ipv4/conf/eth0.100/forwarding` becomes
/// `net.ipv4.conf.eth0/100.forwarding`. Dot-form names are returned unchanged.
pub fn canonical_sysctl_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => swap_dots_slashes(name),
        _ => name.to_owned(),
    }
}

fn swap_dots_slashes(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '.' => '/',
            '/' => '.',
            c => c,
        })
        .collect()
}

/// `/proc/sys` path of a sysctl (either form; see [`canonical_sysctl_name`]).
///
/// In dot form a `/` stands for a literal `.` inside one path component (an interface name such
/// as `eth0.100`), so dots and slashes are interchanged: `net.ipv4.conf.eth0/100.forwarding` →
/// `/proc/sys/net/ipv4/conf/eth0.100/forwarding`. runc's `writeSystemProperty` only replaces
/// `.` with `/`, which agrees for every name without `/` and is wrong for those with one; we
/// follow sysctl(8) because the kubelet produces exactly that encoding.
pub fn sysctl_path(name: &str) -> PathBuf {
    let dotted = canonical_sysctl_name(name);
    Path::new("/proc/sys").join(swap_dots_slashes(&dotted))
}

/// Validates one sysctl; returns its canonical (dot-form) name.
pub(super) fn check_sysctl(
    name: &str,
    value: &str,
    host_network: bool,
    host_ipc: bool,
) -> Result<String, String> {
    if name.is_empty() || name.len() > MAX_SYSCTL_NAME_LEN {
        return Err(format!("name must be 1-{MAX_SYSCTL_NAME_LEN} bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
    {
        return Err("name may only contain [A-Za-z0-9_./-]".into());
    }
    let dotted = canonical_sysctl_name(name);
    // Each path component under /proc/sys: a dot-form segment with `/` read as `.`.
    for seg in dotted.split('.') {
        let comp = seg.replace('/', ".");
        if comp.is_empty() || comp == "." || comp == ".." {
            return Err("name has an empty, `.` or `..` path component".into());
        }
    }
    if value.len() > MAX_SYSCTL_VALUE_LEN {
        return Err(format!("value longer than {MAX_SYSCTL_VALUE_LEN} bytes"));
    }
    if value.bytes().any(|b| b == 0 || b == b'\n' || b == b'\r') {
        return Err("value contains NUL or a line break".into());
    }
    if is_ipc_sysctl(&dotted) {
        if host_ipc {
            return Err("not allowed: the pod uses the host IPC namespace".into());
        }
    } else if is_net_sysctl(&dotted) {
        if host_network {
            return Err("not allowed: the pod uses the host network namespace".into());
        }
    } else {
        return Err(
            "not namespaced: only kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.* and net.* \
             may be set for a pod"
                .into(),
        );
    }
    Ok(dotted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_rules() {
        let ok = |name: &str, net: bool, ipc: bool| check_sysctl(name, "1", net, ipc);
        // (pod network, host network), (pod IPC, host IPC)
        let (p, h) = (false, true);
        let (ip, ih) = (false, true);
        for n in [
            "kernel.shmmax",
            "kernel.shm_rmid_forced",
            "kernel.msgmax",
            "kernel.sem",
            "fs.mqueue.msg_max",
            "net.ipv4.ip_forward",
            "net.ipv4.conf.eth0/100.forwarding",
        ] {
            assert!(ok(n, p, ip).is_ok(), "{n}");
        }
        // Slash form is canonicalised.
        assert_eq!(
            ok("net/ipv4/conf/eth0.100/forwarding", p, ip).unwrap(),
            "net.ipv4.conf.eth0/100.forwarding"
        );
        // IPC sysctls need a private IPC namespace, net.* a private network namespace.
        assert!(ok("kernel.shmmax", p, ih).unwrap_err().contains("host IPC"));
        assert!(ok("fs.mqueue.queues_max", h, ih).is_err());
        assert!(ok("kernel.shmmax", h, ip).is_ok());
        assert!(
            ok("net.core.somaxconn", h, ip)
                .unwrap_err()
                .contains("host network")
        );
        assert!(ok("net.core.somaxconn", p, ih).is_ok());
        // Not namespaced at all.
        for n in [
            "kernel.hostname",
            "kernel.semx",
            "vm.overcommit_memory",
            "kernel.pid_max",
            "fs.file-max",
            "network.foo",
        ] {
            assert!(ok(n, p, ip).unwrap_err().contains("not namespaced"), "{n}");
        }
        // Malformed names.
        for n in [
            "",
            "net..ipv4",
            "net.ipv4.",
            ".net.ipv4",
            "net.ipv4.conf.//.x",
            "net.ipv4.conf./.x",
            "net/ipv4/../../kernel/x",
            "net.ipv4.a b",
            "net.ipv4.\0",
            &format!("net.{}", "a".repeat(300)),
        ] {
            assert!(ok(n, p, ip).is_err(), "{n:?}");
        }
        // Values.
        assert!(check_sysctl("net.ipv4.ip_forward", "1\n", p, ip).is_err());
        assert!(check_sysctl("net.ipv4.ip_forward", "a\0", p, ip).is_err());
        assert!(check_sysctl("net.ipv4.ip_forward", &"1".repeat(2000), p, ip).is_err());
        assert!(check_sysctl("net.ipv4.ping_group_range", "0 2147483647", p, ip).is_ok());
    }

    #[test]
    fn sysctl_paths() {
        assert_eq!(
            sysctl_path("net.ipv4.ip_forward"),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            sysctl_path("net.ipv4.conf.eth0/100.forwarding"),
            PathBuf::from("/proc/sys/net/ipv4/conf/eth0.100/forwarding")
        );
        assert_eq!(
            sysctl_path("net/ipv4/conf/eth0.100/forwarding"),
            PathBuf::from("/proc/sys/net/ipv4/conf/eth0.100/forwarding")
        );
        assert_eq!(
            sysctl_path("kernel.sem"),
            PathBuf::from("/proc/sys/kernel/sem")
        );
    }

    #[test]
    fn defaults_follow_what_the_host_allows() {
        let init = "         0          0 4294967295\n";
        assert_eq!(
            SysctlDefaults::from_host(Some(init), true),
            SysctlDefaults::default()
        );
        // Regression: inside a user namespace the kernel rejects ping_group_range for GIDs
        // outside the mapping; it was added anyway and every pod failed to start.
        let userns = "         0     100000      65536\n";
        assert_eq!(
            SysctlDefaults::from_host(Some(userns), true),
            SysctlDefaults {
                unprivileged_ports: true,
                unprivileged_icmp: false
            }
        );
        assert!(!SysctlDefaults::from_host(Some("0 0 1\n"), true).unprivileged_icmp);
        // No uid_map (no /proc): assume the initial namespace, as moby does.
        assert!(SysctlDefaults::from_host(None, true).unprivileged_icmp);
        // A kernel without ip_unprivileged_port_start (< 4.11).
        assert!(!SysctlDefaults::from_host(Some(init), false).unprivileged_ports);
        // This test process (root in the initial namespace on the bench and in CI).
        assert_eq!(
            SysctlDefaults::detect().unprivileged_icmp,
            !running_in_user_ns()
        );
    }

    #[test]
    fn defaults_are_added_only_where_allowed() {
        let mut user = BTreeMap::new();
        user.insert("kernel.shmmax".to_string(), "1".to_string());
        let names = |d: SysctlDefaults, host_network: bool| -> Vec<String> {
            with_defaults(&user, host_network, d)
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        let userns = SysctlDefaults::from_host(Some("0 100000 65536"), true);
        assert_eq!(
            names(userns, false),
            ["kernel.shmmax", "net.ipv4.ip_unprivileged_port_start"]
        );
        assert_eq!(
            names(SysctlDefaults::default(), false),
            [
                "kernel.shmmax",
                "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.ping_group_range"
            ]
        );
        assert_eq!(names(SysctlDefaults::default(), true), ["kernel.shmmax"]);
    }
}
