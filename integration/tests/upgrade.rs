//! N-1 → N (issue 25 item 4): pods of the previous release's shim across an upgrade to this
//! one, on the bench's containerd and the `rsandbox` CRI handler.
//!
//! - A pod of the previous release whose shim dies after this release is installed: this
//!   release's `delete` (containerd runs whatever binary it finds then) reads the old release's
//!   sandbox record (no schema version: version 0, it says so in containerd's log) and takes the
//!   pod down; StopPodSandbox and RemovePodSandbox succeed and nothing is left.
//! - A pod of the previous release that keeps running while this release is installed: its
//!   shim still runs the old (now unlinked) file, exec, stop and remove work through it, and a
//!   new pod runs this release.
//!
//! The previous release's binary: `$RSANDBOX_PREVIOUS_SHIM` (hack/test.sh sets it from
//! `hack/previous-release.sh`), else the test runs that script, which builds it once (cached).
//! A clone without that commit (a shallow clone) fails the test, saying how to fetch it: never a
//! silent skip. This release's binary is the one installed in the bench when the test starts
//! (hack/build.sh's); every swap of the installed binary is undone when the test ends, however
//! it ends ([`Installed`]'s Drop), since the other tests share the bench.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rsandbox_integration::cri::*;
use rsandbox_integration::pods::SleepingPod;
use rsandbox_integration::*;

/// The shim binary the bench's containerd runs (next to containerd).
fn installed_path() -> PathBuf {
    prefix().join("usr/bin").join(SHIM)
}

