//! The Sandbox service's state and logic: one pod per shim.
//!
//! CreateSandbox decodes the CRI pod config, writes the pod files and mounts the pod's
//! /dev/shm; StartSandbox starts the pause process (see [`super::pause`]) in the pod cgroup;
//! containers created afterwards get the pod files and /dev/shm added to their spec
//! ([`crate::task::PodHooks`]). StopSandbox kills the pod's processes and the pause process
//! synchronously (containerd removes the netns right after it returns); ShutdownSandbox removes
//! everything and lets the shim exit. What `delete` needs to clean up after a dead shim is kept
//! in `<bundle>/rsandbox-sandbox.json`.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use protobuf::well_known_types::any::Any;

use super::cgroup::PodCgroup;
use super::pause::{PauseConfig, PauseProcess};
use super::spec::{
    CgroupParent, IpcMode, MemberNamespace, NetworkMode, NetworkPlan, PodSpec, SysctlDefaults,
};
use crate::host::network::{NetworkProvider, NetworkRecord};
use crate::host::reclaim::Member;
use crate::host::systemd::scope::PodScope;
use crate::records::error::{Context, Error, Result};
use crate::records::oci::{self, NamespaceChoice, PodMount};
use crate::records::validate;
use crate::shim::reaper::{Exit, Reaper};
use crate::shim::sync::{Lock, Wait};
use crate::shim::timing::Steps;
use crate::shim::util::write_file_atomic;
use crate::shim::waiters::{ExitInfo, ExitWaiter, Waiters};
use crate::task::{PodHooks, TaskManager};

/// The file in the sandbox bundle that tells `delete` what to clean up.
pub use crate::records::bundle::SANDBOX_STATE_FILE;

/// OS effects of the pod, behind one trait so the Sandbox service is testable without root.
pub trait PodHost: Send + Sync {
    fn write_files(&self, dir: &Path, spec: &PodSpec) -> Result<()>;
    fn remove_files(&self, dir: &Path) -> Result<()>;
    /// Mounts the pod's /dev/shm tmpfs, labelled for `spec`'s containers where SELinux is on.
    fn mount_shm(&self, path: &Path, spec: &PodSpec) -> Result<()>;
    /// Labels the pod files in `dir` with the shared form of a container's SELinux mount
    /// label (its spec's `linux.mountLabel`); a no-op where SELinux is off.
    fn label_pod_files(&self, dir: &Path, mount_label: &str) -> Result<()>;
    fn unmount_shm(&self, path: &Path) -> Result<()>;
    /// Checks that `path` is a network namespace, without blocking (a client's `netns_path`).
    fn check_netns(&self, path: &Path) -> Result<()>;
    fn spawn_pause(&self, cfg: &PauseConfig) -> Result<PauseProcess>;
    /// Moves `pid` into `cgroup` (the pause's: `<cgroup_parent>/<sandbox id>`, see
    /// [`super::cgroup`]), creating what is missing.
    fn join_cgroup(&self, cgroup: &Path, pid: i32) -> Result<PodCgroup>;
    /// Removes the cgroups of pod `id`'s pause that this shim made (never a pod cgroup or
    /// other parent: see [`super::cgroup::remove`]).
    fn remove_cgroup(&self, id: &str, cg: &PodCgroup);
    /// Puts `pid` in the systemd scope `scope` of the pod's slice (a `.slice`
    /// cgroup_parent: systemd cgroup driver, see [`super::scope`]).
    fn join_scope(
        &self,
        scope: &PodScope,
        id: &str,
        pid: i32,
    ) -> std::result::Result<PodCgroup, super::scope::JoinFailed>;
    /// Stops the systemd scope `cg` names, if it names one (one already gone is fine).
    fn stop_scope(&self, cg: &PodCgroup) -> Result<()>;
    /// SIGKILL to the pause, through its handle (never `kill(pid)`: once the reaper took it,
    /// its pid may name another process).
    fn kill(&self, pause: &PauseProcess);
    /// Statistics of the pod cgroup `pod` (absolute in the cgroup tree: `/kubepods/pod1`).
    fn metrics(&self, pod: &Path) -> Result<Any>;
    /// The cgroup of `pid` relative to its hierarchy (the one the pod cgroup is managed in).
    fn cgroup_path(&self, pid: i32) -> Option<String>;
    /// Which of containerd's default pod sysctls this host accepts (detected once at start-up).
    fn sysctl_defaults(&self) -> SysctlDefaults;
    /// Whether the pod's OCI runtime can run user-namespaced containers (runc >= 1.2, see
    /// [`crate::host::runtime::check_userns_runc`]); the error names the version found.
    fn check_userns_runtime(&self) -> Result<()>;
    /// Reserves the pod's SELinux MCS level across the node ([`crate::host::mcs`]) where the pause
    /// gets labels: the level the pod names, else a random pair no other pod has; `None`
    /// where SELinux gives the pause no label.
    fn reserve_mcs(
        &self,
        id: &str,
        options: Option<&crate::host::selinux::SelinuxOptions>,
    ) -> Result<Option<crate::host::mcs::Reservation>>;
    /// Releases a reservation of [`PodHost::reserve_mcs`].
    fn release_mcs(&self, r: &crate::host::mcs::Reservation);
    /// Gives the bundle, the pod files and /dev/shm to the root of the pod's user namespace
    /// (`root`: its host uid and gid), see [`super::files::own_for_userns`].
    fn own_for_userns(
        &self,
        bundle: &Path,
        files_dir: &Path,
        shm: Option<&Path>,
        root: (u32, u32),
    ) -> Result<()>;
}

