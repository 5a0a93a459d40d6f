//! The verbose info against the Go structures containerd decodes it into. Each mirror below is
//! a Go struct, field by field, with its JSON tag: `deny_unknown_fields` fails on a key the Go
//! struct does not have (containerd 2.3 would drop it), and the Rust types fail on a value of
//! another JSON type (containerd 2.3 would fail the whole PodSandboxStatus).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protobuf::Message;
use serde::Deserialize;
use serde_json::{Value, json};

use super::*;
use crate::records::cri;

/// containerd v2.3.4 `internal/cri/server/podsandbox/types/sandbox_info.go:29-45` (the same
/// fields as v2.1.9's `internal/cri/types/sandbox_info.go`, which has no overhead/resources).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SandboxInfo {
    pid: u32, // Pid uint32 `json:"pid"`
    #[serde(rename = "processStatus")]
    status: String, // Status string `json:"processStatus"`
    #[serde(rename = "netNamespaceClosed")]
    net_ns_closed: bool, // NetNSClosed bool `json:"netNamespaceClosed"`
    image: String, // Image string `json:"image"`
    #[serde(rename = "snapshotKey")]
    snapshot_key: String, // SnapshotKey string `json:"snapshotKey"`
    snapshotter: String, // Snapshotter string `json:"snapshotter"`
    #[serde(rename = "runtimeType")]
    runtime_type: String, // RuntimeType string `json:"runtimeType"`
    #[serde(rename = "runtimeOptions")]
    runtime_options: Value, // RuntimeOptions any `json:"runtimeOptions"`
    config: Option<PodSandboxConfig>, // Config *runtime.PodSandboxConfig `json:"config"`
    #[serde(rename = "runtimeSpec")]
    runtime_spec: Option<BTreeMap<String, Value>>, // RuntimeSpec *specs.Spec `json:"runtimeSpec"`
    #[serde(rename = "cniResult")]
    cni_result: Option<CniResultGo>, // CNIResult *cni.Result `json:"cniResult"`
    #[serde(rename = "sandboxMetadata", default)]
    metadata: Option<Value>, // Metadata *sandboxstore.Metadata `json:"sandboxMetadata"`
    #[serde(default)]
    overhead: Option<LinuxContainerResources>, // `json:"overhead,omitempty"`
    #[serde(default)]
    resources: Option<LinuxContainerResources>, // `json:"resources,omitempty"`
}

// cri-api v0.36.3 (the version containerd 2.3.4's go.mod names), `pkg/apis/runtime/v1/api.pb.go`
// (protoc-gen-go): every field `json:"<proto name>,omitempty"`, so all are optional here.

/// api.pb.go:1886-1937
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct PodSandboxConfig {
    metadata: Option<PodSandboxMetadata>,
    hostname: Option<String>,
    log_directory: Option<String>,
    dns_config: Option<DnsConfig>,
    port_mappings: Option<Vec<PortMapping>>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    linux: Option<LinuxPodSandboxConfig>,
    windows: Option<WindowsPodSandboxConfig>,
}

/// api.pb.go:1812-1824
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct PodSandboxMetadata {
    name: Option<String>,
    uid: Option<String>,
    namespace: Option<String>,
    attempt: Option<u32>,
}

/// api.pb.go:941-952
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct DnsConfig {
    servers: Option<Vec<String>>,
    searches: Option<Vec<String>>,
    options: Option<Vec<String>>,
}

/// api.pb.go:1006-1027 (Protocol is an int32 enum)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct PortMapping {
    protocol: Option<i32>,
    container_port: Option<i32>,
    host_port: Option<i32>,
    host_ip: Option<String>,
}

/// api.pb.go:1725-1741
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct LinuxPodSandboxConfig {
    cgroup_parent: Option<String>,
    security_context: Option<LinuxSandboxSecurityContext>,
    sysctls: Option<BTreeMap<String, String>>,
    overhead: Option<LinuxContainerResources>,
    resources: Option<LinuxContainerResources>,
}

/// api.pb.go:1511-1555
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct LinuxSandboxSecurityContext {
    namespace_options: Option<NamespaceOption>,
    selinux_options: Option<SeLinuxOption>,
    run_as_user: Option<Int64Value>,
    run_as_group: Option<Int64Value>,
    readonly_rootfs: Option<bool>,
    supplemental_groups: Option<Vec<i64>>,
    supplemental_groups_policy: Option<i32>,
    privileged: Option<bool>,
    seccomp: Option<SecurityProfile>,
    apparmor: Option<SecurityProfile>,
    seccomp_profile_path: Option<String>,
}

