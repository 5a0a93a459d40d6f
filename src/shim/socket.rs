//! The shim's listening socket: its address (containerd's naming scheme), binding it safely,
//! and telling a socket a live shim serves from one a dead shim left behind.
//!
//! `start` uses all three (it reuses the socket of a live shim of the same group), `delete`
//! the last (it removes what a killed shim left, and nothing else).

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The address of the shim serving `grouping` in `namespace` for the containerd at
/// `grpc_address`: `unix://<socket_dir>/<sha256(grpc_address/namespace/grouping)>`.
///
/// The hash input is built with `Path::join` (as the containerd-shim crate that earlier
/// versions of this shim used did, and as Go's `filepath.Join` does for containerd's clean
/// inputs), so a new binary finds the sockets of shims started by an old one.
pub fn address(socket_dir: &str, grpc_address: &str, namespace: &str, grouping: &str) -> String {
    let input = Path::new(grpc_address)
        .join(namespace)
        .join(grouping)
        .display()
        .to_string();
    let hex: String = sha256(input.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("unix://{}/{hex}", socket_dir.trim_end_matches('/'))
}

/// Binds a listening socket at `path`, creating its directory 0700 when missing; the socket
/// is 0600 from the moment it exists, never abstract.
///
/// The mode comes from the socket itself: Linux gives the bound file the socket inode's mode
/// (less the umask), and `fchmod` before `bind` sets it. No process-wide umask is touched,
/// so other threads creating files meanwhile are unaffected.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, listen, socket};
    use nix::sys::stat::{Mode, fchmod};
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    fchmod(&fd, Mode::S_IRUSR | Mode::S_IWUSR)?;
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &UnixAddr::new(path)?)?;
    let listener = UnixListener::from(fd);
    listen(&listener, Backlog::MAXCONN)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// What a connection attempt says about a socket file.
#[derive(Debug)]
pub enum Probe {
    /// Something accepts connections there (or its backlog is full: alive but busy).
    Live,
    /// The file exists but nothing listens on it (ECONNREFUSED).
    Refused,
    /// No such file.
    Missing,
    /// Anything else (permissions, not a socket, ...): nothing can be concluded.
    Unknown(io::Error),
}

/// Tries a non-blocking connection to `path` (a hung shim with a full backlog cannot block us).
pub fn probe(path: &Path) -> Probe {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let fd = match socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    ) {
        Ok(fd) => fd,
        Err(e) => return Probe::Unknown(e.into()),
    };
    let addr = match UnixAddr::new(path) {
        Ok(a) => a,
        Err(e) => return Probe::Unknown(e.into()),
    };
    match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) | Err(Errno::EAGAIN) | Err(Errno::EINPROGRESS) => Probe::Live,
        Err(Errno::ECONNREFUSED) => Probe::Refused,
        Err(Errno::ENOENT) => Probe::Missing,
        Err(e) => Probe::Unknown(e.into()),
    }
}

/// Whether a socket of this network namespace is bound to `path`, per a `/proc/net/unix`
/// document. A socket between `bind` and `listen` refuses connections but is not stale.
pub fn bound_in(proc_net_unix: &str, path: &Path) -> bool {
    let Some(want) = path.to_str() else {
        return true; // cannot tell: assume bound
    };
    // "Num RefCount Protocol Flags Type St Inode Path": the path is the 8th field, if any.
    proc_net_unix
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().nth(7) == Some(want))
}

/// The socket path of `address` if it is one this shim may have created: `unix://` (a bare
/// path is abstract in containerd's reading, never a file of ours), absolute, no `.`/`..`
/// parts, a file named by the 64-hex-digit hash directly in one of `dirs`.
pub fn own_socket_path(address: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let raw = address.strip_prefix("unix://")?;
    // Checked on the text: `Path::components` would silently drop "." and "//".
    let plain = raw.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
    });
    let path = Path::new(raw);
    let name = path.file_name()?.to_str()?;
    let hashed = name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let parent = path.parent()?;
    let in_dir = dirs.iter().any(|d| d.as_path() == parent);
    (plain && hashed && in_dir).then(|| path.to_path_buf())
}

