//! SELinux labels of what the shim makes for a pod: the pod files (/etc/hosts,
//! /etc/resolv.conf, /etc/hostname), the /dev/shm tmpfs, and the pause process (its process
//! label and its program's, [`Selinux::pause_labels`]; the pause module applies them).
//!
//! One job: compute a label, write it (`security.selinux` through `lsetxattr`, never following a
//! link), or give it as a mount option. Only where the kernel has SELinux enabled (a writable
//! selinuxfs mounted and a policy loaded, as go-selinux's `GetEnabled` decides) and the policy
//! names a container file context (its `lxc_contexts`, as go-selinux reads it); otherwise every
//! call is a no-op, as containerd's `label.InitLabels` gives no labels then.
//!
//! Enabled never depends on reading selinuxfs itself: an engine domain may not search it
//! (refpolicy's `dockerd_t` is denied it, silently), and a shim that took that for "SELinux is
//! off" would run the pause in the engine's own domain with the pod files unlabelled, while
//! containerd (go-selinux: `statfs` and the process's own label) labels the containers.
//!
//! containerd's runc path relabels these files per container with the container's mount label
//! (`label.Relabel(path, mountLabel, false)`), which works there because every container of a
//! pod inherits the pause's MCS level. With the shim sandboxer containerd 2.1 has no pod process
//! label (the controller returns none), so each container may get its own random categories:
//! files that several containers share get the label *without* its categories (level `s0`),
//! as go-selinux's `Relabel(path, label, shared=true)` (the `z` volume option) does, which any
//! container's level dominates.

use std::io;
use std::path::{Path, PathBuf};

/// The extended attribute holding a file's SELinux label.
const XATTR: &str = "security.selinux";

/// The level of a label shared by every container (no categories).
const SHARED_LEVEL: &str = "s0";

/// The pod's `security_context.selinux_options` (CRI `SELinuxOption`); empty fields are unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelinuxOptions {
    pub user: String,
    pub role: String,
    pub kind: String,
    pub level: String,
}

/// An SELinux context `user:role:type[:level]` (the level may itself hold colons: `s0:c1,c2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub user: String,
    pub role: String,
    pub kind: String,
    pub level: String,
}

impl Label {
    /// Parses `user:role:type[:level]`; `None` for anything with fewer parts, as go-selinux's
    /// `NewContext` refuses it.
    /// Every part must be made of the characters SELinux names use ([`is_name`],
    /// [`is_level`]): a label ends up inside a mount option (`context="..."`), where a quote or
    /// a comma would add options of its own.
    pub fn parse(s: &str) -> Option<Label> {
        let mut parts = s.trim().splitn(4, ':');
        let (user, role, kind) = (parts.next()?, parts.next()?, parts.next()?);
        let level = parts.next().unwrap_or("");
        if ![user, role, kind].iter().all(|p| is_name(p)) || !(level.is_empty() || is_level(level))
        {
            return None;
        }
        Some(Label {
            user: user.into(),
            role: role.into(),
            kind: kind.into(),
            level: level.into(),
        })
    }

    /// The same label for files several containers share: level `s0`, no categories (what
    /// go-selinux's `Relabel(.., shared=true)` writes).
    pub fn shared(&self) -> Label {
        Label {
            level: SHARED_LEVEL.into(),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.user, self.role, self.kind)?;
        if !self.level.is_empty() {
            write!(f, ":{}", self.level)?;
        }
        Ok(())
    }
}

/// An SELinux user, role or type name: letters, digits, `_`, `.`, `-`, `@` (no `:`).
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-@".contains(&b))
}

/// An MLS/MCS level or range (`s0`, `s0-s0:c0.c1023`, `s0:c1,c2`).
pub fn is_level(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 4096
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-:,".contains(&b))
}

/// The mount option that gives a whole filesystem (the pod's /dev/shm tmpfs) label `label`, as
/// go-selinux's `FormatMountLabel` writes it.
pub fn mount_option(label: &Label) -> String {
    format!("context=\"{label}\"")
}

