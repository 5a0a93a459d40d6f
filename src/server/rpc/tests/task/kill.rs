//! The terminal an exec asks for, Kill (every signal, all, a finished process, a paused task)
//! and the Waits it answers.

use super::*;

#[test]
fn the_exec_request_decides_the_terminal() {
    let f = fixture();
    running(&f, "t1");
    // The container's own process spec (terminal false), with a request asking for a tty: what
    // containerd's Go client sends for task.Exec(..., cio.WithTerminal).
    f.svc
        .exec(
            &ctx(),
            ExecProcessRequest {
                id: "t1".into(),
                exec_id: "tty".into(),
                terminal: true,
                spec: process_spec(br#"{"args":["sh"],"terminal":false,"cwd":"/"}"#),
                ..Default::default()
            },
        )
        .unwrap();
    f.start("t1", "tty").unwrap();
    let specs = f.host.runtime.exec_specs.lock().unwrap().clone();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0]["terminal"], serde_json::json!(true));
    assert_eq!(specs[0]["cwd"], serde_json::json!("/"));
}

#[test]
fn kill_all_and_wait_all_cover_every_live_container() {
    let f = Arc::new(fixture());
    let p1 = running(&f, "a");
    let p2 = running(&f, "b");
    f.tm.kill_all();
    // Both have a pid namespace of their own: SIGKILL to the init is enough, no runc exec.
    let mut signals = f.host.signals.lock().unwrap().clone();
    signals.sort();
    assert_eq!(signals, [(p1 as i32, 9), (p2 as i32, 9)]);
    assert!(!f.host.runtime.calls().iter().any(|c| c.starts_with("kill")));
    let soon = std::time::Instant::now() + std::time::Duration::from_millis(50);
    assert!(!f.tm.wait_all(soon), "nothing exited yet");
    let f2 = f.clone();
    let exits = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        f2.exit(p1, 137);
        f2.exit(p2, 137);
    });
    let later = std::time::Instant::now() + std::time::Duration::from_secs(5);
    assert!(f.tm.wait_all(later));
    exits.join().unwrap();
    // A second kill_all skips ended containers.
    f.tm.kill_all();
    assert_eq!(f.host.signals.lock().unwrap().len(), 2);
    // A container in a shared pid namespace needs runc kill --all.
    let shared = SPEC.replace(r#"{"type":"pid"},"#, "");
    let bundle = f.bundle("c", &shared);
    f.svc.create(&ctx(), create_req("c", &bundle)).unwrap();
    f.start("c", "").unwrap();
    f.tm.kill_all();
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"kill c 9 true".to_string())
    );
}

#[test]
fn wait_on_an_unknown_process_is_not_found_and_parks_nothing() {
    let f = fixture();
    running(&f, "t1");
    for (id, exec) in [("t1", "nope"), ("nope", "")] {
        match f.tm.waitable(id, exec) {
            Err(e) => assert_eq!(e.kind(), crate::records::error::Kind::NotFound),
            Ok(_) => panic!("{id}/{exec} found"),
        }
    }
    let p = f.tm.waitable("t1", "").unwrap();
    assert_eq!(p.state().parked(), 0);
}

#[test]
fn killing_an_init_signals_it_directly_and_all_goes_through_runc() {
    let f = fixture();
    let pid = running(&f, "t1");
    let kill = |signal: u32, all: bool| f.kill("t1", "", signal, all);
    kill(15, false).unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), [(pid as i32, 15)]);
    kill(9, true).unwrap();
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"kill t1 9 true".to_string())
    );
    f.exit(pid, 143);
    assert_eq!(code(kill(15, false)), Code::NOT_FOUND);
    assert_eq!(
        f.host.signals.lock().unwrap().len(),
        1,
        "no signal to an ended process"
    );
}

