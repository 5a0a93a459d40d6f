//! A pod whose cgroup parent is a systemd slice: the pause in a scope of that slice, and
//! what a slow or failing systemd leaves.

use super::*;

/// A slice parent (systemd cgroup driver): the pause goes into the scope
/// `cri-containerd-<id>.scope` of that slice through systemd (v1 or v2 is the host's
/// business, see `pod::scope`); the record names it before systemd is asked (for `delete`), the spec carries the runc path's
/// `slice:prefix:name` cgroupsPath, the pod's statistics come from the expanded slice, and
/// StopSandbox and ShutdownSandbox stop the scope after the pause is dead. The same for the
/// slice's expanded path (what the kubelet sends) as for its bare unit name.
#[test]
fn a_slice_parent_puts_the_pause_in_a_systemd_scope_of_that_slice() {
    for parent in [
        "kubepods-besteffort-pod1.slice",
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
    ] {
        pause_in_the_scope_of(parent);
    }
}

fn pause_in_the_scope_of(parent: &str) {
    let f = fixture();
    f.create("pod1", with_cgroup_parent(parent)).unwrap();
    // The pause is in the record before systemd is asked for its scope (which may take
    // 30 s): a shim killed meanwhile leaves a pause that `delete` finds.
    let record_file = f.state_file("pod1");
    let seen = Arc::new(Mutex::new(None));
    let (r, s) = (record_file.clone(), seen.clone());
    *f.host.on_join_scope.lock().unwrap() = Some(Box::new(move || {
        let rec: SandboxRecord = serde_json::from_slice(&std::fs::read(&r).unwrap()).unwrap();
        *s.lock().unwrap() = Some(rec.pause_pid);
    }));
    let start = f.start("pod1").unwrap();
    assert_eq!(*seen.lock().unwrap(), Some(PAUSE_PID));
    let calls = f.host.calls();
    let spawn = calls.iter().position(|c| c == "spawn_pause").unwrap();
    assert_eq!(
        calls[spawn + 1],
        format!(
            "join_scope cri-containerd-pod1.scope kubepods-besteffort-pod1.slice pod1 {PAUSE_PID}"
        ),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.starts_with("join_cgroup")),
        "{calls:?}"
    );
    let spec: serde_json::Value = serde_json::from_slice(&start.spec.value).unwrap();
    assert_eq!(
        spec["linux"]["cgroupsPath"],
        "kubepods-besteffort-pod1.slice:cri-containerd:pod1"
    );
    let record = f.record("pod1");
    assert_eq!(
        record.cgroup.scope.as_ref().map(|s| s.unit.as_str()),
        Some("cri-containerd-pod1.scope")
    );
    f.metrics("pod1").unwrap();
    assert!(
        f.host.calls().contains(
            &"metrics /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice"
                .to_string()
        ),
        "{:?}",
        f.host.calls()
    );
    // The pause has exited (its scope is empty): the scope is stopped all the same,
    // not left to systemd's garbage collection.
    f.pause_exits(0);
    let before = f.host.calls().len();
    f.stop("pod1").unwrap();
    assert_eq!(
        f.host.calls()[before..],
        [
            "unmount_shm".to_string(),
            "stop_scope cri-containerd-pod1.scope".to_string()
        ]
    );
    // Stopped: ShutdownSandbox does not ask systemd again.
    f.shutdown("pod1").unwrap();
    assert_eq!(
        f.host.calls_to("stop_scope").len(),
        1,
        "{:?}",
        f.host.calls()
    );
}

/// No systemd (this machine): StartSandbox fails naming it, the pause is killed, and the
/// record no longer names a scope; a later ShutdownSandbox cleans up as for any pod.
#[test]
fn a_slice_parent_without_systemd_fails_start_and_leaves_no_pause() {
    let f = fixture();
    *f.host.fail_scope.lock().unwrap() = Some(
        "systemd is not reachable at /run/systemd/private: connect: No such file or directory"
            .into(),
    );
    f.create_in_slice("pod1");
    let e = f.start("pod1").unwrap_err();
    assert_eq!(
        code(Err::<(), _>(e.clone())),
        Code::FAILED_PRECONDITION,
        "{e:?}"
    );
    let text = format!("{e:?}");
    assert!(
        text.contains("systemd is not reachable at /run/systemd/private"),
        "{text}"
    );
    assert!(text.contains("systemd scope of the pod slice"), "{text}");
    assert!(
        f.host.calls().contains(&format!("kill {PAUSE_PID}")),
        "{:?}",
        f.host.calls()
    );
    let record = f.record("pod1");
    assert_eq!(record.cgroup, PodCgroup::default());
    assert_eq!(record.pause_pid, 0);
    f.shutdown("pod1").unwrap();
}

