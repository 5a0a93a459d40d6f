//! A pod scope's start and stop: its properties, its job and the deadlines, systemd's errors,
//! a unit that exists already, and the undo of a failed start.

use super::*;

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
