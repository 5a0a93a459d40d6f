//! The D-Bus client against a fake systemd (see [`super::fake`]): no systemd needed.

use std::time::{Duration, Instant};

use super::conn::{BUS_DRIVER, Conn, DbusError};
use super::fake::*;
use super::manager::{Endpoints, Manager, NO_SUCH_UNIT, SystemdError, UNIT_EXISTS};
use super::scope::{self, PodScope};
use super::wire::{Message, Value};

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

#[test]
fn a_scope_starts_with_runc_s_properties_and_waits_for_its_job() {
    let fake = FakeSystemd::serve(1, systemd_with_result("done"));
    scope::start(&fake.endpoints(), &pod_scope(), "sb1", 4242, true).unwrap();
    let calls = fake.finish();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call.member.as_deref(), Some("StartTransientUnit"));
    assert_eq!(
        call.interface.as_deref(),
        Some("org.freedesktop.systemd1.Manager")
    );
    assert_eq!(call.path.as_deref(), Some("/org/freedesktop/systemd1"));
    // The private socket is a direct connection: nobody to address.
    assert_eq!(call.destination, None);
    assert_eq!(call.signature, "ssa(sv)a(sa(sv))");
    let body = call.body().unwrap();
    assert_eq!(body[0], Value::Str("cri-containerd-sb1.scope".into()));
    assert_eq!(body[1], Value::Str("replace".into()));
    let Value::Array(_, props) = &body[2] else {
        panic!("{body:?}")
    };
    let props: Vec<(String, Value)> = props
        .iter()
        .map(|p| match p {
            Value::Struct(kv) => match (&kv[0], &kv[1]) {
                (Value::Str(k), Value::Variant(v)) => (k.clone(), (**v).clone()),
                _ => panic!("{p:?}"),
            },
            _ => panic!("{p:?}"),
        })
        .collect();
    let get = |k: &str| props.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        get("Slice"),
        Some(Value::Str("kubepods-besteffort-pod1.slice".into()))
    );
    assert_eq!(
        get("PIDs"),
        Some(Value::Array("u".into(), vec![Value::U32(4242)]))
    );
    for on in [
        "Delegate",
        "MemoryAccounting",
        "CPUAccounting",
        "IOAccounting",
        "TasksAccounting",
    ] {
        assert_eq!(get(on), Some(Value::Bool(true)), "{on}");
    }
    assert_eq!(get("DefaultDependencies"), Some(Value::Bool(false)));
    // The runc path's pause has containerd's 2 CPU shares: runc's CPUWeight 1 on v2.
    assert_eq!(get("CPUWeight"), Some(Value::U64(1)));
    assert_eq!(get("CPUShares"), None);
    assert_eq!(get("BlockIOAccounting"), None);
    // runc's device rules for the pause container: a strict policy, the list cleared, then
    // runc's defaults (the nodes among them depend on this host; mknod of any device does not).
    assert_eq!(get("DevicePolicy"), Some(Value::Str("strict".into())));
    let allow: Vec<&Value> = props
        .iter()
        .filter(|(k, _)| k == "DeviceAllow")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(allow.len(), 2, "{allow:?}");
    assert_eq!(allow[0], &Value::Array("(ss)".into(), vec![]));
    let Value::Array(sig, entries) = allow[1] else {
        panic!("{allow:?}")
    };
    assert_eq!(sig, "(ss)");
    let entry = |p: &str, m: &str| Value::Struct(vec![Value::Str(p.into()), Value::Str(m.into())]);
    assert_eq!(entries[..2], [entry("block-*", "m"), entry("char-*", "m")]);
    assert_eq!(body[3], Value::Array("(sa(sv))".into(), vec![]));
}

#[test]
fn cgroup_v1_asks_for_block_io_accounting() {
    let props = scope::properties(&pod_scope(), "sb1", 1, false);
    assert!(props.iter().any(|(k, _)| k == "BlockIOAccounting"));
    assert!(!props.iter().any(|(k, _)| k == "IOAccounting"));
    assert!(props.contains(&("CPUShares".into(), Value::U64(2))));
    assert!(!props.iter().any(|(k, _)| k == "CPUWeight"));
}

/// systemd may emit the job's end before the call's reply reaches us: it is kept.
#[test]
fn a_job_that_ends_before_the_reply_arrives_is_not_missed() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| vec![job_removed(7, JOB, "x.scope", "done"), queued(call)]),
    );
    let mut m = manager(&fake, soon());
    m.start_transient_unit("x.scope", vec![], soon()).unwrap();
    drop(m);
    fake.finish();
}

