//! The pod's namespace holder ("pause"): a forked child of the shim that sets the pod up and
//! then executes our own pause program ([`super::pause_image`]).
//!
//! Why a fork and not runc with a pause image:
//! - latency: one `clone(2)` and one `execveat(2)` of a 2 KB static program (well under a
//!   millisecond) instead of `runc create` + `runc start` of a pause container (~100 ms with
//!   runc's Go start-up and its fork chain);
//! - memory: the pause program maps a few pages (no libc, no heap), ~16 KiB of PSS;
//! - security: no host binary runs inside the pod's namespaces (nothing for a container to
//!   overwrite through `/proc/<pid>/exe`, CVE-2019-5736: the program is a sealed memfd).
//!
//! # What a container of the pod can reach through the pause
//!
//! In a pod that shares its PID namespace the pause is PID 1, and a container with
//! `CAP_SYS_PTRACE` can open `/proc/1/root`, `/proc/1/cwd`, `/proc/1/mountinfo`,
//! `/proc/1/environ` and `/proc/1/mem`. So the pause holds nothing of the node:
//! - its own mount namespace, every mount made private, then `pivot_root` into an empty,
//!   read-only tmpfs and the node's tree detached: its root, cwd and mount table show one empty
//!   directory (where `pivot_root` cannot work, on an initramfs root, the tmpfs is moved over
//!   `/` and chrooted into);
//! - a clean address space and an empty environment (the exec), no descriptor at all;
//! - uid/gid 65535, no capabilities (bounding set dropped), `no_new_privs`, non-dumpable, and
//!   the program's own seccomp allow-list of the calls its loop makes.
//!
//! The pod's containers never join this mount namespace (runc gives them their own), and it
//! is always the node's user namespace's, also in a user-namespaced pod: no process of the pod
//! may enter it.
//!
//! # Steps
//!
//! The child is created with a raw `clone` (new mount, IPC and UTS namespaces, a new PID
//! namespace when the pod shares one, in which it is PID 1), joins the pod netns, sets the
//! hostname and the pod sysctls (net.* resolve to the netns and kernel.shm*/msg*/sem/
//! fs.mqueue.* to the IPC namespace of the writer: so they are written before the root goes),
//! pivots into the empty root, drops every privilege, closes every descriptor but two, and
//! executes the pause program with `argv` `rsandbox-pause <pod id>` and no environment. Its
//! errors travel back over a close-on-exec pipe as (step, errno, index); the program itself
//! writes one 0 byte on that pipe (its descriptor 0) once its seccomp filter is on.
//!
//! # User-namespaced pods
//!
//! With `userns_options` mode POD the pause lives in a user namespace with the pod's maps, and
//! its IPC, UTS and PID namespaces belong to it, so that the pod's containers, which run in
//! that user namespace, can join them. Its mount namespace does not: the containers never join
//! it (runc makes theirs), and one of the pod's user namespace would let a container with
//! `CAP_SYS_ADMIN` in it `setns` into it and undo the empty root (on an initramfs root, where
//! the node's tree stays under the tmpfs moved over `/`, see it). The order is runc's
//! (`nsexec.c`), with the mount namespace first: the child is cloned into a new mount namespace
//! (the node's user namespace's), joins the pod netns and writes its net.* sysctls while it
//! still has the node's privileges, enters its empty root, then enters the user namespace:
//! - containerd's CRI makes the netns of such a pod inside a user namespace with the pod's maps
//!   (`setupNetnsWithinUserns`), and the pod must live in that one (its containers need
//!   privilege over their network: sysfs, links; the runc path's pause joins it too): the child
//!   joins the netns's owner and checks that its `/proc/self/{uid,gid}_map` are the pod's;
//! - a netns of the node's user namespace (shim-owned networking, other clients): the child
//!   makes a user namespace and waits on a socket pair until the parent has written
//!   `/proc/<child>/uid_map` and `gid_map`.
//!
//! The kernel refuses a user namespace to a chrooted process, but the child is not one for it
//! after either way into its empty root: `pivot_root` makes the tmpfs the namespace's root, and
//! the tmpfs moved over `/` is the topmost mount on the namespace's root.
//!
//! It then clones the pause with the other new namespaces (a new PID namespace takes effect
//! for children only: the pause is its PID 1), reports the pause's pid on the status pipe and
//! exits; the pause goes to the shim, a child subreaper (the parent waits for the child's end
//! by pidfd, so this holds when `spawn` returns). The pause sets the hostname, becomes root of
//! the namespace (whose root owns the sysctls of its IPC namespace), writes the other sysctls
//! through the node's `/proc` (a descriptor opened before the clone: a sysctl resolves to the
//! namespaces of the process that opens it, whatever `/proc` it is opened through) and goes on
//! as without a user namespace: privileges dropped to 65535 (which the maps must cover:
//! refused otherwise), exec.
//!
//! The forked child never allocates, locks or unwinds: see [`child`].
//!
//! # Files
//!
//! One job per file, each saying what it may and may not do:
//! - this file: the public API ([`spawn`]) and the parent's side of the spawn (the clone, the
//!   reports awaited, a failed child killed);
//! - [`config`]: what the pause should hold ([`PauseConfig`]) and its identity;
//! - [`prepare`]: everything the child needs, allocated and opened before the clone;
//! - [`child`]: the forked child up to the exec: raw system calls only, no allocation, no
//!   locks, no unwinding;
//! - [`userns`]: the shim's side of a user-namespaced pause (maps, handshake, the intermediate
//!   child reaped);
//! - [`status`]: the status pipe's protocol (the child's reports, the parent's reader);
//! - [`process`]: the handle of a started pause ([`PauseProcess`]), signalled by pidfd only.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use crate::records::error::{Context, Error, Result};

