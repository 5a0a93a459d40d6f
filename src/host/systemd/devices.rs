//! The device rules of the pod's scope: `DevicePolicy=strict` and the `DeviceAllow=` list
//! runc gives the runc path's pause container scope.
//!
//! Why the pause's scope needs them although the pause opens no device: on cgroup v1 systemd
//! realizes a controller of a slice the first time a unit below it wants that controller
//! (`unit_realize_cgroup_now_enable` in `src/core/cgroup.c`), and it then moves every process
//! of the slice's subtree (as the `name=systemd` hierarchy shows it) into the slice's own
//! cgroup of that controller (`unit_update_cgroup` → `cg_migrate_v1_controllers`). A delegated
//! scope that was realized before is never moved back (`unit_update_cgroup` computes no
//! migration for it). runc starts a container's scope without device properties and adds
//! them with `SetUnitProperties` in its `Set`, after it has put the init into its own devices
//! cgroup: when that container is the first unit of a fresh pod slice to want `devices`, its
//! init ends up in the pod slice's devices cgroup, which allows everything. On the runc path
//! that first unit is the pause container (harmless); with a scope that has no device rules
//! it was the pod's first app container. Starting the pause's scope with these properties
//! makes it the first devices-bearing unit of the pod slice, realized before any process is
//! in the slice. On cgroup v2 systemd attaches a BPF device program to the scope instead.
//!
//! The list is what runc derives for containerd's pause container: containerd's default spec
//! denies every device (`linux.resources.devices = [{allow: false, access: "rwm"}]`), runc
//! appends its default allowed devices (`specconv.AllowedDevices`, the same 11 rules in runc
//! 1.1 and 1.3), and its systemd driver turns the resulting allow list into `DeviceAllow=`
//! entries (1.1: `generateDeviceProperties`, `libcontainer/cgroups/systemd/common.go`; 1.3:
//! `systemdProperties`, `cgroups/devices/systemd.go`), in its emulator's order (major, minor,
//! type). We spell it as runc 1.1 does, which every systemd reads: a wildcard minor becomes
//! the device group of `/proc/devices` (`char-pts`; runc 1.3 writes `char-136` on systemd
//! ≥ 240, the same rule there) and a `major:minor` rule `/dev/char/M:m`, left out when
//! neither that node nor `/sys/dev/char/M:m` exists (systemd < 240 stats the path).

use super::wire::Value;

/// A device cgroup rule of runc's default allow list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    /// `b` (block) or `c` (char).
    kind: char,
    /// `None`: any.
    major: Option<u32>,
    /// `None`: any.
    minor: Option<u32>,
    perms: &'static str,
}

const fn rule(kind: char, major: Option<u32>, minor: Option<u32>, perms: &'static str) -> Rule {
    Rule {
        kind,
        major,
        minor,
        perms,
    }
}

/// runc's `AllowedDevices` (mknod of any device; /dev/null, zero, full, random, urandom, tty,
/// the pts devices, ptmx, tun), in the order runc's emulator yields them: by major, minor
/// (any first), type.
const RUNC_DEFAULT_RULES: [Rule; 11] = [
    rule('b', None, None, "m"),
    rule('c', None, None, "m"),
    rule('c', Some(1), Some(3), "rwm"),
    rule('c', Some(1), Some(5), "rwm"),
    rule('c', Some(1), Some(7), "rwm"),
    rule('c', Some(1), Some(8), "rwm"),
    rule('c', Some(1), Some(9), "rwm"),
    rule('c', Some(5), Some(0), "rwm"),
    rule('c', Some(5), Some(2), "rwm"),
    rule('c', Some(10), Some(200), "rwm"),
    rule('c', Some(136), None, "rwm"),
];

/// One `DeviceAllow=` entry: a device node, a `char-`/`block-` group, and its permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAllow {
    pub path: String,
    pub perms: String,
}

