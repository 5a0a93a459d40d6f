use super::*;
use crate::pod::spec::SysctlDefaults;
use cri::NamespaceMode as M;

fn any_of(cfg: &cri::PodSandboxConfig, url: &str) -> Any {
    Any {
        type_url: url.into(),
        value: cfg.write_to_bytes().unwrap(),
        ..Default::default()
    }
}

fn decode(cfg: &cri::PodSandboxConfig) -> Result<PodSpec, SpecError> {
    decode_pod_config(&any_of(cfg, "runtime.v1.PodSandboxConfig"))
}

fn kubelet_like() -> cri::PodSandboxConfig {
    let mut cfg = cri::PodSandboxConfig::new();
    let md = cfg.metadata.mut_or_insert_default();
    md.name = "nginx".into();
    md.namespace = "default".into();
    md.uid = "5f2a6e1c-0000-4000-8000-000000000001".into();
    md.attempt = 1;
    cfg.hostname = "nginx".into();
    cfg.log_directory = "/var/log/pods/default_nginx_5f2a".into();
    let dns = cfg.dns_config.mut_or_insert_default();
    dns.servers = vec!["10.96.0.10".into(), "fd00::a".into()];
    dns.searches = vec![
        "default.svc.cluster.local".into(),
        "svc.cluster.local".into(),
    ];
    dns.options = vec!["ndots:5".into()];
    let mut pm = cri::PortMapping::new();
    pm.protocol = cri::Protocol::TCP.into();
    pm.container_port = 80;
    pm.host_port = 8080;
    cfg.port_mappings.push(pm);
    cfg.labels.insert("app".into(), "nginx".into());
    cfg.annotations
        .insert("kubernetes.io/config.source".into(), "api".into());
    let linux = cfg.linux.mut_or_insert_default();
    linux.cgroup_parent = "/kubepods/besteffort/pod5f2a".into();
    linux
        .sysctls
        .insert("net.core.somaxconn".into(), "1024".into());
    linux.sysctls.insert("kernel.shmmax".into(), "1000".into());
    let sc = linux.security_context.mut_or_insert_default();
    sc.run_as_user.mut_or_insert_default().value = 1000;
    sc.run_as_group.mut_or_insert_default().value = 2000;
    let ns = sc.namespace_options.mut_or_insert_default();
    ns.network = M::POD.into();
    ns.pid = M::CONTAINER.into();
    ns.ipc = M::POD.into();
    ns.userns_options.mut_or_insert_default().mode = M::NODE.into();
    cfg
}

fn with_linux(f: impl FnOnce(&mut cri::LinuxPodSandboxConfig)) -> cri::PodSandboxConfig {
    let mut cfg = kubelet_like();
    f(cfg.linux.mut_or_insert_default());
    cfg
}

/// SELinux options end up in a mount option (`context="..."`): a value that could close its
/// quotes or add options is InvalidArgument naming the field; SELinux names pass.
#[test]
fn selinux_options_are_names_not_mount_options() {
    let with = |user: &str, level: &str| {
        with_linux(|l| {
            let o = l
                .security_context
                .mut_or_insert_default()
                .selinux_options
                .mut_or_insert_default();
            o.user = user.into();
            o.level = level.into();
        })
    };
    let spec = decode(&with("system_u", "s0:c1,c2")).unwrap();
    let o = spec.selinux.unwrap();
    assert_eq!(
        (o.user.as_str(), o.level.as_str()),
        ("system_u", "s0:c1,c2")
    );
    for (user, level, field) in [
        ("x\",size=64g,mode=1777,\"y", "", "user"),
        ("u:r", "", "user"),
        ("system_u", "s0 size=1", "level"),
        ("system_u", "s0\"", "level"),
    ] {
        let e = decode(&with(user, level)).unwrap_err().to_string();
        assert!(
            e.contains(&format!("selinux_options.{field}")),
            "{user:?} {level:?}: {e}"
        );
    }
}

