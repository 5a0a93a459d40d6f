//! The task manager: containers (one init plus execs each) run through the OCI runtime.
//!
//! The verbs live one per file: [`create`](create.rs) (with an undo guard), [`start`](start.rs),
//! [`exec`](exec.rs), [`exits`](exits.rs) (what the reaper reports, and the one place that
//! orders events: Create < Start < Exit < Delete, an init's exit after its execs'), and
//! [`delete`](delete.rs). Each process is one state machine ([`process`]); Waits are parked on
//! it and answered by its terminal transition, so no thread blocks for a Wait.
//!
//! Locks, outermost first: the container table (short), a container's `op` lock (one lifecycle
//! call at a time per container: init Start, Pause/Resume, Delete; it is held across runc), an
//! init's state, the exec table, an exec's state. An exec's Start does not take `op`: like
//! containerd's runc shim, which starts an exec under that exec's own lock, it claims its
//! process (Created → Starting, which no second Start, Delete or Kill of that exec gets past)
//! and counts itself in the exec table for the container's Delete, so one slow `runc exec` holds
//! up nothing else of the container (see [`ExecTable::starting`]). The reaper thread never
//! takes an `op` lock, so a slow `runc` call never delays exit handling.
//!
//! Layer rule: imports `host`, `shim`, `records` and `cni` only, nothing of the layers above
//! (`pod`, `server`, `cli`). `hack/check-cycles.sh` checks it.

mod create;
mod delete;
mod exec;
mod exits;
pub mod host;
pub mod process;
mod start;
pub mod stdio;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

use containerd_shim_protos::events::task::{TaskPaused, TaskResumed};

use crate::host::cgroups::CgroupPaths;
use crate::host::mount::MountSpec;
use crate::host::network::{NetworkProvider, NetworkRecord};
use crate::host::reclaim::Member;
use crate::host::runtime::{RuncConfig, Runtime};
use crate::records::error::{Context, Error, Result};
use crate::records::validate;
use crate::shim::events::{Event, EventSink};
use crate::shim::reaper::Reaper;
use crate::shim::sync::{Lock, Wait};
use crate::task::stdio::StdioRequest;

pub use host::{Host, LinuxHost};
pub use process::{ExitInfo, ExitWaiter, Phase, Process, Status, UNKNOWN_EXIT_STATUS};

/// The file in a task bundle that tells the `delete` action how to clean up.
pub use crate::records::bundle::TASK_STATE_FILE;

/// What `delete` needs to clean up a task without the daemon.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub runc: RuncConfig,
    pub rootfs_mounted: bool,
    /// The network the shim set up for a standalone task (opt-in).
    #[serde(default)]
    pub network: Option<NetworkRecord>,
    /// Which of its cgroup directories existed before its `runc create`
    /// ([`crate::host::cgroup_ownership`]): `delete` kills in and removes only cgroups runc made.
    #[serde(default)]
    pub cgroups_at_create: Option<crate::host::cgroup_ownership::CgroupsAtCreate>,
}

/// A task's creation request, already decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<MountSpec>,
    pub stdio: StdioRequest,
    /// runc settings from the request's runtime options, if any.
    pub runc: Option<RuncConfig>,
}

/// The pod side of the shim, as the task manager sees it (implemented by the sandbox).
pub trait PodHooks: Send + Sync {
    /// Edits a container's OCI spec before `runc create` (pod files, /dev/shm). Returns whether
    /// the spec changed.
    fn prepare_spec(&self, container_id: &str, spec: &mut serde_json::Value) -> Result<bool>;
    /// Edits an exec's process spec before `runc exec` (the pod's SELinux level). Returns
    /// whether it changed.
    fn prepare_exec(&self, _container_id: &str, _process: &mut serde_json::Value) -> Result<bool> {
        Ok(false)
    }
    /// The pid Connect/Pids report for `id` if it names the sandbox.
    fn sandbox_pid(&self, id: &str) -> Option<u32>;
    /// Whether a sandbox lives in this shim (then Shutdown never exits the shim).
    fn has_sandbox(&self) -> bool;
    /// Notes a container of the pod before its `runc create`, for `delete` to take down after
    /// a crash of the shim.
    fn add_member(&self, member: Member) -> Result<()>;
    /// The container `id` was deleted: no longer the pod's to take down.
    fn remove_member(&self, id: &str);
}

