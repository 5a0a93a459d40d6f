//! Against the live systemd of the machine (ignored: `hack/guest.sh --systemd` and the node run
//! them, the `live_systemd` filter).

use super::*;

/// CPU time (user + system, clock ticks) PID 1 has used, from `/proc/1/stat`.
fn pid1_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/1/stat").ok()?;
    // after the command's closing parenthesis: state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Waits (at most two minutes) until PID 1 has been idle for a second: under TCG, systemd
/// takes tens of seconds to work through the mount and cgroup events the integration tests
/// just caused (it was seen running, State R, through a 30 s unanswered StopUnit), and this
/// test measures the calls, not that backlog.
fn wait_for_idle_pid1() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = pid1_cpu_ticks();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        let now = pid1_cpu_ticks();
        if let (Some(a), Some(b)) = (last, now)
            && b.saturating_sub(a) <= 2
        {
            return;
        }
        last = now;
    }
    eprintln!("PID 1 still busy after 2 minutes: measuring anyway");
}

/// How long the live test lets one start or stop take before it calls it a hang.
const LIVE_HANG: Duration = Duration::from_secs(180);

/// How many rounds each way goes through (`RSANDBOX_LIVE_ROUNDS`, default 5).
fn live_rounds() -> usize {
    std::env::var("RSANDBOX_LIVE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// Whether the real systemd is here to test against (root, its private socket).
fn live_systemd_here() -> bool {
    let here = std::path::Path::new(crate::host::systemd::manager::PRIVATE_SOCKET).exists()
        && nix::unistd::getuid().is_root();
    if !here {
        // `cargo test -- --include-ignored` runs it on hosts without systemd too; the systemd
        // node and guest expect the gate (a misfire there fails the test).
        crate::testutil::skip(
            "live-systemd",
            "systemd's private socket is not here (or not root)",
        );
    }
    here
}

/// The two ways in to the real systemd, by name: the system bus (what the shim uses first, as
/// runc does), then the private socket alone.
fn live_ways() -> [(&'static str, Endpoints); 2] {
    [
        ("system bus", Endpoints::default()),
        (
            "private socket",
            Endpoints {
                system_bus: Ok(vec!["/nonexistent/system-bus".into()]),
                ..Endpoints::default()
            },
        ),
    ]
}

/// Against the real systemd (root, systemd as PID 1: the systemd guest): a process put in a
/// transient scope of system.slice through each way in (the system bus, then the private
/// socket alone) is in that scope's cgroup; after the stop the process is gone and so is the
/// scope's cgroup. Every round of each way must go through: a start or stop that gets no
/// answer fails the test (after asking `systemctl` for the same stop, and printing what it
/// got and what PID 1 was doing, for the diagnosis). Prints how long start and stop took (the
/// median of the rounds), once PID 1 is idle. Issue 27 item 10: the private socket's "lost"
/// StopUnit replies were our client's (`BEGIN` sent right before the first call, which sd-bus
/// then parked, see conn.rs), and rounds that lost them were not counted: the test passed
/// while that way never worked.
#[test]
#[ignore = "needs root and systemd as PID 1"]
fn live_systemd_scope_start_and_stop() {
    use std::path::Path;
    if !live_systemd_here() {
        return;
    }
    let unified = crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
    let rounds = live_rounds();
    for (way, endpoints) in live_ways() {
        wait_for_idle_pid1();
        let (mut starts, mut stops) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut child = std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap();
            let pid = child.id();
            let scope = PodScope {
                unit: format!("rsandbox-live-{pid}-{round}.scope"),
                slice: "system.slice".into(),
            };
            // Bounded at LIVE_HANG, not the shim's 30 s: this checks the client against the
            // real systemd and measures it; a PID 1 that stalls for tens of seconds under TCG
            // shows in the printed maximum.
            let t = Instant::now();
            let started = scope::start_within(&endpoints, &scope, "live", pid, unified, LIVE_HANG);
            starts.push(t.elapsed());
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let t = Instant::now();
            let stopped = scope::stop_within(&endpoints, &scope.unit, LIVE_HANG);
            stops.push(t.elapsed());
            if let Err(e) = &stopped {
                diagnose(way, round, &scope.unit, e);
            }
            let _ = child.kill();
            let status = child.wait().unwrap();
            if let Err(e) = &started {
                panic!("{way} round {round}: {e}");
            }
            if let Err(e) = &stopped {
                panic!("{way} round {round}: {e}");
            }
            assert!(
                cgroup.contains(&format!("/system.slice/{}", scope.unit)),
                "{way}: {cgroup}"
            );
            // StopUnit's SIGTERM ended it (kill above came too late to matter).
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGTERM), "{way}");
            if unified {
                let dir = Path::new("/sys/fs/cgroup/system.slice").join(&scope.unit);
                assert!(!dir.exists(), "{way}: {} is left", dir.display());
            }
        }
        starts.sort();
        stops.sort();
        eprintln!(
            "live systemd via {way}: {rounds} rounds, StartTransientUnit + job {:?} (median, max {:?}), StopUnit + job {:?} (median, max {:?})",
            starts[starts.len() / 2],
            starts.last().unwrap(),
            stops[stops.len() / 2],
            stops.last().unwrap()
        );
    }
}

