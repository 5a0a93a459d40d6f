//! The systemd cgroup driver, end to end, on both CRI handlers (`runc` with `SystemdCgroup =
//! true`, and `rsandbox`): a pod whose cgroup_parent is a kubelet-style pod slice
//! (`kubepods-besteffort-pod<uid>.slice`, a transient unit under `kubepods-besteffort.slice`
//! under `kubepods.slice`), two containers, where the pause and each container live (units
//! `cri-containerd-<id>.scope` of the pod slice), a memory limit on a container's scope,
//! ContainerStats and PodSandboxStats, an OOM kill, UpdateContainerResources, pause/resume
//! and the SIGKILL of a paused task, teardown leaving no unit and no cgroup, and a SIGKILLed
//! shim followed by StopPodSandbox/RemovePodSandbox. The runc handler runs first and the
//! rsandbox handler must show the same layout and outcomes.
//!
//! Needs systemd as PID 1 on cgroup v2 (`hack/guest.sh --systemd` boots such a guest and runs
//! this binary there); anywhere else every test says so and passes without doing anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{self, Pods, container_config};
use rsandbox_integration::*;

type R<T = ()> = Result<T, String>;

const HANDLERS: [&str; 2] = [RUNC_HANDLER, HANDLER];
const CG: &str = "/sys/fs/cgroup";
/// The QoS slice the kubelet puts BestEffort pods in (it creates it, and `kubepods.slice`,
/// when it starts).
const QOS_SLICE: &str = "kubepods-besteffort.slice";
/// Properties that say where a scope lives and how it was made: runc's systemd driver sets
/// `Delegate`, the four accountings and `DefaultDependencies=no` on every scope it starts.
const SCOPE_PROPS: &str = "Id,Slice,ControlGroup,ActiveState,Delegate,DefaultDependencies,\
                           MemoryAccounting,CPUAccounting,IOAccounting,TasksAccounting,CPUWeight";

/// Why this binary cannot test anything here, if it cannot: systemd must be PID 1 (as the
/// kubelet's systemd driver wants) and `/sys/fs/cgroup` the unified hierarchy, or the v1
/// hybrid layout (`name=systemd` at `/sys/fs/cgroup/systemd`: hack/node.sh's node).
fn not_a_systemd_node() -> Option<String> {
    if !Path::new("/run/systemd/system").is_dir() {
        return Some("systemd is not PID 1 (no /run/systemd/system)".into());
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = |dir: &str, fstype: &str| {
        mountinfo
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(dir) && l.contains(fstype))
    };
    let unified = mounted(CG, " - cgroup2 ");
    let hybrid = mounted("/sys/fs/cgroup/systemd", " - cgroup ");
    (!unified && !hybrid).then(|| format!("{CG} is neither cgroup2 nor v1 with name=systemd"))
}

/// Skips the calling test (with the reason on stderr) unless this is a systemd node.
macro_rules! systemd_node_or_skip {
    () => {
        if let Some(why) = not_a_systemd_node() {
            eprintln!("SKIPPED: {why}; hack/node.sh run-tests (v1) and hack/guest.sh --systemd (v2) run these tests");
            return;
        }
    };
}

fn run(prog: &str, args: &[&str]) -> Out {
    let mut c = Command::new(prog);
    c.args(args);
    run_timeout(c, None, Duration::from_secs(120))
}

/// `systemctl show -p <props> <unit>` as a map.
fn show(unit: &str, props: &str) -> R<BTreeMap<String, String>> {
    let o = run("systemctl", &["show", "-p", props, "--", unit]);
    if !o.ok() {
        return Err(format!("systemctl show {unit}: {o:?}"));
    }
    Ok(o.stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn load_state(unit: &str) -> R<String> {
    Ok(show(unit, "LoadState")?
        .remove("LoadState")
        .unwrap_or_default())
}

/// The cgroup path systemd gives slice `name`: `a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`.
fn slice_path(name: &str) -> String {
    let stem = name.trim_end_matches(".slice");
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push_str(&format!("/{prefix}.slice"));
    }
    path
}

fn cgroup_dir(rel: &str) -> PathBuf {
    Path::new(CG).join(rel.trim_start_matches('/'))
}

/// The unified-hierarchy cgroup of `pid`.
fn cgroup_of(pid: u32) -> R<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| e.to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(String::from)
        .ok_or_else(|| format!("/proc/{pid}/cgroup: {s}"))
}