/// What `delete` reads to clean up after a dead shim.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub pause_pid: i32,
    /// /proc/<pid>/stat start time of the pause process, to never kill a recycled pid.
    pub pause_start_ticks: u64,
    /// Set just before the pause is spawned (boot-time clock ticks), cleared once its pid is
    /// recorded: a shim killed in between leaves a pause that `delete` then finds by its
    /// command line ([`super::unrecorded_pause`]).
    #[serde(default)]
    pub pause_spawning_since_ticks: u64,
    pub shm: Option<PathBuf>,
    pub files_dir: PathBuf,
    pub cgroup: PodCgroup,
    /// The network the shim set up itself (no netns_path was given).
    #[serde(default)]
    pub network: Option<NetworkRecord>,
    /// The pod's containers, each listed before its `runc create` and dropped after its
    /// delete: after a crash, `delete` takes them down ([`crate::host::reclaim`]).
    #[serde(default)]
    pub members: Vec<Member>,
    /// The pause's SELinux MCS level reserved across the node ([`crate::host::mcs`]): released
    /// by ShutdownSandbox, or by `delete` after a shim that died.
    #[serde(default)]
    pub mcs: Option<crate::host::mcs::Reservation>,
}

/// Sandbox lifecycle states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Created,
    Ready,
    NotReady,
}

/// What a non-verbose SandboxStatus answers, copied out of the sandbox's data.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusView {
    pub id: String,
    pub pid: i32,
    pub state: State,
    pub created_at: Option<SystemTime>,
    pub exit: Option<(u32, SystemTime)>,
}

impl StatusView {
    pub fn of(s: &Sandbox) -> StatusView {
        StatusView {
            id: s.id.clone(),
            pid: s.pid,
            state: s.state,
            created_at: s.created_at,
            exit: s.exit,
        }
    }
}

/// One pod.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: String,
    pub bundle: PathBuf,
    pub spec: PodSpec,
    pub netns: Option<PathBuf>,
    pub state: State,
    pub pid: i32,
    /// The pause's handle (its pidfd), from StartSandbox on: the only way it is signalled.
    pub pause: Option<Arc<PauseProcess>>,
    pub created_at: Option<SystemTime>,
    pub exit: Option<(u32, SystemTime)>,
    pub record: SandboxRecord,
    /// The record's systemd scope is known to be gone (stopped by StopSandbox): Shutdown
    /// need not ask systemd again.
    pub scope_stopped: bool,
    /// StartSandbox's StartTransientUnit got no answer: systemd may still run it, with the
    /// pause's pid. The pause was kept alive for it (that pid then names the pause), and
    /// StopSandbox stops the scope before it kills the pause.
    pub scope_unconfirmed: bool,
    /// The `PodSandboxConfig` as containerd sent it (protobuf), for the verbose status.
    pub pod_config: Option<Arc<[u8]>>,
    /// The spec StartSandbox reported, for the verbose status.
    pub started_spec: Option<Arc<serde_json::Value>>,
    /// The pod's /dev/shm was taken down by StopSandbox: Shutdown leaves it.
    pub shm_unmounted: bool,
    /// StopSandbox killed the pause but saw no exit within its wait: until the reaper reports
    /// it (or its pidfd says it exited), ShutdownSandbox keeps its SELinux level reserved and
    /// the record, and fails.
    pub pause_lingers: bool,
}

/// The Sandbox service's state.
pub struct SandboxManager {
    host: Arc<dyn PodHost>,
    tm: Arc<TaskManager>,
    reaper: Option<Arc<Reaper>>,
    sandbox: Mutex<Option<Sandbox>>,
    changed: Condvar,
    /// Parked WaitSandbox calls, answered when the pod ends (pause exit, stop, shutdown).
    waiters: Mutex<Waiters>,
    on_shutdown: Arc<dyn Fn() + Send + Sync>,
    /// Shim-owned networking: the provider (also used to tear down).
    network: Option<Arc<dyn NetworkProvider>>,
    /// Whether pods created without a netns get a shim-owned network.
    network_for_pods: bool,
    /// Serializes lifecycle calls (create/start/stop/shutdown). The data lock above is only
    /// ever held briefly: helpers (CNI plugins) are reaped by the reaper thread, which calls
    /// `on_exit`, which needs the data lock.
    op: Mutex<()>,
}

/// Everything the sandbox manager is built with, besides its task manager.
pub struct SandboxDeps {
    pub host: Arc<dyn PodHost>,
    /// The shim's exit monitor; `None` in tests that inject exits by hand.
    pub reaper: Option<Arc<Reaper>>,
    pub network: Option<Arc<dyn NetworkProvider>>,
    pub network_for_pods: bool,
    /// Called when ShutdownSandbox lets the shim exit.
    pub on_shutdown: Arc<dyn Fn() + Send + Sync>,
}

/// A CreateSandbox request, decoded.
#[derive(Debug, Clone, Default)]
pub struct CreateSandbox {
    pub id: String,
    pub bundle: PathBuf,
    pub spec: PodSpec,
    pub netns: Option<PathBuf>,
    /// The `PodSandboxConfig` the spec was decoded from (protobuf), if there was one.
    pub pod_config: Option<Arc<[u8]>>,
}

