//! The verbose `SandboxStatus.info` of a pod: what `crictl inspectp` shows of it.
//!
//! containerd's CRI hands the shim's `info` map to its client, with one rewrite since 2.3: the
//! `"info"` entry is decoded into the runc path's `SandboxInfo` and encoded again
//! (`internal/cri/server/sandbox_status.go:78` and `:116-142` in v2.3.4, identical in
//! v2.4.0-beta.0; commit de5b622bd "Persist pod sandbox resource updates"). So on 2.3 a key
//! that `SandboxInfo` does not have is dropped, and a value of the wrong JSON type fails the
//! whole PodSandboxStatus, verbose or not. containerd 2.1 and 2.2 pass the map through
//! (`internal/cri/server/sandbox_status.go:72` in v2.1.9). Hence two entries:
//!
//! * [`INFO_KEY`] (`"info"`): a `SandboxInfo` document
//!   (`internal/cri/server/podsandbox/types/sandbox_info.go:29-45` in v2.3.4;
//!   `internal/cri/types/sandbox_info.go` in v2.1.9), filled as the runc path's
//!   `toCRISandboxInfo` fills it (`internal/cri/server/podsandbox/sandbox_status.go:61-137`):
//!   `pid`, `processStatus`, `netNamespaceClosed`, `runtimeType`, `config` (the
//!   `PodSandboxConfig` as Go's `encoding/json` writes the cri-api struct: [`go_json`]),
//!   `runtimeSpec` (the spec StartSandbox reported) and, where the shim ran CNI, `cniResult`
//!   (go-cni's `Result`: [`go_cni_result`]). `image`, `snapshotKey` and `snapshotter` stay
//!   empty (the pause process has no image) and `runtimeOptions` null (no options table);
//!   `sandboxMetadata` is left out: containerd's own record, which the shim does not have.
//! * [`DETAILS_KEY`] (`"rsandbox"`): rsandbox's own details (network owner, IPs, namespaces,
//!   pod files, `/dev/shm`, cgroup, sysctls, containers), an entry of its own, which every
//!   containerd passes through.
//!
//! The flat `pid` and `state` entries of every status, verbose or not, are the RPC layer's
//! (`rpc::sandbox`): this module only runs for a verbose status.

use std::path::Path;

use protobuf::MessageDyn;
use protobuf::reflect::{ReflectFieldRef, ReflectValueRef};
use serde_json::{Map, Value, json};

use crate::cni::CniResult;
use crate::host::network::NetworkRecord;
use crate::records::cri;

use super::spec::PodSpec;

/// containerd's key of the `SandboxInfo` document.
pub const INFO_KEY: &str = "info";
/// The key of rsandbox's own details.
pub const DETAILS_KEY: &str = "rsandbox";

/// What the pause process is doing, in containerd's `ProcessStatus` words (the runc path
/// reports its pause task's status as `processStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStatus {
    /// Created, not started.
    Created,
    /// Started and running.
    Running,
    /// Exited or stopped.
    Stopped,
}

impl ProcessStatus {
    /// containerd's string (`client/task.go`: `Running = "running"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessStatus::Created => "created",
            ProcessStatus::Running => "running",
            ProcessStatus::Stopped => "stopped",
        }
    }
}

/// Everything the verbose info is made of (the sandbox manager fills it in).
#[derive(Debug)]
pub struct PodView<'a> {
    /// The pause process's pid (0 before StartSandbox).
    pub pid: u32,
    pub process: ProcessStatus,
    pub spec: &'a PodSpec,
    /// The pod's netns file, when it is not the node's.
    pub netns: Option<&'a Path>,
    /// Whether that netns file is gone (no longer a network namespace).
    pub netns_closed: bool,
    /// The `PodSandboxConfig` as containerd sent it (protobuf bytes), if it sent one.
    pub pod_config: Option<&'a [u8]>,
    /// The spec StartSandbox reported.
    pub runtime_spec: Option<&'a Value>,
    /// The network the shim set up itself.
    pub network: Option<&'a NetworkRecord>,
    pub files_dir: &'a Path,
    pub shm: Option<&'a Path>,
    pub cgroup_dirs: &'a [std::path::PathBuf],
    pub systemd_scope: Option<&'a str>,
    /// The pod's sysctls as applied.
    pub sysctls: Vec<(String, String)>,
    /// The pod's containers.
    pub containers: Vec<String>,
}