fn read(p: &Path) -> R<String> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Cgroup directories strictly below `dir`.
fn cgroups_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(e.path());
                todo.push(e.path());
            }
        }
    }
    out
}

/// Starts the transient slice `name` the way the kubelet's systemd cgroup manager does (runc's
/// libcontainer systemd manager, `Apply(-1)`): StartTransientUnit on the system bus with a
/// description, `Wants=` its parent slice, the four accountings and `DefaultDependencies=no`;
/// then waits until the unit is active. A slice that is already active is left as it is.
fn start_slice(name: &str, parent: &str) -> R {
    if show(name, "ActiveState")?
        .get("ActiveState")
        .map(String::as_str)
        == Some("active")
    {
        return Ok(());
    }
    let desc = format!("libcontainer container {name}");
    let o = run(
        "busctl",
        &[
            "call",
            // positional arguments from here on: "-.slice" is no option
            "--",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            name,
            "replace",
            "7",
            "Description",
            "s",
            &desc,
            "Wants",
            "as",
            "1",
            parent,
            "MemoryAccounting",
            "b",
            "true",
            "CPUAccounting",
            "b",
            "true",
            "IOAccounting",
            "b",
            "true",
            "TasksAccounting",
            "b",
            "true",
            "DefaultDependencies",
            "b",
            "false",
            "0",
        ],
    );
    ensure!(o.ok(), "StartTransientUnit {name}: {o:?}");
    let active = poll(Duration::from_secs(60), || {
        let s = show(name, "ActiveState").ok()?;
        (s.get("ActiveState").map(String::as_str) == Some("active")).then_some(())
    });
    ensure!(
        active.is_some(),
        "slice {name} not active: {:?}",
        show(name, "ActiveState,LoadState")
    );
    Ok(())
}

/// A kubelet-style pod slice for one pod, stopped (as the kubelet's pod cgroup manager does
/// when the pod is gone) on drop.
struct PodSlice {
    name: String,
}

impl PodSlice {
    fn create(pod_uid: &str) -> R<PodSlice> {
        start_slice("kubepods.slice", "-.slice")?;
        start_slice(QOS_SLICE, "kubepods.slice")?;
        // the kubelet escapes the pod UID's dashes (systemd's slice separator)
        let name = format!("kubepods-besteffort-pod{}.slice", pod_uid.replace('-', "_"));
        start_slice(&name, QOS_SLICE)?;
        Ok(PodSlice { name })
    }

    fn dir(&self) -> PathBuf {
        cgroup_dir(&slice_path(&self.name))
    }

    /// Stops the slice (and whatever still runs in it); fails if it is still active or its
    /// cgroup still there afterwards. (A slice loads without a unit file: `LoadState` stays
    /// `loaded` for any slice name systemctl asks about, so that says nothing.)
    fn stop(&self) -> R {
        let o = run("systemctl", &["stop", "--", &self.name]);
        ensure!(o.ok(), "systemctl stop {}: {o:?}", self.name);
        let gone = poll(HANG, || {
            let state = show(&self.name, "ActiveState")
                .ok()?
                .remove("ActiveState")?;
            (state == "inactive" && !self.dir().exists()).then_some(())
        });
        ensure!(
            gone.is_some(),
            "pod slice {} left after stop: {:?}, dir exists {}",
            self.name,
            show(&self.name, "ActiveState,SubState"),
            self.dir().exists()
        );
        Ok(())
    }
}

impl Drop for PodSlice {
    fn drop(&mut self) {
        let _ = run("systemctl", &["stop", "--", &self.name]);
    }
}

fn scope_of(id: &str) -> String {
    format!("cri-containerd-{id}.scope")
}

/// What one handler showed, with the IDs replaced by their roles, for the comparison of the
/// two handlers.
#[derive(Debug, PartialEq)]
struct Seen {
    /// role -> the scope unit's properties (`SCOPE_PROPS`, plus MemoryMax for c1)
    scopes: BTreeMap<String, BTreeMap<String, String>>,
    /// PodSandboxStats: Ok(number of containers listed) or the error
    pod_stats: Result<usize, String>,
}

/// Replaces every ID in `s` by its role.
fn normalize(s: &str, roles: &[(String, &str)]) -> String {
    let mut s = s.to_string();
    for (id, role) in roles {
        s = s.replace(id.as_str(), role);
    }
    s
}

