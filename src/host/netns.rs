//! Shim-owned, persistent network namespaces (what containerd's `pkg/netns` does for its
//! podsandbox controller, which with `sandboxer = "shim"` is our job).
//!
//! A namespace is kept alive by bind-mounting its nsfs inode onto an empty file
//! `<dir>/<name>` (the `ip netns` convention), so it outlives every process in it and can be
//! handed to runc / CNI plugins as a path.
//!
//! [`NetNs::create`] does the `unshare(CLONE_NEWNET)` on a dedicated, short-lived OS thread:
//! network namespaces are per thread, so no other thread of the shim (in particular no ttrpc
//! worker) ever changes namespace. The thread brings `lo` up inside the new namespace, bind-mounts
//! `/proc/<pid>/task/<tid>/ns/net` onto the file and exits; the mount keeps the namespace.
//!
//! # Mount propagation
//!
//! containerd's `pkg/netns` only creates the directory (its comment says it "needs to be a
//! shared mountpoint", but the code does not make it one). The bind mount is visible at once to
//! every process in the shim's mount namespace (runc, CNI plugins and containerd run there).
//! A process in ANOTHER mount namespace that already has `<dir>` (e.g. a containerized network
//! daemon with `/run/netns` mounted `rslave`) only sees new mounts if the mount containing `<dir>`
//! is shared. On systemd hosts `/` and `/run` are shared, so nothing is needed; where they are
//! not, call [`ensure_shared_mount`] once for the directory (at shim start), which does what
//! `ip netns add` does: make `<dir>` a mount point of its own (bind onto itself) with shared
//! propagation. [`NetNs::create`] does not do this on its own, because it changes the host's
//! mount table.

use std::ffi::CString;
use std::fs::DirBuilder;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
use nix::sys::stat::Mode;
use nix::unistd::{getpid, gettid};

/// Longest namespace file name we accept.
pub const MAX_NAME_LEN: usize = 64;
/// Mode of the namespace directory when we create it (containerd: 0755).
pub const DIR_MODE: u32 = 0o755;
/// Mode of the placeholder file. containerd uses 0666 minus umask; nothing ever writes the
/// file (once mounted, the nsfs inode, mode 0444, shows through), so read-only is enough.
pub const FILE_MODE: u32 = 0o444;

/// Errors from namespace handling.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    /// The name is not a plain file name.
    #[error("netns name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A rejected name is one the shim made (Internal); an OS failure maps by its errno (see
/// [`crate::records::error::os_error_kind`]).
impl From<NetNsError> for crate::records::error::Error {
    fn from(e: NetNsError) -> Self {
        let kind = match &e {
            NetNsError::InvalidName { .. } => crate::records::error::Kind::Internal,
            NetNsError::Io { source, .. } => {
                crate::records::error::os_error_kind(source.raw_os_error())
            }
        };
        crate::records::error::Error::new(kind, e.to_string())
    }
}

fn ioerr(op: &'static str, path: &Path, source: impl Into<std::io::Error>) -> NetNsError {
    NetNsError::Io {
        op,
        path: path.to_path_buf(),
        source: source.into(),
    }
}

/// Checks that `name` is a plain file name: 1–[`MAX_NAME_LEN`] bytes, no `/`, no NUL or other
/// control characters, not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), NetNsError> {
    let bad = |reason| {
        Err(NetNsError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 64 bytes");
    }
    if name == "." || name == ".." {
        return bad("`.` and `..` are not file names");
    }
    if name.contains('/') {
        return bad("contains `/`");
    }
    if name.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    Ok(())
}

/// A persistent network namespace, bind-mounted at [`NetNs::path`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNs {
    path: PathBuf,
}

impl NetNs {
    /// Creates a new network namespace with `lo` up and pins it at `dir/name`.
    ///
    /// `dir` is created with mode [`DIR_MODE`] if missing. `dir/name` must not exist. On any
    /// failure the file is removed again. Needs `CAP_SYS_ADMIN`.
    pub fn create(dir: &Path, name: &str) -> Result<NetNs, NetNsError> {
        validate_name(name)?;
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|e| ioerr("create directory", dir, e))?;
        let path = dir.join(name);
        // The placeholder: must be new, and we never follow a symlink planted there.
        let file = open(
            &path,
            OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(FILE_MODE),
        )
        .map_err(|e| ioerr("create", &path, e))?;