#[test]
fn a_systemd_that_never_answers_fails_at_the_deadline() {
    let fake = FakeSystemd::serve(1, Box::new(|_| Vec::new()));
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut m = manager(&fake, soon());
    let e = m
        .start_transient_unit("x.scope", vec![], deadline)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SystemdError::Call {
                source: DbusError::Timeout { .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("StartTransientUnit x.scope"), "{e}");
    assert!(
        e.to_string().contains("no answer before the deadline"),
        "{e}"
    );
    drop(m);
    fake.finish();
}

/// A reply but never the job's end: also bounded.
#[test]
fn a_job_that_never_ends_fails_at_the_deadline() {
    let fake = FakeSystemd::serve(1, Box::new(|call| vec![queued(call), noise()]));
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut m = manager(&fake, soon());
    let e = m.stop_unit("x.scope", deadline).unwrap_err();
    assert!(e.to_string().contains("wait for job"), "{e}");
    drop(m);
    fake.finish();
}

#[test]
fn an_error_reply_is_a_typed_error_with_systemd_s_name_and_text() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| {
            vec![error(
                call,
                "org.freedesktop.DBus.Error.InvalidArgs",
                "Unit name x is not valid.",
            )]
        }),
    );
    let mut m = manager(&fake, soon());
    let e = m.start_transient_unit("x", vec![], soon()).unwrap_err();
    assert_eq!(
        e.remote_name(),
        Some("org.freedesktop.DBus.Error.InvalidArgs")
    );
    assert!(e.to_string().contains("Unit name x is not valid."), "{e}");
    drop(m);
    fake.finish();
}

#[test]
fn a_job_that_fails_is_an_error_naming_its_result() {
    let fake = FakeSystemd::serve(1, systemd_with_result("failed"));
    let mut m = manager(&fake, soon());
    let e = m
        .start_transient_unit("x.scope", vec![], soon())
        .unwrap_err();
    assert!(
        matches!(&e, SystemdError::JobFailed { result, .. } if result == "failed"),
        "{e:?}"
    );
    drop(m);
    fake.finish();
}

#[test]
fn stopping_a_unit_that_is_gone_is_fine() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| match call.member.as_deref() {
            Some("StopUnit" | "ResetFailedUnit") => {
                vec![error(call, NO_SUCH_UNIT, "Unit x.scope not loaded.")]
            }
            _ => vec![reply(call, &[])],
        }),
    );
    scope::stop(&fake.endpoints(), "x.scope").unwrap();
    let calls = fake.finish();
    let members: Vec<_> = calls.iter().map(|c| c.member.clone().unwrap()).collect();
    assert_eq!(members, ["StopUnit", "ResetFailedUnit"]);
    assert_eq!(arg(&calls[0], 0), "x.scope");
    assert_eq!(arg(&calls[0], 1), "replace");
}

#[test]
fn a_stop_waits_for_the_stop_job() {
    let fake = FakeSystemd::serve(1, systemd_with_result("done"));
    scope::stop(&fake.endpoints(), "cri-containerd-sb1.scope").unwrap();
    fake.finish();
}

/// A unit of that name left from an earlier attempt: reset, then started once more (runc).
#[test]
fn an_existing_unit_is_reset_and_the_start_retried_once() {
    let mut first = true;
    let fake = FakeSystemd::serve(
        1,
        Box::new(move |call| match call.member.as_deref() {
            Some("StartTransientUnit") if first => {
                first = false;
                vec![error(call, UNIT_EXISTS, "Unit x already exists.")]
            }
            Some("StartTransientUnit") => job_ends(call, "x", "done"),
            _ => vec![reply(call, &[])],
        }),
    );
    start_pod_scope(&fake.endpoints()).unwrap();
    let members = fake.finish_members();
    assert_eq!(
        members,
        [
            "StartTransientUnit",
            "ResetFailedUnit",
            "StartTransientUnit"
        ]
    );
}

/// A unit of that name that is active (the reset does not clear it) is not ours: the start
/// fails and no StopUnit is sent for it.
#[test]
fn a_unit_that_exists_still_after_the_reset_is_not_stopped() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => vec![error(call, UNIT_EXISTS, "Unit x already exists.")],
            Some("StopUnit") => job_ends(call, "x", "done"),
            _ => vec![reply(call, &[])],
        }),
    );
    let e = start_pod_scope(&fake.endpoints()).unwrap_err();
    assert_eq!(e.error.remote_name(), Some(UNIT_EXISTS), "{e}");
    // Not ours: nothing for the record to keep.
    assert!(!e.unit_may_remain);
    // The fake serves a second connection: an undo would have made it; this one ends it.
    let _ = Conn::connect(&fake.path, soon());
    let members = fake.finish_members();
    assert_eq!(
        members,
        [
            "StartTransientUnit",
            "ResetFailedUnit",
            "StartTransientUnit"
        ]
    );
}

