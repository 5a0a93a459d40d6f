//! The OCI runtime spec of the sandbox, as StartSandbox reports it (`StartSandboxResponse.spec`).
//!
//! containerd 2.3 added the field: its CRI stores the spec with the sandbox and hands it to NRI
//! plugins as the pod's spec (`internal/cri/nri/nri_api_linux.go`: the pod's namespaces, cgroups
//! path, resources and annotations come from it). On containerd's runc path it is the pause
//! container's `config.json`; ours describes the pause process the same way, with the paths of
//! the namespaces it holds, so a plugin can enter them. containerd 2.1 and 2.2 ignore the field
//! (their NRI then sees no namespaces and no cgroups path for the pod).
//!
//! Encoded as containerd's typeurl encodes a `specs.Spec`: JSON under
//! `types.containerd.io/opencontainers/runtime-spec/1/Spec`.

use std::path::Path;

use protobuf::well_known_types::any::Any;
use serde_json::{Map, Value, json};

use super::pause::{PAUSE_ARGV0, PAUSE_GID, PAUSE_UID};
use super::spec::{IpcMode, NetworkMode, PidMode, PodSpec};

/// typeurl's name of an OCI runtime spec (`specs.Spec`, major version 1).
pub const TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";

/// The pod as it runs: what the spec is built from.
#[derive(Debug, Clone, Copy)]
pub struct RunningPod<'a> {
    pub id: &'a str,
    pub spec: &'a PodSpec,
    /// The pause process (host pid).
    pub pid: i32,
    /// The pod's netns file, when it is not the node's.
    pub netns: Option<&'a Path>,
    /// The pause's cgroup, relative to the hierarchy root (`/kubepods/pod1/<id>`), if known.
    pub cgroups_path: Option<&'a str>,
}

