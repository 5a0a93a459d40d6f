//! The pod's configuration as plain Rust: [`PodSpec`] and its parts, free of protobuf types.
//!
//! * [`decode`]: decode the CRI `PodSandboxConfig` that containerd forwards in
//!   `CreateSandboxRequest.options` and validate it into a [`PodSpec`] (and the pod annotations
//!   into what CNI is told);
//! * [`sysctl`]: pod sysctls (names, `/proc/sys` paths, containerd's defaults, validation).
//!
//! Dependencies point one way: `decode` uses this module and `sysctl`; this module uses only
//! `sysctl` and `systemd::names` (leaves: systemd's slice layout), so nothing here names
//! `decode` (`hack/check-cycles.sh`).
//!
//! Everything here is pure (no syscalls) except [`SysctlDefaults::detect`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};

pub mod decode;
pub mod sysctl;

pub use sysctl::{
    MAX_SYSCTL_NAME_LEN, MAX_SYSCTL_VALUE_LEN, MAX_SYSCTLS, SysctlDefaults, canonical_sysctl_name,
    running_in_user_ns, sysctl_path,
};

/// Longest path (cgroup parent, log directory) we accept.
pub const MAX_PATH_LEN: usize = 4096;

/// Why a pod config was rejected. `Display` always starts with the CRI field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The `Any` holds something other than a `PodSandboxConfig` (or `Empty`).
    #[error("options: unsupported type_url {0:?} (want \"runtime.v1.PodSandboxConfig\")")]
    UnsupportedType(String),
    /// The bytes are not a valid `PodSandboxConfig`.
    #[error("options: cannot decode runtime.v1.PodSandboxConfig: {0}")]
    Decode(String),
    /// A field has an invalid value.
    #[error("{field}: {reason}")]
    Invalid {
        /// CRI path of the field, e.g. `linux.sysctls["kernel.foo"]`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A field asks for something this shim cannot do (yet).
    #[error("{field}: {what} are not supported by this shim yet")]
    Unsupported {
        /// CRI path of the field.
        field: String,
        /// The feature, plural (e.g. "user namespaces").
        what: &'static str,
    },
}

/// An invalid pod config is the caller's (InvalidArgument); a feature this shim lacks is
/// Unimplemented. (Only CreateSandbox decodes pod configs: containerd's task-API downgrade on
/// Unimplemented does not apply.)
impl From<SpecError> for crate::records::error::Error {
    fn from(e: SpecError) -> Self {
        let kind = match &e {
            SpecError::UnsupportedType(_) | SpecError::Decode(_) | SpecError::Invalid { .. } => {
                crate::records::error::Kind::InvalidArgument
            }
            SpecError::Unsupported { .. } => crate::records::error::Kind::Unimplemented,
        };
        crate::records::error::Error::new(kind, e.to_string())
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// DNS settings for the pod's `resolv.conf`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dns {
    /// Nameserver addresses (validated as IP addresses, IPv6 may carry a `%zone`).
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options, e.g. `ndots:5`.
    pub options: Vec<String>,
}

/// Transport protocol of a port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP (CRI default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

/// One `hostPort` mapping of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// Transport protocol.
    pub protocol: Protocol,
    /// Port inside the pod (0 = unspecified).
    pub container_port: u16,
    /// Port on the host (0 = no host port).
    pub host_port: u16,
    /// Host address to bind, `None` for all addresses.
    pub host_ip: Option<IpAddr>,
}

/// Network namespace of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkMode {
    /// A new network namespace (and a new UTS namespace) for the pod.
    #[default]
    Pod,
    /// The node's network (and UTS) namespace (`hostNetwork: true`).
    Host,
}

/// IPC namespace of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IpcMode {
    /// A new IPC namespace shared by the pod's containers.
    #[default]
    Pod,
    /// The node's IPC namespace (`hostIPC: true`).
    Host,
}

/// PID namespace of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PidMode {
    /// Each container gets its own PID namespace (the kubelet's default).
    #[default]
    Container,
    /// One PID namespace for the whole pod (`shareProcessNamespace: true`).
    Pod,
    /// The node's PID namespace (`hostPID: true`).
    Host,
    /// The PID namespace of the named container.
    Target(String),
}

/// `linux.cgroup_parent`, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupParent {
    /// A cgroupfs path, absolute, relative to the cgroup root (e.g. `/kubepods/burstable/pod…`).
    Fs(PathBuf),
    /// A systemd form: a slice unit name (`kubepods-burstable-pod….slice`, also when it came
    /// as its expanded path) or `slice:prefix:name`.
    Systemd(String),
}