/// Rewrites the `context=` option naming `old` (quoted, as go-selinux's `FormatMountLabel`
/// writes it, or bare) to name `new`, in every mount of `mounts`; whether one changed.
/// containerd's client appends the container's mount label to each rootfs mount so
/// (`client/container.go:350-355` in v2.1.9): when the shim moves the container to another
/// level, its rootfs must follow, or the process cannot read its own files.
pub fn move_context_option(
    mounts: &mut [crate::host::mount::MountSpec],
    old: &str,
    new: &str,
) -> bool {
    let (quoted, bare) = (format!("context=\"{old}\""), format!("context={old}"));
    let mut changed = false;
    for o in mounts.iter_mut().flat_map(|m| m.options.iter_mut()) {
        if *o == quoted || *o == bare {
            *o = format!("context=\"{new}\"");
            changed = true;
        }
    }
    changed
}

/// Writes and reads a file's label; the real one is `lsetxattr`/`lgetxattr`, tests record.
pub trait Xattrs: Send + Sync {
    fn set_label(&self, path: &Path, label: &str) -> io::Result<()>;
    /// The label of `path` itself (a link's own); ENOTSUP where the store keeps none.
    fn label_of(&self, _path: &Path) -> io::Result<String> {
        Err(io::Error::from_raw_os_error(libc::ENOTSUP))
    }
}

/// `lsetxattr(path, "security.selinux", label)`: a symlink is labelled itself, never followed.
pub struct RealXattrs;

impl Xattrs for RealXattrs {
    fn set_label(&self, path: &Path, label: &str) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let p = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let name = std::ffi::CString::new(XATTR).expect("no NUL in the name");
        // SAFETY: both strings are NUL-terminated and outlive the call; the value is a byte
        // slice with its length.
        let r = unsafe {
            libc::lsetxattr(
                p.as_ptr(),
                name.as_ptr(),
                label.as_ptr().cast(),
                label.len(),
                0,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn label_of(&self, path: &Path) -> io::Result<String> {
        use std::os::unix::ffi::OsStrExt;
        let p = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let name = std::ffi::CString::new(XATTR).expect("no NUL in the name");
        // A label is at most a page in practice; the kernel says ERANGE if not.
        let mut buf = vec![0u8; 4096];
        // SAFETY: both strings are NUL-terminated and outlive the call; the buffer is ours
        // with its length.
        let n = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string())
    }
}

/// What the node's SELinux is, detected once when the daemon starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selinux {
    /// The policy's container file context (`file` of `lxc_contexts`); `None` when SELinux is
    /// disabled or the policy names none: then nothing is labelled.
    file_context: Option<Label>,
    /// The policy's container process context (`process` of `lxc_contexts`); `None`: the
    /// pause runs under the shim's own label.
    process_context: Option<Label>,
}

impl Selinux {
    /// SELinux as disabled: every call is a no-op.
    pub fn disabled() -> Selinux {
        Selinux::default()
    }

