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
//! The pod's containers never join this mount namespace (runc gives them their own).
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
//! its mount, IPC, UTS and PID namespaces belong to it, so that the pod's containers, which
//! run in that user namespace, can join them. The order is runc's (`nsexec.c`): the child first
//! joins the pod netns and writes its net.* sysctls while it still has the node's privileges,
//! then enters the user namespace:
//! - containerd's CRI makes the netns of such a pod inside a user namespace with the pod's maps
//!   (`setupNetnsWithinUserns`), and the pod must live in that one (its containers need
//!   privilege over their network: sysfs, links; the runc path's pause joins it too): the child
//!   joins the netns's owner and checks that its `/proc/self/{uid,gid}_map` are the pod's;
//! - a netns of the node's user namespace (shim-owned networking, other clients): the child
//!   makes a user namespace and waits on a socket pair until the parent has written
//!   `/proc/<child>/uid_map` and `gid_map`.
//!
//! It then clones the pause with the other new namespaces (a new PID namespace takes effect
//! for children only: the pause is its PID 1), reports the pause's pid on the status pipe and
//! exits; the pause goes to the shim, a child subreaper (the parent waits for the child's end
//! by pidfd, so this holds when `spawn` returns). The pause sets the hostname, mounts its empty
//! root with the node's uid 0 (unmapped in the namespace, no capability outside it: as their
//! owner it may pass containerd's state directories, mode 0700, to the mount point in the
//! sandbox bundle, which the namespace's root could not), becomes root of the namespace (whose
//! root owns the sysctls of its IPC namespace), writes the other sysctls, pivots into its root
//! by descriptor and goes on as without a user namespace: privileges dropped to 65535 (which
//! the maps must cover: refused otherwise), exec.
//!
//! # The forked child never allocates, locks or unwinds
//!
//! The shim is multi-threaded: in the copy, anything that may take a lock (malloc, glibc's set*id
//! broadcast to all threads, stdio) can deadlock on a lock another thread held at the clone, and
//! an unwinding panic would run the shim's code (destructors, the RPC loop) in a second process.
//! So between the clone and the exec the child only makes raw, async-signal-safe system calls on
//! data the parent prepared (`Prepared`): no `unwrap`/`expect`, no slice indexing, no `format!`,
//! no `Vec`/`String`, and every exit is `_exit`. It first sets [`IN_FORKED_CHILD`], so a panic
//! hook that runs anyway (a bug) can `_exit` at once instead of unwinding.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::spec::{
    IdMapping, IpcMode, NetworkMode, PidMode, PodSpec, SysctlDefaults, UserNamespace, sysctl_path,
};
use crate::error::{Context, Error, Result};

/// The pause process's `argv[0]`; `argv[1]` is the pod ID (`ps`: `rsandbox-pause <pod id>`,
/// never taken for a shim by `pgrep -f containerd-shim-rsandbox-v1`); its `comm` is `pause`.
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
    /// An existing directory the pause mounts its empty root on, in its own mount namespace
    /// only (the sandbox bundle): nothing is created or mounted on the node. In a user
    /// namespace, its root must be able to reach it (the sandbox manager gives the bundle to
    /// the mapped root's group, as containerd does for the runc path).
    pub root_mountpoint: PathBuf,
    /// A new user namespace with these maps, owning the new mount, IPC, UTS and PID
    /// namespaces (see "User-namespaced pods" in the module docs); `None`: the node's.
    pub userns: Option<UserNamespace>,
}

impl PauseConfig {
    /// The pause process of a pod: `netns` is the pod's network namespace (given by the caller
    /// or made by the shim), `defaults` what the host allows of containerd's default sysctls,
    /// `bundle` the sandbox bundle (see [`PauseConfig::root_mountpoint`]).
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
        bundle: &Path,
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
            root_mountpoint: bundle.to_path_buf(),
            userns: spec.userns.clone(),
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
    PrivateMounts = 12,
    MountRoot = 13,
    PivotRoot = 14,
    DetachNodeRoot = 15,
    ReadyFd = 16,
    Exec = 17,
    UnshareUserns = 18,
    WaitForMaps = 19,
    CreateNamespaces = 20,
    BecomeNsRoot = 21,
    JoinUserns = 22,
    CheckMaps = 23,
}

impl Step {
    /// Every step, in the child's order. In a user-namespaced pod, the four user namespace
    /// steps come right after JoinNetns and the net.* sysctls (written while the child still
    /// has the node's privileges in the pod netns); the other sysctls follow the hostname.
    const ALL: [Step; 22] = [
        Step::JoinNetns,
        Step::JoinUserns,
        Step::CheckMaps,
        Step::UnshareUserns,
        Step::WaitForMaps,
        Step::CreateNamespaces,
        Step::SetHostname,
        Step::BecomeNsRoot,
        Step::OpenSysctl,
        Step::WriteSysctl,
        Step::PrivateMounts,
        Step::MountRoot,
        Step::PivotRoot,
        Step::DetachNodeRoot,
        Step::DropCapabilities,
        Step::SetGroups,
        Step::SetGid,
        Step::SetUid,
        Step::NoNewPrivs,
        Step::BlockSignals,
        Step::ReadyFd,
        Step::Exec,
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
            Step::UnshareUserns => "create its user namespace",
            Step::WaitForMaps => "wait for the maps of its user namespace",
            Step::CreateNamespaces => "create the pod namespaces in its user namespace",
            Step::BecomeNsRoot => "become root of its user namespace",
            Step::JoinUserns => "join the user namespace that owns the pod netns",
            Step::CheckMaps => {
                "check the maps of the user namespace that owns the pod netns (they are not \
                 the pod's)"
            }
            Step::SetHostname => "set the hostname",
            Step::OpenSysctl => "open the file of sysctl",
            Step::WriteSysctl => "write sysctl",
            Step::PrivateMounts => "make its mounts private",
            Step::MountRoot => "mount its empty root",
            Step::PivotRoot => "pivot into its empty root",
            Step::DetachNodeRoot => "detach the node's root",
            Step::DropCapabilities => "drop capabilities",
            Step::SetGroups => "set groups",
            Step::SetGid => "set gid",
            Step::SetUid => "set uid",
            Step::NoNewPrivs => "set no_new_privs/non-dumpable",
            Step::BlockSignals => "block signals",
            Step::ReadyFd => "pass the status pipe to the pause program",
            Step::Exec => "execute the pause program",
        }
    }
}

