#[test]
fn runc_versions_parse_and_only_1_2_and_later_run_userns_pods() {
    for (out, number, ok) in [
        (
            "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n",
            Some((1, 1, 5)),
            false,
        ),
        (
            "runc version 1.3.0\ncommit: v1.3.0\n",
            Some((1, 3, 0)),
            true,
        ),
        ("runc version 1.2.0-rc.1\n", Some((1, 2, 0)), true),
        ("runc version 2.0\n", Some((2, 0, 0)), true),
        ("runc version 1.0.0-rc93\n", Some((1, 0, 0)), false),
        ("crun version 1.8\n", Some((1, 8, 0)), true),
        ("runc\n", None, false),
        ("", None, false),
    ] {
        let v = RuncVersion::parse(out);
        assert_eq!(v.number, number, "{out:?}");
        let verdict = userns_runc_verdict(Path::new("/usr/sbin/runc"), &v);
        assert_eq!(verdict.is_ok(), ok, "{out:?}");
        if let Err(e) = verdict {
            assert_eq!(e.kind(), crate::records::error::Kind::FailedPrecondition);
            assert_eq!(
                e.message(),
                format!(
                    "user-namespaced pods (userns_options mode POD) need runc >= 1.2 \
                         (idmapped mounts); /usr/sbin/runc is {:?}",
                    out.lines().next().unwrap_or("")
                )
            );
        }
    }
}

#[test]
fn the_version_comes_from_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let runc = dir.path().join("runc");
    std::fs::write(
        &runc,
        "#!/bin/sh\necho 'runc version 1.1.12'\necho 'spec: 1.0.2'\n",
    )
    .unwrap();
    std::fs::set_permissions(&runc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bin = runc.to_str().unwrap();
    // A thread of this test binary that forks meanwhile may hold the script open for a
    // moment (ETXTBSY).
    let mut err = check_userns_runc(bin, &Spawner::direct()).unwrap_err();
    for _ in 0..20 {
        if !err.message().contains("Text file busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        err = check_userns_runc(bin, &Spawner::direct()).unwrap_err();
    }
    assert!(
        err.message().ends_with("is \"runc version 1.1.12\""),
        "{}",
        err.message()
    );
    assert_eq!(
        runc_version(bin, &Spawner::direct()).unwrap().number,
        Some((1, 1, 12))
    );
}

use super::*;
use crate::records::error::Kind;

#[test]
fn a_systemd_cgroups_path_turns_on_the_systemd_cgroup_driver() {
    let spec = |path: &str| serde_json::json!({"linux": {"cgroupsPath": path}});
    let d = || RuncConfig::defaults("k8s.io");
    assert!(
        d().for_container(&spec("kubepods-besteffort-pod1.slice:cri-containerd:c1"))
            .systemd_cgroup
    );
    assert!(
        !d().for_container(&spec("/kubepods/besteffort/pod1/c1"))
            .systemd_cgroup
    );
    assert!(!d().for_container(&serde_json::json!({})).systemd_cgroup);
    // The options' SystemdCgroup = true stays on for every container.
    let on = RuncConfig {
        systemd_cgroup: true,
        ..d()
    };
    assert!(on.for_container(&spec("/kubepods/pod1/c1")).systemd_cgroup);
}

/// Every runc command of such a container carries the global flag, before the command.
#[test]
fn the_systemd_flag_is_passed_to_every_runc_command() {
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    // The fake records its arguments in `args` itself.
    let mut runc = fake_runc(dir.path(), "echo '[]'");
    runc.config.systemd_cgroup = true;
    runc.kill("c1", 9, true).unwrap();
    runc.pause("c1").unwrap();
    runc.resume("c1").unwrap();
    runc.ps("c1").unwrap();
    runc.update("c1", b"{}").unwrap();
    runc.delete("c1", true).unwrap();
    let lines = std::fs::read_to_string(&args).unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 6, "{lines:?}");
    for l in lines {
        let words: Vec<&str> = l.split(' ').collect();
        let flag = words.iter().position(|w| *w == "--systemd-cgroup");
        let cmd = words
            .iter()
            .position(|w| ["kill", "pause", "resume", "ps", "update", "delete"].contains(w));
        assert!(flag.is_some() && flag < cmd, "{l}");
    }
}