    /// Detects the node's SELinux: a writable selinuxfs, a loaded policy
    /// ([`policy_loaded`]), and the configured policy's `lxc_contexts` under `/etc/selinux`.
    ///
    /// Every shim daemon detects it when it starts, so it goes the way go-selinux's
    /// `findSELinuxfs` does: one `statfs` of the usual mount point; the mount table (hundreds
    /// of lines on a node with many pods) only when the kernel knows selinuxfs
    /// (`/proc/filesystems`) and it is mounted elsewhere. A node without SELinux costs two
    /// small reads.
    pub fn detect() -> Selinux {
        let etc = Path::new("/etc/selinux");
        if is_selinuxfs(Path::new(SELINUXFS)) {
            if is_read_only(Path::new(SELINUXFS)) {
                return Selinux::disabled();
            }
            return Self::detect_at(etc, &|p| std::fs::read_to_string(p));
        }
        let known = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !kernel_has_selinuxfs(&known) {
            return Selinux::disabled();
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::detect_in(&mountinfo, etc)
    }

    /// [`Selinux::detect`] with the mount table and the policy directory given.
    pub fn detect_in(mountinfo: &str, etc_selinux: &Path) -> Selinux {
        Self::detect_with(mountinfo, etc_selinux, &|p| std::fs::read_to_string(p))
    }

    /// [`Selinux::detect_in`] with every file read through `read` (the node preflight,
    /// `check`, reads a node its tests can fake).
    pub fn detect_with(
        mountinfo: &str,
        etc_selinux: &Path,
        read: &dyn Fn(&Path) -> io::Result<String>,
    ) -> Selinux {
        match writable_selinuxfs(mountinfo) {
            Some(_) => Self::detect_at(etc_selinux, read),
            None => Selinux::disabled(),
        }
    }

    /// SELinux with a writable selinuxfs mounted: enabled if a policy is loaded
    /// ([`policy_loaded`]), with the policy's contexts from `etc_selinux`.
    fn detect_at(etc_selinux: &Path, read: &dyn Fn(&Path) -> io::Result<String>) -> Selinux {
        if !policy_loaded(read(Path::new(OWN_LABEL))) {
            return Selinux::disabled();
        }
        let lxc = lxc_contexts(etc_selinux, read).unwrap_or_default();
        let context = |key: &str| config_value(&lxc, key).and_then(|v| Label::parse(&v));
        Selinux {
            file_context: context("file"),
            process_context: context("file").and(context("process")),
        }
    }

    /// SELinux enabled with container file context `file_context` (tests).
    pub fn with_file_context(file_context: Label) -> Selinux {
        Selinux {
            file_context: Some(file_context),
            process_context: None,
        }
    }

    /// SELinux enabled with both container contexts (tests).
    pub fn with_contexts(file_context: Label, process_context: Label) -> Selinux {
        Selinux {
            file_context: Some(file_context),
            process_context: Some(process_context),
        }
    }

    /// Whether the pause gets labels ([`Selinux::pause_labels`]): SELinux enabled and the
    /// policy names both container contexts.
    pub fn labels_pause(&self) -> bool {
        self.process_context.is_some() && self.file_context.is_some()
    }

    /// The pause's process label and the label of the program it runs, as containerd's
    /// `label.InitLabels` gives the runc path's pause container its process and mount labels:
    /// the container process context with the pod's `user`, `role` and `type`, the container
    /// file context with its `user`, both at `level`: the pod's `level`, else one random pair
    /// of MCS categories (`s0:cX,cY`, go-selinux's `uniqMcs`, [`draw_categories`]) reserved
    /// for the pod across the node ([`crate::host::mcs`]), so that no container of another pod
    /// dominates the pause. The program (a sealed memfd) gets the file label, which container
    /// domains may enter (`entrypoint`), as they enter their rootfs' binaries. `None` when
    /// SELinux is disabled or the policy names no container process context.
    pub fn pause_labels(
        &self,
        options: Option<&SelinuxOptions>,
        level: &str,
    ) -> Option<(Label, Label)> {
        let mut process = self.process_context.clone()?;
        let mut file = self.file_context.clone()?;
        let o = options.cloned().unwrap_or_default();
        if !o.user.is_empty() {
            process.user = o.user.clone();
            file.user = o.user;
        }
        if !o.role.is_empty() {
            process.role = o.role;
        }
        if !o.kind.is_empty() {
            process.kind = o.kind;
        }
        process.level = level.to_string();
        file.level = level.to_string();
        Some((process, file))
    }

    pub fn enabled(&self) -> bool {
        self.file_context.is_some()
    }

    /// The label of the pod files and /dev/shm: the container file context, with the pod's
    /// `user` if it names one (go-selinux's `InitLabels` gives `user` and `level` to the mount
    /// label; `role` and `type` are the process's), at the pod's MCS `level` as containerd's
    /// podsandbox gives its sandbox mount label to both; at the shared level where the pod has
    /// none (its containers may then have any).
    pub fn pod_file_label(
        &self,
        options: Option<&SelinuxOptions>,
        level: Option<&str>,
    ) -> Option<Label> {
        let mut label = self.file_context.clone()?;
        if let Some(o) = options.filter(|o| !o.user.is_empty()) {
            label.user = o.user.clone();
        }
        Some(match level {
            Some(level) => Label {
                level: level.to_string(),
                ..label
            },
            None => label.shared(),
        })
    }

    /// The label a container's mount label (`linux.mountLabel` of its spec) gives the pod files
    /// it mounts: itself where it is at the pod's level (containerd relabels them so on the
    /// runc path, `label.Relabel(path, mountLabel, false)`), else its shared form, which every
    /// container of the pod can read (a pod without a level, whose containers' levels differ,
    /// or a container at a level of its own, which must not take them from the others); `None`
    /// when SELinux is disabled or it is not a label.
    pub fn pod_files_label_of(&self, mount_label: &str, pod_level: Option<&str>) -> Option<Label> {
        self.file_context.as_ref()?;
        let label = Label::parse(mount_label)?;
        Some(if pod_level == Some(label.level.as_str()) {
            label
        } else {
            label.shared()
        })
    }

    /// Labels each of `paths` (not following links). A filesystem without labels (ENOTSUP) is
    /// no error, as containerd ignores it.
    pub fn relabel(&self, x: &dyn Xattrs, paths: &[PathBuf], label: &Label) -> io::Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let text = label.to_string();
        for p in paths {
            match x.set_label(p, &text) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("label {} {text}: {e}", p.display()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where selinuxfs is mounted on every distribution that has it.
const SELINUXFS: &str = "/sys/fs/selinux";

/// The process's own SELinux label.
const OWN_LABEL: &str = "/proc/self/attr/current";

/// Whether a policy is loaded, from the process's own label (`/proc/self/attr/current`, read):
/// before a policy loads every process is `kernel` (go-selinux's and libselinux's test). A
/// label that cannot be read counts as loaded: an unreadable file must never turn labelling off
/// where selinuxfs is mounted.
fn policy_loaded(own_label: io::Result<String>) -> bool {
    match own_label {
        Ok(l) => l.trim_end_matches(['\0', '\n']).trim() != "kernel",
        Err(_) => true,
    }
}

/// Whether the filesystem at `dir` is mounted read-only (a container's selinuxfs is: go-selinux
/// then takes SELinux as disabled).
fn is_read_only(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// Whether `dir` is a mounted selinuxfs (its `statfs` type).
fn is_selinuxfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SELINUX_MAGIC)
}

/// Whether `/proc/filesystems` (given) lists selinuxfs: without it no mount can be one.
fn kernel_has_selinuxfs(filesystems: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("selinuxfs"))
}

/// The mount point of a writable selinuxfs in `mountinfo` (a read-only one, as containers get,
/// means SELinux is off for whoever sees it, as go-selinux's `verifySELinuxfsMount` decides).
pub fn writable_selinuxfs(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut fields = pre.split_whitespace();
        let point = fields.nth(4)?;
        let read_only = fields.next()?.split(',').any(|o| o == "ro");
        (post.split_whitespace().next()? == "selinuxfs" && !read_only).then(|| PathBuf::from(point))
    })
}

