//! The pod's namespace holder ("pause"): a forked copy of the shim, never an exec.
//!
//! Why a fork and not a pause image, a re-exec or a runc container:
//! - latency: one `clone(2)` (well under a millisecond) instead of `runc create` + `runc start`
//!   of a pause container (~100 ms with runc's Go start-up and its fork chain);
//! - memory: the child shares every page with the shim copy-on-write and touches only a few
//!   stack pages, so shim + pause cost barely more than the shim (a static pause binary alone
//!   has ~0.7 MB RSS);
//! - security: no host binary is executed inside pod namespaces (nothing for a container to
//!   overwrite through `/proc/<pid>/exe`, CVE-2019-5736); the child closes every fd, drops all
//!   capabilities (bounding set included), switches to 65535:65535, sets no_new_privs and
//!   is not dumpable.
//!
//! The child is created with a raw `clone` (new IPC and UTS namespaces, a new PID namespace when
//! the pod shares one, in which it is PID 1 and reaps), joins the pod netns, sets the hostname
//! and the pod sysctls (net.* resolve to the netns and kernel.shm*/msg*/sem/fs.mqueue.* to the IPC
//! namespace of the writer), rewrites its command line to `rsandbox-pause <pod id>` (see
//! [`PAUSE_ARGV0`]), then waits for signals. Errors travel back over a CLOEXEC pipe as
//! (step, errno, index); the parent turns them into a message naming the step (and the sysctl).
//!
//! # The forked child never allocates, locks or unwinds
//!
//! The shim is multi-threaded: in the copy, anything that may take a lock (malloc, glibc's set*id
//! broadcast to all threads, stdio) can deadlock on a lock another thread held at the clone, and
//! an unwinding panic would run the shim's code (destructors, the RPC loop) in a second process.
//! So between the clone and its endless wait the child only makes raw, async-signal-safe system
//! calls on data the parent prepared (`Prepared`): no `unwrap`/`expect`, no slice indexing, no
//! `format!`, no `Vec`/`String`, and every exit is `_exit`. It first sets [`IN_FORKED_CHILD`], so
//! a panic hook that runs anyway (a bug) can `_exit` at once instead of unwinding.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::spec::{IpcMode, NetworkMode, PidMode, PodSpec, SysctlDefaults, sysctl_path};
use crate::error::{Context, Error, Result};

/// The pause process's `argv[0]`; `argv[1]` is the pod ID.
///
/// A forked copy of the shim would otherwise show the shim's command line, and `ps`,
/// `pgrep -f containerd-shim-rsandbox-v1` and node monitoring would count two shims per pod. The
/// child overwrites its copy of the argv memory in place (the kernel's `/proc/<pid>/cmdline`
/// reads that memory), so no privilege is needed (`PR_SET_MM` would need CAP_SYS_RESOURCE); its
/// `comm` is `pause`.
pub const PAUSE_ARGV0: &str = "rsandbox-pause";

/// The identity the pause process runs as (as Kubernetes' pause image).
pub const PAUSE_UID: u32 = 65535;
pub const PAUSE_GID: u32 = 65535;

/// True in the forked pause child from its first instruction on, false in the shim.
///
/// The child must never unwind (see the module docs). The shim's panic hook
/// ([`crate::panic_hook`]) checks this flag first and, when it is set, calls `_exit` without
/// formatting, logging or unwinding: a panic in the child is a bug, and the only safe reaction
/// in a copy of a multi-threaded process is to vanish (the parent then reports "the child exited
/// before reporting"). Only the child's copy of memory ever sees `true`.
pub use crate::panic_hook::IN_FORKED_CHILD;

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
    /// (name, value) sysctls, written under /proc/sys from inside the namespaces (names in
    /// either form; see [`sysctl_path`]).
    pub sysctls: Vec<(String, String)>,
    /// The pod ID, shown in the command line (`rsandbox-pause <pod id>`).
    pub pod_id: String,
}