/// `<binary> -v`'s `Version:` value.
fn version_of(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("-v")
        .output()
        .unwrap_or_else(|e| panic!("run {} -v: {e}", binary.display()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Version:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("{} -v printed no version", binary.display()))
}

/// The previous release's binary (see the module doc).
fn previous_shim() -> PathBuf {
    if let Some(p) = std::env::var_os("RSANDBOX_PREVIOUS_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "RSANDBOX_PREVIOUS_SHIM={} is not a file",
            p.display()
        );
        return p;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/previous-release.sh");
    eprintln!(
        "RSANDBOX_PREVIOUS_SHIM is not set: building the previous release with {}",
        script.display()
    );
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "the N-1 upgrade test cannot get the previous release: {} failed ({}); its message is above",
        script.display(),
        out.status
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The installed shim, swapped between the two releases, as an installer does it (a new file
/// renamed over the path: running shims keep the file they run). Dropping it puts this
/// release back, whatever happened.
struct Installed {
    /// A copy of this release's binary, taken at the start.
    new: PathBuf,
    old: PathBuf,
    new_version: String,
    old_version: String,
    _dir: TempDir,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Installed {
    fn take() -> Installed {
        let old = previous_shim();
        let dir = std::env::temp_dir().join(unique_id("upgrade-bin"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let new = dir.join(SHIM);
        std::fs::copy(installed_path(), &new).unwrap_or_else(|e| {
            panic!(
                "copy the installed shim {}: {e} (hack/build.sh installs it)",
                installed_path().display()
            )
        });
        let (new_version, old_version) = (version_of(&new), version_of(&old));
        assert_ne!(
            new_version, old_version,
            "the installed shim ({}) is of the previous release's version: install this tree's (hack/build.sh)",
            new_version
        );
        Installed {
            new,
            old,
            new_version,
            old_version,
            _dir: TempDir(dir),
        }
    }

    /// Installs `binary` by copy + rename (atomic for containerd and for running shims).
    fn install(binary: &Path) {
        let dest = installed_path();
        let tmp = dest.with_file_name(format!(".{SHIM}.upgrade-{}", std::process::id()));
        std::fs::copy(binary, &tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &dest).unwrap();
    }

    fn previous(&self) {
        Self::install(&self.old);
        assert_eq!(version_of(&installed_path()), self.old_version);
    }

    fn current(&self) {
        Self::install(&self.new);
        assert_eq!(version_of(&installed_path()), self.new_version);
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        Self::install(&self.new);
    }
}

/// The running shim daemon's executable and its version (run through /proc/<pid>/exe, which
/// works after the file was replaced).
fn daemon_version(pod: &SleepingPod) -> Result<(String, String), String> {
    let pid = pod
        .shim_pid()
        .ok_or(format!("no (single) shim daemon for pod {}", pod.id))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| format!("readlink /proc/{pid}/exe: {e}"))?;
    Ok((
        exe.to_string_lossy().into_owned(),
        version_of(Path::new(&format!("/proc/{pid}/exe"))),
    ))
}

/// The pod's sandbox bundle (the shim sandboxer's) and its container's task bundle.
fn bundles(pod: &SleepingPod) -> (PathBuf, PathBuf) {
    let state = prefix().join("run/containerd");
    (
        state
            .join("io.containerd.sandbox.controller.v1.shim/k8s.io")
            .join(&pod.id),
        state
            .join("io.containerd.runtime.v2.task/k8s.io")
            .join(&pod.container),
    )
}

/// The record file in `bundle`, parsed; whether it carries a schema version.
fn record_version(file: &Path) -> Result<Option<u64>, String> {
    let raw = std::fs::read(file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(v.get("schema_version").and_then(|n| n.as_u64()))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// The pid of the pod's pause and of its container's init (CRI's verbose status).
async fn workload_pids(pod: &mut SleepingPod) -> Result<Vec<u32>, String> {
    let pid_of = |info: Option<&String>| -> Option<u32> {
        let v: serde_json::Value = serde_json::from_str(info?).ok()?;
        v["pid"].as_u64().map(|p| p as u32)
    };
    let c = pod
        .rt
        .container_status(ContainerStatusRequest {
            container_id: pod.container.clone(),
            verbose: true,
        })
        .await
        .map_err(|s| format!("ContainerStatus: {}", s.message()))?
        .into_inner();
    let s = pod
        .rt
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: true,
        })
        .await
        .map_err(|s| format!("PodSandboxStatus: {}", s.message()))?
        .into_inner();
    let pids: Vec<u32> = [pid_of(c.info.get("info")), pid_of(s.info.get("info"))]
        .into_iter()
        .flatten()
        .collect();
    ensure!(pids.len() == 2, "container and pause pids: {pids:?}");
    Ok(pids)
}

async fn pod_state(pod: &mut SleepingPod) -> Result<i32, String> {
    pod.rt
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .map_err(|s| s.message().to_string())
        .map(|r| r.into_inner().status.map(|s| s.state).unwrap_or(-1))
}

async fn container_state(pod: &mut SleepingPod) -> Result<i32, String> {
    pod.rt
        .container_status(ContainerStatusRequest {
            container_id: pod.container.clone(),
            verbose: false,
        })
        .await
        .map_err(|s| s.message().to_string())
        .map(|r| r.into_inner().status.map(|s| s.state).unwrap_or(-1))
}

/// (a): the previous release's pod, its shim SIGKILLed once this release is installed.
async fn crashed_old_pod(bin: &Installed, pod: &mut SleepingPod) -> Result<(), String> {
    let (exe, version) = daemon_version(pod)?;
    ensure!(
        version == bin.old_version,
        "the pod's shim {exe} is version {version}, not the previous release's {}",
        bin.old_version
    );
    let (sandbox_bundle, task_bundle) = bundles(pod);
    // What the previous release wrote: no schema version (0.1.0) — or the version it had.
    let old_record = record_version(&sandbox_bundle.join("rsandbox-sandbox.json"))?;
    let old_task = record_version(&task_bundle.join("rsandbox-task.json"))?;
    eprintln!(
        "previous release {}: sandbox record schema {old_record:?}, task record schema {old_task:?}",
        bin.old_version
    );
    let pids = workload_pids(pod).await?;

    // This release goes in first: containerd runs `delete` with the binary it finds when it
    // sees the shim gone, i.e. at once.
    bin.current();
    let shim = pod.shim_pid().ok_or("no shim daemon")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| format!("kill the shim {shim}: {e}"))?;
    // containerd notices the closed connection, runs `delete` and sees the container's exit
    // asynchronously: the pod turns NOTREADY and the container EXITED once it has (as in
    // crash.rs).
    let want = (
        Ok(PodSandboxState::SandboxNotready as i32),
        Ok(ContainerState::ContainerExited as i32),
    );
    let deadline = tokio::time::Instant::now() + HANG;
    let mut seen = (pod_state(pod).await, container_state(pod).await);
    while seen != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = (pod_state(pod).await, container_state(pod).await);
    }
    ensure!(
        seen == want,
        "pod and container states after the shim died: {seen:?}"
    );
    // This release's delete read the old record: it says so, and containerd logs it.
    let needle = format!(
        "rsandbox-sandbox.json: schema version {}",
        old_record.unwrap_or(0)
    );
    let said = poll(HANG, || {
        let lines = log_lines(&pod.id, 200);
        lines
            .lines()
            .find(|l| {
                l.contains(&needle) && l.contains(&format!("read by rsandbox {}", bin.new_version))
            })
            .map(String::from)
    });
    ensure!(
        said.is_some(),
        "containerd's log shows no delete of {} by rsandbox {} reading the old record ({needle:?}):\n{}",
        pod.id,
        bin.new_version,
        log_lines(&pod.id, 20)
    );
    eprintln!("containerd: {}", said.unwrap());
    pod.remove().await?;
    let running: Vec<u32> = pids.into_iter().filter(|&p| alive(p)).collect();
    ensure!(
        running.is_empty(),
        "the old pod's pause or container still runs: {running:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_pod_whose_shim_died_is_cleaned_up_by_this_release() {
    let g = Guard::new();
    let bin = Installed::take();
    bin.previous();
    let dir = scratch_dir(&unique_id("upgrade-a"));
    let mut pod = match SleepingPod::start(&unique_id("upgrade-a"), &dir).await {
        Ok(p) => p,
        Err(e) => panic!(
            "a pod on the previous release ({}): {e}\n{}",
            bin.old_version,
            log_lines("error", 20)
        ),
    };
    let r = crashed_old_pod(&bin, &mut pod).await;
    if r.is_err() {
        bin.current();
        let _ = pod.remove_or_kill().await;
    }
    expect_ok(&pod.id, r);
    drop(bin);
    g.assert_clean(&pod.ids());
}

/// (b): the previous release's pod runs on while this release is installed and new pods come.
async fn old_pod_across_the_upgrade(
    bin: &Installed,
    old: &mut SleepingPod,
    dir: &Path,
    new_pod: &mut Option<SleepingPod>,
) -> Result<(), String> {
    let (exe, version) = daemon_version(old)?;
    ensure!(
        version == bin.old_version,
        "the old pod's shim {exe} is version {version}"
    );
    bin.current();
    // The old pod's shim runs the file that was replaced (unlinked, still mapped).
    let (exe, version) = daemon_version(old)?;
    ensure!(
        version == bin.old_version && exe.ends_with(" (deleted)"),
        "after the upgrade the old pod's shim runs {exe:?} (version {version})"
    );
    let r = old
        .exec(&["echo", "still here"], 10)
        .await
        .map_err(|s| format!("exec into the old pod: {}", s.message()))?;
    ensure!(
        r.exit_code == 0 && String::from_utf8_lossy(&r.stdout) == "still here\n",
        "exec into the old pod: {r:?}"
    );
    // A new pod runs this release.
    let pod = SleepingPod::start(&unique_id("upgrade-b-new"), dir).await?;
    let new = new_pod.insert(pod);
    let (exe, version) = daemon_version(new)?;
    ensure!(
        version == bin.new_version && !exe.ends_with(" (deleted)"),
        "the new pod's shim runs {exe:?} (version {version}), not this release"
    );
    let (sandbox_bundle, _) = bundles(new);
    ensure!(
        record_version(&sandbox_bundle.join("rsandbox-sandbox.json"))? == Some(2),
        "this release's sandbox record has no schema_version 2"
    );
    let r = new
        .exec(&["echo", "new"], 10)
        .await
        .map_err(|s| format!("exec into the new pod: {}", s.message()))?;
    ensure!(r.exit_code == 0, "exec into the new pod: {r:?}");
    // The old pod is stopped and removed through its own (old) shim.
    old.stop_within(HANG).await?;
    old.remove_within(HANG).await?;
    new.remove().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_pod_keeps_running_across_the_upgrade() {
    let g = Guard::new();
    let bin = Installed::take();
    bin.previous();
    let dir = scratch_dir(&unique_id("upgrade-b"));
    let mut old = match SleepingPod::start(&unique_id("upgrade-b-old"), &dir).await {
        Ok(p) => p,
        Err(e) => panic!(
            "a pod on the previous release ({}): {e}\n{}",
            bin.old_version,
            log_lines("error", 20)
        ),
    };
    let mut new = None;
    let r = old_pod_across_the_upgrade(&bin, &mut old, &dir, &mut new).await;
    let mut ids = old.ids();
    if let Some(n) = &new {
        ids.extend(n.ids());
    }
    if r.is_err() {
        bin.current();
        let _ = old.remove_or_kill().await;
        if let Some(n) = &mut new {
            let _ = n.remove_or_kill().await;
        }
    }
    expect_ok(&old.id, r);
    drop(bin);
    g.assert_clean(&ids);
}
