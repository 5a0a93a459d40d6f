//! The node's cgroups: the version (v2, or v1 with or without the unified hierarchy beside
//! it), the cgroup driver (systemd or cgroupfs: containerd's runc handlers' `SystemdCgroup`,
//! the kubelet's `cgroupDriver`), and whether the shim reaches systemd where the driver is
//! systemd (the pause goes into a transient scope of the pod's slice, `crate::host::systemd`,
//! through the shim's own D-Bus client, tried here as the shim tries it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};

/// How long systemd may take to answer.
pub const SYSTEMD_TIMEOUT: Duration = Duration::from_secs(5);

/// The kubelet's config file (kubeadm's).
pub const DEFAULT_KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupVersion {
    V2,
    /// v1 hierarchies; the unified one beside them (hybrid) at this path, if mounted.
    V1 {
        unified: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub version: CgroupVersion,
    /// containerd has a runc handler with `SystemdCgroup = true`.
    pub containerd_systemd: bool,
    /// The kubelet's `cgroupDriver`, if its config file says.
    pub kubelet_driver: Option<String>,
    /// systemd is PID 1 (`/run/systemd/system`, as `sd_booted`).
    pub pid1_systemd: bool,
    /// `None`: not tried (not needed).
    pub systemd: Option<Result<(), String>>,
}

impl Facts {
    /// The cgroup driver pods get: systemd when containerd's runc handler or the kubelet says
    /// so.
    pub fn driver_is_systemd(&self) -> bool {
        self.containerd_systemd || self.kubelet_driver.as_deref() == Some("systemd")
    }

    /// The v2 mount point on a v2-only host.
    pub fn unified_only(&self) -> Option<&Path> {
        (self.version == CgroupVersion::V2).then_some(Path::new("/sys/fs/cgroup"))
    }
}

pub fn gather(node: &dyn Node, containerd_systemd: bool, kubelet_config: &Path) -> Facts {
    let version = if node.is_cgroup2(Path::new("/sys/fs/cgroup")) {
        CgroupVersion::V2
    } else {
        let mountinfo = node
            .read(Path::new("/proc/self/mountinfo"))
            .unwrap_or_default();
        CgroupVersion::V1 {
            unified: crate::host::cgroups::cgroup_mounts(&mountinfo)
                .into_iter()
                .find(|m| m.unified)
                .map(|m| m.mountpoint),
        }
    };
    let kubelet_driver = node.read(kubelet_config).ok().and_then(|t| {
        t.lines().find_map(|l| {
            let v = l.strip_prefix("cgroupDriver:")?;
            Some(v.trim().trim_matches(['"', '\'']).to_string())
        })
    });
    let mut f = Facts {
        version,
        containerd_systemd,
        kubelet_driver,
        pid1_systemd: node.exists(Path::new("/run/systemd/system")),
        systemd: None,
    };
    if f.driver_is_systemd() || f.pid1_systemd {
        f.systemd = Some(node.systemd(SYSTEMD_TIMEOUT));
    }
    f
}

pub fn facts_json(f: &Facts) -> (Value, Value) {
    let version = match &f.version {
        CgroupVersion::V2 => json!(2),
        CgroupVersion::V1 { .. } => json!(1),
    };
    let hybrid = match &f.version {
        CgroupVersion::V1 { unified } => json!(unified),
        CgroupVersion::V2 => Value::Null,
    };
    (
        json!({
            "version": version,
            "unified_beside_v1": hybrid,
            "driver": if f.driver_is_systemd() { "systemd" } else { "cgroupfs" },
            "containerd_runc_systemd_cgroup": f.containerd_systemd,
            "kubelet_cgroup_driver": f.kubelet_driver,
        }),
        json!({
            "pid1": f.pid1_systemd,
            "reachable": f.systemd.as_ref().map(|r| r.is_ok()),
        }),
    )
}

pub fn judge(f: &Facts) -> Vec<Finding> {
    let mut out = vec![match &f.version {
        CgroupVersion::V2 => Finding::new("cgroup.version", Status::Ok, "cgroup v2 (unified)"),
        CgroupVersion::V1 { unified } => Finding::new(
            "cgroup.version",
            Status::Info,
            match unified {
                Some(p) => format!("cgroup v1, the unified hierarchy beside it at {}", p.display()),
                None => "cgroup v1".to_string(),
            },
        )
        .detail("rsandbox runs pods on v1 and v2; Kubernetes keeps cgroup v1 in maintenance mode (1.31) and newer kubelets refuse it by default"),
    }];
    let driver = if f.driver_is_systemd() {
        "systemd"
    } else {
        "cgroupfs"
    };
    let mut sources = Vec::new();
    if f.containerd_systemd {
        sources.push("containerd's runc handler has SystemdCgroup = true".to_string());
    }
    if let Some(k) = &f.kubelet_driver {
        sources.push(format!("the kubelet's cgroupDriver is {k}"));
    }
    let mismatch = f
        .kubelet_driver
        .as_deref()
        .is_some_and(|k| (k == "systemd") != f.containerd_systemd);
    let finding = Finding::new(
        "cgroup.driver",
        if mismatch { Status::Warn } else { Status::Ok },
        format!("cgroup driver: {driver}"),
    )
    .detail(if sources.is_empty() {
        "nothing says systemd (no runc handler with SystemdCgroup, no kubelet config): cgroupfs"
            .to_string()
    } else {
        sources.join("; ")
    });
    out.push(if mismatch {
        finding.fix("make the kubelet's cgroupDriver and the runc handler's SystemdCgroup agree (rsandbox follows each pod's cgroup_parent either way)")
    } else {
        finding
    });
    out.push(match (&f.systemd, f.driver_is_systemd()) {
        (Some(Ok(())), true) => Finding::new(
            "systemd.reachable",
            Status::Ok,
            "the shim reaches systemd (pod scopes of the systemd driver)",
        ),
        (Some(Err(e)), true) => Finding::new(
            "systemd.reachable",
            Status::Block,
            "the cgroup driver is systemd but the shim cannot reach systemd",
        )
        .detail(e.clone())
        .fix("the shim, as root, needs /run/dbus/system_bus_socket or /run/systemd/private (mount /run from the host into an installer's container)"),
        (Some(r), false) => Finding::new(
            "systemd.reachable",
            Status::Info,
            format!(
                "systemd is PID 1 and {}; not needed with the cgroupfs driver",
                if r.is_ok() { "reachable" } else { "not reachable" }
            ),
        ),
        (None, _) => Finding::new(
            "systemd.reachable",
            Status::Info,
            "no systemd as PID 1, and the cgroup driver is cgroupfs: not needed",
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    fn status(fs: &[Finding], id: &str) -> Status {
        fs.iter().find(|f| f.id == id).unwrap().status
    }

    const KUBELET: &str = "/var/lib/kubelet/config.yaml";

    /// A kubeadm node: cgroup v2, systemd PID 1, kubelet and containerd on the systemd driver,
    /// systemd reachable; then the same node with the bus down.
    #[test]
    fn systemd_driver_needs_systemd_reachable() {
        let mut n = FakeNode {
            cgroup2: vec!["/sys/fs/cgroup".into()],
            systemd: Some(Ok(())),
            ..Default::default()
        };
        n.file("/run/systemd/system/x", "").file(
            KUBELET,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
        );
        let f = gather(&n, true, Path::new(KUBELET));
        let fs = judge(&f);
        assert_eq!(status(&fs, "cgroup.version"), Status::Ok);
        assert_eq!(status(&fs, "cgroup.driver"), Status::Ok);
        assert_eq!(status(&fs, "systemd.reachable"), Status::Ok);
        assert_eq!(f.unified_only(), Some(Path::new("/sys/fs/cgroup")));
        let (cg, sd) = facts_json(&f);
        assert_eq!(
            (cg["version"].clone(), cg["driver"].clone()),
            (json!(2), json!("systemd"))
        );
        assert_eq!(sd["reachable"], true);

        n.systemd = Some(Err(
            "systemd is not reachable at /run/systemd/private: ...".into()
        ));
        let fs = judge(&gather(&n, true, Path::new(KUBELET)));
        assert_eq!(status(&fs, "systemd.reachable"), Status::Block);
    }

    /// This bench: cgroup v1 hybrid, no systemd, no kubelet, containerd's runc on cgroupfs:
    /// systemd is not even tried.
    #[test]
    fn cgroupfs_without_systemd_does_not_ask_for_it() {
        let mut n = FakeNode::default();
        n.file(
            "/proc/self/mountinfo",
            "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw\n\
             31 25 0:27 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n",
        );
        let f = gather(&n, false, Path::new(KUBELET));
        assert_eq!(f.systemd, None);
        assert_eq!(f.unified_only(), None);
        let fs = judge(&f);
        assert_eq!(status(&fs, "cgroup.version"), Status::Info);
        assert!(fs[0].summary.contains("/sys/fs/cgroup/unified"), "{fs:?}");
        assert_eq!(status(&fs, "cgroup.driver"), Status::Ok);
        assert_eq!(status(&fs, "systemd.reachable"), Status::Info);
    }

    #[test]
    fn kubelet_and_containerd_disagreeing_is_a_warning() {
        let mut n = FakeNode {
            systemd: Some(Ok(())),
            ..Default::default()
        };
        n.file(KUBELET, "cgroupDriver: \"systemd\"\n");
        let fs = judge(&gather(&n, false, Path::new(KUBELET)));
        assert_eq!(status(&fs, "cgroup.driver"), Status::Warn);
        assert_eq!(status(&fs, "systemd.reachable"), Status::Ok);
    }
}
