//! Network configuration loading (libcni `ConfFiles` / `NetworkConfFromBytes` semantics) and
//! plugin lookup (`pkg/invoke` `FindInPath`).

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::CniError;
use super::util::parse_version;

/// The newest spec version this library speaks (used to pick from a 1.1 `cniVersions` list).
pub const SUPPORTED_MAX_VERSION: &str = "1.1.0";

/// File extensions of network configs, as containerd's go-cni loads them.
pub const CONF_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// One plugin of a network config list.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// The plugin `type` (binary name, validated: no `/`, no `..`).
    pub plugin_type: String,
    /// Capabilities the plugin declares with `true` in its `capabilities` map.
    pub capabilities: BTreeSet<String>,
    /// The plugin's complete JSON object, unknown keys included.
    pub raw: Map<String, Value>,
}

/// A network config list (`.conflist`, or a `.conf`/`.json` single plugin wrapped in a list).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    /// Network `name` (validated like a container ID: `[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
    pub name: String,
    /// The effective `cniVersion` injected into every plugin's stdin.
    pub cni_version: String,
    /// `disableCheck`: CHECK becomes a no-op.
    pub disable_check: bool,
    /// The plugins, in ADD order.
    pub plugins: Vec<PluginConfig>,
    /// The list's bytes (for a wrapped single-plugin file, the synthesized list), stored in the
    /// result cache like libcni does.
    pub bytes: Vec<u8>,
    /// The file it was loaded from, if any.
    pub source: Option<PathBuf>,
}

fn invalid(source: &str, reason: impl Into<String>) -> CniError {
    CniError::InvalidConfig {
        source_name: source.to_string(),
        reason: reason.into(),
    }
}

fn bool_field(obj: &Map<String, Value>, key: &str, src: &str) -> Result<bool, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        // libcni also accepts the strings "true"/"false"
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(invalid(src, format!("invalid {key} value {s:?}"))),
        },
        Some(other) => Err(invalid(src, format!("invalid {key} value {other}"))),
    }
}

impl PluginConfig {
    /// Validates one plugin object.
    pub fn from_value(v: Value, src: &str) -> Result<Self, CniError> {
        let Value::Object(raw) = v else {
            return Err(invalid(src, "plugin entry is not a JSON object"));
        };
        let plugin_type = match raw.get("type") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                return Err(invalid(src, "plugin has no type"));
            }
            Some(other) => {
                return Err(invalid(
                    src,
                    format!("plugin type is not a string: {other}"),
                ));
            }
        };
        validate_plugin_type(&plugin_type)?;
        let capabilities = match raw.get("capabilities") {
            None | Some(Value::Null) => BTreeSet::new(),
            Some(Value::Object(m)) => m
                .iter()
                .filter(|(_, on)| on.as_bool() == Some(true))
                .map(|(k, _)| k.clone())
                .collect(),
            Some(_) => {
                return Err(invalid(
                    src,
                    format!("plugin {plugin_type:?}: capabilities is not an object"),
                ));
            }
        };
        Ok(PluginConfig {
            plugin_type,
            capabilities,
            raw,
        })
    }
}

fn top_level(bytes: &[u8], src: &str) -> Result<Map<String, Value>, CniError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid(src, "not a JSON object")),
        Err(e) => Err(invalid(src, format!("invalid JSON: {e}"))),
    }
}

fn name_and_version(obj: &Map<String, Value>, src: &str) -> Result<(String, String), CniError> {
    let name = match obj.get("name") {
        Some(Value::String(n)) => n.clone(),
        None | Some(Value::Null) => return Err(invalid(src, "no name")),
        Some(other) => return Err(invalid(src, format!("name is not a string: {other}"))),
    };
    validate_name("network name", &name)?;
    let mut version = match obj.get("cniVersion") {
        Some(Value::String(v)) => v.clone(),
        None | Some(Value::Null) => return Err(invalid(src, "no cniVersion")),
        Some(other) => return Err(invalid(src, format!("cniVersion is not a string: {other}"))),
    };
    if parse_version(&version).is_none() {
        return Err(invalid(src, format!("invalid cniVersion {version:?}")));
    }
    // Spec 1.1 `cniVersions`: use the highest listed version we support, if higher.
    if let Some(list) = obj.get("cniVersions") {
        let Value::Array(list) = list else {
            return Err(invalid(src, "cniVersions is not an array"));
        };
        let max = parse_version(SUPPORTED_MAX_VERSION).expect("constant");
        for v in list {
            let s = v
                .as_str()
                .ok_or_else(|| invalid(src, "cniVersions contains a non-string"))?;
            let pv = parse_version(s)
                .ok_or_else(|| invalid(src, format!("invalid cniVersions entry {s:?}")))?;
            if pv <= max && pv > parse_version(&version).expect("validated") {
                version = s.to_string();
            }
        }
    }
    Ok((name, version))
}

