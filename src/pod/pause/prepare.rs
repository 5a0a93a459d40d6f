//! The parent's preparation before the clone: everything the child will use ([`Prepared`]),
//! opened, checked and allocated in the shim, so that the child needs no allocation at all.
//!
//! Runs in the shim only, before any clone: it may allocate, read files and fail with a typed
//! error; it starts no process and changes nothing on the node.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use super::config::{PAUSE_ARGV0, PauseConfig};
use super::userns::{check_maps, kernel_map_text, owner_unless_initial};
use crate::pod::spec::sysctl_path;
use crate::records::error::{Context, Error, Result};

/// One sysctl, ready for the child: the path to open, the bytes to write.
pub(super) struct PreparedSysctl {
    /// Relative to `/proc` (`sys/net/...`): opened at [`Prepared::proc`], which stays
    /// reachable once the pause's root is empty.
    pub(super) path: CString,
    pub(super) value: Vec<u8>,
    /// A net.* sysctl: in a user-namespaced pod, written before the user namespace exists
    /// (the pod netns belongs to the node's user namespace, so only the node's root may).
    pub(super) in_netns: bool,
}

/// The empty root's mount: a read-only tmpfs of one page that can hold nothing.
pub(super) const ROOT_FSTYPE: &CStr = c"tmpfs";
pub(super) const ROOT_SOURCE: &CStr = c"rsandbox-pause";
pub(super) const ROOT_OPTIONS: &CStr = c"size=4k,nr_inodes=2,mode=0555";

/// Everything the child needs, allocated before the clone.
pub(super) struct Prepared {
    /// The clone of the child: its namespaces, or with a user namespace only its mount
    /// namespace (the child makes or joins the user namespace itself, then clones the pause
    /// with `pause_flags`).
    pub(super) flags: libc::c_int,
    /// In a user-namespaced pod, the namespaces of the pause but the mount namespace (cloned by
    /// the child once its user namespace has its maps, so they belong to it; the mount
    /// namespace is the child's, the node's user namespace's); `None`: the child is the pause.
    pub(super) pause_flags: Option<libc::c_int>,
    /// The user namespace that owns the pod netns, when it is not the node's: CRI makes the
    /// netns of a user-namespaced pod inside a user namespace with the pod's maps, and the pod
    /// must live in that one (else its containers have no privilege over their own network:
    /// no sysfs, no interface changes). The child joins it instead of making one.
    pub(super) join_userns: Option<OwnedFd>,
    /// `/proc/self/uid_map` and `gid_map` as the kernel shows the pod's maps (`%10u %10u %10u`
    /// lines): what the joined namespace must show.
    pub(super) expected_maps: [Vec<u8>; 2],
    pub(super) netns: Option<OwnedFd>,
    pub(super) hostname: Option<CString>,
    pub(super) sysctls: Vec<PreparedSysctl>,
    /// The node's `/proc` (`O_PATH`), where the sysctls and `self/{uid,gid}_map` are opened
    /// from: in a user-namespaced pod the child is in its empty root before it enters the user
    /// namespace, and the pause writes its IPC sysctls from there (a sysctl resolves to the
    /// namespace of the opener, not of the `/proc` mount).
    pub(super) proc: OwnedFd,
    /// Where the empty root is mounted (in the child's mount namespace only).
    pub(super) root: CString,
    /// The shim's `/` is the initramfs (`rootfs`), which `pivot_root` cannot leave.
    pub(super) root_is_rootfs: bool,
    /// Whether the child tries `pivot_root` first (tests turn it off to run the initramfs
    /// fallback, the tmpfs moved over `/` and chrooted into, on any root).
    pub(super) use_pivot_root: bool,
    pub(super) cap_last: libc::c_int,
    /// Upper bound (exclusive) of the fds the one-by-one fallback closes.
    pub(super) fd_limit: u32,
    /// Whether the child tries `close_range` first (tests turn it off to run the fallback).
    pub(super) use_close_range: bool,
    /// The sealed pause program.
    pub(super) program: OwnedFd,
    /// The pause's SELinux process label, written to `/proc/thread-self/attr/exec` before the
    /// exec; `None`: the shim's own.
    pub(super) exec_label: Option<CString>,
    /// `argv` (`rsandbox-pause <pod id>`), NUL-terminated strings behind a NULL-terminated
    /// pointer array; `envp` is empty.
    _argv: Vec<CString>,
    pub(super) argv_ptrs: Vec<*const libc::c_char>,
    pub(super) envp: [*const libc::c_char; 1],
}

