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

use crate::error::{Context, Error, Result};

const FLAGS: libc::c_int = libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOFOLLOW;

/// `NS_GET_NSTYPE` (`_IO(0xb7, 0x3)`, Linux 4.11): the `CLONE_NEW*` type of a namespace file.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// What a file is, for error messages.
fn kind(f: &File) -> &'static str {
    match f.metadata().map(|m| m.file_type()) {
        Ok(t) if t.is_fifo() => "a fifo",
        Ok(t) if t.is_socket() => "a socket",
        Ok(t) if t.is_char_device() => "a character device",
        Ok(t) if t.is_block_device() => "a block device",
        Ok(t) if t.is_dir() => "a directory",
        Ok(t) if t.is_file() => "a regular file",
        _ => "of an unknown type",
    }
}

/// Opens a network namespace file (`/var/run/netns/cni-…`, `/proc/<pid>/ns/net`). Anything
/// else (a fifo, a regular file, another namespace type) is InvalidArgument. Links are
/// followed here (`/proc/<pid>/ns/net` is one): what they lead to is checked all the same.
pub fn open_netns(path: &Path) -> Result<OwnedFd> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("open netns {}", path.display()))?;
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's inode.
    let t = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_NSTYPE) };
    if t == libc::CLONE_NEWNET {
        return Ok(OwnedFd::from(f));
    }
    let what = if t >= 0 {
        "a namespace of another type"
    } else {
        kind(&f)
    };
    Err(Error::invalid(format!(
        "netns {} is not a network namespace: it is {what}",
        path.display()
    )))
}

/// How a fifo is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifoEnd {
    Read,
    Write,
    /// Both ends: never waits and never fails for want of a peer.
    ReadWrite,
}

/// Opens a fifo without waiting for its other end; anything but a fifo is InvalidArgument.
/// The descriptor stays non-blocking: [`blocking`] makes it blocking for a process.
/// A write end opens only while a reader exists (ENXIO otherwise).
pub fn open_fifo(path: &Path, end: FifoEnd) -> Result<File> {
    let f = OpenOptions::new()
        .read(end != FifoEnd::Write)
        .write(end != FifoEnd::Read)
        .custom_flags(FLAGS)
        .open(path)
        .with_context(|| format!("open fifo {}", path.display()))?;
    if !f
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?
        .file_type()
        .is_fifo()
    {
        return Err(Error::invalid(format!(
            "{} is not a fifo: it is {}",
            path.display(),
            kind(&f)
        )));
    }
    Ok(f)
}

/// Opens (creating it, mode 0640) a log file to append to; a fifo, device or socket there is
/// InvalidArgument, never waited on. Its parent directories are created.
pub fn open_log_file(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(FLAGS)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // A fifo without a reader (or a device without its peer).
            Some(libc::ENXIO) => Error::invalid(format!(
                "log file {} is not a regular file: it is a fifo or a device",
                path.display()
            )),
            _ => Error::from(e).context(format!("open log file {}", path.display())),
        })?;
    if !f
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?
        .is_file()
    {
        return Err(Error::invalid(format!(
            "log file {} is not a regular file: it is {}",
            path.display(),
            kind(&f)
        )));
    }
    blocking(f, path)
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
    use crate::error::Kind;

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
        let flags = fcntl(file.as_fd(), FcntlArg::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        assert_ne!(flags & libc::O_APPEND, 0);
    }
}