/// Checks that `pid` lives in the scope `cri-containerd-<id>.scope` of `slice`, that the scope
/// unit exists there with runc's properties; returns those properties, normalized.
fn check_scope(
    what: &str,
    pid: u32,
    id: &str,
    slice: &PodSlice,
    extra: &str,
    roles: &[(String, &str)],
) -> R<BTreeMap<String, String>> {
    let unit = scope_of(id);
    let want = format!("{}/{unit}", slice_path(&slice.name));
    let cg = cgroup_of(pid)?;
    ensure!(cg == want, "{what} ({pid}) in cgroup {cg}, want {want}");
    let props = show(&unit, &format!("{SCOPE_PROPS}{extra}"))?;
    let p = |k: &str| props.get(k).map(String::as_str).unwrap_or("");
    ensure!(p("Id") == unit, "{what}: unit {props:?}");
    ensure!(p("Slice") == slice.name, "{what}: scope's slice {props:?}");
    ensure!(
        p("ControlGroup") == want,
        "{what}: scope's cgroup {props:?}"
    );
    ensure!(p("ActiveState") == "active", "{what}: scope {props:?}");
    ensure!(
        p("Delegate") == "yes",
        "{what}: scope not delegated {props:?}"
    );
    Ok(props
        .into_iter()
        .map(|(k, v)| (k, normalize(&v, roles)))
        .collect())
}

/// Polls until the scope unit of `id` is unloaded and its cgroup gone.
fn scope_gone(id: &str, slice: &PodSlice) -> R {
    let unit = scope_of(id);
    let dir = slice.dir().join(&unit);
    let gone = poll(HANG, || {
        (load_state(&unit).ok()? == "not-found" && !dir.exists()).then_some(())
    });
    ensure!(
        gone.is_some(),
        "{unit} left: {:?}, cgroup {} exists {}",
        show(&unit, "LoadState,ActiveState,SubState"),
        dir.display(),
        dir.exists()
    );
    Ok(())
}

fn ctr_k8s(args: &[&str]) -> Out {
    ctr("k8s.io", args)
}

fn with_memory_limit(mut c: ContainerConfig, bytes: i64) -> ContainerConfig {
    let l = c.linux.get_or_insert_default();
    l.resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: bytes,
        ..Default::default()
    });
    c
}

