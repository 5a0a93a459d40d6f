//! The forked child, from the clone to the exec of the pause program: the namespaces joined
//! and made, hostname and sysctls, the empty root, every privilege dropped, every descriptor
//! closed, the exec.
//!
//! # It never allocates, locks or unwinds
//!
//! The shim is multi-threaded: in the copy, anything that may take a lock (malloc, glibc's set*id
//! broadcast to all threads, stdio) can deadlock on a lock another thread held at the clone, and
//! an unwinding panic would run the shim's code (destructors, the RPC loop) in a second process.
//! So everything here makes only raw, async-signal-safe system calls on data the parent prepared
//! ([`Prepared`]): no `unwrap`/`expect`, no slice indexing, no `format!`, no `Vec`/`String`, no
//! `std::fs`, and every exit is `_exit` (failures through [`fail`]). The child first sets
//! [`IN_FORKED_CHILD`], so a panic hook that runs anyway (a bug) can `_exit` at once instead
//! of unwinding.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::config::{PAUSE_GID, PAUSE_UID};
use super::prepare::{Prepared, PreparedSysctl, ROOT_FSTYPE, ROOT_OPTIONS, ROOT_SOURCE};
use super::status::{PID_REPORT, REPORT_LEN, Step, fail};
use crate::shim::panic_hook::IN_FORKED_CHILD;

/// The descriptor the pause program reports ready on (`READY_FD` in `pause/pause.rs`).
const READY_FD: libc::c_int = 0;