impl NetworkConfig {
    /// Parses a config list (`{"name","cniVersion","plugins":[...]}`).
    pub fn from_conflist_bytes(bytes: &[u8], src: &str) -> Result<Self, CniError> {
        let obj = top_level(bytes, src)?;
        let (name, cni_version) = name_and_version(&obj, src)?;
        let disable_check = bool_field(&obj, "disableCheck", src)?;
        let plugins = match obj.get("plugins") {
            Some(Value::Array(p)) => p.clone(),
            None | Some(Value::Null) => return Err(invalid(src, "no plugins in list")),
            Some(_) => return Err(invalid(src, "plugins is not an array")),
        };
        if plugins.is_empty() {
            return Err(invalid(src, "plugin list is empty"));
        }
        let plugins = plugins
            .into_iter()
            .map(|p| PluginConfig::from_value(p, src))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NetworkConfig {
            name,
            cni_version,
            disable_check,
            plugins,
            bytes: bytes.to_vec(),
            source: None,
        })
    }

    /// Parses a single-plugin config (`.conf`/`.json`) and wraps it in a one-plugin list, as
    /// libcni's `ConfListFromConf` does (the stored `bytes` are the synthesized list).
    pub fn from_conf_bytes(bytes: &[u8], src: &str) -> Result<Self, CniError> {
        let obj = top_level(bytes, src)?;
        let (name, cni_version) = name_and_version(&obj, src)?;
        if obj.contains_key("plugins") && !obj.contains_key("type") {
            return Err(invalid(
                src,
                "looks like a config list (has plugins, no type); name it *.conflist",
            ));
        }
        let plugin = PluginConfig::from_value(Value::Object(obj.clone()), src)?;
        let list = serde_json::json!({
            "name": name,
            "cniVersion": cni_version,
            "plugins": [Value::Object(obj)],
        });
        Ok(NetworkConfig {
            name,
            cni_version,
            disable_check: false,
            plugins: vec![plugin],
            bytes: serde_json::to_vec(&list).expect("JSON value serializes"),
            source: None,
        })
    }

    /// Loads one file, choosing the format by extension.
    pub fn from_file(path: &Path) -> Result<Self, CniError> {
        let src = path.display().to_string();
        let bytes = fs::read(path).map_err(|e| invalid(&src, format!("cannot read: {e}")))?;
        let mut net = if path.extension().is_some_and(|e| e == "conflist") {
            Self::from_conflist_bytes(&bytes, &src)?
        } else {
            Self::from_conf_bytes(&bytes, &src)?
        };
        net.source = Some(path.to_path_buf());
        Ok(net)
    }

    /// Whether CHECK is meaningful: `cniVersion >= 0.4.0`.
    pub fn supports_check(&self) -> bool {
        parse_version(&self.cni_version).is_some_and(|v| v >= (0, 4, 0))
    }

    /// Whether DEL gets the cached result as `prevResult` (`cniVersion >= 0.4.0`).
    pub(crate) fn uses_cached_result(&self) -> bool {
        self.supports_check()
    }
}

