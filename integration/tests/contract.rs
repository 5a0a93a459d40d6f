//! The runc shim's contract, second pass (issue 14 items 1-4): real-time signals, SIGKILL of a
//! paused task, `exec -t` into a paused task, a terminal client that never reads, and CRI's
//! StopContainer of a container that exits on SIGTERM. Every probe runs against our shim and,
//! in the same test, against containerd's runc shim (`io.containerd.runc.v2` through `ctr` or
//! the Tasks API, the `runc` handler through CRI): both must behave alike.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use containerd_client::types::v1::Status;
use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{Pod, container_config, pod_config};
use rsandbox_integration::pty::PtyChild;
use rsandbox_integration::tasks::{Fifos, StdioPaths, TaskApi};
use rsandbox_integration::*;

const NS: &str = "default";
/// containerd's runc shim, for `ctr run --runtime`.
const RUNC_RUNTIME: &str = "io.containerd.runc.v2";

type R = Result<(), String>;

/// Both runtimes, with a short tag for IDs.
fn runtimes() -> [(&'static str, &'static str); 2] {
    [(RUNTIME, "rs"), (RUNC_RUNTIME, "runc")]
}

/// Runs `body` for a fresh ID on `runtime`, then removes the task and container whatever
/// happened. Our shim must leave nothing behind (the Guard counts our shim processes only).
fn with_task(name: &str, runtime: &str, tag: &str, body: impl FnOnce(&str) -> R) {
    let g = Guard::new();
    let id = unique_id(&format!("{name}-{tag}"));
    let res = {
        let _cleanup = CtrObjects {
            ns: NS,
            ids: vec![id.clone()],
        };
        body(&id).map_err(|e| format!("[{runtime}] {e}"))
    };
    expect_ok(&id, res);
    g.assert_clean(&[id]);
}

/// `ctr run -d --runtime <runtime> [flags] busybox <id> <cmd...>`
fn run_detached(runtime: &str, id: &str, flags: &[&str], cmd: &[&str]) -> R {
    let mut args = vec!["run", "-d", "--runtime", runtime];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[BUSYBOX, id]);
    args.extend_from_slice(cmd);
    let o = ctr(NS, &args);
    ensure!(o.ok(), "ctr run -d: {o:?}");
    wait_status(id, "RUNNING", HANG).map(drop)
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

/// Polls `ctr task ls` until `id` shows `want`; how long that took.
fn wait_status(id: &str, want: &str, limit: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    let mut last = String::new();
    let ok = poll(limit, || {
        last = task_status(id);
        (last == want).then_some(())
    });
    ensure!(
        ok.is_some(),
        "task {id}: status {last:?} after {limit:?}, want {want}"
    );
    Ok(t.elapsed())
}

/// `ctr <args>` must succeed.
fn ctr_ok(args: &[&str]) -> R {
    let o = ctr(NS, args);
    ensure!(o.ok(), "ctr {}: {o:?}", args.join(" "));
    Ok(())
}

/// Waits until the file holds `needle`.
fn wait_for_text(path: &Path, needle: &str, limit: Duration) -> R {
    let mut text = String::new();
    let ok = poll(limit, || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.contains(needle).then_some(())
    });
    ensure!(
        ok.is_some(),
        "{needle:?} not in {} within {limit:?}: {text:?}",
        path.display()
    );
    Ok(())
}

// --- item 1: signals ------------------------------------------------------------------------

