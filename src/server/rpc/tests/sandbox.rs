//! Sandbox service tests through the ttrpc trait, with a fake pod host and a fake runtime.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use containerd_shim_protos::sandbox_api::*;
use containerd_shim_protos::sandbox_sync::Sandbox as _;
use protobuf::well_known_types::any::Any;
use protobuf::{Message, MessageField};
use ttrpc::Code;

use crate::testutil::*;

use crate::host::network::FakeNetwork;
use crate::host::runtime::RuncConfig;
use crate::host::systemd::scope::PodScope;
use crate::pod::cgroup::PodCgroup;
use crate::pod::pause::{PauseConfig, PauseProcess};
use crate::pod::sandbox::SandboxDeps;
use crate::pod::sandbox::delete::cleanup_from_bundle;
use crate::pod::sandbox::*;
use crate::pod::spec::{PodSpec, SysctlDefaults};
use crate::records::error::Result;
use crate::server::rpc::sandbox::SandboxService;
use crate::shim::events::RecordingSink;
use crate::shim::reaper::Exit;
use crate::task::{PodHooks, TaskDeps, TaskManager};

mod exits;
mod kept;
mod lifecycle;
mod members;
mod network;
mod scope;

type SpawnHook = Box<dyn Fn(i32) + Send>;

#[derive(Default)]
struct FakePodHost {
    calls: Mutex<Vec<String>>,
    pause: Mutex<Option<PauseConfig>>,
    fail_pause: Mutex<bool>,
    sysctl_defaults: Mutex<SysctlDefaults>,
    /// Runs in spawn_pause with the new pid, before it returns (a pause that dies at once).
    on_spawn: Mutex<Option<SpawnHook>>,
    /// The `runc --version` line of an old runc: check_userns_runtime refuses.
    old_runc: Mutex<Option<String>>,
    /// join_scope fails with this (a systemd that cannot be reached).
    fail_scope: Mutex<Option<String>>,
    /// That failure's undo did not succeed either (a systemd too slow for both).
    scope_may_remain: Mutex<bool>,
    /// Runs in join_scope (what a shim killed while systemd is asked would leave).
    on_join_scope: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// stop_scope fails (a systemd that does not answer) while set.
    fail_stop_scope: Mutex<bool>,
    /// The live processes whose pidfds the pause handles carry (ended with the host).
    stand_ins: Mutex<Vec<std::process::Child>>,
    /// The pause is a real child (`sleep`) with its own pid, not PAUSE_PID.
    real_pause: Mutex<bool>,
    /// join_scope and stop_scope go to this (fake) systemd through the real client.
    systemd: Mutex<Option<crate::host::systemd::manager::Endpoints>>,
    /// reserve_mcs reserves in this registry (SELinux as on), else gives nothing (off).
    mcs: Mutex<Option<crate::host::mcs::Registry>>,
    /// unmount_shm fails (EPERM) while set.
    fail_unmount_shm: Mutex<bool>,
    /// mount_shm fails (ENOSPC) while set.
    fail_shm: Mutex<bool>,
    /// kill only logs: the pause does not die (stuck in the kernel). Else it kills the
    /// stand-in through the handle's pidfd, as the real host does.
    unkillable_pause: Mutex<bool>,
}

