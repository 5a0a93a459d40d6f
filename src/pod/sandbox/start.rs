//! StartSandbox: the pause process in the pod's cgroup (or systemd scope), each step recorded
//! before and after it so that `delete` finds what a killed shim left.

use std::sync::Arc;
use std::time::SystemTime;

use crate::host::systemd::scope::PodScope;
use crate::pod::cgroup::PodCgroup;
use crate::pod::pause::{PauseConfig, PauseProcess};
use crate::pod::spec::CgroupParent;
use crate::records::error::{Context, Error, Result};
use crate::records::validate;
use crate::shim::timing::Steps;
use crate::shim::waiters::ExitInfo;

use super::{STOP_WAIT, Sandbox, SandboxManager, State, save_record};

impl SandboxManager {
    /// StartSandbox: the pause process. Returns (pid, created_at, the sandbox's OCI spec).
    pub fn start(&self, id: &str) -> Result<(u32, SystemTime, serde_json::Value)> {
        self.start_inner(id)
            .with_context(|| format!("start sandbox {id}"))
    }

    fn start_inner(&self, id: &str) -> Result<(u32, SystemTime, serde_json::Value)> {
        validate::id("sandbox id", id)?;
        let _op = crate::shim::blocking::lock(&self.op);
        let s = match self.lock().as_ref() {
            Some(s) if s.id == id => s.clone(),
            _ => return Err(Error::precondition(format!("sandbox {id} was not created"))),
        };
        if s.state != State::Created {
            return Err(Error::precondition(format!(
                "sandbox {id} was already started"
            )));
        }
        // A slice parent (systemd cgroup driver) is checked before anything is started, and
        // the scope is written into the record before systemd is asked for it: `delete` after
        // a shim killed meanwhile then still stops it.
        let scope = match s.spec.cgroup_parent_kind() {
            Some(CgroupParent::Systemd(p)) => {
                let scope = crate::pod::scope::plan(id, &p)?;
                self.record_scope(id, Some(&scope))?;
                Some(scope)
            }
            _ => None,
        };
        let mut cfg = PauseConfig::for_pod(
            id,
            &s.spec,
            s.netns.as_deref(),
            self.host.sysctl_defaults(),
            &s.bundle,
        );
        // The pod's SELinux level, reserved at CreateSandbox (its files carry it). The spawn
        // is recorded as under way first, for `delete` after a shim killed meanwhile.
        cfg.mcs_level = s.record.mcs.as_ref().map(|r| r.level.clone());
        if let Err(e) = self.record_spawning(id, crate::pod::unrecorded_pause::boot_ticks_now()) {
            self.forget_scope(id, scope.is_some());
            return Err(e);
        }
        // Subscribed before the fork: an exit of the pause process before its pid is stored
        // below is caught here, never lost (and never confused with a recycled pid).
        let subscription = self.reaper.as_ref().map(|r| r.subscribe());
        let mut steps = Steps::new(|| format!("start sandbox {id}"));
        // The pause's pid goes to systemd (StartTransientUnit's PIDs) or into cgroup.procs by
        // number, as runc names its unreaped `runc init`: it is held unreaped from the fork
        // until it has been checked where it landed, so that it names the pause or its zombie
        // all along, never a process that got it after a reap (issue 27 item 2). Nothing is
        // reaped from the fork until that hold is taken.
        let reaps = self.reaper.as_ref().map(|r| r.hold_reaps());
        let pause = match self.host.spawn_pause(&cfg) {
            Ok(pause) => Arc::new(pause),
            Err(e) => {
                drop(reaps);
                self.forget_scope(id, scope.is_some());
                self.forget_spawning(id);
                return Err(e);
            }
        };
        let pid = pause.pid();
        let held = self.reaper.as_ref().map(|r| r.hold_pid(pid));
        drop(reaps);
        steps.step("spawn pause");
        // In the record before the scope or cgroup join (up to 30 s with a slow systemd): a
        // shim killed meanwhile leaves a pause that `delete` finds and kills.
        if let Err(e) = self.record_pause(id, pid) {
            log::warn!("sandbox {id}: {e}");
        }
        let mut cgroup = PodCgroup::default();
        // Whether a failure leaves a scope that may exist: the record keeps naming it then.
        let joined = match (&scope, s.spec.cgroup_parent_kind()) {
            (Some(scope), _) => Some(self.host.join_scope(scope, id, pid).map_err(|f| {
                (
                    f.error
                        .context("put the pause process in a systemd scope of the pod slice"),
                    f.scope_may_remain,
                )
            })),
            (None, Some(CgroupParent::Fs(parent))) => Some(
                self.host
                    .join_cgroup(&crate::pod::cgroup::pause_cgroup(&parent, id), pid)
                    .context("put the pause process in the pod cgroup")
                    .map_err(|e| (e, false)),
            ),
            _ => None,
        };
        // Checked through its pidfd while its pid is still held: alive, the pid named the
        // pause itself, and the scope or cgroup holds it. Dead (OOM, a kill from outside),
        // only its zombie was named: the pod has no pause, the scope or cgroup is undone.
        let joined = match joined {
            Some(Ok(cg)) if pause.has_exited() => {
                let undone = match &cg.scope {
                    Some(_) => self.host.stop_scope(&cg).map_err(|e| {
                        log::warn!("sandbox {id}: {e}");
                    }),
                    None => {
                        self.host.remove_cgroup(id, &cg);
                        Ok(())
                    }
                };
                Some(Err((
                    Error::internal(format!(
                        "the pause process {pid} exited while it was put in the pod's {}",
                        if scope.is_some() {
                            "systemd scope"
                        } else {
                            "cgroup"
                        }
                    )),
                    undone.is_err(),
                )))
            }
            other => other,
        };
        match joined {
            Some(Ok(cg)) => cgroup = cg,
            Some(Err((e, scope_may_remain))) if scope_may_remain && !pause.has_exited() => {
                // systemd did not answer and may yet run the queued start, with the pause's
                // pid: the pause stays alive and recorded so that the pid names it, and the
                // scope stays in the record. StopSandbox (containerd's ShutdownSandbox after
                // a failed start) stops the scope, then kills the pause; `delete` kills the
                // recorded pause and stops the scope.
                log::warn!(
                    "sandbox {id}: the systemd scope may exist; the pause process {pid} is kept \
                     until it is stopped"
                );
                self.keep_failed_pause(id, pid, pause, |s| s.scope_unconfirmed = true);
                drop(held);
                return Err(e);
            }
            Some(Err((e, scope_may_remain))) => {
                self.host.kill(&pause);
                // Waited for as StopSandbox waits, with its pid still held: until `s.pid`
                // names it below, its exit stays unreaped, and on_exit sees it then. The pod's
                // SELinux level stays reserved until ShutdownSandbox, which releases it only
                // once the pause has exited (another pod could draw it while this pause still
                // ran under it).
                let exited = pause.exits_within(STOP_WAIT);
                if exited && let Err(e) = self.record_pause(id, 0) {
                    log::warn!("sandbox {id}: {e}");
                }
                // The undo's stop got no answer either (the pause died meanwhile, so it could
                // not be kept for a queued start): ShutdownSandbox and `delete` stop the scope
                // the record still names.
                if scope_may_remain {
                    log::warn!("sandbox {id}: the systemd scope may exist; kept in the record");
                } else {
                    self.forget_scope(id, scope.is_some());
                }
                if exited {
                    self.forget_spawning(id);
                } else {
                    // Not dead (stuck in the kernel): kept as StopSandbox keeps a pause that
                    // would not die. The record stays (`delete` kills a recorded pause and
                    // keeps the level while it is there), the pod is NOTREADY and never
                    // started again, and Shutdown fails until its exit is seen.
                    log::warn!(
                        "sandbox {id}: the pause process {pid} has not exited since it was \
                         killed: its SELinux level and record are kept"
                    );
                    self.keep_failed_pause(id, pid, pause, |s| s.pause_lingers = true);
                }
                drop(held);
                return Err(e);
            }
            None => {}
        }
        // The hold is kept until the record and the spec are written: the pause's start time
        // below is read by pid, and so are the spec's /proc/<pid> paths. A pause that dies
        // meanwhile stays a zombie until then, so they name it, never a process that got its
        // pid after a reap (its exit is then reported by the reaper, `s.pid` set).
        steps.step(if scope.is_some() {
            "systemd scope"
        } else {
            "pod cgroup"
        });
        let now = SystemTime::now();
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else {
            self.host.kill(&pause);
            return Err(Error::precondition(format!(
                "sandbox {id} went away while starting"
            )));
        };
        s.pid = pid;
        s.pause = Some(pause);
        s.created_at = Some(now);
        s.state = State::Ready;
        s.record.cgroup = cgroup;
        s.record.pause_pid = pid;
        s.record.pause_start_ticks = crate::shim::util::process_start_ticks(pid).unwrap_or(0);
        s.record.pause_spawning_since_ticks = 0;
        let early = subscription.and_then(|sub| sub.take(pid));
        let mut ended = Vec::new();
        if let Some(e) = early {
            ended = self.record_exit(s, e);
        }
        if let Err(e) = save_record(&s.bundle, &s.record) {
            log::warn!("sandbox {id}: {e}");
        }
        steps.step("record");
        log::info!("sandbox {id}: pause process {pid} ready");
        // Built while the lifecycle lock is held: a concurrent StopSandbox cannot make its
        // /proc/<pid> paths name another process before it is returned.
        let spec = self.spec_of(s);
        s.started_spec = Some(Arc::new(spec.clone()));
        self.changed.notify_all();
        drop(guard);
        drop(held);
        crate::shim::waiters::wake(ended, ExitInfo::unknown());
        Ok((pid as u32, now, spec))
    }