/// A start that fails leaves no unit: the shim stops and resets it on a new connection.
#[test]
fn a_failed_start_stops_and_resets_the_unit() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => job_ends(call, "x", "failed"),
            Some("StopUnit") => vec![error(call, NO_SUCH_UNIT, "not loaded")],
            _ => vec![reply(call, &[])],
        }),
    );
    let e = start_pod_scope(&fake.endpoints()).unwrap_err();
    assert!(e.to_string().contains("result \"failed\""), "{e}");
    assert!(!e.unit_may_remain, "the undo succeeded");
    let members = fake.finish_members();
    assert_eq!(
        members,
        ["StartTransientUnit", "StopUnit", "ResetFailedUnit"]
    );
}

/// A start that fails and whose undo fails too (systemd answers the first connection only):
/// the unit may remain, and the failure says so for the record to keep it.
#[test]
fn a_failed_start_whose_undo_fails_says_the_unit_may_remain() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => job_ends(call, "x", "timeout"),
            _ => vec![reply(call, &[])],
        }),
    );
    let e = start_pod_scope(&fake.endpoints()).unwrap_err();
    assert!(e.unit_may_remain, "{e}");
    let members = fake.finish_members();
    assert_eq!(members, ["StartTransientUnit"]);
}

/// A start systemd refuses with an error reply made nothing: no undo, nothing to keep.
#[test]
fn a_refused_start_is_not_undone() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => vec![error(
                call,
                "org.freedesktop.DBus.Error.InvalidArgs",
                "Invalid unit name",
            )],
            _ => vec![reply(call, &[])],
        }),
    );
    let e = start_pod_scope(&fake.endpoints()).unwrap_err();
    assert!(e.to_string().contains("Invalid unit name"), "{e}");
    assert!(!e.unit_may_remain);
    // An undo would have made the second connection; this one ends the fake.
    let _ = Conn::connect(&fake.path, soon());
    assert_eq!(fake.finish_members(), ["StartTransientUnit"]);
}

/// When the reset of an existing unit fails, that unit is not known to be ours: neither a
/// second start nor a stop of it (runc would go on and retry; stopping is what must not be).
#[test]
fn an_existing_unit_whose_reset_fails_is_left_alone() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => vec![error(call, UNIT_EXISTS, "Unit x already exists.")],
            Some("ResetFailedUnit") => vec![error(
                call,
                "org.freedesktop.DBus.Error.AccessDenied",
                "denied",
            )],
            _ => vec![reply(call, &[])],
        }),
    );
    let e = start_pod_scope(&fake.endpoints()).unwrap_err();
    assert_eq!(e.error.remote_name(), Some(UNIT_EXISTS), "{e}");
    assert!(!e.unit_may_remain);
    let _ = Conn::connect(&fake.path, soon());
    assert_eq!(
        fake.finish_members(),
        ["StartTransientUnit", "ResetFailedUnit"]
    );
}

/// A start that got no answer may still be carried out after the undo (systemd may read it
/// from the closed connection later): the undo runs, and the unit may remain even though the
/// undo's stop found nothing.
#[test]
fn an_unanswered_start_is_undone_and_may_remain() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => Vec::new(),
            Some("StopUnit") => vec![error(call, NO_SUCH_UNIT, "not loaded")],
            _ => vec![reply(call, &[])],
        }),
    );
    let e = scope::start_within(
        &fake.endpoints(),
        &pod_scope(),
        "sb1",
        1,
        true,
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("no answer before the deadline"),
        "{e}"
    );
    assert!(e.unit_may_remain, "{e}");
    assert_eq!(
        fake.finish_members(),
        ["StartTransientUnit", "StopUnit", "ResetFailedUnit"]
    );
}

#[test]
fn no_systemd_is_an_error_naming_both_ways_in() {
    let dir = tempfile::tempdir().unwrap();
    let endpoints = Endpoints::with_bus(
        dir.path().join("private"),
        dir.path().join("system_bus_socket"),
    );
    let e = start_pod_scope(&endpoints).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "systemd is not reachable at {}: connect: No such file or directory",
            endpoints.private.display()
        )),
        "{text}"
    );
    assert!(text.contains("system_bus_socket"), "{text}");
}

