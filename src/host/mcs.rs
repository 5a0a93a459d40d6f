//! The MCS levels (`s0:cX,cY`) of the node's pause processes, reserved across every shim of
//! the node, so that no two pods share categories (a container of one could then read and
//! write what the other's label allows).
//!
//! go-selinux (containerd's CRI, podman) reserves a container's random pair in a map of its
//! own process (`mcsAdd`, and `ReserveLabel` for a level the caller names, which may be shared
//! and only keeps random picks off it); its older releases kept the same map as files, one per
//! level, created `O_EXCL`, for several processes. Each pod has a shim process of its own here,
//! so the map is a directory of the node: `<dir>/<level>/<sandbox id>`, one entry per pod that
//! uses the level.
//! - a random pair is taken by creating its level's directory (`mkdir` is atomic: of two shims
//!   that draw the same pair, one gets `EEXIST` and draws again), then the pod's entry;
//! - a level the pod names itself (`selinux_options.level`) gets the pod's entry in its
//!   directory, made if missing: shared with any pod naming it too, never drawn at random
//!   while it is in use;
//! - the release removes the pod's entry, then the level's directory if that was the last.
//!
//! The directory is [`NODE_DIR`] on tmpfs: it outlives shim restarts and goes with a reboot,
//! as the pods do; it is made 0700 (root only). A pod's reservation is in its sandbox record:
//! ShutdownSandbox releases it, and so does `delete` after a shim that died (an entry names
//! its sandbox, so a record releases only its own pod's).

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The node's reservations: tmpfs (gone at reboot, as the pods), root only.
pub const NODE_DIR: &str = "/run/rsandbox/mcs";

/// How many random pairs are drawn before giving up (of 523,776: only a node that has
/// reserved nearly all of them ever comes near).
const MAX_DRAWS: usize = 4096;

/// One pod's use of a level, as its sandbox record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reservation {
    pub level: String,
    /// The sandbox id whose entry it is.
    pub owner: String,
}

/// Why a level could not be reserved.
#[derive(Debug, thiserror::Error)]
pub enum McsError {
    #[error("reserve SELinux MCS level {level} in {}: {source}", .dir.display())]
    Io {
        dir: PathBuf,
        level: String,
        source: io::Error,
    },
    #[error("no free SELinux MCS pair after {MAX_DRAWS} draws in {}", .dir.display())]
    Exhausted { dir: PathBuf },
    #[error("no random bytes for an SELinux MCS pair")]
    NoRandom,
    #[error("{0:?} is not an MCS level the registry can hold")]
    BadLevel(String),
}

/// The reservations directory of the node (or of a test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    dir: PathBuf,
}

impl Registry {
    pub fn at(dir: impl Into<PathBuf>) -> Registry {
        Registry { dir: dir.into() }
    }

    /// [`NODE_DIR`].
    pub fn node() -> Registry {
        Registry::at(NODE_DIR)
    }