/// The configured policy's `lxc_contexts` (`<etc_selinux>/<SELINUXTYPE>/contexts/lxc_contexts`).
fn lxc_contexts(etc_selinux: &Path, read: &dyn Fn(&Path) -> io::Result<String>) -> Option<String> {
    let config = read(&etc_selinux.join("config")).ok()?;
    let policy = config_value(&config, "SELINUXTYPE")?;
    if policy.contains('/') || policy.starts_with('.') {
        return None;
    }
    read(&etc_selinux.join(policy).join("contexts/lxc_contexts")).ok()
}

/// Two distinct MCS categories of 0..1024, the lower first: `s0:cX,cY` (go-selinux's
/// `uniqMcs`). `None` if the kernel gives no random bytes.
pub fn draw_categories() -> Option<String> {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills our own buffer of that length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return None;
    }
    let c1 = u16::from_ne_bytes([b[0], b[1]]) % 1024;
    let mut c2 = u16::from_ne_bytes([b[2], b[3]]) % 1024;
    if c2 == c1 {
        c2 = (c1 + 1) % 1024;
    }
    let (lo, hi) = (c1.min(c2), c1.max(c2));
    Some(format!("s0:c{lo},c{hi}"))
}

/// The value of `key = value` (or `key=value`, quotes dropped) in a config file's lines.
fn config_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim();
        if l.starts_with('#') {
            return None;
        }
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The kernel's form of `context` (its `/sys/fs/selinux/context` answer, go-selinux's
/// `CanonicalizeContext`): what `/proc/<pid>/attr/current` shows for a process that got it.
/// Needs the `security:check_context` permission; fails where selinuxfs is not mounted.
pub fn canonicalize_context(context: &str) -> io::Result<String> {
    use std::io::{Read, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(SELINUXFS).join("context"))?;
    f.write_all(context.as_bytes())?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out)
        .trim_end_matches(['\0', '\n'])
        .to_string())
}

