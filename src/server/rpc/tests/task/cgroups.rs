//! An init or exec found outside its cgroups, a refused runc delete, an init killed during
//! create, two creates of one id.

use super::*;

/// The error of a process found outside its container's cgroups (what `placement` returns).
fn misplaced(pid: i32) -> Error {
    crate::host::placement::Misplaced {
        pid,
        hierarchy: "devices".into(),
        expected: "/sys/fs/cgroup/devices/pod.slice/cri-containerd-t1.scope".into(),
        actual: "/sys/fs/cgroup/devices/pod.slice".into(),
    }
    .into()
}

/// An init outside its cgroups after `runc create` (systemd on cgroup v1 moved it): Create
/// fails naming the hierarchy and both paths, before the container's code could run, and the
/// runc container is deleted with everything else Create made.
#[test]
fn an_init_outside_its_cgroups_after_create_fails_the_create_and_leaves_nothing() {
    let f = fixture();
    let first_pid = FAKE_PID_BASE;
    f.fail("placement", misplaced(first_pid));
    let r = f.create("t1");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("create task t1: check the container's cgroups after runc create: "),
        "{m}"
    );
    assert!(m.contains("devices hierarchy"), "{m}");
    assert!(m.contains("cri-containerd-t1.scope"), "{m}");
    assert!(m.ends_with("says /sys/fs/cgroup/devices/pod.slice"), "{m}");
    assert_eq!(
        *f.host.runtime.placement_checks.lock().unwrap(),
        [("t1".to_string(), first_pid)]
    );
    assert_eq!(
        f.host.runtime.calls(),
        ["create t1", "delete t1 true"],
        "the container is deleted (--force kills its init)"
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    assert!(f.events.topics().is_empty(), "{:?}", f.events.topics());
    // In place, the same ID is created.
    f.host.runtime.fail.lock().unwrap().clear();
    f.create("t1").unwrap();
}

/// Outside its cgroups after `runc start`: the init is SIGKILLed through runc, the Start
/// fails (its Waits answer), and containerd's Delete takes the container away.
#[test]
fn an_init_outside_its_cgroups_after_start_is_killed_and_the_start_fails() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let waited = park_wait(&f, "t1", "");
    f.fail("placement", misplaced(pid as i32));
    let r = f.start("t1", "");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("start task t1: check the container's cgroups after runc start: "),
        "{m}"
    );
    assert_eq!(
        f.host.runtime.calls()[1..],
        [
            "start t1".to_string(),
            format!("kill t1 {} false", libc::SIGKILL)
        ]
    );
    assert_eq!(waited.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    assert!(!f.events.topics().contains(&"/tasks/start"));
    f.delete("t1", "").unwrap();
    assert!(f.tm.is_empty());
}

/// An exec'd process outside its container's cgroups: SIGKILLed, its Start fails, nothing
/// of it stays registered.
#[test]
fn an_exec_outside_its_cgroups_is_killed_and_its_start_fails() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let exec_pid = FAKE_PID_BASE + 1;
    f.fail("placement", misplaced(exec_pid));
    let r = f.start("t1", "e1");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("start exec e1 of task t1: check the exec's cgroups after runc exec: "),
        "{m}"
    );
    assert!(
        f.host
            .signals
            .lock()
            .unwrap()
            .contains(&(exec_pid, libc::SIGKILL as u32)),
        "{:?}",
        f.host.signals.lock().unwrap()
    );
    assert_eq!(f.tm.watched_pids(), 1, "only the init is watched");
    assert!(!f.events.topics().contains(&"/tasks/exec-started"));
    assert_eq!(f.tm.wait_blocking("t1", "e1").unwrap().status, 255);
}

/// An init that exited while paused: runc reads a cgroup still frozen as paused and refuses a
/// plain `runc delete`; Delete then forces it, and succeeds.
#[test]
fn a_refused_plain_runc_delete_is_forced() {
    let f = fixture();
    let pid = running(&f, "t1");
    f.pause("t1").unwrap();
    f.exit(pid, 137);
    *f.host.runtime.refuse_plain_delete.lock().unwrap() = Some(Error::internal(
        "runc delete: cannot delete container t1 that is not stopped: paused",
    ));
    let deleted = f.delete("t1", "").unwrap();
    assert_eq!(deleted.exit_status, 137);
    assert!(
        f.host
            .runtime
            .calls()
            .ends_with(&["delete t1 false".to_string(), "delete t1 true".to_string()]),
        "{:?}",
        f.host.runtime.calls()
    );
    assert!(f.tm.is_empty());
    assert_eq!(f.events.topics().last(), Some(&"/tasks/delete"));
}

#[test]
fn an_init_killed_during_create_gets_its_task_exit_after_task_create() {
    let reaper = Reaper::new_for_test();
    let f = fixture_with(Some(reaper.clone()));
    let r = reaper.clone();
    *f.host.runtime.on_create.lock().unwrap() = Some(Box::new(move |pid| {
        // The reaper reports the exit before `create` even returned the pid.
        r.inject(Exit {
            pid,
            status: 137,
            at: SystemTime::now(),
        })
    }));
    let pid = f.create("t1").unwrap().pid;
    assert_eq!(f.events.topics(), ["/tasks/create", "/tasks/exit"]);
    assert_eq!(f.tm.wait_blocking("t1", "").unwrap().status, 137);
    let m = message(f.start("t1", ""));
    assert!(m.contains("has already exited"), "{m}");
    assert_eq!(f.tm.state("t1", "").unwrap().pid, pid);
}

#[test]
fn two_concurrent_creates_of_one_id_one_wins() {
    let f = Arc::new(fixture());
    let (go_tx, inside_rx) = hold_creates(&f);
    let f2 = f.clone();
    let first = std::thread::spawn(move || f2.create("t1").map(|r| r.pid));
    inside_rx.recv().unwrap(); // the first Create is inside runc create
    assert_eq!(code(f.create("t1")), Code::ALREADY_EXISTS);
    go_tx.send(()).unwrap();
    first.join().unwrap().unwrap();
    assert_eq!(f.tm.len(), 1);
    assert_eq!(
        f.host
            .runtime
            .calls()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count(),
        1
    );
}
