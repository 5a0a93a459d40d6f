//! `ctr run --runtime io.containerd.rsandbox.v1` behaves as with runc.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rsandbox_integration::events::EventStream;
use rsandbox_integration::pty::{PtyChild, set_winsize};
use rsandbox_integration::*;

const NS: &str = "default";

/// `ctr run --runtime <ours> [flags] busybox <id> <cmd...>`
fn run_args<'a>(flags: &[&'a str], id: &'a str, cmd: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["run", "--runtime", RUNTIME];
    v.extend_from_slice(flags);
    v.push(BUSYBOX);
    v.push(id);
    v.extend_from_slice(cmd);
    v
}

/// Status column of `ctr task ls` for `id` ("" when absent).
fn task_status(id: &str) -> String {
    let o = ctr(NS, &["task", "ls"]);
    o.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("")
        .to_string()
}

fn task_pid(id: &str) -> Option<i32> {
    let o = ctr(NS, &["task", "ls"]);
    o.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
}

#[track_caller]
fn wait_status(id: &str, want: &str) {
    let mut last = String::new();
    let ok = poll(HANG, || {
        last = task_status(id);
        (last == want).then_some(())
    });
    assert!(ok.is_some(), "task {id}: status {last:?}, want {want}");
}

/// Starts `sleep 300` detached.
#[track_caller]
fn run_sleeper(id: &str, flags: &[&str]) {
    ctr(
        NS,
        &run_args(&[&["-d"], flags].concat(), id, &["sleep", "300"]),
    )
    .expect_ok("ctr run -d sleep");
    wait_status(id, "RUNNING");
}

#[test]
fn hello_stdout() {
    let g = Guard::new();
    let id = unique_id("hello");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    let o = ctr(NS, &run_args(&["--rm"], &id, &["echo", "hello"]));
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(o.stdout, "hello\n", "{o:?}");
    g.assert_clean(&[id]);
}

#[test]
fn exit_code_propagates() {
    let g = Guard::new();
    let id = unique_id("exit");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    let o = ctr(
        NS,
        &run_args(
            &["--rm"],
            &id,
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
        ),
    );
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_eq!(o.code, Some(3), "{o:?}");
    assert_eq!(o.stdout, "out\n", "{o:?}");
    assert!(o.stderr.contains("err\n"), "{o:?}");
    g.assert_clean(&[id]);
}

#[test]
fn stdin_reaches_the_container() {
    let g = Guard::new();
    let id = unique_id("stdin");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    // 200 KiB: more than a pipe buffer, then EOF must end `wc`.
    let mut input = Vec::new();
    for i in 0..20000 {
        input.extend_from_slice(format!("line {i:05}\n").as_bytes());
    }
    let o = ctr_input(
        NS,
        &run_args(&["--rm"], &id, &["sh", "-c", "cat | md5sum; echo done"]),
        &input,
    );
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_eq!(o.code, Some(0), "{o:?}");
    let want = md5_of(&input);
    assert_eq!(o.stdout, format!("{want}  -\ndone\n"), "{o:?}");
    g.assert_clean(&[id]);
}

fn md5_of(data: &[u8]) -> String {
    let mut c = Command::new("md5sum");
    c.stdin(Stdio::piped());
    let o = run_timeout(c, Some(data), HANG);
    o.stdout.split_whitespace().next().unwrap().to_string()
}

// --- tty --------------------------------------------------------------------------------------

#[test]
fn tty_and_resize() {
    let g = Guard::new();
    let id = unique_id("tty");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    // ctr sets the console size once the task has started, as with runc, and again on
    // SIGWINCH: the container prints its size at each line it reads, until a `q`.
    let script = r#"tty; while read x && [ "$x" != q ]; do stty size; done; echo bye"#;
    let mut p = PtyChild::spawn(
        NS,
        &run_args(&["--rm", "-t"], &id, &["sh", "-c", script]),
        30,
        100,
    );
    p.expect("/dev/pts/0", HANG);
    p.prompt_until("\r", "30 100", Duration::from_millis(300), HANG);
    // Resize our terminal, tell ctr (it resizes the container's console on SIGWINCH).
    set_winsize(&p.master, 42, 77);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    p.prompt_until("\r", "42 77", Duration::from_millis(300), HANG);
    p.write("q\r");
    p.expect("bye", HANG);
    let code = p.wait(HANG);
    let text = p.text();
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_eq!(code, Some(0), "ctr run -t: {text:?}");
    g.assert_clean(&[id]);
}

