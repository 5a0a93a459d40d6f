//! The node installer (`deploy/node/rsandbox-node.sh`, issue 25 item 3) on a node whose
//! containerd runs as `containerd.service`: a fresh install, a re-run that restarts nothing,
//! an upgrade while a pod of the old binary runs (the old pod stays manageable and goes away
//! cleanly, a new pod runs the new binary, containerd is not restarted: only a config change
//! restarts it), the uninstall (containerd's config byte for byte as before, the binary kept
//! while a pod runs and removed after), each once with a containerd >= 2.2-style config.toml
//! that imports `conf.d/*.toml` and once with a hand-written one that imports nothing; and a
//! preflight with a blocking verdict that changes nothing. In modules of their own under
//! `installer/`: the uninstall with the imports entry rewritten or left in place
//! (`uninstall_config.rs`), the token on no argv (`token.rs`), the lock (`lock.rs`), the
//! paced rollout: a pod through the handler before the label, the restart slot, the rollback
//! (`rollout.rs`); the node shapes: k3s, EKS nodeadm, COS, a CRI-O refusal (`distro.rs`).
//!
//! The node is throwaway: the test rewrites containerd's config and restarts containerd
//! (both restored at the end), and moves aside a shim binary found on containerd's PATH before
//! the install directory (a node booted with the shim in place). `hack/installer/test.sh` runs
//! this binary inside a systemd node (`hack/node.sh`), or, with `--scratch`, against a
//! throwaway containerd of its own (`hack/installer/scratch-node.sh`, a `systemctl` stand-in).
//!
//! Environment (without `RSANDBOX_INSTALLER_NEW` every test skips out loud, gate `installer-node`;
//! the DaemonSet's test also needs a systemd node, gate `installer-daemonset`; see
//! `rsandbox_integration::skip` for the `rsandbox-skip:` line and `RSANDBOX_EXPECT_GATES`):
//! - `RSANDBOX_INSTALLER_NEW`: the binary to install (this tree's release build);
//! - `RSANDBOX_INSTALLER_OLD`: the previous release's binary (the upgrade's starting point);
//! - `RSANDBOX_INSTALLER_CONFIG`: containerd's config file on this node;
//! - `CONTAINERD_ADDRESS`: containerd's socket (CRI);
//! - `SYSTEMCTL`, `INSTALL_DIR`, `STATE_DIR`: as the installer reads them (default
//!   `systemctl`, `/usr/local/bin`, `/var/lib/rsandbox-node`); every other variable of the
//!   installer passes through to it too;
//! - `RSANDBOX_INSTALLER_IMAGE_ROOT`: the installer image's file system, unpacked
//!   (`hack/installer/image.sh --rootfs`): the DaemonSet's container is run from it (see
//!   `the_daemonset_container_installs_and_uninstalls`; systemd node only);
//! - `KUBE_API`, `NODE_NAME` and `RSANDBOX_INSTALLER_KUBE_STATE`: the Kubernetes API stub
//!   (`hack/installer/kube-stub.py`) and the file where it keeps the Node's labels: when set,
//!   the labels are checked after each step;
//! - `SA_DIR`: the service account's directory, with the token the stub requires and the
//!   namespace of the restart slots (Leases);
//! - `VERIFY_IMAGE`: the image of the installer's verification pod (the bench's busybox).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rsandbox_integration::pods::SleepingPod;
use rsandbox_integration::*;

type R<T = ()> = Result<T, String>;

const UNIT: &str = "containerd.service";
const RUNTIME_TABLE: &str = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]";

struct Node {
    script: PathBuf,
    new_bin: PathBuf,
    old_bin: PathBuf,
    config: PathBuf,
    install_dir: PathBuf,
    state_dir: PathBuf,
    systemctl: Vec<String>,
    scratch: PathBuf,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.into())
}

/// The node under test, or why there is none.
fn node() -> Result<Node, String> {
    let new_bin = std::env::var("RSANDBOX_INSTALLER_NEW")
        .map_err(|_| "RSANDBOX_INSTALLER_NEW is not set".to_string())?;
    let old_bin = std::env::var("RSANDBOX_INSTALLER_OLD")
        .map_err(|_| "RSANDBOX_INSTALLER_OLD is not set".to_string())?;
    let config = std::env::var("RSANDBOX_INSTALLER_CONFIG")
        .map_err(|_| "RSANDBOX_INSTALLER_CONFIG is not set".to_string())?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = scratch_dir("installer");
    Ok(Node {
        script: repo.join("deploy/node/rsandbox-node.sh"),
        new_bin: new_bin.into(),
        old_bin: old_bin.into(),
        config: config.into(),
        install_dir: env_or("INSTALL_DIR", "/usr/local/bin").into(),
        state_dir: env_or("STATE_DIR", "/var/lib/rsandbox-node").into(),
        systemctl: env_or("SYSTEMCTL", "systemctl")
            .split_whitespace()
            .map(String::from)
            .collect(),
        scratch,
    })
}