/// Why [`remove_if_stale`] did or did not remove a socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// A live shim serves it, or a socket is bound there: left alone.
    InUse,
    /// Not there (already cleaned up).
    Missing,
    /// Not a socket file, or its directory is reached through a symlink: left alone.
    NotOurs,
    /// Removing it failed.
    Failed(String),
}

/// Removes the socket file at `path` when nothing serves it: the file must be a socket,
/// its directory a real one (no symlink anywhere on the way), connections refused, and no
/// socket bound to the path in `/proc/net/unix`.
pub fn remove_if_stale(path: &Path, proc_net_unix: impl FnOnce() -> Option<String>) -> Removal {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Removal::Missing,
        Err(e) => return Removal::Failed(e.to_string()),
    };
    if !meta.file_type().is_socket() {
        return Removal::NotOurs;
    }
    let Some(dir) = path.parent() else {
        return Removal::NotOurs;
    };
    if std::fs::canonicalize(dir).ok().as_deref() != Some(dir) {
        return Removal::NotOurs;
    }
    match probe(path) {
        Probe::Refused => {}
        Probe::Missing => return Removal::Missing,
        Probe::Live | Probe::Unknown(_) => return Removal::InUse,
    }
    match proc_net_unix() {
        Some(table) if !bound_in(&table, path) => {}
        _ => return Removal::InUse,
    }
    match std::fs::remove_file(path) {
        Ok(()) => Removal::Removed,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Removal::Missing,
        Err(e) => Removal::Failed(e.to_string()),
    }
}

