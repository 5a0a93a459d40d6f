//! The `delete` action: containerd runs it after a shim is gone (or when its connection
//! closed) with only the bundle to go on. It cleans up exactly the given ID and always
//! succeeds: whatever is already gone is fine.
//!
//! Last, it removes the shim socket a killed daemon left behind (containerd's runc shim
//! leaks it): the socket named in the bundle's `address` file (else in containerd's
//! `bootstrap.json`), only when it is one of our sockets in the shim socket directory and
//! nothing serves it any more (see [`crate::shim::socket::remove_if_stale`]). A container's bundle
//! may name its pod's shared, live socket: that one stays.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::reclaim::{Member, reclaim_all};
use crate::host::runtime::RuncConfig;
use crate::records::bundle::{
    ADDRESS_FILE, BOOTSTRAP_FILE, CONFIG_FILE, ROOTFS_DIR, SHIM_PID_FILE, SOCKET_DIR,
    SOCKET_DIR_LINK, TASK_STATE_FILE,
};
use crate::shim::socket::{Removal, own_socket_path, remove_if_stale};
use crate::shim::timing::{Budget, Undone};
use crate::task::TaskRecord;

/// What `delete` found.
#[derive(Debug, Default)]
pub struct Cleaned {
    pub pid: u32,
}

/// Cleans up task or sandbox `id` from `bundle`, by [`DELETE_BUDGET`], and reports what it
/// could not do (see [`report`]). For the `delete` process, which exits right after: when the
/// deadline cut steps off, the bundle's lock is held until then (`BundleLock::keep_until_exit`).
pub fn delete_from_bundle(namespace: &str, id: &str, bundle: &Path) -> Cleaned {
    if crate::records::validate::id("id", id).is_err() {
        return Cleaned::default();
    }
    let (cleaned, undone) = delete_within(namespace, id, bundle, &Budget::new(DELETE_BUDGET));
    report(id, &undone);
    cleaned
}

/// [`delete_from_bundle`] within `budget`, returning what it left undone.
fn delete_within(namespace: &str, id: &str, bundle: &Path, budget: &Budget) -> (Cleaned, Undone) {
    let budget = *budget;
    let mut steps = crate::shim::timing::Steps::new(|| format!("delete {id}"));
    let mut undone = Undone::default();
    let Some(lock) = lock_bundle(bundle, &budget) else {
        undone.cut_off("all of it: another delete of this bundle still runs");
        return (Cleaned::default(), undone);
    };
    steps.step("bundle lock");
    // A hung daemon first: alive, it could still record and `runc create` a container after
    // the clean-up below has listed the pod's. At most its share: once it is SIGKILLed it runs
    // no more code of its own, and waiting longer for its exit here would take the time of
    // the pod's containers and network (the socket's removal at the end waits for the rest).
    // The usual case needs no thread: the daemon answered ShutdownSandbox and exited before
    // containerd ran `delete` (its pid is gone or a zombie, which the socket step below waits
    // for). Only a daemon that still runs gets the watched thread that may kill it.
    if recorded_daemon_runs(bundle) {
        let stale = budget.at_most(STALE_SHIM_SHARE);
        let b = bundle.to_path_buf();
        if stale
            .run("rsandbox-stale", move || kill_stale_shim(&b, &stale))
            .is_none()
        {
            undone.cut_off("the stale shim daemon's exit");
        }
    }
    steps.step("stale daemon");
    let pid = match crate::pod::sandbox::delete::cleanup_from_bundle(
        namespace,
        id,
        bundle,
        &budget,
        &mut undone,
    ) {
        Some(pid) => pid,
        None => {
            delete_task(namespace, id, bundle, &budget, &mut undone);
            0
        }
    };
    steps.step("sandbox or task");
    // A killed daemon that a busy machine has not let exit yet (its share above was short)
    // still holds its socket, which can go only once it has: it gets what is left.
    if let Some(pid) = exiting_daemon(bundle) {
        crate::shim::util::wait_for_exit(pid, budget.left());
    }
    remove_stale_socket(bundle);
    steps.step("stale socket");
    // A step the deadline cut off may still be at work on its watched thread. (`Undone` does
    // not tell those from steps never begun; keeping the lock a few ms longer costs nothing.)
    if !undone.cut_off.is_empty() {
        lock.keep_until_exit();
    }
    (Cleaned { pid }, undone)
}

