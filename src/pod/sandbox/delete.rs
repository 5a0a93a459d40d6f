//! `delete` for a sandbox bundle after the shim is gone: the pod's containers, its pause, its
//! files, scope and cgroup, then its network.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::reclaim::Member;
use crate::pod::spec::SysctlDefaults;

use super::linux_host::LinuxPodHost;
use super::{PodHost, SANDBOX_STATE_FILE, SandboxRecord};

/// `delete` for a sandbox bundle, within `budget`: take down the pod's containers (a shim's
/// death leaves them running, see [`crate::host::reclaim`]), in parallel; kill the pause process if
/// it still runs (and is still ours), unmount /dev/shm, remove the pod files, stop the pod's
/// systemd scope and remove the pause's cgroup; then the network, which keeps its share of the
/// budget whatever the steps before it take. Everything is best effort; what could not be done
/// goes to `undone`. `None` when the bundle holds no sandbox record of `id`.
pub fn cleanup_from_bundle(
    namespace: &str,
    id: &str,
    bundle: &Path,
    budget: &crate::shim::timing::Budget,
    undone: &mut crate::shim::timing::Undone,
) -> Option<u32> {
    let raw = std::fs::read(bundle.join(SANDBOX_STATE_FILE)).ok()?;
    // Any release's record (crate::records::state_file): a pod of an older shim is cleaned up too.
    let record: SandboxRecord =
        match crate::records::state_file::decode(&crate::records::state_file::SANDBOX_RECORD, &raw)
        {
            Ok(d) => d.record,
            Err(e) => {
                eprintln!("delete {id}: {e}: not used");
                return None;
            }
        };
    // The record is a file in a bundle: it speaks for the sandbox containerd named, no other.
    if record.id != id {
        undone.failed(format!(
            "the bundle's sandbox record is of {:?}: not used",
            record.id
        ));
        return None;
    }
    let network_share = if record.network.is_some() {
        crate::host::network::DELETE_SHARE
    } else {
        Duration::ZERO
    };
    crate::host::reclaim::reclaim_all(
        &members_of(namespace, &record),
        &budget.before(network_share + POD_DELETE_SHARE),
        undone,
    );
    let pod_budget = budget.before(network_share);
    let pod = record.clone();
    match pod_budget.run("rsandbox-pod", move || take_down_pod(&pod, &pod_budget)) {
        Some(u) => undone.extend(u),
        None => undone.cut_off("the pod's pause, /dev/shm, files, systemd scope or cgroup"),
    }
    // The network last: its plugins are the one step that can take all of what is left.
    if let Some(net) = record.network.clone() {
        crate::host::network::teardown_in_delete(net, budget, undone);
    }
    let _ = std::fs::remove_file(bundle.join(SANDBOX_STATE_FILE));
    Some(record.pause_pid as u32)
}

/// What `delete` keeps for the pod's own steps ([`take_down_pod`]) after its containers: the
/// pause's exit, the systemd scope's stop, a few unmounts and directory removals.
const POD_DELETE_SHARE: Duration = Duration::from_millis(500);

/// `delete`'s steps for the pod itself once its containers are down (see
/// [`cleanup_from_bundle`]), within `budget`.
fn take_down_pod(
    record: &SandboxRecord,
    budget: &crate::shim::timing::Budget,
) -> crate::shim::timing::Undone {
    let mut undone = crate::shim::timing::Undone::default();
    let host = LinuxPodHost {
        host_etc: PathBuf::from("/etc"),
        unified: crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup")),
        // Unused: `delete` starts no pause process and makes no pod.
        sysctl_defaults: SysctlDefaults::default(),
        runc: "runc".into(),
        spawner: crate::shim::reaper::Spawner::direct(),
        selinux: crate::host::selinux::Selinux::disabled(),
        scope_stop_timeout: budget.bound(crate::host::systemd::scope::DELETE_STOP_TIMEOUT),
        mcs: crate::host::mcs::Registry::node(),
    };
    // The recorded pause, or one the shim spawned but died before recording (found by its
    // command line and a start after the record's mark).
    let pauses: Vec<(i32, u64)> = if record.pause_pid > 0 {
        vec![(record.pause_pid, record.pause_start_ticks)]
    } else if record.pause_spawning_since_ticks > 0 {
        crate::pod::unrecorded_pause::find(
            Path::new("/proc"),
            &record.id,
            record.pause_spawning_since_ticks,
        )
    } else {
        Vec::new()
    };
    let mut pause_left = false;
    for (pid, start) in pauses {
        // Only while the pid still names the pause process we started.
        let ours = || crate::shim::util::process_start_ticks(pid) == Some(start);
        let gone =
            crate::shim::util::kill_and_wait(pid, ours, budget.bound(Duration::from_secs(1)));
        if !gone && ours() {
            pause_left = true;
            undone.failed(format!("the pause process {pid} is still there"));
        }
    }
    if let Some(shm) = &record.shm
        && let Err(e) = host.unmount_shm(shm)
    {
        undone.failed(e.to_string());
    }
    let _ = host.remove_files(&record.files_dir);
    // The pause's MCS level: only this pod's entry (the record is of the sandbox containerd
    // named: checked in `cleanup_from_bundle`).
    // Never while the pause may still run under it: another pod would get its categories.
    if let Some(r) = record.mcs.as_ref().filter(|r| r.owner == record.id) {
        if pause_left {
            undone.failed(format!(
                "the SELinux level {} stays reserved while the pause process runs",
                r.level
            ));
        } else {
            host.release_mcs(r);
        }
    }
    // The dead shim's systemd scope (the pause is gone: it is empty), then the pause's cgroup.
    // Only the unit this pod's scope is named: a record is a file, not an authority to stop
    // any unit of the node.
    if let Some(scope) = &record.cgroup.scope
        && scope.unit != crate::host::systemd::names::pod_scope_name(&record.id)
    {
        undone.failed(format!(
            "the record names unit {:?}, not the pod's scope: not stopped",
            scope.unit
        ));
    } else if record.cgroup.scope.is_some() && budget.is_spent() {
        undone.cut_off("stop the pod's systemd scope");
    } else if let Err(e) = host.stop_scope(&record.cgroup) {
        undone.failed(e.to_string());
    }
    for e in crate::pod::cgroup::remove(&record.cgroup, &record.id) {
        undone.failed(e.to_string());
    }
    undone
}

