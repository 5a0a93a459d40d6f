//! The systemd cgroup driver as a kubelet drives it, end to end, on both CRI handlers (`runc`
//! with `SystemdCgroup = true`, and `rsandbox`), on cgroup v1 (hack/node.sh's node: systemd 252
//! on this host's v1 hybrid layout) and v2 (hack/guest.sh --systemd). The tests play the
//! kubelet's part as its cgroup manager plays it (runc's libcontainer systemd manager):
//! `kubepods.slice`, `kubepods-besteffort.slice` and the pod slice are transient slice units
//! (`Apply(-1)`: `Wants=` the parent, the accountings, `DefaultDependencies=no`, no device
//! properties; on v1 also the slice's directory in every hierarchy); the pod's `cgroup_parent`
//! is the EXPANDED slice path the kubelet sends
//! (`/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice`); each
//! handler's first pod is the first of QoS slices made anew (as after a node boot); a pod
//! slice goes as the kubelet's `Destroy` takes it (the unit stopped, then on v1 its directory
//! in every hierarchy). The runc handler runs first; rsandbox must show the same.
//!
//! * `systemd_v1_moves_a_slice_s_processes_into_its_devices_cgroup` (v1 only): the mechanism
//!   of issue 24's devices escape, with systemd alone;
//! * `pod_on_a_systemd_slice_as_on_runc`: where the pause and each container live (their own
//!   `cri-containerd-<id>.scope` in every hierarchy, nothing in the pod slice), the device
//!   probe (a container's main process and an exec'd one make `/dev/fuse`, c 10:229, and open
//!   it: EPERM), the scopes' properties, a memory limit, ContainerStats, PodSandboxStats,
//!   UpdateContainerResources, pause/resume and SIGKILL of a paused task, an OOM kill,
//!   teardown;
//! * `sigkilled_shim_then_delete_leaves_no_unit`;
//! * `containerd_restart_with_pods_of_both_handlers`: a pod of each handler running across
//!   `systemctl restart containerd`: no pause left in containerd.service, createdAt as
//!   containerd gives it, exec works, then nothing left.
//!
//! Needs systemd as PID 1; anywhere else every test skips out loud (gate `systemd-node`; the
//! v1-only test also gate `cgroup-v1`): a `rsandbox-skip:` line, and a failure where the stage
//! says the gate holds (`RSANDBOX_EXPECT_GATES`, see `rsandbox_integration::skip`).

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
/// The QoS slice the kubelet puts BestEffort pods in.
const QOS_SLICE: &str = "kubepods-besteffort.slice";
/// What Go's zero `time.Time` gives as `UnixNano()`: what containerd 2.1.9 (and up to
/// v2.4.0-beta.0) lists as a shim-sandboxer pod's createdAt after a restart.
const GO_ZERO_TIME_UNIX_NANO: i64 = -6795364578871345152;

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

/// Skips the calling test (gate `systemd-node`, see `rsandbox_integration::skip`) unless this is
/// a systemd node; the node and the systemd guest expect the gate, so there a misfire fails.
macro_rules! systemd_node_or_skip {
    () => {
        if let Some(why) = not_a_systemd_node() {
            skip!(
                "systemd-node",
                "{why}; hack/node.sh run-tests (v1) and hack/guest.sh --systemd (v2) run these tests"
            );
        }
    };
}

fn run(prog: &str, args: &[&str]) -> Out {
    let mut c = Command::new(prog);
    c.args(args);
    run_timeout(c, None, Duration::from_secs(120))
}

// --- the node's cgroup hierarchies ---------------------------------------------------------

/// One cgroup hierarchy of this node, named as `/proc/<pid>/cgroup` names it: its controllers
/// (`memory`, `cpu,cpuacct`, `name=systemd`; empty for the unified hierarchy), and where it is
/// mounted.
#[derive(Debug, Clone)]
struct Hierarchy {
    key: String,
    mount: PathBuf,
}

impl Hierarchy {
    fn name(&self) -> &str {
        if self.key.is_empty() {
            "unified"
        } else {
            &self.key
        }
    }
    /// Directory of cgroup `rel` (`/kubepods.slice/...`) in this hierarchy.
    fn dir(&self, rel: &str) -> PathBuf {
        self.mount.join(rel.trim_start_matches('/'))
    }
    fn has(&self, controller: &str) -> bool {
        self.key.split(',').any(|c| c == controller)
    }
}

/// Every hierarchy this process is in that is mounted here: on v2 the one at /sys/fs/cgroup,
/// on the v1 hybrid node each v1 hierarchy and the unified one.
fn hierarchies() -> Vec<Hierarchy> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out = Vec::new();
    for line in own.lines() {
        let Some(key) = line.split(':').nth(1) else {
            continue;
        };
        let mount = mountinfo.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mountpoint = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let (fstype, _, opts) = (r.next()?, r.next()?, r.next()?);
            let hit = if key.is_empty() {
                fstype == "cgroup2"
            } else {
                fstype == "cgroup" && key.split(',').all(|c| opts.split(',').any(|o| o == c))
            };
            hit.then(|| PathBuf::from(mountpoint))
        });
        if let Some(mount) = mount {
            out.push(Hierarchy {
                key: key.into(),
                mount,
            });
        }
    }
    out
}

/// cgroup v1 (the node) rather than v2 only (the guest).
fn v1() -> bool {
    hierarchies().iter().any(|h| !h.key.is_empty())
}

/// The hierarchy holding `controller` (v1), or the unified one (v2).
fn hierarchy_of(controller: &str) -> R<Hierarchy> {
    let all = hierarchies();
    let found = if v1() {
        all.into_iter().find(|h| h.has(controller))
    } else {
        all.into_iter().find(|h| h.key.is_empty())
    };
    found.ok_or_else(|| format!("no cgroup hierarchy for {controller}"))
}

