//! The OCI runtime (runc) behind a narrow trait.
//!
//! [`Runtime`] is the only way the task manager acts on containers, so tests drive the whole
//! Task service with a fake. [`Runc`] is the real one: it runs the `runc` binary through the
//! [`Spawner`] (never `Child::wait`, see `reaper`), passes stdio file descriptors straight to
//! runc (which hands them to the container: no copy loop in the shim), receives the pty master
//! over a console socket for terminals, and turns runc's JSON log into error messages.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::records::error::{Context, Error, Result};
use crate::shim::reaper::Spawner;
use crate::shim::sync::Lock;

/// Stdio handed to a new process: each `None` becomes /dev/null.
#[derive(Debug, Default)]
pub struct ProcessIo {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// What `create`/`exec` produced.
#[derive(Debug)]
pub struct Spawned {
    /// Host pid of the new process.
    pub pid: i32,
    /// The pty master when a terminal was requested.
    pub console: Option<File>,
}

/// Operations the task manager needs from an OCI runtime.
pub trait Runtime: Send + Sync {
    /// `runc create`: the container's init is created and waits for `start`.
    fn create(&self, id: &str, bundle: &Path, terminal: bool, io: ProcessIo) -> Result<Spawned>;
    /// `runc start`.
    fn start(&self, id: &str) -> Result<()>;
    /// `runc exec --detach` of the process spec at `process_json`.
    fn exec(
        &self,
        id: &str,
        bundle: &Path,
        exec_id: &str,
        process_json: &[u8],
        terminal: bool,
        io: ProcessIo,
    ) -> Result<Spawned>;
    /// `runc kill [--all] id signal`.
    fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()>;
    /// `runc delete [--force] id`.
    fn delete(&self, id: &str, force: bool) -> Result<()>;
    /// `runc pause id`.
    fn pause(&self, id: &str) -> Result<()>;
    /// `runc resume id`.
    fn resume(&self, id: &str) -> Result<()>;
    /// `runc ps --format json id`: host pids in the container.
    fn ps(&self, id: &str) -> Result<Vec<i32>>;
    /// `runc update --resources - id` with a JSON `LinuxResources`.
    fn update(&self, id: &str, resources_json: &[u8]) -> Result<()>;
    /// That process `pid` of container `id` is in the container's cgroup in every hierarchy
    /// runc's state says the container joined (see [`crate::host::placement`]); a typed error
    /// naming the hierarchy and both directories if not.
    fn check_placement(&self, id: &str, pid: i32) -> Result<()>;
}

/// runc settings, from the runtime options (`containerd.runc.v1.Options`) or defaults.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuncConfig {
    /// The runc binary (a path, or a name looked up in PATH).
    pub binary: String,
    /// runc's state root.
    pub root: PathBuf,
    /// Use the systemd cgroup driver.
    pub systemd_cgroup: bool,
    /// `runc create --no-pivot` (runtime option `NoPivotRoot`): for a node whose root is the
    /// initramfs, where `pivot_root` cannot work (runc moves the rootfs over `/` instead).
    /// Defaulted: records written before it existed are read by `delete` after an upgrade.
    #[serde(default)]
    pub no_pivot_root: bool,
    /// `runc create --no-new-keyring` (runtime option `NoNewKeyring`).
    #[serde(default)]
    pub no_new_keyring: bool,
}

impl RuncConfig {
    /// Defaults for namespace `ns`: `runc` from PATH, root `/run/containerd/runc/<ns>` (the
    /// same as containerd's runc shim, so `runc list` shows all containers of a namespace).
    pub fn defaults(ns: &str) -> Self {
        RuncConfig {
            binary: "runc".into(),
            root: PathBuf::from("/run/containerd/runc").join(ns),
            systemd_cgroup: false,
            no_pivot_root: false,
            no_new_keyring: false,
        }
    }