/// The spec of the sandbox `pod`.
pub fn build(pod: RunningPod<'_>) -> Value {
    let s = pod.spec;
    let ns = |kind: &str| format!("/proc/{}/ns/{kind}", pod.pid);
    let mut namespaces = vec![json!({"type": "mount", "path": ns("mnt")})];
    if s.pid != PidMode::Host {
        namespaces.push(json!({"type": "pid", "path": ns("pid")}));
    }
    if s.ipc == IpcMode::Pod {
        namespaces.push(json!({"type": "ipc", "path": ns("ipc")}));
    }
    if s.network != NetworkMode::Host {
        namespaces.push(json!({"type": "uts", "path": ns("uts")}));
        let net = pod
            .netns
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| ns("net"));
        namespaces.push(json!({"type": "network", "path": net}));
    }
    if s.userns.is_some() {
        namespaces.push(json!({"type": "user", "path": ns("user")}));
    }

    let mut annotations = Map::new();
    let mut note = |k: &str, v: String| {
        annotations.insert(k.to_string(), Value::String(v));
    };
    // As containerd's DefaultCRIAnnotations for a sandbox (no image name: there is no image).
    note("io.kubernetes.cri.container-type", "sandbox".into());
    note("io.kubernetes.cri.sandbox-id", pod.id.into());
    note("io.kubernetes.cri.sandbox-name", s.name.clone());
    note("io.kubernetes.cri.sandbox-namespace", s.namespace.clone());
    note("io.kubernetes.cri.sandbox-uid", s.uid.clone());
    note(
        "io.kubernetes.cri.sandbox-log-directory",
        s.log_directory.clone(),
    );

    let mut linux = Map::new();
    linux.insert("namespaces".into(), Value::Array(namespaces));
    if let Some(u) = &s.userns {
        // As the runc path's pause container spec of a user-namespaced pod.
        let maps = |m: &[crate::pod::spec::IdMapping]| {
            m.iter()
                .map(
                    |m| json!({"containerID": m.container_id, "hostID": m.host_id, "size": m.size}),
                )
                .collect::<Vec<_>>()
        };
        linux.insert("uidMappings".into(), Value::Array(maps(&u.uids)));
        linux.insert("gidMappings".into(), Value::Array(maps(&u.gids)));
    }
    if let Some(p) = pod.cgroups_path {
        linux.insert("cgroupsPath".into(), Value::String(p.into()));
    }
    if let Some(r) = &s.resources {
        // The runc path writes these four into its pause container's annotations.
        note(
            "io.kubernetes.cri.sandbox-cpu-period",
            r.cpu_period.to_string(),
        );
        note(
            "io.kubernetes.cri.sandbox-cpu-quota",
            r.cpu_quota.to_string(),
        );
        note(
            "io.kubernetes.cri.sandbox-cpu-shares",
            r.cpu_shares.to_string(),
        );
        note(
            "io.kubernetes.cri.sandbox-memory",
            r.memory_limit_in_bytes.to_string(),
        );
        let mut cpu = Map::new();
        let mut set = |k: &str, v: Value, keep: bool| {
            if keep {
                cpu.insert(k.into(), v);
            }
        };
        set("shares", json!(r.cpu_shares), r.cpu_shares > 0);
        set("quota", json!(r.cpu_quota), r.cpu_quota != 0);
        set("period", json!(r.cpu_period), r.cpu_period > 0);
        set("cpus", json!(r.cpuset_cpus), !r.cpuset_cpus.is_empty());
        set("mems", json!(r.cpuset_mems), !r.cpuset_mems.is_empty());
        let mut res = Map::new();
        if !cpu.is_empty() {
            res.insert("cpu".into(), Value::Object(cpu));
        }
        if r.memory_limit_in_bytes != 0 {
            res.insert("memory".into(), json!({"limit": r.memory_limit_in_bytes}));
        }
        linux.insert("resources".into(), Value::Object(res));
    }
    let mut args = vec![PAUSE_ARGV0.to_string()];
    args.push(pod.id.to_string());
    let mut spec = json!({
        "ociVersion": "1.2.0",
        "process": {
            "user": {"uid": PAUSE_UID, "gid": PAUSE_GID},
            "args": args,
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
        },
        "root": {"path": "/", "readonly": true},
        "annotations": Value::Object(annotations),
        "linux": Value::Object(linux),
    });
    if s.network != NetworkMode::Host && !s.hostname.is_empty() {
        spec["hostname"] = Value::String(s.hostname.clone());
    }
    spec
}

/// The spec's `cgroupsPath` from a `/proc/<pid>/cgroup` text: on a cgroup v2 host the unified
/// line (`0::/path`), else the v1 memory hierarchy's line (the pod cgroup is made in every v1
/// hierarchy alike; a hybrid host's unified line is not ours).
pub fn cgroups_path_from_proc(proc_cgroup: &str, unified: bool) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = if unified {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == "memory")
        };
        ours.then(|| path.to_string())
    })
}

