//! The handle of a started pause process: its host pid and a pidfd taken at its spawn (from
//! the clone itself, or while its parent still held it unreaped), kept for its life.
//!
//! Signals go through the pidfd only, never `kill(pid)`: the shim's reaper may reap the pause
//! at any moment, after which its pid can name another process of the node; the pidfd names
//! the pause alone and answers ESRCH once it is reaped. Runs in the shim (no restriction of
//! the forked child applies here).

use std::os::fd::{AsFd, OwnedFd};

/// A pause process spawned by [`super::spawn`].
#[derive(Debug)]
pub struct PauseProcess {
    pid: i32,
    pidfd: OwnedFd,
}

impl PauseProcess {
    /// `pidfd` must name the process `pid` named when it was taken.
    pub(super) fn new(pid: i32, pidfd: OwnedFd) -> PauseProcess {
        PauseProcess { pid, pidfd }
    }

    /// Its pid in the shim's PID namespace (for `/proc/<pid>`, the cgroup, the record).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// SIGKILL through the pidfd. Err(ESRCH) once it has been reaped: a process that got its
    /// pid since is never signalled.
    pub fn kill(&self) -> std::io::Result<()> {
        PauseProcess::signal(&self.pidfd)
    }

    /// Whether it has exited (its pidfd is readable from its exit on, reaped or not). While
    /// its pid is held unreaped ([`crate::shim::reaper::Reaper::hold_pid`]) a `false` here means the
    /// pid still names this process.
    pub fn has_exited(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        loop {
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(n) => return n > 0,
                Err(nix::errno::Errno::EINTR) => continue,
                // A pidfd that cannot be polled: say exited, so nothing is trusted to it.
                Err(_) => return true,
            }
        }
    }

    /// Waits at most `timeout` for it to exit; whether it has (reaped or not, as
    /// [`PauseProcess::has_exited`]).
    pub fn exits_within(&self, timeout: std::time::Duration) -> bool {
        crate::shim::util::exited_within(self.pidfd.as_fd(), timeout)
    }

    /// A handle of a process the test spawned (`pidfd` taken while it was unreaped).
    #[cfg(test)]
    pub fn for_test(pid: i32, pidfd: OwnedFd) -> PauseProcess {
        PauseProcess { pid, pidfd }
    }

    /// For fake hosts: a handle with the pid `pid` whose pidfd names `stand_in`, a live child
    /// of the test (so the pause counts as alive until the test ends it).
    #[cfg(test)]
    pub fn standing_in(pid: i32, stand_in: &std::process::Child) -> PauseProcess {
        PauseProcess {
            pid,
            pidfd: pidfd_open(stand_in.id() as i32).unwrap(),
        }
    }

    /// SIGKILL through `pidfd`.
    pub(super) fn signal(pidfd: &OwnedFd) -> std::io::Result<()> {
        crate::shim::util::pidfd_sigkill(pidfd.as_fd())
    }

    /// For fake hosts: a handle whose pidfd names a process that was reaped already (so that a
    /// signal through it reaches nobody), with the pid `pid`.
    #[cfg(test)]
    pub fn reaped(pid: i32) -> PauseProcess {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = pidfd_open(child.id() as i32).unwrap();
        child.wait().unwrap();
        PauseProcess { pid, pidfd }
    }
}

/// `pidfd_open(pid, 0)`: only race-free while `pid` is a child of ours not yet reaped (or held
/// unreaped by its parent).
pub(super) use crate::shim::util::pidfd_open;

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 20: the pause was killed by `kill(pid)`, which after its reaping reaches whatever
    /// process got the pid. Here the pid already names another live process (recycled): the
    /// kill through the handle answers ESRCH and that process never gets SIGKILL (it ends by the
    /// SIGTERM sent after, which a SIGKILL queued first would have preempted).
    #[test]
    fn no_signal_reaches_a_process_that_got_the_pid_after_the_reap() {
        let mut pause = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pidfd = pidfd_open(pause.id() as i32).unwrap();
        pause.kill().unwrap();
        pause.wait().unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let handle = PauseProcess::new(other.id() as i32, pidfd);
        let err = handle.kill().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(other.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = other.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    }

    /// The handle of a live child signals that child.
    #[test]
    fn the_handle_kills_its_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let handle = PauseProcess::new(child.id() as i32, pidfd_open(child.id() as i32).unwrap());
        handle.kill().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(handle.kill().unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn a_handle_tells_whether_its_process_has_exited() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let handle = PauseProcess::new(child.id() as i32, pidfd_open(child.id() as i32).unwrap());
        assert!(!handle.has_exited());
        handle.kill().unwrap();
        // A zombie has exited, before and after its reaping.
        while !handle.has_exited() {
            std::thread::yield_now();
        }
        child.wait().unwrap();
        assert!(handle.has_exited());
    }

    #[test]
    fn a_fake_handle_signals_nobody() {
        let h = PauseProcess::reaped(1 << 23);
        assert_eq!(h.pid(), 1 << 23);
        assert_eq!(h.kill().unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }
}
