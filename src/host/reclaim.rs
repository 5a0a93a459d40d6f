//! Takes down runc containers whose shim is gone (SIGKILLed, crashed): `delete` runs this for a
//! task bundle, and for every member container of a pod whose shim died.
//!
//! A container's processes outlive its shim, and nothing else will run `runc delete` for it:
//! containerd only closes the dead connection and removes the bundle, so the container's cgroup
//! (in every v1 hierarchy) and its runc state would stay forever (containerd's own runc shim
//! leaves both). For each container: `runc delete --force` with the runc root and binary it was
//! created with (runc kills what still runs, removes the cgroups and the state); then whatever
//! is still there is taken down directly: the processes left in its cgroups are killed (v2
//! `cgroup.kill`, else as runc's `signalAllProcesses`: freeze, collect the pids of the whole
//! subtree, SIGKILL each, thaw), the cgroup directories removed (deepest first) and the runc
//! state directory too. The cgroups come from runc's `state.json` (`cgroup_paths`), read before
//! runc deletes it, else from the container's `cgroupsPath`.
//!
//! Only cgroups that are the container's own are touched, and which are is decided at create,
//! not from a name ([`crate::host::cgroup_ownership`]): the directories runc made, because none of
//! them existed before its `runc create`. A spec may name a cgroup shared with others
//! (`/system.slice`, even as task `system.slice`), and runc's state then names that one. Its
//! processes are not the container's to kill (`runc delete --force` kills only the
//! container's own), nor its directories ours to remove.
//!
//! The members of a pod are taken down in parallel ([`reclaim_all`]), each within the budget
//! `delete` gives them: a `runc delete` that hangs costs the others nothing, and whatever is not
//! done when the budget ends is reported with the step it was in.
//!
//! Which containers belong to a pod: the sandbox record lists each one before its `runc create`
//! ([`Member`]); a scan of the runc roots ([`members_in_root`]) also finds those that runc's
//! state labels (the OCI annotations) put in the pod, in case the record missed one.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::host::cgroup_ownership::{CgroupsAtCreate, dirs_of};
use crate::host::runtime::{Runc, RuncConfig, Runtime};
use crate::records::error::Kind;
use crate::shim::reaper::Spawner;
use crate::shim::timing::{Budget, Undone};

/// containerd's CRI annotation naming a container's pod (runc copies annotations into the
/// labels of its state).
const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// How long the cgroups of a killed container may take to empty before they are removed.
const EMPTY_WAIT: Duration = Duration::from_secs(2);
/// How long a freezer may take to freeze the processes before they are killed.
const FREEZE_WAIT: Duration = Duration::from_secs(1);
/// How long `runc delete --force` of a dead shim's container may take (runc kills and waits).
const RUNC_DELETE_TIMEOUT: Duration = Duration::from_secs(4);
/// What [`reclaim_all`] keeps of its budget for the members to report (a helper killed at its
/// timeout is waited for briefly).
const REPORT_MARGIN: Duration = Duration::from_millis(200);

/// A container of a pod, as the sandbox record keeps it for `delete`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub id: String,
    /// The task bundle (its rootfs mount is ours to undo).
    pub bundle: Option<PathBuf>,
    pub runc: RuncConfig,
    /// `linux.cgroupsPath` of its spec: where its cgroups are if runc's state is gone.
    #[serde(default)]
    pub cgroups_path: Option<String>,
    /// Which of its cgroup directories existed before its `runc create`: its cgroups are its
    /// own to kill in and remove only when runc made them all. `None`: a record of a shim
    /// from before the survey, or a container found only in runc's state: not its own.
    #[serde(default)]
    pub cgroups_at_create: Option<CgroupsAtCreate>,
}

/// What runc's `state.json` tells about a container.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RuncState {
    /// Its cgroup directory in each hierarchy (v1: one per controller, v2: one).
    pub cgroup_dirs: Vec<PathBuf>,
    pub bundle: Option<PathBuf>,
    pub sandbox_id: Option<String>,
}

