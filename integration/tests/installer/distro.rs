//! The node installer on the node shapes of `deploy/node/lib/distro.sh` (issue 35 item 2), on
//! the systemd node: `hack/installer/distro-node.sh` starts containerd the way each
//! distribution does (k3s: a k3s.service that renders config.toml from its template at every
//! start and runs containerd as its child on k3s' socket; EKS: a nodeadm-config.service that
//! rewrites /etc/containerd/config.toml at every boot; COS: /usr read-only, ID=cos, the shim's
//! directory /home/kubernetes/bin first on containerd's PATH). Each case installs (the
//! installer runs a pod through the handler before it reports success), re-runs (nothing
//! changed, containerd not restarted), "reboots" (the bootstrapper rewrites its file and
//! restarts containerd: the handler is still served, and an install run after it runs a pod
//! through the handler again; on COS, whose config imports no directory, the installer's
//! imports entry is lost with the rewrite and the next install puts it back), and uninstalls (the drop-in gone, the rendered file as the
//! bootstrapper wrote it, the handler gone). A CRI-O-shaped node gets one refusal, exit 3, and
//! nothing restarted or written.
//!
//! Then, on the same shape, the upgrade with running pods: the previous release installed and
//! a pod on it, the new binary installed over it (nothing restarted; the old pod's shim keeps
//! its unlinked file and answers an exec), a pod of the new binary, the uninstall with both
//! running (the shape's unit restarts; on k3s, rke2, k0s and microk8s containerd is its child,
//! and both shims outlive it; the binary stays), the second uninstall (the binary goes). The
//! Node's labels (the API stub of hack/installer/in-node.sh) are checked after each install and
//! uninstall; on COS the rewrite that drops the handler leaves `rsandbox.io/installed=true`
//! until the installer runs again (docs/install.md).
//!
//! Last, the shape's installer pod: the installer image run as the DaemonSet runs it, with the
//! volumes and arguments of deploy/kubernetes/shapes/NAME (the base for EKS) as kustomize builds
//! them (hack/installer/test.sh writes them to RSANDBOX_INSTALLER_SHAPE_MANIFESTS): it finds the
//! shape from inside the pod (systemd over D-Bus, the node's processes through hostPID),
//! installs (a pod through the handler before it reports success), re-runs without a restart
//! and uninstalls.

use super::*;

const HELPER: &str = "hack/installer/distro-node.sh";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `distro-node.sh ACTION SHAPE`, with the node's (prepared) config, containerd binary and
/// containerd.service's PATH.
fn helper(n: &Node, action: &str, shape: &str, ctrd: &Path, path: &str) -> R {
    let mut c = Command::new("bash");
    c.arg(repo().join(HELPER))
        .args([action, shape])
        .env("BASE", &n.config)
        .env("CTRD", ctrd)
        .env("CTRD_PATH", path);
    let out = run_timeout(c, None, Duration::from_secs(300));
    ensure!(out.ok(), "{HELPER} {action} {shape}: {out:?}");
    Ok(())
}

/// The installer without an install directory or a CRI socket from the environment (the node
/// shape picks them), with the API stub of hack/installer/in-node.sh (the Node's labels).
fn run_installer(n: &Node, args: &[&str]) -> Run {
    n.reset_start_limit();
    n.run_script(args, &["INSTALL_DIR", "CONTAINERD_SOCKET"])
}

/// [`run_installer`] that must exit 0; the error names the shape and `what` failed.
fn installer_ok(n: &Node, s: &Shape, args: &[&str], what: &str) -> R<Run> {
    let r = run_installer(n, args);
    ensure!(r.code == Some(0), "{}: {what} failed:\n{}", s.name, r.log);
    Ok(r)
}

/// The installer pod of a shape's DaemonSet: the installer image's root, the hostPath volumes
/// (but systemd's socket, which the pod gets as always) and the arguments that say how it
/// reaches the host, as kustomize built them.
struct ShapePod {
    rootfs: PathBuf,
    volumes: Vec<String>,
    host_args: Vec<String>,
}

/// The installer pod of `component` (deploy/kubernetes/shapes/NAME, `base`: none), from the
/// manifests hack/installer/test.sh built; skips (gate installer-daemonset) without them.
macro_rules! shape_pod_or_skip {
    ($component:expr) => {
        match shape_pod($component) {
            Ok(p) => p,
            Err(why) => skip!("installer-daemonset", "{why}"),
        }
    };
}

