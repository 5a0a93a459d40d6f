//! `containerd-shim-rsandbox-v1 unit`: the few `systemctl` commands the node installer
//! (deploy/node/lib/unit.sh, lib/rollout.sh) runs on containerd's unit, and a command run on
//! the host as a transient service (the installer's `--host-exec`), through systemd's D-Bus
//! API ([`crate::host::systemd::unit`]) instead of the host's `systemctl` binary in the host's
//! namespaces. The installer's pod then needs systemd's socket, not the host's `/`, its PID 1
//! or `nsenter`.
//!
//! The `systemctl` subset keeps `systemctl`'s syntax, output and exit statuses (systemctl(1):
//! `is-active` exits 0 for an active unit and 3 otherwise, printing the state), so the
//! installer's `SYSTEMCTL` seam takes either.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::host::systemd::manager::{Endpoints, Manager, SystemdError};

/// `unit`'s usage (`unit -h`).
pub const USAGE: &str = "\
Usage: containerd-shim-rsandbox-v1 unit [-socket PATH] [-timeout SECONDS] COMMAND
systemd over D-Bus, as root (the system bus, else systemd's private socket /run/systemd/private):
  show --property MainPID --value UNIT   the service's main PID (0: none)
  show --property LoadState --value UNIT the unit's LoadState (loaded, not-found, masked ...)
  is-active [--quiet] UNIT               prints the unit's ActiveState; exit 0 active, 3 not
  restart [--no-block] UNIT              RestartUnit; waits for its job unless --no-block
  reset-failed UNIT                      ResetFailedUnit
  run [-host-root DIR] -output-dir DIR -- COMMAND [ARG...]
                                         COMMAND run on the host once, as a transient service
                                         of systemd's; its output is passed through files in
                                         DIR (a host path, seen here under -host-root), its
                                         exit status is this command's
  -socket PATH    systemd's private socket only (no system bus)
  -timeout S      bound of the whole command (default 300)
Exit status: as systemctl's (0, 1 failed, 3 not active), 2 usage; run: COMMAND's.
";

/// Exit statuses (systemctl's: 1 a failure, 3 `is-active` of a unit that is not active).
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NOT_ACTIVE: i32 = 3;

/// A parsed `unit` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub socket: Option<PathBuf>,
    pub timeout: Duration,
    pub command: Command,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    MainPid(String),
    LoadState(String),
    IsActive {
        unit: String,
        quiet: bool,
    },
    Restart {
        unit: String,
        wait: bool,
    },
    ResetFailed(String),
    Run {
        host_root: PathBuf,
        output_dir: String,
        argv: Vec<String>,
    },
    Help,
}

/// Why a command line was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct UsageError(String);

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// `name`'s value: `--name=V`/`-name=V` or the next argument.
fn value_of(
    arg: &str,
    names: &[&str],
    rest: &mut std::slice::Iter<'_, String>,
) -> Option<Result<String, UsageError>> {
    for n in names {
        if arg == *n {
            return Some(
                rest.next()
                    .cloned()
                    .ok_or_else(|| usage(format!("{n} needs a value"))),
            );
        }
        if let Some(v) = arg.strip_prefix(n).and_then(|v| v.strip_prefix('=')) {
            return Some(Ok(v.to_string()));
        }
    }
    None
}