/// A shim without a pod (standalone `ctr run` tasks, tests).
pub struct NoPod;

impl PodHooks for NoPod {
    fn prepare_spec(&self, _id: &str, _spec: &mut serde_json::Value) -> Result<bool> {
        Ok(false)
    }
    fn sandbox_pid(&self, _id: &str) -> Option<u32> {
        None
    }
    fn has_sandbox(&self) -> bool {
        false
    }
    fn add_member(&self, _member: Member) -> Result<()> {
        Ok(())
    }
    fn remove_member(&self, _id: &str) {}
}

/// Everything the task manager is built with.
pub struct TaskDeps {
    pub namespace: String,
    /// runc settings for tasks whose request carries none.
    pub default_runc: RuncConfig,
    pub host: Arc<dyn Host>,
    pub events: Arc<dyn EventSink>,
    /// The shim's exit monitor; `None` in tests that inject exits by hand.
    pub reaper: Option<Arc<Reaper>>,
    /// Shim-owned networking (also tears down what it made).
    pub network: Option<Arc<dyn NetworkProvider>>,
    /// Whether standalone tasks that ask for a new network namespace get a shim-owned network.
    pub network_for_tasks: bool,
    /// The sandbox, when the shim has one (a back edge: the sandbox owns the task manager).
    pub pod: Weak<dyn PodHooks>,
    /// Called when Shutdown decides the shim should exit.
    pub on_shutdown: Arc<dyn Fn() + Send + Sync>,
}

/// One container.
pub struct Container {
    id: String,
    bundle: PathBuf,
    runtime: Arc<dyn Runtime>,
    rootfs_mounted: bool,
    init: Arc<Process>,
    execs: Mutex<ExecTable>,
    cgroup: Option<CgroupPaths>,
    /// The container has no pid namespace of its own: when its init exits, the rest of its
    /// processes must be killed explicitly.
    shares_pid_ns: bool,
    /// Shim-owned network of a standalone task.
    network: Option<NetworkRecord>,
    /// Serializes lifecycle operations on this container (not exec Starts, see the module).
    op: Mutex<()>,
    /// Notified when an exec Start ends, either way ([`ExecTable::starting`]).
    exec_starts_done: Condvar,
    /// A SIGKILL was sent to the init or all its processes: a later Pause would freeze a
    /// dying container (see [`TaskManager::thaw_after_sigkill`]).
    sigkilled: AtomicBool,
    /// Its init runs with an SELinux process label. runc runs an exec that names no label of
    /// its own under the container's (libcontainer's `newInitConfig`), so such an exec's stdio
    /// goes through the shim's pipes too.
    process_labelled: bool,
}

impl Container {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bundle(&self) -> &Path {
        &self.bundle
    }

    pub fn init(&self) -> &Arc<Process> {
        &self.init
    }

    /// The IDs of the execs registered now.
    pub fn exec_ids(&self) -> Vec<String> {
        self.execs.locked().by_id.keys().cloned().collect()
    }

    fn exec(&self, exec_id: &str) -> Option<Arc<Process>> {
        self.execs.locked().by_id.get(exec_id).cloned()
    }

    /// Waits until an exec Start of `p` under way, if any, has published its outcome (the
    /// Start changes the phase before its `ExecStarting` is dropped, which notifies under the
    /// exec table's lock, so checking the phase under that lock loses no wake-up). Bounded by
    /// the Start's own `runc exec` timeout.
    fn wait_for_exec_start(&self, p: &Process) {
        let mut execs = self.execs.locked();
        if p.state().phase() != Phase::Starting {
            return;
        }
        let _blocked = crate::shim::blocking::blocking();
        while p.state().phase() == Phase::Starting {
            execs = self.exec_starts_done.wait_on(execs);
        }
    }

