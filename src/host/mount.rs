//! Mounting a task's rootfs (the snapshot mounts containerd sends with Create) on
//! `<bundle>/rootfs`, and taking it down again.
//!
//! A mount's `target` is a path inside the rootfs, and the rootfs is an image: once its first
//! mount is made, every later target is resolved through files the image chose. An image with
//! `data -> /etc` and a mount with target `data` must land on `rootfs/etc`, never on the
//! node's `/etc` (containerd's `mount.All` resolves targets inside the root with
//! `fs.RootPath`). So a target is resolved with `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS)` relative to a descriptor of the rootfs as it is at that moment
//! (earlier mounts included), and mount(2) is given that descriptor as `/proc/self/fd/<fd>`,
//! the way runc mounts into a container's rootfs: the kernel mounts on the object the
//! descriptor holds and resolves nothing a client chose. mount(2) through the descriptor rather
//! than `fsopen`/`fsmount`/`move_mount`: it takes every filesystem type and option string as
//! containerd's mount package does (a deep overlay's `lowerdir` list of up to a page, where
//! `fsconfig` takes 256 bytes per value before Linux 6.8's `lowerdir+`), and needs nothing
//! newer than `openat2` (5.6). An undo (a failed later mount, a failed read-only remount)
//! unmounts through the same descriptor: umount(2) acts on the topmost mount on the object it
//! names, never on a path looked up again. Missing targets are an error, as in containerd
//! (its `Target` "assumes that the subdirectory exists in a parent mount").

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::records::error::{Context, Error, Result};

/// One mount as containerd sends it (`containerd.types.Mount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub kind: String,
    pub source: String,
    pub target: String,
    pub options: Vec<String>,
}

/// Flags and the leftover data string of a mount's options, as containerd's `parseMountOptions`.
pub fn parse_options(options: &[String]) -> (MsFlags, Vec<String>) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for o in options {
        let (set, clear) = match o.as_str() {
            "async" => (MsFlags::empty(), MsFlags::MS_SYNCHRONOUS),
            "atime" => (MsFlags::empty(), MsFlags::MS_NOATIME),
            "bind" => (MsFlags::MS_BIND, MsFlags::empty()),
            "defaults" => (MsFlags::empty(), MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "diratime" => (MsFlags::empty(), MsFlags::MS_NODIRATIME),
            "dirsync" => (MsFlags::MS_DIRSYNC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "mand" => (MsFlags::MS_MANDLOCK, MsFlags::empty()),
            "noatime" => (MsFlags::MS_NOATIME, MsFlags::empty()),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "nomand" => (MsFlags::empty(), MsFlags::MS_MANDLOCK),
            "norelatime" => (MsFlags::empty(), MsFlags::MS_RELATIME),
            "nostrictatime" => (MsFlags::empty(), MsFlags::MS_STRICTATIME),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "rbind" => (MsFlags::MS_BIND | MsFlags::MS_REC, MsFlags::empty()),
            "relatime" => (MsFlags::MS_RELATIME, MsFlags::empty()),
            "remount" => (MsFlags::MS_REMOUNT, MsFlags::empty()),
            "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "strictatime" => (MsFlags::MS_STRICTATIME, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
            _ => {
                data.push(o.clone());
                continue;
            }
        };
        flags = (flags | set) - clear;
    }
    (flags, data)
}

/// Checks the mounts before anything is touched.
pub fn validate(mounts: &[MountSpec]) -> Result<()> {
    for (i, m) in mounts.iter().enumerate() {
        let bad = |what: &str| Error::invalid(format!("rootfs[{i}]: {what}"));
        if m.kind.is_empty() || m.kind.contains('\0') || m.kind.contains('/') {
            return Err(bad(&format!("bad mount type {:?}", m.kind)));
        }
        if m.source.contains('\0') || m.options.iter().any(|o| o.contains('\0')) {
            return Err(bad("NUL byte in source or options"));
        }
        if !m.target.is_empty() {
            let t = Path::new(&m.target);
            if t.is_absolute() || t.components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(bad(&format!(
                    "target {:?} must be a relative path inside the rootfs",
                    m.target
                )));
            }
        }
    }
    Ok(())
}