impl CgroupParent {
    /// Classifies and validates a non-empty `cgroup_parent` value the way containerd's CRI
    /// tells the two drivers apart (`getCgroupsPath`: `strings.HasSuffix(path.Base(parent),
    /// ".slice")`, then `<base>:cri-containerd:<id>` for every container):
    ///
    /// * an absolute path whose last component ends in `.slice` → [`CgroupParent::Systemd`]
    ///   with that slice unit name. This is what the kubelet's systemd driver sends: its
    ///   `CgroupName.ToSystemd()` is runc's `ExpandSlice` of the pod slice, e.g.
    ///   `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice`. The
    ///   path must be exactly that expansion (see [`slice_of_expanded_path`]);
    /// * any other absolute path → [`CgroupParent::Fs`]: no `.`/`..` components;
    /// * `*.slice` without `/` → [`CgroupParent::Systemd`] (the bare unit name, which no
    ///   kubelet sends but containerd takes the same way);
    /// * `slice:prefix:name` (three `:`-separated parts, the slice part empty or `*.slice`, no
    ///   `/`) → [`CgroupParent::Systemd`].
    ///
    /// No NUL or newline anywhere.
    pub fn parse(raw: &str) -> Result<CgroupParent, String> {
        if raw.is_empty() {
            return Err("empty".into());
        }
        if raw.len() > MAX_PATH_LEN {
            return Err(format!("longer than {MAX_PATH_LEN} bytes"));
        }
        if raw.bytes().any(|b| b == 0 || b == b'\n') {
            return Err("contains NUL or newline".into());
        }
        if raw.starts_with('/') {
            let p = Path::new(raw);
            for c in p.components() {
                match c {
                    Component::RootDir | Component::Normal(_) => {}
                    _ => return Err(format!("{raw:?} has a `.` or `..` component")),
                }
            }
            // `Path::components` silently drops `.`; catch it explicitly.
            if raw.split('/').any(|s| s == "." || s == "..") {
                return Err(format!("{raw:?} has a `.` or `..` component"));
            }
            if let Some(slice) = slice_of_expanded_path(raw)? {
                return Ok(CgroupParent::Systemd(slice));
            }
            return Ok(CgroupParent::Fs(p.to_path_buf()));
        }
        if raw.contains('/') {
            return Err(format!(
                "{raw:?} is neither an absolute cgroupfs path nor a systemd slice"
            ));
        }
        let unit_ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.@\\".contains(&b))
        };
        let parts: Vec<&str> = raw.split(':').collect();
        match parts.as_slice() {
            [slice] if slice.ends_with(".slice") && unit_ok(slice) => {
                Ok(CgroupParent::Systemd(raw.into()))
            }
            [slice, prefix, name]
                if (slice.is_empty() || (slice.ends_with(".slice") && unit_ok(slice)))
                    && (prefix.is_empty() || unit_ok(prefix))
                    && unit_ok(name) =>
            {
                Ok(CgroupParent::Systemd(raw.into()))
            }
            _ => Err(format!(
                "{raw:?} is neither an absolute cgroupfs path nor a systemd slice \
                 (`name.slice` or `slice:prefix:name`)"
            )),
        }
    }
}

/// The slice unit named by an absolute `cgroup_parent` whose last component ends in
/// `.slice` (containerd's test for the systemd form, trailing `/` ignored as `path.Base`
/// ignores it), `None` for any other path. The path must be the slice's own expansion
/// (runc's `ExpandSlice`, the only layout systemd gives a slice): containerd and runc use the
/// last component alone, so a path such as `/a.slice/c.slice` would put the runc path's pause
/// and containers in `/c.slice`, while containerd's `PodSandboxStats` reads the path as given —
/// the pod would run in one cgroup and be measured in another. The kubelet never sends such a
/// path (`ToSystemd()` is `ExpandSlice` of the pod slice); it is refused, naming both paths.
fn slice_of_expanded_path(raw: &str) -> Result<Option<String>, String> {
    let trimmed = raw.trim_end_matches('/');
    let Some((_, base)) = trimmed.rsplit_once('/') else {
        return Ok(None);
    };
    if !base.ends_with(".slice") {
        return Ok(None);
    }
    let expanded = crate::host::systemd::names::expand_slice(base).map_err(|e| {
        format!("{raw:?} ends in a systemd slice, but {e} (runc could not place the pod there)")
    })?;
    if Path::new(trimmed) != expanded {
        return Err(format!(
            "{raw:?} ends in the systemd slice {base}, whose cgroup is {} (runc and containerd \
             use the slice name alone: the pod would run there, not at the path given)",
            expanded.display()
        ));
    }
    Ok(Some(base.to_string()))
}