#[test]
fn pod_resources_are_decoded_and_checked() {
    let cfg = with_linux(|l| {
        let r = l.resources.mut_or_insert_default();
        r.cpu_period = 100_000;
        r.cpu_quota = -1;
        r.cpu_shares = 256;
        r.memory_limit_in_bytes = 64 << 20;
        r.cpuset_cpus = "0-3,6".into();
    });
    let spec = decode(&cfg).unwrap();
    assert_eq!(
        spec.resources,
        Some(PodResources {
            cpu_period: 100_000,
            cpu_quota: -1,
            cpu_shares: 256,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0-3,6".into(),
            cpuset_mems: String::new(),
        })
    );
    assert_eq!(decode(&kubelet_like()).unwrap().resources, None);
    for (f, want) in [
        (
            (|r: &mut cri::LinuxContainerResources| r.cpu_shares = -2)
                as fn(&mut cri::LinuxContainerResources),
            "linux.resources.cpu_shares: -2 is negative",
        ),
        (
            |r| r.cpu_quota = -5,
            "linux.resources.cpu_quota: -5 is below -1",
        ),
        (
            |r| r.cpuset_mems = "0;rm".into(),
            "linux.resources.cpuset_mems: ",
        ),
    ] {
        let cfg = with_linux(|l| f(l.resources.mut_or_insert_default()));
        let err = err_string(&cfg);
        assert!(err.starts_with(want), "{err}");
    }
}

fn nso(cfg: &mut cri::PodSandboxConfig) -> &mut cri::NamespaceOption {
    cfg.linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .namespace_options
        .mut_or_insert_default()
}

fn err_string(cfg: &cri::PodSandboxConfig) -> String {
    decode(cfg).unwrap_err().to_string()
}

#[test]
fn decodes_kubelet_like_config() {
    let spec = decode(&kubelet_like()).unwrap();
    assert!(spec.cri_config);
    assert_eq!(spec.name, "nginx");
    assert_eq!(spec.namespace, "default");
    assert_eq!(spec.uid, "5f2a6e1c-0000-4000-8000-000000000001");
    assert_eq!(spec.attempt, 1);
    assert_eq!(spec.hostname, "nginx");
    assert_eq!(spec.log_directory, "/var/log/pods/default_nginx_5f2a");
    assert_eq!(
        spec.dns,
        Some(Dns {
            servers: vec!["10.96.0.10".into(), "fd00::a".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into()
            ],
            options: vec!["ndots:5".into()],
        })
    );
    assert_eq!(
        spec.port_mappings,
        vec![PortMapping {
            protocol: Protocol::Tcp,
            container_port: 80,
            host_port: 8080,
            host_ip: None
        }]
    );
    assert_eq!(spec.labels["app"], "nginx");
    assert_eq!(spec.annotations["kubernetes.io/config.source"], "api");
    assert_eq!(
        spec.cgroup_parent.as_deref(),
        Some("/kubepods/besteffort/pod5f2a")
    );
    assert_eq!(
        spec.cgroup_parent_kind(),
        Some(CgroupParent::Fs("/kubepods/besteffort/pod5f2a".into()))
    );
    assert_eq!(spec.sysctls.len(), 2);
    assert_eq!(spec.network, NetworkMode::Pod);
    assert_eq!(spec.ipc, IpcMode::Pod);
    assert_eq!(spec.pid, PidMode::Container);
    assert!(!spec.host_uts());
    assert_eq!(spec.run_as_user, Some(1000));
    assert_eq!(spec.run_as_group, Some(2000));
    assert!(!spec.privileged);
    assert_eq!(spec.selinux, None, "no selinux_options");
}

