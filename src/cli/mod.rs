//! Entry point: containerd's shim flags and the three ways the binary runs.
//!
//! - `start`: containerd asks for a shim. We bind the socket here (0600, in a root-only
//!   directory, never abstract), start the daemon with the listening socket as fd 3 and no
//!   stdio (containerd reads our combined output until it closes), and print the bootstrap
//!   reply (`{"version":3,...}`; containerd 2.3's protobuf handshake is spoken by the
//!   containerd-shim crate, which parses flags and stdin for `start`, `delete` and `-info`).
//! - `delete`: clean up one ID from its bundle alone, after the daemon is gone.
//! - serve (no action): the daemon, see [`crate::daemon`].

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use containerd_shim::api::DeleteResponse;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Config, Flags, Shim, StartOpts};

use crate::bundle::{CONFIG_FILE, LISTENER_FD, OPTIONS_FILE, RUNTIME_ID, SHIM_PID_FILE};

/// Runs the binary.
pub fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let flags = match containerd_shim::parse(&args[1..]) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{RUNTIME_ID}: {e}");
            std::process::exit(2);
        }
    };
    if flags.version {
        println!(
            "containerd-shim-rsandbox-v1:\n  Version: {}\n  Runtime: {RUNTIME_ID}",
            env!("CARGO_PKG_VERSION")
        );
        return;
    }
    if flags.action.is_empty() && !flags.info {
        let code = match crate::daemon::serve(&flags) {
            Ok(()) => 0,
            Err(e) => {
                log::error!("shim failed: {e}");
                eprintln!("{RUNTIME_ID}: {e}");
                1
            }
        };
        std::process::exit(code);
    }
    // The daemon reaps through its own monitor; start/delete wait for their children directly.
    let config = Config {
        no_setup_logger: true,
        no_reaper: true,
        no_sub_reaper: true,
        ..Default::default()
    };
    containerd_shim::run::<Launcher>(RUNTIME_ID, Some(config));
}

/// `start` and `delete` for the containerd-shim crate's `run`.
pub struct Launcher {
    namespace: String,
    id: String,
    bundle: PathBuf,
    debug: bool,
}

/// Never served: the daemon has its own server (see [`crate::daemon`]).
pub struct Unused;
impl containerd_shim::Task for Unused {}

impl Shim for Launcher {
    type T = Unused;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        let bundle = if args.bundle.is_empty() {
            std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
        } else {
            PathBuf::from(&args.bundle)
        };
        Launcher {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            bundle,
            debug: args.debug,
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        start(&opts, &self.bundle, self.debug)
            .map_err(|e| containerd_shim::Error::Other(e.to_string()))
    }

    fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        let res = crate::cleanup::delete_from_bundle(&self.namespace, &self.id, &self.bundle);
        Ok(DeleteResponse {
            pid: res.pid,
            exit_status: 137,
            exited_at: MessageField::some(crate::util::timestamp(std::time::SystemTime::now())),
            ..Default::default()
        })
    }

    fn wait(&mut self) {}

    fn create_task_service(&self, _publisher: RemotePublisher) -> Self::T {
        Unused
    }
}

/// The grouping key of a bundle: the CRI sandbox ID of a container spec, else the ID itself.
/// With bootstrap version 3 containerd reuses a sandbox's shim itself; grouping only matters
/// to a client that runs `start` per container (bootstrap v2 behaviour).
fn grouping(bundle: &Path, id: &str) -> String {
    let Ok(raw) = std::fs::read(bundle.join(CONFIG_FILE)) else {
        return id.to_string();
    };
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&raw) else {
        return id.to_string();
    };
    spec.pointer("/annotations/io.kubernetes.cri.sandbox-id")
        .and_then(|v| v.as_str())
        .filter(|s| crate::validate::id("sandbox id", s).is_ok())
        .unwrap_or(id)
        .to_string()
}

fn start(opts: &StartOpts, bundle: &Path, debug: bool) -> crate::error::Result<String> {
    use crate::error::Context;
    crate::validate::id("shim id", &opts.id)?;
    // A broken config file fails here, where containerd shows the message to the user.
    crate::config::ShimConfig::load()?;
    let address = opts.socket_address(&grouping(bundle, &opts.id));
    let path = PathBuf::from(address.trim_start_matches("unix://"));
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Ok(address); // that shim is alive and serves this group
        }
        let _ = std::fs::remove_file(&path);
    }
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("create {}", dir.display()))?;
    }
    // umask makes the socket 0600 from the moment it exists.
    // SAFETY: umask only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(&path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound.with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .context("chmod socket")?;
    if let Some(any) = opts
        .extensions
        .iter()
        .find(|a| a.type_url.ends_with("Options"))
    {
        let data = protobuf::Message::write_to_bytes(any).unwrap_or_default();
        crate::util::write_file_atomic(&bundle.join(OPTIONS_FILE), &data, 0o600)
            .context("save runtime options")?;
    }
    let exe = std::env::current_exe().context("find own executable")?;
    let mut cmd = Command::new(exe);
    cmd.current_dir(bundle)
        .args([
            "-namespace",
            &opts.namespace,
            "-id",
            &opts.id,
            "-address",
            &opts.address,
            "-socket",
            &address,
        ])
        .env("TTRPC_ADDRESS", &opts.ttrpc_address)
        // One malloc arena: the daemon's threads mostly sleep; per-thread arenas only cost memory.
        .env("MALLOC_ARENA_MAX", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if debug {
        cmd.arg("-debug");
    }
    let fd = listener.as_raw_fd();
    // SAFETY: between fork and exec the closure only calls dup2 and fcntl, which are
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let target = LISTENER_FD;
            // dup2 clears FD_CLOEXEC on the copy, so the daemon inherits exactly fd 3; when the
            // listener already is fd 3, dup2 does nothing and the flag is cleared by hand.
            let r = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("start the shim daemon")?;
    crate::util::write_file_atomic(
        &bundle.join(SHIM_PID_FILE),
        child.id().to_string().as_bytes(),
        0o600,
    )
    .context("write shim.pid")?;
    let _ = std::io::stderr().flush();
    Ok(address)
}
