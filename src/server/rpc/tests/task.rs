//! Task service tests through the ttrpc trait, with a fake runtime and a fake host.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use containerd_shim_protos::api::*;
use containerd_shim_protos::shim_sync::Task;
use protobuf::MessageField;
use protobuf::well_known_types::any::Any;
use protobuf::well_known_types::empty::Empty;
use ttrpc::Code;

use crate::testutil::*;

use crate::host::cgroups::CgroupPaths;
use crate::host::mount::MountSpec;
use crate::host::runtime::{ProcessIo, Spawned};
use crate::host::runtime::{RuncConfig, Runtime};
use crate::records::error::{Error, Result};
use crate::server::rpc::task::TaskService;
use crate::shim::events::RecordingSink;
use crate::shim::reaper::Exit;
use crate::shim::reaper::Reaper;
use crate::task::*;

mod cgroups;
mod exec_start;
mod kill;
mod lifecycle;
mod races;
mod stdio;

/// Fake pids start above the kernel's pid_max, so they can never be real processes.
const FAKE_PID_BASE: i32 = 1 << 23;

type Hook = Mutex<Option<Box<dyn Fn(i32) + Send>>>;

#[derive(Default)]
struct FakeRuntime {
    calls: Mutex<Vec<String>>,
    next_pid: AtomicI32,
    fail: Mutex<HashMap<&'static str, Error>>,
    on_start: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Runs inside `create` with the new pid, before it returns.
    on_create: Hook,
    /// Process specs given to `exec`.
    exec_specs: Mutex<Vec<serde_json::Value>>,
    /// Runs inside `exec`, while `runc exec` would run.
    on_exec: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Where `exec` goes instead, when set (a real `Runc` with a stand-in binary).
    exec_via: Mutex<Option<Arc<dyn Runtime>>>,
    /// Runs inside `delete`, while `runc delete` would run.
    on_delete: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// What a plain `runc delete` (no `--force`) fails with.
    refuse_plain_delete: Mutex<Option<Error>>,
    /// The stdio `exec` was given (the process's ends).
    exec_io: Mutex<Vec<ProcessIo>>,
    /// The stdio `create` was given (the init's ends).
    create_io: Mutex<Vec<ProcessIo>>,
    ps: Mutex<Vec<i32>>,
    /// (container, pid) of every placement check.
    placement_checks: Mutex<Vec<(String, i32)>>,
}

/// A terminal for a fake process: the master, as runc would send it (the slave is closed at
/// once, so the copier sees the "process" gone and reports its output flushed).
fn fake_console(terminal: bool) -> Option<std::fs::File> {
    terminal.then(|| {
        let pty = nix::pty::openpty(None, None).unwrap();
        std::fs::File::from(pty.master)
    })
}

