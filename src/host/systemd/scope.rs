//! The pod's transient scope: the pause process in `cri-containerd-<sandbox id>.scope` of
//! the pod's slice, started and stopped as runc starts and stops a container's scope
//! (`libcontainer/cgroups/systemd`: `startUnit`, `stopUnit`).

use std::time::{Duration, Instant};

use super::manager::{Endpoints, Manager, SystemdError, UNIT_EXISTS};
use super::wire::Value;

/// How long starting the scope may take in all: connect, authenticate, the call and its job.
/// runc waits 30 s for the job alone; a systemd that does not answer within this fails the
/// StartSandbox. Not less: a systemd busy with other units' cgroup events (the systemd guest
/// under TCG on a loaded machine) has left a StopUnit call unanswered for over 10 s, twice.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping it may take (as long as a start, for the same reason).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `delete` waits for it: containerd gives the whole `delete` 5 s
/// (`io.containerd.timeout.shim.cleanup`) and kills it after, and the scope is empty by then
/// (the pause is dead), which systemd stops on its own anyway.
pub const DELETE_STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// The clean-up after a failed start (its own connection: the first may be mid-message).
const UNDO_TIMEOUT: Duration = Duration::from_secs(3);

/// A scope the shim started, as the sandbox record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodScope {
    /// `cri-containerd-<sandbox id>.scope`.
    pub unit: String,
    /// The pod's slice (`cgroup_parent`).
    pub slice: String,
}

/// The unit properties runc gives a container's scope (v2: `IOAccounting`; v1:
/// `BlockIOAccounting`), for `pid` in `scope`, and the device rules runc gives the runc
/// path's pause container (see [`super::devices`] for why they must be there from the start).
pub fn properties(scope: &PodScope, id: &str, pid: u32, unified: bool) -> Vec<(String, Value)> {
    let b = |k: &str, v: bool| (k.to_string(), Value::Bool(v));
    let devices = super::devices::properties(&super::devices::runc_default_device_allow(
        &super::devices::Host,
    ));
    let mut props = vec![
        ("Slice".into(), Value::Str(scope.slice.clone())),
        (
            "Description".into(),
            Value::Str(format!("rsandbox pod sandbox {id}")),
        ),
        // The containers' scopes are runc's; this one holds only the pause, but a delegated
        // scope is what runc makes and what cAdvisor and the kubelet expect to see.
        b("Delegate", true),
        (
            "PIDs".into(),
            Value::Array("u".into(), vec![Value::U32(pid)]),
        ),
        b("MemoryAccounting", true),
        b("CPUAccounting", true),
        b(
            if unified {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            true,
        ),
        b("TasksAccounting", true),
        b("DefaultDependencies", false),
        // The runc path's pause container has containerd's `cpu.shares` 2
        // (`WithDefaultSandboxShares`), which runc gives its scope as `CPUShares=2` (v1) or
        // `CPUWeight=1` (v2, its conversion of 2 shares).
        if unified {
            ("CPUWeight".into(), Value::U64(1))
        } else {
            ("CPUShares".into(), Value::U64(2))
        },
    ];
    props.extend(devices);
    props
}

/// Starts `scope` with `pid` in it and waits for systemd to finish the job. A unit of that
/// name left over (failed) is reset and the start tried once more, as runc does; if the reset
/// itself fails, the unit that exists is not known to be ours and nothing more is done.
/// On failure:
/// * systemd refused the start (an error reply: `UnitExists` again, bad arguments, access
///   denied): it made nothing, so nothing is undone — an existing unit of that name is not
///   ours to stop;
/// * the start was answered with a job that failed or whose end did not come: the unit is
///   stopped and reset, best effort; when that does not succeed either (a systemd too slow
///   for both), the failure says the unit may remain;
/// * the start got no answer at all: undone the same way, and the unit may remain even when
///   the undo succeeded: systemd may still read the unanswered call from the closed
///   connection after the undo's, and start the unit then.
///
/// Whoever keeps the record must stop a unit that may remain once systemd answers.
pub fn start(
    endpoints: &Endpoints,
    scope: &PodScope,
    id: &str,
    pid: u32,
    unified: bool,
) -> Result<(), StartFailed> {
    start_within(endpoints, scope, id, pid, unified, START_TIMEOUT)
}

/// [`start`], the start itself within `timeout` (the undo has its own).
pub fn start_within(
    endpoints: &Endpoints,
    scope: &PodScope,
    id: &str,
    pid: u32,
    unified: bool,
    timeout: Duration,
) -> Result<(), StartFailed> {
    let deadline = Instant::now() + timeout;
    let mut manager = Manager::connect(endpoints, deadline).map_err(|error| StartFailed {
        error,
        // Nothing was asked of systemd.
        unit_may_remain: false,
    })?;
    let props = || properties(scope, id, pid, unified);
    let r = match manager.start_transient_unit(&scope.unit, props(), deadline) {
        Err(e) if e.remote_name() == Some(UNIT_EXISTS) => {
            match manager.reset_failed_unit(&scope.unit, deadline) {
                Ok(()) => manager.start_transient_unit(&scope.unit, props(), deadline),
                Err(reset) => {
                    log::warn!("{reset}");
                    Err(e)
                }
            }
        }
        r => r,
    };
    r.map_err(|error| {
        if error.refused() {
            return StartFailed {
                error,
                unit_may_remain: false,
            };
        }
        drop(manager);
        let undone = undo(endpoints, &scope.unit);
        StartFailed {
            unit_may_remain: !undone || error.unanswered(),
            error,
        }
    })
}

/// A failed [`start`].
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct StartFailed {
    pub error: SystemdError,
    /// The undo did not succeed: the unit may exist now or later (a start systemd has not
    /// run yet), and must be stopped once systemd answers.
    pub unit_may_remain: bool,
}

/// Stops and resets `unit` after a failed start; whether that succeeded.
fn undo(endpoints: &Endpoints, unit: &str) -> bool {
    let deadline = Instant::now() + UNDO_TIMEOUT;
    let r = Manager::connect(endpoints, deadline).and_then(|mut m| {
        m.stop_unit(unit, deadline)?;
        m.reset_failed_unit(unit, deadline)
    });
    if let Err(e) = &r {
        log::warn!("undo scope {unit}: {e}");
    }
    r.is_ok()
}

/// Stops `unit` and waits for the job; a unit that is gone already is fine. A failed unit
/// is reset so systemd forgets it (runc's `stopUnit`).
pub fn stop(endpoints: &Endpoints, unit: &str) -> Result<(), SystemdError> {
    stop_within(endpoints, unit, STOP_TIMEOUT)
}

/// [`stop`], all of it within `timeout`.
pub fn stop_within(
    endpoints: &Endpoints,
    unit: &str,
    timeout: Duration,
) -> Result<(), SystemdError> {
    let deadline = Instant::now() + timeout;
    let mut manager = Manager::connect(endpoints, deadline)?;
    let r = manager.stop_unit(unit, deadline);
    if let Err(e) = manager.reset_failed_unit(unit, deadline) {
        log::debug!("{e}");
    }
    r
}