fn shape_pod(component: &str) -> R<ShapePod> {
    let rootfs = std::env::var("RSANDBOX_INSTALLER_IMAGE_ROOT").map_err(
        |_| "RSANDBOX_INSTALLER_IMAGE_ROOT is not set (hack/installer/test.sh sets it on the node)",
    )?;
    let dir = std::env::var("RSANDBOX_INSTALLER_SHAPE_MANIFESTS").map_err(
        |_| "RSANDBOX_INSTALLER_SHAPE_MANIFESTS is not set (hack/installer/test.sh builds them)",
    )?;
    let path = Path::new(&dir).join(format!("{component}.json"));
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let volumes = v["volumes"]
        .as_array()
        .ok_or("no volumes")?
        .iter()
        .filter(|v| v["type"] != "Socket")
        .filter_map(|v| v["path"].as_str().map(String::from))
        .collect();
    let host_args = v["args"]
        .as_array()
        .ok_or("no args")?
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| {
            [
                "--host-root=",
                "--host-exec=",
                "--systemctl=",
                "--binary=",
                "--distro=",
            ]
            .iter()
            .any(|p| a.starts_with(p))
        })
        .map(String::from)
        .collect();
    Ok(ShapePod {
        rootfs: rootfs.into(),
        volumes,
        host_args,
    })
}

/// The shape's installer pod installs (the installer's own verification runs a pod through the
/// handler first), finds the shape, writes where the host run did, re-runs without a restart,
/// and uninstalls everything it did.
fn from_the_daemonset(n: &Node, s: &Shape, pod: &ShapePod) -> R {
    // The shapes that keep containerd.service's socket (EKS, COS) serve CRI at
    // /run/containerd/containerd.sock on a real node, which the manifest mounts; this node's
    // containerd serves at the bench's socket instead: the pod gets that directory too.
    let mut volumes = pod.volumes.clone();
    if s.socket.is_none() {
        let socket = std::env::var("CONTAINERD_ADDRESS")
            .unwrap_or_else(|_| "/run/containerd/containerd.sock".into());
        let socket = Path::new(socket.trim_start_matches("unix://"));
        volumes.extend(socket.parent().and_then(Path::to_str).map(String::from));
    }
    let run = |action: &str, what: &str| -> R<Run> {
        n.reset_start_limit();
        let r = super::in_installer_pod_with(&pod.rootfs, &volumes, &pod.host_args, action, &[]);
        ensure!(
            r.code == Some(0),
            "{} ({}): {what} from the installer pod failed:\n{}",
            s.name,
            s.component,
            r.log
        );
        Ok(r)
    };
    let r = run("install", "install")?;
    ensure!(
        r.log.contains(&format!("node shape {}", s.name)),
        "{}: the installer pod did not find the shape:\n{}",
        s.name,
        r.log
    );
    ensure!(
        Path::new(s.dropin).exists() && Path::new(s.shim).exists(),
        "{}: after the installer pod's install: drop-in {} {}, shim {} {}",
        s.name,
        s.dropin,
        Path::new(s.dropin).exists(),
        s.shim,
        Path::new(s.shim).exists()
    );
    wait_status_handler(n, true, "after the installer pod's install")?;
    let r = run("install", "re-run")?;
    ensure!(
        r.log.contains("containerd not restarted"),
        "{}: the installer pod's re-run restarted containerd:\n{}",
        s.name,
        r.log
    );
    run("uninstall", "uninstall")?;
    ensure!(
        !Path::new(s.dropin).exists() && !Path::new(s.shim).exists(),
        "{}: the installer pod's uninstall left the drop-in or the shim",
        s.name
    );
    wait_status_handler(n, false, "after the installer pod's uninstall")
}

/// The handlers `rsandbox-node.sh status` reads from the shape's CRI socket.
fn status_handlers(n: &Node) -> R<Vec<String>> {
    let r = run_installer(n, &["status"]);
    ensure!(r.code == Some(0), "status failed:\n{}", r.log);
    let line = r
        .log
        .lines()
        .find_map(|l| l.strip_prefix("handlers:"))
        .ok_or_else(|| format!("no handlers line:\n{}", r.log))?;
    Ok(line.split_whitespace().map(String::from).collect())
}

fn wait_status_handler(n: &Node, present: bool, when: &str) -> R {
    let mut last = Vec::new();
    poll(HANG, || {
        last = status_handlers(n).unwrap_or_default();
        (last.iter().any(|h| h == HANDLER) == present).then_some(())
    })
    .ok_or_else(|| format!("{when}: the {HANDLER} handler present={present} never held: {last:?}"))
}

