//! Shim-owned networking through the fake network provider, and the network decision table
//! (docs/networking.md) with hostNetwork pods.

use super::*;

// ---- shim-owned networking, through the fake network provider ----

#[test]
fn a_sandbox_without_netns_gets_the_shim_network_and_loses_it_at_stop() {
    let net = Arc::new(FakeNetwork::default());
    let f = fixture_with_network(&net);
    f.create_in("pod1", pod_config("web-0", false), "").unwrap();
    assert_eq!(net.calls(), ["setup k8s.io pod1 web"]);
    let conf = net.confs.lock().unwrap()[0].clone().unwrap();
    assert_eq!(
        (
            conf.name.as_str(),
            conf.namespace.as_str(),
            conf.uid.as_str()
        ),
        ("web", "default", "uid-1")
    );
    assert_eq!(conf.dns.unwrap().servers, ["10.96.0.10"]);
    let info = f.status("pod1").unwrap().info["rsandbox"].clone();
    assert!(info.contains("10.90.0.2/16"), "{info}");
    assert!(info.contains("rsandbox (CNI run by the shim)"), "{info}");

    f.start("pod1").unwrap();
    let pause = f.host.pause.lock().unwrap().clone().unwrap();
    assert_eq!(pause.netns, Some(FakeNetwork::netns_of("pod1")));

    let reaper = f.pause_exits_soon(0);
    f.stop("pod1").unwrap();
    reaper.join().unwrap();
    assert_eq!(net.calls(), ["setup k8s.io pod1 web", "teardown pod1"]);
    // The record no longer names a network: neither shutdown nor `delete` tears it down again.
    let record = std::fs::read_to_string(f.state_file("pod1")).unwrap();
    assert!(record.contains("\"network\":null"), "{record}");
    f.stop("pod1").unwrap();
    f.shutdown("pod1").unwrap();
    assert_eq!(net.calls().len(), 2, "{:?}", net.calls());
}

#[test]
fn a_failing_network_setup_fails_the_create_and_leaves_nothing() {
    let net = Arc::new(FakeNetwork::default());
    *net.fail_setup.lock().unwrap() = Some(crate::records::error::Error::precondition(
        "load CNI config: no-such-plugin",
    ));
    let f = fixture_with_network(&net);
    let r = f.create_in("pod1", pod_config("a", false), "");
    let msg = message(r);
    assert_eq!(
        msg,
        "create sandbox pod1: set up the pod network: load CNI config: no-such-plugin"
    );
    let r = f.create_in("pod1", pod_config("a", false), "");
    assert!(
        r.is_ok(),
        "the failed create left the sandbox behind: {r:?}"
    );
    f.shutdown("pod1").unwrap();
    // The first create's pod files and /dev/shm were taken down again.
    let calls = f.host.calls();
    assert_eq!(
        calls[..4],
        [
            "mount_shm shm",
            "write_files etc a",
            "unmount_shm",
            "remove_files"
        ],
        "{calls:?}"
    );
}

#[test]
fn a_failed_create_is_typed() {
    let net = Arc::new(FakeNetwork::default());
    *net.fail_setup.lock().unwrap() = Some(crate::records::error::Error::precondition("no plugin"));
    let f = fixture_with_network(&net);
    assert_eq!(
        code(f.create_in("pod1", pod_config("a", false), "")),
        Code::FAILED_PRECONDITION
    );
}

#[test]
fn bad_bandwidth_annotations_fail_before_any_network_is_made() {
    let net = Arc::new(FakeNetwork::default());
    let f = fixture_with_network(&net);
    let mut cfg = crate::records::cri::PodSandboxConfig::new();
    cfg.annotations
        .insert("kubernetes.io/ingress-bandwidth".into(), "1".into());
    let any = any_config(&cfg);
    let r = f.create_in("pod1", any.clone(), "");
    assert_eq!(code(r), Code::INVALID_ARGUMENT);
    assert!(net.calls().is_empty(), "{:?}", net.calls());
    // With a netns given, CRI owns the network and the annotation is none of ours.
    f.create("pod1", any).unwrap();
}

#[test]
fn a_failing_teardown_does_not_fail_stop() {
    let net = Arc::new(FakeNetwork::default());
    let f = fixture_with_network(&net);
    f.create_in("pod1", pod_config("a", false), "").unwrap();
    *net.fail_teardown.lock().unwrap() =
        Some(crate::records::error::Error::internal("CNI DEL: boom"));
    // Never started: stop has no pause process to wait for.
    f.stop("pod1").unwrap();
    assert_eq!(net.calls(), ["setup k8s.io pod1 web", "teardown pod1"]);
    f.shutdown("pod1").unwrap();
}

// ---- the network decision table (docs/networking.md) and hostNetwork pods ----

