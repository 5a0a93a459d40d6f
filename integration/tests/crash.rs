//! A pod whose shim is SIGKILLed (issue 20 item 5): after StopPodSandbox + RemovePodSandbox
//! nothing of it may be left: no cgroup of its container in any hierarchy, no runc state, no
//! process. The same crash on containerd's runc handler shows what that path leaves (printed,
//! then cleaned up by the test: it is containerd's, not ours to assert on). The pod's CreatedAt
//! is read before and after the crash on both. A pod cgroup (cgroup_parent) that did not
//! exist is left by both, in the same hierarchies: it is no pod's own (issue 27 item 11).
//!
//! Issue 27: `delete` of a task whose cgroupsPath names a cgroup shared with others kills and
//! removes nothing of the others' (item 1, with containerd's runc shim beside it); `delete`
//! of a pod whose members' `runc delete` and one CNI plugin hang ends before containerd's 5 s
//! with the network gone (item 3).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{self, Pod, container_config};
use rsandbox_integration::*;

/// Whether `pid` runs (a zombie does not: it is dead, only not yet reaped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// The runc roots of the bench: the rsandbox shim's default (`/run/containerd/runc/<ns>`) and
/// the runc handler's (`Root` of its options).
fn runc_roots() -> Vec<PathBuf> {
    vec![
        PathBuf::from("/run/containerd/runc/k8s.io"),
        prefix().join("run/runc/k8s.io"),
    ]
}

/// The shim daemon of pod `id` on `handler`: a process of that shim binary started with
/// `-id <id>` for the bench's containerd.
fn shim_of(handler: &str, id: &str) -> Option<i32> {
    let binary = if handler == HANDLER {
        SHIM
    } else {
        "containerd-shim-runc-v2"
    };
    let addr = format!(" -address {} ", address().display());
    let want_id = format!(" -id {id} ");
    let rd = std::fs::read_dir("/proc").ok()?;
    rd.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let raw = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = format!("{} ", String::from_utf8_lossy(&raw).replace('\0', " "));
        let first = cmd.split(' ').next()?;
        (first.ends_with(binary) && cmd.contains(&addr) && cmd.contains(&want_id)).then_some(pid)
    })
}

/// SIGKILLs shim daemon `shim` (a crash, as the tests make one).
fn sigkill_shim(shim: i32) -> Result<(), String> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| format!("kill the shim {shim}: {e}"))
}

/// The socket of pod `id`'s shim, from the `bootstrap.json` containerd wrote in its bundle
/// (the sandbox controller's for the shim sandboxer, the task's for the runc path).
fn shim_socket(id: &str) -> Option<PathBuf> {
    [
        "io.containerd.sandbox.controller.v1.shim",
        "io.containerd.runtime.v2.task",
    ]
    .iter()
    .find_map(|kind| {
        let b = prefix()
            .join("run/containerd")
            .join(kind)
            .join("k8s.io")
            .join(id);
        let raw = std::fs::read(b.join("bootstrap.json")).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
        let a = v["address"].as_str()?;
        Some(PathBuf::from(a.strip_prefix("unix://").unwrap_or(a)))
    })
}

/// CreatedAt of pod `id` as ListPodSandbox and PodSandboxStatus report it.
async fn created_at(pod: &mut Pod) -> Result<(i64, i64), String> {
    let list = pod
        .rt
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                id: pod.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| format!("ListPodSandbox: {}", s.message()))?
        .into_inner();
    let listed = list.items.first().map(|p| p.created_at).unwrap_or(-1);
    let status = pod
        .rt
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .map_err(|s| format!("PodSandboxStatus: {}", s.message()))?
        .into_inner();
    let stated = status.status.map(|s| s.created_at).unwrap_or(-1);
    Ok((listed, stated))
}

/// What a crashed pod left: cgroups named after `ids`, runc state dirs, live processes, the
/// shim's socket.
fn leftovers(ids: &[String], pids: &[u32], socket: &Path) -> Vec<String> {
    let mut found: Vec<String> = cgroups_named(ids)
        .into_iter()
        .map(|c| format!("cgroup {}", c.display()))
        .collect();
    for root in runc_roots() {
        for id in ids {
            let d = root.join(id);
            if d.exists() {
                found.push(format!("runc state {}", d.display()));
            }
        }
    }
    for &pid in pids {
        if alive(pid) {
            found.push(format!("process {pid} still runs"));
        }
    }
    if socket.exists() {
        found.push(format!("shim socket {}", socket.display()));
    }
    found
}

/// What one handler's pod showed around the crash.
struct Crash {
    created_before: (i64, i64),
    created_after: (i64, i64),
    ids: Vec<String>,
    pids: Vec<u32>,
    socket: PathBuf,
    /// StopPodSandbox + RemovePodSandbox.
    removed: Result<(), String>,
    /// The pod's own cgroup_parent (a name under the root of each hierarchy), if it had one.
    parent: Option<String>,
}

