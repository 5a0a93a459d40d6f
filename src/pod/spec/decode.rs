//! Decode the CRI `PodSandboxConfig` that containerd forwards in `CreateSandboxRequest.options`
//! and validate it into a plain-Rust [`PodSpec`].
//!
//! Validation is deliberately strict where a value ends up in a path, a file we write or a
//! kernel interface (hostname, sysctls, cgroup parent, DNS), and lenient elsewhere (labels and
//! annotations are opaque and returned as they came). Every error names the offending field
//! with its CRI path, e.g. `linux.sysctls["kernel.foo"]: ...`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use protobuf::Message;
use protobuf::well_known_types::any::Any;

use super::sysctl::{MAX_SYSCTLS, check_sysctl};
use super::{
    CgroupParent, Dns, IdMapping, IpcMode, MAX_ID_MAPPINGS, MAX_PATH_LEN, NetworkMode, PidMode,
    PodResources, PodSpec, PortMapping, Protocol, REQUIRED_MAPPED_IDS, SpecError, UserNamespace,
    invalid,
};
use crate::host::network::{self, Bandwidth, DnsConf, PodNetworkConf};
use crate::records::cri;

/// Longest hostname the kernel accepts (`HOST_NAME_MAX`).
pub const MAX_HOSTNAME_LEN: usize = 64;
/// Most DNS servers / searches / options (generous; glibc itself uses 3 servers, 32 searches).
pub const MAX_DNS_SERVERS: usize = 16;
/// See [`MAX_DNS_SERVERS`].
pub const MAX_DNS_SEARCHES: usize = 32;
/// See [`MAX_DNS_SERVERS`].
pub const MAX_DNS_OPTIONS: usize = 32;
/// Longest single DNS search domain / option.
pub const MAX_DNS_ENTRY_LEN: usize = 253;
/// Most port mappings a pod may declare.
pub const MAX_PORT_MAPPINGS: usize = 1024;

const TYPE_URL_PREFIX: &str = "type.googleapis.com/";
const EMPTY_TYPE: &str = "google.protobuf.Empty";

impl PodSpec {
    /// Validates and converts a decoded CRI config.
    pub fn from_cri(cfg: &cri::PodSandboxConfig) -> Result<PodSpec, SpecError> {
        convert(cfg)
    }

    /// What shim-run CNI needs to know about the pod (identity, host ports, DNS, bandwidth), as
    /// containerd's CRI passes it. Fails only on bad bandwidth annotations (see
    /// [`bandwidth_of`]), which are checked here and not when decoding: CRI accepts them
    /// on pods whose network it does not set up.
    pub fn network_conf(&self) -> Result<PodNetworkConf, SpecError> {
        Ok(PodNetworkConf {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            port_mappings: self
                .port_mappings
                .iter()
                .filter(|p| p.host_port != 0)
                .map(|p| network::PortMapping {
                    protocol: match p.protocol {
                        Protocol::Tcp => "tcp",
                        Protocol::Udp => "udp",
                        Protocol::Sctp => "sctp",
                    },
                    container_port: p.container_port,
                    host_port: p.host_port,
                    host_ip: p.host_ip,
                })
                .collect(),
            dns: self.dns.as_ref().map(|d| DnsConf {
                servers: d.servers.clone(),
                searches: d.searches.clone(),
                options: d.options.clone(),
            }),
            bandwidth: bandwidth_of(&self.annotations)?,
        })
    }
}