/// The mount system calls, behind a seam so that the overlay compaction, the target
/// resolution and the rollback paths can be tested without root. Targets are always
/// `/proc/self/fd/<fd>` of a descriptor resolved inside the rootfs (see the module docs).
pub trait MountSys {
    /// mount(2). With `cwd`, the call runs with that working directory (relative `lowerdir`s
    /// are resolved against it).
    fn mount(&self, call: &MountCall<'_>) -> nix::Result<()>;
    /// Takes down whatever is mounted on `target` ([`unmount`]).
    fn unmount(&self, target: &Path) -> Result<()>;
}

/// One mount(2) call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountCall<'a> {
    pub cwd: Option<&'a Path>,
    pub source: Option<&'a str>,
    /// `/proc/self/fd/<fd>` of the resolved target.
    pub target: &'a Path,
    pub kind: Option<&'a str>,
    pub flags: MsFlags,
    pub data: Option<&'a str>,
}

/// The real system calls.
pub struct LinuxMounts;

impl MountSys for LinuxMounts {
    fn mount(&self, c: &MountCall<'_>) -> nix::Result<()> {
        let call = || mount(c.source, c.target, c.kind, c.flags, c.data);
        let Some(cwd) = c.cwd else {
            return call();
        };
        // The working directory is shared by every thread of the process: change it only on a
        // thread of our own that first unshares its fs context (as containerd's mountAt does).
        // The thread exits afterwards, and its private context with it.
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
                nix::unistd::chdir(cwd)?;
                call()
            })
            .join()
            .unwrap_or(Err(nix::Error::EINVAL))
        })
    }
    fn unmount(&self, target: &Path) -> Result<()> {
        unmount(target)
    }
}

/// mount(2) takes at most one page of option data. containerd starts shortening `lowerdir`
/// at a page less 512 bytes; so do we.
fn options_limit() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

/// Shortens an overlay's `lowerdir` list by making every layer relative to their common
/// parent directory (containerd's `compactLowerdirOption`): `/…/snapshots/12/fs:/…/snapshots/
/// 11/fs` becomes `12/fs:11/fs`, mounted from that parent. Returns the parent and the new
/// options, or `None` where nothing can be shortened (one layer, no common parent below `/`).
pub fn compact_lowerdir(options: &[String]) -> Option<(PathBuf, Vec<String>)> {
    const PREFIX: &str = "lowerdir=";
    let idx = options.iter().position(|o| o.starts_with(PREFIX))?;
    let dirs: Vec<&str> = options[idx][PREFIX.len()..].split(':').collect();
    if dirs.len() < 2 {
        return None;
    }
    // The longest common byte prefix is that of the smallest and the largest string.
    let (min, max) = (dirs.iter().min()?, dirs.iter().max()?);
    let common = min
        .bytes()
        .zip(max.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    // Back to the last '/' inside it: snapshot ids are numbers, and "snapshots/1" must not be
    // taken for a parent of "snapshots/12". A parent of "/" (or none) is no use.
    let slash = min.as_bytes()[..common].iter().rposition(|b| *b == b'/')?;
    if slash == 0 {
        return None;
    }
    let parent = &min[..slash];
    let mut short = Vec::with_capacity(dirs.len());
    for d in &dirs {
        match d.get(slash + 1..) {
            Some(rest) if !rest.is_empty() => short.push(rest),
            _ => return None,
        }
    }
    let mut out: Vec<String> = options.to_vec();
    out.remove(idx);
    out.push(format!("{PREFIX}{}", short.join(":")));
    Some((PathBuf::from(parent), out))
}

/// Mounts `mounts` in order on `rootfs` (each at its `target` below it, resolved inside the
/// rootfs). On failure, the mounts already made are taken down again before the error is
/// returned. `rootfs` is the bundle's `rootfs` directory: the idmapped layers' scratch mount
/// point goes beside it, in the bundle ([`crate::records::bundle::IDMAPPED_SCRATCH`]).
pub fn mount_all(mounts: &[MountSpec], rootfs: &Path) -> Result<()> {
    mount_all_with(&LinuxMounts, mounts, rootfs)
}

/// [`mount_all`] through `sys`.
pub fn mount_all_with(sys: &dyn MountSys, mounts: &[MountSpec], rootfs: &Path) -> Result<()> {
    validate(mounts)?;
    // Derived from the bundle, never from a target: a target is the image's to shape.
    let scratch = rootfs.with_file_name(crate::records::bundle::IDMAPPED_SCRATCH);
    let mut done: Vec<ResolvedTarget> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let made = ResolvedTarget::resolve(rootfs, &m.target)
            .and_then(|target| mount_one(sys, m, &target, &scratch).map(|()| target));
        match made {
            Ok(target) => done.push(target),
            Err(e) => {
                for t in done.iter().rev() {
                    if let Err(u) = sys.unmount(&t.proc_path()) {
                        log::warn!(
                            "{}",
                            u.context(format!("undo the mount on {}", t.shown.display()))
                        );
                    }
                }
                return Err(e.context(format!(
                    "mount rootfs[{i}] ({} {} on {})",
                    m.kind,
                    m.source,
                    shown_target(rootfs, &m.target).display()
                )));
            }
        }
    }
    Ok(())
}

