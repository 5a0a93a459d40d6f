//! The shim's side of a user-namespaced pod's pause: the maps checked before any clone
//! ([`check_maps`]), the user namespace that owns the pod netns ([`owner_unless_initial`]), the
//! maps written for a child that made its own ([`userns_handshake`]) and the intermediate child
//! reaped by pidfd ([`reap_intermediate`]).
//!
//! Runs in the shim only: it may allocate and returns typed errors, it never waits beyond
//! [`STATUS_TIMEOUT`]. The child's half of the handshake (unshare, wait for the maps, join the
//! netns's owner) is raw system calls in [`super::child`].

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use super::config::{PAUSE_GID, PAUSE_UID};
use super::status::STATUS_TIMEOUT;
use crate::pod::spec::{IdMapping, UserNamespace};
use crate::records::error::{Context, Error, Result};

/// The pause runs as [`PAUSE_UID`]:[`PAUSE_GID`] inside its user namespace: both must be mapped
/// (the pod spec's decoding already insists on it; a `PauseConfig` made otherwise is checked
/// here, before any clone).
pub(super) fn check_maps(u: &UserNamespace) -> Result<()> {
    let covers = |maps: &[IdMapping], id: u32| {
        maps.iter().any(|m| {
            id >= m.container_id && u64::from(id) < u64::from(m.container_id) + u64::from(m.size)
        })
    };
    for (what, maps, id) in [("uid", &u.uids, PAUSE_UID), ("gid", &u.gids, PAUSE_GID)] {
        if !covers(maps, id) {
            return Err(Error::invalid(format!(
                "pause: the {what} map of the pod's user namespace does not map {id}, the \
                 pause process's {what}"
            )));
        }
    }
    Ok(())
}

/// The user namespace that owns `netns` (NS_GET_USERNS), or `None` when that is the shim's.
pub(super) fn owner_unless_initial(netns: &OwnedFd) -> Result<Option<OwnedFd>> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: NS_GET_USERNS returns a new descriptor (or -1), which we own.
    let fd = unsafe { libc::ioctl(netns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(Error::from(std::io::Error::last_os_error())
            .context("pause: find the user namespace of the pod netns"));
    }
    // SAFETY: as above.
    let owner = File::from(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let ours = std::fs::metadata("/proc/self/ns/user").context("pause: stat /proc/self/ns/user")?;
    let theirs = owner.metadata().context("pause: stat the netns owner")?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Ok(None);
    }
    Ok(Some(OwnedFd::from(owner)))
}

/// A map as `/proc/<pid>/uid_map` shows it.
pub(super) fn kernel_map_text(maps: &[IdMapping]) -> Vec<u8> {
    maps.iter()
        .map(|m| format!("{:>10} {:>10} {:>10}\n", m.container_id, m.host_id, m.size))
        .collect::<String>()
        .into_bytes()
}

/// The parent's side of the user namespace: waits until the child has made it, writes its uid
/// and gid maps, lets it go on. A child that fails first closes `sock` (its report is on the
/// status pipe, which tells the error).
pub(super) fn userns_handshake(pid: i32, u: &UserNamespace, sock: &mut File) -> Result<()> {
    let deadline = Instant::now() + STATUS_TIMEOUT;
    match crate::shim::util::poll_readable(std::os::fd::AsFd::as_fd(&*sock), deadline) {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::internal(
                "pause: the child did not make its user namespace within 10s",
            ));
        }
        Err(e) => return Err(Error::from(e).context("pause: wait for the child's user namespace")),
    }
    let mut b = [0u8; 1];
    if sock.read(&mut b).context("pause: read the sync socket")? == 0 {
        return Ok(()); // the child failed: read_status says why
    }
    for (what, text) in [("uid_map", u.uid_map()), ("gid_map", u.gid_map())] {
        let path = format!("/proc/{pid}/{what}");
        // One write: the kernel takes a map only whole, and only once.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
            .with_context(|| {
                format!(
                    "pause: write the {what} of its user namespace ({path}: {:?})",
                    text.trim_end()
                )
            })?;
    }
    std::io::Write::write_all(sock, &[1]).context("pause: let the child go on")?;
    Ok(())
}

/// Waits (briefly: it exits right after reporting the pause's pid) until the child that made
/// the user namespace has exited, so that the pause is the shim's (a child subreaper) when
/// this returns, and reaps it unless the shim's reaper did first (ECHILD). By pidfd: never
/// another process that got the pid since.
pub(super) fn reap_intermediate(pidfd: &OwnedFd) {
    // Its own exit raises SIGCHLD, whose handler may run on this thread (EINTR: waited on).
    let _ = crate::shim::util::poll_readable(
        std::os::fd::AsFd::as_fd(pidfd),
        Instant::now() + STATUS_TIMEOUT,
    );
    crate::shim::util::reap_pidfd(std::os::fd::AsFd::as_fd(pidfd), true);
}