/// Parses runc's `state.json` (the fields every runc since 1.0 writes).
pub fn parse_state(raw: &[u8]) -> Option<RuncState> {
    let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
    let mut cgroup_dirs: Vec<PathBuf> = v
        .get("cgroup_paths")
        .and_then(|p| p.as_object())
        .map(|m| {
            m.values()
                .filter_map(|d| d.as_str())
                .map(PathBuf::from)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    cgroup_dirs.sort();
    cgroup_dirs.dedup();
    let labels: Vec<&str> = v
        .pointer("/config/labels")
        .and_then(|l| l.as_array())
        .map(|a| a.iter().filter_map(|l| l.as_str()).collect())
        .unwrap_or_default();
    let label = |key: &str| {
        labels
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    Some(RuncState {
        cgroup_dirs,
        bundle: label("bundle").map(PathBuf::from),
        sandbox_id: label(SANDBOX_ID_ANNOTATION),
    })
}

fn read_state(root: &Path, id: &str) -> Option<RuncState> {
    parse_state(&std::fs::read(root.join(id).join("state.json")).ok()?)
}

/// The containers in runc root `root` whose state puts them in pod `pod`.
pub fn members_in_root(root: &Path, pod: &str) -> Vec<(String, RuncState)> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<(String, RuncState)> = rd
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_str()?.to_string();
            crate::records::validate::id("container id", &id).ok()?;
            let state = read_state(root, &id)?;
            (state.sandbox_id.as_deref() == Some(pod) && id != pod).then_some((id, state))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Whether `member`'s cgroups are its own to kill in and remove: runc made them all, as its
/// create recorded ([`crate::host::cgroup_ownership`]); else the reason they are not.
fn owns_its_cgroups(member: &Member) -> Result<(), String> {
    match &member.cgroups_at_create {
        Some(at) if at.made_by_runc() => Ok(()),
        Some(at) => Err(at.why_not_own()),
        None => Err(
            "no record says its runc made its cgroup (a record of an older shim, or a \
                     container found only in runc's state)"
                .into(),
        ),
    }
}

/// Where a member's take-down is (for the report of one the deadline cut off).
pub type Stage = Mutex<&'static str>;

/// Takes down `members` (see the module doc) in parallel, each on a thread of its own, within
/// `budget`, adding to `undone` what could not be done. A member still at work when the budget
/// ends is reported cut off with the step it was in, and left to finish on its own while the
/// process lives (each of its waits ends with the budget anyway).
pub fn reclaim_all(members: &[Member], budget: &Budget, undone: &mut Undone) {
    let (tx, rx) = std::sync::mpsc::channel();
    // Each member's own waits end a little before the budget, so that one whose `runc delete`
    // was killed at its timeout still reports that.
    let own = budget.before(REPORT_MARGIN);
    // The stage of each member that runs on a thread of its own, until it reports.
    let mut running: Vec<Option<Arc<Stage>>> = Vec::new();
    for (i, member) in members.iter().enumerate() {
        let stage = Arc::new(Stage::new("start"));
        let (m, st, tx, b) = (member.clone(), stage.clone(), tx.clone(), own);
        let spawned = std::thread::Builder::new()
            .name("rsandbox-reclaim".into())
            .spawn(move || {
                let _ = tx.send((i, reclaim(&m, &b, &st)));
            });
        match spawned {
            Ok(_) => running.push(Some(stage)),
            // No thread: take it down here, as the budget allows.
            Err(_) => {
                running.push(None);
                undone.extend(reclaim(member, &own, &stage));
            }
        }
    }
    drop(tx);
    let mut reports: Vec<(usize, Undone)> = Vec::new();
    while running.iter().any(Option::is_some) {
        match rx.recv_timeout(budget.left()) {
            Ok((i, u)) => {
                running[i] = None;
                reports.push((i, u));
            }
            Err(_) => break,
        }
    }
    reports.sort_by_key(|(i, _)| *i);
    for (_, u) in reports {
        undone.extend(u);
    }
    for (member, stage) in members.iter().zip(&running) {
        if let Some(stage) = stage {
            let at = stage.lock().map(|s| *s).unwrap_or("?");
            undone.cut_off(format!("container {} (at: {at})", member.id));
        }
    }
}

/// Takes down `member` (see the module doc): nothing of it is left running or on disk, as far
/// as the system lets us, within `budget` (shared with the rest of `delete`); `stage` says
/// which step it is at. Returns what was left undone, for the caller to report. A container
/// whose cgroups could not be emptied keeps its runc state, so that `runc list` still shows it
/// and a later `runc delete` can take it down: removing the state would leave its processes
/// untracked.
pub fn reclaim(member: &Member, budget: &Budget, stage: &Stage) -> Undone {
    let at = |s: &'static str| {
        if let Ok(mut g) = stage.lock() {
            *g = s;
        }
    };
    let mut undone = Undone::default();
    if crate::records::validate::id("container id", &member.id).is_err()
        || !member.runc.root.is_absolute()
    {
        undone.failed(format!("{:?}: not a container id and runc root", member.id));
        return undone;
    }
    let id = &member.id;
    // Read before runc deletes it: where its cgroups are (only the container's own directories,
    // strictly below a mounted hierarchy's root, the unified one of a hybrid host too: the
    // fallback below kills what is in them and removes them).
    at("read its runc state");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts: Vec<PathBuf> = crate::host::cgroups::cgroup_mounts(&mountinfo)
        .into_iter()
        .map(|m| m.mountpoint)
        .collect();
    let mut dirs: Vec<PathBuf> = read_state(&member.runc.root, id)
        .map(|s| s.cgroup_dirs)
        .unwrap_or_default()
        .into_iter()
        .filter(|d| below_a_root(d, &mounts))
        .collect();
    // A systemd path's scope is systemd's unit: runc delete stops it; nothing to fall back on.
    if dirs.is_empty()
        && let Some(path) = &member.cgroups_path
        && !crate::host::systemd::names::is_systemd_cgroups_path(path)
    {
        dirs = dirs_of(path, &hierarchy_roots()).unwrap_or_default();
    }
    if let Err(why) = owns_its_cgroups(member) {
        if let Some(d) = dirs.iter().find(|d| d.is_dir()) {
            undone.failed(format!(
                "container {id}: its cgroup {} is not its own ({why}): delete kills nothing in \
                 it and removes nothing of it (runc delete --force kills the container's own \
                 processes)",
                d.display()
            ));
        }
        dirs.clear();
    }
    at("runc delete --force");
    if budget.is_spent() {
        undone.cut_off(format!("container {id}: runc delete --force"));
    } else {
        let rt = Runc::new(member.runc.clone(), Spawner::direct(), std::env::temp_dir())
            .with_timeout(budget.bound(RUNC_DELETE_TIMEOUT));
        if let Err(e) = rt.delete(id, true)
            && e.kind() != Kind::NotFound
        {
            undone.failed(format!("container {id}: {e}"));
        }
    }
    let left: Vec<PathBuf> = dirs.into_iter().filter(|d| d.is_dir()).collect();
    let mut emptied = true;
    if !left.is_empty() {
        at("kill the processes in its cgroups");
        kill_cgroup_processes(&left, budget.bound(FREEZE_WAIT), KillWith::CgroupKill);
        at("remove its cgroups");
        // One deadline for all of them: containerd gives `delete` 5 s in all.
        let deadline = budget.deadline(EMPTY_WAIT);
        for d in &left {
            if let Err(e) = remove_cgroup_tree(d, deadline) {
                emptied = false;
                undone.failed(format!(
                    "container {id}: remove cgroup {}: {e}",
                    d.display()
                ));
            }
        }
    }
    at("remove its runc state");
    let state_dir = member.runc.root.join(id);
    if !emptied {
        if state_dir.exists() {
            undone.failed(format!(
                "container {id}: runc state {} kept: its cgroups still hold processes",
                state_dir.display()
            ));
        }
    } else if state_dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&state_dir)
    {
        undone.failed(format!(
            "container {id}: remove runc state {}: {e}",
            state_dir.display()
        ));
    }
    if let Some(bundle) = &member.bundle {
        at("unmount its rootfs");
        // The rootfs and the idmapped layers' scratch mount: containerd's bundle removal
        // cannot remove a directory something is still mounted on.
        for dir in [
            crate::records::bundle::ROOTFS_DIR,
            crate::records::bundle::IDMAPPED_SCRATCH,
        ] {
            if let Err(e) = crate::host::mount::unmount(&bundle.join(dir)) {
                undone.failed(format!("container {id}: {e}"));
            }
        }
    }
    at("done");
    undone
}

/// Whether `dir` lies strictly below one of `roots`, through plain components only.
fn below_a_root(dir: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| {
        dir.strip_prefix(r).is_ok_and(|rel| {
            !rel.as_os_str().is_empty()
                && rel.components().all(|c| matches!(c, Component::Normal(_)))
        })
    })
}