/// One sysctl, ready for the child: the path to open, the bytes to write.
struct PreparedSysctl {
    path: CString,
    value: Vec<u8>,
    /// A net.* sysctl: in a user-namespaced pod, written before the user namespace exists
    /// (the pod netns belongs to the node's user namespace, so only the node's root may).
    in_netns: bool,
}

/// The first byte of the intermediate child's report of the pause's pid (a failure report
/// starts with its [`Step`], the pause program's ready byte is 0).
const PID_REPORT: u8 = 0xfe;

/// The descriptor the pause program reports ready on (`READY_FD` in `pause/pause.rs`).
const READY_FD: libc::c_int = 0;

/// The empty root's mount: a read-only tmpfs of one page that can hold nothing.
const ROOT_FSTYPE: &CStr = c"tmpfs";
const ROOT_SOURCE: &CStr = c"rsandbox-pause";
const ROOT_OPTIONS: &CStr = c"size=4k,nr_inodes=2,mode=0555";
/// The same in a user namespace, owned by its root (the pause mounts it as the node's uid 0,
/// which the namespace does not map).
const USERNS_ROOT_OPTIONS: &CStr = c"size=4k,nr_inodes=2,mode=0555,uid=0,gid=0";

/// Everything the child needs, allocated before the clone.
struct Prepared {
    /// The clone of the child: its namespaces, or none with a user namespace (the child
    /// creates that itself, then clones the pause with `pause_flags`).
    flags: libc::c_int,
    /// In a user-namespaced pod, the namespaces of the pause (cloned by the child once its user
    /// namespace has its maps, so they belong to it); `None`: the child is the pause.
    pause_flags: Option<libc::c_int>,
    /// The user namespace that owns the pod netns, when it is not the node's: CRI makes the
    /// netns of a user-namespaced pod inside a user namespace with the pod's maps, and the pod
    /// must live in that one (else its containers have no privilege over their own network:
    /// no sysfs, no interface changes). The child joins it instead of making one.
    join_userns: Option<OwnedFd>,
    /// `/proc/self/uid_map` and `gid_map` as the kernel shows the pod's maps (`%10u %10u %10u`
    /// lines): what the joined namespace must show.
    expected_maps: [Vec<u8>; 2],
    netns: Option<OwnedFd>,
    hostname: Option<CString>,
    sysctls: Vec<PreparedSysctl>,
    /// Where the empty root is mounted (in the child's mount namespace only).
    root: CString,
    /// Its mount options ([`ROOT_OPTIONS`], or [`USERNS_ROOT_OPTIONS`]).
    root_options: &'static CStr,
    /// The shim's `/` is the initramfs (`rootfs`), which `pivot_root` cannot leave.
    root_is_rootfs: bool,
    cap_last: libc::c_int,
    /// Upper bound (exclusive) of the fds the one-by-one fallback closes.
    fd_limit: u32,
    /// Whether the child tries `close_range` first (tests turn it off to run the fallback).
    use_close_range: bool,
    /// The sealed pause program.
    program: OwnedFd,
    /// `argv` (`rsandbox-pause <pod id>`), NUL-terminated strings behind a NULL-terminated
    /// pointer array; `envp` is empty.
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp: [*const libc::c_char; 1],
}

fn prepare(cfg: &PauseConfig) -> Result<Prepared> {
    let mut flags = libc::SIGCHLD | libc::CLONE_NEWNS;
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
        pause_flags = Some(flags);
        flags = libc::SIGCHLD | libc::CLONE_PIDFD;
    }
    let netns = match &cfg.netns {
        Some(p) => Some(crate::client_paths::open_netns(p)?),
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
        let path = CString::new(sysctl_path(name).as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("sysctl {name:?} contains NUL")))?;
        let in_netns = sysctl_path(name).starts_with("/proc/sys/net");
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
    Ok(Prepared {
        flags,
        pause_flags,
        join_userns,
        expected_maps,
        netns,
        hostname,
        sysctls,
        root,
        root_options: if cfg.userns.is_some() {
            USERNS_ROOT_OPTIONS
        } else {
            ROOT_OPTIONS
        },
        root_is_rootfs: std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| root_fstype(&m) == Some("rootfs")),
        cap_last,
        fd_limit: fd_limit(),
        use_close_range: true,
        program: super::pause_image::sealed()?,
        _argv: argv,
        argv_ptrs,
        envp: [std::ptr::null()],
    })
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