/// Whether the file at `path` (relative to the directory `dir`) holds exactly `want` (at most
/// 4 KiB). Raw system calls on a stack buffer: it runs in the forked child.
///
/// # Safety
/// Only with `path` NUL-terminated.
unsafe fn file_is(dir: libc::c_int, path: &CStr, want: &[u8]) -> bool {
    let mut buf = [0u8; 4096];
    // SAFETY: openat/read/close into our own stack buffer.
    unsafe {
        let fd = libc::openat(dir, path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let mut got = 0usize;
        while got < buf.len() {
            let n = libc::read(fd, buf.as_mut_ptr().add(got).cast(), buf.len() - got);
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        libc::close(fd);
        buf.get(..got) == Some(want)
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

/// Closes every fd but the two in `keep`: with `close_range` when it works, else one by one
/// below `limit`. No allocation, no panics (it runs in the forked child).
fn close_all_but<C: CloseFds, const N: usize>(
    sys: &C,
    mut keep: [u32; N],
    limit: u32,
    use_close_range: bool,
) {
    keep.sort_unstable(); // in place: no allocation
    if use_close_range {
        let ok = |first: u32, last: u32| first > last || sys.close_range(first, last);
        // The gaps: below the first kept fd, between two, above the last.
        let mut all = true;
        let mut next = 0u32; // the first fd not yet accounted for
        for &k in &keep {
            if k >= next {
                if k > next {
                    all &= ok(next, k - 1);
                }
                next = k.saturating_add(1);
            }
        }
        if keep.last() != Some(&u32::MAX) {
            all &= ok(next, u32::MAX);
        }
        if all {
            return;
        }
    }
    let mut fd = 0;
    while fd < limit {
        if !keep.contains(&fd) {
            sys.close(fd);
        }
        fd += 1;
    }
}

/// Moves the child into an empty, read-only root of its own mount namespace (created by the
/// clone, always in the node's user namespace): mounts made private (nothing propagates to or
/// from the node), a one-page tmpfs on `p.root`, `pivot_root` into it and the node's tree
/// detached. Only where the node's root is the initramfs (`rootfs`, which `pivot_root` cannot
/// leave) is the tmpfs moved over `/` and chrooted into instead: the node's mounts then stay
/// referenced by the namespace (out of reach of the pause's root and cwd, and of the pod: the
/// namespace is the node's user namespace's, so no process of the pod's may enter it) for the
/// pod's life; anywhere else a failed `pivot_root` fails the start. Either way the child is
/// not "chrooted" for the kernel afterwards (its root is the namespace's topmost root), so it
/// may still create or join a user namespace. Raw system calls only.
///
/// # Safety
/// Only in the forked child.
unsafe fn enter_empty_root(p: &Prepared, status_fd: i32) {
    // SAFETY: as the two halves require.
    unsafe {
        let (old_root, new_root) = mount_empty_root(&p.root, status_fd);
        let may_move = p.root_is_rootfs || !p.use_pivot_root;
        pivot_into(old_root, new_root, p.use_pivot_root, may_move, status_fd);
    }
}

/// The first half of [`enter_empty_root`]: mounts private, the tmpfs on `root`; returns
/// descriptors of the old root and of the new one (close-on-exec).
///
/// # Safety
/// Only in the forked child, with `root` NUL-terminated.
unsafe fn mount_empty_root(root: &CStr, status_fd: i32) -> (libc::c_int, libc::c_int) {
    // SAFETY: raw system calls on NUL-terminated constants and `root`.
    unsafe {
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            fail(status_fd, Step::PrivateMounts, 0);
        }
        if libc::mount(
            ROOT_SOURCE.as_ptr(),
            root.as_ptr(),
            ROOT_FSTYPE.as_ptr(),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            ROOT_OPTIONS.as_ptr().cast(),
        ) != 0
        {
            fail(status_fd, Step::MountRoot, 0);
        }
        let flags = libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC;
        let old_root = libc::open(c"/".as_ptr(), flags);
        let new_root = libc::open(root.as_ptr(), flags);
        if old_root < 0 || new_root < 0 {
            fail(status_fd, Step::PivotRoot, 0);
        }
        (old_root, new_root)
    }
}

/// The second half of [`enter_empty_root`]: `pivot_root` into `new_root`, the node's tree
/// (from `old_root`) detached (unless `pivot` is false); where that fails and `may_move`, the
/// tmpfs moved over `/` and chrooted into; both descriptors closed.
///
/// # Safety
/// Only in the forked child, with the descriptors of [`mount_empty_root`].
unsafe fn pivot_into(
    old_root: libc::c_int,
    new_root: libc::c_int,
    pivot: bool,
    may_move: bool,
    status_fd: i32,
) {
    // SAFETY: raw system calls on NUL-terminated constants; fds are our own.
    unsafe {
        if libc::fchdir(new_root) != 0 {
            fail(status_fd, Step::PivotRoot, 0);
        }
        // As runc: pivot_root(".", ".") stacks the old root on the new one; from the old root's
        // descriptor, detach it and everything below it.
        if pivot && libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0 {
            if libc::fchdir(old_root) != 0 || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                fail(status_fd, Step::DetachNodeRoot, 0);
            }
        } else if !may_move
            || libc::mount(
                c".".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_MOVE,
                std::ptr::null(),
            ) != 0
            || libc::chroot(c".".as_ptr()) != 0
        {
            fail(status_fd, Step::PivotRoot, 0);
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            fail(status_fd, Step::PivotRoot, 0);
        }
        libc::close(old_root);
        libc::close(new_root);
    }
}

/// The child side. Only raw system calls; no allocation, no locks, no panics.
///
/// Without a user namespace the child is the pause. With one (`p.pause_flags`), the child joins
/// the pod netns and writes the net.* sysctls with the node's privileges, enters its empty root
/// in its mount namespace (the clone's, the node's user namespace's), joins the user namespace
/// that owns the netns (`p.join_userns`) or makes one and waits on `sync_fd` for the parent to
/// write its maps, and clones the pause into new IPC, UTS and PID namespaces owned by it (a new
/// PID namespace only applies to children: the pause is PID 1 there); it reports the pause's
/// pid on the status pipe and exits, and the pause goes to the shim, a child subreaper.
pub(super) fn child(p: &Prepared, status_fd: i32, sync_fd: i32) -> ! {
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
        let Some(pause_flags) = p.pause_flags else {
            if let Some(h) = &p.hostname
                && libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0
            {
                fail(status_fd, Step::SetHostname, 0);
            }
            write_sysctls(p, status_fd, |_| true);
            become_pause(p, status_fd, false);
        };
        write_sysctls(p, status_fd, |s| s.in_netns);
        // Before the user namespace, with the node's privileges: this mount namespace stays
        // the node's user namespace's, out of reach of every process of the pod's.
        enter_empty_root(p, status_fd);
        if let Some(owner) = &p.join_userns {
            if libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                fail(status_fd, Step::JoinUserns, 0);
            }
            let [uids, gids] = &p.expected_maps;
            let proc = p.proc.as_raw_fd();
            if !file_is(proc, c"self/uid_map", uids) || !file_is(proc, c"self/gid_map", gids) {
                *libc::__errno_location() = libc::EINVAL;
                fail(status_fd, Step::CheckMaps, 0);
            }
        } else {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                fail(status_fd, Step::UnshareUserns, 0);
            }
            let mut b = [1u8];
            if libc::write(sync_fd, b.as_ptr().cast(), 1) != 1
                || libc::read(sync_fd, b.as_mut_ptr().cast(), 1) != 1
            {
                fail(status_fd, Step::WaitForMaps, 0);
            }
        }
        let pid = libc::syscall(
            libc::SYS_clone,
            pause_flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        );
        if pid < 0 {
            fail(status_fd, Step::CreateNamespaces, 0);
        }
        if pid == 0 {
            if let Some(h) = &p.hostname
                && libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0
            {
                fail(status_fd, Step::SetHostname, 0);
            }
            // The sysctls of its IPC namespace are its root's to write (from the node's
            // `/proc`, held open: its own root is empty already).
            if libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
            {
                fail(status_fd, Step::BecomeNsRoot, 0);
            }
            write_sysctls(p, status_fd, |s| !s.in_netns);
            become_pause(p, status_fd, true);
        }
        // Its pid in this PID namespace, the shim's: the pause's host pid.
        let pid = (pid as i32).to_ne_bytes();
        let rec: [u8; REPORT_LEN] = [
            PID_REPORT, 0, 0, 0, pid[0], pid[1], pid[2], pid[3], 0, 0, 0, 0,
        ];
        libc::write(status_fd, rec.as_ptr().cast(), rec.len());
        // Alive until the parent holds the pause's pidfd (it closes its end of `sync_fd`):
        // until then the pause is this process's child, and nobody reaps it. The status pipe
        // is closed first, so that the pause's own end still tells the parent if it dies.
        libc::close(status_fd);
        let mut b = [0u8];
        libc::read(sync_fd, b.as_mut_ptr().cast(), 1);
        libc::_exit(0);
    }
}