/// The mount points of the hierarchies containers get cgroups in: the unified one on a
/// v2-only host, else every v1 hierarchy.
fn hierarchy_roots() -> Vec<PathBuf> {
    let unified = crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    crate::host::cgroups::cgroup_mounts(&mountinfo)
        .into_iter()
        .filter(|m| m.unified == unified)
        .map(|m| m.mountpoint)
        .collect()
}

/// How [`kill_cgroup_processes`] kills: v2's `cgroup.kill` where the kernel has it (5.14), or
/// always the way without it (for the tests of that way on a kernel that has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillWith {
    CgroupKill,
    FreezeAndSignal,
}

/// SIGKILLs every process in `dirs` (a container's own cgroup in each hierarchy) and in the
/// cgroups below them, as runc's `signalAllProcesses` does: v2 `cgroup.kill` (the kernel kills
/// the whole subtree) where the kernel has it; else the cgroups are frozen (v1 `freezer.state`,
/// v2 `cgroup.freeze`) so that no process can fork or exit between the read of the pids and
/// the kill (an exited process's pid could be someone else's by then), the pids of every
/// cgroup of the subtrees are collected, each is SIGKILLed, and the cgroups are thawed so the
/// kills are delivered (a v1 freezer holds even SIGKILL). Without any freezer (v2 before 5.2)
/// the pids are killed unfrozen, as runc does.
pub fn kill_cgroup_processes(dirs: &[PathBuf], freeze_wait: Duration, how: KillWith) {
    signal_all(dirs, freeze_wait, how, |_| {});
}