/// The pause runs as [`PAUSE_UID`]:[`PAUSE_GID`] inside its user namespace: both must be mapped
/// (the pod spec's decoding already insists on it; a `PauseConfig` made otherwise is checked
/// here, before any clone).
fn check_maps(u: &UserNamespace) -> Result<()> {
    let covers = |maps: &[IdMapping], id: u32| {
        maps.iter().any(|m| {
            id >= m.container_id && u64::from(id) < u64::from(m.container_id) + u64::from(m.size)
        })
    };
    for (what, maps, id) in [("uid", &u.uids, PAUSE_UID), ("gid", &u.gids, PAUSE_GID)] {
        if !covers(maps, id) {
            return Err(Error::invalid(format!(
                "pause: the {what} map of the pod's user namespace does not map {id}, the \
                 pause process's {what}"
            )));
        }
    }
    Ok(())
}

/// The user namespace that owns `netns` (NS_GET_USERNS), or `None` when that is the shim's.
fn owner_unless_initial(netns: &OwnedFd) -> Result<Option<OwnedFd>> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: NS_GET_USERNS returns a new descriptor (or -1), which we own.
    let fd = unsafe { libc::ioctl(netns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(Error::from(std::io::Error::last_os_error())
            .context("pause: find the user namespace of the pod netns"));
    }
    // SAFETY: as above.
    let owner = File::from(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let ours = std::fs::metadata("/proc/self/ns/user").context("pause: stat /proc/self/ns/user")?;
    let theirs = owner.metadata().context("pause: stat the netns owner")?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Ok(None);
    }
    Ok(Some(OwnedFd::from(owner)))
}

/// A map as `/proc/<pid>/uid_map` shows it.
fn kernel_map_text(maps: &[IdMapping]) -> Vec<u8> {
    maps.iter()
        .map(|m| format!("{:>10} {:>10} {:>10}\n", m.container_id, m.host_id, m.size))
        .collect::<String>()
        .into_bytes()
}

/// Whether the file at `path` holds exactly `want` (at most 4 KiB). Raw system calls on a
/// stack buffer: it runs in the forked child.
///
/// # Safety
/// Only with `path` NUL-terminated.
unsafe fn file_is(path: &CStr, want: &[u8]) -> bool {
    let mut buf = [0u8; 4096];
    // SAFETY: open/read/close into our own stack buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
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

/// Starts the pause process; returns its host pid once it holds the namespaces, dropped its
/// privileges and runs the pause program under its seccomp filter. Its exit is reaped by the
/// shim's reaper like any child.
pub fn spawn(cfg: &PauseConfig) -> Result<i32> {
    spawn_prepared(cfg, prepare(cfg)?)
}

fn spawn_prepared(cfg: &PauseConfig, p: Prepared) -> Result<i32> {
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pause: create status pipe")?;
    // With a user namespace: the child says on `sync` when it has made it, and waits there
    // for its maps; the parent gets a pidfd of the child (CLONE_PIDFD).
    let sync = match (&cfg.userns, p.pause_flags, &p.join_userns) {
        (Some(u), Some(_), None) => Some((
            u,
            nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            )
            .context("pause: create the sync socket")?,
        )),
        _ => None,
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack): the child gets a copy of this
    // thread and runs `child`, which only makes async-signal-safe raw system calls on `p` and
    // never returns. With CLONE_PIDFD the kernel writes the pidfd into `pidfd` (x86_64 and
    // aarch64 take it as the third argument, parent_tid).
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
        let sync_fd = sync
            .as_ref()
            .map_or(-1, |(_, (_, theirs))| theirs.as_raw_fd());
        if let Some((_, (ours, _))) = &sync {
            // The parent's end: with it closed here, the child reads EOF if the shim dies
            // during the handshake instead of waiting for ever.
            // SAFETY: close is async-signal-safe; the child never uses this descriptor.
            unsafe { libc::close(ours.as_raw_fd()) };
        }
        child(&p, tx.as_raw_fd(), sync_fd);
    }
    let pid = pid as i32;
    // SAFETY: with CLONE_PIDFD the kernel made `pidfd` ours (close-on-exec).
    let pidfd =
        (pidfd >= 0).then(|| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) });
    drop(tx);
    let p_userns = p.pause_flags.is_some();
    drop(p);
    // In a user-namespaced pod the pause is the child's child, its pid reported first.
    let mut pause = (!p_userns).then_some(pid);
    let report = match sync {
        None => read_status(rx, cfg, &mut pause),
        Some((u, (ours, theirs))) => {
            drop(theirs);
            match userns_handshake(pid, u, ours) {
                Ok(()) => read_status(rx, cfg, &mut pause),
                Err(e) => Report::NoAnswer(e),
            }
        }
    };
    // SIGKILL to the child (by its pidfd where there is one: once reaped, its pid may name
    // another process) and to the pause when it is another process (not reaped by anyone
    // before it exits: it stays ours until then).
    let kill = |pause: Option<i32>| {
        match &pidfd {
            // SAFETY: pidfd_send_signal with no siginfo on a pidfd we own.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0u32,
                );
            },
            None => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if let Some(p) = pause.filter(|p| *p != pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    match report {
        Report::Ready => match pause {
            Some(pause) => {
                if let Some(fd) = pidfd {
                    reap_intermediate(&fd);
                }
                Ok(pause)
            }
            None => {
                kill(None);
                Err(Error::internal(
                    "pause: the pause process is ready but its pid never came",
                ))
            }
        },
        // The child reported its failure and exits by itself: it may already be reaped, and
        // its pid is not ours to signal any more.
        Report::Failed(e) => Err(e),
        Report::Gone => {
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

/// The parent's side of the user namespace: waits until the child has made it, writes its uid
/// and gid maps, lets it go on. A child that fails first closes `sock` (its report is on the
/// status pipe, which tells the error).
fn userns_handshake(pid: i32, u: &UserNamespace, sock: OwnedFd) -> Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut sock = File::from(sock);
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(&sock),
        PollFlags::POLLIN,
    )];
    let deadline = Instant::now() + STATUS_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => {
                return Err(Error::internal(
                    "pause: the child did not make its user namespace within 10s",
                ));
            }
            Ok(_) => break,
            // A signal handler of the shim ran on this thread: poll is never restarted.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                return Err(Error::from(e).context("pause: wait for the child's user namespace"));
            }
        }
    }
    let mut b = [0u8; 1];
    if sock.read(&mut b).context("pause: read the sync socket")? == 0 {
        return Ok(()); // the child failed: read_status says why
    }
    for (what, text) in [("uid_map", u.uid_map()), ("gid_map", u.gid_map())] {
        let path = format!("/proc/{pid}/{what}");
        // One write: the kernel takes a map only whole, and only once.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
            .with_context(|| {
                format!(
                    "pause: write the {what} of its user namespace ({path}: {:?})",
                    text.trim_end()
                )
            })?;
    }
    std::io::Write::write_all(&mut sock, &[1]).context("pause: let the child go on")?;
    Ok(())
}