macro_rules! node_or_skip {
    () => {
        match node() {
            Ok(n) => n,
            Err(why) => skip!(
                "installer-node",
                "{why}; hack/installer/test.sh runs these tests on a node"
            ),
        }
    };
}

/// One run of the installer: its exit status and its log (stderr and stdout).
struct Run {
    code: Option<i32>,
    log: String,
}

impl Node {
    /// systemd allows a unit 5 starts in 10 s (containerd.service keeps the defaults): this
    /// test restarts containerd more often than any node would, so before each step that may
    /// restart it, it resets the counter (`reset-failed` does; an active unit is untouched).
    fn reset_start_limit(&self) {
        let _ = self.systemctl(&["reset-failed", UNIT]);
    }

    fn installer(&self, args: &[&str]) -> Run {
        self.reset_start_limit();
        self.run_script(args, &[])
    }

    /// rsandbox-node.sh ARGS without the environment variables `unset` names; its log
    /// (stderr, then stdout) printed and returned.
    fn run_script(&self, args: &[&str], unset: &[&str]) -> Run {
        let mut c = Command::new("bash");
        c.arg(&self.script).args(args);
        for v in unset {
            c.env_remove(v);
        }
        let out = run_timeout(c, None, Duration::from_secs(300));
        let run = Run {
            code: out.code,
            log: format!("{}{}", out.stderr, out.stdout),
        };
        eprintln!(
            "--- rsandbox-node.sh {} (exit {:?})\n{}",
            args.join(" "),
            run.code,
            run.log
        );
        run
    }

    fn install(&self, binary: &Path, extra: &[&str]) -> Run {
        let b = binary.to_string_lossy().into_owned();
        let mut args = vec!["install", "--binary", b.as_str()];
        args.extend_from_slice(extra);
        self.installer(&args)
    }

    fn systemctl(&self, args: &[&str]) -> Out {
        let mut c = Command::new(&self.systemctl[0]);
        c.args(&self.systemctl[1..]).args(args);
        run_timeout(c, None, Duration::from_secs(120))
    }

    fn main_pid(&self) -> R<u32> {
        let out = self.systemctl(&["show", "--property", "MainPID", "--value", UNIT]);
        out.stdout
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("no MainPID of {UNIT}: {out:?}"))
    }

    fn restart_containerd(&self) -> R {
        self.reset_start_limit();
        let out = self.systemctl(&["restart", UNIT]);
        ensure!(out.ok(), "systemctl restart {UNIT}: {out:?}");
        self.wait_handlers(|_| true)?;
        Ok(())
    }

    /// CRI's runtime handlers, polled until `want` holds for them (a deadline only for a hang).
    fn wait_handlers(&self, want: impl Fn(&[String]) -> bool) -> R<Vec<String>> {
        let mut last = Vec::new();
        let got = poll(HANG, || {
            last = handlers();
            want(&last).then(|| last.clone())
        });
        got.ok_or_else(|| format!("CRI runtime handlers stayed {last:?}"))
    }

    fn shim_path(&self) -> PathBuf {
        self.install_dir.join(SHIM)
    }

    fn dropin(&self) -> PathBuf {
        self.config.parent().unwrap().join("conf.d/rsandbox.toml")
    }

    fn saved_config(&self) -> PathBuf {
        let mut p = self.config.clone().into_os_string();
        p.push(".installer-test-orig");
        p.into()
    }
}

/// CRI Status's runtime handler names, through the Rust CRI client (not the installer's
/// reader); on a thread of its own, so that sync and async callers alike can ask.
fn handlers() -> Vec<String> {
    std::thread::spawn(handlers_on_this_thread)
        .join()
        .unwrap_or_default()
}

fn handlers_on_this_thread() -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Ok(ch) = containerd_client::connect(address()).await else {
            return Vec::new();
        };
        let mut c = Runtime::new(ch);
        match c.status(cri::StatusRequest { verbose: false }).await {
            Ok(r) => r
                .into_inner()
                .runtime_handlers
                .into_iter()
                .map(|h| h.name)
                .filter(|n| !n.is_empty())
                .collect(),
            Err(_) => Vec::new(),
        }
    })
}

/// The config flavours the installer meets.
#[derive(Clone, Copy, Debug)]
enum Flavour {
    /// containerd >= 2.2's default: `imports = ['<config dir>/conf.d/*.toml']`.
    ImportsConfD,
    /// A hand-written or older config.toml: no imports.
    NoImports,
}

