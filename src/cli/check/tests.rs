//! `check` end to end on faked nodes: the bench as it is, a node that must not get rsandbox
//! as its default runtime, and the command line.

use super::node::fake::{FakeNode, ok};
use super::report::{EXIT_BLOCKING, EXIT_OK, Status, Verdict};
use super::*;

const CONTAINERD: &str = "/opt/rsandbox/usr/bin/containerd";
const CONFIG: &str = "/opt/rsandbox/conf/containerd.toml";

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A node as this bench is: containerd 2.1.9 with the rsandbox handler in its config, runc
/// 1.1.5, cgroup v1 (hybrid), no systemd, SELinux off.
fn bench(default_runtime: &str) -> FakeNode {
    let dump = format!(
        "version = 3\nimports = []\n[plugins]\n  [plugins.'io.containerd.cri.v1.runtime']\n\
         \x20   [plugins.'io.containerd.cri.v1.runtime'.containerd]\n      default_runtime_name = '{default_runtime}'\n\
         \x20     [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]\n\
         \x20       [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n\
         \x20         runtime_type = 'io.containerd.runc.v2'\n          sandboxer = 'podsandbox'\n\
         \x20         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n\
         \x20           SystemdCgroup = false\n\
         \x20       [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n\
         \x20         runtime_type = 'io.containerd.rsandbox.v1'\n          sandboxer = 'shim'\n\
         \x20 [plugins.'io.containerd.shim.v1.manager']\n    env = ['RSANDBOX_CONFIG=/opt/rsandbox/conf/rsandbox.toml']\n"
    );
    let mut n = FakeNode {
        release: "6.1.0-41-amd64".into(),
        ..Default::default()
    };
    n.file(CONFIG, "version = 3\n")
        .file(
            "/opt/rsandbox/conf/rsandbox.toml",
            "[network]\nsandboxes = true\n",
        )
        .file(
            "/proc/self/mountinfo",
            "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
        )
        .file("/opt/rsandbox/usr/bin/containerd-shim-rsandbox-v1", "")
        .binary("runc", "/usr/sbin/runc")
        .command(
            &format!("{CONTAINERD} --version"),
            ok("containerd github.com/containerd/containerd/v2 2.1.9+unknown \n"),
        )
        .command(
            &format!("{CONTAINERD} --config {CONFIG} config dump"),
            ok(&dump),
        )
        .command(
            "/opt/rsandbox/usr/bin/containerd-shim-rsandbox-v1 -v",
            ok(&crate::records::version::text(
                "containerd-shim-rsandbox-v1",
            )),
        )
        .command("/usr/sbin/runc --version", ok("runc version 1.1.5+ds1\n"))
        .command(
            "/usr/sbin/runc features",
            ok(r#"{"linux":{"namespaces":["user"]}}"#),
        );
    n
}

fn options(extra: &[&str]) -> Options {
    let mut a = vec!["-containerd", CONTAINERD, "-containerd-config", CONFIG];
    a.extend(extra);
    Options::parse(&args(&a)).unwrap()
}

/// Every finding id the notes document appears, each once per subject; the bench's verdict is
/// "warn" (hostNetwork on 2.1.9, no drop-in read) and the exit status 0.
#[test]
fn the_bench_passes_with_its_warnings() {
    let n = bench("runc");
    let r = run(&n, &options(&["-runtime", "rsandbox"]));
    for id in [
        "shim.config",
        "containerd.binary",
        "containerd.version",
        "containerd.config",
        "containerd.config-version",
        "containerd.drop-in",
        "containerd.runtime",
        "containerd.options-table",
        "containerd.default-runtime",
        "containerd.host-network",
        "containerd.shim-binary",
        "node-shape",
        "runc.version",
        "runc.features",
        "kernel.openat2",
        "kernel.pidfd",
        "kernel.memfd-seals",
        "kernel.idmapped-mounts",
        "kernel.close-range",
        "kernel.cgroup-kill",
        "cgroup.version",
        "cgroup.driver",
        "systemd.reachable",
        "selinux",
        "restart.sandbox-order",
        "restart.sandbox-names",
        "static-pods.admission",
    ] {
        assert!(r.finding(id).is_some(), "no {id}: {:#?}", r.findings);
    }
    assert_eq!(r.verdict(), Verdict::Warn, "{}", r.to_text());
    assert_eq!(r.exit_status(), EXIT_OK);
    assert_eq!(
        r.finding("containerd.host-network").unwrap().status,
        Status::Warn
    );
    // The shim config came from containerd's env, as the shim gets it.
    let j = r.to_json();
    assert_eq!(
        j["facts"]["shim_config"]["path"],
        "/opt/rsandbox/conf/rsandbox.toml"
    );
    assert_eq!(j["facts"]["cgroup"]["version"], 1);
    assert_eq!(j["facts"]["containerd"]["version"], "2.1.9");
    assert_eq!(j["facts"]["runc"]["binary"], "/usr/sbin/runc");
    assert_eq!(j["verdict"], "warn");
    // No kubelet on the bench: a note, no warning.
    assert_eq!(
        r.finding("restart.sandbox-order").unwrap().status,
        Status::Info
    );
    assert!(j["facts"]["kubelet"]["binary"].is_null());
    // The systemd driver is not in use and systemd is not PID 1: never asked.
    assert!(!n.ran.borrow().iter().any(|c| c.contains("systemd")));
}

/// The bench with a kubelet 1.34 running (as the issue's kubelet built before PR 130551):
/// the restart hazard is a warning in the report, with what to do; with 1.36 it is not.
#[test]
fn a_running_kubelet_before_1_35_is_warned_about() {
    let mut n = bench("runc");
    n.file("/proc/1/comm", "systemd\n")
        .file("/proc/4242/comm", "kubelet\n")
        .command("/proc/4242/exe --version", ok("Kubernetes v1.34.2\n"));
    n.links
        .insert("/proc/4242/exe".into(), "/usr/bin/kubelet".into());
    let r = run(&n, &options(&["-runtime", "rsandbox"]));
    let f = r.finding("restart.sandbox-order").unwrap();
    assert_eq!(f.status, Status::Warn, "{}", r.to_text());
    let t = r.to_text();
    assert!(t.contains("[ WARN] restart.sandbox-order"), "{t}");
    assert!(t.contains("/usr/bin/kubelet (running, pid 4242)"), "{t}");
    assert_eq!(r.to_json()["facts"]["kubelet"]["version"], "1.34.2");
    assert_eq!(r.exit_status(), EXIT_OK);

    n.command("/proc/4242/exe --version", ok("Kubernetes v1.36.2\n"));
    let r = run(&n, &options(&["-runtime", "rsandbox"]));
    assert_eq!(
        r.finding("restart.sandbox-order").unwrap().status,
        Status::Ok
    );
}

#[test]
fn rsandbox_as_default_runtime_on_2_1_exits_1() {
    let n = bench("rsandbox");
    let r = run(&n, &options(&[]));
    assert_eq!(r.verdict(), Verdict::Blocking);
    assert_eq!(r.exit_status(), EXIT_BLOCKING);
    let t = r.to_text();
    assert!(t.contains("[BLOCK] containerd.default-runtime"), "{t}");
}

#[test]
fn flags_parse_as_go_flags_and_usage_errors_are_typed() {
    let o = Options::parse(&args(&["--json", "-runtime=rsandbox", "-timeout", "3"])).unwrap();
    assert!(o.json);
    assert_eq!(o.runtime, "rsandbox");
    assert_eq!(o.timeout().unwrap(), Duration::from_secs(3));
    assert!(matches!(
        Options::parse(&args(&["-h"])),
        Err(UsageError::Flag(FlagError::Help))
    ));
    for bad in [
        &["-nope"][..],
        &["extra"],
        &["-timeout", "0"],
        &["-timeout", "x"],
        &["-runc"],
    ] {
        assert!(Options::parse(&args(bad)).is_err(), "{bad:?}");
    }
}

/// The real node: `check` on this machine ends (no hang) and judges the kernel facilities
/// as usable; what it says about containerd depends on the machine.
#[test]
fn check_runs_on_this_machine() {
    let r = run(&node::System, &options(&["-timeout", "20"]));
    for id in ["kernel.openat2", "kernel.pidfd", "kernel.memfd-seals"] {
        assert_eq!(r.finding(id).unwrap().status, Status::Ok, "{}", r.to_text());
    }
    serde_json::to_string(&r.to_json()).unwrap();
}
