//! The node's kubelet, found as the node runs it, and its version (`kubelet --version`:
//! "Kubernetes v1.34.2"). `check` needs the version for what a containerd restart does to
//! rsandbox pods ([`super::restart`]): kubelets before 1.35 pick a pod's current sandbox by
//! its `CreatedAt` alone.
//!
//! Where the binary is looked for, in order: the running kubelet (`/proc/<pid>/exe` of a
//! process named `kubelet`: the version that runs, even when a newer binary was installed
//! over it since), then `kubelet` in `$PATH`, `/usr/bin/kubelet`, `/usr/local/bin/kubelet`.
//! The kubelet's config file carries no version; it only tells that this node has a kubelet
//! when no binary is found (a kubelet built into another program, as k3s's is).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::node::Node;

/// Where a plain install puts the kubelet, after `$PATH`.
const WELL_KNOWN: [&str; 2] = ["/usr/bin/kubelet", "/usr/local/bin/kubelet"];

/// How the kubelet's binary was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A running process named `kubelet`: its pid, and where `/proc/<pid>/exe` points (if it
    /// could be read).
    Running { pid: u32, exe: Option<PathBuf> },
    /// A file, not known to run.
    Installed(PathBuf),
}

impl Found {
    /// The path to run for the version: the running process's own image, else the file.
    fn program(&self) -> PathBuf {
        match self {
            Found::Running { pid, .. } => PathBuf::from(format!("/proc/{pid}/exe")),
            Found::Installed(p) => p.clone(),
        }
    }

    /// The binary's path as a person knows it.
    pub fn describe(&self) -> String {
        match self {
            Found::Running { pid, exe: Some(e) } => format!("{} (running, pid {pid})", e.display()),
            Found::Running { pid, exe: None } => format!("the running kubelet (pid {pid})"),
            Found::Installed(p) => p.display().to_string(),
        }
    }
}

/// A kubelet's version, as `kubelet --version` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletVersion {
    /// What it printed (trimmed).
    pub line: String,
    /// (major, minor, patch); `None`: no `v<major>.<minor>.<patch>` in the line.
    pub number: Option<(u32, u32, u32)>,
    /// The pre-release after `-` ("alpha.1"), if any. A build suffix after `+` is not kept.
    pub pre: Option<String>,
}

impl KubeletVersion {
    /// Reads "Kubernetes v1.34.2", "Kubernetes v1.35.0-alpha.1", "Kubernetes v1.33.4+k3s1".
    pub fn parse(output: &str) -> KubeletVersion {
        let line = output.lines().next().unwrap_or_default().trim().to_string();
        let token = line.split_whitespace().find_map(|w| {
            w.strip_prefix('v')
                .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        });
        let (number, pre) = match token {
            Some(t) => {
                let t = t.split('+').next().unwrap_or_default();
                let (core, pre) = match t.split_once('-') {
                    Some((c, p)) => (c, Some(p.to_string())),
                    None => (t, None),
                };
                let parts: Vec<Option<u32>> = core.split('.').map(|p| p.parse().ok()).collect();
                match parts.as_slice() {
                    [Some(a), Some(b), Some(c)] => (Some((*a, *b, *c)), pre),
                    _ => (None, None),
                }
            }
            None => (None, None),
        };
        KubeletVersion { line, number, pre }
    }
}

/// What was found about the kubelet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub binary: Option<Found>,
    /// `Err`: `--version` did not run or failed (why). `None`: no binary.
    pub version: Option<Result<KubeletVersion, String>>,
    /// The kubelet's config file, if it exists.
    pub config: Option<PathBuf>,
}

/// Finds the kubelet and asks it its version; `config` is the kubelet's config file.
pub fn gather(node: &dyn Node, config: &Path, timeout: Duration) -> Facts {
    let binary = running(node)
        .or_else(|| node.look_path("kubelet").map(Found::Installed))
        .or_else(|| {
            WELL_KNOWN
                .iter()
                .map(PathBuf::from)
                .find(|p| node.exists(p))
                .map(Found::Installed)
        });
    let version = binary
        .as_ref()
        .map(|b| match node.run(&b.program(), &["--version"], timeout) {
            Ok(o) if o.status == 0 => Ok(KubeletVersion::parse(&o.stdout)),
            Ok(o) => Err(format!(
                "--version exited with status {}: {}",
                o.status,
                o.stderr.trim()
            )),
            Err(e) => Err(e),
        });
    Facts {
        binary,
        version,
        config: Some(config.to_path_buf()).filter(|c| node.exists(c)),
    }
}

/// The first process (lowest pid) whose name is `kubelet`.
fn running(node: &dyn Node) -> Option<Found> {
    let mut pids: Vec<u32> = node
        .list_dir(Path::new("/proc"))
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    pids.sort_unstable();
    let pid = pids.into_iter().find(|pid| {
        node.read(Path::new(&format!("/proc/{pid}/comm")))
            .is_ok_and(|c| c.trim_end() == "kubelet")
    })?;
    let exe = node.read_link(Path::new(&format!("/proc/{pid}/exe"))).ok();
    Some(Found::Running { pid, exe })
}

