//! The pause process's cgroup with the systemd cgroup driver: a `.slice` cgroup_parent.
//!
//! containerd's runc path runs the pause container with cgroupsPath
//! `<slice>:cri-containerd:<sandbox id>`, and runc (`--systemd-cgroup`) asks systemd for the
//! transient scope `cri-containerd-<sandbox id>.scope` in that slice with the pause's pid in
//! it. We ask systemd for the same scope (see [`crate::host::systemd::scope`]). systemd creates
//! the cgroup directories of the scope and of the slices above it, and removes them when the
//! scope stops; we create none on cgroup v2. On cgroup v1 systemd places the process only in
//! the hierarchies it manages (name=systemd and those with accounting: cpu, cpuacct, memory,
//! pids, blkio); runc joins the others (cpuset, freezer, devices, ...) itself at the same
//! path, and so do we, removing on teardown only the directories we made.

use std::path::{Path, PathBuf};

use super::cgroup::PodCgroup;
use crate::host::systemd::manager::{Endpoints, SystemdError};
use crate::host::systemd::names::{expand_slice, pod_scope_name};
use crate::host::systemd::scope::PodScope;
use crate::records::error::{Context, Error, Result};

/// The scope of sandbox `id` in slice `parent` (the pod's `cgroup_parent`), or why such a
/// parent cannot be used: only a slice unit name is (the `slice:prefix:name` form names a
/// container's cgroup, not a pod's).
pub fn plan(id: &str, parent: &str) -> Result<PodScope> {
    expand_slice(parent).map_err(|e| {
        Error::invalid(format!(
            "systemd cgroup parent {parent:?}: {e} (the pod's cgroup_parent must be a slice \
             unit name such as kubepods-besteffort-pod<uid>.slice)"
        ))
    })?;
    Ok(PodScope {
        unit: pod_scope_name(id),
        slice: parent.to_string(),
    })
}

/// The cgroup of `scope`, relative to the cgroup root: the expanded slice, then the unit.
pub fn cgroup_of(scope: &PodScope) -> Result<PathBuf> {
    let slice = expand_slice(&scope.slice).map_err(Error::invalid)?;
    Ok(slice.join(&scope.unit))
}

/// The cgroupsPath the runc path's pause container has: `<slice>:cri-containerd:<id>`.
pub fn cgroups_path(scope: &PodScope, id: &str) -> String {
    format!("{}:cri-containerd:{id}", scope.slice)
}

/// A systemd error as ours: an unreachable systemd is the node's state (FailedPrecondition),
/// anything else systemd answered an internal error; the message names the step.
pub fn error(e: SystemdError) -> Error {
    match e {
        SystemdError::Unreachable { .. } => Error::precondition(e.to_string()),
        _ => Error::internal(e.to_string()),
    }
}

/// A failed [`join`]: why, and whether the scope may exist still (systemd did not answer
/// its stop): then the sandbox record keeps naming it, so ShutdownSandbox or `delete` stop
/// it once systemd answers.
#[derive(Debug)]
pub struct JoinFailed {
    pub error: Error,
    pub scope_may_remain: bool,
}

impl From<Error> for JoinFailed {
    fn from(error: Error) -> Self {
        JoinFailed {
            error,
            scope_may_remain: false,
        }
    }
}

/// Puts `pid` in `scope` through systemd at `endpoints`, then (cgroup v1) joins it to the
/// hierarchies systemd does not manage, at `roots`. On failure nothing is left: the scope is
/// stopped, directories made are removed; if the stop fails, the failure says so.
pub fn join(
    endpoints: &Endpoints,
    roots: &[PathBuf],
    unified: bool,
    scope: &PodScope,
    id: &str,
    pid: i32,
) -> std::result::Result<PodCgroup, JoinFailed> {
    let leaf = cgroup_of(scope)?;
    crate::host::systemd::scope::start(endpoints, scope, id, pid as u32, unified).map_err(|f| {
        JoinFailed {
            error: error(f.error),
            scope_may_remain: f.unit_may_remain,
        }
    })?;
    let cg = if unified {
        let rel = leaf.strip_prefix("/").unwrap_or(&leaf);
        PodCgroup {
            dirs: roots.iter().map(|r| r.join(rel)).collect(),
            created: Vec::new(),
            pod: leaf.parent().map(Path::to_path_buf),
            scope: None,
        }
    } else {
        match super::cgroup::join(roots, false, &leaf, pid) {
            Ok(cg) => cg,
            Err(e) => {
                let stopped = crate::host::systemd::scope::stop(endpoints, &scope.unit);
                if let Err(s) = &stopped {
                    log::warn!("sandbox {id}: {s}");
                }
                return Err(JoinFailed {
                    error: e.context(format!(
                        "join the cgroup v1 hierarchies systemd does not manage at {}",
                        leaf.display()
                    )),
                    scope_may_remain: stopped.is_err(),
                });
            }
        }
    };
    Ok(PodCgroup {
        scope: Some(scope.clone()),
        ..cg
    })
}