impl Drop for FakePodHost {
    fn drop(&mut self) {
        for mut c in self.stand_ins.lock().unwrap().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl FakePodHost {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    /// The calls that begin with `prefix`.
    fn calls_to(&self, prefix: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.starts_with(prefix))
            .collect()
    }
}

const PAUSE_PID: i32 = 1 << 23;

impl PodHost for FakePodHost {
    fn write_files(&self, dir: &Path, spec: &PodSpec, level: Option<&str>) -> Result<()> {
        self.log(format!(
            "write_files {} {}{}",
            dir.file_name().unwrap().to_string_lossy(),
            spec.hostname,
            level.map(|l| format!(" {l}")).unwrap_or_default()
        ));
        Ok(())
    }
    fn remove_files(&self, _dir: &Path) -> Result<()> {
        self.log("remove_files".into());
        Ok(())
    }
    fn label_pod_files(
        &self,
        dir: &Path,
        mount_label: &str,
        pod_level: Option<&str>,
    ) -> Result<()> {
        self.log(format!(
            "label_pod_files {} {mount_label} pod level {}",
            dir.file_name().unwrap().to_string_lossy(),
            pod_level.unwrap_or("none")
        ));
        Ok(())
    }
    fn move_volume_labels(&self, volumes: &[PathBuf], from: &str, to: &str) -> Result<()> {
        for v in volumes {
            self.log(format!("move_volume_labels {} {from} {to}", v.display()));
        }
        Ok(())
    }
    fn mount_shm(&self, path: &Path, _spec: &PodSpec, level: Option<&str>) -> Result<()> {
        self.log(format!(
            "mount_shm {}{}",
            path.file_name().unwrap().to_string_lossy(),
            level.map(|l| format!(" {l}")).unwrap_or_default()
        ));
        if *self.fail_shm.lock().unwrap() {
            return Err(crate::records::error::Error::internal(
                "mount tmpfs: No space left on device",
            ));
        }
        Ok(())
    }
    fn unmount_shm(&self, _path: &Path) -> Result<()> {
        self.log("unmount_shm".into());
        if *self.fail_unmount_shm.lock().unwrap() {
            return Err(crate::records::error::Error::internal(
                "unmount shm: Operation not permitted",
            ));
        }
        Ok(())
    }
    fn check_netns(&self, path: &Path) -> Result<()> {
        // The real check (client_paths::open_netns) is tested on its own; here any file is a
        // netns and a missing one is NotFound, as there.
        if !path.exists() {
            return Err(crate::records::error::Error::not_found(format!(
                "{}",
                path.display()
            )));
        }
        Ok(())
    }
    fn spawn_pause(&self, cfg: &PauseConfig) -> Result<PauseProcess> {
        if *self.fail_pause.lock().unwrap() {
            return Err(crate::records::error::Error::internal(
                "pause: set the hostname: Operation not permitted",
            ));
        }
        *self.pause.lock().unwrap() = Some(cfg.clone());
        self.log("spawn_pause".into());
        if *self.real_pause.lock().unwrap() {
            let child = std::process::Command::new("sleep")
                .arg("3600")
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            // Unreaped: the sandbox holds reaps across the spawn.
            let pidfd = crate::shim::util::pidfd_open(pid).unwrap();
            std::mem::forget(child); // reaped by the reaper
            return Ok(PauseProcess::for_test(pid, pidfd));
        }
        if let Some(f) = self.on_spawn.lock().unwrap().as_ref() {
            f(PAUSE_PID);
        }
        // A live stand-in: the pause is alive as far as its pidfd tells.
        let stand_in = std::process::Command::new("sleep")
            .arg("3600")
            .spawn()
            .unwrap();
        let pause = PauseProcess::standing_in(PAUSE_PID, &stand_in);
        self.stand_ins.lock().unwrap().push(stand_in);
        Ok(pause)
    }
    fn join_cgroup(&self, cgroup: &Path, pid: i32) -> Result<PodCgroup> {
        self.log(format!("join_cgroup {} {pid}", cgroup.display()));
        Ok(PodCgroup {
            dirs: vec![cgroup.to_path_buf()],
            created: vec![cgroup.to_path_buf()],
            pod: cgroup.parent().map(Path::to_path_buf),
            scope: None,
        })
    }
    fn join_scope(
        &self,
        scope: &PodScope,
        id: &str,
        pid: i32,
    ) -> std::result::Result<PodCgroup, crate::pod::scope::JoinFailed> {
        self.log(format!(
            "join_scope {} {} {id} {pid}",
            scope.unit, scope.slice
        ));
        if let Some(f) = self.on_join_scope.lock().unwrap().as_ref() {
            f();
        }
        if let Some(endpoints) = self.systemd.lock().unwrap().as_ref() {
            return crate::pod::scope::join(endpoints, &[], true, scope, id, pid);
        }
        if let Some(msg) = self.fail_scope.lock().unwrap().as_ref() {
            return Err(crate::pod::scope::JoinFailed {
                error: crate::records::error::Error::precondition(msg.clone()),
                scope_may_remain: *self.scope_may_remain.lock().unwrap(),
            });
        }
        let leaf = crate::pod::scope::cgroup_of(scope).unwrap();
        Ok(PodCgroup {
            dirs: vec![leaf.clone()],
            created: Vec::new(),
            pod: leaf.parent().map(Path::to_path_buf),
            scope: Some(scope.clone()),
        })
    }
    fn stop_scope(&self, cg: &PodCgroup) -> Result<()> {
        if let Some(scope) = &cg.scope {
            self.log(format!("stop_scope {}", scope.unit));
        }
        if let Some(endpoints) = self.systemd.lock().unwrap().as_ref() {
            return crate::pod::scope::stop(endpoints, cg, std::time::Duration::from_secs(10));
        }
        if *self.fail_stop_scope.lock().unwrap() {
            return Err(crate::records::error::Error::internal(
                "StopUnit: no answer before the deadline",
            ));
        }
        Ok(())
    }
    fn remove_cgroup(&self, id: &str, cg: &PodCgroup) {
        self.log(format!("remove_cgroup {id} {}", cg.created.len()));
    }
    fn kill(&self, pause: &PauseProcess) {
        self.log(format!("kill {}", pause.pid()));
        if !*self.unkillable_pause.lock().unwrap() {
            let _ = pause.kill();
        }
    }
    fn metrics(&self, pod: &Path) -> Result<Any> {
        self.log(format!("metrics {}", pod.display()));
        Ok(Any {
            type_url: "io.containerd.cgroups.v1.Metrics".into(),
            ..Default::default()
        })
    }
    fn cgroup_path(&self, _pid: i32) -> Option<String> {
        Some("/kubepods/pod1/pod1".into())
    }
    fn sysctl_defaults(&self) -> SysctlDefaults {
        *self.sysctl_defaults.lock().unwrap()
    }
    fn check_userns_runtime(&self) -> Result<()> {
        self.log("check_userns_runtime".into());
        match self.old_runc.lock().unwrap().as_ref() {
            Some(line) => Err(crate::records::error::Error::precondition(format!(
                "user-namespaced pods need runc >= 1.2; runc is {line:?}"
            ))),
            None => Ok(()),
        }
    }
    fn reserve_mcs(
        &self,
        id: &str,
        options: Option<&crate::host::selinux::SelinuxOptions>,
    ) -> Result<Option<crate::host::mcs::Reservation>> {
        let Some(reg) = self.mcs.lock().unwrap().clone() else {
            return Ok(None);
        };
        self.log(format!("reserve_mcs {id}"));
        let r = match options.map(|o| o.level.as_str()).filter(|l| !l.is_empty()) {
            Some(level) => reg.reserve_given(id, level),
            None => reg.reserve_random(id, crate::host::selinux::draw_categories),
        };
        r.map(Some)
            .map_err(|e| crate::records::error::Error::internal(e.to_string()))
    }
    fn release_mcs(&self, r: &crate::host::mcs::Reservation) {
        self.log(format!("release_mcs {} {}", r.owner, r.level));
        if let Some(reg) = self.mcs.lock().unwrap().as_ref() {
            reg.release(r);
        }
    }
    fn own_for_userns(
        &self,
        bundle: &Path,
        files_dir: &Path,
        shm: Option<&Path>,
        (uid, gid): (u32, u32),
    ) -> Result<()> {
        let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
        self.log(format!(
            "own_for_userns {} {} {} {uid}:{gid}",
            name(bundle),
            name(files_dir),
            shm.map_or("-".into(), name)
        ));
        Ok(())
    }
}

struct Fixture {
    svc: SandboxService,
    tasks: crate::server::rpc::task::TaskService,
    sm: Arc<SandboxManager>,
    host: Arc<FakePodHost>,
    /// The task side's host: it records the rootfs mounts it is given and refuses them.
    task_host: Arc<NoHost>,
    dir: tempfile::TempDir,
    shut: Arc<Mutex<bool>>,
}

fn fixture() -> Fixture {
    fixture_with(None, None)
}

/// A fixture whose sandboxes get their network from `net` when created without a netns.
fn fixture_with_network(net: &Arc<FakeNetwork>) -> Fixture {
    fixture_with(None, Some(net.clone()))
}

/// A fixture whose sandbox subscribes to `reaper` before forking the pause, as the daemon's,
/// and, with `net`, sets up shim-owned networks through it.
fn fixture_with(
    reaper: Option<Arc<crate::shim::reaper::Reaper>>,
    net: Option<Arc<FakeNetwork>>,
) -> Fixture {
    let host = Arc::new(FakePodHost::default());
    let task_host = Arc::new(NoHost::default());
    let th = task_host.clone();
    let shut = Arc::new(Mutex::new(false));
    let s2 = shut.clone();
    let on_shutdown: Arc<dyn Fn() + Send + Sync> = Arc::new(move || *s2.lock().unwrap() = true);
    let sm = SandboxManager::new(
        SandboxDeps {
            host: host.clone(),
            reaper,
            network_for_pods: net.is_some(),
            network: net.map(|n| n as Arc<dyn crate::host::network::NetworkProvider>),
            on_shutdown: on_shutdown.clone(),
        },
        |pod| {
            TaskManager::new(TaskDeps {
                namespace: "k8s.io".into(),
                default_runc: RuncConfig::defaults("k8s.io"),
                host: th,
                events: Arc::new(RecordingSink::default()),
                reaper: None,
                network: None,
                network_for_tasks: false,
                pod,
                on_shutdown,
            })
        },
    );
    let tm = sm.tasks().clone();
    Fixture {
        svc: SandboxService::new(sm.clone()),
        tasks: crate::server::rpc::task::TaskService::new(tm),
        sm,
        host,
        task_host,
        dir: tempfile::tempdir().unwrap(),
        shut,
    }
}

/// The task side is not exercised here, but for what a Create would mount: each rootfs is
/// recorded, then refused (no runtime lies behind it).
#[derive(Default)]
struct NoHost {
    rootfs: Mutex<Vec<Vec<crate::host::mount::MountSpec>>>,
}
impl crate::task::Host for NoHost {
    fn mount_rootfs(&self, m: &[crate::host::mount::MountSpec], _: &Path) -> Result<()> {
        self.rootfs.lock().unwrap().push(m.to_vec());
        Err(crate::records::error::Error::internal(
            "no rootfs in these tests",
        ))
    }
    fn unmount_rootfs(&self, _: &Path) -> Result<()> {
        Ok(())
    }
    fn cgroup_paths(&self, _: i32) -> Result<crate::host::cgroups::CgroupPaths> {
        Ok(Default::default())
    }
    fn metrics(&self, _: &crate::host::cgroups::CgroupPaths) -> Result<Any> {
        Ok(Any::new())
    }
    fn watch_oom(&self, _: &str, _: &crate::host::cgroups::CgroupPaths) -> Result<()> {
        Ok(())
    }
    fn unwatch_oom(&self, _: &str) {}
    fn check_oom_at_exit(&self, _: &str, _: i32) {}
    fn signal(&self, _: i32, _: u32) -> Result<()> {
        Ok(())
    }
    fn thaw(&self, _: &crate::host::cgroups::CgroupPaths) -> Result<()> {
        Ok(())
    }
    fn runtime(&self, _: &RuncConfig) -> Arc<dyn crate::host::runtime::Runtime> {
        unreachable!("no tasks in these tests")
    }
}

/// `cfg` as containerd sends it in CreateSandbox's options.
fn any_config(cfg: &crate::records::cri::PodSandboxConfig) -> Any {
    Any {
        type_url: "runtime.v1.PodSandboxConfig".into(),
        value: cfg.write_to_bytes().unwrap(),
        ..Default::default()
    }
}

fn pod_config(hostname: &str, share_pid: bool) -> Any {
    any_config(&pod_sandbox_config(hostname, share_pid))
}

/// The pod of most tests: `web` in `default` (uid-1), cgroup parent `/kubepods/pod-uid-1`, one
/// sysctl, a DNS server, its own pid namespace or the pod's.
fn pod_sandbox_config(hostname: &str, share_pid: bool) -> crate::records::cri::PodSandboxConfig {
    use crate::records::cri;
    let mut cfg = cri::PodSandboxConfig::new();
    cfg.hostname = hostname.into();
    let md = cfg.metadata.mut_or_insert_default();
    md.name = "web".into();
    md.namespace = "default".into();
    md.uid = "uid-1".into();
    let linux = cfg.linux.mut_or_insert_default();
    linux.cgroup_parent = "/kubepods/pod-uid-1".into();
    linux
        .sysctls
        .insert("net.ipv4.ip_unprivileged_port_start".into(), "80".into());
    let ns = linux
        .security_context
        .mut_or_insert_default()
        .namespace_options
        .mut_or_insert_default();
    ns.pid = if share_pid {
        cri::NamespaceMode::POD
    } else {
        cri::NamespaceMode::CONTAINER
    }
    .into();
    let dns = cfg.dns_config.mut_or_insert_default();
    dns.servers = vec!["10.96.0.10".into()];
    cfg
}

impl Fixture {
    fn netns(&self) -> String {
        let p = self.dir.path().join("netns");
        std::fs::write(&p, "").unwrap();
        p.display().to_string()
    }
    fn create(&self, id: &str, options: Any) -> ttrpc::Result<CreateSandboxResponse> {
        let netns = self.netns();
        self.create_in(id, options, &netns)
    }
    /// CreateSandbox with `netns_path` (empty: none).
    fn create_in(
        &self,
        id: &str,
        options: Any,
        netns: &str,
    ) -> ttrpc::Result<CreateSandboxResponse> {
        let bundle = self.dir.path().join(id);
        std::fs::create_dir_all(&bundle).unwrap();
        self.svc.create_sandbox(
            &ctx(),
            CreateSandboxRequest {
                sandbox_id: id.into(),
                bundle_path: bundle.display().to_string(),
                options: MessageField::some(options),
                netns_path: netns.into(),
                ..Default::default()
            },
        )
    }
    fn start(&self, id: &str) -> ttrpc::Result<StartSandboxResponse> {
        self.svc.start_sandbox(
            &ctx(),
            StartSandboxRequest {
                sandbox_id: id.into(),
                ..Default::default()
            },
        )
    }
    fn stop(&self, id: &str) -> ttrpc::Result<StopSandboxResponse> {
        self.svc.stop_sandbox(
            &ctx(),
            StopSandboxRequest {
                sandbox_id: id.into(),
                ..Default::default()
            },
        )
    }
    fn shutdown(&self, id: &str) -> ttrpc::Result<ShutdownSandboxResponse> {
        self.svc.shutdown_sandbox(
            &ctx(),
            ShutdownSandboxRequest {
                sandbox_id: id.into(),
                ..Default::default()
            },
        )
    }
    fn status(&self, id: &str) -> ttrpc::Result<SandboxStatusResponse> {
        self.svc.sandbox_status(
            &ctx(),
            SandboxStatusRequest {
                sandbox_id: id.into(),
                verbose: true,
                ..Default::default()
            },
        )
    }
}

/// The report of the pause's exit with `status`.
fn pause_exit(status: i32) -> Exit {
    Exit {
        pid: PAUSE_PID,
        status,
        at: SystemTime::now(),
    }
}

/// The slice of the systemd cgroup driver's pods here (the kubelet's besteffort pod1).
const SLICE: &str = "kubepods-besteffort-pod1.slice";

impl Fixture {
    /// Creates sandbox `id` with its pod cgroup in SLICE: the pause goes into a systemd scope.
    fn create_in_slice(&self, id: &str) {
        self.create(id, with_cgroup_parent(SLICE)).unwrap();
    }
    /// Where sandbox `id`'s record is kept (in its bundle).
    fn state_file(&self, id: &str) -> std::path::PathBuf {
        self.dir.path().join(id).join(SANDBOX_STATE_FILE)
    }
    /// Sandbox `id`'s record as it is on disk.
    fn record(&self, id: &str) -> SandboxRecord {
        serde_json::from_slice(&std::fs::read(self.state_file(id)).unwrap()).unwrap()
    }
    /// Writes `record` over sandbox `id`'s record on disk.
    fn write_record(&self, id: &str, record: &SandboxRecord) {
        std::fs::write(self.state_file(id), serde_json::to_vec(record).unwrap()).unwrap();
    }
    /// `delete` of sandbox `id` (namespace `default`) from the bundle of sandbox `bundle_of`
    /// within `secs`: what it returns and what it could not do.
    fn delete_from_bundle(
        &self,
        id: &str,
        bundle_of: &str,
        secs: u64,
    ) -> (Option<u32>, crate::shim::timing::Undone) {
        let budget = crate::shim::timing::Budget::new(std::time::Duration::from_secs(secs));
        let mut undone = crate::shim::timing::Undone::default();
        let pid = cleanup_from_bundle(
            "default",
            id,
            &self.dir.path().join(bundle_of),
            &budget,
            &mut undone,
        );
        (pid, undone)
    }
    /// The reaper's report that the pause exited with `status`.
    fn pause_exits(&self, status: i32) {
        self.sm.on_exit(pause_exit(status));
    }
    /// The pause exits with `status` 20 ms from now (on a thread; join it).
    fn pause_exits_soon(&self, status: i32) -> std::thread::JoinHandle<()> {
        let sm = self.sm.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            sm.on_exit(pause_exit(status));
        })
    }
    /// The pause exits (137) once it is killed: the fake's kill only logs it (on a thread;
    /// join it).
    fn pause_exits_once_killed(&self) -> std::thread::JoinHandle<()> {
        let (host, sm) = (self.host.clone(), self.sm.clone());
        std::thread::spawn(move || {
            while !host.calls().iter().any(|c| c.starts_with("kill")) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            sm.on_exit(pause_exit(137));
        })
    }
}

