//! The status pipe between the child and the shim: the steps the child reports failures for
//! ([`Step`]), the report's wire format, the child's writer ([`fail`]) and the parent's reader
//! ([`read_status`]).
//!
//! The reader runs in the shim: it may allocate and returns typed errors, it never blocks
//! beyond [`STATUS_TIMEOUT`] per report. [`fail`] runs in the forked child: raw, async-signal-
//! safe system calls on a stack buffer only (no allocation, no locks, no panics), like
//! everything in [`super::child`].

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use super::config::PauseConfig;
use crate::pod::spec::sysctl_path;
use crate::records::error::{Context, Error, Result};

/// Steps the child reports failures for; the discriminant travels over the status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Step {
    Unknown = 0,
    JoinNetns = 2,
    SetHostname = 3,
    OpenSysctl = 4,
    WriteSysctl = 5,
    DropCapabilities = 6,
    SetGroups = 7,
    SetGid = 8,
    SetUid = 9,
    NoNewPrivs = 10,
    BlockSignals = 11,
    PrivateMounts = 12,
    MountRoot = 13,
    PivotRoot = 14,
    DetachNodeRoot = 15,
    ReadyFd = 16,
    Exec = 17,
    UnshareUserns = 18,
    WaitForMaps = 19,
    CreateNamespaces = 20,
    BecomeNsRoot = 21,
    JoinUserns = 22,
    CheckMaps = 23,
    SetExecLabel = 24,
    ExecInDomain = 25,
}

impl Step {
    /// Every step, in the order of a user-namespaced pod's child: the netns and the net.*
    /// sysctls (written while the child still has the node's privileges in the pod netns), the
    /// empty root (its mount namespace is the node's user namespace's), the four user
    /// namespace steps, then the pause: hostname, the other sysctls, privileges dropped. Without
    /// a user namespace, the hostname and every sysctl come before the empty root.
    const ALL: [Step; 24] = [
        Step::JoinNetns,
        Step::PrivateMounts,
        Step::MountRoot,
        Step::PivotRoot,
        Step::DetachNodeRoot,
        Step::JoinUserns,
        Step::CheckMaps,
        Step::UnshareUserns,
        Step::WaitForMaps,
        Step::CreateNamespaces,
        Step::SetHostname,
        Step::BecomeNsRoot,
        Step::OpenSysctl,
        Step::WriteSysctl,
        Step::DropCapabilities,
        Step::SetGroups,
        Step::SetGid,
        Step::SetUid,
        Step::NoNewPrivs,
        Step::BlockSignals,
        Step::SetExecLabel,
        Step::ReadyFd,
        Step::Exec,
        Step::ExecInDomain,
    ];

    fn from_wire(b: u8) -> Step {
        Step::ALL
            .into_iter()
            .find(|s| *s as u8 == b)
            .unwrap_or(Step::Unknown)
    }

    fn describe(self) -> &'static str {
        match self {
            Step::Unknown => "unknown step",
            Step::JoinNetns => "join the pod network namespace",
            Step::UnshareUserns => "create its user namespace",
            Step::WaitForMaps => "wait for the maps of its user namespace",
            Step::CreateNamespaces => "create the pod namespaces in its user namespace",
            Step::BecomeNsRoot => "become root of its user namespace",
            Step::JoinUserns => "join the user namespace that owns the pod netns",
            Step::CheckMaps => {
                "check the maps of the user namespace that owns the pod netns (they are not \
                 the pod's)"
            }
            Step::SetHostname => "set the hostname",
            Step::OpenSysctl => "open the file of sysctl",
            Step::WriteSysctl => "write sysctl",
            Step::PrivateMounts => "make its mounts private",
            Step::MountRoot => "mount its empty root",
            Step::PivotRoot => "pivot into its empty root",
            Step::DetachNodeRoot => "detach the node's root",
            Step::DropCapabilities => "drop capabilities",
            Step::SetGroups => "set groups",
            Step::SetGid => "set gid",
            Step::SetUid => "set uid",
            Step::NoNewPrivs => "set no_new_privs/non-dumpable",
            Step::BlockSignals => "block signals",
            Step::ReadyFd => "pass the status pipe to the pause program",
            Step::Exec => "execute the pause program",
            Step::SetExecLabel => "SELinux: set its process label for the exec (attr/exec)",
            Step::ExecInDomain => {
                "SELinux: execute the pause program in the pod's domain (the policy refused \
                 the transition or the entry point)"
            }
        }
    }
}

/// The first byte of the intermediate child's report of the pause's pid (a failure report
/// starts with its [`Step`], the pause program's ready byte is 0).
pub(super) const PID_REPORT: u8 = 0xfe;