/// Decodes `CreateSandboxRequest.options` into a validated [`PodSpec`].
///
/// Accepts `type_url` `runtime.v1.PodSandboxConfig`, also behind any `…/` prefix such as
/// `type.googleapis.com/`. An `Any` with an empty `type_url` and no bytes, or one holding
/// `google.protobuf.Empty` (containerd's sandbox controller API and `ctr` send that), yields
/// [`PodSpec::default()`]: empty names, pod network, new IPC/UTS namespaces, no PID sharing.
///
/// Note that a real `PodSandboxConfig` without `namespace_options` decodes to PID mode POD,
/// the protobuf default (`NamespaceMode` 0); the kubelet always sends the mode explicitly.
pub fn decode_pod_config(any: &Any) -> Result<PodSpec, SpecError> {
    let type_name = any
        .type_url
        .rsplit_once('/')
        .map_or(any.type_url.as_str(), |(_, n)| n);
    if any.type_url.is_empty() {
        if any.value.is_empty() {
            return Ok(PodSpec::default());
        }
        return Err(SpecError::UnsupportedType(String::new()));
    }
    // Only `type.googleapis.com/` or no prefix at all for the well-known Empty.
    if type_name == EMPTY_TYPE
        && (any.type_url == EMPTY_TYPE || any.type_url.strip_prefix(TYPE_URL_PREFIX).is_some())
    {
        return Ok(PodSpec::default());
    }
    if type_name != cri::POD_SANDBOX_CONFIG_TYPE_URL {
        return Err(SpecError::UnsupportedType(any.type_url.clone()));
    }
    let cfg = cri::PodSandboxConfig::parse_from_bytes(&any.value)
        .map_err(|e| SpecError::Decode(e.to_string()))?;
    convert(&cfg)
}

/// The protobuf bytes of the `PodSandboxConfig` in `CreateSandboxRequest.options`, when it
/// holds one (see [`decode_pod_config`]); `None` for an empty `Any` or `google.protobuf.Empty`.
pub fn pod_config_bytes(any: &Any) -> Option<&[u8]> {
    let type_name = any
        .type_url
        .rsplit_once('/')
        .map_or(any.type_url.as_str(), |(_, n)| n);
    (type_name == cri::POD_SANDBOX_CONFIG_TYPE_URL).then_some(any.value.as_slice())
}