#[test]
fn selinux_options_are_kept_when_any_is_set() {
    let mut cfg = kubelet_like();
    fn options(cfg: &mut cri::PodSandboxConfig) -> &mut cri::SELinuxOption {
        cfg.linux
            .mut_or_insert_default()
            .security_context
            .mut_or_insert_default()
            .selinux_options
            .mut_or_insert_default()
    }
    options(&mut cfg);
    assert_eq!(decode(&cfg).unwrap().selinux, None, "all fields empty");
    let o = options(&mut cfg);
    o.user = "system_u".into();
    o.type_ = "spc_t".into();
    o.level = "s0:c1,c2".into();
    assert_eq!(
        decode(&cfg).unwrap().selinux,
        Some(crate::host::selinux::SelinuxOptions {
            user: "system_u".into(),
            role: String::new(),
            kind: "spc_t".into(),
            level: "s0:c1,c2".into(),
        })
    );
}

#[test]
fn type_url_forms() {
    let cfg = kubelet_like();
    for url in [
        "runtime.v1.PodSandboxConfig",
        "type.googleapis.com/runtime.v1.PodSandboxConfig",
    ] {
        assert_eq!(decode_pod_config(&any_of(&cfg, url)).unwrap().name, "nginx");
    }
    let e = decode_pod_config(&any_of(&cfg, "runtime.v1alpha2.PodSandboxConfig")).unwrap_err();
    assert!(matches!(e, SpecError::UnsupportedType(_)), "{e}");
    assert!(e.to_string().starts_with("options: "), "{e}");
}

#[test]
fn empty_any_gives_default_pod() {
    let default = PodSpec::default();
    assert_eq!(default.network, NetworkMode::Pod);
    assert_eq!(default.ipc, IpcMode::Pod);
    assert_eq!(default.pid, PidMode::Container);
    assert!(default.name.is_empty() && default.namespace.is_empty());
    for url in [
        "",
        "google.protobuf.Empty",
        "type.googleapis.com/google.protobuf.Empty",
    ] {
        let any = Any {
            type_url: url.into(),
            ..Default::default()
        };
        assert_eq!(decode_pod_config(&any).unwrap(), default, "{url:?}");
    }
    // Bytes without a type are not guessed at.
    let any = Any {
        value: vec![0x12, 0x01, b'h'],
        ..Default::default()
    };
    assert!(decode_pod_config(&any).is_err());
}

#[test]
fn garbage_bytes_are_a_decode_error() {
    let any = Any {
        type_url: "runtime.v1.PodSandboxConfig".into(),
        value: vec![0x0a, 0x05, 0x01],
        ..Default::default()
    };
    assert!(matches!(decode_pod_config(&any), Err(SpecError::Decode(_))));
}

#[test]
fn minimal_config_uses_protobuf_defaults() {
    let spec = decode(&cri::PodSandboxConfig::new()).unwrap();
    assert_eq!(spec.pid, PidMode::Pod);
    assert_eq!(spec.network, NetworkMode::Pod);
    assert_eq!(spec.dns, None);
    assert_eq!(spec.cgroup_parent, None);
    assert_eq!(spec.run_as_user, None);
}

#[test]
fn namespace_modes() {
    let mut cfg = kubelet_like();
    let n = nso(&mut cfg);
    n.network = M::NODE.into();
    n.ipc = M::NODE.into();
    n.pid = M::NODE.into();
    cfg.linux.mut_or_insert_default().sysctls.clear();
    let spec = decode(&cfg).unwrap();
    assert_eq!(
        (spec.network, spec.ipc, spec.pid.clone()),
        (NetworkMode::Host, IpcMode::Host, PidMode::Host)
    );
    assert!(spec.host_uts());

    let mut cfg = kubelet_like();
    nso(&mut cfg).pid = M::TARGET.into();
    let e = err_string(&cfg);
    assert!(
        e.starts_with("linux.security_context.namespace_options.target_id: "),
        "{e}"
    );
    nso(&mut cfg).target_id = "ctr1".into();
    assert_eq!(decode(&cfg).unwrap().pid, PidMode::Target("ctr1".into()));

    let mut cfg = kubelet_like();
    nso(&mut cfg).network = M::CONTAINER.into();
    let e = err_string(&cfg);
    assert!(
        e.starts_with("linux.security_context.namespace_options.network: "),
        "{e}"
    );

    let mut cfg = kubelet_like();
    nso(&mut cfg).ipc = protobuf::EnumOrUnknown::from_i32(42);
    let e = err_string(&cfg);
    assert!(e.contains("namespace_options.ipc: unknown mode 42"), "{e}");
}

