//! Exits, and the one place that decides when an exit becomes visible.
//!
//! containerd requires, per container: TaskCreate < TaskStart < TaskExit < TaskDelete, and an
//! init's TaskExit after the TaskExit of every exec that was started (its own shim keeps the
//! same order). The reaper reports exits in whatever order the kernel gives them; here an exit
//! is recorded at once ([`super::process::ProcState::reap`]) and made visible (TaskExit
//! published, Waits answered) only when:
//!
//! 1. the pid was registered, which happens after TaskCreate ([`TaskManager::register_pid`]);
//! 2. Start is not running: Start publishes TaskStart, then releases the exit (under the same
//!    state lock, so the reaper thread cannot slip a TaskExit in between);
//! 3. a copier's output is flushed: a terminal's, or a labelled process's pipes' (the copier
//!    calls [`TaskManager::output_drained`]);
//! 4. for an init, no exec holds it (started, exit not visible yet).
//!
//! Nothing here blocks: the reaper thread calls [`TaskManager::on_exit`] and must stay free.

use std::sync::Arc;

use containerd_shim_protos::events::task::TaskExit;
use protobuf::MessageField;

use super::{Container, TaskManager};
use crate::shim::events::Event;
use crate::shim::reaper::{Exit, Subscription};
use crate::shim::sync::Lock;
use crate::shim::util::timestamp;
use crate::task::process::{ExitInfo, Process};

impl TaskManager {
    /// Makes `pid` known to the exit path; an exit that `subscription` caught before this (the
    /// process died right after it was spawned) is handled now.
    pub(super) fn register_pid(
        &self,
        pid: i32,
        p: &Arc<Process>,
        subscription: Option<Subscription>,
    ) {
        self.by_pid.locked().insert(pid, p.clone());
        if let Some(exit) = subscription.and_then(|s| s.take(pid)) {
            self.on_exit(exit);
        }
    }

    /// SIGKILLs a process spawned under `subscription` whose pid is not registered yet,
    /// unless the subscription saw it exit: it is checked while the reaper holds off, so the
    /// signal never reaches a reaped (and maybe recycled) pid.
    pub(super) fn kill_unregistered(&self, pid: i32, subscription: Option<&Subscription>) {
        let _held = subscription.map(|s| s.hold_reaps());
        if subscription.is_some_and(|s| s.has_seen(pid)) {
            return;
        }
        if let Err(e) = self.host.signal(pid, libc::SIGKILL as u32) {
            log::debug!("kill pid {pid}: {e}");
        }
    }

    /// Called by the reaper for every exited child. Never blocks on a lifecycle lock.
    pub fn on_exit(&self, exit: Exit) {
        let Some(p) = self.by_pid.locked().remove(&exit.pid) else {
            return;
        };
        let info = ExitInfo {
            status: u32::try_from(exit.status).unwrap_or(crate::task::UNKNOWN_EXIT_STATUS),
            at: exit.at,
        };
        if !p.state().reap(info) {
            return;
        }
        log::info!(
            "task {} process {} (pid {}) exited with status {}",
            p.container_id(),
            p.event_id(),
            exit.pid,
            exit.status
        );
        // Output readers see EOF now; a copier (terminal or pipes) flushes first, then reports.
        let copier_flushing = p.io().process_exited();
        if !copier_flushing {
            p.state().set_output_done();
        }
        if p.is_init() {
            // Its TaskOOM, if any, goes out before its TaskExit.
            self.host.check_oom_at_exit(p.container_id(), exit.status);
        }
        self.publish_ready(&p);
        if p.is_init() {
            self.after_init_exit(&p);
        }
        let (lock, cond) = &self.exits_seen;
        *lock.locked() += 1;
        cond.notify_all();
    }

    /// The process's copier (terminal or pipes) flushed its output.
    pub(super) fn output_drained(&self, p: &Arc<Process>) {
        p.state().set_output_done();
        self.publish_ready(p);
    }

    /// Publishes `p`'s exit if nothing holds it back any more; an exec's end may in turn
    /// release its init's exit.
    pub(super) fn publish_ready(&self, p: &Process) {
        let Ok(c) = self.container(p.container_id()) else {
            return; // deleted: its waiters were answered by Delete
        };
        self.try_publish(&c, p);
        if !p.is_init() {
            self.try_publish(&c, &c.init);
        }
    }

    /// Rule 4 and the event. Rules 1-3 are [`super::process::ProcState::publishable_exit`].
    fn try_publish(&self, c: &Container, p: &Process) {
        let mut st = p.state();
        if st.publishable_exit().is_none() {
            return;
        }
        // Checked under the init's lock: an exec cannot begin to hold it meanwhile without
        // also seeing the init ended (Start checks that).
        if p.is_init() && c.execs_hold_init_exit() {
            return;
        }
        let pid = st.pid();
        let wakeup = st.publish_exit();
        if let Some(exit) = st.visible_exit() {
            self.events.publish(exit_event(p, pid, exit));
        }
        drop(st);
        wakeup.wake();
    }

    /// Delete of a process whose exit is still held: its TaskExit goes out now, so that
    /// TaskExit still comes before TaskDelete.
    pub(super) fn publish_held_exit(&self, p: &Process) {
        let mut st = p.state();
        let pid = st.pid();
        let Some((exit, wakeup)) = st.release_held_exit() else {
            return;
        };
        self.events.publish(exit_event(p, pid, exit));
        drop(st);
        wakeup.wake();
    }

    /// When a container without its own pid namespace loses its init, kill the rest of it.
    fn after_init_exit(&self, init: &Process) {
        let Ok(c) = self.container(init.container_id()) else {
            return;
        };
        if c.shares_pid_ns {
            let runtime = c.runtime.clone();
            let id = c.id.clone();
            // Off the reaper thread: runc's own exit is reaped by it.
            let spawned = std::thread::Builder::new()
                .name("kill-rest".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    if let Err(e) = runtime.kill(&id, 9, true) {
                        log::debug!("kill remaining processes of {id}: {e}");
                    }
                });
            if let Err(e) = spawned {
                log::warn!("task {}: cannot kill its remaining processes: {e}", c.id);
            }
        }
    }
}

/// The TaskExit of `p`.
fn exit_event(p: &Process, pid: i32, exit: ExitInfo) -> Event {
    Event::Exit(TaskExit {
        container_id: p.container_id().to_string(),
        id: p.event_id().to_string(),
        pid: pid as u32,
        exit_status: exit.status,
        exited_at: MessageField::some(timestamp(exit.at)),
        ..Default::default()
    })
}
