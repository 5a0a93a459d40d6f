use super::*;

#[test]
fn own_cgroups_end_in_the_id_or_its_scope() {
    let own = |d: &str, id: &str| is_own_cgroup(Path::new(d), id);
    // cgroupfs: ctr's default, CRI's container and pause cgroups.
    assert!(own("/sys/fs/cgroup/memory/default/c1", "c1"));
    assert!(own("/sys/fs/cgroup/kubepods/besteffort/pod1/c1", "c1"));
    // systemd: the scope runc makes for `<slice>:cri-containerd:<id>`.
    assert!(own(
        "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope",
        "c1"
    ));
    assert!(own(
        "/sys/fs/cgroup/unified/system.slice/docker-c1.scope",
        "c1"
    ));
    // Shared cgroups a spec may name, a pod cgroup, parents.
    assert!(!own("/sys/fs/cgroup/unified/system.slice", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/kubepods/besteffort/pod1", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/kubepods", "c1"));
    assert!(!own("/sys/fs/cgroup/memory", "c1"));
    // Not the ID: a longer name ending in it, a slice, a scope of another ID.
    assert!(!own("/sys/fs/cgroup/memory/xc1", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/c1.slice", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/cri-containerd-xc1.scope", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/c1.scope", "c1"));
    // Through `..`: never.
    assert!(!own("/sys/fs/cgroup/memory/c1/../../c1", "c1"));
    assert!(!own("/sys/fs/cgroup/memory/c1", ""));
}

const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
28 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
30 25 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
31 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd";

const CGROUP: &str = "\
12:pids:/default/c1
4:cpu,cpuacct:/default/c1
3:memory:/default/c1
1:name=systemd:/default/c1
0::/default/c1";

#[test]
fn v1_paths_join_mount_points() {
    let p = CgroupPaths::parse(CGROUP, MOUNTINFO, false);
    assert_eq!(
        p.v1["memory"],
        PathBuf::from("/sys/fs/cgroup/memory/default/c1")
    );
    assert_eq!(
        p.v1["cpuacct"],
        PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/default/c1")
    );
    assert_eq!(
        p.v1["systemd"],
        PathBuf::from("/sys/fs/cgroup/systemd/default/c1")
    );
    assert_eq!(p.v2, None);
}

#[test]
fn v2_path_on_unified_hosts() {
    let mi = "26 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
    let p = CgroupPaths::parse("0::/k8s.io/abc", mi, true);
    assert_eq!(p.v2, Some(PathBuf::from("/sys/fs/cgroup/k8s.io/abc")));
    assert!(p.v1.is_empty());
}

#[test]
fn paths_of_a_cgroup_in_every_hierarchy() {
    let p = CgroupPaths::of_cgroup_in(Path::new("/kubepods/pod1"), MOUNTINFO, false);
    assert_eq!(
        p.v1["memory"],
        PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1")
    );
    assert_eq!(
        p.v1["cpuacct"],
        PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1")
    );
    assert_eq!(p.v2, None);
    let mi = "26 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
    let p = CgroupPaths::of_cgroup_in(Path::new("/kubepods/pod1"), mi, true);
    assert_eq!(p.v2, Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1")));
    assert!(p.v1.is_empty());
}

#[test]
fn v1_metrics_read_files() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("memory");
    let pids = dir.path().join("pids");
    std::fs::create_dir_all(&mem).unwrap();
    std::fs::create_dir_all(&pids).unwrap();
    std::fs::write(mem.join("memory.usage_in_bytes"), "4096\n").unwrap();
    std::fs::write(mem.join("memory.limit_in_bytes"), "8192\n").unwrap();
    std::fs::write(mem.join("memory.stat"), "cache 10\nrss 20\ntotal_rss 30\n").unwrap();
    std::fs::write(pids.join("pids.current"), "3\n").unwrap();
    std::fs::write(pids.join("pids.max"), "max\n").unwrap();
    let mut p = CgroupPaths::default();
    p.v1.insert("memory".into(), mem);
    p.v1.insert("pids".into(), pids);
    let any = p.metrics().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
    let m: v1::Metrics = protobuf::Message::parse_from_bytes(&any.value).unwrap();
    assert_eq!(m.pids.current, 3);
    assert_eq!(m.pids.limit, 0);
    assert_eq!(m.memory.usage.usage, 4096);
    assert_eq!(m.memory.usage.limit, 8192);
    assert_eq!(
        (m.memory.cache, m.memory.rss, m.memory.total_rss),
        (10, 20, 30)
    );
}

/// Issue 14 item 2: the thaw after a SIGKILL writes the v1 freezer or the v2 freeze file;
/// a cgroup already gone, or no freezer, is no error.
#[test]
fn thaw_writes_the_freezer_of_either_version() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("freezer");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("freezer.state"), "FROZEN\n").unwrap();
    let mut paths = CgroupPaths::default();
    paths.v1.insert("freezer".into(), v1.clone());
    paths.thaw().unwrap();
    assert_eq!(
        std::fs::read_to_string(v1.join("freezer.state"))
            .unwrap()
            .trim(),
        "THAWED"
    );
    let v2 = dir.path().join("unified");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("cgroup.freeze"), "1\n").unwrap();
    let paths = CgroupPaths {
        v2: Some(v2.clone()),
        ..Default::default()
    };
    paths.thaw().unwrap();
    assert_eq!(
        std::fs::read_to_string(v2.join("cgroup.freeze"))
            .unwrap()
            .trim(),
        "0"
    );
    let gone = CgroupPaths {
        v2: Some(dir.path().join("gone")),
        ..Default::default()
    };
    gone.thaw().unwrap();
    CgroupPaths::default().thaw().unwrap();
}

#[test]
fn v2_metrics_read_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("memory.current"), "100\n").unwrap();
    std::fs::write(d.join("memory.max"), "max\n").unwrap();
    std::fs::write(
        d.join("memory.events"),
        "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
    )
    .unwrap();
    std::fs::write(
        d.join("cpu.stat"),
        "usage_usec 55\nuser_usec 50\nsystem_usec 5\n",
    )
    .unwrap();
    std::fs::write(d.join("pids.current"), "2\n").unwrap();
    let p = CgroupPaths {
        v2: Some(d.to_path_buf()),
        ..Default::default()
    };
    let any = p.metrics().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    let m: v2::Metrics = protobuf::Message::parse_from_bytes(&any.value).unwrap();
    assert_eq!((m.memory.usage, m.memory.usage_limit), (100, 0));
    assert_eq!(
        (m.memory_events.oom_kill, m.cpu.usage_usec, m.pids.current),
        (1, 55, 2)
    );
}