/// api.pb.go:1366-1393
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct NamespaceOption {
    network: Option<i32>,
    pid: Option<i32>,
    ipc: Option<i32>,
    target_id: Option<String>,
    userns_options: Option<UserNamespace>,
}

/// api.pb.go:1301-1312
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct UserNamespace {
    mode: Option<i32>,
    uids: Option<Vec<IdMapping>>,
    gids: Option<Vec<IdMapping>>,
}

/// api.pb.go:1237-1247
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct IdMapping {
    host_id: Option<u32>,
    container_id: Option<u32>,
    length: Option<u32>,
}

/// api.pb.go:1461-1467
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Int64Value {
    value: Option<i64>,
}

/// api.pb.go:4509-4517
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SeLinuxOption {
    user: Option<String>,
    role: Option<String>,
    #[serde(rename = "type")]
    type_: Option<String>,
    level: Option<String>,
}

/// api.pb.go:1666-1677
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SecurityProfile {
    profile_type: Option<i32>,
    localhost_ref: Option<String>,
}

/// api.pb.go:4322-4348
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct LinuxContainerResources {
    cpu_period: Option<i64>,
    cpu_quota: Option<i64>,
    cpu_shares: Option<i64>,
    memory_limit_in_bytes: Option<i64>,
    oom_score_adj: Option<i64>,
    cpuset_cpus: Option<String>,
    cpuset_mems: Option<String>,
    hugepage_limits: Option<Vec<HugepageLimit>>,
    unified: Option<BTreeMap<String, String>>,
    memory_swap_limit_in_bytes: Option<i64>,
}

/// api.pb.go:4452-4462
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct HugepageLimit {
    page_size: Option<String>,
    limit: Option<u64>,
}

/// api.pb.go:5129-5135
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct WindowsPodSandboxConfig {
    security_context: Option<WindowsSandboxSecurityContext>,
}

/// api.pb.go:5053-5067
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct WindowsSandboxSecurityContext {
    run_as_username: Option<String>,
    credential_spec: Option<String>,
    host_process: Option<bool>,
    namespace_options: Option<WindowsNamespaceOption>,
}

/// api.pb.go:5004-5011
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct WindowsNamespaceOption {
    network: Option<i32>,
}

// go-cni v1.1.13 (containerd 2.3.4's go.mod), result.go: no JSON tags, so the Go field names.

/// result.go `Result` (`raw` is unexported: never written)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(non_snake_case, dead_code)]
struct CniResultGo {
    Interfaces: BTreeMap<String, CniConfigGo>,
    DNS: Option<Vec<CniDns>>,
    Routes: Option<Vec<CniRoute>>,
}

/// result.go `Config`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(non_snake_case, dead_code)]
struct CniConfigGo {
    IPConfigs: Option<Vec<CniIpConfig>>,
    Mac: String,
    Sandbox: String,
    PciID: String,
    SocketPath: String,
}

/// result.go `IPConfig` (net.IP marshals as its text form)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(non_snake_case, dead_code)]
struct CniIpConfig {
    IP: String,
    Gateway: String,
}

/// containernetworking/cni v1.3.0 `pkg/types/types.go` `DNS`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct CniDns {
    nameservers: Option<Vec<String>>,
    domain: Option<String>,
    search: Option<Vec<String>>,
    options: Option<Vec<String>>,
}

/// containernetworking/cni v1.3.0 `pkg/types/types.go` `route` (what `Route.MarshalJSON` writes)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct CniRoute {
    dst: String,
    gw: Option<String>,
    mtu: Option<i64>,
    advmss: Option<i64>,
    priority: Option<i64>,
    table: Option<i64>,
    scope: Option<i64>,
}

