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
use crate::reclaim::{Member, reclaim};
use crate::runtime::RuncConfig;
use crate::socket::{Removal, own_socket_path, remove_if_stale};
use crate::task::TaskRecord;
use crate::timing::Budget;

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
    let budget = Budget::new(DELETE_BUDGET);
    // A hung daemon first: alive, it could still record and `runc create` a container after
    // the clean-up below has listed the pod's, and that one would run on with nobody to reap it.
    kill_stale_shim(bundle, &budget);
    steps.step("stale daemon");
    let pid = match crate::pod::sandbox::cleanup_from_bundle(namespace, id, bundle, &budget) {
        Some(pid) => pid,
        None => {
            delete_task(namespace, id, bundle, &budget);
            0
        }
    };
    steps.step("sandbox or task");
    remove_stale_socket(bundle);
    steps.step("stale socket");
    Cleaned { pid }
}

/// containerd gives `delete` 5 s (`io.containerd.timeout.shim.cleanup`) and kills it then:
/// every wait of it shares this budget, a little under that, so that one slow step (a shim
/// slow to die, a stuck runc) leaves the later ones less time, not none.
const DELETE_BUDGET: Duration = Duration::from_millis(4500);

fn delete_task(namespace: &str, id: &str, bundle: &Path, budget: &Budget) {
    // Any release's record (crate::state_file): a task of an older shim is cleaned up too.
    let record: Option<TaskRecord> = std::fs::read(bundle.join(TASK_STATE_FILE))
        .ok()
        .and_then(|raw| {
            crate::state_file::decode(&crate::state_file::TASK_RECORD, &raw)
                .inspect_err(|e| eprintln!("delete {id}: {e}: not used"))
                .ok()
        })
        .map(|d| d.record);
    let network = record.as_ref().and_then(|r| r.network.clone());
    let runc = record
        .map(|r| r.runc)
        .unwrap_or_else(|| RuncConfig::defaults(namespace));
    // Only tasks have runc state; a sandbox ID is simply not found by runc.
    if bundle.join(CONFIG_FILE).exists() || bundle.join(TASK_STATE_FILE).exists() {
        let member = Member {
            id: id.to_string(),
            bundle: Some(bundle.to_path_buf()),
            runc,
            cgroups_path: cgroups_path_of(bundle),
        };
        for p in reclaim(&member, budget) {
            eprintln!("delete {id}: {p}");
        }
    } else {
        // The idmapped layers' scratch mount too: a shim that died between making it and
        // dropping it (after the overlay mount) left it, and the bundle could not be removed.
        for dir in [ROOTFS_DIR, crate::bundle::IDMAPPED_SCRATCH] {
            if let Err(e) = crate::mount::unmount(&bundle.join(dir)) {
                eprintln!("delete {id}: {e}");
            }
        }
    }
    if let Some(net) = network
        && let Err(e) = crate::network::teardown_within(&net, budget)
    {
        eprintln!("delete {id}: {e}");
    }
}

/// `linux.cgroupsPath` of the bundle's spec.
fn cgroups_path_of(bundle: &Path) -> Option<String> {
    let raw = std::fs::read(bundle.join(CONFIG_FILE)).ok()?;
    crate::oci::cgroups_path(&serde_json::from_slice(&raw).ok()?)
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

/// How long `delete` waits for a daemon it killed, or one still dying, to be gone: a SIGKILLed
/// process exits as soon as each of its threads runs, which a loaded machine may delay by
/// seconds; until then its socket is live and must not be removed.
const SHIM_EXIT_WAIT: Duration = Duration::from_secs(10);

/// If the daemon recorded in `shim.pid` still runs (a hung shim), kill it; if it is dying (a
/// killed shim whose main thread has exited while others still hold its socket), wait for it.
/// `delete` must leave nothing behind: neither a live shim nor the socket of a dead one. The
/// pid is trusted for a kill only while it still runs our own binary.
fn kill_stale_shim(bundle: &Path, budget: &Budget) {
    let Ok(s) = std::fs::read_to_string(bundle.join(SHIM_PID_FILE)) else {
        return;
    };
    let Ok(pid) = s.trim().parse::<i32>() else {
        return;
    };
    if pid <= 1 || pid == std::process::id() as i32 {
        return;
    }
    let me = std::env::current_exe().ok().map(|p| without_deleted(&p));
    // The daemon's working directory is the bundle as the kernel resolved it; containerd may
    // name it through a link (/var/run -> /run).
    let bundle = std::fs::canonicalize(bundle).unwrap_or_else(|_| bundle.to_path_buf());
    let is_our_daemon = || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| without_deleted(&p));
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        exe.is_some() && exe == me && cwd.as_deref() == Some(bundle.as_path())
    };
    if !is_our_daemon() {
        // A zombie main thread has no exe or cwd to check; the other threads of a killed
        // daemon may still be exiting, its socket still open: the socket removal that follows
        // must see it refused, not live. (A recycled pid that is some other zombie costs a
        // wait, never a signal.)
        if main_thread_exited(pid) {
            crate::util::wait_for_exit(pid, budget.bound(SHIM_EXIT_WAIT));
        }
        return;
    }
    // The daemon removes its socket file on a clean exit; killed, it cannot.
    let socket = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|raw| socket_of(&raw));
    let gone = crate::util::kill_and_wait(pid, is_our_daemon, budget.bound(SHIM_EXIT_WAIT));
    if gone && let Some(address) = socket {
        remove_socket_of(&address, &socket_dirs(&bundle));
    }
}