/// Through the system bus: Hello, a match rule for JobRemoved, Subscribe, and every
/// manager call addressed to org.freedesktop.systemd1.
#[test]
fn the_system_bus_is_used_with_hello_match_and_subscribe_when_the_private_socket_is_missing() {
    let bus = FakeSystemd::serve(1, on_the_bus(systemd_with_result("done")));
    let endpoints = without_private_socket(&bus);
    scope::stop(&endpoints, "x.scope").unwrap();
    let calls = bus.finish();
    let seen: Vec<_> = calls
        .iter()
        .map(|c| {
            (
                c.member.clone().unwrap(),
                c.destination.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("Hello".to_string(), "org.freedesktop.DBus".to_string()),
            ("AddMatch".into(), "org.freedesktop.DBus".into()),
            ("AddMatch".into(), "org.freedesktop.DBus".into()),
            ("GetNameOwner".into(), "org.freedesktop.DBus".into()),
            ("Subscribe".into(), "org.freedesktop.systemd1".into()),
            ("StopUnit".into(), "org.freedesktop.systemd1".into()),
            ("ResetFailedUnit".into(), "org.freedesktop.systemd1".into()),
        ]
    );
    assert!(arg(&calls[1], 0).contains("member='JobRemoved'"));
    let owner_rule = arg(&calls[2], 0);
    for part in [
        "sender='org.freedesktop.DBus'",
        "member='NameOwnerChanged'",
        "arg0='org.freedesktop.systemd1'",
    ] {
        assert!(owner_rule.contains(part), "{owner_rule}");
    }
}

/// The fake bus as the system bus, with no private socket to use first.
fn without_private_socket(bus: &FakeSystemd) -> Endpoints {
    Endpoints::with_bus(
        bus.path.with_file_name("no-private-socket"),
        bus.path.clone(),
    )
}

/// systemd's unique name on the fake bus.
const SYSTEMD_ON_THE_BUS: &str = ":1.1";

/// `script` as systemd behind a bus daemon: GetNameOwner answers its unique name, the bus
/// daemon answers its own calls (Hello, AddMatch, GetNameOwner) as `org.freedesktop.DBus`,
/// and what systemd sends (replies, signals) carries systemd's unique name as its sender,
/// unless the script set another.
fn on_the_bus(mut script: Script) -> Script {
    Box::new(move |call| {
        let to_daemon = call.destination.as_deref() == Some(BUS_DRIVER);
        let mut out = if call.member.as_deref() == Some("GetNameOwner") {
            vec![reply(call, &[Value::Str(SYSTEMD_ON_THE_BUS.into())])]
        } else {
            script(call)
        };
        for m in &mut out {
            if m.sender.is_none() {
                let daemon = to_daemon && m.kind != super::wire::Kind::Signal;
                m.sender = Some(
                    if daemon {
                        BUS_DRIVER
                    } else {
                        SYSTEMD_ON_THE_BUS
                    }
                    .into(),
                );
            }
        }
        out
    })
}

/// On the system bus any local user may send us a `JobRemoved`: only systemd's counts.
#[test]
fn on_the_system_bus_a_job_removed_from_another_sender_is_ignored() {
    let bus = FakeSystemd::serve(
        1,
        on_the_bus(Box::new(|call| match call.member.as_deref() {
            Some("StopUnit") => {
                let mut forged = job_removed(7, JOB, "x.scope", "done");
                forged.sender = Some(":1.99".into());
                vec![
                    queued(call),
                    forged,
                    job_removed(7, JOB, "x.scope", "failed"),
                ]
            }
            _ => vec![reply(call, &[])],
        })),
    );
    let endpoints = without_private_socket(&bus);
    let e = scope::stop(&endpoints, "x.scope").unwrap_err();
    assert!(
        matches!(e, SystemdError::JobFailed { ref result, .. } if result == "failed"),
        "{e}"
    );
    bus.finish();
}

/// systemd's unique name once it is back on the bus after a re-exec.
const SYSTEMD_AFTER_RE_EXEC: &str = ":1.7";

/// Issue 27 item 6: `systemctl daemon-reexec` while a job runs: systemd leaves the bus and
/// comes back under a new unique name (the bus daemon says so with NameOwnerChanged), and the
/// job's end comes from that name. It is taken; before, the wait ran to its deadline.
#[test]
fn on_the_system_bus_a_job_s_end_after_a_systemd_re_exec_is_taken() {
    let bus = FakeSystemd::serve(
        1,
        on_the_bus(Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => {
                let mut done = job_removed(7, JOB, "cri-containerd-sb1.scope", "done");
                done.sender = Some(SYSTEMD_AFTER_RE_EXEC.into());
                vec![
                    queued(call),
                    name_owner_changed("org.freedesktop.systemd1", SYSTEMD_ON_THE_BUS, ""),
                    name_owner_changed("org.freedesktop.systemd1", "", SYSTEMD_AFTER_RE_EXEC),
                    done,
                ]
            }
            _ => vec![reply(call, &[])],
        })),
    );
    let endpoints = without_private_socket(&bus);
    scope::start_within(
        &endpoints,
        &pod_scope(),
        "sb1",
        1,
        true,
        Duration::from_secs(5),
    )
    .unwrap();
    bus.finish();
}