/// Runs a pod with a sleeping container on `handler`, SIGKILLs its shim, then StopPodSandbox
/// and RemovePodSandbox (both must succeed).
/// With `parent`, the pod has a cgroup_parent of its own (`/<unique name>`, which nobody made
/// before: the shim or runc makes it; see [`pod_cgroups_left`]).
async fn crash_pod(handler: &str, dir: &Path, parent: bool) -> Result<Crash, String> {
    let name = unique_id(&format!(
        "crash-{handler}{}",
        if parent { "-p" } else { "" }
    ));
    let mut cfg = pods::pod_config(&name, dir);
    if parent {
        cfg.linux.get_or_insert_default().cgroup_parent = format!("/{name}");
    }
    let mut pod = Pod::run(handler, cfg).await?;
    let r = crash_pod_inner(&mut pod).await;
    let parent = parent.then_some(name);
    match r {
        Ok(mut c) => {
            c.parent = parent;
            Ok(c)
        }
        Err(e) => {
            clean_runc_leftovers(&pod.ids(), &[]);
            if let Some(p) = &parent {
                remove_pod_cgroups(p);
            }
            let _ = pod.remove().await;
            Err(e)
        }
    }
}

/// The directories of pod cgroup `/<name>` (a cgroup_parent nobody but the shim or runc made)
/// that are still there, as `<hierarchy mount point>`: the shim removes the pause's own
/// cgroup only, never a parent (issue 27 item 11), as runc's fs manager removes only the
/// container's own paths; nothing below it may be left (the leftover checks see those: they
/// are named after the pod's and containers' IDs).
fn pod_cgroups_left(name: &str) -> Vec<PathBuf> {
    cgroup_roots()
        .into_iter()
        .filter(|r| r.join(name).is_dir())
        .collect()
}

/// Removes pod cgroup `/<name>` where it is left (the test's clean-up: the kubelet's job).
fn remove_pod_cgroups(name: &str) {
    for r in cgroup_roots() {
        let d = r.join(name);
        let _ = poll(Duration::from_secs(5), || {
            std::fs::remove_dir(&d).ok().or((!d.exists()).then_some(()))
        });
    }
}

async fn crash_pod_inner(pod: &mut Pod) -> Result<Crash, String> {
    let handler = pod.handler.clone();
    let cid = pod
        .start(container_config("sleeper", &["sleep", "3600"]))
        .await?;
    let mut pids = Vec::new();
    let verbose_pid = |info: Option<&String>| -> Option<u32> {
        let v: serde_json::Value = serde_json::from_str(info?).ok()?;
        v["pid"].as_u64().map(|p| p as u32)
    };
    let c = pod
        .rt
        .container_status(ContainerStatusRequest {
            container_id: cid.clone(),
            verbose: true,
        })
        .await
        .map_err(|s| format!("{handler}: ContainerStatus: {}", s.message()))?
        .into_inner();
    pids.extend(verbose_pid(c.info.get("info")));
    let s = pod
        .rt
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: true,
        })
        .await
        .map_err(|s| format!("{handler}: PodSandboxStatus: {}", s.message()))?
        .into_inner();
    pids.extend(verbose_pid(s.info.get("info")));
    ensure!(
        pids.len() == 2 && pids.iter().all(|&p| alive(p)),
        "{handler}: container and pause pids {pids:?}"
    );
    let created_before = created_at(pod).await?;
    let socket = shim_socket(&pod.id).ok_or(format!("{handler}: no bootstrap.json"))?;
    let shim = shim_of(&handler, &pod.id).ok_or(format!("{handler}: no shim for {}", pod.id))?;
    sigkill_shim(shim)?;
    ensure!(
        poll(Duration::from_secs(30), || (!alive(shim as u32))
            .then_some(()))
        .is_some(),
        "{handler}: the shim {shim} survived SIGKILL"
    );
    // containerd notices the closed connection (and runs `delete`) asynchronously: the pod
    // turns NOTREADY and the container EXITED once it has (until then a status call may fail
    // with "ttrpc: closed").
    let notready = PodSandboxState::SandboxNotready as i32;
    let exited = ContainerState::ContainerExited as i32;
    let mut seen = (Ok(-1), Ok(-1));
    for _ in 0..300 {
        seen.0 = pod.state().await;
        seen.1 = pod
            .rt
            .container_status(ContainerStatusRequest {
                container_id: cid.clone(),
                verbose: false,
            })
            .await
            .map_err(|s| s.message().to_string())
            .map(|r| r.into_inner().status.map(|s| s.state).unwrap_or(-1));
        if seen.0 == Ok(notready) && seen.1 == Ok(exited) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        seen.0 == Ok(notready) && seen.1 == Ok(exited),
        "{handler}: pod and container states after the crash: {seen:?}"
    );
    let created_after = created_at(pod).await?;
    let removed = pod.remove().await;
    Ok(Crash {
        created_before,
        created_after,
        ids: pod.ids(),
        pids,
        socket,
        removed,
        parent: None,
    })
}