/// How long StopSandbox waits for the pod's processes to be reaped.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl SandboxManager {
    /// Builds the sandbox manager and, through `tasks`, its task manager, which gets the
    /// sandbox as a weak back edge (the sandbox owns the task manager, never the reverse).
    pub fn new(
        deps: SandboxDeps,
        tasks: impl FnOnce(Weak<dyn PodHooks>) -> Arc<TaskManager>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me: &Weak<SandboxManager>| {
            let hooks: Weak<dyn PodHooks> = me.clone();
            SandboxManager {
                host: deps.host,
                tm: tasks(hooks),
                reaper: deps.reaper,
                sandbox: Mutex::new(None),
                changed: Condvar::new(),
                waiters: Mutex::default(),
                on_shutdown: deps.on_shutdown,
                network: deps.network,
                network_for_pods: deps.network_for_pods,
                op: Mutex::new(()),
            }
        })
    }

    /// The task manager of this pod.
    pub fn tasks(&self) -> &Arc<TaskManager> {
        &self.tm
    }

    fn lock(&self) -> MutexGuard<'_, Option<Sandbox>> {
        self.sandbox.locked()
    }

    /// The sandbox `id`, or NotFound.
    pub fn get(&self, id: &str) -> Result<Sandbox> {
        validate::id("sandbox id", id)?;
        match self.lock().as_ref() {
            Some(s) if s.id == id => Ok(s.clone()),
            _ => Err(Error::not_found(format!("sandbox {id} not found"))),
        }
    }

    /// [`SandboxManager::get`]'s status fields without waiting for the sandbox's data: `None`
    /// while another call holds it (a record being written), so that a caller that must not
    /// wait (the connection reader, see [`crate::server::rpc::server::InlineMethod`]) can hand the
    /// call on instead.
    pub fn try_status(&self, id: &str) -> Option<Result<StatusView>> {
        if let Err(e) = validate::id("sandbox id", id) {
            return Some(Err(e));
        }
        let guard = match self.sandbox.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(match guard.as_ref() {
            Some(s) if s.id == id => Ok(StatusView::of(s)),
            _ => Err(Error::not_found(format!("sandbox {id} not found"))),
        })
    }

    /// Holds the sandbox's data as a call in progress would (tests of [`Self::try_status`]).
    #[cfg(test)]
    pub fn hold_data(&self) -> MutexGuard<'_, Option<Sandbox>> {
        self.lock()
    }

    // ---- Create / Start ----

    pub fn create(&self, req: CreateSandbox) -> Result<()> {
        let id = req.id.clone();
        self.create_inner(req)
            .with_context(|| format!("create sandbox {id}"))
    }

    fn create_inner(&self, req: CreateSandbox) -> Result<()> {
        validate::id("sandbox id", &req.id)?;
        check_abs_dir("bundle", &req.bundle)?;
        if let Some(ns) = &req.netns {
            check_abs_path("netns_path", ns)?;
            // Opened without blocking and checked: a fifo or a regular file given as
            // netns_path is refused here, not waited on (or failed on late in StartSandbox).
            self.host.check_netns(ns).map_err(|e| {
                if e.kind() == crate::records::error::Kind::NotFound {
                    Error::invalid(format!("netns_path {} does not exist", ns.display()))
                } else {
                    Error::invalid(format!("netns_path: {}", e.message()))
                }
            })?;
        }
        let provider = self.network.clone().filter(|_| self.network_for_pods);
        let mut req = req;
        let plan = req
            .spec
            .network_plan(req.netns.is_some(), provider.is_some())
            .map_err(Error::invalid)?;
        match plan {
            // The pod is then on the host network for everything that follows: the pause
            // process, containerd's default net.* sysctls (never written into the host's
            // netns), and the member containers.
            NetworkPlan::Host => {
                req.spec.network = NetworkMode::Host;
                req.netns = None;
            }
            NetworkPlan::Given | NetworkPlan::ShimOwned => {}
        }
        let _op = crate::shim::blocking::lock(&self.op);
        if let Some(s) = self.lock().as_ref() {
            return Err(if s.id == req.id {
                Error::already_exists(format!("sandbox {} already exists", req.id))
            } else {
                Error::precondition(format!("this shim already runs sandbox {}", s.id))
            });
        }
        if req.spec.userns.is_some() {
            // Before anything is made: with a runc that cannot run them, the pod's containers
            // would fail one by one (or run without their volumes' idmapping).
            self.host.check_userns_runtime()?;
        }
        let files_dir = req.bundle.join("etc");
        let shm = (req.spec.ipc == IpcMode::Pod).then(|| req.bundle.join("shm"));
        let mut record = SandboxRecord {
            id: req.id.clone(),
            files_dir: files_dir.clone(),
            ..Default::default()
        };
        let mut netns = req.netns.clone();
        let mut steps = Steps::new(|| format!("create sandbox {}", req.id));
        // Each step records what it made, so `undo` takes down exactly that on failure.
        let r = (|| -> Result<()> {
            self.host
                .write_files(&files_dir, &req.spec)
                .context("write pod files")?;
            steps.step("pod files");
            if let Some(shm) = &shm {
                std::fs::create_dir_all(shm)
                    .with_context(|| format!("create {}", shm.display()))
                    .and_then(|_| self.host.mount_shm(shm, &req.spec))
                    .context("mount the pod's /dev/shm")?;
                record.shm = Some(shm.clone());
                steps.step("mount /dev/shm");
            }
            if let Some(u) = &req.spec.userns {
                self.host
                    .own_for_userns(&req.bundle, &files_dir, shm.as_deref(), u.host_root())
                    .context("give the pod's files to the root of its user namespace")?;
                steps.step("userns ownership");
            }
            if plan == NetworkPlan::ShimOwned
                && let Some(provider) = &provider
            {
                // Without a CRI pod config there is no pod identity to pass (no K8S_POD_*).
                let conf = req
                    .spec
                    .cri_config
                    .then(|| req.spec.network_conf())
                    .transpose()
                    .context("set up the pod network")?;
                let net = provider
                    .setup(self.tm.namespace(), &req.id, conf.as_ref())
                    .context("set up the pod network")?;
                netns = Some(net.netns.clone());
                record.network = Some(net);
                steps.step("netns and CNI");
            }
            save_record(&req.bundle, &record)?;
            steps.step("save record");
            Ok(())
        })();
        if let Err(e) = r {
            self.undo(&record);
            return Err(e);
        }
        *self.lock() = Some(Sandbox {
            id: req.id,
            bundle: req.bundle,
            spec: req.spec,
            netns,
            state: State::Created,
            pid: 0,
            pause: None,
            created_at: None,
            exit: None,
            record,
            scope_stopped: false,
            scope_unconfirmed: false,
            pod_config: req.pod_config,
            started_spec: None,
            shm_unmounted: false,
            pause_lingers: false,
        });
        Ok(())
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

    /// Takes down what `record` says was made: the network, /dev/shm, the pod files, the
    /// pause's MCS reservation.
    fn undo(&self, record: &SandboxRecord) {
        self.teardown_network(record);
        self.undo_files(record);
        if let Some(r) = &record.mcs {
            self.host.release_mcs(r);
        }
    }

    /// CNI DEL and netns removal of a shim-owned network; idempotent.
    fn teardown_network(&self, record: &SandboxRecord) {
        let Some(net) = &record.network else { return };
        if let Err(e) = crate::host::network::teardown(self.network.as_ref(), net) {
            log::warn!("sandbox {}: {e}", record.id);
        }
    }

    fn undo_files(&self, record: &SandboxRecord) {
        if let Some(shm) = &record.shm {
            let _ = self.host.unmount_shm(shm);
            let _ = std::fs::remove_dir(shm);
        }
        let _ = self.host.remove_files(&record.files_dir);
    }

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
                let scope = super::scope::plan(id, &p)?;
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
        // The pause's SELinux categories, reserved across the node's shims and recorded before
        // the spawn (for `delete`); released on any failure below that leaves no pause.
        let mcs = match self
            .host
            .reserve_mcs(id, s.spec.selinux.as_ref())
            .context("reserve the pause's SELinux categories")
            .and_then(|m| self.record_before_spawn(id, m.clone()).map(|()| m))
        {
            Ok(m) => m,
            Err(e) => {
                self.forget_scope(id, scope.is_some());
                return Err(e);
            }
        };
        cfg.mcs_level = mcs.as_ref().map(|r| r.level.clone());
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
                self.forget_mcs(id);
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
                    .join_cgroup(&super::cgroup::pause_cgroup(&parent, id), pid)
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
                // Its SELinux level goes back to the node's pool only once it has exited:
                // another pod could draw it while this pause still runs under it. Waited for
                // as StopSandbox waits, with its pid still held: until `s.pid` names it below,
                // its exit stays unreaped, and on_exit sees it then.
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
                    self.forget_mcs(id);
                } else {
                    // Not dead (stuck in the kernel): kept as StopSandbox keeps a pause that
                    // would not die. The level and the record stay (`delete` kills a recorded
                    // pause and keeps the level while it is there), the pod is NOTREADY and
                    // never started again, and Shutdown fails until its exit is seen.
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

    /// Writes what `delete` needs if the shim dies from here until the pause's pid is recorded
    /// into the stored record: the pause's MCS reservation, and that its spawn begins now.
    fn record_before_spawn(
        &self,
        id: &str,
        mcs: Option<crate::host::mcs::Reservation>,
    ) -> Result<()> {
        self.record_mcs_and_spawn(id, mcs, super::unrecorded_pause::boot_ticks_now())
    }

    /// Writes the pause's MCS reservation into the stored record (after a failed start).
    fn record_mcs(&self, id: &str, mcs: Option<crate::host::mcs::Reservation>) -> Result<()> {
        self.record_mcs_and_spawn(id, mcs, 0)
    }

    fn record_mcs_and_spawn(
        &self,
        id: &str,
        mcs: Option<crate::host::mcs::Reservation>,
        spawning_since: u64,
    ) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut().filter(|s| s.id == id) else {
            if let Some(r) = &mcs {
                self.host.release_mcs(r);
            }
            return Err(Error::precondition(format!(
                "sandbox {id} went away while starting"
            )));
        };
        s.record.mcs = mcs;
        s.record.pause_spawning_since_ticks = spawning_since;
        save_record(&s.bundle, &s.record)
    }

    /// After a failed start that leaves no pause: its MCS level is released, and the record
    /// no longer says a spawn is under way.
    fn forget_mcs(&self, id: &str) {
        let (mcs, marked) = match self.lock().as_mut().filter(|s| s.id == id) {
            Some(s) => (
                s.record.mcs.take(),
                std::mem::take(&mut s.record.pause_spawning_since_ticks) != 0,
            ),
            None => return,
        };
        if let Some(r) = &mcs {
            self.host.release_mcs(r);
        }
        if (mcs.is_some() || marked)
            && let Err(e) = self.record_mcs(id, None)
        {
            log::warn!("sandbox {id}: {e}");
        }
    }

    /// After a failed start: the scope was not made (or was undone), the record says so.
    fn forget_scope(&self, id: &str, had: bool) {
        if had && let Err(e) = self.record_scope(id, None) {
            log::warn!("sandbox {id}: {e}");
        }
    }

    // ---- Exits, Stop, Wait ----

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
    fn record_exit(&self, s: &mut Sandbox, exit: Exit) -> Vec<Box<dyn ExitWaiter>> {
        if s.exit.is_some() {
            return Vec::new();
        }
        // A status the pause program exits with when its own set-up fails says which step.
        let why = super::pause_image::describe_exit(exit.status)
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

    /// The OCI spec of the running sandbox, for `StartSandboxResponse.spec` (see
    /// [`super::sandbox_spec`]). Its cgroups path only when the pause is in the pod cgroup:
    /// otherwise it shares the shim's, which an NRI plugin must not take for the pod's.
    fn spec_of(&self, s: &Sandbox) -> serde_json::Value {
        let cgroups_path = match &s.record.cgroup.scope {
            // The form the runc path's pause container has, as CRI wrote it.
            Some(scope) => Some(super::scope::cgroups_path(scope, &s.id)),
            None => (!s.record.cgroup.dirs.is_empty())
                .then(|| self.host.cgroup_path(s.pid))
                .flatten(),
        };
        super::sandbox_spec::build(super::sandbox_spec::RunningPod {
            id: &s.id,
            spec: &s.spec,
            pid: s.pid,
            netns: s.netns.as_deref(),
            cgroups_path: cgroups_path.as_deref(),
        })
    }

    /// Pod statistics from the pod cgroup (the pause's cgroup is one leaf of it). Without a
    /// cgroup_parent there is no pod cgroup: containerd's CRI then fails the runc path's pod
    /// stats alike ("cgroupPath is empty").
    pub fn metrics(&self, id: &str) -> Result<Any> {
        let s = self.get(id).context("sandbox metrics")?;
        if s.state != State::Ready {
            return Err(Error::precondition(format!(
                "sandbox metrics: sandbox {id} is not running"
            )));
        }
        let Some(pod) = &s.record.cgroup.pod else {
            return Err(Error::precondition(format!(
                "sandbox metrics: sandbox {id} has no pod cgroup (no cgroup_parent)"
            )));
        };
        self.host.metrics(pod).context("sandbox metrics")
    }

    /// The entries a verbose SandboxStatus adds to `info` (see [`super::status_info`]).
    pub fn verbose_info(&self, s: &Sandbox) -> Vec<(String, String)> {
        use super::status_info::{PodView, ProcessStatus, entries};
        let process = match s.state {
            State::Created => ProcessStatus::Created,
            State::Ready => ProcessStatus::Running,
            State::NotReady => ProcessStatus::Stopped,
        };
        // CRI removes its netns after StopSandbox, the shim its own: gone is closed. Opened
        // as a client path (never blocks, checks it is a network namespace).
        let netns_closed = s
            .netns
            .as_deref()
            .is_some_and(|p| crate::host::client_paths::open_netns(p).is_err());
        entries(&PodView {
            pid: u32::try_from(s.pid).unwrap_or(0),
            process,
            spec: &s.spec,
            netns: s.netns.as_deref(),
            netns_closed,
            pod_config: s.pod_config.as_deref(),
            runtime_spec: s.started_spec.as_deref(),
            network: s.record.network.as_ref(),
            files_dir: &s.record.files_dir,
            shm: s.record.shm.as_deref(),
            cgroup_dirs: &s.record.cgroup.dirs,
            systemd_scope: s.record.cgroup.scope.as_ref().map(|sc| sc.unit.as_str()),
            sysctls: s.spec.effective_sysctls(self.host.sysctl_defaults()),
            containers: self.tm.ids(),
        })
    }
}