pub fn facts_json(f: &Facts) -> Value {
    let v = f.version.as_ref().and_then(|v| v.as_ref().ok());
    let (pid, binary) = match &f.binary {
        Some(Found::Running { pid, exe }) => (Some(*pid), exe.clone()),
        Some(Found::Installed(p)) => (None, Some(p.clone())),
        None => (None, None),
    };
    json!({
        "binary": binary,
        "running_pid": pid,
        "version": v.and_then(|v| {
            let (a, b, c) = v.number?;
            Some(match &v.pre {
                Some(p) => format!("{a}.{b}.{c}-{p}"),
                None => format!("{a}.{b}.{c}"),
            })
        }),
        "version_line": v.map(|v| &v.line),
        "config": f.config,
    })
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::{FakeNode, failed, ok};
    use super::*;

    const CONFIG: &str = "/var/lib/kubelet/config.yaml";

    fn gather_on(n: &FakeNode) -> Facts {
        gather(n, Path::new(CONFIG), Duration::from_secs(1))
    }

    #[test]
    fn versions_as_kubelets_print_them() {
        let v = KubeletVersion::parse("Kubernetes v1.34.2\n");
        assert_eq!(
            (v.number, v.pre, v.line.as_str()),
            (Some((1, 34, 2)), None, "Kubernetes v1.34.2")
        );
        let v = KubeletVersion::parse("Kubernetes v1.35.0-alpha.1\n");
        assert_eq!(
            (v.number, v.pre.as_deref()),
            (Some((1, 35, 0)), Some("alpha.1"))
        );
        let v = KubeletVersion::parse("Kubernetes v1.33.4+k3s1\n");
        assert_eq!((v.number, v.pre), (Some((1, 33, 4)), None));
        let v = KubeletVersion::parse("Kubernetes v1.32.3-eks-4096722\n");
        assert_eq!(
            (v.number, v.pre.as_deref()),
            (Some((1, 32, 3)), Some("eks-4096722"))
        );
        for junk in ["", "Kubernetes", "Kubernetes v1.x", "Kubernetes vfoo 1.2.3"] {
            assert_eq!(KubeletVersion::parse(junk).number, None, "{junk:?}");
        }
    }

    /// The running kubelet wins over `$PATH`, and is asked through its own image: an upgrade
    /// that replaced the file on disk does not change what runs.
    #[test]
    fn the_running_kubelet_is_asked_first() {
        let mut n = FakeNode::default();
        n.file("/proc/1/comm", "systemd\n")
            .file("/proc/812/comm", "kubelet\n")
            .file("/proc/self/comm", "kubelet\n")
            .file(CONFIG, "kind: KubeletConfiguration\n")
            .binary("kubelet", "/usr/local/bin/kubelet")
            .command("/proc/812/exe --version", ok("Kubernetes v1.33.1\n"))
            .command(
                "/usr/local/bin/kubelet --version",
                ok("Kubernetes v1.35.2\n"),
            );
        n.links
            .insert("/proc/812/exe".into(), "/usr/bin/kubelet".into());
        let f = gather_on(&n);
        assert_eq!(
            f.binary,
            Some(Found::Running {
                pid: 812,
                exe: Some("/usr/bin/kubelet".into())
            })
        );
        assert_eq!(f.version.clone().unwrap().unwrap().number, Some((1, 33, 1)));
        let j = facts_json(&f);
        assert_eq!(
            (&j["binary"], &j["running_pid"], &j["version"], &j["config"]),
            (
                &json!("/usr/bin/kubelet"),
                &json!(812),
                &json!("1.33.1"),
                &json!(CONFIG)
            )
        );
    }

    #[test]
    fn without_a_running_kubelet_path_then_the_usual_places() {
        let mut n = FakeNode::default();
        n.binary("kubelet", "/opt/k8s/kubelet")
            .file("/usr/bin/kubelet", "")
            .command("/opt/k8s/kubelet --version", ok("Kubernetes v1.34.0\n"));
        let f = gather_on(&n);
        assert_eq!(f.binary, Some(Found::Installed("/opt/k8s/kubelet".into())));

        let mut n = FakeNode::default();
        n.file("/usr/local/bin/kubelet", "").command(
            "/usr/local/bin/kubelet --version",
            failed(126, "permission denied"),
        );
        let f = gather_on(&n);
        assert_eq!(
            f.binary,
            Some(Found::Installed("/usr/local/bin/kubelet".into()))
        );
        assert!(
            f.version
                .unwrap()
                .unwrap_err()
                .contains("permission denied")
        );
    }

    /// A plain containerd host: nothing found, nothing run.
    #[test]
    fn no_kubelet_no_command() {
        let mut n = FakeNode::default();
        n.file("/proc/1/comm", "containerd\n");
        let f = gather_on(&n);
        assert_eq!(f, Facts::default());
        assert!(n.ran.borrow().is_empty());
        assert!(facts_json(&f)["version"].is_null());
    }
}