fn id_map(container_id: u32, host_id: u32, length: u32) -> cri::IDMapping {
    cri::IDMapping {
        container_id,
        host_id,
        length,
        ..Default::default()
    }
}

/// What the kubelet sends for `hostUsers: false`: one mapping of 65536 ids.
fn userns_pod(uids: Vec<cri::IDMapping>, gids: Vec<cri::IDMapping>) -> cri::PodSandboxConfig {
    let mut cfg = kubelet_like();
    let u = nso(&mut cfg).userns_options.mut_or_insert_default();
    u.mode = M::POD.into();
    u.uids = uids;
    u.gids = gids;
    cfg
}

#[test]
fn userns_pod_gets_its_mappings() {
    let cfg = userns_pod(
        vec![id_map(0, 65536 * 3, 65536)],
        vec![id_map(0, 65536 * 4, 65536)],
    );
    let spec = decode(&cfg).unwrap();
    let u = spec.userns.clone().unwrap();
    assert_eq!(
        u.uids,
        [IdMapping {
            container_id: 0,
            host_id: 196608,
            size: 65536
        }]
    );
    assert_eq!(u.host_root(), (196608, 262144));
    assert_eq!(u.uid_map(), "0 196608 65536\n");
    assert_eq!(u.gid_map(), "0 262144 65536\n");
    // Members join the pause's user namespace; no default ping_group_range (containerd).
    assert_eq!(
        spec.member_namespace("user"),
        crate::pod::spec::MemberNamespace::Pause("user")
    );
    let names: Vec<String> = spec
        .effective_sysctls(SysctlDefaults::default())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"net.ipv4.ip_unprivileged_port_start".to_string()));
    assert!(!names.contains(&"net.ipv4.ping_group_range".to_string()));
    // Several lines, each side disjoint, covering 0 and 65535.
    let cfg = userns_pod(
        vec![id_map(0, 100000, 1000), id_map(1000, 300000, 65000)],
        vec![id_map(0, 100000, 65536)],
    );
    assert_eq!(
        decode(&cfg).unwrap().userns.unwrap().uid_map(),
        "0 100000 1000\n1000 300000 65000\n"
    );
}

#[test]
fn userns_node_and_absent_mean_the_node() {
    let mut cfg = kubelet_like();
    assert_eq!(decode(&cfg).unwrap().userns, None);
    nso(&mut cfg).userns_options.clear();
    let spec = decode(&cfg).unwrap();
    assert_eq!(spec.userns, None);
    assert_eq!(
        spec.member_namespace("user"),
        crate::pod::spec::MemberNamespace::Own
    );
}