/// Issue 27 item 6, the private socket: a re-exec closes systemd's private connections
/// (keeping its jobs). The connection closes while our start job runs: we connect again, find
/// the job still there (GetJob) and take its end on the new connection. Before, the start
/// failed ("the peer closed the connection").
#[test]
fn on_the_private_socket_a_job_is_waited_for_again_after_a_re_exec() {
    let fake = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => {
                vec![queued(call), hang_up()]
            }
            Some("GetJob") => {
                assert_eq!(call.body().unwrap(), [Value::U32(7)]);
                job_ends(call, "x.scope", "done")
            }
            _ => vec![reply(call, &[])],
        }),
    );
    let mut m = manager(&fake, soon());
    m.start_transient_unit("x.scope", vec![], soon()).unwrap();
    drop(m);
    assert_eq!(fake.finish_members(), ["StartTransientUnit", "GetJob"]);
}

/// A job that ended while systemd re-executed (its end went to nobody) is judged by the
/// unit's state: an active unit after a start is done; a unit that is gone after a stop is.
#[test]
fn a_job_that_ended_during_a_re_exec_is_judged_by_its_unit() {
    let start = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StartTransientUnit") => {
                vec![queued(call), hang_up()]
            }
            Some("GetJob") => vec![error(call, super::manager::NO_SUCH_JOB, "no job 7")],
            Some("GetUnit") => vec![reply(
                call,
                &[Value::ObjectPath(
                    "/org/freedesktop/systemd1/unit/x_2escope".into(),
                )],
            )],
            Some("Get") => {
                assert_eq!(
                    call.path.as_deref(),
                    Some("/org/freedesktop/systemd1/unit/x_2escope")
                );
                vec![reply(
                    call,
                    &[Value::Variant(Box::new(Value::Str("active".into())))],
                )]
            }
            _ => vec![reply(call, &[])],
        }),
    );
    let mut m = manager(&start, soon());
    m.start_transient_unit("x.scope", vec![], soon()).unwrap();
    drop(m);
    assert_eq!(
        start.finish_members(),
        ["StartTransientUnit", "GetJob", "GetUnit", "Get"]
    );
    let stop = FakeSystemd::serve(
        2,
        Box::new(|call| match call.member.as_deref() {
            Some("StopUnit") => vec![queued(call), hang_up()],
            Some("GetJob") => vec![error(call, super::manager::NO_SUCH_JOB, "no job 7")],
            Some("GetUnit") => vec![error(call, NO_SUCH_UNIT, "not loaded")],
            _ => vec![reply(call, &[])],
        }),
    );
    let mut m = manager(&stop, soon());
    m.stop_unit("x.scope", soon()).unwrap();
    drop(m);
    stop.finish();
}

/// Only the bus daemon says who owns systemd's name: a NameOwnerChanged from anyone else
/// (a local user on a permissive bus) moves nothing, and that user's JobRemoved is not taken.
#[test]
fn a_name_owner_change_not_from_the_bus_daemon_is_ignored() {
    let bus = FakeSystemd::serve(
        1,
        on_the_bus(Box::new(|call| match call.member.as_deref() {
            Some("StopUnit") => {
                let mut forged_move = name_owner_changed("org.freedesktop.systemd1", "", ":1.99");
                forged_move.sender = Some(":1.99".into());
                let mut forged_end = job_removed(7, JOB, "x.scope", "done");
                forged_end.sender = Some(":1.99".into());
                vec![
                    queued(call),
                    forged_move,
                    forged_end,
                    job_removed(7, JOB, "x.scope", "failed"),
                ]
            }
            _ => vec![reply(call, &[])],
        })),
    );
    let endpoints = without_private_socket(&bus);
    let e = scope::stop(&endpoints, "x.scope").unwrap_err();
    assert!(
        matches!(e, SystemdError::JobFailed { ref result, .. } if result == "failed"),
        "{e}"
    );
    bus.finish();
}

