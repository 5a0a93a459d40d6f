//! systemd's manager over D-Bus: start a transient unit, stop a unit, reset a failed one,
//! each waiting for its job's `JobRemoved` signal, as runc does through go-systemd.
//!
//! Two ways in, tried in order (the bus first, as runc's go-systemd does; the private socket
//! when the bus does not answer within half the deadline):
//! * the system bus (`DBUS_SYSTEM_BUS_ADDRESS` when set, as libdbus and go-systemd read it,
//!   else `/run/dbus/system_bus_socket`), where systemd is `org.freedesktop.systemd1`:
//!   `Hello` first, match rules for `JobRemoved` and for the bus daemon's `NameOwnerChanged`
//!   of systemd's name, systemd's unique name (`GetNameOwner`: only signals and replies from
//!   it count, any local user may send us one), and `Subscribe` (systemd only emits job
//!   signals on the bus while someone subscribed). `systemctl daemon-reexec` (a systemd
//!   package upgrade) takes systemd off the bus and back under a new unique name, keeping its
//!   jobs and its subscribers; `NameOwnerChanged` tells us the new name, so a job's end sent
//!   after the re-exec is still taken (go-systemd takes any sender's `JobRemoved`).
//! * systemd's private socket `/run/systemd/private` (root only). A direct connection: no
//!   bus daemon, no `Hello`, and systemd sends every manager signal to each of its direct
//!   connections unconditionally (`bus_foreach_bus` in systemd's `src/core/dbus.c`), so no
//!   `Subscribe` either. This is what `systemctl` uses as root.

use std::path::PathBuf;
use std::time::Instant;

use super::conn::{BUS_DRIVER, Conn, DbusError};
use super::wire::{Kind, Message, Value};

pub const PRIVATE_SOCKET: &str = "/run/systemd/private";
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";

const SERVICE: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// The error systemd answers StopUnit/ResetFailedUnit of an unknown unit with.
pub const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// Errors a bus daemon answers with when the callee gave no answer: no refusal by systemd.
const NOT_ANSWERS: [&str; 4] = [
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.Timeout",
    "org.freedesktop.DBus.Error.TimedOut",
];

/// The error StartTransientUnit answers when a unit of that name is loaded.
pub const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// The error GetJob answers for a job that has ended.
pub const NO_SUCH_JOB: &str = "org.freedesktop.systemd1.NoSuchJob";

/// Where to reach systemd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub private: PathBuf,
    /// The system bus's sockets, tried in order, or why the configured address names none
    /// the shim can use.
    pub system_bus: Result<Vec<PathBuf>, String>,
}

impl Default for Endpoints {
    /// The compiled-in places, whatever the environment says.
    fn default() -> Self {
        Endpoints {
            private: PRIVATE_SOCKET.into(),
            system_bus: Ok(vec![SYSTEM_BUS_SOCKET.into()]),
        }
    }
}

impl Endpoints {
    /// The node's: the system bus at `DBUS_SYSTEM_BUS_ADDRESS` when it is set and not empty
    /// (godbus, runc's client, takes an empty one for unset; libdbus's syntax, `unix:path=`
    /// entries only, see [`super::address`]), else the default socket.
    pub fn of_node() -> Endpoints {
        let system_bus = match std::env::var(super::address::SYSTEM_BUS_ENV) {
            Ok(address) if !address.is_empty() => Endpoints::bus_at(&address),
            _ => Ok(vec![SYSTEM_BUS_SOCKET.into()]),
        };
        Endpoints {
            system_bus,
            ..Endpoints::default()
        }
    }

    /// The system bus's sockets from a D-Bus `address`.
    pub fn bus_at(address: &str) -> Result<Vec<PathBuf>, String> {
        super::address::unix_paths(address)
            .map_err(|e| format!("{}={address:?}: {e}", super::address::SYSTEM_BUS_ENV))
    }

    /// The private socket only, the system bus at `bus` (tests).
    pub fn with_bus(private: PathBuf, bus: PathBuf) -> Endpoints {
        Endpoints {
            private,
            system_bus: Ok(vec![bus]),
        }
    }
}