    /// Reserves a random pair for `owner`, drawing with `draw` (`s0:cX,cY`) until one is free.
    pub fn reserve_random(
        &self,
        owner: &str,
        mut draw: impl FnMut() -> Option<String>,
    ) -> Result<Reservation, McsError> {
        self.make_dir()?;
        for _ in 0..MAX_DRAWS {
            let level = draw().ok_or(McsError::NoRandom)?;
            let dir = self.level_dir(&level)?;
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(self.io(&level, source)),
            }
            let r = Reservation {
                level,
                owner: owner.into(),
            };
            if let Err(source) = self.add_entry(&r) {
                let _ = std::fs::remove_dir(&dir);
                return Err(self.io(&r.level, source));
            }
            return Ok(r);
        }
        Err(McsError::Exhausted {
            dir: self.dir.clone(),
        })
    }

    /// Records `owner`'s use of `level`, a level the pod names itself: shared with others
    /// that name it, kept from random draws while in use (go-selinux's `ReserveLabel`).
    pub fn reserve_given(&self, owner: &str, level: &str) -> Result<Reservation, McsError> {
        self.make_dir()?;
        let dir = self.level_dir(level)?;
        let r = Reservation {
            level: level.into(),
            owner: owner.into(),
        };
        // A last user's release may remove the directory between our mkdir and our entry:
        // made again then.
        let mut last = None;
        for _ in 0..8 {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(self.io(level, source)),
            }
            match self.add_entry(&r) {
                Ok(()) => return Ok(r),
                Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
                Err(source) => return Err(self.io(level, source)),
            }
        }
        Err(self.io(level, last.expect("tried")))
    }

    /// Releases `r`: its owner's entry, then the level's directory if no other pod uses it.
    /// What is already gone is fine.
    pub fn release(&self, r: &Reservation) {
        let Ok(dir) = self.level_dir(&r.level) else {
            return;
        };
        if crate::records::validate::id("sandbox id", &r.owner).is_err() {
            return;
        }
        let _ = std::fs::remove_file(dir.join(&r.owner));
        // ENOTEMPTY: another pod uses the level still.
        let _ = std::fs::remove_dir(&dir);
    }

    /// The pods using `level` (tests, diagnostics).
    pub fn users(&self, level: &str) -> Vec<String> {
        let Ok(dir) = self.level_dir(level) else {
            return Vec::new();
        };
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn make_dir(&self) -> Result<(), McsError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|source| McsError::Io {
                dir: self.dir.clone(),
                level: String::new(),
                source,
            })
    }

    fn add_entry(&self, r: &Reservation) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        crate::records::validate::id("sandbox id", &r.owner)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.level_dir(&r.level).expect("checked").join(&r.owner))
            .map(drop)
    }

    /// The directory of `level`: one name below the registry, never `.`/`..` or a path.
    fn level_dir(&self, level: &str) -> Result<PathBuf, McsError> {
        if !crate::host::selinux::is_level(level) || level == "." || level == ".." {
            return Err(McsError::BadLevel(level.into()));
        }
        Ok(self.dir.join(level))
    }

    fn io(&self, level: &str, source: io::Error) -> McsError {
        McsError::Io {
            dir: self.dir.clone(),
            level: level.into(),
            source,
        }
    }

    /// The registry's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A draw that offers `levels` in turn.
    fn draws(levels: &[&str]) -> impl FnMut() -> Option<String> {
        let mut v: Vec<String> = levels.iter().rev().map(|s| s.to_string()).collect();
        move || v.pop()
    }

    /// Issue 27 item 8: two pods whose draws give the same pair do not share it: the second
    /// draws again. Before, each pause took its draw as it came (two pods in a hundred shared
    /// categories at 100 pods a node).
    #[test]
    fn two_pods_never_get_the_same_random_pair() {
        let d = tempfile::tempdir().unwrap();
        let reg = Registry::at(d.path().join("mcs"));
        let a = reg.reserve_random("pod-a", draws(&["s0:c1,c2"])).unwrap();
        let b = reg
            .reserve_random("pod-b", draws(&["s0:c1,c2", "s0:c1,c2", "s0:c3,c4"]))
            .unwrap();
        assert_eq!(a.level, "s0:c1,c2");
        assert_eq!(b.level, "s0:c3,c4");
        assert_eq!(reg.users("s0:c1,c2"), ["pod-a"]);
        // Root only.
        let mode = std::fs::metadata(reg.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // Released, the pair can be drawn again.
        reg.release(&a);
        assert!(!reg.dir().join("s0:c1,c2").exists());
        let c = reg.reserve_random("pod-c", draws(&["s0:c1,c2"])).unwrap();
        assert_eq!(c.level, "s0:c1,c2");
    }

    /// Shims of the node draw at once: each pair goes to one of them.
    #[test]
    fn concurrent_draws_of_one_pair_give_it_to_one_pod() {
        let d = tempfile::tempdir().unwrap();
        let reg = Registry::at(d.path().join("mcs"));
        let got: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let reg = reg.clone();
                    s.spawn(move || {
                        let mut n = 0;
                        reg.reserve_random(&format!("pod-{i}"), || {
                            n += 1;
                            Some(format!("s0:c{n},c1000"))
                        })
                        .unwrap()
                        .level
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut unique = got.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "{got:?}");
    }

    /// A level pods name themselves is shared by them, and kept from random draws until its
    /// last user releases it (go-selinux's ReserveLabel).
    #[test]
    fn a_given_level_is_shared_and_kept_from_draws_while_used() {
        let d = tempfile::tempdir().unwrap();
        let reg = Registry::at(d.path().join("mcs"));
        let a = reg.reserve_given("pod-a", "s0:c5,c6").unwrap();
        let b = reg.reserve_given("pod-b", "s0:c5,c6").unwrap();
        assert_eq!(reg.users("s0:c5,c6"), ["pod-a", "pod-b"]);
        let r = reg
            .reserve_random("pod-r", draws(&["s0:c5,c6", "s0:c7,c8"]))
            .unwrap();
        assert_eq!(r.level, "s0:c7,c8");
        reg.release(&a);
        assert_eq!(reg.users("s0:c5,c6"), ["pod-b"]);
        let r2 = reg
            .reserve_random("pod-r2", draws(&["s0:c5,c6", "s0:c9,c10"]))
            .unwrap();
        assert_eq!(r2.level, "s0:c9,c10");
        reg.release(&b);
        assert!(!reg.dir().join("s0:c5,c6").exists());
    }

    /// A release touches its owner's entry only; names that would leave the registry are
    /// refused; a draw that gives out fails, never loops.
    #[test]
    fn releases_and_names_stay_inside_the_registry() {
        let d = tempfile::tempdir().unwrap();
        let reg = Registry::at(d.path().join("mcs"));
        let a = reg.reserve_given("pod-a", "s0:c1,c2").unwrap();
        reg.release(&Reservation {
            level: "s0:c1,c2".into(),
            owner: "pod-b".into(),
        });
        assert_eq!(reg.users("s0:c1,c2"), ["pod-a"]);
        for bad in ["..", ".", "../x", "s0/c1", ""] {
            assert!(
                matches!(reg.reserve_given("pod-a", bad), Err(McsError::BadLevel(_))),
                "{bad}"
            );
            reg.release(&Reservation {
                level: bad.into(),
                owner: "pod-a".into(),
            });
        }
        reg.release(&Reservation {
            level: "s0:c1,c2".into(),
            owner: "../mcs".into(),
        });
        assert_eq!(reg.users("s0:c1,c2"), ["pod-a"]);
        reg.release(&a);
        assert!(matches!(
            reg.reserve_random("pod-x", || None),
            Err(McsError::NoRandom)
        ));
        reg.reserve_given("pod-y", "s0:c1,c2").unwrap();
        assert!(matches!(
            reg.reserve_random("pod-x", || Some("s0:c1,c2".into())),
            Err(McsError::Exhausted { .. })
        ));
    }
}