/// Signal 37 (SIGRTMIN+3, systemd's stop signal) and 64 (SIGRTMAX) reach the init, an exec
/// and `all`, and a trap in the workload sees them; 65 is refused.
#[test]
fn real_time_signals_reach_the_init_the_execs_and_all() {
    for (runtime, tag) in runtimes() {
        with_task("rtsig", runtime, tag, |id| {
            let dir = scratch_dir(id);
            let log = dir.join("out.log");
            let uri = format!("file://{}", log.display());
            let init = "trap 'echo init37' 37; trap 'echo init64' 64; echo ready; \
                        while true; do sleep 0.1; done";
            run_detached(runtime, id, &["--log-uri", &uri], &["sh", "-c", init])?;
            wait_for_text(&log, "ready", HANG)?;
            // The exec writes into the init's stdout, the log file.
            let exec = "trap 'echo exec37 > /proc/1/fd/1' 37; echo exec-ready > /proc/1/fd/1; \
                        while true; do sleep 0.1; done";
            ctr_ok(&[
                "task",
                "exec",
                "-d",
                "--exec-id",
                "e1",
                id,
                "sh",
                "-c",
                exec,
            ])?;
            wait_for_text(&log, "exec-ready", HANG)?;

            ctr_ok(&["task", "kill", "-s", "37", id])?;
            wait_for_text(&log, "init37", HANG)?;
            ctr_ok(&["task", "kill", "-s", "37", "--exec-id", "e1", id])?;
            wait_for_text(&log, "exec37", HANG)?;
            ctr_ok(&["task", "kill", "-a", "-s", "64", id])?;
            wait_for_text(&log, "init64", HANG)?;
            let o = ctr(NS, &["task", "kill", "-s", "65", id]);
            ensure!(!o.ok(), "signal 65 (above SIGRTMAX) was accepted: {o:?}");
            ensure!(
                task_status(id) == "RUNNING",
                "the task did not survive its trapped signals"
            );
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        });
    }
}

// --- item 2: SIGKILL of a paused task -------------------------------------------------------

/// `ctr task pause; ctr task kill -s KILL [-a]`: STOPPED (on cgroup v1 the freezer holds the
/// SIGKILL until the cgroup thaws, as runc does after it; before that fix it never stopped),
/// then deletable.
#[test]
fn sigkill_of_a_paused_task_stops_it() {
    for (runtime, tag) in runtimes() {
        for all in [false, true] {
            let name = if all { "pkill-all" } else { "pkill" };
            with_task(name, runtime, tag, |id| {
                run_detached(runtime, id, &[], &["sleep", "300"])?;
                ctr_ok(&["task", "pause", id])?;
                wait_status(id, "PAUSED", HANG)?;
                let mut kill = vec!["task", "kill", "-s", "KILL"];
                if all {
                    kill.push("-a");
                }
                kill.push(id);
                ctr_ok(&kill)?;
                let took = wait_status(id, "STOPPED", HANG)?;
                eprintln!("[{runtime}] SIGKILL (all={all}) of a paused task: STOPPED in {took:?}");
                ctr_ok(&["task", "rm", id])
            });
        }
    }
}

/// StopPodSandbox of a pod whose container was paused (through containerd's Tasks API in
/// `k8s.io`): the pod stops and goes, for both handlers.
#[tokio::test]
async fn stop_pod_sandbox_of_a_paused_container() {
    for handler in [HANDLER, RUNC_HANDLER] {
        let g = Guard::new();
        let name = unique_id(&format!("ppause-{handler}"));
        let dir = scratch_dir(&name);
        let (mut rt, _) = cri_clients().await;
        let mut ids = Vec::new();
        let res = async {
            let cfg = pod_config(&name, &dir);
            let (pod, cid) = run_pod(&mut rt, handler, &cfg, &["sleep", "3600"]).await?;
            ids.extend([pod.clone(), cid.clone()]);
            let o = ctr("k8s.io", &["task", "pause", &cid]);
            ensure!(o.ok(), "ctr task pause: {o:?}");
            let t = Instant::now();
            let stop = rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            });
            match tokio::time::timeout(HANG, stop).await {
                Ok(Ok(_)) => {}
                Ok(Err(s)) => return Err(format!("StopPodSandbox: {}", s.message())),
                Err(_) => {
                    return Err(format!(
                        "StopPodSandbox of a paused container: no answer in {HANG:?}"
                    ));
                }
            }
            eprintln!(
                "[{handler}] StopPodSandbox with a paused container: {:?}",
                t.elapsed()
            );
            let st = rt
                .container_status(ContainerStatusRequest {
                    container_id: cid.clone(),
                    verbose: false,
                })
                .await
                .map_err(|s| format!("ContainerStatus: {}", s.message()))?
                .into_inner()
                .status
                .map(|s| s.state);
            ensure!(
                st == Some(ContainerState::ContainerExited as i32),
                "container state {st:?} after StopPodSandbox"
            );
            Ok(())
        }
        .await;
        if let Some(pod) = ids.first() {
            let _ = rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await;
            let _ = rt
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await;
        }
        expect_ok(&name, res.map_err(|e| format!("[{handler}] {e}")));
        g.assert_clean(&ids);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// --- item 3: a failed runc exec with a terminal ---------------------------------------------