/// The config files in `dir` (regular files, or symlinks to them, ending in `.conf`,
/// `.conflist` or `.json`), sorted lexically by file name. A missing dir yields an empty list.
pub fn conf_files(dir: &Path) -> Result<Vec<PathBuf>, CniError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CniError::ReadConfDir {
                dir: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CniError::ReadConfDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CONF_EXTENSIONS.contains(&e))
        {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Loads the pod network: the first *valid* config file in lexical order among `*.conf`,
/// `*.conflist` and `*.json` in `conf_dir` (one sort over all extensions, like containerd's
/// go-cni). Files that fail to parse or validate are skipped with a warning, as CRI-O does
/// (go-cni instead fails on the first broken file); if none is valid, the error lists why
/// each was rejected.
pub fn load_network(conf_dir: &Path) -> Result<NetworkConfig, CniError> {
    let files = conf_files(conf_dir)?;
    if files.is_empty() {
        return Err(CniError::NoConfig {
            dir: conf_dir.to_path_buf(),
        });
    }
    let mut errors = Vec::new();
    for f in files {
        match NetworkConfig::from_file(&f) {
            Ok(net) => return Ok(net),
            Err(e) => {
                log::warn!("skipping CNI config {}: {e}", f.display());
                errors.push(e.to_string());
            }
        }
    }
    Err(CniError::NoValidConfig {
        dir: conf_dir.to_path_buf(),
        errors,
    })
}

/// Rejects plugin types that could escape the bin dirs: empty, containing `/`, `..` or NUL.
pub fn validate_plugin_type(t: &str) -> Result<(), CniError> {
    if t.is_empty() || t.contains('/') || t.contains("..") || t.contains('\0') {
        return Err(CniError::InvalidPluginType(t.to_string()));
    }
    Ok(())
}

/// Finds plugin `plugin_type` as a regular file in the first of `bin_dirs` that has it.
pub fn find_plugin(plugin_type: &str, bin_dirs: &[PathBuf]) -> Result<PathBuf, CniError> {
    validate_plugin_type(plugin_type)?;
    for dir in bin_dirs {
        let p = dir.join(plugin_type);
        if fs::metadata(&p).is_ok_and(|m| m.is_file()) {
            return Ok(p);
        }
    }
    Err(CniError::PluginNotFound {
        plugin: plugin_type.to_string(),
        dirs: bin_dirs.to_vec(),
    })
}

/// libcni's rule for container IDs and network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`. This
/// also keeps them safe as parts of cache file names (no `/`, cannot be `.` or `..`).
pub fn validate_name(what: &'static str, value: &str) -> Result<(), CniError> {
    let mut chars = value.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        return Err(CniError::InvalidName {
            what,
            value: value.to_string(),
            reason: "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*",
        });
    }
    Ok(())
}