/// One line of a user namespace's uid or gid map: container ids `container_id ..
/// container_id + size` are host ids `host_id ..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// Most lines of a uid or gid map (the kernel's limit since Linux 4.15).
pub const MAX_ID_MAPPINGS: usize = 340;

/// Container ids a pod's user namespace must map, in both maps: 0 (the containers' root, which
/// owns the pod files and /dev/shm) and 65535 (the pause process runs as 65535:65535, as
/// Kubernetes' pause image; `pause::PAUSE_UID`).
pub const REQUIRED_MAPPED_IDS: [u32; 2] = [0, 65535];

/// The pod's own user namespace (CRI `userns_options` mode POD): the pause process creates it
/// with these maps and the pod's containers join it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserNamespace {
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
}

impl UserNamespace {
    /// The host uid and gid of the namespace's root (container id 0).
    pub fn host_root(&self) -> (u32, u32) {
        (host_id(&self.uids, 0), host_id(&self.gids, 0))
    }

    /// `/proc/<pid>/uid_map` content (one `container host size` line per mapping).
    pub fn uid_map(&self) -> String {
        map_text(&self.uids)
    }

    /// `/proc/<pid>/gid_map` content.
    pub fn gid_map(&self) -> String {
        map_text(&self.gids)
    }
}

/// The host id of container id `id` (validated maps cover 0; 65534, the overflow id, else).
fn host_id(maps: &[IdMapping], id: u32) -> u32 {
    maps.iter()
        .find(|m| {
            id >= m.container_id && u64::from(id) < u64::from(m.container_id) + u64::from(m.size)
        })
        .map_or(65534, |m| m.host_id + (id - m.container_id))
}

fn map_text(maps: &[IdMapping]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size))
        .collect()
}

/// A pod's `linux.resources` (CRI `LinuxContainerResources`; 0 and "" mean "not specified").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResources {
    pub cpu_period: u64,
    pub cpu_quota: i64,
    pub cpu_shares: u64,
    pub memory_limit_in_bytes: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
}

/// The validated pod configuration, free of protobuf types.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSpec {
    /// Pod name (`metadata.name`).
    pub name: String,
    /// Pod namespace (`metadata.namespace`).
    pub namespace: String,
    /// Pod UID (`metadata.uid`).
    pub uid: String,
    /// Sandbox attempt number (`metadata.attempt`).
    pub attempt: u32,
    /// Pod hostname. Empty stays empty here (the kubelet only leaves it empty for host-network
    /// pods); [`crate::pod::files::PodFiles::write`] then falls back to the node's hostname,
    /// as containerd does.
    pub hostname: String,
    /// Host directory for container logs (absolute, or empty).
    pub log_directory: String,
    /// DNS config; `None` means "use the node's resolv.conf".
    pub dns: Option<Dns>,
    /// Host port mappings.
    pub port_mappings: Vec<PortMapping>,
    /// Pod labels, as given.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations, as given (must be returned unaltered in status).
    pub annotations: BTreeMap<String, String>,
    /// Raw `linux.cgroup_parent`, `None` when empty. Validated; see [`PodSpec::cgroup_parent_kind`].
    pub cgroup_parent: Option<String>,
    /// Pod sysctls as given by the user, names canonicalised to dot form (see [`sysctl_path`]).
    pub sysctls: BTreeMap<String, String>,
    /// Network (and UTS) namespace.
    pub network: NetworkMode,
    /// IPC namespace.
    pub ipc: IpcMode,
    /// PID namespace.
    pub pid: PidMode,
    /// `security_context.run_as_user`.
    pub run_as_user: Option<u32>,
    /// `security_context.run_as_group` (only valid together with `run_as_user`).
    pub run_as_group: Option<u32>,
    /// `security_context.privileged`.
    pub privileged: bool,
    /// `security_context.selinux_options`, when any field is set.
    pub selinux: Option<crate::host::selinux::SelinuxOptions>,
    /// The pod's own user namespace (`userns_options` mode POD); `None`: the node's.
    pub userns: Option<UserNamespace>,
    /// `linux.resources`: the pod's resources (what the runc path writes into its pause
    /// container's annotations; reported to NRI in the sandbox spec).
    pub resources: Option<PodResources>,
    /// A CRI `PodSandboxConfig` was given. False: none, or `google.protobuf.Empty` (the sandbox
    /// API used directly, as by `ctr` or containerd's Go client), where an empty `netns_path`
    /// may mean the host network (see [`PodSpec::network_plan`]).
    pub cri_config: bool,
}