/// Takes down what the runc handler's crash left (the test made it): `runc delete --force`
/// with the handler's root, then the processes and cgroups directly.
fn clean_runc_leftovers(ids: &[String], pids: &[u32]) {
    let runc = prefix().join("usr/bin/runc");
    for root in runc_roots() {
        for id in ids {
            if root.join(id).exists() {
                let _ = std::process::Command::new(&runc)
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", id])
                    .output();
                let _ = std::fs::remove_dir_all(root.join(id));
            }
        }
    }
    for &pid in pids {
        if alive(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let mut dirs = cgroups_named(ids);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = poll(Duration::from_secs(5), || {
            std::fs::remove_dir(&d).ok().or((!d.exists()).then_some(()))
        });
    }
}

/// StopPodSandbox + RemovePodSandbox of pod `id` once more.
async fn remove_pod(id: &str) -> Result<(), String> {
    let (mut rt, _) = cri_clients().await;
    rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map_err(|s| s.message().to_string())?;
    rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map(drop)
    .map_err(|s| s.message().to_string())
}

/// Runs the crash on both handlers and checks rsandbox left nothing (see the module doc).
async fn crash_both(parent: bool) {
    let g = Guard::new();
    let dir = scratch_dir(&unique_id("crash"));
    let ours = crash_pod(HANDLER, &dir, parent).await;
    let theirs = crash_pod(RUNC_HANDLER, &dir, parent).await;
    let what = if parent { " (cgroup_parent)" } else { "" };

    // The runc path's leftovers, for the record; then the test removes them.
    let mut all_ids = Vec::new();
    let mut runc_parent_left = Vec::new();
    match theirs {
        Ok(mut c) => {
            let mut left = leftovers(&c.ids, &c.pids, &c.socket);
            if let Err(e) = &c.removed {
                left.push(format!("StopPodSandbox + RemovePodSandbox failed: {e}"));
            }
            eprintln!(
                "[runc{what}] a SIGKILLed shim left {} thing(s) after StopPodSandbox + RemovePodSandbox:\n  {}",
                left.len(),
                left.join("\n  ")
            );
            eprintln!(
                "[runc{what}] CreatedAt (ListPodSandbox, PodSandboxStatus) before the crash {:?}, after {:?}",
                c.created_before, c.created_after
            );
            clean_runc_leftovers(&c.ids, &c.pids);
            let _ = std::fs::remove_file(&c.socket);
            if c.removed.is_err() {
                c.removed = remove_pod(&c.ids[0]).await;
            }
            if let Some(p) = &c.parent {
                runc_parent_left = pod_cgroups_left(p);
                eprintln!("[runc{what}] the pod cgroup /{p} is left in {runc_parent_left:?}");
                remove_pod_cgroups(p);
            }
            assert!(c.removed.is_ok(), "[runc{what}] {:?}", c.removed);
            all_ids.extend(c.ids.clone());
        }
        Err(e) => panic!("[runc{what}] {e}"),
    }

    let ours = ours.unwrap_or_else(|e| panic!("{e}\n{}", log_lines("crash", 20)));
    all_ids.extend(ours.ids.clone());
    assert!(ours.removed.is_ok(), "[rsandbox{what}] {:?}", ours.removed);
    eprintln!(
        "[rsandbox{what}] CreatedAt (ListPodSandbox, PodSandboxStatus) before the crash {:?}, after {:?}",
        ours.created_before, ours.created_after
    );
    let mut left = Vec::new();
    let clean = poll(HANG, || {
        left = leftovers(&ours.ids, &ours.pids, &ours.socket);
        left.is_empty().then_some(())
    });
    // The pod cgroup, a parent made for want of one, is the kubelet's and every other pod's
    // under it (issue 27 item 11): rsandbox leaves it, in the same hierarchies as runc.
    let parent_left = ours.parent.as_deref().map(pod_cgroups_left);
    if let Some(p) = &ours.parent {
        eprintln!("[rsandbox{what}] the pod cgroup /{p} is left in {parent_left:?}");
        remove_pod_cgroups(p);
    }
    assert!(
        clean.is_some(),
        "[rsandbox{what}] a SIGKILLed shim left:\n  {}",
        left.join("\n  ")
    );
    if let Some(ours_left) = parent_left {
        assert_eq!(
            ours_left, runc_parent_left,
            "[rsandbox{what}] the pod cgroup is not left where the runc path leaves it"
        );
    }
    eprintln!("[rsandbox{what}] a SIGKILLed shim left nothing of its own");
    // containerd 2.1.9 keeps the pod's CreatedAt in its own store for ListPodSandbox; its
    // PodSandboxStatus asks the sandbox controller, which answers for a dead shim with a zero
    // time (plugins/sandbox/controller.go:290) that its `== 0` fallback misses
    // (internal/cri/server/sandbox_status.go:76): printed above, not the shim's to fix.
    assert_eq!(
        ours.created_after.0, ours.created_before.0,
        "[rsandbox{what}] ListPodSandbox CreatedAt changed by the crash"
    );
    g.assert_clean(&all_ids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_killed_shim_leaves_nothing_behind() {
    crash_both(false).await;
}

#[tokio::test]
async fn a_killed_shim_leaves_nothing_behind_under_a_cgroup_parent() {
    crash_both(true).await;
}

// --- issue 27 item 1: `delete` kills only what is the container's ------------------------

/// The mount points of every cgroup hierarchy (v1 and v2), from mountinfo.
fn cgroup_roots() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut roots: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mountpoint = pre.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(mountpoint))
        })
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Makes cgroup `dir` (v1 cpuset: with its parent's CPUs and memory nodes, which a process
/// needs to join it).
fn make_cgroup(dir: &Path) -> Result<(), String> {
    std::fs::create_dir(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    for f in ["cpuset.cpus", "cpuset.mems"] {
        if dir.join(f).exists()
            && let Some(v) = dir
                .parent()
                .and_then(|p| std::fs::read_to_string(p.join(f)).ok())
        {
            let _ = std::fs::write(dir.join(f), v.trim());
        }
    }
    Ok(())
}

/// The pid `ctr task ls` shows for task `id` in `ns`.
fn task_pid(ns: &str, id: &str) -> Option<u32> {
    ctr(ns, &["task", "ls"])
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
}

/// What a crashed task shim with a shared cgroup left (see the test below).
struct SharedCrash {
    container_died: bool,
    foreign_alive: bool,
    foreign_cgroups_gone: Vec<PathBuf>,
}

impl SharedCrash {
    /// What the crash and `delete` left: whether the container `pid` died (within HANG), whether
    /// the foreign process `foreign_pid` lives, and which of `foreign`'s cgroups are gone.
    fn observe(pid: u32, foreign_pid: u32, foreign: &Foreign) -> SharedCrash {
        let container_died = poll(HANG, || (!alive(pid)).then_some(())).is_some();
        SharedCrash {
            container_died,
            foreign_alive: alive(foreign_pid),
            foreign_cgroups_gone: foreign
                .dirs
                .iter()
                .filter(|d| !d.exists())
                .cloned()
                .collect(),
        }
    }
}

/// A cgroup `shared` that exists before the container is created, in every hierarchy (as
/// `/system.slice` does), and later another process in a child cgroup `foreign` of it: killed
/// and its cgroups removed on drop (also when the test fails).
struct Foreign {
    child: Option<std::process::Child>,
    /// `<root>/<shared>/foreign` in each hierarchy.
    dirs: Vec<PathBuf>,
}

impl Foreign {
    /// Makes `shared` in every hierarchy (empty: runc cannot set up v1 `devices` in a cgroup
    /// that has children already, EINVAL).
    fn prepare(shared: &str) -> Result<Foreign, String> {
        let mut f = Foreign {
            child: None,
            dirs: Vec::new(),
        };
        for root in cgroup_roots() {
            let d = root.join(shared).join("foreign");
            f.dirs.push(d.clone());
            make_cgroup(d.parent().unwrap())?;
        }
        ensure!(!f.dirs.is_empty(), "no cgroup hierarchy");
        Ok(f)
    }

    /// The other process, in `<shared>/foreign` in every hierarchy.
    fn start(&mut self) -> Result<u32, String> {
        let child = std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn sleep: {e}"))?;
        let pid = child.id();
        self.child = Some(child);
        for d in &self.dirs {
            make_cgroup(d)?;
            std::fs::write(d.join("cgroup.procs"), pid.to_string())
                .map_err(|e| format!("move the foreign sleep into {}: {e}", d.display()))?;
        }
        Ok(pid)
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        for d in &self.dirs {
            for dir in [d.as_path(), d.parent().unwrap()] {
                let _ = poll(Duration::from_secs(5), || {
                    std::fs::remove_dir(dir)
                        .ok()
                        .or((!dir.exists()).then_some(()))
                });
            }
        }
    }
}

/// A `ctr run` task `cid` on `runtime` whose `cgroupsPath` names `shared` (a cgroup that
/// exists before the task is created and later also holds another process, in a child cgroup
/// in every hierarchy), its shim SIGKILLed, containerd's `delete` run for it (the task bundle
/// is then gone).
fn crash_in_shared_cgroup(runtime: &str, shared: &str, cid: &str) -> Result<SharedCrash, String> {
    // Dropped after the container is gone: its cgroups can then be removed.
    let mut foreign = Foreign::prepare(shared)?;
    let _objs = CtrObjects {
        ns: "default",
        ids: vec![cid.to_string()],
    };
    let cgroups_path = format!("/{shared}");
    let run = ctr(
        "default",
        &[
            "run",
            "-d",
            "--runtime",
            runtime,
            "--cgroup",
            &cgroups_path,
            BUSYBOX,
            cid,
            "sleep",
            "3600",
        ],
    );
    ensure!(
        run.ok(),
        "{runtime}: ctr run --cgroup {cgroups_path}: {run:?}"
    );
    // The other process's cgroup is made once the container runs: runc cannot set up v1
    // `devices` in a cgroup that has children already (EINVAL).
    let foreign_pid = foreign.start()?;
    let pid = task_pid("default", cid).ok_or(format!("{runtime}: no pid for {cid}"))?;
    let handler = if runtime == RUNTIME { HANDLER } else { "runc" };
    let shim = shim_of(handler, cid).ok_or(format!("{runtime}: no shim for {cid}"))?;
    sigkill_shim(shim)?;
    // containerd runs the shim's `delete` when it sees the connection close, and removes the
    // bundle once that has returned.
    let bundle = prefix()
        .join("run/containerd/io.containerd.runtime.v2.task/default")
        .join(cid);
    ensure!(
        poll(HANG, || (!bundle.exists()).then_some(())).is_some(),
        "{runtime}: the bundle {} stayed after the shim's death",
        bundle.display()
    );
    Ok(SharedCrash::observe(pid, foreign_pid, &foreign))
}

/// Issue 27 item 1, issue 33 item 2: a task created through the Task API whose `cgroupsPath`
/// names a cgroup shared with others, with the task's ID the cgroup's name (task
/// `system.slice` with cgroupsPath `/system.slice`: the cgroup exists before the task, and
/// here holds another process in a child cgroup), its shim SIGKILLed, containerd's `delete`:
/// the container dies, the other process lives on and keeps its cgroup. `runc delete --force`
/// kills only the container's own processes; `delete` kills in and removes only cgroups the
/// container's runc made, as recorded before its `runc create` (a rule by name took this one
/// for the container's own and killed the other process). The runc shim in the same test
/// shows the same.
#[test]
fn delete_after_a_crash_leaves_a_shared_cgroup_s_other_processes_alone() {
    let g = Guard::new();
    let mut failures = Vec::new();
    let mut ids = Vec::new();
    for (runtime, short) in [(RUNTIME, "rsandbox"), ("io.containerd.runc.v2", "runc")] {
        let shared = unique_id(&format!("shared-cg-{short}"));
        // The task is named as the shared cgroup is (`system.slice` in `/system.slice`).
        let cid = shared.clone();
        ids.push(cid.clone());
        let r = crash_in_shared_cgroup(runtime, &shared, &cid);
        if short == "runc" {
            // containerd's runc shim leaves its socket when it is killed (see above): its own.
            let socket = rsandbox_integration::shim_socket("default", &cid);
            if socket.exists() {
                eprintln!("[{runtime}] left its socket {}", socket.display());
                let _ = std::fs::remove_file(socket);
            }
        }
        match r {
            Ok(c) => {
                eprintln!(
                    "[{runtime}] container died: {}, foreign process alive: {}, its cgroups removed: {:?}",
                    c.container_died, c.foreign_alive, c.foreign_cgroups_gone
                );
                if !c.container_died {
                    failures.push(format!("{runtime}: the container still runs after delete"));
                }
                if !c.foreign_alive {
                    failures.push(format!(
                        "{runtime}: delete killed a process of the shared cgroup that is not the container's"
                    ));
                }
                if !c.foreign_cgroups_gone.is_empty() {
                    failures.push(format!(
                        "{runtime}: delete removed cgroups that are not the container's: {:?}",
                        c.foreign_cgroups_gone
                    ));
                }
            }
            // containerd gives a shim's `delete` 5 s and kills it then, keeping the bundle and
            // runc's state. With runc 1.3 the runc shim's delete of this task runs out of that
            // time every run here (runc 1.1's does not); runc's `delete --force` polls up to
            // 10 s for the killed init to be gone (its killContainer). That is the runc path's
            // own behaviour, not what this test compares: it is said, the runc path is not
            // compared this run, and what it left is taken down, not counted as ours.
            Err(e) if short == "runc" && runc_delete_was_killed(&cid) => {
                eprintln!(
                    "known runc-path behaviour (not a failure): containerd killed the runc \
                     shim's delete at its 5 s timeout; no comparison this run ({e})"
                );
                ids.retain(|i| i != &cid);
                let left = g.leftovers(std::slice::from_ref(&cid));
                eprintln!("known runc-path leftovers (not a failure), taken down: {left:?}");
                clean_killed_runc_task(&cid);
            }
            Err(e) => failures.push(format!("{runtime}: {e}\n{}", log_lines(&cid, 20))),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    g.assert_clean(&ids);
}

/// Issue 33 item 2, the pod path: a member container of an rsandbox pod (sandbox API, `ctr
/// run --sandbox`) named as a cgroup that exists before it and later holds another process
/// (`system.slice` in `/system.slice`), the pod's shim SIGKILLed. containerd runs `delete` for
/// the sandbox's bundle, which takes the member down from the sandbox record; the record lists
/// it with what its create found, so the other process and its cgroups are left alone. (No runc
/// counterpart: containerd's podsandbox path takes no member through the sandbox API; the
/// task path above shows the runc shim beside ours.)
#[tokio::test]
async fn delete_of_a_crashed_pod_leaves_a_member_s_shared_cgroup_alone() {
    use rsandbox_integration::controller::*;
    let g = Guard::new();
    let pod = unique_id("shared-pod");
    let shared = unique_id("shared-cg-member");
    let mut c = controller().await;
    // `ctr run --sandbox` finds the sandbox in containerd's store, which the controller API
    // alone does not write.
    store_record(&pod).await;
    let res: Result<SharedCrash, String> = async {
        let mut foreign = Foreign::prepare(&shared)?;
        let _objs = CtrObjects {
            ns: "default",
            ids: vec![shared.clone()],
        };
        // No netns given: the shim makes the pod's and runs the CNI chain itself.
        create_and_start(&mut c, &pod, "").await?;
        let cgroups_path = format!("/{shared}");
        let run = ctr(
            "default",
            &[
                "run",
                "-d",
                "--sandbox",
                &pod,
                "--runtime",
                RUNTIME,
                "--cgroup",
                &cgroups_path,
                BUSYBOX,
                &shared,
                "sleep",
                "3600",
            ],
        );
        ensure!(
            run.ok(),
            "ctr run --sandbox {pod} --cgroup {cgroups_path}: {run:?}"
        );
        let foreign_pid = foreign.start()?;
        let pid = task_pid("default", &shared).ok_or(format!("no pid for {shared}"))?;
        let shim = shim_of(HANDLER, &pod).ok_or(format!("no shim for {pod}"))?;
        sigkill_shim(shim)?;
        // containerd runs `delete` for the sandbox's bundle once it sees the connection close
        // (the member's task shares it: its bundle waits for the task's own removal), and
        // removes the bundle once that has returned: the member is taken down from the pod's
        // record.
        let bundle = prefix()
            .join("run/containerd/io.containerd.runtime.v2.task/default")
            .join(&pod);
        ensure!(
            poll(HANG, || (!bundle.exists()).then_some(())).is_some(),
            "the bundle {} stayed after the shim's death",
            bundle.display()
        );
        Ok(SharedCrash::observe(pid, foreign_pid, &foreign))
    }
    .await;
    // containerd's sandbox object (the shim is gone: errors here are expected and not ours).
    let _ = stop_and_shutdown(&mut c, &pod).await;
    drop_store_record(&pod).await;
    // containerd 2.1.9 runs no `delete` for the bundle of a task that shared the dead
    // sandbox's shim (only the sandbox's connection closes): that bundle stays until
    // containerd restarts and cleans up dead shims. containerd's, not the shim's: taken down.
    let member_bundle = prefix()
        .join("run/containerd/io.containerd.runtime.v2.task/default")
        .join(&shared);
    if member_bundle.exists() {
        eprintln!(
            "known containerd behaviour (not a failure), taken down: {}",
            member_bundle.display()
        );
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(member_bundle.join("rootfs"))
            .output();
        let _ = std::fs::remove_dir_all(&member_bundle);
    }
    let c = res.unwrap_or_else(|e| panic!("{e}\n{}", log_lines(&pod, 30)));
    eprintln!(
        "container died: {}, foreign process alive: {}, its cgroups removed: {:?}",
        c.container_died, c.foreign_alive, c.foreign_cgroups_gone
    );
    assert!(c.container_died, "the member still runs after delete");
    assert!(
        c.foreign_alive,
        "delete killed a process of the shared cgroup that is not the container's"
    );
    assert!(
        c.foreign_cgroups_gone.is_empty(),
        "delete removed cgroups that are not the container's: {:?}",
        c.foreign_cgroups_gone
    );
    g.assert_clean(&[pod, shared]);
}

/// Takes down a `ctr run` task of the runc handler whose dead shim's `delete` containerd
/// killed (the test made it): its runc state, the bundle's rootfs mount and the bundle, then
/// containerd's task and container objects.
fn clean_killed_runc_task(cid: &str) {
    // containerd's runc shim keeps the `default` namespace's tasks under this root
    let root = Path::new("/run/containerd/runc/default");
    let _ = std::process::Command::new(prefix().join("usr/bin/runc"))
        .arg("--root")
        .arg(root)
        .args(["delete", "--force", cid])
        .output();
    let _ = std::fs::remove_dir_all(root.join(cid));
    clean_runc_leftovers(&[cid.to_string()], &[]);
    let bundle = prefix()
        .join("run/containerd/io.containerd.runtime.v2.task/default")
        .join(cid);
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(bundle.join("rootfs"))
        .output();
    let _ = std::fs::remove_dir_all(&bundle);
    ctr_force_remove("default", &[cid.to_string()]);
}

/// Whether containerd's log says it killed the dead runc shim's `delete` of `cid` (its
/// `io.containerd.timeout.shim.cleanup`, 5 s).
fn runc_delete_was_killed(cid: &str) -> bool {
    log_lines(cid, 50).lines().any(|l| {
        l.contains("failed to delete dead shim")
            && l.contains("containerd-shim-runc-v2")
            && l.contains("signal: killed")
    })
}

// --- issue 27 item 3: `delete` ends by its deadline, the network gone ----------------------

/// Live processes whose command line is one of `cmdlines` (words joined by blanks).
fn processes_running(cmdlines: &[&str]) -> Vec<(i32, String)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            let cmd = cmd.trim_end().to_string();
            (cmdlines.contains(&cmd.as_str()) && alive(pid as u32)).then_some((pid, cmd))
        })
        .collect()
}

/// `containerd-shim-rsandbox-v1 ... -id ID -bundle BUNDLE delete` as containerd runs it (in
/// the bundle, stdin empty): its output and how long it took.
fn shim_delete(id: &str, bundle: &Path) -> (std::process::Output, Duration) {
    let start = std::time::Instant::now();
    let out = std::process::Command::new(prefix().join("usr/bin").join(SHIM))
        .args(["-namespace", "default", "-address"])
        .arg(address())
        .arg("-publish-binary")
        .arg(prefix().join("usr/bin/containerd"))
        .args(["-id", id, "-bundle"])
        .arg(bundle)
        .arg("delete")
        .current_dir(bundle)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (out, start.elapsed())
}

/// Writes an executable shell script `path` with `body`.
fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Issue 27 item 3, the reviewer's probe: a pod with the shim's own network (bridge + IP
/// lease + netns, the bench's `rsandbox-shim` conflist), its shim hung (SIGSTOP), its record
/// given 8 members whose `runc delete` hangs and a CNI plugin whose DEL hangs (appended to
/// the conflist the record names, so it is DELed first). Then `delete` as containerd runs it
/// (`containerd-shim-rsandbox-v1 -namespace ... -id ... -bundle ... delete`, in the bundle):
/// it must end before containerd's 5 s, having killed the hung daemon and the pause, told
/// each member and the plugin in its stderr, and taken the network down (veth, IP lease,
/// netns). Before: 6.2 s, and the veth and lease stayed (DEL stopped at the hung plugin).
/// The measured time is printed; the bound asserted is the product's (4.5 s: the budget of
/// 4 s plus the process's start and end), plus what a `delete` with nothing to do takes on
/// the machine then (milliseconds when idle; more on a starved one), never past 5 s.
#[tokio::test]
async fn delete_ends_by_its_deadline_with_the_network_gone() {
    use rsandbox_integration::controller::{controller, create_and_start, stop_and_shutdown};
    let g = Guard::new();
    let id = unique_id("deadline");
    let dir = scratch_dir(&id);
    let veths_before = bridge_ports();
    let mut c = controller().await;
    let pause = create_and_start(&mut c, &id, "")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", log_lines(&id, 20)));
    let bundle = prefix()
        .join("run/containerd/io.containerd.sandbox.controller.v1.shim/default")
        .join(&id);
    let record_file = bundle.join("rsandbox-sandbox.json");
    let daemon = shim_daemons_for(&id)
        .first()
        .map(|p| p.pid)
        .expect("the pod's shim daemon");
    // Hung: containerd does not see it die and runs no `delete` of its own meanwhile.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_file).unwrap()).unwrap();
    let net = record["network"].clone();
    assert!(net.is_object(), "no shim-owned network: {record}");
    let netns = PathBuf::from(net["netns"].as_str().unwrap());
    let ip = net["ips"][0]
        .as_str()
        .and_then(|a| a.split('/').next())
        .expect("the pod's IP")
        .to_string();
    let lease = prefix()
        .join("var/lib/cni/networks/rsandbox-shim")
        .join(&ip);
    assert!(lease.exists() && netns.exists(), "{lease:?} {netns:?}");
    // The hung runc of 8 members, and a plugin whose DEL hangs after the bench's conflist.
    let (bin, conf, runc_root) = (dir.join("bin"), dir.join("conf"), dir.join("runc-root"));
    for d in [&bin, &conf, &runc_root] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Distinct command lines: the test looks for them after `delete`.
    let (runc_sleep, plugin_sleep) = ("sleep 6001", "sleep 6002");
    script(&bin.join("runc"), &format!("exec {runc_sleep}"));
    script(
        &bin.join("hang"),
        &format!("[ \"$CNI_COMMAND\" = DEL ] && exec {plugin_sleep}\nexit 0"),
    );
    let orig_conf = PathBuf::from(net["conf_dir"].as_str().unwrap());
    let conflist = std::fs::read_dir(&orig_conf)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conflist"))
        .min()
        .expect("the bench's conflist");
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    list["plugins"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "hang"}));
    std::fs::write(conf.join(conflist.file_name().unwrap()), list.to_string()).unwrap();
    record["network"]["conf_dir"] = conf.display().to_string().into();
    record["network"]["bin_dirs"]
        .as_array_mut()
        .unwrap()
        .insert(0, bin.display().to_string().into());
    let members: Vec<String> = (0..8).map(|i| format!("{id}-m{i}")).collect();
    for m in &members {
        record["members"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "id": m,
                "bundle": null,
                "runc": {
                    "binary": bin.join("runc").display().to_string(),
                    "root": runc_root.display().to_string(),
                    "systemd_cgroup": false
                },
                "cgroups_path": null
            }));
    }
    std::fs::write(&record_file, record.to_string()).unwrap();

    // What starting and ending `delete` costs on this machine now, from a `delete` with
    // nothing to do (an empty bundle), before and after: a busy machine's share, not the
    // product's, of the time measured.
    let empty_bundle = dir.join("empty-bundle");
    std::fs::create_dir_all(&empty_bundle).unwrap();
    let idle_before = shim_delete(&format!("{id}-nothing"), &empty_bundle).1;
    let (out, took) = shim_delete(&id, &bundle);
    let idle_after = shim_delete(&format!("{id}-nothing"), &empty_bundle).1;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "delete took {took:?} (one with nothing to do: {idle_before:?} before, {idle_after:?} \
         after); its stderr:\n{stderr}"
    );
    let veths_after = bridge_ports();
    // The hung helpers were killed (each at its timeout; `delete` may end before their exits
    // are seen).
    let mut helpers_left = Vec::new();
    let _ = poll(Duration::from_secs(5), || {
        helpers_left = processes_running(&[runc_sleep, plugin_sleep]);
        helpers_left.is_empty().then_some(())
    });
    for (pid, _) in &helpers_left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let pause_alive = alive(pause);
    let daemon_alive = alive(daemon as u32);
    if daemon_alive {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(daemon),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let errs = stop_and_shutdown(&mut c, &id).await;
    eprintln!("Controller Stop/Shutdown after the dead shim: {errs:?}");

    assert!(out.status.success(), "delete failed: {:?}", out.status);
    assert!(!out.stdout.is_empty(), "no DeleteResponse on stdout");
    assert!(!daemon_alive, "the hung daemon was left");
    assert!(
        helpers_left.is_empty(),
        "hung helpers left running: {helpers_left:?}"
    );
    assert!(!pause_alive, "the pause process was left");
    for m in &members {
        assert!(
            stderr.contains(&format!("container {m}")),
            "{m} not reported:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("\"hang\""),
        "the hung plugin not reported:\n{stderr}"
    );
    // CNI DEL went on past the hung plugin: the bridge's veth and the IP lease are gone, and
    // so is the netns.
    let new_veths: Vec<_> = veths_after.difference(&veths_before).collect();
    assert!(new_veths.is_empty(), "veth left: {new_veths:?}");
    assert!(!lease.exists(), "IP lease {} left", lease.display());
    assert!(!netns.exists(), "netns {} left", netns.display());
    // The product's bound: its budget (4 s) and 0.5 s for the process's start and end, as
    // long as those take milliseconds; on a starved machine, what they took there, up to the
    // rest of containerd's 5 s (past them containerd would have killed it).
    let bound =
        Duration::from_millis(4500) + idle_before.max(idle_after).min(Duration::from_millis(500));
    assert!(
        took < bound,
        "delete took {took:?} (bound {bound:?}; one with nothing to do took {idle_before:?} \
         before, {idle_after:?} after): containerd kills it at 5 s"
    );
    g.assert_clean(std::slice::from_ref(&id));
    let _ = std::fs::remove_dir_all(&dir);
}
