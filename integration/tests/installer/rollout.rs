//! The rollout a platform team paces (issue 34 item 5), on the node with the API stub:
//! - before the Node is labelled, a real pod sandbox and container ran through the handler
//!   (seen by this test's own CRI client while the installer runs) and were removed; the
//!   restart of containerd happened inside a restart slot (a Lease taken before containerd's
//!   new process started, given back after); an `Installed` Event on the Node;
//! - a slot held by another node makes the install wait without touching containerd, until
//!   that node's lease expires and is taken over;
//! - a containerd that does not come back healthy after the restart (a unit drop-in that makes
//!   its start fail while the rsandbox drop-in exists) is rolled back: the previous config,
//!   containerd up on it, exit status 4, a `RolledBack` Event; after `--max-rollbacks` the
//!   installer no longer restarts containerd (exit status 5, `RestartHeld`), and as the
//!   DaemonSet's container it stays instead of crash-looping.

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

const VERIFY_POD: &str = "rsandbox-node-verify";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/rsandbox-system/leases";

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The API stub's state files and the requests it logged after `from` lines; None without a stub.
struct Stub {
    state: String,
}

impl Stub {
    fn get() -> Option<Stub> {
        Some(Stub {
            state: std::env::var("RSANDBOX_INSTALLER_KUBE_STATE").ok()?,
        })
    }
    fn log(&self) -> Vec<String> {
        fs::read_to_string(format!("{}.log", self.state))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
    fn events(&self) -> Vec<serde_json::Value> {
        fs::read_to_string(format!("{}.events", self.state))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
    fn lease(&self, name: &str) -> Option<serde_json::Value> {
        let text = fs::read_to_string(format!("{}.leases", self.state)).ok()?;
        let all: serde_json::Value = serde_json::from_str(&text).ok()?;
        all.get(format!("rsandbox-system/{name}")).cloned()
    }
}

/// The time a stub log line was served (its `t=`).
fn line_time(l: &str) -> Option<f64> {
    l.rsplit(' ').next()?.strip_prefix("t=")?.parse().ok()
}

/// One request to the stub with the service account's token (curl's config on stdin, as the
/// installer sends it): the HTTP status.
fn stub_request(method: &str, path: &str, body: Option<&str>) -> R<u16> {
    let api = std::env::var("KUBE_API").map_err(|_| "no KUBE_API")?;
    let sa = std::env::var("SA_DIR").map_err(|_| "no SA_DIR")?;
    let token = fs::read_to_string(Path::new(&sa).join("token")).map_err(|e| e.to_string())?;
    let mut c = Command::new("curl");
    c.args([
        "--config",
        "-",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        method,
    ])
    .arg(format!("{api}{path}"))
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let mut child = c.spawn().map_err(|e| e.to_string())?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        writeln!(stdin, "header = \"Authorization: Bearer {}\"", token.trim())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| format!("curl answered {:?}", out))
}

/// When a process started (seconds since the epoch, to the clock tick): its start in ticks
/// since boot, placed on the wall clock through /proc/uptime read now (to 10 ms; /proc/stat's
/// btime is whole seconds, too coarse to order two events a few ms apart).
fn process_start(pid: u32) -> R<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let after = stat.rsplit_once(')').ok_or("no comm in stat")?.1;
    // field 22 (starttime) is the 20th after the comm
    let ticks: f64 = after
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .ok_or("no starttime")?;
    let uptime: f64 = fs::read_to_string("/proc/uptime")
        .map_err(|e| e.to_string())?
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or("no uptime")?;
    let booted = now_secs() - uptime;
    // USER_HZ is 100 on every Linux ABI this runs on
    Ok(booted + ticks / 100.0)
}

/// What the watcher saw of the installer's verification pod.
#[derive(Default, Debug)]
struct Seen {
    /// when a sandbox named rsandbox-node-verify on the rsandbox handler was first listed
    sandbox_at: Option<f64>,
    /// when a container of it was first listed running or exited
    container_at: Option<f64>,
    /// its container's states as listed
    states: Vec<i32>,
}

