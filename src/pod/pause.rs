//! The pod's namespace holder ("pause"): a forked copy of the shim, never an exec.
//!
//! Why a fork and not a pause image, a re-exec or a runc container:
//! - latency: one `clone(2)` (well under a millisecond) instead of `runc create` + `runc start`
//!   of a pause container (~100 ms with runc's Go start-up and its fork chain);
//! - memory: the child shares every page with the shim copy-on-write and touches only a few
//!   stack pages, so shim + pause cost barely more than the shim (a static pause binary alone
//!   has ~0.7 MB RSS);
//! - security: no host binary is executed inside pod namespaces (nothing for a container to
//!   overwrite through /proc/<pid>/exe, CVE-2019-5736); the child closes every fd, drops all
//!   capabilities (bounding set included), switches to 65535:65535, sets no_new_privs and
//!   is not dumpable.
//!
//! The child is created with a raw `clone` (new IPC and UTS namespaces, a new PID namespace when
//! the pod shares one, in which it is PID 1 and reaps), joins the pod netns, sets the hostname
//! and the pod sysctls (net.* resolve to the netns and kernel.shm*/msg*/sem/fs.mqueue.* to the IPC
//! namespace of the writer), then waits for signals. Between clone and its endless wait the child
//! only makes raw system calls on data prepared by the parent: the shim is multi-threaded and
//! anything that may take a lock (malloc, glibc's set*id broadcast to all threads) would
//! deadlock in the copy. Errors travel back over a CLOEXEC pipe as (step, errno).

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Context, Error, Result};

/// The identity the pause process runs as (as Kubernetes' pause image).
pub const PAUSE_UID: u32 = 65535;
pub const PAUSE_GID: u32 = 65535;

/// What the pause process should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PauseConfig {
    /// Network namespace to join; `None` stays in the shim's (host) netns.
    pub netns: Option<PathBuf>,
    /// New IPC namespace (false: hostIPC).
    pub new_ipc: bool,
    /// New UTS namespace (false: host network pods keep the host's).
    pub new_uts: bool,
    /// New PID namespace with the pause as PID 1 (shareProcessNamespace).
    pub new_pid: bool,
    /// Hostname to set in the new UTS namespace.
    pub hostname: Option<String>,
    /// (name, value) sysctls, written under /proc/sys from inside the namespaces.
    pub sysctls: Vec<(String, String)>,
}

/// Steps the child reports failures for.
const STEPS: [&str; 12] = [
    "unknown step",
    "reset signal handlers",
    "join the pod network namespace",
    "set the hostname",
    "open a sysctl file",
    "write a sysctl",
    "drop capabilities",
    "set groups",
    "set gid",
    "set uid",
    "set no_new_privs/non-dumpable",
    "block signals",
];

/// Everything the child needs, allocated before the clone.
struct Prepared {
    flags: libc::c_int,
    netns: Option<OwnedFd>,
    hostname: Option<CString>,
    sysctls: Vec<(CString, Vec<u8>, String)>,
    cap_last: libc::c_int,
}

fn prepare(cfg: &PauseConfig) -> Result<Prepared> {
    let mut flags = libc::SIGCHLD;
    if cfg.new_ipc {
        flags |= libc::CLONE_NEWIPC;
    }
    if cfg.new_uts {
        flags |= libc::CLONE_NEWUTS;
    }
    if cfg.new_pid {
        flags |= libc::CLONE_NEWPID;
    }
    let netns = match &cfg.netns {
        Some(p) => Some(OwnedFd::from(
            File::open(p).with_context(|| format!("open netns {}", p.display()))?,
        )),
        None => None,
    };
    let hostname = match &cfg.hostname {
        Some(h) if cfg.new_uts && !h.is_empty() => {
            Some(CString::new(h.as_bytes()).map_err(|_| Error::invalid("hostname contains NUL"))?)
        }
        _ => None,
    };
    let mut sysctls = Vec::new();
    for (name, value) in &cfg.sysctls {
        let path = PathBuf::from("/proc/sys").join(name.replace('.', "/"));
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("sysctl {name:?} contains NUL")))?;
        sysctls.push((c, value.as_bytes().to_vec(), name.clone()));
    }
    let cap_last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    Ok(Prepared {
        flags,
        netns,
        hostname,
        sysctls,
        cap_last,
    })
}

