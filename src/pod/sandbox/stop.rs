//! The pause's exit, StopSandbox, WaitSandbox and ShutdownSandbox.

use std::time::{Instant, SystemTime};

use crate::records::error::{Context, Error, Result};
use crate::records::validate;
use crate::shim::reaper::Exit;
use crate::shim::sync::{Lock, Wait};
use crate::shim::timing::Steps;
use crate::shim::waiters::{ExitInfo, ExitWaiter};

use super::{SANDBOX_STATE_FILE, STOP_WAIT, Sandbox, SandboxManager, State, save_record};

impl SandboxManager {
    /// Called for every reaped child; notes the pause process's exit.
    pub fn on_exit(&self, exit: Exit) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut().filter(|s| s.pid == exit.pid && s.pid != 0) else {
            return;
        };
        s.pause_lingers = false;
        let waiters = self.record_exit(s, exit);
        drop(guard);
        self.wake(waiters);
    }

    /// The pod ended with `exit` (the pause process's): NOTREADY from now on. Returns the
    /// WaitSandbox calls to answer once the data lock is released.
    pub(super) fn record_exit(&self, s: &mut Sandbox, exit: Exit) -> Vec<Box<dyn ExitWaiter>> {
        if s.exit.is_some() {
            return Vec::new();
        }
        // A status the pause program exits with when its own set-up fails says which step.
        let why = crate::pod::pause_image::describe_exit(exit.status)
            .map(|w| format!(" (the pause program could not {w})"))
            .unwrap_or_default();
        log::info!(
            "sandbox {}: pause process {} exited with status {}{why}",
            s.id,
            exit.pid,
            exit.status
        );
        s.exit = Some((exit.status as u32, exit.at));
        s.state = State::NotReady;
        self.changed.notify_all();
        self.waiters.locked().take()
    }

    /// Answers parked WaitSandbox calls with the pod's exit (or "unknown" when it is gone).
    fn wake(&self, waiters: Vec<Box<dyn ExitWaiter>>) {
        if waiters.is_empty() {
            return;
        }
        let exit = self
            .lock()
            .as_ref()
            .and_then(|s| s.exit)
            .map(|(status, at)| ExitInfo { status, at })
            .unwrap_or_else(ExitInfo::unknown);
        crate::shim::waiters::wake(waiters, exit);
    }

    /// StopSandbox: kill every container's processes and the pause process, and wait until
    /// they are gone. Idempotent.
    pub fn stop(&self, id: &str) -> Result<()> {
        let _op = crate::shim::blocking::lock(&self.op);
        self.stop_locked(id)
    }

    fn stop_locked(&self, id: &str) -> Result<()> {
        let s = self.get(id).context("stop sandbox")?;
        let mut steps = Steps::new(|| format!("stop sandbox {id}"));
        self.tm.kill_all();
        if !self.tm.wait_all(Instant::now() + STOP_WAIT) {
            log::warn!("stop sandbox {id}: containers still running after {STOP_WAIT:?}");
        }
        steps.step("containers");
        // A scope whose start systemd never answered is stopped while the pause lives: a
        // start systemd runs late then finds the pid still naming the pause.
        let unconfirmed = self
            .lock()
            .as_ref()
            .is_some_and(|s| s.scope_unconfirmed && !s.scope_stopped);
        if unconfirmed {
            self.stop_scope(id);
            steps.step("systemd scope (unconfirmed start)");
            // Still not known stopped (systemd did not answer the stop either): the start it
            // may yet run names the pause's pid, so the pause stays alive and the stop fails,
            // to be tried again (StopSandbox, ShutdownSandbox, or `delete`).
            if self.lock().as_ref().is_some_and(|s| !s.scope_stopped) {
                return Err(Error::internal(format!(
                    "stop sandbox {id}: the pod's systemd scope, whose start systemd never \
                     answered, could not be stopped: the pause process is kept until it is"
                )));
            }
        }
        let waiters = {
            let mut guard = self.lock();
            if let Some(pause) = &s.pause
                && guard.as_ref().is_some_and(|s| s.exit.is_none())
            {
                self.host.kill(pause);
                let _blocked = crate::shim::blocking::blocking();
                guard = self.changed.wait_on_timeout_while(guard, STOP_WAIT, |s| {
                    s.as_ref().is_some_and(|s| s.exit.is_none())
                });
            }
            let mut waiters = Vec::new();
            if let Some(s) = guard.as_mut() {
                s.state = State::NotReady;
                // Never started (or the pause process would not die): WaitSandbox must
                // return too.
                if s.exit.is_none() {
                    s.pause_lingers = s.pause.is_some();
                    s.exit = Some((crate::shim::waiters::UNKNOWN_EXIT_STATUS, SystemTime::now()));
                }
                waiters = self.waiters.locked().take();
            }
            self.changed.notify_all();
            waiters
        };
        self.wake(waiters);
        steps.step("pause process");
        // /dev/shm goes with the pause, as CRI unmounts the runc path's at StopPodSandbox
        // (podsandbox's cleanupSandboxFiles): no process of the pod uses it any more (a
        // container that would not die holds its own bind mount of it). RemovePodSandbox
        // then has less to do, as on the runc path.
        // A failed unmount is tried again by ShutdownSandbox (which fails while it still
        // fails, keeping the record for `delete`).
        if let Some(done) = self.take_down_shm() {
            if let Err(e) = done {
                log::warn!("stop sandbox {id}: {e}");
            }
            steps.step("/dev/shm");
        }
        // The pause's scope, now empty: stopped rather than left for systemd to collect.
        if self.stop_scope(id) {
            steps.step("systemd scope");
        }
        // The pod's network goes with its pause process (CRI does the same for its own netns
        // right after StopSandbox). Outside the data lock: CNI plugins are reaped meanwhile.
        // Bound first: a guard in the `if let` scrutinee would live through the body and block
        // the reaper thread (it takes this lock in `on_exit`) while CNI plugins run.
        let record = self.lock().as_ref().map(|s| s.record.clone());
        if let Some(record) = record
            && record.network.is_some()
        {
            self.teardown_network(&record);
            steps.step("network");
            if let Some(s) = self.lock().as_mut() {
                s.record.network = None;
                if let Err(e) = save_record(&s.bundle, &s.record) {
                    log::warn!("sandbox {id}: {e}");
                }
            }
        }
        Ok(())
    }

    /// Unmounts the pod's /dev/shm unless that was done: `None` when there is nothing to do.
    /// Only an unmount that succeeded is noted (`shm_unmounted`), so a failed one is tried
    /// again by the next caller.
    fn take_down_shm(&self) -> Option<Result<()>> {
        let shm = self
            .lock()
            .as_ref()
            .filter(|s| !s.shm_unmounted)
            .and_then(|s| s.record.shm.clone())?;
        let done = self.host.unmount_shm(&shm);
        if done.is_ok() {
            let _ = std::fs::remove_dir(&shm);
            if let Some(s) = self.lock().as_mut() {
                s.shm_unmounted = true;
            }
        }
        Some(done)
    }

    /// Stops the record's systemd scope unless it is known stopped; whether it asked systemd.
    /// A stop systemd does not answer is tried again by ShutdownSandbox, which fails while
    /// systemd still does not answer.
    fn stop_scope(&self, id: &str) -> bool {
        let cgroup = self
            .lock()
            .as_ref()
            .filter(|s| !s.scope_stopped)
            .map(|s| s.record.cgroup.clone());
        let Some(cg) = cgroup.filter(|cg| cg.scope.is_some()) else {
            return false;
        };
        match self.host.stop_scope(&cg) {
            Ok(()) => {
                if let Some(s) = self.lock().as_mut() {
                    s.scope_stopped = true;
                }
            }
            Err(e) => log::warn!("stop sandbox {id}: {e}"),
        }
        true
    }

    /// WaitSandbox: parks `waiter` until the pod ends (the pause process exits, or the sandbox
    /// is stopped); answers at once if it has. An unknown sandbox is an error.
    pub fn wait(&self, id: &str, waiter: Box<dyn ExitWaiter>) -> Result<()> {
        let guard = self.lock();
        match guard.as_ref() {
            Some(s) if s.id == id => match s.exit {
                Some((status, at)) => {
                    drop(guard);
                    waiter.exited(ExitInfo { status, at });
                }
                None => self.waiters.locked().push(waiter),
            },
            _ => {
                drop(guard);
                let e = match validate::id("sandbox id", id) {
                    Err(e) => e,
                    Ok(()) => Error::not_found(format!("sandbox {id} not found")),
                }
                .context("wait sandbox");
                waiter.refused(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// WaitSandbox for a caller that owns a thread (tests).
    pub fn wait_blocking(&self, id: &str) -> Result<ExitInfo> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.wait(id, Box::new(crate::shim::waiters::ChannelWaiter(tx)))?;
        rx.recv()
            .map_err(|_| Error::internal(format!("wait sandbox {id}: dropped")))
    }

    // ---- Shutdown ----

    /// ShutdownSandbox: stop, remove the containers left, the pod files, /dev/shm, the pod
    /// cgroup; then let the shim exit.
    pub fn shutdown(&self, id: &str) -> Result<()> {
        let _op = crate::shim::blocking::lock(&self.op);
        if let Err(e) = self.get(id) {
            // containerd answers a failed CreateSandbox with ShutdownSandbox "to let the shim
            // exit" and then deletes the bundle: a shim that holds nothing must go, or it is
            // killed by `delete` and its socket file stays in /run/containerd/s.
            if e.kind() == crate::records::error::Kind::NotFound
                && self.lock().is_none()
                && self.tm.close_if_empty()
            {
                log::info!("shutdown sandbox {id}: no sandbox was created; exiting");
                (self.on_shutdown)();
                return Ok(());
            }
            return Err(e.context("shutdown sandbox"));
        }
        let mut steps = Steps::new(|| format!("shutdown sandbox {id}"));
        // A Create under way would otherwise add its container (runc state, rootfs mount)
        // after the deletes below, and the daemon would exit leaving it behind.
        if !self.tm.close(Instant::now() + STOP_WAIT) {
            log::warn!("shutdown sandbox {id}: a task create still runs after {STOP_WAIT:?}");
        }
        steps.step("settle creates");
        self.stop_locked(id).context("shutdown sandbox")?;
        steps.step("stop");
        for cid in self.tm.ids() {
            if let Err(e) = self.tm.delete(&cid, "") {
                log::warn!("shutdown sandbox {id}: {e}");
            }
        }
        steps.step("delete containers");
        // A scope StopSandbox could not stop (systemd did not answer): tried again, and while
        // it may remain, Shutdown fails and keeps the record, so that containerd's retry (the
        // kubelet retries RemovePodSandbox) comes back here rather than the unit being forgotten.
        let left = self
            .lock()
            .as_ref()
            .filter(|s| s.record.cgroup.scope.is_some() && !s.scope_stopped)
            .map(|s| s.record.cgroup.clone());
        if let Some(cg) = left {
            self.host
                .stop_scope(&cg)
                .context("shutdown sandbox: stop the pod's systemd scope")?;
            steps.step("systemd scope");
        }
        // A pause StopSandbox killed but did not see exit (stuck in the kernel): its SELinux
        // level must not go to another pod while it may still run, nor its cgroup be removed
        // under it. Shutdown fails and keeps the record, as for the scope above.
        let lingering = self
            .lock()
            .as_ref()
            .filter(|s| s.pause_lingers)
            .and_then(|s| s.pause.clone())
            .filter(|p| !p.has_exited());
        if let Some(p) = lingering {
            return Err(Error::internal(format!(
                "shutdown sandbox {id}: the pause process {} has not exited since it was \
                 killed: its SELinux level, cgroup and record are kept",
                p.pid()
            )));
        }
        // A /dev/shm StopSandbox could not unmount: tried again; while it fails, Shutdown
        // fails and keeps the record (`delete` unmounts what it names).
        if let Some(done) = self.take_down_shm() {
            done.context("shutdown sandbox: unmount the pod's /dev/shm")?;
            steps.step("/dev/shm");
        }
        let s = self.lock().take();
        if let Some(s) = s {
            let mut record = s.record.clone();
            if s.shm_unmounted {
                record.shm = None;
            }
            self.undo(&record);
            steps.step("network, /dev/shm, pod files");
            self.host.remove_cgroup(&s.id, &s.record.cgroup);
            let _ = std::fs::remove_file(s.bundle.join(SANDBOX_STATE_FILE));
            steps.step("cgroup and record");
        }
        self.changed.notify_all();
        let late = self.waiters.locked().take();
        crate::shim::waiters::wake(late, ExitInfo::unknown());
        (self.on_shutdown)();
        Ok(())
    }
}