    /// The settings for the container whose OCI spec is `spec`: with systemd's cgroup driver
    /// (`--systemd-cgroup` on every runc command) when its `linux.cgroupsPath` has systemd's
    /// `slice:prefix:name` form, whatever the runtime options say. containerd's CRI writes
    /// that form for every container of a pod whose cgroup_parent is a `.slice` (its
    /// `getCgroupsPath`), and runc without the flag would take it for a cgroupfs path and
    /// make a directory of that name in its own cgroup (containerd issue #4900); the options
    /// cannot even be set for a non-runc runtime on containerd 2.1/2.2. `SystemdCgroup =
    /// true` in the options keeps the flag for every container, as in containerd's runc shim.
    pub fn for_container(mut self, spec: &serde_json::Value) -> RuncConfig {
        if spec
            .pointer("/linux/cgroupsPath")
            .and_then(serde_json::Value::as_str)
            .is_some_and(crate::host::systemd::names::is_systemd_cgroups_path)
        {
            self.systemd_cgroup = true;
        }
        self
    }
}

/// `name` as an absolute path: a bare name is looked up in `PATH` once per shim and
/// remembered (exec'ing a bare name walks `PATH` with failed `execve`s on every runc call).
/// An unresolvable name is returned as is, for the exec to report.
fn resolve_binary(name: &str) -> PathBuf {
    static RESOLVED: std::sync::LazyLock<Mutex<HashMap<String, PathBuf>>> =
        std::sync::LazyLock::new(Mutex::default);
    if name.contains('/') {
        return PathBuf::from(name);
    }
    if let Some(p) = RESOLVED.locked().get(name) {
        return p.clone();
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    });
    match found {
        Some(p) => {
            RESOLVED.locked().insert(name.to_string(), p.clone());
            p
        }
        None => PathBuf::from(name),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The oldest runc that can run the containers of a user-namespaced pod: CRI gives their
/// mounts (the pod files, volumes) uid/gid mappings, which runc 1.2 turns into idmapped
/// mounts; runc 1.1 ignores them.
pub const USERNS_MIN_RUNC: (u32, u32) = (1, 2);

/// What `runc --version` says: its first line and the version number in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuncVersion {
    /// e.g. `runc version 1.1.5+ds1`.
    pub line: String,
    /// (major, minor, patch), `None` when the line has no number.
    pub number: Option<(u32, u32, u32)>,
}

impl RuncVersion {
    /// Parses `runc --version`'s output (`runc version 1.3.0-rc.1`, `+ds1` suffixes ...).
    pub fn parse(out: &str) -> RuncVersion {
        let line = out.lines().next().unwrap_or("").trim().to_string();
        let number = line
            .split_whitespace()
            .skip_while(|w| *w != "version")
            .nth(1)
            .and_then(|v| {
                let digits: String = v
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                let mut it = digits.split('.').map(|n| n.parse::<u32>().ok());
                Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
            });
        RuncVersion { line, number }
    }
}

