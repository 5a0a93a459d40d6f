//! The shim's own config file, parsed by the shim's own code (`crate::records::config::ShimConfig`):
//! the file `start` loads — a file that does not parse fails every pod's start.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};
use crate::records::config::ShimConfig;

#[derive(Debug, Clone)]
pub struct Facts {
    pub path: PathBuf,
    /// Where the path came from.
    pub source: &'static str,
    /// `None`: no file (the defaults); `Err`: why it does not load.
    pub loaded: Option<Result<ShimConfig, String>>,
}

/// The file the shim will read: `--shim-config`, else `RSANDBOX_CONFIG` from containerd's
/// shim manager `env` (what containerd passes to `start`), else this process's
/// `$RSANDBOX_CONFIG`, else the default.
pub fn gather(node: &dyn Node, flag: Option<&Path>, containerd_env: Option<&str>) -> Facts {
    let (path, source) = if let Some(p) = flag {
        (p.to_path_buf(), "--shim-config")
    } else if let Some(p) = containerd_env {
        (PathBuf::from(p), "containerd's shim manager env")
    } else if let Some(p) = node.env(crate::records::config::CONFIG_ENV) {
        (PathBuf::from(p), "$RSANDBOX_CONFIG")
    } else {
        (
            PathBuf::from(crate::records::config::DEFAULT_CONFIG),
            "default",
        )
    };
    let loaded = match node.read(&path) {
        Ok(text) => Some(ShimConfig::parse(&text).map_err(|e| e.message().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(format!("read: {e}"))),
    };
    Facts {
        path,
        source,
        loaded,
    }
}

pub fn facts_json(f: &Facts) -> Value {
    json!({
        "path": f.path,
        "source": f.source,
        "exists": f.loaded.is_some(),
        "valid": f.loaded.as_ref().map(|l| l.is_ok()),
    })
}

pub fn judge(f: &Facts) -> Finding {
    let path = f.path.display();
    match &f.loaded {
        None => Finding::new(
            "shim.config",
            Status::Ok,
            format!("no {path} ({}): the shim's defaults", f.source),
        ),
        Some(Ok(c)) => Finding::new(
            "shim.config",
            Status::Ok,
            format!("{path} ({}) loads", f.source),
        )
        .detail(format!(
            "shim-owned networks: sandboxes = {}, standalone_tasks = {}, CNI config in {}",
            c.network.sandboxes,
            c.network.standalone_tasks,
            c.network.cni_conf_dir.display()
        )),
        Some(Err(e)) => Finding::new(
            "shim.config",
            Status::Block,
            format!(
                "{path} ({}) does not load: every pod's start fails",
                f.source
            ),
        )
        .detail(e.clone())
        .fix(format!("fix {path} (see docs/networking.md) or remove it")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    #[test]
    fn the_file_is_found_where_the_shim_looks_and_judged_by_its_parser() {
        let mut n = FakeNode::default();
        // Nothing anywhere: the defaults.
        let f = gather(&n, None, None);
        assert_eq!(f.path, Path::new("/etc/containerd/rsandbox.toml"));
        assert_eq!(judge(&f).status, Status::Ok);

        // containerd's env wins over this process's.
        n.env
            .insert("RSANDBOX_CONFIG".into(), "/tmp/mine.toml".into());
        n.file("/etc/rs.toml", "[network]\nsandboxes = false\n");
        let f = gather(&n, None, Some("/etc/rs.toml"));
        assert_eq!(
            (f.path.as_path(), f.source),
            (Path::new("/etc/rs.toml"), "containerd's shim manager env")
        );
        assert_eq!(judge(&f).status, Status::Ok);
        assert!(judge(&f).detail.contains("sandboxes = false"));
        assert_eq!(gather(&n, None, None).path, Path::new("/tmp/mine.toml"));

        // A key the shim does not know: the shim's parser refuses it, so does check.
        n.file("/etc/bad.toml", "[network]\nstandalone_task = true\n");
        let f = gather(&n, Some(Path::new("/etc/bad.toml")), Some("/etc/rs.toml"));
        let j = judge(&f);
        assert_eq!(j.status, Status::Block);
        assert!(j.detail.contains("standalone_task"), "{j:?}");
        assert_eq!(facts_json(&f)["valid"], false);
    }
}