/// `ctr task pause t; ctr task exec -t --exec-id x t true` fails with the refusal (runc:
/// "cannot exec in a paused container"; the runc shim refuses at Exec: "cannot exec in a
/// paused state"), not after runc's 120 s timeout, and the task is fine afterwards.
#[test]
fn exec_tty_into_a_paused_task_fails_and_the_task_lives_on() {
    for (runtime, tag) in runtimes() {
        with_task("pexec", runtime, tag, |id| {
            run_detached(runtime, id, &[], &["sleep", "300"])?;
            ctr_ok(&["task", "pause", id])?;
            wait_status(id, "PAUSED", HANG)?;
            let t = Instant::now();
            let mut p = PtyChild::spawn(
                NS,
                &["task", "exec", "-t", "--exec-id", "x", id, "true"],
                24,
                80,
            );
            let code = p.wait(HANG);
            let took = t.elapsed();
            let text = p.text();
            eprintln!("[{runtime}] exec -t into a paused task: {code:?} in {took:?}: {text:?}");
            ensure!(code.is_some(), "still running after {HANG:?}: {text:?}");
            ensure!(
                code != Some(0),
                "exec into a paused task succeeded: {text:?}"
            );
            ensure!(
                text.contains("paused"),
                "the error does not say why: {text:?}"
            );
            ctr_ok(&["task", "resume", id])?;
            wait_status(id, "RUNNING", HANG)?;
            ctr_ok(&["task", "exec", "--exec-id", "y", id, "true"])
        });
    }
}

// --- item 4: output never holds an exit hostage ---------------------------------------------

/// `exec -t ... yes` whose client keeps its stdout fifo open and never reads (a killed `ctr`
/// whose fifo someone still holds): SIGKILL to the exec and the init, and the task is
/// STOPPED (it used to stay RUNNING while the output was stuck) and deletable.
#[tokio::test]
async fn a_terminal_client_that_never_reads_does_not_hold_the_exit() {
    for (runtime, tag) in runtimes() {
        let g = Guard::new();
        let id = unique_id(&format!("stuck-{tag}"));
        let dir = scratch_dir(&id);
        let res = {
            let _cleanup = CtrObjects {
                ns: NS,
                ids: vec![id.clone()],
            };
            stuck_client(runtime, &id, &dir).await
        };
        expect_ok(&id, res.map_err(|e| format!("[{runtime}] {e}")));
        g.assert_clean(std::slice::from_ref(&id));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// How many bytes the pipe `f` reads from holds, and its capacity (-1 where unknown).
fn pipe_fill(f: &std::fs::File) -> (libc::c_int, libc::c_int) {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = -1;
    // SAFETY: FIONREAD writes one c_int to the pointer, which outlives the call; F_GETPIPE_SZ
    // takes no argument. Both only read the fd's state.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut queued) != 0 {
            queued = -1;
        }
        (queued, libc::fcntl(f.as_raw_fd(), libc::F_GETPIPE_SZ))
    }
}