/// Why a manager call failed.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// Neither way in works: the private socket and its error, then the system bus's (which
    /// names the socket, or why the configured bus address cannot be used).
    #[error(
        "systemd is not reachable at {}: {private_error} (nor through the system bus: {bus_error})",
        .private.display()
    )]
    Unreachable {
        private: PathBuf,
        private_error: String,
        bus_error: String,
    },
    /// A call failed: the step (`StartTransientUnit cri-containerd-x.scope`) and why. With
    /// [`DbusError::Remote`] systemd refused it (nothing was done); otherwise it got no answer
    /// (systemd may still carry it out).
    #[error("{step}: {source}")]
    Call { step: String, source: DbusError },
    /// The call was answered with a job, whose end did not come (or could not be read).
    #[error("{step}: {source}")]
    Job { step: String, source: DbusError },
    /// The unit's job finished with a result other than `done`.
    #[error("{step}: the job finished with result {result:?}")]
    JobFailed { step: String, result: String },
}

impl SystemdError {
    /// The D-Bus error name systemd answered with, if it answered with one.
    pub fn remote_name(&self) -> Option<&str> {
        match self {
            SystemdError::Call { source, .. } => source.remote_name(),
            _ => None,
        }
    }

    /// systemd refused the call with an error reply: it made no job and changed nothing. Not
    /// the errors a bus daemon answers in systemd's stead when systemd did not answer
    /// (`NoReply`, `Disconnected`, `Timeout`, `TimedOut`): those are [`Self::unanswered`].
    pub fn refused(&self) -> bool {
        self.remote_name()
            .is_some_and(|n| !NOT_ANSWERS.contains(&n))
    }

    /// The call went out and got no answer: systemd may carry it out still, later.
    pub fn unanswered(&self) -> bool {
        matches!(self, SystemdError::Call { .. }) && !self.refused()
    }
}

type SResult<T> = std::result::Result<T, SystemdError>;

fn is_job_removed(m: &Message) -> bool {
    m.kind == Kind::Signal
        && m.interface.as_deref() == Some(MANAGER)
        && m.member.as_deref() == Some("JobRemoved")
}

/// A connection to systemd's manager.
pub struct Manager {
    pub(super) conn: Conn,
    /// On the system bus messages must name systemd (the connection then follows its unique
    /// name, see [`Conn::follow_service`]); on the private socket there is nobody else to
    /// name.
    pub(super) destination: Option<&'static str>,
    /// On the private socket, its path: a re-exec of systemd closes the connection, and a job
    /// of ours is waited for again through a new one ([`Manager::rejoin_job`]).
    private: Option<PathBuf>,
}

impl Manager {
    /// Connects through the system bus, else through systemd's private socket: runc's order
    /// (go-systemd's `NewWithContext`: the system bus, the private socket for root when the
    /// bus fails). The private socket alone lost replies in the systemd guest on a loaded host
    /// (StopUnit carried out, its reply and signals never received, on a new connection too;
    /// the system bus answered every call meanwhile): it is the way in where there is no bus.
    /// A bus that does not answer gets half the time left, so the private socket still gets
    /// the rest.
    pub fn connect(endpoints: &Endpoints, deadline: Instant) -> SResult<Manager> {
        let now = Instant::now();
        let bus_deadline = now + deadline.saturating_duration_since(now) / 2;
        let bus_error = match &endpoints.system_bus {
            Ok(paths) => {
                // Each socket of the address in turn, as libdbus tries them.
                let mut errors = Vec::new();
                for path in paths {
                    match Manager::through_bus(path, bus_deadline) {
                        Ok(m) => return Ok(m),
                        Err(e) => errors.push(format!("{}: {e}", path.display())),
                    }
                }
                errors.join("; ")
            }
            Err(unusable) => {
                log::warn!("the system bus: {unusable}");
                unusable.clone()
            }
        };
        match Conn::connect(&endpoints.private, deadline) {
            Ok(conn) => {
                let mut m = Manager::direct(conn);
                m.private = Some(endpoints.private.clone());
                Ok(m)
            }
            Err(private) => Err(SystemdError::Unreachable {
                private: endpoints.private.clone(),
                private_error: private.to_string(),
                bus_error,
            }),
        }
    }

    fn direct(mut conn: Conn) -> Manager {
        conn.keep_signals(is_job_removed);
        Manager {
            conn,
            destination: None,
            private: None,
        }
    }

