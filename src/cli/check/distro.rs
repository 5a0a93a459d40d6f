//! The node's shape (`node-shape`): which distribution runs containerd here, and whether the
//! drop-in `check` judges sits where that containerd reads it and no bootstrapper undoes it.
//! The same shapes as the node installer's `deploy/node/lib/distro.sh` (see there for the
//! sources), told apart by files only (`check` runs no systemctl):
//!
//! - k3s, rke2: the config under `/var/lib/rancher/{k3s,rke2}/agent/etc/containerd/` is
//!   rendered at every start; the drop-in must be in a directory it imports (`config-v3.toml.d`);
//! - k0s: `/etc/k0s/containerd.toml`; k0s merges `/etc/k0s/containerd.d/*.toml` itself;
//! - microk8s: `args/containerd.toml` under `/var/snap/microk8s/`, rendered from its template;
//! - EKS (nodeadm's unit file present): `config.toml` rewritten at every boot; the drop-in must
//!   be in a directory it imports (`/etc/containerd/config.d`);
//! - GKE COS (`ID=cos`): the shim lives in `/home/kubernetes/bin`;
//! - CRI-O (`/etc/crio`, and no containerd config): not a node rsandbox runs on;
//! - anything else: containerd's own config, where the installer may add an imports entry.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};

/// A node shape (`deploy/node/lib/distro.sh`'s names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Containerd,
    Eks,
    Cos,
    K3s,
    Rke2,
    K0s,
    Microk8s,
    Crio,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Containerd => "containerd",
            Shape::Eks => "eks",
            Shape::Cos => "cos",
            Shape::K3s => "k3s",
            Shape::Rke2 => "rke2",
            Shape::K0s => "k0s",
            Shape::Microk8s => "microk8s",
            Shape::Crio => "crio",
        }
    }

    /// The shape's bootstrapper rewrites the root config: an imports entry added there is lost.
    fn rewrites_root(self) -> bool {
        matches!(
            self,
            Shape::Eks | Shape::K3s | Shape::Rke2 | Shape::Microk8s
        )
    }
}

/// What `node-shape` is judged on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub shape: Shape,
    pub config: PathBuf,
    pub drop_in: PathBuf,
    /// The directories of the root config's top-level `imports = ["DIR/*.toml"]` entries.
    pub imported_dirs: Vec<PathBuf>,
}

/// nodeadm's units, as the AL2023 EKS AMI installs them
/// (amazon-eks-ami templates/al2023/runtime/rootfs/etc/systemd/system/).
const NODEADM_UNITS: [&str; 2] = [
    "/etc/systemd/system/nodeadm-config.service",
    "/usr/lib/systemd/system/nodeadm-config.service",
];

pub fn gather(node: &dyn Node, config: &Path, drop_in: &Path) -> Facts {
    let c = config.to_string_lossy();
    let os_id = node
        .read(Path::new("/etc/os-release"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("ID=")
                .map(|v| v.trim_matches(['"', '\'']).to_string())
        })
        .unwrap_or_default();
    let shape = if c.starts_with("/var/lib/rancher/k3s/") {
        Shape::K3s
    } else if c.starts_with("/var/lib/rancher/rke2/") {
        Shape::Rke2
    } else if c.starts_with("/etc/k0s/") {
        Shape::K0s
    } else if c.starts_with("/var/snap/microk8s/") {
        Shape::Microk8s
    } else if !node.exists(config) && node.exists(Path::new("/etc/crio")) {
        Shape::Crio
    } else if NODEADM_UNITS.iter().any(|u| node.exists(Path::new(u))) {
        Shape::Eks
    } else if os_id == "cos" {
        Shape::Cos
    } else {
        Shape::Containerd
    };
    Facts {
        shape,
        config: config.to_path_buf(),
        drop_in: drop_in.to_path_buf(),
        imported_dirs: imported_dirs(&node.read(config).unwrap_or_default(), config),
    }
}

/// The directories the config's top-level `imports` glob as `DIR/*.toml` (relative entries
/// against the config's directory, as containerd resolves them).
fn imported_dirs(text: &str, config: &Path) -> Vec<PathBuf> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let base = config.parent().unwrap_or(Path::new("/"));
    table
        .get("imports")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter_map(|s| s.strip_suffix("/*.toml"))
        .filter(|d| !d.contains('*'))
        .map(|d| base.join(d))
        .collect()
}

