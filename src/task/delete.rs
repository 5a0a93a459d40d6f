//! Delete: an exec's record, or a whole container (runc state, rootfs, network, execs).
//!
//! Deleting is a terminal transition: every Wait parked on the deleted processes is answered
//! (with the exit, or [`super::UNKNOWN_EXIT_STATUS`] for a process that never ran).

use containerd_shim_protos::events::task::TaskDelete;
use protobuf::MessageField;

use super::{Phase, TaskManager};
use crate::host::runtime::Runtime;
use crate::records::error::{Context, Error, Kind, Result};
use crate::shim::events::Event;
use crate::shim::sync::{Lock, Wait};
use crate::shim::timing::Steps;
use crate::shim::util::timestamp;
use crate::task::process::{ExitInfo, Process};

impl TaskManager {
    /// Delete the init (removing the task) or an exec. Returns (pid, exit).
    pub fn delete(&self, id: &str, exec_id: &str) -> Result<(u32, ExitInfo)> {
        let what = if exec_id.is_empty() {
            format!("delete task {id}")
        } else {
            format!("delete exec {exec_id} of task {id}")
        };
        self.delete_inner(id, exec_id).context(&what)
    }

    fn delete_inner(&self, id: &str, exec_id: &str) -> Result<(u32, ExitInfo)> {
        let (c, p) = self.process(id, exec_id)?;
        let mut steps = Steps::new(|| format!("delete {id} {exec_id}"));
        let _op = crate::shim::blocking::lock(&c.op);
        refuse_if_running(&p)?;
        let (pid, never_started, how) = {
            let st = p.state();
            (
                st.pid(),
                st.never_started(),
                RuncDelete::for_init(st.phase(), st.has_ended()),
            )
        };
        if let Some(exec_id) = p.exec_id() {
            c.remove_exec(exec_id, &p)?;
            let exit = self.forget(&p);
            return Ok((pid as u32, exit));
        }
        // The init has ended (refuse_if_running), so no exec Start can begin any more; those
        // under way finish first (see ExecTable::starting): then `runc delete` kills what
        // they started (runc kills what is left in the cgroup of a container that ended), and
        // their TaskExecStarted precedes our TaskDelete. Each is bounded by the runtime's own
        // timeout, and fails fast in a container whose init died.
        {
            let mut execs = c.execs.locked();
            if execs.starting > 0 {
                let _blocked = crate::shim::blocking::blocking();
                while execs.starting > 0 {
                    execs = c.exec_starts_done.wait_on(execs);
                }
            }
        }
        steps.step("exec starts under way");
        match how.run(c.runtime.as_ref(), id) {
            Ok(()) => {}
            Err(e) if e.kind() == Kind::NotFound => {}
            Err(e) => return Err(e),
        }
        steps.step("runc delete");
        if let Some(pod) = self.pod() {
            pod.remove_member(id);
        }
        if c.rootfs_mounted {
            self.host.unmount_rootfs(&c.bundle.join("rootfs"))?;
        }
        steps.step("unmount rootfs");
        self.host.unwatch_oom(id);
        if let Some(net) = &c.network
            && let Err(e) = crate::host::network::teardown(self.network.as_ref(), net)
        {
            log::warn!("delete task {id}: {e}");
        }
        steps.step("network");
        self.containers.locked().remove(id);
        let execs = c.execs.locked().close();
        for e in &execs {
            self.forget(e);
        }
        let mut exit = self.forget(&p);
        if never_started {
            // `runc delete --force` just killed it: the exit the reaper may have seen meanwhile
            // is not the answer, the task never ran (containerd's runc shim answers 0 too).
            exit = ExitInfo::never_started();
        }
        self.events.publish(Event::Delete(TaskDelete {
            container_id: id.into(),
            pid: pid as u32,
            exit_status: exit.status,
            exited_at: MessageField::some(timestamp(exit.at)),
            id: id.into(),
            ..Default::default()
        }));
        Ok((pid as u32, exit))
    }