/// How a target reads in messages (what it names, not what it resolved to).
fn shown_target(rootfs: &Path, target: &str) -> PathBuf {
    if target.is_empty() {
        rootfs.to_path_buf()
    } else {
        rootfs.join(target)
    }
}

/// A mount target resolved inside the rootfs: an `O_PATH` descriptor of the directory (or
/// file) the mount goes on. mount(2) and umount(2) are given `/proc/self/fd/<fd>`; both act
/// on the topmost mount there, so the descriptor, taken before the mount, also names the mount
/// to undo.
struct ResolvedTarget {
    fd: OwnedFd,
    /// The rootfs, to look the same target up again for a remount ([`Self::reopen`]).
    rootfs: PathBuf,
    target: String,
    /// For messages.
    shown: PathBuf,
}

impl ResolvedTarget {
    /// Resolves `target` (validated: relative, no `..`) inside `rootfs` as it is now: the
    /// rootfs directory is opened afresh, so that a target below an earlier mount (the image's
    /// overlay on the rootfs itself, or a parent mount) is looked up in that mount. Symlinks
    /// are followed inside the rootfs (an absolute link starts at the rootfs, `..` stops
    /// there); magic links (`/proc/<pid>/...`) are refused.
    fn resolve(rootfs: &Path, target: &str) -> Result<Self> {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
        use nix::sys::stat::Mode;
        let shown = shown_target(rootfs, target);
        // The bundle's own `rootfs` (containerd made it), never through a link.
        let root = open(
            rootfs,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("open the rootfs {}", rootfs.display()))?;
        let fd = if target.is_empty() {
            root
        } else {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            match openat2(&root, target, how) {
                Ok(fd) => fd,
                Err(nix::Error::ENOSYS) => {
                    return Err(Error::precondition(format!(
                        "mount target {target:?}: resolving it inside the rootfs needs \
                         openat2 (Linux 5.6 or later)"
                    )));
                }
                Err(e) => {
                    return Err(Error::from(e).context(format!(
                        "resolve the mount target {target:?} inside {}",
                        rootfs.display()
                    )));
                }
            }
        };
        Ok(ResolvedTarget {
            fd,
            rootfs: rootfs.to_path_buf(),
            target: target.to_string(),
            shown,
        })
    }

