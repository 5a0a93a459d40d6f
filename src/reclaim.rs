//! Takes down runc containers whose shim is gone (SIGKILLed, crashed): `delete` runs this for a
//! task bundle, and for every member container of a pod whose shim died.
//!
//! A container's processes outlive its shim, and nothing else will run `runc delete` for it:
//! containerd only closes the dead connection and removes the bundle, so the container's cgroup
//! (in every v1 hierarchy) and its runc state would stay forever (containerd's own runc shim
//! leaves both). For each container: `runc delete --force` with the runc root and binary it was
//! created with (runc kills what still runs, removes the cgroups and the state); then whatever
//! is still there is taken down directly: the processes left in its cgroups are killed (v2
//! `cgroup.kill`, v1 freezer + SIGKILL to each pid), the cgroup directories removed (deepest
//! first) and the runc state directory too. The cgroups come from runc's `state.json`
//! (`cgroup_paths`), read before runc deletes it, else from the container's `cgroupsPath`.
//!
//! Which containers belong to a pod: the sandbox record lists each one before its `runc create`
//! ([`Member`]); a scan of the runc roots ([`members_in_root`]) also finds those that runc's
//! state labels (the OCI annotations) put in the pod, in case the record missed one.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::Kind;
use crate::reaper::Spawner;
use crate::runtime::{Runc, RuncConfig, Runtime};
use crate::timing::Budget;

/// containerd's CRI annotation naming a container's pod (runc copies annotations into the
/// labels of its state).
const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// How long the cgroups of a killed container may take to empty before they are removed.
const EMPTY_WAIT: Duration = Duration::from_secs(2);
/// How long a v1 freezer may take to freeze the processes before they are killed.
const FREEZE_WAIT: Duration = Duration::from_secs(1);
/// How long `runc delete --force` of a dead shim's container may take (runc kills and waits).
const RUNC_DELETE_TIMEOUT: Duration = Duration::from_secs(4);

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
            crate::validate::id("container id", &id).ok()?;
            let state = read_state(root, &id)?;
            (state.sandbox_id.as_deref() == Some(pod) && id != pod).then_some((id, state))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The directories of container `id`'s cgroupfs path `cgroups_path` (`/k8s.io/<id>`,
/// `<parent>/<id>`: what containerd gives a container ends in its ID) under each hierarchy in
/// `roots`. A systemd path (`slice:prefix:name`), one with `..`, or one that does not end in
/// the container's ID gives none: every process in these directories is killed, and a spec's
/// path naming a cgroup of others (`/system.slice`) must not take them along.
pub fn cgroup_dirs_of(cgroups_path: &str, id: &str, roots: &[PathBuf]) -> Vec<PathBuf> {
    if cgroups_path.contains(':') {
        return Vec::new();
    }
    let rel = Path::new(cgroups_path.trim_start_matches('/'));
    if rel.as_os_str().is_empty()
        || !rel.components().all(|c| matches!(c, Component::Normal(_)))
        || rel.file_name() != Some(std::ffi::OsStr::new(id))
    {
        return Vec::new();
    }
    roots.iter().map(|r| r.join(rel)).collect()
}

/// Takes down `member` (see the module doc): nothing of it is left running or on disk, as far
/// as the system lets us, within `budget` (shared with the rest of `delete`). Returns what
/// could not be done, for the caller to report. A container whose cgroups could not be
/// emptied keeps its runc state, so that `runc list` still shows it and a later `runc delete`
/// can take it down: removing the state would leave its processes untracked.
pub fn reclaim(member: &Member, budget: &Budget) -> Vec<String> {
    let mut problems = Vec::new();
    if crate::validate::id("container id", &member.id).is_err() || !member.runc.root.is_absolute() {
        return vec![format!("{:?}: not a container id and runc root", member.id)];
    }
    let id = &member.id;
    // Read before runc deletes it: where its cgroups are (only directories strictly below a
    // mounted hierarchy's root, the unified one of a hybrid host too: the fallback below kills
    // what is in them and removes them).
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts: Vec<PathBuf> = crate::cgroups::cgroup_mounts(&mountinfo)
        .into_iter()
        .map(|m| m.mountpoint)
        .collect();
    let mut dirs = read_state(&member.runc.root, id)
        .map(|s| s.cgroup_dirs)
        .unwrap_or_default();
    dirs.retain(|d| below_a_root(d, &mounts));
    if dirs.is_empty()
        && let Some(path) = &member.cgroups_path
    {
        dirs = cgroup_dirs_of(path, id, &hierarchy_roots());
    }
    let rt = Runc::new(member.runc.clone(), Spawner::direct(), std::env::temp_dir())
        .with_timeout(budget.bound(RUNC_DELETE_TIMEOUT));
    if let Err(e) = rt.delete(id, true)
        && e.kind() != Kind::NotFound
    {
        problems.push(format!("container {id}: {e}"));
    }
    let left: Vec<PathBuf> = dirs.into_iter().filter(|d| d.is_dir()).collect();
    let mut emptied = true;
    if !left.is_empty() {
        kill_cgroup_processes(&left, budget.bound(FREEZE_WAIT));
        // One deadline for all of them: containerd gives `delete` 5 s in all.
        let deadline = budget.deadline(EMPTY_WAIT);
        for d in &left {
            if let Err(e) = remove_cgroup_tree(d, deadline) {
                emptied = false;
                problems.push(format!(
                    "container {id}: remove cgroup {}: {e}",
                    d.display()
                ));
            }
        }
    }
    let state_dir = member.runc.root.join(id);
    if !emptied {
        if state_dir.exists() {
            problems.push(format!(
                "container {id}: runc state {} kept: its cgroups still hold processes",
                state_dir.display()
            ));
        }
    } else if state_dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&state_dir)
    {
        problems.push(format!(
            "container {id}: remove runc state {}: {e}",
            state_dir.display()
        ));
    }
    if let Some(bundle) = &member.bundle {
        // The rootfs and the idmapped layers' scratch mount: containerd's bundle removal
        // cannot remove a directory something is still mounted on.
        for dir in [crate::bundle::ROOTFS_DIR, crate::bundle::IDMAPPED_SCRATCH] {
            if let Err(e) = crate::mount::unmount(&bundle.join(dir)) {
                problems.push(format!("container {id}: {e}"));
            }
        }
    }
    problems
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
    let unified = crate::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    crate::cgroups::cgroup_mounts(&mountinfo)
        .into_iter()
        .filter(|m| m.unified == unified)
        .map(|m| m.mountpoint)
        .collect()
}

