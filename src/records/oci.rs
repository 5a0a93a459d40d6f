//! Reading and editing OCI runtime specs (`config.json`) and exec process specs.
//!
//! Every edit the shim makes to a spec is here: the checks before runc sees it, the exec's
//! terminal, the network namespace of a standalone task, and the pod's share of a container
//! (which namespaces it joins, keeps or leaves to the node, and the pod's files and /dev/shm).
//!
//! Specs stay raw JSON (`serde_json::Value`): containerd and CRI write fields newer than any
//! typed model we could link (and vendor extensions), runc must see every one of them after our
//! edits, and a typed round trip (the `oci-spec` crate) would also reject specs runc accepts
//! (its enums and validations are stricter). So the crate is not used: typed reads would buy
//! nothing the few fields read here need. Each edit keeps every field it does not touch.

use std::path::Path;

use serde_json::Value;

use crate::records::error::{Error, Result};

/// Minimal checks of a container's spec before runc sees it; `terminal` is the request's.
pub fn check_container_spec(spec: &Value, terminal: bool) -> Result<()> {
    let Some(obj) = spec.as_object() else {
        return Err(Error::invalid("config.json is not a JSON object"));
    };
    if obj.get("ociVersion").and_then(Value::as_str).is_none() {
        return Err(Error::invalid("config.json has no ociVersion"));
    }
    if obj
        .get("root")
        .and_then(|r| r.get("path"))
        .and_then(Value::as_str)
        .is_none()
    {
        return Err(Error::invalid("config.json has no root.path"));
    }
    if let Some(p) = obj.get("process") {
        check_args(p).map_err(|e| e.context("config.json process"))?;
        let spec_terminal = p.get("terminal").and_then(Value::as_bool).unwrap_or(false);
        if spec_terminal != terminal {
            return Err(Error::invalid(format!(
                "config.json process.terminal is {spec_terminal} but the request asks for terminal={terminal}"
            )));
        }
    }
    Ok(())
}

fn check_args(process: &Value) -> Result<()> {
    match process.get("args").and_then(Value::as_array) {
        Some(a) if !a.is_empty() && a.iter().all(Value::is_string) => Ok(()),
        Some(a) if !a.is_empty() => Err(Error::invalid("args must be strings")),
        _ => Err(Error::invalid("has no args")),
    }
}

/// Parses an exec's process spec and makes its `terminal` the request's: the request decides
/// (containerd's runc shim sets `spec.Terminal = r.Terminal`; containerd's Go client reuses
/// the container's process spec for `task.Exec(..., cio.WithTerminal)`). Returns the JSON
/// runc gets.
pub fn exec_process_spec(raw: &[u8], terminal: bool) -> Result<Vec<u8>> {
    let mut spec: Value = serde_json::from_slice(raw)
        .map_err(|e| Error::invalid(format!("process spec is not JSON: {e}")))?;
    let Some(obj) = spec.as_object_mut() else {
        return Err(Error::invalid("process spec is not a JSON object"));
    };
    check_args(&Value::Object(obj.clone())).map_err(|e| e.context("process spec"))?;
    let current = obj
        .get("terminal")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if current == terminal {
        return Ok(raw.to_vec());
    }
    obj.insert("terminal".into(), Value::Bool(terminal));
    serde_json::to_vec(&spec).map_err(|e| Error::internal(format!("encode process spec: {e}")))
}

/// The spec's entry for namespace `kind` (`network`, `pid`, ...), if any.
fn namespace<'a>(spec: &'a Value, kind: &str) -> Option<&'a Value> {
    spec.pointer("/linux/namespaces")
        .and_then(Value::as_array)?
        .iter()
        .find(|n| n.get("type").and_then(Value::as_str) == Some(kind))
}

/// True when `entry` (a namespace entry) creates a namespace rather than joining one by path.
fn is_new(entry: &Value) -> bool {
    entry
        .get("path")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
}

/// Where the spec puts the process's namespace of `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespacePlace<'a> {
    /// No entry: the runtime's own (the node's).
    Inherited,
    /// A new one of its own.
    New,
    /// Joins the namespace at this path.
    Joins(&'a str),
}

/// Where the spec puts the namespace of `kind`.
pub fn namespace_place<'a>(spec: &'a Value, kind: &str) -> NamespacePlace<'a> {
    match namespace(spec, kind) {
        None => NamespacePlace::Inherited,
        Some(entry) if is_new(entry) => NamespacePlace::New,
        Some(entry) => {
            NamespacePlace::Joins(entry.get("path").and_then(Value::as_str).unwrap_or(""))
        }
    }
}

/// True when the spec asks for a new network namespace.
pub fn wants_new_netns(spec: &Value) -> bool {
    namespace(spec, "network").is_some_and(is_new)
}

/// True when the spec has no pid namespace of its own (the host's, or one joined by path).
pub fn shares_pid_namespace(spec: &Value) -> bool {
    !namespace(spec, "pid").is_some_and(is_new)
}

