//! The shim binary's own actions, timed alone, the way containerd runs them
//! (core/runtime/v2/binary.go and pkg/shim/util.go of containerd 2.1.9): same flags, same
//! environment, cwd the bundle, a `log` fifo opened by the caller.
//!
//! One sample: `start` (spawn to exit: it binds the socket, starts the daemon, prints the
//! address), one ttrpc round trip to the new daemon (the median of [`ROUND_TRIPS`] Task
//! `Connect` calls, which rsandbox answers through its worker pool: its answers to CRI's most
//! frequent call, a non-verbose SandboxStatus, skip that hand-over), then the Task `Shutdown`
//! call and the time from its reply until the daemon's exit, then `delete` on the bundle
//! (spawn to exit). Plus `-v`: the binary's bare exec + start-up cost.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::ProcTable;

/// containerd namespace of the actions' shims (no containerd object is created in it).
pub const NAMESPACE: &str = "rsandbox-bench-actions";

/// Everything a shim binary is run with.
pub struct ShimBinary {
    pub path: PathBuf,
    /// containerd's gRPC socket (`-address`).
    pub address: PathBuf,
    /// containerd's own binary (`-publish-binary`).
    pub containerd: PathBuf,
    /// Extra environment (the bench's `io.containerd.shim.v1.manager` env).
    pub env: Vec<(String, String)>,
    /// Write a minimal config.json into the bundle (containerd-shim-runc-v2's `start` reads it).
    pub needs_spec: bool,
}

/// Round trips timed per sample (after one that is not: it may start the shim's threads); odd,
/// so that the median is one of them.
pub const ROUND_TRIPS: usize = 11;

/// One sample's durations.
#[derive(Debug, Clone, Copy)]
pub struct ActionTimes {
    pub version: Duration,
    pub start: Duration,
    /// One request's write to its whole reply, on an idle daemon (the median of the sample's).
    pub round_trip: Duration,
    /// From the Shutdown reply until the daemon has exited.
    pub exit_after_shutdown: Duration,
    pub delete: Duration,
}

