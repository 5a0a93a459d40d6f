//! Requests refused, and what the pod gives its containers: files, /dev/shm, namespaces; the
//! sandbox's Task calls (Connect, Pids) and Shutdown.

use super::*;

#[test]
fn create_twice_start_before_create_and_unknown_ids() {
    let f = fixture();
    assert_eq!(code(f.start("pod1")), Code::FAILED_PRECONDITION);
    f.create("pod1", pod_config("a", false)).unwrap();
    assert_eq!(
        code(f.create("pod1", pod_config("a", false))),
        Code::ALREADY_EXISTS
    );
    assert_eq!(
        code(f.create("pod2", pod_config("a", false))),
        Code::FAILED_PRECONDITION
    );
    assert_eq!(code(f.status("other")), Code::NOT_FOUND);
    assert_eq!(code(f.status("../x")), Code::INVALID_ARGUMENT);
    let w = f.svc.wait_sandbox(
        &ctx(),
        WaitSandboxRequest {
            sandbox_id: "other".into(),
            ..Default::default()
        },
    );
    assert_eq!(code(w), Code::NOT_FOUND);
    let cfg_pid = f.start("pod1").unwrap();
    assert!(
        f.host.pause.lock().unwrap().as_ref().unwrap().new_pid,
        "the pause process must not stay in the host's pid namespace without hostPID"
    );
    assert_eq!(cfg_pid.pid, PAUSE_PID as u32);
    assert_eq!(code(f.start("pod1")), Code::FAILED_PRECONDITION);
}

#[test]
fn bad_pod_configs_are_rejected_with_the_field_and_leave_nothing() {
    let f = fixture();
    let mut cfg = crate::records::cri::PodSandboxConfig::new();
    cfg.linux
        .mut_or_insert_default()
        .sysctls
        .insert("kernel.panic".into(), "1".into());
    let r = f.create("pod1", any_config(&cfg));
    let msg = match r {
        Err(ttrpc::Error::RpcStatus(s)) => {
            assert_eq!(s.code(), Code::INVALID_ARGUMENT);
            s.message().to_string()
        }
        other => panic!("{other:?}"),
    };
    assert!(msg.contains("kernel.panic"), "{msg}");
    let garbage = Any {
        type_url: "runtime.v1.PodSandboxConfig".into(),
        value: vec![0xff, 0xff, 0xff],
        ..Default::default()
    };
    assert_eq!(code(f.create("pod1", garbage)), Code::INVALID_ARGUMENT);
    assert!(
        f.host.calls().is_empty(),
        "something was created: {:?}",
        f.host.calls()
    );

    // A netns path that does not exist.
    let r = f.create_in("pod9", pod_config("a", false), "/nonexistent/netns");
    assert_eq!(code(r), Code::INVALID_ARGUMENT);
}

#[test]
fn a_failing_pause_leaves_the_sandbox_created_and_startable_state_clean() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    *f.host.fail_pause.lock().unwrap() = true;
    match f.start("pod1") {
        Err(ttrpc::Error::RpcStatus(s)) => assert_eq!(
            s.message(),
            "start sandbox pod1: pause: set the hostname: Operation not permitted"
        ),
        other => panic!("{other:?}"),
    }
    // containerd answers a failed start with ShutdownSandbox: everything goes.
    f.shutdown("pod1").unwrap();
    let calls = f.host.calls();
    assert!(
        calls.contains(&"unmount_shm".into()) && calls.contains(&"remove_files".into()),
        "{calls:?}"
    );
}

#[test]
fn containers_get_the_pod_files_and_the_pod_shm() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    let mut spec: serde_json::Value = serde_json::json!({
        "root": {"path": "rootfs", "readonly": true},
        "mounts": [
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid"]},
            {"destination": "/etc/resolv.conf", "type": "bind", "source": "/user/resolv", "options": ["rbind"]}
        ]
    });
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let mounts = spec["mounts"].as_array().unwrap();
    let find = |d: &str| {
        mounts
            .iter()
            .find(|m| m["destination"] == d)
            .unwrap()
            .clone()
    };
    assert_eq!(find("/dev/shm")["type"], "bind");
    assert!(
        find("/dev/shm")["source"]
            .as_str()
            .unwrap()
            .ends_with("pod1/shm")
    );
    assert_eq!(
        find("/etc/resolv.conf")["source"],
        "/user/resolv",
        "a user mount is kept"
    );
    assert!(
        find("/etc/hosts")["source"]
            .as_str()
            .unwrap()
            .ends_with("pod1/etc/hosts")
    );
    assert_eq!(
        find("/etc/hostname")["options"][2],
        "ro",
        "read-only rootfs gives read-only pod files"
    );
    assert_eq!(mounts.len(), 4);
}