/// What the derivation reads from the host (a stand-in in tests).
pub trait DeviceHost {
    /// Whether `path` exists.
    fn exists(&self, path: &str) -> bool;
    /// The text of `/proc/devices` (empty if unreadable).
    fn proc_devices(&self) -> String;
}

/// This machine.
pub struct Host;

impl DeviceHost for Host {
    fn exists(&self, path: &str) -> bool {
        std::path::Path::new(path).exists()
    }
    fn proc_devices(&self) -> String {
        std::fs::read_to_string("/proc/devices").unwrap_or_default()
    }
}

/// runc 1.1's `DeviceAllow=` list for a container with containerd's default device rules.
/// Rules runc would skip are skipped (a node that does not exist, a major without a group).
pub fn runc_default_device_allow(host: &dyn DeviceHost) -> Vec<DeviceAllow> {
    let groups = host.proc_devices();
    let mut out = Vec::new();
    for r in RUNC_DEFAULT_RULES {
        let prefix = if r.kind == 'b' { "block-" } else { "char-" };
        let path = match (r.major, r.minor) {
            (None, None) => format!("{prefix}*"),
            // "*:n" rules systemd cannot express; runc warns and skips them (none here).
            (None, Some(_)) => continue,
            (Some(major), None) => match device_group(&groups, r.kind, major) {
                Some(name) => format!("{prefix}{name}"),
                None => {
                    log::warn!("no device group for {}/{major} in /proc/devices", r.kind);
                    continue;
                }
            },
            (Some(major), Some(minor)) => {
                let dir = if r.kind == 'b' { "block" } else { "char" };
                let node = format!("/dev/{dir}/{major}:{minor}");
                if !host.exists(&node) && !host.exists(&format!("/sys{node}")) {
                    log::debug!("skipping device {node} for systemd: not there");
                    continue;
                }
                node
            }
        };
        out.push(DeviceAllow {
            path,
            perms: r.perms.into(),
        });
    }
    out
}