/// The pod's containers: those the record lists, and those runc's state puts in the pod in
/// the runc roots the pod used (the default one of the namespace included), in case the record
/// missed one.
fn members_of(namespace: &str, record: &SandboxRecord) -> Vec<Member> {
    let mut members = record.members.clone();
    let mut runcs: Vec<crate::host::runtime::RuncConfig> =
        members.iter().map(|m| m.runc.clone()).collect();
    runcs.push(crate::host::runtime::RuncConfig::defaults(namespace));
    let mut seen = std::collections::BTreeSet::new();
    for runc in runcs {
        if !seen.insert(runc.root.clone()) {
            continue;
        }
        for (id, state) in crate::host::reclaim::members_in_root(&runc.root, &record.id) {
            if !members.iter().any(|m| m.id == id) {
                members.push(Member {
                    id,
                    bundle: state.bundle,
                    runc: runc.clone(),
                    cgroups_path: None,
                    // found in runc's state only: nothing says runc made its cgroups
                    cgroups_at_create: None,
                });
            }
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33 item 5: a shim killed between the pause's spawn and its record left a record
    /// with the spawn's mark and no pid. `delete` finds the pod's pause by its command line
    /// (here a `sleep` named as the shim names the pause of pod `3600`) and kills it; a
    /// process with the same command line started before the mark is not this spawn's.
    #[test]
    fn delete_kills_a_pause_spawned_but_never_recorded() {
        use std::os::unix::process::CommandExt;
        // spawn (posix_spawn: a vfork) returns once the exec has swapped the child's memory,
        // which is before the kernel writes the new argument area: /proc/<pid>/cmdline may still
        // be empty. Wait for the command line `delete` looks for (CI once lost this race).
        let pause_like = || {
            let child = std::process::Command::new("sleep")
                .arg0(crate::pod::pause::PAUSE_ARGV0)
                .arg("3600")
                .spawn()
                .unwrap();
            let want = format!("{}\0{}\0", crate::pod::pause::PAUSE_ARGV0, 3600).into_bytes();
            let cmdline = format!("/proc/{}/cmdline", child.id());
            while std::fs::read(&cmdline).map(|c| c != want).unwrap_or(false) {
                std::thread::sleep(Duration::from_millis(5));
            }
            child
        };
        let mut older = pause_like();
        // The clock's ticks are coarse (10 ms): the mark lies after the older one's start.
        std::thread::sleep(Duration::from_millis(50));
        let since = crate::pod::unrecorded_pause::boot_ticks_now();
        let mut pause = pause_like();
        let files = tempfile::tempdir().unwrap();
        let record = SandboxRecord {
            id: "3600".into(),
            pause_spawning_since_ticks: since,
            files_dir: files.path().join("files"),
            ..Default::default()
        };
        let undone = take_down_pod(
            &record,
            &crate::shim::timing::Budget::new(Duration::from_secs(30)),
        );
        // Read from /proc, not through wait: another test's `waitpid(-1)` (a reaper) in this
        // process may reap these children first. A zombie or a gone pid is dead.
        let running = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
                .unwrap_or(false)
        };
        let pause_runs = running(pause.id());
        let older_runs = running(older.id());
        for child in [&mut older, &mut pause] {
            let _ = child.kill();
            let _ = child.try_wait();
        }
        assert!(!pause_runs, "the unrecorded pause still runs: {undone:?}");
        assert!(
            older_runs,
            "a process older than the spawn's mark was killed"
        );
    }

    /// `delete` takes down the containers the record lists and those a runc root it knows
    /// puts in the pod (listed once).
    #[test]
    fn members_come_from_the_record_and_the_runc_roots() {
        let root = tempfile::tempdir().unwrap();
        let state = |pod: &str| {
            format!(
                r#"{{"config":{{"labels":["io.kubernetes.cri.sandbox-id={pod}","bundle=/b"]}}}}"#
            )
        };
        for (id, pod) in [("c1", "pod1"), ("c2", "pod1"), ("c3", "pod2")] {
            std::fs::create_dir(root.path().join(id)).unwrap();
            std::fs::write(root.path().join(id).join("state.json"), state(pod)).unwrap();
        }
        let runc = crate::host::runtime::RuncConfig {
            root: root.path().to_path_buf(),
            ..crate::host::runtime::RuncConfig::defaults("ns")
        };
        let listed = Member {
            id: "c1".into(),
            bundle: Some(PathBuf::from("/bundles/c1")),
            runc: runc.clone(),
            cgroups_path: Some("/k8s.io/c1".into()),
            cgroups_at_create: Some(Default::default()),
        };
        let record = SandboxRecord {
            id: "pod1".into(),
            members: vec![listed.clone()],
            ..Default::default()
        };
        let members = members_of("rsandbox-unit-test-no-such-ns", &record);
        assert_eq!(members.len(), 2, "{members:?}");
        assert_eq!(members[0], listed);
        assert_eq!(
            members[1],
            Member {
                id: "c2".into(),
                bundle: Some(PathBuf::from("/b")),
                runc,
                cgroups_path: None,
                cgroups_at_create: None,
            }
        );
    }
}
