//! The `delete` action: containerd runs it after a shim is gone (or when its connection
//! closed) with only the bundle to go on. It cleans up exactly the given ID and always
//! succeeds: whatever is already gone is fine.
//!
//! Last, it removes the shim socket a killed daemon left behind (containerd's runc shim
//! leaks it): the socket named in the bundle's `address` file (else in containerd's
//! `bootstrap.json`), only when it is one of our sockets in the shim socket directory and
//! nothing serves it any more (see [`crate::socket::remove_if_stale`]). A container's bundle
//! may name its pod's shared, live socket: that one stays.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bundle::{
    ADDRESS_FILE, BOOTSTRAP_FILE, CONFIG_FILE, ROOTFS_DIR, SHIM_PID_FILE, SOCKET_DIR,
    SOCKET_DIR_LINK, TASK_STATE_FILE,
};
use crate::reaper::Spawner;
use crate::runtime::{Runc, RuncConfig, Runtime};
use crate::socket::{Removal, own_socket_path, remove_if_stale};
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
    let mut steps = crate::timing::Steps::new(|| format!("delete {id}"));
    let pid = match crate::pod::sandbox::cleanup_from_bundle(bundle) {
        Some(pid) => pid,
        None => {
            delete_task(namespace, id, bundle);
            0
        }
    };
    steps.step("sandbox or task");
    kill_stale_shim(bundle);
    steps.step("stale daemon");
    remove_stale_socket(bundle);
    steps.step("stale socket");
    Cleaned { pid }
}

fn delete_task(namespace: &str, id: &str, bundle: &Path) {
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
    // The idmapped layers' scratch mount too: a shim that died between making it and
    // dropping it (after the overlay mount) left it, and the bundle could not be removed.
    for dir in [ROOTFS_DIR, crate::bundle::IDMAPPED_SCRATCH] {
        if let Err(e) = crate::mount::unmount(&bundle.join(dir)) {
            eprintln!("delete {id}: {e}");
        }
    }
    if let Some(net) = network
        && let Err(e) = crate::network::teardown(None, &net)
    {
        eprintln!("delete {id}: {e}");
    }
}

/// The directories our sockets may be in: the default one, and the one containerd 2.3 gave
/// `start` (recorded as the `socket-dir` link).
fn socket_dirs(bundle: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(SOCKET_DIR)];
    if let Ok(d) = std::fs::read_link(bundle.join(SOCKET_DIR_LINK))
        && d.is_absolute()
    {
        dirs.push(PathBuf::from(d.to_string_lossy().trim_end_matches('/')));
    }
    dirs
}

/// The shim address the bundle records: our `address` file, else containerd's bootstrap.json.
fn recorded_address(bundle: &Path) -> Option<String> {
    if let Ok(a) = std::fs::read_to_string(bundle.join(ADDRESS_FILE)) {
        return Some(a.trim().to_string());
    }
    let raw = std::fs::read(bundle.join(BOOTSTRAP_FILE)).ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    doc.get("address")?.as_str().map(str::to_string)
}

/// Removes the socket the bundle names if a dead shim left it (see the module doc).
fn remove_stale_socket(bundle: &Path) -> Removal {
    let Some(address) = recorded_address(bundle) else {
        return Removal::Missing;
    };
    remove_socket_of(&address, &socket_dirs(bundle))
}

fn remove_socket_of(address: &str, dirs: &[PathBuf]) -> Removal {
    let Some(path) = own_socket_path(address, dirs) else {
        return Removal::NotOurs;
    };
    let removal = remove_if_stale(&path, || std::fs::read_to_string("/proc/net/unix").ok());
    if let Removal::Failed(e) = &removal {
        eprintln!("remove stale shim socket {}: {e}", path.display());
    }
    removal
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
    let me = std::env::current_exe().ok();
    let is_our_daemon = || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        exe.is_some() && exe == me && cwd.as_deref() == Some(bundle)
    };
    if !is_our_daemon() {
        return;
    }
    // The daemon removes its socket file on a clean exit; killed, it cannot.
    let socket = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|raw| socket_of(&raw));
    let gone = crate::util::kill_and_wait(pid, is_our_daemon, Duration::from_secs(1));
    if gone && let Some(address) = socket {
        remove_socket_of(&address, &socket_dirs(bundle));
    }
}