/// A pod config with every field of PodSandboxConfig and of every message in it set.
fn full_config() -> cri::PodSandboxConfig {
    let mut cfg = cri::PodSandboxConfig::new();
    let md = cfg.metadata.mut_or_insert_default();
    md.name = "web".into();
    md.uid = "0b7c1c6e-1d1b-4c1e-9f3c-3a4e5f6a7b8c".into();
    md.namespace = "default".into();
    md.attempt = 2;
    cfg.hostname = "web".into();
    cfg.log_directory = "/var/log/pods/default_web_0b7c".into();
    let dns = cfg.dns_config.mut_or_insert_default();
    dns.servers = vec!["10.96.0.10".into()];
    dns.searches = vec!["default.svc.cluster.local".into()];
    dns.options = vec!["ndots:5".into()];
    let mut pm = cri::PortMapping::new();
    pm.protocol = cri::Protocol::UDP.into();
    pm.container_port = 53;
    pm.host_port = 5353;
    pm.host_ip = "127.0.0.1".into();
    cfg.port_mappings.push(pm);
    cfg.labels.insert("app".into(), "web".into());
    cfg.annotations
        .insert("kubernetes.io/config.seen".into(), "now".into());
    let linux = cfg.linux.mut_or_insert_default();
    linux.cgroup_parent = "/kubepods/besteffort/pod0b7c".into();
    linux
        .sysctls
        .insert("net.ipv4.ip_unprivileged_port_start".into(), "0".into());
    let sc = linux.security_context.mut_or_insert_default();
    let ns = sc.namespace_options.mut_or_insert_default();
    ns.network = cri::NamespaceMode::NODE.into();
    ns.pid = cri::NamespaceMode::CONTAINER.into();
    ns.ipc = cri::NamespaceMode::NODE.into();
    ns.target_id = "t".into();
    let userns = ns.userns_options.mut_or_insert_default();
    userns.mode = cri::NamespaceMode::POD.into();
    let mut idm = cri::IDMapping::new();
    idm.host_id = 100000;
    idm.container_id = 0;
    idm.length = 65536;
    userns.uids.push(idm.clone());
    userns.gids.push(idm);
    let se = sc.selinux_options.mut_or_insert_default();
    se.user = "system_u".into();
    se.role = "system_r".into();
    se.type_ = "container_t".into();
    se.level = "s0:c1,c2".into();
    sc.run_as_user.mut_or_insert_default().value = 65534;
    sc.run_as_group.mut_or_insert_default().value = 0;
    sc.readonly_rootfs = true;
    sc.supplemental_groups = vec![1, 2];
    sc.supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict.into();
    sc.privileged = true;
    sc.seccomp.mut_or_insert_default().profile_type =
        cri::security_profile::ProfileType::RuntimeDefault.into();
    let aa = sc.apparmor.mut_or_insert_default();
    aa.profile_type = cri::security_profile::ProfileType::Localhost.into();
    aa.localhost_ref = "k8s-default".into();
    sc.seccomp_profile_path = "runtime/default".into();
    for r in [
        linux.overhead.mut_or_insert_default(),
        linux.resources.mut_or_insert_default(),
    ] {
        r.cpu_period = 100_000;
        r.cpu_quota = 50_000;
        r.cpu_shares = 512;
        r.memory_limit_in_bytes = 1 << 40; // above 2^32: a number, not a string
        r.oom_score_adj = -998;
        r.cpuset_cpus = "0-1".into();
        r.cpuset_mems = "0".into();
        let mut h = cri::HugepageLimit::new();
        h.page_size = "2MB".into();
        h.limit = 1 << 21;
        r.hugepage_limits.push(h);
        r.unified.insert("memory.high".into(), "max".into());
        r.memory_swap_limit_in_bytes = 1 << 41;
    }
    let w = cfg
        .windows
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default();
    w.run_as_username = "ContainerUser".into();
    w.credential_spec = "spec".into();
    w.host_process = true;
    w.namespace_options.mut_or_insert_default().network = cri::NamespaceMode::NODE.into();
    cfg
}

/// What the shim's CNI chain returned for a shim-owned pod network on the bench (bridge and
/// host-local of containernetworking-plugins 1.9.1, then portmap passing it on; no default
/// route, no DNS: the bench's network has neither), from the shim's libcni cache
/// (`var/lib/cni/results/rsandbox-shim-<id>-eth0`, printed by integration/tests/network.rs).
const BRIDGE_RESULT: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"mac":"de:b4:68:29:39:fc","name":"rsandbox1"},{"mac":"c6:e6:aa:7d:ef:79","name":"veth113a8bc0"},{"mac":"d6:fa:3f:f9:ed:14","name":"eth0","sandbox":"/opt/rsandbox/run/netns/rsandbox-493ec86cefd20e12"}],"ips":[{"address":"10.90.0.8/16","gateway":"10.90.0.1","interface":2}]}"#;