/// A bundle's delete lock, held until dropped (see [`lock_bundle`]).
enum BundleLock {
    /// The bundle directory, locked (closing it unlocks).
    Held {
        _dir: std::fs::File,
    },
    NoBundle,
}

impl BundleLock {
    /// Holds the lock until the process exits, by leaking its descriptor on purpose. For a
    /// `delete` whose deadline cut steps off: their threads ([`Budget::run`], the members'
    /// take-downs) go on killing, unmounting or DELing for the bundle until the process ends,
    /// and a lock dropped when `delete_within` returns would let a second `delete` of the
    /// bundle (containerd runs one again) run beside them meanwhile. The `delete` process
    /// ends right after (`cli`: its reply, then exit), and the exit closes the descriptor;
    /// it is close-on-exec, so no helper started meanwhile keeps it.
    fn keep_until_exit(self) {
        if let BundleLock::Held { _dir: dir } = self {
            let _leaked = std::os::fd::IntoRawFd::into_raw_fd(dir);
        }
    }
}

/// Takes `bundle`'s delete lock (`flock` on the bundle directory), waiting for it at most
/// until the end of `budget`. Two `delete`s of one bundle can run at once: the first kills a
/// hung daemon, and containerd, seeing that daemon's connection close, runs `delete` again.
/// Both would then kill, unmount and DEL the same things (a CNI plugin's DEL racing another's
/// fails: "failed to delete eth0: no such device", and then releases nothing); the second one
/// waits, and finds the work done. `None` when the lock did not come in time. A bundle that
/// cannot be opened needs no lock: there is nothing in it to clean up.
fn lock_bundle(bundle: &Path, budget: &Budget) -> Option<BundleLock> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(dir) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(bundle)
    else {
        return Some(BundleLock::NoBundle);
    };
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Some(BundleLock::Held { _dir: dir });
        }
        if budget.is_spent() {
            return None;
        }
        std::thread::sleep(budget.bound(Duration::from_millis(20)));
    }
}

/// containerd gives `delete` 5 s (`io.containerd.timeout.shim.cleanup`) and kills it then.
/// This is a hard deadline a little under that: every step is bounded by what is left of it,
/// the steps that can hang run on threads watched only until it ends, and at the deadline
/// `delete` stops and reports what it left rather than being killed in the middle of a step
/// (the network's above all: its veth, IP lease and netns would leak). The ~1 s to spare is
/// for starting and ending the process on a busy machine.
pub const DELETE_BUDGET: Duration = Duration::from_millis(4000);

/// What the stale daemon's exit may take of [`DELETE_BUDGET`].
const STALE_SHIM_SHARE: Duration = Duration::from_secs(1);

/// Says what `delete` could not do: each line on stderr (containerd logs it as "cleanup
/// warnings") and in the shim log (with `-debug`: the daemon's log fifo, see `cli`).
fn report(id: &str, undone: &Undone) {
    for line in undone.lines(DELETE_BUDGET) {
        eprintln!("delete {id}: {line}");
        log::warn!("delete {id}: {line}");
    }
}

