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
mod tests;