/// Issue 14 item 1: every signal of 1..=SIGRTMAX reaches the process (SIGRTMIN+3 = 37 is
/// systemd's stop signal), for the init, an exec and `all`; 0 and above SIGRTMAX do not.
#[test]
fn kill_takes_every_signal_up_to_sigrtmax() {
    let f = fixture();
    let pid = running(&f, "t1") as i32;
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid as i32;
    let max = libc::SIGRTMAX() as u32;
    for sig in [1, 15, 34, 37, max] {
        f.kill("t1", "", sig, false).unwrap();
        f.kill("t1", "e1", sig, false).unwrap();
        f.kill("t1", "", sig, true).unwrap();
    }
    let signals = f.host.signals.lock().unwrap().clone();
    for sig in [1, 15, 34, 37, max] {
        assert!(
            signals.contains(&(pid, sig)),
            "{sig} to the init: {signals:?}"
        );
        assert!(
            signals.contains(&(epid, sig)),
            "{sig} to the exec: {signals:?}"
        );
        let all = format!("kill t1 {sig} true");
        assert!(f.host.runtime.calls().contains(&all), "{all}");
    }
    for bad in [0, max + 1, 1000, u32::MAX] {
        for (exec, all) in [("", false), ("e1", false), ("", true)] {
            let r = f.kill("t1", exec, bad, all);
            assert_eq!(code(r), Code::INVALID_ARGUMENT, "{bad}");
        }
    }
    assert_eq!(f.host.signals.lock().unwrap().len(), signals.len());
}

/// Issue 14 item 1: a Kill of a process that has ended answers NotFound "process already
/// finished", and one with `all` succeeds, and neither runs anything (no runc kill --all on a
/// stopped container: containerd's CRI sends exactly that, Kill(SIGKILL, all), after every
/// TaskExit), whether the exit is visible or only reaped (held back by a running exec).
#[test]
fn kill_of_a_finished_process_is_not_found_and_runs_nothing() {
    let f = fixture();
    let pid = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid;
    f.exit(pid, 0); // held: the exec still runs
    assert_eq!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::RUNNING
    );
    let calls_before = f.host.runtime.calls().len();
    for sig in [9, 15] {
        let kill = || f.kill("t1", "", sig, false);
        assert_eq!(code(kill()), Code::NOT_FOUND);
        let m = message(kill());
        assert!(m.contains("process already finished"), "{m}");
        f.kill("t1", "", sig, true).unwrap();
    }
    f.exit(epid, 137);
    assert_eq!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::STOPPED
    );
    for exec in ["", "e1"] {
        let r = f.kill("t1", exec, 9, false);
        assert_eq!(code(r), Code::NOT_FOUND, "{exec}");
    }
    f.kill("t1", "", 9, true).unwrap();
    assert_eq!(f.host.runtime.calls().len(), calls_before, "runc ran");
    assert!(
        f.host.signals.lock().unwrap().is_empty(),
        "a signal was sent"
    );
}

/// Issue 14 item 2: SIGKILL to a paused task (init, `all`, and StopSandbox's kill_all) thaws
/// its cgroup after the signal, as runc does; other signals and running tasks do not.
#[test]
fn sigkill_thaws_a_paused_task() {
    let f = fixture();
    running(&f, "t1");
    let thaws = || f.host.thaws.load(Ordering::SeqCst);
    f.kill("t1", "", 15, false).unwrap();
    assert_eq!(thaws(), 0, "not paused");
    f.pause("t1").unwrap();
    f.kill("t1", "", 15, false).unwrap();
    f.kill("t1", "", 15, true).unwrap();
    assert_eq!(thaws(), 0, "only SIGKILL thaws");
    f.kill("t1", "", 9, false).unwrap();
    assert_eq!(thaws(), 1);
    f.kill("t1", "", 9, true).unwrap();
    assert_eq!(thaws(), 2);
    f.tm.kill_all();
    assert_eq!(thaws(), 3);
}

/// Issue 14 item 2, the race: a Pause whose freeze lands after a SIGKILL would leave a dying
/// container frozen (v1) for ever; it thaws again and fails instead.
#[test]
fn a_pause_after_a_sigkill_thaws_and_fails() {
    let f = fixture();
    running(&f, "t1");
    f.kill("t1", "", 9, false).unwrap();
    assert_eq!(f.host.thaws.load(Ordering::SeqCst), 0, "it was not paused");
    let r = f.pause("t1");
    assert_eq!(code(r), Code::FAILED_PRECONDITION);
    assert_eq!(f.host.thaws.load(Ordering::SeqCst), 1);
    assert_ne!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::PAUSED
    );
}