async fn stuck_client(runtime: &str, id: &str, dir: &Path) -> R {
    run_detached(runtime, id, &[], &["sleep", "300"])?;
    let mut api = TaskApi::connect(NS).await;
    let spec = api.spec(id).await?;
    let mut process = spec["process"].clone();
    process["args"] = serde_json::json!(["yes"]);
    process["terminal"] = serde_json::json!(true);
    let fifos = Fifos::new(dir, "y");
    // The client's read end, held and never read.
    let held = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&fifos.stdout)
        .map_err(|e| format!("open {}: {e}", fifos.stdout.display()))?;
    let io = StdioPaths {
        stdin: fifos.paths(true).stdin,
        stdout: fifos.paths(true).stdout,
        stderr: String::new(),
    };
    api.exec(id, "y", &process, &io, true).await?;
    api.start(id, "y").await?;
    // `yes` fills the fifo and blocks on its terminal: the test is about a client stuck
    // there, so it goes on only once the fifo is full: more than half its capacity queued
    // (the kernel fills its slots with pages the copies leave part empty) and no more coming
    // for 4 looks 50 ms apart.
    let (mut queued, mut capacity, mut still) = (0, 0, 0);
    let t = Instant::now();
    while t.elapsed() < HANG && still < 4 {
        let (now, cap) = pipe_fill(&held);
        still = if now == queued && cap > 0 && now > cap / 2 {
            still + 1
        } else {
            0
        };
        (queued, capacity) = (now, cap);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        still >= 4,
        "the client's fifo: {queued} of {capacity} bytes, still filling {HANG:?} after `yes` started"
    );
    api.kill(id, "y", 9).await?;
    api.kill(id, "", 9).await?;
    let t = Instant::now();
    let limit = HANG;
    loop {
        let init = api.get(id, "").await?;
        let exec = api.get(id, "y").await?;
        if init.status == Status::Stopped as i32 && exec.status == Status::Stopped as i32 {
            break;
        }
        ensure!(
            t.elapsed() < limit,
            "init {:?} and exec {:?} {limit:?} after their SIGKILL",
            Status::try_from(init.status),
            Status::try_from(exec.status)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[{runtime}] stuck tty client: STOPPED {:?} after the SIGKILLs",
        t.elapsed()
    );
    let status = tokio::time::timeout(limit, api.wait(id, ""))
        .await
        .map_err(|_| "Wait of the stopped init did not answer".to_string())??;
    ensure!(status == 137, "init exit status {status}, want 137");
    tokio::time::timeout(limit, api.delete(id))
        .await
        .map_err(|_| format!("Tasks.Delete not answered within {limit:?}"))??;
    Ok(())
}

// --- item 1, through CRI: StopContainer -----------------------------------------------------

/// The pod config for `name`, its containers in a pid namespace of their own or the pod's.
fn pod_config_with_pid(name: &str, dir: &Path, pid: NamespaceMode) -> PodSandboxConfig {
    let mut cfg = pod_config(name, dir);
    if let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.pid = pid as i32;
    }
    cfg
}

/// RunPodSandbox with `handler`, then one container running `cmd`. Returns (pod, container).
async fn run_pod(
    rt: &mut Runtime,
    handler: &str,
    cfg: &PodSandboxConfig,
    cmd: &[&str],
) -> Result<(String, String), String> {
    let pod = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .map_err(|s| format!("RunPodSandbox: {}", s.message()))?
        .into_inner()
        .pod_sandbox_id;
    let cid = start_container(rt, &pod, cfg, "c0", cmd).await?;
    Ok((pod, cid))
}

async fn start_container(
    rt: &mut Runtime,
    pod: &str,
    cfg: &PodSandboxConfig,
    name: &str,
    cmd: &[&str],
) -> Result<String, String> {
    // The kubelet repeats the pod's namespace options in each container's config.
    let mut config = container_config(name, cmd);
    let pod_ns = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.namespace_options = pod_ns;
    }
    let cid = rt
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(cfg.clone()),
        })
        .await
        .map_err(|s| format!("CreateContainer: {}", s.message()))?
        .into_inner()
        .container_id;
    rt.start_container(StartContainerRequest {
        container_id: cid.clone(),
    })
    .await
    .map_err(|s| format!("StartContainer: {}", s.message()))?;
    Ok(cid)
}

