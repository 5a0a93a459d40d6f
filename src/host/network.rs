//! Shim-owned networking: a network namespace made by the shim plus the CNI plugin chain, for
//! pods and tasks that no caller gives a network to (containerd's sandbox controller API,
//! `ctr run`). Under CRI, containerd makes the netns and runs CNI itself; this is never used
//! there.
//!
//! With no CNI network config at all ([`CniError::NoConfig`]) the namespace gets loopback only
//! (a warning in the log, no IPs), unless `[network] require_cni = true` makes that an error. A
//! config that exists but is broken is always an error.
//!
//! The pod is described by a [`PodNetworkConf`] that `pod/` builds from its spec: this module does
//! not know the pod spec. Everything needed to undo the setup is in a [`NetworkRecord`] kept in
//! the bundle, so teardown works from the daemon, from ShutdownSandbox, and from the `delete`
//! action after a crash. Teardown is idempotent: CNI DEL tolerates a missing netns and a missing
//! cache entry.
//!
//! [`NetworkProvider`] is the narrow trait the sandbox and task code use, so their tests run
//! against `FakeNetwork` (test builds only) instead of namespaces and plugins.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::cni::{Cni, CniError, ExecError, PluginExec, PodArgs, RuntimeConf};
use crate::host::netns::NetNs;
use crate::records::config::NetworkConfig;
use crate::records::error::{Context, Error, Result};
use crate::shim::reaper::Spawner;

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
    /// No CNI network config existed: the netns has loopback only and no plugin ran (teardown
    /// only removes the netns).
    #[serde(default)]
    pub loopback_only: bool,
    /// The CNI result of the ADD (the last plugin's), for the verbose status. Memory only:
    /// `delete` after a crash needs none of it.
    #[serde(skip)]
    pub result: Option<serde_json::Value>,
}

/// What CNI needs to know about a pod (libcni's `RuntimeConf` minus the netns), as containerd's
/// CRI passes it: the `K8S_POD_*` CNI_ARGS and the `portMappings`, `dns` and `bandwidth`
/// capability args. Built by `pod/` from the pod's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNetworkConf {
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_UID`.
    pub uid: String,
    /// Host ports (entries without a host port are not passed, as in containerd).
    pub port_mappings: Vec<PortMapping>,
    /// The pod's DNS settings, for plugins that declare the `dns` capability.
    pub dns: Option<DnsConf>,
    /// Traffic shaping, for plugins that declare the `bandwidth` capability.
    pub bandwidth: Option<Bandwidth>,
}

/// One `portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    pub container_port: u16,
    pub host_port: u16,
    /// Host address to bind, `None` for all.
    pub host_ip: Option<IpAddr>,
}

/// The `dns` capability arg.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConf {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// The `bandwidth` capability arg, in bits per second and bits (containerd: the pod's
/// `kubernetes.io/{ingress,egress}-bandwidth` annotations, bursts `u32::MAX`); 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bandwidth {
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
}