/// Where the pod's network namespace comes from (docs/networking.md's decision table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPlan {
    /// The caller's `netns_path` (CRI made it and runs CNI).
    Given,
    /// The shim makes it: CNI when a network config exists, else loopback only (unless
    /// `[network] require_cni`); see [`crate::host::network`].
    ShimOwned,
    /// The node's network (and UTS) namespace: hostNetwork pods, and sandboxes without a
    /// netns and without a pod config when shim-owned networking is off.
    Host,
}

/// What a member container whose spec asks for a new namespace (an entry without a path) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberNamespace {
    /// The pause process's: `/proc/<pause>/ns/<name>`.
    Pause(&'static str),
    /// The node's: the entry is removed (as CRI does for hostNetwork/hostIPC containers).
    Host,
    /// Its own new one: the entry stays as it is.
    Own,
}

impl PodSpec {
    /// The pod's sysctls plus containerd's podsandbox defaults that `defaults` allows, sorted
    /// by name (see [`sysctl::with_defaults`]).
    /// As containerd, a user-namespaced pod gets no default `ping_group_range`.
    pub fn effective_sysctls(&self, defaults: SysctlDefaults) -> Vec<(String, String)> {
        let defaults = SysctlDefaults {
            unprivileged_icmp: defaults.unprivileged_icmp && self.userns.is_none(),
            ..defaults
        };
        sysctl::with_defaults(&self.sysctls, self.network == NetworkMode::Host, defaults)
    }

    /// The classified cgroup parent, if any (already validated by [`decode_pod_config`]).
    pub fn cgroup_parent_kind(&self) -> Option<CgroupParent> {
        self.cgroup_parent
            .as_deref()
            .and_then(|raw| CgroupParent::parse(raw).ok())
    }