fn save_record(bundle: &Path, record: &SandboxRecord) -> Result<()> {
    let data =
        crate::records::state_file::encode(&crate::records::state_file::SANDBOX_RECORD, record)?;
    write_file_atomic(&bundle.join(SANDBOX_STATE_FILE), &data, 0o600).context("save sandbox record")
}

fn check_abs_path(what: &str, p: &Path) -> Result<()> {
    if !p.is_absolute()
        || p.components().any(|c| matches!(c, Component::ParentDir))
        || p.as_os_str().len() > 4096
    {
        return Err(Error::invalid(format!(
            "{what} {:?} must be an absolute path without '..'",
            p
        )));
    }
    Ok(())
}

fn check_abs_dir(what: &str, p: &Path) -> Result<()> {
    check_abs_path(what, p)?;
    crate::host::client_paths::check_dir(what, p)
}

/// Makes a container that asks for new network, IPC or UTS namespaces (and a new PID namespace
/// when the pod shares one) join the pod's instead: the pause process's, or the node's where
/// the pod uses the node's ([`PodSpec::member_namespace`]). A container of a pod lives in the
/// pod. Returns whether the spec changed.
fn join_pod_namespaces(s: &Sandbox, spec: &mut serde_json::Value) -> bool {
    let pause_alive = s.pid != 0 && s.exit.is_none();
    oci::place_namespaces(spec, |kind| match s.spec.member_namespace(kind) {
        MemberNamespace::Host => NamespaceChoice::Node,
        MemberNamespace::Pause(name) if pause_alive => {
            NamespaceChoice::Join(format!("/proc/{}/ns/{name}", s.pid))
        }
        MemberNamespace::Pause(_) | MemberNamespace::Own => NamespaceChoice::Own,
    })
}