    /// Writes `scope` into the stored record (the scope about to be asked for, or none).
    fn record_scope(&self, id: &str, scope: Option<&PodScope>) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut().filter(|s| s.id == id) else {
            return Err(Error::precondition(format!(
                "sandbox {id} went away while starting"
            )));
        };
        s.record.cgroup.scope = scope.cloned();
        save_record(&s.bundle, &s.record)
    }

    /// Records the pause process (its pid and start time, what `delete` checks before a kill);
    /// pid 0: none (it was killed).
    fn record_pause(&self, id: &str, pid: i32) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut().filter(|s| s.id == id) else {
            return Ok(());
        };
        s.record.pause_pid = pid;
        s.record.pause_start_ticks = match pid {
            0 => 0,
            pid => crate::shim::util::process_start_ticks(pid).unwrap_or(0),
        };
        s.record.pause_spawning_since_ticks = 0;
        save_record(&s.bundle, &s.record)
    }

    /// Writes into the stored record that the pause's spawn begins (boot-time ticks), or that
    /// none is under way (0): a shim killed before the pause's pid is recorded leaves a pause
    /// that `delete` then finds by its command line.
    fn record_spawning(&self, id: &str, since_ticks: u64) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut().filter(|s| s.id == id) else {
            return Err(Error::precondition(format!(
                "sandbox {id} went away while starting"
            )));
        };
        s.record.pause_spawning_since_ticks = since_ticks;
        save_record(&s.bundle, &s.record)
    }

    /// After a failed start that leaves no pause: the record no longer says a spawn is under
    /// way. (The pod's SELinux level stays: its files carry it; ShutdownSandbox releases it.)
    fn forget_spawning(&self, id: &str) {
        if let Err(e) = self.record_spawning(id, 0) {
            log::warn!("sandbox {id}: {e}");
        }
    }

    /// After a failed start: the scope was not made (or was undone), the record says so.
    fn forget_scope(&self, id: &str, had: bool) {
        if had && let Err(e) = self.record_scope(id, None) {
            log::warn!("sandbox {id}: {e}");
        }
    }

    /// Keeps the pause of a StartSandbox that failed and could not let it go (its systemd
    /// scope may remain, or it has not exited since its kill) in sandbox `id`: its pid names
    /// it for Stop, Shutdown and `delete`, the pod is NOTREADY and never started again, and
    /// `mark` says why it is kept.
    fn keep_failed_pause(
        &self,
        id: &str,
        pid: i32,
        pause: Arc<PauseProcess>,
        mark: impl FnOnce(&mut Sandbox),
    ) {
        if let Some(s) = self.lock().as_mut().filter(|s| s.id == id) {
            s.pid = pid;
            s.pause = Some(pause);
            s.state = State::NotReady;
            mark(s);
        }
    }
}
