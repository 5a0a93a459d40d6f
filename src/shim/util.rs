//! Small helpers shared by several modules: time stamps, /proc reads, file writes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protobuf::well_known_types::timestamp::Timestamp;

use crate::records::error::{Context, Result};

/// A protobuf timestamp for `t`.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

/// `t` as RFC 3339 UTC with nanoseconds, the format containerd's logrus logs use.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), used to
/// tell a live process from a recycled pid.
pub fn process_start_ticks(pid: i32) -> Option<u64> {
    start_ticks_of_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time (field 22, clock ticks since boot) in the text of a `/proc/<pid>/stat`.
pub fn start_ticks_of_stat(stat: &str) -> Option<u64> {
    // comm (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// Writes `data` to `path` atomically (temp file + rename) with `mode`.
pub fn write_file_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(data)
        .with_context(|| format!("write {}", tmp.display()))?;
    drop(f);
    fs::rename(&tmp, path)
        .with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
}

/// Machine architecture in containerd/Go's naming (`amd64`, `arm64`, ...).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// `pidfd_open(pid, 0)`: a close-on-exec descriptor naming process `pid`. It names the
/// process `pid` named at this moment: race-free only while that process cannot be reaped
/// (our unreaped child, or one its parent holds unreaped), else to be checked after.
pub fn pidfd_open(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel made `fd` ours.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// SIGKILL through `pidfd`: Err(ESRCH) once the process is reaped, never another process.
pub fn pidfd_sigkill(pidfd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal reads the fd, a signal number and a null siginfo pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// SIGKILLs `pid` and waits until every thread of it has exited (a zombie counts), at most
/// `timeout`; returns whether it did. Used to take down a process recorded in a file (a hung daemon, a pause
/// process after a crash): a pidfd is opened first and `still_ours` checked after, so the
/// signal reaches the process that passed the check even if the pid is recycled meanwhile,
/// and its exit is waited for with `poll`, not by sleeping.
pub fn kill_and_wait(pid: i32, still_ours: impl Fn() -> bool, timeout: Duration) -> bool {
    use std::os::fd::AsFd;
    if pid <= 1 {
        return false;
    }
    let Ok(pidfd) = pidfd_open(pid) else {
        // No such process (or no pidfd support): nothing to kill that we could name safely.
        return std::fs::metadata(format!("/proc/{pid}")).is_err();
    };
    if !still_ours() {
        return false;
    }
    if let Err(e) = pidfd_sigkill(pidfd.as_fd()) {
        return e.raw_os_error() == Some(libc::ESRCH);
    }
    exited_within(pidfd.as_fd(), timeout)
}

/// Waits, at most `timeout`, until every thread of `pid` has exited (the process may stay a
/// zombie); true also when there is no such process. A process whose main thread has exited
/// shows as a zombie in /proc while its other threads may still be exiting and holding its
/// files (a killed daemon's listening socket): only this wait says they are gone.
pub fn wait_for_exit(pid: i32, timeout: Duration) -> bool {
    use std::os::fd::AsFd;
    if pid <= 0 {
        return false;
    }
    let Ok(pidfd) = pidfd_open(pid) else {
        return std::fs::metadata(format!("/proc/{pid}")).is_err();
    };
    exited_within(pidfd.as_fd(), timeout)
}

/// A pidfd polls readable once its whole thread group has exited.
pub fn exited_within(pidfd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> bool {
    let _blocked = crate::shim::blocking::blocking();
    poll_readable(pidfd, std::time::Instant::now() + timeout).unwrap_or(false)
}

/// Waits until `fd` polls readable (or hung up): `Ok(true)`, or `Ok(false)` once `deadline`
/// has passed. A signal handler that ran on this thread (EINTR: poll is never restarted) is
/// not an answer: the wait goes on.
pub fn poll_readable(
    fd: std::os::fd::BorrowedFd<'_>,
    deadline: std::time::Instant,
) -> nix::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) if std::time::Instant::now() >= deadline => return Ok(false),
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}

/// Reaps our child that `pidfd` names (`waitid(P_PIDFD)`: never another process that got its
/// pid since), waiting for its exit unless `nohang`. ECHILD (the shim's reaper took it first)
/// and EINTR are fine: the caller only wants no zombie of its own making.
pub fn reap_pidfd(pidfd: std::os::fd::BorrowedFd<'_>, nohang: bool) {
    use std::os::fd::AsRawFd;
    let flags = libc::WEXITED | if nohang { libc::WNOHANG } else { 0 };
    // SAFETY: waitid writes one siginfo_t, which we own.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            flags,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_798_547_696, 5); // 2026-12-29T12:34:56Z
        assert_eq!(rfc3339(t), "2026-12-29T12:34:56.000000005Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&rfc3339(leap)[..10], "2000-02-29");
    }

    #[test]
    fn timestamp_splits_seconds_and_nanos() {
        let ts = timestamp(UNIX_EPOCH + Duration::new(12, 34));
        assert_eq!((ts.seconds, ts.nanos), (12, 34));
    }

    #[test]
    fn start_ticks_of_self_is_stable_and_differs_for_missing_pid() {
        let me = std::process::id() as i32;
        let a = process_start_ticks(me).unwrap();
        assert_eq!(process_start_ticks(me), Some(a));
        assert_eq!(process_start_ticks(i32::MAX), None);
    }

    #[test]
    fn atomic_write_replaces_content_with_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_file_atomic(&p, b"one", 0o600).unwrap();
        write_file_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// A signal handled while waiting interrupts the poll; the wait goes on until the exit.
    #[test]
    fn a_signal_during_the_wait_is_not_an_exit() {
        use std::os::fd::AsFd;
        static HANDLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        extern "C" fn nothing(_: libc::c_int) {
            HANDLED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        // A handler (no SA_RESTART: poll is never restarted anyway) so SIGUSR2 interrupts.
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(nothing),
            nix::sys::signal::SaFlags::empty(),
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        unsafe { nix::sys::signal::sigaction(nix::sys::signal::SIGUSR2, &action) }.unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pidfd = pidfd_open(child.id() as i32).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // SAFETY: gettid has no arguments and cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            exited_within(pidfd.as_fd(), Duration::from_secs(60))
        });
        let tid = rx.recv().unwrap();
        // The system calls glibc's poll() makes: aarch64's generic table has no poll, so there
        // it is ppoll; x86_64 has both.
        #[cfg(target_arch = "x86_64")]
        let polls = [libc::SYS_poll, libc::SYS_ppoll];
        #[cfg(not(target_arch = "x86_64"))]
        let polls = [libc::SYS_ppoll];
        // Signal the waiter once it sits in poll (its current syscall, from /proc).
        let in_poll = || {
            fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
                .is_some_and(|nr| polls.contains(&nr))
        };
        while !in_poll() {
            std::thread::yield_now();
        }
        // SAFETY: tgkill takes ids and a signal number; no memory is passed.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR2) };
        // Once the handler ran, the waiter's poll has returned EINTR.
        while HANDLED.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        child.kill().unwrap();
        assert!(
            waiter.join().unwrap(),
            "an interrupted wait was taken for no exit"
        );
        child.wait().unwrap();
    }

    #[test]
    fn kill_and_wait_takes_down_only_a_process_that_passes_the_check() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!kill_and_wait(pid, || false, Duration::from_secs(1)));
        assert!(
            child.try_wait().unwrap().is_none(),
            "killed although not ours"
        );
        assert!(kill_and_wait(pid, || true, Duration::from_secs(60)));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}