#[test]
fn bad_userns_options_are_invalid() {
    let f = "linux.security_context.namespace_options.userns_options";
    let full = || vec![id_map(0, 100000, 65536)];
    let mut cases = vec![
        (
            userns_pod(vec![], full()),
            format!("{f}.uids: mode POD needs at least one mapping"),
        ),
        (
            userns_pod(full(), vec![]),
            format!("{f}.gids: mode POD needs at least one mapping"),
        ),
        (
            userns_pod(vec![id_map(0, 1, 0)], full()),
            format!("{f}.uids[0]: length 0"),
        ),
        (
            userns_pod(full(), vec![id_map(0, u32::MAX, 2)]),
            format!("{f}.gids[0]: the range reaches 2^32-1"),
        ),
        (
            // 200 short lines with long ids: more than a page of map text.
            userns_pod(
                (0..200)
                    .map(|i| id_map(1_000_000_000 + i * 10, 3_000_000_000 + i * 10, 1))
                    .collect(),
                full(),
            ),
            format!("{f}.uids: the map is 4800 bytes long, the kernel takes less than 4096"),
        ),
        (
            // Ends exactly at 2^32: its last id would be (uid_t)-1.
            userns_pod(full(), vec![id_map(0, u32::MAX, 1)]),
            format!("{f}.gids[0]: the range reaches 2^32-1"),
        ),
        (
            userns_pod(
                vec![id_map(0, 100000, 65536), id_map(70000, 165000, 10)],
                full(),
            ),
            format!("{f}.uids[1]: its host ids overlap those of [0]"),
        ),
        (
            userns_pod(
                vec![id_map(0, 100000, 65536), id_map(100, 500000, 10)],
                full(),
            ),
            format!("{f}.uids[1]: its container ids overlap those of [0]"),
        ),
        (
            userns_pod(vec![id_map(0, 100000, 65535)], full()),
            format!(
                "{f}.uids: container id 65535 is not mapped (the pod needs ids [0, 65535]: \
                     root, and the pause process's 65535)"
            ),
        ),
        (
            userns_pod(full(), vec![id_map(1, 100000, 65535)]),
            format!(
                "{f}.gids: container id 0 is not mapped (the pod needs ids [0, 65535]: \
                     root, and the pause process's 65535)"
            ),
        ),
        (
            userns_pod(vec![id_map(0, 1, 1); MAX_ID_MAPPINGS + 1], full()),
            format!("{f}.uids: more than {MAX_ID_MAPPINGS} mappings"),
        ),
    ];
    for mode in [M::CONTAINER, M::TARGET] {
        let mut cfg = userns_pod(full(), full());
        nso(&mut cfg).userns_options.mut_or_insert_default().mode = mode.into();
        cases.push((
            cfg,
            format!("{f}.mode: mode {mode:?} is not valid (want POD or NODE)"),
        ));
    }
    let mut cfg = userns_pod(full(), full());
    nso(&mut cfg).userns_options.mut_or_insert_default().mode = M::NODE.into();
    cases.push((
        cfg,
        format!("{f}: mode NODE takes no mappings (got 1 uid and 1 gid mappings)"),
    ));
    let mut cfg = userns_pod(full(), full());
    nso(&mut cfg).userns_options.mut_or_insert_default().mode =
        protobuf::EnumOrUnknown::from_i32(9);
    cases.push((cfg, format!("{f}.mode: unknown mode 9")));
    for (cfg, want) in cases {
        let e = decode(&cfg).unwrap_err();
        assert!(matches!(e, SpecError::Invalid { .. }), "{e}");
        assert_eq!(e.to_string(), want);
        assert_eq!(
            crate::records::error::Error::from(e).kind(),
            crate::records::error::Kind::InvalidArgument
        );
    }
}

#[test]
fn hostname_rules() {
    for ok in ["a", "nginx-1", "a.b.c", "A1", &"x".repeat(63)] {
        assert!(check_hostname(ok).is_ok(), "{ok}");
    }
    let long = format!("{}.{}", "a".repeat(40), "b".repeat(30));
    for bad in [
        "",
        "-a",
        "a-",
        "a..b",
        "a_b",
        "a b",
        "a/b",
        ".a",
        &"x".repeat(64 + 1),
        &"x".repeat(64),
        &long,
    ] {
        assert!(check_hostname(bad).is_err(), "{bad:?}");
    }
    let mut cfg = kubelet_like();
    cfg.hostname = "bad_name".into();
    assert!(err_string(&cfg).starts_with("hostname: "));
    cfg.hostname = String::new();
    assert_eq!(decode(&cfg).unwrap().hostname, "");
}

#[test]
fn sysctl_errors_name_the_key() {
    let cfg = with_linux(|l| {
        l.sysctls.insert("kernel.foo".into(), "1".into());
    });
    let e = err_string(&cfg);
    assert!(
        e.starts_with("linux.sysctls[\"kernel.foo\"]: not namespaced"),
        "{e}"
    );

    let cfg = with_linux(|l| {
        l.sysctls.insert("net.ipv4.ip_forward".into(), "1".into());
        l.sysctls.insert("net/ipv4/ip_forward".into(), "0".into());
    });
    assert!(err_string(&cfg).contains("set twice"));
}