/// The inline answer of `path` to `req`, if the fast path takes it.
fn inline(f: &Fixture, path: &str, req: &impl Message) -> Option<ttrpc::Result<Vec<u8>>> {
    let methods = crate::server::rpc::sandbox::inline_methods(&f.sm);
    let (_, m) = methods
        .iter()
        .find(|(p, _)| p.ends_with(path))
        .unwrap_or_else(|| panic!("no inline method {path}"));
    m.answer(&req.write_to_bytes().unwrap())
}

fn status_req(id: &str, verbose: bool) -> SandboxStatusRequest {
    SandboxStatusRequest {
        sandbox_id: id.into(),
        verbose,
        ..Default::default()
    }
}

/// The status, error code and message of a failed answer.
fn failure<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> (Code, String) {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => (s.code(), s.message),
        other => panic!("not a status: {other:?}"),
    }
}

fn with_cgroup_parent(parent: &str) -> Any {
    let mut cfg = pod_sandbox_config("web-0", true);
    cfg.linux.mut_or_insert_default().cgroup_parent = parent.into();
    any_config(&cfg)
}

impl Fixture {
    fn metrics(&self, id: &str) -> ttrpc::Result<SandboxMetricsResponse> {
        self.svc.sandbox_metrics(
            &ctx(),
            SandboxMetricsRequest {
                sandbox_id: id.into(),
                ..Default::default()
            },
        )
    }
}
/// A node's MCS registry of its own (in the directory returned with it).
fn mcs_registry() -> (tempfile::TempDir, crate::host::mcs::Registry) {
    let d = tempfile::tempdir().unwrap();
    let reg = crate::host::mcs::Registry::at(d.path().join("mcs"));
    (d, reg)
}

