//! An exec's Start under way: what it holds up (nothing else of its container), what Kill and
//! Delete do meanwhile, a Start that panics; a systemd cgroups path.

use super::*;

/// Registers exec `exec_id` of `id` with a terminal or without.
fn exec_with_terminal(f: &Fixture, id: &str, exec_id: &str, terminal: bool) {
    f.svc
        .exec(
            &ctx(),
            ExecProcessRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                terminal,
                spec: process_spec(br#"{"args":["sh"],"cwd":"/"}"#),
                ..Default::default()
            },
        )
        .unwrap();
}

/// Issue 20 item 2: an exec whose runc connects to the console socket and then sends nothing
/// (a real `Runc` with a stand-in binary, its timeout shortened) fails at that timeout, and
/// meanwhile another exec's Start, an exec's Delete and Pause/Resume of the container go
/// through: they used to queue behind it on the container's lifecycle lock.
#[test]
fn a_hung_exec_start_holds_up_nothing_else_of_its_container() {
    use crate::host::runtime::Runc;
    use crate::shim::reaper::Spawner;
    use std::time::Duration;
    let f = fixture();
    running(&f, "t1");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("runc");
    std::fs::write(&bin, format!("#!/bin/sh\n{FAKE_RUNC_EXEC}\n")).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Generous: what follows must finish while the hung exec waits; only its end is awaited.
    let timeout = Duration::from_secs(15);
    let runc = Runc::new(
        RuncConfig {
            binary: bin.display().to_string(),
            root: dir.path().join("root"),
            ..RuncConfig::defaults("ns")
        },
        Spawner::direct(),
        dir.path().join("s"),
    )
    .with_timeout(timeout);
    *f.host.runtime.exec_via.lock().unwrap() = Some(Arc::new(runc));

    // An exec that ran and ended, to be deleted meanwhile.
    exec_with_terminal(&f, "t1", "done", false);
    let done = f.start("t1", "done").unwrap().pid;
    f.exit(done, 0);
    exec_with_terminal(&f, "t1", "hung", true);
    exec_with_terminal(&f, "t1", "other", false);

    let (tx, rx) = std::sync::mpsc::channel();
    let tm = f.tm.clone();
    std::thread::spawn(move || {
        let _ = tx.send(tm.start("t1", "hung"));
    });
    let (conn, runc_pid) = connect_as_runc(dir.path());

    // While its runc sits on the console socket:
    f.delete("t1", "done").unwrap();
    let other = f.start("t1", "other").unwrap().pid;
    f.pause("t1").unwrap();
    f.resume("t1").unwrap();
    f.exit(other, 0);
    f.delete("t1", "other").unwrap();
    // A second Start or a Delete of the hung exec is refused at once, not queued.
    assert_eq!(code(f.start("t1", "hung")), Code::FAILED_PRECONDITION);
    assert_eq!(code(f.delete("t1", "hung")), Code::FAILED_PRECONDITION);
    assert!(
        rx.try_recv().is_err(),
        "all of the above finished only after the hung exec gave up ({timeout:?}): they \
         queued behind it"
    );

    let e = rx
        .recv_timeout(timeout + Duration::from_secs(120))
        .expect("the hung exec never gave up")
        .unwrap_err();
    assert!(
        e.message()
            .contains("timed out waiting for runc to send the console"),
        "{e}"
    );
    assert_eq!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(runc_pid), None),
        Err(nix::Error::ESRCH),
        "its runc was killed and reaped"
    );
    drop(conn);
    // It failed to start: its Wait answers, and it can be deleted.
    assert_eq!(
        f.tm.wait_blocking("t1", "hung").unwrap().status,
        UNKNOWN_EXIT_STATUS
    );
    f.delete("t1", "hung").unwrap();
    let topics = f.events.topics();
    assert_eq!(
        topics
            .iter()
            .filter(|t| **t == "/tasks/exec-started")
            .count(),
        2,
        "done and other: {topics:?}"
    );
}

/// Starts exec `exec_id` of `id` on a thread and holds it inside `runc exec` until the
/// returned sender sends (or is dropped); returns once `runc exec` runs.
fn start_held_in_runc_exec(
    f: &Fixture,
    id: &str,
    exec_id: &str,
) -> (
    std::thread::JoinHandle<crate::records::error::Result<u32>>,
    std::sync::mpsc::Sender<()>,
) {
    use std::sync::mpsc;
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.lock().unwrap().recv();
    }));
    let tm = f.tm.clone();
    let (id, exec_id) = (id.to_string(), exec_id.to_string());
    let start = std::thread::spawn(move || tm.start(&id, &exec_id));
    entered_rx.recv().unwrap();
    (start, release_tx)
}

/// The container's Delete never orphans a starting exec: it waits until the exec's Start
/// has published its outcome (so TaskExecStarted precedes TaskDelete) before `runc delete`
/// (which kills what the exec started), and an exec Start that comes after the init ended
/// runs nothing.
#[test]
fn the_containers_delete_waits_for_an_exec_start_under_way() {
    use std::sync::mpsc;
    use std::time::Duration;
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    f.exec("t1", "late").unwrap();
    let (start, release_tx) = start_held_in_runc_exec(&f, "t1", "e1");
    // runc exec runs; the init dies meanwhile and the container's Delete comes.
    f.exit(init, 137);
    let tm = f.tm.clone();
    let (deleted_tx, deleted_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = deleted_tx.send(tm.delete("t1", ""));
    });
    // An exec Start after the init ended runs nothing, and is not held up by the Delete.
    assert_eq!(code(f.start("t1", "late")), Code::FAILED_PRECONDITION);
    // Not a timing assertion: the Delete may only be slow to get here, never early.
    assert!(
        deleted_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the Delete went ahead of a starting exec"
    );
    assert!(
        !f.host
            .runtime
            .calls()
            .iter()
            .any(|c| c.starts_with("delete t1")),
        "runc delete ran while runc exec did"
    );
    release_tx.send(()).unwrap();
    let pid = start.join().unwrap().unwrap();
    deleted_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Delete never went on")
        .unwrap();
    let calls = f.host.runtime.calls();
    let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
    assert!(at("exec t1 e1") < at("delete t1 false"), "{calls:?}");
    let topics = f.events.topics();
    let at = |t: &str| topics.iter().rposition(|x| *x == t).unwrap();
    assert!(
        at("/tasks/exec-started") < at("/tasks/delete"),
        "{topics:?}"
    );
    assert_eq!(topics.last(), Some(&"/tasks/delete"), "{topics:?}");
    assert!(f.tm.is_empty());
    assert_eq!(
        f.tm.watched_pids(),
        0,
        "pid {pid} of the exec is forgotten with its container"
    );
}