#[test]
fn effective_sysctls_adds_containerd_defaults() {
    let spec = decode(&kubelet_like()).unwrap();
    assert_eq!(
        spec.effective_sysctls(SysctlDefaults::default()),
        vec![
            ("kernel.shmmax".to_string(), "1000".to_string()),
            ("net.core.somaxconn".into(), "1024".into()),
            ("net.ipv4.ip_unprivileged_port_start".into(), "0".into()),
            ("net.ipv4.ping_group_range".into(), "0 2147483647".into()),
        ]
    );
    // User values win.
    let cfg = with_linux(|l| {
        l.sysctls
            .insert("net.ipv4.ip_unprivileged_port_start".into(), "1024".into());
        l.sysctls
            .insert("net.ipv4.ping_group_range".into(), "1 0".into());
    });
    let eff = decode(&cfg)
        .unwrap()
        .effective_sysctls(SysctlDefaults::default());
    assert!(eff.contains(&("net.ipv4.ip_unprivileged_port_start".into(), "1024".into())));
    assert!(eff.contains(&("net.ipv4.ping_group_range".into(), "1 0".into())));
    // Toggles.
    let eff = spec.effective_sysctls(SysctlDefaults {
        unprivileged_ports: false,
        unprivileged_icmp: true,
    });
    assert!(
        !eff.iter()
            .any(|(k, _)| k == "net.ipv4.ip_unprivileged_port_start")
    );
    assert!(eff.iter().any(|(k, _)| k == "net.ipv4.ping_group_range"));
    // Host network: nothing added.
    let mut cfg = kubelet_like();
    nso(&mut cfg).network = M::NODE.into();
    cfg.linux.mut_or_insert_default().sysctls.clear();
    assert!(
        decode(&cfg)
            .unwrap()
            .effective_sysctls(SysctlDefaults::default())
            .is_empty()
    );
}

#[test]
fn cgroup_parent_forms() {
    use CgroupParent::*;
    assert_eq!(
        CgroupParent::parse("/kubepods/burstable/pod1"),
        Ok(Fs("/kubepods/burstable/pod1".into()))
    );
    assert_eq!(
        CgroupParent::parse("kubepods-burstable-pod1.slice"),
        Ok(Systemd("kubepods-burstable-pod1.slice".into()))
    );
    assert_eq!(
        CgroupParent::parse("system.slice:rsandbox:abc"),
        Ok(Systemd("system.slice:rsandbox:abc".into()))
    );
    assert_eq!(
        CgroupParent::parse(":rsandbox:abc"),
        Ok(Systemd(":rsandbox:abc".into()))
    );
    for bad in [
        "kubepods",
        "kubepods/burstable",
        "/kubepods/../etc",
        "/kubepods/./x",
        "/a\0b",
        "a.slice/b",
        "a.service",
        "a:b",
        "a.slice:b:c:d",
        "x.slice:p:",
    ] {
        assert!(CgroupParent::parse(bad).is_err(), "{bad:?}");
    }
    let cfg = with_linux(|l| l.cgroup_parent = "relative/path".into());
    assert!(err_string(&cfg).starts_with("linux.cgroup_parent: "));
}