/// Starts the pause process; returns its host pid once it holds the namespaces and dropped
/// its privileges. Its exit is reaped by the shim's reaper like any child.
pub fn spawn(cfg: &PauseConfig) -> Result<i32> {
    let p = prepare(cfg)?;
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pause: create status pipe")?;
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack): the child gets a copy of this
    // thread and runs `child`, which only makes async-signal-safe raw system calls on `p` and
    // never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            p.flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(Error::from(std::io::Error::last_os_error()).context("pause: clone"));
    }
    if pid == 0 {
        child(&p, tx.as_raw_fd());
    }
    let pid = pid as i32;
    drop(tx);
    drop(p);
    match read_status(rx) {
        Ok(()) => Ok(pid),
        Err(e) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            Err(e)
        }
    }
}

/// Reads the child's report: one `0` byte for success, or (step, errno, sysctl index).
fn read_status(rx: OwnedFd) -> Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut f = File::from(rx);
    let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&f), PollFlags::POLLIN)];
    match poll(
        &mut fds,
        PollTimeout::from(Duration::from_secs(10).as_millis() as u16),
    ) {
        Ok(0) => {
            return Err(Error::internal(
                "pause: no status from the child within 10s",
            ));
        }
        Ok(_) => {}
        Err(e) => return Err(Error::from(e).context("pause: wait for the child")),
    }
    let mut buf = [0u8; 12];
    let n = f.read(&mut buf).context("pause: read the child's status")?;
    match n {
        1 if buf[0] == 0 => Ok(()),
        12 => {
            let step = STEPS.get(buf[0] as usize).copied().unwrap_or(STEPS[0]);
            let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
            let idx = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
            let err = std::io::Error::from_raw_os_error(errno);
            Err(Error::internal(if step.contains("sysctl") {
                format!("pause: {step} (#{idx}): {err}")
            } else {
                format!("pause: {step}: {err}")
            }))
        }
        _ => Err(Error::internal("pause: the child exited before reporting")),
    }
}

/// Reports a failed step and exits. Async-signal-safe.
fn fail(fd: i32, step: u8, idx: u32) -> ! {
    // SAFETY: __errno_location is this thread's errno; write and _exit are async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let mut rec = [0u8; 12];
        rec[0] = step;
        let e = errno.to_ne_bytes();
        let i = idx.to_ne_bytes();
        let mut k = 0;
        while k < 4 {
            rec[4 + k] = e[k];
            rec[8 + k] = i[k];
            k += 1;
        }
        libc::write(fd, rec.as_ptr().cast(), rec.len());
        libc::_exit(1);
    }
}