// --- exec -------------------------------------------------------------------------------------

#[test]
fn exec_plain_and_tty() {
    let g = Guard::new();
    let id = unique_id("exec");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    run_sleeper(&id, &[]);
    let o = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "e1",
            &id,
            "sh",
            "-c",
            "echo hi; exit 5",
        ],
    );
    assert_eq!(o.code, Some(5), "{o:?}");
    assert_eq!(o.stdout, "hi\n", "{o:?}");
    let o = ctr_input(
        NS,
        &["task", "exec", "--exec-id", "e2", &id, "cat"],
        b"piped\n",
    );
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "piped\n"), "{o:?}");
    // the exec runs in the container: it sees the container's pid 1 (sleep)
    let o = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "e3",
            &id,
            "cat",
            "/proc/1/cmdline",
        ],
    );
    assert_eq!(o.stdout, "sleep\x00300\x00", "{o:?}");

    let mut p = PtyChild::spawn(
        NS,
        &[
            "task",
            "exec",
            "-t",
            "--exec-id",
            "e4",
            &id,
            "sh",
            "-c",
            r#"tty; while read x && [ "$x" != q ]; do stty size; done; exit 7"#,
        ],
        25,
        90,
    );
    p.expect("/dev/pts/", HANG);
    // the size ctr sets once the exec has started: printed at each line, until a `q`
    p.prompt_until("\r", "25 90", Duration::from_millis(300), HANG);
    p.write("q\r");
    let code = p.wait(HANG);
    let text = p.text();
    assert!(text.contains("/dev/pts/"), "exec -t: {text:?}");
    assert_eq!(code, Some(7), "exec -t: {text:?}");

    ctr_force_remove(NS, std::slice::from_ref(&id));
    g.assert_clean(&[id]);
}

// --- signals ----------------------------------------------------------------------------------

#[test]
fn kill_with_signals() {
    let g = Guard::new();
    let id = unique_id("kill");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    // Foreground `ctr run` exits with the task's status.
    let mut cmd = ctr_cmd(NS, &run_args(&[], &id, &["sleep", "300"]));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    wait_status(&id, "RUNNING");

    // An exec'd sleep (not pid 1, so default SIGTERM action applies) killed by SIGTERM: 143.
    let mut exec = ctr_cmd(
        NS,
        &["task", "exec", "--exec-id", "s1", &id, "sleep", "300"],
    );
    exec.stdout(Stdio::piped()).stderr(Stdio::piped());
    let exec = exec.spawn().unwrap();
    let ok = poll(HANG, || {
        ctr(NS, &["task", "ps", &id])
            .stdout
            .lines()
            .count()
            .ge(&3)
            .then_some(())
    });
    assert!(ok.is_some(), "exec s1 did not start");
    ctr(
        NS,
        &["task", "kill", "-s", "SIGTERM", "--exec-id", "s1", &id],
    )
    .expect_ok("kill exec");
    let eo = wait_child(exec, HANG);
    assert_eq!(
        eo.as_ref().and_then(|o| o.code),
        Some(143),
        "exec SIGTERM: {eo:?}"
    );
    assert_eq!(task_status(&id), "RUNNING");

    // pid 1 without a handler: SIGKILL → 137, task STOPPED.
    ctr(NS, &["task", "kill", "-s", "SIGKILL", &id]).expect_ok("kill");
    let o = wait_child(child, HANG);
    assert_eq!(o.as_ref().and_then(|o| o.code), Some(137), "ctr run: {o:?}");

    // pid 1 with a handler: SIGTERM is delivered.
    let id2 = unique_id("kill2");
    let _cleanup2 = CtrObjects {
        ns: NS,
        ids: vec![id2.clone()],
    };
    run_detached_sh(
        &id2,
        "trap 'echo got; exit 42' TERM; while :; do sleep 1; done",
    );
    ctr(NS, &["task", "kill", "-s", "SIGTERM", &id2]).expect_ok("kill -s SIGTERM");
    wait_status(&id2, "STOPPED");

    ctr_force_remove(NS, &[id.clone(), id2.clone()]);
    g.assert_clean(&[id, id2]);
}

