//! The `delete` action: containerd runs it after a shim is gone (or when its connection
//! closed) with only the bundle to go on. It cleans up exactly the given ID and always
//! succeeds: whatever is already gone is fine.

use std::path::Path;
use std::time::Duration;

use crate::bundle::{CONFIG_FILE, ROOTFS_DIR, SHIM_PID_FILE, SOCKET_DIR, TASK_STATE_FILE};
use crate::reaper::Spawner;
use crate::runtime::{Runc, RuncConfig, Runtime};
use crate::task::TaskRecord;

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
    if bundle.join(CONFIG_FILE).exists() || bundle.join(TASK_STATE_FILE).exists() {
        let rt = Runc::new(runc, Spawner::direct(), std::env::temp_dir());
        if let Err(e) = rt.delete(id, true)
            && e.kind() != crate::error::Kind::NotFound
        {
            eprintln!("delete {id}: {e}");
        }
    }
    if let Err(e) = crate::mount::unmount(&bundle.join(ROOTFS_DIR)) {
        eprintln!("delete {id}: {e}");
    }
    if let Some(net) = network
        && let Err(e) = crate::network::teardown(None, &net)
    {
        eprintln!("delete {id}: {e}");
    }
    kill_stale_shim(bundle);
    Cleaned::default()
}

/// If the daemon recorded in `shim.pid` still runs (a hung shim), kill it; `delete` must leave
/// nothing behind. The pid is trusted only while it still runs our own binary.
fn kill_stale_shim(bundle: &Path) {
    let Ok(s) = std::fs::read_to_string(bundle.join(SHIM_PID_FILE)) else {
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
    // The daemon removes its socket file on a clean exit; killed, it cannot.
    let socket = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|raw| socket_of(&raw));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let mut gone = false;
    for _ in 0..100 {
        // Dead is enough: a zombie waits for its new parent (init) to reap it.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.chars().next()));
        if matches!(state, None | Some(Some('Z')) | Some(Some('X'))) {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if gone && let Some(path) = socket {
        let _ = std::fs::remove_file(path);
    }
}

/// The `-socket unix://PATH` of a daemon's command line, if PATH is in the shim socket dir.
fn socket_of(cmdline: &[u8]) -> Option<std::path::PathBuf> {
    let mut args = cmdline.split(|b| *b == 0);
    while let Some(a) = args.next() {
        if a == b"-socket" {
            let v = std::str::from_utf8(args.next()?).ok()?;
            let p = Path::new(v.trim_start_matches("unix://"));
            let in_dir = p.parent() == Some(Path::new(SOCKET_DIR));
            return in_dir.then(|| p.to_path_buf());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::socket_of;

    #[test]
    fn socket_of_reads_the_daemon_flag() {
        let c = b"/x/shim\0-id\0a\0-socket\0unix:///run/containerd/s/abc\0-debug\0";
        assert_eq!(
            socket_of(c).as_deref(),
            Some(std::path::Path::new("/run/containerd/s/abc"))
        );
        assert_eq!(socket_of(b"/x/shim\0-socket\0unix:///etc/passwd\0"), None);
        assert_eq!(socket_of(b"/x/shim\0-socket"), None);
    }
}