/// Lines of containerd's log with CRI's exit-handler failure for one of `ids` (the line prints
/// the event, its IDs with it: `internal/cri/server/events.go`), so that another test's late
/// retry is not counted.
fn exit_handler_failures(ids: &[String]) -> usize {
    std::fs::read_to_string(containerd_log())
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("failed to handle container TaskExit event")
                && ids.iter().any(|id| l.contains(id.as_str()))
        })
        .count()
}

/// 200 StopContainer calls on containers that exit on SIGTERM: every call succeeds and CRI's
/// exit handler never fails (its Kill(SIGKILL, all) after the TaskExit found a stopped
/// container and runc kill --all failed on it: "failed to handle container TaskExit event"
/// in containerd's log, then a retry after a back-off, calls of 1.3-2 s). The same probe on
/// the `runc` handler. How long the calls take is printed for both handlers, not asserted
/// (the machine may be busy or shared): hack/bench.sh measures StopContainer per handler.
/// Containers with a pid namespace of their own.
#[tokio::test]
async fn stop_container_of_a_container_that_exits_on_sigterm() {
    stop_containers(NamespaceMode::Container).await;
}

/// The same in a pod that shares one pid namespace (the shim kills the rest of a container
/// with `runc kill --all` when its init exits).
#[tokio::test]
async fn stop_container_in_a_shared_pid_namespace() {
    stop_containers(NamespaceMode::Pod).await;
}

async fn stop_containers(pid: NamespaceMode) {
    const CALLS: usize = 200;
    // PID 1 ignores SIGTERM unless it traps it; `wait` returns at once on a trapped signal.
    // "ready": the trap is set (a SIGTERM before that would be ignored).
    let cmd = [
        "sh",
        "-c",
        "trap 'exit 0' TERM; echo ready; sleep 3600 & wait",
    ];
    for handler in [HANDLER, RUNC_HANDLER] {
        let g = Guard::new();
        let tag = if pid == NamespaceMode::Pod {
            "shared"
        } else {
            "own"
        };
        let name = unique_id(&format!("stop200-{tag}-{handler}"));
        let dir = scratch_dir(&name);
        let (mut rt, _) = cri_clients().await;
        let mut pod_id = None;
        let mut made = Vec::new();
        let mut times = Vec::with_capacity(CALLS);
        let res = async {
            let cfg = pod_config_with_pid(&name, &dir, pid);
            let (pod, first) = run_pod(&mut rt, handler, &cfg, &cmd).await?;
            pod_id = Some(pod.clone());
            let mut cid = first;
            for i in 0..CALLS {
                if i > 0 {
                    cid = start_container(&mut rt, &pod, &cfg, &format!("c{i}"), &cmd).await?;
                }
                made.push(cid.clone());
                wait_for_text(&dir.join(format!("c{i}.log")), "ready", HANG)?;
                let t = Instant::now();
                rt.stop_container(StopContainerRequest {
                    container_id: cid.clone(),
                    timeout: 10,
                })
                .await
                .map_err(|s| format!("StopContainer {i}: {}", s.message()))?;
                times.push(t.elapsed());
                rt.remove_container(RemoveContainerRequest {
                    container_id: cid.clone(),
                })
                .await
                .map_err(|s| format!("RemoveContainer {i}: {}", s.message()))?;
            }
            Ok::<(), String>(())
        }
        .await;
        if let Some(pod) = &pod_id {
            let _ = rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await;
            let _ = rt
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: pod.clone(),
                })
                .await;
        }
        let mut sorted = times.clone();
        sorted.sort();
        let failures = exit_handler_failures(&made);
        eprintln!(
            "[{handler}, {pid:?} pid namespace] {} StopContainer calls: p50 {:?}, p99 {:?}, \
             max {:?}; exit handler failures: {failures}",
            times.len(),
            sorted.get(sorted.len() / 2),
            sorted.get(sorted.len() * 99 / 100),
            sorted.last()
        );
        let res = res.and_then(|()| {
            ensure!(
                failures == 0,
                "{failures} 'failed to handle container TaskExit event' in containerd's log"
            );
            Ok(())
        });
        expect_ok(&name, res.map_err(|e| format!("[{handler}, {pid:?}] {e}")));
        made.extend(pod_id);
        g.assert_clean(&made);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// --- issue 20 item 2: one exec never holds up the container ---------------------------------

