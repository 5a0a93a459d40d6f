//! Issue 13: the sandbox holds the pod in. PID 1 of a pod that shares its PID namespace is the
//! pause process; a container of that pod must reach nothing of the node through it, whatever
//! it is granted short of `privileged`. Every probe runs on the `rsandbox` handler and on
//! containerd's own `runc` handler (a pause container) in the same test: both must hold.
//!
//! Before the fix the pause lived in the node's mount namespace with the node's `/` as root:
//! a container with `CAP_SYS_PTRACE` wrote onto the node through `/proc/1/root`, read the
//! node's mount table, and read the shim's environment and memory (the pause was a fork of it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rsandbox_integration::controller::{self, ControllerCreateRequest, req, sandbox_info};
use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{self, Pod, container_config};
use rsandbox_integration::*;

type R = Result<(), String>;

/// A pod sharing one PID namespace (`shareProcessNamespace: true`).
fn shared_pid_pod(name: &str, dir: &Path) -> PodSandboxConfig {
    let mut cfg = pods::pod_config(name, dir);
    if let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.pid = NamespaceMode::Pod as i32;
    }
    cfg
}

/// A sleeping busybox container in the pod's PID namespace, with `add` capabilities added to
/// CRI's defaults (`kubectl debug --profile=general` adds SYS_PTRACE).
fn member(name: &str, add: &[&str]) -> ContainerConfig {
    let mut c = container_config(name, &["sleep", "3600"]);
    let sc = c
        .linux
        .get_or_insert_default()
        .security_context
        .get_or_insert_default();
    sc.namespace_options.get_or_insert_default().pid = NamespaceMode::Pod as i32;
    if !add.is_empty() {
        sc.capabilities = Some(Capability {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
    }
    c
}

/// A file on the node that no pod may read: `/tmp/<name>` holding a secret.
struct NodeSecret(PathBuf);

impl NodeSecret {
    fn new(name: &str) -> NodeSecret {
        let p = Path::new("/tmp").join(name);
        std::fs::write(&p, "node-secret-4711").unwrap();
        NodeSecret(p)
    }
}

impl Drop for NodeSecret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Where the escape probe would land on the node (`/tmp/<name>`, `/<name>`); removed on drop.
struct EscapeProof {
    name: String,
}

impl EscapeProof {
    fn new(name: &str) -> EscapeProof {
        let e = EscapeProof { name: name.into() };
        for p in e.paths() {
            let _ = std::fs::remove_file(p);
        }
        e
    }

    fn paths(&self) -> [PathBuf; 2] {
        [
            Path::new("/tmp").join(&self.name),
            Path::new("/").join(&self.name),
        ]
    }

    /// The node files a container wrote.
    fn written(&self) -> Vec<PathBuf> {
        self.paths().into_iter().filter(|p| p.exists()).collect()
    }
}

impl Drop for EscapeProof {
    fn drop(&mut self) {
        for p in self.paths() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Mount points (field 5) of a mountinfo text.
fn mount_points(mountinfo: &str) -> Vec<&str> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .collect()
}

/// The probes, in pod `p` on its handler: `ptracer` has CAP_SYS_PTRACE, `plain` CRI's default
/// capabilities only.
async fn probe(p: &mut Pod, ptracer: &str, plain: &str, tag: &str) -> R {
    let h = p.handler.clone();
    let secret = NodeSecret::new(&format!("rsandbox-node-secret-{tag}"));
    let secret_name = secret.0.file_name().unwrap().to_string_lossy().into_owned();
    // The reported escape: writing onto the node through PID 1's root and cwd. The guard
    // removes what a container managed to write, whatever happens next.
    let escape = EscapeProof::new(&format!("rsandbox-escape-proof-{tag}"));
    for dir in ["/proc/1/root", "/proc/1/cwd"] {
        for target in [
            format!("{dir}/tmp/{}", escape.name),
            format!("{dir}/{}", escape.name),
        ] {
            let _ = p.sh(ptracer, &format!("echo pwned > {target}")).await?;
        }
    }
    let written = escape.written();
    ensure!(
        written.is_empty(),
        "{h}: a container wrote {written:?} on the node"
    );

    // Reading a node file through PID 1's root and cwd (the node's /tmp, /etc).
    for dir in ["/proc/1/root", "/proc/1/cwd"] {
        let (_, out, _) = p
            .sh(
                ptracer,
                &format!("cat {dir}/tmp/{secret_name} {dir}/etc/hostname"),
            )
            .await?;
        ensure!(
            !out.contains("node-secret-4711"),
            "{h}: read the node's file via {dir}"
        );
        let node_hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let node_hostname = node_hostname.trim();
        ensure!(
            node_hostname.is_empty() || !out.contains(node_hostname),
            "{h}: read the node's /etc/hostname via {dir}: {out:?}"
        );
    }

    // The node's mount table (other pods' volumes and secrets are mounted under the node's
    // kubelet and containerd directories): no mount point of PID 1 lies under the bench's
    // prefix, where this containerd keeps every pod's root filesystem.
    let (rc, mountinfo, err) = p.sh(ptracer, "cat /proc/1/mountinfo").await?;
    ensure!(rc == 0, "{h}: cat /proc/1/mountinfo: {err}");
    let prefix = prefix().to_string_lossy().into_owned();
    let node_mounts: Vec<&str> = mount_points(&mountinfo)
        .into_iter()
        .filter(|m| m.starts_with(&prefix) || m.starts_with("/run/containerd"))
        .collect();
    ensure!(
        node_mounts.is_empty(),
        "{h}: PID 1 shows the node's mount points: {node_mounts:?}"
    );

    // The pause's own empty root stays in its mount namespace: the node sees no such mount.
    let node_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    ensure!(
        !node_mounts.contains("rsandbox-pause"),
        "{h}: the pause's root tmpfs shows in the node's mount table"
    );

    // The pause's environment and memory: nothing of the shim (its addresses, its config).
    let (_, environ, _) = p.sh(ptracer, "cat /proc/1/environ").await?;
    for leak in ["TTRPC_ADDRESS", "GRPC_ADDRESS", "RSANDBOX"] {
        ensure!(
            !environ.contains(leak),
            "{h}: PID 1's environment has {leak}: {environ:?}"
        );
    }
    let (_, maps, _) = p
        .sh(ptracer, "cat /proc/1/maps; readlink /proc/1/exe")
        .await?;
    ensure!(
        !maps.contains(SHIM),
        "{h}: PID 1 maps the shim binary: {maps}"
    );

    // Without CAP_SYS_PTRACE: no access to PID 1's files at all (it runs as 65535, not
    // dumpable), as on the runc path.
    for probe in [
        "cat /proc/1/environ",
        // Opening it is the access check (a read at offset 0 fails anyway: nothing is mapped).
        "exec 3</proc/1/mem && echo opened",
        "ls -A /proc/1/root/",
        "ls -A /proc/1/cwd/",
    ] {
        let (rc, out, err) = p.sh(plain, probe).await?;
        ensure!(
            rc != 0 && out.is_empty(),
            "{h}: a container without CAP_SYS_PTRACE could {probe}: {out:?} {err:?}"
        );
    }

    // Signals from a container (CAP_KILL is a default capability). SIGKILL and SIGSTOP to a
    // PID 1 from inside its namespace are dropped by the kernel on both paths. rsandbox's
    // pause also ignores SIGTERM/SIGINT/SIGHUP from inside the pod (it takes them only from
    // outside, the shim or the node); the runc path's pause container exits on a container's
    // SIGTERM, so that part is not probed there.
    let signals = if h == HANDLER {
        "KILL STOP TERM INT HUP USR1 QUIT"
    } else {
        "KILL STOP"
    };
    let (rc, _, err) = p
        .sh(
            plain,
            &format!("for s in {signals}; do kill -s $s 1 || exit 9; done"),
        )
        .await?;
    ensure!(rc == 0, "{h}: kill: {err}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        p.state().await? == PodSandboxState::SandboxReady as i32,
        "{h}: the pod is not ready after a container signalled PID 1 ({signals})"
    );
    let (rc, out, _) = p.sh(plain, "cat /proc/1/status").await?;
    ensure!(
        rc == 0
            && out
                .lines()
                .any(|l| l.starts_with("State:") && l.contains("S (sleeping)")),
        "{h}: PID 1 after the signals: {out}"
    );
    if h == HANDLER {
        ensure!(
            pause_procs_of(&p.id).len() == 1,
            "{h}: the pause process is gone"
        );
    }
    Ok(())
}

async fn run_probes(handler: &str, dir: &Path) -> (Result<(), String>, Vec<String>) {
    let name = unique_id(&format!("iso-{handler}"));
    let mut pod = match Pod::run(handler, shared_pid_pod(&name, dir)).await {
        Ok(p) => p,
        Err(e) => return (Err(e), vec![name]),
    };
    let res = async {
        let ptracer = pod.start(member("ptracer", &["SYS_PTRACE"])).await?;
        let plain = pod.start(member("plain", &[])).await?;
        probe(
            &mut pod,
            &ptracer,
            &plain,
            &format!("{handler}-{}", std::process::id()),
        )
        .await
    }
    .await;
    let removed = pod.remove().await;
    let mut ids = pod.ids();
    ids.push(name);
    (res.and(removed), ids)
}

#[tokio::test]
async fn the_pause_is_no_door_to_the_node() {
    let g = Guard::new();
    let dir = scratch_dir(&unique_id("isolation"));
    let mut all_ids = Vec::new();
    let mut failures = Vec::new();
    for handler in [HANDLER, RUNC_HANDLER] {
        let (res, ids) = run_probes(handler, &dir).await;
        if let Err(e) = res {
            failures.push(format!(
                "{e}\n--- containerd log ---\n{}",
                log_lines(&ids[0], 20)
            ));
        }
        all_ids.extend(ids);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    g.assert_clean(&all_ids);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client-chosen `netns_path` that is a fifo (or a regular file) is refused at once with
/// InvalidArgument: the shim never waits on it (a blocking open of a fifo without a writer
/// would hold the sandbox for ever) and never fails on it late in StartSandbox.
#[tokio::test]
async fn a_netns_path_that_is_no_netns_is_refused_at_once() {
    let g = Guard::new();
    let id = unique_id("bad-netns");
    let dir = scratch_dir(&id);
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let file = dir.join("file");
    std::fs::write(&file, "").unwrap();
    let mut c = controller::controller().await;
    let mut ids = Vec::new();
    let mut failures = Vec::new();
    for (n, path) in [&fifo, &file].into_iter().enumerate() {
        let sid = format!("{id}-{n}");
        ids.push(sid.clone());
        let create = c.create(req(ControllerCreateRequest {
            sandbox_id: sid.clone(),
            netns_path: path.to_string_lossy().into_owned(),
            sandbox: Some(sandbox_info(&sid)),
            sandboxer: "shim".into(),
            ..Default::default()
        }));
        match tokio::time::timeout(HANG, create).await {
            Err(_) => failures.push(format!(
                "{}: Create did not answer within {HANG:?}",
                path.display()
            )),
            Ok(Ok(_)) => failures.push(format!("{}: Create succeeded", path.display())),
            Ok(Err(s)) => {
                let m = s.message();
                if !(m.contains("netns_path") && m.contains("not a network namespace")) {
                    failures.push(format!("{}: {:?} {m}", path.display(), s.code()));
                }
            }
        }
        let _ = controller::stop_and_shutdown(&mut c, &sid).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    ids.push(id);
    g.assert_clean(&ids);
    let _ = std::fs::remove_dir_all(&dir);
}