/// Puts the node in its before-install state for `flavour`: containerd's config without any
/// rsandbox runtime (from the node's original config, saved once), no shim binary that
/// containerd would find before the install directory; containerd restarted on it. Returns
/// the config's bytes.
fn prepare(n: &Node, flavour: Flavour) -> R<Vec<u8>> {
    let saved = n.saved_config();
    if !saved.exists() {
        fs::copy(&n.config, &saved).map_err(|e| format!("save {}: {e}", n.config.display()))?;
    }
    let orig = fs::read_to_string(&saved).map_err(|e| format!("read {}: {e}", saved.display()))?;
    let mut base = String::new();
    let mut skipping = false;
    for line in orig.lines() {
        let t = line.trim_start();
        if t == RUNTIME_TABLE || t.starts_with(&RUNTIME_TABLE.replace(']', ".")) {
            skipping = true;
            continue;
        }
        if skipping && t.starts_with('[') {
            skipping = false;
        }
        if !skipping {
            base.push_str(line);
            base.push('\n');
        }
    }
    let text = match flavour {
        Flavour::NoImports => base,
        Flavour::ImportsConfD => format!(
            "imports = ['{}/conf.d/*.toml']\n{base}",
            n.config.parent().unwrap().display()
        ),
    };
    fs::write(&n.config, &text).map_err(|e| format!("write {}: {e}", n.config.display()))?;
    // a shim the node came with, on containerd's PATH before the install directory, would
    // win over the installed one (the installer refuses such a node): a bare node has none
    let pid = n.main_pid()?;
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let path = environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix("PATH="))
        .next()
        .unwrap_or("")
        .to_string();
    let exe_dir = fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let mut dirs: Vec<PathBuf> = path.split(':').map(PathBuf::from).collect();
    dirs.extend(exe_dir);
    for d in dirs {
        if d == n.install_dir {
            break;
        }
        let s = d.join(SHIM);
        if s.exists() {
            let aside = d.join(format!(".{SHIM}.installer-test-aside"));
            fs::rename(&s, &aside).map_err(|e| format!("move {} aside: {e}", s.display()))?;
            eprintln!("moved {} aside (the node came with it)", s.display());
        }
    }
    let _ = fs::remove_file(n.shim_path());
    n.restart_containerd()?;
    let hs = handlers();
    ensure!(
        !hs.iter().any(|h| h == HANDLER),
        "the prepared node still serves {HANDLER}: {hs:?}"
    );
    Ok(text.into_bytes())
}

/// Puts the node's original config back and restarts containerd on it.
fn restore(n: &Node) {
    let saved = n.saved_config();
    if saved.exists() {
        let _ = fs::rename(&saved, &n.config);
    }
    let _ = n.restart_containerd();
}

/// The Node's labels as the API stub keeps them (None without a stub).
fn stub_labels() -> Option<serde_json::Map<String, serde_json::Value>> {
    let f = std::env::var("RSANDBOX_INSTALLER_KUBE_STATE").ok()?;
    let text = fs::read_to_string(f).unwrap_or_else(|_| "{}".into());
    serde_json::from_str(&text).ok()
}

/// major.minor of the containerd binary `exe` (its `--version`)
fn containerd_version(exe: &Path) -> R<(u32, u32)> {
    let out = run_timeout(
        {
            let mut c = Command::new(exe);
            c.arg("--version");
            c
        },
        None,
        HANG,
    );
    // "containerd github.com/containerd/containerd/v2 2.1.9+unknown ..."
    let v = out
        .stdout
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .ok_or_else(|| format!("no version in {:?}", out.stdout))?;
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>());
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => Err(format!("cannot read a version from {v:?}")),
    }
}

/// The running containerd's executable (its MainPID's /proc/<pid>/exe).
fn containerd_exe(n: &Node) -> R<PathBuf> {
    let pid = n.main_pid()?;
    fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| format!("containerd's exe: {e}"))
}

/// The `rsandbox.io/shim-version` label the installer derives from `<binary> -v` (its
/// "Version:" line, made a label value).
fn version_label(bin: &Path) -> String {
    let out = run_timeout(
        {
            let mut c = Command::new(bin);
            c.arg("-v");
            c
        },
        None,
        HANG,
    );
    let v = out
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))
        .unwrap_or("")
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect::<String>();
    let v = v
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    if v.is_empty() { "unknown".into() } else { v }
}

/// With the API stub: the installer's labels are there (for the binary `installed`) or all gone.
fn check_labels(n: &Node, installed: Option<&Path>, when: &str) -> R {
    check_labels_for(|| containerd_exe(n), installed, when)
}