/// [`kill_cgroup_processes`], running `between` after the pids are collected and before they
/// are killed (the window a freeze closes; for the tests).
fn signal_all(
    dirs: &[PathBuf],
    freeze_wait: Duration,
    how: KillWith,
    between: impl FnOnce(&BTreeSet<i32>),
) {
    if how == KillWith::CgroupKill {
        for d in dirs {
            if write_control(&d.join("cgroup.kill"), "1") {
                return;
            }
        }
    }
    let frozen = freeze(dirs, freeze_wait);
    let mut pids = BTreeSet::new();
    for d in dirs {
        collect_pids(d, &mut pids);
    }
    between(&pids);
    let me = std::process::id() as i32;
    for &pid in pids.iter().filter(|&&p| p > 1 && p != me) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for (file, thawed) in frozen {
        write_control(&file, thawed);
    }
}

/// Freezes each of `dirs` that has a freezer (v1 `freezer.state` in the freezer hierarchy, v2
/// `cgroup.freeze`; a frozen cgroup freezes its whole subtree) and waits, at most
/// `wait` in all, until the kernel says frozen. Returns the files to thaw and their value.
fn freeze(dirs: &[PathBuf], wait: Duration) -> Vec<(PathBuf, &'static str)> {
    let until = Instant::now() + wait;
    let mut frozen = Vec::new();
    for d in dirs {
        let (v1, v2) = (d.join("freezer.state"), d.join("cgroup.freeze"));
        if v1.exists() && write_control(&v1, "FROZEN") {
            frozen.push((v1.clone(), "THAWED"));
            while Instant::now() < until
                && std::fs::read_to_string(&v1).is_ok_and(|s| s.trim() == "FREEZING")
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        } else if v2.exists() && write_control(&v2, "1") {
            frozen.push((v2, "0"));
            let events = d.join("cgroup.events");
            while Instant::now() < until
                && std::fs::read_to_string(&events)
                    .is_ok_and(|s| !s.lines().any(|l| l.trim() == "frozen 1"))
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    frozen
}

/// The pids in cgroup `dir` and every cgroup below it (`cgroup.procs`), into `pids`.
fn collect_pids(dir: &Path, pids: &mut BTreeSet<i32>) {
    pids.extend(procs(dir));
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), pids);
            }
        }
    }
}

/// The pids in cgroup `dir` (`cgroup.procs`); none if it is gone.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn write_control(file: &Path, value: &str) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(file)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .is_ok()
}

