//! The Sandbox service's state and logic: one pod per shim.
//!
//! CreateSandbox decodes the CRI pod config, writes the pod files and mounts the pod's
//! /dev/shm; StartSandbox starts the pause process (see [`super::pause`]) in the pod cgroup;
//! containers created afterwards get the pod files and /dev/shm added to their spec
//! ([`crate::task::PodHooks`]). StopSandbox kills the pod's processes and the pause process
//! synchronously (containerd removes the netns right after it returns); ShutdownSandbox removes
//! everything and lets the shim exit. What `delete` needs to clean up after a dead shim is kept
//! in `<bundle>/rsandbox-sandbox.json`.
//!
//! Here the state (the [`PodHost`] trait, the record, [`Sandbox`], [`SandboxManager`]) and the
//! calls that only read it; the paths one per file: [`create`](create.rs), [`start`](start.rs),
//! [`stop`](stop.rs) (the pause's exit, Stop, Wait, Shutdown), what the pod gives its member
//! containers ([`hooks`](hooks.rs)), the real host ([`linux_host`](linux_host.rs)) and `delete`'s
//! clean-up after a dead shim ([`delete`](delete.rs)).

mod create;
pub mod delete;
mod hooks;
pub mod linux_host;
mod start;
mod stop;

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use protobuf::well_known_types::any::Any;

use super::cgroup::PodCgroup;
use super::pause::{PauseConfig, PauseProcess};
use super::spec::{PodSpec, SysctlDefaults};
use crate::host::network::{NetworkProvider, NetworkRecord};
use crate::host::reclaim::Member;
use crate::host::systemd::scope::PodScope;
use crate::records::error::{Context, Error, Result};
use crate::records::validate;
use crate::shim::reaper::Reaper;
use crate::shim::sync::Lock;
use crate::shim::util::write_file_atomic;
use crate::shim::waiters::Waiters;
use crate::task::{PodHooks, TaskManager};

/// The file in the sandbox bundle that tells `delete` what to clean up.
pub use crate::records::bundle::SANDBOX_STATE_FILE;

/// OS effects of the pod, behind one trait so the Sandbox service is testable without root.
pub trait PodHost: Send + Sync {
    /// Writes the pod files into `dir`, labelled at the pod's MCS `level` where SELinux is on
    /// (at the shared level where the pod has none).
    fn write_files(&self, dir: &Path, spec: &PodSpec, level: Option<&str>) -> Result<()>;
    fn remove_files(&self, dir: &Path) -> Result<()>;
    /// Mounts the pod's /dev/shm tmpfs, labelled for `spec`'s containers at the pod's MCS
    /// `level` where SELinux is on (`context=` is fixed at the mount).
    fn mount_shm(&self, path: &Path, spec: &PodSpec, level: Option<&str>) -> Result<()>;
    /// Labels the pod files in `dir` for a container's SELinux mount label (its spec's
    /// `linux.mountLabel`): as is where it is at the pod's reserved `pod_level`, else its shared
    /// form ([`crate::host::selinux::Selinux::pod_files_label_of`]); a no-op where SELinux is
    /// off.
    fn label_pod_files(&self, dir: &Path, mount_label: &str, pod_level: Option<&str>)
    -> Result<()>;
    /// Relabels each of `volumes` that carries exactly `from` (a container's volume containerd
    /// relabelled for it) with `to`, its whole tree ([`crate::host::relabel::move_tree`]).
    fn move_volume_labels(&self, volumes: &[PathBuf], from: &str, to: &str) -> Result<()>;
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