/// [`check_labels`] for a containerd that is not containerd.service's main process (a node
/// shape whose unit runs it as a child): `ctrd` gives its binary.
fn check_labels_for(ctrd: impl Fn() -> R<PathBuf>, installed: Option<&Path>, when: &str) -> R {
    let Some(labels) = stub_labels() else {
        return Ok(());
    };
    let ours: Vec<_> = labels
        .keys()
        .filter(|k| k.starts_with("rsandbox.io/"))
        .collect();
    if let Some(bin) = installed {
        ensure!(
            labels.get("rsandbox.io/installed").and_then(|v| v.as_str()) == Some("true"),
            "{when}: the Node is not labelled rsandbox.io/installed=true: {labels:?}"
        );
        let want = version_label(bin);
        ensure!(
            labels
                .get("rsandbox.io/shim-version")
                .and_then(|v| v.as_str())
                == Some(want.as_str()),
            "{when}: rsandbox.io/shim-version is not {want:?}: {labels:?}"
        );
        // containerd 2.1/2.2 crash on hostNetwork pods of a shim sandboxer (fixed in 2.3.0)
        let crash = labels
            .get("rsandbox.io/containerd-hostnetwork-crash")
            .and_then(|v| v.as_str());
        let (major, minor) = containerd_version(&ctrd()?)?;
        let want = (major, minor) < (2, 3);
        ensure!(
            (crash == Some("true")) == want && (crash.is_none() || crash == Some("true")),
            "{when}: rsandbox.io/containerd-hostnetwork-crash is {crash:?} on containerd {major}.{minor}"
        );
    } else {
        ensure!(
            ours.is_empty(),
            "{when}: labels of the installer left: {ours:?}"
        );
    }
    ensure!(
        labels.contains_key("kubernetes.io/hostname"),
        "{when}: a label of someone else's went: {labels:?}"
    );
    Ok(())
}

fn exe_of(pid: i32) -> String {
    fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn inode_of_exe(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}/exe"))
        .ok()
        .map(|m| m.ino())
}

/// Installs this tree's binary (with the preflight where it has one) and waits for CRI to
/// serve the handler.
fn install_new(n: &Node) -> R {
    let no_check: &[&str] = if has_check(&n.new_bin) {
        &[]
    } else {
        &["--no-check"]
    };
    let r = n.install(&n.new_bin, no_check);
    ensure!(r.code == Some(0), "install failed:\n{}", r.log);
    n.wait_handlers(|h| h.iter().any(|x| x == HANDLER))?;
    Ok(())
}

/// Whether the new binary has the preflight (`check`); the previous release predates it.
fn has_check(bin: &Path) -> bool {
    let out = run_timeout(
        {
            let mut c = Command::new(bin);
            c.arg("check").arg("--help");
            c
        },
        None,
        HANG,
    );
    !format!("{}{}", out.stdout, out.stderr).contains("unknown action")
}

async fn exec_ok(pod: &mut SleepingPod, what: &str) -> R {
    let r = pod
        .exec(&["echo", "alive"], 10)
        .await
        .map_err(|s| format!("{what}: ExecSync: {}", s.message()))?;
    ensure!(
        r.exit_code == 0 && String::from_utf8_lossy(&r.stdout).trim() == "alive",
        "{what}: ExecSync answered {} {:?}",
        r.exit_code,
        String::from_utf8_lossy(&r.stdout)
    );
    Ok(())
}