impl FakeRuntime {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
    fn check(&self, op: &'static str) -> Result<()> {
        match self.fail.lock().unwrap().get(op) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
    fn pid(&self) -> i32 {
        FAKE_PID_BASE + self.next_pid.fetch_add(1, Ordering::SeqCst)
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Runtime for FakeRuntime {
    fn create(&self, id: &str, _bundle: &Path, _terminal: bool, io: ProcessIo) -> Result<Spawned> {
        self.record(format!("create {id}"));
        self.create_io.lock().unwrap().push(io);
        self.check("create")?;
        let pid = self.pid();
        if let Some(f) = self.on_create.lock().unwrap().as_ref() {
            f(pid);
        }
        Ok(Spawned { pid, console: None })
    }
    fn start(&self, id: &str) -> Result<()> {
        self.record(format!("start {id}"));
        self.check("start")?;
        if let Some(f) = self.on_start.lock().unwrap().as_ref() {
            f();
        }
        Ok(())
    }
    fn exec(
        &self,
        id: &str,
        bundle: &Path,
        exec_id: &str,
        spec: &[u8],
        terminal: bool,
        io: ProcessIo,
    ) -> Result<Spawned> {
        self.record(format!("exec {id} {exec_id}"));
        let via = self.exec_via.lock().unwrap().clone();
        if let Some(via) = via {
            return via.exec(id, bundle, exec_id, spec, terminal, io);
        }
        self.exec_specs
            .lock()
            .unwrap()
            .push(serde_json::from_slice(spec).unwrap());
        self.exec_io.lock().unwrap().push(io);
        if let Some(f) = self.on_exec.lock().unwrap().as_ref() {
            f();
        }
        self.check("exec")?;
        Ok(Spawned {
            pid: self.pid(),
            console: fake_console(terminal),
        })
    }
    fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        self.record(format!("kill {id} {signal} {all}"));
        self.check("kill")
    }
    fn delete(&self, id: &str, force: bool) -> Result<()> {
        self.record(format!("delete {id} {force}"));
        if let Some(f) = self.on_delete.lock().unwrap().take() {
            f();
        }
        if !force && let Some(e) = self.refuse_plain_delete.lock().unwrap().clone() {
            return Err(e);
        }
        self.check("delete")
    }
    fn pause(&self, id: &str) -> Result<()> {
        self.record(format!("pause {id}"));
        self.check("pause")
    }
    fn resume(&self, id: &str) -> Result<()> {
        self.record(format!("resume {id}"));
        self.check("resume")
    }
    fn ps(&self, id: &str) -> Result<Vec<i32>> {
        self.record(format!("ps {id}"));
        Ok(self.ps.lock().unwrap().clone())
    }
    fn update(&self, id: &str, _r: &[u8]) -> Result<()> {
        self.record(format!("update {id}"));
        self.check("update")
    }
    fn check_placement(&self, id: &str, pid: i32) -> Result<()> {
        self.placement_checks.lock().unwrap().push((id.into(), pid));
        self.check("placement")
    }
}

#[derive(Default)]
struct FakeHost {
    runtime: Arc<FakeRuntime>,
    mounted: Mutex<Vec<String>>,
    signals: Mutex<Vec<(i32, u32)>>,
    /// How often a cgroup was thawed.
    thaws: AtomicI32,
    fail_mount: Mutex<bool>,
    /// The runc settings each container's runtime was built with.
    configs: Mutex<Vec<RuncConfig>>,
    /// Containers whose init exit was checked for an OOM kill; with `oom_sink` set, each
    /// check finds one and publishes its TaskOOM there.
    oom_checks: Mutex<Vec<String>>,
    oom_sink: Mutex<Option<Arc<RecordingSink>>>,
}

impl Host for FakeHost {
    fn mount_rootfs(&self, _m: &[MountSpec], rootfs: &Path) -> Result<()> {
        if *self.fail_mount.lock().unwrap() {
            return Err(Error::internal(
                "mount rootfs[0] (overlay overlay): invalid argument",
            ));
        }
        self.mounted
            .lock()
            .unwrap()
            .push(rootfs.display().to_string());
        Ok(())
    }
    fn unmount_rootfs(&self, rootfs: &Path) -> Result<()> {
        self.mounted
            .lock()
            .unwrap()
            .retain(|m| m != &rootfs.display().to_string());
        Ok(())
    }
    fn cgroup_paths(&self, _pid: i32) -> Result<CgroupPaths> {
        Ok(CgroupPaths::default())
    }
    fn metrics(&self, _p: &CgroupPaths) -> Result<Any> {
        Ok(Any {
            type_url: "io.containerd.cgroups.v1.Metrics".into(),
            ..Default::default()
        })
    }
    fn watch_oom(&self, _id: &str, _p: &CgroupPaths) -> Result<()> {
        Ok(())
    }
    fn unwatch_oom(&self, _id: &str) {}
    fn check_oom_at_exit(&self, id: &str, _status: i32) {
        self.oom_checks.lock().unwrap().push(id.into());
        if let Some(sink) = self.oom_sink.lock().unwrap().as_ref() {
            crate::shim::events::EventSink::publish(
                sink.as_ref(),
                crate::shim::events::Event::Oom(containerd_shim_protos::events::task::TaskOOM {
                    container_id: id.into(),
                    ..Default::default()
                }),
            );
        }
    }
    fn signal(&self, pid: i32, signal: u32) -> Result<()> {
        self.signals.lock().unwrap().push((pid, signal));
        Ok(())
    }
    fn thaw(&self, _p: &CgroupPaths) -> Result<()> {
        self.thaws.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn runtime(&self, c: &RuncConfig) -> Arc<dyn Runtime> {
        self.configs.lock().unwrap().push(c.clone());
        self.runtime.clone()
    }
}

struct Fixture {
    tm: Arc<TaskManager>,
    svc: TaskService,
    host: Arc<FakeHost>,
    events: Arc<RecordingSink>,
    dir: tempfile::TempDir,
    /// How often Shutdown let the shim exit.
    shutdowns: Arc<AtomicI32>,
}

fn fixture() -> Fixture {
    fixture_with(None)
}

/// A fixture whose task manager subscribes to `reaper` before spawning, as the daemon's does.
fn fixture_with(reaper: Option<Arc<Reaper>>) -> Fixture {
    let host = Arc::new(FakeHost::default());
    let events = Arc::new(RecordingSink::default());
    let shutdowns = Arc::new(AtomicI32::new(0));
    let s2 = shutdowns.clone();
    let tm = TaskManager::new(TaskDeps {
        namespace: "default".into(),
        default_runc: RuncConfig::defaults("default"),
        host: host.clone(),
        events: events.clone(),
        reaper,
        network: None,
        network_for_tasks: false,
        pod: Weak::<NoPod>::new(),
        on_shutdown: Arc::new(move || {
            s2.fetch_add(1, Ordering::SeqCst);
        }),
    });
    let svc = TaskService::new(tm.clone());
    Fixture {
        tm,
        svc,
        host,
        events,
        dir: tempfile::tempdir().unwrap(),
        shutdowns,
    }
}

/// CreateTask of `id` from `bundle`, nothing else set.
fn create_req(id: &str, bundle: &str) -> CreateTaskRequest {
    CreateTaskRequest {
        id: id.into(),
        bundle: bundle.into(),
        ..Default::default()
    }
}

/// An exec's process spec as containerd sends it (`json`: the OCI process).
fn process_spec(json: &[u8]) -> MessageField<Any> {
    MessageField::some(Any {
        type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
        value: json.to_vec(),
        ..Default::default()
    })
}

const SPEC: &str = r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":["sh"],"terminal":false},
"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#;

impl Fixture {
    fn bundle(&self, id: &str, spec: &str) -> String {
        let b = self.dir.path().join(id);
        std::fs::create_dir_all(b.join("rootfs")).unwrap();
        std::fs::write(b.join("config.json"), spec).unwrap();
        b.display().to_string()
    }

    fn create(&self, id: &str) -> ttrpc::Result<CreateTaskResponse> {
        let bundle = self.bundle(id, SPEC);
        self.svc.create(
            &ctx(),
            CreateTaskRequest {
                rootfs: vec![containerd_shim_protos::types::mount::Mount {
                    type_: "overlay".into(),
                    source: "overlay".into(),
                    options: vec!["lowerdir=/l".into()],
                    ..Default::default()
                }],
                ..create_req(id, &bundle)
            },
        )
    }

    fn start(&self, id: &str, exec_id: &str) -> ttrpc::Result<StartResponse> {
        self.svc.start(
            &ctx(),
            StartRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                ..Default::default()
            },
        )
    }

    fn state(&self, id: &str) -> ttrpc::Result<StateResponse> {
        self.svc.state(
            &ctx(),
            StateRequest {
                id: id.into(),
                ..Default::default()
            },
        )
    }

    fn exit(&self, pid: u32, status: i32) {
        self.tm.on_exit(Exit {
            pid: pid as i32,
            status,
            at: SystemTime::now(),
        });
    }

    fn delete(&self, id: &str, exec_id: &str) -> ttrpc::Result<DeleteResponse> {
        self.svc.delete(
            &ctx(),
            DeleteRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                ..Default::default()
            },
        )
    }

    fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> ttrpc::Result<Empty> {
        self.svc.kill(
            &ctx(),
            KillRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                signal,
                all,
                ..Default::default()
            },
        )
    }