/// SIGKILLs every process in `dirs` (a container's cgroup in each hierarchy): v2 `cgroup.kill`
/// where the kernel has it; else the v1 freezer holds the processes still (none can fork away
/// between the read of `cgroup.procs` and the kill) while each pid is killed, then thaws them so
/// the SIGKILLs are delivered.
pub fn kill_cgroup_processes(dirs: &[PathBuf], freeze_wait: Duration) {
    for d in dirs {
        let kill = d.join("cgroup.kill");
        if kill.exists() && write_control(&kill, "1") {
            return;
        }
    }
    let freezer = dirs.iter().find(|d| d.join("freezer.state").exists());
    if let Some(f) = freezer {
        let state = f.join("freezer.state");
        if write_control(&state, "FROZEN") {
            let until = Instant::now() + freeze_wait;
            while Instant::now() < until
                && std::fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FREEZING")
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    for d in dirs {
        for pid in procs(d) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    if let Some(f) = freezer {
        write_control(&f.join("freezer.state"), "THAWED");
    }
}

/// The pids in cgroup `dir` (`cgroup.procs`); none if it is gone.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&p: &i32| p > 1)
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
    fn cgroups_path_resolves_under_each_hierarchy() {
        let roots = vec![
            PathBuf::from("/sys/fs/cgroup/memory"),
            PathBuf::from("/sys/fs/cgroup/pids"),
        ];
        assert_eq!(
            cgroup_dirs_of("/k8s.io/c1", "c1", &roots),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory/k8s.io/c1"),
                PathBuf::from("/sys/fs/cgroup/pids/k8s.io/c1")
            ]
        );
        assert!(cgroup_dirs_of("/k8s.io/../../etc", "etc", &roots).is_empty());
        assert!(cgroup_dirs_of("kubepods.slice:cri-containerd:c1", "c1", &roots).is_empty());
        assert!(cgroup_dirs_of("/", "c1", &roots).is_empty());
        // Not the container's own cgroup: its processes are not the container's to kill.
        assert!(cgroup_dirs_of("/system.slice", "c1", &roots).is_empty());
        assert!(cgroup_dirs_of("/k8s.io/c1/..", "c1", &roots).is_empty());
        assert!(cgroup_dirs_of("/k8s.io", "c1", &roots).is_empty());
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
        };
        assert_eq!(reclaim(&m, &Budget::new(Duration::from_secs(60))).len(), 1);
    }

    /// Where runc cannot delete (here: a "runc" that always fails), the container's processes
    /// are killed through its cgroups and the cgroups and the state dir removed anyway.
    #[test]
    #[ignore = "needs root"]
    fn without_runc_the_processes_are_killed_and_the_cgroups_removed() {
        let unified = crate::cgroups::is_unified(Path::new("/sys/fs/cgroup"));
        // The freezer (v1, for the kill) and pids hierarchies, or the unified one.
        let roots: Vec<PathBuf> = hierarchy_roots()
            .into_iter()
            .filter(|r| unified || r.ends_with("freezer") || r.ends_with("pids"))
            .collect();
        reclaim_without_runc(&roots);
        // cgroup v2's cgroup.kill: the unified hierarchy (also mounted on a hybrid host).
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let v2: Vec<PathBuf> = crate::cgroups::cgroup_mounts(&mountinfo)
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
        }
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
        let paths: serde_json::Map<String, serde_json::Value> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| (i.to_string(), d.display().to_string().into()))
            .collect();
        std::fs::create_dir(runc_root.path().join(&id)).unwrap();
        std::fs::write(
            runc_root.path().join(&id).join("state.json"),
            serde_json::json!({"cgroup_paths": paths}).to_string(),
        )
        .unwrap();
        let member = member_with_failing_runc(&id, runc_root.path());
        let problems = reclaim(&member, &Budget::new(Duration::from_secs(60)));
        assert_eq!(problems.len(), 1, "only runc's failure: {problems:?}");
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        for d in &dirs {
            assert!(!d.exists(), "{} left", d.display());
        }
        assert!(!runc_root.path().join(&id).exists());
    }

    /// A container cgroup that cannot be removed (here: something is mounted on it, so rmdir
    /// says EBUSY) keeps the container's runc state, and says so: removing it would leave
    /// whatever is still in the cgroup untracked.
    #[test]
    #[ignore = "needs root"]
    fn a_cgroup_that_stays_keeps_the_runc_state() {
        let root = hierarchy_roots()
            .into_iter()
            .find(|r| r.ends_with("pids") || crate::cgroups::is_unified(r))
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
        std::fs::create_dir(runc_root.path().join(&id)).unwrap();
        std::fs::write(
            runc_root.path().join(&id).join("state.json"),
            serde_json::json!({"cgroup_paths": {"pids": dir.display().to_string()}}).to_string(),
        )
        .unwrap();
        let member = member_with_failing_runc(&id, runc_root.path());
        let problems = reclaim(&member, &Budget::new(Duration::from_millis(300)));
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
