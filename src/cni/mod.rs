//! CNI runtime library: used when the shim itself owns a pod's network.
//!
//! Implements the runtime side of the CNI spec (1.0/1.1, with 0.3.x/0.4.0 results accepted),
//! following libcni (`libcni/api.go`, `pkg/invoke`) unless noted:
//!
//! * [`load_network`] picks the first valid `*.conf`/`*.conflist`/`*.json` in lexical order.
//! * [`Cni::add`] / [`Cni::del`] / [`Cni::check`] run the plugin chain, injecting `name`,
//!   `cniVersion`, `prevResult` and the declared capabilities' `runtimeConfig`.
//! * Results are cached in libcni's `cniCacheV1` format under `<cache_dir>/results`.
//!
//! Plugins are run through [`PluginExec`], implemented by the shim on top of its spawner so that
//! the daemon's single reaper reaps them; every implementation retries a spawn failing with
//! `ETXTBSY` ([`retry_text_busy`]). The tests run plugins through a std-based implementation.
//!
//! Deviations from libcni, on purpose:
//! * A failed ADD is rolled back here: DEL runs for the whole list (reverse order, best effort,
//!   `prevResult` = the last successful plugin's result) and any cache entry is removed. libcni
//!   just returns the error and leaves cleanup to the caller (containerd's CRI calls teardown).
//! * A failed cache write after a successful ADD also rolls back (libcni returns the error).
//! * CHECK without a cached result is an error ([`CniError::NoCachedResult`]); libcni runs the
//!   plugins without `prevResult`, which they then reject.
//! * Invalid config files are skipped, not fatal (CRI-O behaviour; go-cni fails hard).
//! * `cniVersion` is required in configs; results are not converted between versions (the raw
//!   result is passed on as `prevResult`); pre-0.3.0 results (`ip4`/`ip6`) are rejected.
//! * DEL on a netns path that no longer exists passes an empty `CNI_NETNS` (containerd does the
//!   same); plugin binaries are resolved for the whole list before anything runs.
//! * Every plugin execution has a timeout ([`CniSettings::timeout`], default 60 s); libcni only
//!   has the caller's context.
//! * No GC/STATUS/VERSION commands, no 1.1 `plugins` sub-directory loading.
//!
//! Layer rule: the bottom layer, self-contained: it imports nothing else of the crate (it
//! could be a crate of its own). `hack/check-cycles.sh` checks it.

mod cache;
mod config;
mod error;
mod exec;
mod result;
mod util;

#[cfg(test)]
mod std_exec;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

pub use cache::{CACHE_KIND, CacheEntry, ResultCache};
pub use config::{
    CONF_EXTENSIONS, NetworkConfig, PluginConfig, SUPPORTED_MAX_VERSION, conf_files, find_plugin,
    load_network, validate_ifname, validate_name, validate_plugin_type,
};
pub use error::{CniError, Command};
pub use exec::{ExecError, PluginExec, retry_text_busy};
pub use result::{CniResult, Dns, Interface, IpConfig, IpNet, ResultError, Route};
pub use util::parse_version;

/// Default config dir (containerd/CRI-O).
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Default plugin dir.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// Default cache dir (libcni's `CacheDir`).
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
/// Default interface name inside the pod.
pub const DEFAULT_IFNAME: &str = "eth0";
/// Default per-plugin-execution timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// `PATH` given to plugins when the shim itself has none.
pub const DEFAULT_PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where configs, plugins and the cache live, and how plugins are run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniSettings {
    /// Network config dir (default `/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Plugin dirs, searched in order; also passed as `CNI_PATH` (default `/opt/cni/bin`).
    pub bin_dirs: Vec<PathBuf>,
    /// Cache dir; results go to `<cache_dir>/results` (default `/var/lib/cni`).
    pub cache_dir: PathBuf,
    /// Interface name in the pod (default `eth0`).
    pub ifname: String,
    /// Timeout for each single plugin execution (default 60 s).
    pub timeout: Duration,
    /// `PATH` for plugins (default: the shim's `PATH`, else [`DEFAULT_PATH_ENV`]).
    pub path_env: String,
}