#[test]
fn classify_maps_runc_wording_to_kinds() {
    assert_eq!(
        classify("kill", "container \"x\" does not exist", 1).kind(),
        Kind::NotFound
    );
    assert_eq!(
        classify("kill", "container not running", 1).kind(),
        Kind::NotFound
    );
    assert_eq!(
        classify("kill", "os: process already finished", 1).message(),
        "runc kill: process already finished"
    );
    let e = classify("create", "", 2);
    assert_eq!(
        (e.kind(), e.message()),
        (Kind::Internal, "runc create: exit status 2")
    );
}

#[test]
fn last_error_line_of_runc_log_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.json");
    std::fs::write(
            &log,
            "{\"level\":\"warning\",\"msg\":\"w\"}\n{\"level\":\"error\",\"msg\":\"first\"}\n{\"level\":\"error\",\"msg\":\"exec: \\\"nope\\\": not found\"}\n",
        )
        .unwrap();
    assert_eq!(
        last_log_error(&log).as_deref(),
        Some("exec: \"nope\": not found")
    );
    assert_eq!(last_log_error(&dir.path().join("missing")), None);
}

/// A stand-in runc: a script that records its arguments and plays the part asked for.
fn fake_runc(dir: &Path, body: &str) -> Runc {
    fake_runc_with(dir, body, Spawner::direct())
}

fn fake_runc_with(dir: &Path, body: &str, spawner: Spawner) -> Runc {
    let bin = dir.join("runc");
    std::fs::write(
        &bin,
        format!("#!/bin/sh\necho \"$@\" >> {}/args\n{body}\n", dir.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = RuncConfig {
        binary: bin.display().to_string(),
        root: dir.join("root"),
        ..RuncConfig::defaults("ns")
    };
    Runc::new(cfg, spawner, dir.join("s"))
}

/// Issue 14 item 3: `runc exec` with a terminal that fails before it sends the console
/// (e.g. into a paused container) fails at once with runc's own message: the exit that
/// the console wait saw is kept for the wait that follows (it used to wait for the
/// 120 s timeout, then SIGKILL a pid reaped two minutes earlier).
#[test]
fn a_runc_that_fails_before_sending_the_console_fails_at_once() {
    use crate::shim::reaper::{Exit, Reaper};
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let dir = tempfile::tempdir().unwrap();
    let (log, pid_file) = (
        dir.path().join("exec-x-log.json"),
        dir.path().join("runc.pid"),
    );
    let body = format!(
        "echo $$ > {}\necho '{{\"level\":\"error\",\"msg\":\"cannot exec in a paused container\"}}' > {}\nexit 1",
        pid_file.display(),
        log.display()
    );
    let reaper = Reaper::new_for_test();
    let runc = fake_runc_with(dir.path(), &body, Spawner::with_reaper(reaper.clone()));
    // The reaper thread's part, for this one pid only (other tests' children are theirs).
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok());
            if let Some(pid) = pid {
                match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(_, status)) => {
                        return reaper.inject(Exit {
                            pid,
                            status,
                            at: std::time::SystemTime::now(),
                        });
                    }
                    Ok(WaitStatus::StillAlive) => {}
                    _ => return,
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let bundle = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = runc.exec("c1", &bundle, "x", b"{}", true, ProcessIo::default());
        let _ = tx.send(r.map(|s| s.pid));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("runc exec -t still waits 5 s after runc failed");
    let e = r.unwrap_err();
    assert_eq!(
        e.message(),
        "runc exec x: cannot exec in a paused container",
        "{e}"
    );
}

/// Issue 20 item 2: a runc that connects to the console socket and then sends nothing
/// fails the exec at the deadline; the runc is killed and reaped, and the shim's end of
/// the connection is closed (the peer reads EOF).
#[test]
fn a_runc_that_connects_and_sends_no_console_fails_at_the_deadline() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let runc =
        fake_runc(dir.path(), crate::testutil::FAKE_RUNC_EXEC).with_timeout(Duration::from_secs(2));
    let bundle = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = runc.exec("c1", &bundle, "x", b"{}", true, ProcessIo::default());
        let _ = tx.send(r.map(|s| s.pid));
    });
    let (mut conn, pid) = crate::testutil::connect_as_runc(dir.path());
    // Generous: the point is that it returns, not how fast.
    let r = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("runc exec -t still waits for a console that never comes");
    let e = r.unwrap_err();
    assert!(
        e.message()
            .contains("timed out waiting for runc to send the console"),
        "{e}"
    );
    assert!(e.message().starts_with("exec x: "), "{e}");
    // Reaped: the pid is gone (a zombie would still answer kill(0)).
    assert_eq!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::Error::ESRCH),
        "the fake runc was killed and reaped"
    );
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(
        conn.read(&mut [0u8; 8]).unwrap(),
        0,
        "the shim closed its end"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("s")).unwrap().count(),
        0,
        "the console socket is removed"
    );
}