#[test]
fn only_containers_in_the_pods_ipc_namespace_get_the_pod_shm() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    f.start("pod1").unwrap();
    let shm_of = |ipc: serde_json::Value| {
        let mut spec = serde_json::json!({
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}],
            "linux": {"namespaces": [ipc, {"type": "mount"}]}
        });
        f.sm.prepare_spec("c", &mut spec).unwrap();
        let m = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .unwrap()
            .clone();
        (m["type"].as_str().unwrap().to_string(), spec)
    };
    let pause_ipc = format!("/proc/{PAUSE_PID}/ns/ipc");
    // CRI names the pause process's namespace: the pod's /dev/shm.
    let (kind, _) = shm_of(serde_json::json!({"type": "ipc", "path": pause_ipc}));
    assert_eq!(kind, "bind");
    // A new one asked for by a client (ctr run --sandbox) is placed in the pod's: the pod's.
    let (kind, spec) = shm_of(serde_json::json!({"type": "ipc"}));
    assert_eq!(kind, "bind");
    assert_eq!(spec["linux"]["namespaces"][0]["path"], pause_ipc);
    // Another process's IPC namespace: its own /dev/shm stays.
    let (kind, _) = shm_of(serde_json::json!({"type": "ipc", "path": "/proc/1/ns/ipc"}));
    assert_eq!(kind, "tmpfs");
}

#[test]
fn a_new_ipc_namespace_keeps_its_own_shm_when_there_is_no_pause_to_join() {
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap(); // not started: no pause process
    let mut spec = serde_json::json!({
        "mounts": [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}],
        "linux": {"namespaces": [{"type": "ipc"}]}
    });
    f.sm.prepare_spec("c", &mut spec).unwrap();
    assert_eq!(spec["mounts"][0]["type"], "tmpfs");
    assert_eq!(spec["linux"]["namespaces"][0].get("path"), None);
}

#[test]
fn containers_without_namespace_paths_join_the_pod() {
    let f = fixture();
    f.create("pod1", pod_config("a", true)).unwrap();
    f.start("pod1").unwrap();
    let mut spec = serde_json::json!({
        "root": {"path": "rootfs"},
        "linux": {"namespaces": [
            {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "pid"}, {"type": "mount"},
            {"type": "cgroup", "path": ""}
        ]}
    });
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let ns = spec["linux"]["namespaces"].as_array().unwrap();
    let path = |t: &str| {
        ns.iter()
            .find(|n| n["type"] == t)
            .unwrap()
            .get("path")
            .cloned()
    };
    assert_eq!(
        path("network"),
        Some(serde_json::json!(format!("/proc/{PAUSE_PID}/ns/net")))
    );
    assert_eq!(
        path("pid"),
        Some(serde_json::json!(format!("/proc/{PAUSE_PID}/ns/pid")))
    );
    assert_eq!(path("mount"), None);
    // A path already set (CRI) is kept.
    let mut cri = serde_json::json!({"linux": {"namespaces": [{"type": "network", "path": "/proc/1/ns/net"}]}});
    f.sm.prepare_spec("c2", &mut cri).unwrap();
    assert_eq!(cri["linux"]["namespaces"][0]["path"], "/proc/1/ns/net");
}

#[test]
fn shutdown_after_a_failed_create_lets_the_shim_exit() {
    let f = fixture();
    // an unknown ID while the shim holds a sandbox: NotFound, no exit
    f.create("pod1", pod_config("a", false)).unwrap();
    assert_eq!(code(f.shutdown("other")), Code::NOT_FOUND);
    assert!(!*f.shut.lock().unwrap());

    // containerd's cleanup after a CreateSandbox that failed: the shim holds nothing
    let f = fixture();
    f.shutdown("pod1").unwrap();
    assert!(*f.shut.lock().unwrap(), "the shim was not told to exit");
}

