//! Delete: an exec's record, or a whole container (runc state, rootfs, network, execs).
//!
//! Deleting is a terminal transition: every Wait parked on the deleted processes is answered
//! (with the exit, or [`super::UNKNOWN_EXIT_STATUS`] for a process that never ran).

use containerd_shim_protos::events::task::TaskDelete;
use protobuf::MessageField;

use super::{Phase, TaskManager};
use crate::error::{Context, Error, Kind, Result};
use crate::events::Event;
use crate::sync::Lock;
use crate::task::process::{ExitInfo, Process};
use crate::timing::Steps;
use crate::util::timestamp;

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
        let _op = c.op.locked();
        refuse_if_running(&p)?;
        let (pid, never_started) = {
            let st = p.state();
            (st.pid(), st.never_started())
        };
        if let Some(exec_id) = p.exec_id() {
            c.execs.locked().by_id.remove(exec_id);
            let exit = self.forget(&p);
            return Ok((pid as u32, exit));
        }
        match c.runtime.delete(id, true) {
            Ok(()) => {}
            Err(e) if e.kind() == Kind::NotFound => {}
            Err(e) => return Err(e),
        }
        steps.step("runc delete");
        if c.rootfs_mounted {
            self.host.unmount_rootfs(&c.bundle.join("rootfs"))?;
        }
        steps.step("unmount rootfs");
        self.host.unwatch_oom(id);
        if let Some(net) = &c.network
            && let Err(e) = crate::network::teardown(self.network.as_ref(), net)
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

/// A process that runs cannot be deleted. One that ended but whose exit is still held (its
/// terminal output flushing, an init waiting for its execs) can: Delete publishes that exit
/// first ([`TaskManager::publish_held_exit`]), so nothing is left behind when a pod is torn
/// down at that moment.
fn refuse_if_running(p: &Process) -> Result<()> {
    let st = p.state();
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