/// What containerd's sandbox controller API sends without a pod config.
fn no_pod_config() -> Any {
    Any {
        type_url: "type.googleapis.com/google.protobuf.Empty".into(),
        ..Default::default()
    }
}

fn host_network_pod_config() -> Any {
    use crate::records::cri;
    let mut cfg = cri::PodSandboxConfig::new();
    cfg.hostname = "node-name-is-used".into();
    let md = cfg.metadata.mut_or_insert_default();
    md.name = "hostnet".into();
    md.namespace = "kube-system".into();
    let ns = cfg
        .linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .namespace_options
        .mut_or_insert_default();
    ns.network = cri::NamespaceMode::NODE.into();
    ns.pid = cri::NamespaceMode::CONTAINER.into();
    any_config(&cfg)
}

#[test]
fn host_network_pod_keeps_the_host_network_and_uts() {
    // Shim-owned networking on, and even a netns given: neither applies to hostNetwork.
    let net = Arc::new(FakeNetwork::default());
    let f = fixture_with_network(&net);
    f.create_in("pod1", host_network_pod_config(), "").unwrap();
    assert!(net.calls().is_empty(), "{:?}", net.calls());
    f.start("pod1").unwrap();
    let cfg = f.host.pause.lock().unwrap().clone().unwrap();
    assert_eq!(
        cfg,
        PauseConfig {
            netns: None,
            new_ipc: true,
            new_uts: false,
            new_pid: true,
            hostname: None,
            sysctls: vec![],
            pod_id: "pod1".into(),
            root_mountpoint: cfg.root_mountpoint.clone(),
            userns: None,
            selinux_options: None,
            labels: None,
            mcs_level: None,
        },
        "pause in the host netns and UTS, no default net.* sysctls written into the host's"
    );
    let mut spec = member_spec();
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let pause = |k: &str| format!("/proc/{PAUSE_PID}/ns/{k}");
    assert_eq!(
        namespaces_of(&spec),
        [ns("pid", ""), ns("ipc", &pause("ipc")), ns("mount", "")],
        "containers: host network and UTS (entries dropped), the pod's IPC"
    );
    let info = f.status("pod1").unwrap().info["rsandbox"].clone();
    assert!(info.contains("\"networkOwner\":\"host\""), "{info}");

    let f = fixture_with_network(&net);
    let netns = f.netns();
    f.create_in("pod2", host_network_pod_config(), &netns)
        .unwrap();
    f.start("pod2").unwrap();
    assert_eq!(f.host.pause.lock().unwrap().as_ref().unwrap().netns, None);
}

#[test]
fn no_netns_no_pod_config_and_no_shim_networking_means_the_host_network() {
    let f = fixture();
    f.create_in("pod1", no_pod_config(), "").unwrap();
    f.start("pod1").unwrap();
    let cfg = f.host.pause.lock().unwrap().clone().unwrap();
    assert_eq!((cfg.netns.as_ref(), cfg.new_uts), (None, false));
    assert!(cfg.sysctls.is_empty(), "{:?}", cfg.sysctls);
    let mut spec = member_spec();
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let names: Vec<String> = namespaces_of(&spec).into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["pid", "ipc", "mount"]);
    let info = f.status("pod1").unwrap().info["rsandbox"].clone();
    assert!(info.contains("\"networkMode\":\"Host\""), "{info}");

    // A CRI pod config that asks for a pod network cannot be given the host's.
    let f = fixture();
    let msg = message(f.create_in("pod1", pod_config("a", false), ""));
    assert!(
        msg.contains("no netns_path") && msg.contains("sandboxes = false"),
        "{msg}"
    );
}

#[test]
fn no_cni_config_gives_a_loopback_only_pod_network() {
    let net = Arc::new(FakeNetwork::default());
    net.loopback_only
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let f = fixture_with_network(&net);
    f.create_in("pod1", no_pod_config(), "").unwrap();
    assert_eq!(net.calls(), ["setup k8s.io pod1 -"]);
    f.start("pod1").unwrap();
    let cfg = f.host.pause.lock().unwrap().clone().unwrap();
    assert_eq!(cfg.netns, Some(FakeNetwork::netns_of("pod1")));
    assert!(cfg.new_uts);
    let info = f.status("pod1").unwrap().info["rsandbox"].clone();
    assert!(info.contains("\"ips\":[]"), "{info}");
    assert!(info.contains("loopback only"), "{info}");
    let mut spec = member_spec();
    assert!(f.sm.prepare_spec("c1", &mut spec).unwrap());
    let pause = |k: &str| format!("/proc/{PAUSE_PID}/ns/{k}");
    assert_eq!(
        namespaces_of(&spec),
        [
            ns("pid", ""),
            ns("ipc", &pause("ipc")),
            ns("uts", &pause("uts")),
            ns("mount", ""),
            ns("network", &pause("net")),
        ]
    );
}
