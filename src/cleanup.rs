//! The `delete` action: containerd runs it after a shim is gone (or when its connection
//! closed) with only the bundle to go on. It cleans up exactly the given ID and always
//! succeeds: whatever is already gone is fine.

use std::path::Path;
use std::time::Duration;

use crate::reaper::Spawner;
use crate::runtime::{Runc, RuncConfig, Runtime};
use crate::task::{TASK_STATE_FILE, TaskRecord};

/// What `delete` found.
#[derive(Debug, Default)]
pub struct Cleaned {
    pub pid: u32,
}

/// Cleans up task or sandbox `id` from `bundle`.
pub fn delete_from_bundle(namespace: &str, id: &str, bundle: &Path) -> Cleaned {
    if crate::validate::id("id", id).is_err() {
        return Cleaned::default();
    }
    if let Some(pid) = crate::pod::sandbox::cleanup_from_bundle(bundle) {
        kill_stale_shim(bundle);
        return Cleaned { pid };
    }
    let record: Option<TaskRecord> = std::fs::read(bundle.join(TASK_STATE_FILE))
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok());
    let network = record.as_ref().and_then(|r| r.network.clone());
    let runc = record
        .map(|r| r.runc)
        .unwrap_or_else(|| RuncConfig::defaults(namespace));
    // Only tasks have runc state; a sandbox ID is simply not found by runc.
    if bundle.join("config.json").exists() || bundle.join(TASK_STATE_FILE).exists() {
        let rt = Runc::new(runc, Spawner::direct(), std::env::temp_dir());
        if let Err(e) = rt.delete(id, true)
            && e.kind() != crate::error::Kind::NotFound
        {
            eprintln!("delete {id}: {e}");
        }
    }
    if let Err(e) = crate::mount::unmount(&bundle.join("rootfs")) {
        eprintln!("delete {id}: {e}");
    }
    if let Some(net) = network
        && let Err(e) = crate::network::teardown_with(
            &net,
            std::sync::Arc::new(crate::network::SpawnerExec(Spawner::direct())),
        )
    {
        eprintln!("delete {id}: {e}");
    }
    kill_stale_shim(bundle);
    Cleaned::default()
}

/// If the daemon recorded in `shim.pid` still runs (a hung shim), kill it; `delete` must leave
/// nothing behind. The pid is trusted only while it still runs our own binary.
fn kill_stale_shim(bundle: &Path) {
    let Ok(s) = std::fs::read_to_string(bundle.join("shim.pid")) else {
        return;
    };
    let Ok(pid) = s.trim().parse::<i32>() else {
        return;
    };
    if pid <= 1 || pid == std::process::id() as i32 {
        return;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let me = std::env::current_exe().ok();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    if exe.is_none() || exe != me || cwd.as_deref() != Some(bundle) {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    for _ in 0..100 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
