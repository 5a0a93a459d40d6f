//! Shim-owned networking: a network namespace made by the shim plus the CNI plugin chain, for
//! pods and tasks that no caller gives a network to (containerd's sandbox controller API,
//! `ctr run`). Under CRI, containerd makes the netns and runs CNI itself; this is never used
//! there.
//!
//! Everything needed to undo the setup is in a [`NetworkRecord`] kept in the bundle, so
//! teardown works from the daemon, from ShutdownSandbox, and from the `delete` action after a
//! crash. Teardown is idempotent: CNI DEL tolerates a missing netns and a missing cache entry.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::cni::{Cni, CniResult, ExecError, PluginExec, PodArgs, RuntimeConf};
use crate::config::NetworkConfig;
use crate::error::{Context, Error, Result};
use crate::netns::NetNs;
use crate::pod::spec::PodSpec;
use crate::reaper::Spawner;

/// What was set up, and how to take it down again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkRecord {
    /// The netns bind mount the shim created.
    pub netns: PathBuf,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    pub ifname: String,
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    pub timeout_seconds: u64,
    /// The pod identity passed as CNI_ARGS (None for plain tasks).
    pub pod: Option<(String, String, String, String)>,
    /// Addresses of the interface, as `addr/prefix`.
    pub ips: Vec<String>,
}

/// Sets up and tears down shim-owned networks (a trait so tests can fake it).
pub trait NetworkProvider: Send + Sync {
    /// Creates the netns for `id` (namespace `ns`) and runs CNI ADD.
    fn setup(&self, ns: &str, id: &str, pod: Option<&PodSpec>) -> Result<NetworkRecord>;
    /// CNI DEL and netns removal.
    fn teardown(&self, record: &NetworkRecord) -> Result<()>;
}

/// Runs CNI plugins through the shim's reaper (or directly outside the daemon).
pub struct SpawnerExec(pub Spawner);

impl PluginExec for SpawnerExec {
    fn exec(
        &self,
        path: &Path,
        env: &[(String, String)],
        stdin: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Vec<u8>, ExecError> {
        let mut cmd = Command::new(path);
        cmd.env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir("/");
        let out = crate::cni::retry_text_busy(timeout, |left| {
            self.0.output_in_group(&mut cmd, Some(stdin), left)
        })
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                ExecError::Timeout {
                    path: path.to_path_buf(),
                    timeout,
                }
            } else if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::EACCES)
            {
                ExecError::Spawn {
                    path: path.to_path_buf(),
                    source: e,
                }
            } else {
                ExecError::Io {
                    path: path.to_path_buf(),
                    source: e,
                }
            }
        })?;
        if out.status != 0 {
            let (code, signal) = if out.status > 128 {
                (None, Some(out.status - 128))
            } else {
                (Some(out.status), None)
            };
            return Err(ExecError::Failed {
                path: path.to_path_buf(),
                code,
                signal,
                stdout: out.stdout,
                stderr: out.stderr,
            });
        }
        Ok(out.stdout)
    }
}

/// The real provider.
pub struct Networker {
    cfg: NetworkConfig,
    exec: Arc<dyn PluginExec>,
}

/// The netns file name for `id` in namespace `ns`: short and unique (IDs can be 128 bytes,
/// netns names at most 64).
pub fn netns_name(ns: &str, id: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ns, id).hash(&mut h);
    format!("rsandbox-{:016x}", h.finish())
}

fn pod_args(pod: &PodSpec, sandbox_id: &str) -> PodArgs {
    PodArgs {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        infra_container_id: sandbox_id.into(),
        uid: pod.uid.clone(),
    }
}

fn runtime_conf(record: &NetworkRecord, pod: Option<&PodSpec>) -> RuntimeConf {
    let mut rt = RuntimeConf::new(
        record.container_id.clone(),
        record.netns.display().to_string(),
        record.ifname.clone(),
    );
    if let Some((namespace, name, infra, uid)) = &record.pod {
        rt = rt.with_pod(&PodArgs {
            namespace: namespace.clone(),
            name: name.clone(),
            infra_container_id: infra.clone(),
            uid: uid.clone(),
        });
    }
    if let Some(pod) = pod {
        let ports: Vec<serde_json::Value> = pod
            .port_mappings
            .iter()
            .filter(|p| p.host_port != 0)
            .map(|p| {
                let mut m = serde_json::json!({
                    "hostPort": p.host_port,
                    "containerPort": p.container_port,
                    "protocol": format!("{:?}", p.protocol).to_lowercase(),
                });
                if let Some(ip) = p.host_ip {
                    m["hostIP"] = serde_json::json!(ip.to_string());
                }
                m
            })
            .collect();
        if !ports.is_empty() {
            rt = rt.with_capability("portMappings", serde_json::Value::Array(ports));
        }
    }
    rt
}