/// `<binary> --version`, run once per shim and binary (a pod's runc does not change while
/// its shim runs).
pub fn runc_version(binary: &str, spawner: &Spawner) -> Result<RuncVersion> {
    static SEEN: std::sync::LazyLock<Mutex<HashMap<PathBuf, RuncVersion>>> =
        std::sync::LazyLock::new(Mutex::default);
    let path = resolve_binary(binary);
    if let Some(v) = SEEN.locked().get(&path) {
        return Ok(v.clone());
    }
    let mut cmd = Command::new(&path);
    cmd.arg("--version");
    let out = spawner
        .output(&mut cmd, None, Duration::from_secs(10))
        .with_context(|| format!("run {} --version", path.display()))?;
    if out.status != 0 {
        return Err(Error::internal(format!(
            "{} --version exited with status {}: {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v = RuncVersion::parse(&String::from_utf8_lossy(&out.stdout));
    SEEN.locked().insert(path, v.clone());
    Ok(v)
}

/// Refuses a user-namespaced pod when `binary` (the pod's runc) is older than
/// [`USERNS_MIN_RUNC`], with an error that names the version found.
pub fn check_userns_runc(binary: &str, spawner: &Spawner) -> Result<()> {
    let v = runc_version(binary, spawner)?;
    userns_runc_verdict(&resolve_binary(binary), &v)
}

fn userns_runc_verdict(path: &Path, v: &RuncVersion) -> Result<()> {
    let (major, minor) = USERNS_MIN_RUNC;
    match v.number {
        Some((a, b, _)) if (a, b) >= (major, minor) => Ok(()),
        _ => Err(Error::precondition(format!(
            "user-namespaced pods (userns_options mode POD) need runc >= {major}.{minor} \
             (idmapped mounts); {} is {:?}",
            path.display(),
            v.line
        ))),
    }
}

/// How long one runc invocation may take before it is killed (waiting for its console
/// included).
const RUNC_TIMEOUT: Duration = Duration::from_secs(120);

/// The real runtime: the runc CLI.
pub struct Runc {
    config: RuncConfig,
    spawner: Spawner,
    /// Directory for console sockets (short, root-only: socket paths are limited to 108 bytes).
    socket_dir: PathBuf,
    /// [`RUNC_TIMEOUT`], shorter in tests.
    timeout: Duration,
}

static CONSOLE_SEQ: AtomicU64 = AtomicU64::new(0);

impl Runc {
    pub fn new(config: RuncConfig, spawner: Spawner, socket_dir: PathBuf) -> Self {
        Runc {
            config,
            spawner,
            socket_dir,
            timeout: RUNC_TIMEOUT,
        }
    }

    /// The same runtime with another bound on each runc invocation.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn command(&self, log: Option<&Path>) -> Command {
        let mut cmd = Command::new(resolve_binary(&self.config.binary));
        cmd.arg("--root").arg(&self.config.root);
        if let Some(log) = log {
            cmd.arg("--log").arg(log).args(["--log-format", "json"]);
        }
        if self.config.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        // runc would otherwise notify systemd for the container.
        cmd.env_remove("NOTIFY_SOCKET");
        cmd
    }

    /// Runs a short runc command and maps a failure to an error naming `what`.
    fn run(&self, what: &str, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>> {
        let mut cmd = self.command(None);
        cmd.args(args);
        let out = self
            .spawner
            .output(&mut cmd, input, self.timeout)
            .with_context(|| format!("run {} {what}", self.config.binary))?;
        if out.status != 0 {
            return Err(classify(
                what,
                &String::from_utf8_lossy(&out.stderr),
                out.status,
            ));
        }
        Ok(out.stdout)
    }

    /// Runs runc create/exec, which hand stdio to the new process and may send a console.
    /// `log` is runc's JSON log for this invocation (execs run in parallel: each has its own).
    fn spawn_process(
        &self,
        what: &str,
        bundle: &Path,
        log: &Path,
        args: Vec<String>,
        terminal: bool,
        io: ProcessIo,
    ) -> Result<Spawned> {
        let pid_file = bundle.join(format!("{}.pid", what.replace(' ', "-")));
        let _ = std::fs::remove_file(&pid_file);
        let mut cmd = self.command(Some(log));
        cmd.args(&args[..1]).arg("--pid-file").arg(&pid_file);
        let console = if terminal {
            std::fs::create_dir_all(&self.socket_dir).context("create console socket dir")?;
            let path = self.socket_dir.join(format!(
                "pty-{}-{}",
                std::process::id(),
                CONSOLE_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path)
                .with_context(|| format!("bind console socket {}", path.display()))?;
            cmd.arg("--console-socket").arg(&path);
            Some((path, listener))
        } else {
            None
        };
        cmd.args(&args[1..]);
        cmd.stdin(io.stdin.map(Stdio::from).unwrap_or_else(Stdio::null));
        cmd.stdout(io.stdout.map(Stdio::from).unwrap_or_else(Stdio::null));
        cmd.stderr(io.stderr.map(Stdio::from).unwrap_or_else(Stdio::null));
        let result = self.spawn_and_collect(what, cmd, console.as_ref().map(|(_, l)| l), log);
        if let Some((path, _)) = console {
            let _ = std::fs::remove_file(path);
        }
        let master = result?;
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("{what}: read pid file {}", pid_file.display()))?
            .trim()
            .parse::<i32>()
            .map_err(|e| {
                Error::internal(format!("{what}: bad pid file {}: {e}", pid_file.display()))
            })?;
        let _ = std::fs::remove_file(&pid_file);
        Ok(Spawned {
            pid,
            console: master,
        })
    }

    fn spawn_and_collect(
        &self,
        what: &str,
        mut cmd: Command,
        console: Option<&UnixListener>,
        log: &Path,
    ) -> Result<Option<File>> {
        let mut child = self
            .spawner
            .spawn(&mut cmd)
            .with_context(|| format!("{what}: spawn {}", self.config.binary))?;
        // The Command holds the stdio fds: close our copies now so that only the container
        // keeps the write ends (EOF for readers depends on it).
        drop(cmd);
        let deadline = Instant::now() + self.timeout;
        let mut master = None;
        if let Some(listener) = console {
            master = match receive_console(listener, &mut child, deadline) {
                Ok(m) => m,
                Err(e) => {
                    // Killed and reaped here: nothing of this runc outlives the failed call.
                    child.kill();
                    let _ = child.wait(Some(Duration::from_secs(5)));
                    return Err(e.context(what));
                }
            };
        }
        let status = match child.wait(Some(deadline.saturating_duration_since(Instant::now()))) {
            Ok(Some(s)) => s,
            Ok(None) => {
                child.kill();
                let _ = child.wait(Some(Duration::from_secs(5)));
                return Err(Error::internal(format!(
                    "{what}: runc timed out after {:?}",
                    self.timeout
                )));
            }
            Err(e) => return Err(Error::from(e).context(what)),
        };
        if status != 0 {
            let msg = last_log_error(log).unwrap_or_else(|| format!("exit status {status}"));
            return Err(classify(what, &msg, status));
        }
        Ok(master)
    }
}

/// Accepts runc's connection on the console socket and receives the pty master (SCM_RIGHTS),
/// while watching runc so that a failing runc does not leave us waiting, and never past
/// `deadline`: neither the accept nor the receive blocks (a runc that connects and then sends
/// nothing used to hold the Start, and every call queued behind it, for ever).
fn receive_console(
    listener: &UnixListener,
    child: &mut crate::shim::reaper::Child,
    deadline: Instant,
) -> Result<Option<File>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let _blocked = crate::shim::blocking::blocking();
    listener.set_nonblocking(true).context("console socket")?;
    // Whether runc has ended is read before each attempt, not after: a connection or a
    // console sent just before runc exited is still taken by the attempt that follows.
    let stream = loop {
        let exited = child.try_wait()?.is_some();
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if exited {
                    return Ok(None); // runc failed before sending; its status tells why
                }
                if Instant::now() >= deadline {
                    return Err(Error::internal(
                        "timed out waiting for runc to connect to the console socket",
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::from(e).context("accept console socket")),
        }
    };
    // Accepted sockets do not inherit O_NONBLOCK on Linux; MSG_DONTWAIT needs no flag change.
    let mut buf = [0u8; 4096];
    loop {
        let exited = child.try_wait()?.is_some();
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        match recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(msg) => {
                // Every descriptor received is owned at once: the first is the master, any
                // other is closed here.
                let mut fds: Vec<OwnedFd> = Vec::new();
                for c in msg.cmsgs().context("receive console fd")? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: received through SCM_RIGHTS just now; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                return match fds.into_iter().next() {
                    Some(fd) => Ok(Some(File::from(fd))),
                    None => Err(Error::internal("runc sent no console fd")),
                };
            }
            Err(nix::Error::EAGAIN) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(Error::from(e).context("receive console fd")),
        }
        if exited {
            return Ok(None); // runc ended after connecting; its status tells why
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::internal(
                "timed out waiting for runc to send the console: it connected to the console \
                 socket and sent nothing",
            ));
        }
        let wait = left.min(Duration::from_millis(20));
        let mut pfd = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&stream),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(wait.as_millis()).unwrap_or(20);
        match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(ms)) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(Error::from(e).context("wait for the console fd")),
        }
    }
}

