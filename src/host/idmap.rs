//! Idmapped rootfs layers for the containers of a user-namespaced pod.
//!
//! For such a container containerd (2.1, overlayfs snapshotter) sends its rootfs as an overlay
//! mount with the options `uidmap=<container:host:size>[,...]` and `gidmap=...`, which its own
//! mount package (what containerd's runc shim uses) turns into idmapped lower layers: the
//! directory that holds the layers is bind-mounted idmapped and read-only to a scratch place
//! (`open_tree` + `mount_setattr(MOUNT_ATTR_IDMAP)` + `move_mount`), the overlay takes its
//! lowerdirs through it, and the scratch mount is detached once the overlay holds them. Files
//! of the image, owned by 0 on disk, are then the container root's (the mapped host id) in
//! the container; what it writes goes to the upper layer under its mapped host ids. This module
//! does the same; the user namespace the mapping needs comes from a short-lived child made in
//! one (raw `clone`, as the pause: the shim is multi-threaded) and killed once its
//! `/proc/<pid>/ns/user` is open.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::records::error::{Context, Error, Result};

/// One `container:host:size` mapping of a `uidmap=`/`gidmap=` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// Parses containerd's `container:host:size[,container:host:size...]`.
pub fn parse_mappings(what: &str, text: &str) -> Result<Vec<Mapping>> {
    text.split(',')
        .map(|m| {
            let n: Vec<Option<u32>> = m.split(':').map(|p| p.parse().ok()).collect();
            match n.as_slice() {
                [Some(c), Some(h), Some(s)] if *s > 0 => Ok(Mapping {
                    container_id: *c,
                    host_id: *h,
                    size: *s,
                }),
                _ => Err(Error::invalid(format!(
                    "{what}: {m:?} is not container-id:host-id:size"
                ))),
            }
        })
        .collect()
}

fn map_text(maps: &[Mapping]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.size))
        .collect()
}

/// The values of a mount's `uidmap=` and `gidmap=` options.
pub type MapOptions = (String, String);

/// The `uidmap=` and `gidmap=` options taken out of `options`: (the other options, the two
/// maps if both are given). One without the other is refused (containerd ignores it, which
/// would give the container an unmapped rootfs).
pub fn take_idmap_options(options: &[String]) -> Result<(Vec<String>, Option<MapOptions>)> {
    let mut rest = Vec::with_capacity(options.len());
    let (mut uid, mut gid) = (None, None);
    for o in options {
        if let Some(v) = o.strip_prefix("uidmap=") {
            uid = Some(v.to_string());
        } else if let Some(v) = o.strip_prefix("gidmap=") {
            gid = Some(v.to_string());
        } else {
            rest.push(o.clone());
        }
    }
    match (uid, gid) {
        (Some(u), Some(g)) => Ok((rest, Some((u, g)))),
        (None, None) => Ok((rest, None)),
        _ => Err(Error::invalid(
            "uidmap= and gidmap= mount options come together",
        )),
    }
}

/// A user namespace with the given maps, held by its descriptor.
pub fn userns_fd(uids: &[Mapping], gids: &[Mapping]) -> Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone; the child only makes raw system calls (prctl, pause, _exit)
    // and never returns (see `pod::pause` on forking a multi-threaded process).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::SIGCHLD | libc::CLONE_NEWUSER | libc::CLONE_PIDFD) as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(Error::from(std::io::Error::last_os_error())
            .context("make a user namespace for an idmapped mount: clone"));
    }
    if pid == 0 {
        crate::shim::panic_hook::IN_FORKED_CHILD.store(true, Ordering::SeqCst);
        // SAFETY: raw, async-signal-safe system calls only.
        unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: CLONE_PIDFD made `pidfd` ours (close-on-exec).
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let r = (|| {
        for (what, maps) in [("uid_map", uids), ("gid_map", gids)] {
            let path = format!("/proc/{pid}/{what}");
            std::fs::write(&path, map_text(maps)).with_context(|| format!("write {path}"))?;
        }
        let path = format!("/proc/{pid}/ns/user");
        std::fs::File::open(&path)
            .map(OwnedFd::from)
            .with_context(|| format!("open {path}"))
    })();
    let _ = crate::shim::util::pidfd_sigkill(pidfd.as_fd());
    crate::shim::util::reap_pidfd(pidfd.as_fd(), false);
    r.context("make a user namespace for an idmapped mount")
}

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::invalid(format!("{}: NUL in path", p.display())))
}

