//! `-info`: containerd asks what this runtime is and what its OCI runtime supports, with the
//! runtime options (a protobuf `Any`) on stdin; the answer is a protobuf
//! `containerd.types.RuntimeInfo` on stdout. As `containerd-shim-runc-v2`'s `Info`
//! (`manager_linux.go`):
//! - `options`: the `containerd.runc.v1.Options` given, re-encoded (absent without them);
//! - `features`: the JSON that `<runc> features` prints, as an Any of type
//!   `types.containerd.io/opencontainers/runtime-spec/1/features/Features` (typeurl's name
//!   for Go's `specs-go/features.Features`, registered in containerd's
//!   `core/runtime/typeurl.go`; its value is JSON, which CRI decodes with `UnmarshalAny`),
//!   where runc is `BinaryName` from the options, else `runc`, looked up in `$PATH`.
//!   A runc too old for `features` (it fails, or prints no JSON object) gives no features
//!   and no error.
//!
//! Unlike the runc shim, options of another type (CRI's `runtimeoptions.v1.Options`) are not
//! an error: they say nothing about runc.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use containerd_shim_protos::shim::oci::Options as RuncOptions;
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};
use protobuf::well_known_types::any::Any;
use protobuf::{Message, MessageField};

use super::bootstrap::is_runc_options;
use crate::records::bundle::RUNTIME_ID;
use crate::records::error::{Error, Result};
use crate::shim::reaper::Spawner;

/// typeurl's type URL of Go's `features.Features` (JSON-encoded).
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// typeurl's type URL of `containerd.runc.v1.Options` (gogo/protobuf: the message's full name).
pub const RUNC_OPTIONS_TYPE_URL: &str = "containerd.runc.v1.Options";

/// How long `runc features` may take (it only prints a constant document).
const FEATURES_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to `-info` for `stdin` (empty, or the runtime options Any); runc is looked up in
/// `path_var` (the value of `$PATH`).
pub fn runtime_info(stdin: &[u8], path_var: Option<&OsStr>) -> Result<RuntimeInfo> {
    let options = if stdin.is_empty() {
        None
    } else {
        Some(
            Any::parse_from_bytes(stdin)
                .map_err(|e| Error::invalid(format!("runtime options on stdin: {e}")))?,
        )
    };
    let runc = match options.as_ref().filter(|a| is_runc_options(a)) {
        Some(any) => Some(RuncOptions::parse_from_bytes(&any.value).map_err(|e| {
            Error::invalid(format!("runtime options (containerd.runc.v1.Options): {e}"))
        })?),
        None => None,
    };
    let mut info = RuntimeInfo {
        name: RUNTIME_ID.to_string(),
        version: MessageField::some(RuntimeVersion {
            version: crate::records::version::VERSION.to_string(),
            revision: crate::records::version::REVISION.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut binary = "runc".to_string();
    if let Some(o) = &runc {
        info.options = MessageField::some(Any {
            type_url: RUNC_OPTIONS_TYPE_URL.to_string(),
            value: o.write_to_bytes()?,
            ..Default::default()
        });
        if !o.binary_name.is_empty() {
            binary = o.binary_name.clone();
        }
    }
    let abs = look_path(&binary, path_var)?;
    if let Some(json) = features(&abs) {
        info.features = MessageField::some(Any {
            type_url: FEATURES_TYPE_URL.to_string(),
            value: json,
            ..Default::default()
        });
    }
    Ok(info)
}

/// Go's `exec.LookPath`: a name with a slash is used as is, else the first executable file of
/// that name in `$PATH` (an empty entry is the working directory).
pub fn look_path(name: &str, path_var: Option<&OsStr>) -> Result<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(Error::not_found(format!(
                "look up the OCI runtime {name:?}: not an executable file"
            )))
        };
    }
    for dir in std::env::split_paths(path_var.unwrap_or_default()) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let p = dir.join(name);
        if executable(&p) {
            return Ok(p);
        }
    }
    Err(Error::not_found(format!(
        "look up the OCI runtime {name:?}: executable file not found in $PATH"
    )))
}