/// Writes the sysctls that `which` picks, reporting a failure by its index. Raw system calls.
fn write_sysctls(p: &Prepared, status_fd: i32, which: impl Fn(&PreparedSysctl) -> bool) {
    for (i, s) in p.sysctls.iter().enumerate() {
        if !which(s) {
            continue;
        }
        // SAFETY: open/write/close on a NUL-terminated path and a buffer prepared before the
        // clone.
        unsafe {
            let fd = libc::openat(
                p.proc.as_raw_fd(),
                s.path.as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                fail(status_fd, Step::OpenSysctl, i as u32);
            }
            if libc::write(fd, s.value.as_ptr().cast(), s.value.len()) < 0 {
                fail(status_fd, Step::WriteSysctl, i as u32);
            }
            libc::close(fd);
        }
    }
}

/// The pause's last steps: its empty root (unless it is in it already), every privilege dropped, every descriptor but the
/// status pipe closed, the exec. Raw system calls; never returns.
fn become_pause(p: &Prepared, status_fd: i32, in_empty_root: bool) -> ! {
    // SAFETY: as in `child`.
    unsafe {
        if !in_empty_root {
            enter_empty_root(p, status_fd);
        }
        // The pod's SELinux process label for the exec, written while the node's /proc is
        // still open here (the label survives the uid change below; the exec takes it). A
        // label that cannot be set fails the pause (runc fails closed too): it must never run
        // in the shim's own, far more privileged domain instead of the pod's.
        let labelled = p.exec_label.is_some();
        if let Some(label) = &p.exec_label {
            let fd = libc::openat(
                p.proc.as_raw_fd(),
                c"thread-self/attr/exec".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                fail(status_fd, Step::SetExecLabel, 0);
            }
            let len = label.as_bytes().len();
            if libc::write(fd, label.as_ptr().cast(), len) != len as isize {
                fail(status_fd, Step::SetExecLabel, 0);
            }
            libc::close(fd);
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
        // The exec makes the process dumpable again: the pause program clears it first thing.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
        {
            fail(status_fd, Step::NoNewPrivs, 0);
        }
        // Blocked until the program waits for them (the mask survives the exec): a SIGTERM
        // from the shim in between is kept pending, not lost.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            fail(status_fd, Step::BlockSignals, 0);
        }
        // Nothing of the shim's stays open here (sockets, pipes, fifos, netns fds): close all
        // but the status pipe and the program; the program gets the pipe as its descriptor 0
        // (both originals are close-on-exec).
        let program = p.program.as_raw_fd();
        // Kept: the status pipe and the program.
        close_all_but(
            &Syscalls,
            [status_fd as u32, program as u32],
            p.fd_limit,
            p.use_close_range,
        );
        if status_fd == READY_FD
            || program == READY_FD
            || libc::dup3(status_fd, READY_FD, 0) != READY_FD
        {
            fail(status_fd, Step::ReadyFd, 0);
        }
        libc::syscall(
            libc::SYS_execveat,
            program,
            c"".as_ptr(),
            p.argv_ptrs.as_ptr(),
            p.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
        // With a label, a refused exec is the policy refusing the pod's domain (EACCES for
        // the transition or the entry point, EPERM when no_new_privs forbids it without
        // nnp_transition), or the exec's own failure: either way the pause does not run, and
        // never unlabelled (the old fallback ran it in the shim's domain).
        fail(status_fd, exec_failure_step(labelled), 0);
    }
}

/// The step a failed exec of the pause program reports: with an SELinux label, the exec
/// into the pod's domain.
pub(super) fn exec_failure_step(labelled: bool) -> Step {
    if labelled {
        Step::ExecInDomain
    } else {
        Step::Exec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn close_range_closes_around_the_kept_fds() {
        let f = FakeClose::new(true);
        close_all_but(&f, [9, 5], 1024, true);
        assert_eq!(*f.ranges.borrow(), [(0, 4), (6, 8), (10, u32::MAX)]);
        assert!(f.closed.borrow().is_empty());
        let f = FakeClose::new(true);
        close_all_but(&f, [0, 1], 1024, true);
        assert_eq!(*f.ranges.borrow(), [(2, u32::MAX)]);
        let f = FakeClose::new(true);
        close_all_but(&f, [3, 3], 1024, true);
        assert_eq!(*f.ranges.borrow(), [(0, 2), (4, u32::MAX)]);
    }

    /// Regression: a failing close_range (ENOSYS before Linux 5.9, EPERM under seccomp) left
    /// every inherited fd open in the pause process.
    #[test]
    fn a_failing_close_range_falls_back_to_closing_one_by_one() {
        let f = FakeClose::new(false);
        close_all_but(&f, [3, 6], 8, true);
        assert_eq!(*f.closed.borrow(), [0, 1, 2, 4, 5, 7]);
        let f = FakeClose::new(true);
        close_all_but(&f, [6, 3], 8, false);
        assert!(f.ranges.borrow().is_empty());
        assert_eq!(*f.closed.borrow(), [0, 1, 2, 4, 5, 7]);
    }

    #[test]
    fn only_the_child_sets_the_flag() {
        assert!(!IN_FORKED_CHILD.load(Ordering::SeqCst));
    }
}