/// The name `/proc/devices` gives major `major` of type `kind` (runc's `findDeviceGroup`: the
/// first match in the section of that type).
fn device_group(proc_devices: &str, kind: char, major: u32) -> Option<String> {
    let mut section = None;
    for line in proc_devices.lines().map(str::trim) {
        match line {
            "Character devices:" => section = Some('c'),
            "Block devices:" => section = Some('b'),
            "" => {}
            _ if section == Some(kind) => {
                let mut f = line.split_whitespace();
                if let (Some(m), Some(name)) = (f.next(), f.next())
                    && m.parse::<u32>() == Ok(major)
                {
                    return Some(name.to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// The unit properties runc 1.1 sends for those rules: `DevicePolicy=strict`, an empty
/// `DeviceAllow=` (which clears the list of an existing unit), then the list.
pub fn properties(allow: &[DeviceAllow]) -> Vec<(String, Value)> {
    let list = |entries: &[DeviceAllow]| {
        Value::Array(
            "(ss)".into(),
            entries
                .iter()
                .map(|e| {
                    Value::Struct(vec![
                        Value::Str(e.path.clone()),
                        Value::Str(e.perms.clone()),
                    ])
                })
                .collect(),
        )
    };
    vec![
        ("DevicePolicy".into(), Value::Str("strict".into())),
        ("DeviceAllow".into(), list(&[])),
        ("DeviceAllow".into(), list(allow)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with `/proc/devices` as the Debian 12 kernel shows it and some nodes present.
    struct Stand {
        nodes: Vec<&'static str>,
        proc_devices: &'static str,
    }

    impl DeviceHost for Stand {
        fn exists(&self, path: &str) -> bool {
            self.nodes.contains(&path)
        }
        fn proc_devices(&self) -> String {
            self.proc_devices.into()
        }
    }

    const PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
 10 misc
 13 input
128 ptm
136 pts
180 usb

Block devices:
  8 sd
  9 md
136 notpts
254 mdp
";

    const ALL_NODES: [&str; 8] = [
        "/dev/char/1:3",
        "/dev/char/1:5",
        "/dev/char/1:7",
        "/dev/char/1:8",
        "/dev/char/1:9",
        "/dev/char/5:0",
        "/dev/char/5:2",
        "/dev/char/10:200",
    ];

    fn pairs(list: &[DeviceAllow]) -> Vec<(&str, &str)> {
        list.iter()
            .map(|e| (e.path.as_str(), e.perms.as_str()))
            .collect()
    }

    /// The list runc 1.1's `generateDeviceProperties` makes for containerd's pause container
    /// on a host with every node: mknod of anything, the standard nodes, ptmx, tun and the
    /// pts group.
    #[test]
    fn the_list_is_runc_s_for_containerd_s_default_spec() {
        let host = Stand {
            nodes: ALL_NODES.to_vec(),
            proc_devices: PROC_DEVICES,
        };
        assert_eq!(
            pairs(&runc_default_device_allow(&host)),
            [
                ("block-*", "m"),
                ("char-*", "m"),
                ("/dev/char/1:3", "rwm"),
                ("/dev/char/1:5", "rwm"),
                ("/dev/char/1:7", "rwm"),
                ("/dev/char/1:8", "rwm"),
                ("/dev/char/1:9", "rwm"),
                ("/dev/char/5:0", "rwm"),
                ("/dev/char/5:2", "rwm"),
                ("/dev/char/10:200", "rwm"),
                ("char-pts", "rwm"),
            ]
        );
    }

    /// runc's emulator yields its rules sorted by (major, minor, type), any (-1) first.
    #[test]
    fn the_rules_are_in_runc_s_emulator_order() {
        let key = |r: &Rule| {
            (
                r.major.map_or(-1, i64::from),
                r.minor.map_or(-1, i64::from),
                r.kind,
            )
        };
        let mut sorted = RUNC_DEFAULT_RULES;
        sorted.sort_by_key(key);
        assert_eq!(sorted, RUNC_DEFAULT_RULES);
    }

    /// As runc: a node found only in /sys/dev counts, a missing one is skipped (no tun module
    /// loaded), a major without a group in /proc/devices too.
    #[test]
    fn absent_nodes_and_groups_are_skipped_as_runc_skips_them() {
        let host = Stand {
            nodes: vec![
                "/dev/char/1:3",
                "/sys/dev/char/1:5",
                "/dev/char/1:7",
                "/dev/char/1:8",
                "/dev/char/1:9",
                "/dev/char/5:0",
                "/dev/char/5:2",
            ],
            proc_devices: "Character devices:\n  1 mem\n\nBlock devices:\n136 notpts\n",
        };
        let list = runc_default_device_allow(&host);
        let paths: Vec<&str> = list.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"/dev/char/1:5"), "{paths:?}");
        assert!(!paths.contains(&"/dev/char/10:200"), "{paths:?}");
        assert!(!paths.iter().any(|p| p.contains("pts")), "{paths:?}");
        assert_eq!(list.len(), 9, "{paths:?}");
    }

    #[test]
    fn the_properties_are_a_strict_policy_and_the_list() {
        let allow = vec![DeviceAllow {
            path: "/dev/char/1:3".into(),
            perms: "rwm".into(),
        }];
        let props = properties(&allow);
        assert_eq!(
            props,
            vec![
                ("DevicePolicy".to_string(), Value::Str("strict".into())),
                (
                    "DeviceAllow".to_string(),
                    Value::Array("(ss)".into(), vec![])
                ),
                (
                    "DeviceAllow".to_string(),
                    Value::Array(
                        "(ss)".into(),
                        vec![Value::Struct(vec![
                            Value::Str("/dev/char/1:3".into()),
                            Value::Str("rwm".into())
                        ])]
                    )
                ),
            ]
        );
        assert_eq!(props[2].1.signature(), "a(ss)");
    }
}