/// `exe` without the ` (deleted)` the kernel appends to the link of a binary replaced since
/// the process started it (a shim upgraded under its running daemons is still that daemon).
fn without_deleted(exe: &Path) -> PathBuf {
    let s = exe.as_os_str().as_encoded_bytes();
    match s.strip_suffix(b" (deleted)") {
        // SAFETY: cut at an ASCII boundary of bytes that came from an OsStr.
        Some(cut) => PathBuf::from(unsafe { std::ffi::OsStr::from_encoded_bytes_unchecked(cut) }),
        None => exe.to_path_buf(),
    }
}

/// Whether `pid`'s main thread is a zombie (state `Z` or `X` in /proc/<pid>/stat).
fn main_thread_exited(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .map(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
        })
        .unwrap_or(false)
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
    use crate::pod::sandbox::SandboxRecord;
    use crate::state_file::{self, Decoded, SANDBOX_RECORD, TASK_RECORD};

    /// Files the previous release (0.1.0, 148d184) wrote, taken from a real run of its binary
    /// on the bench (a CRI pod with one container; integration/tests/upgrade.rs makes the same
    /// pod): no schema version. `delete` reads them as version 0 with every field.
    #[test]
    fn records_of_the_previous_release_load_as_version_0() {
        let raw = include_bytes!("testdata/state-0.1.0/rsandbox-sandbox.json");
        let d: Decoded<SandboxRecord> = state_file::decode(&SANDBOX_RECORD, raw).unwrap();
        assert_eq!(d.version, 0);
        let r = d.record;
        assert_eq!(
            r.id,
            "229c52c2fd69c5ce31a1bbcf0727f7c3105a937e06c7cd3b5d30c28781c64263"
        );
        assert_eq!((r.pause_pid, r.pause_start_ticks), (9911, 376659));
        assert!(r.shm.unwrap().ends_with("shm"));
        assert_eq!(r.members.len(), 1);
        let m = &r.members[0];
        assert_eq!(m.runc.root, PathBuf::from("/run/containerd/runc/k8s.io"));
        assert_eq!(
            m.cgroups_path.as_deref(),
            Some("/k8s.io/3e279dea6dfff2cc13bf7da5d1118fe5717ec2ac91cc4eda4669b17770cbbdd0")
        );

        let raw = include_bytes!("testdata/state-0.1.0/rsandbox-task.json");
        let d: Decoded<TaskRecord> = state_file::decode(&TASK_RECORD, raw).unwrap();
        assert_eq!(d.version, 0);
        assert_eq!(d.record.id, m.id);
        assert!(d.record.rootfs_mounted && d.record.network.is_none());
        assert_eq!(d.record.runc, m.runc);
    }

    /// What this release writes, the previous release reads: the same fields (it ignores
    /// `schema_version`, as serde ignores any unknown key), so a downgrade's `delete` works.
    #[test]
    fn records_of_this_release_load_in_the_previous_one() {
        let raw = include_bytes!("testdata/state-0.1.0/rsandbox-sandbox.json");
        let old: SandboxRecord = serde_json::from_slice(raw).unwrap();
        let new = state_file::encode(&SANDBOX_RECORD, &old).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&new).unwrap();
        assert_eq!(v["schema_version"], 1);
        // The previous release's reader: plain serde of the same struct.
        let back: SandboxRecord = serde_json::from_slice(&new).unwrap();
        assert_eq!(back, old);
        let raw = include_bytes!("testdata/state-0.1.0/rsandbox-task.json");
        let old: TaskRecord = serde_json::from_slice(raw).unwrap();
        let new = state_file::encode(&TASK_RECORD, &old).unwrap();
        assert_eq!(serde_json::from_slice::<TaskRecord>(&new).unwrap(), old);
    }

    const HASH: &str = "0ddfbd72d02b3551e75f3a0ed90b9965b533401be618f43a568bc522764e0ad0";

    #[test]
    fn a_replaced_binary_is_still_the_daemon_s() {
        assert_eq!(
            without_deleted(Path::new("/usr/bin/containerd-shim-rsandbox-v1 (deleted)")),
            Path::new("/usr/bin/containerd-shim-rsandbox-v1")
        );
        assert_eq!(
            without_deleted(Path::new("/usr/bin/x")),
            Path::new("/usr/bin/x")
        );
    }

    /// Not a test of its own: the stand-in daemon of the test below, which runs this binary
    /// with `RSANDBOX_TEST_STAND_IN` set (then it sleeps until killed).
    #[test]
    fn stand_in_daemon() {
        if std::env::var_os("RSANDBOX_TEST_STAND_IN").is_some() {
            std::thread::sleep(Duration::from_secs(600));
        }
    }

    /// A hung daemon is killed also when containerd names its bundle through a link: the
    /// daemon's working directory reads as the resolved path.
    #[test]
    fn a_hung_daemon_is_killed_when_its_bundle_is_named_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cleanup::tests::stand_in_daemon",
                "--test-threads=1",
            ])
            .env("RSANDBOX_TEST_STAND_IN", "1")
            .current_dir(&real)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        std::fs::write(link.join(SHIM_PID_FILE), pid.to_string()).unwrap();
        // It runs the test binary in the bundle (the exec is done once its cwd reads so).
        let me = std::env::current_exe().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::fs::read_link(format!("/proc/{pid}/exe")).ok().as_ref() != Some(&me)
            || std::fs::read_link(format!("/proc/{pid}/cwd")).ok().as_ref()
                != std::fs::canonicalize(&real).ok().as_ref()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the stand-in never ran"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        kill_stale_shim(&link, &Budget::new(Duration::from_secs(60)));
        let status = child.try_wait().unwrap();
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(status.is_some(), "the hung daemon was left running");
    }

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
        assert_eq!(
            until_not_in_use(|| remove_stale_socket(&bundle)),
            Removal::Removed
        );
        assert!(!sock.exists());
        assert_eq!(remove_stale_socket(&bundle), Removal::Missing);
    }

    #[test]
    fn delete_removes_the_stale_socket_of_a_task_bundle() {
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, sock) = bundle_with_socket(tmp.path());
        drop(crate::socket::bind(&sock).unwrap());
        // No config.json and no state records: nothing to run runc for.
        until_not_in_use(|| {
            let res = delete_from_bundle("default", "t1", &bundle);
            assert_eq!(res.pid, 0);
            if sock.exists() {
                Removal::InUse
            } else {
                Removal::Removed
            }
        });
        assert!(!sock.exists());
    }

    /// Calls `f` until it finds the socket not in use (60 s, a hang). A socket this test
    /// closed may still be open for a moment in a process another test of this binary forked
    /// meanwhile (a fork copies every descriptor until its exec; one test's child keeps them a
    /// second): that is another holder, which `delete` rightly leaves alone while it lasts.
    fn until_not_in_use(mut f: impl FnMut() -> Removal) -> Removal {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = f();
            if r != Removal::InUse || std::time::Instant::now() >= deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Issue 20: a SIGKILLed daemon's main thread is a zombie (no exe, no cwd in /proc) while
    /// its other threads, not yet run on a loaded machine, still hold its socket. `delete` ran
    /// then found the socket live and left it; nobody removed it after the threads were gone.
    #[test]
    fn delete_waits_for_a_killed_shim_whose_threads_are_still_exiting() {
        use nix::unistd::ForkResult;
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, sock) = bundle_with_socket(tmp.path());
        let listener = crate::socket::bind(&sock).unwrap();
        // SAFETY: the child only starts a thread and ends its own; it never returns into the
        // test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            ForkResult::Child => {
                let _holder = std::thread::spawn(move || {
                    let _socket = listener;
                    std::thread::sleep(Duration::from_secs(1));
                    // SAFETY: ends the whole child process.
                    unsafe { libc::_exit(0) }
                });
                // SAFETY: exit(2) ends only this (the main) thread; the holder goes on.
                unsafe { libc::syscall(libc::SYS_exit, 0) };
                unreachable!("exit(2) returned");
            }
            ForkResult::Parent { child } => {
                drop(listener);
                std::fs::write(bundle.join(SHIM_PID_FILE), child.to_string()).unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while !main_thread_exited(child.as_raw()) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no zombie main thread"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert!(
                    matches!(crate::socket::probe(&sock), crate::socket::Probe::Live),
                    "the dying daemon still serves its socket"
                );
                delete_from_bundle("default", "t1", &bundle);
                let _ = nix::sys::wait::waitpid(child, None);
                assert!(!sock.exists(), "delete left the socket of a dying shim");
            }
        }
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