impl ShimBinary {
    fn command(&self, id: &str, cwd: &Path, extra: &[&str]) -> Command {
        let mut c = Command::new(&self.path);
        c.args(["-namespace", NAMESPACE, "-address"])
            .arg(&self.address)
            .arg("-publish-binary")
            .arg(&self.containerd)
            .args(["-id", id])
            .args(extra)
            .current_dir(cwd)
            .env("GOMAXPROCS", "2")
            .env("MAX_SHIM_VERSION", "2")
            .env("TTRPC_ADDRESS", format!("{}.ttrpc", self.address.display()))
            .env("GRPC_ADDRESS", &self.address)
            .env("NAMESPACE", NAMESPACE)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0);
        c
    }

    /// `<shim> -v`: exec and start-up alone.
    fn version(&self) -> Result<Duration, String> {
        let t = Instant::now();
        let out = Command::new(&self.path)
            .arg("-v")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} -v: {e}", self.path.display()))?;
        let d = t.elapsed();
        if !out.status.success() {
            return Err(format!("{} -v: {}", self.path.display(), out.status));
        }
        Ok(d)
    }

    /// One start / round trips / Shutdown / delete round in a fresh bundle under `work`.
    pub fn sample(&self, work: &Path, id: &str) -> Result<ActionTimes, String> {
        let version = self.version()?;
        let bundle = work.join(id);
        let mut guard = BundleGuard {
            bundle: bundle.clone(),
            address: self.address.clone(),
            id: id.to_string(),
            socket: None,
        };
        fs::create_dir_all(bundle.join("rootfs")).map_err(|e| format!("mkdir bundle: {e}"))?;
        if self.needs_spec {
            fs::write(bundle.join("config.json"), br#"{"ociVersion":"1.1.0"}"#)
                .map_err(|e| format!("write config.json: {e}"))?;
        }
        let _log = open_log_fifo(&bundle)?;

        let t = Instant::now();
        let out = self
            .command(id, &bundle, &["start"])
            .output()
            .map_err(|e| format!("start: {e}"))?;
        let start = t.elapsed();
        if !out.status.success() {
            return Err(format!(
                "{} start: {}: {}{}",
                self.path.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let socket =
            socket_of_start_reply(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
                format!(
                    "start: no address in {:?}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })?;
        guard.socket = Some(socket.clone());
        let daemon = wait_for_daemon(id, &self.address)
            .ok_or_else(|| format!("start: no daemon process with -id {id}"))?;
        let pidfd = pidfd_open(daemon)?;

        let mut trips = crate::ttrpc::connect_round_trips(
            &socket,
            id,
            NAMESPACE,
            ROUND_TRIPS + 1,
            Duration::from_millis(1),
        )
        .map_err(|e| format!("Connect ({}): {e}", socket.display()))?;
        trips.remove(0);
        trips.sort();
        let round_trip = trips[trips.len() / 2];

        let conn = crate::ttrpc::shutdown_task(&socket, id, NAMESPACE)
            .map_err(|e| format!("Shutdown ({}): {e}", socket.display()))?;
        // containerd closes its connection as soon as it has the reply (rsandbox waits for
        // that before it exits).
        drop(conn);
        let t = Instant::now();
        if !wait_readable(&pidfd, Duration::from_secs(5)) {
            return Err(format!(
                "the daemon (pid {daemon}) did not exit within 5 s of Shutdown"
            ));
        }
        let exit_after_shutdown = t.elapsed();

        let t = Instant::now();
        let out = self
            .command(
                id,
                &bundle,
                &["-bundle", &bundle.to_string_lossy(), "delete"],
            )
            .output()
            .map_err(|e| format!("delete: {e}"))?;
        let delete = t.elapsed();
        if !out.status.success() {
            return Err(format!(
                "{} delete: {}: {}",
                self.path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(ActionTimes {
            version,
            start,
            round_trip,
            exit_after_shutdown,
            delete,
        })
    }
}

/// Removes a sample's bundle; kills its daemon if it still runs and then removes its socket.
struct BundleGuard {
    bundle: PathBuf,
    address: PathBuf,
    id: String,
    socket: Option<PathBuf>,
}

impl Drop for BundleGuard {
    fn drop(&mut self) {
        if let Some(pid) = daemon_pid(&self.id, &self.address) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            std::thread::sleep(Duration::from_millis(100));
            if let Some(s) = &self.socket {
                let _ = fs::remove_file(s);
            }
        }
        let _ = fs::remove_dir_all(&self.bundle);
    }
}

/// The shim socket of a `start` reply: `{"version":3,"address":"unix:///...",...}` or a
/// bare address.
pub fn socket_of_start_reply(out: &str) -> Option<PathBuf> {
    let out = out.trim();
    let addr = match serde_json::from_str::<serde_json::Value>(out) {
        Ok(v) => v.get("address")?.as_str()?.to_string(),
        Err(_) => out.to_string(),
    };
    let path = addr.strip_prefix("unix://")?;
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// [`daemon_pid`] once the daemon can be seen: `start` returns as soon as the daemon's exec has
/// begun, a moment before the kernel shows its new command line in /proc.
fn wait_for_daemon(id: &str, address: &Path) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(pid) = daemon_pid(id, address) {
            return Some(pid);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The daemon of the actions' shim `id` (not a forked child of it).
pub fn daemon_pid(id: &str, address: &Path) -> Option<i32> {
    let t = ProcTable::read();
    let addr = address.to_string_lossy();
    let shims: Vec<_> = t
        .shims_of(id, &addr)
        .into_iter()
        .filter(|p| p.cmdline.contains(&format!(" -namespace {NAMESPACE} ")))
        .filter(|p| !p.cmdline.ends_with(" start ") && !p.cmdline.ends_with(" delete "))
        .collect();
    let pids: Vec<i32> = shims.iter().map(|p| p.pid).collect();
    shims
        .iter()
        .find(|p| !pids.contains(&p.ppid))
        .map(|p| p.pid)
}

/// The bundle's `log` fifo, opened for reading as containerd does before `start` (the Go
/// shim's daemon blocks opening it for writing until a reader exists). Read-write so it
/// never sees end-of-file; nothing is read: a sample logs far less than a pipe holds.
fn open_log_fifo(bundle: &Path) -> Result<fs::File, String> {
    let path = bundle.join("log");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o700))
        .map_err(|e| format!("mkfifo {}: {e}", path.display()))?;
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, String> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(format!(
            "pidfd_open {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the fd was just returned by the kernel and nothing else owns it; pidfds are
    // close-on-exec.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until `fd` is readable (a pidfd: the process has exited).
fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return true;
        }
        if r == 0
            || (r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted)
        {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_replies() {
        assert_eq!(
            socket_of_start_reply(
                "{\"version\":3,\"address\":\"unix:///run/containerd/s/ab\",\"protocol\":\"ttrpc\"}\n"
            ),
            Some(PathBuf::from("/run/containerd/s/ab"))
        );
        assert_eq!(
            socket_of_start_reply("unix:///run/containerd/s/cd\n"),
            Some(PathBuf::from("/run/containerd/s/cd"))
        );
        assert_eq!(socket_of_start_reply("vsock://3:1"), None);
        assert_eq!(socket_of_start_reply("unix://"), None);
    }
}
