//! A shim that cannot be wedged (issue 10): failed execs leave nothing blocked, a thousand
//! parked Waits hold no threads and all wake, and hostile IDs get InvalidArgument instead of
//! killing the shim.
//!
//! Each test prints its measurements (`--nocapture` shows them).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use containerd_client::services::v1::WaitRequest;
use containerd_client::services::v1::tasks_client::TasksClient;
use rsandbox_integration::pods::SleepingPod;
use rsandbox_integration::shim::{Answer, ShimClient, sandbox_api, task_api};
use rsandbox_integration::tasks::{
    TaskApi, channel, in_ns, shim_address, thread_count, thread_names,
};
use rsandbox_integration::*;
use ttrpc::Code;

type R = Result<(), String>;

/// The bound on a pod shim's threads, however many calls came before.
const MAX_SHIM_THREADS: usize = 32;

/// Runs `body` against a fresh pod with one sleeping container, then removes the pod (if the
/// body did not) and checks that nothing is left.
async fn with_sleeping_pod<F>(name: &str, body: F)
where
    F: AsyncFnOnce(&mut SleepingPod) -> R,
{
    let g = Guard::new();
    let name = unique_id(name);
    let dir = scratch_dir(&name);
    let mut pod = SleepingPod::start(&name, &dir)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", log_lines(&name, 20)));
    let res = body(&mut pod).await;
    let cleanup = pod.remove_or_kill().await;
    expect_ok(&pod.id, res);
    cleanup.unwrap_or_else(|e| panic!("clean-up: {e}"));
    let mut ids = pod.ids();
    ids.push(name);
    g.assert_clean(&ids);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 10: before the fix every failed exec left a Wait blocked on a worker thread forever;
/// after about 256 the pool was full and every call for the pod (exec, stop, remove) hung.
#[tokio::test]
async fn three_hundred_failed_execs_leave_the_pod_working() {
    with_sleeping_pod("failed-execs", async |pod: &mut SleepingPod| {
        let shim = pod.shim_pid().ok_or("no single shim daemon for the pod")?;
        let threads_before = thread_count(shim);
        let start = Instant::now();
        let mut slowest = Duration::ZERO;
        let mut max_threads = threads_before;
        let mut first_error = String::new();
        for i in 0..300 {
            let t = Instant::now();
            let r = tokio::time::timeout(HANG, pod.exec(&["/nope"], 10)).await;
            let took = t.elapsed();
            match r {
                Err(_) => {
                    return Err(format!(
                        "exec #{i} of /nope did not answer within {HANG:?} ({} shim threads)",
                        thread_count(shim)
                    ));
                }
                Ok(Ok(resp)) => {
                    return Err(format!(
                        "exec #{i} of /nope did not fail: exit {}, stderr {:?}",
                        resp.exit_code,
                        String::from_utf8_lossy(&resp.stderr)
                    ));
                }
                Ok(Err(s)) if i == 0 => first_error = s.message().to_string(),
                Ok(Err(_)) => {}
            }
            slowest = slowest.max(took);
            if i % 10 == 0 {
                max_threads = max_threads.max(thread_count(shim));
            }
        }
        let total = start.elapsed();
        let threads_after = thread_count(shim);
        eprintln!(
            "300 failed execs: {total:?} in all, {:?} each on average, slowest {slowest:?}; \
             shim threads {threads_before} before, at most {max_threads} during, \
             {threads_after} after; first error: {first_error}",
            total / 300
        );
        ensure!(
            threads_after <= MAX_SHIM_THREADS,
            "the shim holds {threads_after} threads after 300 failed execs (limit {MAX_SHIM_THREADS})"
        );

        // The pod still answers.
        let t = Instant::now();
        let r = tokio::time::timeout(HANG, pod.exec(&["echo", "ok"], 10))
            .await
            .map_err(|_| format!("exec of echo did not answer within {HANG:?}"))?
            .map_err(|s| format!("exec of echo: {}", s.message()))?;
        let exec_took = t.elapsed();
        ensure!(
            r.exit_code == 0 && r.stdout == b"ok\n",
            "echo ok: exit {}, stdout {:?}, stderr {:?}",
            r.exit_code,
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        let stop_took = pod.stop_within(HANG).await?;
        let remove_took = pod.remove_within(HANG).await?;
        eprintln!("then: exec {exec_took:?}, stop {stop_took:?}, remove {remove_took:?}");
        Ok(())
    })
    .await;
}

const NS: &str = "default";

/// Issue 10: a thousand concurrent Waits on one task through containerd, then a Kill. Before
/// the fix each Wait held a worker thread (at most 256), so the Kill queued behind them and
/// nothing ever returned.
#[tokio::test]
async fn a_thousand_waits_then_a_kill_all_return() {
    const WAITS: usize = 1000;
    const CHANNELS: usize = 10;
    let g = Guard::new();
    let id = unique_id("thousand-waits");
    let _cleanup = CtrObjects {
        ns: NS,
        ids: vec![id.clone()],
    };
    ctr(
        NS,
        &[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            BUSYBOX,
            &id,
            "sleep",
            "300",
        ],
    )
    .expect_ok("ctr run -d sleep");
    let shim = match shim_daemons_for(&id).as_slice() {
        [one] => one.pid,
        other => panic!("shim daemons for {id}: {other:?}"),
    };
    let threads_before = thread_count(shim);

    let mut clients = Vec::new();
    for _ in 0..CHANNELS {
        clients.push(TasksClient::new(channel().await));
    }
    let returned = Arc::new(AtomicUsize::new(0));
    let mut waits = Vec::new();
    for i in 0..WAITS {
        let mut c = clients[i % CHANNELS].clone();
        let (id, returned) = (id.clone(), returned.clone());
        waits.push(tokio::spawn(async move {
            let r = c
                .wait(in_ns(
                    NS,
                    WaitRequest {
                        container_id: id,
                        exec_id: String::new(),
                    },
                ))
                .await;
            returned.fetch_add(1, Ordering::Relaxed);
            (r.map(|r| r.into_inner().exit_status), Instant::now())
        }));
    }

    // While they are parked: the shim's threads, and a State call through containerd.
    let mut max_threads = 0;
    let mut busiest = Default::default();
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_secs(3) {
        let names = thread_names(shim);
        let n = names.values().sum();
        if n > max_threads {
            (max_threads, busiest) = (n, names);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let early = returned.load(Ordering::Relaxed);
    let mut api = TaskApi::connect(NS).await;
    let t = Instant::now();
    let state = tokio::time::timeout(HANG, api.get(&id, "")).await;
    let state_took = t.elapsed();

    let killed_at = Instant::now();
    let kill = tokio::time::timeout(HANG, api.kill(&id, "", 9)).await;
    let deadline = killed_at + 2 * HANG;
    let mut statuses = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    let mut last = killed_at;
    let mut missing = 0;
    for w in waits {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, w).await {
            Ok(Ok((Ok(status), at))) => {
                *statuses.entry(status).or_insert(0usize) += 1;
                last = last.max(at);
            }
            Ok(Ok((Err(s), _))) => errors.push(format!("{:?}: {}", s.code(), s.message())),
            Ok(Err(join)) => errors.push(format!("join: {join}")),
            Err(_) => missing += 1,
        }
    }
    eprintln!(
        "{WAITS} Waits: shim threads {threads_before} before, at most {max_threads} while \
         parked ({busiest:?}); State while parked took {state_took:?}; all returned {:?} \
         after the Kill; statuses {statuses:?}",
        last - killed_at
    );
    // A wedged shim would hang the clean-up (ctr kill, delete): kill the shim first, so that
    // the bench is clean for the next test; containerd cleans up after a dead shim.
    let kill_shim = || {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(shim),
            nix::sys::signal::Signal::SIGKILL,
        );
    };
    let wedged = !matches!(kill, Ok(Ok(()))) || missing > 0;
    if wedged {
        kill_shim();
    }
    ctr_force_remove(NS, std::slice::from_ref(&id));
    if poll(Duration::from_secs(5), || {
        (thread_count(shim) == 0).then_some(())
    })
    .is_none()
    {
        kill_shim();
        ctr_force_remove(NS, std::slice::from_ref(&id));
    }

    assert_eq!(early, 0, "Waits returned before the Kill");
    let state = state
        .unwrap_or_else(|_| {
            panic!("State (Tasks.Get) did not answer within {HANG:?} while the Waits were parked")
        })
        .expect("Tasks.Get");
    assert!(state.pid != 0, "{state:?}");
    kill.unwrap_or_else(|_| panic!("Kill did not answer within {HANG:?}"))
        .expect("Kill");
    assert_eq!(
        missing,
        0,
        "{missing} of {WAITS} Waits had not returned {:?} after the Kill",
        2 * HANG
    );
    assert!(errors.is_empty(), "Waits failed: {errors:?}");
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        vec![(137, WAITS)],
        "every Wait must report SIGKILL's status"
    );
    assert!(
        max_threads <= MAX_SHIM_THREADS,
        "the shim held {max_threads} threads with {WAITS} Waits parked: {busiest:?}"
    );
    g.assert_clean(&[id]);
}

/// IDs of every length from 1 to 300 bytes: all `a`, and with `ä`, `€` or `😀` at byte 0,
/// around byte 16 (where the old message sliced) and at the end.
fn hostile_ids() -> Vec<String> {
    let mut ids = Vec::new();
    for len in 1..=300usize {
        ids.push("a".repeat(len));
        for c in ['ä', '€', '😀'] {
            let n = c.len_utf8();
            if n > len {
                continue;
            }
            let mut offsets = vec![0, 15, 16, 17, len - n];
            offsets.retain(|&o| o + n <= len);
            offsets.sort_unstable();
            offsets.dedup();
            for o in offsets {
                let id = format!("{}{c}{}", "a".repeat(o), "a".repeat(len - o - n));
                debug_assert_eq!(id.len(), len);
                ids.push(id);
            }
        }
    }
    ids
}

/// What the shim accepts as an ID (its `validate::id` for these inputs): ASCII letters, at
/// most 128 bytes.
fn acceptable(id: &str) -> bool {
    id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Sends each hostile ID to the shim at `address` in every place an ID goes. Returns the number
/// of calls made, or what went wrong (stopping at once if the shim stops answering).
fn send_hostile_ids(address: &str, container: &str) -> Result<usize, String> {
    let c = ShimClient::connect(address)?;
    let ctx = ShimClient::ctx;
    let mut calls = 0;
    let mut wrong = Vec::new();
    for id in hostile_ids() {
        let want = if acceptable(&id) {
            Code::NOT_FOUND
        } else {
            Code::INVALID_ARGUMENT
        };
        let answers = [
            (
                "Task.State",
                want,
                Answer::of(c.task.state(
                    ctx(),
                    &task_api::StateRequest {
                        id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            (
                "Task.State (exec id)",
                want,
                Answer::of(c.task.state(
                    ctx(),
                    &task_api::StateRequest {
                        id: container.into(),
                        exec_id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            (
                "Task.Wait",
                want,
                Answer::of(c.task.wait(
                    ctx(),
                    &task_api::WaitRequest {
                        id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            (
                "Task.Wait (exec id)",
                want,
                Answer::of(c.task.wait(
                    ctx(),
                    &task_api::WaitRequest {
                        id: container.into(),
                        exec_id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            // No bundle: refused before anything is made, whatever the ID.
            (
                "Task.Create",
                Code::INVALID_ARGUMENT,
                Answer::of(c.task.create(
                    ctx(),
                    &task_api::CreateTaskRequest {
                        id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            (
                "Sandbox.SandboxStatus",
                want,
                Answer::of(c.sandbox.sandbox_status(
                    ctx(),
                    &sandbox_api::SandboxStatusRequest {
                        sandbox_id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
            (
                "Sandbox.WaitSandbox",
                want,
                Answer::of(c.sandbox.wait_sandbox(
                    ctx(),
                    &sandbox_api::WaitSandboxRequest {
                        sandbox_id: id.clone(),
                        ..Default::default()
                    },
                )),
            ),
        ];
        for (what, want, answer) in answers {
            calls += 1;
            if let Answer::Transport(e) = &answer {
                return Err(format!(
                    "{what} with the {}-byte ID {id:?}: no answer ({e}); after {calls} calls",
                    id.len()
                ));
            }
            if answer.code() != Some(want) && wrong.len() < 10 {
                wrong.push(format!("{what} {id:?}: {answer:?}, want {want:?}"));
            }
        }
    }
    if wrong.is_empty() {
        Ok(calls)
    } else {
        Err(format!("wrong answers:\n{}", wrong.join("\n")))
    }
}

/// Issue 10: an ID longer than 128 bytes with a multi-byte character at byte 16 aborted the
/// shim (`&id[..16]`, `panic = "abort"`). containerd validates IDs itself, so this talks to the
/// pod's shim directly.
#[tokio::test]
async fn hostile_ids_get_invalid_argument_and_the_shim_lives() {
    with_sleeping_pod("hostile-ids", async |pod: &mut SleepingPod| {
        let shim = pod.shim_pid().ok_or("no single shim daemon for the pod")?;
        let address = shim_address("k8s.io", &pod.id, shim)
            .ok_or_else(|| format!("no ttrpc address for the shim {shim} of {}", pod.id))?;
        let container = pod.container.clone();
        let t = Instant::now();
        let a = address.clone();
        let calls = tokio::task::spawn_blocking(move || send_hostile_ids(&a, &container))
            .await
            .map_err(|e| format!("join: {e}"))??;
        eprintln!(
            "{calls} calls with hostile IDs in {:?}; shim threads now {}",
            t.elapsed(),
            thread_count(shim)
        );

        // The same shim still serves: Connect on a fresh connection, and the pod works.
        let id = pod.id.clone();
        let connected = tokio::task::spawn_blocking(move || {
            ShimClient::connect(&address)?
                .connect_task(&id)
                .map_err(|a| format!("{a:?}"))
        })
        .await
        .map_err(|e| format!("join: {e}"))?;
        ensure!(
            connected == Ok(shim as u32),
            "Task.Connect after the hostile IDs: {connected:?}, the shim's pid is {shim}"
        );
        let r = pod
            .exec(&["echo", "ok"], 10)
            .await
            .map_err(|s| format!("exec after the hostile IDs: {}", s.message()))?;
        ensure!(
            r.exit_code == 0 && r.stdout == b"ok\n",
            "echo ok: exit {} stdout {:?}",
            r.exit_code,
            String::from_utf8_lossy(&r.stdout)
        );
        ensure!(
            pod.shim_pid() == Some(shim),
            "the shim changed: {:?}, was {shim}",
            pod.shim_pid()
        );
        Ok(())
    })
    .await;
}