/// Bind-mounts `source` read-only and idmapped by `userns` on `target` (an empty directory).
pub fn idmapped_bind(source: &Path, target: &Path, userns: &OwnedFd) -> Result<()> {
    let (src, dst) = (cstr(source)?, cstr(target)?);
    // SAFETY: the new mount API on NUL-terminated paths and our own descriptors; the tree's fd
    // is owned below.
    unsafe {
        let tree = libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        );
        if tree < 0 {
            return Err(Error::from(std::io::Error::last_os_error())
                .context(format!("open_tree {}", source.display())));
        }
        let tree = OwnedFd::from_raw_fd(tree as libc::c_int);
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        if libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ) != 0
        {
            return Err(Error::from(std::io::Error::last_os_error())
                .context(format!("idmap the mount of {}", source.display())));
        }
        if libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ) != 0
        {
            return Err(Error::from(std::io::Error::last_os_error())
                .context(format!("attach the idmapped mount on {}", target.display())));
        }
    }
    Ok(())
}

/// The idmapped scratch mount of an overlay's layers; detached and removed on drop (the
/// overlay, once mounted, holds the layers itself).
pub struct IdmappedLayers {
    mountpoint: PathBuf,
    mounted: bool,
}

impl Drop for IdmappedLayers {
    fn drop(&mut self) {
        if self.mounted {
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
    }
}

/// The directory all `dirs` are in (component-wise); `None` for none, or when it is `/`.
fn common_dir(dirs: &[PathBuf]) -> Option<PathBuf> {
    let first = dirs.first()?;
    let mut common: Vec<Component> = first.components().collect();
    for d in &dirs[1..] {
        let n = common
            .iter()
            .zip(d.components())
            .take_while(|(a, b)| **a == *b)
            .count();
        common.truncate(n);
    }
    let p: PathBuf = common.iter().collect();
    (p.is_absolute() && p != Path::new("/")).then_some(p)
}

/// For an overlay with `uidmap=`/`gidmap=` options: mounts the directory of its lowerdirs
/// idmapped at `scratch` and returns the options to mount the overlay with (lowerdirs through
/// it, the map options gone) and the scratch mount to drop once the overlay is mounted.
/// Without those options: the options as they are, and nothing to drop.
pub fn overlay_options(
    options: &[String],
    scratch: &Path,
) -> Result<(Vec<String>, Option<IdmappedLayers>)> {
    let (mut rest, maps) = take_idmap_options(options)?;
    let Some((uidmap, gidmap)) = maps else {
        return Ok((rest, None));
    };
    let uids = parse_mappings("uidmap", &uidmap)?;
    let gids = parse_mappings("gidmap", &gidmap)?;
    let Some(lower_i) = rest.iter().position(|o| o.starts_with("lowerdir=")) else {
        return Err(Error::invalid("an idmapped overlay without lowerdir="));
    };
    let lowers: Vec<PathBuf> = rest[lower_i]["lowerdir=".len()..]
        .split(':')
        .map(PathBuf::from)
        .collect();
    let common = common_dir(&lowers).ok_or_else(|| {
        Error::invalid(format!(
            "idmapped overlay: the lowerdirs {lowers:?} have no common directory below /"
        ))
    })?;
    let userns = userns_fd(&uids, &gids)?;
    // A scratch place a crashed shim left behind (the bundle is this task's alone).
    let _ = nix::mount::umount2(scratch, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(scratch);
    std::fs::create_dir(scratch).with_context(|| format!("create {}", scratch.display()))?;
    let mut layers = IdmappedLayers {
        mountpoint: scratch.to_path_buf(),
        mounted: false,
    };
    idmapped_bind(&common, scratch, &userns)?;
    layers.mounted = true;
    let through: Vec<String> = lowers
        .iter()
        .map(|l| {
            let rel = l.strip_prefix(&common).unwrap_or(Path::new(""));
            scratch.join(rel).to_string_lossy().into_owned()
        })
        .collect();
    rest[lower_i] = format!("lowerdir={}", through.join(":"));
    Ok((rest, Some(layers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn idmap_options_are_taken_out() {
        let (rest, maps) = take_idmap_options(&opts(&[
            "index=off",
            "uidmap=0:1000:65536",
            "lowerdir=/a",
            "gidmap=0:2000:65536",
        ]))
        .unwrap();
        assert_eq!(rest, opts(&["index=off", "lowerdir=/a"]));
        assert_eq!(
            maps,
            Some(("0:1000:65536".to_string(), "0:2000:65536".to_string()))
        );
        assert_eq!(
            take_idmap_options(&opts(&["lowerdir=/a"])).unwrap(),
            (opts(&["lowerdir=/a"]), None)
        );
        let e = take_idmap_options(&opts(&["uidmap=0:1:1"])).unwrap_err();
        assert_eq!(e.kind(), crate::records::error::Kind::InvalidArgument);
    }

    #[test]
    fn mappings_parse_as_containerd_writes_them() {
        assert_eq!(
            parse_mappings("uidmap", "0:1000:65536,65536:500000:10").unwrap(),
            [
                Mapping {
                    container_id: 0,
                    host_id: 1000,
                    size: 65536
                },
                Mapping {
                    container_id: 65536,
                    host_id: 500000,
                    size: 10
                }
            ]
        );
        for bad in ["", "0:1", "0:1:0", "a:b:c", "0:1:2:3", "-1:0:1"] {
            assert!(parse_mappings("uidmap", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_common_directory_of_the_layers() {
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            common_dir(&p(&["/s/snapshots/2/fs", "/s/snapshots/1/fs"])),
            Some(PathBuf::from("/s/snapshots"))
        );
        assert_eq!(
            common_dir(&p(&["/s/snapshots/1/fs"])),
            Some(PathBuf::from("/s/snapshots/1/fs"))
        );
        assert_eq!(common_dir(&p(&["/a/x", "/b/y"])), None);
        assert_eq!(common_dir(&p(&["rel/x"])), None);
        assert_eq!(common_dir(&[]), None);
    }

    /// Files owned by 0 in a layer are the mapped root's through the idmapped overlay.
    #[test]
    #[ignore = "needs root: user namespaces and mounts"]
    fn an_idmapped_overlay_shows_the_layers_to_the_mapped_root() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("snapshots/1/fs");
        let (upper, work, target) = (
            dir.path().join("upper"),
            dir.path().join("work"),
            dir.path().join("rootfs"),
        );
        for d in [&lower, &upper, &work, &target] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(lower.join("file"), "x").unwrap();
        let options = opts(&[
            &format!("lowerdir={}", lower.display()),
            &format!("upperdir={}", upper.display()),
            &format!("workdir={}", work.display()),
            "uidmap=0:300000:65536",
            "gidmap=0:400000:65536",
        ]);
        let scratch = dir.path().join(".rootfs-idmapped");
        let (options, layers) = overlay_options(&options, &scratch).unwrap();
        assert!(!options.iter().any(|o| o.contains("map=")), "{options:?}");
        nix::mount::mount(
            Some("overlay"),
            &target,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.join(",").as_str()),
        )
        .unwrap();
        drop(layers);
        assert!(!scratch.exists());
        let m = std::fs::metadata(target.join("file")).unwrap();
        let owner = (m.uid(), m.gid());
        nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert_eq!(owner, (300000, 400000));
    }
}