/// How many ExecSyncs run at once, and how many rounds are measured.
const PARALLEL: usize = 5;
const ROUNDS: usize = 5;

/// A container that burns the 0.1 CPU it is given, in periods of 0.5 s: the burner spends the
/// quota at the start of each period, so a `runc exec` into it (whose `runc init` joins the
/// cgroup) mostly waits for the next period. Execs that run at once wait for the same period;
/// a shim that runs them one at a time makes each wait for its own.
fn burner_config() -> ContainerConfig {
    let mut c = container_config("burner", &["sh", "-c", "while :; do :; done"]);
    c.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        cpu_period: 500_000,
        cpu_quota: 50_000,
        ..Default::default()
    });
    c
}

/// ExecSync `true` into `cid` (60 s CRI timeout: the test is about order, not speed).
async fn exec_true(mut rt: Runtime, cid: String) -> R {
    let r = rt
        .exec_sync(ExecSyncRequest {
            container_id: cid,
            cmd: vec!["true".into()],
            timeout: 60,
        })
        .await
        .map_err(|s| format!("ExecSync: {}", s.message()))?
        .into_inner();
    ensure!(r.exit_code == 0, "ExecSync true: exit {}", r.exit_code);
    Ok(())
}

/// Median wall times of [`PARALLEL`] ExecSyncs one after the other and at once.
#[derive(Clone, Copy, Debug)]
struct ExecTimes {
    seq: Duration,
    par: Duration,
}

impl ExecTimes {
    fn ratio(&self) -> f64 {
        self.par.as_secs_f64() / self.seq.as_secs_f64()
    }
}

/// Whether rsandbox queued its parallel execs where the runc handler, measured in the same
/// test, did not: worse on both counts (see the test below for why one is not enough).
fn queues(rs: ExecTimes, runc: ExecTimes) -> bool {
    rs.ratio() > runc.ratio() + 0.15 && rs.par.as_secs_f64() > runc.par.as_secs_f64() * 1.3
}

#[test]
fn queueing_is_worse_than_runc_on_both_counts() {
    let t = |seq_ms, par_ms| ExecTimes {
        seq: Duration::from_millis(seq_ms),
        par: Duration::from_millis(par_ms),
    };
    // CI: a higher ratio only because rsandbox's sequential execs were the faster
    assert!(!queues(t(1079, 516), t(1753, 491)));
    // the same parallel time, the same ratio
    assert!(!queues(t(1200, 500), t(1200, 500)));
    // one exec at a time: parallel about as long as sequential
    assert!(queues(t(1400, 1100), t(1500, 500)));
}

/// One round: wall time of [`PARALLEL`] ExecSyncs one after the other, then of as many at once.
async fn sequential_then_parallel(rt: &Runtime, cid: &str) -> Result<(Duration, Duration), String> {
    let t = Instant::now();
    for _ in 0..PARALLEL {
        exec_true(rt.clone(), cid.into()).await?;
    }
    let seq = t.elapsed();
    let t = Instant::now();
    let running: Vec<_> = (0..PARALLEL)
        .map(|_| tokio::spawn(exec_true(rt.clone(), cid.into())))
        .collect();
    for r in running {
        r.await.map_err(|e| format!("join: {e}"))??;
    }
    Ok((seq, t.elapsed()))
}