/// Sets up and tears down shim-owned networks (a trait so tests can fake it: `FakeNetwork`).
pub trait NetworkProvider: Send + Sync {
    /// Creates the netns for `id` (namespace `ns`) and runs CNI ADD (or leaves it with loopback
    /// only when there is no CNI config; see the module docs).
    fn setup(&self, ns: &str, id: &str, pod: Option<&PodNetworkConf>) -> Result<NetworkRecord>;
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

fn runtime_conf(record: &NetworkRecord, pod: Option<&PodNetworkConf>) -> RuntimeConf {
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
    let Some(pod) = pod else { return rt };
    let ports: Vec<serde_json::Value> = pod
        .port_mappings
        .iter()
        .filter(|p| p.host_port != 0)
        .map(|p| {
            let mut m = serde_json::json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": p.protocol,
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
    if let Some(dns) = &pod.dns {
        rt = rt.with_capability(
            "dns",
            serde_json::json!({
                "servers": dns.servers,
                "searches": dns.searches,
                "options": dns.options,
            }),
        );
    }
    if let Some(b) = pod.bandwidth {
        rt = rt.with_capability(
            "bandwidth",
            serde_json::json!({
                "ingressRate": b.ingress_rate,
                "ingressBurst": b.ingress_burst,
                "egressRate": b.egress_rate,
                "egressBurst": b.egress_burst,
            }),
        );
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

/// [`teardown`] for the `delete` action (no provider: plugins run with a direct spawner), by
/// the end of `budget`: containerd kills `delete` at 5 s, and nobody runs DEL after it.
/// Every plugin runs (also after one failed) with at most its share of the time left
/// ([`Cni::del_until`]), so one that hangs for its own timeout (60 s by default) is killed in
/// time for the others, the bridge's veth and IP lease among them; the netns is removed
/// whatever DEL did, in the last [`NETNS_REMOVAL_SHARE`].
pub fn teardown_within(record: &NetworkRecord, budget: &crate::shim::timing::Budget) -> Result<()> {
    let mut failures: Vec<String> = Vec::new();
    if !record.loopback_only {
        let cni = cni_for(record, Arc::new(SpawnerExec(Spawner::direct())));
        match cni.load_network() {
            Ok(net) => {
                let rt = runtime_conf(record, None);
                let plugins = budget.before(NETNS_REMOVAL_SHARE);
                failures.extend(
                    cni.del_until(&net, &rt, plugins.until())
                        .into_iter()
                        .map(|e| e.to_string()),
                );
            }
            Err(e) => failures.push(format!("load CNI config for DEL: {e}")),
        }
    }
    if let Err(e) = NetNs::remove(&record.netns) {
        failures.push(format!("remove netns: {e}"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(format!("CNI DEL: {}", failures.join("; "))))
    }
}

/// What `delete` keeps for the network of [`crate::cli::cleanup::DELETE_BUDGET`]: the steps before
/// it (the containers, the pause) end this much before the deadline, so a `runc delete` that
/// hangs never leaves CNI DEL without time. It gets more when they end sooner.
pub const DELETE_SHARE: Duration = Duration::from_millis(1500);

/// `delete`'s network step: [`teardown_within`] on a thread of its own, watched until `budget`
/// ends; what it could not do goes to `undone`.
pub fn teardown_in_delete(
    record: NetworkRecord,
    budget: &crate::shim::timing::Budget,
    undone: &mut crate::shim::timing::Undone,
) {
    let b = *budget;
    match budget.run("rsandbox-cni-del", move || teardown_within(&record, &b)) {
        Some(Ok(())) => {}
        Some(Err(e)) => undone.failed(e.to_string()),
        None => undone.cut_off("the pod network (CNI DEL, netns)"),
    }
}

/// What [`teardown_within`] keeps of its budget for removing the netns after the plugins.
pub const NETNS_REMOVAL_SHARE: Duration = Duration::from_millis(100);

/// Tears down `record` with `exec` (the `delete` action uses a direct spawner).
pub fn teardown_with(record: &NetworkRecord, exec: Arc<dyn PluginExec>) -> Result<()> {
    if record.loopback_only {
        return NetNs::remove(&record.netns).context("remove netns");
    }
    let cni = cni_for(record, exec);
    let net = cni.load_network().context("load CNI config for DEL")?;
    let rt = runtime_conf(record, None);
    let del = cni.del(&net, &rt).context("CNI DEL");
    let rm = NetNs::remove(&record.netns).context("remove netns");
    del.and(rm)
}

impl NetworkProvider for Networker {
    fn setup(&self, ns: &str, id: &str, pod: Option<&PodNetworkConf>) -> Result<NetworkRecord> {
        let mut record = NetworkRecord {
            netns: self.cfg.netns_dir.join(netns_name(ns, id)),
            container_id: id.to_string(),
            ifname: self.cfg.ifname.clone(),
            conf_dir: self.cfg.cni_conf_dir.clone(),
            bin_dirs: self.cfg.cni_bin_dirs.clone(),
            cache_dir: self.cfg.cni_cache_dir.clone(),
            timeout_seconds: self.cfg.plugin_timeout_seconds,
            pod: pod.map(|p| {
                (
                    p.namespace.clone(),
                    p.name.clone(),
                    id.to_string(),
                    p.uid.clone(),
                )
            }),
            ips: Vec::new(),
            loopback_only: false,
            result: None,
        };
        let cni = cni_for(&record, self.exec.clone());
        // The config first: a broken one fails before anything exists.
        let net = match cni.load_network() {
            Ok(net) => Some(net),
            Err(CniError::NoConfig { dir }) if !self.cfg.require_cni => {
                log::warn!(
                    "{id}: no CNI network config in {}: the network namespace gets loopback only \
                     (set [network] require_cni = true to make this an error)",
                    dir.display()
                );
                None
            }
            Err(e) => return Err(Error::from(e).context("load CNI config")),
        };
        let netns = NetNs::create(&self.cfg.netns_dir, &netns_name(ns, id))
            .context("create network namespace")?;
        record.netns = netns.path().to_path_buf();
        let Some(net) = net else {
            record.loopback_only = true;
            log::info!(
                "{id}: network namespace {} with loopback only",
                record.netns.display()
            );
            return Ok(record);
        };
        match cni
            .add(&net, &runtime_conf(&record, pod))
            .context("CNI ADD")
        {
            Ok(res) => {
                record.ips = res
                    .sandbox_ips(&record.ifname)
                    .iter()
                    .map(|i| i.address.to_string())
                    .collect();
                record.result = Some(res.raw().clone());
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

/// A [`NetworkProvider`] for tests: records every call, answers as scripted, touches nothing.
#[cfg(test)]
#[derive(Default)]
pub struct FakeNetwork {
    /// `setup <ns> <id> <pod name or ->` / `teardown <id>`, in order.
    pub calls: std::sync::Mutex<Vec<String>>,
    /// The pod confs `setup` was given.
    pub confs: std::sync::Mutex<Vec<Option<PodNetworkConf>>>,
    /// When set, `setup` fails with this error (once).
    pub fail_setup: std::sync::Mutex<Option<Error>>,
    /// When set, `teardown` fails with this error (once).
    pub fail_teardown: std::sync::Mutex<Option<Error>>,
    /// `setup` reports loopback only (no CNI config) instead of an IP.
    pub loopback_only: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl FakeNetwork {
    /// The netns path `setup` reports for `id`.
    pub fn netns_of(id: &str) -> PathBuf {
        PathBuf::from("/fake/netns").join(id)
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[cfg(test)]
impl NetworkProvider for FakeNetwork {
    fn setup(&self, ns: &str, id: &str, pod: Option<&PodNetworkConf>) -> Result<NetworkRecord> {
        self.calls.lock().unwrap().push(format!(
            "setup {ns} {id} {}",
            pod.map_or("-", |p| p.name.as_str())
        ));
        self.confs.lock().unwrap().push(pod.cloned());
        if let Some(e) = self.fail_setup.lock().unwrap().take() {
            return Err(e);
        }
        let loopback_only = self.loopback_only.load(std::sync::atomic::Ordering::SeqCst);
        Ok(NetworkRecord {
            netns: Self::netns_of(id),
            container_id: id.into(),
            ifname: "eth0".into(),
            conf_dir: "/fake/cni".into(),
            bin_dirs: vec![],
            cache_dir: "/fake/cache".into(),
            timeout_seconds: 1,
            pod: pod.map(|p| {
                (
                    p.namespace.clone(),
                    p.name.clone(),
                    id.into(),
                    p.uid.clone(),
                )
            }),
            ips: if loopback_only {
                vec![]
            } else {
                vec!["10.90.0.2/16".into()]
            },
            loopback_only,
            result: None,
        })
    }

    fn teardown(&self, record: &NetworkRecord) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("teardown {}", record.container_id));
        match self.fail_teardown.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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

    fn record() -> NetworkRecord {
        NetworkRecord {
            netns: "/run/netns/x".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            conf_dir: "/c".into(),
            bin_dirs: vec![],
            cache_dir: "/k".into(),
            timeout_seconds: 1,
            pod: Some(("ns".into(), "name".into(), "c".into(), "uid".into())),
            ips: vec![],
            loopback_only: false,
            result: None,
        }
    }

    /// `delete`'s CNI DEL ends with its budget, not after the plugin timeout the record names:
    /// a plugin that hangs is killed at its share, and the plugins after it still run (the
    /// netns's removal: `cleanup`'s root test).
    #[test]
    fn teardown_within_a_budget_kills_a_hanging_plugin_and_runs_the_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (conf, bin) = (dir.path().join("conf"), dir.path().join("bin"));
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            conf.join("10-hang.conflist"),
            r#"{"cniVersion":"1.0.0","name":"hangnet","plugins":[{"type":"note"},{"type":"hang"}]}"#,
        )
        .unwrap();
        let ran = dir.path().join("note-ran");
        for (name, body) in [
            ("hang", "exec sleep 300".to_string()),
            (
                "note",
                format!("echo \"$CNI_COMMAND\" >> {}", ran.display()),
            ),
        ] {
            let plugin = bin.join(name);
            std::fs::write(&plugin, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let rec = NetworkRecord {
            netns: dir.path().join("netns"),
            conf_dir: conf,
            bin_dirs: vec![bin],
            cache_dir: dir.path().join("cache"),
            timeout_seconds: 600,
            ..record()
        };
        let budget = crate::shim::timing::Budget::new(std::time::Duration::from_secs(2));
        let t = std::time::Instant::now();
        let e = teardown_within(&rec, &budget).unwrap_err();
        // The record's 600 s would be 10 minutes; only a hang takes a minute.
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "{e}");
        assert!(format!("{e:#}").contains("CNI DEL"), "{e:#}");
        assert!(format!("{e:#}").contains("\"hang\""), "{e:#}");
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "DEL\n");
        println!("teardown with a hung plugin took {:?} of 2 s", t.elapsed());
    }

    #[test]
    fn the_pod_conf_becomes_args_and_capabilities() {
        let pod = PodNetworkConf {
            name: "name".into(),
            namespace: "ns".into(),
            uid: "uid".into(),
            port_mappings: vec![
                PortMapping {
                    protocol: "tcp",
                    container_port: 80,
                    host_port: 8080,
                    host_ip: None,
                },
                PortMapping {
                    protocol: "udp",
                    container_port: 53,
                    host_port: 0,
                    host_ip: None,
                },
                PortMapping {
                    protocol: "sctp",
                    container_port: 9,
                    host_port: 9,
                    host_ip: Some("::1".parse().unwrap()),
                },
            ],
            dns: Some(DnsConf {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            bandwidth: Some(Bandwidth {
                ingress_rate: 1_000_000,
                ingress_burst: u32::MAX as u64,
                ..Default::default()
            }),
        };
        let rt = runtime_conf(&record(), Some(&pod));
        assert_eq!(
            rt.capability_args["portMappings"],
            serde_json::json!([
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 9, "containerPort": 9, "protocol": "sctp", "hostIP": "::1"}
            ])
        );
        assert_eq!(
            rt.capability_args["dns"],
            serde_json::json!({"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"], "options": ["ndots:5"]})
        );
        assert_eq!(
            rt.capability_args["bandwidth"],
            serde_json::json!({"ingressRate": 1_000_000, "ingressBurst": 4294967295u64, "egressRate": 0, "egressBurst": 0})
        );
        assert!(
            rt.args
                .iter()
                .any(|(k, v)| k == "K8S_POD_NAME" && v == "name")
        );
        // Teardown passes no capabilities; a pod without any passes none either.
        assert!(runtime_conf(&record(), None).capability_args.is_empty());
        assert!(
            runtime_conf(&record(), Some(&PodNetworkConf::default()))
                .capability_args
                .is_empty()
        );
    }

    #[test]
    fn old_records_are_cni_networks() {
        let mut v = serde_json::to_value(record()).unwrap();
        v.as_object_mut().unwrap().remove("loopback_only");
        let r: NetworkRecord = serde_json::from_value(v).unwrap();
        assert!(!r.loopback_only);
    }

    fn networker(conf_dir: &Path, netns_dir: &Path, require_cni: bool) -> Networker {
        let cfg = NetworkConfig {
            cni_conf_dir: conf_dir.into(),
            netns_dir: netns_dir.into(),
            require_cni,
            ..Default::default()
        };
        Networker::new(cfg, Arc::new(SpawnerExec(Spawner::direct())))
    }

    #[test]
    fn require_cni_makes_a_missing_config_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("net.d");
        std::fs::create_dir(&empty).unwrap();
        let netns_dir = dir.path().join("netns");
        let e = networker(&empty, &netns_dir, true)
            .setup("default", "p1", None)
            .unwrap_err();
        assert_eq!(e.kind(), crate::records::error::Kind::FailedPrecondition);
        assert!(
            e.message().contains("no CNI network config found"),
            "{}",
            e.message()
        );
        assert!(!netns_dir.exists(), "nothing was created");
    }

    #[test]
    fn a_broken_config_is_an_error_even_without_require_cni() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("10-x.conflist"), "{not json").unwrap();
        let netns_dir = dir.path().join("netns");
        let e = networker(dir.path(), &netns_dir, false)
            .setup("default", "p1", None)
            .unwrap_err();
        assert_eq!(e.kind(), crate::records::error::Kind::FailedPrecondition);
        assert!(!netns_dir.exists(), "nothing was created");
    }

    #[test]
    #[ignore = "needs root: creates a network namespace"]
    fn no_config_gives_a_loopback_only_netns() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("net.d");
        let netns_dir = dir.path().join("netns");
        let n = networker(&empty, &netns_dir, false);
        let rec = n.setup("default", "p1", None).unwrap();
        struct Remove(PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = NetNs::remove(&self.0);
            }
        }
        let _rm = Remove(rec.netns.clone());
        assert!(rec.loopback_only && rec.ips.is_empty(), "{rec:?}");
        assert_eq!(rec.netns, netns_dir.join(netns_name("default", "p1")));
        assert_eq!(
            nix::sys::statfs::statfs(&rec.netns)
                .unwrap()
                .filesystem_type(),
            nix::sys::statfs::NSFS_MAGIC
        );
        // Teardown runs no plugin (there is no config to run) and removes the netns.
        n.teardown(&rec).unwrap();
        assert!(!rec.netns.exists());
        n.teardown(&rec).unwrap();
    }
}