mod child;
mod config;
mod prepare;
mod process;
mod status;
#[cfg(test)]
mod tests;
mod userns;

pub use config::{PAUSE_ARGV0, PAUSE_GID, PAUSE_UID, PauseConfig, PauseLabels};
use prepare::{Prepared, prepare};
pub use process::PauseProcess;
use status::{Report, read_status};
use userns::{reap_intermediate, userns_handshake};

/// True in the forked pause child from its first instruction on, false in the shim.
///
/// The child must never unwind (see the module docs). The shim's panic hook
/// ([`crate::shim::panic_hook`]) checks this flag first and, when it is set, calls `_exit` without
/// formatting, logging or unwinding: a panic in the child is a bug, and the only safe reaction
/// in a copy of a multi-threaded process is to vanish (the parent then reports "the child exited
/// before reporting"). Only the child's copy of memory ever sees `true`.
pub use crate::shim::panic_hook::IN_FORKED_CHILD;

/// Starts the pause process; returns its handle (host pid and pidfd) once it holds the
/// namespaces, dropped its privileges and runs the pause program under its seccomp filter. Its
/// exit is reaped by the shim's reaper like any child; signal it through the handle only.
pub fn spawn(cfg: &PauseConfig) -> Result<PauseProcess> {
    let p = prepare(cfg)?;
    let wanted = p
        .exec_label
        .is_some()
        .then_some(cfg.labels.as_ref())
        .flatten();
    let pause = spawn_prepared(cfg, p)?;
    if let Some(l) = wanted {
        let now = std::fs::read(format!("/proc/{}/attr/current", pause.pid())).unwrap_or_default();
        if let Err(e) = check_label(
            &now,
            &l.process,
            &crate::host::selinux::canonicalize_context,
        ) {
            let _ = pause.kill();
            return Err(e);
        }
    }
    Ok(pause)
}

/// That the pause runs under its label (`current`: its `/proc/<pid>/attr/current`): anything
/// else fails it, as a label the kernel refused does (SELinux fails closed). The kernel shows
/// a label in its own form, which need not be the policy's or the pod's (`s0:c1,c2,c3` shows
/// as `s0:c1.c3`): `want` is compared as the kernel gives it back (`canonicalize`, the real
/// one [`crate::host::selinux::canonicalize_context`]), else by component, its level in the
/// kernel's form ([`crate::host::selinux::same_context`]).
fn check_label(
    current: &[u8],
    want: &str,
    canonicalize: &dyn Fn(&str) -> std::io::Result<String>,
) -> Result<()> {
    let now = String::from_utf8_lossy(current);
    let now = now.trim_end_matches(['\0', '\n']);
    let same = now == want
        || canonicalize(want).is_ok_and(|c| c == now)
        || crate::host::selinux::same_context(now, want);
    if !same {
        return Err(Error::precondition(format!(
            "pause: SELinux: it runs as {now:?}, not under the pod's label {want:?}"
        )));
    }
    Ok(())
}