/// What the kubelet's systemd driver sends, per QoS class (`CgroupName.ToSystemd()`:
/// runc's `ExpandSlice` of `kubepods[-<qos>]-pod<uid with - as _>.slice`, seen in `crictl
/// inspectp` of kubelet 1.36 pods), is that slice — as containerd's `getCgroupsPath` takes
/// it (the base name's `.slice` suffix).
#[test]
fn the_kubelet_s_expanded_slice_paths_are_the_pod_slice() {
    use CgroupParent::*;
    let uid = "5f2a0c1e-7b3d-4e1f-9a2b-8c4d6e0f1a2b".replace('-', "_");
    for (sent, slice) in [
        (
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"),
            format!("kubepods-besteffort-pod{uid}.slice"),
        ),
        (
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"),
            format!("kubepods-burstable-pod{uid}.slice"),
        ),
        (
            format!("/kubepods.slice/kubepods-pod{uid}.slice"),
            format!("kubepods-pod{uid}.slice"),
        ),
        // a trailing `/`, which containerd's `path.Base` drops too
        (
            format!("/kubepods.slice/kubepods-pod{uid}.slice/"),
            format!("kubepods-pod{uid}.slice"),
        ),
        // the QoS slices and kubepods.slice themselves
        ("/kubepods.slice".into(), "kubepods.slice".into()),
    ] {
        assert_eq!(CgroupParent::parse(&sent), Ok(Systemd(slice)), "{sent}");
        let cfg = with_linux(|l| l.cgroup_parent = sent.clone());
        let spec = decode(&cfg).unwrap();
        assert_eq!(spec.cgroup_parent.as_deref(), Some(sent.as_str()));
        assert!(matches!(spec.cgroup_parent_kind(), Some(Systemd(_))));
    }
    // The cgroupfs driver's paths stay cgroupfs paths.
    for sent in [
        format!("/kubepods/besteffort/pod{uid}"),
        format!("/kubepods/pod{uid}"),
        "/".into(),
        "/system.slice/kube/pod1".into(),
    ] {
        assert_eq!(
            CgroupParent::parse(&sent),
            Ok(Fs(sent.clone().into())),
            "{sent}"
        );
    }
}

/// A path ending in a slice that is not that slice's own cgroup: containerd and runc would
/// use the name alone and put the runc path's pod in `/c.slice`, while containerd reads
/// `PodSandboxStats` from the path given. Refused, naming where the slice lives; so is a
/// last component runc's `ExpandSlice` refuses.
#[test]
fn a_slice_path_that_is_not_the_slice_s_expansion_is_refused() {
    for (sent, why) in [
        ("/a.slice/c.slice", "whose cgroup is /c.slice ("),
        (
            "/c.slice/a-b.slice/c-d.slice",
            "whose cgroup is /c.slice/c-d.slice (",
        ),
        (
            "/kubepods/kubepods-besteffort-pod1.slice",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
        ),
        ("/kubepods.slice/kubepods--x.slice", "invalid slice name"),
        ("/kubepods.slice/-x.slice", "invalid slice name"),
    ] {
        let e = CgroupParent::parse(sent).unwrap_err();
        assert!(e.contains(why), "{sent}: {e}");
        let cfg = with_linux(|l| l.cgroup_parent = sent.into());
        let e = err_string(&cfg);
        assert!(e.starts_with("linux.cgroup_parent: "), "{e}");
    }
}

#[test]
fn dns_rules() {
    let set = |f: &dyn Fn(&mut cri::DNSConfig)| {
        let mut cfg = kubelet_like();
        f(cfg.dns_config.mut_or_insert_default());
        decode(&cfg)
    };
    assert!(set(&|d| d.servers = vec!["fe80::1%eth0".into()]).is_ok());
    let e = set(&|d| d.servers = vec!["10.0.0.1".into(), "dns.example".into()])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("dns_config.servers[1]: "), "{e}");
    assert!(set(&|d| d.servers = vec!["10.0.0.1\nnameserver 1.2.3.4".into()]).is_err());
    let e = set(&|d| d.searches = vec!["a b".into()])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("dns_config.searches[0]: "), "{e}");
    assert!(set(&|d| d.options = vec!["ndots:5\n".into()]).is_err());
    assert!(set(&|d| d.options = vec![String::new()]).is_err());
    assert!(set(&|d| d.searches = vec!["s".into(); MAX_DNS_SEARCHES + 1]).is_err());
}