/// install (old) / re-run / upgrade with the old pod running / uninstall with pods / uninstall.
async fn lifecycle(n: &Node, flavour: Flavour) -> R {
    let before = prepare(n, flavour)?;
    let check_new: &[&str] = if has_check(&n.new_bin) {
        &[]
    } else {
        eprintln!(
            "NOTE: {} has no `check`: installed with --no-check",
            n.new_bin.display()
        );
        &["--no-check"]
    };

    // 1. fresh install of the previous release (it predates `check`)
    let pid0 = n.main_pid()?;
    let r = n.install(&n.old_bin, &["--no-check"]);
    ensure!(r.code == Some(0), "fresh install failed:\n{}", r.log);
    let pid1 = n.main_pid()?;
    ensure!(
        pid1 != pid0,
        "the fresh install did not restart containerd (MainPID {pid0})"
    );
    ensure!(
        fs::read(n.shim_path()).ok() == fs::read(&n.old_bin).ok(),
        "{} is not the old binary",
        n.shim_path().display()
    );
    ensure!(
        n.dropin().exists(),
        "no drop-in at {}",
        n.dropin().display()
    );
    let after_install = fs::read(&n.config).map_err(|e| e.to_string())?;
    match flavour {
        Flavour::ImportsConfD => ensure!(
            after_install == before,
            "config.toml imports conf.d, yet the installer changed it"
        ),
        Flavour::NoImports => ensure!(
            String::from_utf8_lossy(&after_install)
                .contains(&format!("imports = ['{}']", n.dropin().display())),
            "config.toml imports nothing, yet no imports entry for the drop-in was added:\n{}",
            String::from_utf8_lossy(&after_install)
        ),
    }
    let hs = n.wait_handlers(|h| h.iter().any(|x| x == HANDLER))?;
    eprintln!("handlers after the install: {hs:?}");
    check_labels(n, Some(&n.old_bin), "after the install")?;

    // 2. a re-run with everything in place restarts nothing and writes nothing
    let r = n.install(&n.old_bin, &["--no-check"]);
    ensure!(r.code == Some(0), "re-run failed:\n{}", r.log);
    ensure!(n.main_pid()? == pid1, "the re-run restarted containerd");
    ensure!(
        fs::read(&n.config).ok().as_deref() == Some(&after_install[..]),
        "the re-run changed config.toml"
    );

    // 3. a pod of the old binary
    let logs = n.scratch.join(format!("{flavour:?}"));
    fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    let guard = Guard::new();
    let mut old_pod =
        SleepingPod::start(&unique_id(&format!("inst-old-{flavour:?}")), &logs).await?;
    let result = upgrade_and_uninstall(
        n,
        flavour,
        &before,
        pid1,
        check_new,
        &logs,
        &mut old_pod,
        &guard,
    )
    .await;
    if result.is_err() {
        let _ = old_pod.remove_or_kill().await;
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn upgrade_and_uninstall(
    n: &Node,
    flavour: Flavour,
    before: &[u8],
    pid1: u32,
    check_new: &[&str],
    logs: &Path,
    old_pod: &mut SleepingPod,
    guard: &Guard,
) -> R {
    let old_shim = old_pod.shim_pid().ok_or("no shim daemon for the old pod")?;
    let old_inode = inode_of_exe(old_shim);
    ensure!(
        exe_of(old_shim) == n.shim_path().to_string_lossy(),
        "the old pod's shim runs {}, not {}",
        exe_of(old_shim),
        n.shim_path().display()
    );

    // 4. upgrade: the binary changes, the config does not: nothing is restarted
    let r = n.install(&n.new_bin, check_new);
    ensure!(r.code == Some(0), "upgrade failed:\n{}", r.log);
    ensure!(
        n.main_pid()? == pid1,
        "the upgrade restarted containerd (only the binary changed)"
    );
    check_labels(n, Some(&n.new_bin), "after the upgrade")?;
    ensure!(
        fs::read(n.shim_path()).ok() == fs::read(&n.new_bin).ok(),
        "{} is not the new binary after the upgrade",
        n.shim_path().display()
    );
    // the old shim still runs its own (now unlinked) file
    ensure!(
        exe_of(old_shim) == format!("{} (deleted)", n.shim_path().display()),
        "the old pod's shim now runs {:?}",
        exe_of(old_shim)
    );
    ensure!(
        inode_of_exe(old_shim) == old_inode,
        "the old shim's binary changed under it"
    );
    exec_ok(old_pod, "the old pod after the upgrade").await?;

    // 5. a new pod runs the new binary
    let mut new_pod =
        SleepingPod::start(&unique_id(&format!("inst-new-{flavour:?}")), logs).await?;
    let rest = async {
        let new_shim = new_pod.shim_pid().ok_or("no shim daemon for the new pod")?;
        ensure!(
            exe_of(new_shim) == n.shim_path().to_string_lossy(),
            "the new pod's shim runs {}",
            exe_of(new_shim)
        );
        ensure!(
            inode_of_exe(new_shim) != old_inode,
            "the new pod runs the old binary's file"
        );

        // 6. uninstall while both pods run: config as before, the binary kept
        let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
        ensure!(r.code == Some(0), "uninstall with pods failed:\n{}", r.log);
        let pid2 = n.main_pid()?;
        ensure!(pid2 != pid1, "the uninstall did not restart containerd");
        ensure!(
            fs::read(&n.config).ok().as_deref() == Some(before),
            "config.toml is not byte for byte as before the install:\n{}",
            String::from_utf8_lossy(&fs::read(&n.config).unwrap_or_default())
        );
        ensure!(!n.dropin().exists(), "the drop-in is still there");
        let hs = n.wait_handlers(|h| !h.iter().any(|x| x == HANDLER))?;
        eprintln!("handlers after the uninstall: {hs:?}");
        ensure!(
            n.shim_path().exists(),
            "the binary was removed while pods still run"
        );
        check_labels(n, None, "after the uninstall")?;
        ensure!(
            r.log.contains("binary") && r.log.contains("kept"),
            "the uninstall did not say why it kept the binary:\n{}",
            r.log
        );

        // 7. both pods keep running and go away cleanly without the handler. Exec into them
        // does not work any more: containerd 2.1.9's ExecSync looks the pod's handler up in
        // its config (GetSandboxRuntime), whatever the runtime (pinned, so that a change is
        // seen; the installer's --wait-for-pods drains before the config goes for this reason)
        for (pod, what) in [(&mut *old_pod, "old"), (&mut new_pod, "new")] {
            match pod.exec(&["echo", "alive"], 10).await {
                Err(s)
                    if s.message()
                        .contains("no runtime for \"rsandbox\" is configured") => {}
                other => {
                    return Err(format!(
                        "exec into the {what} pod after the uninstall: {:?}, expected containerd's \
                         \"no runtime for \\\"rsandbox\\\" is configured\"",
                        other.map(|r| r.exit_code)
                    ));
                }
            }
        }
        ensure!(
            old_pod.shim_pid().is_some() && new_pod.shim_pid().is_some(),
            "a pod's shim went away with the uninstall"
        );
        Ok::<_, String>(pid2)
    }
    .await;
    let removed_new = new_pod.remove().await;
    let removed_old = old_pod.remove().await;
    let pid2 = rest?;
    removed_new.map_err(|e| format!("remove the new pod: {e}"))?;
    removed_old.map_err(|e| format!("remove the old pod: {e}"))?;
    let mut ids = old_pod.ids();
    ids.extend(new_pod.ids());
    guard.assert_clean(&ids);

    // 8. the second uninstall finds no pod: the binary goes, nothing is restarted
    let r = n.installer(&["uninstall"]);
    ensure!(r.code == Some(0), "the second uninstall failed:\n{}", r.log);
    ensure!(
        !n.shim_path().exists(),
        "the binary is still there with no pod left"
    );
    ensure!(
        n.main_pid()? == pid2,
        "the second uninstall restarted containerd"
    );
    ensure!(
        fs::read(&n.config).ok().as_deref() == Some(before),
        "config.toml changed by the second uninstall"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn install_upgrade_uninstall_with_conf_d_imports() {
    let n = node_or_skip!();
    let r = lifecycle(&n, Flavour::ImportsConfD).await;
    restore(&n);
    r.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn install_upgrade_uninstall_without_imports() {
    let n = node_or_skip!();
    let r = lifecycle(&n, Flavour::NoImports).await;
    restore(&n);
    r.unwrap();
}

/// A blocking verdict of `check` stops the install before anything on the node changes.
#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_check_changes_nothing() {
    let n = node_or_skip!();
    let r = (|| -> R {
        let before = prepare(&n, Flavour::NoImports)?;
        let pid = n.main_pid()?;
        let state_before = n.state_dir.exists();
        // a binary whose `check` reports a blocking problem, as the real one does (exit 1)
        let fake = n.scratch.join("blocking-shim");
        fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1\" = check ] && { echo 'containerd.default-runtime: block'; exit 1; }\nexit 0\n",
        )
        .map_err(|e| e.to_string())?;
        let _ = Command::new("chmod").arg("755").arg(&fake).status();
        let r = n.install(&fake, &[]);
        ensure!(
            r.code == Some(3),
            "install over a blocking check exited {:?}:\n{}",
            r.code,
            r.log
        );
        ensure!(
            r.log.contains("containerd.default-runtime: block"),
            "the check's report is not in the log"
        );
        ensure!(
            fs::read(&n.config).ok() == Some(before),
            "config.toml changed"
        );
        ensure!(!n.dropin().exists(), "a drop-in was written");
        ensure!(!n.shim_path().exists(), "a binary was installed");
        let staged: Vec<_> = fs::read_dir(&n.install_dir)
            .map_err(|e| e.to_string())?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("rsandbox-new"))
            .collect();
        ensure!(staged.is_empty(), "a staged binary was left: {staged:?}");
        ensure!(n.main_pid()? == pid, "containerd was restarted");
        ensure!(
            n.state_dir.exists() == state_before,
            "the refused install made {}",
            n.state_dir.display()
        );
        Ok(())
    })();
    restore(&n);
    r.unwrap();
}

/// The DaemonSet's arguments that say how it reaches the host (`--host-root`, `--host-exec`,
/// `--systemctl`, `--binary`), read from deploy/kubernetes/base/daemonset.yaml: the test runs
/// what the manifest runs.
fn daemonset_host_args() -> Vec<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/base/daemonset.yaml");
    let text = fs::read_to_string(&path).unwrap();
    let args: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- "))
        .filter(|a| {
            ["--host-root=", "--host-exec=", "--systemctl=", "--binary="]
                .iter()
                .any(|p| a.starts_with(p))
        })
        .map(String::from)
        .collect();
    assert_eq!(
        args.len(),
        4,
        "{}: the host arguments: {args:?}",
        path.display()
    );
    args
}

/// The DaemonSet's container, as deploy/kubernetes/base/daemonset.yaml makes it:
/// [`in_installer_pod_with`] with the manifest's host arguments and its volumes in the node's
/// layout. The node's layout is not the manifest's defaults (containerd's config and CRI socket
/// are the bench's), so the volumes are the node's directories of the same roles, as an overlay
/// would patch them.
fn in_installer_pod(n: &Node, rootfs: &Path, action: &str, extra: &[&str]) -> Run {
    let dir_of = |p: &Path| p.parent().unwrap().to_str().unwrap().to_string();
    let socket = PathBuf::from(
        std::env::var("CONTAINERD_ADDRESS")
            .unwrap_or_else(|_| "/run/containerd/containerd.sock".into())
            .trim_start_matches("unix://"),
    );
    // the DaemonSet's volumes, in the node's layout: the lock directory, containerd's config
    // directory, the install directory, the CRI socket's directory, the state directory
    let volumes = vec![
        "/run/rsandbox-node".into(),
        dir_of(&n.config),
        n.install_dir.to_str().unwrap().to_string(),
        dir_of(&socket),
        n.state_dir.to_str().unwrap().to_string(),
    ];
    in_installer_pod_with(rootfs, &volumes, &daemonset_host_args(), action, extra)
}

/// The DaemonSet's container: the installer image's file system as `/`, read-only, with a
/// tmpfs at /tmp; a container's /dev (the usual nodes and runc's /dev/fd, stdin, stdout, stderr
/// links); of the node only `volumes` (host paths: directories, made as DirectoryOrCreate makes
/// them, or files), each under `/host` at its own path, and systemd's private socket; the
/// node's PID namespace (hostPID: a fresh /proc shows the node's processes) and network; no
/// privilege: every capability dropped but SYS_PTRACE (the bounding set, so that root's exec
/// keeps no other), no_new_privs. Runs `rsandbox-node.sh ACTION HOST-ARGS EXTRA` there with the
/// environment the pod has (its node name, the API; nothing of this test's).
fn in_installer_pod_with(
    rootfs: &Path,
    volumes: &[String],
    host_args: &[String],
    action: &str,
    extra: &[&str],
) -> Run {
    let script = r#"set -e
r=$1 sa=$2 socket=$3; shift 3
mount --make-rprivate /
mount --bind "$r" "$r"
mount -o remount,bind,ro "$r"
# the mount points, as the runtime makes them in the container's writable layer (the image
# root is read-only here: tmpfs at /host and /run, which hold nothing of the image's)
mount -t tmpfs tmpfs "$r/host"
mount -t tmpfs tmpfs "$r/run"
mkdir -p "$r/run/systemd" "$r/run/secrets/sa"
: >>"$r/run/systemd/private"
while [ "$1" != -- ]; do
	if [ -e "$1" ] && [ ! -d "$1" ]; then
		mkdir -p "$(dirname "$r/host$1")"
		: >"$r/host$1"
	else
		mkdir -p "$1" "$r/host$1"
	fi
	mount --bind "$1" "$r/host$1"
	shift
done
shift
mount --bind "$socket" "$r/run/systemd/private"
# a container's /dev: a tmpfs with the usual nodes and runc's links, not the node's devices
mount -t tmpfs -o nosuid,mode=755 tmpfs "$r/dev"
for d in null zero full random urandom tty; do : >"$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
mount -t proc proc "$r/proc"
mount -t tmpfs tmpfs "$r/tmp"
[ -z "$sa" ] || mount --bind "$sa" "$r/run/secrets/sa"
exec chroot "$r" setpriv --bounding-set=-all,+sys_ptrace --inh-caps=-all --no-new-privs -- /opt/rsandbox-node/rsandbox-node.sh "$@""#;
    let _ = Command::new("systemctl")
        .args(["reset-failed", UNIT])
        .status();
    // a parent before what lies below it (a later mount would hide an earlier one)
    let mut volumes = volumes.to_vec();
    volumes.sort_by_key(|v| Path::new(v).components().count());
    let sa = std::env::var("SA_DIR").unwrap_or_default();
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--fork",
        "--",
        "bash",
        "-c",
        script,
        "installer-pod",
    ])
    .arg(rootfs)
    .arg(&sa)
    .arg("/run/systemd/private")
    .args(&volumes)
    .arg("--")
    .arg(action)
    .args(host_args)
    .args(extra)
    .env_clear()
    .env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    for v in ["NODE_NAME", "KUBE_API", "VERIFY_IMAGE"] {
        if let Ok(val) = std::env::var(v) {
            c.env(v, val);
        }
    }
    // the pod's projected token, mounted as the kubelet mounts it
    if !sa.is_empty() {
        c.env("SA_DIR", "/run/secrets/sa");
    }
    let out = run_timeout(c, None, Duration::from_secs(300));
    let run = Run {
        code: out.code,
        log: format!("{}{}", out.stderr, out.stdout),
    };
    eprintln!(
        "--- (installer pod) rsandbox-node.sh {action} (exit {:?})\n{}",
        run.code, run.log
    );
    run
}