impl Default for CniSettings {
    fn default() -> Self {
        CniSettings {
            conf_dir: DEFAULT_CONF_DIR.into(),
            bin_dirs: vec![DEFAULT_BIN_DIR.into()],
            cache_dir: DEFAULT_CACHE_DIR.into(),
            ifname: DEFAULT_IFNAME.into(),
            timeout: DEFAULT_TIMEOUT,
            path_env: std::env::var("PATH")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_PATH_ENV.into()),
        }
    }
}

/// Kubernetes pod identity, turned into the standard `K8S_POD_*` CNI_ARGS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodArgs {
    /// `K8S_POD_NAMESPACE`
    pub namespace: String,
    /// `K8S_POD_NAME`
    pub name: String,
    /// `K8S_POD_INFRA_CONTAINER_ID` (the sandbox ID)
    pub infra_container_id: String,
    /// `K8S_POD_UID`
    pub uid: String,
}

/// Per-invocation arguments (libcni's `RuntimeConf`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuntimeConf {
    /// `CNI_CONTAINERID` (the sandbox ID).
    pub container_id: String,
    /// `CNI_NETNS`: path of the pod's network namespace.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS` pairs, joined as `K=V;K=V` in this order.
    pub args: Vec<(String, String)>,
    /// Capability args (`portMappings`, `dns`, `bandwidth`, `ips`, `mac`, `cgroupPath`, …); each
    /// plugin gets in `runtimeConfig` only those its `capabilities` declare.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    /// A conf with no args and no capability args.
    pub fn new(
        container_id: impl Into<String>,
        netns: impl Into<String>,
        ifname: impl Into<String>,
    ) -> Self {
        RuntimeConf {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            ..Default::default()
        }
    }

    /// Sets `args` to `IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;
    /// K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..` (the order containerd uses).
    pub fn with_pod(mut self, pod: &PodArgs) -> Self {
        self.args = vec![
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), pod.namespace.clone()),
            ("K8S_POD_NAME".into(), pod.name.clone()),
            (
                "K8S_POD_INFRA_CONTAINER_ID".into(),
                pod.infra_container_id.clone(),
            ),
            ("K8S_POD_UID".into(), pod.uid.clone()),
        ];
        self
    }

    /// Sets one capability arg (e.g. `"portMappings"`).
    pub fn with_capability(mut self, name: impl Into<String>, value: Value) -> Self {
        self.capability_args.insert(name.into(), value);
        self
    }
}

/// Formats CNI_ARGS: `K=V` pairs joined with `;`. Keys must be non-empty; neither keys nor
/// values may contain `;` or `=` (plugins split on both).
pub fn format_cni_args(args: &[(String, String)]) -> Result<String, CniError> {
    let mut out = Vec::with_capacity(args.len());
    for (k, v) in args {
        if k.is_empty() || [k, v].iter().any(|s| s.contains([';', '=', '\0'])) {
            return Err(CniError::InvalidArg {
                key: k.clone(),
                value: v.clone(),
            });
        }
        out.push(format!("{k}={v}"));
    }
    Ok(out.join(";"))
}

/// Builds the stdin document for one plugin: its own config plus injected `name`,
/// `cniVersion`, `prevResult` (if any) and `runtimeConfig` (declared capabilities only; only
/// injected when non-empty, like libcni).
pub fn plugin_stdin(
    net: &NetworkConfig,
    plugin: &PluginConfig,
    prev_result: Option<&Value>,
    rt: &RuntimeConf,
) -> Value {
    let mut conf = plugin.raw.clone();
    conf.insert("name".into(), Value::from(net.name.clone()));
    conf.insert("cniVersion".into(), Value::from(net.cni_version.clone()));
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    let rc: Map<String, Value> = plugin
        .capabilities
        .iter()
        .filter_map(|c| rt.capability_args.get(c).map(|v| (c.clone(), v.clone())))
        .collect();
    if !rc.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(rc));
    }
    Value::Object(conf)
}

/// The CNI runtime: runs network config lists against pods.
pub struct Cni {
    settings: CniSettings,
    exec: Arc<dyn PluginExec>,
    cache: ResultCache,
}

