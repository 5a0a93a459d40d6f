//! A task's and an exec's lifecycle and events, the answers to unknown or bad ids and specs,
//! Pause/Resume/Update/Stats, Shutdown.

use super::*;

#[test]
fn lifecycle_publishes_events_in_order_and_cleans_up() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    assert!(pid as i32 >= FAKE_PID_BASE);
    assert_eq!(f.host.mounted.lock().unwrap().len(), 1);
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::CREATED
    );
    assert_eq!(f.start("t1", "").unwrap().pid, pid);

    let tm = f.tm.clone();
    let waiter = std::thread::spawn(move || tm.wait_blocking("t1", "").unwrap());
    f.exit(pid, 3);
    assert_eq!(waiter.join().unwrap().status, 3);
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::STOPPED
    );
    assert_eq!(st.exit_status, 3);

    let del = f.delete("t1", "").unwrap();
    assert_eq!((del.pid, del.exit_status), (pid, 3));
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ]
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    // The init is gone: a plain `runc delete`, as containerd's runc shim (`--force` sleeps
    // 100 ms from runc 1.2 on).
    assert_eq!(
        f.host.runtime.calls(),
        ["create t1", "start t1", "delete t1 false"]
    );
    assert_eq!(code(f.state("t1")), Code::NOT_FOUND);
}

#[test]
fn an_exit_during_start_is_published_after_start() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let tm = f.tm.clone();
    *f.host.runtime.on_start.lock().unwrap() = Some(Box::new(move || {
        tm.on_exit(Exit {
            pid: pid as i32,
            status: 0,
            at: SystemTime::now(),
        })
    }));
    f.start("t1", "").unwrap();
    assert_eq!(
        f.events.topics(),
        ["/tasks/create", "/tasks/start", "/tasks/exit"]
    );
    assert_eq!(f.tm.wait_blocking("t1", "").unwrap().status, 0);
}

#[test]
fn unknown_ids_answer_not_found_everywhere() {
    let f = fixture();
    let c = ctx();
    // Calls that take only an ID, each given one nobody knows.
    macro_rules! not_found {
        ($($call:ident($req:ident)),+) => {$(
            let r = f.svc.$call(&c, $req { id: "nope".into(), ..Default::default() });
            assert_eq!(code(r), Code::NOT_FOUND, stringify!($call));
        )+};
    }
    not_found!(
        state(StateRequest),
        start(StartRequest),
        delete(DeleteRequest)
    );
    assert_eq!(code(f.kill("nope", "", 9, false)), Code::NOT_FOUND);
    not_found!(
        wait(WaitRequest),
        pids(PidsRequest),
        pause(PauseRequest),
        resume(ResumeRequest)
    );
    assert_eq!(code(f.exec("nope", "e1")), Code::NOT_FOUND);
    not_found!(
        resize_pty(ResizePtyRequest),
        close_io(CloseIORequest),
        update(UpdateTaskRequest),
        stats(StatsRequest),
        connect(ConnectRequest)
    );
    f.create("t1").unwrap();
    assert_eq!(
        code(f.svc.state(
            &c,
            StateRequest {
                id: "t1".into(),
                exec_id: "e9".into(),
                ..Default::default()
            }
        )),
        Code::NOT_FOUND
    );
}

#[test]
fn bad_ids_and_paths_are_invalid_arguments() {
    let f = fixture();
    let c = ctx();
    for bad in ["a/b", "..", "", "-x"] {
        let r = f.svc.create(&c, create_req(bad, "/tmp"));
        assert_eq!(code(r), Code::INVALID_ARGUMENT, "{bad:?}");
        assert_eq!(code(f.state(bad)), Code::INVALID_ARGUMENT);
    }
    let r = f.svc.create(&c, create_req("t1", "relative/b"));
    assert!(message(r).contains("must be an absolute path"));
    let bundle = f.bundle("t2", SPEC);
    let r = f.svc.create(
        &c,
        CreateTaskRequest {
            stdout: "tcp://x".into(),
            ..create_req("t2", &bundle)
        },
    );
    assert_eq!(code(r), Code::INVALID_ARGUMENT);
    f.create("t3").unwrap();
    f.start("t3", "").unwrap();
    assert_eq!(code(f.exec("t3", "../e")), Code::INVALID_ARGUMENT);
    assert!(
        f.host.runtime.calls().iter().all(|c| !c.contains("t2")),
        "t2 reached the runtime"
    );
}

