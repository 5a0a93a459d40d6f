//! The task manager: containers (one init plus execs each) run through the OCI runtime.
//!
//! It keeps one short lock for the container table and one lifecycle lock per container, so
//! a slow `runc create` of one container never stalls another. Exits arrive from the reaper
//! thread through [`TaskManager::on_exit`], which never blocks on a lifecycle lock: it records
//! the exit and publishes it unless Start is still running, in which case Start publishes it
//! right after TaskStart (containerd requires Create < Start < Exit < Delete). An init's exit is
//! made visible only after its execs' exits, as containerd's own shim does.

pub mod host;
pub mod process;

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskPaused,
    TaskResumed, TaskStart,
};
use protobuf::MessageField;

use crate::cgroups::CgroupPaths;
use crate::error::{Context, Error, Result};
use crate::events::{Event, EventSink};
use crate::mount::MountSpec;
use crate::network::{NetworkProvider, NetworkRecord};
use crate::reaper::{Exit, Reaper};
use crate::runtime::{ProcessIo, RuncConfig, Runtime};
use crate::stdio::{self, StdioRequest, TtyCopier};
use crate::util::{timestamp, write_file_atomic};
use crate::validate;

pub use host::{Host, LinuxHost};
pub use process::{ExitInfo, Process, Status};

/// The file in a task bundle that tells the `delete` action how to clean up.
pub use crate::bundle::TASK_STATE_FILE;

/// What `delete` needs to clean up a task without the daemon.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub runc: RuncConfig,
    pub rootfs_mounted: bool,
    /// The network the shim set up for a standalone task (opt-in).
    #[serde(default)]
    pub network: Option<NetworkRecord>,
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
    /// The pid Connect/Pids report for `id` if it names the sandbox.
    fn sandbox_pid(&self, id: &str) -> Option<u32>;
    /// Whether a sandbox lives in this shim (then Shutdown never exits the shim).
    fn has_sandbox(&self) -> bool;
}

/// One container.
pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runtime: Arc<dyn Runtime>,
    pub rootfs_mounted: bool,
    pub init: Arc<Process>,
    pub execs: Mutex<HashMap<String, Arc<Process>>>,
    pub cgroup: Option<CgroupPaths>,
    /// The container has no pid namespace of its own: when its init exits, the rest of its
    /// processes must be killed explicitly.
    pub shares_pid_ns: bool,
    /// Shim-owned network of a standalone task.
    pub network: Option<NetworkRecord>,
    /// Serializes lifecycle operations on this container.
    op: Mutex<()>,
}

/// The Task service's state and logic.
pub struct TaskManager {
    namespace: String,
    default_runc: RuncConfig,
    host: Arc<dyn Host>,
    events: Arc<dyn EventSink>,
    reaper: Option<Arc<Reaper>>,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    creating: Mutex<HashSet<String>>,
    by_pid: Mutex<HashMap<i32, Arc<Process>>>,
    pod: Mutex<Option<Arc<dyn PodHooks>>>,
    /// Shim-owned networking for standalone tasks: the provider (also used to tear down), and
    /// whether new tasks get a network (off by default).
    network: Mutex<(Option<Arc<dyn NetworkProvider>>, bool)>,
    /// Called when Shutdown decides the shim should exit.
    on_shutdown: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    me: Weak<TaskManager>,
}