pub(super) fn prepare(cfg: &PauseConfig) -> Result<Prepared> {
    // CLONE_PIDFD: the spawner's handle of the pause (or of the child that clones it).
    let mut flags = libc::SIGCHLD | libc::CLONE_PIDFD | libc::CLONE_NEWNS;
    if cfg.new_ipc {
        flags |= libc::CLONE_NEWIPC;
    }
    if cfg.new_uts {
        flags |= libc::CLONE_NEWUTS;
    }
    if cfg.new_pid {
        flags |= libc::CLONE_NEWPID;
    }
    let mut pause_flags = None;
    if let Some(u) = &cfg.userns {
        check_maps(u)?;
        // The mount namespace is made by this clone, in the node's user namespace: the pause
        // holds no mount a process of the pod's user namespace could enter or undo (the
        // containers never join it; runc makes theirs).
        pause_flags = Some(flags & !(libc::CLONE_NEWNS | libc::CLONE_PIDFD));
        flags = libc::SIGCHLD | libc::CLONE_PIDFD | libc::CLONE_NEWNS;
    }
    let netns = match &cfg.netns {
        Some(p) => Some(crate::host::client_paths::open_netns(p)?),
        None => None,
    };
    let join_userns = match (&cfg.userns, &netns) {
        (Some(_), Some(ns)) => owner_unless_initial(ns)?,
        _ => None,
    };
    let expected_maps = match &cfg.userns {
        Some(u) => [kernel_map_text(&u.uids), kernel_map_text(&u.gids)],
        None => [Vec::new(), Vec::new()],
    };
    let hostname = match &cfg.hostname {
        Some(h) if cfg.new_uts && !h.is_empty() => {
            Some(CString::new(h.as_bytes()).map_err(|_| Error::invalid("hostname contains NUL"))?)
        }
        _ => None,
    };
    let mut sysctls = Vec::with_capacity(cfg.sysctls.len());
    for (name, value) in &cfg.sysctls {
        let full = sysctl_path(name);
        let in_proc = full.strip_prefix("/proc").map_err(|_| {
            Error::internal(format!("sysctl {name:?}: {full:?} is not under /proc"))
        })?;
        let path = CString::new(in_proc.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("sysctl {name:?} contains NUL")))?;
        let in_netns = full.starts_with("/proc/sys/net");
        sysctls.push(PreparedSysctl {
            path,
            value: value.as_bytes().to_vec(),
            in_netns,
        });
    }
    if !cfg.root_mountpoint.is_absolute() || !cfg.root_mountpoint.is_dir() {
        return Err(Error::internal(format!(
            "pause: the mount point of its root {:?} is not a directory",
            cfg.root_mountpoint
        )));
    }
    let root = CString::new(cfg.root_mountpoint.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("the bundle path contains NUL"))?;
    let proc = nix::fcntl::open(
        "/proc",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .context("pause: open /proc")?;
    let cap_last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    let argv: Vec<CString> = [PAUSE_ARGV0, &cfg.pod_id]
        .into_iter()
        .filter(|a| !a.is_empty())
        .map(|a| CString::new(a).map_err(|_| Error::invalid("the pod id contains NUL")))
        .collect::<Result<_>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let program = crate::pod::pause_image::sealed()?;
    let exec_label = match &cfg.labels {
        Some(l) => Some(label_program(&program, l)?),
        None => None,
    };
    Ok(Prepared {
        flags,
        pause_flags,
        join_userns,
        expected_maps,
        netns,
        hostname,
        sysctls,
        proc,
        root,
        root_is_rootfs: root_is_rootfs(),
        cap_last,
        fd_limit: fd_limit(),
        use_close_range: true,
        use_pivot_root: true,
        program,
        exec_label,
        _argv: argv,
        argv_ptrs,
        envp: [std::ptr::null()],
    })
}

/// Gives the pause program's memfd its label (a container domain may enter only files of a
/// type it is allowed to, as it enters the binaries of a container's rootfs), and returns the
/// process label for the exec. A memfd that cannot be labelled fails the pause (SELinux fails
/// closed, as with runc): an exec into the pod's domain from it would be refused, and running
/// the pause under the shim's own label instead would leave it unconfined.
fn label_program(program: &OwnedFd, labels: &super::config::PauseLabels) -> Result<CString> {
    use std::os::fd::AsRawFd;
    let process = CString::new(labels.process.as_bytes())
        .map_err(|_| Error::invalid("pause: its SELinux label contains NUL"))?;
    // SAFETY: fsetxattr on our own open descriptor, with a NUL-terminated name and a byte
    // slice with its length.
    let r = unsafe {
        libc::fsetxattr(
            program.as_raw_fd(),
            c"security.selinux".as_ptr(),
            labels.program.as_ptr().cast(),
            labels.program.len(),
            0,
        )
    };
    if r != 0 {
        return Err(Error::precondition(format!(
            "pause: SELinux: label its program {}: {}",
            labels.program,
            std::io::Error::last_os_error()
        )));
    }
    Ok(process)
}