#[test]
fn ports_ids_and_paths() {
    let mut cfg = kubelet_like();
    cfg.port_mappings[0].host_port = 70000;
    assert!(err_string(&cfg).starts_with("port_mappings[0].host_port: "));
    let mut cfg = kubelet_like();
    cfg.port_mappings[0].host_ip = "localhost".into();
    assert!(err_string(&cfg).starts_with("port_mappings[0].host_ip: "));
    let mut cfg = kubelet_like();
    cfg.port_mappings[0].host_ip = "::1".into();
    cfg.port_mappings[0].protocol = cri::Protocol::SCTP.into();
    let pm = &decode(&cfg).unwrap().port_mappings[0];
    assert_eq!(pm.host_ip, Some("::1".parse().unwrap()));
    assert_eq!(pm.protocol, Protocol::Sctp);

    let mut cfg = kubelet_like();
    cfg.linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .run_as_user
        .clear();
    assert!(err_string(&cfg).contains("run_as_group: set without run_as_user"));
    let mut cfg = kubelet_like();
    cfg.linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .run_as_user
        .mut_or_insert_default()
        .value = -1;
    assert!(err_string(&cfg).starts_with("linux.security_context.run_as_user: "));

    let mut cfg = kubelet_like();
    cfg.log_directory = "relative".into();
    assert!(err_string(&cfg).starts_with("log_directory: "));
    let mut cfg = kubelet_like();
    cfg.metadata.mut_or_insert_default().name = "a/b".into();
    assert!(err_string(&cfg).starts_with("metadata.name: "));
}

#[test]
fn quantities() {
    for (q, want) in [
        ("10M", 10_000_000u64),
        ("1k", 1_000),
        ("1Ki", 1_024),
        ("1.5Ki", 1_536),
        ("1.5k", 1_500),
        ("+2G", 2_000_000_000),
        ("1e3", 1_000),
        ("1E6", 1_000_000),
        ("12e-1", 2),
        ("1500m", 2),
        ("0.001k", 1),
        ("1.", 1),
        (".5k", 500),
        ("0", 0),
        ("000100", 100),
        ("1P", 1_000_000_000_000_000),
        ("1Ei", 1 << 60),
        ("16Ei", u64::MAX),
        ("100000000000000000000000", u64::MAX),
        ("1e9999", u64::MAX),
        ("1e-9999", 1),
        ("1.000000000000000000000000000", 1),
        ("0.000000000000000000001", 1),
    ] {
        assert_eq!(parse_quantity(q), Ok(want), "{q}");
    }
    for bad in [
        "",
        ".",
        "k",
        "1.2.3",
        "1 k",
        " 1k",
        "1kb",
        "1K",
        "1e",
        "1e+",
        "1e12345",
        "-1k",
        "1..",
        "1.00000000000000000001",
    ] {
        assert!(parse_quantity(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn bandwidth_annotations() {
    let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(bandwidth_of(&ann(&[("a", "b")])), Ok(None));
    assert_eq!(
        bandwidth_of(&ann(&[(INGRESS_BANDWIDTH, "10M")])),
        Ok(Some(Bandwidth {
            ingress_rate: 10_000_000,
            ingress_burst: u32::MAX as u64,
            egress_rate: 0,
            egress_burst: 0,
        }))
    );
    let b = bandwidth_of(&ann(&[(INGRESS_BANDWIDTH, "1k"), (EGRESS_BANDWIDTH, "1P")]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (b.ingress_rate, b.egress_rate),
        (1_000, 1_000_000_000_000_000)
    );
    assert_eq!(b.egress_burst, u32::MAX as u64);
    for (v, why) in [
        ("999", "unreasonably small"),
        ("1.0001P", "unreasonably large"),
        ("ten", "not a resource quantity"),
    ] {
        let e = bandwidth_of(&ann(&[(EGRESS_BANDWIDTH, v)]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("annotations[\"kubernetes.io/egress-bandwidth\"]: ") && e.contains(why),
            "{v}: {e}"
        );
    }
}