/// containerd.service's binary and PATH, before the shape replaces it.
fn containerd_of(n: &Node) -> R<(PathBuf, String)> {
    let pid = n.main_pid()?;
    let exe = fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let path = environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix("PATH="))
        .next()
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .to_string();
    Ok((exe, path))
}

struct Shape {
    name: &'static str,
    /// The DaemonSet's component for the shape (deploy/kubernetes/shapes/NAME; `base`: none).
    component: &'static str,
    /// The config the distribution renders (never edited by the installer).
    rendered: &'static str,
    /// Where the drop-in must go.
    dropin: &'static str,
    /// Where the shim must go.
    shim: &'static str,
    /// The CRI socket the shape's containerd serves (None: the node's, which the config the
    /// bootstrapper writes keeps).
    socket: Option<&'static str>,
    /// The installer adds an imports entry to `rendered` (COS: GKE's config imports no
    /// directory), which the bootstrapper's next rewrite drops: after a reboot the handler is
    /// gone until the installer (the DaemonSet's pod) runs again.
    edits_rendered: bool,
}

async fn shape_lifecycle(n: &Node, s: &Shape, pod: &ShapePod) -> R {
    prepare(n, Flavour::NoImports)?;
    let (ctrd, path) = containerd_of(n)?;
    helper(n, "up", s.name, &ctrd, &path)?;
    let labels = |installed: Option<&Path>, when: &str| {
        check_labels_for(
            || Ok(ctrd.clone()),
            installed,
            &format!("{}: {when}", s.name),
        )
    };
    let r = async {
        let rendered = fs::read(s.rendered).map_err(|e| format!("{}: {e}", s.rendered))?;
        let new_bin = n.new_bin.to_string_lossy().into_owned();

        let r = installer_ok(n, s, &["install", "--binary", &new_bin], "install")?;
        ensure!(
            r.log.contains(&format!("node shape {}", s.name)),
            "{}: not detected as such:\n{}",
            s.name,
            r.log
        );
        ensure!(
            Path::new(s.dropin).exists(),
            "{}: no drop-in at {}",
            s.name,
            s.dropin
        );
        ensure!(
            Path::new(s.shim).exists(),
            "{}: no shim at {}",
            s.name,
            s.shim
        );
        let now = fs::read_to_string(s.rendered).map_err(|e| e.to_string())?;
        ensure!(
            (now.as_bytes() == &rendered[..]) != s.edits_rendered,
            "{}: {} edited: {}, expected: {}:\n{now}",
            s.name,
            s.rendered,
            now.as_bytes() != &rendered[..],
            s.edits_rendered
        );
        wait_status_handler(n, true, "after the install")?;
        labels(Some(&n.new_bin), "after the install")?;

        let r = installer_ok(n, s, &["install", "--binary", &new_bin], "re-run")?;
        ensure!(
            r.log.contains("containerd not restarted"),
            "{}: the re-run restarted containerd:\n{}",
            s.name,
            r.log
        );

        // the bootstrapper rewrites its file and containerd starts again: the handler stays,
        // and a pod runs through it (the install's verification) without a restart
        helper(n, "reboot", s.name, &ctrd, &path)?;
        ensure!(
            fs::read(s.rendered).ok().as_deref() == Some(&rendered[..]),
            "{}: the reboot did not render {} as before",
            s.name,
            s.rendered
        );
        wait_status_handler(n, !s.edits_rendered, "after the reboot")?;
        // nothing told the API: the labels stay (on COS, stale until the installer runs again)
        labels(Some(&n.new_bin), "after the reboot")?;
        let r = run_installer(n, &["install", "--binary", &new_bin]);
        ensure!(
            r.code == Some(0) && (s.edits_rendered || r.log.contains("containerd not restarted")),
            "{}: the install after the reboot failed or restarted containerd:\n{}",
            s.name,
            r.log
        );
        wait_status_handler(n, true, "after the install after the reboot")?;
        labels(Some(&n.new_bin), "after the install after the reboot")?;

        installer_ok(n, s, &["uninstall", "--wait-for-pods=0"], "uninstall")?;
        ensure!(
            !Path::new(s.dropin).exists(),
            "{}: the drop-in is left",
            s.name
        );
        ensure!(!Path::new(s.shim).exists(), "{}: the shim is left", s.name);
        ensure!(
            fs::read(s.rendered).ok().as_deref() == Some(&rendered[..]),
            "{}: the uninstall changed {}",
            s.name,
            s.rendered
        );
        wait_status_handler(n, false, "after the uninstall")?;
        labels(None, "after the uninstall")?;

        upgrade_with_pods(n, s, &labels).await?;
        from_the_daemonset(n, s, pod)
    }
    .await;
    let down = helper(n, "down", s.name, &ctrd, &path);
    restore(n);
    r.and(down)
}

