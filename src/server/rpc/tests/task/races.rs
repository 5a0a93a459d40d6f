//! Creates and execs racing the shim's close or a Delete, Connect, checkpoints, consoles, and the
//! Waits of processes that failed or never started.

use super::*;

#[test]
fn a_create_racing_the_shims_close_takes_itself_down() {
    let f = Arc::new(fixture());
    let (go_tx, inside_rx) = hold_creates(&f);
    let f2 = f.clone();
    let creating = std::thread::spawn(move || f2.create("t1").map(|r| r.pid));
    inside_rx.recv().unwrap(); // inside runc create, rootfs mounted
    assert_eq!(f.host.mounted.lock().unwrap().len(), 1);
    let f3 = f.clone();
    let closing = std::thread::spawn(move || {
        f3.tm
            .close(std::time::Instant::now() + std::time::Duration::from_secs(30))
    });
    // Let the Create go on only once close has begun (and waits for it).
    let t = std::time::Instant::now();
    while !f.tm.is_closed() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(f.tm.is_closed());
    go_tx.send(()).unwrap();
    // close returns only once the Create has ended, and the Create undid itself.
    assert!(closing.join().unwrap());
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"delete t1 true".to_string()),
        "{:?}",
        f.host.runtime.calls()
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs unmounted"
    );
    assert_eq!(code(creating.join().unwrap()), Code::FAILED_PRECONDITION);
    assert!(f.tm.is_empty());
    assert!(
        !f.events.topics().contains(&"/tasks/create"),
        "no TaskCreate for a container that never was"
    );
    assert_eq!(code(f.create("t2")), Code::FAILED_PRECONDITION);
}

#[test]
fn an_exec_racing_the_delete_of_its_container_is_not_found() {
    let f = fixture();
    let pid = running(&f, "t1");
    // The Exec looked the container up (and saw its init running) ...
    let c = f.tm.container("t1").unwrap();
    // ... then the init exited and the container was deleted ...
    f.exit(pid, 0);
    f.delete("t1", "").unwrap();
    // ... before the Exec registered its process.
    let p = crate::task::Process::new(
        "t1",
        Some("e1".into()),
        Default::default(),
        Some(b"{}".to_vec()),
    );
    let e = f.tm.add_exec(&c, p).unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert!(c.exec_ids().is_empty());
    let topics = f.events.topics();
    assert_eq!(topics.last(), Some(&"/tasks/delete"), "{topics:?}");
    assert!(!topics.contains(&"/tasks/exec-added"), "{topics:?}");
}

#[test]
fn connect_reports_shim_and_task_pids() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let r = f
        .svc
        .connect(
            &ctx(),
            ConnectRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((r.shim_pid, r.task_pid), (std::process::id(), pid));
}

#[test]
fn checkpoint_restore_on_create_is_unimplemented() {
    let f = fixture();
    let bundle = f.bundle("t1", SPEC);
    let r = f.svc.create(
        &ctx(),
        CreateTaskRequest {
            checkpoint: "/x".into(),
            ..create_req("t1", &bundle)
        },
    );
    assert_eq!(code(r), Code::UNIMPLEMENTED);
}

#[test]
fn a_terminal_without_a_console_takes_the_container_down_again() {
    let f = fixture();
    let spec = SPEC.replace("\"terminal\":false", "\"terminal\":true");
    let bundle = f.bundle("t1", &spec);
    let r = f.svc.create(
        &ctx(),
        CreateTaskRequest {
            terminal: true,
            ..create_req("t1", &bundle)
        },
    );
    assert!(message(r).contains("runc did not send a console"));
    assert_eq!(f.host.runtime.calls(), ["create t1", "delete t1 true"]);
    assert!(f.tm.is_empty());
}

#[test]
fn failed_exec_starts_answer_their_waits_and_leave_nothing_behind() {
    let f = fixture();
    let init = running(&f, "t1");
    f.fail(
        "exec",
        Error::internal("exec: \"nope\": executable file not found in $PATH"),
    );
    for i in 0..300 {
        let e = format!("probe{i}");
        f.exec("t1", &e).unwrap();
        let waited = park_wait(&f, "t1", &e);
        assert_eq!(code(f.start("t1", &e)), Code::INTERNAL);
        let exit = waited
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("a failed exec start must answer its Wait");
        assert_eq!(exit.status, UNKNOWN_EXIT_STATUS);
        // Wait after the failure answers at once, State says stopped.
        assert_eq!(f.tm.wait_blocking("t1", &e).unwrap().status, 255);
        assert_eq!(
            f.tm.state("t1", &e).unwrap().status,
            crate::task::Status::Stopped
        );
        f.delete("t1", &e).unwrap();
    }
    assert_eq!(f.tm.watched_pids(), 1, "only the init is watched");
    assert!(f.tm.container("t1").unwrap().exec_ids().is_empty());
    // No TaskExit for an exec that never ran (containerd's runc shim publishes none either),
    // and failed execs do not hold the init's exit back.
    assert!(!f.events.topics().contains(&"/tasks/exec-started"));
    f.exit(init, 0);
    assert_eq!(f.events.topics().last(), Some(&"/tasks/exit"));
}

#[test]
fn deleting_processes_nobody_started_answers_their_waits() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let exec_wait = park_wait(&f, "t1", "e1");
    let deleted = f.delete("t1", "e1").unwrap();
    // Delete answers 0, as containerd's runc shim (TestDeleteContainerExecCreated); the Wait
    // learns that the exec will never run.
    assert_eq!((deleted.exit_status, deleted.pid), (0, 0));
    assert_eq!(exec_wait.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);

    // A created, never started init (e.g. `ctr run` whose start failed), which `runc delete
    // --force` kills: its exit (137) is not the Delete's answer.
    let pid = f.create("t2").unwrap().pid;
    let init_wait = park_wait(&f, "t2", "");
    *f.host.runtime.on_delete.lock().unwrap() = Some(Box::new(exit_later(&f, pid, 137)));
    let deleted = f.delete("t2", "").unwrap();
    assert_eq!((deleted.exit_status, deleted.pid), (0, pid));
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t2 true");
    match f.events.events.lock().unwrap().last() {
        Some(crate::shim::events::Event::Delete(d)) => {
            assert_eq!((d.container_id.as_str(), d.exit_status), ("t2", 0))
        }
        other => panic!("expected TaskDelete last, got {other:?}"),
    }
    assert_eq!(init_wait.try_recv().unwrap().status, 137);

    // Deleting a container answers the Waits of its execs too.
    f.exec("t1", "e2").unwrap();
    let e2 = park_wait(&f, "t1", "e2");
    let pid = f.tm.task_pid("t1").unwrap();
    f.exit(pid, 9);
    f.delete("t1", "").unwrap();
    assert_eq!(e2.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t1 false");
}

#[test]
fn a_failed_init_start_answers_its_waits() {
    let f = fixture();
    f.create("t1").unwrap();
    let waited = park_wait(&f, "t1", "");
    f.fail("start", Error::internal("start failed"));
    assert_eq!(code(f.start("t1", "")), Code::INTERNAL);
    assert_eq!(waited.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    let m = message(f.start("t1", ""));
    assert!(m.contains("failed to start"), "{m}");
    // It can still be deleted (runc delete --force takes the created container down).
    f.delete("t1", "").unwrap();
    assert!(f.tm.is_empty());
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t1 true");
}