/// `linux.cgroupsPath`, if the spec sets one.
pub fn cgroups_path(spec: &Value) -> Option<String> {
    spec.pointer("/linux/cgroupsPath")?
        .as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_string)
}

/// `linux.mountLabel` (SELinux), if the spec sets one.
pub fn mount_label(spec: &Value) -> Option<String> {
    spec.pointer("/linux/mountLabel")?
        .as_str()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
}

/// Points the spec's network namespace at `path`.
pub fn set_netns_path(spec: &mut Value, path: &Path) {
    if let Some(list) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
    {
        for n in list {
            if n.get("type").and_then(Value::as_str) == Some("network") {
                n["path"] = serde_json::json!(path);
            }
        }
    }
}

/// What a container does with a namespace its spec asks to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceChoice {
    /// Create its own, as the spec says.
    Own,
    /// Join this one (`/proc/<pause>/ns/<kind>`).
    Join(String),
    /// Stay in the node's: the entry goes (a hostNetwork pod's containers).
    Node,
}

/// For each namespace the spec would create (an entry without a path), applies
/// `choose(kind)`. Entries that already name a path are the caller's and stay. Returns whether
/// the spec changed.
pub fn place_namespaces(spec: &mut Value, mut choose: impl FnMut(&str) -> NamespaceChoice) -> bool {
    let Some(list) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let before = list.len();
    let mut changed = false;
    list.retain_mut(|ns| {
        if !is_new(ns) {
            return true;
        }
        let kind = ns.get("type").and_then(Value::as_str).unwrap_or("");
        match choose(kind) {
            NamespaceChoice::Own => true,
            NamespaceChoice::Node => false,
            NamespaceChoice::Join(path) => {
                ns["path"] = Value::String(path);
                changed = true;
                true
            }
        }
    });
    changed || list.len() != before
}

/// A bind mount the pod gives each container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMount {
    pub destination: &'static str,
    pub source: std::path::PathBuf,
    /// Read-only when the container's root is (the pod files); false: always writable
    /// (/dev/shm).
    pub follows_readonly_root: bool,
}