pub fn facts_json(f: &Facts) -> Value {
    json!({
        "shape": f.shape.name(),
        "config": f.config,
        "imported_dirs": f.imported_dirs,
    })
}

pub fn judge(f: &Facts) -> Finding {
    let id = "node-shape";
    let dir = f.drop_in.parent().unwrap_or(Path::new("/"));
    let in_imported = f.imported_dirs.iter().any(|d| d == dir);
    let name = f.shape.name();
    match f.shape {
        Shape::Crio => Finding::new(id, Status::Block, "this node runs CRI-O, not containerd")
            .detail("rsandbox is a containerd shim: CRI-O cannot run it")
            .fix("keep rsandbox (its DaemonSet and RuntimeClass) off CRI-O nodes"),
        Shape::K0s if !dir.starts_with("/etc/k0s/containerd.d") => Finding::new(
            id,
            Status::Block,
            format!("k0s node: the drop-in {} is not in /etc/k0s/containerd.d", f.drop_in.display()),
        )
        .detail("k0s generates containerd's config at every start and merges only /etc/k0s/containerd.d/*.toml into it")
        .fix("put the drop-in in /etc/k0s/containerd.d (the node installer does)"),
        s if s.rewrites_root() && !in_imported => Finding::new(
            id,
            Status::Block,
            format!(
                "{name} node: {} is rewritten by {name} and does not import the drop-in's directory {}",
                f.config.display(),
                dir.display()
            ),
        )
        .detail("an imports entry added to the rendered file is lost at the next render (a restart or reboot); the drop-in is then not read")
        .fix(match s {
            Shape::K3s | Shape::Rke2 => "put the drop-in in the versioned drop-in directory the rendered config imports (config-v3.toml.d/), or give config-v3.toml.tmpl such an import",
            Shape::Eks => "put imports = [\"/etc/containerd/config.d/*.toml\"] into the NodeConfig's spec.containerd.config and the drop-in into /etc/containerd/config.d",
            _ => "add a top-level imports entry for a drop-in directory to containerd-template.toml, and put the drop-in there",
        }),
        Shape::Cos => Finding::new(
            id,
            Status::Info,
            "GKE Container-Optimized OS: / and /usr are read-only; the shim goes in /home/kubernetes/bin, on its containerd's PATH",
        ),
        Shape::Containerd => Finding::new(id, Status::Ok, "containerd's own config (no bootstrapper rewrites it)"),
        _ => Finding::new(
            id,
            Status::Ok,
            format!("{name} node: the drop-in {} is where its containerd reads it", f.drop_in.display()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    // the installer's fixtures: each file as its distribution writes it (sources named in them)
    const K3S: &str = include_str!(
        "../../../hack/installer/fixtures/distro/k3s/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    );
    const K3S_OLD: &str = include_str!(
        "../../../hack/installer/fixtures/distro/k3s-no-imports/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    );
    const EKS: &str =
        include_str!("../../../hack/installer/fixtures/distro/eks/etc/containerd/config.toml");
    const EKS_OLD: &str = include_str!(
        "../../../hack/installer/fixtures/distro/eks-no-imports/etc/containerd/config.toml"
    );
    const K0S: &str =
        include_str!("../../../hack/installer/fixtures/distro/k0s/etc/k0s/containerd.toml");
    const COS_RELEASE: &str =
        include_str!("../../../hack/installer/fixtures/distro/cos/etc/os-release");
    const MICROK8S: &str = include_str!(
        "../../../hack/installer/fixtures/distro/microk8s/var/snap/microk8s/current/args/containerd.toml"
    );

    fn judged(node: &FakeNode, config: &str, drop_in: &str) -> (Shape, Status) {
        let f = gather(node, Path::new(config), Path::new(drop_in));
        (f.shape, judge(&f).status)
    }

    const K3S_CONFIG: &str = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml";
    const K3S_V3_DIR: &str =
        "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/rsandbox.toml";
    const CTRD_CONFIG: &str = "/etc/containerd/config.toml";
    const CONF_D: &str = "/etc/containerd/conf.d/rsandbox.toml";
    const NODEADM_UNIT: &str = "/usr/lib/systemd/system/nodeadm-config.service";
    const MICROK8S_CONFIG: &str = "/var/snap/microk8s/current/args/containerd.toml";

    /// One node: its files (path, content), the config containerd loads, where the drop-in
    /// would go, and the verdict.
    type Case = (
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
        (Shape, Status),
    );

    #[test]
    fn each_shape_is_told_apart_and_its_drop_in_judged() {
        let cases: &[Case] = &[
            // k3s: the versioned drop-in directory its template imports
            (
                &[(K3S_CONFIG, K3S)],
                K3S_CONFIG,
                K3S_V3_DIR,
                (Shape::K3s, Status::Ok),
            ),
            // conf.d beside the rendered file: nothing imports it
            (
                &[(K3S_CONFIG, K3S)],
                K3S_CONFIG,
                "/var/lib/rancher/k3s/agent/etc/containerd/conf.d/rsandbox.toml",
                (Shape::K3s, Status::Block),
            ),
            (
                &[(K3S_CONFIG, K3S_OLD)],
                K3S_CONFIG,
                K3S_V3_DIR,
                (Shape::K3s, Status::Block),
            ),
            (
                &[(CTRD_CONFIG, EKS), (NODEADM_UNIT, "")],
                CTRD_CONFIG,
                "/etc/containerd/config.d/rsandbox.toml",
                (Shape::Eks, Status::Ok),
            ),
            // an imports entry in config.toml (the containerd shape's way) is lost at boot here
            (
                &[(CTRD_CONFIG, EKS), (NODEADM_UNIT, "")],
                CTRD_CONFIG,
                CONF_D,
                (Shape::Eks, Status::Block),
            ),
            (
                &[(CTRD_CONFIG, EKS_OLD), (NODEADM_UNIT, "")],
                CTRD_CONFIG,
                "/etc/containerd/config.d/rsandbox.toml",
                (Shape::Eks, Status::Block),
            ),
            (
                &[("/etc/k0s/containerd.toml", K0S)],
                "/etc/k0s/containerd.toml",
                "/etc/k0s/containerd.d/rsandbox.toml",
                (Shape::K0s, Status::Ok),
            ),
            (
                &[("/etc/k0s/containerd.toml", K0S)],
                "/etc/k0s/containerd.toml",
                "/etc/k0s/conf.d/rsandbox.toml",
                (Shape::K0s, Status::Block),
            ),
            (
                &[(MICROK8S_CONFIG, MICROK8S)],
                MICROK8S_CONFIG,
                "/var/snap/microk8s/current/args/containerd.d/rsandbox.toml",
                (Shape::Microk8s, Status::Block),
            ),
            (
                &[
                    ("/etc/os-release", COS_RELEASE),
                    (CTRD_CONFIG, "version = 2\n"),
                ],
                CTRD_CONFIG,
                CONF_D,
                (Shape::Cos, Status::Info),
            ),
            (
                &[("/etc/crio", "")],
                CTRD_CONFIG,
                CONF_D,
                (Shape::Crio, Status::Block),
            ),
            (
                &[(CTRD_CONFIG, "version = 3\n")],
                CTRD_CONFIG,
                CONF_D,
                (Shape::Containerd, Status::Ok),
            ),
        ];
        for (files, config, drop_in, want) in cases {
            let mut n = FakeNode::default();
            for (path, content) in *files {
                n.file(path, content);
            }
            assert_eq!(
                judged(&n, config, drop_in),
                *want,
                "files {:?}, config {config}, drop-in {drop_in}",
                files.iter().map(|f| f.0).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn imports_are_read_as_containerd_resolves_them() {
        let dirs = imported_dirs(
            "version = 3\nimports = [\"conf.d/*.toml\", \"/x/y.toml\", \"/a/*/b/*.toml\"]\n",
            Path::new("/etc/containerd/config.toml"),
        );
        assert_eq!(dirs, vec![PathBuf::from("/etc/containerd/conf.d")]);
    }
}