fn run_detached_sh(id: &str, script: &str) {
    ctr(NS, &run_args(&["-d"], id, &["sh", "-c", script])).expect_ok("ctr run -d sh");
    wait_status(id, "RUNNING");
}

fn wait_child(child: std::process::Child, timeout: Duration) -> Option<Out> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(o)) => Some(o.into()),
        _ => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            None
        }
    }
}

// --- pause, metrics, ps -----------------------------------------------------------------------

#[test]
fn pause_resume_metrics_ps() {
    let g = Guard::new();
    let id = unique_id("pause");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    run_detached_sh(
        &id,
        "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done",
    );
    let pid = task_pid(&id).expect("task pid");

    ctr(NS, &["task", "pause", &id]).expect_ok("pause");
    wait_status(&id, "PAUSED");
    // The container's cgroup is frozen: cgroup v1's freezer.state or v2's cgroup.freeze, one of
    // which must exist (a missing cgroup is a failure, not a skipped check).
    let v1 = format!("/sys/fs/cgroup/freezer/{NS}/{id}/freezer.state");
    let v2 = format!("/sys/fs/cgroup/{NS}/{id}/cgroup.freeze");
    match (std::fs::read_to_string(&v1), std::fs::read_to_string(&v2)) {
        (Ok(s), _) => assert_eq!(s.trim(), "FROZEN", "{v1}"),
        (_, Ok(s)) => assert_eq!(s.trim(), "1", "{v2}"),
        (Err(e1), Err(e2)) => panic!("no freezer state of {id}: {v1}: {e1}; {v2}: {e2}"),
    }
    let n1 = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/n")).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let n2 = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/n")).unwrap();
    assert_eq!(n1, n2, "the paused container kept running");

    ctr(NS, &["task", "resume", &id]).expect_ok("resume");
    wait_status(&id, "RUNNING");
    // it counts again (HANG: only a container that never runs again fails)
    let counting = poll(HANG, || {
        let n3 = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/n")).ok()?;
        (n3 != n2).then_some(())
    });
    assert!(counting.is_some(), "the resumed container does not run");

    let m = ctr(NS, &["task", "metrics", &id]);
    m.expect_ok("metrics");
    for key in ["memory", "cpu", "pids"] {
        assert!(m.stdout.contains(key), "metrics lack {key}: {}", m.stdout);
    }
    let m = ctr(NS, &["task", "metrics", "--format", "json", &id]);
    let v: serde_json::Value =
        serde_json::from_str(&m.stdout).unwrap_or_else(|e| panic!("metrics json: {e}: {m:?}"));
    let pids = &v["pids"]["current"];
    assert!(pids.as_u64().unwrap_or(0) >= 1, "pids.current: {v}");
    let mem = &v["memory"]["usage"]["usage"];
    assert!(mem.as_u64().unwrap_or(0) > 0, "memory usage: {v}");

    let ps = ctr(NS, &["task", "ps", &id]);
    ps.expect_ok("ps");
    assert!(
        ps.stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&pid.to_string())),
        "ps lacks pid {pid}: {}",
        ps.stdout
    );

    ctr_force_remove(NS, std::slice::from_ref(&id));
    g.assert_clean(&[id]);
}

// --- OOM --------------------------------------------------------------------------------------