/// The `-socket` address of a daemon's command line.
fn socket_of(cmdline: &[u8]) -> Option<String> {
    let mut args = cmdline.split(|b| *b == 0);
    while let Some(a) = args.next() {
        if a == b"-socket" {
            return std::str::from_utf8(args.next()?).ok().map(str::to_string);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "0ddfbd72d02b3551e75f3a0ed90b9965b533401be618f43a568bc522764e0ad0";

    #[test]
    fn socket_of_reads_the_daemon_flag() {
        let c = b"/x/shim\0-id\0a\0-socket\0unix:///run/containerd/s/abc\0-debug\0";
        assert_eq!(
            socket_of(c).as_deref(),
            Some("unix:///run/containerd/s/abc")
        );
        assert_eq!(socket_of(b"/x/shim\0-socket"), None);
        assert_eq!(socket_of(b"/x/shim\0-id\0x"), None);
    }

    #[test]
    fn the_address_file_wins_over_bootstrap_json() {
        let tmp = tempfile::tempdir().unwrap();
        let b = tmp.path();
        assert_eq!(recorded_address(b), None);
        std::fs::write(
            b.join(BOOTSTRAP_FILE),
            r#"{"version":3,"address":"unix:///run/containerd/s/b","protocol":"ttrpc"}"#,
        )
        .unwrap();
        assert_eq!(
            recorded_address(b).as_deref(),
            Some("unix:///run/containerd/s/b")
        );
        std::fs::write(b.join(ADDRESS_FILE), "unix:///run/containerd/s/a\n").unwrap();
        assert_eq!(
            recorded_address(b).as_deref(),
            Some("unix:///run/containerd/s/a")
        );
    }

    #[test]
    fn socket_dirs_are_the_default_and_the_recorded_link() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(socket_dirs(tmp.path()), vec![PathBuf::from(SOCKET_DIR)]);
        std::os::unix::fs::symlink("/x/s/", tmp.path().join(SOCKET_DIR_LINK)).unwrap();
        assert_eq!(
            socket_dirs(tmp.path()),
            vec![PathBuf::from(SOCKET_DIR), PathBuf::from("/x/s")]
        );
        std::fs::remove_file(tmp.path().join(SOCKET_DIR_LINK)).unwrap();
        std::os::unix::fs::symlink("rel", tmp.path().join(SOCKET_DIR_LINK)).unwrap();
        assert_eq!(socket_dirs(tmp.path()), vec![PathBuf::from(SOCKET_DIR)]);
    }

    /// A bundle whose `address` names a socket in a (temporary) 2.3 socket dir.
    fn bundle_with_socket(tmp: &Path) -> (PathBuf, PathBuf) {
        let dir = std::fs::canonicalize(tmp).unwrap().join("s");
        let bundle = tmp.join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        std::os::unix::fs::symlink(&dir, bundle.join(SOCKET_DIR_LINK)).unwrap();
        let sock = dir.join(HASH);
        std::fs::write(
            bundle.join(ADDRESS_FILE),
            format!("unix://{}", sock.display()),
        )
        .unwrap();
        (bundle, sock)
    }

    #[test]
    fn a_killed_shims_socket_is_removed_a_live_one_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, sock) = bundle_with_socket(tmp.path());
        let listener = crate::socket::bind(&sock).unwrap();
        assert_eq!(remove_stale_socket(&bundle), Removal::InUse);
        assert!(sock.exists());
        drop(listener); // kill -9 of the shim
        assert_eq!(remove_stale_socket(&bundle), Removal::Removed);
        assert!(!sock.exists());
        assert_eq!(remove_stale_socket(&bundle), Removal::Missing);
    }

    #[test]
    fn delete_removes_the_stale_socket_of_a_task_bundle() {
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, sock) = bundle_with_socket(tmp.path());
        drop(crate::socket::bind(&sock).unwrap());
        // No config.json and no state records: nothing to run runc for.
        let res = delete_from_bundle("default", "t1", &bundle);
        assert_eq!(res.pid, 0);
        assert!(!sock.exists());
    }

    #[test]
    fn paths_outside_the_socket_dirs_are_never_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        // A stale socket, but in no socket dir of this bundle.
        let elsewhere = dir.join(HASH);
        drop(crate::socket::bind(&elsewhere).unwrap());
        let bundle = dir.join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        std::fs::write(
            bundle.join(ADDRESS_FILE),
            format!("unix://{}", elsewhere.display()),
        )
        .unwrap();
        assert_eq!(remove_stale_socket(&bundle), Removal::NotOurs);
        // ...nor through dot-dot from an allowed dir.
        std::fs::create_dir(dir.join("s")).unwrap();
        std::os::unix::fs::symlink(dir.join("s"), bundle.join(SOCKET_DIR_LINK)).unwrap();
        std::fs::write(
            bundle.join(ADDRESS_FILE),
            format!("unix://{}/s/../{HASH}", dir.display()),
        )
        .unwrap();
        assert_eq!(remove_stale_socket(&bundle), Removal::NotOurs);
        assert!(elsewhere.exists());
    }
}