    /// Drops the process from the exit path and its stdio, answers its Waits.
    fn forget(&self, p: &Process) -> ExitInfo {
        let pid = p.state().pid();
        if pid != 0 {
            let mut by_pid = self.by_pid.locked();
            if by_pid
                .get(&pid)
                .is_some_and(|q| std::ptr::eq(q.as_ref(), p))
            {
                by_pid.remove(&pid);
            }
        }
        p.release_io();
        self.publish_held_exit(p);
        let (exit, wakeup) = p.state().delete();
        wakeup.wake();
        exit
    }
}

impl super::Container {
    /// The first half of an exec's Delete: checked again, and taken out of the table, under
    /// the exec table's lock, where an exec Start claims its process (begin_exec_start, which
    /// needs it in the table): either that Start claimed it first and this Delete is refused,
    /// or it is gone from the table and the Start finds nothing to start. Never both.
    pub(crate) fn remove_exec(&self, exec_id: &str, p: &std::sync::Arc<Process>) -> Result<()> {
        let mut execs = self.execs.locked();
        refuse_if_running(p)?;
        if execs
            .by_id
            .get(exec_id)
            .is_some_and(|q| std::sync::Arc::ptr_eq(q, p))
        {
            execs.by_id.remove(exec_id);
        }
        Ok(())
    }
}

/// A process that runs cannot be deleted. One that ended but whose exit is still held (its
/// terminal output flushing, an init waiting for its execs) can: Delete publishes that exit
/// first ([`TaskManager::publish_held_exit`]), so nothing is left behind when a pod is torn
/// down at that moment.
fn refuse_if_running(p: &Process) -> Result<()> {
    let st = p.state();
    if st.phase() == Phase::Starting {
        // An exec whose Start runs `runc exec` (that exec's own claim, see start.rs).
        return Err(Error::precondition(format!(
            "{} is being started",
            p.event_id()
        )));
    }
    let running = match st.phase() {
        Phase::Starting | Phase::Running | Phase::Paused => !st.has_ended(),
        // An init that was created but never started is deleted with `runc delete --force`.
        Phase::Created | Phase::Exited(_) | Phase::FailedToStart(_) | Phase::Deleted(_) => false,
    };
    if running {
        return Err(Error::precondition(format!(
            "{} is still running; kill it first",
            p.event_id()
        )));
    }
    Ok(())
}

/// How Delete takes an init's runc container down.
///
/// `runc delete --force` costs 100 ms and more from runc 1.2 on: it always sends SIGKILL and
/// sleeps 100 ms before it looks again, even for a stopped container (runc commit 29283bb7,
/// "runc delete -f: fix for no pidns + no init case"); CRI's StopContainer waits for it. A
/// plain `runc delete` destroys a stopped container at once, and kills what is left in its
/// cgroup first when it shares a PID namespace (libcontainer's `destroy`), as `--force` does.
/// containerd's runc shim deletes an init with a plain `runc delete` too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuncDelete {
    /// The init is gone, so runc reads the container as stopped: `runc delete`, and `--force`
    /// only if that fails (a cgroup frozen behind our back reads as paused, a busy cgroup).
    PlainThenForce,
    /// `runc delete --force`: the init never ran or may still be held by runc (created, a
    /// start that failed, a frozen cgroup), which a plain `runc delete` refuses or also kills.
    Force,
}

impl RuncDelete {
    fn for_init(phase: Phase, ended: bool) -> Self {
        match phase {
            Phase::Paused | Phase::FailedToStart(_) => RuncDelete::Force,
            _ if ended => RuncDelete::PlainThenForce,
            _ => RuncDelete::Force,
        }
    }