/// `pid`'s cgroup per hierarchy key (`/proc/<pid>/cgroup`).
fn cgroups_of(pid: u32) -> R<BTreeMap<String, String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| e.to_string())?;
    Ok(s.lines()
        .filter_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, key, path) = (p.next()?, p.next()?, p.next()?);
            Some((key.to_string(), path.to_string()))
        })
        .collect())
}

/// The cgroup of `pid` in systemd's own hierarchy (`name=systemd` on v1, the unified one on
/// v2): its unit's cgroup.
fn unit_cgroup_of(pid: u32) -> R<String> {
    let cg = cgroups_of(pid)?;
    cg.get("name=systemd")
        .or_else(|| cg.get(""))
        .cloned()
        .ok_or_else(|| format!("/proc/{pid}/cgroup: {cg:?}"))
}

/// The hierarchies in which `pid` is not in cgroup `want`, as `hierarchy: where it is`.
fn outside(pid: u32, want: &str) -> R<Vec<String>> {
    let cg = cgroups_of(pid)?;
    Ok(hierarchies()
        .iter()
        .filter_map(|h| {
            let got = cg.get(&h.key)?;
            (got != want).then(|| format!("{}: {got}", h.name()))
        })
        .collect())
}

fn read(p: &Path) -> R<String> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Cgroup directories strictly below cgroup `rel`, in every hierarchy.
fn cgroups_below(rel: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for h in hierarchies() {
        let mut todo = vec![h.dir(rel)];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    out.push(e.path());
                    todo.push(e.path());
                }
            }
        }
    }
    out
}

/// The processes in cgroup `rel` itself, per hierarchy (those where there are any).
fn procs_in(rel: &str) -> BTreeMap<String, String> {
    hierarchies()
        .iter()
        .filter_map(|h| {
            let procs = read(&h.dir(rel).join("cgroup.procs")).ok()?;
            (!procs.is_empty()).then(|| (h.name().to_string(), procs.replace('\n', " ")))
        })
        .collect()
}

/// Removes cgroup `rel` and everything below it in every hierarchy, deepest first, as runc's
/// `RemovePaths` does for the kubelet's `Destroy`; fails if a directory stays (processes).
fn remove_everywhere(rel: &str) -> R {
    let mut left = Vec::new();
    for h in hierarchies() {
        let top = h.dir(rel);
        if !top.exists() {
            continue;
        }
        let mut dirs = vec![top.clone()];
        let mut i = 0;
        while i < dirs.len() {
            for e in std::fs::read_dir(&dirs[i]).into_iter().flatten().flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    dirs.push(e.path());
                }
            }
            i += 1;
        }
        for d in dirs.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                left.push(format!("{}: {e}", d.display()));
            }
        }
    }
    ensure!(left.is_empty(), "cgroups not removable: {left:?}");
    Ok(())
}

// --- systemd units -------------------------------------------------------------------------

/// `systemctl show -p <props> <unit>` as a map; a property shown on several lines (such as
/// `DeviceAllow`, one line per entry) has its values joined by `; `.
fn show(unit: &str, props: &str) -> R<BTreeMap<String, String>> {
    let o = run("systemctl", &["show", "-p", props, "--", unit]);
    if !o.ok() {
        return Err(format!("systemctl show {unit}: {o:?}"));
    }
    let mut m: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in o.stdout.lines().filter_map(|l| l.split_once('=')) {
        m.entry(k.to_string())
            .and_modify(|e| {
                e.push_str("; ");
                e.push_str(v)
            })
            .or_insert_with(|| v.to_string());
    }
    Ok(m)
}

fn load_state(unit: &str) -> R<String> {
    Ok(show(unit, "LoadState")?
        .remove("LoadState")
        .unwrap_or_default())
}