        let result = new_ns_on_thread(&file);
        drop(file);
        match result {
            Ok(()) => Ok(NetNs { path }),
            Err((op, errno)) => {
                let _ = std::fs::remove_file(&path);
                Err(ioerr(op, &path, errno))
            }
        }
    }

    /// Refers to an existing namespace file (e.g. after a shim restart). No checks.
    pub fn from_path(path: impl Into<PathBuf>) -> NetNs {
        NetNs { path: path.into() }
    }

    /// Path of the bind-mounted namespace file (what goes into the OCI spec / CNI).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts (lazily, `MNT_DETACH`) and unlinks a namespace file. Idempotent: a missing file,
    /// or one that is no longer a mount point, is fine. The namespace itself dies once no
    /// process and no other mount or fd refers to it.
    pub fn remove(path: &Path) -> Result<(), NetNsError> {
        // Unmount every stacked mount (normally exactly one).
        for _ in 0..16 {
            match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) => continue,
                Err(Errno::EINVAL) | Err(Errno::ENOENT) => break,
                Err(e) => return Err(ioerr("unmount", path, e)),
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ioerr("remove", path, e)),
        }
    }
}

type StepError = (&'static str, Errno);

/// Runs the namespace work on a fresh thread that exits afterwards; its namespace change never
/// leaks into any other thread.
fn new_ns_on_thread(file: &OwnedFd) -> Result<(), StepError> {
    // Mount onto the fd we created rather than the path, so the target cannot be swapped.
    let target = format!("/proc/self/fd/{}", file.as_raw_fd());
    std::thread::Builder::new()
        .name("rsandbox-netns".into())
        .spawn(move || -> Result<(), StepError> {
            unshare(CloneFlags::CLONE_NEWNET).map_err(|e| ("unshare(CLONE_NEWNET) for", e))?;
            set_link_up("lo").map_err(|e| ("bring up lo in", e))?;
            let src = format!("/proc/{}/task/{}/ns/net", getpid(), gettid());
            mount(
                Some(src.as_str()),
                target.as_str(),
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| ("bind-mount netns onto", e))
            // Returning ends the thread, and with it its membership in the new namespace.
        })
        .map_err(|e| {
            (
                "spawn thread for",
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EAGAIN)),
            )
        })?
        .join()
        .map_err(|_| ("thread panicked creating", Errno::EIO))?
}

/// Sets `IFF_UP` on interface `name` in the calling thread's network namespace.
fn set_link_up(name: &str) -> Result<(), Errno> {
    let flags = link_flags(name)?;
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let mut ifr = ifreq_for(name)?;
    ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: `ifr` is a valid, NUL-terminated ifreq; SIOCSIFFLAGS reads `ifr_name` and
    // `ifru_flags`.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) })?;
    Ok(())
}

/// Reads the flags of interface `name` in the calling thread's network namespace.
fn link_flags(name: &str) -> Result<libc::c_short, Errno> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let mut ifr = ifreq_for(name)?;
    // SAFETY: `ifr` is a valid, NUL-terminated ifreq; SIOCGIFFLAGS fills `ifru_flags`.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) })?;
    // SAFETY: initialised by the kernel.
    Ok(unsafe { ifr.ifr_ifru.ifru_flags })
}

fn ifreq_for(name: &str) -> Result<libc::ifreq, Errno> {
    let cname = CString::new(name).map_err(|_| Errno::EINVAL)?;
    let bytes = cname.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(Errno::EINVAL);
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(ifr)
}

