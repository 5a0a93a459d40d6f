//! The D-Bus client against a fake systemd (see [`super::fake`]): no systemd needed.

use std::time::{Duration, Instant};

use super::conn::{BUS_DRIVER, Conn, DbusError};
use super::fake::*;
use super::manager::{Endpoints, Manager, NO_SUCH_UNIT, SystemdError, UNIT_EXISTS};
use super::scope::{self, PodScope};
use super::wire::{Message, Value};

mod backlog;
mod bus;
mod live;
mod pod_scope;

const JOB: &str = "/org/freedesktop/systemd1/job/7";

fn manager(fake: &FakeSystemd, deadline: Instant) -> Manager {
    Manager::from_direct_conn(
        Conn::connect(&fake.path, deadline).unwrap(),
        Some(fake.path.clone()),
    )
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn pod_scope() -> PodScope {
    PodScope {
        unit: "cri-containerd-sb1.scope".into(),
        slice: "kubepods-besteffort-pod1.slice".into(),
    }
}

/// systemd's answer to a call that starts a job: job JOB is queued.
fn queued(call: &Message) -> Message {
    reply(call, &[Value::ObjectPath(JOB.into())])
}

/// systemd's answer to a call that starts a job, and that job's end (`result`) for `unit`.
fn job_ends(call: &Message, unit: &str, result: &str) -> Vec<Message> {
    vec![queued(call), job_removed(7, JOB, unit, result)]
}

/// Starts pod_scope() for sandbox sb1 (pid 1, cgroup v2) through `endpoints`.
fn start_pod_scope(endpoints: &Endpoints) -> Result<(), scope::StartFailed> {
    scope::start(endpoints, &pod_scope(), "sb1", 1, true)
}

/// A systemd that answers every job-starting call with JOB and then, after a signal the
/// client must skip and another job's end, JOB's end with `result`.
fn systemd_with_result(result: &'static str) -> Script {
    Box::new(move |call| match call.member.as_deref() {
        Some("StartTransientUnit" | "StopUnit") => vec![
            queued(call),
            noise(),
            job_removed(
                6,
                "/org/freedesktop/systemd1/job/6",
                "other.scope",
                "failed",
            ),
            job_removed(7, JOB, &arg(call, 0), result),
        ],
        _ => vec![reply(call, &[])],
    })
}
