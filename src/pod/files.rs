//! The pod's `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname` and `/dev/shm`, made the way
//! containerd 2.1's podsandbox controller makes them (`setupSandboxFiles`), because with
//! `sandboxer = "shim"` containerd creates none of them.
//!
//! * `hostname`: the pod's hostname plus `\n`; an empty hostname (host-network pods) falls back
//!   to the node's hostname, as containerd does.
//! * `hosts`: a verbatim copy of the node's `/etc/hosts`. containerd does exactly this and
//!   leaves pod entries to the kubelet, which bind-mounts its own managed `etc-hosts` file into
//!   each container; ours is what the sandbox itself (and any container the kubelet does not
//!   manage) sees.
//! * `resolv.conf`: rendered from the CRI `DNSConfig` when present (containerd's
//!   `parseDNSOptions` format), else a verbatim copy of the node's `resolv.conf`.
//! * `/dev/shm`: a tmpfs (`nosuid,nodev,noexec`, `mode=1777`, 64 MiB by default) on a
//!   directory the caller created, unless the pod uses the host IPC namespace.
//!
//! Writes are atomic (temporary file + `renameat`) and never follow a symlink inside the pod
//! directory: the directory is opened with `O_NOFOLLOW|O_DIRECTORY`, temporary files are
//! created `O_EXCL|O_NOFOLLOW` relative to that fd, and `rename` replaces a symlink at the
//! destination rather than writing through it.

use std::ffi::OsStr;
use std::fs::DirBuilder;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::spec::{Dns, PodSpec};

/// Mode of the files we write (containerd: 0644).
pub const FILE_MODE: u32 = 0o644;
/// Mode of the pod directory when we create it. Files are bind-mounted into containers by a
/// root process, so nobody else needs to list the directory.
pub const DIR_MODE: u32 = 0o711;
/// containerd's `defaultShmSize`: 64 MiB.
pub const DEFAULT_SHM_SIZE: u64 = 64 * 1024 * 1024;

/// File names inside the pod directory.
pub const HOSTS: &str = "hosts";
/// See [`HOSTS`].
pub const RESOLV_CONF: &str = "resolv.conf";
/// See [`HOSTS`].
pub const HOSTNAME: &str = "hostname";

/// An I/O failure, with the operation and path.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct FilesError {
    /// What we were doing, e.g. "write".
    pub op: &'static str,
    /// The path involved.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Kind by the OS error (see [`crate::records::error::os_error_kind`]); the text names op and path.
impl From<FilesError> for crate::records::error::Error {
    fn from(e: FilesError) -> Self {
        crate::records::error::Error::new(
            crate::records::error::os_error_kind(e.source.raw_os_error()),
            e.to_string(),
        )
    }
}

