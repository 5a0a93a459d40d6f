//! Entry point: containerd's shim command line and the ways the binary runs.
//!
//! - `-v`: the version.
//! - `-info`: what this runtime and its runc support, see [`info`].
//! - `start`: the handshake ([`bootstrap`]: containerd 2.0 to 2.2 and 2.3's protocols), then
//!   the socket and the daemon ([`start`]), `ShimCgroup` included ([`shim_cgroup`]).
//! - `delete`: clean up one ID from its bundle alone, after the daemon is gone
//!   ([`crate::cli::cleanup`]); prints a protobuf `DeleteResponse`.
//! - `check`: the node preflight for people and installers ([`check`]); containerd never
//!   runs it.
//! - `unit`: systemd over D-Bus for the node installer: a `systemctl` subset and a command
//!   run on the host as a transient service ([`unit`]); containerd never runs it.
//! - no action: the daemon, see [`crate::server::daemon`].
//!
//! Everything `start` and `delete` print on stdout is their reply: containerd reads it (for
//! `start`, stdout and stderr combined). Errors go to stderr with exit status 1.
//!
//! Layer rule: the top layer, it may import every layer below it. `hack/check-cycles.sh`
//! checks that nothing below imports it.

pub mod bootstrap;
pub mod check;
pub mod cleanup;
pub mod info;
pub mod shim_cgroup;
pub mod start;
pub mod unit;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use containerd_shim_protos::api::DeleteResponse;
use protobuf::{Message, MessageField};

use crate::records::bundle::RUNTIME_ID;
use crate::records::error::{Context, Error, Result};
use crate::records::flags::{self, FlagError, Flags};

/// Runs the binary.
pub fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let flags = match flags::parse(&args) {
        Ok(f) => f,
        Err(FlagError::Help) => {
            eprint!("{}", flags::USAGE);
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{RUNTIME_ID}: {e}");
            eprint!("{}", flags::USAGE);
            std::process::exit(2);
        }
    };
    if flags.version {
        // containerd's shims name themselves by argv[0]'s base name.
        let argv0 = std::env::args_os().next().map(PathBuf::from);
        let name = argv0
            .as_deref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "containerd-shim-rsandbox-v1".into());
        print!("{}", crate::records::version::text(&name));
        return;
    }
    let result = if flags.info {
        run_info()
    } else {
        match flags.action.as_str() {
            "" => crate::server::daemon::serve(&flags)
                .inspect_err(|e| log::error!("shim failed: {e}")),
            "start" => run_start(&flags),
            "delete" => run_delete(&flags),
            "check" => std::process::exit(check::main(&flags.args)),
            "unit" => std::process::exit(unit::main(&flags.args)),
            other => Err(Error::invalid(format!(
                "unknown action {other:?} (want start, delete, check or unit)"
            ))),
        }
    };
    if let Err(e) = result {
        eprintln!("{RUNTIME_ID}: {e}");
        std::process::exit(1);
    }
}

/// The bundle: `-bundle`, else the working directory (containerd runs us in it).
fn bundle(flags: &Flags) -> Result<PathBuf> {
    if flags.bundle.is_empty() {
        std::env::current_dir().context("getcwd")
    } else {
        Ok(PathBuf::from(&flags.bundle))
    }
}

fn require_namespace(flags: &Flags) -> Result<()> {
    if flags.namespace.is_empty() {
        return Err(Error::invalid("shim namespace cannot be empty"));
    }
    Ok(())
}

fn write_stdout(data: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(data).context("write stdout")?;
    out.flush().context("flush stdout")
}

fn run_info() -> Result<()> {
    let input = bootstrap::read_stdin().context("read runtime options from stdin")?;
    let info = info::runtime_info(&input, std::env::var_os("PATH").as_deref())?;
    write_stdout(&info.write_to_bytes()?)
}

fn run_start(flags: &Flags) -> Result<()> {
    require_namespace(flags)?;
    let input = bootstrap::read_stdin().context("read bootstrap params from stdin")?;
    let params = bootstrap::parse_start(&input, flags, &bootstrap::Env::from_process())?;
    // A broken config file fails here, where containerd shows the message to the user.
    crate::records::config::ShimConfig::load()?;
    let exe = std::env::current_exe().context("find own executable")?;
    // The host's cgroup mounts (the mount table) are read only for a ShimCgroup option.
    let address = start::start(&params, &bundle(flags)?, &exe, shim_cgroup::Host::system)?;
    write_stdout(&bootstrap::encode_reply(&address, params.protocol))
}

fn run_delete(flags: &Flags) -> Result<()> {
    require_namespace(flags)?;
    let bundle = bundle(flags)?;
    if flags.debug {
        // The daemon's log fifo, while containerd still reads it: `delete`'s step timings land
        // in containerd's log next to the daemon's lines. No reader: no log.
        let _ = crate::shim::logger::init(
            &bundle.join(crate::records::bundle::LOG_FIFO),
            true,
            &flags.namespace,
            &flags.id,
        );
    }
    let res = crate::cli::cleanup::delete_from_bundle(&flags.namespace, &flags.id, &bundle);
    let response = DeleteResponse {
        pid: res.pid,
        // As containerd-shim-runc-v2's Stop: 128 + SIGKILL.
        exit_status: 137,
        exited_at: MessageField::some(crate::shim::util::timestamp(std::time::SystemTime::now())),
        ..Default::default()
    };
    write_stdout(&response.write_to_bytes()?)
}