/// Whether a container (its namespaces already placed by [`join_pod_namespaces`]) lives in
/// the pod's IPC namespace, and so gets the pod's /dev/shm: it joins the pause process's
/// (the path CRI and [`join_pod_namespaces`] write), or its spec names no IPC namespace at all
/// (the node's, as in a host-IPC pod). One with an IPC namespace of its own, or another
/// process's, keeps its own /dev/shm: POSIX shared memory there must not meet the pod's.
fn shares_pod_ipc(s: &Sandbox, spec: &serde_json::Value) -> bool {
    match oci::namespace_place(spec, "ipc") {
        oci::NamespacePlace::Inherited => true,
        oci::NamespacePlace::New => false,
        oci::NamespacePlace::Joins(path) => s.pid != 0 && path == format!("/proc/{}/ns/ipc", s.pid),
    }
}

/// The files the pod gives each container, and its /dev/shm to those in its IPC namespace.
fn pod_mounts(s: &Sandbox, shares_ipc: bool) -> Vec<PodMount> {
    let file = |destination: &'static str, name: &str| PodMount {
        destination,
        source: s.record.files_dir.join(name),
        follows_readonly_root: true,
    };
    let mut v = vec![
        file("/etc/hosts", super::files::HOSTS),
        file("/etc/resolv.conf", super::files::RESOLV_CONF),
        file("/etc/hostname", super::files::HOSTNAME),
    ];
    let shm = match &s.record.shm {
        _ if !shares_ipc => None,
        Some(shm) => Some(shm.clone()),
        None if s.spec.ipc == IpcMode::Host => Some(PathBuf::from("/dev/shm")),
        None => None,
    };
    if let Some(source) = shm {
        v.push(PodMount {
            destination: "/dev/shm",
            source,
            follows_readonly_root: false,
        });
    }
    v
}

impl PodHooks for SandboxManager {
    fn prepare_spec(&self, _container_id: &str, spec: &mut serde_json::Value) -> Result<bool> {
        let Some(s) = self.lock().clone() else {
            return Ok(false);
        };
        let joined = join_pod_namespaces(&s, spec);
        let shares_ipc = shares_pod_ipc(&s, spec);
        // containerd gives each container a mount label; the pod files it mounts get its
        // shared form (no categories: other containers of the pod may have other ones).
        if let Some(mount_label) = spec
            .pointer("/linux/mountLabel")
            .and_then(|l| l.as_str())
            .filter(|l| !l.is_empty())
        {
            self.host
                .label_pod_files(&s.record.files_dir, mount_label)
                .context("label the pod files for the container")?;
        }
        let mounted = oci::add_pod_mounts(spec, &pod_mounts(&s, shares_ipc))?;
        Ok(joined || mounted)
    }

    fn sandbox_pid(&self, id: &str) -> Option<u32> {
        self.lock()
            .as_ref()
            .filter(|s| s.id == id)
            .map(|s| s.pid as u32)
    }

