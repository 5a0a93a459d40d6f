//! Start: `runc start` for an init, `runc exec` for an exec; TaskStart / TaskExecStarted.
//!
//! A Start that fails is terminal for the process (`FailedToStart`): its Waits return
//! [`super::UNKNOWN_EXIT_STATUS`] at once, as containerd's runc shim closes its wait channel
//! when an exec fails to start. Without that, every failed exec probe of a pod would leave a
//! Wait behind forever.

use containerd_shim_protos::events::task::{TaskExecStarted, TaskStart};

use super::TaskManager;
use crate::error::{Context, Error, Result};
use crate::events::Event;
use crate::sync::Lock;
use crate::timing::Steps;

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
        let mut steps = Steps::new(|| format!("start {id} {exec_id}"));
        let _op = c.op.locked();
        steps.step("lifecycle lock");
        if !p.is_init() && c.init.state().has_ended() {
            return Err(Error::precondition(format!("task {id} is not running")));
        }
        p.state()
            .begin_start()
            .map_err(|e| e.context(p.event_id()))?;
        let result = if p.is_init() {
            c.runtime.start(id).map(|()| p.state().pid())
        } else {
            self.spawn_exec(&c, &p)
        };
        steps.step(if p.is_init() {
            "runc start"
        } else {
            "runc exec"
        });
        let pid = match result {
            Ok(pid) => pid,
            Err(e) => {
                let wakeup = p.state().start_failed();
                wakeup.wake();
                if !p.is_init() {
                    p.release_io();
                    // This exec no longer holds its init's exit.
                    self.publish_ready(&p);
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
                    container_id: id.into(),
                    pid: pid as u32,
                    ..Default::default()
                }),
                Some(e) => Event::ExecStarted(TaskExecStarted {
                    container_id: id.into(),
                    exec_id: e.into(),
                    pid: pid as u32,
                    ..Default::default()
                }),
            });
        }
        // An exit seen while Start ran.
        self.publish_ready(&p);
        Ok(pid as u32)
    }
}