/// SHA-256 (FIPS 180-4). Only names sockets here; nothing security-relevant rests on it.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    // Padding: 0x80, zeros to 56 mod 64, the bit length big-endian.
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64).wrapping_mul(8)).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_matches_the_fips_180_vectors() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            (
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            ),
            (
                b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
                "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(hex(&sha256(input)), *want);
        }
        let million = vec![b'a'; 1_000_000];
        assert_eq!(
            hex(&sha256(&million)),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
        // Lengths around the padding boundary, against `sha256sum`.
        for (n, want) in [
            (
                55,
                "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072",
            ),
            (
                56,
                "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e",
            ),
            (
                63,
                "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2",
            ),
            (
                64,
                "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c",
            ),
            (
                119,
                "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c",
            ),
        ] {
            assert_eq!(hex(&sha256(&vec![b'x'; n])), want, "{n} bytes");
        }
    }

    #[test]
    fn address_is_the_hash_containerd_shim_0_12_computed() {
        // The containerd-shim crate's own test vector (lib.rs test_socket_address).
        let hash = "0ddfbd72d02b3551e75f3a0ed90b9965b533401be618f43a568bc522764e0ad0";
        assert_eq!(
            address(
                "/run/containerd/s",
                "/run/containerd/containerd.sock",
                "default",
                "123"
            ),
            format!("unix:///run/containerd/s/{hash}")
        );
        assert_eq!(
            address(
                "/tmp/sockets/",
                "/run/containerd/containerd.sock",
                "default",
                "123"
            ),
            format!("unix:///tmp/sockets/{hash}")
        );
        // Go: sha256("/run/containerd/containerd.sock/default/123") is the same input.
        assert_eq!(
            hex(&sha256(b"/run/containerd/containerd.sock/default/123")),
            hash
        );
    }

    #[test]
    fn own_socket_paths_are_hash_files_in_the_socket_dirs() {
        let dirs = [PathBuf::from("/run/containerd/s"), PathBuf::from("/x/s")];
        let h = "0ddfbd72d02b3551e75f3a0ed90b9965b533401be618f43a568bc522764e0ad0";
        assert_eq!(
            own_socket_path(&format!("unix:///run/containerd/s/{h}"), &dirs),
            Some(PathBuf::from(format!("/run/containerd/s/{h}")))
        );
        assert!(own_socket_path(&format!("unix:///x/s/{h}"), &dirs).is_some());
        for bad in [
            format!("/run/containerd/s/{h}"), // abstract in containerd's reading
            format!("vsock://3:{h}"),         // not a file
            format!("unix:///run/containerd/s/../s/{h}"), // dot-dot
            format!("unix:///run/containerd/s/./{h}"), // dot
            format!("unix:///run/containerd//s/{h}"), // empty part
            format!("unix:///run/containerd/{h}"), // another dir
            format!("unix:///run/containerd/s/x/{h}"), // below the dir
            "unix:///run/containerd/s/passwd".to_string(), // not a hash name
            format!("unix://run/containerd/s/{h}"), // relative
            format!("unix:///run/containerd/s/{}", h.to_uppercase()),
        ] {
            assert_eq!(own_socket_path(&bad, &dirs), None, "{bad}");
        }
    }

    #[test]
    fn proc_net_unix_lookup() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 23456 /run/containerd/s/abc\n\
            0000000000000000: 00000002 00000000 00000000 0001 03 23457\n\
            0000000000000000: 00000002 00000000 00000000 0001 01 23458 @abstract\n";
        assert!(bound_in(table, Path::new("/run/containerd/s/abc")));
        assert!(!bound_in(table, Path::new("/run/containerd/s/abd")));
        assert!(!bound_in(table, Path::new("/run/containerd/s")));
    }

    #[test]
    fn bind_makes_a_0600_socket_in_a_0700_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s").join("sock");
        let l = bind(&path).unwrap();
        // The listener is close-on-exec (start hands it on with dup2 only).
        let flags = nix::fcntl::fcntl(&l, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert!(matches!(probe(&path), Probe::Live));
        // A second bind fails: never two shims on one socket.
        assert!(bind(&path).is_err());
    }

    #[test]
    fn only_stale_sockets_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        fn table(s: &str) -> impl FnOnce() -> Option<String> + '_ {
            move || Some(s.to_string())
        }
        let empty = "Num RefCount Protocol Flags Type St Inode Path\n";

        // Served: left alone.
        let live = dir.join("live");
        let l = bind(&live).unwrap();
        assert_eq!(remove_if_stale(&live, table(empty)), Removal::InUse);
        assert!(live.exists());
        // The listener gone (a killed shim): removed.
        drop(l);
        assert!(matches!(probe(&live), Probe::Refused));
        assert_eq!(remove_if_stale(&live, table(empty)), Removal::Removed);
        assert!(!live.exists());
        assert_eq!(remove_if_stale(&live, table(empty)), Removal::Missing);

        // Refusing, but a socket is still bound there (between bind and listen): left alone.
        let bound = dir.join("bound");
        drop(bind(&bound).unwrap());
        let t = format!(
            "{empty}0: 00000002 00000000 00000000 0001 07 1 {}\n",
            bound.display()
        );
        assert_eq!(remove_if_stale(&bound, table(&t)), Removal::InUse);
        // Without /proc/net/unix nothing can be concluded either.
        assert_eq!(remove_if_stale(&bound, || None), Removal::InUse);
        assert!(bound.exists());

        // Not a socket: never removed.
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(remove_if_stale(&file, table(empty)), Removal::NotOurs);
        assert!(file.exists());

        // A symlinked directory on the way: never followed.
        let real = dir.join("real");
        std::fs::create_dir(&real).unwrap();
        drop(bind(&real.join("sock")).unwrap());
        std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
        assert_eq!(
            remove_if_stale(&dir.join("link").join("sock"), table(empty)),
            Removal::NotOurs
        );
        assert!(real.join("sock").exists());
    }
}