pub(super) fn convert(cfg: &cri::PodSandboxConfig) -> Result<PodSpec, SpecError> {
    let md = cfg.metadata.as_ref();
    let linux = cfg.linux.as_ref();
    let sc = linux.and_then(|l| l.security_context.as_ref());
    let nso = sc.and_then(|s| s.namespace_options.as_ref());

    let name = md.map(|m| m.name.clone()).unwrap_or_default();
    let namespace = md.map(|m| m.namespace.clone()).unwrap_or_default();
    let uid = md.map(|m| m.uid.clone()).unwrap_or_default();
    check_ident("metadata.name", &name)?;
    check_ident("metadata.namespace", &namespace)?;
    check_ident("metadata.uid", &uid)?;

    // Namespaces first: the sysctl rules depend on them.
    let nso_field = "linux.security_context.namespace_options";
    let mode_of = |field: &str, m: &protobuf::EnumOrUnknown<cri::NamespaceMode>| {
        m.enum_value()
            .map_err(|v| invalid(format!("{nso_field}.{field}"), format!("unknown mode {v}")))
    };
    // Network and IPC: the pod's own namespace or the node's, nothing else. true = node.
    let on_node =
        |field: &str, m: &protobuf::EnumOrUnknown<cri::NamespaceMode>| match mode_of(field, m)? {
            cri::NamespaceMode::POD => Ok(false),
            cri::NamespaceMode::NODE => Ok(true),
            m => Err(invalid(
                format!("{nso_field}.{field}"),
                format!("mode {m:?} is not valid for a pod sandbox (want POD or NODE)"),
            )),
        };
    let network = match nso.map(|n| on_node("network", &n.network)).transpose()? {
        Some(true) => NetworkMode::Host,
        None | Some(false) => NetworkMode::Pod,
    };
    let ipc = match nso.map(|n| on_node("ipc", &n.ipc)).transpose()? {
        Some(true) => IpcMode::Host,
        None | Some(false) => IpcMode::Pod,
    };
    let pid = match nso.map(|n| mode_of("pid", &n.pid)).transpose()? {
        None | Some(cri::NamespaceMode::POD) => PidMode::Pod,
        Some(cri::NamespaceMode::CONTAINER) => PidMode::Container,
        Some(cri::NamespaceMode::NODE) => PidMode::Host,
        Some(cri::NamespaceMode::TARGET) => {
            let target = nso.map(|n| n.target_id.clone()).unwrap_or_default();
            if target.is_empty() {
                return Err(invalid(
                    format!("{nso_field}.target_id"),
                    "pid mode TARGET needs a target container id",
                ));
            }
            check_ident(&format!("{nso_field}.target_id"), &target)?;
            PidMode::Target(target)
        }
    };
    let userns = match nso.and_then(|n| n.userns_options.as_ref()) {
        None => None,
        Some(u) => convert_userns(&format!("{nso_field}.userns_options"), u)?,
    };

    let hostname = cfg.hostname.clone();
    if !hostname.is_empty() {
        check_hostname(&hostname).map_err(|r| invalid("hostname", r))?;
    }

    let log_directory = cfg.log_directory.clone();
    if !log_directory.is_empty() {
        check_abs_path(&log_directory).map_err(|r| invalid("log_directory", r))?;
    }

    let dns = cfg.dns_config.as_ref().map(convert_dns).transpose()?;

    if cfg.port_mappings.len() > MAX_PORT_MAPPINGS {
        return Err(invalid(
            "port_mappings",
            format!("more than {MAX_PORT_MAPPINGS} entries"),
        ));
    }
    let port_mappings = cfg
        .port_mappings
        .iter()
        .enumerate()
        .map(|(i, pm)| convert_port(i, pm))
        .collect::<Result<Vec<_>, _>>()?;

    let cgroup_parent = match linux.map(|l| l.cgroup_parent.as_str()) {
        None | Some("") => None,
        Some(raw) => {
            CgroupParent::parse(raw).map_err(|r| invalid("linux.cgroup_parent", r))?;
            Some(raw.to_owned())
        }
    };

    let mut sysctls = BTreeMap::new();
    if let Some(l) = linux {
        if l.sysctls.len() > MAX_SYSCTLS {
            return Err(invalid(
                "linux.sysctls",
                format!("more than {MAX_SYSCTLS} entries"),
            ));
        }
        for (k, v) in &l.sysctls {
            let field = format!("linux.sysctls[{k:?}]");
            let name = check_sysctl(k, v, network == NetworkMode::Host, ipc == IpcMode::Host)
                .map_err(|r| invalid(&field, r))?;
            if sysctls.insert(name, v.clone()).is_some() {
                return Err(invalid(field, "set twice (in dot and slash form)"));
            }
        }
    }

    let id = |field: &str, v: Option<&cri::Int64Value>| -> Result<Option<u32>, SpecError> {
        v.map(|v| {
            u32::try_from(v.value).map_err(|_| {
                invalid(
                    format!("linux.security_context.{field}"),
                    format!("{} is not a valid id", v.value),
                )
            })
        })
        .transpose()
    };
    let run_as_user = id("run_as_user", sc.and_then(|s| s.run_as_user.as_ref()))?;
    let run_as_group = id("run_as_group", sc.and_then(|s| s.run_as_group.as_ref()))?;
    if run_as_group.is_some() && run_as_user.is_none() {
        return Err(invalid(
            "linux.security_context.run_as_group",
            "set without run_as_user",
        ));
    }

    let resources = match linux.and_then(|l| l.resources.as_ref()) {
        None => None,
        Some(r) => Some(resources("linux.resources", r)?),
    };

    Ok(PodSpec {
        name,
        namespace,
        uid,
        attempt: md.map_or(0, |m| m.attempt),
        hostname,
        log_directory,
        dns,
        port_mappings,
        labels: cfg
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        annotations: cfg
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cgroup_parent,
        sysctls,
        network,
        ipc,
        pid,
        run_as_user,
        run_as_group,
        privileged: sc.is_some_and(|s| s.privileged),
        selinux: selinux_options(sc.and_then(|s| s.selinux_options.as_ref()))?
            .map(|o| crate::host::selinux::SelinuxOptions {
                user: o.user.clone(),
                role: o.role.clone(),
                kind: o.type_.clone(),
                level: o.level.clone(),
            })
            .filter(|o| *o != crate::host::selinux::SelinuxOptions::default()),
        userns,
        resources,
        cri_config: true,
    })
}