#[test]
fn after_shutdown_sandbox_no_task_create_starts() {
    use containerd_shim_protos::shim_sync::Task as _;
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    f.shutdown("pod1").unwrap();
    assert!(*f.shut.lock().unwrap());
    // A Create that reaches the exiting shim is refused before anything is made (the fake
    // host's runtime would panic if it got that far).
    let bundle = f.dir.path().join("late");
    std::fs::create_dir_all(&bundle).unwrap();
    let r = f.tasks.create(
        &ctx(),
        containerd_shim_protos::api::CreateTaskRequest {
            id: "late".into(),
            bundle: bundle.display().to_string(),
            ..Default::default()
        },
    );
    assert_eq!(code(r), Code::FAILED_PRECONDITION);
}

#[test]
fn task_connect_and_pids_answer_for_the_sandbox_id() {
    // containerd probes a sandbox shim after a restart with Task.Connect and Task.Pids on the
    // sandbox ID; an error makes it drop the pod.
    use containerd_shim_protos::api::{ConnectRequest, PidsRequest};
    use containerd_shim_protos::shim_sync::Task as _;
    let f = fixture();
    f.create("pod1", pod_config("a", false)).unwrap();
    f.start("pod1").unwrap();
    let c = f
        .tasks
        .connect(
            &ctx(),
            ConnectRequest {
                id: "pod1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        (c.shim_pid, c.task_pid),
        (std::process::id(), PAUSE_PID as u32)
    );
    let p = f
        .tasks
        .pids(
            &ctx(),
            PidsRequest {
                id: "pod1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(p.processes.len(), 1);
    assert_eq!(p.processes[0].pid, PAUSE_PID as u32);
    let other = f.tasks.connect(
        &ctx(),
        ConnectRequest {
            id: "pod2".into(),
            ..Default::default()
        },
    );
    assert_eq!(code(other), Code::NOT_FOUND);
}

#[test]
fn a_shim_in_a_user_namespace_starts_pods_without_ping_group_range() {
    let f = fixture();
    // What SysctlDefaults::detect finds inside a user namespace.
    *f.host.sysctl_defaults.lock().unwrap() =
        SysctlDefaults::from_host(Some("0 100000 65536"), true);
    f.create("pod1", pod_config("a", false)).unwrap();
    f.start("pod1").unwrap();
    let cfg = f.host.pause.lock().unwrap().clone().unwrap();
    let names: Vec<&str> = cfg.sysctls.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["net.ipv4.ip_unprivileged_port_start"]);
    let info = f.status("pod1").unwrap().info["rsandbox"].clone();
    assert!(!info.contains("ping_group_range"), "{info}");
}

/// Issue 37: containerd gives each container of a shim-sandboxer pod categories of its own
/// (StartSandbox can hand it no pod label) and relabels the container's volumes with them; the
/// pod moves the container, its volumes and its execs to the pause's level, as the runc path's
/// containers all share it. A pod that names its level is left as containerd made it.
#[test]
fn a_container_its_volumes_and_its_execs_move_to_the_pod_s_mcs_level() {
    let (_d, reg) = mcs_registry();
    let f = fixture_with_mcs(&reg);
    f.create("pod1", pod_config("web-0", true)).unwrap();
    f.start("pod1").unwrap();
    let level = f.record("pod1").mcs.unwrap().level;
    let volume = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/data";
    // As containerd 2.1.9's CRI writes it (WithSelinuxLabels at categories it drew; the
    // volume as WithMounts adds it).
    let cri_spec = || {
        serde_json::json!({
            "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "selinuxLabel": "system_u:system_r:container_t:s0:c4,c811"},
            "mounts": [{"destination": "/data", "type": "bind", "source": volume,
                        "options": ["rbind", "rprivate", "rw"]}],
            "linux": {"mountLabel": "system_u:object_r:container_file_t:s0:c4,c811"}
        })
    };
    let mut spec = cri_spec();
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    assert_eq!(
        spec["process"]["selinuxLabel"],
        format!("system_u:system_r:container_t:{level}")
    );
    let mount_label = format!("system_u:object_r:container_file_t:{level}");
    assert_eq!(spec["linux"]["mountLabel"], mount_label.as_str());
    assert_eq!(
        f.host.calls_to("move_volume_labels"),
        [format!(
            "move_volume_labels {volume} system_u:object_r:container_file_t:s0:c4,c811 {mount_label}"
        )]
    );
    // The pod files get the (moved) mount label itself, the pod's level, as containerd
    // relabels them on the runc path.
    assert_eq!(
        f.host.calls_to("label_pod_files"),
        [format!(
            "label_pod_files etc {mount_label} pod level {level}"
        )]
    );
    // Through Create: the rootfs's `context=` option, which containerd's client appends from
    // the container's mount label (client/container.go:350-355), follows the move; the
    // snapshot's own options are kept. (On the enforcing guest the rootfs kept the old level
    // and the container could not read /bin/sh.)
    {
        use containerd_shim_protos::shim_sync::Task as _;
        let bundle = f.dir.path().join("c3");
        std::fs::create_dir_all(&bundle).unwrap();
        let mut spec = cri_spec();
        spec["ociVersion"] = "1.2.1".into();
        spec["process"]["cwd"] = "/".into();
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let r = f.tasks.create(
            &ctx(),
            containerd_shim_protos::api::CreateTaskRequest {
                id: "c3".into(),
                bundle: bundle.display().to_string(),
                rootfs: vec![containerd_shim_protos::types::mount::Mount {
                    type_: "overlay".into(),
                    source: "overlay".into(),
                    options: vec![
                        "index=off".into(),
                        "lowerdir=/var/lib/containerd/snapshots/1/fs".into(),
                        "context=\"system_u:object_r:container_file_t:s0:c4,c811\"".into(),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("no rootfs in these tests"), "{e}");
        let mounted = f.task_host.rootfs.lock().unwrap().clone();
        assert_eq!(
            mounted[0][0].options,
            [
                "index=off".to_string(),
                "lowerdir=/var/lib/containerd/snapshots/1/fs".into(),
                format!("context=\"{mount_label}\""),
            ]
        );
    }
    let mut exec = serde_json::json!({"args": ["ls"], "selinuxLabel": "system_u:system_r:container_t:s0:c4,c811"});
    assert!(f.sm.prepare_exec("c1", &mut exec).unwrap());
    assert_eq!(
        exec["selinuxLabel"],
        format!("system_u:system_r:container_t:{level}")
    );

    // A privileged container (containerd clears its process label, keeps its mount label at
    // categories it drew and relabels its volumes with it): its mounts, its volumes and the
    // pod files it mounts go to the pod's level, its process stays unlabelled. Before, the pod
    // files took its categories, and the pod's other containers could no longer read them.
    let mut privileged = cri_spec();
    privileged["process"]["selinuxLabel"] = serde_json::json!("");
    let moves = f.host.calls_to("move_volume_labels").len();
    assert!(f.sm.prepare_spec("c3", &mut privileged).unwrap());
    assert_eq!(privileged["process"]["selinuxLabel"], "");
    assert_eq!(privileged["linux"]["mountLabel"], mount_label.as_str());
    assert_eq!(f.host.calls_to("move_volume_labels").len(), moves + 1);
    assert_eq!(
        f.host.calls_to("label_pod_files").last().unwrap(),
        &format!("label_pod_files etc {mount_label} pod level {level}")
    );

    // A pod that names its level: its containers keep what containerd gave them.
    let g = fixture_with_mcs(&reg);
    let mut cfg = pod_sandbox_config("web-1", true);
    cfg.linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .selinux_options
        .mut_or_insert_default()
        .level = "s0:c1,c2".into();
    g.create("pod2", any_config(&cfg)).unwrap();
    g.start("pod2").unwrap();
    let mut spec = cri_spec();
    g.sm.prepare_spec("c2", &mut spec).unwrap();
    assert_eq!(spec, {
        let mut s = cri_spec();
        s["mounts"] = spec["mounts"].clone();
        s
    });
    assert!(g.host.calls_to("move_volume_labels").is_empty());
    assert!(!g.sm.prepare_exec("c2", &mut exec.clone()).unwrap());
}