/// The message of the last error line in runc's JSON log (`{"level":"error","msg":...}`).
fn last_log_error(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("level")?.as_str()? == "error" {
            Some(v.get("msg")?.as_str()?.to_string())
        } else {
            None
        }
    })
}

/// Turns runc's failure text into an error of the right kind. The one place that reads runc's
/// wording: "does not exist" and finished processes are NotFound, the rest Internal.
pub fn classify(what: &str, stderr: &str, status: i32) -> Error {
    let text = stderr.trim();
    let text = if text.is_empty() {
        format!("exit status {status}")
    } else {
        text.to_string()
    };
    let lower = text.to_ascii_lowercase();
    let msg = format!("runc {what}: {text}");
    if lower.contains("does not exist")
        || lower.contains("not exist") && lower.contains("container")
    {
        Error::not_found(msg)
    } else if lower.contains("process already finished")
        || lower.contains("container not running")
        || lower.contains("no such process")
    {
        Error::not_found(format!("runc {what}: process already finished"))
    } else {
        Error::internal(msg)
    }
}

impl Runtime for Runc {
    fn create(&self, id: &str, bundle: &Path, terminal: bool, io: ProcessIo) -> Result<Spawned> {
        let _ = std::fs::remove_file(bundle.join("log.json"));
        // The options' flags as containerd's runc shim gives them (go-runc's CreateOpts); runc
        // takes its flags in any order before the ID.
        let mut args = vec!["create".to_string()];
        if self.config.no_pivot_root {
            args.push("--no-pivot".into());
        }
        if self.config.no_new_keyring {
            args.push("--no-new-keyring".into());
        }
        args.extend(["--bundle".into(), bundle.display().to_string(), id.into()]);
        self.spawn_process(
            "create",
            bundle,
            &bundle.join("log.json"),
            args,
            terminal,
            io,
        )
    }

