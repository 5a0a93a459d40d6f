//! The pause's exit and WaitSandbox, user-namespaced pods, the record's members and the pod
//! files' label.

use super::*;

#[test]
fn a_pause_that_dies_before_its_pid_is_stored_makes_the_pod_notready() {
    let reaper = crate::shim::reaper::Reaper::new_for_test();
    let f = fixture_with(Some(reaper.clone()), None);
    let r = reaper.clone();
    *f.host.on_spawn.lock().unwrap() = Some(Box::new(move |pid| {
        r.inject(Exit {
            pid,
            status: 2,
            at: SystemTime::now(),
        })
    }));
    f.create("pod1", pod_config("web-0", true)).unwrap();
    f.start("pod1").unwrap();
    let st = f.status("pod1").unwrap();
    assert_eq!(st.state, "SANDBOX_NOTREADY");
    assert_eq!(f.sm.wait_blocking("pod1").unwrap().status, 2);
}

#[test]
fn an_old_exit_of_a_recycled_pid_does_not_touch_a_new_pause() {
    let reaper = crate::shim::reaper::Reaper::new_for_test();
    let f = fixture_with(Some(reaper.clone()), None);
    // Some helper with the pid the pause process will get exited long before.
    reaper.inject(pause_exit(1));
    f.create("pod1", pod_config("web-0", true)).unwrap();
    f.start("pod1").unwrap();
    assert_eq!(f.status("pod1").unwrap().state, "SANDBOX_READY");
}

#[test]
fn wait_sandbox_is_parked_until_the_pod_ends_and_unknown_ids_are_refused() {
    let f = fixture();
    f.create("pod1", pod_config("web-0", true)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    f.sm.wait("pod1", Box::new(crate::shim::waiters::ChannelWaiter(tx)))
        .unwrap();
    assert!(rx.try_recv().is_err(), "nothing ended yet");
    f.stop("pod1").unwrap();
    assert_eq!(
        rx.try_recv().unwrap().status,
        crate::shim::waiters::UNKNOWN_EXIT_STATUS,
        "a pod stopped before it started still answers its Waits"
    );
    let (tx, _rx) = std::sync::mpsc::channel();
    let e =
        f.sm.wait("nope", Box::new(crate::shim::waiters::ChannelWaiter(tx)))
            .unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound);
}

/// A pod of `hostUsers: false`: userns_options mode POD, uids 0..65536 at 100000, gids at
/// 200000.
fn userns_pod_config() -> Any {
    use crate::records::cri;
    let mut cfg = pod_sandbox_config("web-u", true);
    let u = cfg
        .linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .namespace_options
        .mut_or_insert_default()
        .userns_options
        .mut_or_insert_default();
    u.mode = cri::NamespaceMode::POD.into();
    let map = |host_id| cri::IDMapping {
        host_id,
        container_id: 0,
        length: 65536,
        ..Default::default()
    };
    u.uids = vec![map(100000)];
    u.gids = vec![map(200000)];
    any_config(&cfg)
}