/// Polls CRI (this test's own client) until `stop`: the verification pod and its container.
fn watch_verify_pod(stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(ch) = containerd_client::connect(address()).await {
                let mut c = Runtime::new(ch);
                if let Ok(r) = c
                    .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                    .await
                {
                    for p in r.into_inner().items {
                        let name = p.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                        if name != VERIFY_POD || p.runtime_handler != HANDLER {
                            continue;
                        }
                        let t = now_secs();
                        seen.lock().unwrap().sandbox_at.get_or_insert(t);
                        let filter = cri::ContainerFilter {
                            pod_sandbox_id: p.id.clone(),
                            ..Default::default()
                        };
                        if let Ok(cs) = c
                            .list_containers(cri::ListContainersRequest {
                                filter: Some(filter),
                            })
                            .await
                        {
                            for ctr in cs.into_inner().containers {
                                let mut s = seen.lock().unwrap();
                                s.states.push(ctr.state);
                                if ctr.state == cri::ContainerState::ContainerRunning as i32
                                    || ctr.state == cri::ContainerState::ContainerExited as i32
                                {
                                    s.container_at.get_or_insert(t);
                                }
                            }
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    });
}

/// Pods named rsandbox-node-verify CRI still knows.
fn verify_pods_left() -> Vec<String> {
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let Ok(ch) = containerd_client::connect(address()).await else {
                return vec!["(CRI not answering)".to_string()];
            };
            let mut c = Runtime::new(ch);
            match c
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
            {
                Ok(r) => r
                    .into_inner()
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == VERIFY_POD))
                    .map(|p| p.id)
                    .collect(),
                Err(e) => vec![format!("(ListPodSandbox: {})", e.message())],
            }
        })
    })
    .join()
    .unwrap_or_default()
}

#[test]
fn a_pod_runs_through_the_handler_before_the_label_and_the_restart_is_paced() {
    let n = node_or_skip!();
    let Some(stub) = Stub::get() else {
        skip!(
            "installer-node",
            "no API stub (hack/installer/in-node.sh starts it): no label or lease to order"
        );
    };
    let r = (|| -> R {
        prepare(&n, Flavour::NoImports)?;
        let node = std::env::var("NODE_NAME").map_err(|_| "no NODE_NAME")?;
        let logged_before = stub.log().len();
        let events_before = stub.events().len();
        let pid0 = n.main_pid()?;

        // another node holds the only restart slot, freshly: the install waits for it and
        // leaves containerd alone
        let lease = |holder: &str, renew: &str| {
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "rsandbox-node-restart-0", "namespace": "rsandbox-system"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 600,
                         "acquireTime": renew, "renewTime": renew}
            })
        };
        let now = chrono_like_now();
        let code = if stub.lease("rsandbox-node-restart-0").is_some() {
            let mut l = stub.lease("rsandbox-node-restart-0").unwrap();
            l["spec"] = lease("other-node", &now)["spec"].clone();
            stub_request(
                "PUT",
                &format!("{LEASE_PATH}/rsandbox-node-restart-0"),
                Some(&l.to_string()),
            )?
        } else {
            stub_request(
                "POST",
                LEASE_PATH,
                Some(&lease("other-node", &now).to_string()),
            )?
        };
        ensure!(code == 200 || code == 201, "seeding the lease: HTTP {code}");

        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watcher = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || watch_verify_pod(stop, seen))
        };
        let installer = {
            let n2 = super::node()?;
            std::thread::spawn(move || install_new(&n2))
        };
        // it waits: the slot is taken, containerd is not restarted
        std::thread::sleep(Duration::from_secs(12));
        let waited = !installer.is_finished();
        let pid_while_waiting = n.main_pid()?;
        // the other node's lease expires (its holder gone): the installer takes it over
        let mut l = stub
            .lease("rsandbox-node-restart-0")
            .ok_or("the seeded lease is gone")?;
        l["spec"]["renewTime"] = "2020-01-01T00:00:00.000000Z".into();
        let code = stub_request(
            "PUT",
            &format!("{LEASE_PATH}/rsandbox-node-restart-0"),
            Some(&l.to_string()),
        )?;
        let installed = installer
            .join()
            .map_err(|_| "the installer thread panicked")?;
        stop.store(true, Ordering::Relaxed);
        let _ = watcher.join();
        ensure!(code == 200, "expiring the seeded lease: HTTP {code}");
        installed?;
        ensure!(
            waited,
            "the install did not wait for the restart slot another node held"
        );
        ensure!(
            pid_while_waiting == pid0,
            "containerd was restarted while another node held the only restart slot"
        );
        let pid1 = n.main_pid()?;
        ensure!(pid1 != pid0, "the install did not restart containerd");
        check_labels(&n, Some(&n.new_bin), "after the install")?;

        // the order the API stub saw: the slot taken, containerd's new process, the pod, the
        // label, the slot given back
        let log: Vec<String> = stub.log().into_iter().skip(logged_before).collect();
        let taken = log
            .iter()
            .find(|l| {
                l.starts_with(&format!("PUT {LEASE_PATH}/rsandbox-node-restart-0 "))
                    && l.contains(&format!("\"holderIdentity\":\"{node}\""))
            })
            .and_then(|l| line_time(l))
            .ok_or_else(|| format!("the installer never took the slot: {log:#?}"))?;
        let labelled = log
            .iter()
            .find(|l| {
                l.starts_with(&format!("PATCH /api/v1/nodes/{node} "))
                    && l.contains("\"rsandbox.io/installed\":\"true\"")
            })
            .and_then(|l| line_time(l))
            .ok_or_else(|| format!("the Node was not labelled: {log:#?}"))?;
        let given_back = log
            .iter()
            .rfind(|l| l.starts_with(&format!("PUT {LEASE_PATH}/rsandbox-node-restart-0 ")))
            .ok_or("no update of the slot")?;
        ensure!(
            !given_back.contains("holderIdentity"),
            "the slot was not given back last: {given_back}"
        );
        let started = process_start(pid1)?;
        let s = seen.lock().unwrap();
        eprintln!(
            "slot taken {taken:.2}, containerd started {started:.2}, pod seen {:?}, container seen {:?} (states {:?}), labelled {labelled:.2}",
            s.sandbox_at, s.container_at, s.states
        );
        // (to the clock tick and /proc/uptime's 10 ms)
        ensure!(
            taken <= started + 0.03,
            "containerd's new process ({started:.2}) started before the slot was taken ({taken:.2})"
        );
        let pod_at = s
            .sandbox_at
            .ok_or("no pod sandbox rsandbox-node-verify on the rsandbox handler was ever listed")?;
        let ctr_at = s
            .container_at
            .ok_or("the verification pod's container was never listed running or exited")?;
        ensure!(
            pod_at < labelled && ctr_at < labelled,
            "the verification pod ({pod_at:.2}) or container ({ctr_at:.2}) came after the label ({labelled:.2})"
        );
        drop(s);
        let left = verify_pods_left();
        ensure!(left.is_empty(), "the verification pod was left: {left:?}");

        let events: Vec<_> = stub.events().into_iter().skip(events_before).collect();
        ensure!(
            events.iter().any(|e| e["reason"] == "Installed"
                && e["involvedObject"]["kind"] == "Node"
                && e["involvedObject"]["name"] == node.as_str()
                && e["metadata"]["namespace"] == "default"),
            "no Installed Event on Node {node}: {events:?}"
        );
        let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
        ensure!(r.code == Some(0), "uninstall failed:\n{}", r.log);
        Ok(())
    })();
    restore(&n);
    r.unwrap();
}