/// The entries a verbose SandboxStatus adds to `info`.
pub fn entries(pod: &PodView<'_>) -> Vec<(String, String)> {
    vec![
        (INFO_KEY.to_string(), sandbox_info(pod).to_string()),
        (DETAILS_KEY.to_string(), details(pod).to_string()),
    ]
}

/// The `SandboxInfo` document (field names and JSON tags of
/// `internal/cri/server/podsandbox/types/sandbox_info.go:29-45`, v2.3.4).
pub fn sandbox_info(pod: &PodView<'_>) -> Value {
    let config = pod.pod_config.map(|bytes| {
        // The bytes decoded once already (CreateSandbox); should they not decode now, the
        // document says null rather than failing the status.
        match <cri::PodSandboxConfig as protobuf::Message>::parse_from_bytes(bytes) {
            Ok(cfg) => go_json(&cfg),
            Err(e) => {
                log::warn!("verbose status: the pod config does not decode: {e}");
                Value::Null
            }
        }
    });
    let cni_result = pod.network.and_then(|n| {
        let raw = n.result.as_ref()?;
        match CniResult::from_value(raw.clone(), "") {
            Ok(r) => Some(go_cni_result(&r, &n.ifname)),
            Err(e) => {
                log::warn!("verbose status: the cached CNI result does not parse: {e}");
                None
            }
        }
    });
    json!({
        "pid": pod.pid,
        "processStatus": pod.process.as_str(),
        "netNamespaceClosed": pod.netns_closed,
        "image": "",
        "snapshotKey": "",
        "snapshotter": "",
        "runtimeType": crate::records::bundle::RUNTIME_ID,
        "runtimeOptions": null,
        "config": config,
        "runtimeSpec": pod.runtime_spec,
        "cniResult": cni_result,
    })
}

/// rsandbox's own details.
pub fn details(pod: &PodView<'_>) -> Value {
    let s = pod.spec;
    json!({
        "netns": pod.netns,
        "ips": pod.network.map(|n| n.ips.clone()).unwrap_or_default(),
        "networkOwner": match pod.network {
            Some(n) if n.loopback_only => "rsandbox (loopback only: no CNI network config)",
            Some(_) => "rsandbox (CNI run by the shim)",
            None if pod.netns.is_some() => "caller (CRI)",
            None => "host",
        },
        "hostname": s.hostname,
        "networkMode": format!("{:?}", s.network),
        "ipcMode": format!("{:?}", s.ipc),
        "pidMode": format!("{:?}", s.pid),
        "userns": s.userns.as_ref().map(|u| json!({
            "uidMap": u.uid_map(),
            "gidMap": u.gid_map(),
        })),
        "podFiles": pod.files_dir,
        "shm": pod.shm,
        "cgroup": pod.cgroup_dirs,
        "systemdScope": pod.systemd_scope,
        "sysctls": pod.sysctls,
        "pause": "the shim's pause program (no image) in an empty root, uid 65535, seccomp",
        "containers": pod.containers,
    })
}

/// A protobuf message as Go's `encoding/json` writes the struct protoc-gen-go generates for it
/// (cri-api's `api.pb.go`), which is how containerd's CRI puts `config` into `SandboxInfo`:
/// keys are the proto field names (the struct tags say `json:"log_directory,omitempty"`);
/// every field is `omitempty`, so a zero scalar, an empty string, list or map and an unset
/// message are left out, while a set but empty message is `{}`; enums and 64-bit integers are
/// numbers; bytes are base64; map keys come sorted (as Go sorts them).
pub fn go_json(msg: &dyn MessageDyn) -> Value {
    let mut out = Map::new();
    for field in msg.descriptor_dyn().fields() {
        let value = match field.get_reflect(msg) {
            // Proto3 fields without presence: `value()` is None for the zero value.
            ReflectFieldRef::Optional(v) => v.value().map(|v| go_value(&v)),
            ReflectFieldRef::Repeated(r) => {
                (!r.is_empty()).then(|| Value::Array(r.into_iter().map(|v| go_value(&v)).collect()))
            }
            ReflectFieldRef::Map(m) => (!m.is_empty()).then(|| {
                Value::Object(
                    (&m).into_iter()
                        .map(|(k, v)| (map_key(&k), go_value(&v)))
                        .collect(),
                )
            }),
        };
        if let Some(v) = value {
            out.insert(field.name().to_string(), v);
        }
    }
    Value::Object(out)
}