/// The child side. Only raw system calls; no allocation, no locks, no panics.
fn child(p: &Prepared, status_fd: i32) -> ! {
    // SAFETY: every call below is an async-signal-safe system call on memory prepared before
    // the clone and owned by this (copied) address space.
    unsafe {
        // Signal handlers installed by the shim (signal-hook) must not run here.
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        let mut sig = 1;
        while sig < 65 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
            sig += 1;
        }
        if let Some(ns) = &p.netns
            && libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0
        {
            fail(status_fd, 2, 0);
        }
        if let Some(h) = &p.hostname
            && libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0
        {
            fail(status_fd, 3, 0);
        }
        let mut i = 0;
        while i < p.sysctls.len() {
            let (path, value, _) = &p.sysctls[i];
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                fail(status_fd, 4, i as u32);
            }
            if libc::write(fd, value.as_ptr().cast(), value.len()) < 0 {
                fail(status_fd, 5, i as u32);
            }
            libc::close(fd);
            i += 1;
        }
        libc::chdir(c"/".as_ptr());
        // The clone copies the name of the thread that forked us (e.g. "rpc"): `ps` in a pod
        // sharing its PID namespace should show PID 1 as the pause process.
        libc::prctl(
            libc::PR_SET_NAME,
            c"pause".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut cap = 0;
        while cap <= p.cap_last {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                fail(status_fd, 6, cap as u32);
            }
            cap += 1;
        }
        // Raw syscalls: glibc's wrappers would try to signal the shim's other threads.
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
            fail(status_fd, 7, 0);
        }
        if libc::syscall(libc::SYS_setresgid, PAUSE_GID, PAUSE_GID, PAUSE_GID) != 0 {
            fail(status_fd, 8, 0);
        }
        if libc::syscall(libc::SYS_setresuid, PAUSE_UID, PAUSE_UID, PAUSE_UID) != 0 {
            fail(status_fd, 9, 0);
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
        {
            fail(status_fd, 10, 0);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            fail(status_fd, 11, 0);
        }
        // Nothing of the shim's stays open here (sockets, pipes, fifos, netns fds): close all
        // but the status pipe, report, then close that too.
        let fd = status_fd as u32;
        if fd > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, fd - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, fd + 1, u32::MAX, 0u32);
        let ok = [0u8];
        libc::write(status_fd, ok.as_ptr().cast(), 1);
        libc::close(status_fd);
        let pid1 = libc::getpid() == 1;
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let s = libc::sigwaitinfo(&set, &mut info);
            if s == libc::SIGCHLD {
                // As PID 1 of the pod's pid namespace, reap orphans.
                if pid1 {
                    while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
                }
            } else if s == libc::SIGTERM || s == libc::SIGINT || s == libc::SIGHUP {
                libc::_exit(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kills the pause process even when an assertion fails first.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.0), None);
        }
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn wait_exit(pid: i32) -> i32 {
        match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            nix::sys::wait::WaitStatus::Signaled(_, s, _) => 128 + s as i32,
            other => panic!("{other:?}"),
        }
    }

    fn status_field(pid: i32, key: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find(|l| l.starts_with(key))
            .unwrap()
            .split_once(':')
            .unwrap()
            .1
            .trim()
            .to_string()
    }

    #[test]
    fn pause_holds_new_namespaces_unprivileged() {
        if !is_root() {
            eprintln!("skipped: creating namespaces needs root");
            return;
        }
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            hostname: Some("pod-a".into()),
            sysctls: vec![("kernel.shm_rmid_forced".into(), "1".into())],
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        let ns = |p: &str, k: &str| std::fs::read_link(format!("/proc/{p}/ns/{k}")).unwrap();
        for kind in ["ipc", "uts", "pid_for_children"] {
            let k = if kind == "pid_for_children" {
                "pid"
            } else {
                kind
            };
            assert_ne!(ns(&pid.to_string(), k), ns("self", kind), "{kind}");
        }
        assert_eq!(ns(&pid.to_string(), "net"), ns("self", "net"));
        assert_eq!(status_field(pid, "Uid"), "65535\t65535\t65535\t65535");
        assert_eq!(status_field(pid, "Name"), "pause");
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
        assert_eq!(status_field(pid, "NoNewPrivs"), "1");
        assert_eq!(
            status_field(pid, "NSpid").split_whitespace().last(),
            Some("1")
        );
        // Nothing inherited (the status pipe closes right after the report).
        let fds = || {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .count()
        };
        for _ in 0..100 {
            if fds() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(fds(), 0);
        // Hostname and the IPC sysctl live in its namespaces.
        let uts = File::open(format!("/proc/{pid}/ns/uts")).unwrap();
        let got = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).unwrap();
            nix::sched::setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS).unwrap();
            let n = nix::unistd::gethostname().unwrap();
            n.into_string().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, "pod-a");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(wait_exit(pid), 0);
    }

    #[test]
    fn a_failing_step_is_reported_with_its_name() {
        if !is_root() {
            eprintln!("skipped: creating namespaces needs root");
            return;
        }
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            sysctls: vec![("kernel.no_such_sysctl_rsandbox".into(), "1".into())],
            ..Default::default()
        };
        let err = spawn(&cfg).unwrap_err();
        assert_eq!(
            err.message(),
            "pause: open a sysctl file (#0): No such file or directory (os error 2)"
        );
        // The child exited on its own; reap it so no zombie is left.
        let _ = nix::sys::wait::waitpid(None, None);
    }

    #[test]
    fn a_missing_netns_fails_before_any_clone() {
        let cfg = PauseConfig {
            netns: Some("/nonexistent/netns".into()),
            ..Default::default()
        };
        let err = spawn(&cfg).unwrap_err();
        assert!(
            err.message().starts_with("open netns /nonexistent/netns"),
            "{}",
            err.message()
        );
    }
}
