//! The shim's own configuration file (TOML), for what containerd does not tell a shim.
//!
//! Path: `$RSANDBOX_CONFIG`, else `/etc/containerd/rsandbox.toml`. A missing file means the
//! defaults below. containerd passes its environment to `start` (add
//! `RSANDBOX_CONFIG=...` to `[plugins.'io.containerd.shim.v1.manager'] env` to point at
//! another file), and the daemon inherits it.
//!
//! ```toml
//! [network]
//! # Pods created without a netns_path (containerd's sandbox controller API, not CRI) get a
//! # network namespace and the CNI chain from the shim. Off: such a sandbox without a CRI pod
//! # config runs in the host network; one whose pod config asks for a pod network is refused.
//! sandboxes = true
//! # With no CNI network config in cni_conf_dir, shim-owned namespaces get loopback only (and a
//! # warning in the log). true: that is an error instead.
//! require_cni = false
//! # Containers run with `ctr run --runtime io.containerd.rsandbox.v1` that ask for a new
//! # network namespace get one with CNI too. Off: they behave exactly as with runc.
//! standalone_tasks = false
//! cni_conf_dir = "/etc/cni/net.d"
//! cni_bin_dirs = ["/opt/cni/bin"]
//! cni_cache_dir = "/var/lib/cni"
//! netns_dir = "/var/run/netns"
//! ifname = "eth0"
//! plugin_timeout_seconds = 60
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::records::error::{Error, Result};

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "RSANDBOX_CONFIG";
/// Default config file.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/rsandbox.toml";

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimConfig {
    #[serde(default)]
    pub network: NetworkConfig,
}

/// `[network]`: shim-owned pod networking.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    pub sandboxes: bool,
    pub standalone_tasks: bool,
    /// A missing CNI network config fails the create instead of giving loopback only.
    pub require_cni: bool,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
    pub cni_cache_dir: PathBuf,
    pub netns_dir: PathBuf,
    pub ifname: String,
    pub plugin_timeout_seconds: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            sandboxes: true,
            standalone_tasks: false,
            require_cni: false,
            cni_conf_dir: PathBuf::from(crate::cni::DEFAULT_CONF_DIR),
            cni_bin_dirs: vec![PathBuf::from(crate::cni::DEFAULT_BIN_DIR)],
            cni_cache_dir: PathBuf::from(crate::cni::DEFAULT_CACHE_DIR),
            netns_dir: PathBuf::from("/var/run/netns"),
            ifname: crate::cni::DEFAULT_IFNAME.into(),
            plugin_timeout_seconds: 60,
        }
    }
}

impl NetworkConfig {
    /// CNI settings for the CNI runtime.
    pub fn cni_settings(&self) -> crate::cni::CniSettings {
        crate::cni::CniSettings {
            conf_dir: self.cni_conf_dir.clone(),
            bin_dirs: self.cni_bin_dirs.clone(),
            cache_dir: self.cni_cache_dir.clone(),
            ifname: self.ifname.clone(),
            timeout: Duration::from_secs(self.plugin_timeout_seconds.max(1)),
            ..Default::default()
        }
    }
}

impl ShimConfig {
    /// Parses a config document.
    pub fn parse(text: &str) -> Result<ShimConfig> {
        let cfg: ShimConfig = toml::from_str(text).map_err(|e| Error::invalid(e.to_string()))?;
        for (what, p) in [
            ("cni_conf_dir", &cfg.network.cni_conf_dir),
            ("cni_cache_dir", &cfg.network.cni_cache_dir),
            ("netns_dir", &cfg.network.netns_dir),
        ]
        .into_iter()
        .chain(cfg.network.cni_bin_dirs.iter().map(|p| ("cni_bin_dirs", p)))
        {
            if !p.is_absolute() {
                return Err(Error::invalid(format!(
                    "network.{what} {:?} must be an absolute path",
                    p
                )));
            }
        }
        Ok(cfg)
    }

    /// Loads the file at `path`; a missing file gives the defaults.
    pub fn load_from(path: &Path) -> Result<ShimConfig> {
        match std::fs::read_to_string(path) {
            Ok(text) => ShimConfig::parse(&text)
                .map_err(|e| e.context(format!("config {}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ShimConfig::default()),
            Err(e) => Err(Error::from(e).context(format!("read config {}", path.display()))),
        }
    }

    /// Loads the config named by `$RSANDBOX_CONFIG` or the default path.
    pub fn load() -> Result<ShimConfig> {
        let path = std::env::var_os(CONFIG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        Self::load_from(&path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_the_file_is_missing_or_empty() {
        let cfg = ShimConfig::load_from(Path::new("/nonexistent/rsandbox.toml")).unwrap();
        assert_eq!(cfg, ShimConfig::default());
        assert!(cfg.network.sandboxes && !cfg.network.standalone_tasks);
        assert!(!cfg.network.require_cni);
        assert_eq!(ShimConfig::parse("").unwrap(), ShimConfig::default());
    }

    #[test]
    fn keys_are_read_and_unknown_ones_rejected() {
        let cfg = ShimConfig::parse(
            "[network]\nstandalone_tasks = true\ncni_conf_dir = \"/etc/cni/x.d\"\ncni_bin_dirs = [\"/a\", \"/b\"]\nplugin_timeout_seconds = 5\n",
        )
        .unwrap();
        assert!(cfg.network.standalone_tasks);
        assert_eq!(
            cfg.network.cni_bin_dirs,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(cfg.network.cni_settings().timeout, Duration::from_secs(5));
        assert_eq!(cfg.network.netns_dir, PathBuf::from("/var/run/netns"));
        assert!(
            ShimConfig::parse("[network]\nrequire_cni = true\n")
                .unwrap()
                .network
                .require_cni
        );
        let e = ShimConfig::parse("[network]\nstandalone_task = true\n").unwrap_err();
        assert!(e.message().contains("standalone_task"), "{}", e.message());
        let e = ShimConfig::parse("[network]\nnetns_dir = \"relative\"\n").unwrap_err();
        assert!(e.message().contains("netns_dir"), "{}", e.message());
    }
}