    /// What mount(2) and umount(2) are given.
    fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Where the descriptor points (the kernel's view, for checks and tests).
    fn resolved(&self) -> Result<PathBuf> {
        std::fs::read_link(self.proc_path())
            .with_context(|| format!("read where {} resolved to", self.shown.display()))
    }

    /// The same target looked up again after a mount was made on it: a descriptor of the new
    /// mount's root, which a remount needs (the first descriptor names the directory below
    /// it). Resolved as safely as the first time, and refused unless it lands on the same
    /// place (as runc checks its `/proc/self/fd` paths).
    fn reopen(&self) -> Result<ResolvedTarget> {
        let again = ResolvedTarget::resolve(&self.rootfs, &self.target)?;
        let (before, after) = (self.resolved()?, again.resolved()?);
        if before != after {
            return Err(Error::internal(format!(
                "mount target {:?} moved while it was mounted: {} then {}",
                self.target,
                before.display(),
                after.display()
            )));
        }
        Ok(again)
    }
}

/// One mount; a half-made one (a bind whose read-only remount failed) is taken down again.
fn mount_one(
    sys: &dyn MountSys,
    m: &MountSpec,
    resolved: &ResolvedTarget,
    scratch: &Path,
) -> Result<()> {
    // A user-namespaced container's overlay (uidmap=/gidmap=): idmapped layers, see
    // crate::host::idmap. `_idmapped` is dropped after the mount (the overlay holds its layers).
    let (m_options, _idmapped) = match m.kind.as_str() {
        "overlay" => crate::host::idmap::overlay_options(&m.options, scratch)?,
        _ => match crate::host::idmap::take_idmap_options(&m.options)? {
            (o, None) => (o, None),
            (_, Some(_)) => {
                return Err(Error::invalid(format!(
                    "uidmap=/gidmap= on a {} mount: only overlay rootfs mounts are idmapped",
                    m.kind
                )));
            }
        },
    };
    let limit = options_limit();
    let mut cwd = None;
    let mut options = std::borrow::Cow::Borrowed(m_options.as_slice());
    // Deep images: a long lowerdir list would not fit in the page mount(2) takes.
    if m.kind == "overlay"
        && options.iter().map(String::len).sum::<usize>() >= limit.saturating_sub(512)
        && let Some((parent, short)) = compact_lowerdir(&m_options)
    {
        cwd = Some(parent);
        options = std::borrow::Cow::Owned(short);
    }
    let (flags, data) = parse_options(&options);
    let data = data.join(",");
    if data.len() > limit {
        return Err(Error::invalid(format!(
            "mount options are too long ({} bytes, at most {limit})",
            data.len()
        )));
    }
    let bind = flags.contains(MsFlags::MS_BIND);
    let target = resolved.proc_path();
    let target = target.as_path();
    sys.mount(&MountCall {
        cwd: cwd.as_deref(),
        source: (!m.source.is_empty()).then_some(m.source.as_str()),
        target,
        kind: (!bind).then_some(m.kind.as_str()),
        // The first pass of a bind mount ignores MS_RDONLY; a read-only bind needs a remount.
        flags: if bind {
            flags - MsFlags::MS_RDONLY
        } else {
            flags
        },
        data: (!data.is_empty()).then_some(data.as_str()),
    })?;
    if bind && flags.contains(MsFlags::MS_RDONLY) {
        // A remount acts on a mount's root: the new mount's, looked up again inside the rootfs.
        let remount = resolved.reopen().and_then(|root| {
            sys.mount(&MountCall {
                cwd: None,
                source: None,
                target: &root.proc_path(),
                kind: None,
                flags: flags | MsFlags::MS_REMOUNT,
                data: None,
            })
            .map_err(Error::from)
        });
        if let Err(e) = remount {
            // The bind is there but writable: never leave it behind.
            if let Err(u) = sys.unmount(target) {
                log::warn!(
                    "{}",
                    u.context("undo a bind mount whose read-only remount failed")
                );
            }
            return Err(e.context("remount read-only"));
        }
    }
    Ok(())
}

/// Unmounts everything mounted on `path` (stacked mounts included). Missing or not-mounted
/// paths are fine; a busy mount is detached lazily.
pub fn unmount(path: &Path) -> Result<()> {
    for _ in 0..64 {
        match umount2(path, MntFlags::empty()) {
            Ok(()) => continue,
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(nix::Error::EBUSY) => {
                umount2(path, MntFlags::MNT_DETACH)
                    .with_context(|| format!("unmount {}", path.display()))?;
            }
            Err(e) => return Err(Error::from(e).context(format!("unmount {}", path.display()))),
        }
    }
    Err(Error::internal(format!(
        "unmount {}: still mounted after 64 attempts",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::error::Kind;

    fn opts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_split_into_flags_and_data() {
        let (f, d) = parse_options(&opts(&[
            "ro",
            "nosuid",
            "workdir=/w",
            "upperdir=/u",
            "lowerdir=/l",
        ]));
        assert_eq!(f, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID);
        assert_eq!(d, opts(&["workdir=/w", "upperdir=/u", "lowerdir=/l"]));
        let (f, _) = parse_options(&opts(&["rbind", "ro", "rw"]));
        assert_eq!(f, MsFlags::MS_BIND | MsFlags::MS_REC);
    }

    #[test]
    fn bad_mounts_are_rejected_before_any_mount() {
        let m = |kind: &str, target: &str| MountSpec {
            kind: kind.into(),
            source: "s".into(),
            target: target.into(),
            options: vec![],
        };
        assert!(validate(&[m("overlay", "")]).is_ok());
        for bad in [
            m("", ""),
            m("a/b", ""),
            m("bind", "/abs"),
            m("bind", "../x"),
            m("bind", "a/../../x"),
        ] {
            assert_eq!(
                validate(std::slice::from_ref(&bad)).unwrap_err().kind(),
                Kind::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    /// One recorded mount call: (cwd, target, flags, data).
    type Recorded = (Option<PathBuf>, PathBuf, MsFlags, Option<String>);

    /// Records mount calls; fails the call numbered `fail_at`. Targets are recorded as the
    /// kernel resolved them (where their `/proc/self/fd` link points at the time of the call).
    #[derive(Default)]
    struct FakeMounts {
        fail_at: Option<usize>,
        calls: std::sync::Mutex<Vec<Recorded>>,
        unmounted: std::sync::Mutex<Vec<PathBuf>>,
    }

    /// Where a `/proc/self/fd/<fd>` target points; anything else is a bug of the caller.
    fn through_fd(target: &Path) -> PathBuf {
        assert!(
            target.starts_with("/proc/self/fd/"),
            "not a descriptor: {}",
            target.display()
        );
        std::fs::read_link(target).unwrap()
    }

    impl MountSys for FakeMounts {
        fn mount(&self, c: &MountCall<'_>) -> nix::Result<()> {
            let mut calls = self.calls.lock().unwrap();
            calls.push((
                c.cwd.map(Path::to_path_buf),
                through_fd(c.target),
                c.flags,
                c.data.map(str::to_string),
            ));
            if Some(calls.len()) == self.fail_at {
                return Err(nix::Error::EPERM);
            }
            Ok(())
        }
        fn unmount(&self, target: &Path) -> Result<()> {
            self.unmounted.lock().unwrap().push(through_fd(target));
            Ok(())
        }
    }

    /// A bundle with an empty `rootfs` directory.
    fn bundle() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        let rootfs = rootfs.canonicalize().unwrap();
        (dir, rootfs)
    }

    /// An overlay of `layers` layers with containerd-like snapshot paths under `root`.
    fn deep_overlay(root: &str, layers: usize) -> MountSpec {
        let snap =
            |n: usize| format!("{root}/io.containerd.snapshotter.v1.overlayfs/snapshots/{n}");
        let lower: Vec<String> = (1..=layers)
            .rev()
            .map(|n| format!("{}/fs", snap(n)))
            .collect();
        MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options: vec![
                "index=off".into(),
                format!("workdir={}/work", snap(layers + 1)),
                format!("upperdir={}/fs", snap(layers + 1)),
                format!("lowerdir={}", lower.join(":")),
            ],
        }
    }

    #[test]
    fn a_deep_overlay_is_mounted_relative_to_the_common_parent() {
        let root = "/var/lib/containerd-with-a-rather-long-root-directory-name";
        let m = deep_overlay(root, 128);
        assert!(m.options.iter().map(String::len).sum::<usize>() > 8192);
        let fake = FakeMounts::default();
        let (_dir, rootfs) = bundle();
        mount_all_with(&fake, std::slice::from_ref(&m), &rootfs).unwrap();
        let calls = fake.calls.lock().unwrap();
        assert_eq!(calls.len(), 1);
        let (cwd, target, _, data) = &calls[0];
        let parent = format!("{root}/io.containerd.snapshotter.v1.overlayfs/snapshots");
        assert_eq!(cwd.as_deref(), Some(Path::new(&parent)));
        assert_eq!(target, &rootfs);
        let data = data.as_deref().unwrap();
        assert!(data.len() < options_limit(), "{} bytes", data.len());
        assert!(data.starts_with(&format!("index=off,workdir={parent}/129/work,upperdir=")));
        let lower = data.rsplit_once("lowerdir=").unwrap().1;
        let layers: Vec<&str> = lower.split(':').collect();
        assert_eq!(layers.len(), 128);
        assert_eq!((layers[0], layers[127]), ("128/fs", "1/fs"), "order kept");
    }

    #[test]
    fn a_short_overlay_is_mounted_as_given() {
        let fake = FakeMounts::default();
        let (_dir, rootfs) = bundle();
        mount_all_with(&fake, &[deep_overlay("/v", 3)], &rootfs).unwrap();
        let calls = fake.calls.lock().unwrap();
        assert_eq!(calls[0].0, None);
        assert!(
            calls[0]
                .3
                .as_deref()
                .unwrap()
                .contains("lowerdir=/v/io.containerd")
        );
    }

    #[test]
    fn lowerdir_compaction_needs_a_common_parent_below_the_root() {
        let o = |v: &str| opts(&["upperdir=/u", v]);
        let (parent, out) =
            compact_lowerdir(&o("lowerdir=/s/snapshots/12/fs:/s/snapshots/1/fs")).unwrap();
        // "snapshots/1" is a common prefix, but the parent is the directory above it.
        assert_eq!(parent, Path::new("/s/snapshots"));
        assert_eq!(out, opts(&["upperdir=/u", "lowerdir=12/fs:1/fs"]));
        assert_eq!(compact_lowerdir(&o("lowerdir=/s/a")), None, "one layer");
        assert_eq!(
            compact_lowerdir(&o("lowerdir=/a/x:/b/y")),
            None,
            "only / in common"
        );
        assert_eq!(
            compact_lowerdir(&o("lowerdir=/s/a:/s/a")).map(|p| p.0),
            Some(PathBuf::from("/s"))
        );
        assert_eq!(
            compact_lowerdir(&opts(&["upperdir=/u"])),
            None,
            "no lowerdir"
        );
    }

    #[test]
    fn options_too_long_even_after_compaction_are_refused() {
        let fake = FakeMounts::default();
        let mut m = deep_overlay("/v", 2);
        m.options.push(format!("x={}", "y".repeat(70_000)));
        let (_dir, rootfs) = bundle();
        let e = mount_all_with(&fake, &[m], &rootfs).unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidArgument);
        assert!(fake.calls.lock().unwrap().is_empty());
    }

    #[test]
    fn a_read_only_bind_whose_remount_fails_is_unmounted() {
        let bind = |target: &str| MountSpec {
            kind: "bind".into(),
            source: "/src".into(),
            target: target.into(),
            options: opts(&["rbind", "ro"]),
        };
        // Call 1: the first bind; 2: its remount; 3: the second bind; 4: its remount fails.
        let fake = FakeMounts {
            fail_at: Some(4),
            ..Default::default()
        };
        let (_dir, rootfs) = bundle();
        for d in ["a", "b"] {
            std::fs::create_dir(rootfs.join(d)).unwrap();
        }
        let e = mount_all_with(&fake, &[bind("a"), bind("b")], &rootfs).unwrap_err();
        assert!(e.message().contains("remount read-only"), "{}", e.message());
        assert!(e.message().contains("rootfs[1]"), "{}", e.message());
        let calls = fake.calls.lock().unwrap();
        assert!(
            !calls[2].2.contains(MsFlags::MS_RDONLY),
            "the first pass is read-write"
        );
        assert!(
            calls[3]
                .2
                .contains(MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY)
        );
        // The half-made bind first, then the complete one before it.
        assert_eq!(
            *fake.unmounted.lock().unwrap(),
            vec![rootfs.join("b"), rootfs.join("a")]
        );
    }

    fn bind_on(target: &str) -> MountSpec {
        MountSpec {
            kind: "bind".into(),
            source: "/src".into(),
            target: target.into(),
            options: opts(&["rbind"]),
        }
    }

    /// Issue 20 item 1: an image's symlinks are followed inside the rootfs, never out of it.
    #[test]
    fn targets_resolve_inside_the_rootfs() {
        let (dir, rootfs) = bundle();
        let outside = dir.path().canonicalize().unwrap().join("outside");
        std::fs::create_dir(&outside).unwrap();
        // The image: `data` points at a directory outside the rootfs (absolute), `up` climbs
        // out of it (relative), `etc` is a plain directory; and where an absolute link
        // resolves inside the rootfs, a directory of that name.
        std::os::unix::fs::symlink(&outside, rootfs.join("data")).unwrap();
        std::os::unix::fs::symlink("../../../../../../outside", rootfs.join("up")).unwrap();
        std::fs::create_dir(rootfs.join("etc")).unwrap();
        std::fs::create_dir(rootfs.join("outside")).unwrap();
        let inside = rootfs.join(outside.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        let fake = FakeMounts::default();
        mount_all_with(
            &fake,
            &[bind_on("etc"), bind_on("data"), bind_on("up")],
            &rootfs,
        )
        .unwrap();
        let targets: Vec<PathBuf> = fake
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.1.clone())
            .collect();
        assert_eq!(
            targets,
            [rootfs.join("etc"), inside, rootfs.join("outside")],
            "each target where the image's links lead inside the rootfs"
        );
        assert!(fake.unmounted.lock().unwrap().is_empty());
    }

    #[test]
    fn a_target_that_leads_nowhere_inside_the_rootfs_mounts_nothing() {
        let (dir, rootfs) = bundle();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, rootfs.join("data")).unwrap();
        std::fs::create_dir(rootfs.join("etc")).unwrap();
        let fake = FakeMounts::default();
        // `data` exists outside the rootfs only: as containerd, no directory is made for it.
        let e = mount_all_with(&fake, &[bind_on("etc"), bind_on("data")], &rootfs).unwrap_err();
        assert_eq!(e.kind(), Kind::NotFound, "{e}");
        assert!(e.message().contains("rootfs[1]"), "{}", e.message());
        assert!(
            e.message().contains("resolve the mount target \"data\""),
            "{}",
            e.message()
        );
        let calls = fake.calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "only etc was mounted");
        // ... and undone through the descriptor it was mounted on.
        assert_eq!(*fake.unmounted.lock().unwrap(), vec![rootfs.join("etc")]);
        assert!(!rootfs.join(outside.strip_prefix("/").unwrap()).exists());
    }

    #[test]
    fn the_rootfs_itself_is_never_reached_through_a_link() {
        let (dir, rootfs) = bundle();
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&rootfs, &linked).unwrap();
        let fake = FakeMounts::default();
        assert!(mount_all_with(&fake, &[bind_on("")], &linked).is_err());
        assert!(fake.calls.lock().unwrap().is_empty());
    }

    /// A real overlay of 128 layers with long paths (far beyond a page of options).
    #[test]
    #[ignore = "needs root"]
    fn a_128_layer_overlay_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir
            .path()
            .join("a-long-directory-name-standing-in-for-containerds-root");
        let root = base.to_str().unwrap();
        let m = deep_overlay(root, 128);
        let snaps = base.join("io.containerd.snapshotter.v1.overlayfs/snapshots");
        for n in 1..=128 {
            let fs = snaps.join(format!("{n}/fs"));
            std::fs::create_dir_all(&fs).unwrap();
            std::fs::write(fs.join(format!("layer{n}")), n.to_string()).unwrap();
        }
        std::fs::write(snaps.join("1/fs/shadowed"), "1").unwrap();
        std::fs::write(snaps.join("128/fs/shadowed"), "128").unwrap();
        std::fs::create_dir_all(snaps.join("129/fs")).unwrap();
        std::fs::create_dir_all(snaps.join("129/work")).unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        mount_all(&[m], &rootfs).unwrap();
        let seen = (
            std::fs::read_to_string(rootfs.join("layer1")),
            std::fs::read_to_string(rootfs.join("layer128")),
            std::fs::read_to_string(rootfs.join("shadowed")),
        );
        unmount(&rootfs).unwrap();
        assert_eq!(
            (seen.0.unwrap(), seen.1.unwrap(), seen.2.unwrap()),
            ("1".into(), "128".into(), "128".into()),
            "every layer visible, the first lowerdir on top"
        );
        assert!(
            std::fs::read_dir(&rootfs).unwrap().next().is_none(),
            "unmounted"
        );
    }