/// The median of `v`.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Five parallel ExecSyncs into a container limited to 0.1 CPU that burns it take about as
/// long as the slowest, not the sum. No absolute time is asserted: both handlers are measured
/// in the same test (their rounds taken in turn), and rsandbox is said to queue only when it
/// is worse than the runc handler on both counts: its parallel time against its own
/// sequential time (more than 0.15 above runc's ratio) and its parallel time against runc's
/// parallel time (more than 1.3×). One
/// count alone is noise on a busy machine: in CI rsandbox measured a ratio of 0.48 against
/// runc's 0.28 with the same parallel time (516 ms against 491 ms; its sequential execs were
/// the faster). Non-queued execs all wait for the same CFS period (0.5 s), queued ones each
/// for their own. With the lifecycle lock put back across each `runc exec` (an experiment,
/// runc 1.1, idle bench) rsandbox measured 0.78 and 1.52 s against runc's 0.25 and 0.52 s;
/// without it, 0.26 and 0.52 s against 0.27 and 0.54 s.
#[tokio::test]
async fn parallel_execs_into_a_throttled_container_do_not_queue() {
    let g = Guard::new();
    let dir = scratch_dir(&unique_id("pexec"));
    let mut failures = Vec::new();
    // Both pods first, then the rounds taken in turn, so that a change of the machine's load
    // falls on both handlers alike.
    let mut pods = Vec::new();
    for handler in [HANDLER, RUNC_HANDLER] {
        let name = unique_id(&format!("pexec-{handler}"));
        let mut pod = match Pod::run(handler, pod_config(&name, &dir)).await {
            Ok(p) => p,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let started = async {
            let cid = pod.start(burner_config()).await?;
            exec_true(pod.rt.clone(), cid.clone()).await?; // warm-up
            Ok::<_, String>(cid)
        }
        .await;
        match started {
            Ok(cid) => pods.push((handler, pod, cid)),
            Err(e) => {
                failures.push(format!("[{handler}] {e}"));
                pods.push((handler, pod, String::new()));
            }
        }
    }
    let mut rounds: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); pods.len()];
    if failures.is_empty() {
        'rounds: for _ in 0..ROUNDS {
            for (i, (handler, pod, cid)) in pods.iter().enumerate() {
                match sequential_then_parallel(&pod.rt, cid).await {
                    Ok((seq, par)) => {
                        rounds[i].0.push(seq);
                        rounds[i].1.push(par);
                    }
                    Err(e) => {
                        failures.push(format!(
                            "[{handler}] {e}\n--- containerd log ---\n{}",
                            log_lines(&pod.id, 20)
                        ));
                        break 'rounds;
                    }
                }
            }
        }
    }
    let mut all_ids = Vec::new();
    for (handler, pod, _) in &mut pods {
        if let Err(e) = pod.remove().await {
            failures.push(format!("[{handler}] remove: {e}"));
        }
        all_ids.extend(pod.ids());
    }
    let mut measured = Vec::new();
    for ((handler, _, _), (seq, par)) in pods.iter().zip(rounds) {
        eprintln!("  [{handler}] rounds: one after the other {seq:?}, at once {par:?}");
        if seq.len() == ROUNDS {
            let m = ExecTimes {
                seq: median(seq),
                par: median(par),
            };
            eprintln!(
                "[{handler}] {PARALLEL} ExecSync into a 0.1-CPU burner: one after the other \
                 {:?}, at once {:?} (ratio {:.2})",
                m.seq,
                m.par,
                m.ratio()
            );
            measured.push(m);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let (rs, runc) = (measured[0], measured[1]);
    assert!(
        !queues(rs, runc),
        "{PARALLEL} parallel execs on rsandbox take {:.2} of {PARALLEL} sequential ones ({:?}), \
         on runc {:.2} ({:?}): rsandbox queues them",
        rs.ratio(),
        rs.par,
        runc.ratio(),
        runc.par
    );
    g.assert_clean(&all_ids);
    let _ = std::fs::remove_dir_all(&dir);
}
