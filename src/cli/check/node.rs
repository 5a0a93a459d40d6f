//! The node as `check` sees it: every read, command and system call goes through [`Node`],
//! so tests can stand in a node CI does not have (containerd 2.2 to 2.4, cgroup v2, systemd,
//! SELinux enforcing, an old kernel). [`System`] is the real one.
//!
//! Nothing here may hang: commands are killed after their timeout (with their process
//! group), systemd gets a deadline, files are read whole (small configs, `/proc`, `/sys`).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What a command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// A kernel facility `check` probes by using it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syscall {
    /// `openat2(2)` with `RESOLVE_IN_ROOT` (Linux 5.6): every rootfs mount target.
    Openat2,
    /// `pidfd_open(2)` (5.3; `CLONE_PIDFD` is 5.2): the pause and every wait on a process.
    PidfdOpen,
    /// `memfd_create(MFD_ALLOW_SEALING)` + `F_ADD_SEALS`: the pause program's image.
    MemfdSeals,
    /// `mount_setattr(2)` (5.12): idmapped mounts of user-namespaced pods.
    MountSetattr,
    /// `close_range(2)` (5.9): the pause child closes inherited descriptors.
    CloseRange,
}

/// Whether a facility works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    Yes,
    /// The kernel lacks it (ENOSYS), or refuses it (EPERM under a seccomp filter): the reason.
    No(String),
}

/// The node.
pub trait Node {
    /// Runs `program` with `args`; killed (with its process group) after `timeout`. `Err`:
    /// it could not run or did not end in time.
    fn run(&self, program: &Path, args: &[&str], timeout: Duration) -> Result<CmdOutput, String>;
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Where a symbolic link points (`/proc/<pid>/exe`).
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;
    fn exists(&self, path: &Path) -> bool;
    /// Names in a directory, files and directories (containerd's import globs, `/proc`).
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// An executable file `name` in this process's `$PATH`.
    fn look_path(&self, name: &str) -> Option<PathBuf>;
    fn env(&self, name: &str) -> Option<String>;
    fn syscall(&self, probe: Syscall) -> Support;
    /// `uname -r`.
    fn kernel_release(&self) -> String;
    /// Whether `path` is a cgroup2 file system.
    fn is_cgroup2(&self, path: &Path) -> bool;
    /// Connects to systemd's manager as the shim does (`crate::host::systemd::manager`).
    fn systemd(&self, timeout: Duration) -> Result<(), String>;
}

/// The real node.
pub struct System;