    fn run(self, runtime: &dyn Runtime, id: &str) -> Result<()> {
        if self == RuncDelete::PlainThenForce {
            match runtime.delete(id, false) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == Kind::NotFound => return Err(e),
                Err(e) => log::info!("delete task {id}: {e}; again with --force"),
            }
        }
        runtime.delete(id, true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::host::runtime::{ProcessIo, Spawned};
    use crate::records::error::Error;

    #[test]
    fn only_an_init_that_is_gone_gets_a_plain_runc_delete() {
        let exit = ExitInfo::never_started();
        let table = [
            // (phase, ended, how)
            (Phase::Exited(exit), true, RuncDelete::PlainThenForce),
            // Reaped, exit held back (output flushing, execs): runc sees it stopped.
            (Phase::Running, true, RuncDelete::PlainThenForce),
            (Phase::Starting, true, RuncDelete::PlainThenForce),
            (Phase::Created, true, RuncDelete::PlainThenForce),
            // Created and alive: runc kills it either way.
            (Phase::Created, false, RuncDelete::Force),
            // runc reads a frozen cgroup as paused and a plain delete refuses it.
            (Phase::Paused, true, RuncDelete::Force),
            (Phase::FailedToStart(exit), true, RuncDelete::Force),
        ];
        for (phase, ended, how) in table {
            assert_eq!(
                RuncDelete::for_init(phase, ended),
                how,
                "{phase:?} ended={ended}"
            );
        }
    }

    /// Records `delete` calls; fails the plain or forced one as told.
    struct Deletes {
        calls: Mutex<Vec<bool>>,
        plain: Option<Error>,
    }

    impl Runtime for Deletes {
        fn create(&self, _: &str, _: &std::path::Path, _: bool, _: ProcessIo) -> Result<Spawned> {
            unreachable!()
        }
        fn start(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        fn exec(
            &self,
            _: &str,
            _: &std::path::Path,
            _: &str,
            _: &[u8],
            _: bool,
            _: ProcessIo,
        ) -> Result<Spawned> {
            unreachable!()
        }
        fn kill(&self, _: &str, _: u32, _: bool) -> Result<()> {
            unreachable!()
        }
        fn delete(&self, _: &str, force: bool) -> Result<()> {
            self.calls.lock().unwrap().push(force);
            match (&self.plain, force) {
                (Some(e), false) => Err(e.clone()),
                _ => Ok(()),
            }
        }
        fn pause(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        fn resume(&self, _: &str) -> Result<()> {
            unreachable!()
        }
        fn ps(&self, _: &str) -> Result<Vec<i32>> {
            unreachable!()
        }
        fn update(&self, _: &str, _: &[u8]) -> Result<()> {
            unreachable!()
        }
        fn check_placement(&self, _: &str, _: i32) -> Result<()> {
            unreachable!()
        }
    }

    fn deletes(how: RuncDelete, plain: Option<Error>) -> (Result<()>, Vec<bool>) {
        let rt = Deletes {
            calls: Mutex::default(),
            plain,
        };
        let r = how.run(&rt, "t1");
        (r, rt.calls.into_inner().unwrap())
    }

    #[test]
    fn a_failed_plain_runc_delete_is_retried_with_force_but_a_missing_container_is_not() {
        let (r, calls) = deletes(RuncDelete::PlainThenForce, None);
        assert!(r.is_ok());
        assert_eq!(calls, [false]);

        let refused =
            Error::internal("runc delete: cannot delete container t1 that is not stopped: paused");
        let (r, calls) = deletes(RuncDelete::PlainThenForce, Some(refused));
        assert!(r.is_ok());
        assert_eq!(calls, [false, true]);

        let gone = Error::not_found("runc delete: container \"t1\" does not exist");
        let (r, calls) = deletes(RuncDelete::PlainThenForce, Some(gone));
        assert_eq!(r.unwrap_err().kind(), Kind::NotFound);
        assert_eq!(calls, [false]);

        let (r, calls) = deletes(RuncDelete::Force, None);
        assert!(r.is_ok());
        assert_eq!(calls, [true]);
    }
}