fn delete_task(namespace: &str, id: &str, bundle: &Path, budget: &Budget, undone: &mut Undone) {
    // Any release's record (crate::records::state_file): a task of an older shim is cleaned up too.
    let record: Option<TaskRecord> = std::fs::read(bundle.join(TASK_STATE_FILE))
        .ok()
        .and_then(|raw| {
            crate::records::state_file::decode(&crate::records::state_file::TASK_RECORD, &raw)
                .inspect_err(|e| eprintln!("delete {id}: {e}: not used"))
                .ok()
        })
        .map(|d| d.record);
    let network = record.as_ref().and_then(|r| r.network.clone());
    let cgroups_at_create = record.as_ref().and_then(|r| r.cgroups_at_create.clone());
    let runc = record
        .map(|r| r.runc)
        .unwrap_or_else(|| RuncConfig::defaults(namespace));
    // The network keeps its share of the budget whatever the container takes.
    let reserve = if network.is_some() {
        crate::host::network::DELETE_SHARE
    } else {
        Duration::ZERO
    };
    // Only tasks have runc state; a sandbox ID is simply not found by runc.
    if bundle.join(CONFIG_FILE).exists() || bundle.join(TASK_STATE_FILE).exists() {
        let member = Member {
            id: id.to_string(),
            bundle: Some(bundle.to_path_buf()),
            runc,
            cgroups_path: cgroups_path_of(bundle),
            cgroups_at_create,
        };
        reclaim_all(&[member], &budget.before(reserve), undone);
    } else {
        // The idmapped layers' scratch mount too: a shim that died between making it and
        // dropping it (after the overlay mount) left it, and the bundle could not be removed.
        for dir in [ROOTFS_DIR, crate::records::bundle::IDMAPPED_SCRATCH] {
            if let Err(e) = crate::host::mount::unmount(&bundle.join(dir)) {
                undone.failed(e.to_string());
            }
        }
    }
    if let Some(net) = network {
        crate::host::network::teardown_in_delete(net, budget, undone);
    }
}

/// `linux.cgroupsPath` of the bundle's spec.
fn cgroups_path_of(bundle: &Path) -> Option<String> {
    let raw = std::fs::read(bundle.join(CONFIG_FILE)).ok()?;
    crate::records::oci::cgroups_path(&serde_json::from_slice(&raw).ok()?)
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
    let Some(pid) = recorded_daemon(bundle) else {
        return;
    };
    // The daemon's working directory is the bundle as the kernel resolved it; containerd may
    // name it through a link (/var/run -> /run).
    let bundle = std::fs::canonicalize(bundle).unwrap_or_else(|_| bundle.to_path_buf());
    let is_our_daemon = || is_our_daemon(pid, &bundle);
    if !is_our_daemon() {
        // A zombie main thread has no exe or cwd to check; the other threads of a killed
        // daemon may still be exiting, its socket still open: the socket removal that follows
        // must see it refused, not live. (A recycled pid that is some other zombie costs a
        // wait, never a signal.)
        if main_thread_exited(pid) {
            crate::shim::util::wait_for_exit(pid, budget.bound(SHIM_EXIT_WAIT));
        }
        return;
    }
    // The daemon removes its socket file on a clean exit; killed, it cannot.
    let socket = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|raw| socket_of(&raw));
    let gone = crate::shim::util::kill_and_wait(pid, is_our_daemon, budget.bound(SHIM_EXIT_WAIT));
    if gone && let Some(address) = socket {
        remove_socket_of(&address, &socket_dirs(&bundle));
    }
}

/// The daemon pid `shim.pid` records (not ours, not init).
fn recorded_daemon(bundle: &Path) -> Option<i32> {
    let pid = std::fs::read_to_string(bundle.join(SHIM_PID_FILE))
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()?;
    (pid > 1 && pid != std::process::id() as i32).then_some(pid)
}

/// Whether the daemon `shim.pid` records may still run code: its pid names a process whose
/// main thread has not exited (it may be another process that took the pid:
/// [`kill_stale_shim`] checks). Reads only the pid file and `/proc/<pid>/stat`, which do not
/// wait on the process.
fn recorded_daemon_runs(bundle: &Path) -> bool {
    recorded_daemon(bundle).is_some_and(
        |pid| matches!(process_state(pid), Some(state) if state != 'Z' && state != 'X'),
    )
}