/// Adds the pod's mounts. A destination the container already mounts something at stays the
/// container's, except the runtime's default private tmpfs at /dev/shm, which gives way to
/// the pod's. Returns whether the spec changed.
pub fn add_pod_mounts(spec: &mut Value, mounts: &[PodMount]) -> Result<bool> {
    let readonly_root = spec
        .pointer("/root/readonly")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let Some(obj) = spec.as_object_mut() else {
        return Err(Error::invalid("config.json is not a JSON object"));
    };
    let list = obj
        .entry("mounts")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Some(list) = list.as_array_mut() else {
        return Err(Error::invalid("config.json mounts is not a list"));
    };
    let mut changed = false;
    for m in mounts {
        let mode = if m.follows_readonly_root && readonly_root {
            "ro"
        } else {
            "rw"
        };
        let entry = serde_json::json!({
            "destination": m.destination,
            "type": "bind",
            "source": m.source,
            "options": ["rbind", "rprivate", mode],
        });
        let existing = list
            .iter()
            .position(|e| e.get("destination").and_then(Value::as_str) == Some(m.destination));
        match existing {
            Some(i)
                if m.destination == "/dev/shm"
                    && list[i].get("type").and_then(Value::as_str) == Some("tmpfs") =>
            {
                list[i] = entry;
                changed = true;
            }
            Some(_) => {} // the container mounts something there itself: keep it
            None => {
                list.push(entry);
                changed = true;
            }
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::error::Kind;
    use serde_json::json;

    #[test]
    fn namespace_places() {
        let spec = json!({"linux": {"namespaces": [
            {"type": "ipc", "path": "/proc/7/ns/ipc"}, {"type": "uts", "path": ""}, {"type": "pid"}
        ]}});
        assert_eq!(
            namespace_place(&spec, "ipc"),
            NamespacePlace::Joins("/proc/7/ns/ipc")
        );
        assert_eq!(namespace_place(&spec, "uts"), NamespacePlace::New);
        assert_eq!(namespace_place(&spec, "pid"), NamespacePlace::New);
        assert_eq!(namespace_place(&spec, "network"), NamespacePlace::Inherited);
        assert_eq!(
            namespace_place(&json!({}), "ipc"),
            NamespacePlace::Inherited
        );
    }

    #[test]
    fn container_spec_checks_name_the_problem() {
        let ok = json!({"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":["sh"]}});
        check_container_spec(&ok, false).unwrap();
        for (spec, msg) in [
            (json!([]), "not a JSON object"),
            (json!({"root":{"path":"r"}}), "no ociVersion"),
            (json!({"ociVersion":"1"}), "no root.path"),
            (
                json!({"ociVersion":"1","root":{"path":"r"},"process":{"args":[]}}),
                "has no args",
            ),
            (
                json!({"ociVersion":"1","root":{"path":"r"},"process":{"args":[1]}}),
                "must be strings",
            ),
        ] {
            let e = check_container_spec(&spec, false).unwrap_err();
            assert_eq!(e.kind(), Kind::InvalidArgument);
            assert!(e.message().contains(msg), "{spec}: {}", e.message());
        }
        let e = check_container_spec(&ok, true).unwrap_err();
        assert!(e.message().contains("terminal"), "{}", e.message());
    }

    #[test]
    fn the_exec_request_decides_the_terminal_and_other_fields_survive() {
        let raw = br#"{"args":["sh"],"terminal":false,"cwd":"/","x-vendor":{"a":1}}"#;
        let out: Value = serde_json::from_slice(&exec_process_spec(raw, true).unwrap()).unwrap();
        assert_eq!(out["terminal"], json!(true));
        assert_eq!(out["x-vendor"], json!({"a":1}));
        assert_eq!(out["cwd"], json!("/"));
        // Unchanged when they agree: the bytes pass through.
        assert_eq!(exec_process_spec(raw, false).unwrap(), raw.to_vec());
        let no_terminal = br#"{"args":["sh"]}"#;
        let out: Value =
            serde_json::from_slice(&exec_process_spec(no_terminal, true).unwrap()).unwrap();
        assert_eq!(out["terminal"], json!(true));
        for bad in [
            &b"nope"[..],
            b"[]",
            br#"{"args":[]}"#,
            br#"{"terminal":true}"#,
        ] {
            assert_eq!(
                exec_process_spec(bad, false).unwrap_err().kind(),
                Kind::InvalidArgument
            );
        }
    }

    #[test]
    fn namespace_questions() {
        let new_net = json!({"linux":{"namespaces":[{"type":"network"},{"type":"pid","path":"/proc/1/ns/pid"}]}});
        assert!(wants_new_netns(&new_net));
        assert!(shares_pid_namespace(&new_net));
        let own_pid = json!({"linux":{"namespaces":[{"type":"pid","path":""}]}});
        assert!(!shares_pid_namespace(&own_pid));
        assert!(!wants_new_netns(&own_pid));
        assert!(shares_pid_namespace(&json!({})));
        let mut s = new_net.clone();
        set_netns_path(&mut s, Path::new("/run/netns/x"));
        assert!(!wants_new_netns(&s));
        assert_eq!(
            s.pointer("/linux/namespaces/0/path").unwrap(),
            &json!("/run/netns/x")
        );
    }

    #[test]
    fn namespaces_are_joined_kept_or_left_to_the_node() {
        let mut s = json!({"linux":{"namespaces":[
            {"type":"pid"},{"type":"network"},{"type":"uts"},{"type":"ipc","path":"/x"},{"type":"mount"}
        ]}});
        let changed = place_namespaces(&mut s, |kind| match kind {
            "network" => NamespaceChoice::Join("/proc/7/ns/net".into()),
            "uts" => NamespaceChoice::Node,
            "ipc" => panic!("an entry with a path is the caller's"),
            _ => NamespaceChoice::Own,
        });
        assert!(changed);
        assert_eq!(
            s["linux"]["namespaces"],
            json!([{"type":"pid"},{"type":"network","path":"/proc/7/ns/net"},{"type":"ipc","path":"/x"},{"type":"mount"}])
        );
        let mut none = json!({"linux":{}});
        assert!(!place_namespaces(&mut none, |_| NamespaceChoice::Node));
        let mut own = json!({"linux":{"namespaces":[{"type":"pid"}]}});
        assert!(!place_namespaces(&mut own, |_| NamespaceChoice::Own));
    }

    #[test]
    fn pod_mounts_respect_the_container_and_the_readonly_root() {
        let mounts = [
            PodMount {
                destination: "/etc/hosts",
                source: "/b/etc/hosts".into(),
                follows_readonly_root: true,
            },
            PodMount {
                destination: "/dev/shm",
                source: "/b/shm".into(),
                follows_readonly_root: false,
            },
        ];
        let mut s = json!({"root":{"readonly":true},"mounts":[
            {"destination":"/dev/shm","type":"tmpfs","source":"shm"}
        ]});
        assert!(add_pod_mounts(&mut s, &mounts).unwrap());
        assert_eq!(s["mounts"][0]["source"], json!("/b/shm"));
        assert_eq!(s["mounts"][0]["options"][2], json!("rw"));
        assert_eq!(s["mounts"][1]["destination"], json!("/etc/hosts"));
        assert_eq!(s["mounts"][1]["options"][2], json!("ro"));
        // The container's own mount at a destination stays.
        let mut mine =
            json!({"mounts":[{"destination":"/etc/hosts","type":"bind","source":"/mine"}]});
        add_pod_mounts(&mut mine, &mounts[..1]).unwrap();
        assert_eq!(
            mine["mounts"],
            json!([{"destination":"/etc/hosts","type":"bind","source":"/mine"}])
        );
        // No mounts list: one is made; a non-list is an error.
        let mut bare = json!({});
        assert!(add_pod_mounts(&mut bare, &mounts[..1]).unwrap());
        let mut bad = json!({"mounts": 3});
        assert_eq!(
            add_pod_mounts(&mut bad, &mounts).unwrap_err().kind(),
            Kind::InvalidArgument
        );
    }
}