impl std::fmt::Debug for Cni {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cni")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Cni {
    /// A runtime with `settings`, running plugins through `exec`.
    pub fn new(settings: CniSettings, exec: Arc<dyn PluginExec>) -> Self {
        let cache = ResultCache::new(settings.cache_dir.clone());
        Cni {
            settings,
            exec,
            cache,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &CniSettings {
        &self.settings
    }

    /// The result cache.
    pub fn cache(&self) -> &ResultCache {
        &self.cache
    }

    /// Loads the network from [`CniSettings::conf_dir`] (see [`load_network`]).
    pub fn load_network(&self) -> Result<NetworkConfig, CniError> {
        load_network(&self.settings.conf_dir)
    }

    /// A [`RuntimeConf`] for `container_id`/`netns` with the configured interface name.
    pub fn runtime_conf(
        &self,
        container_id: impl Into<String>,
        netns: impl Into<String>,
    ) -> RuntimeConf {
        RuntimeConf::new(container_id, netns, self.settings.ifname.clone())
    }

    /// The exact environment a plugin gets: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
    /// `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`, `PATH` — nothing else.
    pub fn plugin_env(
        &self,
        command: Command,
        rt: &RuntimeConf,
        netns: &str,
    ) -> Result<Vec<(String, String)>, CniError> {
        let cni_path = self
            .settings
            .bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        Ok(vec![
            ("CNI_COMMAND".into(), command.as_str().into()),
            ("CNI_CONTAINERID".into(), rt.container_id.clone()),
            ("CNI_NETNS".into(), netns.into()),
            ("CNI_IFNAME".into(), rt.ifname.clone()),
            ("CNI_ARGS".into(), format_cni_args(&rt.args)?),
            ("CNI_PATH".into(), cni_path),
            ("PATH".into(), self.settings.path_env.clone()),
        ])
    }

    fn validate(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<Vec<PathBuf>, CniError> {
        validate_name("network name", &net.name)?;
        validate_name("container ID", &rt.container_id)?;
        validate_ifname(&rt.ifname)?;
        format_cni_args(&rt.args)?;
        if net.plugins.is_empty() {
            return Err(CniError::InvalidConfig {
                source_name: net.name.clone(),
                reason: "plugin list is empty".into(),
            });
        }
        if parse_version(&net.cni_version).is_none() {
            return Err(CniError::InvalidConfig {
                source_name: net.name.clone(),
                reason: format!("invalid cniVersion {:?}", net.cni_version),
            });
        }
        net.plugins
            .iter()
            .map(|p| find_plugin(&p.plugin_type, &self.settings.bin_dirs))
            .collect()
    }

    /// Runs one plugin; maps a failure with a CNI error object on stdout to
    /// [`CniError::Plugin`].
    fn run(
        &self,
        call: &Call<'_>,
        plugin: &PluginConfig,
        path: &Path,
        prev: Option<&Value>,
    ) -> Result<Vec<u8>, CniError> {
        self.run_for(call, plugin, path, prev, self.settings.timeout)
    }

    /// [`Cni::run`] with its own `timeout`.
    fn run_for(
        &self,
        call: &Call<'_>,
        plugin: &PluginConfig,
        path: &Path,
        prev: Option<&Value>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CniError> {
        let Call {
            command,
            net,
            rt,
            netns,
        } = *call;
        let env = self.plugin_env(command, rt, netns)?;
        let stdin = serde_json::to_vec(&plugin_stdin(net, plugin, prev, rt))
            .expect("JSON value serializes");
        log::debug!(
            "CNI {command} network={} plugin={} container={}",
            net.name,
            plugin.plugin_type,
            rt.container_id
        );
        self.exec
            .exec(path, &env, &stdin, timeout)
            .map_err(|e| plugin_error(&plugin.plugin_type, command, e))
    }

    /// ADD: runs the plugins in order, chaining each result into the next one's `prevResult`,
    /// caches and returns the final result. On failure the whole list is DELeted (best effort)
    /// and the plugin's error is returned.
    pub fn add(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<CniResult, CniError> {
        let paths = self.validate(net, rt)?;
        let mut prev: Option<CniResult> = None;
        let call = Call {
            command: Command::Add,
            net,
            rt,
            netns: &rt.netns,
        };
        for (plugin, path) in net.plugins.iter().zip(&paths) {
            let step = self
                .run(&call, plugin, path, prev.as_ref().map(CniResult::raw))
                .and_then(|out| {
                    CniResult::parse(&out, &net.cni_version).map_err(|source| {
                        CniError::InvalidResult {
                            plugin: plugin.plugin_type.clone(),
                            command: Command::Add,
                            source,
                        }
                    })
                });
            match step {
                Ok(r) => prev = Some(r),
                Err(e) => {
                    self.rollback(net, rt, &paths, prev.as_ref().map(CniResult::raw));
                    return Err(e);
                }
            }
        }
        let result = prev.expect("a network has at least one plugin");
        let entry = CacheEntry {
            kind: CACHE_KIND.into(),
            container_id: rt.container_id.clone(),
            config: net.bytes.clone(),
            if_name: rt.ifname.clone(),
            network_name: net.name.clone(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result: Some(result.raw().clone()),
        };
        if let Err(e) = self.cache.write(&entry) {
            self.rollback(net, rt, &paths, Some(result.raw()));
            return Err(e);
        }
        Ok(result)
    }

    fn rollback(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        paths: &[PathBuf],
        prev: Option<&Value>,
    ) {
        log::warn!(
            "CNI ADD of network {} for {} failed; rolling back with DEL",
            net.name,
            rt.container_id
        );
        let netns = effective_del_netns(&rt.netns);
        let call = Call {
            command: Command::Del,
            net,
            rt,
            netns: &netns,
        };
        for (plugin, path) in net.plugins.iter().zip(paths).rev() {
            if let Err(e) = self.run(&call, plugin, path, prev) {
                log::warn!("CNI rollback: {e}");
            }
        }
        if let Err(e) = self.cache.remove(&net.name, &rt.container_id, &rt.ifname) {
            log::warn!("CNI rollback: {e}");
        }
    }

    /// DEL: runs the plugins in reverse order with the cached result as `prevResult` (for
    /// `cniVersion >= 0.4.0`; omitted if there is no usable cache entry), then removes the cache
    /// entry. Idempotent; a netns path that no longer exists becomes an empty `CNI_NETNS`.
    /// On a plugin failure the cache entry is kept so a retry still has the `prevResult`.
    pub fn del(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<(), CniError> {
        let paths = self.validate(net, rt)?;
        let cached = self.prev_result_for_del(net, rt);
        let netns = effective_del_netns(&rt.netns);
        let call = Call {
            command: Command::Del,
            net,
            rt,
            netns: &netns,
        };
        for (plugin, path) in net.plugins.iter().zip(&paths).rev() {
            self.run(&call, plugin, path, cached.as_ref())?;
        }
        if let Err(e) = self.cache.remove(&net.name, &rt.container_id, &rt.ifname) {
            log::warn!("CNI DEL: {e}");
        }
        Ok(())
    }

    /// DEL as the last chance, by `deadline` (the `delete` action, which containerd kills after
    /// 5 s and which nobody retries): every plugin of the list runs, in reverse order, also
    /// after one before it failed (libcni stops at the first failure and leaves the retry to
    /// its caller), and each gets at most an equal share of the time left for the plugins
    /// still to run (and never more than the plugin timeout): a plugin that hangs is killed at
    /// its share, and those after it still get theirs. The cache entry is removed whatever
    /// happened: nobody will DEL again (the caller's record of the network goes with it).
    /// Returns every failure, in the order met.
    pub fn del_until(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        deadline: std::time::Instant,
    ) -> Vec<CniError> {
        let paths = match self.validate(net, rt) {
            Ok(p) => p,
            Err(e) => return vec![e],
        };
        let cached = self.prev_result_for_del(net, rt);
        let netns = effective_del_netns(&rt.netns);
        let call = Call {
            command: Command::Del,
            net,
            rt,
            netns: &netns,
        };
        let mut errors = Vec::new();
        let count = net.plugins.len();
        for (i, (plugin, path)) in net.plugins.iter().zip(&paths).rev().enumerate() {
            let still_to_run = (count - i) as u32;
            let share =
                deadline.saturating_duration_since(std::time::Instant::now()) / still_to_run;
            let timeout = share.min(self.settings.timeout);
            if timeout.is_zero() {
                errors.push(CniError::NoTimeLeft {
                    plugin: plugin.plugin_type.clone(),
                    command: Command::Del,
                });
                continue;
            }
            if let Err(e) = self.run_for(&call, plugin, path, cached.as_ref(), timeout) {
                errors.push(e);
            }
        }
        if let Err(e) = self.cache.remove(&net.name, &rt.container_id, &rt.ifname) {
            errors.push(e);
        }
        errors
    }

    /// The `prevResult` DEL passes: the cached result (for `cniVersion >= 0.4.0`), none if
    /// there is no usable cache entry (an unusable one is removed).
    fn prev_result_for_del(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Option<Value> {
        if !net.uses_cached_result() {
            return None;
        }
        match self.cache.read(&net.name, &rt.container_id, &rt.ifname) {
            Ok(entry) => entry.and_then(|e| e.result),
            Err(e) => {
                log::warn!("ignoring unusable CNI cache entry: {e}");
                let _ = self.cache.remove(&net.name, &rt.container_id, &rt.ifname);
                None
            }
        }
    }

    /// CHECK: runs the plugins in order with the cached result as `prevResult`. Errors for
    /// `cniVersion < 0.4.0`; a no-op with `disableCheck`; requires the cached result.
    pub fn check(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<(), CniError> {
        if !net.supports_check() {
            return Err(CniError::CheckNotSupported(net.cni_version.clone()));
        }
        if net.disable_check {
            return Ok(());
        }
        let paths = self.validate(net, rt)?;
        let cached = self
            .cache
            .read(&net.name, &rt.container_id, &rt.ifname)?
            .and_then(|e| e.result)
            .ok_or_else(|| CniError::NoCachedResult {
                network: net.name.clone(),
                container_id: rt.container_id.clone(),
                ifname: rt.ifname.clone(),
            })?;
        let call = Call {
            command: Command::Check,
            net,
            rt,
            netns: &rt.netns,
        };
        for (plugin, path) in net.plugins.iter().zip(&paths) {
            self.run(&call, plugin, path, Some(&cached))?;
        }
        Ok(())
    }

    /// The result cached by the last successful ADD, if any.
    pub fn cached_result(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, CniError> {
        let Some(raw) = self
            .cache
            .read(&net.name, &rt.container_id, &rt.ifname)?
            .and_then(|e| e.result)
        else {
            return Ok(None);
        };
        let path = self.cache.path(&net.name, &rt.container_id, &rt.ifname)?;
        CniResult::from_value(raw, &net.cni_version)
            .map(Some)
            .map_err(|e| CniError::Cache {
                path,
                reason: format!("cached result: {e}"),
            })
    }
}

/// What is common to all plugin runs of one operation.
#[derive(Clone, Copy)]
struct Call<'a> {
    command: Command,
    net: &'a NetworkConfig,
    rt: &'a RuntimeConf,
    netns: &'a str,
}

/// `CNI_NETNS` for DEL: empty when the path no longer exists.
fn effective_del_netns(netns: &str) -> String {
    if netns.is_empty() || Path::new(netns).exists() {
        netns.to_string()
    } else {
        log::info!("netns {netns} is gone; running CNI DEL with an empty CNI_NETNS");
        String::new()
    }
}

/// Turns a failed execution into the most specific error: a CNI error object on stdout
/// becomes [`CniError::Plugin`].
fn plugin_error(plugin: &str, command: Command, e: ExecError) -> CniError {
    if let ExecError::Failed { stdout, .. } = &e
        && let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(stdout)
        && (o.contains_key("msg") || o.contains_key("code"))
    {
        let text = |k: &str| match o.get(k) {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        };
        let details = text("details");
        return CniError::Plugin {
            plugin: plugin.to_string(),
            command,
            code: o.get("code").and_then(Value::as_u64).unwrap_or(0),
            msg: text("msg"),
            details: (!details.is_empty()).then_some(details),
        };
    }
    CniError::Exec {
        plugin: plugin.to_string(),
        command,
        source: e,
    }
}