fn spawn_prepared(cfg: &PauseConfig, p: Prepared) -> Result<PauseProcess> {
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pause: create status pipe")?;
    // With a user namespace: the child says on `sync` when it has made it and waits there for
    // its maps (unless it joins the netns's owner), and once it has reported the pause's pid it
    // waits there again, until this end closes: the pause is its child until it exits, so
    // nobody can reap it (and its pid name another process) before we hold its pidfd.
    let sync = match p.pause_flags {
        Some(_) => Some(
            nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            )
            .context("pause: create the sync socket")?,
        ),
        None => None,
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack): the child gets a copy of this
    // thread and runs `child`, which only makes async-signal-safe raw system calls on `p` and
    // never returns. With CLONE_PIDFD (always in `p.flags`) the kernel writes the pidfd into
    // `pidfd` (x86_64 and aarch64 take it as the third argument, parent_tid).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            p.flags as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(Error::from(std::io::Error::last_os_error()).context("pause: clone"));
    }
    if pid == 0 {
        let sync_fd = sync.as_ref().map_or(-1, |(_, theirs)| theirs.as_raw_fd());
        if let Some((ours, _)) = &sync {
            // The parent's end: with it closed here, the child reads EOF if the shim dies
            // during the handshake instead of waiting for ever.
            // SAFETY: close is async-signal-safe; the child never uses this descriptor.
            unsafe { libc::close(ours.as_raw_fd()) };
        }
        child::child(&p, tx.as_raw_fd(), sync_fd);
    }
    let pid = pid as i32;
    // SAFETY: with CLONE_PIDFD the kernel made `pidfd` ours (close-on-exec).
    let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    drop(tx);
    let makes_userns = p.join_userns.is_none();
    drop(p);
    // In a user-namespaced pod the pause is the child's child, its pid reported first.
    let mut pause = sync.is_none().then_some(pid);
    let mut held = None;
    let report = match sync {
        None => read_status(rx, cfg, &mut pause),
        Some((ours, theirs)) => {
            drop(theirs);
            let mut ours = std::fs::File::from(ours);
            let handshake = match &cfg.userns {
                Some(u) if makes_userns => userns_handshake(pid, u, &mut ours),
                _ => Ok(()),
            };
            held = Some(ours);
            match handshake {
                Ok(()) => read_status(rx, cfg, &mut pause),
                Err(e) => Report::NoAnswer(e),
            }
        }
    };
    // SIGKILL to the pause when it is another process (by pid: it is the child's, unreaped
    // while the child lives — so first, before the child is killed and the pause could be
    // reparented to us and reaped), then to the child (by its pidfd: once reaped, its pid may
    // name another process).
    let kill = |pause: Option<i32>| {
        if let Some(p) = pause.filter(|p| *p != pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = PauseProcess::signal(&pidfd);
    };
    match report {
        Report::Ready => match pause {
            Some(pause) if pause == pid => Ok(PauseProcess::new(pid, pidfd)),
            Some(pause) => {
                let pause_fd = process::pidfd_open(pause);
                if pause_fd.is_err() {
                    kill(Some(pause));
                }
                drop(held);
                reap_intermediate(&pidfd);
                let pause_fd = pause_fd.map_err(|e| {
                    Error::from(e).context(format!("pause: open a pidfd of the pause ({pause})"))
                })?;
                Ok(PauseProcess::new(pause, pause_fd))
            }
            None => {
                kill(None);
                Err(Error::internal(
                    "pause: the pause process is ready but its pid never came",
                ))
            }
        },
        // The child reported its failure and exits by itself.
        Report::Failed(e) => Err(e),
        Report::Gone => {
            if pause.is_some_and(|p| p != pid) && held.take().is_some() {
                // Let the intermediate child go, so that the dead pause is ours to inspect.
                reap_intermediate(&pidfd);
            }
            let why = exit_status_of(pause.unwrap_or(pid))
                .map(|code| match super::pause_image::describe_exit(code) {
                    Some(w) => format!(" with status {code}: it could not {w}"),
                    None => format!(" with status {code}"),
                })
                .unwrap_or_default();
            Err(Error::internal(format!(
                "pause: the pause process exited before reporting ready{why}"
            )))
        }
        // Alive and silent (or unknown): it must not stay.
        Report::NoAnswer(e) => {
            kill(pause);
            Err(e)
        }
    }
}

/// The exit status of our child `pid` if it is a zombie not yet reaped (the shim's reaper
/// may win the race: then `None`). Waits up to 100 ms for it to become one.
fn exit_status_of(pid: i32) -> Option<i32> {
    for _ in 0..20 {
        // SAFETY: waitid writes one siginfo_t; WNOWAIT leaves the zombie to the reaper.
        let (r, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            );
            (r, info)
        };
        if r != 0 {
            return None;
        }
        // SAFETY: waitid filled the SIGCHLD fields of `info` (or left them zero: no zombie yet).
        let (spid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if spid == pid {
            return (info.si_code == libc::CLD_EXITED).then_some(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}