impl Node for System {
    fn run(&self, program: &Path, args: &[&str], timeout: Duration) -> Result<CmdOutput, String> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        // Messages as containerd and runc print them for anyone.
        cmd.env("LC_ALL", "C");
        let out = crate::shim::reaper::Spawner::direct()
            .output_in_group(&mut cmd, None, timeout)
            .map_err(|e| format!("run {}: {e}", program.display()))?;
        Ok(CmdOutput {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in std::fs::read_dir(dir)? {
            names.push(e?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn look_path(&self, name: &str) -> Option<PathBuf> {
        crate::cli::info::look_path(name, std::env::var_os("PATH").as_deref()).ok()
    }

    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn syscall(&self, probe: Syscall) -> Support {
        let r = match probe {
            Syscall::Openat2 => probe_openat2(),
            Syscall::PidfdOpen => {
                crate::shim::util::pidfd_open(std::process::id() as i32).map(drop)
            }
            Syscall::MemfdSeals => probe_memfd_seals(),
            Syscall::MountSetattr => probe_mount_setattr(),
            Syscall::CloseRange => probe_close_range(),
        };
        match r {
            Ok(()) => Support::Yes,
            Err(e) => Support::No(e.to_string()),
        }
    }

    fn kernel_release(&self) -> String {
        nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn is_cgroup2(&self, path: &Path) -> bool {
        crate::host::cgroups::is_unified(path)
    }

    fn systemd(&self, timeout: Duration) -> Result<(), String> {
        use crate::host::systemd::manager::{Endpoints, Manager};
        Manager::connect(&Endpoints::default(), Instant::now() + timeout)
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// `openat2("/", O_PATH, RESOLVE_IN_ROOT)`, as `crate::host::mount` resolves mount targets.
fn probe_openat2() -> io::Result<()> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_DIRECTORY)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(nix::fcntl::AT_FDCWD, "/", how)
        .map(drop)
        .map_err(io::Error::from)
}

/// A sealed memfd, as `crate::pod::pause_image` makes the pause program's.
fn probe_memfd_seals() -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: the name is a NUL-terminated literal; memfd_create returns a new fd or -1.
    let fd = unsafe {
        libc::memfd_create(
            c"rsandbox-check".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create gave us this new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS takes an int; `fd` is an open memfd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mount_setattr(-1, "", 0, NULL, 0)`: the kernel has the call when it answers anything but
/// ENOSYS (EBADF/EINVAL here); nothing is changed.
fn probe_mount_setattr() -> io::Result<()> {
    // SAFETY: an invalid fd and a null attr pointer with size 0: the kernel validates and
    // fails the call without touching memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1i32,
            c"".as_ptr(),
            0u32,
            std::ptr::null::<u8>(),
            0usize,
        )
    };
    let e = io::Error::last_os_error();
    if r == -1 && matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) {
        return Err(e);
    }
    Ok(())
}

/// `close_range(u32::MAX, u32::MAX, 0)`: closes nothing (no such descriptor).
fn probe_close_range() -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; this range holds none.
    let r = unsafe { libc::syscall(libc::SYS_close_range, u32::MAX, u32::MAX, 0u32) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A scripted node (tests): files, command outputs, syscall answers.
#[cfg(test)]
pub mod fake {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[derive(Default)]
    pub struct FakeNode {
        pub files: BTreeMap<PathBuf, String>,
        /// Symbolic links: the link → its target.
        pub links: HashMap<PathBuf, PathBuf>,
        /// `program args...` (joined by spaces) → what it answers.
        pub commands: HashMap<String, Result<CmdOutput, String>>,
        pub path: HashMap<String, PathBuf>,
        pub env: HashMap<String, String>,
        /// Syscalls not listed work.
        pub syscalls: HashMap<Syscall, Support>,
        pub release: String,
        pub cgroup2: Vec<PathBuf>,
        pub systemd: Option<Result<(), String>>,
        /// Every command run, in order.
        pub ran: std::cell::RefCell<Vec<String>>,
    }

    pub fn ok(stdout: &str) -> Result<CmdOutput, String> {
        Ok(CmdOutput {
            status: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        })
    }

    pub fn failed(status: i32, stderr: &str) -> Result<CmdOutput, String> {
        Ok(CmdOutput {
            status,
            stdout: String::new(),
            stderr: stderr.into(),
        })
    }

    impl FakeNode {
        pub fn file(&mut self, path: &str, text: &str) -> &mut Self {
            self.files.insert(path.into(), text.into());
            self
        }

        pub fn command(&mut self, line: &str, out: Result<CmdOutput, String>) -> &mut Self {
            self.commands.insert(line.into(), out);
            self
        }

        /// An executable in `$PATH` (also a file, so it exists).
        pub fn binary(&mut self, name: &str, path: &str) -> &mut Self {
            self.path.insert(name.into(), path.into());
            self.files.insert(path.into(), String::new());
            self
        }
    }

    impl Node for FakeNode {
        fn run(&self, program: &Path, args: &[&str], _: Duration) -> Result<CmdOutput, String> {
            let line = std::iter::once(program.to_string_lossy().into_owned())
                .chain(args.iter().map(|a| a.to_string()))
                .collect::<Vec<_>>()
                .join(" ");
            self.ran.borrow_mut().push(line.clone());
            self.commands
                .get(&line)
                .cloned()
                .unwrap_or_else(|| Err(format!("run {line}: No such file or directory")))
        }

        fn read(&self, path: &Path) -> io::Result<String> {
            self.files
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            self.links
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn exists(&self, path: &Path) -> bool {
            self.files.contains_key(path) || self.files.keys().any(|f| f.starts_with(path))
        }

        /// The files directly in `dir`, and the directories that hold files below it.
        fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
            let names: std::collections::BTreeSet<String> = self
                .files
                .keys()
                .filter_map(|f| f.strip_prefix(dir).ok()?.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let names: Vec<String> = names.into_iter().collect();
            if names.is_empty() && !self.exists(dir) {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            Ok(names)
        }

        fn look_path(&self, name: &str) -> Option<PathBuf> {
            self.path.get(name).cloned()
        }

        fn env(&self, name: &str) -> Option<String> {
            self.env.get(name).cloned()
        }

        fn syscall(&self, probe: Syscall) -> Support {
            self.syscalls.get(&probe).cloned().unwrap_or(Support::Yes)
        }

        fn kernel_release(&self) -> String {
            self.release.clone()
        }

        fn is_cgroup2(&self, path: &Path) -> bool {
            self.cgroup2.iter().any(|p| p == path)
        }

        fn systemd(&self, _: Duration) -> Result<(), String> {
            self.systemd
                .clone()
                .unwrap_or_else(|| Err("no systemd".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real probes on this machine's kernel (>= 5.6 everywhere the project runs): each
    /// facility the shim depends on works, and none of them changed anything.
    #[test]
    fn real_syscall_probes_work_here() {
        for p in [
            Syscall::Openat2,
            Syscall::PidfdOpen,
            Syscall::MemfdSeals,
            Syscall::MountSetattr,
            Syscall::CloseRange,
        ] {
            assert_eq!(System.syscall(p), Support::Yes, "{p:?}");
        }
        assert!(!System.kernel_release().is_empty());
    }

    /// A command that does not end is killed at its timeout: check never hangs.
    #[test]
    fn a_hanging_command_is_cut_off() {
        let t0 = Instant::now();
        let e = System
            .run(
                Path::new("/bin/sleep"),
                &["600"],
                Duration::from_millis(300),
            )
            .unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(60));
        let out = System
            .run(
                Path::new("/bin/sh"),
                &["-c", "echo hi; exit 3"],
                Duration::from_secs(60),
            )
            .unwrap();
        assert_eq!((out.status, out.stdout.as_str()), (3, "hi\n"));
    }
}