/// Issue 27 item 9: a method return is systemd's only if systemd sent it. A local user whom
/// a permissive bus policy lets send us a method return with our call's serial is not
/// answered for systemd (here: its forged job would never end).
#[test]
fn on_the_system_bus_a_reply_from_another_sender_is_ignored() {
    let bus = FakeSystemd::serve(
        1,
        on_the_bus(Box::new(|call| match call.member.as_deref() {
            Some("StopUnit") => {
                let mut forged = reply(
                    call,
                    &[Value::ObjectPath(
                        "/org/freedesktop/systemd1/job/666".into(),
                    )],
                );
                forged.sender = Some(":1.99".into());
                vec![forged, queued(call), job_removed(7, JOB, "x.scope", "done")]
            }
            _ => vec![reply(call, &[])],
        })),
    );
    let endpoints = without_private_socket(&bus);
    scope::stop_within(&endpoints, "x.scope", Duration::from_secs(5)).unwrap();
    bus.finish();
}

/// Issue 27 item 9: `DBUS_SYSTEM_BUS_ADDRESS` (libdbus's syntax) names the system bus; an
/// address the shim cannot use is named in the error.
#[test]
fn the_system_bus_address_is_taken_from_a_d_bus_address() {
    let bus = FakeSystemd::serve(1, on_the_bus(systemd_with_result("done")));
    let address = format!("tcp:host=localhost,port=1;unix:path={}", bus.path.display());
    let endpoints = Endpoints {
        private: bus.path.with_file_name("no-private-socket"),
        system_bus: Endpoints::bus_at(&address),
    };
    scope::stop(&endpoints, "x.scope").unwrap();
    assert_eq!(bus.finish_members()[0], "Hello");

    let dir = tempfile::tempdir().unwrap();
    let endpoints = Endpoints {
        private: dir.path().join("private"),
        system_bus: Endpoints::bus_at("unix:abstract=/tmp/dbus-x"),
    };
    let e = scope::stop(&endpoints, "x.scope").unwrap_err().to_string();
    assert!(
        e.contains("DBUS_SYSTEM_BUS_ADDRESS=\"unix:abstract=/tmp/dbus-x\""),
        "{e}"
    );
    assert!(e.contains("abstract sockets are not used"), "{e}");
}

/// Issue 27 item 10: the private socket "lost" a StopUnit's reply under load (systemd ran the
/// stop, we got nothing, `systemctl` got through). sd-bus parks what it reads after `BEGIN`
/// until the socket is readable again; our `BEGIN` went out after the server's `OK`, right
/// before the call, so a slow systemd read both at once and sat on the call until we closed
/// the connection. `BEGIN` now goes with `AUTH`, as sd-bus's client sends it, and the call is
/// answered.
#[test]
fn a_slow_sd_bus_server_answers_the_first_call() {
    let fake = FakeSystemd::serve_like_sd_bus(1, systemd_with_result("done"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut m = manager(&fake, deadline);
    m.stop_unit("x.scope", deadline).unwrap();
    m.reset_failed_unit("x.scope", deadline).unwrap();
    drop(m);
    assert_eq!(fake.finish_members(), ["StopUnit", "ResetFailedUnit"]);
}

/// Issue 27 item 9: a wait for systemd is a blocking section (see crate::shim::blocking): the RPC
/// pool then adds a worker for other calls instead of waiting for its stall rule.
#[test]
fn waiting_for_systemd_is_a_blocking_section() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl crate::shim::blocking::Observer for Count {
        fn blocked(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn unblocked(&self) {}
    }
    let count = Arc::new(Count::default());
    crate::shim::blocking::observe_this_thread(count.clone());
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| {
            std::thread::sleep(Duration::from_millis(50));
            job_ends(call, "x.scope", "done")
        }),
    );
    let mut m = manager(&fake, soon());
    let before = count.0.load(Ordering::SeqCst);
    m.stop_unit("x.scope", soon()).unwrap();
    assert!(
        count.0.load(Ordering::SeqCst) > before,
        "no blocking section"
    );
    drop(m);
    fake.finish();
}

/// A peer that refuses the authentication.
#[test]
fn a_refused_authentication_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
        s.write_all(b"REJECTED EXTERNAL\r\n").unwrap();
    });
    let e = Conn::connect(&path, soon()).err().unwrap();
    assert!(
        matches!(e, DbusError::Auth(ref l) if l == "REJECTED EXTERNAL"),
        "{e:?}"
    );
    t.join().unwrap();
}

/// CPU time (user + system, clock ticks) PID 1 has used, from `/proc/1/stat`.
fn pid1_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/1/stat").ok()?;
    // after the command's closing parenthesis: state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Waits (at most two minutes) until PID 1 has been idle for a second: under TCG, systemd