/// A slow systemd: StartTransientUnit and the undo both time out. systemd may still run the
/// queued start, with the pause's pid: issue 27 item 2, the pause is not killed then (its pid
/// would be free for another process, which a late start would put in the pod's scope and
/// the teardown's StopUnit kill) but kept, recorded, the pod NOTREADY; the record keeps
/// naming the scope, and ShutdownSandbox (containerd's answer to the failed start) stops the
/// scope first, then kills the pause.
#[test]
fn a_scope_whose_undo_failed_stays_in_the_record_and_shutdown_stops_it() {
    let f = fixture_whose_scope_start_gets_no_answer();
    f.start("pod1").unwrap_err();
    assert!(
        f.host.calls_to("kill").is_empty(),
        "the pause was killed while systemd may still run its start: {:?}",
        f.host.calls()
    );
    let record = f.record("pod1");
    assert_eq!(
        record.cgroup.scope.as_ref().map(|s| s.unit.as_str()),
        Some("cri-containerd-pod1.scope")
    );
    assert_eq!(record.pause_pid, PAUSE_PID, "the kept pause is recorded");
    assert_eq!(f.status("pod1").unwrap().state, "SANDBOX_NOTREADY");
    // Not started twice over the kept pause.
    let e = f.start("pod1").unwrap_err();
    assert!(format!("{e:?}").contains("already started"), "{e:?}");
    // The pause exits once killed (the fake's kill only logs it).
    let exits = f.pause_exits_once_killed();
    f.shutdown("pod1").unwrap();
    exits.join().unwrap();
    let calls = f.host.calls();
    let stop = calls
        .iter()
        .position(|c| c == "stop_scope cri-containerd-pod1.scope")
        .unwrap_or_else(|| panic!("{calls:?}"));
    let kill = calls
        .iter()
        .position(|c| *c == format!("kill {PAUSE_PID}"))
        .unwrap_or_else(|| panic!("{calls:?}"));
    assert!(
        stop < kill,
        "the scope is stopped while the pause lives: {calls:?}"
    );
}

/// The state letter of `pid` in /proc (`Z` a zombie), or "gone".
fn proc_state(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.get(s.rfind(')')? + 2..)?;
            rest.split(' ').next().map(String::from)
        })
        .unwrap_or_else(|| "gone".into())
}