/// Issue 16: a user-namespaced pod checks its runc first, gives its files to the mapped root,
/// has its pause make the user namespace with the pod's maps, and its members join it.
#[test]
fn a_user_namespaced_pod_has_its_pause_hold_the_user_namespace() {
    let f = fixture();
    f.create("pod1", userns_pod_config()).unwrap();
    assert_eq!(
        f.host.calls(),
        [
            "check_userns_runtime",
            "mount_shm shm",
            "write_files etc web-u",
            "own_for_userns pod1 etc shm 100000:200000"
        ]
    );
    f.start("pod1").unwrap();
    let cfg = f.host.pause.lock().unwrap().clone().unwrap();
    let u = cfg.userns.clone().unwrap();
    assert_eq!(
        (u.uid_map().as_str(), u.gid_map().as_str()),
        ("0 100000 65536\n", "0 200000 65536\n")
    );
    assert!(cfg.new_ipc && cfg.new_uts && cfg.new_pid);
    assert!(
        !cfg.sysctls
            .iter()
            .any(|(k, _)| k == "net.ipv4.ping_group_range"),
        "containerd adds no ping_group_range to a user-namespaced pod: {:?}",
        cfg.sysctls
    );
    let mut spec = member_spec();
    spec["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "user"}));
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let pause = |k: &str| format!("/proc/{PAUSE_PID}/ns/{k}");
    assert!(
        namespaces_of(&spec).contains(&ns("user", &pause("user"))),
        "{:?}",
        namespaces_of(&spec)
    );
    let st = f.status("pod1").unwrap();
    assert!(
        st.info["rsandbox"].contains("\"uidMap\":\"0 100000 65536\\n\""),
        "{}",
        st.info["rsandbox"]
    );
}

/// With a runc older than 1.2, CreateSandbox refuses before it makes anything, and says which
/// runc it found.
#[test]
fn a_user_namespaced_pod_is_refused_with_an_old_runc() {
    let f = fixture();
    *f.host.old_runc.lock().unwrap() = Some("runc version 1.1.5+ds1".into());
    let err = f.create("pod1", userns_pod_config()).unwrap_err();
    let ttrpc::Error::RpcStatus(st) = err else {
        panic!("{err:?}")
    };
    assert_eq!(st.code(), Code::FAILED_PRECONDITION);
    assert!(
        st.message.contains("runc version 1.1.5+ds1"),
        "{}",
        st.message
    );
    assert_eq!(f.host.calls(), ["check_userns_runtime"]);
    // A pod without a user namespace does not ask.
    f.create("pod2", pod_config("web-0", true)).unwrap();
    assert!(!f.host.calls()[1..].contains(&"check_userns_runtime".to_string()));
}

/// Issue 20 item 5: each container of the pod is in the sandbox record from before its `runc
/// create` until its delete, so that `delete` after a crash of the shim finds it.
#[test]
fn the_record_lists_the_pods_containers_until_they_are_deleted() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    let record = || f.record("pod1");
    let member = |id: &str| crate::host::reclaim::Member {
        id: id.into(),
        bundle: Some(f.dir.path().join(id)),
        runc: RuncConfig::defaults("k8s.io"),
        cgroups_path: Some(format!("/k8s.io/{id}")),
        cgroups_at_create: Some(Default::default()),
    };
    f.sm.add_member(member("c1")).unwrap();
    f.sm.add_member(member("c2")).unwrap();
    f.sm.add_member(member("c1")).unwrap(); // a retried create is listed once
    let ids: Vec<String> = record().members.into_iter().map(|m| m.id).collect();
    assert_eq!(ids, ["c2", "c1"]);
    assert_eq!(record().members[1], member("c1"));
    f.sm.remove_member("c2");
    f.sm.remove_member("unknown");
    let ids: Vec<String> = record().members.into_iter().map(|m| m.id).collect();
    assert_eq!(ids, ["c1"]);
}

/// Issue 20 item 7: a container whose spec carries an SELinux mount label (containerd's CRI
/// sets `linux.mountLabel` where SELinux is on) has the pod files labelled for it before its
/// `runc create`; one without a label leaves them alone. With no level of the pod's (SELinux
/// gives the pause none here) they get the label's shared form.
#[test]
fn a_containers_mount_label_labels_the_pod_files() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    let label = "system_u:object_r:container_file_t:s0:c1,c2";
    let mut spec = serde_json::json!({
        "root": {"path": "rootfs"},
        "linux": {"mountLabel": label}
    });
    f.sm.prepare_spec("c1", &mut spec).unwrap();
    let mut plain = serde_json::json!({"root": {"path": "rootfs"}, "linux": {"mountLabel": ""}});
    f.sm.prepare_spec("c2", &mut plain).unwrap();
    let labelled = f.host.calls_to("label_pod_files");
    assert_eq!(
        labelled,
        [format!("label_pod_files etc {label} pod level none")]
    );
}