/// takes tens of seconds to work through the mount and cgroup events the integration tests
/// just caused (it was seen running, State R, through a 30 s unanswered StopUnit), and this
/// test measures the calls, not that backlog.
fn wait_for_idle_pid1() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = pid1_cpu_ticks();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        let now = pid1_cpu_ticks();
        if let (Some(a), Some(b)) = (last, now)
            && b.saturating_sub(a) <= 2
        {
            return;
        }
        last = now;
    }
    eprintln!("PID 1 still busy after 2 minutes: measuring anyway");
}

/// How long the live test lets one start or stop take before it calls it a hang.
const LIVE_HANG: Duration = Duration::from_secs(180);

/// How many rounds each way goes through (`RSANDBOX_LIVE_ROUNDS`, default 5).
fn live_rounds() -> usize {
    std::env::var("RSANDBOX_LIVE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// Whether the real systemd is here to test against (root, its private socket).
fn live_systemd_here() -> bool {
    let here = std::path::Path::new(super::manager::PRIVATE_SOCKET).exists()
        && nix::unistd::getuid().is_root();
    if !here {
        // `cargo test -- --include-ignored` runs it on hosts without systemd too; the systemd
        // node and guest expect the gate (a misfire there fails the test).
        crate::testutil::skip(
            "live-systemd",
            "systemd's private socket is not here (or not root)",
        );
    }
    here
}

/// The two ways in to the real systemd, by name: the system bus (what the shim uses first, as
/// runc does), then the private socket alone.
fn live_ways() -> [(&'static str, Endpoints); 2] {
    [
        ("system bus", Endpoints::default()),
        (
            "private socket",
            Endpoints {
                system_bus: Ok(vec!["/nonexistent/system-bus".into()]),
                ..Endpoints::default()
            },
        ),
    ]
}

/// Against the real systemd (root, systemd as PID 1: the systemd guest): a process put in a
/// transient scope of system.slice through each way in (the system bus, then the private
/// socket alone) is in that scope's cgroup; after the stop the process is gone and so is the
/// scope's cgroup. Every round of each way must go through: a start or stop that gets no
/// answer fails the test (after asking `systemctl` for the same stop, and printing what it
/// got and what PID 1 was doing, for the diagnosis). Prints how long start and stop took (the
/// median of the rounds), once PID 1 is idle. Issue 27 item 10: the private socket's "lost"
/// StopUnit replies were our client's (`BEGIN` sent right before the first call, which sd-bus
/// then parked, see conn.rs), and rounds that lost them were not counted: the test passed
/// while that way never worked.
#[test]
#[ignore = "needs root and systemd as PID 1"]
fn live_systemd_scope_start_and_stop() {
    use std::path::Path;
    if !live_systemd_here() {
        return;
    }
    let unified = crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
    let rounds = live_rounds();
    for (way, endpoints) in live_ways() {
        wait_for_idle_pid1();
        let (mut starts, mut stops) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut child = std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap();
            let pid = child.id();
            let scope = PodScope {
                unit: format!("rsandbox-live-{pid}-{round}.scope"),
                slice: "system.slice".into(),
            };
            // Bounded at LIVE_HANG, not the shim's 30 s: this checks the client against the
            // real systemd and measures it; a PID 1 that stalls for tens of seconds under TCG
            // shows in the printed maximum.
            let t = Instant::now();
            let started = scope::start_within(&endpoints, &scope, "live", pid, unified, LIVE_HANG);
            starts.push(t.elapsed());
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let t = Instant::now();
            let stopped = scope::stop_within(&endpoints, &scope.unit, LIVE_HANG);
            stops.push(t.elapsed());
            if let Err(e) = &stopped {
                diagnose(way, round, &scope.unit, e);
            }
            let _ = child.kill();
            let status = child.wait().unwrap();
            if let Err(e) = &started {
                panic!("{way} round {round}: {e}");
            }
            if let Err(e) = &stopped {
                panic!("{way} round {round}: {e}");
            }
            assert!(
                cgroup.contains(&format!("/system.slice/{}", scope.unit)),
                "{way}: {cgroup}"
            );
            // StopUnit's SIGTERM ended it (kill above came too late to matter).
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGTERM), "{way}");
            if unified {
                let dir = Path::new("/sys/fs/cgroup/system.slice").join(&scope.unit);
                assert!(!dir.exists(), "{way}: {} is left", dir.display());
            }
        }
        starts.sort();
        stops.sort();
        eprintln!(
            "live systemd via {way}: {rounds} rounds, StartTransientUnit + job {:?} (median, max {:?}), StopUnit + job {:?} (median, max {:?})",
            starts[starts.len() / 2],
            starts.last().unwrap(),
            stops[stops.len() / 2],
            stops.last().unwrap()
        );
    }
}