/// Waits (briefly: it exits right after reporting the pause's pid) until the child that made
/// the user namespace has exited, so that the pause is the shim's (a child subreaper) when
/// this returns, and reaps it unless the shim's reaper did first (ECHILD). By pidfd: never
/// another process that got the pid since.
fn reap_intermediate(pidfd: &OwnedFd) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(pidfd),
        PollFlags::POLLIN,
    )];
    let deadline = Instant::now() + STATUS_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        // Its own exit raises SIGCHLD, whose handler may run on this thread (EINTR).
        match poll(&mut fds, PollTimeout::from(ms)) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => break,
        }
    }
    // SAFETY: waitid writes one siginfo_t; WNOHANG never blocks.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        );
    }
}

/// How long the parent waits for each report of the child.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// What the status pipe said.
enum Report {
    /// The pause program is confined and waiting.
    Ready,
    /// The child reported a failed step and exited.
    Failed(Error),
    /// The pipe closed without a report: the child or the program died.
    Gone,
    /// No answer in time, or the pipe could not be read: the child may still live.
    NoAnswer(Error),
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

/// Length of the child's failure report: step (1 byte), padding (3), errno (4), index (4).
const REPORT_LEN: usize = 12;

/// Reads the reports, within 10 s: one `0` byte from the pause program once it is confined,
/// or the child's (step, errno, index); in a user-namespaced pod first the pause's host pid
/// from the child that cloned it (stored in `pause` as it comes).
fn read_status(rx: OwnedFd, cfg: &PauseConfig, pause: &mut Option<i32>) -> Report {
    let mut f = File::from(rx);
    let deadline = Instant::now() + STATUS_TIMEOUT;
    let mut ready = false;
    loop {
        let mut buf = [0u8; REPORT_LEN];
        match read_full(&mut f, &mut buf[..1], deadline) {
            Ok(0) => return Report::Gone,
            Ok(_) => {}
            Err(e) => return Report::NoAnswer(e),
        }
        if buf[0] == 0 {
            // In a user-namespaced pod the pause (the grandchild) can report ready before
            // its parent has reported its pid: wait for the pid (its parent holds the pipe
            // open until it has written it, or exits).
            if pause.is_some() {
                return Report::Ready;
            }
            ready = true;
            continue;
        }
        match read_full(&mut f, &mut buf[1..], deadline) {
            Ok(n) if n == REPORT_LEN - 1 => {}
            Ok(_) => return Report::Gone,
            Err(e) => return Report::NoAnswer(e),
        }
        if buf[0] == PID_REPORT {
            *pause = Some(i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]));
            if ready {
                return Report::Ready;
            }
            continue;
        }
        return Report::Failed(failure(&buf, cfg));
    }
}