/// `linux.security_context.selinux_options`, each field empty or of the characters SELinux
/// names use: they end up in a mount option (`context="..."`) and in file labels.
fn selinux_options(
    o: Option<&cri::SELinuxOption>,
) -> Result<Option<&cri::SELinuxOption>, SpecError> {
    let Some(o) = o else { return Ok(None) };
    let field = "linux.security_context.selinux_options";
    for (name, v, ok) in [
        (
            "user",
            &o.user,
            crate::host::selinux::is_name as fn(&str) -> bool,
        ),
        ("role", &o.role, crate::host::selinux::is_name),
        ("type", &o.type_, crate::host::selinux::is_name),
        ("level", &o.level, crate::host::selinux::is_level),
    ] {
        if !v.is_empty() && !ok(v) {
            return Err(invalid(
                format!("{field}.{name}"),
                format!("{v:?} is not an SELinux name"),
            ));
        }
    }
    Ok(Some(o))
}

/// `userns_options`: mode NODE (no mappings, as containerd) is the node's user namespace;
/// mode POD needs uid and gid mappings ([`check_id_mappings`]); CONTAINER and TARGET are
/// invalid for a pod (as containerd's runc path).
fn convert_userns(field: &str, u: &cri::UserNamespace) -> Result<Option<UserNamespace>, SpecError> {
    let mode = u
        .mode
        .enum_value()
        .map_err(|v| invalid(format!("{field}.mode"), format!("unknown mode {v}")))?;
    match mode {
        cri::NamespaceMode::NODE => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return Err(invalid(
                    field,
                    format!(
                        "mode NODE takes no mappings (got {} uid and {} gid mappings)",
                        u.uids.len(),
                        u.gids.len()
                    ),
                ));
            }
            Ok(None)
        }
        cri::NamespaceMode::POD => Ok(Some(UserNamespace {
            uids: check_id_mappings(&format!("{field}.uids"), &u.uids)?,
            gids: check_id_mappings(&format!("{field}.gids"), &u.gids)?,
        })),
        m => Err(invalid(
            format!("{field}.mode"),
            format!("mode {m:?} is not valid (want POD or NODE)"),
        )),
    }
}