/// What the live test prints when a stop fails: PID 1's state, and what `systemctl stop` of
/// the same unit gets (systemd's own client, on its private socket as root).
fn diagnose(way: &str, round: usize, unit: &str, e: &SystemdError) {
    eprintln!(
        "{way} round {round}: {e}; PID 1 CPU ticks {:?}",
        pid1_cpu_ticks()
    );
    for f in ["status", "wchan", "stack"] {
        let got = std::fs::read_to_string(format!("/proc/1/{f}"));
        eprintln!("/proc/1/{f}: {got:?}");
    }
    if e.unanswered() {
        let t = Instant::now();
        let ctl = std::process::Command::new("timeout")
            .args(["120", "systemctl", "stop", unit])
            .status();
        eprintln!(
            "{way} round {round}: systemctl stop {unit}: {ctl:?} after {:?}",
            t.elapsed()
        );
    }
}

/// Issue 27 item 6, against the real systemd: `systemctl daemon-reexec` while a job of ours
/// runs, through each way in. On the system bus systemd leaves the bus and comes back under a
/// new unique name: the job's end comes from that name and must be taken (before, the wait ran
/// to its deadline). On the private socket the re-exec closes the connection: the client
/// connects again and waits for the job there (before, the start failed at once). A scope's
/// start job ends at once, so the job here is a transient oneshot service's (`sleep 20`: a
/// re-exec takes seconds under TCG), the re-exec asked for 3 s into it (once the start call is
/// answered: a call in flight at the re-exec is answered NoReply by the bus daemon); the wait
/// is the same code.
#[test]
#[ignore = "needs root and systemd as PID 1"]
fn live_systemd_job_end_after_daemon_reexec() {
    if !live_systemd_here() {
        return;
    }
    for (way, endpoints) in live_ways() {
        wait_for_idle_pid1();
        let deadline = Instant::now() + LIVE_HANG;
        let mut m = Manager::connect(&endpoints, deadline).unwrap();
        let before = m.systemd_name().map(String::from);
        assert_eq!(before.is_some(), way == "system bus", "{way}");
        let unit = format!(
            "rsandbox-live-reexec-{}-{}.service",
            std::process::id(),
            before.is_some()
        );
        let exec = Value::Array(
            "(sasb)".into(),
            vec![Value::Struct(vec![
                Value::Str("/bin/sleep".into()),
                Value::strings(&["sleep", "20"]),
                Value::Bool(false),
            ])],
        );
        let reexec = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_secs(3));
            let t = Instant::now();
            let s = std::process::Command::new("systemctl")
                .arg("daemon-reexec")
                .status();
            (s, t.elapsed())
        });
        let t = Instant::now();
        let r = m.start_transient_unit(
            &unit,
            vec![
                ("Type".into(), Value::Str("oneshot".into())),
                ("ExecStart".into(), exec),
            ],
            deadline,
        );
        let took = t.elapsed();
        let (reexec_status, reexec_took) = reexec.join().unwrap();
        let after = m.systemd_name().map(String::from);
        eprintln!(
            "live daemon-reexec via {way}: systemctl daemon-reexec {reexec_status:?} after \
             {reexec_took:?}; systemd on the bus {before:?} -> {after:?}; the start job's end \
             after {took:?}: {r:?}"
        );
        let _ = scope::stop_within(&endpoints, &unit, LIVE_HANG);
        assert!(reexec_status.unwrap().success(), "{way}");
        if way == "system bus" {
            assert_ne!(
                before, after,
                "systemd kept its unique name: no re-exec seen"
            );
        }
        r.unwrap();
    }
}

/// A full listen backlog (the peer is slow to accept): the connect is tried again until the
/// peer accepts, not taken as made (a non-blocking unix connect's EAGAIN is nothing under
/// way: the first write would fail ENOTCONN).
#[test]
fn a_full_listen_backlog_is_waited_out() {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    // Backlog 0 holds one pending connection: this one fills it.
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::from(fd);
    let filler = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
        Conn::connect(&path, soon()).map(|_| ())
    });
    let tid = rx.recv().unwrap();
    // Accept only once the client waits between attempts (or gave up): its first connect
    // met the full backlog.
    let sleeping = || {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
            .is_some_and(|nr| nr == libc::SYS_nanosleep || nr == libc::SYS_clock_nanosleep)
    };
    while !sleeping() && !client.is_finished() {
        std::thread::yield_now();
    }
    let (first, _) = listener.accept().unwrap();
    drop((first, filler));
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
        s.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
            .unwrap();
        let _ = s.read(&mut b);
    });
    client.join().unwrap().unwrap();
    server.join().unwrap();
}