/// Whether `/` is the initial rootfs (an initramfs never switched away from), where
/// `pivot_root` cannot work. The rootfs is a ramfs or a tmpfs: only then is the mount table
/// read to tell it from an ordinary tmpfs root (every StartSandbox would read it otherwise,
/// and it is long on a node with many pods).
fn root_is_rootfs() -> bool {
    // linux/magic.h; nix and libc do not name it
    const RAMFS_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0x8584_58f6);
    let in_memory = nix::sys::statfs::statfs("/").is_ok_and(|s| {
        let t = s.filesystem_type();
        t == RAMFS_MAGIC || t == nix::sys::statfs::TMPFS_MAGIC
    });
    in_memory
        && std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| root_fstype(&m) == Some("rootfs"))
}

/// The filesystem type of the mount at `/` in a mountinfo text (the last one: mounts stack).
fn root_fstype(mountinfo: &str) -> Option<&str> {
    mountinfo
        .lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == Some("/"))
        .find_map(|l| l.split_once(" - ")?.1.split(' ').next())
}

/// The number of fds this process can ever have had open: the hard `RLIMIT_NOFILE`, capped by
/// `fs.nr_open` (the kernel's ceiling; it is also what an infinite limit means). The sysctl is
/// read only for a limit above the kernel's default ceiling (2^20): below it the limit is the
/// bound already, and an SELinux engine domain may be denied `sysctl_fs_t` (an audit denial per
/// pod for nothing).
fn fd_limit() -> u32 {
    const DEFAULT_NR_OPEN: u64 = 1 << 20;
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
    if hard <= DEFAULT_NR_OPEN {
        return hard as u32;
    }
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_NR_OPEN);
    u32::try_from(hard.min(nr_open)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// Regression: the pause process wrote `net.ipv4.conf.eth0/100.forwarding` to
    /// `/proc/sys/net/ipv4/conf/eth0/100/forwarding` (dots replaced, slashes kept).
    #[test]
    fn slash_form_sysctls_get_the_spec_path() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            sysctls: vec![
                ("net.ipv4.conf.eth0/100.forwarding".into(), "1".into()),
                ("net/ipv4/conf/eth0.101/forwarding".into(), "1".into()),
                ("kernel.shmmax".into(), "1000".into()),
            ],
            ..Default::default()
        };
        let p = prepare(&cfg).unwrap();
        // Relative to the node's `/proc`, held open by the child.
        let paths: Vec<&str> = p.sysctls.iter().map(|s| s.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "sys/net/ipv4/conf/eth0.100/forwarding",
                "sys/net/ipv4/conf/eth0.101/forwarding",
                "sys/kernel/shmmax",
            ]
        );
        for (s, (name, _)) in p.sysctls.iter().zip(&cfg.sysctls) {
            assert_eq!(
                format!("/proc/{}", s.path.to_str().unwrap()),
                sysctl_path(name).to_str().unwrap()
            );
        }
    }

    /// Issue 27 item 4: a program the node will not label (here a pipe, which takes no
    /// security.selinux: SELinux is not enabled on this machine) fails the pause with the step
    /// named, instead of running it unlabelled in the shim's domain.
    #[test]
    fn a_program_that_cannot_be_labelled_fails_the_pause() {
        let (r, _w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let labels = super::super::config::PauseLabels {
            process: "system_u:system_r:container_t:s0:c1,c2".into(),
            program: "system_u:object_r:container_file_t:s0:c1,c2".into(),
        };
        let e = label_program(&r, &labels).unwrap_err();
        assert_eq!(
            e.kind(),
            crate::records::error::Kind::FailedPrecondition,
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("SELinux: label its program system_u:object_r:container_file_t"),
            "{e}"
        );
    }

    #[test]
    fn the_root_filesystem_type_is_the_last_mount_on_slash() {
        let m = "1 0 0:2 / / rw - rootfs rootfs rw\n\
                 22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                 23 22 0:5 / /proc rw - proc proc rw\n";
        assert_eq!(root_fstype(m), Some("ext4"));
        assert_eq!(
            root_fstype("1 0 0:2 / / rw - rootfs rootfs rw\n"),
            Some("rootfs")
        );
        assert_eq!(root_fstype("garbage"), None);
    }

    #[test]
    fn the_fd_limit_covers_every_open_fd() {
        let limit = fd_limit();
        let fd = nix::unistd::dup(std::io::stdin()).unwrap();
        assert!((fd.as_raw_fd() as u32) < limit, "{limit}");
        assert!(limit <= 1 << 30, "{limit}");
    }
}