/// A Kill of an exec whose Start is running `runc exec` waits for that Start and signals the
/// process it made, as containerd's runc shim (its exec Kill waits for the lock its Start
/// holds): refused with "not started", a probe's exec killed at its timeout would run on.
#[test]
fn killing_an_exec_being_started_signals_the_process_its_start_makes() {
    use std::sync::mpsc;
    use std::time::Duration;
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let (start, release_tx) = start_held_in_runc_exec(&f, "t1", "e1");
    let tm = f.tm.clone();
    let (killed_tx, killed_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = killed_tx.send(tm.kill("t1", "e1", 9, false));
    });
    // Not a timing assertion: the Kill may only be slow to get here, never early.
    assert!(
        killed_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the Kill answered while the exec's Start still ran"
    );
    release_tx.send(()).unwrap();
    let pid = start.join().unwrap().unwrap();
    killed_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Kill never went on")
        .unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), [(pid as i32, 9)]);
}

/// An exec Start that unwinds (a panic inside it, caught per call) fails the exec: a Kill that
/// waits for Starts to settle answers instead of waiting for ever, and the exec can be deleted.
#[test]
fn an_exec_start_that_panics_fails_its_exec() {
    use std::time::Duration;
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let init_wait = park_wait(&f, "t1", "");
    // The init ends while the exec is being started (its exit is held for the exec's
    // TaskExecStarted), then the start unwinds.
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new({
        let exit = exit_later(&f, init, 3);
        move || {
            exit();
            panic!("inside runc exec")
        }
    }));
    let tm = f.tm.clone();
    assert!(
        std::thread::spawn(move || tm.start("t1", "e1"))
            .join()
            .is_err()
    );
    let tm = f.tm.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(tm.kill("t1", "e1", 9, false));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Kill waits for a Start that is gone")
        .unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert_eq!(
        f.tm.wait_blocking("t1", "e1").unwrap().status,
        UNKNOWN_EXIT_STATUS
    );
    // The exit the exec held back went out when its start failed.
    assert_eq!(
        init_wait
            .recv_timeout(Duration::from_secs(60))
            .expect("the init's Wait is answered")
            .status,
        3
    );
    assert_eq!(f.events.topics().last(), Some(&"/tasks/exit"));
    f.delete("t1", "e1").unwrap();
}

/// An exec's Delete takes it out of the table under the lock its Start claims it under: a
/// Start that looked the exec up before the Delete ran runs nothing (before, it could claim
/// the exec between the Delete's check and its removal, and `runc exec` started a process
/// nobody could reach any more).
#[test]
fn a_start_of_an_exec_its_delete_took_out_runs_nothing() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let (c, p) = f.tm.process("t1", "e1").unwrap();
    // The Delete's first half, then the Start that had looked the exec up.
    c.remove_exec("e1", &p).unwrap();
    let e = f.tm.start_process(&c, &p).unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert!(
        !f.host.runtime.calls().iter().any(|c| c.starts_with("exec")),
        "{:?}",
        f.host.runtime.calls()
    );
    // And a Start that claimed first makes the Delete refuse.
    f.exec("t1", "e2").unwrap();
    let (c, p) = f.tm.process("t1", "e2").unwrap();
    p.state().begin_start().unwrap();
    assert_eq!(
        c.remove_exec("e2", &p).unwrap_err().kind(),
        crate::records::error::Kind::FailedPrecondition
    );
    assert_eq!(c.exec_ids(), ["e2"]);
}

/// A container whose cgroupsPath has systemd's `slice:prefix:name` form (a pod with a
/// `.slice` parent) runs under runc's systemd cgroup driver, and its record says so for
/// `delete`; one with a cgroupfs path does not.
#[test]
fn a_systemd_cgroups_path_runs_the_container_with_runc_s_systemd_driver() {
    let f = fixture();
    for (id, path, systemd) in [
        (
            "c1",
            "kubepods-besteffort-pod1.slice:cri-containerd:c1",
            true,
        ),
        ("c2", "/kubepods/besteffort/pod1/c2", false),
    ] {
        let spec = SPEC.replace(
            r#""linux":{"#,
            &format!(r#""linux":{{"cgroupsPath":"{path}","#),
        );
        let bundle = f.bundle(id, &spec);
        f.svc.create(&ctx(), create_req(id, &bundle)).unwrap();
        let config = f.host.configs.lock().unwrap().last().cloned().unwrap();
        assert_eq!(config.systemd_cgroup, systemd, "{id}");
        let record: crate::task::TaskRecord = serde_json::from_slice(
            &std::fs::read(Path::new(&bundle).join(crate::task::TASK_STATE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(record.runc.systemd_cgroup, systemd, "{id}");
    }
}