/// What the live test prints when a stop fails: PID 1's state, and what `systemctl stop` of
/// the same unit gets (systemd's own client, on its private socket as root).
fn diagnose(way: &str, round: usize, unit: &str, e: &SystemdError) {
    eprintln!(
        "{way} round {round}: {e}; PID 1 CPU ticks {:?}",
        pid1_cpu_ticks()
    );
    for f in ["status", "wchan", "stack"] {
        let got = std::fs::read_to_string(format!("/proc/1/{f}"));
        eprintln!("/proc/1/{f}: {got:?}");
    }
    if e.unanswered() {
        let t = Instant::now();
        let ctl = std::process::Command::new("timeout")
            .args(["120", "systemctl", "stop", unit])
            .status();
        eprintln!(
            "{way} round {round}: systemctl stop {unit}: {ctl:?} after {:?}",
            t.elapsed()
        );
    }
}

/// Issue 27 item 6, against the real systemd: `systemctl daemon-reexec` while a job of ours
/// runs, through each way in. On the system bus systemd leaves the bus and comes back under a
/// new unique name: the job's end comes from that name and must be taken (before, the wait ran
/// to its deadline). On the private socket the re-exec closes the connection: the client
/// connects again and waits for the job there (before, the start failed at once). A scope's
/// start job ends at once, so the job here is a transient oneshot service's (`sleep 20`: a
/// re-exec takes seconds under TCG), the re-exec asked for 3 s into it (once the start call is
/// answered: a call in flight at the re-exec is answered NoReply by the bus daemon); the wait
/// is the same code.
#[test]
#[ignore = "needs root and systemd as PID 1"]
fn live_systemd_job_end_after_daemon_reexec() {
    if !live_systemd_here() {
        return;
    }
    for (way, endpoints) in live_ways() {
        wait_for_idle_pid1();
        let deadline = Instant::now() + LIVE_HANG;
        let mut m = Manager::connect(&endpoints, deadline).unwrap();
        let before = m.systemd_name().map(String::from);
        assert_eq!(before.is_some(), way == "system bus", "{way}");
        let unit = format!(
            "rsandbox-live-reexec-{}-{}.service",
            std::process::id(),
            before.is_some()
        );
        let exec = Value::Array(
            "(sasb)".into(),
            vec![Value::Struct(vec![
                Value::Str("/bin/sleep".into()),
                Value::strings(&["sleep", "20"]),
                Value::Bool(false),
            ])],
        );
        let reexec = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_secs(3));
            let t = Instant::now();
            let s = std::process::Command::new("systemctl")
                .arg("daemon-reexec")
                .status();
            (s, t.elapsed())
        });
        let t = Instant::now();
        let r = m.start_transient_unit(
            &unit,
            vec![
                ("Type".into(), Value::Str("oneshot".into())),
                ("ExecStart".into(), exec),
            ],
            deadline,
        );
        let took = t.elapsed();
        let (reexec_status, reexec_took) = reexec.join().unwrap();
        let after = m.systemd_name().map(String::from);
        eprintln!(
            "live daemon-reexec via {way}: systemctl daemon-reexec {reexec_status:?} after \
             {reexec_took:?}; systemd on the bus {before:?} -> {after:?}; the start job's end \
             after {took:?}: {r:?}"
        );
        let _ = scope::stop_within(&endpoints, &unit, LIVE_HANG);
        assert!(reexec_status.unwrap().success(), "{way}");
        if way == "system bus" {
            assert_ne!(
                before, after,
                "systemd kept its unique name: no re-exec seen"
            );
        }
        r.unwrap();
    }
}