    /// Whether some exec was started and its exit is not visible yet: the init's exit waits.
    fn execs_hold_init_exit(&self) -> bool {
        self.execs
            .locked()
            .by_id
            .values()
            .any(|e| e.state().holds_init_exit())
    }
}

/// A container's execs. Delete closes the table as it empties it: an Exec that raced the
/// Delete then finds it closed instead of registering into a container that is gone (and
/// publishing TaskExecAdded after TaskDelete).
#[derive(Default)]
struct ExecTable {
    by_id: HashMap<String, Arc<Process>>,
    closed: bool,
    /// Exec Starts under way (`runc exec` running, or its outcome not yet published).
    ///
    /// The invariant that keeps the container's Delete from orphaning a starting exec: an exec
    /// Start counts itself here only while it holds its init's state lock and sees the init
    /// not ended ([`TaskManager::begin_exec_start`]), and uncounts itself only after it has
    /// published its outcome (TaskExecStarted, or the failure) and registered its pid. The
    /// container's Delete runs only once the init has ended (an ended init never runs again),
    /// and then waits, before `runc delete`, until this count is 0. So every exec Start either
    /// began before the init ended, and Delete waits for it — its process is then in the
    /// container's cgroup, which `runc delete --force` kills, and its TaskExecStarted comes
    /// before TaskDelete —, or it sees the init ended and fails without running anything.
    starting: usize,
}

impl ExecTable {
    /// Empties and closes the table; returns the execs it held.
    fn close(&mut self) -> Vec<Arc<Process>> {
        self.closed = true;
        self.by_id.drain().map(|(_, p)| p).collect()
    }
}

/// A row of the container table: an ID is reserved for the whole of a Create, so that two
/// concurrent Creates of one ID cannot both proceed.
enum Slot {
    Creating,
    Live(Arc<Container>),
}

/// The Task service's state and logic.
pub struct TaskManager {
    namespace: String,
    default_runc: RuncConfig,
    host: Arc<dyn Host>,
    events: Arc<dyn EventSink>,
    reaper: Option<Arc<Reaper>>,
    network: Option<Arc<dyn NetworkProvider>>,
    network_for_tasks: bool,
    pod: Weak<dyn PodHooks>,
    on_shutdown: Arc<dyn Fn() + Send + Sync>,
    containers: Mutex<HashMap<String, Slot>>,
    /// Set (under the `containers` lock) once the shim is going away: no Create may start,
    /// and one under way undoes itself instead of adding its container ([`TaskManager::close`]).
    closed: AtomicBool,
    /// Notified (under the `containers` lock) when a Create ends, either way.
    creates_done: Condvar,
    by_pid: Mutex<HashMap<i32, Arc<Process>>>,
    /// Bumped on every exit the reaper reports; [`TaskManager::wait_all`] waits on it.
    exits_seen: (Mutex<u64>, Condvar),
    me: Weak<TaskManager>,
}

/// Releases a reserved container ID unless the Create filled it.
struct Reservation<'a> {
    tm: &'a TaskManager,
    id: String,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut table = self.tm.containers.locked();
        if matches!(table.get(&self.id), Some(Slot::Creating)) {
            table.remove(&self.id);
        }
        self.tm.creates_done.notify_all();
    }
}

impl TaskManager {
    pub fn new(deps: TaskDeps) -> Arc<Self> {
        Arc::new_cyclic(|me| TaskManager {
            namespace: deps.namespace,
            default_runc: deps.default_runc,
            host: deps.host,
            events: deps.events,
            reaper: deps.reaper,
            network: deps.network,
            network_for_tasks: deps.network_for_tasks,
            pod: deps.pod,
            on_shutdown: deps.on_shutdown,
            containers: Mutex::default(),
            closed: AtomicBool::new(false),
            creates_done: Condvar::new(),
            by_pid: Mutex::default(),
            exits_seen: (Mutex::new(0), Condvar::new()),
            me: me.clone(),
        })
    }

    /// Namespace this shim serves.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shim's own runc settings (its start options'), for a task without options of its own.
    pub fn default_runc(&self) -> &RuncConfig {
        &self.default_runc
    }