/// A fixture with SELinux labels on: the pause's MCS level is reserved in `reg`.
fn fixture_with_mcs(reg: &crate::host::mcs::Registry) -> Fixture {
    let f = fixture();
    *f.host.mcs.lock().unwrap() = Some(reg.clone());
    f
}
/// A fixture with sandbox pod1 created in SLICE, whose systemd (slow) answers neither the
/// scope's StartTransientUnit nor its undo: the scope may remain.
fn fixture_whose_scope_start_gets_no_answer() -> Fixture {
    let f = fixture();
    *f.host.fail_scope.lock().unwrap() = Some(
        "StartTransientUnit cri-containerd-pod1.scope: call: no answer before the deadline".into(),
    );
    *f.host.scope_may_remain.lock().unwrap() = true;
    f.create_in_slice("pod1");
    f
}
/// A container spec as `ctr run --sandbox` sends it: new namespaces of every kind, no paths.
fn member_spec() -> serde_json::Value {
    serde_json::json!({
        "root": {"path": "rootfs"},
        "linux": {"namespaces": [
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            {"type": "network"}
        ]}
    })
}
/// The namespaces of a prepared container spec: (type, path or "").
fn namespaces_of(spec: &serde_json::Value) -> Vec<(String, String)> {
    spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["type"].as_str().unwrap().to_string(),
                n["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}
fn ns(kind: &str, path: &str) -> (String, String) {
    (kind.to_string(), path.to_string())
}