/// RFC 3339 with microseconds (a Lease's MicroTime), now, from `date` (no time crate here).
fn chrono_like_now() -> String {
    let out = run_timeout(
        {
            let mut c = Command::new("date");
            c.args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"]);
            c
        },
        None,
        HANG,
    );
    out.stdout.trim().to_string()
}

const BREAK_UNIT: &str = "/run/systemd/system/containerd.service.d/zz-rsandbox-rollout-test.conf";

/// A containerd.service drop-in that makes the unit's start fail while `dropin` exists (the
/// config containerd would load is fine: only the start fails, as after a bad upgrade).
fn break_containerd_with(n: &Node, dropin: &Path) -> R {
    let p = Path::new(BREAK_UNIT);
    fs::create_dir_all(p.parent().unwrap()).map_err(|e| e.to_string())?;
    fs::write(
        p,
        format!(
            "[Service]\nExecStartPre=/bin/sh -c '! test -e {}'\n",
            dropin.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let out = n.systemctl(&["daemon-reload"]);
    ensure!(out.ok(), "daemon-reload: {out:?}");
    Ok(())
}

fn unbreak_containerd(n: &Node) {
    let _ = fs::remove_file(BREAK_UNIT);
    let _ = n.systemctl(&["daemon-reload"]);
}

#[test]
fn a_containerd_that_does_not_come_back_is_rolled_back_and_not_restarted_in_a_loop() {
    let n = node_or_skip!();
    if !Path::new("/run/systemd/system").is_dir() {
        skip!(
            "installer-daemonset",
            "systemd is not PID 1 here: a unit drop-in cannot break containerd's start"
        );
    }
    let stub = Stub::get();
    // a fresh install: no drop-in of an earlier run (the rollback would restore it, and the
    // broken unit would not start with it)
    let _ = fs::remove_file(n.dropin());
    let r = (|| -> R {
        let before = prepare(&n, Flavour::NoImports)?;
        let _ = fs::remove_file(n.state_dir.join("rollbacks"));
        let events_before = stub.as_ref().map(|s| s.events().len()).unwrap_or(0);
        break_containerd_with(&n, &n.dropin())?;
        let no_check: &[&str] = if has_check(&n.new_bin) {
            &[]
        } else {
            &["--no-check"]
        };
        let mut args = vec!["--wait=15"];
        args.extend_from_slice(no_check);

        // two attempts (--max-rollbacks 2): each rolled back, containerd up on the old config
        for attempt in 1..=2 {
            let pid0 = n.main_pid()?;
            let r = n.install(&n.new_bin, &args);
            ensure!(
                r.code == Some(4),
                "attempt {attempt}: the install exited {:?}, not 4 (rolled back):\n{}",
                r.code,
                r.log
            );
            let pid = n.main_pid()?;
            ensure!(
                pid != pid0,
                "attempt {attempt}: containerd was not restarted"
            );
            let hs = n.wait_handlers(|h| !h.is_empty())?;
            ensure!(
                !hs.iter().any(|h| h == HANDLER),
                "attempt {attempt}: containerd serves {HANDLER} after the rollback: {hs:?}"
            );
            ensure!(
                fs::read(&n.config).ok().as_deref() == Some(&before[..]),
                "attempt {attempt}: config.toml is not as before"
            );
            ensure!(
                !n.dropin().exists(),
                "attempt {attempt}: the drop-in is still there"
            );
            let count = fs::read_to_string(n.state_dir.join("rollbacks")).unwrap_or_default();
            ensure!(
                count.split_whitespace().nth(1) == Some(&attempt.to_string()),
                "attempt {attempt}: the rollbacks counted: {count:?}"
            );
            check_labels(&n, None, &format!("after rollback {attempt}"))?;
        }

        // the bound reached: containerd is not restarted again, as a hand-run ...
        let pid0 = n.main_pid()?;
        let r = n.install(&n.new_bin, &args);
        ensure!(
            r.code == Some(5),
            "after 2 rollbacks the install exited {:?}, not 5 (held):\n{}",
            r.code,
            r.log
        );
        ensure!(
            n.main_pid()? == pid0,
            "the held install restarted containerd"
        );

        // ... nor as the DaemonSet's container, which stays (not Ready) instead of exiting
        let ready = n.scratch.join("held-ready");
        let _ = fs::remove_file(&ready);
        let mut c = Command::new("bash");
        c.arg(&n.script)
            .args(["run", "install", "--binary"])
            .arg(&n.new_bin)
            .args(&args)
            .env("READY_FILE", &ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let mut pod = c.spawn().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_secs(10));
        let still = matches!(pod.try_wait(), Ok(None));
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", pod.id())])
            .status();
        let _ = pod.wait();
        ensure!(
            still,
            "the DaemonSet's container exited when held (a crash loop)"
        );
        ensure!(
            !ready.exists(),
            "the held DaemonSet's container became Ready"
        );
        ensure!(
            n.main_pid()? == pid0,
            "the held DaemonSet's container restarted containerd"
        );

        if let Some(stub) = &stub {
            let events: Vec<_> = stub.events().into_iter().skip(events_before).collect();
            let reasons: Vec<_> = events.iter().map(|e| e["reason"].clone()).collect();
            ensure!(
                events
                    .iter()
                    .filter(|e| e["reason"] == "RolledBack" && e["type"] == "Warning")
                    .count()
                    == 2
                    && events.iter().any(|e| e["reason"] == "RestartHeld"),
                "the Node's Events are not 2 RolledBack and a RestartHeld: {reasons:?}"
            );
        }

        // fixed (the unit drop-in gone) and the count removed: the install goes through
        unbreak_containerd(&n);
        let _ = fs::remove_file(n.state_dir.join("rollbacks"));
        let events_before = stub.as_ref().map(|s| s.events().len()).unwrap_or(0);
        install_new(&n)?;
        ensure!(
            !n.state_dir.join("rollbacks").exists(),
            "a good install left the rollback count"
        );
        if let Some(stub) = &stub {
            // never served before: an install, however many attempts were rolled back
            let events: Vec<_> = stub.events().into_iter().skip(events_before).collect();
            ensure!(
                events.iter().any(|e| e["reason"] == "Installed"),
                "the first good install posted no Installed Event: {events:?}"
            );
        }
        let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
        ensure!(r.code == Some(0), "uninstall failed:\n{}", r.log);
        Ok(())
    })();
    unbreak_containerd(&n);
    let _ = fs::remove_file(n.state_dir.join("rollbacks"));
    if r.is_err() {
        // what a failed run may have left: the drop-in (the node's config is restored below)
        let _ = fs::remove_file(n.dropin());
    }
    restore(&n);
    r.unwrap();
}