    fn pod(&self) -> Option<Arc<dyn PodHooks>> {
        self.pod.upgrade()
    }

    /// Reserves `id` for a Create, or AlreadyExists.
    fn reserve(&self, id: &str) -> Result<Reservation<'_>> {
        let mut table = self.containers.locked();
        if self.closed.load(Ordering::SeqCst) {
            return Err(shutting_down());
        }
        if table.contains_key(id) {
            return Err(Error::already_exists(format!("task {id} already exists")));
        }
        table.insert(id.to_string(), Slot::Creating);
        Ok(Reservation {
            tm: self,
            id: id.to_string(),
        })
    }

    /// The container `id` or NotFound.
    pub fn container(&self, id: &str) -> Result<Arc<Container>> {
        validate::id("task id", id)?;
        match self.containers.locked().get(id) {
            Some(Slot::Live(c)) => Ok(c.clone()),
            _ => Err(Error::not_found(format!("task {id} not found"))),
        }
    }

    /// The process `exec_id` of container `id` (the init when `exec_id` is empty).
    pub fn process(&self, id: &str, exec_id: &str) -> Result<(Arc<Container>, Arc<Process>)> {
        let c = self.container(id)?;
        if exec_id.is_empty() {
            let p = c.init.clone();
            return Ok((c, p));
        }
        validate::id("exec id", exec_id)?;
        match c.exec(exec_id) {
            Some(p) => Ok((c, p)),
            None => Err(Error::not_found(format!(
                "exec {exec_id} of task {id} not found"
            ))),
        }
    }

    /// Number of containers, including those being created.
    pub fn len(&self) -> usize {
        self.containers.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many pids the exit path watches (diagnostics, tests).
    pub fn watched_pids(&self) -> usize {
        self.by_pid.locked().len()
    }

    /// Every live container.
    pub fn all(&self) -> Vec<Arc<Container>> {
        self.containers
            .locked()
            .values()
            .filter_map(|s| match s {
                Slot::Live(c) => Some(c.clone()),
                Slot::Creating => None,
            })
            .collect()
    }

    /// The IDs of every live container.
    pub fn ids(&self) -> Vec<String> {
        self.all().iter().map(|c| c.id.clone()).collect()
    }

    // ---- Waiting ----

    /// The process a Wait parks on ([`Process::wait`]); an unknown one is an error.
    pub fn waitable(&self, id: &str, exec_id: &str) -> Result<Arc<Process>> {
        self.process(id, exec_id)
            .map(|(_, p)| p)
            .with_context(|| format!("wait {id}"))
    }

    /// Blocks until the process ends (tests, and callers inside the shim that own a thread).
    pub fn wait_blocking(&self, id: &str, exec_id: &str) -> Result<ExitInfo> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.waitable(id, exec_id)?
            .wait(Box::new(crate::shim::waiters::ChannelWaiter(tx)));
        rx.recv()
            .map_err(|_| Error::internal(format!("wait {id}: the process was dropped")))
    }

    /// SIGKILLs every container whose init has not ended, all its processes: a container
    /// with a pid namespace of its own dies with its init (the kernel kills the rest), the
    /// others through `runc kill --all`. A paused container is thawed after the signal.
    pub fn kill_all(&self) {
        for c in self.all() {
            if c.init.state().has_ended() {
                continue;
            }
            c.sigkilled.store(true, Ordering::SeqCst);
            let r = if c.shares_pid_ns || c.init.state().pid() == 0 {
                c.runtime.kill(&c.id, SIGKILL, true)
            } else {
                self.signal_unreaped(&c.init, SIGKILL)
            };
            match r {
                Ok(()) => self.thaw_after_sigkill(&c),
                Err(e) => log::debug!("kill {}: {e}", c.id),
            }
        }
    }

    /// Waits until the init of every container has ended, at most until `deadline`. Returns
    /// whether they all did.
    pub fn wait_all(&self, deadline: Instant) -> bool {
        let (lock, cond) = &self.exits_seen;
        let mut seen = lock.locked();
        loop {
            // Checked under `exits_seen`: an exit reported meanwhile bumps it after we wait.
            if self.all().iter().all(|c| c.init.state().has_ended()) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _blocked = crate::shim::blocking::blocking();
            seen = cond.wait_on_timeout(seen, left).0;
        }
    }

    // ---- Signals, state ----

    /// Kill: `signal` (any of 1..=SIGRTMAX) to the init, an exec, or with `all` to every
    /// process of the container. Once the process has ended (its exit visible or only
    /// reaped) nothing runs: a Kill of it is NotFound "process already finished", as with
    /// containerd's runc shim, and one with `all` succeeds, as the runc shim's `runc kill
    /// --all` of a stopped container does (nothing is left: a container with its own pid
    /// namespace died with its init, and the rest of one without was killed at the init's
    /// exit, see `exits.rs`). Running runc there raced its cgroup teardown ("invalid state
    /// transition from stopped to paused"), and CRI's exit handler, which sends exactly that
    /// after every TaskExit, failed and retried after a back-off.
    pub fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let (c, p) = self
            .process(id, exec_id)
            .with_context(|| format!("kill {id}"))?;
        let what = match p.exec_id() {
            None => format!("kill task {id}"),
            Some(e) => format!("kill exec {e}"),
        };
        check_signal(signal).context(&what)?;
        if !p.is_init() {
            // As containerd's runc shim, whose exec Kill waits for the lock its Start holds:
            // the signal goes to the process that Start makes (a probe's exec killed at its
            // timeout while `runc exec` still runs must not be left to run on).
            c.wait_for_exec_start(&p);
        }
        let (pid, phase, ended) = {
            let st = p.state();
            (st.pid(), st.phase(), st.has_ended())
        };
        if ended {
            if all && p.is_init() {
                return Ok(());
            }
            return Err(Error::not_found(format!(
                "{what}: process already finished"
            )));
        }
        if !p.is_init() {
            if pid == 0 || phase == Phase::Created {
                return Err(Error::precondition(format!("{what}: not started")));
            }
            return self.signal_unreaped(&p, signal).context(&what);
        }
        if signal == SIGKILL {
            c.sigkilled.store(true, Ordering::SeqCst);
        }
        if all || pid == 0 {
            c.runtime.kill(id, signal, all).context(&what)?;
        } else {
            // One process: kill(2) directly, as runc kill would, without exec'ing runc.
            self.signal_unreaped(&p, signal).context(&what)?;
        }
        if signal == SIGKILL {
            self.thaw_after_sigkill(&c);
        }
        Ok(())
    }

    /// After a SIGKILL to a paused container: thaw it, as `runc kill` does. A cgroup v1
    /// freezer holds even SIGKILL until the cgroup thaws, so the task would stay paused for
    /// ever (v2 delivers it; thawing is harmless there). The phase stays Paused until the
    /// exit, as in containerd's runc shim. A Pause racing this sees `sigkilled` (see
    /// [`TaskManager::freeze`]): one of the two always thaws.
    fn thaw_after_sigkill(&self, c: &Container) {
        if c.init.state().phase() != Phase::Paused {
            return;
        }
        if let Some(paths) = &c.cgroup
            && let Err(e) = self.host.thaw(paths)
        {
            log::warn!("task {}: thaw after SIGKILL: {e}", c.id);
        }
    }

    /// Signals `p` while the reaper holds off (see [`Reaper::hold_reaps`]): a process that
    /// ended is NotFound, never a recycled pid.
    fn signal_unreaped(&self, p: &Process, signal: u32) -> Result<()> {
        let _reaps = self.reaper.as_ref().map(|r| r.hold_reaps());
        let pid = {
            let st = p.state();
            if st.has_ended() {
                return Err(Error::not_found("process already finished"));
            }
            st.pid()
        };
        self.host.signal(pid, signal)
    }

    pub fn pause(&self, id: &str) -> Result<()> {
        self.freeze(id, true)
    }

    pub fn resume(&self, id: &str) -> Result<()> {
        self.freeze(id, false)
    }

    /// Pause (`freeze`) or resume a running task, with its event.
    fn freeze(&self, id: &str, freeze: bool) -> Result<()> {
        let (verb, from) = if freeze {
            ("pause", Status::Running)
        } else {
            ("resume", Status::Paused)
        };
        let c = self.container(id).with_context(|| format!("{verb} {id}"))?;
        let _op = crate::shim::blocking::lock(&c.op);
        {
            let st = c.init.state();
            if st.status() != from || st.has_ended() {
                return Err(Error::precondition(format!(
                    "{verb} {id}: task is not {}",
                    if freeze { "running" } else { "paused" }
                )));
            }
        }
        let r = if freeze {
            c.runtime.pause(id)
        } else {
            c.runtime.resume(id)
        };
        r.with_context(|| format!("{verb} {id}"))?;
        let mut st = c.init.state();
        if freeze && c.sigkilled.load(Ordering::SeqCst) {
            // A SIGKILL came while runc froze the container: a frozen v1 cgroup would hold it
            // for ever. Checked under the init's state lock, as the Kill side checks the phase.
            drop(st);
            if let Some(paths) = &c.cgroup {
                self.host.thaw(paths).context("thaw after SIGKILL")?;
            }
            return Err(Error::precondition(format!(
                "pause {id}: the task is being killed"
            )));
        }
        st.set_paused(freeze);
        let container_id = id.to_string();
        self.events.publish(if freeze {
            Event::Paused(TaskPaused {
                container_id,
                ..Default::default()
            })
        } else {
            Event::Resumed(TaskResumed {
                container_id,
                ..Default::default()
            })
        });
        Ok(())
    }

    /// What State reports for a process.
    pub fn state(&self, id: &str, exec_id: &str) -> Result<ProcessStatus> {
        let (c, p) = self.process(id, exec_id)?;
        let (pid, mut status, exit) = {
            let st = p.state();
            (st.pid(), st.status(), st.visible_exit())
        };
        // The whole container is frozen: so are its execs.
        if !p.is_init() && status == Status::Running && c.init.state().status() == Status::Paused {
            status = Status::Paused;
        }
        Ok(ProcessStatus {
            bundle: c.bundle.clone(),
            pid: pid as u32,
            status,
            exit,
            stdio: p.stdio().clone(),
        })
    }

    /// Pids of the container, with the exec ID of each exec process.
    pub fn pids(&self, id: &str) -> Result<Vec<(u32, Option<String>)>> {
        if let Some(pid) = self.pod().and_then(|p| p.sandbox_pid(id)) {
            return Ok(vec![(pid, None)]);
        }
        let c = self.container(id).with_context(|| format!("pids {id}"))?;
        let pids = c.runtime.ps(id).with_context(|| format!("pids {id}"))?;
        let execs: Vec<(i32, String)> = c
            .execs
            .locked()
            .by_id
            .iter()
            .map(|(exec_id, e)| (e.state().pid(), exec_id.clone()))
            .collect();
        Ok(pids
            .into_iter()
            .map(|pid| {
                let exec = execs
                    .iter()
                    .find(|(p, _)| *p == pid && pid != 0)
                    .map(|(_, e)| e.clone());
                (pid as u32, exec)
            })
            .collect())
    }

    pub fn stats(&self, id: &str) -> Result<protobuf::well_known_types::any::Any> {
        let c = self.container(id).with_context(|| format!("stats {id}"))?;
        let paths = c
            .cgroup
            .as_ref()
            .ok_or_else(|| crate::host::cgroups::no_cgroup(id))?;
        self.host
            .metrics(paths)
            .with_context(|| format!("stats {id}"))
    }

    pub fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        let c = self.container(id).with_context(|| format!("update {id}"))?;
        let _: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(resources_json)
            .map_err(|e| {
                Error::invalid(format!("update {id}: resources are not a JSON object: {e}"))
            })?;
        c.runtime
            .update(id, resources_json)
            .with_context(|| format!("update {id}"))
    }

    /// CloseIO: the process's stdin reaches EOF once no client holds the fifo open; with a
    /// terminal, the terminal's end-of-file character is sent.
    pub fn close_io(&self, id: &str, exec_id: &str, stdin: bool) -> Result<()> {
        let (_, p) = self
            .process(id, exec_id)
            .with_context(|| format!("close io of {id}"))?;
        if stdin {
            p.io().close_stdin();
        }
        Ok(())
    }

    pub fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let (_, p) = self
            .process(id, exec_id)
            .with_context(|| format!("resize pty of {id}"))?;
        let w = u16::try_from(width)
            .map_err(|_| Error::invalid(format!("width {width} is too large")))?;
        let h = u16::try_from(height)
            .map_err(|_| Error::invalid(format!("height {height} is too large")))?;
        match p.io().tty() {
            Some(t) => t.resize(w, h),
            None => Err(Error::precondition(format!(
                "resize pty of {}: it has no terminal",
                p.event_id()
            ))),
        }
    }

    /// The pid Connect reports for `id` (the init, or the sandbox's pause process).
    pub fn task_pid(&self, id: &str) -> Result<u32> {
        if let Some(pid) = self.pod().and_then(|p| p.sandbox_pid(id)) {
            return Ok(pid);
        }
        let c = self.container(id)?;
        Ok(c.init.state().pid() as u32)
    }

    /// Shutdown: the shim exits once it holds neither tasks nor a sandbox.
    pub fn shutdown(&self) {
        let has_sandbox = self.pod().is_some_and(|p| p.has_sandbox());
        if has_sandbox || !self.close_if_empty() {
            log::debug!("shutdown ignored: tasks or a sandbox remain");
            return;
        }
        (self.on_shutdown)();
    }

    #[cfg(test)]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes the task manager (see [`TaskManager::close`]) if it holds no container, not even
    /// one being created: decided under the table's lock, so a Create arriving now is refused
    /// rather than left behind by the exiting daemon. Returns whether it closed.
    pub fn close_if_empty(&self) -> bool {
        let table = self.containers.locked();
        if !table.is_empty() {
            return false;
        }
        self.closed.store(true, Ordering::SeqCst);
        true
    }

    /// The shim is going away (ShutdownSandbox): refuses new Creates, and waits, at most until
    /// `deadline`, for those under way to end. One that ends after this undoes itself (its
    /// runc container, rootfs mount and network) instead of adding a container nobody would
    /// delete. Returns whether no Create is under way any more.
    pub fn close(&self, deadline: Instant) -> bool {
        let mut table = self.containers.locked();
        self.closed.store(true, Ordering::SeqCst);
        loop {
            if !table.values().any(|s| matches!(s, Slot::Creating)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _blocked = crate::shim::blocking::blocking();
            table = self.creates_done.wait_on_timeout(table, left).0;
        }
    }
}

/// A process as State reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessStatus {
    pub bundle: PathBuf,
    pub pid: u32,
    pub status: Status,
    /// Set once the exit is visible.
    pub exit: Option<ExitInfo>,
    pub stdio: StdioRequest,
}

/// What a Create that comes too late hears.
fn shutting_down() -> Error {
    Error::precondition("the shim is shutting down")
}

const SIGKILL: u32 = libc::SIGKILL as u32;

/// A signal Kill may send: 1..=SIGRTMAX of this system (real-time signals included: systemd's
/// stop signal is SIGRTMIN+3). 0 only probes, and containerd never sends it.
fn check_signal(signal: u32) -> Result<()> {
    let max = libc::SIGRTMAX();
    if signal == 0 || i64::from(signal) > i64::from(max) {
        return Err(Error::invalid(format!(
            "signal {signal} is not valid (want 1..={max})"
        )));
    }
    Ok(())
}

fn validate_bundle(bundle: &Path) -> Result<()> {
    if !bundle.is_absolute()
        || bundle
            .components()
            .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(Error::invalid(format!(
            "bundle {:?} must be an absolute path without '..'",
            bundle
        )));
    }
    crate::host::client_paths::check_dir("bundle", bundle)
}