    fn has_sandbox(&self) -> bool {
        self.lock().is_some()
    }

    fn add_member(&self, member: Member) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else {
            return Ok(());
        };
        s.record.members.retain(|m| m.id != member.id);
        s.record.members.push(member);
        save_record(&s.bundle, &s.record)
    }

    fn remove_member(&self, id: &str) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        let before = s.record.members.len();
        s.record.members.retain(|m| m.id != id);
        if s.record.members.len() != before
            && let Err(e) = save_record(&s.bundle, &s.record)
        {
            log::warn!("sandbox {}: {e}", s.id);
        }
    }
}

/// The real pod host.
pub struct LinuxPodHost {
    pub host_etc: PathBuf,
    pub unified: bool,
    /// [`SysctlDefaults::detect`], once when the daemon starts.
    pub sysctl_defaults: SysctlDefaults,
    /// The pod's runc (`BinaryName` of the runtime options, else `runc` from PATH).
    pub runc: String,
    /// Runs `runc --version` (through the daemon's reaper).
    pub spawner: crate::shim::reaper::Spawner,
    /// The node's SELinux ([`crate::host::selinux::Selinux::detect`], once when the daemon starts).
    pub selinux: crate::host::selinux::Selinux,
    /// How long stopping the pod's systemd scope may take: StopSandbox's bound, or the
    /// shorter one of `delete` ([`crate::host::systemd::scope::DELETE_STOP_TIMEOUT`]).
    pub scope_stop_timeout: std::time::Duration,
    /// The node's MCS reservations ([`crate::host::mcs::Registry::node`]).
    pub mcs: crate::host::mcs::Registry,
}

impl LinuxPodHost {
    /// Labels the pod files in `dir` with `label` (SELinux on only).
    fn label_files(&self, dir: &Path, label: &crate::host::selinux::Label) -> Result<()> {
        let files = [
            super::files::HOSTS,
            super::files::RESOLV_CONF,
            super::files::HOSTNAME,
        ]
        .map(|f| dir.join(f));
        self.selinux
            .relabel(&crate::host::selinux::RealXattrs, &files, label)
            .context("label the pod files")
    }
}

impl PodHost for LinuxPodHost {
    fn write_files(&self, dir: &Path, spec: &PodSpec) -> Result<()> {
        super::files::PodFiles::write(dir, spec, &self.host_etc).map_err(Error::from)?;
        match self.selinux.pod_file_label(spec.selinux.as_ref()) {
            Some(label) => self.label_files(dir, &label),
            None => Ok(()),
        }
    }
    fn label_pod_files(&self, dir: &Path, mount_label: &str) -> Result<()> {
        match self.selinux.shared_label_of(mount_label) {
            Some(label) => self.label_files(dir, &label),
            None => Ok(()),
        }
    }
    fn remove_files(&self, dir: &Path) -> Result<()> {
        super::files::PodFiles::remove(dir)?;
        let _ = std::fs::remove_dir(dir);
        Ok(())
    }
    fn mount_shm(&self, path: &Path, spec: &PodSpec) -> Result<()> {
        let context = self
            .selinux
            .pod_file_label(spec.selinux.as_ref())
            .map(|l| crate::host::selinux::mount_option(&l));
        super::files::mount_shm(path, super::files::DEFAULT_SHM_SIZE, context.as_deref())
            .map_err(Error::from)
    }
    fn unmount_shm(&self, path: &Path) -> Result<()> {
        super::files::unmount_shm(path).map_err(Error::from)
    }
    fn check_netns(&self, path: &Path) -> Result<()> {
        crate::host::client_paths::open_netns(path).map(drop)
    }
    fn spawn_pause(&self, cfg: &PauseConfig) -> Result<PauseProcess> {
        if !self.selinux.labels_pause() {
            return super::pause::spawn(cfg);
        }
        // Fails closed: a pause that should be labelled and has no level is not started.
        let level = cfg.mcs_level.as_deref().ok_or_else(|| {
            Error::internal("pause: SELinux: no MCS level was reserved for the pod")
        })?;
        match self
            .selinux
            .pause_labels(cfg.selinux_options.as_ref(), level)
        {
            None => super::pause::spawn(cfg),
            Some((process, program)) => {
                let cfg = PauseConfig {
                    labels: Some(super::pause::PauseLabels {
                        process: process.to_string(),
                        program: program.to_string(),
                    }),
                    ..cfg.clone()
                };
                super::pause::spawn(&cfg)
            }
        }
    }
    fn join_cgroup(&self, cgroup: &Path, pid: i32) -> Result<PodCgroup> {
        if self.unified {
            // One hierarchy, at the place `unified` was detected: no mount table to read (it
            // is long on a node with many pods, and this is on RunPodSandbox's path).
            let roots = [PathBuf::from(crate::host::cgroups::CGROUP_ROOT)];
            return super::cgroup::join(&roots, true, cgroup, pid);
        }
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
        let roots = super::cgroup::hierarchies(&mountinfo, self.unified);
        super::cgroup::join(&roots, self.unified, cgroup, pid)
    }
    fn remove_cgroup(&self, id: &str, cg: &PodCgroup) {
        for e in super::cgroup::remove(cg, id) {
            log::warn!("{e}");
        }
    }
    fn join_scope(
        &self,
        scope: &PodScope,
        id: &str,
        pid: i32,
    ) -> std::result::Result<PodCgroup, super::scope::JoinFailed> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
        super::scope::join(
            &crate::host::systemd::manager::Endpoints::of_node(),
            &super::cgroup::hierarchies(&mountinfo, self.unified),
            self.unified,
            scope,
            id,
            pid,
        )
    }
    fn stop_scope(&self, cg: &PodCgroup) -> Result<()> {
        super::scope::stop(
            &crate::host::systemd::manager::Endpoints::of_node(),
            cg,
            self.scope_stop_timeout,
        )
    }
    fn kill(&self, pause: &PauseProcess) {
        if let Err(e) = pause.kill()
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            log::warn!("kill the pause process {}: {e}", pause.pid());
        }
    }
    fn metrics(&self, pod: &Path) -> Result<Any> {
        crate::host::cgroups::CgroupPaths::of_cgroup(pod, self.unified)?.metrics()
    }
    fn cgroup_path(&self, pid: i32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        super::sandbox_spec::cgroups_path_from_proc(&text, self.unified)
    }
    fn sysctl_defaults(&self) -> SysctlDefaults {
        self.sysctl_defaults
    }
    fn check_userns_runtime(&self) -> Result<()> {
        crate::host::runtime::check_userns_runc(&self.runc, &self.spawner)
    }
    fn reserve_mcs(
        &self,
        id: &str,
        options: Option<&crate::host::selinux::SelinuxOptions>,
    ) -> Result<Option<crate::host::mcs::Reservation>> {
        if !self.selinux.labels_pause() {
            return Ok(None);
        }
        let r = match options.map(|o| o.level.as_str()).filter(|l| !l.is_empty()) {
            Some(level) => self.mcs.reserve_given(id, level),
            None => self
                .mcs
                .reserve_random(id, crate::host::selinux::draw_categories),
        };
        r.map(Some).map_err(|e| Error::internal(e.to_string()))
    }
    fn release_mcs(&self, r: &crate::host::mcs::Reservation) {
        self.mcs.release(r);
    }
    fn own_for_userns(
        &self,
        bundle: &Path,
        files_dir: &Path,
        shm: Option<&Path>,
        (uid, gid): (u32, u32),
    ) -> Result<()> {
        super::files::own_for_userns(bundle, files_dir, shm, uid, gid).map_err(Error::from)
    }
}