/// `spec` as the Any containerd decodes with typeurl.
pub fn to_any(spec: &Value) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: serde_json::to_vec(spec).unwrap_or_default(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::spec::PodResources;

    fn pod_spec() -> PodSpec {
        PodSpec {
            name: "web".into(),
            namespace: "prod".into(),
            uid: "u-1".into(),
            hostname: "web-0".into(),
            log_directory: "/var/log/pods/p1".into(),
            network: NetworkMode::Pod,
            ipc: IpcMode::Pod,
            pid: PidMode::Pod,
            ..Default::default()
        }
    }

    fn running<'a>(spec: &'a PodSpec, netns: Option<&'a Path>) -> RunningPod<'a> {
        RunningPod {
            id: "p1",
            spec,
            pid: 4242,
            netns,
            cgroups_path: Some("/kubepods/podu-1/p1"),
        }
    }

    /// What an NRI plugin reads: it decodes as an OCI spec with the pod's namespaces (paths it
    /// can enter), its cgroups path, resources and CRI's annotations.
    #[test]
    fn the_spec_carries_namespaces_cgroups_path_resources_and_annotations() {
        let mut s = pod_spec();
        s.resources = Some(PodResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 128 << 20,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: String::new(),
        });
        let netns = Path::new("/var/run/netns/cni-1");
        let any = to_any(&build(running(&s, Some(netns))));
        assert_eq!(any.type_url, TYPE_URL);
        let v: Value = serde_json::from_slice(&any.value).unwrap();
        let ns: Vec<(String, String)> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["type"].as_str().unwrap().to_string(),
                    n["path"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = [
            ("mount", "/proc/4242/ns/mnt"),
            ("pid", "/proc/4242/ns/pid"),
            ("ipc", "/proc/4242/ns/ipc"),
            ("uts", "/proc/4242/ns/uts"),
            ("network", "/var/run/netns/cni-1"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(ns, want);
        assert_eq!(v["linux"]["cgroupsPath"], "/kubepods/podu-1/p1");
        assert_eq!(
            v["linux"]["resources"],
            json!({"cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1"},
                   "memory": {"limit": 134217728}})
        );
        let a = &v["annotations"];
        assert_eq!(a["io.kubernetes.cri.container-type"], "sandbox");
        assert_eq!(a["io.kubernetes.cri.sandbox-id"], "p1");
        assert_eq!(a["io.kubernetes.cri.sandbox-name"], "web");
        assert_eq!(a["io.kubernetes.cri.sandbox-namespace"], "prod");
        assert_eq!(a["io.kubernetes.cri.sandbox-uid"], "u-1");
        assert_eq!(a["io.kubernetes.cri.sandbox-cpu-shares"], "512");
        assert_eq!(a["io.kubernetes.cri.sandbox-memory"], "134217728");
        assert_eq!(v["hostname"], "web-0");
        assert_eq!(v["process"]["user"]["uid"], 65535);
        assert_eq!(v["process"]["args"], json!(["rsandbox-pause", "p1"]));
    }

    #[test]
    fn the_cgroups_path_comes_from_the_managed_hierarchy() {
        let v1 = "13:pids:/kubepods/p1\n9:memory:/kubepods/p1\n0::/\n";
        assert_eq!(
            cgroups_path_from_proc(v1, false).as_deref(),
            Some("/kubepods/p1")
        );
        let v2 = "0::/kubepods.slice/p1\n";
        assert_eq!(
            cgroups_path_from_proc(v2, true).as_deref(),
            Some("/kubepods.slice/p1")
        );
        assert_eq!(cgroups_path_from_proc(v2, false), None);
        assert_eq!(cgroups_path_from_proc("garbage", true), None);
    }

    /// A user-namespaced pod: the pause's user namespace by path and the pod's maps.
    #[test]
    fn a_user_namespaced_pod_names_its_user_namespace_and_maps() {
        let mut s = pod_spec();
        let m = vec![crate::pod::spec::IdMapping {
            container_id: 0,
            host_id: 100000,
            size: 65536,
        }];
        s.userns = Some(crate::pod::spec::UserNamespace {
            uids: m.clone(),
            gids: m,
        });
        let v = build(running(&s, None));
        assert!(
            v["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .contains(&json!({"type": "user", "path": "/proc/4242/ns/user"}))
        );
        let want = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        assert_eq!(v["linux"]["uidMappings"], want);
        assert_eq!(v["linux"]["gidMappings"], want);
        let v = build(running(&pod_spec(), None));
        assert!(v["linux"].get("uidMappings").is_none());
    }

    #[test]
    fn node_namespaces_are_left_out() {
        let mut s = pod_spec();
        s.network = NetworkMode::Host;
        s.ipc = IpcMode::Host;
        s.pid = PidMode::Host;
        let v = build(running(&s, Some(Path::new("/ignored"))));
        assert_eq!(
            v["linux"]["namespaces"],
            json!([{"type": "mount", "path": "/proc/4242/ns/mnt"}])
        );
        assert!(v.get("hostname").is_none());
        assert!(v["linux"].get("resources").is_none());
        // Without a netns file the pause's own is named.
        let s = pod_spec();
        let v = build(running(&s, None));
        assert!(
            v["linux"]["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == &json!({"type": "network", "path": "/proc/4242/ns/net"}))
        );
    }
}