/// A uid or gid map the kernel takes and the pod can live with: 1 to [`MAX_ID_MAPPINGS`]
/// lines, none empty or past 2^32 on either side, no two overlapping on either side, and the
/// [`REQUIRED_MAPPED_IDS`] covered.
fn check_id_mappings(field: &str, maps: &[cri::IDMapping]) -> Result<Vec<IdMapping>, SpecError> {
    if maps.is_empty() {
        return Err(invalid(field, "mode POD needs at least one mapping"));
    }
    if maps.len() > MAX_ID_MAPPINGS {
        return Err(invalid(
            field,
            format!("more than {MAX_ID_MAPPINGS} mappings"),
        ));
    }
    let end = |start: u32, size: u32| u64::from(start) + u64::from(size);
    let mut out: Vec<IdMapping> = Vec::with_capacity(maps.len());
    for (i, m) in maps.iter().enumerate() {
        let f = format!("{field}[{i}]");
        if m.length == 0 {
            return Err(invalid(f, "length 0"));
        }
        // The kernel refuses id 2^32-1 (it is (uid_t)-1) and any range reaching it.
        if end(m.container_id, m.length) >= 1 << 32 || end(m.host_id, m.length) >= 1 << 32 {
            return Err(invalid(f, "the range reaches 2^32-1"));
        }
        for (j, o) in out.iter().enumerate() {
            let cross =
                |a: u32, b: u32| u64::from(a) < end(b, o.size) && u64::from(b) < end(a, m.length);
            if cross(m.container_id, o.container_id) {
                return Err(invalid(
                    f,
                    format!("its container ids overlap those of [{j}]"),
                ));
            }
            if cross(m.host_id, o.host_id) {
                return Err(invalid(f, format!("its host ids overlap those of [{j}]")));
            }
        }
        out.push(IdMapping {
            container_id: m.container_id,
            host_id: m.host_id,
            size: m.length,
        });
    }
    // The kernel takes a map only as one write shorter than a page.
    let text: usize = out
        .iter()
        .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size).len())
        .sum();
    if text >= 4096 {
        return Err(invalid(
            field,
            format!("the map is {text} bytes long, the kernel takes less than 4096"),
        ));
    }
    for id in REQUIRED_MAPPED_IDS {
        if !out
            .iter()
            .any(|m| id >= m.container_id && u64::from(id) < end(m.container_id, m.size))
        {
            return Err(invalid(
                field,
                format!(
                    "container id {id} is not mapped (the pod needs ids {REQUIRED_MAPPED_IDS:?}: \
                     root, and the pause process's 65535)"
                ),
            ));
        }
    }
    Ok(out)
}

/// Checks and converts CRI resources: no negative period or shares, a quota of -1 (no limit)
/// or more, cpusets of digits, commas and dashes.
fn resources(field: &str, r: &cri::LinuxContainerResources) -> Result<PodResources, SpecError> {
    let non_negative = |name: &str, v: i64| {
        u64::try_from(v).map_err(|_| invalid(format!("{field}.{name}"), format!("{v} is negative")))
    };
    let at_least_minus_one = |name: &str, v: i64| {
        if v < -1 {
            return Err(invalid(
                format!("{field}.{name}"),
                format!("{v} is below -1"),
            ));
        }
        Ok(v)
    };
    let cpuset = |name: &str, v: &str| {
        if v.len() > 1024
            || !v
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
        {
            return Err(invalid(
                format!("{field}.{name}"),
                "not a cpuset list (digits, ',' and '-')",
            ));
        }
        Ok(v.to_owned())
    };
    Ok(PodResources {
        cpu_period: non_negative("cpu_period", r.cpu_period)?,
        cpu_quota: at_least_minus_one("cpu_quota", r.cpu_quota)?,
        cpu_shares: non_negative("cpu_shares", r.cpu_shares)?,
        memory_limit_in_bytes: at_least_minus_one(
            "memory_limit_in_bytes",
            r.memory_limit_in_bytes,
        )?,
        cpuset_cpus: cpuset("cpuset_cpus", &r.cpuset_cpus)?,
        cpuset_mems: cpuset("cpuset_mems", &r.cpuset_mems)?,
    })
}

/// Names and ids: may be empty, no control characters, no `/` (they may end up in file names).
fn check_ident(field: &str, v: &str) -> Result<(), SpecError> {
    if v.len() > 253 {
        return Err(invalid(field, "longer than 253 bytes"));
    }
    if v.chars().any(|c| c.is_control() || c == '/') {
        return Err(invalid(
            field,
            format!("{v:?} contains `/` or a control character"),
        ));
    }
    Ok(())
}