/// An MLS/MCS level or range in the form the kernel prints it (`mls_sid_to_context`): the
/// categories sorted, runs of three or more as `cX.cY`, of two as `cX,cY`, and a range whose
/// ends are equal as its low end (`s0-s0:c1,c2,c3` is `s0-s0:c1.c3`, `s0-s0` is `s0`). `None`
/// for a level this does not parse (sensitivities and categories not named `s<n>`, `c<n>`:
/// a policy with other names is left to the exact comparison).
pub fn canonical_level(level: &str) -> Option<String> {
    fn num(s: &str, prefix: char) -> Option<u32> {
        let n = s.strip_prefix(prefix)?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .then(|| n.parse().ok())
            .flatten()
    }
    fn level_of(s: &str) -> Option<(u32, std::collections::BTreeSet<u32>)> {
        let (sens, cats) = match s.split_once(':') {
            Some((sens, cats)) => (sens, Some(cats)),
            None => (s, None),
        };
        let sens = num(sens, 's')?;
        let mut set = std::collections::BTreeSet::new();
        for item in cats.map(|c| c.split(',')).into_iter().flatten() {
            match item.split_once('.') {
                Some((a, b)) => {
                    let (a, b) = (num(a, 'c')?, num(b, 'c')?);
                    if a > b {
                        return None;
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(num(item, 'c')?);
                }
            }
        }
        Some((sens, set))
    }
    fn print(sens: u32, cats: &std::collections::BTreeSet<u32>) -> String {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for &c in cats {
            match runs.last_mut() {
                Some((_, hi)) if *hi + 1 == c => *hi = c,
                _ => runs.push((c, c)),
            }
        }
        let cats: Vec<String> = runs
            .iter()
            .map(|&(lo, hi)| match hi - lo {
                0 => format!("c{lo}"),
                1 => format!("c{lo},c{hi}"),
                _ => format!("c{lo}.c{hi}"),
            })
            .collect();
        if cats.is_empty() {
            format!("s{sens}")
        } else {
            format!("s{sens}:{}", cats.join(","))
        }
    }
    let mut ends = level.split('-');
    let low = level_of(ends.next()?)?;
    let high = match ends.next() {
        Some(h) => level_of(h)?,
        None => low.clone(),
    };
    if ends.next().is_some() {
        return None;
    }
    let low_text = print(low.0, &low.1);
    Some(if low == high {
        low_text
    } else {
        format!("{low_text}-{}", print(high.0, &high.1))
    })
}

/// Whether two contexts name the same label: equal, or equal user, role and type with levels
/// that are the same once in the kernel's form ([`canonical_level`]).
pub fn same_context(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (Some(x), Some(y)) = (Label::parse(a), Label::parse(b)) else {
        return false;
    };
    x.user == y.user
        && x.role == y.role
        && x.kind == y.kind
        && match (canonical_level(&x.level), canonical_level(&y.level)) {
            (Some(p), Some(q)) => p == q,
            _ => x.level == y.level,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorded {
        calls: Mutex<Vec<(PathBuf, String)>>,
        fail: Option<i32>,
    }

    impl Xattrs for Recorded {
        fn set_label(&self, path: &Path, label: &str) -> io::Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push((path.to_path_buf(), label.into()));
            match self.fail {
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => Ok(()),
            }
        }
    }

    #[test]
    fn labels_parse_print_and_lose_their_categories_when_shared() {
        let l = Label::parse("system_u:object_r:container_file_t:s0:c1,c2").unwrap();
        assert_eq!(l.kind, "container_file_t");
        assert_eq!(l.level, "s0:c1,c2");
        assert_eq!(l.to_string(), "system_u:object_r:container_file_t:s0:c1,c2");
        assert_eq!(
            l.shared().to_string(),
            "system_u:object_r:container_file_t:s0"
        );
        // An MLS range loses its categories too.
        let r = Label::parse("u:r:t:s0-s0:c0.c1023").unwrap();
        assert_eq!(r.shared().to_string(), "u:r:t:s0");
        // No level: printed without one; shared gets s0.
        let n = Label::parse("u:r:t").unwrap();
        assert_eq!(n.to_string(), "u:r:t");
        assert_eq!(n.shared().to_string(), "u:r:t:s0");
        for bad in [
            "",
            "u:r",
            "u::t:s0",
            "container_file_t",
            // would close the mount option's quotes and add options of its own
            "x\",size=64g,mode=1777,\"y:r:t:s0",
            "u:r:t:s0\",size=1",
            "u:r:t:s0 size=1",
            "u:r,mode=1777:t",
        ] {
            assert_eq!(Label::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_mount_option_quotes_the_label() {
        let l = Label::parse("system_u:object_r:container_file_t:s0:c1,c2").unwrap();
        assert_eq!(
            mount_option(&l),
            "context=\"system_u:object_r:container_file_t:s0:c1,c2\""
        );
    }

    /// The rootfs mounts as containerd 2.1.9's client sends them for a labelled container
    /// (`client/container.go:350-355`: the snapshot's options, then `context="<mountLabel>"`).
    #[test]
    fn a_rootfs_context_option_moves_with_the_mount_label() {
        use crate::host::mount::MountSpec;
        let old = "system_u:object_r:container_file_t:s0:c197,c365";
        let new = "system_u:object_r:container_file_t:s0:c225,c993";
        let mut mounts = vec![MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options: vec![
                "index=off".into(),
                "workdir=/var/lib/containerd/snapshots/9/work".into(),
                "upperdir=/var/lib/containerd/snapshots/9/fs".into(),
                "lowerdir=/var/lib/containerd/snapshots/1/fs".into(),
                format!("context=\"{old}\""),
            ],
        }];
        assert!(move_context_option(&mut mounts, old, new));
        assert_eq!(mounts[0].options[4], format!("context=\"{new}\""));
        assert_eq!(
            mounts[0].options[3],
            "lowerdir=/var/lib/containerd/snapshots/1/fs"
        );
        // Moved once: nothing names the old label any more; another label is not touched.
        assert!(!move_context_option(&mut mounts, old, new));
        mounts[0].options[4] = "context=u:object_r:other_t:s0:c1,c2".into();
        assert!(!move_context_option(&mut mounts, old, new));
        mounts[0].options[4] = format!("context={old}");
        assert!(move_context_option(&mut mounts, old, new));
        assert_eq!(mounts[0].options[4], format!("context=\"{new}\""));
    }

    /// A policy directory like Fedora's: `config` names the policy, `lxc_contexts` the
    /// container contexts.
    fn policy(dir: &Path) {
        std::fs::write(
            dir.join("config"),
            "# comment\nSELINUX=enforcing\nSELINUXTYPE=targeted\n",
        )
        .unwrap();
        let c = dir.join("targeted/contexts");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(
            c.join("lxc_contexts"),
            "process = \"system_u:system_r:container_t:s0\"\n\
             content = \"system_u:object_r:virt_var_lib_t:s0\"\n\
             file = \"system_u:object_r:container_file_t:s0\"\n",
        )
        .unwrap();
    }

    const SELINUXFS: &str = "30 25 0:28 / /sys/fs/selinux rw,relatime - selinuxfs selinuxfs rw\n";

    #[test]
    fn the_mount_table_is_read_only_where_the_kernel_has_selinuxfs() {
        // /proc/filesystems: "nodev\t<name>" or "\t<name>"
        assert!(kernel_has_selinuxfs(
            "nodev\tsysfs\nnodev\tselinuxfs\n\text4\n"
        ));
        assert!(!kernel_has_selinuxfs(
            "nodev\tsysfs\n\text4\nnodev\tselinuxfs2\n"
        ));
        assert!(!kernel_has_selinuxfs(""));
        // the fast path's statfs: an ordinary directory, or none, is not selinuxfs
        let d = tempfile::tempdir().unwrap();
        assert!(!is_selinuxfs(d.path()));
        assert!(!is_selinuxfs(&d.path().join("missing")));
    }

    #[test]
    fn detection_needs_a_writable_selinuxfs_a_loaded_policy_and_a_file_context() {
        let d = tempfile::tempdir().unwrap();
        policy(d.path());
        // The process's own label as the fake kernel gives it; every other file from disk.
        let as_labelled = |own: Option<&'static str>| {
            move |p: &Path| -> io::Result<String> {
                if p == Path::new(OWN_LABEL) {
                    own.map(String::from)
                        .ok_or_else(|| io::Error::from(io::ErrorKind::PermissionDenied))
                } else {
                    std::fs::read_to_string(p)
                }
            }
        };
        let engine = as_labelled(Some("system_u:system_r:dockerd_t:s0\0"));
        // No selinuxfs mounted: disabled, whatever /etc/selinux says.
        let s = Selinux::detect_with("40 1 8:1 / / rw - ext4 /dev/vda rw\n", d.path(), &engine);
        assert!(!s.enabled());
        // selinuxfs mounted, a policy loaded: enabled, though nothing under selinuxfs can be
        // read (an engine domain may not search it; `enforce` is never needed).
        let s = Selinux::detect_with(SELINUXFS, d.path(), &engine);
        assert_eq!(
            s.pod_file_label(None, None).unwrap().to_string(),
            "system_u:object_r:container_file_t:s0"
        );
        assert!(s.labels_pause());
        // Our own label unreadable: still enabled (never off because a read failed).
        assert!(Selinux::detect_with(SELINUXFS, d.path(), &as_labelled(None)).enabled());
        // No policy loaded yet (every process is `kernel`): disabled.
        assert!(
            !Selinux::detect_with(SELINUXFS, d.path(), &as_labelled(Some("kernel\0"))).enabled()
        );
        // A read-only selinuxfs (what a container sees): disabled, as go-selinux decides.
        let ro = "30 25 0:28 / /sys/fs/selinux ro,relatime - selinuxfs selinuxfs rw\n";
        assert_eq!(writable_selinuxfs(ro), None);
        assert!(!Selinux::detect_with(ro, d.path(), &engine).enabled());
        // Enabled, but the policy names no container contexts: nothing to label with.
        std::fs::remove_file(d.path().join("targeted/contexts/lxc_contexts")).unwrap();
        assert!(!Selinux::detect_with(SELINUXFS, d.path(), &engine).enabled());
        // A policy name that would leave /etc/selinux is not followed.
        std::fs::write(d.path().join("config"), "SELINUXTYPE=../x\n").unwrap();
        assert!(!Selinux::detect_with(SELINUXFS, d.path(), &engine).enabled());
    }

    #[test]
    fn the_pod_label_takes_the_pods_user_and_its_reserved_level() {
        let s = Selinux::with_file_context(
            Label::parse("system_u:object_r:container_file_t:s0").unwrap(),
        );
        let o = SelinuxOptions {
            user: "staff_u".into(),
            role: "staff_r".into(),
            kind: "spc_t".into(),
            level: "s0:c5,c6".into(),
        };
        assert_eq!(
            s.pod_file_label(Some(&o), Some("s0:c5,c6"))
                .unwrap()
                .to_string(),
            "staff_u:object_r:container_file_t:s0:c5,c6"
        );
        assert_eq!(
            s.pod_file_label(None, Some("s0:c1,c9"))
                .unwrap()
                .to_string(),
            "system_u:object_r:container_file_t:s0:c1,c9"
        );
        // No level reserved (the pause is not labelled): shared by all the pod's containers.
        assert_eq!(
            s.pod_file_label(Some(&o), None).unwrap().to_string(),
            "staff_u:object_r:container_file_t:s0"
        );
        let mount = "system_u:object_r:container_file_t:s0:c7,c8";
        assert_eq!(
            s.pod_files_label_of(mount, Some("s0:c7,c8"))
                .unwrap()
                .to_string(),
            mount
        );
        // No pod level, or a container at a level of its own: the shared form.
        for pod_level in [None, Some("s0:c1,c2")] {
            assert_eq!(
                s.pod_files_label_of(mount, pod_level).unwrap().to_string(),
                "system_u:object_r:container_file_t:s0"
            );
        }
        assert_eq!(s.pod_files_label_of("garbage", Some("s0:c7,c8")), None);
    }

    #[test]
    fn the_pause_gets_the_container_process_label_at_the_pods_level_or_random_categories() {
        let d = tempfile::tempdir().unwrap();
        policy(d.path());
        let fs = d.path().join("selinuxfs");
        std::fs::create_dir(&fs).unwrap();
        std::fs::write(fs.join("enforce"), "1").unwrap();
        let mi = SELINUXFS.replace("/sys/fs/selinux", fs.to_str().unwrap());
        let s = Selinux::detect_in(&mi, d.path());
        assert!(s.labels_pause());
        let drawn = draw_categories().unwrap();
        let (p, f) = s.pause_labels(None, &drawn).unwrap();
        assert_eq!((p.user.as_str(), p.role.as_str()), ("system_u", "system_r"));
        assert_eq!(p.kind, "container_t");
        assert_eq!(f.kind, "container_file_t");
        assert_eq!(
            p.level, f.level,
            "one level for the process and its program"
        );
        let cats: Vec<u16> = p
            .level
            .strip_prefix("s0:c")
            .unwrap()
            .split(",c")
            .map(|c| c.parse().unwrap())
            .collect();
        assert!(
            cats.len() == 2 && cats[0] < cats[1] && cats[1] < 1024,
            "{p}"
        );
        // The pod's options win, the role and type for the process only.
        let o = SelinuxOptions {
            user: "staff_u".into(),
            role: "staff_r".into(),
            kind: "spc_t".into(),
            level: "s0:c5,c6".into(),
        };
        let (p, f) = s.pause_labels(Some(&o), &o.level).unwrap();
        assert_eq!(p.to_string(), "staff_u:staff_r:spc_t:s0:c5,c6");
        assert_eq!(f.to_string(), "staff_u:object_r:container_file_t:s0:c5,c6");
        // No process context in the policy, or SELinux off: no label.
        let only_file = Selinux::with_file_context(f.clone());
        assert_eq!(only_file.pause_labels(None, "s0:c1,c2"), None);
        assert!(!only_file.labels_pause() && !Selinux::disabled().labels_pause());
        assert_eq!(Selinux::disabled().pause_labels(None, "s0:c1,c2"), None);
    }

    #[test]
    fn disabled_selinux_labels_nothing() {
        let s = Selinux::disabled();
        assert_eq!(s.pod_file_label(None, Some("s0:c1,c2")), None);
        assert_eq!(
            s.pod_files_label_of(
                "system_u:object_r:container_file_t:s0:c1,c2",
                Some("s0:c1,c2")
            ),
            None
        );
        let x = Recorded::default();
        let l = Label::parse("u:r:t:s0").unwrap();
        s.relabel(&x, &[PathBuf::from("/x")], &l).unwrap();
        assert!(x.calls.lock().unwrap().is_empty());
    }

    #[test]
    fn relabel_writes_each_path_and_tolerates_unlabelled_filesystems() {
        let s = Selinux::with_file_context(Label::parse("u:object_r:t:s0").unwrap());
        let l = Label::parse("u:object_r:t:s0").unwrap();
        let x = Recorded::default();
        let paths = [
            PathBuf::from("/b/etc/hosts"),
            PathBuf::from("/b/etc/hostname"),
        ];
        s.relabel(&x, &paths, &l).unwrap();
        assert_eq!(
            *x.calls.lock().unwrap(),
            vec![
                (paths[0].clone(), "u:object_r:t:s0".to_string()),
                (paths[1].clone(), "u:object_r:t:s0".to_string())
            ]
        );
        let unsupported = Recorded {
            fail: Some(libc::ENOTSUP),
            ..Default::default()
        };
        s.relabel(&unsupported, &paths, &l).unwrap();
        let denied = Recorded {
            fail: Some(libc::EACCES),
            ..Default::default()
        };
        let e = s.relabel(&denied, &paths, &l).unwrap_err();
        assert!(
            e.to_string().contains("label /b/etc/hosts u:object_r:t:s0"),
            "{e}"
        );
    }

    /// The real call reports the path's own error (here: it does not exist).
    #[test]
    fn real_xattrs_name_the_path_itself() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing");
        let e = RealXattrs.set_label(&missing, "u:r:t:s0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = RealXattrs.label_of(&missing).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    /// The kernel prints a level in its own form (sorted categories, runs as ranges): a
    /// pod's level given in another form is the same level.
    #[test]
    fn levels_compare_in_the_kernel_s_form() {
        for (given, kernel) in [
            ("s0", "s0"),
            ("s0:c1,c2", "s0:c1,c2"),
            ("s0:c2,c1", "s0:c1,c2"),
            ("s0:c1,c2,c3", "s0:c1.c3"),
            ("s0:c1.c2", "s0:c1,c2"),
            ("s0:c0.c3,c5,c7.c8", "s0:c0.c3,c5,c7,c8"),
            ("s0-s0", "s0"),
            ("s0-s0:c0.c1023", "s0-s0:c0.c1023"),
            ("s0:c1,c2-s0:c1,c2", "s0:c1,c2"),
        ] {
            assert_eq!(canonical_level(given).as_deref(), Some(kernel), "{given}");
        }
        for bad in ["", "x0", "s0:", "s0:c3.c1", "s0:cat", "s0-s0-s0"] {
            assert_eq!(canonical_level(bad), None, "{bad}");
        }
        assert!(same_context(
            "system_u:system_r:container_t:s0:c1.c3",
            "system_u:system_r:container_t:s0:c3,c2,c1"
        ));
        assert!(!same_context(
            "system_u:system_r:container_t:s0:c1,c2",
            "system_u:system_r:container_t:s0:c1,c3"
        ));
        assert!(!same_context(
            "system_u:system_r:spc_t:s0:c1,c2",
            "system_u:system_r:container_t:s0:c1,c2"
        ));
        assert!(!same_context("", "system_u:system_r:container_t:s0"));
    }
}
