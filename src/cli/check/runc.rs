//! runc as the shim will run it: `<runc> --version` (rsandbox needs 1.1; user-namespaced pods
//! need 1.2, see `crate::host::runtime::USERNS_MIN_RUNC`) and `<runc> features` (what `-info`
//! hands containerd: user namespaces and idmapped mounts, recursive read-only mounts).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};
use crate::host::runtime::{RuncVersion, USERNS_MIN_RUNC};

/// The oldest runc rsandbox supports (what CI runs: bookworm's 1.1.5).
pub const MIN_RUNC: (u32, u32) = (1, 1);

/// What was found.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub binary: Option<PathBuf>,
    /// `Err`: it did not run (why).
    pub version: Option<Result<RuncVersion, String>>,
    /// `<runc> features`'s document, if it printed one.
    pub features: Option<Value>,
}

/// Looks at `binary` (a path or a name looked up in `$PATH`; `None`: `runc`).
pub fn gather(node: &dyn Node, binary: Option<&str>, timeout: Duration) -> Facts {
    let name = binary.unwrap_or("runc");
    let path = if name.contains('/') {
        Some(PathBuf::from(name)).filter(|p| node.exists(p))
    } else {
        node.look_path(name).or_else(|| {
            ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"]
                .into_iter()
                .map(|d| PathBuf::from(d).join(name))
                .find(|p| node.exists(p))
        })
    };
    let mut f = Facts {
        binary: path.clone(),
        ..Default::default()
    };
    let Some(path) = path else { return f };
    f.version = Some(match node.run(&path, &["--version"], timeout) {
        Ok(o) if o.status == 0 => Ok(RuncVersion::parse(&o.stdout)),
        Ok(o) => Err(format!(
            "--version exited with status {}: {}",
            o.status,
            o.stderr.trim()
        )),
        Err(e) => Err(e),
    });
    f.features = node
        .run(&path, &["features"], timeout)
        .ok()
        .filter(|o| o.status == 0)
        .and_then(|o| serde_json::from_str::<Value>(&o.stdout).ok())
        .filter(|v| v.is_object());
    f
}

pub fn facts_json(f: &Facts) -> Value {
    let v = f.version.as_ref().and_then(|v| v.as_ref().ok());
    json!({
        "binary": f.binary,
        "version": v.and_then(|v| v.number).map(|(a, b, c)| format!("{a}.{b}.{c}")),
        "version_line": v.map(|v| &v.line),
        "features": f.features.is_some(),
        "idmap": f.features.as_ref().map(crate::cli::info::supports_cri_userns),
    })
}