#[test]
fn oom_kill_exit_137_and_event() {
    let g = Guard::new();
    let id = unique_id("oom");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    let mut events = EventStream::subscribe(NS).unwrap_or_else(|e| panic!("{e}"));
    let o = ctr(
        NS,
        &run_args(
            &["--rm", "--memory-limit", "20971520"],
            &id,
            &[
                "sh",
                "-c",
                "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived",
            ],
        ),
    );
    let oom = events.wait_until(
        |lines| {
            lines
                .iter()
                .any(|l| l.contains("/tasks/oom") && l.contains(&id))
        },
        HANG,
    );
    let seen = events.lines().to_vec();
    drop(events);
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_eq!(o.code, Some(137), "{o:?}");
    assert!(oom, "no /tasks/oom event for {id}: {seen:#?}");
    g.assert_clean(&[id]);
}

// --- many -------------------------------------------------------------------------------------

#[test]
fn twenty_in_parallel() {
    let g = Guard::new();
    let ids: Vec<String> = (0..20).map(|i| unique_id(&format!("par{i}"))).collect();
    let _cleanup = CtrObjects {
        ns: NS,
        ids: ids.clone(),
    };
    let handles: Vec<_> = ids
        .iter()
        .cloned()
        .map(|id| std::thread::spawn(move || ctr(NS, &run_args(&["-d"], &id, &["sleep", "300"]))))
        .collect();
    let outs: Vec<Out> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let failed: Vec<_> = outs.iter().filter(|o| !o.ok()).collect();
    let mut statuses = Vec::new();
    if failed.is_empty() {
        for id in &ids {
            let ok = poll(HANG, || (task_status(id) == "RUNNING").then_some(()));
            statuses.push((id.clone(), ok.is_some()));
        }
    }
    let shims = shim_procs().len();
    // kill + delete in parallel too
    let handles: Vec<_> = ids
        .iter()
        .cloned()
        .map(|id| std::thread::spawn(move || ctr_force_remove(NS, &[id])))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(failed.is_empty(), "ctr run -d failed: {failed:#?}");
    assert!(statuses.iter().all(|s| s.1), "not RUNNING: {statuses:?}");
    assert!(shims >= 20, "{shims} shim processes for 20 containers");
    g.assert_clean(&ids);
}

// --- bad inputs -------------------------------------------------------------------------------

#[test]
fn unknown_task_ids_fail() {
    let g = Guard::new();
    let id = unique_id("nope");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    for args in [
        vec!["task", "kill", id.as_str()],
        vec!["task", "pause", id.as_str()],
        vec!["task", "exec", "--exec-id", "x", id.as_str(), "true"],
        vec!["task", "metrics", id.as_str()],
    ] {
        let o = ctr(NS, &args);
        assert!(!o.ok(), "{args:?} succeeded: {o:?}");
        assert!(o.stderr.contains("not found"), "{args:?}: {o:?}");
    }
    g.assert_clean(&[id]);
}

#[test]
fn malformed_spec_is_rejected() {
    let g = Guard::new();
    let id = unique_id("badspec");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    let dir = scratch_dir(&id);
    let spec = ctr(NS, &["oci", "spec"]);
    spec.expect_ok("ctr oci spec");
    let mut v: serde_json::Value = serde_json::from_str(&spec.stdout).unwrap();
    // A relative cwd: the OCI spec requires an absolute path.
    v["process"]["args"] = serde_json::json!(["true"]);
    v["process"]["cwd"] = serde_json::json!("relative/dir");
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    // with --config, ctr takes the rootfs from the spec and wants only the ID
    v["root"] = serde_json::json!({"path": prefix().join("busybox")});
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = ctr(
        NS,
        &[
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            "--config",
            path.to_str().unwrap(),
            &id,
        ],
    );
    ctr_force_remove(NS, std::slice::from_ref(&id));
    assert_ne!(o.code, Some(0), "bad spec accepted: {o:?}");
    assert!(
        o.stderr
            .to_lowercase()
            .contains("cwd must be an absolute path"),
        "error does not name the cause: {o:?}"
    );
    g.assert_clean(&[id]);
}