#[test]
fn malformed_spec_is_rejected_before_mounting() {
    let f = fixture();
    for (spec, why) in [
        ("not json", "parse"),
        (r#"{"root":{"path":"rootfs"}}"#, "ociVersion"),
        (
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":[]}}"#,
            "no args",
        ),
        (
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":["sh"],"terminal":true}}"#,
            "terminal",
        ),
    ] {
        let bundle = f.bundle("bad", spec);
        let r = f.svc.create(&ctx(), create_req("bad", &bundle));
        let msg = message(r);
        assert!(
            msg.starts_with("create task bad: ") && msg.contains(why),
            "{msg}"
        );
    }
    assert!(f.host.mounted.lock().unwrap().is_empty());
    assert!(f.host.runtime.calls().is_empty());
}

#[test]
fn a_failed_create_leaves_nothing_and_the_id_can_be_reused() {
    let f = fixture();
    f.fail(
        "create",
        Error::internal("runc create: exec: \"nope\": not found"),
    );
    let msg = message(f.create("t1"));
    assert_eq!(
        msg,
        "create task t1: runc create: exec: \"nope\": not found"
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    f.host.runtime.fail.lock().unwrap().clear();
    f.create("t1").unwrap();

    *f.host.fail_mount.lock().unwrap() = true;
    let msg = message(f.create("t2"));
    assert!(msg.contains("mount rootfs[0]"), "{msg}");
}

#[test]
fn create_twice_is_already_exists_and_running_delete_is_refused() {
    let f = fixture();
    f.create("t1").unwrap();
    assert_eq!(code(f.create("t1")), Code::ALREADY_EXISTS);
    f.start("t1", "").unwrap();
    let r = f.delete("t1", "");
    assert_eq!(code(r), Code::FAILED_PRECONDITION);
    assert_eq!(code(f.start("t1", "")), Code::FAILED_PRECONDITION);
}

/// The init's exit is checked for an OOM kill the watch missed, and its TaskOOM goes out
/// before its TaskExit; an exec's exit is not checked (its container lives on).
#[test]
fn an_init_exit_is_checked_for_an_oom_kill_before_its_task_exit() {
    let f = fixture();
    *f.host.oom_sink.lock().unwrap() = Some(f.events.clone());
    let init = f.create("t1").unwrap().pid;
    f.start("t1", "").unwrap();
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid;
    f.exit(epid, 137);
    assert!(f.host.oom_checks.lock().unwrap().is_empty());
    f.exit(init, 137);
    assert_eq!(*f.host.oom_checks.lock().unwrap(), ["t1"]);
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exec-added",
            "/tasks/exec-started",
            "/tasks/exit",
            "/tasks/oom",
            "/tasks/exit"
        ]
    );
}

#[test]
fn exec_lifecycle_and_init_exit_waits_for_execs() {
    let f = fixture();
    let init = f.create("t1").unwrap().pid;
    f.start("t1", "").unwrap();
    f.exec("t1", "e1").unwrap();
    assert_eq!(code(f.exec("t1", "e1")), Code::ALREADY_EXISTS);
    let epid = f.start("t1", "e1").unwrap().pid;
    assert_ne!(epid, init);
    *f.host.runtime.ps.lock().unwrap() = vec![init as i32, epid as i32];
    let pids = f
        .svc
        .pids(
            &ctx(),
            PidsRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(pids.processes.len(), 2);
    assert!(pids.processes[0].info.is_none());
    assert_eq!(
        pids.processes[1].info.type_url,
        "containerd.runc.v1.ProcessDetails"
    );

    f.kill("t1", "e1", 15, false).unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), vec![(epid as i32, 15)]);

    // The init dies first; its exit must still come after the exec's.
    f.exit(init, 137);
    assert_eq!(
        f.tm.process("t1", "").unwrap().1.state().visible_exit(),
        None,
        "the init's exit waits for its exec's"
    );
    f.exit(epid, 143);
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exec-added",
            "/tasks/exec-started",
            "/tasks/exit",
            "/tasks/exit"
        ]
    );
    let exits: Vec<String> = f
        .events
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| {
            if let crate::shim::events::Event::Exit(x) = e {
                Some(x.id.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(exits, ["e1", "t1"]);
    let d = f.delete("t1", "e1").unwrap();
    assert_eq!(d.exit_status, 143);
    assert_eq!(code(f.kill("t1", "", 9, false)), Code::NOT_FOUND);
}

#[test]
fn pause_resume_update_stats_and_checkpoint() {
    let f = fixture();
    f.create("t1").unwrap();
    assert_eq!(code(f.pause("t1")), Code::FAILED_PRECONDITION);
    f.start("t1", "").unwrap();
    f.pause("t1").unwrap();
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::PAUSED
    );
    f.resume("t1").unwrap();
    assert!(
        f.events
            .topics()
            .ends_with(&["/tasks/paused", "/tasks/resumed"])
    );

    let bad = UpdateTaskRequest {
        id: "t1".into(),
        resources: MessageField::some(Any {
            value: b"[1]".to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(code(f.svc.update(&ctx(), bad)), Code::INVALID_ARGUMENT);
    let good = UpdateTaskRequest {
        id: "t1".into(),
        resources: MessageField::some(Any {
            value: br#"{"memory":{"limit":1048576}}"#.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.svc.update(&ctx(), good).unwrap();
    let s = f
        .svc
        .stats(
            &ctx(),
            StatsRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.stats.type_url, "io.containerd.cgroups.v1.Metrics");
    let r = f.svc.checkpoint(
        &ctx(),
        CheckpointTaskRequest {
            id: "t1".into(),
            ..Default::default()
        },
    );
    assert_eq!(code(r), Code::UNIMPLEMENTED);
}

#[test]
fn shutdown_exits_only_without_tasks() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    f.shutdown("t1").unwrap();
    assert_eq!(f.shutdowns.load(Ordering::SeqCst), 0);
    f.start("t1", "").unwrap();
    f.exit(pid, 0);
    f.delete("t1", "").unwrap();
    f.shutdown("t1").unwrap();
    assert_eq!(f.shutdowns.load(Ordering::SeqCst), 1);
    // The shim is exiting: a Create now would be left behind.
    assert_eq!(code(f.create("t2")), Code::FAILED_PRECONDITION);
    assert!(!f.host.runtime.calls().contains(&"create t2".to_string()));
}
