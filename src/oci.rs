//! Reading and editing OCI runtime specs (`config.json`) and exec process specs.
//!
//! Specs stay raw JSON (`serde_json::Value`) here: containerd and CRI write fields newer than
//! any typed model we could link (and vendor extensions under `annotations`), and runc must
//! see every one of them after our edits. The edits are small and named, and each keeps
//! every field it does not touch.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

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

/// True when the spec asks for a new network namespace.
pub fn wants_new_netns(spec: &Value) -> bool {
    namespace(spec, "network").is_some_and(is_new)
}

/// True when the spec has no pid namespace of its own (the host's, or one joined by path).
pub fn shares_pid_namespace(spec: &Value) -> bool {
    !namespace(spec, "pid").is_some_and(is_new)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;
    use serde_json::json;

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
}
