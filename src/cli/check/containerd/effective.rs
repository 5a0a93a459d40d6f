//! The effective config `containerd --config <root> config dump` prints: the CRI runtime
//! handlers (version 3+ layout, or a version 2 dump's), the default runtime, the shim
//! manager's environment.

use crate::records::bundle::RUNTIME_ID;

/// The CRI runtime plugin's section (config version 3 and later).
pub(super) const CRI_RUNTIME: &str = "io.containerd.cri.v1.runtime";
/// The CRI plugin's section in version 2 configs.
const CRI_V2: &str = "io.containerd.grpc.v1.cri";
const SHIM_MANAGER: &str = "io.containerd.shim.v1.manager";

/// An rsandbox handler of the effective config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    pub name: String,
    pub sandboxer: String,
    pub has_options: bool,
    /// `options.BinaryName` (containerd >= 2.3.1 passes it to the shim).
    pub binary_name: Option<String>,
    pub runtime_path: Option<String>,
}

/// What the effective config says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub version: i64,
    pub default_runtime: Option<String>,
    /// Handlers with `runtime_type = io.containerd.rsandbox.v1`.
    pub handlers: Vec<Handler>,
    /// `runtime_type` of every handler, by name.
    pub runtime_types: Vec<(String, String)>,
    /// A handler of runc's type with `SystemdCgroup = true`.
    pub runc_systemd_cgroup: bool,
    /// `RSANDBOX_CONFIG=` in the shim manager's `env`.
    pub shim_config_env: Option<String>,
}

/// Reads the effective config printed by `config dump`.
pub fn parse_effective(dump: &str) -> Result<Effective, String> {
    let t: toml::Table =
        toml::from_str(dump).map_err(|e| format!("config dump is not valid TOML: {e}"))?;
    let mut eff = Effective {
        version: t.get("version").and_then(|v| v.as_integer()).unwrap_or(0),
        ..Default::default()
    };
    let plugins = t.get("plugins").and_then(|v| v.as_table());
    let plugin = |name: &str| plugins.and_then(|p| p.get(name)).and_then(|v| v.as_table());
    // The CRI runtime section: version 3+ (`io.containerd.cri.v1.runtime`), else a version 2
    // dump (`io.containerd.grpc.v1.cri`).
    let containerd = plugin(CRI_RUNTIME)
        .and_then(|c| c.get("containerd"))
        .or_else(|| plugin(CRI_V2).and_then(|c| c.get("containerd")))
        .and_then(|v| v.as_table());
    if let Some(c) = containerd {
        eff.default_runtime = c
            .get("default_runtime_name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(String::from);
        let runtimes = c.get("runtimes").and_then(|v| v.as_table());
        for (name, r) in runtimes.into_iter().flatten() {
            let Some(r) = r.as_table() else { continue };
            let get = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let runtime_type = get("runtime_type");
            let options = r.get("options").and_then(|v| v.as_table());
            if runtime_type == RUNTIME_ID {
                eff.handlers.push(Handler {
                    name: name.clone(),
                    sandboxer: get("sandboxer"),
                    has_options: options.is_some(),
                    binary_name: options
                        .and_then(|o| o.get("BinaryName"))
                        .and_then(|v| v.as_str())
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                    runtime_path: Some(get("runtime_path")).filter(|s| !s.is_empty()),
                });
            } else if runtime_type == "io.containerd.runc.v2"
                && options
                    .and_then(|o| o.get("SystemdCgroup"))
                    .and_then(|v| v.as_bool())
                    == Some(true)
            {
                eff.runc_systemd_cgroup = true;
            }
            eff.runtime_types.push((name.clone(), runtime_type));
        }
    }
    let env = plugin(SHIM_MANAGER)
        .and_then(|m| m.get("env"))
        .and_then(|v| v.as_array());
    eff.shim_config_env = env
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .find_map(|e| e.strip_prefix(&format!("{}=", crate::records::config::CONFIG_ENV)))
        .map(String::from);
    Ok(eff)
}
