//! Moving a volume from one SELinux label to another: every file of a directory tree whose root
//! carries exactly the label `from` gets `to` (go-selinux's recursive `Chcon`, which containerd's
//! `label.Relabel` uses), links labelled themselves and never followed.
//!
//! One job: the walk. What to move and why is the pod's ([`crate::pod`]'s MCS level); how a
//! label is read and written is [`super::selinux::Xattrs`].

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::selinux::Xattrs;

/// What a move did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Files relabelled (the root included); 0 when the root did not carry `from`.
    pub files: usize,
}

/// Relabels the tree at `root` from `from` to `to` if `root` itself is labelled `from` (then
/// whoever relabelled it, containerd for one container, relabelled the whole tree). A root with
/// another label, or on a filesystem without labels, is left alone. Directories are entered
/// once each (by device and inode: a bind mount looping into itself cannot loop the walk);
/// mount points below the root are crossed, as containerd's relabel crosses them.
pub fn move_tree(x: &dyn Xattrs, root: &Path, from: &str, to: &str) -> io::Result<Moved> {
    match x.label_of(root) {
        Ok(l) if l == from => {}
        Ok(_) => return Ok(Moved::default()),
        Err(e) if is_unlabelled(&e) => return Ok(Moved::default()),
        Err(e) => return Err(e),
    }
    let mut moved = Moved::default();
    let mut seen = HashSet::new();
    let mut pending: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        set(x, &path, to)?;
        moved.files += 1;
        if !meta.is_dir() || !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        for entry in std::fs::read_dir(&path)? {
            pending.push(entry?.path());
        }
    }
    Ok(moved)
}

fn set(x: &dyn Xattrs, path: &Path, label: &str) -> io::Result<()> {
    match x.set_label(path, label) {
        Err(e) if !is_unlabelled(&e) => Err(io::Error::new(
            e.kind(),
            format!("label {} {label}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// A filesystem that holds no labels (ENOTSUP, ENODATA for a file never labelled): no error,
/// as containerd ignores it.
fn is_unlabelled(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENODATA))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Labels in memory, keyed by path; a path never set has none (ENODATA).
    #[derive(Default)]
    struct Labels(Mutex<HashMap<PathBuf, String>>);

    impl Xattrs for Labels {
        fn set_label(&self, path: &Path, label: &str) -> io::Result<()> {
            self.0
                .lock()
                .unwrap()
                .insert(path.to_path_buf(), label.into());
            Ok(())
        }
        fn label_of(&self, path: &Path) -> io::Result<String> {
            self.0
                .lock()
                .unwrap()
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODATA))
        }
    }

    const OLD: &str = "system_u:object_r:container_file_t:s0:c1,c2";
    const NEW: &str = "system_u:object_r:container_file_t:s0:c7,c9";

    #[test]
    fn a_tree_with_the_old_label_moves_whole_and_links_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        std::fs::create_dir_all(vol.join("sub")).unwrap();
        std::fs::write(vol.join("sub/f"), "x").unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("link")).unwrap();
        let x = Labels::default();
        x.set_label(&vol, OLD).unwrap();
        let moved = move_tree(&x, &vol, OLD, NEW).unwrap();
        // vol, sub, sub/f, link: the link itself, not what it points to
        assert_eq!(moved.files, 4);
        for p in [
            vol.clone(),
            vol.join("sub"),
            vol.join("sub/f"),
            vol.join("link"),
        ] {
            assert_eq!(x.label_of(&p).unwrap(), NEW, "{}", p.display());
        }
        assert!(x.label_of(&outside.join("secret")).is_err());
        assert!(x.label_of(&outside).is_err());
    }

    #[test]
    fn a_root_with_another_label_or_none_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "x").unwrap();
        let x = Labels::default();
        assert_eq!(move_tree(&x, d.path(), OLD, NEW).unwrap().files, 0);
        x.set_label(d.path(), "system_u:object_r:container_file_t:s0")
            .unwrap();
        assert_eq!(move_tree(&x, d.path(), OLD, NEW).unwrap().files, 0);
        assert!(x.label_of(&d.path().join("f")).is_err());
    }

    /// The real `lsetxattr`/`lgetxattr`: without an SELinux LSM (this bench) the filesystem
    /// keeps `security.selinux` as it is given; where the kernel refuses it, nothing to show.
    #[test]
    fn the_real_xattrs_move_a_tree() {
        use super::super::selinux::RealXattrs;
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        std::fs::write(vol.join("f"), "x").unwrap();
        if RealXattrs.set_label(&vol, OLD).is_err() {
            eprintln!("SKIPPED: this filesystem or kernel takes no security.selinux from us");
            return;
        }
        RealXattrs.set_label(&vol.join("f"), OLD).unwrap();
        assert_eq!(RealXattrs.label_of(&vol).unwrap(), OLD);
        assert_eq!(move_tree(&RealXattrs, &vol, OLD, NEW).unwrap().files, 2);
        assert_eq!(RealXattrs.label_of(&vol).unwrap(), NEW);
        assert_eq!(RealXattrs.label_of(&vol.join("f")).unwrap(), NEW);
    }

    #[test]
    fn a_missing_root_is_an_error_naming_nothing_moved() {
        let d = tempfile::tempdir().unwrap();
        let x = Labels::default();
        let gone = d.path().join("gone");
        x.set_label(&gone, OLD).unwrap();
        assert!(move_tree(&x, &gone, OLD, NEW).is_err());
    }
}