fn ioerr(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FilesError + use<> {
    let path = path.to_path_buf();
    move |source| FilesError { op, path, source }
}

fn nixerr(op: &'static str, path: &Path) -> impl FnOnce(Errno) -> FilesError + use<> {
    let path = path.to_path_buf();
    move |e| FilesError {
        op,
        path,
        source: e.into(),
    }
}

/// Content of the pod's `resolv.conf`.
///
/// With a DNS config: `search a b\n`, one `nameserver x\n` per server, `options o1 o2\n`, each
/// line only if its list is non-empty (so an all-empty config gives an empty file), exactly as
/// containerd's `parseDNSOptions`. Without one: the node's `resolv.conf` content as-is.
pub fn resolv_conf(dns: Option<&Dns>, host_resolv: &str) -> String {
    let Some(dns) = dns else {
        return host_resolv.to_owned();
    };
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for s in &dns.servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// Content of the pod's `hosts`: the node's `/etc/hosts`, verbatim (see the module docs).
pub fn hosts(host_hosts: &str) -> String {
    host_hosts.to_owned()
}

/// Content of the pod's `hostname` file.
pub fn hostname_file(hostname: &str) -> String {
    format!("{hostname}\n")
}

/// Paths of the pod files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFiles {
    /// `<dir>/hosts`.
    pub hosts: PathBuf,
    /// `<dir>/resolv.conf`.
    pub resolv_conf: PathBuf,
    /// `<dir>/hostname`.
    pub hostname: PathBuf,
}

impl PodFiles {
    /// The paths the files have (or would have) in `dir`.
    pub fn paths(dir: &Path) -> PodFiles {
        PodFiles {
            hosts: dir.join(HOSTS),
            resolv_conf: dir.join(RESOLV_CONF),
            hostname: dir.join(HOSTNAME),
        }
    }

    /// Writes `hosts`, `resolv.conf` and `hostname` into `dir` (created with [`DIR_MODE`] if
    /// missing, parents included; an existing directory keeps its mode but must not be a
    /// symlink). `host_etc` is the node's `/etc` (a parameter for tests): `hosts` is always
    /// read from it, `resolv.conf` only when the pod has no DNS config. Each file is written
    /// atomically with mode [`FILE_MODE`]; rewriting replaces the previous files.
    pub fn write(dir: &Path, spec: &PodSpec, host_etc: &Path) -> Result<PodFiles, FilesError> {
        let hosts_src = host_etc.join(HOSTS);
        let host_hosts = std::fs::read_to_string(&hosts_src).map_err(ioerr("read", &hosts_src))?;
        let resolv = match &spec.dns {
            Some(dns) => resolv_conf(Some(dns), ""),
            None => {
                let src = host_etc.join(RESOLV_CONF);
                resolv_conf(
                    None,
                    &std::fs::read_to_string(&src).map_err(ioerr("read", &src))?,
                )
            }
        };
        let hostname = if spec.hostname.is_empty() {
            let h = nix::unistd::gethostname().map_err(nixerr("gethostname", Path::new("")))?;
            h.to_string_lossy().into_owned()
        } else {
            spec.hostname.clone()
        };

        let existed = dir.symlink_metadata().is_ok();
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(ioerr("create directory", dir))?;
        let dirfd = open_dir_nofollow(dir)?;
        if !existed {
            // Undo the umask on the directory we just made.
            fchmod(&dirfd, Mode::from_bits_truncate(DIR_MODE)).map_err(nixerr("chmod", dir))?;
        }
        let paths = PodFiles::paths(dir);
        write_atomic(&dirfd, dir, HOSTS, hosts(&host_hosts).as_bytes())?;
        write_atomic(&dirfd, dir, RESOLV_CONF, resolv.as_bytes())?;
        write_atomic(&dirfd, dir, HOSTNAME, hostname_file(&hostname).as_bytes())?;
        Ok(paths)
    }

    /// Removes the three files from `dir` (not the directory). Idempotent: missing files or a
    /// missing directory are fine.
    pub fn remove(dir: &Path) -> Result<(), FilesError> {
        let dirfd = match open_dir_nofollow(dir) {
            Ok(fd) => fd,
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for name in [HOSTS, RESOLV_CONF, HOSTNAME] {
            match unlinkat(&dirfd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(nixerr("remove", &dir.join(name))(e)),
            }
        }
        Ok(())
    }
}

/// For a user-namespaced pod, gives what its containers and its pause use to the root of its
/// user namespace (`uid`, `gid`: the host ids of container id 0), as containerd does for the
/// runc path:
/// * the sandbox `bundle`: group `gid`, mode 0710 (containerd's
///   `prepareBundleDirectoryPermissions`): runc in the namespace can pass through it, nobody
///   else (the pause mounts its empty root there still as the node's uid 0);
/// * the pod files in `files_dir` and the directory: owned by `uid:gid` (the container's root
///   can rewrite `/etc/hosts` as on a node), modes unchanged;
/// * the `/dev/shm` tmpfs root, if any: owned by `uid:gid` (mode 1777 unchanged).
///
/// Symlinks are never followed (the files are ours, but the bundle is the caller's).
pub fn own_for_userns(
    bundle: &Path,
    files_dir: &Path,
    shm: Option<&Path>,
    uid: u32,
    gid: u32,
) -> Result<(), FilesError> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{Gid, Uid, fchownat};
    let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    let bundle_fd = open_dir_nofollow(bundle)?;
    nix::unistd::fchown(&bundle_fd, None, gid).map_err(nixerr("chown", bundle))?;
    fchmod(&bundle_fd, Mode::from_bits_truncate(0o710)).map_err(nixerr("chmod", bundle))?;
    let dirfd = open_dir_nofollow(files_dir)?;
    nix::unistd::fchown(&dirfd, uid, gid).map_err(nixerr("chown", files_dir))?;
    for name in [HOSTS, RESOLV_CONF, HOSTNAME] {
        fchownat(&dirfd, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(nixerr("chown", &files_dir.join(name)))?;
    }
    if let Some(shm) = shm {
        let fd = open_dir_nofollow(shm)?;
        nix::unistd::fchown(&fd, uid, gid).map_err(nixerr("chown", shm))?;
    }
    Ok(())
}

fn open_dir_nofollow(dir: &Path) -> Result<OwnedFd, FilesError> {
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nixerr("open directory", dir))
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `data` to `dirfd/name` via a fresh temporary file and `renameat`.
fn write_atomic(dirfd: &OwnedFd, dir: &Path, name: &str, data: &[u8]) -> Result<(), FilesError> {
    let path = dir.join(name);
    let tmp = format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let tmp_os = OsStr::from_bytes(tmp.as_bytes());
    let fd = openat(
        dirfd.as_fd(),
        tmp_os,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(nixerr("create", &dir.join(&tmp)))?;
    let cleanup = |e: FilesError| {
        let _ = unlinkat(dirfd, tmp_os, UnlinkatFlags::NoRemoveDir);
        e
    };
    // The umask may have narrowed the mode.
    fchmod(&fd, Mode::from_bits_truncate(FILE_MODE))
        .map_err(nixerr("chmod", &path))
        .map_err(cleanup)?;
    let mut file = std::fs::File::from(fd);
    // No fsync: the rename alone keeps readers from a half-written file, and a pod's files
    // need not outlive a host crash (the pod does not either). containerd's podsandbox does not
    // sync them either; on a disk-backed state dir the three fsyncs cost ~1.5 ms per pod.
    file.write_all(data)
        .map_err(ioerr("write", &path))
        .map_err(cleanup)?;
    drop(file);
    renameat(dirfd, tmp_os, dirfd, name)
        .map_err(nixerr("rename into place", &path))
        .map_err(cleanup)
}

/// Mounts a tmpfs for the pod's `/dev/shm` on `path`, which must be an existing, empty
/// directory and not a symlink. Options as containerd: `nosuid,nodev,noexec`, `mode=1777`,
/// `size=<size_bytes>` (use [`DEFAULT_SHM_SIZE`]; 0 is rejected since tmpfs reads it as
/// "unlimited"). `context`: the SELinux `context=` option giving the whole tmpfs the pod's label
/// (see [`crate::host::selinux::mount_option`]), where SELinux is enabled. Needs `CAP_SYS_ADMIN`.
pub fn mount_shm(path: &Path, size_bytes: u64, context: Option<&str>) -> Result<(), FilesError> {
    if size_bytes == 0 {
        return Err(FilesError {
            op: "mount shm",
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "size 0"),
        });
    }
    // Pin the directory (no symlink) and mount through its fd, so a swapped-in symlink
    // cannot redirect the mount.
    let fd = open_dir_nofollow(path)?;
    let mut entries = std::fs::read_dir(path).map_err(ioerr("read directory", path))?;
    if entries.next().is_some() {
        return Err(FilesError {
            op: "mount shm",
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::DirectoryNotEmpty,
                "directory is not empty",
            ),
        });
    }
    let target = fd_path(&fd);
    let mut data = format!("mode=1777,size={size_bytes}");
    if let Some(c) = context {
        data.push(',');
        data.push_str(c);
    }
    mount(
        Some("shm"),
        target.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(nixerr("mount shm", path))
}

fn fd_path(fd: &OwnedFd) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Unmounts the pod's `/dev/shm` tmpfs. Idempotent: a missing path or a path that is not a
/// mount point (`ENOENT`/`EINVAL`) is success. Falls back to a lazy `MNT_DETACH` unmount when
/// the mount is busy. Does not follow a symlink at `path`.
pub fn unmount_shm(path: &Path) -> Result<(), FilesError> {
    match umount2(path, MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) | Err(Errno::ENOENT) | Err(Errno::EINVAL) => Ok(()),
        Err(Errno::EBUSY) => {
            match umount2(path, MntFlags::UMOUNT_NOFOLLOW | MntFlags::MNT_DETACH) {
                Ok(()) | Err(Errno::ENOENT) | Err(Errno::EINVAL) => Ok(()),
                Err(e) => Err(nixerr("unmount shm", path)(e)),
            }
        }
        Err(e) => Err(nixerr("unmount shm", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn dns() -> Dns {
        Dns {
            servers: vec!["10.96.0.10".into(), "fd00::10".into()],
            searches: vec!["ns.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into(), "edns0".into()],
        }
    }

    #[test]
    fn resolv_conf_format_matches_containerd() {
        assert_eq!(
            resolv_conf(Some(&dns()), "ignored"),
            "search ns.svc.cluster.local svc.cluster.local\n\
             nameserver 10.96.0.10\n\
             nameserver fd00::10\n\
             options ndots:5 edns0\n"
        );
        let only_servers = Dns {
            servers: vec!["1.1.1.1".into()],
            ..Default::default()
        };
        assert_eq!(
            resolv_conf(Some(&only_servers), "x"),
            "nameserver 1.1.1.1\n"
        );
        assert_eq!(resolv_conf(Some(&Dns::default()), "host"), "");
    }

    #[test]
    fn resolv_conf_without_dns_copies_host() {
        let host = "# generated\nnameserver 192.168.1.1\nsearch lan\n";
        assert_eq!(resolv_conf(None, host), host);
        assert_eq!(resolv_conf(None, ""), "");
    }

    #[test]
    fn hosts_and_hostname() {
        let h = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n";
        assert_eq!(hosts(h), h);
        assert_eq!(hostname_file("web-0"), "web-0\n");
    }

    fn host_etc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("hosts"), "127.0.0.1 localhost\n").unwrap();
        std::fs::write(d.path().join("resolv.conf"), "nameserver 192.0.2.53\n").unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Issue 16: the bundle goes to the mapped root's group (0710), the pod files and /dev/shm
    /// to the mapped root; contents and file modes stay.
    #[test]
    #[ignore = "needs root: chown, mounts a tmpfs"]
    fn own_for_userns_gives_the_pod_to_the_mapped_root() {
        let etc = host_etc();
        let bundle = tempfile::tempdir().unwrap();
        let dir = bundle.path().join("etc");
        let spec = PodSpec {
            hostname: "web-u".into(),
            ..Default::default()
        };
        let files = PodFiles::write(&dir, &spec, etc.path()).unwrap();
        let shm = bundle.path().join("shm");
        std::fs::create_dir(&shm).unwrap();
        mount_shm(&shm, DEFAULT_SHM_SIZE, None).unwrap();
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = unmount_shm(&self.0);
            }
        }
        let _u = Unmount(shm.clone());
        own_for_userns(bundle.path(), &dir, Some(&shm), 100000, 200000).unwrap();
        let owner = |p: &Path| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(owner(bundle.path()).1, 200000);
        assert_eq!(mode(bundle.path()), 0o710);
        for p in [
            &dir,
            &files.hosts,
            &files.resolv_conf,
            &files.hostname,
            &shm,
        ] {
            assert_eq!(owner(p), (100000, 200000), "{}", p.display());
        }
        assert_eq!(mode(&files.hosts), FILE_MODE);
        assert_eq!(mode(&shm), 0o1777);
        assert_eq!(std::fs::read_to_string(&files.hostname).unwrap(), "web-u\n");
    }

    #[test]
    fn write_creates_files_with_mode_and_content() {
        let etc = host_etc();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sandbox").join("pod1");
        let spec = PodSpec {
            hostname: "web-0".into(),
            dns: Some(dns()),
            ..Default::default()
        };
        let files = PodFiles::write(&dir, &spec, etc.path()).unwrap();
        assert_eq!(files, PodFiles::paths(&dir));
        assert_eq!(mode(&dir), DIR_MODE);
        for p in [&files.hosts, &files.resolv_conf, &files.hostname] {
            assert_eq!(mode(p), FILE_MODE, "{}", p.display());
        }
        assert_eq!(
            std::fs::read_to_string(&files.hosts).unwrap(),
            "127.0.0.1 localhost\n"
        );
        assert_eq!(
            std::fs::read_to_string(&files.resolv_conf).unwrap(),
            resolv_conf(Some(&dns()), "")
        );
        assert_eq!(std::fs::read_to_string(&files.hostname).unwrap(), "web-0\n");
        // No temporary files left behind.
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["hostname", "hosts", "resolv.conf"]);

        // Rewrite (e.g. after a shim restart) replaces the content; no DNS → host copy;
        // empty hostname → the node's hostname.
        let spec = PodSpec::default();
        PodFiles::write(&dir, &spec, etc.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&files.resolv_conf).unwrap(),
            "nameserver 192.0.2.53\n"
        );
        let node = nix::unistd::gethostname().unwrap();
        assert_eq!(
            std::fs::read_to_string(&files.hostname).unwrap(),
            format!("{}\n", node.to_string_lossy())
        );
    }

    #[test]
    fn write_fails_without_host_files() {
        let etc = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let e = PodFiles::write(root.path(), &PodSpec::default(), etc.path()).unwrap_err();
        assert!(e.to_string().starts_with("read "), "{e}");
    }

    #[test]
    fn remove_is_idempotent() {
        let etc = host_etc();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("p");
        let files = PodFiles::write(&dir, &PodSpec::default(), etc.path()).unwrap();
        PodFiles::remove(&dir).unwrap();
        assert!(!files.hosts.exists() && !files.resolv_conf.exists() && !files.hostname.exists());
        PodFiles::remove(&dir).unwrap();
        PodFiles::remove(&root.path().join("never-created")).unwrap();
    }

    #[test]
    fn symlinks_in_dir_are_not_followed() {
        let etc = host_etc();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("p");
        std::fs::create_dir(&dir).unwrap();
        let victim = root.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("hosts")).unwrap();

        let files = PodFiles::write(&dir, &PodSpec::default(), etc.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(mode(&victim), 0o600);
        let md = std::fs::symlink_metadata(&files.hosts).unwrap();
        assert!(
            md.file_type().is_file(),
            "the symlink was replaced by a file"
        );

        // The pod directory itself being a symlink is refused.
        let link_dir = root.path().join("linkdir");
        std::os::unix::fs::symlink(&dir, &link_dir).unwrap();
        assert!(PodFiles::write(&link_dir, &PodSpec::default(), etc.path()).is_err());
        // And remove() does not unlink through it either.
        assert!(PodFiles::remove(&link_dir).is_err());
        assert!(files.hosts.exists());
    }

    #[test]
    #[ignore = "needs root: mount(2)"]
    fn shm_mount_and_unmount() {
        let root = tempfile::tempdir().unwrap();
        let shm = root.path().join("shm");
        std::fs::create_dir(&shm).unwrap();
        let parent_dev = std::fs::metadata(root.path()).unwrap().dev();

        mount_shm(&shm, DEFAULT_SHM_SIZE, None).unwrap();
        // Unmount even if an assertion below fails.
        struct Guard<'a>(&'a Path);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                let _ = unmount_shm(self.0);
            }
        }
        let _guard = Guard(&shm);
        let st = nix::sys::statfs::statfs(&shm).unwrap();
        assert_eq!(st.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
        let md = std::fs::metadata(&shm).unwrap();
        assert_ne!(md.dev(), parent_dev, "a new mount");
        assert_eq!(md.permissions().mode() & 0o7777, 0o1777);
        assert_eq!(
            st.blocks() * st.block_size() as u64,
            DEFAULT_SHM_SIZE,
            "size"
        );
        let canon = std::fs::canonicalize(&shm).unwrap();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = info
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
            .expect("mountinfo line");
        let opts = line.split(' ').nth(5).unwrap();
        for o in ["nosuid", "nodev", "noexec"] {
            assert!(opts.split(',').any(|x| x == o), "{o} missing in {line}");
        }

        unmount_shm(&shm).unwrap();
        assert_eq!(std::fs::metadata(&shm).unwrap().dev(), parent_dev);
        unmount_shm(&shm).unwrap();
        unmount_shm(&root.path().join("missing")).unwrap();
    }

    #[test]
    fn shm_refuses_bad_targets() {
        let root = tempfile::tempdir().unwrap();
        let full = root.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("f"), "x").unwrap();
        let e = mount_shm(&full, DEFAULT_SHM_SIZE, None).unwrap_err();
        assert_eq!(e.source.kind(), std::io::ErrorKind::DirectoryNotEmpty);

        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&empty, &link).unwrap();
        assert!(mount_shm(&link, DEFAULT_SHM_SIZE, None).is_err());
        assert!(mount_shm(&empty, 0, None).is_err());
        assert!(mount_shm(&root.path().join("missing"), DEFAULT_SHM_SIZE, None).is_err());
    }

    #[test]
    fn files_errors_keep_their_kind_on_the_wire() {
        use crate::records::error::{Error, Kind};
        for (errno, kind) in [
            (libc::ENOENT, Kind::NotFound),
            (libc::EEXIST, Kind::AlreadyExists),
            (libc::EACCES, Kind::Internal),
        ] {
            let e = Error::from(FilesError {
                op: "write",
                path: "/b/etc/hosts".into(),
                source: std::io::Error::from_raw_os_error(errno),
            });
            assert_eq!(e.kind(), kind, "errno {errno}");
            assert!(
                e.message().starts_with("write /b/etc/hosts: "),
                "{}",
                e.message()
            );
        }
    }
}