/// The pids of StartTransientUnit's `PIDs` property.
fn pids_of(call: &crate::host::systemd::wire::Message) -> Vec<i32> {
    use crate::host::systemd::wire::Value;
    let body = call.body().unwrap();
    let Value::Array(_, props) = &body[2] else {
        panic!("{body:?}")
    };
    props
        .iter()
        .find_map(|p| match p {
            Value::Struct(kv) if kv[0] == Value::Str("PIDs".into()) => match &kv[1] {
                Value::Variant(v) => match &**v {
                    Value::Array(_, pids) => {
                        Some(pids.iter().map(|p| p.as_u32().unwrap() as i32).collect())
                    }
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        })
        .unwrap()
}

/// Issue 27 item 2, in a PID namespace of its own (root): the pause dies while systemd works
/// on its StartTransientUnit, and right then another process is forced onto the pause's pid
/// (`/proc/sys/kernel/ns_last_pid`). The pause's pid is held unreaped through the join: the
/// forced process gets another pid, the pid systemd was given names the pause's zombie when
/// systemd acts on it (the fake looks then: what a real systemd would put in the scope), and
/// the start fails (the pause is gone, seen through its pidfd) with the scope stopped. Before,
/// the reaper reaped the pause at once and the forced process got its pid: systemd would have
/// put it in the pod's scope, and the teardown's StopUnit would have killed it.
#[test]
#[ignore = "needs root: a PID namespace of its own (unshare --pid --fork --mount-proc)"]
fn a_pause_that_dies_while_systemd_is_asked_never_lends_its_pid() {
    use crate::host::systemd::fake::{FakeSystemd, job_removed, reply};
    use crate::host::systemd::wire::Value;
    if !in_own_pid_namespace(
        "server::rpc::tests::sandbox::scope::a_pause_that_dies_while_systemd_is_asked_never_lends_its_pid",
    ) {
        return;
    }
    let reaper = crate::shim::reaper::Reaper::start().unwrap();
    let f = fixture_with(Some(reaper.clone()), None);
    let sm = Arc::downgrade(&f.sm);
    reaper.set_handler(move |e| {
        if let Some(sm) = sm.upgrade() {
            sm.on_exit(e)
        }
    });
    let seen = Arc::new(Mutex::new(Vec::<(String, i32, String)>::new()));
    let s = seen.clone();
    const JOB: &str = "/org/freedesktop/systemd1/job/1";
    let fake = FakeSystemd::serve(
        2,
        Box::new(move |call| match call.member.as_deref() {
            Some("StartTransientUnit") => {
                let pause = pids_of(call)[0];
                // The pause dies while systemd works on the call.
                // SAFETY: kill(2) of the pid given, a live child of this process.
                unsafe { libc::kill(pause, libc::SIGKILL) };
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !["Z", "gone"].contains(&proc_state(pause).as_str())
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                // Give a few moments for a reaper that would take it.
                std::thread::sleep(std::time::Duration::from_millis(200));
                s.lock()
                    .unwrap()
                    .push(("pause".into(), pause, proc_state(pause)));
                std::fs::write("/proc/sys/kernel/ns_last_pid", (pause - 1).to_string()).unwrap();
                let forced = std::process::Command::new("sleep")
                    .arg("3600")
                    .spawn()
                    .unwrap();
                let forced_pid = forced.id() as i32;
                std::mem::forget(forced); // ends with the namespace
                s.lock()
                    .unwrap()
                    .push(("forced".into(), forced_pid, proc_state(forced_pid)));
                // What systemd would put in the scope: whatever the pid names now.
                s.lock()
                    .unwrap()
                    .push(("scope gets".into(), pause, proc_state(pause)));
                vec![
                    reply(call, &[Value::ObjectPath(JOB.into())]),
                    job_removed(1, JOB, "cri-containerd-pod1.scope", "done"),
                ]
            }
            Some("StopUnit") => vec![
                reply(call, &[Value::ObjectPath(JOB.into())]),
                job_removed(1, JOB, "cri-containerd-pod1.scope", "done"),
            ],
            _ => vec![reply(call, &[])],
        }),
    );
    *f.host.real_pause.lock().unwrap() = true;
    *f.host.systemd.lock().unwrap() = Some(fake.endpoints());
    f.create_in_slice("pod1");
    let e = f.start("pod1").unwrap_err();
    let seen = seen.lock().unwrap().clone();
    eprintln!("{seen:?}");
    let pause = seen[0].1;
    assert_eq!(
        seen[0].2, "Z",
        "the pause was reaped while systemd held its pid: {seen:?}"
    );
    assert_ne!(
        seen[1].1, pause,
        "the forced process got the pause's pid: {seen:?}"
    );
    assert_eq!(seen[2].2, "Z", "the pid named another process: {seen:?}");
    assert!(
        format!("{e:?}").contains("exited while it was put in the pod's systemd scope"),
        "{e:?}"
    );
    assert_eq!(
        fake.finish_members(),
        ["StartTransientUnit", "StopUnit", "ResetFailedUnit"]
    );
    // Released: the reaper takes the zombie now.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while proc_state(pause) != "gone" && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(proc_state(pause), "gone");
}

/// A scope that StopSandbox could not stop (systemd did not answer) is not forgotten:
/// ShutdownSandbox tries again and, while systemd still does not answer, fails and keeps the
/// record for containerd's retry, which succeeds once systemd answers. A scope StopSandbox
/// stopped is not asked for again.
#[test]
fn a_scope_stop_systemd_did_not_answer_fails_shutdown_until_it_does() {
    let f = fixture();
    f.create_in_slice("pod1");
    f.start("pod1").unwrap();
    *f.host.fail_stop_scope.lock().unwrap() = true;
    f.stop("pod1").unwrap();
    let e = f.shutdown("pod1").unwrap_err();
    assert!(
        format!("{e:?}").contains("stop the pod's systemd scope"),
        "{e:?}"
    );
    assert!(f.state_file("pod1").exists());
    *f.host.fail_stop_scope.lock().unwrap() = false;
    f.shutdown("pod1").unwrap();
    assert!(!f.state_file("pod1").exists());
    let stops = |f: &Fixture| f.host.calls_to("stop_scope").len();
    assert_eq!(stops(&f), 4, "{:?}", f.host.calls());

    let f = fixture();
    f.create_in_slice("pod1");
    f.start("pod1").unwrap();
    f.stop("pod1").unwrap();
    f.shutdown("pod1").unwrap();
    assert_eq!(stops(&f), 1, "{:?}", f.host.calls());
}

/// A parent in the `slice:prefix:name` form names a container's cgroup, not a pod's: refused
/// before the pause.
#[test]
fn a_slice_prefix_name_parent_is_refused_before_the_pause() {
    let f = fixture();
    f.create("pod1", with_cgroup_parent("system.slice:rsandbox:abc"))
        .unwrap();
    let e = f.start("pod1").unwrap_err();
    assert_eq!(
        code(Err::<(), _>(e.clone())),
        Code::INVALID_ARGUMENT,
        "{e:?}"
    );
    assert!(!f.host.calls().contains(&"spawn_pause".to_string()));
}

/// Without a pod cgroup the pause shares the shim's cgroup: the spec must not name that as
/// the pod's (an NRI plugin would adjust the shim's cgroup).
#[test]
fn the_spec_names_no_cgroup_when_the_pod_has_none() {
    use crate::records::cri;
    let f = fixture();
    let mut cfg = cri::PodSandboxConfig::new();
    cfg.hostname = "h".into();
    cfg.metadata.mut_or_insert_default().name = "web".into();
    f.create("pod1", any_config(&cfg)).unwrap();
    let start = f.start("pod1").unwrap();
    let spec: serde_json::Value = serde_json::from_slice(&start.spec.value).unwrap();
    assert!(spec["linux"].get("cgroupsPath").is_none(), "{spec}");
    assert!(
        spec["linux"]["namespaces"]
            .as_array()
            .is_some_and(|n| !n.is_empty())
    );
}