/// The pod on one handler; `roles` collects ID -> role for [`normalize`].
async fn pod_on_slice(
    p: &mut Pods,
    cfg: PodSandboxConfig,
    slice: &PodSlice,
    roles: &mut Vec<(String, &'static str)>,
) -> R<Seen> {
    let mut seen = Seen {
        scopes: BTreeMap::new(),
        pod_stats: Ok(0),
    };
    let id = p.run(cfg.clone()).await?;
    roles.push((slice.name.clone(), "<pod slice>"));
    roles.push((id.clone(), "<pod>"));
    let pause = p.pause_pid(&id).await?;
    let c1 = p
        .start(
            &id,
            &cfg,
            with_memory_limit(container_config("c1", &["sleep", "300"]), 64 << 20),
        )
        .await?;
    roles.push((c1.clone(), "<c1>"));
    let c2 = p
        .start(&id, &cfg, container_config("c2", &["sleep", "300"]))
        .await?;
    roles.push((c2.clone(), "<c2>"));

    // where everything lives: each in its scope of the pod slice, nothing in the slice itself
    let props = check_scope("pause", pause, &id, slice, "", roles)?;
    seen.scopes.insert("pause".into(), props);
    for (role, c, extra) in [("c1", &c1, ",MemoryMax"), ("c2", &c2, "")] {
        let pid = p.container_pid(c).await?;
        let props = check_scope(role, pid, c, slice, extra, roles)?;
        seen.scopes.insert(role.into(), props);
    }
    let procs = read(&slice.dir().join("cgroup.procs"))?;
    ensure!(
        procs.is_empty(),
        "processes in the pod slice itself: {procs}"
    );

    // the memory limit, on the scope unit and in its cgroup
    let c1_dir = slice.dir().join(scope_of(&c1));
    let max = read(&c1_dir.join("memory.max"))?;
    ensure!(max == (64u64 << 20).to_string(), "c1 memory.max {max}");
    let unit_max = seen.scopes["c1"].get("MemoryMax").cloned();
    ensure!(
        unit_max == Some((64u64 << 20).to_string()),
        "c1 scope MemoryMax {unit_max:?}"
    );

    // ContainerStats (the shim's Task.Stats, read from the scope)
    p.container_stats_in_use(&c1).await?;
    // PodSandboxStats: containerd's CRI reads the pod's cgroup_parent itself; on 2.1.9 it
    // takes the slice name for a path and fails on the runc path too. Recorded and compared.
    seen.pod_stats =
        p.rt.pod_sandbox_stats(PodSandboxStatsRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map(|r| {
            r.into_inner()
                .stats
                .and_then(|s| s.linux)
                .map(|l| l.containers.len())
                .unwrap_or(0)
        })
        .map_err(|s| normalize(s.message(), roles));

    // UpdateContainerResources reaches the scope's cgroup
    p.update_memory_and_cpu(&c1).await?;
    let max = read(&c1_dir.join("memory.max"))?;
    ensure!(
        max == pods::UPDATED_MEMORY.to_string(),
        "c1 memory.max after update {max}"
    );
    let cpu = read(&c1_dir.join("cpu.max"))?;
    ensure!(
        cpu == pods::UPDATED_CPU_MAX,
        "c1 cpu.max after update {cpu:?}"
    );

    // pause/resume (containerd's task API on the CRI container), then SIGKILL while paused
    let c2_dir = slice.dir().join(scope_of(&c2));
    let freeze = || read(&c2_dir.join("cgroup.freeze"));
    let o = ctr_k8s(&["task", "pause", &c2]);
    ensure!(o.ok(), "ctr task pause c2: {o:?}");
    ensure!(freeze()? == "1", "c2 not frozen after pause");
    let o = ctr_k8s(&["task", "resume", &c2]);
    ensure!(o.ok(), "ctr task resume c2: {o:?}");
    ensure!(freeze()? == "0", "c2 frozen after resume");
    let o = ctr_k8s(&["task", "pause", &c2]);
    ensure!(o.ok(), "ctr task pause c2 again: {o:?}");
    let o = ctr_k8s(&["task", "kill", "-s", "SIGKILL", &c2]);
    ensure!(o.ok(), "ctr task kill c2: {o:?}");
    let s = p.wait_exited(&c2, Duration::from_secs(60)).await?;
    ensure!(s.exit_code == 137, "paused c2 after SIGKILL: {s:?}");
    scope_gone(&c2, slice)?;

    // an OOM kill in its scope: exit 137, reason OOMKilled (memory.events of the scope)
    let hog = container_config(
        "hog",
        &[
            "sh",
            "-c",
            "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived",
        ],
    );
    let h = p.start(&id, &cfg, with_memory_limit(hog, 20 << 20)).await?;
    let s = p.wait_exited(&h, Duration::from_secs(120)).await?;
    ensure!(s.exit_code == 137, "hog: {s:?}");
    if s.reason != "OOMKilled" {
        // The runc path loses the OOM event now and then here: systemd stops the scope of the
        // killed process and its cgroup (memory.events) goes with it before the event is read
        // (seen with runc 1.3 in the systemd guest): printed for it. rsandbox also looks
        // when it reaps the init, before it publishes the exit (cgroups::check_at_exit), so
        // on rsandbox it is asserted.
        ensure!(
            p.handler == RUNC_HANDLER,
            "hog's OOM kill without reason OOMKilled: {s:?}"
        );
        eprintln!(
            "known flake ({}): the OOM kill's reason is {:?}",
            p.handler, s.reason
        );
    }

    // teardown: no scope of the pod left, no cgroup below the pod slice
    p.stop(&id).await?;
    p.remove(&id).await?;
    for (c, _) in roles.iter().filter(|(_, r)| *r != "<pod slice>") {
        scope_gone(c, slice)?;
    }
    scope_gone(&h, slice)?;
    let below = cgroups_below(&slice.dir());
    ensure!(below.is_empty(), "cgroups left in the pod slice: {below:?}");
    Ok(seen)
}

/// Runs `body` once per CRI handler (runc first) on a fresh kubelet-style pod slice for a
/// pod named after `name`; then removes the pods (whatever happened), checks the leftovers,
/// that nothing is left in the pod slice, and stops the slice as the kubelet would (which
/// also ends whatever still runs in it). Returns each handler's result and every failure,
/// prefixed by the handler. With `runc_leaks` the runc handler's leftovers are printed, not
/// failures: what containerd's runc path is known to leave (see the caller).
async fn per_handler<T: std::fmt::Debug, F>(
    name: &str,
    runc_leaks: bool,
    body: F,
) -> (BTreeMap<&'static str, R<T>>, Vec<String>)
where
    F: AsyncFn(&mut Pods, PodSandboxConfig, &PodSlice) -> R<T>,
{
    let mut results = BTreeMap::new();
    let mut failures = Vec::new();
    for handler in HANDLERS {
        let g = Guard::new();
        let name = unique_id(&format!("{name}-{handler}"));
        let dir = scratch_dir(&name);
        let mut cfg = pods::pod_config(&name, &dir);
        let uid = cfg.metadata.as_ref().unwrap().uid.clone();
        let slice = match PodSlice::create(&uid) {
            Ok(s) => s,
            Err(e) => panic!("{handler}: the pod slice: {e}"),
        };
        cfg.linux.as_mut().unwrap().cgroup_parent = slice.name.clone();
        let mut p = Pods::new(handler).await;
        let res = body(&mut p, cfg, &slice).await;
        let errs = teardown(&mut p).await;
        let mut ids = p.all_ids();
        ids.push(name.clone());
        let mut leftovers = Vec::new();
        let clean = poll(HANG, || {
            leftovers = g.leftovers(&ids);
            leftovers.is_empty().then_some(())
        });
        let below = cgroups_below(&slice.dir());
        match &res {
            Err(e) => failures.push(format!(
                "{handler}: {e}\n--- containerd log ---\n{}",
                p.ids.first().map(|i| log_lines(i, 20)).unwrap_or_default()
            )),
            Ok(v) => eprintln!("{handler}: {v:?}"),
        }
        let mut left = Vec::new();
        if !errs.is_empty() {
            left.push(format!("{handler}: teardown: {errs:?}"));
        }
        if clean.is_none() {
            left.push(format!("{handler}: leftovers: {leftovers:?}"));
        }
        if !below.is_empty() {
            left.push(format!(
                "{handler}: cgroups left in the pod slice: {below:?}"
            ));
        }
        let tolerated = runc_leaks && handler == RUNC_HANDLER;
        if tolerated {
            for l in &left {
                eprintln!("known runc-path leftover (not a failure): {l}");
            }
        } else {
            failures.extend(left.iter().cloned());
        }
        if let Err(e) = slice.stop() {
            failures.push(format!("{handler}: {e}"));
        }
        if tolerated && !left.is_empty() {
            // the kubelet's clean-up: what ran in the pod slice ended with it; now the pod
            // must go through CRI and leave nothing
            let errs = teardown(&mut p).await;
            if !errs.is_empty() {
                failures.push(format!(
                    "{handler}: teardown after the slice stop: {errs:?}"
                ));
            }
            let mut leftovers = Vec::new();
            let clean = poll(HANG, || {
                leftovers = g.leftovers(&ids);
                leftovers.is_empty().then_some(())
            });
            // the dead shim's socket stays on the runc path (containerd-shim-runc-v2 never
            // removes it): known, and outside the pod slice
            leftovers.retain(|l| !l.starts_with("shim socket "));
            if clean.is_none() && !leftovers.is_empty() {
                failures.push(format!(
                    "{handler}: leftovers after the slice stop: {leftovers:?}"
                ));
            }
        }
        // a scope stopped with the slice may stay "failed" (a unit): forget it, as the
        // kubelet's node would not care either
        for id in &ids {
            let _ = run("systemctl", &["reset-failed", "--", &scope_of(id)]);
        }
        results.insert(handler, res);
        let _ = std::fs::remove_dir_all(&dir);
    }
    (results, failures)
}

/// Stops and removes every pod of `p` that is still there (a test body may have removed its
/// pod already: NotFound is no error here). Returns the errors.
async fn teardown(p: &mut Pods) -> Vec<String> {
    let mut errs = Vec::new();
    for id in p.ids.clone() {
        let stop =
            p.rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let remove =
            p.rt.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        for (what, r) in [
            ("StopPodSandbox", stop.map(drop)),
            ("RemovePodSandbox", remove.map(drop)),
        ] {
            if let Err(s) = r
                && s.code() != tonic::Code::NotFound
            {
                errs.push(format!("{what} {id}: {}", s.message()));
            }
        }
    }
    errs
}

/// One pod per handler on a kubelet-style pod slice: layout, limits, stats, Update,
/// pause/resume/kill, OOM, teardown; then the rsandbox handler's view compared with runc's.
#[tokio::test]
async fn pod_on_a_systemd_slice_as_on_runc() {
    systemd_node_or_skip!();
    let (seen, mut failures) = per_handler("sdpod", false, async |p, cfg, slice| {
        let mut roles = Vec::new();
        pod_on_slice(p, cfg, slice, &mut roles).await
    })
    .await;
    if let (Some(Ok(runc)), Some(Ok(ours))) = (seen.get(RUNC_HANDLER), seen.get(HANDLER))
        && runc != ours
    {
        failures.push(format!(
            "rsandbox differs from runc:\n  runc:     {runc:?}\n  rsandbox: {ours:?}"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Processes whose command line names a containerd shim started with `-id <id>` (the runc
/// shim of a pod serves all its containers under the sandbox ID; ours is one per pod).
fn shims_of(id: &str) -> Vec<i32> {
    let want = format!(" -id {id} ");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = format!("{} ", String::from_utf8_lossy(&cmd).replace('\0', " "));
            (cmd.split(' ').next()?.contains("containerd-shim") && cmd.contains(&want))
                .then_some(pid)
        })
        .collect()
}

/// Polls (for `HANG` at most) until pod `id` and its container `c` are in the states `want`
/// (CRI's pod and container state numbers); returns what was seen last.
async fn states_until(p: &mut Pods, id: &str, c: &str, want: (i32, i32)) -> (R<i32>, R<i32>) {
    let deadline = std::time::Instant::now() + HANG;
    let mut seen = (Err(String::new()), Err(String::new()));
    while std::time::Instant::now() < deadline {
        seen = (
            p.status(id).await.map(|s| s.state),
            p.container_status(c).await.map(|s| s.state),
        );
        if seen == (Ok(want.0), Ok(want.1)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// A pod whose shim was SIGKILLed, then StopPodSandbox/RemovePodSandbox (containerd runs the
/// shim binary's `delete` for what the dead shim started). Returns what is left of the pod
/// (processes, scopes, cgroups) once containerd had `HANG` for it.
async fn killed_shim(p: &mut Pods, cfg: PodSandboxConfig, slice: &PodSlice) -> R<Vec<String>> {
    let id = p.run(cfg.clone()).await?;
    let pause = p.pause_pid(&id).await?;
    let c = p
        .start(&id, &cfg, container_config("c", &["sleep", "300"]))
        .await?;
    let pid = p.container_pid(&c).await?;
    let shims = shims_of(&id);
    ensure!(shims.len() == 1, "shims of {id}: {shims:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shims[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| format!("kill -9 shim {}: {e}", shims[0]))?;
    let dead = poll(HANG, || {
        (!Path::new(&format!("/proc/{}", shims[0])).exists()).then_some(())
    });
    ensure!(
        dead.is_some(),
        "shim {} still there after SIGKILL",
        shims[0]
    );
    let mut left = Vec::new();
    // containerd notices the closed connection (and runs `delete`) asynchronously: the pod
    // turns NOTREADY and the container EXITED once it has; a RemovePodSandbox before that
    // fails ("container is still running") on either handler, as a kubelet's would, which
    // retries it (until then a status call may fail with "ttrpc: closed").
    let (notready, exited) = (
        PodSandboxState::SandboxNotready as i32,
        ContainerState::ContainerExited as i32,
    );
    let seen = states_until(p, &id, &c, (notready, exited)).await;
    if seen != (Ok(notready), Ok(exited)) {
        left.push(format!(
            "pod and container states after the crash: {seen:?}"
        ));
    }
    // errors are recorded, not returned: what is left afterwards is the point
    if let Err(e) = p.stop(&id).await {
        left.push(e);
    }
    if let Err(e) = p.remove(&id).await {
        left.push(e);
    }
    for (what, pid, unit_id) in [("pause", pause, &id), ("container", pid, &c)] {
        // the process is gone (or the pid reused by something outside the pod)
        let gone = poll(HANG, || {
            (!cgroup_of(pid).is_ok_and(|cg| cg.contains(unit_id.as_str()))).then_some(())
        });
        if gone.is_none() {
            left.push(format!("{what} {pid} still runs"));
        }
        if let Err(e) = scope_gone(unit_id, slice) {
            left.push(format!("{what}: {e}"));
        }
    }
    let below = cgroups_below(&slice.dir());
    if !below.is_empty() {
        left.push(format!("cgroups in the pod slice: {below:?}"));
    }
    Ok(left)
}

/// A SIGKILLed shim, then StopPodSandbox/RemovePodSandbox, on both handlers: rsandbox leaves
/// nothing. containerd 2.1.9's runc path does not get there: its pod's containers share the
/// sandbox's shim, containerd cleans up after the dead shim for the sandbox ID only ("cleaning
/// up dead shim"), the container's task delete fails ("ttrpc: closed") and its runc container
/// is never deleted: the process runs on in its scope (with runc 1.3 RemovePodSandbox then
/// fails: "container is still running, to stop first") until the kubelet ends what is left in
/// the pod slice. Seen in the systemd guest with both runcs; printed, not failed (after the
/// slice is stopped the runc pod must go cleanly).
#[tokio::test]
async fn sigkilled_shim_then_delete_leaves_no_unit() {
    systemd_node_or_skip!();
    let (left, mut failures) = per_handler("sdkill", true, killed_shim).await;
    for (handler, left) in left {
        match left {
            Ok(l) if l.is_empty() => {}
            Ok(l) if handler == RUNC_HANDLER => {
                eprintln!("known runc-path leftover after the dead shim (not a failure): {l:?}")
            }
            Ok(l) => failures.push(format!("{handler}: left after delete: {l:?}")),
            Err(_) => {} // reported by per_handler
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A fresh CRI client once the restarted containerd answers (`Version`), within `HANG`.
async fn reconnect() -> R<Runtime> {
    let deadline = std::time::Instant::now() + HANG;
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        match containerd_client::connect(address()).await {
            Ok(ch) => {
                let mut rt = Runtime::new(ch);
                match rt.version(VersionRequest::default()).await {
                    Ok(_) => return Ok(rt),
                    Err(s) => last = format!("Version: {}", s.message()),
                }
            }
            Err(e) => last = format!("connect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("containerd did not come back: {last}"))
}

/// A pod on its slice with a running container, containerd restarted under it (`systemctl
/// restart containerd`: `KillMode=process`, the shims live on), then what containerd sees
/// of it again: pod state, container state, an ExecSync, both scopes still active with the
/// same processes; then StopPodSandbox/RemovePodSandbox leave no scope.
async fn across_a_restart(p: &mut Pods, cfg: PodSandboxConfig, slice: &PodSlice) -> R<String> {
    let id = p.run(cfg.clone()).await?;
    let c = p
        .start(&id, &cfg, container_config("c", &["sleep", "300"]))
        .await?;
    let (pause, pid) = (p.pause_pid(&id).await?, p.container_pid(&c).await?);
    let o = run("systemctl", &["restart", "containerd"]);
    ensure!(o.ok(), "systemctl restart containerd: {o:?}");
    p.rt = reconnect().await?;
    let ready = PodSandboxState::SandboxReady as i32;
    let running = ContainerState::ContainerRunning as i32;
    // CRI recovers its pods as it starts: a status may briefly say otherwise
    let seen = states_until(p, &id, &c, (ready, running)).await;
    ensure!(
        seen == (Ok(ready), Ok(running)),
        "pod and container after the restart: {seen:?}"
    );
    let out = p.out(&c, &["echo", "alive"]).await?;
    ensure!(out.trim() == "alive", "ExecSync after the restart: {out:?}");
    for (what, pid, unit_id) in [("pause", pause, &id), ("container", pid, &c)] {
        let cg = cgroup_of(pid)?;
        ensure!(
            cg.contains(&scope_of(unit_id)),
            "{what} {pid} after the restart: {cg}"
        );
        let state = show(&scope_of(unit_id), "ActiveState")?;
        ensure!(
            state.get("ActiveState").map(String::as_str) == Some("active"),
            "{what} scope after the restart: {state:?}"
        );
    }
    p.stop(&id).await?;
    p.remove(&id).await?;
    scope_gone(&c, slice)?;
    scope_gone(&id, slice)?;
    Ok("pod Ready, container Running, ExecSync answered, scopes kept".into())
}

/// containerd restarted while a slice-parented pod runs, on both handlers alike: the pod and
/// its container live on in their scopes and containerd reaches them again.
#[tokio::test]
async fn containerd_restart_keeps_a_slice_parented_pod() {
    systemd_node_or_skip!();
    let (_, failures) = per_handler("sdrestart", false, across_a_restart).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