impl PauseConfig {
    /// The pause process of a pod: `netns` is the pod's network namespace (given by the caller
    /// or made by the shim), `defaults` what the host allows of containerd's default sysctls.
    ///
    /// As containerd's podsandbox controller:
    /// * a host-network pod keeps the host's network and UTS namespaces (no netns is joined even
    ///   if one is given) and gets no default sysctls;
    /// * hostIPC keeps the host's IPC namespace;
    /// * the pause process gets a PID namespace of its own unless the pod asks for the node's:
    ///   CRI puts a container whose own namespace_options say pid=POD into
    ///   `/proc/<pause>/ns/pid` whatever the pod's mode, and a pause left in the host's PID
    ///   namespace would hand it the node's processes.
    pub fn for_pod(
        pod_id: &str,
        spec: &PodSpec,
        netns: Option<&Path>,
        defaults: SysctlDefaults,
    ) -> PauseConfig {
        let host_network = spec.network == NetworkMode::Host;
        PauseConfig {
            pod_id: pod_id.to_string(),
            netns: netns.filter(|_| !host_network).map(Path::to_path_buf),
            new_ipc: spec.ipc == IpcMode::Pod,
            new_uts: !spec.host_uts(),
            new_pid: spec.pid != PidMode::Host,
            hostname: Some(spec.hostname.clone()).filter(|h| !h.is_empty() && !spec.host_uts()),
            sysctls: spec.effective_sysctls(defaults),
        }
    }
}

/// Steps the child reports failures for; the discriminant travels over the status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Unknown = 0,
    JoinNetns = 2,
    SetHostname = 3,
    OpenSysctl = 4,
    WriteSysctl = 5,
    DropCapabilities = 6,
    SetGroups = 7,
    SetGid = 8,
    SetUid = 9,
    NoNewPrivs = 10,
    BlockSignals = 11,
}

impl Step {
    /// Every step, in the child's order.
    const ALL: [Step; 10] = [
        Step::JoinNetns,
        Step::SetHostname,
        Step::OpenSysctl,
        Step::WriteSysctl,
        Step::DropCapabilities,
        Step::SetGroups,
        Step::SetGid,
        Step::SetUid,
        Step::NoNewPrivs,
        Step::BlockSignals,
    ];

    fn from_wire(b: u8) -> Step {
        Step::ALL
            .into_iter()
            .find(|s| *s as u8 == b)
            .unwrap_or(Step::Unknown)
    }

    fn describe(self) -> &'static str {
        match self {
            Step::Unknown => "unknown step",
            Step::JoinNetns => "join the pod network namespace",
            Step::SetHostname => "set the hostname",
            Step::OpenSysctl => "open the file of sysctl",
            Step::WriteSysctl => "write sysctl",
            Step::DropCapabilities => "drop capabilities",
            Step::SetGroups => "set groups",
            Step::SetGid => "set gid",
            Step::SetUid => "set uid",
            Step::NoNewPrivs => "set no_new_privs/non-dumpable",
            Step::BlockSignals => "block signals",
        }
    }
}

/// One sysctl, ready for the child: the path to open, the bytes to write.
struct PreparedSysctl {
    path: CString,
    value: Vec<u8>,
}

/// Everything the child needs, allocated before the clone.
struct Prepared {
    flags: libc::c_int,
    netns: Option<OwnedFd>,
    hostname: Option<CString>,
    sysctls: Vec<PreparedSysctl>,
    cap_last: libc::c_int,
    /// Upper bound (exclusive) of the fds the one-by-one fallback closes.
    fd_limit: u32,
    /// Whether the child tries `close_range` first (tests turn it off to run the fallback).
    use_close_range: bool,
    /// This process's argv memory, `None` when unknown.
    argv: Option<ArgvArea>,
    /// What goes there: [`title`].
    title: Vec<u8>,
}

/// Where the kernel keeps this process's command line: `[start, start + len)` of its memory
/// (`arg_start`/`arg_end` in /proc/self/stat), the strings `argv` points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArgvArea {
    start: usize,
    len: usize,
}

impl ArgvArea {
    /// This process's argv area.
    fn of_self() -> Option<ArgvArea> {
        ArgvArea::parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }

