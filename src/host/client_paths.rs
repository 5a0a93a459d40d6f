//! Opening paths a client chose (`netns_path`, stdio fifos, `file://` log targets, bundles):
//! never blocking, never following a symbolic link in the last component, and checking what
//! was opened (fstat, or the namespace ioctl) before it is used.
//!
//! A plain `open(2)` of a FIFO for reading or writing waits for the other end: a client that
//! names a FIFO where the shim expects a netns, a log file or a directory would otherwise hold
//! the calling RPC, and the locks it holds, for ever. `O_NONBLOCK` makes every open return at
//! once; the type is then checked on the descriptor itself, so a path swapped between a check
//! and the open cannot slip through.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::records::error::{Context, Error, Result};

const FLAGS: libc::c_int = libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOFOLLOW;
/// Reopening through `/proc/self/fd` follows that magic link by design (no `O_NOFOLLOW`).
const REOPEN_FLAGS: libc::c_int = libc::O_CLOEXEC | libc::O_NONBLOCK;

/// `NS_GET_NSTYPE` (`_IO(0xb7, 0x3)`, Linux 4.11): the `CLONE_NEW*` type of a namespace file.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
/// `statfs.f_type` of nsfs (namespace files).
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// What a file is, for error messages.
fn kind(f: &File) -> &'static str {
    match f.metadata().map(|m| m.file_type()) {
        Ok(t) if t.is_fifo() => "a fifo",
        Ok(t) if t.is_socket() => "a socket",
        Ok(t) if t.is_char_device() => "a character device",
        Ok(t) if t.is_block_device() => "a block device",
        Ok(t) if t.is_dir() => "a directory",
        Ok(t) if t.is_symlink() => "a symbolic link",
        Ok(t) if t.is_file() => "a regular file",
        _ => "of an unknown type",
    }
}

/// `path` as an `O_PATH` descriptor: opening it has no effect on the file (no device is
/// opened, no fifo waited on); its type is then checked before it is opened for real with
/// [`reopen`]. `follow`: whether a link in the last component is followed.
fn locate(path: &Path, follow: bool) -> std::io::Result<File> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC | nofollow)
        .open(path)
}

/// Opens the file behind an `O_PATH` descriptor (through `/proc/self/fd`: the same inode,
/// whatever happened to the path since).
fn reopen(located: &File, options: &mut OpenOptions) -> std::io::Result<File> {
    options.open(format!("/proc/self/fd/{}", located.as_raw_fd()))
}

/// Opens a network namespace file (`/var/run/netns/cni-…`, `/proc/<pid>/ns/net`). Anything
/// else (a fifo, a regular file, a device, another namespace type) is InvalidArgument, and is
/// never opened. Links are followed here (`/proc/<pid>/ns/net` is one): what they lead to is
/// checked all the same.
pub fn open_netns(path: &Path) -> Result<OwnedFd> {
    let not_netns = |what: &str| {
        Error::invalid(format!(
            "netns {} is not a network namespace: it is {what}",
            path.display()
        ))
    };
    let at = locate(path, true).with_context(|| format!("open netns {}", path.display()))?;
    let fs = nix::sys::statfs::fstatfs(&at)
        .with_context(|| format!("statfs netns {}", path.display()))?;
    if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
        return Err(not_netns(kind(&at)));
    }
    let f = reopen(
        &at,
        OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC),
    )
    .with_context(|| format!("open netns {}", path.display()))?;
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's inode.
    let t = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_NSTYPE) };
    if t != libc::CLONE_NEWNET {
        return Err(not_netns("a namespace of another type"));
    }
    Ok(OwnedFd::from(f))
}

/// How a fifo is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifoEnd {
    Read,
    Write,
    /// Both ends: never waits and never fails for want of a peer.
    ReadWrite,
}

/// Opens a fifo without waiting for its other end; anything else (a link, a file, a device) is
/// InvalidArgument and never opened. The descriptor stays non-blocking: [`blocking`] makes it
/// blocking for a process. A write end opens only while a reader exists (ENXIO otherwise).
pub fn open_fifo(path: &Path, end: FifoEnd) -> Result<File> {
    let at = locate(path, false).with_context(|| format!("open fifo {}", path.display()))?;
    if !at
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?
        .file_type()
        .is_fifo()
    {
        return Err(Error::invalid(format!(
            "{} is not a fifo: it is {}",
            path.display(),
            kind(&at)
        )));
    }
    reopen(
        &at,
        OpenOptions::new()
            .read(end != FifoEnd::Write)
            .write(end != FifoEnd::Read)
            .custom_flags(REOPEN_FLAGS),
    )
    .with_context(|| format!("open fifo {}", path.display()))
}