pub fn judge(f: &Facts) -> Vec<Finding> {
    let Some(bin) = &f.binary else {
        return vec![
            Finding::new("runc.version", Status::Block, "runc not found")
                .detail("the shim runs every container with runc (containerd's $PATH, or the handler's BinaryName)")
                .fix("install runc >= 1.1 (or name it with --runc PATH)"),
        ];
    };
    let (min_a, min_b) = MIN_RUNC;
    let (ns_a, ns_b) = USERNS_MIN_RUNC;
    let version = match f.version.as_ref() {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            return vec![
                Finding::new(
                    "runc.version",
                    Status::Block,
                    format!("{} does not run", bin.display()),
                )
                .detail(e.clone()),
            ];
        }
        None => unreachable!("gather runs --version when it finds runc"),
    };
    let mut out = vec![match version.number {
        Some((a, b, _)) if (a, b) >= (min_a, min_b) => Finding::new(
            "runc.version",
            Status::Ok,
            format!("{}: {}", bin.display(), version.line),
        ),
        _ => Finding::new(
            "runc.version",
            Status::Block,
            format!(
                "{}: {:?} is older than {min_a}.{min_b}",
                bin.display(),
                version.line
            ),
        )
        .fix(format!("install runc >= {min_a}.{min_b}")),
    }];
    out.push(match &f.features {
        None => Finding::new("runc.features", Status::Warn, "`runc features` prints nothing")
            .detail("-info gives containerd no features: no user-namespaced pods and no recursive read-only mounts on this handler (containerd 2.3+)"),
        Some(doc) if crate::cli::info::supports_cri_userns(doc) => Finding::new(
            "runc.features",
            Status::Ok,
            "user namespaces with idmapped mounts: user-namespaced pods can run",
        ),
        Some(_) => Finding::new(
            "runc.features",
            Status::Info,
            format!("no idmapped mounts: user-namespaced pods are refused (they need runc >= {ns_a}.{ns_b})"),
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::{FakeNode, failed, ok};
    use super::*;

    const RUNC_1_1: &str = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n";
    const RUNC_1_3: &str = "runc version 1.3.3+ds1\ncommit: 1.3.3+ds1-1\nspec: 1.2.1\ngo: go1.24.4\nlibseccomp: 2.6.0\n";
    const FEATURES_1_1: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.0.2-dev","linux":{"namespaces":["cgroup","ipc","mount","network","pid","user","uts"]}}"#;
    const FEATURES_1_3: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.1","linux":{"namespaces":["cgroup","ipc","mount","network","pid","time","user","uts"],"mountExtensions":{"idmap":{"enabled":true}}}}"#;

    fn status(fs: &[Finding], id: &str) -> Status {
        fs.iter().find(|f| f.id == id).unwrap().status
    }

    #[test]
    fn runc_1_1_runs_pods_but_no_user_namespaced_ones() {
        let mut n = FakeNode::default();
        n.binary("runc", "/usr/sbin/runc")
            .command("/usr/sbin/runc --version", ok(RUNC_1_1))
            .command("/usr/sbin/runc features", ok(FEATURES_1_1));
        let f = gather(&n, None, Duration::from_secs(1));
        let fs = judge(&f);
        assert_eq!(status(&fs, "runc.version"), Status::Ok);
        assert_eq!(status(&fs, "runc.features"), Status::Info);
        assert_eq!(facts_json(&f)["version"], "1.1.5");
        assert_eq!(facts_json(&f)["idmap"], false);
    }

    #[test]
    fn runc_1_3_with_idmap_from_a_given_path() {
        let mut n = FakeNode::default();
        n.file("/opt/runc-1.3/runc", "")
            .command("/opt/runc-1.3/runc --version", ok(RUNC_1_3))
            .command("/opt/runc-1.3/runc features", ok(FEATURES_1_3));
        let f = gather(&n, Some("/opt/runc-1.3/runc"), Duration::from_secs(1));
        let fs = judge(&f);
        assert_eq!(status(&fs, "runc.version"), Status::Ok);
        assert_eq!(status(&fs, "runc.features"), Status::Ok);
        assert_eq!(facts_json(&f)["idmap"], true);
    }

    #[test]
    fn a_missing_old_or_broken_runc_blocks() {
        let n = FakeNode::default();
        let fs = judge(&gather(&n, None, Duration::from_secs(1)));
        assert_eq!(status(&fs, "runc.version"), Status::Block);

        let mut n = FakeNode::default();
        n.binary("runc", "/usr/bin/runc")
            .command("/usr/bin/runc --version", ok("runc version 1.0.3\n"))
            .command(
                "/usr/bin/runc features",
                failed(1, "No help topic for 'features'"),
            );
        let fs = judge(&gather(&n, None, Duration::from_secs(1)));
        assert_eq!(status(&fs, "runc.version"), Status::Block);
        assert_eq!(status(&fs, "runc.features"), Status::Warn);

        let mut n = FakeNode::default();
        n.binary("runc", "/usr/bin/runc")
            .command("/usr/bin/runc --version", failed(127, "cannot execute"));
        let fs = judge(&gather(&n, None, Duration::from_secs(1)));
        assert_eq!(status(&fs, "runc.version"), Status::Block);
        assert!(fs[0].detail.contains("cannot execute"), "{fs:?}");
    }
}
