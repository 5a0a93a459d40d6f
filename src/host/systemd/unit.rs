//! One unit of the node's, for the node installer (`containerd-shim-rsandbox-v1 unit`): its
//! restart, its state and main PID, and a command run once as a transient service, all through
//! systemd's manager API (org.freedesktop.systemd1(5): `RestartUnit(in s name, in s mode, out
//! o job)`, `GetUnit(in s name, out o unit)`, `LoadUnit(in s name, out o unit)`,
//! `ResetFailedUnit(in s name)`,
//! `StartTransientUnit(in s name, in s mode, in a(sv) properties, in a(sa(sv)) aux, out o
//! job)`; the unit's `ActiveState` (`org.freedesktop.systemd1.Unit`) and a service's
//! `MainPID`, `ExecMainCode`, `ExecMainStatus` (`org.freedesktop.systemd1.Service`) read with
//! `org.freedesktop.DBus.Properties.Get(in s interface, in s property, out v value)`).
//!
//! What `systemctl` would do as root, without its binary, the host's file system or its
//! namespaces: the installer's pod reaches systemd through its private socket alone.

use std::time::Instant;

use super::conn::DbusError;
use super::manager::{Manager, NO_SUCH_UNIT, SystemdError};
use super::wire::{Message, Value};

const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";

type SResult<T> = std::result::Result<T, SystemdError>;

/// How a command run as a transient service ended (`ExecMainCode`, a `CLD_*` code of
/// waitid(2), and `ExecMainStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `CLD_EXITED`: its exit status (systemd's own, 200 and up, when it could not run it:
    /// 203 = the binary could not be executed, systemd.exec(5) "Process Exit Codes").
    Exited(i32),
    /// `CLD_KILLED`/`CLD_DUMPED`: the signal.
    Signal(i32),
}

impl Ended {
    /// As a shell reports it: the status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(s) => s,
            Ended::Signal(s) => 128 + s,
        }
    }
}

/// CLD_EXITED, CLD_KILLED, CLD_DUMPED (Linux's include/uapi/asm-generic/siginfo.h).
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
const CLD_DUMPED: i32 = 3;

impl Manager {
    /// `RestartUnit(name, "replace")`: with `wait`, also its job's end (`done`, else
    /// [`SystemdError::JobFailed`]), as `systemctl restart`; without, as `--no-block`.
    pub fn restart_unit(&mut self, name: &str, wait: bool, deadline: Instant) -> SResult<()> {
        let args = [Value::Str(name.into()), Value::Str("replace".into())];
        if wait {
            return self.run_job(
                format!("RestartUnit {name}"),
                "RestartUnit",
                &args,
                deadline,
            );
        }
        self.conn
            .call(self.message("RestartUnit", &args), deadline, "call")
            .map(|_| ())
            .map_err(|source| SystemdError::Call {
                step: format!("RestartUnit {name}"),
                source,
            })
    }

    /// The unit's object path, `None` when systemd has not loaded it (`NoSuchUnit`).
    fn unit_path(&mut self, name: &str, deadline: Instant) -> SResult<Option<String>> {
        let step = || format!("GetUnit {name}");
        let reply = match self.conn.call(
            self.message("GetUnit", &[Value::Str(name.into())]),
            deadline,
            "call",
        ) {
            Ok(r) => r,
            Err(e) if e.remote_name() == Some(NO_SUCH_UNIT) => return Ok(None),
            Err(source) => {
                return Err(SystemdError::Call {
                    step: step(),
                    source,
                });
            }
        };
        match reply.body().ok().as_deref() {
            Some([Value::ObjectPath(p)]) => Ok(Some(p.clone())),
            _ => Err(not_shaped(step(), &reply, "o")),
        }
    }

    /// `Properties.Get(interface, property)` of the unit `name`; `None` when it is not loaded.
    fn unit_property(
        &mut self,
        name: &str,
        interface: &str,
        property: &str,
        deadline: Instant,
    ) -> SResult<Option<Value>> {
        let Some(path) = self.unit_path(name, deadline)? else {
            return Ok(None);
        };
        self.property_at(name, &path, interface, property, deadline)
    }

    /// `Properties.Get(interface, property)` of the unit `name` at object path `path`; `None`
    /// when it was unloaded meanwhile.
    fn property_at(
        &mut self,
        name: &str,
        path: &str,
        interface: &str,
        property: &str,
        deadline: Instant,
    ) -> SResult<Option<Value>> {
        let step = format!("Get {interface}.{property} of {name}");
        let get = Message::call(
            self.destination,
            path,
            "org.freedesktop.DBus.Properties",
            "Get",
            &[Value::Str(interface.into()), Value::Str(property.into())],
        );
        let reply = match self.conn.call(get, deadline, "call") {
            Ok(r) => r,
            // unloaded between the two calls (a transient unit collected)
            Err(e) if e.remote_name() == Some("org.freedesktop.DBus.Error.UnknownObject") => {
                return Ok(None);
            }
            Err(source) => return Err(SystemdError::Call { step, source }),
        };
        match reply.body().ok().as_deref() {
            Some([Value::Variant(v)]) => Ok(Some((**v).clone())),
            _ => Err(not_shaped(step, &reply, "v")),
        }
    }

    /// The unit's `ActiveState` (`active`, `reloading`, `inactive`, `failed`, `activating`,
    /// `deactivating`, ...); `inactive` for a unit systemd has not loaded, as `systemctl
    /// is-active` prints it.
    pub fn active_state(&mut self, name: &str, deadline: Instant) -> SResult<String> {
        match self.unit_property(name, UNIT_IFACE, "ActiveState", deadline)? {
            None => Ok("inactive".into()),
            Some(Value::Str(s)) => Ok(s),
            Some(other) => Err(wrong_type(name, "ActiveState", "s", &other)),
        }
    }