/// Stops the scope `cg` names, if any (a unit already gone is fine), within `timeout`.
pub fn stop(endpoints: &Endpoints, cg: &PodCgroup, timeout: std::time::Duration) -> Result<()> {
    let Some(scope) = &cg.scope else {
        return Ok(());
    };
    crate::host::systemd::scope::stop_within(endpoints, &scope.unit, timeout)
        .map_err(error)
        .with_context(|| format!("stop the pod's systemd scope {}", scope.unit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::systemd::fake::{FakeSystemd, job_removed, reply};
    use crate::host::systemd::wire::Value;

    fn systemd(connections: usize) -> FakeSystemd {
        FakeSystemd::serve(
            connections,
            Box::new(|call| match call.member.as_deref() {
                Some("StartTransientUnit" | "StopUnit") => vec![
                    reply(call, &[Value::ObjectPath("/j/1".into())]),
                    job_removed(1, "/j/1", "u", "done"),
                ],
                _ => vec![reply(call, &[])],
            }),
        )
    }

    #[test]
    fn a_slice_parent_plans_the_scope_runc_would_make() {
        let s = plan("sb1", "kubepods-besteffort-pod1.slice").unwrap();
        assert_eq!(s.unit, "cri-containerd-sb1.scope");
        assert_eq!(
            cgroup_of(&s).unwrap(),
            PathBuf::from(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-sb1.scope"
            )
        );
        assert_eq!(
            cgroups_path(&s, "sb1"),
            "kubepods-besteffort-pod1.slice:cri-containerd:sb1"
        );
        for bad in ["system.slice:rsandbox:abc", "a--b.slice", ":x:y"] {
            let e = plan("sb1", bad).unwrap_err();
            assert_eq!(
                e.kind(),
                crate::records::error::Kind::InvalidArgument,
                "{bad}"
            );
            assert!(e.to_string().contains("slice unit name"), "{e}");
        }
    }

    #[test]
    fn on_v2_the_scope_is_systemd_s_and_no_directory_is_ours() {
        let fake = systemd(2);
        let root = tempfile::tempdir().unwrap();
        let scope = plan("sb1", "kubepods-pod1.slice").unwrap();
        let cg = join(
            &fake.endpoints(),
            &[root.path().to_path_buf()],
            true,
            &scope,
            "sb1",
            7,
        )
        .unwrap();
        assert_eq!(
            cg.dirs,
            vec![
                root.path()
                    .join("kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope")
            ]
        );
        assert!(cg.created.is_empty());
        assert_eq!(
            cg.pod,
            Some(PathBuf::from("/kubepods.slice/kubepods-pod1.slice"))
        );
        assert_eq!(cg.scope, Some(scope));
        // Nothing written into the (stand-in) hierarchy: systemd moved the process.
        assert!(!root.path().join("kubepods.slice").exists());
        stop(
            &fake.endpoints(),
            &cg,
            crate::host::systemd::scope::STOP_TIMEOUT,
        )
        .unwrap();
        let members = fake.finish_members();
        assert_eq!(
            members,
            ["StartTransientUnit", "StopUnit", "ResetFailedUnit"]
        );
    }

    /// v1: the hierarchies systemd left alone get the scope's path too, made by us and
    /// removed by us; those systemd made are not ours.
    #[test]
    fn on_v1_the_unmanaged_hierarchies_are_joined_at_the_scope_s_path() {
        let fake = systemd(1);
        let memory = tempfile::tempdir().unwrap();
        let cpuset = tempfile::tempdir().unwrap();
        let scope = plan("sb1", "kubepods-pod1.slice").unwrap();
        let rel = "kubepods.slice/kubepods-pod1.slice/cri-containerd-sb1.scope";
        // systemd made the scope's directory in the hierarchy it manages.
        std::fs::create_dir_all(memory.path().join(rel)).unwrap();
        let cg = join(
            &fake.endpoints(),
            &[memory.path().to_path_buf(), cpuset.path().to_path_buf()],
            false,
            &scope,
            "sb1",
            7,
        )
        .unwrap();
        assert_eq!(cg.dirs.len(), 2);
        assert_eq!(
            cg.created,
            vec![
                cpuset.path().join("kubepods.slice"),
                cpuset.path().join("kubepods.slice/kubepods-pod1.slice"),
                cpuset.path().join(rel),
            ]
        );
        assert_eq!(
            std::fs::read_to_string(cpuset.path().join(rel).join("cgroup.procs")).unwrap(),
            "7"
        );
        fake.finish();
    }

    #[test]
    fn without_systemd_the_error_is_a_failed_precondition_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let endpoints = Endpoints::with_bus(dir.path().join("private"), dir.path().join("bus"));
        let scope = plan("sb1", "kubepods-pod1.slice").unwrap();
        let JoinFailed {
            error: e,
            scope_may_remain,
        } = join(&endpoints, &[], true, &scope, "sb1", 7).unwrap_err();
        assert!(!scope_may_remain);
        assert_eq!(e.kind(), crate::records::error::Kind::FailedPrecondition);
        assert!(e.to_string().contains("systemd is not reachable at"), "{e}");
    }
}