    fn start(&self, id: &str) -> Result<()> {
        self.run("start", &["start", id], None).map(drop)
    }

    fn exec(
        &self,
        id: &str,
        bundle: &Path,
        exec_id: &str,
        process_json: &[u8],
        terminal: bool,
        io: ProcessIo,
    ) -> Result<Spawned> {
        let spec = bundle.join(format!("exec-{exec_id}.json"));
        crate::shim::util::write_file_atomic(&spec, process_json, 0o600)
            .context("write exec process spec")?;
        let args = vec![
            "exec".into(),
            "--process".into(),
            spec.display().to_string(),
            "--detach".into(),
            id.into(),
        ];
        // Its own log: execs of one container run in parallel, and the error one reports
        // must be its own runc's.
        let log = bundle.join(format!("exec-{exec_id}-log.json"));
        let _ = std::fs::remove_file(&log);
        let r = self.spawn_process(&format!("exec {exec_id}"), bundle, &log, args, terminal, io);
        let _ = std::fs::remove_file(&spec);
        let _ = std::fs::remove_file(&log);
        r
    }

    fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, &sig]);
        self.run("kill", &args, None).map(drop)
    }

    fn delete(&self, id: &str, force: bool) -> Result<()> {
        let args: &[&str] = if force {
            &["delete", "--force", id]
        } else {
            &["delete", id]
        };
        self.run("delete", args, None).map(drop)
    }

    fn pause(&self, id: &str) -> Result<()> {
        self.run("pause", &["pause", id], None).map(drop)
    }

    fn resume(&self, id: &str) -> Result<()> {
        self.run("resume", &["resume", id], None).map(drop)
    }

    fn ps(&self, id: &str) -> Result<Vec<i32>> {
        let out = self.run("ps", &["ps", "--format", "json", id], None)?;
        // runc prints `null` for an empty list.
        let pids: Option<Vec<i32>> = serde_json::from_slice(&out)
            .map_err(|e| Error::internal(format!("runc ps: bad output: {e}")))?;
        Ok(pids.unwrap_or_default())
    }

    fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        self.run(
            "update",
            &["update", "--resources", "-", id],
            Some(resources_json),
        )
        .map(drop)
    }

    fn check_placement(&self, id: &str, pid: i32) -> Result<()> {
        let joined = crate::host::placement::runc_cgroup_paths(&self.config.root, id)?;
        crate::host::placement::check(pid, &joined)
    }
}

#[cfg(test)]
mod tests;