    /// The unit's `LoadState` (`loaded`, `not-found`, `masked`, `bad-setting`, `error`), as
    /// `systemctl show --property LoadState --value` prints it: the unit is loaded first
    /// (`LoadUnit`), as systemctl does, because a unit nothing holds (a oneshot that ran at
    /// boot, nodeadm-config.service) is not loaded and `GetUnit` would not find it.
    pub fn load_state(&mut self, name: &str, deadline: Instant) -> SResult<String> {
        let step = format!("LoadUnit {name}");
        let reply = self
            .conn
            .call(
                self.message("LoadUnit", &[Value::Str(name.into())]),
                deadline,
                "call",
            )
            .map_err(|source| SystemdError::Call {
                step: step.clone(),
                source,
            })?;
        let path = match reply.body().ok().as_deref() {
            Some([Value::ObjectPath(p)]) => p.clone(),
            _ => return Err(not_shaped(step, &reply, "o")),
        };
        match self.property_at(name, &path, UNIT_IFACE, "LoadState", deadline)? {
            None => Ok("not-found".into()),
            Some(Value::Str(s)) => Ok(s),
            Some(other) => Err(wrong_type(name, "LoadState", "s", &other)),
        }
    }

    /// The service's `MainPID`: 0 when it has no main process or is not loaded (`systemctl
    /// show --property MainPID --value` prints the same).
    pub fn main_pid(&mut self, name: &str, deadline: Instant) -> SResult<u32> {
        match self.unit_property(name, SERVICE_IFACE, "MainPID", deadline)? {
            None => Ok(0),
            Some(Value::U32(p)) => Ok(p),
            Some(other) => Err(wrong_type(name, "MainPID", "u", &other)),
        }
    }

    /// Runs `argv` (`argv[0]`: a path, or a name systemd looks up in its search path) once as
    /// the transient service `name`, with its standard output and error into the files
    /// `stdout` and `stderr` (paths of systemd's, truncated first), and waits for its end. A
    /// `Type=oneshot` service: its start job ends when the command has. `RemainAfterExit` keeps
    /// the ended unit loaded (active or failed) until its exit status has been read; then it is
    /// stopped and reset (unloaded). Errors: systemd refused or did not answer, or the unit
    /// was gone before its status could be read.
    pub fn run_command(
        &mut self,
        name: &str,
        argv: &[String],
        stdout: &str,
        stderr: &str,
        deadline: Instant,
    ) -> SResult<Ended> {
        let exec = Value::Array(
            "(sasb)".into(),
            vec![Value::Struct(vec![
                Value::Str(argv.first().cloned().unwrap_or_default()),
                Value::strings(argv),
                Value::Bool(false),
            ])],
        );
        let props = vec![
            (
                "Description".into(),
                Value::Str(format!("rsandbox node installer: {}", argv.join(" "))),
            ),
            ("Type".into(), Value::Str("oneshot".into())),
            ("RemainAfterExit".into(), Value::Bool(true)),
            ("StandardOutputFile".into(), Value::Str(stdout.into())),
            ("StandardErrorFile".into(), Value::Str(stderr.into())),
            ("ExecStart".into(), exec),
        ];
        let started = self.start_transient_unit(name, props, deadline);
        // A command that failed fails the start job (`failed`): its status is read all the same.
        if let Err(e) = &started
            && !matches!(e, SystemdError::JobFailed { .. })
        {
            return Err(started.unwrap_err());
        }
        let status = self.exec_main(name, deadline);
        // Unloaded either way: a stop of the active (exited) unit, a reset of the failed one.
        let stopped = self.stop_unit(name, deadline);
        let _ = self.reset_failed_unit(name, deadline);
        let ended = status?;
        stopped?;
        Ok(ended)
    }

    fn exec_main(&mut self, name: &str, deadline: Instant) -> SResult<Ended> {
        let gone = || SystemdError::Call {
            step: format!("read how {name} ended"),
            source: DbusError::Remote {
                name: NO_SUCH_UNIT.into(),
                message: "the unit was unloaded before its exit status was read".into(),
            },
        };
        let code = match self.unit_property(name, SERVICE_IFACE, "ExecMainCode", deadline)? {
            None => return Err(gone()),
            Some(Value::I32(c)) => c,
            Some(other) => return Err(wrong_type(name, "ExecMainCode", "i", &other)),
        };
        let status = match self.unit_property(name, SERVICE_IFACE, "ExecMainStatus", deadline)? {
            None => return Err(gone()),
            Some(Value::I32(s)) => s,
            Some(other) => return Err(wrong_type(name, "ExecMainStatus", "i", &other)),
        };
        match code {
            CLD_EXITED => Ok(Ended::Exited(status)),
            CLD_KILLED | CLD_DUMPED => Ok(Ended::Signal(status)),
            other => Err(SystemdError::Call {
                step: format!("read how {name} ended"),
                source: DbusError::Wire(super::wire::WireError(format!(
                    "ExecMainCode {other} (status {status}): the command did not end"
                ))),
            }),
        }
    }
}

fn not_shaped(step: String, reply: &Message, want: &str) -> SystemdError {
    SystemdError::Call {
        step,
        source: DbusError::Wire(super::wire::WireError(format!(
            "the reply's signature is {:?}, not {want:?}",
            reply.signature
        ))),
    }
}

fn wrong_type(unit: &str, property: &str, want: &str, got: &Value) -> SystemdError {
    SystemdError::Call {
        step: format!("Get {property} of {unit}"),
        source: DbusError::Wire(super::wire::WireError(format!(
            "the value is of type {:?}, not {want:?}",
            got.signature()
        ))),
    }
}