    fn pause(&self, id: &str) -> ttrpc::Result<Empty> {
        self.svc.pause(
            &ctx(),
            PauseRequest {
                id: id.into(),
                ..Default::default()
            },
        )
    }

    fn resume(&self, id: &str) -> ttrpc::Result<Empty> {
        self.svc.resume(
            &ctx(),
            ResumeRequest {
                id: id.into(),
                ..Default::default()
            },
        )
    }

    fn shutdown(&self, id: &str) -> ttrpc::Result<Empty> {
        self.svc.shutdown(
            &ctx(),
            ShutdownRequest {
                id: id.into(),
                ..Default::default()
            },
        )
    }

    /// Makes the fake runtime's `op` fail with `e` (until the failures are cleared).
    fn fail(&self, op: &'static str, e: Error) {
        self.host.runtime.fail.lock().unwrap().insert(op, e);
    }

    fn exec(&self, id: &str, exec_id: &str) -> ttrpc::Result<Empty> {
        self.svc.exec(
            &ctx(),
            ExecProcessRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                spec: process_spec(br#"{"args":["true"],"cwd":"/"}"#),
                ..Default::default()
            },
        )
    }
}

/// Makes every `runc create` of `f` report on the second channel that it is inside, then wait
/// (up to 5 s) for a message on the first.
fn hold_creates(f: &Fixture) -> (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>) {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (inside_tx, inside_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    *f.host.runtime.on_create.lock().unwrap() = Some(Box::new(move |_| {
        let _ = inside_tx.send(());
        let _ = go_rx
            .lock()
            .unwrap()
            .recv_timeout(std::time::Duration::from_secs(5));
    }));
    (go_tx, inside_rx)
}
/// Parks a Wait on `id`/`exec_id` and returns where its answer arrives.
fn park_wait(f: &Fixture, id: &str, exec_id: &str) -> std::sync::mpsc::Receiver<ExitInfo> {
    let (tx, rx) = std::sync::mpsc::channel();
    f.tm.waitable(id, exec_id)
        .unwrap()
        .wait(Box::new(crate::shim::waiters::ChannelWaiter(tx)));
    rx
}
/// The reaper's report of `pid`'s exit with `status`, for a runtime hook to deliver (a weak
/// reference: the hook lives in the fixture's runtime, which the task manager owns).
fn exit_later(f: &Fixture, pid: u32, status: i32) -> impl Fn() + Send + 'static {
    let tm = Arc::downgrade(&f.tm);
    move || {
        if let Some(tm) = tm.upgrade() {
            tm.on_exit(Exit {
                pid: pid as i32,
                status,
                at: SystemTime::now(),
            });
        }
    }
}
fn running(f: &Fixture, id: &str) -> u32 {
    let pid = f.create(id).unwrap().pid;
    f.start(id, "").unwrap();
    pid
}