/// Whether CRI advertises user namespaces for a handler whose `-info` carries `features`:
/// containerd 2.3.4's `supportsCRIUserns` (`internal/cri/server/service.go`) wants `user` in
/// `linux.namespaces` and `linux.mountExtensions.idmap.enabled` true. runc >= 1.2 reports
/// both (1.1 has no idmap), which is also what CreateSandbox asks of a user-namespaced pod's
/// runc ([`crate::host::runtime::check_userns_runc`]): the two agree, see the tests.
pub fn supports_cri_userns(features: &serde_json::Value) -> bool {
    let linux = &features["linux"];
    let user = linux["namespaces"]
        .as_array()
        .is_some_and(|n| n.iter().any(|n| n == "user"));
    user && linux["mountExtensions"]["idmap"]["enabled"] == true
}

/// `<runc> features` as compact JSON, if it prints a JSON object and exits 0.
fn features(runc: &Path) -> Option<Vec<u8>> {
    let mut tries = 0;
    let out = loop {
        let mut cmd = Command::new(runc);
        cmd.arg("features");
        match Spawner::direct().output(&mut cmd, None, FEATURES_TIMEOUT) {
            // Being replaced (a package upgrade), or written by a thread of ours that forked.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r.ok()?,
        }
    };
    if out.status != 0 {
        return None;
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    doc.is_object().then(|| serde_json::to_vec(&doc).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake runc in a temp dir; `features_script` is the shell body of `runc features`.
    fn fake_runc(dir: &Path, name: &str, features_script: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!("#!/bin/sh\n[ \"$1\" = features ] || exit 3\n{features_script}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    const FEATURES: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.0","mountOptions":["ro","rro","rbind"],"linux":{"namespaces":["mount","user"],"mountExtensions":{"idmap":{"enabled":true}}}}"#;

    fn runc_any(o: &RuncOptions) -> Vec<u8> {
        Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap()
    }

    /// The bytes containerd reads, decoded as containerd does: RuntimeInfo, then the features
    /// Any by its type URL into JSON.
    fn decode(info: &RuntimeInfo) -> (RuntimeInfo, Option<serde_json::Value>) {
        let wire = info.write_to_bytes().unwrap();
        let back = RuntimeInfo::parse_from_bytes(&wire).unwrap();
        let features = back.features.as_ref().map(|a| {
            assert_eq!(a.type_url, FEATURES_TYPE_URL);
            serde_json::from_slice(&a.value).unwrap()
        });
        (back, features)
    }

    /// Issue 16: `-info` carries what containerd 2.3.4's CRI reads to advertise user
    /// namespaces for the handler exactly when the runc can run user-namespaced pods (and
    /// CreateSandbox accepts them): runc 1.3's features, not runc 1.1's (the real documents,
    /// abridged).
    #[test]
    fn info_advertises_user_namespaces_exactly_with_a_runc_that_runs_them() {
        const RUNC_1_1: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.0.2-dev","linux":{"namespaces":["cgroup","ipc","mount","network","pid","user","uts"]}}"#;
        const RUNC_1_3: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.1","linux":{"namespaces":["cgroup","ipc","mount","network","pid","time","user","uts"],"mountExtensions":{"idmap":{"enabled":true}}}}"#;
        let tmp = tempfile::tempdir().unwrap();
        for (name, version, features, advertised) in [
            ("runc-1.1", "runc version 1.1.5+ds1", RUNC_1_1, false),
            ("runc-1.3", "runc version 1.3.6+ds1", RUNC_1_3, true),
        ] {
            let p = tmp.path().join(name);
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\ncase \"$1\" in\n--version) echo '{version}';;\n\
                     features) echo '{features}';;\n*) exit 3;;\nesac\n"
                ),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            let bin = p.to_str().unwrap().to_string();
            let stdin = runc_any(&RuncOptions {
                binary_name: bin.clone(),
                ..Default::default()
            });
            // A thread of this test binary that forks meanwhile may hold the script open for
            // a moment (ETXTBSY): `features` retries; so does this.
            let mut accepted = crate::host::runtime::check_userns_runc(&bin, &Spawner::direct());
            for _ in 0..20 {
                match &accepted {
                    Err(e) if e.message().contains("Text file busy") => {
                        std::thread::sleep(Duration::from_millis(20));
                        accepted =
                            crate::host::runtime::check_userns_runc(&bin, &Spawner::direct());
                    }
                    _ => break,
                }
            }
            let info = runtime_info(&stdin, None).unwrap();
            let (_, f) = decode(&info);
            let f = f.unwrap();
            assert_eq!(supports_cri_userns(&f), advertised, "{name}: {f}");
            assert_eq!(accepted.is_ok(), advertised, "{name}: {accepted:?}");
        }
        assert!(!supports_cri_userns(&serde_json::json!({})));
        assert!(!supports_cri_userns(
            &serde_json::json!({"linux": {"namespaces": ["user"],
            "mountExtensions": {"idmap": {"enabled": false}}}})
        ));
    }

    #[test]
    fn features_of_the_default_runc_in_path() {
        let tmp = tempfile::tempdir().unwrap();
        fake_runc(tmp.path(), "runc", &format!("echo '{FEATURES}'"));
        let info = runtime_info(&[], Some(tmp.path().as_os_str())).unwrap();
        let (info, features) = decode(&info);
        assert_eq!(info.name, RUNTIME_ID);
        assert_eq!(info.version.version, env!("CARGO_PKG_VERSION"));
        // As the runc shim's Info: the revision the binary was built from.
        assert_eq!(info.version.revision, crate::records::version::REVISION);
        assert!(info.options.is_none());
        let f = features.unwrap();
        assert!(
            f["mountOptions"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("rro"))
        );
        assert_eq!(f["linux"]["mountExtensions"]["idmap"]["enabled"], true);
    }

    #[test]
    fn binary_name_from_the_options_is_honoured_and_options_echoed() {
        let tmp = tempfile::tempdir().unwrap();
        fake_runc(tmp.path(), "runc", "echo '{\"ociVersionMax\":\"wrong\"}'");
        let crun = fake_runc(tmp.path(), "crun", "echo '{\"ociVersionMax\":\"crun\"}'");
        let opts = RuncOptions {
            binary_name: crun.to_string_lossy().into_owned(),
            systemd_cgroup: true,
            ..Default::default()
        };
        let info = runtime_info(&runc_any(&opts), Some(tmp.path().as_os_str())).unwrap();
        let (info, features) = decode(&info);
        assert_eq!(features.unwrap()["ociVersionMax"], "crun");
        let echoed = info.options.as_ref().unwrap();
        assert_eq!(echoed.type_url, "containerd.runc.v1.Options");
        assert_eq!(RuncOptions::parse_from_bytes(&echoed.value).unwrap(), opts);
        // A bare name is looked up in PATH.
        let opts = RuncOptions {
            binary_name: "crun".into(),
            ..Default::default()
        };
        let info = runtime_info(&runc_any(&opts), Some(tmp.path().as_os_str())).unwrap();
        assert_eq!(decode(&info).1.unwrap()["ociVersionMax"], "crun");
    }

    #[test]
    fn a_runc_without_features_gives_no_features_and_no_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = Some(tmp.path().as_os_str());
        // Old runc: "features" is an unknown command.
        fake_runc(
            tmp.path(),
            "runc",
            "echo 'No help topic for features' >&2; exit 1",
        );
        assert!(runtime_info(&[], path).unwrap().features.is_none());
        // Prints something that is no JSON object.
        fake_runc(tmp.path(), "runc", "echo 'runc version 1.0.0'");
        assert!(runtime_info(&[], path).unwrap().features.is_none());
        fake_runc(tmp.path(), "runc", "echo '[1,2]'");
        assert!(runtime_info(&[], path).unwrap().features.is_none());
    }

    #[test]
    fn other_options_types_are_ignored_and_garbage_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        fake_runc(tmp.path(), "runc", &format!("echo '{FEATURES}'"));
        let path = Some(tmp.path().as_os_str());
        let cri = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: b"\x12\x01x".to_vec(),
            ..Default::default()
        };
        let info = runtime_info(&cri.write_to_bytes().unwrap(), path).unwrap();
        assert!(info.options.is_none() && info.features.is_some());
        let e = runtime_info(&[0xff, 0xff, 0xff], path).unwrap_err();
        assert!(e.to_string().contains("runtime options on stdin"), "{e}");
    }

    #[test]
    fn a_missing_runc_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let e = runtime_info(&[], Some(tmp.path().as_os_str())).unwrap_err();
        assert!(e.to_string().contains("\"runc\""), "{e}");
        let opts = RuncOptions {
            binary_name: "/nonexistent/crun".into(),
            ..Default::default()
        };
        let e = runtime_info(&runc_any(&opts), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/crun"), "{e}");
    }

    #[test]
    fn look_path_skips_non_executables() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("runc"), b"").unwrap(); // not executable
        let good = fake_runc(&b, "runc", "true");
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(look_path("runc", Some(&path)).unwrap(), good);
    }
}