impl Invocation {
    pub fn parse(args: &[String]) -> Result<Invocation, UsageError> {
        let mut socket = None;
        let mut timeout = Duration::from_secs(300);
        let mut it = args.iter();
        let verb = loop {
            let Some(a) = it.next() else {
                return Err(usage("no command"));
            };
            if matches!(a.as_str(), "-h" | "-help" | "--help") {
                return Ok(Invocation {
                    socket,
                    timeout,
                    command: Command::Help,
                });
            }
            if let Some(v) = value_of(a, &["-socket", "--socket"], &mut it) {
                socket = Some(PathBuf::from(v?));
            } else if let Some(v) = value_of(a, &["-timeout", "--timeout"], &mut it) {
                let v = v?;
                timeout = match v.parse::<u64>() {
                    Ok(s @ 1..=3600) => Duration::from_secs(s),
                    _ => {
                        return Err(usage(format!(
                            "-timeout {v:?}: want seconds from 1 to 3600"
                        )));
                    }
                };
            } else if a.starts_with('-') {
                return Err(usage(format!("unknown flag {a:?}")));
            } else {
                break a.as_str();
            }
        };
        let command = match verb {
            "show" => {
                let (mut property, mut value, mut unit) = (None, false, None);
                while let Some(a) = it.next() {
                    if let Some(v) = value_of(a, &["--property", "-p"], &mut it) {
                        property = Some(v?);
                    } else if a == "--value" {
                        value = true;
                    } else {
                        unit = Some(one_unit(unit, a)?);
                    }
                }
                // the forms the installer uses; anything else is refused, not guessed
                let unit = || unit.clone().ok_or_else(|| usage("show: no unit"));
                match (property.as_deref(), value) {
                    (Some("MainPID"), true) => Command::MainPid(unit()?),
                    (Some("LoadState"), true) => Command::LoadState(unit()?),
                    _ => {
                        return Err(usage(
                            "show: only `show --property MainPID|LoadState --value UNIT`",
                        ));
                    }
                }
            }
            "is-active" => {
                let (mut quiet, mut unit) = (false, None);
                for a in it.by_ref() {
                    match a.as_str() {
                        "--quiet" | "-q" => quiet = true,
                        _ => unit = Some(one_unit(unit, a)?),
                    }
                }
                Command::IsActive {
                    unit: unit.ok_or_else(|| usage("is-active: no unit"))?,
                    quiet,
                }
            }
            "restart" => {
                let (mut wait, mut unit) = (true, None);
                for a in it.by_ref() {
                    match a.as_str() {
                        "--no-block" => wait = false,
                        _ => unit = Some(one_unit(unit, a)?),
                    }
                }
                Command::Restart {
                    unit: unit.ok_or_else(|| usage("restart: no unit"))?,
                    wait,
                }
            }
            "reset-failed" => {
                let mut unit = None;
                for a in it.by_ref() {
                    unit = Some(one_unit(unit, a)?);
                }
                Command::ResetFailed(unit.ok_or_else(|| usage("reset-failed: no unit"))?)
            }
            "run" => {
                let (mut host_root, mut output_dir) = (PathBuf::from("/"), None);
                loop {
                    let Some(a) = it.next() else {
                        return Err(usage("run: no `-- COMMAND`"));
                    };
                    if a == "--" {
                        break;
                    } else if let Some(v) = value_of(a, &["-host-root", "--host-root"], &mut it) {
                        host_root = PathBuf::from(v?);
                    } else if let Some(v) = value_of(a, &["-output-dir", "--output-dir"], &mut it) {
                        output_dir = Some(v?);
                    } else {
                        return Err(usage(format!("run: unexpected {a:?} before `--`")));
                    }
                }
                let output_dir = output_dir.ok_or_else(|| usage("run: no -output-dir"))?;
                if !output_dir.starts_with('/') {
                    return Err(usage(
                        "run: -output-dir must be an absolute path (the host's)",
                    ));
                }
                let argv: Vec<String> = it.by_ref().cloned().collect();
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(usage("run: no command after `--`"));
                }
                Command::Run {
                    host_root,
                    output_dir,
                    argv,
                }
            }
            other => return Err(usage(format!("unknown command {other:?}"))),
        };
        if let Some(extra) = it.next() {
            return Err(usage(format!("unexpected argument {extra:?}")));
        }
        Ok(Invocation {
            socket,
            timeout,
            command,
        })
    }

    fn endpoints(&self) -> Endpoints {
        match &self.socket {
            Some(p) => Endpoints {
                private: p.clone(),
                system_bus: Err("-socket: the private socket only".into()),
            },
            None => Endpoints::of_node(),
        }
    }
}

fn one_unit(seen: Option<String>, a: &str) -> Result<String, UsageError> {
    if a.starts_with('-') {
        return Err(usage(format!("unknown option {a:?}")));
    }
    match seen {
        Some(u) => Err(usage(format!("one unit only ({u:?}, then {a:?})"))),
        None => Ok(a.to_string()),
    }
}