/// RFC 1123 host name: dot-separated labels of ASCII letters, digits and `-`, each 1–63 bytes,
/// not starting or ending with `-`; at most [`MAX_HOSTNAME_LEN`] bytes in all.
pub fn check_hostname(h: &str) -> Result<(), String> {
    if h.is_empty() {
        return Err("empty".into());
    }
    if h.len() > MAX_HOSTNAME_LEN {
        return Err(format!("{h:?} is longer than {MAX_HOSTNAME_LEN} bytes"));
    }
    for label in h.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(format!(
                "{h:?} is not an RFC 1123 host name (labels of [A-Za-z0-9-], 1-63 bytes, \
                 no leading/trailing `-`)"
            ));
        }
    }
    Ok(())
}

fn check_abs_path(p: &str) -> Result<(), String> {
    if p.len() > MAX_PATH_LEN {
        return Err(format!("longer than {MAX_PATH_LEN} bytes"));
    }
    if p.bytes().any(|b| b == 0 || b == b'\n') {
        return Err("contains NUL or newline".into());
    }
    if !p.starts_with('/') {
        return Err(format!("{p:?} is not an absolute path"));
    }
    if p.split('/').any(|s| s == "..") {
        return Err(format!("{p:?} contains `..`"));
    }
    Ok(())
}

fn check_dns_word(field: &str, v: &str) -> Result<(), SpecError> {
    if v.is_empty() || v.len() > MAX_DNS_ENTRY_LEN {
        return Err(invalid(
            field,
            format!("must be 1-{MAX_DNS_ENTRY_LEN} bytes"),
        ));
    }
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            field,
            format!("{v:?} contains whitespace or a control character"),
        ));
    }
    Ok(())
}

/// A nameserver: an IPv4/IPv6 address; IPv6 may carry a `%zone` (glibc accepts that).
fn check_nameserver(s: &str) -> bool {
    if s.parse::<IpAddr>().is_ok() {
        return true;
    }
    match s.split_once('%') {
        Some((addr, zone)) => {
            addr.parse::<Ipv6Addr>().is_ok()
                && !zone.is_empty()
                && zone.len() < 16
                && zone
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        }
        None => false,
    }
}

fn convert_dns(d: &cri::DNSConfig) -> Result<Dns, SpecError> {
    for (field, list, max) in [
        ("dns_config.servers", &d.servers, MAX_DNS_SERVERS),
        ("dns_config.searches", &d.searches, MAX_DNS_SEARCHES),
        ("dns_config.options", &d.options, MAX_DNS_OPTIONS),
    ] {
        if list.len() > max {
            return Err(invalid(field, format!("more than {max} entries")));
        }
        for (i, v) in list.iter().enumerate() {
            check_dns_word(&format!("{field}[{i}]"), v)?;
        }
    }
    for (i, s) in d.servers.iter().enumerate() {
        if !check_nameserver(s) {
            return Err(invalid(
                format!("dns_config.servers[{i}]"),
                format!("{s:?} is not an IP address"),
            ));
        }
    }
    Ok(Dns {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    })
}

fn convert_port(i: usize, pm: &cri::PortMapping) -> Result<PortMapping, SpecError> {
    let field = |f: &str| format!("port_mappings[{i}].{f}");
    let protocol = match pm.protocol.enum_value() {
        Ok(cri::Protocol::TCP) => Protocol::Tcp,
        Ok(cri::Protocol::UDP) => Protocol::Udp,
        Ok(cri::Protocol::SCTP) => Protocol::Sctp,
        Err(v) => return Err(invalid(field("protocol"), format!("unknown protocol {v}"))),
    };
    let port = |f: &str, v: i32| {
        u16::try_from(v).map_err(|_| invalid(field(f), format!("{v} is not a port number")))
    };
    let host_ip = if pm.host_ip.is_empty() {
        None
    } else {
        Some(pm.host_ip.parse::<IpAddr>().map_err(|_| {
            invalid(
                field("host_ip"),
                format!("{:?} is not an IP address", pm.host_ip),
            )
        })?)
    };
    Ok(PortMapping {
        protocol,
        container_port: port("container_port", pm.container_port)?,
        host_port: port("host_port", pm.host_port)?,
        host_ip,
    })
}

