//! Static pods on the rsandbox RuntimeClass. The kubelet runs a static pod from the files of
//! its `staticPodPath` whatever the API server answers for the pod's mirror: no admission
//! policy sees it, so deploy/'s hostNetwork guard cannot stop a static hostNetwork pod on the
//! rsandbox class, and containerd before 2.3.0 panics on such a pod's sandbox (nil spec in
//! `NewBundle`, see [`super::containerd`]) at every attempt the kubelet makes.
//!
//! The kubelet reads every file of the directory whose name does not start with `.`, each one
//! pod in YAML or JSON (`pkg/kubelet/config/file.go`). `check` reads two fields of each by
//! line, `runtimeClassName` and `hostNetwork`, without a YAML parser: a static pod manifest is
//! one flat Pod, and both fields are scalars on a line of their own in what kubeadm and people
//! write. The RuntimeClass names taken for rsandbox's: `rsandbox` (deploy/'s class) and the
//! names of containerd's rsandbox handlers (a class is often named after its handler); a class
//! of another name cannot be told from the node.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::containerd::{HOST_NETWORK_FIXED, Version};
use super::node::Node;
use super::report::{Finding, Status};

/// Where kubeadm puts static pods (`staticPodPath` in the kubelet config it writes).
pub const KUBEADM_STATIC_POD_PATH: &str = "/etc/kubernetes/manifests";

/// deploy/kubernetes's RuntimeClass.
const MANAGED_CLASS: &str = "rsandbox";

/// A static pod on an rsandbox RuntimeClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPod {
    pub file: PathBuf,
    pub class: String,
    pub host_network: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The directory read: the kubelet config's `staticPodPath`, else kubeadm's if it exists.
    pub dir: Option<PathBuf>,
    /// Its static pods on an rsandbox class.
    pub on_rsandbox: Vec<StaticPod>,
    /// A file that could not be read, and why.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// The value of `key` in a YAML line (`key: v`, also `"key": v,`), quotes removed.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim_start().trim_start_matches("- ");
        let rest = l
            .strip_prefix(key)
            .or_else(|| l.strip_prefix(&format!("\"{key}\"")))?;
        let v = rest.trim_start().strip_prefix(':')?;
        let v = v.split(" #").next().unwrap_or_default().trim();
        Some(
            v.trim_end_matches(',')
                .trim()
                .trim_matches(['"', '\''])
                .to_string(),
        )
    })
}

/// A manifest's `spec.runtimeClassName` (None: no class) and `spec.hostNetwork`: JSON parsed
/// (a generated manifest may be one line), YAML read by line.
fn pod_fields(text: &str) -> Option<(String, bool)> {
    if text.trim_start().starts_with('{') {
        let pod: Value = serde_json::from_str(text).ok()?;
        let spec = pod.get("spec")?;
        let class = spec.get("runtimeClassName")?.as_str()?.to_string();
        let host = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
        return Some((class, host));
    }
    let class = field(text, "runtimeClassName")?;
    Some((class, field(text, "hostNetwork").as_deref() == Some("true")))
}

/// Reads the static pod directory named by `kubelet_config`; `handlers` are containerd's
/// rsandbox handler names.
pub fn gather(node: &dyn Node, kubelet_config: &Path, handlers: &[String]) -> Facts {
    let configured = node
        .read(kubelet_config)
        .ok()
        .and_then(|t| field(&t, "staticPodPath"))
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let dir = configured
        .or_else(|| Some(PathBuf::from(KUBEADM_STATIC_POD_PATH)).filter(|d| node.exists(d)));
    let mut f = Facts {
        dir: dir.clone(),
        ..Facts::default()
    };
    let Some(dir) = dir else { return f };
    let mut names = node.list_dir(&dir).unwrap_or_default();
    names.sort();
    for name in names.iter().filter(|n| !n.starts_with('.')) {
        let file = dir.join(name);
        let text = match node.read(&file) {
            Ok(t) => t,
            Err(e) => {
                // a subdirectory is skipped by the kubelet too
                if node.list_dir(&file).is_err() {
                    f.unreadable.push((file, e.to_string()));
                }
                continue;
            }
        };
        let Some((class, host_network)) = pod_fields(&text) else {
            continue;
        };
        if class == MANAGED_CLASS || handlers.contains(&class) {
            f.on_rsandbox.push(StaticPod {
                file,
                class,
                host_network,
            });
        }
    }
    f
}