/// What a command printed and its exit status.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub code: i32,
}

/// Runs `command` on `manager`.
pub fn execute(
    manager: &mut Manager,
    command: &Command,
    deadline: Instant,
) -> Result<Outcome, SystemdError> {
    let mut out = Outcome::default();
    match command {
        Command::Help => out.stdout = USAGE.into(),
        Command::MainPid(unit) => {
            out.stdout = format!("{}\n", manager.main_pid(unit, deadline)?).into()
        }
        Command::LoadState(unit) => {
            out.stdout = format!("{}\n", manager.load_state(unit, deadline)?).into()
        }
        Command::IsActive { unit, quiet } => {
            let state = manager.active_state(unit, deadline)?;
            if !quiet {
                out.stdout = format!("{state}\n").into();
            }
            // systemctl's is-active: active or reloading (src/systemctl/systemctl-is-active.c)
            if !matches!(state.as_str(), "active" | "reloading" | "refreshing") {
                out.code = EXIT_NOT_ACTIVE;
            }
        }
        Command::Restart { unit, wait } => manager.restart_unit(unit, *wait, deadline)?,
        Command::ResetFailed(unit) => manager.reset_failed_unit(unit, deadline)?,
        Command::Run {
            host_root,
            output_dir,
            argv,
        } => {
            return run_on_host(manager, host_root, output_dir, argv, deadline);
        }
    }
    Ok(out)
}

/// `run`: the transient service's output files go into a directory of root's, made here with
/// mode 0700 (systemd creates the files themselves when it starts the command); they are read
/// back and removed.
fn run_on_host(
    manager: &mut Manager,
    host_root: &Path,
    output_dir: &str,
    argv: &[String],
    deadline: Instant,
) -> Result<Outcome, SystemdError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let name = format!("rsandbox-node-run-{}-{nanos}", std::process::id());
    let host_file = |ext: &str| format!("{}/{name}.{ext}", output_dir.trim_end_matches('/'));
    let here = |host: &str| host_root.join(host.trim_start_matches('/'));
    let local_err = |step: &str, e: std::io::Error| SystemdError::Call {
        step: step.to_string(),
        source: crate::host::systemd::conn::DbusError::Io {
            step: "output file",
            source: e,
        },
    };
    let dir = here(output_dir);
    std::fs::create_dir_all(&dir).map_err(|e| local_err(&format!("mkdir {}", dir.display()), e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| local_err(&format!("chmod {}", dir.display()), e))?;
    }
    let (out_host, err_host) = (host_file("out"), host_file("err"));
    let result = manager.run_command(
        &format!("{name}.service"),
        argv,
        &out_host,
        &err_host,
        deadline,
    );
    let stdout = std::fs::read(here(&out_host)).unwrap_or_default();
    let stderr = std::fs::read(here(&err_host)).unwrap_or_default();
    let _ = std::fs::remove_file(here(&out_host));
    let _ = std::fs::remove_file(here(&err_host));
    let ended = result?;
    Ok(Outcome {
        stdout,
        stderr,
        code: ended.code(),
    })
}

/// Runs `unit` with its arguments; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let inv = match Invocation::parse(args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("containerd-shim-rsandbox-v1 unit: {e}");
            eprint!("{USAGE}");
            return EXIT_USAGE;
        }
    };
    if inv.command == Command::Help {
        print!("{USAGE}");
        return 0;
    }
    let deadline = Instant::now() + inv.timeout;
    let result = Manager::connect(&inv.endpoints(), deadline)
        .and_then(|mut m| execute(&mut m, &inv.command, deadline));
    match result {
        Ok(out) => {
            let _ = std::io::stdout().write_all(&out.stdout);
            let _ = std::io::stderr().write_all(&out.stderr);
            out.code
        }
        Err(e) => {
            eprintln!("containerd-shim-rsandbox-v1 unit: {e}");
            EXIT_FAILED
        }
    }
}

#[cfg(test)]
#[path = "unit_tests.rs"]
mod tests;