#[test]
fn rootfs_that_is_not_a_directory_fails_cleanly() {
    let g = Guard::new();
    let id = unique_id("badroot");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    let dir = scratch_dir(&id);
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    for root in [file.clone(), dir.join("missing")] {
        let o = ctr(
            NS,
            &[
                "run",
                "--rm",
                "--runtime",
                RUNTIME,
                "--rootfs",
                root.to_str().unwrap(),
                &id,
                "true",
            ],
        );
        ctr_force_remove(NS, std::slice::from_ref(&id));
        assert_ne!(o.code, Some(0), "rootfs {root:?} accepted: {o:?}");
        assert!(
            o.stderr.contains("rootfs")
                || o.stderr.contains("not a directory")
                || o.stderr.contains("no such file"),
            "error does not name the cause: {o:?}"
        );
        g.assert_clean(std::slice::from_ref(&id));
    }
}

/// `ctr run --no-pivot` reaches runc (`runc create --no-pivot`, for a node whose root is the
/// initramfs) on both runtimes, and its absence leaves pivot_root on: read back from runc's
/// own record of the container (`config.no_pivot_root` of its state.json). ctr sends runc's
/// options to the runc shim and the v1 Linux `CreateOptions` to any other runtime. Where `/`
/// is the initramfs (the QEMU guest booted without `switch_root`: `RSANDBOX_GUEST_NO_SWITCH_ROOT=1
/// RSANDBOX_GUEST_EXE=<this test binary> hack/guest.sh no_pivot`), only `--no-pivot` can run:
/// without it `ctr run` must fail on both runtimes alike (runc's pivot_root).
#[test]
fn no_pivot_reaches_runc_on_both_runtimes() {
    let g = Guard::new();
    let initramfs = root_is_initramfs();
    eprintln!("/ is the initramfs: {initramfs}");
    let mut ids = Vec::new();
    for runtime in [RUNTIME, "io.containerd.runc.v2"] {
        for no_pivot in [true, false] {
            let id = unique_id(if no_pivot { "nopivot" } else { "pivot" });
            ids.push(id.clone());
            let _cleanup = CtrObjects {
                ns: NS,
                ids: vec![id.clone()],
            };
            let mut args = vec!["run", "-d", "--runtime", runtime];
            if no_pivot {
                args.push("--no-pivot");
            }
            args.extend([BUSYBOX, id.as_str(), "sleep", "300"]);
            let o = ctr(NS, &args);
            if initramfs && !no_pivot {
                ctr_force_remove(NS, std::slice::from_ref(&id));
                assert!(
                    !o.ok(),
                    "{runtime}: pivot_root worked on the initramfs: {o:?}"
                );
                assert!(o.stderr.contains("pivot"), "{runtime}: {o:?}");
                continue;
            }
            o.expect_ok("ctr run -d sleep");
            wait_status(&id, "RUNNING");
            let state = format!("/run/containerd/runc/{NS}/{id}/state.json");
            let read = std::fs::read_to_string(&state);
            ctr_force_remove(NS, std::slice::from_ref(&id));
            let state: serde_json::Value =
                serde_json::from_str(&read.unwrap_or_else(|e| panic!("{state}: {e}"))).unwrap();
            assert_eq!(
                state
                    .pointer("/config/no_pivot_root")
                    .and_then(|v| v.as_bool()),
                Some(no_pivot),
                "{runtime}, --no-pivot {no_pivot}: runc's config {}",
                state["config"]
            );
        }
    }
    g.assert_clean(&ids);
}

/// Whether this process's `/` is the initramfs (`rootfs`, which pivot_root cannot leave).
fn root_is_initramfs() -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .rfind(|l| l.split_whitespace().nth(4) == Some("/"))
        .and_then(|l| l.split_once(" - "))
        .and_then(|(_, post)| post.split_whitespace().next())
        == Some("rootfs")
}