    fn through_bus(path: &std::path::Path, deadline: Instant) -> Result<Manager, DbusError> {
        let mut conn = Conn::connect(path, deadline)?;
        conn.keep_signals(is_job_removed);
        let bus = |member: &str, args: &[Value]| {
            Message::call(
                Some(BUS_DRIVER),
                "/org/freedesktop/DBus",
                BUS_DRIVER,
                member,
                args,
            )
        };
        conn.call(bus("Hello", &[]), deadline, "Hello")?;
        let rule = format!(
            "type='signal',sender='{SERVICE}',path='{PATH}',interface='{MANAGER}',member='JobRemoved'"
        );
        conn.call(bus("AddMatch", &[Value::Str(rule)]), deadline, "AddMatch")?;
        // Before GetNameOwner: a change of owner after its answer is not missed.
        let rule = format!(
            "type='signal',sender='{BUS_DRIVER}',path='/org/freedesktop/DBus',interface='{BUS_DRIVER}',member='NameOwnerChanged',arg0='{SERVICE}'"
        );
        conn.call(bus("AddMatch", &[Value::Str(rule)]), deadline, "AddMatch")?;
        let owner = conn.call(
            bus("GetNameOwner", &[Value::Str(SERVICE.into())]),
            deadline,
            "GetNameOwner",
        )?;
        let sender = owner
            .body()
            .ok()
            .and_then(|b| b.first().and_then(|v| v.as_str().map(String::from)))
            .ok_or_else(|| {
                DbusError::Wire(super::wire::WireError(format!(
                    "GetNameOwner {SERVICE}: the reply is not a name (signature {:?})",
                    owner.signature
                )))
            })?;
        conn.follow_service(SERVICE, sender);
        let mut m = Manager {
            conn,
            destination: Some(SERVICE),
            private: None,
        };
        m.conn
            .call(m.message("Subscribe", &[]), deadline, "Subscribe")?;
        Ok(m)
    }

    /// Wraps an authenticated connection to a peer that behaves as systemd's private socket
    /// (tests); `path` is where to connect again after it closes.
    pub fn from_direct_conn(conn: Conn, path: Option<PathBuf>) -> Manager {
        let mut m = Manager::direct(conn);
        m.private = path;
        m
    }

    /// systemd's unique name on the bus now (`None` on the private socket, or while it is
    /// off the bus).
    pub fn systemd_name(&self) -> Option<&str> {
        self.conn.service_owner()
    }

    pub(super) fn message(&self, member: &str, args: &[Value]) -> Message {
        Message::call(self.destination, PATH, MANAGER, member, args)
    }

    /// Calls a manager method that answers a job path, and waits for that job's end.
    pub(super) fn run_job(
        &mut self,
        step: String,
        member: &str,
        args: &[Value],
        deadline: Instant,
    ) -> SResult<()> {
        let reply = self
            .conn
            .call(self.message(member, args), deadline, "call")
            .map_err(|source| SystemdError::Call {
                step: step.clone(),
                source,
            })?;
        let job = reply
            .body()
            .ok()
            .and_then(|b| b.first().and_then(|v| v.as_str().map(String::from)))
            .ok_or_else(|| SystemdError::Call {
                step: step.clone(),
                source: DbusError::Wire(super::wire::WireError(format!(
                    "the reply is not a job path (signature {:?})",
                    reply.signature
                ))),
            })?;
        let unit = args.first().and_then(Value::as_str).unwrap_or_default();
        let result = match self.wait_job(&job, deadline) {
            Err(DbusError::Closed { .. }) if self.private.is_some() => self.rejoin_job(
                &job,
                unit,
                matches!(member, "StartTransientUnit" | "RestartUnit"),
                deadline,
            ),
            r => r,
        }
        .map_err(|source| SystemdError::Job {
            step: format!("{step}: wait for job {job}"),
            source,
        })?;
        if result != "done" {
            return Err(SystemdError::JobFailed { step, result });
        }
        Ok(())
    }

    /// Waits for `JobRemoved(u id, o job, s unit, s result)` of `job`; returns its result.
    /// On the bus only systemd's signals are kept (its unique name, followed through a
    /// re-exec: see [`Conn::follow_service`]).
    fn wait_job(&mut self, job: &str, deadline: Instant) -> Result<String, DbusError> {
        loop {
            let m = self.conn.next_signal(deadline, "JobRemoved")?;
            let Ok(body) = m.body() else { continue };
            if let [_, Value::ObjectPath(path), _, Value::Str(result)] = body.as_slice()
                && path == job
            {
                return Ok(result.clone());
            }
        }
    }

