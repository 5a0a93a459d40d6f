//! Mounting a task's rootfs (the snapshot mounts containerd sends with Create) on
//! `<bundle>/rootfs`, and taking it down again.

use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::error::{Context, Error, Result};

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

/// Mounts `mounts` in order on `rootfs` (each at its `target` below it). On failure, the
/// mounts already made are taken down again before the error is returned.
pub fn mount_all(mounts: &[MountSpec], rootfs: &Path) -> Result<()> {
    validate(mounts)?;
    let mut done: Vec<PathBuf> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let target = if m.target.is_empty() {
            rootfs.to_path_buf()
        } else {
            rootfs.join(&m.target)
        };
        // A user-namespaced container's overlay (uidmap=/gidmap=): idmapped layers, see
        // crate::idmap. Dropped after the mount attempt (the overlay holds its layers).
        let scratch = target.with_file_name(".rootfs-idmapped");
        let (options, idmapped) = match m.kind.as_str() {
            "overlay" => crate::idmap::overlay_options(&m.options, &scratch),
            _ => crate::idmap::take_idmap_options(&m.options).and_then(|(o, maps)| match maps {
                None => Ok((o, None)),
                Some(_) => Err(Error::invalid(format!(
                    "uidmap=/gidmap= on a {} mount: only overlay rootfs mounts are idmapped",
                    m.kind
                ))),
            }),
        }
        .map_err(|e| {
            for t in done.iter().rev() {
                let _ = unmount(t);
            }
            e.context(format!("mount rootfs[{i}]"))
        })?;
        let (flags, data) = parse_options(&options);
        let data = data.join(",");
        let source = if m.source.is_empty() {
            None
        } else {
            Some(m.source.as_str())
        };
        let kind = if flags.contains(MsFlags::MS_BIND) {
            None
        } else {
            Some(m.kind.as_str())
        };
        // The first pass of a bind mount ignores MS_RDONLY; a read-only bind needs a remount.
        let first = if flags.contains(MsFlags::MS_BIND) {
            flags - MsFlags::MS_RDONLY
        } else {
            flags
        };
        let r = mount(
            source,
            &target,
            kind,
            first,
            if data.is_empty() {
                None
            } else {
                Some(data.as_str())
            },
        )
        .and_then(|_| {
            if flags.contains(MsFlags::MS_BIND) && flags.contains(MsFlags::MS_RDONLY) {
                mount(
                    None::<&str>,
                    &target,
                    None::<&str>,
                    flags | MsFlags::MS_REMOUNT,
                    None::<&str>,
                )
            } else {
                Ok(())
            }
        });
        drop(idmapped);
        if let Err(e) = r {
            for t in done.iter().rev() {
                let _ = unmount(t);
            }
            return Err(Error::from(e).context(format!(
                "mount rootfs[{i}] ({} {} on {})",
                m.kind,
                m.source,
                target.display()
            )));
        }
        done.push(target);
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
    use crate::error::Kind;

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

    #[test]
    fn unmount_of_a_plain_dir_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        unmount(dir.path()).unwrap();
        unmount(&dir.path().join("missing")).unwrap();
    }
}