fn network(result: Option<&str>) -> NetworkRecord {
    NetworkRecord {
        netns: PathBuf::from("/opt/rsandbox/run/netns/rsandbox-493ec86cefd20e12"),
        container_id: "pod1".into(),
        ifname: "eth0".into(),
        conf_dir: PathBuf::from("/etc/cni/net.d"),
        bin_dirs: vec![PathBuf::from("/opt/cni/bin")],
        cache_dir: PathBuf::from("/var/lib/cni"),
        timeout_seconds: 60,
        pod: None,
        ips: vec!["10.90.0.8/16".into()],
        loopback_only: false,
        result: result.map(|r| serde_json::from_str(r).unwrap()),
    }
}

fn view<'a>(
    spec: &'a PodSpec,
    config: Option<&'a [u8]>,
    runtime_spec: Option<&'a Value>,
    net: Option<&'a NetworkRecord>,
) -> PodView<'a> {
    PodView {
        pid: 4242,
        process: ProcessStatus::Running,
        spec,
        netns: net.map(|n| n.netns.as_path()),
        netns_closed: false,
        pod_config: config,
        runtime_spec,
        network: net,
        files_dir: Path::new("/run/bundle/pod1/files"),
        shm: Some(Path::new("/run/bundle/pod1/shm")),
        cgroup_dirs: &[],
        systemd_scope: None,
        sysctls: vec![],
        containers: vec!["c1".into()],
    }
}

#[test]
fn a_started_pod_fills_what_inspectp_shows_on_containerd_2_3() {
    let spec = PodSpec::default();
    let cfg = full_config().write_to_bytes().unwrap();
    let rspec = json!({"ociVersion": "1.2.1", "linux": {"namespaces": [{"type": "network"}]}});
    let net = network(Some(BRIDGE_RESULT));
    let entries = entries(&view(&spec, Some(&cfg), Some(&rspec), Some(&net)));
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, [INFO_KEY, DETAILS_KEY]);

    let info: SandboxInfo = serde_json::from_str(&entries[0].1)
        .unwrap_or_else(|e| panic!("not a SandboxInfo: {e}: {}", entries[0].1));
    assert_eq!(info.pid, 4242);
    assert_eq!(info.status, "running");
    assert_eq!(info.runtime_type, "io.containerd.rsandbox.v1");
    let config = info.config.expect("config");
    assert_eq!(config.metadata.unwrap().name.as_deref(), Some("web"));
    assert_eq!(
        info.runtime_spec.expect("runtimeSpec")["ociVersion"],
        "1.2.1"
    );
    let cni = info.cni_result.expect("cniResult");
    let eth0 = &cni.Interfaces["eth0"];
    assert_eq!(
        eth0.Sandbox,
        "/opt/rsandbox/run/netns/rsandbox-493ec86cefd20e12"
    );
    let ips = eth0.IPConfigs.as_ref().unwrap();
    assert_eq!(
        (ips[0].IP.as_str(), ips[0].Gateway.as_str()),
        ("10.90.0.8", "10.90.0.1")
    );

    // rsandbox's own details are an entry of their own, which containerd 2.3 leaves alone.
    let details: Value = serde_json::from_str(&entries[1].1).unwrap();
    assert_eq!(details["networkOwner"], "rsandbox (CNI run by the shim)");
    assert_eq!(details["containers"], json!(["c1"]));
    assert_eq!(details["ips"], json!(["10.90.0.8/16"]));
}

#[test]
fn a_sandbox_without_pod_config_or_start_is_still_a_sandbox_info() {
    let spec = PodSpec::default();
    let mut v = view(&spec, None, None, None);
    v.pid = 0;
    v.process = ProcessStatus::Created;
    let doc = sandbox_info(&v).to_string();
    let info: SandboxInfo = serde_json::from_str(&doc).unwrap();
    assert_eq!((info.pid, info.status.as_str()), (0, "created"));
    assert!(info.config.is_none() && info.runtime_spec.is_none() && info.cni_result.is_none());
    // crictl parses an entry that starts with '{' as a JSON object (cri-tools util.go).
    assert_eq!(details(&v)["networkOwner"], "host");
}