/// The pod annotation that limits its ingress traffic (bits per second, a resource quantity).
pub const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
/// The pod annotation that limits its egress traffic.
pub const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";

/// The `bandwidth` CNI capability from the pod's annotations, as containerd's
/// `toCNIBandWidth`: each rate a resource quantity within 1k..=1P bits per second, its burst
/// `u32::MAX`. Checked only when the shim runs CNI itself (CRI checks them otherwise, and
/// ignores them for host-network pods).
pub fn bandwidth_of(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Bandwidth>, SpecError> {
    let rate = |key: &str| -> Result<Option<u64>, SpecError> {
        let Some(raw) = annotations.get(key) else {
            return Ok(None);
        };
        let field = || format!("annotations[{key:?}]");
        let v = parse_quantity(raw).map_err(|r| invalid(field(), r))?;
        if v < 1_000 {
            return Err(invalid(field(), "unreasonably small (< 1kbit)"));
        }
        if v > 1_000_000_000_000_000 {
            return Err(invalid(field(), "unreasonably large (> 1Pbit)"));
        }
        Ok(Some(v))
    };
    let (ingress, egress) = (rate(INGRESS_BANDWIDTH)?, rate(EGRESS_BANDWIDTH)?);
    if ingress.is_none() && egress.is_none() {
        return Ok(None);
    }
    let burst = |r: Option<u64>| if r.is_some() { u64::from(u32::MAX) } else { 0 };
    Ok(Some(Bandwidth {
        ingress_rate: ingress.unwrap_or(0),
        ingress_burst: burst(ingress),
        egress_rate: egress.unwrap_or(0),
        egress_burst: burst(egress),
    }))
}

/// Parses a Kubernetes resource quantity (`10M`, `1.5Gi`, `1e6`, `500m`) and rounds it up to an
/// integer, as `resource.Quantity.Value()` does; values beyond `u64` saturate. Negative values
/// are refused (no bandwidth can be).
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a resource quantity (e.g. 10M, 1.5Gi, 1e6)");
    let unsigned = match s.strip_prefix(['+', '-']) {
        Some(_) if s.starts_with('-') => return Err(format!("{s:?} is negative")),
        Some(rest) => rest,
        None => s,
    };
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
        return Err(bad());
    }
    // (power of ten, power of two)
    let (exp10, exp2): (i64, u32) = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e => {
            let digits = e.strip_prefix(['e', 'E']).ok_or_else(bad)?;
            let (neg, digits) = match digits.strip_prefix(['+', '-']) {
                Some(d) => (digits.starts_with('-'), d),
                None => (false, digits),
            };
            if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(bad());
            }
            let v: i64 = digits.parse().map_err(|_| bad())?;
            (if neg { -v } else { v }, 0)
        }
    };
    // value = digits * 10^(exp10 - frac digits) * 2^exp2, exactly, in u128: the digits are
    // kept below 10^20 (more significant digits than u64 holds only fit a value that saturates
    // anyway), so the shift by at most 60 cannot overflow.
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let mut mant: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        mant = mant * 10 + u128::from(b - b'0');
        if mant >= 10u128.pow(20) {
            return if int.len() as i64 + exp10 > 20 {
                Ok(u64::MAX)
            } else {
                Err(format!("{s:?} has too many digits"))
            };
        }
    }
    let num = mant << exp2;
    let scale = exp10 - frac.len() as i64;
    let value = match u32::try_from(scale.unsigned_abs()).ok() {
        _ if num == 0 => 0,
        Some(k) if scale >= 0 => 10u128
            .checked_pow(k)
            .and_then(|p| num.checked_mul(p))
            .unwrap_or(u128::MAX),
        Some(k) => 10u128.checked_pow(k).map_or(1, |den| num.div_ceil(den)),
        None if scale >= 0 => u128::MAX,
        None => 1,
    };
    Ok(u64::try_from(value).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