    /// The network decision for a CreateSandbox: `netns_given` (a non-empty `netns_path`),
    /// `shim_networking` (`[network] sandboxes`). A pod asking for the host network keeps it
    /// whatever else is given; an error names what is missing.
    ///
    /// | host network | netns_path | shim networking | pod config | plan        |
    /// |--------------|------------|-----------------|------------|-------------|
    /// | yes          | any        | any             | CRI        | Host        |
    /// | no           | given      | any             | any        | Given       |
    /// | no           | empty      | on              | any        | ShimOwned   |
    /// | no           | empty      | off             | none       | Host        |
    /// | no           | empty      | off             | CRI        | error       |
    pub fn network_plan(
        &self,
        netns_given: bool,
        shim_networking: bool,
    ) -> Result<NetworkPlan, &'static str> {
        if self.network == NetworkMode::Host {
            Ok(NetworkPlan::Host)
        } else if netns_given {
            Ok(NetworkPlan::Given)
        } else if shim_networking {
            Ok(NetworkPlan::ShimOwned)
        } else if !self.cri_config {
            Ok(NetworkPlan::Host)
        } else {
            Err(
                "no netns_path for a pod that does not ask for the host network, and \
                 shim-owned networking is disabled ([network] sandboxes = false)",
            )
        }
    }

    /// What a member container gets for a namespace of OCI type `kind` that its spec asks to
    /// be new: the pod's (the pause process's) network, UTS and IPC namespaces, or the node's
    /// where the pod uses the node's; the pod's PID namespace only when the pod shares one.
    /// CRI already sends these paths; other clients (containerd's API, `ctr run --sandbox`)
    /// do not.
    pub fn member_namespace(&self, kind: &str) -> MemberNamespace {
        let pod_or_host = |host: bool, name| {
            if host {
                MemberNamespace::Host
            } else {
                MemberNamespace::Pause(name)
            }
        };
        match kind {
            "network" => pod_or_host(self.network == NetworkMode::Host, "net"),
            "uts" => pod_or_host(self.host_uts(), "uts"),
            "ipc" => pod_or_host(self.ipc == IpcMode::Host, "ipc"),
            "pid" if self.pid == PidMode::Pod => MemberNamespace::Pause("pid"),
            "user" if self.userns.is_some() => MemberNamespace::Pause("user"),
            _ => MemberNamespace::Own,
        }
    }

    /// Whether the pod shares the node's UTS namespace (it does exactly when it uses the host
    /// network, as in containerd).
    pub fn host_uts(&self) -> bool {
        self.network == NetworkMode::Host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_decision_table() {
        use NetworkPlan::*;
        let pod = |network, cri_config| PodSpec {
            network,
            cri_config,
            ..Default::default()
        };
        let (p, h) = (NetworkMode::Pod, NetworkMode::Host);
        // (spec, netns given, shim networking) -> plan
        for (spec, given, shim, want) in [
            (pod(h, true), false, true, Ok(Host)),
            (pod(h, true), true, true, Ok(Host)),
            (pod(h, true), false, false, Ok(Host)),
            (pod(p, true), true, true, Ok(Given)),
            (pod(p, false), true, false, Ok(Given)),
            (pod(p, true), false, true, Ok(ShimOwned)),
            (pod(p, false), false, true, Ok(ShimOwned)),
            (pod(p, false), false, false, Ok(Host)),
        ] {
            assert_eq!(
                spec.network_plan(given, shim),
                want,
                "{spec:?} {given} {shim}"
            );
        }
        let e = pod(p, true).network_plan(false, false).unwrap_err();
        assert!(e.contains("sandboxes = false"), "{e}");
    }

    #[test]
    fn member_namespaces() {
        use MemberNamespace::*;
        let pod = PodSpec {
            pid: PidMode::Pod,
            ..Default::default()
        };
        let kinds = ["network", "uts", "ipc", "pid", "mount", "cgroup", "user"];
        let got = |s: &PodSpec| kinds.map(|k| s.member_namespace(k));
        assert_eq!(
            got(&pod),
            [
                Pause("net"),
                Pause("uts"),
                Pause("ipc"),
                Pause("pid"),
                Own,
                Own,
                Own
            ]
        );
        let host = PodSpec {
            network: NetworkMode::Host,
            ipc: IpcMode::Host,
            pid: PidMode::Container,
            ..Default::default()
        };
        assert_eq!(got(&host), [Host, Host, Host, Own, Own, Own, Own]);
        let hostnet = PodSpec {
            network: NetworkMode::Host,
            ..Default::default()
        };
        assert_eq!(
            got(&hostnet),
            [Host, Host, Pause("ipc"), Own, Own, Own, Own]
        );
    }

    #[test]
    fn network_conf_of_a_pod() {
        let spec = PodSpec {
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            port_mappings: vec![
                PortMapping {
                    protocol: Protocol::Udp,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: None,
                },
                PortMapping {
                    protocol: Protocol::Tcp,
                    container_port: 80,
                    host_port: 0,
                    host_ip: None,
                },
            ],
            dns: Some(Dns {
                servers: vec!["10.0.0.10".into()],
                ..Default::default()
            }),
            annotations: [(
                "kubernetes.io/egress-bandwidth".to_string(),
                "1M".to_string(),
            )]
            .into(),
            ..Default::default()
        };
        let conf = spec.network_conf().unwrap();
        assert_eq!(
            (
                conf.name.as_str(),
                conf.namespace.as_str(),
                conf.uid.as_str()
            ),
            ("web", "default", "u1")
        );
        assert_eq!(
            conf.port_mappings,
            [crate::host::network::PortMapping {
                protocol: "udp",
                container_port: 53,
                host_port: 5353,
                host_ip: None
            }]
        );
        assert_eq!(conf.dns.unwrap().servers, ["10.0.0.10"]);
        assert_eq!(conf.bandwidth.unwrap().egress_rate, 1_000_000);
    }

    #[test]
    fn spec_errors_keep_their_kind_on_the_wire() {
        use crate::records::error::{Error, Kind};
        let table = [
            (
                SpecError::UnsupportedType("x".into()),
                Kind::InvalidArgument,
            ),
            (SpecError::Decode("truncated".into()), Kind::InvalidArgument),
            (invalid("hostname", "too long"), Kind::InvalidArgument),
            (
                SpecError::Unsupported {
                    field: "linux.security_context.namespace_options.userns_options".into(),
                    what: "user namespaces",
                },
                Kind::Unimplemented,
            ),
        ];
        for (e, kind) in table {
            let text = e.to_string();
            let err = Error::from(e);
            assert_eq!(err.kind(), kind, "{text}");
            assert_eq!(err.message(), text);
        }
    }
}