impl TaskManager {
    pub fn new(
        namespace: &str,
        default_runc: RuncConfig,
        host: Arc<dyn Host>,
        events: Arc<dyn EventSink>,
        reaper: Option<Arc<Reaper>>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| TaskManager {
            namespace: namespace.to_string(),
            default_runc,
            host,
            events,
            reaper,
            containers: Mutex::default(),
            creating: Mutex::default(),
            by_pid: Mutex::default(),
            pod: Mutex::new(None),
            network: Mutex::new((None, false)),
            on_shutdown: Mutex::new(None),
            me: me.clone(),
        })
    }

    /// Namespace this shim serves.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn set_pod_hooks(&self, hooks: Arc<dyn PodHooks>) {
        *self.pod.lock().unwrap() = Some(hooks);
    }

    /// Sets the network provider; `setup` enables shim-owned networking for standalone tasks
    /// that ask for a network namespace.
    pub fn set_network(&self, provider: Arc<dyn NetworkProvider>, setup: bool) {
        *self.network.lock().unwrap() = (Some(provider), setup);
    }

    pub fn set_on_shutdown(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.on_shutdown.lock().unwrap() = Some(Box::new(f));
    }

    fn pod(&self) -> Option<Arc<dyn PodHooks>> {
        self.pod.lock().unwrap().clone()
    }

    /// The container `id` or NotFound.
    pub fn container(&self, id: &str) -> Result<Arc<Container>> {
        validate::id("task id", id)?;
        self.containers
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("task {id} not found")))
    }

    /// The process `exec_id` of container `id` (the init when `exec_id` is empty).
    pub fn process(&self, id: &str, exec_id: &str) -> Result<(Arc<Container>, Arc<Process>)> {
        let c = self.container(id)?;
        if exec_id.is_empty() {
            let p = c.init.clone();
            return Ok((c, p));
        }
        validate::id("exec id", exec_id)?;
        let p = c.execs.lock().unwrap().get(exec_id).cloned();
        match p {
            Some(p) => Ok((c, p)),
            None => Err(Error::not_found(format!(
                "exec {exec_id} of task {id} not found"
            ))),
        }
    }

    /// Number of live containers.
    pub fn len(&self) -> usize {
        self.containers.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // ---- Create ----

    /// Create: mount the rootfs, open stdio, `runc create`. Returns the init pid.
    pub fn create(&self, req: CreateRequest) -> Result<u32> {
        let id = req.id.clone();
        self.create_inner(req)
            .with_context(|| format!("create task {id}"))
    }

    fn create_inner(&self, req: CreateRequest) -> Result<u32> {
        validate::id("task id", &req.id)?;
        validate_bundle(&req.bundle)?;
        req.stdio.validate()?;
        crate::mount::validate(&req.rootfs)?;
        if self.containers.lock().unwrap().contains_key(&req.id)
            || !self.creating.lock().unwrap().insert(req.id.clone())
        {
            return Err(Error::already_exists(format!(
                "task {} already exists",
                req.id
            )));
        }
        let r = self.create_reserved(&req);
        self.creating.lock().unwrap().remove(&req.id);
        r
    }

    fn create_reserved(&self, req: &CreateRequest) -> Result<u32> {
        let config_path = req.bundle.join("config.json");
        let raw = std::fs::read(&config_path)
            .with_context(|| format!("read {}", config_path.display()))?;
        let mut spec: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::invalid(format!("parse {}: {e}", config_path.display())))?;
        check_spec(&spec, req.stdio.terminal)?;
        let mut spec_changed = false;
        let pod = self.pod().filter(|p| p.has_sandbox());
        if let Some(pod) = &pod {
            spec_changed |= pod
                .prepare_spec(&req.id, &mut spec)
                .context("add pod mounts")?;
        }
        let (provider, setup) = self.network.lock().unwrap().clone();
        let mut network = None;
        if pod.is_none()
            && setup
            && let Some(provider) = &provider
            && wants_new_netns(&spec)
        {
            let net = provider
                .setup(&self.namespace, &req.id, None)
                .context("set up the task network")?;
            set_netns_path(&mut spec, &net.netns);
            spec_changed = true;
            network = Some(net);
        }
        let undo_network = |network: &Option<NetworkRecord>| {
            if let (Some(net), Some(p)) = (network, &provider)
                && let Err(e) = p.teardown(net)
            {
                log::warn!("task {}: {e}", req.id);
            }
        };
        let shares_pid_ns = shares_pid_namespace(&spec);
        let runc = req
            .runc
            .clone()
            .unwrap_or_else(|| self.default_runc.clone());
        let rootfs = req.bundle.join("rootfs");
        let record = TaskRecord {
            id: req.id.clone(),
            runc: runc.clone(),
            rootfs_mounted: !req.rootfs.is_empty(),
            network: network.clone(),
        };
        let prepared = (|| -> Result<()> {
            if spec_changed {
                let data = serde_json::to_vec(&spec).map_err(|e| Error::internal(e.to_string()))?;
                write_file_atomic(&config_path, &data, 0o600).context("write config.json")?;
            }
            let data = serde_json::to_vec(&record).map_err(|e| Error::internal(e.to_string()))?;
            write_file_atomic(&req.bundle.join(TASK_STATE_FILE), &data, 0o600)
                .context("write task record")?;
            if !req.rootfs.is_empty() {
                self.host.mount_rootfs(&req.rootfs, &rootfs)?;
            }
            Ok(())
        })();
        if let Err(e) = prepared {
            undo_network(&network);
            return Err(e);
        }
        let runtime = self.host.runtime(&runc);
        let init = Arc::new(Process::new(&req.id, None, req.stdio.clone(), None));
        let created = self.spawn_init(req, &runtime, &init);
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                if !req.rootfs.is_empty() {
                    let _ = self.host.unmount_rootfs(&rootfs);
                }
                undo_network(&network);
                return Err(e);
            }
        };
        let cgroup = match self.host.cgroup_paths(pid) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("task {}: no cgroup paths: {e}", req.id);
                None
            }
        };
        if let Some(paths) = &cgroup
            && let Err(e) = self.host.watch_oom(&req.id, paths)
        {
            log::warn!("task {}: OOM events unavailable: {e}", req.id);
        }
        let container = Arc::new(Container {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            runtime,
            rootfs_mounted: !req.rootfs.is_empty(),
            init: init.clone(),
            execs: Mutex::default(),
            cgroup,
            shares_pid_ns,
            network,
            op: Mutex::new(()),
        });
        self.containers
            .lock()
            .unwrap()
            .insert(req.id.clone(), container);
        self.events.publish(Event::Create(TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.display().to_string(),
            rootfs: req
                .rootfs
                .iter()
                .map(|m| containerd_shim_protos::types::mount::Mount {
                    type_: m.kind.clone(),
                    source: m.source.clone(),
                    target: m.target.clone(),
                    options: m.options.clone(),
                    ..Default::default()
                })
                .collect(),
            io: MessageField::some(TaskIO {
                stdin: req.stdio.stdin.clone(),
                stdout: req.stdio.stdout.clone(),
                stderr: req.stdio.stderr.clone(),
                terminal: req.stdio.terminal,
                ..Default::default()
            }),
            pid: pid as u32,
            ..Default::default()
        }));
        // An exit that raced the table insert (the init was killed right away) was recorded
        // by pid already; nothing more to do here.
        Ok(pid as u32)
    }

    /// `runc create` with stdio or a terminal; registers the pid before returning.
    fn spawn_init(
        &self,
        req: &CreateRequest,
        runtime: &Arc<dyn Runtime>,
        init: &Arc<Process>,
    ) -> Result<i32> {
        let subscription = self.reaper.as_ref().map(|r| r.subscribe());
        let (io, keepalive, stdin) = if req.stdio.terminal {
            (ProcessIo::default(), Default::default(), None)
        } else {
            let o = stdio::open(&req.stdio)?;
            (o.process, o.keepalive, o.stdin)
        };
        let spawned = runtime.create(&req.id, &req.bundle, req.stdio.terminal, io)?;
        let pid = spawned.pid;
        if let Err(e) = self.attach_io(init, spawned.console, keepalive, stdin) {
            // The container exists but cannot be served: take it down again.
            let _ = runtime.delete(&req.id, true);
            return Err(e);
        }
        init.lock().pid = pid;
        self.by_pid.lock().unwrap().insert(pid, init.clone());
        if let Some(exit) = subscription.and_then(|s| s.take(pid)) {
            self.on_exit(exit);
        }
        Ok(pid)
    }

    /// Starts the stdin copier or the terminal copier of a freshly spawned process and keeps
    /// its descriptors.
    fn attach_io(
        &self,
        p: &Arc<Process>,
        console: Option<std::fs::File>,
        mut keepalive: stdio::Keepalive,
        stdin: Option<stdio::StdinCopy>,
    ) -> Result<()> {
        if let Some(copy) = stdin {
            keepalive.start_stdin(copy)?;
        }
        *p.keepalive.lock().unwrap() = keepalive;
        match console {
            Some(master) => *p.tty.lock().unwrap() = Some(self.start_tty(master, p)?),
            None if p.stdio.terminal => {
                return Err(Error::internal(
                    "runc did not send a console for the terminal",
                ));
            }
            None => {}
        }
        Ok(())
    }

    fn start_tty(&self, master: std::fs::File, process: &Arc<Process>) -> Result<TtyCopier> {
        let me = self.me.clone();
        let p = process.clone();
        TtyCopier::start(
            master,
            &process.stdio,
            Box::new(move || {
                if let Some(tm) = me.upgrade() {
                    tm.output_drained(&p);
                }
            }),
        )
    }

    // ---- Start ----

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
        let _op = c.op.lock().unwrap();
        {
            let mut st = p.lock();
            if st.status != Status::Created || st.exit.is_some() {
                return Err(Error::precondition(
                    format!("{} is {:?}, not created", p.event_id(), st.status).to_lowercase(),
                ));
            }
            st.starting = true;
        }
        let result = if p.exec_id.is_none() {
            c.runtime.start(id).map(|_| p.lock().pid)
        } else {
            self.spawn_exec(&c, &p)
        };
        let mut st = p.lock();
        st.starting = false;
        let pid = match result {
            Ok(pid) => pid,
            Err(e) => {
                drop(st);
                if p.exec_id.is_some() {
                    p.keepalive.lock().unwrap().release();
                }
                return Err(e);
            }
        };
        if st.exit.is_none() {
            st.status = Status::Running;
        }
        self.events.publish(match &p.exec_id {
            None => Event::Start(TaskStart {
                container_id: id.into(),
                pid: pid as u32,
                ..Default::default()
            }),
            Some(e) => Event::ExecStarted(TaskExecStarted {
                container_id: id.into(),
                exec_id: e.clone(),
                pid: pid as u32,
                ..Default::default()
            }),
        });
        if st.exit_pending {
            self.try_publish_exit(&c, &p, &mut st);
        }
        Ok(pid as u32)
    }

    fn spawn_exec(&self, c: &Arc<Container>, p: &Arc<Process>) -> Result<i32> {
        let exec_id = p.exec_id.as_deref().unwrap_or_default();
        let subscription = self.reaper.as_ref().map(|r| r.subscribe());
        let (io, keepalive, stdin) = if p.stdio.terminal {
            (ProcessIo::default(), Default::default(), None)
        } else {
            let o = stdio::open(&p.stdio)?;
            (o.process, o.keepalive, o.stdin)
        };
        let spec = p.spec.as_deref().unwrap_or_default();
        let spawned = c
            .runtime
            .exec(&c.id, &c.bundle, exec_id, spec, p.stdio.terminal, io)?;
        if let Err(e) = self.attach_io(p, spawned.console, keepalive, stdin) {
            // The process runs but cannot be served: kill it (the reaper collects it).
            let _ = self.host.signal(spawned.pid, 9);
            return Err(e);
        }
        p.lock().pid = spawned.pid;
        self.by_pid.lock().unwrap().insert(spawned.pid, p.clone());
        if let Some(exit) = subscription.and_then(|s| s.take(spawned.pid)) {
            self.on_exit(exit);
        }
        Ok(spawned.pid)
    }

    // ---- Exits ----

    /// Called by the reaper for every exited child. Must not block on lifecycle locks.
    pub fn on_exit(&self, exit: Exit) {
        let Some(p) = self.by_pid.lock().unwrap().remove(&exit.pid) else {
            return;
        };
        {
            let mut st = p.lock();
            if st.exit.is_some() {
                return;
            }
            st.exit = Some(ExitInfo {
                status: exit.status as u32,
                at: exit.at,
            });
            st.exit_pending = true;
        }
        log::info!(
            "task {} process {} (pid {}) exited with status {}",
            p.container_id,
            p.event_id(),
            exit.pid,
            exit.status
        );
        p.keepalive.lock().unwrap().release();
        match p.tty.lock().unwrap().as_ref() {
            // The copier flushes the terminal output first, then calls output_drained.
            Some(t) => t.process_exited(),
            None => p.lock().io_drained = true,
        }
        self.publish_if_ready(&p);
        if p.exec_id.is_none() {
            self.after_init_exit(&p);
        }
    }

    /// The terminal copier flushed the process's output.
    fn output_drained(&self, p: &Arc<Process>) {
        p.lock().io_drained = true;
        self.publish_if_ready(p);
    }

    /// Publishes `p`'s exit if nothing holds it back any more; an exec's exit may in turn
    /// release its init's.
    fn publish_if_ready(&self, p: &Arc<Process>) {
        let Ok(c) = self.container(&p.container_id) else {
            // Deleted meanwhile: nobody is left to order events for; just wake waiters.
            let mut st = p.lock();
            if st.exit.is_some() {
                p.publish_exit_locked(&mut st);
            }
            return;
        };
        let mut st = p.lock();
        self.try_publish_exit(&c, p, &mut st);
        drop(st);
        // An exec finishing may unblock its init's exit.
        if p.exec_id.is_some() {
            let mut ist = c.init.lock();
            if ist.exit_pending {
                self.try_publish_exit(&c, &c.init, &mut ist);
            }
        }
    }

    /// Publishes the exit of `p` unless Start is running, terminal output is still draining,
    /// or (for an init) an exec is still alive. Caller holds `p`'s state lock.
    fn try_publish_exit(&self, c: &Container, p: &Process, st: &mut process::ProcState) {
        let Some(exit) = st.exit else { return };
        if st.exit_published || st.starting || !st.exit_pending {
            return;
        }
        if !st.io_drained {
            return;
        }
        if p.exec_id.is_none() {
            let execs = c.execs.lock().unwrap();
            let busy = execs.values().any(|e| {
                let es = e.lock();
                es.status != Status::Created && !es.exit_published
            });
            if busy {
                return;
            }
        }
        p.publish_exit_locked(st);
        self.events.publish(Event::Exit(TaskExit {
            container_id: p.container_id.clone(),
            id: p.event_id().to_string(),
            pid: st.pid as u32,
            exit_status: exit.status,
            exited_at: MessageField::some(timestamp(exit.at)),
            ..Default::default()
        }));
    }

    /// When a container without its own pid namespace loses its init, kill the rest of it.
    fn after_init_exit(&self, init: &Arc<Process>) {
        let Ok(c) = self.container(&init.container_id) else {
            return;
        };
        if c.shares_pid_ns {
            let runtime = c.runtime.clone();
            let id = c.id.clone();
            // Off the reaper thread: runc's own exit is reaped by it.
            let _ = std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    if let Err(e) = runtime.kill(&id, 9, true) {
                        log::debug!("kill remaining processes of {id}: {e}");
                    }
                });
        }
    }

    // ---- Delete ----

    /// Delete the init (removing the task) or an exec. Returns (pid, exit status, exited at).
    pub fn delete(&self, id: &str, exec_id: &str) -> Result<(u32, u32, SystemTime)> {
        let what = if exec_id.is_empty() {
            format!("delete task {id}")
        } else {
            format!("delete exec {exec_id} of task {id}")
        };
        self.delete_inner(id, exec_id).context(&what)
    }

    fn delete_inner(&self, id: &str, exec_id: &str) -> Result<(u32, u32, SystemTime)> {
        let (c, p) = self.process(id, exec_id)?;
        let _op = c.op.lock().unwrap();
        let (pid, status, exit) = {
            let st = p.lock();
            (st.pid, st.status, st.exit)
        };
        if exit.is_none() && status != Status::Created {
            return Err(Error::precondition(format!(
                "{} is still running; kill it first",
                p.event_id()
            )));
        }
        let (code, at) = match exit {
            Some(e) => (e.status, e.at),
            None => (0, SystemTime::now()),
        };
        if let Some(exec_id) = &p.exec_id {
            c.execs.lock().unwrap().remove(exec_id);
            if exit.is_none() {
                self.by_pid.lock().unwrap().remove(&pid);
            }
            p.keepalive.lock().unwrap().release();
            return Ok((pid as u32, code, at));
        }
        match c.runtime.delete(id, true) {
            Ok(()) => {}
            Err(e) if e.kind() == crate::error::Kind::NotFound => {}
            Err(e) => return Err(e),
        }
        if c.rootfs_mounted {
            self.host.unmount_rootfs(&c.bundle.join("rootfs"))?;
        }
        self.host.unwatch_oom(id);
        if let Some(net) = &c.network {
            let provider = self.network.lock().unwrap().0.clone();
            if let Err(e) = crate::network::teardown(provider.as_ref(), net) {
                log::warn!("delete task {id}: {e}");
            }
        }
        p.keepalive.lock().unwrap().release();
        self.containers.lock().unwrap().remove(id);
        {
            let mut by_pid = self.by_pid.lock().unwrap();
            by_pid.retain(|_, proc_| proc_.container_id != id);
        }
        self.events.publish(Event::Delete(TaskDelete {
            container_id: id.into(),
            pid: pid as u32,
            exit_status: code,
            exited_at: MessageField::some(timestamp(at)),
            id: id.into(),
            ..Default::default()
        }));
        Ok((pid as u32, code, at))
    }

    // ---- Exec ----

    /// Registers an exec process (started later by Start with the exec ID).
    pub fn exec(
        &self,
        id: &str,
        exec_id: &str,
        stdio: StdioRequest,
        spec_json: Vec<u8>,
    ) -> Result<()> {
        self.exec_inner(id, exec_id, stdio, spec_json)
            .with_context(|| format!("exec {exec_id} in task {id}"))
    }

    fn exec_inner(
        &self,
        id: &str,
        exec_id: &str,
        stdio: StdioRequest,
        spec_json: Vec<u8>,
    ) -> Result<()> {
        validate::id("exec id", exec_id)?;
        stdio.validate()?;
        let c = self.container(id)?;
        let spec: serde_json::Value = serde_json::from_slice(&spec_json)
            .map_err(|e| Error::invalid(format!("process spec is not JSON: {e}")))?;
        if spec
            .get("args")
            .and_then(|a| a.as_array())
            .is_none_or(|a| a.is_empty())
        {
            return Err(Error::invalid("process spec has no args"));
        }
        if spec
            .get("terminal")
            .and_then(|t| t.as_bool())
            .unwrap_or(false)
            != stdio.terminal
        {
            return Err(Error::invalid(
                "process spec terminal does not match the request",
            ));
        }
        {
            let ist = c.init.lock();
            if ist.exit.is_some() || ist.status != Status::Running && ist.status != Status::Paused {
                return Err(Error::precondition(format!("task {id} is not running")));
            }
        }
        let mut execs = c.execs.lock().unwrap();
        if execs.contains_key(exec_id) {
            return Err(Error::already_exists(format!(
                "exec {exec_id} already exists"
            )));
        }
        execs.insert(
            exec_id.into(),
            Arc::new(Process::new(
                id,
                Some(exec_id.into()),
                stdio,
                Some(spec_json),
            )),
        );
        drop(execs);
        self.events.publish(Event::ExecAdded(TaskExecAdded {
            container_id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        }));
        Ok(())
    }

    // ---- Signals, state, waiting ----

    pub fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let (c, p) = self
            .process(id, exec_id)
            .with_context(|| format!("kill {id}"))?;
        let (pid, exited) = {
            let st = p.lock();
            (st.pid, st.exit.is_some())
        };
        if p.exec_id.is_none() {
            if exited && !all {
                return Err(Error::not_found(format!(
                    "kill task {id}: process already finished"
                )));
            }
            return c
                .runtime
                .kill(id, signal, all)
                .with_context(|| format!("kill task {id}"));
        }
        if exited {
            return Err(Error::not_found(format!(
                "kill exec {}: process already finished",
                p.event_id()
            )));
        }
        if pid == 0 {
            return Err(Error::precondition(format!(
                "kill exec {}: not started",
                p.event_id()
            )));
        }
        self.host
            .signal(pid, signal)
            .with_context(|| format!("kill exec {}", p.event_id()))
    }

    /// Blocks until the process exited; returns its exit.
    pub fn wait(&self, id: &str, exec_id: &str) -> Result<ExitInfo> {
        let (_, p) = self
            .process(id, exec_id)
            .with_context(|| format!("wait {id}"))?;
        Ok(p.wait())
    }

    pub fn pause(&self, id: &str) -> Result<()> {
        self.freeze(id, true)
    }

    pub fn resume(&self, id: &str) -> Result<()> {
        self.freeze(id, false)
    }

    /// Pause (`freeze`) or resume a running task, with its event.
    fn freeze(&self, id: &str, freeze: bool) -> Result<()> {
        let (verb, from, to) = if freeze {
            ("pause", Status::Running, Status::Paused)
        } else {
            ("resume", Status::Paused, Status::Running)
        };
        let c = self.container(id).with_context(|| format!("{verb} {id}"))?;
        let _op = c.op.lock().unwrap();
        if c.init.lock().status != from {
            return Err(Error::precondition(format!(
                "{verb} {id}: task is not {}",
                if freeze { "running" } else { "paused" }
            )));
        }
        let r = if freeze {
            c.runtime.pause(id)
        } else {
            c.runtime.resume(id)
        };
        r.with_context(|| format!("{verb} {id}"))?;
        let mut st = c.init.lock();
        if st.exit.is_none() {
            st.status = to;
        }
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

    /// Pids of the container, with the exec ID of each exec process.
    pub fn pids(&self, id: &str) -> Result<Vec<(u32, Option<String>)>> {
        if let Some(pid) = self.pod().and_then(|p| p.sandbox_pid(id)) {
            return Ok(vec![(pid, None)]);
        }
        let c = self.container(id).with_context(|| format!("pids {id}"))?;
        let pids = c.runtime.ps(id).with_context(|| format!("pids {id}"))?;
        let execs = c.execs.lock().unwrap();
        Ok(pids
            .into_iter()
            .map(|pid| {
                let exec = execs
                    .values()
                    .find(|e| e.lock().pid == pid)
                    .and_then(|e| e.exec_id.clone());
                (pid as u32, exec)
            })
            .collect())
    }

    pub fn stats(&self, id: &str) -> Result<protobuf::well_known_types::any::Any> {
        let c = self.container(id).with_context(|| format!("stats {id}"))?;
        let paths = c
            .cgroup
            .as_ref()
            .ok_or_else(|| crate::cgroups::no_cgroup(id))?;
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

    pub fn close_io(&self, id: &str, exec_id: &str, stdin: bool) -> Result<()> {
        let (_, p) = self
            .process(id, exec_id)
            .with_context(|| format!("close io of {id}"))?;
        if stdin {
            p.keepalive.lock().unwrap().close_stdin();
            if let Some(t) = p.tty.lock().unwrap().as_ref() {
                t.close_stdin();
            }
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
        match p.tty.lock().unwrap().as_ref() {
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
        Ok(c.init.lock().pid as u32)
    }

    /// Shutdown: the shim exits once it holds neither tasks nor a sandbox.
    pub fn shutdown(&self) {
        let has_sandbox = self.pod().is_some_and(|p| p.has_sandbox());
        if has_sandbox || !self.is_empty() {
            log::debug!("shutdown ignored: tasks or a sandbox remain");
            return;
        }
        if let Some(f) = self.on_shutdown.lock().unwrap().as_ref() {
            f();
        }
    }

    /// Every container, for teardown of the pod.
    pub fn all(&self) -> Vec<Arc<Container>> {
        self.containers.lock().unwrap().values().cloned().collect()
    }
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
    if !bundle.is_dir() {
        return Err(Error::invalid(format!(
            "bundle {} is not a directory",
            bundle.display()
        )));
    }
    Ok(())
}

/// Minimal checks of an OCI spec before runc sees it.
fn check_spec(spec: &serde_json::Value, terminal: bool) -> Result<()> {
    let Some(obj) = spec.as_object() else {
        return Err(Error::invalid("config.json is not a JSON object"));
    };
    if obj.get("ociVersion").and_then(|v| v.as_str()).is_none() {
        return Err(Error::invalid("config.json has no ociVersion"));
    }
    if obj
        .get("root")
        .and_then(|r| r.get("path"))
        .and_then(|p| p.as_str())
        .is_none()
    {
        return Err(Error::invalid("config.json has no root.path"));
    }
    if let Some(p) = obj.get("process") {
        if p.get("args")
            .and_then(|a| a.as_array())
            .is_none_or(|a| a.is_empty())
        {
            return Err(Error::invalid("config.json process has no args"));
        }
        let spec_terminal = p.get("terminal").and_then(|t| t.as_bool()).unwrap_or(false);
        if spec_terminal != terminal {
            return Err(Error::invalid(format!(
                "config.json process.terminal is {spec_terminal} but the request asks for terminal={terminal}"
            )));
        }
    }
    Ok(())
}

/// True when the spec asks for a new network namespace (an entry without a path).
fn wants_new_netns(spec: &serde_json::Value) -> bool {
    spec.pointer("/linux/namespaces")
        .and_then(|n| n.as_array())
        .is_some_and(|list| {
            list.iter().any(|n| {
                n.get("type").and_then(|t| t.as_str()) == Some("network")
                    && n.get("path")
                        .and_then(|p| p.as_str())
                        .is_none_or(str::is_empty)
            })
        })
}

/// Points the spec's network namespace at `path`.
fn set_netns_path(spec: &mut serde_json::Value, path: &Path) {
    if let Some(list) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(|n| n.as_array_mut())
    {
        for n in list {
            if n.get("type").and_then(|t| t.as_str()) == Some("network") {
                n["path"] = serde_json::json!(path);
            }
        }
    }
}

/// True when the spec has no pid namespace of its own (host's, or joined by path).
fn shares_pid_namespace(spec: &serde_json::Value) -> bool {
    let ns = spec.pointer("/linux/namespaces").and_then(|n| n.as_array());
    let own = ns.is_some_and(|list| {
        list.iter().any(|n| {
            n.get("type").and_then(|t| t.as_str()) == Some("pid")
                && n.get("path")
                    .and_then(|p| p.as_str())
                    .is_none_or(str::is_empty)
        })
    });
    !own
}

#[cfg(test)]
mod tests;