/// `delete` for a sandbox bundle, within `budget`: take down the pod's containers (a shim's
/// death leaves them running, see [`crate::host::reclaim`]), in parallel; kill the pause process if
/// it still runs (and is still ours), unmount /dev/shm, remove the pod files, stop the pod's
/// systemd scope and remove the pause's cgroup; then the network, which keeps its share of the
/// budget whatever the steps before it take. Everything is best effort; what could not be done
/// goes to `undone`. `None` when the bundle holds no sandbox record of `id`.
pub fn cleanup_from_bundle(
    namespace: &str,
    id: &str,
    bundle: &Path,
    budget: &crate::shim::timing::Budget,
    undone: &mut crate::shim::timing::Undone,
) -> Option<u32> {
    let raw = std::fs::read(bundle.join(SANDBOX_STATE_FILE)).ok()?;
    // Any release's record (crate::records::state_file): a pod of an older shim is cleaned up too.
    let record: SandboxRecord =
        match crate::records::state_file::decode(&crate::records::state_file::SANDBOX_RECORD, &raw)
        {
            Ok(d) => d.record,
            Err(e) => {
                eprintln!("delete {id}: {e}: not used");
                return None;
            }
        };
    // The record is a file in a bundle: it speaks for the sandbox containerd named, no other.
    if record.id != id {
        undone.failed(format!(
            "the bundle's sandbox record is of {:?}: not used",
            record.id
        ));
        return None;
    }
    let network_share = if record.network.is_some() {
        crate::host::network::DELETE_SHARE
    } else {
        Duration::ZERO
    };
    crate::host::reclaim::reclaim_all(
        &members_of(namespace, &record),
        &budget.before(network_share + POD_DELETE_SHARE),
        undone,
    );
    let pod_budget = budget.before(network_share);
    let pod = record.clone();
    match pod_budget.run("rsandbox-pod", move || take_down_pod(&pod, &pod_budget)) {
        Some(u) => undone.extend(u),
        None => undone.cut_off("the pod's pause, /dev/shm, files, systemd scope or cgroup"),
    }
    // The network last: its plugins are the one step that can take all of what is left.
    if let Some(net) = record.network.clone() {
        crate::host::network::teardown_in_delete(net, budget, undone);
    }
    let _ = std::fs::remove_file(bundle.join(SANDBOX_STATE_FILE));
    Some(record.pause_pid as u32)
}

/// What `delete` keeps for the pod's own steps ([`take_down_pod`]) after its containers: the
/// pause's exit, the systemd scope's stop, a few unmounts and directory removals.
const POD_DELETE_SHARE: Duration = Duration::from_millis(500);

/// `delete`'s steps for the pod itself once its containers are down (see
/// [`cleanup_from_bundle`]), within `budget`.
fn take_down_pod(
    record: &SandboxRecord,
    budget: &crate::shim::timing::Budget,
) -> crate::shim::timing::Undone {
    let mut undone = crate::shim::timing::Undone::default();
    let host = LinuxPodHost {
        host_etc: PathBuf::from("/etc"),
        unified: crate::host::cgroups::is_unified(Path::new("/sys/fs/cgroup")),
        // Unused: `delete` starts no pause process and makes no pod.
        sysctl_defaults: SysctlDefaults::default(),
        runc: "runc".into(),
        spawner: crate::shim::reaper::Spawner::direct(),
        selinux: crate::host::selinux::Selinux::disabled(),
        scope_stop_timeout: budget.bound(crate::host::systemd::scope::DELETE_STOP_TIMEOUT),
        mcs: crate::host::mcs::Registry::node(),
    };
    // The recorded pause, or one the shim spawned but died before recording (found by its
    // command line and a start after the record's mark).
    let pauses: Vec<(i32, u64)> = if record.pause_pid > 0 {
        vec![(record.pause_pid, record.pause_start_ticks)]
    } else if record.pause_spawning_since_ticks > 0 {
        super::unrecorded_pause::find(
            Path::new("/proc"),
            &record.id,
            record.pause_spawning_since_ticks,
        )
    } else {
        Vec::new()
    };
    let mut pause_left = false;
    for (pid, start) in pauses {
        // Only while the pid still names the pause process we started.
        let ours = || crate::shim::util::process_start_ticks(pid) == Some(start);
        let gone =
            crate::shim::util::kill_and_wait(pid, ours, budget.bound(Duration::from_secs(1)));
        if !gone && ours() {
            pause_left = true;
            undone.failed(format!("the pause process {pid} is still there"));
        }
    }
    if let Some(shm) = &record.shm
        && let Err(e) = host.unmount_shm(shm)
    {
        undone.failed(e.to_string());
    }
    let _ = host.remove_files(&record.files_dir);
    // The pause's MCS level: only this pod's entry (the record is of the sandbox containerd
    // named: checked in `cleanup_from_bundle`).
    // Never while the pause may still run under it: another pod would get its categories.
    if let Some(r) = record.mcs.as_ref().filter(|r| r.owner == record.id) {
        if pause_left {
            undone.failed(format!(
                "the SELinux level {} stays reserved while the pause process runs",
                r.level
            ));
        } else {
            host.release_mcs(r);
        }
    }
    // The dead shim's systemd scope (the pause is gone: it is empty), then the pause's cgroup.
    // Only the unit this pod's scope is named: a record is a file, not an authority to stop
    // any unit of the node.
    if let Some(scope) = &record.cgroup.scope
        && scope.unit != crate::host::systemd::names::pod_scope_name(&record.id)
    {
        undone.failed(format!(
            "the record names unit {:?}, not the pod's scope: not stopped",
            scope.unit
        ));
    } else if record.cgroup.scope.is_some() && budget.is_spent() {
        undone.cut_off("stop the pod's systemd scope");
    } else if let Err(e) = host.stop_scope(&record.cgroup) {
        undone.failed(e.to_string());
    }
    for e in super::cgroup::remove(&record.cgroup, &record.id) {
        undone.failed(e.to_string());
    }
    undone
}