#[test]
fn the_config_is_written_as_go_encoding_json_writes_the_cri_api_struct() {
    let doc = go_json(&full_config());
    // Every key is a json tag of cri-api's structs, every value of the Go field's type.
    let cfg: PodSandboxConfig = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("not a cri-api PodSandboxConfig: {e}: {doc}"));
    // Nothing of the config is lost on the way (every field was set).
    let linux = cfg.linux.unwrap();
    let sc = linux.security_context.unwrap();
    assert_eq!(sc.run_as_user.unwrap().value, Some(65534));
    assert_eq!(sc.supplemental_groups_policy, Some(1));
    assert_eq!(sc.seccomp_profile_path.as_deref(), Some("runtime/default"));
    let res = linux.resources.unwrap();
    assert_eq!(res.memory_limit_in_bytes, Some(1 << 40));
    assert_eq!(res.hugepage_limits.unwrap()[0].limit, Some(1 << 21));
    assert_eq!(res.unified.unwrap()["memory.high"], "max");
    assert_eq!(cfg.port_mappings.unwrap()[0].protocol, Some(1));
    let w = cfg.windows.unwrap().security_context.unwrap();
    assert_eq!(w.namespace_options.unwrap().network, Some(2));
    // omitempty: zero values are left out (run_as_group 0, an int64 wrapper set to 0, the
    // seccomp profile type RuntimeDefault = 0, the userns mode POD = 0, container_id 0), a set
    // message stays even when all its fields are zero.
    let sc = &doc["linux"]["security_context"];
    assert_eq!(sc["run_as_group"], json!({}));
    assert_eq!(sc["seccomp"], json!({}));
    assert_eq!(
        sc["namespace_options"]["userns_options"]["uids"],
        json!([{"host_id": 100000, "length": 65536}])
    );
    assert!(
        sc["namespace_options"]["userns_options"]
            .get("mode")
            .is_none()
    );
}

#[test]
fn an_empty_config_is_an_empty_object() {
    assert_eq!(go_json(&cri::PodSandboxConfig::new()), json!({}));
    let mut cfg = cri::PodSandboxConfig::new();
    cfg.linux.mut_or_insert_default();
    assert_eq!(go_json(&cfg), json!({"linux": {}}));
}

#[test]
fn the_cni_result_is_go_cnis_result() {
    let r = CniResult::parse(BRIDGE_RESULT.as_bytes(), "1.0.0").unwrap();
    let doc = go_cni_result(&r, "eth0");
    let _: CniResultGo = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(
        doc,
        json!({
            "Interfaces": {
                "eth0": {
                    "IPConfigs": [{"IP": "10.90.0.8", "Gateway": "10.90.0.1"}],
                    "Mac": "d6:fa:3f:f9:ed:14",
                    "Sandbox": "/opt/rsandbox/run/netns/rsandbox-493ec86cefd20e12",
                    "PciID": "",
                    "SocketPath": "",
                },
                "rsandbox1": {"IPConfigs": null, "Mac": "de:b4:68:29:39:fc", "Sandbox": "", "PciID": "", "SocketPath": ""},
                "veth113a8bc0": {"IPConfigs": null, "Mac": "c6:e6:aa:7d:ef:79", "Sandbox": "", "PciID": "", "SocketPath": ""},
            },
            // The result has no dns: go-cni appends the zero types.DNS, all omitempty.
            "DNS": [{}],
            // No routes: a nil slice.
            "Routes": null,
        })
    );
}

#[test]
fn routes_are_cnis_route_json() {
    // The bench's result with a default route and an MTU route added (CNI spec 1.0
    // `routes` entries), as a chain with a gateway returns them.
    let mut raw: Value = serde_json::from_str(BRIDGE_RESULT).unwrap();
    raw["routes"] =
        json!([{"dst": "0.0.0.0/0", "gw": "10.90.0.1"}, {"dst": "10.91.0.0/16", "mtu": 1400}]);
    let r = CniResult::from_value(raw, "1.0.0").unwrap();
    let doc = go_cni_result(&r, "eth0");
    let _: CniResultGo = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(
        doc["Routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.90.0.1"}, {"dst": "10.91.0.0/16", "mtu": 1400}])
    );
}

#[test]
fn ips_without_an_interface_go_to_the_default_one() {
    // An IPAM-only chain (go-cni's getInterfaceName: no `interface` index, the default name).
    let raw = r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.2/24"}],"dns":{"nameservers":["10.1.0.1"]}}"#;
    let r = CniResult::parse(raw.as_bytes(), "0.4.0").unwrap();
    let doc = go_cni_result(&r, "net1");
    let _: CniResultGo = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(
        doc["Interfaces"]["net1"]["IPConfigs"],
        json!([{"IP": "10.1.0.2", "Gateway": ""}])
    );
    assert_eq!(doc["DNS"], json!([{"nameservers": ["10.1.0.1"]}]));
    assert_eq!(doc["Routes"], Value::Null);
}

#[test]
fn base64_is_gos_std_encoding() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(&[0xff, 0xfe, 0xfd, 0x00]), "//79AA==");
}