    /// Fields 48 and 49 (`arg_start`, `arg_end`, Linux 3.5+) of a /proc/<pid>/stat line. The
    /// command name (field 2) may hold blanks and parentheses: fields are counted after its last
    /// `)`. Implausible values (zero, reversed, over 1 MiB) give `None`.
    fn parse_stat(stat: &str) -> Option<ArgvArea> {
        let (_, rest) = stat.rsplit_once(')')?;
        // `rest` starts with field 3 (state).
        let mut fields = rest.split_whitespace().skip(48 - 3);
        let start: usize = fields.next()?.parse().ok()?;
        let end: usize = fields.next()?.parse().ok()?;
        let len = end.checked_sub(start)?;
        (start != 0 && len != 0 && len <= 1 << 20).then_some(ArgvArea { start, len })
    }
}

/// The pause process's command line as argv memory: `rsandbox-pause\0<pod id>\0`.
fn title(pod_id: &str) -> Vec<u8> {
    let mut t = Vec::with_capacity(PAUSE_ARGV0.len() + pod_id.len() + 2);
    t.extend_from_slice(PAUSE_ARGV0.as_bytes());
    t.push(0);
    if !pod_id.is_empty() {
        t.extend_from_slice(pod_id.as_bytes());
        t.push(0);
    }
    t
}

/// Overwrites the argv memory `area` with `title`, truncated to fit, and NUL-fills the rest, so
/// the last byte is NUL: the kernel then reads the command line as exactly the area (with a
/// non-NUL last byte it would assume setproctitle(3) and read on into the environment). No
/// allocation, no panics (it runs in the forked child).
fn overwrite_argv(area: &mut [u8], title: &[u8]) {
    let mut src = title.iter().take(area.len().saturating_sub(1));
    for b in area.iter_mut() {
        *b = src.next().copied().unwrap_or(0);
    }
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
    let mut sysctls = Vec::with_capacity(cfg.sysctls.len());
    for (name, value) in &cfg.sysctls {
        let path = CString::new(sysctl_path(name).as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("sysctl {name:?} contains NUL")))?;
        sysctls.push(PreparedSysctl {
            path,
            value: value.as_bytes().to_vec(),
        });
    }
    let cap_last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    Ok(Prepared {
        flags,
        netns,
        hostname,
        sysctls,
        cap_last,
        fd_limit: fd_limit(),
        use_close_range: true,
        argv: ArgvArea::of_self(),
        title: title(&cfg.pod_id),
    })
}