/// The pod's containers: those the record lists, and those runc's state puts in the pod in
/// the runc roots the pod used (the default one of the namespace included), in case the record
/// missed one.
fn members_of(namespace: &str, record: &SandboxRecord) -> Vec<Member> {
    let mut members = record.members.clone();
    let mut runcs: Vec<crate::host::runtime::RuncConfig> =
        members.iter().map(|m| m.runc.clone()).collect();
    runcs.push(crate::host::runtime::RuncConfig::defaults(namespace));
    let mut seen = std::collections::BTreeSet::new();
    for runc in runcs {
        if !seen.insert(runc.root.clone()) {
            continue;
        }
        for (id, state) in crate::host::reclaim::members_in_root(&runc.root, &record.id) {
            if !members.iter().any(|m| m.id == id) {
                members.push(Member {
                    id,
                    bundle: state.bundle,
                    runc: runc.clone(),
                    cgroups_path: None,
                    // found in runc's state only: nothing says runc made its cgroups
                    cgroups_at_create: None,
                });
            }
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33 item 5: a shim killed between the pause's spawn and its record left a record
    /// with the spawn's mark and no pid. `delete` finds the pod's pause by its command line
    /// (here a `sleep` named as the shim names the pause of pod `3600`) and kills it; a
    /// process with the same command line started before the mark is not this spawn's.
    #[test]
    fn delete_kills_a_pause_spawned_but_never_recorded() {
        use std::os::unix::process::CommandExt;
        let pause_like = || {
            std::process::Command::new("sleep")
                .arg0(crate::pod::pause::PAUSE_ARGV0)
                .arg("3600")
                .spawn()
                .unwrap()
        };
        let mut older = pause_like();
        // The clock's ticks are coarse (10 ms): the mark lies after the older one's start.
        std::thread::sleep(Duration::from_millis(50));
        let since = crate::pod::unrecorded_pause::boot_ticks_now();
        let mut pause = pause_like();
        let files = tempfile::tempdir().unwrap();
        let record = SandboxRecord {
            id: "3600".into(),
            pause_spawning_since_ticks: since,
            files_dir: files.path().join("files"),
            ..Default::default()
        };
        let undone = take_down_pod(
            &record,
            &crate::shim::timing::Budget::new(Duration::from_secs(30)),
        );
        // Read from /proc, not through wait: another test's `waitpid(-1)` (a reaper) in this
        // process may reap these children first. A zombie or a gone pid is dead.
        let running = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
                .unwrap_or(false)
        };
        let pause_runs = running(pause.id());
        let older_runs = running(older.id());
        for child in [&mut older, &mut pause] {
            let _ = child.kill();
            let _ = child.try_wait();
        }
        assert!(!pause_runs, "the unrecorded pause still runs: {undone:?}");
        assert!(
            older_runs,
            "a process older than the spawn's mark was killed"
        );
    }

    /// `delete` takes down the containers the record lists and those a runc root it knows
    /// puts in the pod (listed once).
    #[test]
    fn members_come_from_the_record_and_the_runc_roots() {
        let root = tempfile::tempdir().unwrap();
        let state = |pod: &str| {
            format!(
                r#"{{"config":{{"labels":["io.kubernetes.cri.sandbox-id={pod}","bundle=/b"]}}}}"#
            )
        };
        for (id, pod) in [("c1", "pod1"), ("c2", "pod1"), ("c3", "pod2")] {
            std::fs::create_dir(root.path().join(id)).unwrap();
            std::fs::write(root.path().join(id).join("state.json"), state(pod)).unwrap();
        }
        let runc = crate::host::runtime::RuncConfig {
            root: root.path().to_path_buf(),
            ..crate::host::runtime::RuncConfig::defaults("ns")
        };
        let listed = Member {
            id: "c1".into(),
            bundle: Some(PathBuf::from("/bundles/c1")),
            runc: runc.clone(),
            cgroups_path: Some("/k8s.io/c1".into()),
            cgroups_at_create: Some(Default::default()),
        };
        let record = SandboxRecord {
            id: "pod1".into(),
            members: vec![listed.clone()],
            ..Default::default()
        };
        let members = members_of("rsandbox-unit-test-no-such-ns", &record);
        assert_eq!(members.len(), 2, "{members:?}");
        assert_eq!(members[0], listed);
        assert_eq!(
            members[1],
            Member {
                id: "c2".into(),
                bundle: Some(PathBuf::from("/b")),
                runc,
                cgroups_path: None,
                cgroups_at_create: None,
            }
        );
    }
}