    /// The mount points of this process below `dir` (from /proc/self/mountinfo).
    fn mount_points_below(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(dir))
            .collect()
    }

    fn tmpfs_on(target: &str) -> MountSpec {
        MountSpec {
            kind: "tmpfs".into(),
            source: "tmpfs".into(),
            target: target.into(),
            options: opts(&["size=64k"]),
        }
    }

    /// Issue 20 item 1, with real mounts: an image (bind-mounted on the rootfs, as a snapshot
    /// would be) holds `data -> <a directory outside the rootfs>` and `up -> ../../../above`;
    /// tmpfs
    /// mounts with targets `data` and `up` land inside the rootfs, nothing is mounted outside
    /// it, a `..` target and a magic link are refused, and a failure takes every mount down.
    #[test]
    #[ignore = "needs root"]
    fn real_mounts_stay_inside_the_rootfs() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let outside = base.join("outside");
        let image = base.join("image");
        let rootfs = base.join("bundle/rootfs");
        for d in [&outside, &image, &rootfs] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(outside.join("node-file"), "node").unwrap();
        std::os::unix::fs::symlink(&outside, image.join("data")).unwrap();
        std::os::unix::fs::symlink("../../../../../../../../../../above", image.join("up"))
            .unwrap();
        std::fs::create_dir(image.join("above")).unwrap();
        std::fs::create_dir_all(image.join(outside.strip_prefix("/").unwrap())).unwrap();
        std::fs::create_dir(image.join("proc")).unwrap();
        let image_mount = MountSpec {
            kind: "bind".into(),
            source: image.display().to_string(),
            target: String::new(),
            options: opts(&["rbind", "rw"]),
        };
        // The test's own cleanup, whatever mount_all left.
        let undo = || {
            for p in mount_points_below(&base).iter().rev() {
                let _ = umount2(p, MntFlags::MNT_DETACH);
            }
        };

        let r = mount_all(
            &[image_mount.clone(), tmpfs_on("data"), tmpfs_on("up")],
            &rootfs,
        );
        let points = mount_points_below(&base);
        // What the container would see: the tmpfs inside, the node's file nowhere in it.
        let seen_inside = std::fs::read_dir(rootfs.join(outside.strip_prefix("/").unwrap()))
            .map(|d| d.count())
            .ok();
        let node_file = std::fs::read_to_string(outside.join("node-file")).ok();
        undo();
        r.unwrap();
        assert_eq!(
            points,
            [
                rootfs.clone(),
                rootfs.join(outside.strip_prefix("/").unwrap()),
                rootfs.join("above"),
            ],
            "the image, `data` resolved inside it, `up` clamped at the rootfs"
        );
        assert_eq!(seen_inside, Some(0), "the tmpfs is what rootfs/data shows");
        assert_eq!(
            node_file.as_deref(),
            Some("node"),
            "nothing mounted over the node's dir"
        );

        // A read-only bind through the link: its remount finds the new mount inside too.
        let ro_source = base.join("ro-source");
        std::fs::create_dir(&ro_source).unwrap();
        let ro_bind = MountSpec {
            kind: "bind".into(),
            source: ro_source.display().to_string(),
            target: "data".into(),
            options: opts(&["rbind", "ro"]),
        };
        let r = mount_all(&[image_mount.clone(), ro_bind], &rootfs);
        let points = mount_points_below(&base);
        let write = std::fs::write(
            rootfs.join(outside.strip_prefix("/").unwrap()).join("x"),
            "x",
        )
        .map_err(|e| e.raw_os_error());
        undo();
        r.unwrap();
        assert_eq!(
            points.last(),
            Some(&rootfs.join(outside.strip_prefix("/").unwrap()))
        );
        assert_eq!(write, Err(Some(libc::EROFS)), "read-only where it landed");
        assert!(
            std::fs::write(outside.join("x"), "x").is_ok(),
            "the node's dir is untouched"
        );
        std::fs::remove_file(outside.join("x")).unwrap();

        // `..` never reaches mount(2); a magic link is refused; each failure undoes the image.
        let proc_mount = MountSpec {
            kind: "proc".into(),
            source: "proc".into(),
            target: "proc".into(),
            options: vec![],
        };
        for (bad, kind) in [
            (tmpfs_on("../outside"), Kind::InvalidArgument),
            (tmpfs_on("proc/self/root/tmp"), Kind::Internal),
            (tmpfs_on("missing"), Kind::NotFound),
        ] {
            let r = mount_all(
                &[image_mount.clone(), proc_mount.clone(), bad.clone()],
                &rootfs,
            );
            let left = mount_points_below(&base);
            undo();
            let e = r.unwrap_err();
            assert_eq!(e.kind(), kind, "{bad:?}: {e}");
            assert_eq!(left, Vec::<PathBuf>::new(), "{bad:?}: every mount undone");
        }
        assert!(mount_points_below(&base).is_empty());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    }

    #[test]
    fn unmount_of_a_plain_dir_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        unmount(dir.path()).unwrap();
        unmount(&dir.path().join("missing")).unwrap();
    }
}