fn cni_for(record: &NetworkRecord, exec: Arc<dyn PluginExec>) -> Cni {
    let settings = crate::cni::CniSettings {
        conf_dir: record.conf_dir.clone(),
        bin_dirs: record.bin_dirs.clone(),
        cache_dir: record.cache_dir.clone(),
        ifname: record.ifname.clone(),
        timeout: Duration::from_secs(record.timeout_seconds.max(1)),
        ..Default::default()
    };
    Cni::new(settings, exec)
}

impl Networker {
    pub fn new(cfg: NetworkConfig, exec: Arc<dyn PluginExec>) -> Self {
        Networker { cfg, exec }
    }
}

/// Tears down `record` through `provider` (the daemon: plugins reaped by its reaper), or with a
/// direct spawner where there is none (the `delete` action, which has no reaper).
pub fn teardown(provider: Option<&Arc<dyn NetworkProvider>>, record: &NetworkRecord) -> Result<()> {
    match provider {
        Some(p) => p.teardown(record),
        None => teardown_with(record, Arc::new(SpawnerExec(Spawner::direct()))),
    }
}

/// Tears down `record` with `exec` (the `delete` action uses a direct spawner).
pub fn teardown_with(record: &NetworkRecord, exec: Arc<dyn PluginExec>) -> Result<()> {
    let cni = cni_for(record, exec);
    let net = cni.load_network().context("load CNI config for DEL")?;
    let rt = runtime_conf(record, None);
    let del = cni.del(&net, &rt).context("CNI DEL");
    let rm = NetNs::remove(&record.netns)
        .map_err(|e| Error::internal(e.to_string()).context("remove netns"));
    del.and(rm)
}

impl NetworkProvider for Networker {
    fn setup(&self, ns: &str, id: &str, pod: Option<&PodSpec>) -> Result<NetworkRecord> {
        let netns = NetNs::create(&self.cfg.netns_dir, &netns_name(ns, id))
            .map_err(|e| Error::internal(e.to_string()).context("create network namespace"))?;
        let mut record = NetworkRecord {
            netns: netns.path().to_path_buf(),
            container_id: id.to_string(),
            ifname: self.cfg.ifname.clone(),
            conf_dir: self.cfg.cni_conf_dir.clone(),
            bin_dirs: self.cfg.cni_bin_dirs.clone(),
            cache_dir: self.cfg.cni_cache_dir.clone(),
            timeout_seconds: self.cfg.plugin_timeout_seconds,
            pod: pod.map(|p| {
                let a = pod_args(p, id);
                (a.namespace, a.name, a.infra_container_id, a.uid)
            }),
            ips: Vec::new(),
        };
        let cni = cni_for(&record, self.exec.clone());
        let result: Result<CniResult> = (|| {
            let net = cni.load_network().context("load CNI config")?;
            cni.add(&net, &runtime_conf(&record, pod))
                .context("CNI ADD")
        })();
        match result {
            Ok(res) => {
                record.ips = res
                    .sandbox_ips(&record.ifname)
                    .iter()
                    .map(|i| i.address.to_string())
                    .collect();
                log::info!(
                    "{id}: network namespace {} with {:?}",
                    record.netns.display(),
                    record.ips
                );
                Ok(record)
            }
            Err(e) => {
                // ADD rolls its own chain back; the netns is ours to remove.
                let _ = NetNs::remove(&record.netns);
                Err(e)
            }
        }
    }

    fn teardown(&self, record: &NetworkRecord) -> Result<()> {
        teardown_with(record, self.exec.clone())
            .with_context(|| format!("tear down the network of {}", record.container_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_names_are_short_stable_and_distinct() {
        let a = netns_name("k8s.io", &"f".repeat(128));
        assert!(a.len() <= 64 && a.starts_with("rsandbox-"));
        assert_eq!(a, netns_name("k8s.io", &"f".repeat(128)));
        assert_ne!(a, netns_name("default", &"f".repeat(128)));
    }

    #[test]
    fn port_mappings_become_the_port_mappings_capability() {
        let mut pod = PodSpec::default();
        pod.port_mappings.push(crate::pod::spec::PortMapping {
            protocol: crate::pod::spec::Protocol::Tcp,
            container_port: 80,
            host_port: 8080,
            host_ip: None,
        });
        pod.port_mappings.push(crate::pod::spec::PortMapping {
            protocol: crate::pod::spec::Protocol::Udp,
            container_port: 53,
            host_port: 0,
            host_ip: None,
        });
        let rec = NetworkRecord {
            netns: "/run/netns/x".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            conf_dir: "/c".into(),
            bin_dirs: vec![],
            cache_dir: "/k".into(),
            timeout_seconds: 1,
            pod: Some(("ns".into(), "name".into(), "c".into(), "uid".into())),
            ips: vec![],
        };
        let rt = runtime_conf(&rec, Some(&pod));
        assert_eq!(
            rt.capability_args["portMappings"],
            serde_json::json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
        );
        assert!(
            rt.args
                .iter()
                .any(|(k, v)| k == "K8S_POD_NAME" && v == "name")
        );
    }
}