/// The number of fds this process can ever have had open: the hard `RLIMIT_NOFILE`, capped by
/// `fs.nr_open` (the kernel's ceiling; it is also what an infinite limit means).
fn fd_limit() -> u32 {
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`.
    let hard = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_max
    } else {
        u64::MAX
    };
    u32::try_from(hard.min(nr_open)).unwrap_or(u32::MAX)
}

/// Starts the pause process; returns its host pid once it holds the namespaces and dropped
/// its privileges. Its exit is reaped by the shim's reaper like any child.
pub fn spawn(cfg: &PauseConfig) -> Result<i32> {
    spawn_prepared(cfg, prepare(cfg)?)
}

fn spawn_prepared(cfg: &PauseConfig, p: Prepared) -> Result<i32> {
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
    match read_status(rx, cfg) {
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

/// Length of the child's failure report: step (1 byte), padding (3), errno (4), index (4).
const REPORT_LEN: usize = 12;

/// Reads the child's report: one `0` byte for success, or (step, errno, index).
fn read_status(rx: OwnedFd, cfg: &PauseConfig) -> Result<()> {
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
    let mut buf = [0u8; REPORT_LEN];
    let n = f.read(&mut buf).context("pause: read the child's status")?;
    match n {
        1 if buf[0] == 0 => Ok(()),
        REPORT_LEN => {
            let step = Step::from_wire(buf[0]);
            let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
            let idx = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
            let err = std::io::Error::from_raw_os_error(errno);
            let what = step.describe();
            Err(Error::internal(match step {
                Step::OpenSysctl | Step::WriteSysctl => {
                    let name = cfg.sysctls.get(idx).map_or("?", |(n, _)| n.as_str());
                    format!(
                        "pause: {what} {name} ({}): {err}",
                        sysctl_path(name).display()
                    )
                }
                Step::DropCapabilities => format!("pause: {what} (capability {idx}): {err}"),
                _ => format!("pause: {what}: {err}"),
            }))
        }
        _ => Err(Error::internal("pause: the child exited before reporting")),
    }
}

/// Reports a failed step and exits. Async-signal-safe.
fn fail(fd: i32, step: Step, idx: u32) -> ! {
    // SAFETY: __errno_location is this thread's errno; write and _exit are async-signal-safe.
    unsafe {
        let e = (*libc::__errno_location()).to_ne_bytes();
        let i = idx.to_ne_bytes();
        let rec: [u8; REPORT_LEN] = [
            step as u8, 0, 0, 0, e[0], e[1], e[2], e[3], i[0], i[1], i[2], i[3],
        ];
        libc::write(fd, rec.as_ptr().cast(), rec.len());
        libc::_exit(1);
    }
}

/// The two system calls that close file descriptors, behind a trait so the fallback logic is
/// tested without forking.
trait CloseFds {
    /// `close_range(first, last, 0)`; false when it failed (ENOSYS before Linux 5.9, EPERM
    /// under a seccomp filter that does not know it, ...).
    fn close_range(&self, first: u32, last: u32) -> bool;
    /// `close(fd)`, errors ignored (EBADF for the many fds that are not open).
    fn close(&self, fd: u32);
}

/// The real system calls.
struct Syscalls;

impl CloseFds for Syscalls {
    fn close_range(&self, first: u32, last: u32) -> bool {
        // SAFETY: close_range only closes descriptors; nothing in the child uses them.
        unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) == 0 }
    }
    fn close(&self, fd: u32) {
        // SAFETY: as above, for one descriptor.
        unsafe {
            libc::close(fd as libc::c_int);
        }
    }
}

/// Closes every fd but `keep`: with `close_range` when it works, else one by one below `limit`.
/// No allocation, no panics (it runs in the forked child).
fn close_all_but<C: CloseFds>(sys: &C, keep: u32, limit: u32, use_close_range: bool) {
    if use_close_range {
        let below = keep == 0 || sys.close_range(0, keep - 1);
        let above = keep == u32::MAX || sys.close_range(keep + 1, u32::MAX);
        if below && above {
            return;
        }
    }
    let mut fd = 0;
    while fd < limit {
        if fd != keep {
            sys.close(fd);
        }
        fd += 1;
    }
}

/// The child side. Only raw system calls; no allocation, no locks, no panics.
fn child(p: &Prepared, status_fd: i32) -> ! {
    IN_FORKED_CHILD.store(true, Ordering::SeqCst);
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
            fail(status_fd, Step::JoinNetns, 0);
        }
        if let Some(h) = &p.hostname
            && libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0
        {
            fail(status_fd, Step::SetHostname, 0);
        }
        for (i, s) in p.sysctls.iter().enumerate() {
            let fd = libc::open(s.path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                fail(status_fd, Step::OpenSysctl, i as u32);
            }
            if libc::write(fd, s.value.as_ptr().cast(), s.value.len()) < 0 {
                fail(status_fd, Step::WriteSysctl, i as u32);
            }
            libc::close(fd);
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
        // And `ps`/`pgrep -f` should not take it for a shim (see PAUSE_ARGV0). Before the
        // privileges go, as a rule: nothing after the drop should depend on what it was.
        if let Some(a) = p.argv {
            // SAFETY: [start, start + len) is this process's argv memory as the kernel reports
            // it (initial stack, writable), copied by the clone and referenced by nothing else
            // in the child.
            let area = std::slice::from_raw_parts_mut(a.start as *mut u8, a.len);
            overwrite_argv(area, &p.title);
        }
        let mut cap = 0;
        while cap <= p.cap_last {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                fail(status_fd, Step::DropCapabilities, cap as u32);
            }
            cap += 1;
        }
        // Raw syscalls: glibc's wrappers would try to signal the shim's other threads.
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
            fail(status_fd, Step::SetGroups, 0);
        }
        if libc::syscall(libc::SYS_setresgid, PAUSE_GID, PAUSE_GID, PAUSE_GID) != 0 {
            fail(status_fd, Step::SetGid, 0);
        }
        if libc::syscall(libc::SYS_setresuid, PAUSE_UID, PAUSE_UID, PAUSE_UID) != 0 {
            fail(status_fd, Step::SetUid, 0);
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
        {
            fail(status_fd, Step::NoNewPrivs, 0);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            fail(status_fd, Step::BlockSignals, 0);
        }
        // Nothing of the shim's stays open here (sockets, pipes, fifos, netns fds): close all
        // but the status pipe, report, then close that too.
        close_all_but(&Syscalls, status_fd as u32, p.fd_limit, p.use_close_range);
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

    /// Waits until the pause process holds no fd (the status pipe closes right after the
    /// report); returns how many it still holds.
    fn open_fds(pid: i32) -> usize {
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
        fds()
    }

    /// Runs `f` on a throwaway thread that joined the namespace `ns` (of type `kind`).
    fn in_ns<T: Send + 'static>(
        ns: File,
        kind: nix::sched::CloneFlags,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).unwrap();
            nix::sched::setns(&ns, kind).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    #[test]
    #[ignore = "needs root: creates namespaces and drops to 65535"]
    fn pause_holds_new_namespaces_unprivileged() {
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            hostname: Some("pod-a".into()),
            sysctls: vec![("kernel.shm_rmid_forced".into(), "1".into())],
            ..Default::default()
        };
        // An fd the shim holds without O_CLOEXEC must not reach the pause process either.
        let inherited = nix::unistd::dup(std::io::stdin()).unwrap();
        let pid = spawn(&cfg).unwrap();
        drop(inherited);
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
        assert_eq!(open_fds(pid), 0, "fds inherited by the pause process");
        // Hostname and the IPC sysctl live in its namespaces.
        let uts = File::open(format!("/proc/{pid}/ns/uts")).unwrap();
        let got = in_ns(uts, nix::sched::CloneFlags::CLONE_NEWUTS, || {
            nix::unistd::gethostname().unwrap().into_string().unwrap()
        });
        assert_eq!(got, "pod-a");
        let ipc = File::open(format!("/proc/{pid}/ns/ipc")).unwrap();
        let got = in_ns(ipc, nix::sched::CloneFlags::CLONE_NEWIPC, || {
            std::fs::read_to_string("/proc/sys/kernel/shm_rmid_forced").unwrap()
        });
        assert_eq!(got.trim(), "1");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(wait_exit(pid), 0);
    }

    #[test]
    #[ignore = "needs root: creates namespaces"]
    fn a_failing_sysctl_is_reported_by_name() {
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            sysctls: vec![
                ("kernel.shm_rmid_forced".into(), "1".into()),
                ("kernel.no_such_sysctl_rsandbox".into(), "1".into()),
            ],
            ..Default::default()
        };
        let err = spawn(&cfg).unwrap_err();
        assert_eq!(
            err.message(),
            "pause: open the file of sysctl kernel.no_such_sysctl_rsandbox \
             (/proc/sys/kernel/no_such_sysctl_rsandbox): No such file or directory (os error 2)"
        );
        // The child exited on its own; reap it so no zombie is left.
        let _ = nix::sys::wait::waitpid(None, None);
    }

    /// Regression: the pause process wrote `net.ipv4.conf.eth0/100.forwarding` to
    /// `/proc/sys/net/ipv4/conf/eth0/100/forwarding` (dots replaced, slashes kept).
    #[test]
    fn slash_form_sysctls_get_the_spec_path() {
        let cfg = PauseConfig {
            sysctls: vec![
                ("net.ipv4.conf.eth0/100.forwarding".into(), "1".into()),
                ("net/ipv4/conf/eth0.101/forwarding".into(), "1".into()),
                ("kernel.shmmax".into(), "1000".into()),
            ],
            ..Default::default()
        };
        let p = prepare(&cfg).unwrap();
        let paths: Vec<&str> = p.sysctls.iter().map(|s| s.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/proc/sys/net/ipv4/conf/eth0.100/forwarding",
                "/proc/sys/net/ipv4/conf/eth0.101/forwarding",
                "/proc/sys/kernel/shmmax",
            ]
        );
        for (s, (name, _)) in p.sysctls.iter().zip(&cfg.sysctls) {
            assert_eq!(
                s.path.to_str().unwrap(),
                sysctl_path(name).to_str().unwrap()
            );
        }
    }

    /// The same, for real: an interface with a dot in its name in a fresh netns.
    #[test]
    #[ignore = "needs root: creates a netns, a veth pair and namespaces"]
    fn slash_form_sysctl_reaches_the_interface() {
        let dir = tempfile::tempdir().unwrap();
        let ns = crate::netns::NetNs::create(dir.path(), "pause-sysctl").unwrap();
        struct RemoveNs(PathBuf);
        impl Drop for RemoveNs {
            fn drop(&mut self) {
                let _ = crate::netns::NetNs::remove(&self.0);
            }
        }
        let _rm = RemoveNs(ns.path().to_path_buf());
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", ns.path().display()))
            .args([
                "ip", "link", "add", "v0.100", "type", "veth", "peer", "name", "v1",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let read = || {
            let f = File::open(ns.path()).unwrap();
            in_ns(f, nix::sched::CloneFlags::CLONE_NEWNET, || {
                std::fs::read_to_string("/proc/sys/net/ipv4/conf/v0.100/arp_ignore").unwrap()
            })
        };
        assert_eq!(read().trim(), "0");
        let cfg = PauseConfig {
            netns: Some(ns.path().to_path_buf()),
            new_ipc: true,
            new_uts: true,
            sysctls: vec![("net.ipv4.conf.v0/100.arp_ignore".into(), "2".into())],
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        assert_eq!(read().trim(), "2");
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

    /// Records the close calls; `close_range` answers as scripted.
    struct FakeClose {
        close_range_works: bool,
        ranges: std::cell::RefCell<Vec<(u32, u32)>>,
        closed: std::cell::RefCell<Vec<u32>>,
    }

    impl FakeClose {
        fn new(close_range_works: bool) -> FakeClose {
            FakeClose {
                close_range_works,
                ranges: Default::default(),
                closed: Default::default(),
            }
        }
    }

    impl CloseFds for FakeClose {
        fn close_range(&self, first: u32, last: u32) -> bool {
            self.ranges.borrow_mut().push((first, last));
            self.close_range_works
        }
        fn close(&self, fd: u32) {
            self.closed.borrow_mut().push(fd);
        }
    }

    #[test]
    fn close_range_closes_around_the_status_pipe() {
        let f = FakeClose::new(true);
        close_all_but(&f, 5, 1024, true);
        assert_eq!(*f.ranges.borrow(), [(0, 4), (6, u32::MAX)]);
        assert!(f.closed.borrow().is_empty());
        let f = FakeClose::new(true);
        close_all_but(&f, 0, 1024, true);
        assert_eq!(*f.ranges.borrow(), [(1, u32::MAX)]);
    }

    /// Regression: a failing close_range (ENOSYS before Linux 5.9, EPERM under seccomp) left
    /// every inherited fd open in the pause process.
    #[test]
    fn a_failing_close_range_falls_back_to_closing_one_by_one() {
        let f = FakeClose::new(false);
        close_all_but(&f, 3, 8, true);
        assert_eq!(*f.closed.borrow(), [0, 1, 2, 4, 5, 6, 7]);
        let f = FakeClose::new(true);
        close_all_but(&f, 3, 8, false);
        assert!(f.ranges.borrow().is_empty());
        assert_eq!(*f.closed.borrow(), [0, 1, 2, 4, 5, 6, 7]);
    }

    #[test]
    #[ignore = "needs root: creates namespaces and drops to 65535"]
    fn the_fallback_leaves_no_fd_open() {
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            ..Default::default()
        };
        let mut p = prepare(&cfg).unwrap();
        p.use_close_range = false;
        let inherited = nix::unistd::dup(std::io::stdin()).unwrap();
        let pid = spawn_prepared(&cfg, p).unwrap();
        drop(inherited);
        let _kill = KillOnDrop(pid);
        assert_eq!(open_fds(pid), 0);
    }

    #[test]
    fn the_fd_limit_covers_every_open_fd() {
        let limit = fd_limit();
        let fd = nix::unistd::dup(std::io::stdin()).unwrap();
        assert!((fd.as_raw_fd() as u32) < limit, "{limit}");
        assert!(limit <= 1 << 30, "{limit}");
    }

    #[test]
    fn every_step_survives_the_wire() {
        for s in Step::ALL {
            assert_eq!(Step::from_wire(s as u8), s);
        }
        assert_eq!(Step::from_wire(200), Step::Unknown);
    }

    #[test]
    fn the_title_fills_the_argv_area() {
        let mut area = *b"/usr/bin/containerd-shim-rsandbox-v1\0-id\0pod-1\0";
        overwrite_argv(&mut area, &title("pod-1"));
        let want = b"rsandbox-pause\0pod-1\0";
        assert_eq!(&area[..want.len()], want);
        assert!(area[want.len()..].iter().all(|b| *b == 0));
        // Too small: truncated, and the last byte stays NUL.
        let mut small = [b'x'; 10];
        overwrite_argv(&mut small, &title("pod-1"));
        assert_eq!(&small, b"rsandbox-\0");
        overwrite_argv(&mut [], &title("pod-1"));
        let mut one = [b'x'];
        overwrite_argv(&mut one, &title("pod-1"));
        assert_eq!(one, [0]);
        assert_eq!(title(""), b"rsandbox-pause\0");
    }

    #[test]
    fn the_argv_area_comes_from_proc_stat() {
        // comm with blanks and a parenthesis; fields 48/49 are arg_start/arg_end.
        let mut stat = String::from("4242 (a b) c) S");
        for field in 4..=47 {
            stat.push_str(&format!(" {field}"));
        }
        stat.push_str(" 140727129148119 140727129148139 140727129148139 0 0\n");
        assert_eq!(
            ArgvArea::parse_stat(&stat),
            Some(ArgvArea {
                start: 140727129148119,
                len: 20
            })
        );
        assert_eq!(ArgvArea::parse_stat("4242 (x) S 1 2"), None);
        let reversed = stat.replace("140727129148119 140727129148139", "9 8");
        assert_eq!(ArgvArea::parse_stat(&reversed), None);
        // Ours: the area holds this test binary's argv[0].
        let a = ArgvArea::of_self().unwrap();
        let argv0 = std::env::args_os().next().unwrap();
        // SAFETY: the kernel reports [start, start + len) as this process's argv memory.
        let mem = unsafe { std::slice::from_raw_parts(a.start as *const u8, a.len) };
        assert!(mem.starts_with(argv0.as_bytes()), "{mem:?}");
    }

    #[test]
    #[ignore = "needs root: creates namespaces and drops to 65535"]
    fn the_pause_process_is_named_after_the_pod() {
        let cfg = PauseConfig {
            new_ipc: true,
            new_uts: true,
            pod_id: "pod-b".into(),
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        assert_eq!(args, [&b"rsandbox-pause"[..], b"pod-b"]);
        assert_eq!(status_field(pid, "Name"), "pause");
        // The shim's own command line is untouched.
        let ours = std::fs::read("/proc/self/cmdline").unwrap();
        let argv0 = std::env::args_os().next().unwrap();
        assert!(ours.starts_with(argv0.as_bytes()));
    }

    #[test]
    fn only_the_child_sets_the_flag() {
        assert!(!IN_FORKED_CHILD.load(Ordering::SeqCst));
    }
}