/// The installer image in the DaemonSet's shape installs and uninstalls on the node, not
/// privileged and without the host's `/`: the image's own tools (curl, jq), containerd restarted
/// and host binaries (containerd, the image binary's `check`) run through systemd's D-Bus API
/// (the shim's `unit`; the image has no systemctl, the pod no capability to enter a namespace);
/// then a pod runs through the handler, and the uninstall takes everything back.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemonset_container_installs_and_uninstalls() {
    let n = node_or_skip!();
    let Ok(rootfs) = std::env::var("RSANDBOX_INSTALLER_IMAGE_ROOT") else {
        skip!(
            "installer-daemonset",
            "RSANDBOX_INSTALLER_IMAGE_ROOT is not set (hack/installer/test.sh sets it on a systemd node)"
        );
    };
    if !Path::new("/run/systemd/system").is_dir() {
        skip!(
            "installer-daemonset",
            "systemd is not PID 1 here: the DaemonSet's container needs a node"
        );
    }
    let rootfs = PathBuf::from(rootfs);
    let r: R = async {
        let before = prepare(&n, Flavour::NoImports)?;
        let image_bin = rootfs.join("opt/rsandbox-node").join(SHIM);
        let no_check: &[&str] = if has_check(&image_bin) {
            &[]
        } else {
            eprintln!("NOTE: the image's binary has no `check`: installed with --no-check");
            &["--no-check"]
        };
        // no systemctl to fall back on (util-linux's nsenter is there, but without
        // CAP_SYS_ADMIN the pod cannot enter a namespace with it)
        for absent in ["usr/bin/systemctl", "bin/systemctl"] {
            ensure!(
                !rootfs.join(absent).exists(),
                "the installer image has /{absent}: the test would not show that D-Bus did the work"
            );
        }
        let pid0 = n.main_pid()?;
        let r = in_installer_pod(&n, &rootfs, "install", no_check);
        ensure!(
            r.code == Some(0),
            "install from the installer pod failed:\n{}",
            r.log
        );
        ensure!(n.main_pid()? != pid0, "containerd was not restarted");
        n.wait_handlers(|h| h.iter().any(|x| x == HANDLER))?;
        ensure!(
            fs::read(n.shim_path()).ok() == fs::read(&image_bin).ok(),
            "{} is not the image's binary",
            n.shim_path().display()
        );
        ensure!(
            n.dropin().exists(),
            "no drop-in at {}",
            n.dropin().display()
        );
        check_labels(&n, Some(&image_bin), "after the installer pod's install")?;
        // a pod through the handler, on the containerd the D-Bus restart brought up
        let logs = n.scratch.join("daemonset-pod");
        fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let mut pod = SleepingPod::start(&unique_id("inst-pod"), &logs).await?;
        let ran = exec_ok(&mut pod, "a pod after the installer pod's install").await;
        pod.remove().await?;
        ran?;
        let pid1 = n.main_pid()?;
        let r = in_installer_pod(&n, &rootfs, "install", no_check);
        ensure!(
            r.code == Some(0),
            "the installer pod's re-run failed:\n{}",
            r.log
        );
        ensure!(
            n.main_pid()? == pid1,
            "the installer pod's re-run restarted containerd"
        );
        let r = in_installer_pod(&n, &rootfs, "uninstall", &[]);
        ensure!(
            r.code == Some(0),
            "uninstall from the installer pod failed:\n{}",
            r.log
        );
        ensure!(
            fs::read(&n.config).ok() == Some(before),
            "config.toml is not as before after the installer pod's uninstall"
        );
        ensure!(!n.dropin().exists(), "the drop-in is still there");
        ensure!(
            !n.shim_path().exists(),
            "the binary is still there (no pod needed it)"
        );
        n.wait_handlers(|h| !h.iter().any(|x| x == HANDLER))?;
        check_labels(&n, None, "after the installer pod's uninstall")?;
        Ok(())
    }
    .await;
    restore(&n);
    r.unwrap();
}

// after the helpers and node_or_skip! (a macro is in scope only below its definition)
#[path = "installer/distro.rs"]
mod distro;
#[path = "installer/lock.rs"]
mod lock;
#[path = "installer/rollout.rs"]
mod rollout;
#[path = "installer/token.rs"]
mod token;
#[path = "installer/uninstall_config.rs"]
mod uninstall_config;
