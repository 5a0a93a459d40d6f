//! The pause program, embedded in the shim, and the sealed memfd the pause process runs it from.
//!
//! `pause/pause.rs` is built by `build.rs` (a few kilobytes, static, no libc). Running it
//! instead of staying a forked copy of the shim gives the pause a clean address space: nothing
//! of the shim's memory or environment is left in a process that a container of a shared-PID
//! pod sees as PID 1 (with `CAP_SYS_PTRACE` it could read all of it), and the pause costs a few
//! pages per pod instead of the shim's dirtied pages.
//!
//! The memfd is sealed (no write, grow, shrink, or further seals) and the descriptor the shim
//! keeps is read-only, so nobody, not even a container that reaches `/proc/<pause>/exe`, can
//! change the program (writes fail with EPERM), and each pause gets a memfd of its own: CVE-2019-5736 overwrote runc's binary through that link. No file on
//! the node is involved: `exe` names `/memfd:rsandbox-pause (deleted)`.

use std::ffi::CStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::records::error::{Context, Result};

/// The program (ELF, static).
pub static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rsandbox-pause"));

/// The memfd's name: `/proc/<pause>/exe` reads `/memfd:rsandbox-pause (deleted)`.
const NAME: &CStr = c"rsandbox-pause";

/// `MFD_EXEC` (Linux 6.3): says the memfd is meant to be executed, so a kernel with
/// `vm.memfd_noexec = 1` does not make it non-executable (and does not warn). Older kernels
/// refuse the flag with EINVAL; they have no such policy and get the memfd without it.
const MFD_EXEC: libc::c_uint = 0x10;
/// `F_SEAL_EXEC` (Linux 6.3): the mode's exec bits cannot change either.
const F_SEAL_EXEC: libc::c_int = 0x20;

/// A read-only descriptor of a sealed memfd holding [`PROGRAM`], close-on-exec (`execveat` with
/// `AT_EMPTY_PATH` runs it all the same).
pub fn sealed() -> Result<OwnedFd> {
    let fd = memfd(libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | MFD_EXEC)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => memfd(libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING),
            _ => Err(e),
        })
        .context("pause program: memfd_create")?;
    let mut file = File::from(fd);
    file.write_all(PROGRAM)
        .context("pause program: write the memfd")?;
    // Execute-only: the pause's own uid cannot read the file, so the kernel makes the process
    // non-dumpable from the exec on (no window before the program's own prctl in which a
    // process of uid 65535 could attach to it). Root (the shim) reads it all the same.
    // SAFETY: fchmod on an open memfd.
    if unsafe { libc::fchmod(file.as_raw_fd(), 0o111) } != 0 {
        return Err(
            crate::records::error::Error::from(std::io::Error::last_os_error())
                .context("pause program: chmod the memfd"),
        );
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    add_seals(&file, seals | F_SEAL_EXEC)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => add_seals(&file, seals),
            _ => Err(e),
        })
        .context("pause program: seal the memfd")?;
    // The descriptor we wrote through counts as a writer: executing the file while it is open
    // fails with ETXTBSY. Keep a read-only one instead (as runc does for its memfd copy).
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let ro = std::fs::OpenOptions::new()
        .read(true)
        .open(&path)
        .with_context(|| format!("pause program: reopen {path} read-only"))?;
    Ok(OwnedFd::from(ro))
}

fn memfd(flags: libc::c_uint) -> std::io::Result<OwnedFd> {
    // SAFETY: NAME is a NUL-terminated string; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn add_seals(file: &File, seals: libc::c_int) -> std::io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int; `file` is an open memfd.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the pause program failed to do, from its exit status during set-up
/// (`pause/pause.rs`).
pub fn describe_exit(code: i32) -> Option<&'static str> {
    Some(match code {
        120 => "mark itself non-dumpable",
        121 => "block its signals",
        122 => "install its seccomp filter",
        123 => "report ready",
        124 => "name itself",
        127 => "panic (a bug)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    #[test]
    fn the_program_is_a_small_static_elf() {
        assert_eq!(&PROGRAM[..4], b"\x7fELF");
        assert!(PROGRAM.len() < 16 * 1024, "{} bytes", PROGRAM.len());
        // No program interpreter (PT_INTERP names a dynamic loader's path).
        assert!(
            !PROGRAM.windows(3).any(|w| w == b"ld-"),
            "the pause program must not need a dynamic loader"
        );
    }

    #[test]
    fn the_memfd_is_sealed_and_read_only() {
        let fd = sealed().unwrap();
        // SAFETY: F_GET_SEALS on an open memfd.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        for s in [
            libc::F_SEAL_SEAL,
            libc::F_SEAL_SHRINK,
            libc::F_SEAL_GROW,
            libc::F_SEAL_WRITE,
        ] {
            assert_ne!(seals & s, 0, "seal {s:#x} missing from {seals:#x}");
        }
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        // Opening it for writing works (as for any file one may read), writing does not.
        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let err = w.write_all(b"\x7fELF").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
        drop(w);
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got, PROGRAM);
        let link = std::fs::read_link(&path).unwrap();
        assert_eq!(link.to_str().unwrap(), "/memfd:rsandbox-pause (deleted)");
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&path).unwrap());
        assert_eq!(mode & 0o7777, 0o111, "execute-only");
        // SAFETY: F_GETFD on an open descriptor.
        let fdflags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fdflags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }

    fn status_field(pid: u32, key: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
            .unwrap_or_else(|| panic!("no {key} in {s}"))
            .trim()
            .to_string()
    }

    /// The program alone: it names itself, confines itself with seccomp, reports ready on fd 0,
    /// survives SIGCHLD and ends on SIGTERM with status 0.
    #[test]
    fn the_program_runs_confined_and_ends_on_sigterm() {
        let fd = sealed().unwrap();
        let (mut ready_rx, ready_tx) = std::io::pipe().unwrap();
        let mut cmd = std::process::Command::new(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        cmd.stdin(ready_tx).stdout(std::process::Stdio::null());
        // SAFETY: prctl is async-signal-safe; no_new_privs lets an unprivileged process install
        // a seccomp filter, as in the pause process.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        let mut byte = Vec::new();
        ready_rx.read_to_end(&mut byte).unwrap();
        assert_eq!(byte, [0], "the ready report");
        let pid = child.id();
        assert_eq!(status_field(pid, "Seccomp"), "2");
        assert_eq!(status_field(pid, "Name"), "pause");
        let kill = |s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s).unwrap();
        kill(nix::sys::signal::Signal::SIGCHLD);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            child.try_wait().unwrap().is_none(),
            "SIGCHLD ended the pause"
        );
        kill(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }
}