/// How long the parent waits for each report of the child.
pub(super) const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// What the status pipe said.
pub(super) enum Report {
    /// The pause program is confined and waiting.
    Ready,
    /// The child reported a failed step and exited.
    Failed(Error),
    /// The pipe closed without a report: the child or the program died.
    Gone,
    /// No answer in time, or the pipe could not be read: the child may still live.
    NoAnswer(Error),
}

/// Length of the child's failure report: step (1 byte), padding (3), errno (4), index (4).
pub(super) const REPORT_LEN: usize = 12;

/// Reads the reports, within 10 s: one `0` byte from the pause program once it is confined,
/// or the child's (step, errno, index); in a user-namespaced pod first the pause's host pid
/// from the child that cloned it (stored in `pause` as it comes).
pub(super) fn read_status(rx: OwnedFd, cfg: &PauseConfig, pause: &mut Option<i32>) -> Report {
    let mut f = File::from(rx);
    let deadline = Instant::now() + STATUS_TIMEOUT;
    let mut ready = false;
    loop {
        let mut buf = [0u8; REPORT_LEN];
        match read_full(&mut f, &mut buf[..1], deadline) {
            Ok(0) => return Report::Gone,
            Ok(_) => {}
            Err(e) => return Report::NoAnswer(e),
        }
        if buf[0] == 0 {
            // In a user-namespaced pod the pause (the grandchild) can report ready before
            // its parent has reported its pid: wait for the pid (its parent holds the pipe
            // open until it has written it, or exits).
            if pause.is_some() {
                return Report::Ready;
            }
            ready = true;
            continue;
        }
        match read_full(&mut f, &mut buf[1..], deadline) {
            Ok(n) if n == REPORT_LEN - 1 => {}
            Ok(_) => return Report::Gone,
            Err(e) => return Report::NoAnswer(e),
        }
        if buf[0] == PID_REPORT {
            *pause = Some(i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]));
            if ready {
                return Report::Ready;
            }
            continue;
        }
        return Report::Failed(failure(&buf, cfg));
    }
}

/// Reads until `buf` is full or the pipe ends (the count read), within `deadline`.
fn read_full(f: &mut File, buf: &mut [u8], deadline: Instant) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match crate::shim::util::poll_readable(std::os::fd::AsFd::as_fd(&*f), deadline) {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::internal(
                    "pause: no status from the child within 10s",
                ));
            }
            Err(e) => return Err(Error::from(e).context("pause: wait for the child")),
        }
        match f
            .read(&mut buf[got..])
            .context("pause: read the child's status")?
        {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The error of a child's failure report.
pub(super) fn failure(buf: &[u8; REPORT_LEN], cfg: &PauseConfig) -> Error {
    let step = Step::from_wire(buf[0]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let idx = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    let err = std::io::Error::from_raw_os_error(errno);
    let what = step.describe();
    // SELinux fails closed, as runc: the node's policy refused the pod's label, and the
    // pause does not run in the shim's domain instead.
    if matches!(step, Step::SetExecLabel | Step::ExecInDomain) {
        let label = cfg.labels.as_ref().map_or("?", |l| l.process.as_str());
        return Error::precondition(format!("pause: {what}, label {label}: {err}"));
    }
    Error::internal(match step {
        Step::OpenSysctl | Step::WriteSysctl => {
            let name = cfg.sysctls.get(idx).map_or("?", |(n, _)| n.as_str());
            format!(
                "pause: {what} {name} ({}): {err}",
                sysctl_path(name).display()
            )
        }
        Step::DropCapabilities => format!("pause: {what} (capability {idx}): {err}"),
        Step::MountRoot | Step::PivotRoot => format!(
            "pause: {what} (on {}): {err}",
            cfg.root_mountpoint.display()
        ),
        Step::Exec if errno == libc::EACCES || errno == libc::EPERM => format!(
            "pause: {what}: {err} (is vm.memfd_noexec set to 2, or does a security \
             module forbid executing a memfd?)"
        ),
        _ => format!("pause: {what}: {err}"),
    })
}

/// The failure report [`fail`] writes (no allocation: async-signal-safe).
pub(super) const fn report(step: Step, errno: i32, idx: u32) -> [u8; REPORT_LEN] {
    let e = errno.to_ne_bytes();
    let i = idx.to_ne_bytes();
    [
        step as u8, 0, 0, 0, e[0], e[1], e[2], e[3], i[0], i[1], i[2], i[3],
    ]
}

/// Reports a failed step and exits. Async-signal-safe.
pub(super) fn fail(fd: i32, step: Step, idx: u32) -> ! {
    // SAFETY: __errno_location is this thread's errno; write and _exit are async-signal-safe.
    unsafe {
        let rec = report(step, *libc::__errno_location(), idx);
        libc::write(fd, rec.as_ptr().cast(), rec.len());
        libc::_exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_survives_the_wire() {
        for s in Step::ALL {
            assert_eq!(Step::from_wire(s as u8), s);
        }
        assert_eq!(Step::from_wire(200), Step::Unknown);
    }
}
