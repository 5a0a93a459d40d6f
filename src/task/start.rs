//! Start: `runc start` for an init, `runc exec` for an exec; TaskStart / TaskExecStarted.
//!
//! A Start that fails is terminal for the process (`FailedToStart`): its Waits return
//! [`super::UNKNOWN_EXIT_STATUS`] at once, as containerd's runc shim closes its wait channel
//! when an exec fails to start. Without that, every failed exec probe of a pod would leave a
//! Wait behind forever.
//!
//! An init's Start holds the container's `op` lock across `runc start`. An exec's Start does
//! not (a `runc exec` into a CPU-throttled container takes long, and every other exec, exec
//! Delete, Pause/Resume and the container's Delete would queue behind it): it claims its own
//! process and counts itself in the exec table ([`super::ExecTable::starting`], where the
//! invariant against the container's Delete is written down).

use std::sync::Arc;

use containerd_shim_protos::events::task::{TaskExecStarted, TaskStart};

use super::{Container, TaskManager};
use crate::records::error::{Context, Error, Result};
use crate::shim::events::Event;
use crate::shim::sync::Lock;
use crate::shim::timing::Steps;
use crate::task::process::{Phase, Process};

impl TaskManager {
    /// Start the init (`exec_id` empty) or an exec. Returns the pid.
    pub fn start(&self, id: &str, exec_id: &str) -> Result<u32> {
        let what = if exec_id.is_empty() {
            format!("start task {id}")
        } else {
            format!("start exec {exec_id} of task {id}")
        };
        self.start_inner(id, exec_id).context(&what)
    }

    fn start_inner(&self, id: &str, exec_id: &str) -> Result<u32> {
        let (c, p) = self.process(id, exec_id)?;
        self.start_process(&c, &p)
    }

    /// Start of a process looked up already (which a Delete may have removed since).
    pub(crate) fn start_process(&self, c: &Arc<Container>, p: &Arc<Process>) -> Result<u32> {
        let (id, exec_id) = (c.id.as_str(), p.exec_id().unwrap_or_default());
        let (c, p) = (c.clone(), p.clone());
        let mut steps = Steps::new(|| format!("start {id} {exec_id}"));
        if p.is_init() {
            let _op = crate::shim::blocking::lock(&c.op);
            steps.step("lifecycle lock");
            p.state()
                .begin_start()
                .map_err(|e| e.context(p.event_id()))?;
            let result = c
                .runtime
                .start(id)
                .map(|()| p.state().pid())
                .and_then(|pid| self.still_placed(&c, pid).map(|()| pid));
            steps.step("runc start");
            self.finish_start(&c, &p, result)
        } else {
            // Dropped last: the container's Delete waits for it (see ExecTable::starting).
            let _starting = self.begin_exec_start(&c, &p)?;
            steps.step("claim the exec");
            let result = self.spawn_exec(&c, &p);
            steps.step("runc exec");
            self.finish_start(&c, &p, result)
        }
    }

    /// Claims exec `p` for its Start (Created → Starting) and counts the Start in its
    /// container's exec table, unless the init has ended: both under the init's state lock,
    /// which is what makes [`super::ExecTable::starting`]'s invariant hold (and an exec cannot
    /// begin to hold back the exit of an init that ended, see `exits.rs`).
    pub(super) fn begin_exec_start<'a>(
        &'a self,
        c: &'a Container,
        p: &'a Process,
    ) -> Result<ExecStarting<'a>> {
        let init = c.init.state();
        if init.has_ended() {
            return Err(Error::precondition(format!("task {} is not running", c.id)));
        }
        let mut execs = c.execs.locked();
        if execs.closed {
            return Err(Error::not_found(format!("task {} not found", c.id)));
        }
        // Still in the table: an exec Delete removes it under this lock (Container::remove_exec).
        let exec_id = p.exec_id().unwrap_or_default();
        if !execs
            .by_id
            .get(exec_id)
            .is_some_and(|q| std::ptr::eq(q.as_ref(), p))
        {
            return Err(Error::not_found(format!(
                "exec {exec_id} of task {} not found",
                c.id
            )));
        }
        p.state()
            .begin_start()
            .map_err(|e| e.context(p.event_id()))?;
        execs.starting += 1;
        Ok(ExecStarting { tm: self, c, p })
    }

    /// After `runc start`: the init must still be in its container's cgroups (see
    /// [`crate::host::placement`]). If it is not, it is killed — it must not run there — and the
    /// Start fails; containerd then deletes the task as after any failed start.
    fn still_placed(&self, c: &Container, pid: i32) -> Result<()> {
        let Err(e) = c.runtime.check_placement(&c.id, pid) else {
            return Ok(());
        };
        if let Err(k) = c.runtime.kill(&c.id, libc::SIGKILL as u32, false) {
            log::warn!("task {}: kill the misplaced init: {k}", c.id);
        }
        Err(e.context("check the container's cgroups after runc start"))
    }

    /// Publishes the outcome of a Start; a failure is terminal for the process.
    fn finish_start(&self, c: &Container, p: &Arc<Process>, result: Result<i32>) -> Result<u32> {
        let pid = match result {
            Ok(pid) => pid,
            Err(e) => {
                let wakeup = p.state().start_failed();
                wakeup.wake();
                if !p.is_init() {
                    p.release_io();
                    // This exec no longer holds its init's exit.
                    self.publish_ready(p);
                }
                return Err(e);
            }
        };
        {
            // TaskStart and the state change under one lock: the reaper thread cannot publish
            // TaskExit in between (see exits.rs).
            let mut st = p.state();
            st.started(pid);
            self.events.publish(match p.exec_id() {
                None => Event::Start(TaskStart {
                    container_id: c.id.clone(),
                    pid: pid as u32,
                    ..Default::default()
                }),
                Some(e) => Event::ExecStarted(TaskExecStarted {
                    container_id: c.id.clone(),
                    exec_id: e.into(),
                    pid: pid as u32,
                    ..Default::default()
                }),
            });
        }
        // An exit seen while Start ran.
        self.publish_ready(p);
        Ok(pid as u32)
    }
}

/// An exec Start under way, counted in its container's exec table until dropped.
pub(super) struct ExecStarting<'a> {
    tm: &'a TaskManager,
    c: &'a Container,
    p: &'a Process,
}

impl Drop for ExecStarting<'_> {
    fn drop(&mut self) {
        // A Start that unwound (a panic, caught per call) never published its outcome: it
        // failed, as `finish_start` fails one, so that a Kill or Delete waiting for it goes
        // on (before the notification) and the init's exit it held back goes out.
        let unwound = {
            let mut st = self.p.state();
            let unwound = st.phase() == Phase::Starting;
            let wakeup = st.start_failed();
            drop(st);
            wakeup.wake();
            unwound
        };
        let mut execs = self.c.execs.locked();
        execs.starting -= 1;
        drop(execs);
        self.c.exec_starts_done.notify_all();
        if unwound {
            self.p.release_io();
            self.tm.publish_ready(self.p);
        }
    }
}