/// Makes sure bind mounts created under `dir` propagate to peer mount namespaces (see the
/// module docs): if the mount containing `dir` is already shared, does nothing and returns
/// `false`; otherwise makes `dir` a mount point of its own (bind onto itself, unless it already
/// is one) with `MS_SHARED|MS_REC` propagation and returns `true`. `dir` must exist. Needs
/// `CAP_SYS_ADMIN`.
pub fn ensure_shared_mount(dir: &Path) -> Result<bool, NetNsError> {
    let canon = std::fs::canonicalize(dir).map_err(|e| ioerr("resolve", dir, e))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ioerr("read", Path::new("/proc/self/mountinfo"), e))?;
    let Some(m) = containing_mount(&info, &canon) else {
        return Err(ioerr("find the mount containing", &canon, Errno::ENOENT));
    };
    if m.shared {
        return Ok(false);
    }
    if m.mount_point != canon {
        mount(
            Some(&canon),
            &canon,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| ioerr("bind-mount onto itself", &canon, e))?;
    }
    mount(
        None::<&str>,
        &canon,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| ioerr("make shared", &canon, e))?;
    Ok(true)
}

/// One parsed `/proc/self/mountinfo` line (only what we need).
#[derive(Debug, PartialEq, Eq)]
struct MountInfo {
    mount_point: PathBuf,
    shared: bool,
}

/// The mount `path` (canonical) lives on: the last-listed mount whose mount point is the
/// longest prefix of `path` (later lines are mounted on top of earlier ones).
fn containing_mount(mountinfo: &str, path: &Path) -> Option<MountInfo> {
    let mut best: Option<MountInfo> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 7 {
            continue;
        }
        let mount_point = PathBuf::from(unescape_mountinfo(fields[4]));
        if !path.starts_with(&mount_point) {
            continue;
        }
        // Optional fields run from index 6 up to the "-" separator.
        let shared = fields[6..]
            .iter()
            .take_while(|f| **f != "-")
            .any(|f| f.starts_with("shared:"));
        let longer = best
            .as_ref()
            .is_none_or(|b| mount_point.components().count() >= b.mount_point.components().count());
        if longer {
            best = Some(MountInfo {
                mount_point,
                shared,
            });
        }
    }
    best
}