    /// The private connection closed while `job` (of `unit`; a start, else a stop) ran:
    /// `systemctl daemon-reexec` closes every private connection and keeps the jobs and the
    /// listening socket. Connects again and waits there for the job's end (systemd sends it to
    /// every private connection); a job that ended meanwhile (its end went to nobody) is
    /// judged by its unit's state: active after a start, gone or inactive after a stop.
    fn rejoin_job(
        &mut self,
        job: &str,
        unit: &str,
        starting: bool,
        deadline: Instant,
    ) -> Result<String, DbusError> {
        let path = self.private.clone().expect("checked by the caller");
        log::info!("systemd closed its private connection while job {job} ran: connecting again");
        let mut conn = Conn::connect(&path, deadline)?;
        conn.keep_signals(is_job_removed);
        self.conn = conn;
        let id = job
            .rsplit('/')
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| DbusError::Wire(super::wire::WireError(format!("job path {job:?}"))))?;
        match self.conn.call(
            self.message("GetJob", &[Value::U32(id)]),
            deadline,
            "GetJob",
        ) {
            Ok(_) => return self.wait_job(job, deadline),
            Err(e) if e.remote_name() == Some(NO_SUCH_JOB) => {}
            Err(e) => return Err(e),
        }
        // Its end may have come on this connection before GetJob's answer.
        if let Some(result) = self.take_job_end(job) {
            return Ok(result);
        }
        let state = match self.conn.call(
            self.message("GetUnit", &[Value::Str(unit.into())]),
            deadline,
            "GetUnit",
        ) {
            Ok(reply) => {
                let unit_path = reply
                    .body()
                    .ok()
                    .and_then(|b| b.first().and_then(|v| v.as_str().map(String::from)))
                    .unwrap_or_default();
                let get = Message::call(
                    self.destination,
                    &unit_path,
                    "org.freedesktop.DBus.Properties",
                    "Get",
                    &[
                        Value::Str("org.freedesktop.systemd1.Unit".into()),
                        Value::Str("ActiveState".into()),
                    ],
                );
                let reply = self.conn.call(get, deadline, "Get ActiveState")?;
                match reply.body().ok().as_deref() {
                    Some([Value::Variant(v)]) => v.as_str().unwrap_or_default().to_string(),
                    _ => String::new(),
                }
            }
            Err(e) if e.remote_name() == Some(NO_SUCH_UNIT) => "gone".into(),
            Err(e) => return Err(e),
        };
        let done = if starting {
            state == "active"
        } else {
            matches!(state.as_str(), "gone" | "inactive" | "failed")
        };
        Ok(if done {
            "done".into()
        } else {
            format!("unknown (the job ended while systemd re-executed; the unit is {state:?})")
        })
    }

    /// A `JobRemoved` of `job` already received, if any: its result.
    fn take_job_end(&mut self, job: &str) -> Option<String> {
        let pos = self.conn.signals.iter().position(|m| {
            matches!(m.body().ok().as_deref(), Some([_, Value::ObjectPath(p), _, _]) if p == job)
        })?;
        let m = self.conn.signals.remove(pos)?;
        match m.body().ok()?.as_slice() {
            [_, _, _, Value::Str(result)] => Some(result.clone()),
            _ => None,
        }
    }

    /// `StartTransientUnit(name, "replace", properties, [])` and its job's end.
    pub fn start_transient_unit(
        &mut self,
        name: &str,
        properties: Vec<(String, Value)>,
        deadline: Instant,
    ) -> SResult<()> {
        let props = properties
            .into_iter()
            .map(|(k, v)| Value::Struct(vec![Value::Str(k), Value::Variant(Box::new(v))]))
            .collect();
        self.run_job(
            format!("StartTransientUnit {name}"),
            "StartTransientUnit",
            &[
                Value::Str(name.into()),
                Value::Str("replace".into()),
                Value::Array("(sv)".into(), props),
                Value::Array("(sa(sv))".into(), Vec::new()),
            ],
            deadline,
        )
    }

    /// `StopUnit(name, "replace")` and its job's end. A unit that is not loaded is stopped.
    pub fn stop_unit(&mut self, name: &str, deadline: Instant) -> SResult<()> {
        match self.run_job(
            format!("StopUnit {name}"),
            "StopUnit",
            &[Value::Str(name.into()), Value::Str("replace".into())],
            deadline,
        ) {
            Err(e) if e.remote_name() == Some(NO_SUCH_UNIT) => Ok(()),
            r => r,
        }
    }

    /// `ResetFailedUnit(name)`: lets systemd forget a failed unit. Not loaded is fine.
    pub fn reset_failed_unit(&mut self, name: &str, deadline: Instant) -> SResult<()> {
        match self.conn.call(
            self.message("ResetFailedUnit", &[Value::Str(name.into())]),
            deadline,
            "call",
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.remote_name() == Some(NO_SUCH_UNIT) => Ok(()),
            Err(source) => Err(SystemdError::Call {
                step: format!("ResetFailedUnit {name}"),
                source,
            }),
        }
    }
}