/// libcni's rule for interface names: 1..=15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(ifname: &str) -> Result<(), CniError> {
    let reason = if ifname.is_empty() {
        Some("is empty")
    } else if ifname.len() > 15 {
        Some("is longer than 15 bytes")
    } else if ifname == "." || ifname == ".." {
        Some("is . or ..")
    } else if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
    {
        Some("contains /, :, NUL or whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CniError::InvalidName {
            what: "interface name",
            value: ifname.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, body: &str) {
        fs::write(dir.join(name), body).unwrap();
    }

    const LIST_A: &str = r#"{"cniVersion":"1.0.0","name":"alpha","plugins":[
        {"type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}},
        {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"x-unknown":[1]}]}"#;

    #[test]
    fn lexical_order_over_all_extensions() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "20-b.conf",
            r#"{"cniVersion":"0.4.0","name":"beta","type":"bridge"}"#,
        );
        write(d.path(), "10-a.conflist", LIST_A);
        write(d.path(), "05-ignored.txt", "not a config");
        fs::create_dir(d.path().join("00-dir.conf")).unwrap();
        let files = conf_files(d.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, vec!["10-a.conflist", "20-b.conf"]);

        let net = load_network(d.path()).unwrap();
        assert_eq!(net.name, "alpha");
        assert_eq!(net.cni_version, "1.0.0");
        assert_eq!(net.plugins.len(), 2);
        assert_eq!(net.plugins[0].plugin_type, "bridge");
        assert_eq!(net.plugins[1].plugin_type, "portmap");
        // only capabilities set to true count
        assert_eq!(
            net.plugins[1].capabilities.iter().collect::<Vec<_>>(),
            vec!["portMappings"]
        );
        // unknown keys kept
        assert_eq!(net.plugins[1].raw["x-unknown"], serde_json::json!([1]));
        assert_eq!(net.bytes, LIST_A.as_bytes());
        assert_eq!(
            net.source.as_deref(),
            Some(d.path().join("10-a.conflist").as_path())
        );
        assert!(!net.disable_check);
    }

    #[test]
    fn single_conf_is_wrapped() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "99-loop.json",
            r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback","extra":"kept"}"#,
        );
        let net = load_network(d.path()).unwrap();
        assert_eq!(net.name, "lo");
        assert_eq!(net.cni_version, "0.3.1");
        assert_eq!(net.plugins.len(), 1);
        assert_eq!(net.plugins[0].plugin_type, "loopback");
        assert_eq!(net.plugins[0].raw["extra"], "kept");
        let list: Value = serde_json::from_slice(&net.bytes).unwrap();
        assert_eq!(list["name"], "lo");
        assert_eq!(list["plugins"][0]["type"], "loopback");
        assert!(!net.supports_check());
    }

    #[test]
    fn invalid_files_are_skipped_and_reported() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "01-garbage.conflist", "{not json");
        write(
            d.path(),
            "02-noname.conflist",
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#,
        );
        write(
            d.path(),
            "03-notype.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"a":1}]}"#,
        );
        write(d.path(), "04-list-in-conf.conf", LIST_A);
        write(
            d.path(),
            "05-badtype.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../sbin/x"}]}"#,
        );
        write(
            d.path(),
            "06-noversion.conflist",
            r#"{"name":"n","plugins":[{"type":"x"}]}"#,
        );
        write(
            d.path(),
            "07-empty.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#,
        );
        write(
            d.path(),
            "08-badname.conflist",
            r#"{"cniVersion":"1.0.0","name":"a/b","plugins":[{"type":"x"}]}"#,
        );
        let err = load_network(d.path()).unwrap_err();
        let CniError::NoValidConfig { errors, .. } = &err else {
            panic!("unexpected {err}");
        };
        assert_eq!(errors.len(), 8, "{errors:?}");
        assert!(errors[0].contains("invalid JSON"), "{}", errors[0]);
        assert!(errors[1].contains("no name"), "{}", errors[1]);
        assert!(errors[2].contains("no type"), "{}", errors[2]);
        assert!(errors[3].contains("config list"), "{}", errors[3]);
        assert!(errors[4].contains("invalid plugin type"), "{}", errors[4]);
        assert!(errors[5].contains("no cniVersion"), "{}", errors[5]);
        assert!(errors[6].contains("empty"), "{}", errors[6]);
        assert!(errors[7].contains("network name"), "{}", errors[7]);

        // a valid file after the broken ones is picked
        write(d.path(), "50-good.conflist", LIST_A);
        assert_eq!(load_network(d.path()).unwrap().name, "alpha");
    }

    #[test]
    fn missing_or_empty_dir() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope");
        assert!(conf_files(&missing).unwrap().is_empty());
        let e = load_network(&missing).unwrap_err();
        assert!(
            matches!(e, CniError::NoConfig { ref dir } if dir == &missing),
            "{e}"
        );
        assert!(e.to_string().contains("nope"));
        assert!(matches!(
            load_network(d.path()),
            Err(CniError::NoConfig { .. })
        ));
    }

    #[test]
    fn disable_check_and_cni_versions() {
        let n = NetworkConfig::from_conflist_bytes(
            br#"{"cniVersion":"0.4.0","cniVersions":["1.0.0","1.1.0","9.0.0"],"name":"n","disableCheck":"true","plugins":[{"type":"x"}]}"#,
            "t",
        )
        .unwrap();
        assert!(n.disable_check);
        assert_eq!(n.cni_version, "1.1.0");
        let n = NetworkConfig::from_conflist_bytes(
            br#"{"cniVersion":"1.0.0","name":"n","disableCheck":true,"plugins":[{"type":"x"}]}"#,
            "t",
        )
        .unwrap();
        assert!(n.disable_check);
        assert!(
            NetworkConfig::from_conflist_bytes(
                br#"{"cniVersion":"1.0.0","name":"n","disableCheck":3,"plugins":[{"type":"x"}]}"#,
                "t",
            )
            .is_err()
        );
    }

    #[test]
    fn plugin_lookup() {
        let d1 = tempfile::tempdir().unwrap();
        let d2 = tempfile::tempdir().unwrap();
        let p = d2.path().join("bridge");
        fs::write(&p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(d1.path().join("bridge-dir")).unwrap();
        let dirs = vec![d1.path().to_path_buf(), d2.path().to_path_buf()];
        assert_eq!(find_plugin("bridge", &dirs).unwrap(), p);
        // directories don't count
        assert!(find_plugin("bridge-dir", &dirs).is_err());
        let e = find_plugin("macvlan", &dirs).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("macvlan"), "{msg}");
        assert!(msg.contains(&d1.path().display().to_string()), "{msg}");
        assert!(msg.contains(&d2.path().display().to_string()), "{msg}");
        for bad in ["", "../bridge", "a/b", "..", "/bin/sh"] {
            assert!(
                matches!(find_plugin(bad, &dirs), Err(CniError::InvalidPluginType(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn name_validation() {
        assert!(validate_name("container ID", "abc123_x.y-z").is_ok());
        for bad in ["", ".", "..", "../x", "a/b", "-a", "_a", "a b", "a;b"] {
            assert!(validate_name("container ID", bad).is_err(), "{bad:?}");
        }
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("abcdefghijklmno").is_ok());
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "abcdefghijklmnop"] {
            assert!(validate_ifname(bad).is_err(), "{bad:?}");
        }
    }
}