fn active_state(unit: &str) -> R<String> {
    Ok(show(unit, "ActiveState")?
        .remove("ActiveState")
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

/// `busctl call` of systemd's manager: `method` with `signature` and `args`.
fn manager_call(method: &str, signature: &str, args: &[&str]) -> Out {
    let mut a = vec![
        "call",
        // positional arguments from here on: "-.slice" is no option
        "--",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        method,
        signature,
    ];
    a.extend_from_slice(args);
    run("busctl", &a)
}

/// Polls until `unit` is active.
fn wait_active(unit: &str) -> R {
    let active = poll(Duration::from_secs(60), || {
        (active_state(unit).ok()? == "active").then_some(())
    });
    ensure!(
        active.is_some(),
        "{unit} not active: {:?}",
        show(unit, "ActiveState,LoadState,Result")
    );
    Ok(())
}

/// Starts the transient slice `name` the way the kubelet's cgroup manager does (runc's
/// libcontainer systemd manager, `Apply(-1)` of a slice): StartTransientUnit on the system bus
/// with `Description=libcontainer container <name>`, `Wants=` its parent slice, the four
/// accountings (the block I/O one as runc names it: `BlockIOAccounting` on v1, `IOAccounting`
/// on v2) and `DefaultDependencies=no`, no device properties (the kubelet's resources have
/// `SkipDevices`); waits until the unit is active; on v1 then, as runc's `joinCgroups(-1)`,
/// makes the slice's directory in every v1 hierarchy but `name=systemd`, a cpuset's cpus and
/// mems copied from its parent. A slice that is already active is left as it is.
fn start_slice(name: &str, parent: &str) -> R {
    if active_state(name)? == "active" {
        return Ok(());
    }
    let desc = format!("libcontainer container {name}");
    let io = if v1() {
        "BlockIOAccounting"
    } else {
        "IOAccounting"
    };
    let o = manager_call(
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        &[
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
            io,
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
    wait_active(name)?;
    if v1() {
        for h in hierarchies().iter().filter(|h| !h.key.is_empty()) {
            if h.key == "name=systemd" {
                continue;
            }
            let dir = h.dir(&slice_path(name));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if h.has("cpuset") {
                let mut level = h.mount.clone();
                for part in slice_path(name).trim_start_matches('/').split('/') {
                    let parent = level.clone();
                    level.push(part);
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        if read(&level.join(f))?.is_empty() {
                            let v = read(&parent.join(f))?;
                            std::fs::write(level.join(f), v)
                                .map_err(|e| format!("{}/{f}: {e}", level.display()))?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Stops `unit` (and, for a slice, every unit in it) and waits until it is inactive.
fn stop_unit(unit: &str) -> R {
    let o = run("systemctl", &["stop", "--", unit]);
    ensure!(o.ok(), "systemctl stop {unit}: {o:?}");
    let gone = poll(HANG, || {
        (matches!(active_state(unit).ok()?.as_str(), "inactive" | "failed")).then_some(())
    });
    ensure!(
        gone.is_some(),
        "{unit} still there after stop: {:?}",
        show(unit, "ActiveState,SubState")
    );
    let _ = run("systemctl", &["reset-failed", "--", unit]);
    Ok(())
}

/// As after a node boot: `kubepods.slice` and the QoS slice made anew. Whatever was left
/// below them is stopped with them; their directories go in every hierarchy.
fn fresh_qos_slices() -> R {
    if load_state("kubepods.slice")? == "loaded" && active_state("kubepods.slice")? != "inactive" {
        stop_unit("kubepods.slice")?;
    }
    remove_everywhere("/kubepods.slice")?;
    start_slice("kubepods.slice", "-.slice")?;
    start_slice(QOS_SLICE, "kubepods.slice")
}

/// A kubelet-style pod slice for one pod, destroyed (as the kubelet's pod cgroup manager does
/// when the pod is gone) with [`PodSlice::destroy`] or on drop.
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

    /// What the kubelet sends as the pod's cgroup_parent: the expanded slice path.
    fn path(&self) -> String {
        slice_path(&self.name)
    }

    /// The kubelet's `Destroy` of the pod cgroup: the unit stopped (with whatever still runs
    /// in it), then its directory removed in every hierarchy (runc's `RemovePaths`). Fails if
    /// the unit stays active or a directory stays.
    fn destroy(&self) -> R {
        stop_unit(&self.name)?;
        let gone = poll(HANG, || {
            remove_everywhere(&self.path()).ok()?;
            (!hierarchies().iter().any(|h| h.dir(&self.path()).exists())).then_some(())
        });
        ensure!(
            gone.is_some(),
            "pod slice {} left after its destroy: {:?}",
            self.name,
            remove_everywhere(&self.path())
        );
        Ok(())
    }
}

impl Drop for PodSlice {
    fn drop(&mut self) {
        let _ = run("systemctl", &["stop", "--", &self.name]);
        let _ = remove_everywhere(&self.path());
    }
}

fn scope_of(id: &str) -> String {
    format!("cri-containerd-{id}.scope")
}

/// Properties that say where a scope lives and how it was made: runc's systemd driver sets
/// `Delegate`, the accountings, `DefaultDependencies=no`, the CPU share (containerd gives the
/// pause 2 shares: v1 `CPUShares`, v2 `CPUWeight`) and the device rules on every scope.
fn scope_props() -> String {
    let (io, cpu) = if v1() {
        ("BlockIOAccounting", "CPUShares")
    } else {
        ("IOAccounting", "CPUWeight")
    };
    format!(
        "Id,Slice,ControlGroup,ActiveState,Delegate,DefaultDependencies,MemoryAccounting,\
         CPUAccounting,{io},TasksAccounting,{cpu},DevicePolicy,DeviceAllow"
    )
}

/// The memory limit property runc sets (v1 `MemoryLimit`, v2 `MemoryMax`).
fn memory_prop() -> &'static str {
    if v1() { "MemoryLimit" } else { "MemoryMax" }
}

/// `DeviceAllow` as one spelling: runc 1.1 (and rsandbox) name the pts devices by their
/// `/proc/devices` group (`char-pts`), runc 1.3 on systemd ≥ 240 by their major
/// (`char-136`); runc 1.1 leaves out a `/dev/char/M:m` node the host does not have, runc 1.3
/// does not. The same rules for systemd 252: compared in one form.
fn normalize_device_allow(v: &str) -> String {
    let groups = std::fs::read_to_string("/proc/devices").unwrap_or_default();
    let major_of = |name: &str| {
        groups
            .split("Block devices:")
            .next()
            .unwrap_or("")
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (m, n) = (f.next()?, f.next()?);
                (n == name).then(|| m.to_string())
            })
    };
    v.split("; ")
        .filter(|e| {
            let path = e.split(' ').next().unwrap_or("");
            !path.starts_with("/dev/char/")
                || Path::new(path).exists()
                || Path::new(&format!("/sys{path}")).exists()
        })
        .map(|e| match e.strip_prefix("char-") {
            Some(rest) => {
                let (group, perms) = rest.split_once(' ').unwrap_or((rest, ""));
                let major = major_of(group).unwrap_or_else(|| group.to_string());
                format!("char-{major} {perms}")
            }
            None => e.to_string(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

// --- the mechanism (v1) --------------------------------------------------------------------

/// Starts scope `unit` in slice `slice` with `pid` in it, as runc starts a container's scope
/// (Delegate, an accounting, `DefaultDependencies=no`), plus `extra`: `extra_count` properties
/// as `busctl` writes them (name, signature, value...).
fn start_scope(unit: &str, slice: &str, pid: u32, extra_count: usize, extra: &[&str]) -> R {
    let pid = pid.to_string();
    let count = (5 + extra_count).to_string();
    let mut args = vec![
        unit,
        "replace",
        &count,
        "Slice",
        "s",
        slice,
        "Delegate",
        "b",
        "true",
        "PIDs",
        "au",
        "1",
        &pid,
        "MemoryAccounting",
        "b",
        "true",
        "DefaultDependencies",
        "b",
        "false",
    ];
    args.extend_from_slice(extra);
    args.push("0");
    let o = manager_call("StartTransientUnit", "ssa(sv)a(sa(sv))", &args);
    ensure!(o.ok(), "StartTransientUnit {unit}: {o:?}");
    wait_active(unit)
}

/// A child process that sleeps, killed on drop.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn spawn() -> R<Sleeper> {
        Command::new("sleep")
            .arg("300")
            .spawn()
            .map(Sleeper)
            .map_err(|e| format!("spawn sleep: {e}"))
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One run of the mechanism in a fresh slice pair `<name>.slice`/`<name>-pod.slice`: with
/// `guarded`, a first scope with device rules from its start (what rsandbox's pause scope now
/// is) runs in the pod slice; then a scope made as runc makes a container's (no device
/// properties at its start, its process written into the devices hierarchy at the scope's
/// path, then `DevicePolicy=strict` + `DeviceAllow=` set on the running unit). Returns the
/// devices cgroup of that scope's process before and after the properties were set.
fn devices_after_set_property(name: &str, guarded: bool) -> R<(String, String)> {
    let (top, pod) = (format!("{name}.slice"), format!("{name}-pod.slice"));
    start_slice(&top, "-.slice")?;
    start_slice(&pod, &top)?;
    let devices = hierarchy_of("devices")?;
    let pod_path = slice_path(&pod);
    let guard = Sleeper::spawn()?;
    if guarded {
        start_scope(
            &format!("{name}-pause.scope"),
            &pod,
            guard.pid(),
            2,
            &[
                "DevicePolicy",
                "s",
                "strict",
                "DeviceAllow",
                "a(ss)",
                "1",
                "/dev/null",
                "rwm",
            ],
        )?;
    }
    let c = Sleeper::spawn()?;
    let scope = format!("{name}-c.scope");
    start_scope(&scope, &pod, c.pid(), 0, &[])?;
    // runc's joinCgroups: the process into the devices hierarchy at the scope's path
    let dir = devices.dir(&format!("{pod_path}/{scope}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("cgroup.procs"), c.pid().to_string())
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let before = cgroups_of(c.pid())?
        .get(&devices.key)
        .cloned()
        .unwrap_or_default();
    // runc's Set: SetUnitProperties with the device rules
    let o = run(
        "systemctl",
        &[
            "set-property",
            "--runtime",
            "--",
            &scope,
            "DevicePolicy=strict",
            "DeviceAllow=/dev/null rwm",
        ],
    );
    ensure!(o.ok(), "systemctl set-property {scope}: {o:?}");
    let after = cgroups_of(c.pid())?
        .get(&devices.key)
        .cloned()
        .unwrap_or_default();
    drop((c, guard));
    stop_unit(&top)?;
    remove_everywhere(&slice_path(&top))?;
    Ok((before, after))
}

/// The mechanism behind issue 24's devices escape, with systemd alone (cgroup v1; v2 has no
/// devices hierarchy to move anyone in): a delegated scope that is the first unit of its
/// slice to get device rules, given them after its process joined the scope's devices cgroup
/// (what runc does with every container: its v1 `Apply` starts the scope without device
/// properties and writes the init into each hierarchy, its `Set` then sends `DevicePolicy` and
/// `DeviceAllow` with `SetUnitProperties`), has its process moved into the slice's devices
/// cgroup — which allows every device — when systemd realizes `devices` for the slice
/// (`unit_realize_cgroup_now_enable` → `unit_update_cgroup` → `cg_migrate_v1_controllers` of
/// the slice's whole subtree); nothing moves a delegated scope's process back. With a scope
/// that had device rules from its start already in the slice (rsandbox's pause scope), the
/// slice's devices cgroup is realized before any process is in it and nothing moves. Fails the
/// day systemd stops doing either (the account in README and `src/host/systemd/devices.rs` then
/// changes).
#[tokio::test]
async fn systemd_v1_moves_a_slice_s_processes_into_its_devices_cgroup() {
    systemd_node_or_skip!();
    if !v1() {
        skip!(
            "cgroup-v1",
            "cgroup v2 (no devices hierarchy); the node (v1) runs this test"
        );
    }
    let name = format!("rsprobe{}", std::process::id());
    let pod = slice_path(&format!("{name}-pod.slice"));
    let scope = format!("{pod}/{name}-c.scope");
    let (before, after) = devices_after_set_property(&name, false).unwrap();
    assert_eq!(before, scope, "runc's join of the devices hierarchy");
    assert_eq!(
        after, pod,
        "systemd no longer moves the first devices-bearing scope's process into its slice's \
         devices cgroup: the account of issue 24's escape changed"
    );
    let (before, after) = devices_after_set_property(&name, true).unwrap();
    assert_eq!(before, scope);
    assert_eq!(
        after, scope,
        "with a devices-bearing scope started first in the slice, systemd still moved the \
         process: rsandbox's pause scope would not protect its containers"
    );
}

// --- pods on the slices --------------------------------------------------------------------

/// What one handler showed, with the IDs replaced by their roles, for the comparison of the
/// two handlers.
#[derive(Debug, PartialEq)]
struct Seen {
    /// role -> the scope unit's properties ([`scope_props`], plus the memory limit for c1)
    scopes: BTreeMap<String, BTreeMap<String, String>>,
    /// "main"/"exec" -> what opening /dev/fuse (c 10:229) gave
    devices: BTreeMap<String, String>,
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

/// The process `pid` of scope `id` in `slice`: in the scope's cgroup in every hierarchy
/// (`known` hierarchies may differ: printed for the runc path's pause), the unit there with
/// runc's properties; returns those properties, normalized.
#[allow(clippy::too_many_arguments)]
fn check_scope(
    what: &str,
    pid: u32,
    id: &str,
    slice: &PodSlice,
    extra: &str,
    roles: &[(String, &str)],
    handler: &str,
) -> R<BTreeMap<String, String>> {
    let unit = scope_of(id);
    let want = format!("{}/{unit}", slice.path());
    let cg = unit_cgroup_of(pid)?;
    ensure!(cg == want, "{what} ({pid}) in cgroup {cg}, want {want}");
    let out = outside(pid, &want)?;
    if !out.is_empty() {
        // The runc path's pause: runc gives its scope device rules after the pause joined it,
        // the first devices-bearing unit of a fresh pod slice: systemd moves it into the pod
        // slice's devices cgroup (see systemd_v1_moves_a_slice_s_processes_into_its_devices_cgroup).
        // Harmless for a pause; printed. Anything else fails.
        let known = handler == RUNC_HANDLER
            && what == "pause"
            && out
                .iter()
                .all(|o| o == &format!("devices: {}", slice.path()));
        ensure!(known, "{what} ({pid}) outside its scope {want} in: {out:?}");
        eprintln!("runc path: the pause container outside its scope in {out:?}");
    }
    let props = show(&unit, &format!("{}{extra}", scope_props()))?;
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
    ensure!(
        p("DevicePolicy") == "strict",
        "{what}: scope without a strict device policy {props:?}"
    );
    Ok(props
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "DeviceAllow" => (k, normalize_device_allow(&v)),
            _ => (k, normalize(&v, roles)),
        })
        .collect())
}

/// Polls until the scope unit of `id` is unloaded and its cgroup gone in every hierarchy.
fn scope_gone(id: &str, slice: &PodSlice) -> R {
    let unit = scope_of(id);
    let rel = format!("{}/{unit}", slice.path());
    let left = || {
        hierarchies()
            .iter()
            .map(|h| h.dir(&rel))
            .filter(|d| d.exists())
            .collect::<Vec<_>>()
    };
    let gone = poll(HANG, || {
        (load_state(&unit).ok()? == "not-found" && left().is_empty()).then_some(())
    });
    ensure!(
        gone.is_some(),
        "{unit} left: {:?}, cgroups {:?}",
        show(&unit, "LoadState,ActiveState,SubState"),
        left()
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

/// The main process of the probe container: makes /dev/fuse's node (c 10:229, outside the
/// allow list runc gives every container) and opens it itself (`command exec`: a failed
/// redirection does not end the shell), writes what it got to /tmp/probe (the error to
/// /tmp/probe.err), then sleeps as the container's init.
const MAIN_PROBE: &str = "exec 2>/tmp/probe.err
if ! mknod /tmp/fuse c 10 229; then echo MKNOD-FAILED >/tmp/probe; exec sleep 300; fi
if command exec 3<>/tmp/fuse; then echo ALLOWED >/tmp/probe; else echo DENIED >/tmp/probe; fi
exec 3>&-
exec sleep 300";

/// The same from an exec'd process.
const EXEC_PROBE: &str = "mknod /tmp/fuse-exec c 10 229 || exit 3
if command exec 3<>/tmp/fuse-exec; then echo ALLOWED; else echo DENIED; fi";

/// What a probe's output says: `DENIED (Operation not permitted)` when the open failed with
/// EPERM, else the output as it is.
fn probe_verdict(out: &str, err: &str) -> String {
    if out.trim() == "DENIED" && err.contains("Operation not permitted") {
        "DENIED (Operation not permitted)".into()
    } else {
        format!("{} / {}", out.trim(), err.trim())
    }
}

const EPERM_VERDICT: &str = "DENIED (Operation not permitted)";

/// The device probe in container `c` (whose main process runs [`MAIN_PROBE`]): the main
/// process's and an exec'd process's open of c 10:229.
async fn device_probe(p: &mut Pods, c: &str, pid: u32) -> R<BTreeMap<String, String>> {
    let mut seen = BTreeMap::new();
    let deadline = std::time::Instant::now() + HANG;
    let main = loop {
        let r = p.exec(c, &["cat", "/tmp/probe", "/tmp/probe.err"]).await?;
        if r.exit_code == 0 {
            let out = String::from_utf8_lossy(&r.stdout).into_owned();
            let (verdict, err) = out.split_once('\n').unwrap_or((&out, ""));
            break probe_verdict(verdict, err);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the probe's main process wrote no /tmp/probe: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let devices_line = cgroups_of(pid).map(|cg| {
        cg.into_iter()
            .filter(|(k, _)| k.split(',').any(|c| c == "devices") || k.is_empty())
            .collect::<Vec<_>>()
    });
    ensure!(
        main == EPERM_VERDICT,
        "{}: the container's main process ({pid}) opened c 10:229 (/dev/fuse) or failed \
         otherwise: {main}; its devices/unified cgroups: {devices_line:?}",
        p.handler
    );
    seen.insert("main".to_string(), main);
    let r = p.exec(c, &["sh", "-c", EXEC_PROBE]).await?;
    let exec = probe_verdict(
        &String::from_utf8_lossy(&r.stdout),
        &String::from_utf8_lossy(&r.stderr),
    );
    ensure!(
        exec == EPERM_VERDICT,
        "{}: an exec'd process opened c 10:229 (/dev/fuse) or failed otherwise: {exec} \
         (exit {})",
        p.handler,
        r.exit_code
    );
    seen.insert("exec".to_string(), exec);
    Ok(seen)
}

/// The memory limit of the cgroup `rel` in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`).
fn memory_limit(rel: &str) -> R<String> {
    let h = hierarchy_of("memory")?;
    let file = if v1() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    read(&h.dir(rel).join(file))
}

/// The CPU quota and period of cgroup `rel`, as v2's `cpu.max` writes them.
fn cpu_max(rel: &str) -> R<String> {
    let h = hierarchy_of("cpu")?;
    if v1() {
        Ok(format!(
            "{} {}",
            read(&h.dir(rel).join("cpu.cfs_quota_us"))?,
            read(&h.dir(rel).join("cpu.cfs_period_us"))?
        ))
    } else {
        read(&h.dir(rel).join("cpu.max"))
    }
}

/// Whether cgroup `rel` is frozen (v1 `freezer.state`, v2 `cgroup.freeze`).
fn frozen(rel: &str) -> R<bool> {
    let h = hierarchy_of("freezer")?;
    if v1() {
        Ok(read(&h.dir(rel).join("freezer.state"))? == "FROZEN")
    } else {
        Ok(read(&h.dir(rel).join("cgroup.freeze"))? == "1")
    }
}

/// The pod on one handler, the first of its fresh QoS slice; `roles` collects ID -> role for
/// [`normalize`].
async fn pod_on_slice(
    p: &mut Pods,
    cfg: PodSandboxConfig,
    slice: &PodSlice,
    roles: &mut Vec<(String, &'static str)>,
) -> R<Seen> {
    let mut seen = Seen {
        scopes: BTreeMap::new(),
        devices: BTreeMap::new(),
        pod_stats: Ok(0),
    };
    let id = p.run(cfg.clone()).await?;
    roles.push((slice.name.clone(), "<pod slice>"));
    roles.push((id.clone(), "<pod>"));
    let pause = p.pause_pid(&id).await?;
    // the pod's first container: the device probe as its main process
    let c1 = p
        .start(
            &id,
            &cfg,
            with_memory_limit(container_config("c1", &["sh", "-c", MAIN_PROBE]), 64 << 20),
        )
        .await?;
    roles.push((c1.clone(), "<c1>"));
    let c2 = p
        .start(&id, &cfg, container_config("c2", &["sleep", "300"]))
        .await?;
    roles.push((c2.clone(), "<c2>"));
    let c1_pid = p.container_pid(&c1).await?;

    // first, the device probe: the main process and an exec'd one
    seen.devices = device_probe(p, &c1, c1_pid).await?;

    // where everything lives: each in its scope of the pod slice in every hierarchy, nothing
    // in the slice itself
    let props = check_scope("pause", pause, &id, slice, "", roles, &p.handler)?;
    seen.scopes.insert("pause".into(), props);
    let mem = format!(",{}", memory_prop());
    for (role, c, extra) in [("c1", &c1, mem.as_str()), ("c2", &c2, "")] {
        let pid = p.container_pid(c).await?;
        let props = check_scope(role, pid, c, slice, extra, roles, &p.handler)?;
        seen.scopes.insert(role.into(), props);
    }
    let mut procs = procs_in(&slice.path());
    if p.handler == RUNC_HANDLER && procs.get("devices") == Some(&pause.to_string()) {
        procs.remove("devices"); // the runc path's pause, printed by check_scope
    }
    ensure!(
        procs.is_empty(),
        "processes in the pod slice itself: {procs:?}"
    );

    // the memory limit, on the scope unit and in its cgroup
    let c1_rel = format!("{}/{}", slice.path(), scope_of(&c1));
    let max = memory_limit(&c1_rel)?;
    ensure!(max == (64u64 << 20).to_string(), "c1 memory limit {max}");
    let unit_max = seen.scopes["c1"].get(memory_prop()).cloned();
    ensure!(
        unit_max == Some((64u64 << 20).to_string()),
        "c1 scope {} {unit_max:?}",
        memory_prop()
    );

    // ContainerStats (the shim's Task.Stats, read from the scope)
    p.container_stats_in_use(&c1).await?;
    // PodSandboxStats: containerd's CRI reads the pod's cgroup_parent itself. Recorded and
    // compared.
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
    let max = memory_limit(&c1_rel)?;
    ensure!(
        max == pods::UPDATED_MEMORY.to_string(),
        "c1 memory limit after update {max}"
    );
    let cpu = cpu_max(&c1_rel)?;
    ensure!(
        cpu == pods::UPDATED_CPU_MAX,
        "c1 cpu quota and period after update {cpu:?}"
    );

    // pause/resume (containerd's task API on the CRI container), then SIGKILL while paused
    let c2_rel = format!("{}/{}", slice.path(), scope_of(&c2));
    let o = ctr_k8s(&["task", "pause", &c2]);
    ensure!(o.ok(), "ctr task pause c2: {o:?}");
    ensure!(frozen(&c2_rel)?, "c2 not frozen after pause");
    let o = ctr_k8s(&["task", "resume", &c2]);
    ensure!(o.ok(), "ctr task resume c2: {o:?}");
    ensure!(!frozen(&c2_rel)?, "c2 frozen after resume");
    let o = ctr_k8s(&["task", "pause", &c2]);
    ensure!(o.ok(), "ctr task pause c2 again: {o:?}");
    let o = ctr_k8s(&["task", "kill", "-s", "SIGKILL", &c2]);
    ensure!(o.ok(), "ctr task kill c2: {o:?}");
    let s = p.wait_exited(&c2, Duration::from_secs(60)).await?;
    ensure!(s.exit_code == 137, "paused c2 after SIGKILL: {s:?}");
    scope_gone(&c2, slice)?;

    // an OOM kill in its scope: exit 137, reason OOMKilled
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
        // killed process and its cgroup goes with it before the event is read (seen with runc
        // 1.3 in the systemd guest): printed for it. rsandbox also looks when it reaps the
        // init, before it publishes the exit (cgroups::check_at_exit), so there it is asserted.
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
    let below = cgroups_below(&slice.path());
    ensure!(below.is_empty(), "cgroups left in the pod slice: {below:?}");
    Ok(seen)
}

/// Runs `body` once per CRI handler (runc first): QoS slices made anew, a kubelet-style pod
/// slice for a pod named after `name` whose cgroup_parent is the slice's expanded path; then
/// removes the pods (whatever happened), checks the leftovers and that nothing is left in the
/// pod slice, and destroys the slice as the kubelet would (which also ends whatever still runs
/// in it). Returns each handler's result and every failure, prefixed by the handler. With
/// `runc_leaks` the runc handler's leftovers are printed, not failures: what containerd's
/// runc path is known to leave (see the caller).
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
        if let Err(e) = fresh_qos_slices() {
            panic!("{handler}: the QoS slices: {e}");
        }
        let uid = cfg.metadata.as_ref().unwrap().uid.clone();
        let slice = match PodSlice::create(&uid) {
            Ok(s) => s,
            Err(e) => panic!("{handler}: the pod slice: {e}"),
        };
        cfg.linux.as_mut().unwrap().cgroup_parent = slice.path();
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
        let below = cgroups_below(&slice.path());
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
        if let Err(e) = slice.destroy() {
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

/// One pod per handler on a kubelet-style pod slice, the first of a fresh QoS slice: layout
/// in every hierarchy, the device probe, limits, stats, Update, pause/resume/kill, OOM,
/// teardown; then the rsandbox handler's view compared with runc's.
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
            (!unit_cgroup_of(pid).is_ok_and(|cg| cg.contains(unit_id.as_str()))).then_some(())
        });
        if gone.is_none() {
            // its scope is there then: say so without waiting for it again
            left.push(format!(
                "{what} {pid} still runs in {} ({:?})",
                scope_of(unit_id),
                active_state(&scope_of(unit_id))
            ));
        } else if let Err(e) = scope_gone(unit_id, slice) {
            left.push(format!("{what}: {e}"));
        }
    }
    let below = cgroups_below(&slice.path());
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
/// the pod slice. Seen on both cgroup versions with both runcs; printed, not failed (after the
/// slice is destroyed the runc pod must go cleanly).
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

// --- containerd restarted under running pods -----------------------------------------------

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

/// The unit systemd says `pid` belongs to (`GetUnitByPID`, then the unit's `Id`).
fn unit_of_pid(pid: u32) -> R<String> {
    let o = manager_call("GetUnitByPID", "u", &[&pid.to_string()]);
    ensure!(o.ok(), "GetUnitByPID {pid}: {o:?}");
    let path = o
        .stdout
        .trim()
        .strip_prefix("o ")
        .map(|s| s.trim_matches('"').to_string())
        .ok_or_else(|| format!("GetUnitByPID {pid}: {:?}", o.stdout))?;
    let o = run(
        "busctl",
        &[
            "get-property",
            "org.freedesktop.systemd1",
            &path,
            "org.freedesktop.systemd1.Unit",
            "Id",
        ],
    );
    ensure!(o.ok(), "Id of {path}: {o:?}");
    Ok(o.stdout
        .trim()
        .trim_start_matches("s ")
        .trim_matches('"')
        .to_string())
}

/// The processes in containerd.service's cgroup (and below it), in systemd's hierarchy.
fn containerd_service_pids() -> R<Vec<u32>> {
    let cg = show("containerd.service", "ControlGroup")?
        .remove("ControlGroup")
        .unwrap_or_default();
    ensure!(!cg.is_empty(), "containerd.service has no ControlGroup");
    let h = hierarchies()
        .into_iter()
        .find(|h| h.key == "name=systemd")
        .or_else(|| hierarchies().into_iter().find(|h| h.key.is_empty()))
        .ok_or("no systemd hierarchy")?;
    let mut pids = Vec::new();
    let mut todo = vec![h.dir(&cg)];
    while let Some(d) = todo.pop() {
        pids.extend(
            read(&d.join("cgroup.procs"))?
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push(e.path());
            }
        }
    }
    Ok(pids)
}

/// One handler's pod across the restart: what it showed before.
struct Across {
    p: Pods,
    slice: PodSlice,
    id: String,
    c: String,
    pause: u32,
    pid: u32,
    /// PodSandboxStatus's and ListPodSandbox's createdAt before the restart.
    status_created: i64,
    listed_created: i64,
}

async fn listed_created_at(p: &mut Pods, id: &str) -> R<i64> {
    let list =
        p.rt.list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                id: id.into(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| format!("ListPodSandbox: {}", s.message()))?
        .into_inner()
        .items;
    ensure!(list.len() == 1, "ListPodSandbox {id}: {list:?}");
    Ok(list[0].created_at)
}

/// A pod with a running container on `handler`, on its own pod slice.
async fn pod_before_restart(handler: &str) -> R<Across> {
    let name = unique_id(&format!("sdrestart-{handler}"));
    let dir = scratch_dir(&name);
    let mut cfg = pods::pod_config(&name, &dir);
    let uid = cfg.metadata.as_ref().unwrap().uid.clone();
    let slice = PodSlice::create(&uid)?;
    cfg.linux.as_mut().unwrap().cgroup_parent = slice.path();
    let mut p = Pods::new(handler).await;
    let id = p.run(cfg.clone()).await?;
    let c = p
        .start(&id, &cfg, container_config("c", &["sleep", "300"]))
        .await?;
    let (pause, pid) = (p.pause_pid(&id).await?, p.container_pid(&c).await?);
    let status_created = p.status(&id).await?.created_at;
    let listed_created = listed_created_at(&mut p, &id).await?;
    ensure!(
        status_created == listed_created && status_created > 0,
        "{handler}: createdAt before the restart: status {status_created}, list {listed_created}"
    );
    Ok(Across {
        p,
        slice,
        id,
        c,
        pause,
        pid,
        status_created,
        listed_created,
    })
}

/// After the restart: what containerd and systemd show of `a`'s pod. Failures are returned;
/// `journal` is containerd.service's journal since the restart.
async fn pod_after_restart(a: &mut Across, journal: &str, in_service: &[u32]) -> Vec<String> {
    let mut failures = Vec::new();
    let handler = a.p.handler.clone();
    let mut fail = |s: String| failures.push(format!("{handler}: {s}"));
    let ready = PodSandboxState::SandboxReady as i32;
    let running = ContainerState::ContainerRunning as i32;
    // CRI recovers its pods as it starts: a status may briefly say otherwise
    let seen = states_until(&mut a.p, &a.id, &a.c, (ready, running)).await;
    if seen != (Ok(ready), Ok(running)) {
        fail(format!("pod and container after the restart: {seen:?}"));
    }
    // createdAt: PodSandboxStatus from the shim (rsandbox) or containerd's store (runc), kept
    match a.p.status(&a.id).await {
        Ok(s) if s.created_at == a.status_created => {}
        Ok(s) => fail(format!(
            "PodSandboxStatus createdAt {} after the restart, {} before",
            s.created_at, a.status_created
        )),
        Err(e) => fail(e),
    }
    // ListPodSandbox: containerd 2.1.9 rebuilds a shim-sandboxer pod's status without it
    match listed_created_at(&mut a.p, &a.id).await {
        Ok(t) if handler == RUNC_HANDLER => {
            if t != a.listed_created {
                fail(format!(
                    "ListPodSandbox createdAt {t} after the restart, {} before",
                    a.listed_created
                ))
            }
        }
        Ok(GO_ZERO_TIME_UNIX_NANO) => eprintln!(
            "{handler}: ListPodSandbox createdAt after the restart is Go's zero time \
             ({GO_ZERO_TIME_UNIX_NANO}), as containerd 2.1.9 gives it for a shim-sandboxer pod \
             (its restart.go keeps only the state of the controller's answer)"
        ),
        Ok(t) => fail(format!(
            "ListPodSandbox createdAt after the restart is {t} ({} before), no longer Go's zero \
             time: containerd's CRI recovery (internal/cri/server/restart.go: \
             sandboxstore.NewSandbox(metadata, sandboxstore.Status{{State: state}}) for every \
             non-podsandbox sandbox, dropping the controller's CreatedAt) has changed; if it \
             keeps createdAt now, the bug is fixed: update this test and the README",
            a.listed_created
        )),
        Err(e) => fail(e),
    }
    // exec still works
    match a.p.out(&a.c, &["echo", "alive"]).await {
        Ok(o) if o.trim() == "alive" => {}
        Ok(o) => fail(format!("ExecSync after the restart: {o:?}")),
        Err(e) => fail(format!("ExecSync after the restart: {e}")),
    }
    for (what, pid, unit_id) in [("pause", a.pause, &a.id), ("container", a.pid, &a.c)] {
        let want = scope_of(unit_id);
        // the process is its scope's, not containerd.service's
        match unit_of_pid(pid) {
            Ok(u) if u == want => {}
            Ok(u) => fail(format!(
                "{what} {pid} belongs to {u} after the restart, not {want}"
            )),
            Err(e) => fail(e),
        }
        if in_service.contains(&pid) {
            fail(format!("{what} {pid} is in containerd.service's cgroup"));
        }
        if let Some(l) = journal.lines().find(|l| {
            (l.contains("left-over process") || l.contains("remains running"))
                && l.contains(&format!(" {pid} "))
        }) {
            fail(format!("{what} {pid} in containerd.service's journal: {l}"));
        }
        match active_state(&want) {
            Ok(s) if s == "active" => {}
            other => fail(format!("{what} scope after the restart: {other:?}")),
        }
    }
    failures
}

/// containerd restarted (`systemctl restart containerd`: `KillMode=process`, the shims live
/// on) while a pod of each handler runs, the runc one the first of a fresh QoS slice: on both
/// handlers the pod is Ready and its container Running again, the pause and the container
/// belong to their scopes (`GetUnitByPID`), not to containerd.service (its cgroup, its
/// journal: no "left-over process"), PodSandboxStatus's createdAt is kept, an ExecSync
/// answers; ListPodSandbox's createdAt is kept on runc and, on rsandbox, Go's zero time, as
/// containerd 2.1.9 gives it for every shim-sandboxer pod (its CRI recovery rebuilds their
/// status with the state alone: the shim cannot change it; this test fails the day containerd
/// keeps it, naming the bug). Then both pods go and leave nothing.
#[tokio::test]
async fn containerd_restart_with_pods_of_both_handlers() {
    systemd_node_or_skip!();
    let g = Guard::new();
    fresh_qos_slices().unwrap();
    let mut failures = Vec::new();
    let mut pods = Vec::new();
    for handler in HANDLERS {
        match pod_before_restart(handler).await {
            Ok(a) => pods.push(a),
            Err(e) => failures.push(format!("{handler}: {e}")),
        }
    }
    if failures.is_empty() {
        let since = format!(
            "@{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                - 1
        );
        let o = run("systemctl", &["restart", "containerd"]);
        assert!(o.ok(), "systemctl restart containerd: {o:?}");
        let in_service = containerd_service_pids().unwrap_or_else(|e| {
            failures.push(e);
            Vec::new()
        });
        // containerd.service's journal since the restart (where journald runs: the node; the
        // guest masks it): systemd names the processes it leaves running at the stop
        // (KillMode=process: the shims, as the control) and those it finds left over at the
        // start; the pods' pause and container processes must be in neither
        let journal = if active_state("systemd-journald.service").ok().as_deref() == Some("active")
        {
            let j = run(
                "journalctl",
                &["-u", "containerd.service", "-o", "cat", "--since", &since],
            );
            if !j.ok() {
                failures.push(format!("journalctl: {j:?}"));
            } else if !j.stdout.contains("remains running after unit stopped") {
                failures.push(format!(
                    "containerd.service's journal since the restart names no process left \
                     running (the shims should be there): {:?}",
                    j.stdout
                ));
            }
            j.stdout
        } else {
            eprintln!("no journald here: containerd.service's journal is not checked");
            String::new()
        };
        for a in &mut pods {
            match reconnect().await {
                Ok(rt) => a.p.rt = rt,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            }
            failures.extend(pod_after_restart(a, &journal, &in_service).await);
        }
    }
    // teardown: each pod stopped and removed, its scopes gone, nothing below its slice
    let mut ids = Vec::new();
    for a in &mut pods {
        let handler = a.p.handler.clone();
        for e in teardown(&mut a.p).await {
            failures.push(format!("{handler}: teardown: {e}"));
        }
        for unit_id in [&a.id, &a.c] {
            if let Err(e) = scope_gone(unit_id, &a.slice) {
                failures.push(format!("{handler}: {e}"));
            }
        }
        let below = cgroups_below(&a.slice.path());
        if !below.is_empty() {
            failures.push(format!(
                "{handler}: cgroups left in the pod slice: {below:?}"
            ));
        }
        if let Err(e) = a.slice.destroy() {
            failures.push(format!("{handler}: {e}"));
        }
        ids.extend(a.p.all_ids());
    }
    let mut leftovers = Vec::new();
    let clean = poll(HANG, || {
        leftovers = g.leftovers(&ids);
        leftovers.is_empty().then_some(())
    });
    if clean.is_none() {
        failures.push(format!("leftovers: {leftovers:?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