fn go_value(v: &ReflectValueRef<'_>) -> Value {
    match v {
        ReflectValueRef::U32(n) => json!(n),
        ReflectValueRef::U64(n) => json!(n),
        ReflectValueRef::I32(n) => json!(n),
        ReflectValueRef::I64(n) => json!(n),
        ReflectValueRef::F32(n) => json!(n),
        ReflectValueRef::F64(n) => json!(n),
        ReflectValueRef::Bool(b) => json!(b),
        ReflectValueRef::String(s) => json!(s),
        ReflectValueRef::Bytes(b) => json!(base64(b)),
        ReflectValueRef::Enum(_, n) => json!(n),
        ReflectValueRef::Message(m) => go_json(&**m),
    }
}

/// Go writes a map key of a string type as it is, and of an integer type in decimal.
fn map_key(k: &ReflectValueRef<'_>) -> String {
    match k {
        ReflectValueRef::String(s) => s.to_string(),
        other => match go_value(other) {
            Value::String(s) => s,
            v => v.to_string(),
        },
    }
}

/// Standard base64 with padding (Go's `encoding/json` for `[]byte`).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A CNI result as go-cni's `Result` (v1.1.13, `result.go`: `createResult`) and Go's
/// `encoding/json` write it, which is how containerd's CRI puts `cniResult` into `SandboxInfo`:
/// untagged Go field names (`Interfaces`, `DNS`, `Routes`); the default interface (`ifname`)
/// always present; each IP under the interface it names (the default one when it names
/// none), as a bare address with its gateway; one `DNS` entry per result; routes as CNI's
/// `types.Route` writes them (`dst`, `gw`, `mtu`, `advmss`, `priority`, `table`, `scope`).
pub fn go_cni_result(r: &CniResult, ifname: &str) -> Value {
    let raw_interfaces = r.raw().get("interfaces").and_then(Value::as_array);
    let mut interfaces = Map::new();
    interfaces.insert(ifname.to_string(), go_cni_config(None));
    for (i, intf) in r.interfaces.iter().enumerate() {
        let raw = raw_interfaces.and_then(|a| a.get(i));
        interfaces.insert(intf.name.clone(), go_cni_config(raw));
    }
    for ip in r.ips() {
        let name = ip
            .interface
            .and_then(|i| r.interfaces.get(i))
            .map_or(ifname, |intf| intf.name.as_str());
        let Some(Value::Object(conf)) = interfaces.get_mut(name) else {
            continue;
        };
        let entry = json!({
            "IP": ip.address.addr.to_string(),
            // A nil net.IP marshals as "".
            "Gateway": ip.gateway.map(|g| g.to_string()).unwrap_or_default(),
        });
        match conf.get_mut("IPConfigs") {
            Some(Value::Array(list)) => list.push(entry),
            _ => {
                conf.insert("IPConfigs".into(), Value::Array(vec![entry]));
            }
        }
    }
    let d = &r.dns;
    let mut dns = Map::new();
    if !d.nameservers.is_empty() {
        dns.insert("nameservers".into(), json!(d.nameservers));
    }
    if let Some(domain) = d.domain.as_deref().filter(|s| !s.is_empty()) {
        dns.insert("domain".into(), json!(domain));
    }
    if !d.search.is_empty() {
        dns.insert("search".into(), json!(d.search));
    }
    if !d.options.is_empty() {
        dns.insert("options".into(), json!(d.options));
    }
    const ROUTE_KEYS: [&str; 7] = ["dst", "gw", "mtu", "advmss", "priority", "table", "scope"];
    let routes: Vec<Value> = r
        .raw()
        .get("routes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_object)
                .map(|o| {
                    Value::Object(
                        o.iter()
                            .filter(|(k, v)| ROUTE_KEYS.contains(&k.as_str()) && !v.is_null())
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "Interfaces": interfaces,
        "DNS": [dns],
        // A nil slice marshals as null.
        "Routes": (!routes.is_empty()).then_some(routes),
    })
}

/// go-cni's `Config` of one interface, from its CNI result entry (none: the default
/// interface's empty `Config{}`).
fn go_cni_config(raw: Option<&Value>) -> Value {
    let s = |k: &str| {
        raw.and_then(|r| r.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    json!({
        "IPConfigs": null,
        "Mac": s("mac"),
        "Sandbox": s("sandbox"),
        "PciID": s("pciID"),
        "SocketPath": s("socketPath"),
    })
}

#[cfg(test)]
mod tests;