/// Reads until `buf` is full or the pipe ends (the count read), within `deadline`.
fn read_full(f: &mut File, buf: &mut [u8], deadline: Instant) -> Result<usize> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&*f),
            PollFlags::POLLIN,
        )];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => {
                return Err(Error::internal(
                    "pause: no status from the child within 10s",
                ));
            }
            Ok(_) => {}
            // A signal handler of the shim (SIGCHLD) ran on this thread: poll is never
            // restarted.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::from(e).context("pause: wait for the child")),
        }
        match f
            .read(&mut buf[got..])
            .context("pause: read the child's status")?
        {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The error of a child's failure report.
fn failure(buf: &[u8; REPORT_LEN], cfg: &PauseConfig) -> Error {
    let step = Step::from_wire(buf[0]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let idx = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    let err = std::io::Error::from_raw_os_error(errno);
    let what = step.describe();
    Error::internal(match step {
        Step::OpenSysctl | Step::WriteSysctl => {
            let name = cfg.sysctls.get(idx).map_or("?", |(n, _)| n.as_str());
            format!(
                "pause: {what} {name} ({}): {err}",
                sysctl_path(name).display()
            )
        }
        Step::DropCapabilities => format!("pause: {what} (capability {idx}): {err}"),
        Step::MountRoot | Step::PivotRoot => format!(
            "pause: {what} (on {}): {err}",
            cfg.root_mountpoint.display()
        ),
        Step::Exec if errno == libc::EACCES || errno == libc::EPERM => format!(
            "pause: {what}: {err} (is vm.memfd_noexec set to 2, or does a security \
             module forbid executing a memfd?)"
        ),
        _ => format!("pause: {what}: {err}"),
    })
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

/// Closes every fd but the two in `keep`: with `close_range` when it works, else one by one
/// below `limit`. No allocation, no panics (it runs in the forked child).
fn close_all_but<C: CloseFds>(sys: &C, keep: [u32; 2], limit: u32, use_close_range: bool) {
    let (lo, hi) = if keep[0] <= keep[1] {
        (keep[0], keep[1])
    } else {
        (keep[1], keep[0])
    };
    if use_close_range {
        let ok = |first: u32, last: u32| first > last || sys.close_range(first, last);
        let below = lo == 0 || ok(0, lo - 1);
        let between = lo == hi || ok(lo + 1, hi - 1);
        let above = hi == u32::MAX || ok(hi + 1, u32::MAX);
        if below && between && above {
            return;
        }
    }
    let mut fd = 0;
    while fd < limit {
        if fd != lo && fd != hi {
            sys.close(fd);
        }
        fd += 1;
    }
}

/// Moves the child into an empty, read-only root of its own mount namespace (created by the
/// clone): mounts made private (nothing propagates to or from the node), a one-page tmpfs on
/// `root`, `pivot_root` into it and the node's tree detached. Only where the node's root is the
/// initramfs (`rootfs`, which `pivot_root` cannot leave) is the tmpfs moved over `/` and
/// chrooted into instead: the node's mounts then stay referenced by the namespace (out of reach
/// of the pause's root and cwd) for the pod's life; anywhere else a failed `pivot_root` fails
/// the start. Raw system calls only (it runs in the forked child).
///
/// # Safety
/// Only in the forked child, with `root` a NUL-terminated path.
unsafe fn enter_empty_root(root: &CStr, options: &CStr, rootfs: bool, status_fd: i32) {
    // SAFETY: as the two halves require.
    unsafe {
        let (old_root, new_root) = mount_empty_root(root, options, status_fd);
        pivot_into(old_root, new_root, rootfs, status_fd);
    }
}

/// The first half of [`enter_empty_root`]: mounts private, the tmpfs on `root`; returns
/// descriptors of the old root and of the new one (close-on-exec).
///
/// # Safety
/// Only in the forked child, with `root` and `options` NUL-terminated.
unsafe fn mount_empty_root(
    root: &CStr,
    options: &CStr,
    status_fd: i32,
) -> (libc::c_int, libc::c_int) {
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
            options.as_ptr().cast(),
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
/// (from `old_root`) detached; both descriptors closed.
///
/// # Safety
/// Only in the forked child, with the descriptors of [`mount_empty_root`].
unsafe fn pivot_into(old_root: libc::c_int, new_root: libc::c_int, rootfs: bool, status_fd: i32) {
    // SAFETY: raw system calls on NUL-terminated constants; fds are our own.
    unsafe {
        if libc::fchdir(new_root) != 0 {
            fail(status_fd, Step::PivotRoot, 0);
        }
        // As runc: pivot_root(".", ".") stacks the old root on the new one; from the old root's
        // descriptor, detach it and everything below it.
        if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0 {
            if libc::fchdir(old_root) != 0 || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                fail(status_fd, Step::DetachNodeRoot, 0);
            }
        } else if !rootfs
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
/// the pod netns and writes the net.* sysctls with the node's privileges, joins the user
/// namespace that owns the netns (`p.join_userns`) or makes one and waits on `sync_fd` for the
/// parent to write its maps, and clones the pause into new namespaces owned by it (a new PID namespace only applies to children:
/// the pause is PID 1 there); it reports the pause's pid on the status pipe and exits, and the
/// pause goes to the shim, a child subreaper.
fn child(p: &Prepared, status_fd: i32, sync_fd: i32) -> ! {
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
        if let Some(owner) = &p.join_userns {
            if libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                fail(status_fd, Step::JoinUserns, 0);
            }
            let [uids, gids] = &p.expected_maps;
            if !file_is(c"/proc/self/uid_map", uids) || !file_is(c"/proc/self/gid_map", gids) {
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
        // No setresuid(0) into the namespace here: the pause still has the node's uid 0 (no
        // capability outside the namespace) while it reaches its root's mount point through
        // containerd's state directories (mode 0700, the node root's), then drops to 65535.
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
            // Its root is mounted as the node's uid 0 (see the module docs); the sysctls of
            // its IPC namespace are its root's to write.
            let root = mount_empty_root(&p.root, p.root_options, status_fd);
            if libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
            {
                fail(status_fd, Step::BecomeNsRoot, 0);
            }
            write_sysctls(p, status_fd, |s| !s.in_netns);
            pivot_into(root.0, root.1, p.root_is_rootfs, status_fd);
            become_pause(p, status_fd, true);
        }
        // Its pid in this PID namespace, the shim's: the pause's host pid.
        let pid = (pid as i32).to_ne_bytes();
        let rec: [u8; REPORT_LEN] = [
            PID_REPORT, 0, 0, 0, pid[0], pid[1], pid[2], pid[3], 0, 0, 0, 0,
        ];
        libc::write(status_fd, rec.as_ptr().cast(), rec.len());
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
            let fd = libc::open(s.path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
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
            enter_empty_root(&p.root, p.root_options, p.root_is_rootfs, status_fd);
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
        fail(status_fd, Step::Exec, 0);
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

    /// SIGTERM from the shim's side (outside the pod's PID namespace), then its exit status.
    fn terminate(pid: i32) -> i32 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        wait_exit(pid)
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
            root_mountpoint: std::env::temp_dir(),
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
        for kind in ["mnt", "ipc", "uts", "pid_for_children"] {
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
        assert_eq!(status_field(pid, "Seccomp"), "2");
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
        assert_eq!(terminate(pid), 0);
    }

    #[test]
    #[ignore = "needs root: creates namespaces"]
    fn a_failing_sysctl_is_reported_by_name() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
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
            root_mountpoint: std::env::temp_dir(),
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
            root_mountpoint: std::env::temp_dir(),
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

    /// Issue 13: PID 1 of a shared-PID pod, seen by a container with `CAP_SYS_PTRACE` (root
    /// here has it): its root, cwd and mount table show one empty read-only directory, its
    /// environment is empty, its memory is the pause program's few pages, not the shim's.
    #[test]
    #[ignore = "needs root: creates namespaces and mounts, drops to 65535"]
    fn the_pause_holds_nothing_of_the_node() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            pod_id: "pod-iso".into(),
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        for link in ["root", "cwd"] {
            let dir = format!("/proc/{pid}/{link}");
            assert_eq!(
                std::fs::read_dir(&dir).unwrap().count(),
                0,
                "{dir} is not empty"
            );
            // The probe of issue 13: writing a file onto the node through the pause.
            let err = std::fs::write(format!("{dir}/escape-proof"), "pwned").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{dir}: {err}");
            assert!(std::fs::metadata(format!("{dir}/tmp")).is_err());
            assert!(std::fs::metadata(format!("{dir}/etc/passwd")).is_err());
        }
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        let lines: Vec<&str> = mounts.lines().collect();
        assert_eq!(lines.len(), 1, "{mounts}");
        assert!(
            lines[0].contains(" / / ro,") && lines[0].contains(" - tmpfs rsandbox-pause ro,"),
            "{mounts}"
        );
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            environ.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&environ)
        );
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            !maps.contains("rsandbox")
                || maps
                    .lines()
                    .all(|l| !l.contains('/') || l.contains("/memfd:rsandbox-pause")),
            "{maps}"
        );
        let me = std::env::current_exe().unwrap();
        assert!(!maps.contains(me.to_str().unwrap()), "{maps}");
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
        let pss_kib: u64 = rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert!(pss_kib <= 64, "pause PSS {pss_kib} KiB:\n{rollup}");
        assert_eq!(status_field(pid, "NoNewPrivs"), "1");
        assert_eq!(status_field(pid, "Seccomp"), "2");
    }

    /// A process inside the pod's PID namespace (a container with the default `CAP_KILL`) cannot
    /// end the pause with any signal; the shim, outside it, still can.
    #[test]
    #[ignore = "needs root: creates namespaces, runs nsenter"]
    fn signals_from_inside_the_pod_do_not_end_the_pause() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        let out = std::process::Command::new("nsenter")
            .arg(format!("--pid=/proc/{pid}/ns/pid"))
            .args(["--", "sh", "-c"])
            .arg("for s in TERM INT HUP USR1 QUIT KILL STOP; do kill -s $s 1 || exit 9; done")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(200));
        let state = status_field(pid, "State");
        assert!(state.starts_with('S'), "the pause is {state}");
        assert_eq!(terminate(pid), 0);
    }

    /// rt_sigqueueinfo lets a sender write si_pid itself (si_code SI_QUEUE): a process in the
    /// pod that claims to be outside it (si_pid = 0) does not end the pause either.
    #[test]
    #[ignore = "needs root: creates namespaces, forks into the pod's PID namespace"]
    fn a_forged_sender_does_not_end_the_pause() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        let ns = File::open(format!("/proc/{pid}/ns/pid")).unwrap();
        let sent = std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWPID).unwrap();
            // SAFETY: the child makes raw system calls only and _exits.
            match unsafe { nix::unistd::fork() }.unwrap() {
                // SAFETY: raw writes into a zeroed siginfo_t on this stack, one system call.
                nix::unistd::ForkResult::Child => unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    let words = (&mut info as *mut libc::siginfo_t).cast::<i32>();
                    *words = libc::SIGTERM; // si_signo
                    *words.add(2) = -1; // si_code: SI_QUEUE; si_pid (word 4) stays 0
                    let r = libc::syscall(
                        libc::SYS_rt_sigqueueinfo,
                        1,
                        libc::SIGTERM,
                        &info as *const libc::siginfo_t,
                    );
                    libc::_exit(if r == 0 { 0 } else { 1 });
                },
                nix::unistd::ForkResult::Parent { child } => wait_exit(child.as_raw()),
            }
        })
        .join()
        .unwrap();
        assert_eq!(sent, 0, "the forged SIGTERM was not sent");
        std::thread::sleep(Duration::from_millis(200));
        let state = status_field(pid, "State");
        assert!(state.starts_with('S'), "the pause is {state}");
        assert_eq!(terminate(pid), 0);
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
    fn a_root_mountpoint_that_is_no_directory_fails_before_any_clone() {
        let cfg = PauseConfig {
            root_mountpoint: "/nonexistent/bundle".into(),
            ..Default::default()
        };
        let err = spawn(&cfg).unwrap_err();
        assert!(
            err.message().contains("is not a directory"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn a_missing_netns_fails_before_any_clone() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
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
    #[ignore = "needs root: creates namespaces and drops to 65535"]
    fn the_fallback_leaves_no_fd_open() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
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
    #[ignore = "needs root: creates namespaces and drops to 65535"]
    fn the_pause_process_is_named_after_the_pod() {
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
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
        // The program runs from the sealed memfd, not from a file of the node.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert_eq!(exe.to_str().unwrap(), "/memfd:rsandbox-pause (deleted)");
    }

    /// One mapping of 65536 ids at `host` for both maps, as the kubelet sends.
    fn userns_at(host: u32) -> Option<UserNamespace> {
        let m = vec![IdMapping {
            container_id: 0,
            host_id: host,
            size: 65536,
        }];
        Some(UserNamespace {
            uids: m.clone(),
            gids: m,
        })
    }

    /// The inode of the user namespace that owns the namespace at `path` (NS_GET_USERNS).
    fn owner_of(path: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let f = File::open(path).unwrap();
        // SAFETY: NS_GET_USERNS returns a new fd (or -1), which we own.
        let fd = unsafe { libc::ioctl(f.as_raw_fd(), libc::NS_GET_USERNS) };
        assert!(
            fd >= 0,
            "NS_GET_USERNS {path}: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: as above.
        let owner = File::from(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        owner.metadata().unwrap().ino()
    }

    fn ino(path: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    /// Issue 16: the pause of a user-namespaced pod holds a user namespace with the pod's maps,
    /// and its mount, IPC, UTS and PID namespaces belong to it (member containers in the user
    /// namespace can join them); the pod netns (the node's user namespace) is joined first and
    /// its sysctls written with the node's privileges; the pause is PID 1, runs as 65535 inside
    /// (265535 on the node), confined as without a user namespace, and is the spawner's child
    /// (a subreaper, as the shim) once the intermediate child is gone.
    #[test]
    #[ignore = "needs root: creates a netns and user namespaces"]
    fn pause_holds_the_pods_user_namespace() {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ns = crate::netns::NetNs::create(dir.path(), "pause-userns").unwrap();
        struct RemoveNs(PathBuf);
        impl Drop for RemoveNs {
            fn drop(&mut self) {
                let _ = crate::netns::NetNs::remove(&self.0);
            }
        }
        let _rm = RemoveNs(ns.path().to_path_buf());
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            netns: Some(ns.path().to_path_buf()),
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            hostname: Some("pod-u".into()),
            sysctls: vec![
                ("kernel.shm_rmid_forced".into(), "1".into()),
                ("net.ipv4.ip_unprivileged_port_start".into(), "0".into()),
            ],
            pod_id: "pod-u".into(),
            userns: userns_at(200000),
        };
        let pid = spawn(&cfg).unwrap();
        let _kill = KillOnDrop(pid);
        let map = |kind: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/{kind}"))
                .unwrap()
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(map("uid_map"), ["0", "200000", "65536"]);
        assert_eq!(map("gid_map"), ["0", "200000", "65536"]);
        let user = ino(&format!("/proc/{pid}/ns/user"));
        assert_ne!(user, ino("/proc/self/ns/user"));
        for kind in ["mnt", "ipc", "uts", "pid"] {
            assert_eq!(owner_of(&format!("/proc/{pid}/ns/{kind}")), user, "{kind}");
        }
        assert_eq!(
            ino(&format!("/proc/{pid}/ns/net")),
            ino(&ns.path().display().to_string())
        );
        assert_eq!(
            owner_of(&format!("/proc/{pid}/ns/net")),
            ino("/proc/self/ns/user")
        );
        assert_eq!(status_field(pid, "Uid"), "265535\t265535\t265535\t265535");
        assert_eq!(status_field(pid, "Gid"), "265535\t265535\t265535\t265535");
        assert_eq!(status_field(pid, "PPid"), std::process::id().to_string());
        assert_eq!(
            status_field(pid, "NSpid").split_whitespace().last(),
            Some("1")
        );
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
        assert_eq!(status_field(pid, "NoNewPrivs"), "1");
        assert_eq!(status_field(pid, "Seccomp"), "2");
        assert_eq!(open_fds(pid), 0, "fds inherited by the pause process");
        assert_eq!(
            std::fs::read_dir(format!("/proc/{pid}/root"))
                .unwrap()
                .count(),
            0
        );
        let uts = File::open(format!("/proc/{pid}/ns/uts")).unwrap();
        let got = in_ns(uts, nix::sched::CloneFlags::CLONE_NEWUTS, || {
            nix::unistd::gethostname().unwrap().into_string().unwrap()
        });
        assert_eq!(got, "pod-u");
        let ipc = File::open(format!("/proc/{pid}/ns/ipc")).unwrap();
        let got = in_ns(ipc, nix::sched::CloneFlags::CLONE_NEWIPC, || {
            std::fs::read_to_string("/proc/sys/kernel/shm_rmid_forced").unwrap()
        });
        assert_eq!(got.trim(), "1");
        let net = File::open(ns.path()).unwrap();
        let got = in_ns(net, nix::sched::CloneFlags::CLONE_NEWNET, || {
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap()
        });
        assert_eq!(got.trim(), "0");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(wait_exit(pid), 0);
    }

    /// A failing sysctl is named on either side of the user namespace: net.* (written before
    /// it, by the intermediate child) and the others (by the pause, inside it).
    #[test]
    #[ignore = "needs root: creates user namespaces"]
    fn a_failing_step_in_a_user_namespace_is_reported_by_name() {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        for (name, when) in [
            ("net.ipv4.no_such_sysctl_rsandbox", "before"),
            ("kernel.no_such_sysctl_rsandbox", "inside"),
        ] {
            let cfg = PauseConfig {
                root_mountpoint: std::env::temp_dir(),
                new_ipc: true,
                new_uts: true,
                new_pid: true,
                sysctls: vec![
                    ("kernel.shm_rmid_forced".into(), "1".into()),
                    (name.into(), "1".into()),
                ],
                userns: userns_at(300000),
                ..Default::default()
            };
            let err = spawn(&cfg).unwrap_err();
            assert_eq!(
                err.message(),
                format!(
                    "pause: open the file of sysctl {name} ({}): No such file or directory \
                     (os error 2)",
                    sysctl_path(name).display()
                ),
                "{when}"
            );
        }
        // A pause root it cannot reach: under a directory of another user, mode 0700 (the
        // pause has no capability over the node's files).
        let dir = tempfile::tempdir().unwrap();
        let hidden = dir.path().join("hidden");
        std::fs::create_dir(&hidden).unwrap();
        std::fs::create_dir(hidden.join("root")).unwrap();
        std::fs::set_permissions(&hidden, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        std::os::unix::fs::chown(&hidden, Some(12345), Some(12345)).unwrap();
        let cfg = PauseConfig {
            root_mountpoint: hidden.join("root"),
            new_ipc: true,
            new_uts: true,
            userns: userns_at(300000),
            ..Default::default()
        };
        let err = spawn(&cfg).unwrap_err();
        assert_eq!(
            err.message(),
            format!(
                "pause: mount its empty root (on {}): Permission denied (os error 13)",
                hidden.join("root").display()
            )
        );
    }

    /// A netns inside a new user namespace with `host`-based maps, as CRI makes it for a
    /// user-namespaced pod (`setupNetnsWithinUserns`), held by a `sleep`.
    fn netns_in_userns(host: u32) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("sleep");
        c.arg("60");
        // SAFETY: unshare only, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn().unwrap();
        for map in ["uid_map", "gid_map"] {
            std::fs::write(
                format!("/proc/{}/{map}", child.id()),
                format!("0 {host} 65536\n"),
            )
            .unwrap();
        }
        child
    }

    /// Issue 16 with containerd's CRI: the pod netns belongs to a user namespace with the pod's
    /// maps; the pause joins that one (its containers then own their network: sysfs, links) and
    /// makes its other namespaces in it. Maps that are not the pod's are refused by name.
    #[test]
    #[ignore = "needs root: creates user namespaces"]
    fn pause_joins_the_user_namespace_that_owns_the_pod_netns() {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        let mut holder = netns_in_userns(500000);
        let netns = PathBuf::from(format!("/proc/{}/ns/net", holder.id()));
        let cfg = PauseConfig {
            root_mountpoint: std::env::temp_dir(),
            netns: Some(netns.clone()),
            new_ipc: true,
            new_uts: true,
            new_pid: true,
            sysctls: vec![("net.ipv4.ip_unprivileged_port_start".into(), "0".into())],
            userns: userns_at(500000),
            ..Default::default()
        };
        let pid = spawn(&cfg).unwrap();
        let kill = KillOnDrop(pid);
        let user = ino(&format!("/proc/{}/ns/user", holder.id()));
        assert_eq!(ino(&format!("/proc/{pid}/ns/user")), user);
        for kind in ["mnt", "ipc", "uts", "pid", "net"] {
            assert_eq!(owner_of(&format!("/proc/{pid}/ns/{kind}")), user, "{kind}");
        }
        assert_eq!(status_field(pid, "Uid"), "565535\t565535\t565535\t565535");
        assert_eq!(status_field(pid, "PPid"), std::process::id().to_string());
        assert_eq!(status_field(pid, "Seccomp"), "2");
        drop(kill);
        let wrong = PauseConfig {
            userns: userns_at(600000),
            ..cfg
        };
        let err = spawn(&wrong).unwrap_err();
        assert_eq!(
            err.message(),
            "pause: check the maps of the user namespace that owns the pod netns (they are not \
             the pod's): Invalid argument (os error 22)"
        );
        let _ = holder.kill();
        let _ = holder.wait();
    }

    #[test]
    fn maps_without_the_pause_ids_are_refused_before_any_clone() {
        let short = vec![IdMapping {
            container_id: 0,
            host_id: 100000,
            size: 65535,
        }];
        let full = userns_at(100000).unwrap().uids;
        for (uids, gids, what) in [
            (short.clone(), full.clone(), "uid"),
            (full.clone(), short.clone(), "gid"),
        ] {
            let cfg = PauseConfig {
                root_mountpoint: std::env::temp_dir(),
                userns: Some(UserNamespace { uids, gids }),
                ..Default::default()
            };
            let err = spawn(&cfg).unwrap_err();
            assert_eq!(err.kind(), crate::error::Kind::InvalidArgument);
            assert_eq!(
                err.message(),
                format!(
                    "pause: the {what} map of the pod's user namespace does not map 65535, the \
                     pause process's {what}"
                )
            );
        }
    }

    #[test]
    fn the_spec_requires_the_pause_ids() {
        use crate::pod::spec::REQUIRED_MAPPED_IDS;
        assert!(REQUIRED_MAPPED_IDS.contains(&PAUSE_UID));
        assert!(REQUIRED_MAPPED_IDS.contains(&PAUSE_GID));
        assert!(REQUIRED_MAPPED_IDS.contains(&0));
    }

    #[test]
    fn only_the_child_sets_the_flag() {
        assert!(!IN_FORKED_CHILD.load(Ordering::SeqCst));
    }
}