#[test]
fn create_passes_bundle_and_reads_pid_file() {
    let dir = tempfile::tempdir().unwrap();
    let runc = fake_runc(
        dir.path(),
        r#"while [ $# -gt 0 ]; do [ "$1" = --pid-file ] && echo 4242 > "$2"; shift; done"#,
    );
    let s = runc
        .create("c1", dir.path(), false, ProcessIo::default())
        .unwrap();
    assert_eq!(s.pid, 4242);
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert!(
        args.starts_with(&format!(
            "--root {}/root --log {}/log.json --log-format json create --pid-file",
            dir.path().display(),
            dir.path().display()
        )),
        "{args}"
    );
    assert!(
        args.trim_end()
            .ends_with(&format!("--bundle {} c1", dir.path().display())),
        "{args}"
    );
}

/// NoPivotRoot and NoNewKeyring reach `runc create` as flags before the container ID.
/// A record written before `no_pivot_root` and `no_new_keyring` existed still reads (a
/// `delete` by an upgraded binary cleans up after the old one).
#[test]
fn a_record_without_the_newer_fields_still_reads() {
    let old = r#"{"binary":"runc","root":"/run/containerd/runc/k8s.io","systemd_cgroup":true}"#;
    let cfg: RuncConfig = serde_json::from_str(old).unwrap();
    assert!(cfg.systemd_cgroup && !cfg.no_pivot_root && !cfg.no_new_keyring);
}

#[test]
fn create_passes_no_pivot_and_no_new_keyring() {
    let dir = tempfile::tempdir().unwrap();
    let mut runc = fake_runc(
        dir.path(),
        r#"while [ $# -gt 0 ]; do [ "$1" = --pid-file ] && echo 4242 > "$2"; shift; done"#,
    );
    runc.config.no_pivot_root = true;
    runc.config.no_new_keyring = true;
    runc.create("c1", dir.path(), false, ProcessIo::default())
        .unwrap();
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert!(
        args.contains(&format!(
            " --no-pivot --no-new-keyring --bundle {} c1",
            dir.path().display()
        )),
        "{args}"
    );
}

#[test]
fn failing_create_reports_runc_log_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.json");
    let runc = fake_runc(
        dir.path(),
        &format!(
            "echo '{{\"level\":\"error\",\"msg\":\"rootfs missing\"}}' > {}; exit 1",
            log.display()
        ),
    );
    let e = runc
        .create("c1", dir.path(), false, ProcessIo::default())
        .unwrap_err();
    assert_eq!(e.message(), "runc create: rootfs missing");
}

#[test]
fn ps_accepts_null_and_lists() {
    let dir = tempfile::tempdir().unwrap();
    let runc = fake_runc(dir.path(), "echo null");
    assert_eq!(runc.ps("c1").unwrap(), Vec::<i32>::new());
    let runc = fake_runc(dir.path(), "echo '[1,2]'");
    assert_eq!(runc.ps("c1").unwrap(), vec![1, 2]);
}

#[test]
fn kill_all_and_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let runc = fake_runc(dir.path(), "echo 'container does not exist' >&2; exit 1");
    let e = runc.kill("c9", 9, true).unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert!(args.trim_end().ends_with("kill --all c9 9"), "{args}");
}

#[test]
fn bare_binary_names_resolve_once_through_path() {
    assert_eq!(resolve_binary("/x/runc"), PathBuf::from("/x/runc"));
    let sh = resolve_binary("sh");
    assert!(sh.is_absolute(), "{}", sh.display());
    assert_eq!(resolve_binary("sh"), sh);
    assert_eq!(
        resolve_binary("no-such-binary-rsandbox"),
        PathBuf::from("no-such-binary-rsandbox")
    );
}