pub fn facts_json(f: &Facts) -> Value {
    json!({
        "dir": f.dir,
        "on_rsandbox": f.on_rsandbox.iter().map(|p| json!({
            "file": p.file, "runtime_class": p.class, "host_network": p.host_network,
        })).collect::<Vec<_>>(),
        "unreadable": f.unreadable.iter().map(|(p, e)| json!({"file": p, "error": e})).collect::<Vec<_>>(),
    })
}

/// `containerd`: the version `containerd --version` gave, if any.
pub fn judge(f: &Facts, containerd: Option<Version>) -> Finding {
    const ID: &str = "static-pods.admission";
    let Some(dir) = &f.dir else {
        return Finding::new(
            ID,
            Status::Info,
            "no static pod directory (no staticPodPath in the kubelet's config, no /etc/kubernetes/manifests)",
        );
    };
    if f.on_rsandbox.is_empty() {
        let mut ok = Finding::new(
            ID,
            Status::Ok,
            format!(
                "no static pod in {} uses an rsandbox RuntimeClass",
                dir.display()
            ),
        );
        if !f.unreadable.is_empty() {
            ok = ok.detail(format!(
                "unreadable: {}",
                f.unreadable
                    .iter()
                    .map(|(p, e)| format!("{} ({e})", p.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        return ok;
    }
    let list = |pods: &[&StaticPod]| {
        pods.iter()
            .map(|p| format!("{} (class {})", p.file.display(), p.class))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all: Vec<&StaticPod> = f.on_rsandbox.iter().collect();
    let host: Vec<&StaticPod> = all.iter().copied().filter(|p| p.host_network).collect();
    let bypass = "the kubelet runs static pods from their files whatever the API server answers: \
                  deploy/'s admission policies (the hostNetwork guard) never see them";
    let crashes = |v: &str| {
        format!(
            "static hostNetwork pod(s) on the rsandbox class: {}; containerd {v} panics on a hostNetwork \
             pod with a shim sandboxer (fixed in {HOST_NETWORK_FIXED}), at every attempt the kubelet makes",
            list(&host)
        )
    };
    let fix = format!(
        "take runtimeClassName out of these manifests (or hostNetwork), or upgrade containerd to \
         {HOST_NETWORK_FIXED} or later"
    );
    match containerd {
        _ if host.is_empty() => Finding::new(
            ID,
            Status::Info,
            format!("static pods on the rsandbox class: {}", list(&all)),
        )
        .detail(bypass),
        Some(v) if !v.at_least(HOST_NETWORK_FIXED) => {
            Finding::new(ID, Status::Block, crashes(&v.to_string()))
                .detail(bypass)
                .fix(fix)
        }
        None => Finding::new(
            ID,
            Status::Warn,
            crashes("of an unknown version (before 2.3.0?)"),
        )
        .detail(bypass)
        .fix(fix),
        Some(v) => Finding::new(
            ID,
            Status::Info,
            format!(
                "static hostNetwork pod(s) on the rsandbox class, safe on containerd {v}: {}",
                list(&host)
            ),
        )
        .detail(bypass),
    }
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    const KUBELET: &str = "/var/lib/kubelet/config.yaml";

    fn gather_on(n: &FakeNode) -> Facts {
        gather(n, Path::new(KUBELET), &["rsandbox-gpu".to_string()])
    }

    // what kubeadm writes for a control-plane static pod, with the two fields added
    const HOSTNET_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\n\
        spec:\n  containers:\n  - command:\n    - etcd\n    image: registry.k8s.io/etcd:3.6.4-0\n    name: etcd\n\
        \x20 hostNetwork: true\n  priorityClassName: system-node-critical\n  runtimeClassName: rsandbox\n";

    #[test]
    fn fields_of_yaml_lines_and_json() {
        assert_eq!(field(HOSTNET_POD, "hostNetwork").as_deref(), Some("true"));
        assert_eq!(
            field(HOSTNET_POD, "runtimeClassName").as_deref(),
            Some("rsandbox")
        );
        let j = "{\n  \"spec\": {\n    \"hostNetwork\": true,\n    \"runtimeClassName\": \"rsandbox-gpu\"\n  }\n}";
        assert_eq!(pod_fields(j), Some(("rsandbox-gpu".into(), true)));
        assert_eq!(pod_fields(HOSTNET_POD), Some(("rsandbox".into(), true)));
        assert_eq!(pod_fields("{\"spec\": {\"hostNetwork\": true}}"), None);
        assert_eq!(
            field("runtimeClassName: 'x' # quoted\n", "runtimeClassName").as_deref(),
            Some("x")
        );
        assert_eq!(field("runtimeClassNames: x\n", "runtimeClassName"), None);
    }

    #[test]
    fn the_configured_directory_every_visible_file() {
        let mut n = FakeNode::default();
        n.file(
            KUBELET,
            "kind: KubeletConfiguration\nstaticPodPath: /etc/static\n",
        )
        .file("/etc/static/etcd.yaml", HOSTNET_POD)
        .file(
            "/etc/static/plain.yaml",
            "kind: Pod\nspec:\n  hostNetwork: true\n",
        )
        .file(
            "/etc/static/gpu.json",
            "{\"spec\": {\"runtimeClassName\": \"rsandbox-gpu\"}}",
        )
        .file("/etc/static/.hidden.yaml", HOSTNET_POD)
        .file("/etc/kubernetes/manifests/other.yaml", HOSTNET_POD);
        let f = gather_on(&n);
        assert_eq!(f.dir.as_deref(), Some(Path::new("/etc/static")));
        assert_eq!(
            f.on_rsandbox,
            vec![
                StaticPod {
                    file: "/etc/static/etcd.yaml".into(),
                    class: "rsandbox".into(),
                    host_network: true
                },
                StaticPod {
                    file: "/etc/static/gpu.json".into(),
                    class: "rsandbox-gpu".into(),
                    host_network: false
                },
            ]
        );
    }

    #[test]
    fn a_static_hostnetwork_pod_blocks_before_2_3_only() {
        let mut n = FakeNode::default();
        n.file("/etc/kubernetes/manifests/etcd.yaml", HOSTNET_POD);
        let f = gather_on(&n);
        assert_eq!(f.dir.as_deref(), Some(Path::new(KUBEADM_STATIC_POD_PATH)));
        let old = judge(&f, Some(Version::release(2, 1, 9)));
        assert_eq!(old.status, Status::Block, "{old:?}");
        assert!(
            old.summary.contains("/etc/kubernetes/manifests/etcd.yaml"),
            "{old:?}"
        );
        assert_eq!(judge(&f, None).status, Status::Warn);
        assert_eq!(judge(&f, Some(HOST_NETWORK_FIXED)).status, Status::Info);
    }

    #[test]
    fn no_directory_or_no_rsandbox_pod() {
        let n = FakeNode::default();
        assert_eq!(judge(&gather_on(&n), None).status, Status::Info);
        let mut n = FakeNode::default();
        n.file(KUBELET, "staticPodPath: /etc/static\n").file(
            "/etc/static/a.yaml",
            "spec:\n  hostNetwork: true\n  runtimeClassName: runc\n",
        );
        let j = judge(&gather_on(&n), Some(Version::release(2, 1, 9)));
        assert_eq!(j.status, Status::Ok, "{j:?}");
        // a static pod on rsandbox without hostNetwork: the bypass is said, nothing blocks
        n.file(
            "/etc/static/b.yaml",
            "spec:\n  runtimeClassName: rsandbox\n",
        );
        let j = judge(&gather_on(&n), Some(Version::release(2, 1, 9)));
        assert_eq!(j.status, Status::Info, "{j:?}");
    }
}