/// Decodes the `\ooo` octal escapes mountinfo uses for space, tab, newline and backslash.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::setns;
    use nix::sys::statfs::{NSFS_MAGIC, statfs};
    use std::os::unix::fs::MetadataExt;

    fn is_mount_point(path: &Path) -> bool {
        let canon = std::fs::canonicalize(path).unwrap();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines().any(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|mp| Path::new(&unescape_mountinfo(mp)) == canon)
        })
    }

    #[test]
    fn names_are_validated_without_touching_the_fs() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("netns");
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for bad in ["", ".", "..", "a/b", "../x", "a\0b", "a\nb", long.as_str()] {
            let e = NetNs::create(&dir, bad).unwrap_err();
            assert!(matches!(e, NetNsError::InvalidName { .. }), "{bad:?}: {e}");
        }
        assert!(!dir.exists(), "nothing was created");
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(validate_name("cni-1234abcd-..-x").is_ok());
    }

    #[test]
    #[ignore = "needs root: unshare(CLONE_NEWNET) and mount(2)"]
    fn create_enter_remove() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("netns");
        let ns = NetNs::create(&dir, "pod-1").unwrap();
        assert_eq!(ns.path(), dir.join("pod-1"));
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o7777,
            DIR_MODE,
            "dir mode"
        );

        // The file is an nsfs mount, of a namespace other than ours.
        assert_eq!(statfs(ns.path()).unwrap().filesystem_type(), NSFS_MAGIC);
        assert!(is_mount_point(ns.path()));
        let ours = std::fs::metadata("/proc/self/ns/net").unwrap();
        let theirs = std::fs::metadata(ns.path()).unwrap();
        assert_ne!(ours.ino(), theirs.ino());
        assert_eq!(ours.dev(), theirs.dev(), "both nsfs");
        // Our own thread did not move.
        let me = format!("/proc/self/task/{}/ns/net", gettid());
        assert_eq!(std::fs::metadata(me).unwrap().ino(), ours.ino());

        // Creating the same name again fails and leaves the existing one alone.
        assert!(NetNs::create(&dir, "pod-1").is_err());
        assert_eq!(statfs(ns.path()).unwrap().filesystem_type(), NSFS_MAGIC);

        // Enter it on a throwaway thread: lo is up there.
        let path = ns.path().to_path_buf();
        let (flags, ino) = std::thread::spawn(move || {
            let fd = open(&path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).unwrap();
            setns(&fd, CloneFlags::CLONE_NEWNET).unwrap();
            let me = format!("/proc/self/task/{}/ns/net", gettid());
            (
                link_flags("lo").unwrap(),
                std::fs::metadata(me).unwrap().ino(),
            )
        })
        .join()
        .unwrap();
        assert_ne!(flags & libc::IFF_UP as libc::c_short, 0, "lo is up");
        assert_eq!(ino, theirs.ino());

        NetNs::remove(ns.path()).unwrap();
        assert!(!ns.path().exists());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.contains(&format!(" {} ", dir.join("pod-1").display())));
        NetNs::remove(ns.path()).unwrap();
        NetNs::remove(&dir.join("never-existed")).unwrap();
    }

    #[test]
    fn remove_plain_file_is_fine() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("stale");
        std::fs::write(&p, "").unwrap();
        NetNs::remove(&p).unwrap();
        assert!(!p.exists());
    }

    #[test]
    #[ignore = "needs root: unshare(CLONE_NEWNET) and mount(2)"]
    fn create_refuses_symlink_at_name() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("netns");
        std::fs::create_dir(&dir).unwrap();
        let victim = root.path().join("victim");
        std::fs::write(&victim, "x").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("n")).unwrap();
        assert!(NetNs::create(&dir, "n").is_err());
        assert!(!is_mount_point(&victim));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "x");
    }

    #[test]
    fn mountinfo_parsing() {
        let info = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
40 30 0:26 / /run/net\\040ns rw master:3 - tmpfs tmpfs rw
41 22 0:27 / /tmp rw - tmpfs tmpfs rw
";
        let m = containing_mount(info, Path::new("/run/netns")).unwrap();
        assert_eq!(m.mount_point, Path::new("/run"));
        assert!(m.shared);
        let m = containing_mount(info, Path::new("/run/net ns/x")).unwrap();
        assert_eq!(m.mount_point, Path::new("/run/net ns"));
        assert!(!m.shared, "master: is a slave, not shared");
        let m = containing_mount(info, Path::new("/tmp/a")).unwrap();
        assert!(!m.shared);
        let m = containing_mount(info, Path::new("/var/lib")).unwrap();
        assert_eq!(m.mount_point, Path::new("/"));
        assert_eq!(unescape_mountinfo("a\\134b\\011"), "a\\b\t");
    }

    #[test]
    #[ignore = "needs root: mount(2)"]
    fn ensure_shared_mount_makes_dir_shared() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("netns");
        std::fs::create_dir(&dir).unwrap();
        let changed = ensure_shared_mount(&dir).unwrap();
        let canon = std::fs::canonicalize(&dir).unwrap();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(containing_mount(&info, &canon).unwrap().shared);
        assert!(
            !ensure_shared_mount(&dir).unwrap(),
            "second call is a no-op"
        );
        if changed {
            umount2(&canon, MntFlags::MNT_DETACH).unwrap();
        }
    }

    #[test]
    fn netns_errors_keep_their_kind_on_the_wire() {
        use crate::records::error::{Error, Kind};
        let e = Error::from(ioerr(
            "mount",
            Path::new("/run/netns/x"),
            std::io::Error::from_raw_os_error(libc::ENOENT),
        ));
        assert_eq!(e.kind(), Kind::NotFound);
        assert!(e.message().contains("/run/netns/x") && e.message().contains("os error 2"));
        let e = Error::from(ioerr(
            "unshare",
            Path::new("/run/netns/x"),
            std::io::Error::from_raw_os_error(libc::EPERM),
        ));
        assert_eq!(e.kind(), Kind::Internal);
        let e = Error::from(NetNsError::InvalidName {
            name: "a/b".into(),
            reason: "contains '/'",
        });
        assert_eq!(e.kind(), Kind::Internal, "names are the shim's own");
    }
}