/// Opens (creating it, mode 0640) a log file to append to; a fifo, device, socket or link
/// there is InvalidArgument, never opened. Its parent directories are created.
pub fn open_log_file(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let ctx = || format!("open log file {}", path.display());
    let mut append = OpenOptions::new();
    append.append(true).custom_flags(libc::O_CLOEXEC);
    match locate(path, false) {
        Ok(at) => {
            if !at.metadata().with_context(ctx)?.is_file() {
                return Err(Error::invalid(format!(
                    "log file {} is not a regular file: it is {}",
                    path.display(),
                    kind(&at)
                )));
            }
            reopen(&at, &mut append).with_context(ctx)
        }
        // Created here, so a regular file; O_EXCL: never one that appeared meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => append
            .create_new(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .with_context(ctx),
        Err(e) => Err(Error::from(e).context(ctx())),
    }
}

/// Checks that `path` is a directory, not a symbolic link to one (bundles, the rootfs).
pub fn check_dir(what: &str, path: &Path) -> Result<()> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(FLAGS | libc::O_DIRECTORY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => Error::invalid(format!(
                "{what} {} is not a directory (or is a symbolic link)",
                path.display()
            )),
            _ => Error::from(e).context(format!("open {what} {}", path.display())),
        })?;
    drop(f);
    Ok(())
}

/// Clears `O_NONBLOCK` (the process that gets the descriptor expects blocking I/O).
pub fn blocking(f: File, path: &Path) -> Result<File> {
    let flags = OFlag::from_bits_truncate(
        fcntl(f.as_fd(), FcntlArg::F_GETFL).with_context(|| format!("fcntl {}", path.display()))?,
    );
    fcntl(f.as_fd(), FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))
        .with_context(|| format!("fcntl {}", path.display()))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::error::Kind;

    fn fifo(dir: &Path, name: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn a_fifo_or_a_file_is_not_a_netns() {
        let dir = tempfile::tempdir().unwrap();
        let f = fifo(dir.path(), "fifo");
        // Would block for ever without O_NONBLOCK: no writer exists.
        let err = open_netns(&f).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("it is a fifo"), "{err}");
        let reg = dir.path().join("file");
        std::fs::write(&reg, "").unwrap();
        let err = open_netns(&reg).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("a regular file"), "{err}");
        let err = open_netns(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert!(err.message().contains("another type"), "{err}");
        open_netns(Path::new("/proc/self/ns/net")).unwrap();
        let err = open_netns(&dir.path().join("missing")).unwrap_err();
        assert_eq!(err.kind(), Kind::NotFound, "{err}");
    }

    #[test]
    fn a_symlink_to_a_fifo_or_a_directory_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let f = fifo(dir.path(), "fifo");
        let flink = dir.path().join("flink");
        std::os::unix::fs::symlink(&f, &flink).unwrap();
        assert!(open_fifo(&flink, FifoEnd::ReadWrite).is_err());
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let dlink = dir.path().join("dlink");
        std::os::unix::fs::symlink(&d, &dlink).unwrap();
        check_dir("bundle", &d).unwrap();
        let err = check_dir("bundle", &dlink).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
    }

    #[test]
    fn fifos_open_without_a_peer_and_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = fifo(dir.path(), "fifo");
        open_fifo(&f, FifoEnd::Read).unwrap();
        let rw = open_fifo(&f, FifoEnd::ReadWrite).unwrap();
        open_fifo(&f, FifoEnd::Write).unwrap();
        drop(rw);
        let reg = dir.path().join("file");
        std::fs::write(&reg, "").unwrap();
        let err = open_fifo(&reg, FifoEnd::ReadWrite).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("not a fifo"), "{err}");
    }

    /// Devices are refused before they are opened (an open of some devices has effects).
    #[test]
    fn a_device_is_neither_netns_nor_fifo_nor_log_file() {
        let dev = Path::new("/dev/null");
        let err = open_netns(dev).unwrap_err();
        assert!(err.message().contains("a character device"), "{err}");
        let err = open_fifo(dev, FifoEnd::ReadWrite).unwrap_err();
        assert!(err.message().contains("a character device"), "{err}");
        let err = open_log_file(dev).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("a character device"), "{err}");
    }

    #[test]
    fn a_fifo_is_no_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = fifo(dir.path(), "log");
        // A blocking open for writing would wait for a reader for ever.
        let err = open_log_file(&f).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("a fifo"), "{err}");
        // With a reader the open succeeds; the type check refuses it all the same.
        let _reader = open_fifo(&f, FifoEnd::Read).unwrap();
        let err = open_log_file(&f).unwrap_err();
        assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
        assert!(err.message().contains("it is a fifo"), "{err}");
        let log = dir.path().join("sub/c.log");
        let file = open_log_file(&log).unwrap();
        let mode = std::os::unix::fs::MetadataExt::mode(&file.metadata().unwrap());
        assert_eq!(mode & 0o777, 0o640);
        // An existing one is appended to.
        drop(open_log_file(&log).unwrap());
        let flags = fcntl(file.as_fd(), FcntlArg::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        assert_ne!(flags & libc::O_APPEND, 0);
    }
}