/// The upgrade with running pods, on the shape: the previous release installed and a pod on
/// it; the new binary installed over it (only the binary changes: nothing restarted, the old
/// pod's shim keeps its unlinked file and still answers); a pod of the new binary; the
/// uninstall with both running, which restarts the shape's unit (on k3s, rke2, k0s and
/// microk8s containerd is that unit's child) while both shims live on and the binary stays;
/// the pods removed; the second uninstall takes the binary.
async fn upgrade_with_pods(n: &Node, s: &Shape, labels: &impl Fn(Option<&Path>, &str) -> R) -> R {
    let socket = s.socket.map_or_else(address, PathBuf::from);
    let socket = socket.as_path();
    let old_bin = n.old_bin.to_string_lossy().into_owned();
    let new_bin = n.new_bin.to_string_lossy().into_owned();
    installer_ok(
        n,
        s,
        &["install", "--no-check", "--binary", &old_bin],
        "install of the previous release",
    )?;
    wait_status_handler(n, true, "after the install of the previous release")?;
    labels(
        Some(&n.old_bin),
        "after the install of the previous release",
    )?;

    let logs = n.scratch.join(format!("distro-{}", s.name));
    fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    let mut old_pod =
        SleepingPod::start_at(socket, &unique_id(&format!("distro-old-{}", s.name)), &logs).await?;
    let mut new_pod: Option<SleepingPod> = None;
    let r = async {
        let old_shim = old_pod.shim_pid().ok_or("no shim daemon for the old pod")?;
        ensure!(
            exe_of(old_shim) == s.shim,
            "{}: the old pod's shim runs {}, not {}",
            s.name,
            exe_of(old_shim),
            s.shim
        );

        let r = run_installer(n, &["install", "--binary", &new_bin]);
        ensure!(
            r.code == Some(0) && r.log.contains("containerd not restarted"),
            "{}: the upgrade failed or restarted containerd:\n{}",
            s.name,
            r.log
        );
        labels(Some(&n.new_bin), "after the upgrade")?;
        ensure!(
            exe_of(old_shim) == format!("{} (deleted)", s.shim),
            "{}: after the upgrade the old pod's shim runs {:?}",
            s.name,
            exe_of(old_shim)
        );
        exec_ok(&mut old_pod, "the old pod after the upgrade").await?;

        let pod = new_pod.insert(
            SleepingPod::start_at(socket, &unique_id(&format!("distro-new-{}", s.name)), &logs)
                .await?,
        );
        let new_shim = pod.shim_pid().ok_or("no shim daemon for the new pod")?;
        ensure!(
            exe_of(new_shim) == s.shim,
            "{}: the new pod's shim runs {}",
            s.name,
            exe_of(new_shim)
        );

        installer_ok(
            n,
            s,
            &["uninstall", "--wait-for-pods=0"],
            "uninstall with pods",
        )?;
        wait_status_handler(n, false, "after the uninstall with pods")?;
        labels(None, "after the uninstall with pods")?;
        ensure!(
            Path::new(s.shim).exists(),
            "{}: the binary was removed while pods still run",
            s.name
        );
        ensure!(
            old_pod.shim_pid() == Some(old_shim) && pod.shim_pid() == Some(new_shim),
            "{}: a pod's shim did not outlive the restart of containerd's unit",
            s.name
        );
        Ok(())
    }
    .await;
    let removed_new = match new_pod.as_mut() {
        Some(p) => p.remove_or_kill().await,
        None => Ok(()),
    };
    let removed_old = old_pod.remove_or_kill().await;
    r?;
    removed_new.map_err(|e| format!("{}: remove the new pod: {e}", s.name))?;
    removed_old.map_err(|e| format!("{}: remove the old pod: {e}", s.name))?;

    installer_ok(n, s, &["uninstall"], "the second uninstall")?;
    ensure!(
        !Path::new(s.shim).exists(),
        "{}: the second uninstall (no pods) left the binary",
        s.name
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn k3s_renders_and_the_handler_survives() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("k3s");
    shape_lifecycle(
        &n,
        &Shape {
            name: "k3s",
            component: "k3s",
            rendered: "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            dropin: "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/rsandbox.toml",
            shim: "/usr/local/bin/containerd-shim-rsandbox-v1",
            socket: Some("/run/k3s/containerd/containerd.sock"),
            edits_rendered: false,
        },
        &pod,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn eks_nodeadm_rewrites_and_the_handler_survives() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("base");
    shape_lifecycle(
        &n,
        &Shape {
            name: "eks",
            component: "base",
            rendered: "/etc/containerd/config.toml",
            dropin: "/etc/containerd/config.d/rsandbox.toml",
            shim: "/usr/local/bin/containerd-shim-rsandbox-v1",
            socket: None,
            edits_rendered: false,
        },
        &pod,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cos_read_only_usr_and_the_shim_in_home_kubernetes_bin() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("cos");
    shape_lifecycle(
        &n,
        &Shape {
            name: "cos",
            component: "cos",
            rendered: "/etc/containerd/config.toml",
            dropin: "/etc/containerd/conf.d/rsandbox.toml",
            shim: "/home/kubernetes/bin/containerd-shim-rsandbox-v1",
            socket: None,
            edits_rendered: true,
        },
        &pod,
    )
    .await
    .unwrap();
}

#[test]
fn crio_is_refused_once_and_nothing_restarts() {
    let n = node_or_skip!();
    let (ctrd, path) = containerd_of(&n).unwrap();
    helper(&n, "up", "crio", &ctrd, &path).unwrap();
    let r = (|| -> R {
        let crio_pid = n.systemctl(&["show", "--property", "MainPID", "--value", "crio.service"]);
        let config = fs::read(&n.config).map_err(|e| e.to_string())?;
        let new_bin = n.new_bin.to_string_lossy().into_owned();
        let r = run_installer(&n, &["install", "--binary", &new_bin]);
        ensure!(
            r.code == Some(3),
            "install on CRI-O: exit {:?}:\n{}",
            r.code,
            r.log
        );
        ensure!(
            r.log.matches("refused:").count() == 1 && r.log.contains("CRI-O"),
            "not one refusal naming CRI-O:\n{}",
            r.log
        );
        let active = n.systemctl(&["is-active", "containerd.service"]);
        ensure!(
            active.stdout.trim() != "active",
            "containerd.service was started: {active:?}"
        );
        let again = n.systemctl(&["show", "--property", "MainPID", "--value", "crio.service"]);
        ensure!(
            again.stdout == crio_pid.stdout,
            "crio.service was restarted: {crio_pid:?} -> {again:?}"
        );
        ensure!(
            fs::read(&n.config).ok() == Some(config),
            "containerd's config was changed"
        );
        ensure!(
            !n.shim_path().exists(),
            "a shim was installed at {}",
            n.shim_path().display()
        );
        Ok(())
    })();
    let down = helper(&n, "down", "crio", &ctrd, &path);
    r.and(down).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn rke2_renders_and_the_handler_survives() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("rke2");
    shape_lifecycle(
        &n,
        &Shape {
            name: "rke2",
            component: "rke2",
            rendered: "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
            dropin: "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/rsandbox.toml",
            shim: "/usr/local/bin/containerd-shim-rsandbox-v1",
            socket: Some("/run/k3s/containerd/containerd.sock"),
            edits_rendered: false,
        },
        &pod,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn k0s_containerd_d_and_the_handler_survives() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("k0s");
    shape_lifecycle(
        &n,
        &Shape {
            name: "k0s",
            component: "k0s",
            // the CRI part k0s generates (its containerd.toml lists containerd.d's files)
            rendered: "/run/k0s/containerd-cri.toml",
            dropin: "/etc/k0s/containerd.d/rsandbox.toml",
            shim: "/usr/local/bin/containerd-shim-rsandbox-v1",
            socket: Some("/run/k0s/containerd.sock"),
            edits_rendered: false,
        },
        &pod,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn microk8s_renders_its_template_and_the_handler_survives() {
    let n = node_or_skip!();
    let pod = shape_pod_or_skip!("microk8s");
    shape_lifecycle(
        &n,
        &Shape {
            name: "microk8s",
            component: "microk8s",
            rendered: "/var/snap/microk8s/current/args/containerd.toml",
            dropin: "/var/snap/microk8s/current/args/containerd.d/rsandbox.toml",
            shim: "/usr/local/bin/containerd-shim-rsandbox-v1",
            socket: Some("/var/snap/microk8s/common/run/containerd.sock"),
            edits_rendered: false,
        },
        &pod,
    )
    .await
    .unwrap();
}