/// Whether `pid` runs our binary (also once replaced under it) in `bundle` (resolved).
fn is_our_daemon(pid: i32, bundle: &Path) -> bool {
    let me = std::env::current_exe().ok().map(|p| without_deleted(&p));
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| without_deleted(&p));
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    exe.is_some() && exe == me && cwd.as_deref() == Some(bundle)
}

/// The recorded daemon if it is still exiting: killed (by [`kill_stale_shim`], or before)
/// but still running our binary in the bundle, or its main thread a zombie whose other
/// threads may still hold its socket.
fn exiting_daemon(bundle: &Path) -> Option<i32> {
    let pid = recorded_daemon(bundle)?;
    // The zombie (a daemon that exited after its Shutdown reply) first: no path to resolve.
    let exiting = main_thread_exited(pid) || {
        let bundle = std::fs::canonicalize(bundle).unwrap_or_else(|_| bundle.to_path_buf());
        is_our_daemon(pid, &bundle)
    };
    exiting.then_some(pid)
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
    matches!(process_state(pid), Some('Z' | 'X'))
}

/// The state letter of `pid`'s main thread in /proc/<pid>/stat; `None` without such a process.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
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
    use crate::records::state_file::{self, Decoded, SANDBOX_RECORD, TASK_RECORD};

    /// Files the previous release (0.1.0, 148d184) wrote, taken from a real run of its binary
    /// on the bench (a CRI pod with one container; integration/tests/upgrade.rs makes the same
    /// pod): no schema version. `delete` reads them as version 0 with every field.
    #[test]
    fn records_of_the_previous_release_load_as_version_0() {
        let raw = include_bytes!("../testdata/state-0.1.0/rsandbox-sandbox.json");
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

        let raw = include_bytes!("../testdata/state-0.1.0/rsandbox-task.json");
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
        let raw = include_bytes!("../testdata/state-0.1.0/rsandbox-sandbox.json");
        let old: SandboxRecord = serde_json::from_slice(raw).unwrap();
        let new = state_file::encode(&SANDBOX_RECORD, &old).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&new).unwrap();
        assert_eq!(v["schema_version"], SANDBOX_RECORD.version);
        // The previous release's reader: plain serde of the same struct.
        let back: SandboxRecord = serde_json::from_slice(&new).unwrap();
        assert_eq!(back, old);
        let raw = include_bytes!("../testdata/state-0.1.0/rsandbox-task.json");
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

    /// `delete` starts its watched kill thread only for a recorded daemon that still runs
    /// code: not for a missing pid file, a zombie (a daemon that exited after its Shutdown
    /// reply and is not reaped yet) or a reaped pid.
    #[test]
    fn only_a_recorded_daemon_that_still_runs_needs_the_kill_thread() {
        let bundle = tempfile::tempdir().unwrap();
        assert!(!recorded_daemon_runs(bundle.path()), "no shim.pid");
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        std::fs::write(bundle.path().join(SHIM_PID_FILE), pid.to_string()).unwrap();
        assert!(recorded_daemon_runs(bundle.path()), "a running daemon");
        // SAFETY: kill(2) of our own child; no memory is passed.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        // Not reaped: a zombie, whose main thread has exited.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !main_thread_exited(pid) {
            assert!(std::time::Instant::now() < deadline, "{pid} never exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!recorded_daemon_runs(bundle.path()), "a zombie");
        child.wait().unwrap();
        assert!(!recorded_daemon_runs(bundle.path()), "a reaped pid");
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
                "cli::cleanup::tests::stand_in_daemon",
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
        let listener = crate::shim::socket::bind(&sock).unwrap();
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
        drop(crate::shim::socket::bind(&sock).unwrap());
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
        let listener = crate::shim::socket::bind(&sock).unwrap();
        // SAFETY: the child only starts a thread and ends its own; it never returns into the
        // test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            ForkResult::Child => {
                let _holder = std::thread::spawn(move || {
                    let _socket = listener;
                    // Longer than the stale daemon's share of `delete`: the wait for it goes
                    // on before the socket's removal.
                    std::thread::sleep(STALE_SHIM_SHARE * 2);
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
                    matches!(
                        crate::shim::socket::probe(&sock),
                        crate::shim::socket::Probe::Live
                    ),
                    "the dying daemon still serves its socket"
                );
                delete_from_bundle("default", "t1", &bundle);
                let _ = nix::sys::wait::waitpid(child, None);
                assert!(!sock.exists(), "delete left the socket of a dying shim");
            }
        }
    }

    /// Issue 27 item 3, the task path: a standalone task with the shim's network, whose
    /// `runc delete` hangs and whose network's first-DELed plugin hangs. `delete` ends by its
    /// deadline, the plugin after the hung one still runs, the netns goes, and what was left
    /// is named: the container's runc and the plugin.
    #[test]
    #[ignore = "needs root"]
    fn delete_of_a_task_ends_by_its_deadline_and_its_network_goes() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, bin, conf) = (
            tmp.path().join("bundle"),
            tmp.path().join("bin"),
            tmp.path().join("conf"),
        );
        for d in [&bundle, &bin, &conf] {
            std::fs::create_dir_all(d).unwrap();
        }
        let ran = tmp.path().join("note-ran");
        for (name, body) in [
            ("runc", "exec sleep 600".to_string()),
            ("hang", "exec sleep 600".to_string()),
            (
                "note",
                format!("echo \"$CNI_COMMAND\" >> {}", ran.display()),
            ),
        ] {
            let p = bin.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(
            conf.join("10-net.conflist"),
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"note"},{"type":"hang"}]}"#,
        )
        .unwrap();
        let netns = tmp.path().join("netns");
        std::fs::write(&netns, "").unwrap();
        let record = TaskRecord {
            id: "t1".into(),
            runc: RuncConfig {
                binary: bin.join("runc").display().to_string(),
                root: tmp.path().join("runc-root"),
                ..RuncConfig::defaults("ns")
            },
            rootfs_mounted: false,
            network: Some(crate::host::network::NetworkRecord {
                netns: netns.clone(),
                container_id: "t1".into(),
                ifname: "eth0".into(),
                conf_dir: conf,
                bin_dirs: vec![bin],
                cache_dir: tmp.path().join("cache"),
                timeout_seconds: 600,
                pod: None,
                ips: vec![],
                loopback_only: false,
                result: None,
            }),
            cgroups_at_create: None,
        };
        write_task_record(&bundle, &record);
        let start = std::time::Instant::now();
        let (_, undone) = delete_within("ns", "t1", &bundle, &Budget::new(DELETE_BUDGET));
        let took = start.elapsed();
        println!("delete took {took:?}: {undone:?}");
        // Only a hang takes a minute (the runc's own timeout alone is 4 s, the plugin's 600).
        assert!(took < Duration::from_secs(60), "{took:?}");
        let all: Vec<&String> = undone.failed.iter().chain(&undone.cut_off).collect();
        assert!(all.iter().any(|p| p.contains("container t1")), "{undone:?}");
        assert!(all.iter().any(|p| p.contains("\"hang\"")), "{undone:?}");
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "DEL\n");
        assert!(!netns.exists(), "the netns was left");
    }

    /// A second `delete` of a bundle waits for the first (which holds the bundle's lock) and
    /// does nothing of its own meanwhile; it ends with its budget and says why.
    #[test]
    fn a_second_delete_of_a_bundle_waits_for_the_first() {
        use std::os::fd::AsRawFd;
        let tmp = tempfile::tempdir().unwrap();
        let (bundle, sock) = bundle_with_socket(tmp.path());
        drop(crate::shim::socket::bind(&sock).unwrap());
        let Some(BundleLock::Held { _dir: first }) =
            lock_bundle(&bundle, &Budget::new(Duration::from_secs(60)))
        else {
            panic!("no lock on the bundle");
        };
        let (_, undone) = delete_within(
            "default",
            "t1",
            &bundle,
            &Budget::new(Duration::from_millis(200)),
        );
        assert!(
            undone.cut_off.iter().any(|c| c.contains("another delete")),
            "{undone:?}"
        );
        assert!(sock.exists(), "the waiting delete acted");
        // SAFETY: unlocks a descriptor the test owns.
        assert_eq!(unsafe { libc::flock(first.as_raw_fd(), libc::LOCK_UN) }, 0);
        until_not_in_use(|| {
            let (_, undone) = delete_within(
                "default",
                "t1",
                &bundle,
                &Budget::new(Duration::from_secs(60)),
            );
            assert!(undone.is_empty(), "{undone:?}");
            if sock.exists() {
                Removal::InUse
            } else {
                Removal::Removed
            }
        });
        assert!(!sock.exists());
    }

    #[test]
    fn paths_outside_the_socket_dirs_are_never_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        // A stale socket, but in no socket dir of this bundle.
        let elsewhere = dir.join(HASH);
        drop(crate::shim::socket::bind(&elsewhere).unwrap());
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

    /// Writes `record` as `bundle`'s task record, as the daemon does.
    fn write_task_record(bundle: &Path, record: &TaskRecord) {
        std::fs::write(
            bundle.join(TASK_STATE_FILE),
            serde_json::to_vec(record).unwrap(),
        )
        .unwrap();
    }

    /// Whether another `delete` could take `bundle`'s lock now (a second open of the
    /// directory: `flock` locks of two open files conflict within one process too).
    fn bundle_lock_is_free(bundle: &Path) -> bool {
        use std::os::fd::AsRawFd;
        let dir = std::fs::File::open(bundle).unwrap();
        // SAFETY: flock on a descriptor the test owns; closing it drops the lock.
        unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }

    /// A `delete` whose deadline cut steps off returns while their watched threads may still
    /// work on the bundle: it keeps the bundle's lock until its process exits, so a second
    /// `delete` (containerd runs one again) cannot run beside those threads. Before, the lock
    /// went with `delete_within`'s return. A `delete` that finished everything releases it.
    #[test]
    fn a_delete_cut_off_at_its_deadline_keeps_the_bundle_lock_until_it_exits() {
        let tmp = tempfile::tempdir().unwrap();
        let bundle = tmp.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        // A container of a dead shim: its take-down runs on a watched thread, and with a
        // budget spent from the start the deadline cuts it off, whatever that thread does.
        let record = TaskRecord {
            id: "t1".into(),
            runc: RuncConfig {
                binary: tmp.path().join("no-runc").display().to_string(),
                root: tmp.path().join("runc-root"),
                ..RuncConfig::defaults("ns")
            },
            rootfs_mounted: false,
            network: None,
            cgroups_at_create: None,
        };
        write_task_record(&bundle, &record);
        let (_, undone) = delete_within("ns", "t1", &bundle, &Budget::new(Duration::ZERO));
        assert!(
            undone.cut_off.iter().any(|c| c.contains("container t1")),
            "{undone:?}"
        );
        assert!(
            !bundle_lock_is_free(&bundle),
            "the lock was released while a cut-off step may still run"
        );

        let done = tmp.path().join("done");
        std::fs::create_dir(&done).unwrap();
        let (_, undone) = delete_within("ns", "t1", &done, &Budget::new(Duration::from_secs(60)));
        assert!(undone.is_empty(), "{undone:?}");
        assert!(
            bundle_lock_is_free(&done),
            "a finished delete kept the lock"
        );
    }
}