/// Removes cgroup `dir` and the cgroups below it, deepest first, once the killed processes
/// have left them (EBUSY until then), until `deadline`.
fn remove_cgroup_tree(dir: &Path, deadline: Instant) -> std::io::Result<()> {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path(), deadline)?;
            }
        }
    }
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = r#"{"id":"c1","init_process_pid":4242,
        "config":{"labels":["io.kubernetes.cri.sandbox-id=pod1","bundle=/run/b/c1",
                            "io.kubernetes.cri.container-type=container"]},
        "cgroup_paths":{"memory":"/sys/fs/cgroup/memory/k8s.io/c1",
                        "cpu":"/sys/fs/cgroup/cpu/k8s.io/c1",
                        "cpuacct":"/sys/fs/cgroup/cpu/k8s.io/c1",
                        "bad":"relative/c1"}}"#;

    #[test]
    fn state_gives_cgroups_bundle_and_pod() {
        let s = parse_state(STATE.as_bytes()).unwrap();
        assert_eq!(
            s.cgroup_dirs,
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu/k8s.io/c1"),
                PathBuf::from("/sys/fs/cgroup/memory/k8s.io/c1")
            ]
        );
        assert_eq!(s.bundle, Some(PathBuf::from("/run/b/c1")));
        assert_eq!(s.sandbox_id.as_deref(), Some("pod1"));
        // v2: one unnamed path; no labels at all.
        let v2 = parse_state(br#"{"cgroup_paths":{"":"/sys/fs/cgroup/k8s.io/c2"}}"#).unwrap();
        assert_eq!(
            v2.cgroup_dirs,
            vec![PathBuf::from("/sys/fs/cgroup/k8s.io/c2")]
        );
        assert_eq!(v2.sandbox_id, None);
        assert!(parse_state(b"not json").is_none());
    }

    #[test]
    fn the_root_scan_finds_only_the_pods_containers() {
        let root = tempfile::tempdir().unwrap();
        let put = |id: &str, pod: &str| {
            std::fs::create_dir(root.path().join(id)).unwrap();
            std::fs::write(
                root.path().join(id).join("state.json"),
                STATE.replace("pod1", pod),
            )
            .unwrap();
        };
        put("c1", "pod1");
        put("c2", "pod1");
        put("other", "pod2");
        put("pod1", "pod1"); // a pause container of the runc path names its own pod
        std::fs::create_dir(root.path().join("no-state")).unwrap();
        let ids: Vec<String> = members_in_root(root.path(), "pod1")
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, vec!["c1", "c2"]);
        assert!(members_in_root(Path::new("/nonexistent/runc"), "pod1").is_empty());
    }

    #[test]
    fn what_runc_s_state_names_is_used_only_below_a_root() {
        let roots = vec![
            PathBuf::from("/sys/fs/cgroup/memory"),
            PathBuf::from("/sys/fs/cgroup/pids"),
        ];
        // What runc's state names is used only strictly below a hierarchy's root.
        assert!(below_a_root(
            Path::new("/sys/fs/cgroup/memory/k8s.io/c1"),
            &roots
        ));
        assert!(!below_a_root(Path::new("/sys/fs/cgroup/memory"), &roots));
        assert!(!below_a_root(
            Path::new("/sys/fs/cgroup/memory/k8s.io/../../.."),
            &roots
        ));
        assert!(!below_a_root(Path::new("/etc/k8s.io/c1"), &roots));
    }

    #[test]
    fn a_bad_member_is_refused_before_anything_runs() {
        let m = Member {
            id: "../x".into(),
            bundle: None,
            runc: RuncConfig::defaults("k8s.io"),
            cgroups_path: None,
            cgroups_at_create: None,
        };
        let undone = reclaim(&m, &Budget::new(Duration::from_secs(60)), &Stage::new(""));
        assert_eq!(undone.failed.len(), 1, "{undone:?}");
    }

    /// Where runc cannot delete (here: a "runc" that always fails), the container's processes
    /// are killed through its cgroups and the cgroups and the state dir removed anyway.
    #[test]
    #[ignore = "needs root"]
    fn without_runc_the_processes_are_killed_and_the_cgroups_removed() {
        let unified = crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
        // The freezer (v1, for the kill) and pids hierarchies, or the unified one.
        let roots: Vec<PathBuf> = hierarchy_roots()
            .into_iter()
            .filter(|r| unified || r.ends_with("freezer") || r.ends_with("pids"))
            .collect();
        reclaim_without_runc(&roots);
        // cgroup v2's cgroup.kill: the unified hierarchy (also mounted on a hybrid host).
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let v2: Vec<PathBuf> = crate::host::cgroups::cgroup_mounts(&mountinfo)
            .into_iter()
            .filter(|m| m.unified)
            .map(|m| m.mountpoint)
            .take(1)
            .collect();
        if !v2.is_empty() {
            reclaim_without_runc(&v2);
        }
    }

    /// Container `id` with its runc state in `root` and a "runc" that always fails.
    fn member_with_failing_runc(id: &str, root: &Path) -> Member {
        Member {
            id: id.to_string(),
            bundle: None,
            runc: RuncConfig {
                binary: "/bin/false".into(),
                root: root.to_path_buf(),
                ..RuncConfig::defaults("ns")
            },
            cgroups_path: None,
            // its create found none of its cgroups: runc made them
            cgroups_at_create: Some(CgroupsAtCreate::default()),
        }
    }

    /// runc's state of container `id` in `root`, naming `cgroup_paths` (only).
    fn write_runc_state(root: &Path, id: &str, cgroup_paths: serde_json::Value) {
        std::fs::create_dir(root.join(id)).unwrap();
        std::fs::write(
            root.join(id).join("state.json"),
            serde_json::json!({ "cgroup_paths": cgroup_paths }).to_string(),
        )
        .unwrap();
    }

    /// `dirs` as runc's state names a container's cgroups (keyed here by their index).
    fn cgroup_paths(dirs: &[PathBuf]) -> serde_json::Value {
        let paths: serde_json::Map<String, serde_json::Value> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| (i.to_string(), d.display().to_string().into()))
            .collect();
        paths.into()
    }

    /// A `sleep` in a cgroup under each of `roots`, runc state naming those cgroups, a runc
    /// that always fails: `reclaim` kills the sleep and removes the cgroups and the state.
    fn reclaim_without_runc(roots: &[PathBuf]) {
        use std::os::unix::process::ExitStatusExt;
        assert!(!roots.is_empty(), "no cgroup hierarchy");
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let id = format!("rsandbox-reclaim-{}", child.id());
        let dirs: Vec<PathBuf> = roots.iter().map(|r| r.join(&id)).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        let runc_root = tempfile::tempdir().unwrap();
        write_runc_state(runc_root.path(), &id, cgroup_paths(&dirs));
        let member = member_with_failing_runc(&id, runc_root.path());
        let undone = reclaim(
            &member,
            &Budget::new(Duration::from_secs(60)),
            &Stage::new(""),
        );
        assert_eq!(undone.failed.len(), 1, "only runc's failure: {undone:?}");
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        for d in &dirs {
            assert!(!d.exists(), "{} left", d.display());
        }
        assert!(!runc_root.path().join(&id).exists());
    }

    /// A `sleep` moved into cgroup `dir` (made if missing; v1 cpuset gets its parent's CPUs and
    /// memory nodes, without which nothing can join it).
    fn sleep_in(dirs: &[PathBuf]) -> std::process::Child {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        for d in dirs {
            make_cgroup(d);
            std::fs::write(d.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        child
    }

    /// Makes cgroup `d` if missing. A new v1 cpuset cgroup has no CPUs and memory nodes (a
    /// process cannot join it): it gets its parent's. (v2's empty ones mean "the parent's".)
    fn make_cgroup(d: &Path) {
        if d.is_dir() {
            return;
        }
        std::fs::create_dir(d).unwrap();
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let own = std::fs::read_to_string(d.join(f)).unwrap_or_default();
            if own.trim().is_empty()
                && let Ok(v) = std::fs::read_to_string(d.parent().unwrap().join(f))
                && !v.trim().is_empty()
            {
                std::fs::write(d.join(f), v.trim()).unwrap();
            }
        }
    }

    /// Whether `child` ends (is killed) within 30 s (a hang: it would sleep 600 s).
    fn killed(child: &mut std::process::Child) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Some(st) = child.try_wait().unwrap() {
                return st.signal() == Some(libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Removes cgroup trees made by a test (after its processes are gone).
    fn remove_test_cgroups(dirs: &[PathBuf]) {
        for d in dirs {
            let _ = remove_cgroup_tree(d, Instant::now() + Duration::from_secs(5));
        }
    }

    /// The v1 hierarchies with a freezer (for the fallback kill) and pids, if the host has v1.
    fn v1_roots() -> Vec<PathBuf> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        crate::host::cgroups::cgroup_mounts(&mountinfo)
            .into_iter()
            .filter(|m| !m.unified && m.controllers.iter().any(|c| c == "freezer" || c == "pids"))
            .map(|m| m.mountpoint)
            .collect()
    }

    /// The unified hierarchy (v2 only, or beside v1 on a hybrid host), if mounted.
    fn v2_root() -> Option<PathBuf> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        crate::host::cgroups::cgroup_mounts(&mountinfo)
            .into_iter()
            .find(|m| m.unified)
            .map(|m| m.mountpoint)
    }

    /// Issue 27 item 1 and issue 33 item 2: runc's state names a cgroup shared with others (a
    /// spec's cgroupsPath `/system.slice` for a task named `system.slice`: the name is the
    /// container's ID, so no rule by name can tell), here a test cgroup holding another process
    /// in a child cgroup, in every hierarchy, v2's `cgroup.kill` included. The record's survey,
    /// taken as create takes it (before `runc create`), found the cgroup; with runc failing,
    /// `reclaim` kills nothing in it and removes none of it, and says why. A record without a
    /// survey (an older shim's) is treated the same; one whose survey found nothing would be
    /// runc's own (the other tests).
    #[test]
    #[ignore = "needs root"]
    fn a_shared_cgroup_in_runc_state_is_neither_killed_nor_removed() {
        let mut roots = v1_roots();
        roots.extend(v2_root());
        let shared = format!("rsandbox-reclaim-shared-{}", std::process::id());
        let dirs: Vec<PathBuf> = roots.iter().map(|r| r.join(&shared)).collect();
        for d in &dirs {
            make_cgroup(d);
        }
        let foreign_dirs: Vec<PathBuf> = dirs.iter().map(|d| d.join("foreign")).collect();
        let mut foreign = sleep_in(&foreign_dirs);
        // The container's ID is the shared cgroup's name, as for task `system.slice`.
        let id = shared.clone();
        let surveyed = crate::host::cgroup_ownership::survey(
            Some(&format!("/{shared}")),
            &crate::host::cgroup_ownership::all_hierarchies(),
        );
        let mut results = Vec::new();
        for (what, at_create) in [("surveyed", Some(surveyed)), ("no survey", None)] {
            let runc_root = tempfile::tempdir().unwrap();
            write_runc_state(runc_root.path(), &id, cgroup_paths(&dirs));
            let member = Member {
                cgroups_at_create: at_create,
                ..member_with_failing_runc(&id, runc_root.path())
            };
            let undone = reclaim(
                &member,
                &Budget::new(Duration::from_secs(60)),
                &Stage::new(""),
            );
            let alive = foreign.try_wait().unwrap().is_none();
            let kept: Vec<bool> = foreign_dirs.iter().map(|d| d.is_dir()).collect();
            results.push((what, alive, kept, undone));
        }
        let _ = foreign.kill();
        let _ = foreign.wait();
        remove_test_cgroups(&dirs);
        for (what, alive, kept, undone) in results {
            assert!(
                alive,
                "{what}: reclaim killed a process of a cgroup that is not the container's"
            );
            assert!(
                kept.iter().all(|k| *k),
                "{what}: removed: {foreign_dirs:?} {kept:?}"
            );
            assert!(
                undone.failed.iter().any(|p| p.contains("is not its own")),
                "{what}: {undone:?}"
            );
        }
    }

    /// The test cgroups `name` of the fallback kill's tests, by kind: below each v1 hierarchy
    /// with a freezer or pids, and below the unified one (where the tests force the fallback:
    /// it has `cgroup.kill`, 5.14+). A kind this host does not have is left out.
    fn fallback_kill_cgroups(name: &str) -> Vec<(&'static str, Vec<PathBuf>)> {
        let v2: Vec<PathBuf> = v2_root().into_iter().collect();
        [("v1", v1_roots()), ("v2 without cgroup.kill", v2)]
            .into_iter()
            .filter(|(_, roots)| !roots.is_empty())
            .map(|(what, roots)| (what, roots.iter().map(|r| r.join(name)).collect()))
            .collect()
    }

    /// The pids in cgroups `dirs` and their descendants.
    fn pids_in(dirs: &[PathBuf]) -> BTreeSet<i32> {
        let mut pids = BTreeSet::new();
        for d in dirs {
            collect_pids(d, &mut pids);
        }
        pids
    }

    /// Issue 27 item 7: without `cgroup.kill` (v1; v2 before 5.14) the fallback kill takes the
    /// processes of nested cgroups too (it read only the top directory's `cgroup.procs`), as
    /// runc's `signalAllProcesses` does: freeze, collect the pids of the whole subtree, kill,
    /// thaw. On v1 (this host's freezer and pids hierarchies) and on v2 with the fallback
    /// forced (the unified hierarchy has `cgroup.kill`, 5.14+).
    #[test]
    #[ignore = "needs root"]
    fn the_fallback_kill_takes_nested_cgroups_and_thaws() {
        let name = format!("rsandbox-reclaim-nested-{}", std::process::id());
        let kinds = fallback_kill_cgroups(&name);
        assert!(!kinds.is_empty(), "no cgroup hierarchy");
        for (what, dirs) in kinds {
            let mut top = sleep_in(&dirs);
            let nested: Vec<PathBuf> = dirs.iter().map(|d| d.join("nested/deeper")).collect();
            for d in &dirs {
                make_cgroup(&d.join("nested"));
            }
            let mut deep = sleep_in(&nested);
            kill_cgroup_processes(&dirs, FREEZE_WAIT, KillWith::FreezeAndSignal);
            let (top_killed, deep_killed) = (killed(&mut top), killed(&mut deep));
            let thawed: Vec<String> = dirs
                .iter()
                .filter_map(|d| {
                    std::fs::read_to_string(d.join("freezer.state"))
                        .or_else(|_| std::fs::read_to_string(d.join("cgroup.freeze")))
                        .ok()
                })
                .map(|s| s.trim().to_string())
                .collect();
            remove_test_cgroups(&dirs);
            assert!(
                top_killed,
                "{what}: the process in the cgroup itself survived"
            );
            assert!(
                deep_killed,
                "{what}: the process in a nested cgroup survived"
            );
            assert!(!thawed.is_empty(), "{what}: no freezer");
            assert!(
                thawed.iter().all(|s| s == "THAWED" || s == "0"),
                "{what}: left frozen: {thawed:?}"
            );
        }
    }

    /// Issue 27 item 7: between reading the pids and killing them nothing may fork away (nor
    /// exit and leave its pid to another process): the cgroups are frozen meanwhile. In that
    /// window the test asks a shell in the cgroup to start another process (SIGUSR1, which it
    /// traps): frozen, it cannot, and one kill leaves nothing running; unfrozen, the new
    /// process is not among the pids read and runs on. On v1 and on v2 without `cgroup.kill`.
    #[test]
    #[ignore = "needs root"]
    fn nothing_forks_away_between_reading_the_pids_and_the_kill() {
        let name = format!("rsandbox-reclaim-forks-{}", std::process::id());
        for (what, dirs) in fallback_kill_cgroups(&name) {
            for d in &dirs {
                make_cgroup(d);
            }
            let ready = tempfile::tempdir().unwrap();
            let mark = ready.path().join("trapping");
            let mut shell = std::process::Command::new("sh")
                .args([
                    "-c",
                    &format!(
                        "trap 'sleep 600 &' USR1; touch {}; while :; do sleep 0.05; done",
                        mark.display()
                    ),
                ])
                .spawn()
                .unwrap();
            for d in &dirs {
                std::fs::write(d.join("cgroup.procs"), shell.id().to_string()).unwrap();
            }
            let until = Instant::now() + Duration::from_secs(30);
            while !mark.exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut started_in_window = Vec::new();
            signal_all(&dirs, FREEZE_WAIT, KillWith::FreezeAndSignal, |read| {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(shell.id() as i32),
                    nix::sys::signal::Signal::SIGUSR1,
                );
                // Frozen, nothing new ever shows; unfrozen, the trap runs within 50 ms.
                let until = Instant::now() + Duration::from_secs(1);
                while started_in_window.is_empty() && Instant::now() < until {
                    started_in_window = pids_in(&dirs).difference(read).copied().collect();
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let shell_killed = killed(&mut shell);
            let until = Instant::now() + Duration::from_secs(5);
            let left = loop {
                let left = pids_in(&dirs);
                if left.is_empty() || Instant::now() > until {
                    break left;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            for &pid in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            remove_test_cgroups(&dirs);
            assert!(shell_killed, "{what}: the shell survived");
            assert!(
                started_in_window.is_empty() && left.is_empty(),
                "{what}: started between the read and the kill: {started_in_window:?}; \
                 still running: {left:?}"
            );
        }
    }

    /// A fake runc at `dir/runc` running `body` (sh) for `delete`.
    fn fake_runc(dir: &Path, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("runc");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    }

    fn members_with_runc(n: usize, binary: &str, root: &Path) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                id: format!("m{i}"),
                bundle: None,
                runc: RuncConfig {
                    binary: binary.to_string(),
                    root: root.to_path_buf(),
                    ..RuncConfig::defaults("ns")
                },
                cgroups_path: None,
                cgroups_at_create: None,
            })
            .collect()
    }

    /// Issue 27 item 3: a pod's members are taken down in parallel. Each fake `runc delete`
    /// here waits until all eight have started: one at a time, the first would wait until
    /// its timeout and the others never run in time.
    #[test]
    fn members_are_taken_down_in_parallel() {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("started");
        std::fs::create_dir(&marks).unwrap();
        let runc = fake_runc(
            dir.path(),
            &format!(
                "touch {m}/$$\nwhile [ \"$(ls {m} | wc -l)\" -lt 8 ]; do sleep 0.05; done\nexit 0",
                m = marks.display()
            ),
        );
        let members = members_with_runc(8, &runc, dir.path());
        let mut undone = Undone::default();
        reclaim_all(&members, &Budget::new(Duration::from_secs(30)), &mut undone);
        assert!(undone.is_empty(), "{undone:?}");
        assert_eq!(std::fs::read_dir(&marks).unwrap().count(), 8);
    }

    /// Issue 27 item 3: eight members whose `runc delete` hangs end with the budget, each
    /// reported (its runc timed out and was killed, or the deadline cut it off).
    #[test]
    fn hanging_members_end_with_the_budget_and_are_each_reported() {
        let dir = tempfile::tempdir().unwrap();
        let runc = fake_runc(dir.path(), "exec sleep 600");
        let members = members_with_runc(8, &runc, dir.path());
        let mut undone = Undone::default();
        let start = Instant::now();
        reclaim_all(&members, &Budget::new(Duration::from_secs(1)), &mut undone);
        let took = start.elapsed();
        // Only a hang takes a minute: one `runc delete` waited for after another would take
        // the members' own 4 s timeout each.
        assert!(took < Duration::from_secs(60), "{took:?}");
        for m in &members {
            assert!(
                undone
                    .failed
                    .iter()
                    .chain(&undone.cut_off)
                    .any(|p| p.contains(&format!("container {} ", m.id))
                        || p.starts_with(&format!("container {}:", m.id))),
                "{} not reported: {undone:?}",
                m.id
            );
        }
        println!("8 hanging members, budget 1 s: {took:?}; {undone:?}");
    }

    /// A container cgroup that cannot be removed (here: something is mounted on it, so rmdir
    /// says EBUSY) keeps the container's runc state, and says so: removing it would leave
    /// whatever is still in the cgroup untracked.
    #[test]
    #[ignore = "needs root"]
    fn a_cgroup_that_stays_keeps_the_runc_state() {
        let root = hierarchy_roots()
            .into_iter()
            .find(|r| r.ends_with("pids") || crate::host::cgroups::is_unified(r))
            .expect("a pids or unified hierarchy");
        let id = format!("rsandbox-reclaim-busy-{}", std::process::id());
        let dir = root.join(&id);
        std::fs::create_dir(&dir).unwrap();
        let mounted = nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
        let runc_root = tempfile::tempdir().unwrap();
        write_runc_state(
            runc_root.path(),
            &id,
            serde_json::json!({"pids": dir.display().to_string()}),
        );
        let member = member_with_failing_runc(&id, runc_root.path());
        let problems = reclaim(
            &member,
            &Budget::new(Duration::from_millis(300)),
            &Stage::new(""),
        )
        .failed;
        let _ = nix::mount::umount(&dir);
        let _ = std::fs::remove_dir(&dir);
        mounted.unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("runc state") && p.contains("kept")),
            "{problems:?}"
        );
        assert!(runc_root.path().join(&id).join("state.json").exists());
    }

    /// The directory walk removes children first and treats a missing cgroup as done.
    #[test]
    fn tree_removal_goes_deepest_first() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path().join("c1");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        remove_cgroup_tree(&top, Instant::now()).unwrap();
        assert!(!top.exists());
        remove_cgroup_tree(&top, Instant::now()).unwrap();
    }
}
