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
    fn create(&self, id: &str, _bundle: &Path, _terminal: bool, _io: ProcessIo) -> Result<Spawned> {
        self.record(format!("create {id}"));
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

#[test]
fn lifecycle_publishes_events_in_order_and_cleans_up() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    assert!(pid as i32 >= FAKE_PID_BASE);
    assert_eq!(f.host.mounted.lock().unwrap().len(), 1);
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::CREATED
    );
    assert_eq!(f.start("t1", "").unwrap().pid, pid);

    let tm = f.tm.clone();
    let waiter = std::thread::spawn(move || tm.wait_blocking("t1", "").unwrap());
    f.exit(pid, 3);
    assert_eq!(waiter.join().unwrap().status, 3);
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::STOPPED
    );
    assert_eq!(st.exit_status, 3);

    let del = f.delete("t1", "").unwrap();
    assert_eq!((del.pid, del.exit_status), (pid, 3));
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ]
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    // The init is gone: a plain `runc delete`, as containerd's runc shim (`--force` sleeps
    // 100 ms from runc 1.2 on).
    assert_eq!(
        f.host.runtime.calls(),
        ["create t1", "start t1", "delete t1 false"]
    );
    assert_eq!(code(f.state("t1")), Code::NOT_FOUND);
}

#[test]
fn an_exit_during_start_is_published_after_start() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let tm = f.tm.clone();
    *f.host.runtime.on_start.lock().unwrap() = Some(Box::new(move || {
        tm.on_exit(Exit {
            pid: pid as i32,
            status: 0,
            at: SystemTime::now(),
        })
    }));
    f.start("t1", "").unwrap();
    assert_eq!(
        f.events.topics(),
        ["/tasks/create", "/tasks/start", "/tasks/exit"]
    );
    assert_eq!(f.tm.wait_blocking("t1", "").unwrap().status, 0);
}

#[test]
fn unknown_ids_answer_not_found_everywhere() {
    let f = fixture();
    let c = ctx();
    // Calls that take only an ID, each given one nobody knows.
    macro_rules! not_found {
        ($($call:ident($req:ident)),+) => {$(
            let r = f.svc.$call(&c, $req { id: "nope".into(), ..Default::default() });
            assert_eq!(code(r), Code::NOT_FOUND, stringify!($call));
        )+};
    }
    not_found!(
        state(StateRequest),
        start(StartRequest),
        delete(DeleteRequest)
    );
    assert_eq!(code(f.kill("nope", "", 9, false)), Code::NOT_FOUND);
    not_found!(
        wait(WaitRequest),
        pids(PidsRequest),
        pause(PauseRequest),
        resume(ResumeRequest)
    );
    assert_eq!(code(f.exec("nope", "e1")), Code::NOT_FOUND);
    not_found!(
        resize_pty(ResizePtyRequest),
        close_io(CloseIORequest),
        update(UpdateTaskRequest),
        stats(StatsRequest),
        connect(ConnectRequest)
    );
    f.create("t1").unwrap();
    assert_eq!(
        code(f.svc.state(
            &c,
            StateRequest {
                id: "t1".into(),
                exec_id: "e9".into(),
                ..Default::default()
            }
        )),
        Code::NOT_FOUND
    );
}

#[test]
fn bad_ids_and_paths_are_invalid_arguments() {
    let f = fixture();
    let c = ctx();
    for bad in ["a/b", "..", "", "-x"] {
        let r = f.svc.create(&c, create_req(bad, "/tmp"));
        assert_eq!(code(r), Code::INVALID_ARGUMENT, "{bad:?}");
        assert_eq!(code(f.state(bad)), Code::INVALID_ARGUMENT);
    }
    let r = f.svc.create(&c, create_req("t1", "relative/b"));
    assert!(message(r).contains("must be an absolute path"));
    let bundle = f.bundle("t2", SPEC);
    let r = f.svc.create(
        &c,
        CreateTaskRequest {
            stdout: "tcp://x".into(),
            ..create_req("t2", &bundle)
        },
    );
    assert_eq!(code(r), Code::INVALID_ARGUMENT);
    f.create("t3").unwrap();
    f.start("t3", "").unwrap();
    assert_eq!(code(f.exec("t3", "../e")), Code::INVALID_ARGUMENT);
    assert!(
        f.host.runtime.calls().iter().all(|c| !c.contains("t2")),
        "t2 reached the runtime"
    );
}

#[test]
fn malformed_spec_is_rejected_before_mounting() {
    let f = fixture();
    for (spec, why) in [
        ("not json", "parse"),
        (r#"{"root":{"path":"rootfs"}}"#, "ociVersion"),
        (
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":[]}}"#,
            "no args",
        ),
        (
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"args":["sh"],"terminal":true}}"#,
            "terminal",
        ),
    ] {
        let bundle = f.bundle("bad", spec);
        let r = f.svc.create(&ctx(), create_req("bad", &bundle));
        let msg = message(r);
        assert!(
            msg.starts_with("create task bad: ") && msg.contains(why),
            "{msg}"
        );
    }
    assert!(f.host.mounted.lock().unwrap().is_empty());
    assert!(f.host.runtime.calls().is_empty());
}

#[test]
fn a_failed_create_leaves_nothing_and_the_id_can_be_reused() {
    let f = fixture();
    f.fail(
        "create",
        Error::internal("runc create: exec: \"nope\": not found"),
    );
    let msg = message(f.create("t1"));
    assert_eq!(
        msg,
        "create task t1: runc create: exec: \"nope\": not found"
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    f.host.runtime.fail.lock().unwrap().clear();
    f.create("t1").unwrap();

    *f.host.fail_mount.lock().unwrap() = true;
    let msg = message(f.create("t2"));
    assert!(msg.contains("mount rootfs[0]"), "{msg}");
}

#[test]
fn create_twice_is_already_exists_and_running_delete_is_refused() {
    let f = fixture();
    f.create("t1").unwrap();
    assert_eq!(code(f.create("t1")), Code::ALREADY_EXISTS);
    f.start("t1", "").unwrap();
    let r = f.delete("t1", "");
    assert_eq!(code(r), Code::FAILED_PRECONDITION);
    assert_eq!(code(f.start("t1", "")), Code::FAILED_PRECONDITION);
}

/// The init's exit is checked for an OOM kill the watch missed, and its TaskOOM goes out
/// before its TaskExit; an exec's exit is not checked (its container lives on).
#[test]
fn an_init_exit_is_checked_for_an_oom_kill_before_its_task_exit() {
    let f = fixture();
    *f.host.oom_sink.lock().unwrap() = Some(f.events.clone());
    let init = f.create("t1").unwrap().pid;
    f.start("t1", "").unwrap();
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid;
    f.exit(epid, 137);
    assert!(f.host.oom_checks.lock().unwrap().is_empty());
    f.exit(init, 137);
    assert_eq!(*f.host.oom_checks.lock().unwrap(), ["t1"]);
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exec-added",
            "/tasks/exec-started",
            "/tasks/exit",
            "/tasks/oom",
            "/tasks/exit"
        ]
    );
}

#[test]
fn exec_lifecycle_and_init_exit_waits_for_execs() {
    let f = fixture();
    let init = f.create("t1").unwrap().pid;
    f.start("t1", "").unwrap();
    f.exec("t1", "e1").unwrap();
    assert_eq!(code(f.exec("t1", "e1")), Code::ALREADY_EXISTS);
    let epid = f.start("t1", "e1").unwrap().pid;
    assert_ne!(epid, init);
    *f.host.runtime.ps.lock().unwrap() = vec![init as i32, epid as i32];
    let pids = f
        .svc
        .pids(
            &ctx(),
            PidsRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(pids.processes.len(), 2);
    assert!(pids.processes[0].info.is_none());
    assert_eq!(
        pids.processes[1].info.type_url,
        "containerd.runc.v1.ProcessDetails"
    );

    f.kill("t1", "e1", 15, false).unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), vec![(epid as i32, 15)]);

    // The init dies first; its exit must still come after the exec's.
    f.exit(init, 137);
    assert_eq!(
        f.tm.process("t1", "").unwrap().1.state().visible_exit(),
        None,
        "the init's exit waits for its exec's"
    );
    f.exit(epid, 143);
    assert_eq!(
        f.events.topics(),
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exec-added",
            "/tasks/exec-started",
            "/tasks/exit",
            "/tasks/exit"
        ]
    );
    let exits: Vec<String> = f
        .events
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| {
            if let crate::shim::events::Event::Exit(x) = e {
                Some(x.id.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(exits, ["e1", "t1"]);
    let d = f.delete("t1", "e1").unwrap();
    assert_eq!(d.exit_status, 143);
    assert_eq!(code(f.kill("t1", "", 9, false)), Code::NOT_FOUND);
}

#[test]
fn pause_resume_update_stats_and_checkpoint() {
    let f = fixture();
    f.create("t1").unwrap();
    assert_eq!(code(f.pause("t1")), Code::FAILED_PRECONDITION);
    f.start("t1", "").unwrap();
    f.pause("t1").unwrap();
    let st = f.state("t1").unwrap();
    assert_eq!(
        st.status.enum_value().unwrap(),
        containerd_shim_protos::types::task::Status::PAUSED
    );
    f.resume("t1").unwrap();
    assert!(
        f.events
            .topics()
            .ends_with(&["/tasks/paused", "/tasks/resumed"])
    );

    let bad = UpdateTaskRequest {
        id: "t1".into(),
        resources: MessageField::some(Any {
            value: b"[1]".to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(code(f.svc.update(&ctx(), bad)), Code::INVALID_ARGUMENT);
    let good = UpdateTaskRequest {
        id: "t1".into(),
        resources: MessageField::some(Any {
            value: br#"{"memory":{"limit":1048576}}"#.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.svc.update(&ctx(), good).unwrap();
    let s = f
        .svc
        .stats(
            &ctx(),
            StatsRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.stats.type_url, "io.containerd.cgroups.v1.Metrics");
    let r = f.svc.checkpoint(
        &ctx(),
        CheckpointTaskRequest {
            id: "t1".into(),
            ..Default::default()
        },
    );
    assert_eq!(code(r), Code::UNIMPLEMENTED);
}

#[test]
fn shutdown_exits_only_without_tasks() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    f.shutdown("t1").unwrap();
    assert_eq!(f.shutdowns.load(Ordering::SeqCst), 0);
    f.start("t1", "").unwrap();
    f.exit(pid, 0);
    f.delete("t1", "").unwrap();
    f.shutdown("t1").unwrap();
    assert_eq!(f.shutdowns.load(Ordering::SeqCst), 1);
    // The shim is exiting: a Create now would be left behind.
    assert_eq!(code(f.create("t2")), Code::FAILED_PRECONDITION);
    assert!(!f.host.runtime.calls().contains(&"create t2".to_string()));
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

#[test]
fn a_create_racing_the_shims_close_takes_itself_down() {
    let f = Arc::new(fixture());
    let (go_tx, inside_rx) = hold_creates(&f);
    let f2 = f.clone();
    let creating = std::thread::spawn(move || f2.create("t1").map(|r| r.pid));
    inside_rx.recv().unwrap(); // inside runc create, rootfs mounted
    assert_eq!(f.host.mounted.lock().unwrap().len(), 1);
    let f3 = f.clone();
    let closing = std::thread::spawn(move || {
        f3.tm
            .close(std::time::Instant::now() + std::time::Duration::from_secs(30))
    });
    // Let the Create go on only once close has begun (and waits for it).
    let t = std::time::Instant::now();
    while !f.tm.is_closed() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(f.tm.is_closed());
    go_tx.send(()).unwrap();
    // close returns only once the Create has ended, and the Create undid itself.
    assert!(closing.join().unwrap());
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"delete t1 true".to_string()),
        "{:?}",
        f.host.runtime.calls()
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs unmounted"
    );
    assert_eq!(code(creating.join().unwrap()), Code::FAILED_PRECONDITION);
    assert!(f.tm.is_empty());
    assert!(
        !f.events.topics().contains(&"/tasks/create"),
        "no TaskCreate for a container that never was"
    );
    assert_eq!(code(f.create("t2")), Code::FAILED_PRECONDITION);
}

#[test]
fn an_exec_racing_the_delete_of_its_container_is_not_found() {
    let f = fixture();
    let pid = running(&f, "t1");
    // The Exec looked the container up (and saw its init running) ...
    let c = f.tm.container("t1").unwrap();
    // ... then the init exited and the container was deleted ...
    f.exit(pid, 0);
    f.delete("t1", "").unwrap();
    // ... before the Exec registered its process.
    let p = crate::task::Process::new(
        "t1",
        Some("e1".into()),
        Default::default(),
        Some(b"{}".to_vec()),
    );
    let e = f.tm.add_exec(&c, p).unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert!(c.exec_ids().is_empty());
    let topics = f.events.topics();
    assert_eq!(topics.last(), Some(&"/tasks/delete"), "{topics:?}");
    assert!(!topics.contains(&"/tasks/exec-added"), "{topics:?}");
}

#[test]
fn connect_reports_shim_and_task_pids() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let r = f
        .svc
        .connect(
            &ctx(),
            ConnectRequest {
                id: "t1".into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((r.shim_pid, r.task_pid), (std::process::id(), pid));
}

#[test]
fn checkpoint_restore_on_create_is_unimplemented() {
    let f = fixture();
    let bundle = f.bundle("t1", SPEC);
    let r = f.svc.create(
        &ctx(),
        CreateTaskRequest {
            checkpoint: "/x".into(),
            ..create_req("t1", &bundle)
        },
    );
    assert_eq!(code(r), Code::UNIMPLEMENTED);
}

#[test]
fn a_terminal_without_a_console_takes_the_container_down_again() {
    let f = fixture();
    let spec = SPEC.replace("\"terminal\":false", "\"terminal\":true");
    let bundle = f.bundle("t1", &spec);
    let r = f.svc.create(
        &ctx(),
        CreateTaskRequest {
            terminal: true,
            ..create_req("t1", &bundle)
        },
    );
    assert!(message(r).contains("runc did not send a console"));
    assert_eq!(f.host.runtime.calls(), ["create t1", "delete t1 true"]);
    assert!(f.tm.is_empty());
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

#[test]
fn failed_exec_starts_answer_their_waits_and_leave_nothing_behind() {
    let f = fixture();
    let init = running(&f, "t1");
    f.fail(
        "exec",
        Error::internal("exec: \"nope\": executable file not found in $PATH"),
    );
    for i in 0..300 {
        let e = format!("probe{i}");
        f.exec("t1", &e).unwrap();
        let waited = park_wait(&f, "t1", &e);
        assert_eq!(code(f.start("t1", &e)), Code::INTERNAL);
        let exit = waited
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("a failed exec start must answer its Wait");
        assert_eq!(exit.status, UNKNOWN_EXIT_STATUS);
        // Wait after the failure answers at once, State says stopped.
        assert_eq!(f.tm.wait_blocking("t1", &e).unwrap().status, 255);
        assert_eq!(
            f.tm.state("t1", &e).unwrap().status,
            crate::task::Status::Stopped
        );
        f.delete("t1", &e).unwrap();
    }
    assert_eq!(f.tm.watched_pids(), 1, "only the init is watched");
    assert!(f.tm.container("t1").unwrap().exec_ids().is_empty());
    // No TaskExit for an exec that never ran (containerd's runc shim publishes none either),
    // and failed execs do not hold the init's exit back.
    assert!(!f.events.topics().contains(&"/tasks/exec-started"));
    f.exit(init, 0);
    assert_eq!(f.events.topics().last(), Some(&"/tasks/exit"));
}

#[test]
fn deleting_processes_nobody_started_answers_their_waits() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let exec_wait = park_wait(&f, "t1", "e1");
    let deleted = f.delete("t1", "e1").unwrap();
    // Delete answers 0, as containerd's runc shim (TestDeleteContainerExecCreated); the Wait
    // learns that the exec will never run.
    assert_eq!((deleted.exit_status, deleted.pid), (0, 0));
    assert_eq!(exec_wait.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);

    // A created, never started init (e.g. `ctr run` whose start failed), which `runc delete
    // --force` kills: its exit (137) is not the Delete's answer.
    let pid = f.create("t2").unwrap().pid;
    let init_wait = park_wait(&f, "t2", "");
    *f.host.runtime.on_delete.lock().unwrap() = Some(Box::new(exit_later(&f, pid, 137)));
    let deleted = f.delete("t2", "").unwrap();
    assert_eq!((deleted.exit_status, deleted.pid), (0, pid));
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t2 true");
    match f.events.events.lock().unwrap().last() {
        Some(crate::shim::events::Event::Delete(d)) => {
            assert_eq!((d.container_id.as_str(), d.exit_status), ("t2", 0))
        }
        other => panic!("expected TaskDelete last, got {other:?}"),
    }
    assert_eq!(init_wait.try_recv().unwrap().status, 137);

    // Deleting a container answers the Waits of its execs too.
    f.exec("t1", "e2").unwrap();
    let e2 = park_wait(&f, "t1", "e2");
    let pid = f.tm.task_pid("t1").unwrap();
    f.exit(pid, 9);
    f.delete("t1", "").unwrap();
    assert_eq!(e2.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t1 false");
}

#[test]
fn a_failed_init_start_answers_its_waits() {
    let f = fixture();
    f.create("t1").unwrap();
    let waited = park_wait(&f, "t1", "");
    f.fail("start", Error::internal("start failed"));
    assert_eq!(code(f.start("t1", "")), Code::INTERNAL);
    assert_eq!(waited.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    let m = message(f.start("t1", ""));
    assert!(m.contains("failed to start"), "{m}");
    // It can still be deleted (runc delete --force takes the created container down).
    f.delete("t1", "").unwrap();
    assert!(f.tm.is_empty());
    assert_eq!(f.host.runtime.calls().last().unwrap(), "delete t1 true");
}

/// The error of a process found outside its container's cgroups (what `placement` returns).
fn misplaced(pid: i32) -> Error {
    crate::host::placement::Misplaced {
        pid,
        hierarchy: "devices".into(),
        expected: "/sys/fs/cgroup/devices/pod.slice/cri-containerd-t1.scope".into(),
        actual: "/sys/fs/cgroup/devices/pod.slice".into(),
    }
    .into()
}

/// An init outside its cgroups after `runc create` (systemd on cgroup v1 moved it): Create
/// fails naming the hierarchy and both paths, before the container's code could run, and the
/// runc container is deleted with everything else Create made.
#[test]
fn an_init_outside_its_cgroups_after_create_fails_the_create_and_leaves_nothing() {
    let f = fixture();
    let first_pid = FAKE_PID_BASE;
    f.fail("placement", misplaced(first_pid));
    let r = f.create("t1");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("create task t1: check the container's cgroups after runc create: "),
        "{m}"
    );
    assert!(m.contains("devices hierarchy"), "{m}");
    assert!(m.contains("cri-containerd-t1.scope"), "{m}");
    assert!(m.ends_with("says /sys/fs/cgroup/devices/pod.slice"), "{m}");
    assert_eq!(
        *f.host.runtime.placement_checks.lock().unwrap(),
        [("t1".to_string(), first_pid)]
    );
    assert_eq!(
        f.host.runtime.calls(),
        ["create t1", "delete t1 true"],
        "the container is deleted (--force kills its init)"
    );
    assert!(
        f.host.mounted.lock().unwrap().is_empty(),
        "rootfs left mounted"
    );
    assert!(f.tm.is_empty());
    assert!(f.events.topics().is_empty(), "{:?}", f.events.topics());
    // In place, the same ID is created.
    f.host.runtime.fail.lock().unwrap().clear();
    f.create("t1").unwrap();
}

/// Outside its cgroups after `runc start`: the init is SIGKILLed through runc, the Start
/// fails (its Waits answer), and containerd's Delete takes the container away.
#[test]
fn an_init_outside_its_cgroups_after_start_is_killed_and_the_start_fails() {
    let f = fixture();
    let pid = f.create("t1").unwrap().pid;
    let waited = park_wait(&f, "t1", "");
    f.fail("placement", misplaced(pid as i32));
    let r = f.start("t1", "");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("start task t1: check the container's cgroups after runc start: "),
        "{m}"
    );
    assert_eq!(
        f.host.runtime.calls()[1..],
        [
            "start t1".to_string(),
            format!("kill t1 {} false", libc::SIGKILL)
        ]
    );
    assert_eq!(waited.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    assert!(!f.events.topics().contains(&"/tasks/start"));
    f.delete("t1", "").unwrap();
    assert!(f.tm.is_empty());
}

/// An exec'd process outside its container's cgroups: SIGKILLed, its Start fails, nothing
/// of it stays registered.
#[test]
fn an_exec_outside_its_cgroups_is_killed_and_its_start_fails() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let exec_pid = FAKE_PID_BASE + 1;
    f.fail("placement", misplaced(exec_pid));
    let r = f.start("t1", "e1");
    assert_eq!(code(r.clone()), Code::INTERNAL);
    let m = message(r);
    assert!(
        m.starts_with("start exec e1 of task t1: check the exec's cgroups after runc exec: "),
        "{m}"
    );
    assert!(
        f.host
            .signals
            .lock()
            .unwrap()
            .contains(&(exec_pid, libc::SIGKILL as u32)),
        "{:?}",
        f.host.signals.lock().unwrap()
    );
    assert_eq!(f.tm.watched_pids(), 1, "only the init is watched");
    assert!(!f.events.topics().contains(&"/tasks/exec-started"));
    assert_eq!(f.tm.wait_blocking("t1", "e1").unwrap().status, 255);
}

/// An init that exited while paused: runc reads a cgroup still frozen as paused and refuses a
/// plain `runc delete`; Delete then forces it, and succeeds.
#[test]
fn a_refused_plain_runc_delete_is_forced() {
    let f = fixture();
    let pid = running(&f, "t1");
    f.pause("t1").unwrap();
    f.exit(pid, 137);
    *f.host.runtime.refuse_plain_delete.lock().unwrap() = Some(Error::internal(
        "runc delete: cannot delete container t1 that is not stopped: paused",
    ));
    let deleted = f.delete("t1", "").unwrap();
    assert_eq!(deleted.exit_status, 137);
    assert!(
        f.host
            .runtime
            .calls()
            .ends_with(&["delete t1 false".to_string(), "delete t1 true".to_string()]),
        "{:?}",
        f.host.runtime.calls()
    );
    assert!(f.tm.is_empty());
    assert_eq!(f.events.topics().last(), Some(&"/tasks/delete"));
}

#[test]
fn an_init_killed_during_create_gets_its_task_exit_after_task_create() {
    let reaper = Reaper::new_for_test();
    let f = fixture_with(Some(reaper.clone()));
    let r = reaper.clone();
    *f.host.runtime.on_create.lock().unwrap() = Some(Box::new(move |pid| {
        // The reaper reports the exit before `create` even returned the pid.
        r.inject(Exit {
            pid,
            status: 137,
            at: SystemTime::now(),
        })
    }));
    let pid = f.create("t1").unwrap().pid;
    assert_eq!(f.events.topics(), ["/tasks/create", "/tasks/exit"]);
    assert_eq!(f.tm.wait_blocking("t1", "").unwrap().status, 137);
    let m = message(f.start("t1", ""));
    assert!(m.contains("has already exited"), "{m}");
    assert_eq!(f.tm.state("t1", "").unwrap().pid, pid);
}

#[test]
fn two_concurrent_creates_of_one_id_one_wins() {
    let f = Arc::new(fixture());
    let (go_tx, inside_rx) = hold_creates(&f);
    let f2 = f.clone();
    let first = std::thread::spawn(move || f2.create("t1").map(|r| r.pid));
    inside_rx.recv().unwrap(); // the first Create is inside runc create
    assert_eq!(code(f.create("t1")), Code::ALREADY_EXISTS);
    go_tx.send(()).unwrap();
    first.join().unwrap().unwrap();
    assert_eq!(f.tm.len(), 1);
    assert_eq!(
        f.host
            .runtime
            .calls()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count(),
        1
    );
}

#[test]
fn the_exec_request_decides_the_terminal() {
    let f = fixture();
    running(&f, "t1");
    // The container's own process spec (terminal false), with a request asking for a tty: what
    // containerd's Go client sends for task.Exec(..., cio.WithTerminal).
    f.svc
        .exec(
            &ctx(),
            ExecProcessRequest {
                id: "t1".into(),
                exec_id: "tty".into(),
                terminal: true,
                spec: process_spec(br#"{"args":["sh"],"terminal":false,"cwd":"/"}"#),
                ..Default::default()
            },
        )
        .unwrap();
    f.start("t1", "tty").unwrap();
    let specs = f.host.runtime.exec_specs.lock().unwrap().clone();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0]["terminal"], serde_json::json!(true));
    assert_eq!(specs[0]["cwd"], serde_json::json!("/"));
}

#[test]
fn kill_all_and_wait_all_cover_every_live_container() {
    let f = Arc::new(fixture());
    let p1 = running(&f, "a");
    let p2 = running(&f, "b");
    f.tm.kill_all();
    // Both have a pid namespace of their own: SIGKILL to the init is enough, no runc exec.
    let mut signals = f.host.signals.lock().unwrap().clone();
    signals.sort();
    assert_eq!(signals, [(p1 as i32, 9), (p2 as i32, 9)]);
    assert!(!f.host.runtime.calls().iter().any(|c| c.starts_with("kill")));
    let soon = std::time::Instant::now() + std::time::Duration::from_millis(50);
    assert!(!f.tm.wait_all(soon), "nothing exited yet");
    let f2 = f.clone();
    let exits = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        f2.exit(p1, 137);
        f2.exit(p2, 137);
    });
    let later = std::time::Instant::now() + std::time::Duration::from_secs(5);
    assert!(f.tm.wait_all(later));
    exits.join().unwrap();
    // A second kill_all skips ended containers.
    f.tm.kill_all();
    assert_eq!(f.host.signals.lock().unwrap().len(), 2);
    // A container in a shared pid namespace needs runc kill --all.
    let shared = SPEC.replace(r#"{"type":"pid"},"#, "");
    let bundle = f.bundle("c", &shared);
    f.svc.create(&ctx(), create_req("c", &bundle)).unwrap();
    f.start("c", "").unwrap();
    f.tm.kill_all();
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"kill c 9 true".to_string())
    );
}

#[test]
fn wait_on_an_unknown_process_is_not_found_and_parks_nothing() {
    let f = fixture();
    running(&f, "t1");
    for (id, exec) in [("t1", "nope"), ("nope", "")] {
        match f.tm.waitable(id, exec) {
            Err(e) => assert_eq!(e.kind(), crate::records::error::Kind::NotFound),
            Ok(_) => panic!("{id}/{exec} found"),
        }
    }
    let p = f.tm.waitable("t1", "").unwrap();
    assert_eq!(p.state().parked(), 0);
}

#[test]
fn killing_an_init_signals_it_directly_and_all_goes_through_runc() {
    let f = fixture();
    let pid = running(&f, "t1");
    let kill = |signal: u32, all: bool| f.kill("t1", "", signal, all);
    kill(15, false).unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), [(pid as i32, 15)]);
    kill(9, true).unwrap();
    assert!(
        f.host
            .runtime
            .calls()
            .contains(&"kill t1 9 true".to_string())
    );
    f.exit(pid, 143);
    assert_eq!(code(kill(15, false)), Code::NOT_FOUND);
    assert_eq!(
        f.host.signals.lock().unwrap().len(),
        1,
        "no signal to an ended process"
    );
}

/// Issue 14 item 1: every signal of 1..=SIGRTMAX reaches the process (SIGRTMIN+3 = 37 is
/// systemd's stop signal), for the init, an exec and `all`; 0 and above SIGRTMAX do not.
#[test]
fn kill_takes_every_signal_up_to_sigrtmax() {
    let f = fixture();
    let pid = running(&f, "t1") as i32;
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid as i32;
    let max = libc::SIGRTMAX() as u32;
    for sig in [1, 15, 34, 37, max] {
        f.kill("t1", "", sig, false).unwrap();
        f.kill("t1", "e1", sig, false).unwrap();
        f.kill("t1", "", sig, true).unwrap();
    }
    let signals = f.host.signals.lock().unwrap().clone();
    for sig in [1, 15, 34, 37, max] {
        assert!(
            signals.contains(&(pid, sig)),
            "{sig} to the init: {signals:?}"
        );
        assert!(
            signals.contains(&(epid, sig)),
            "{sig} to the exec: {signals:?}"
        );
        let all = format!("kill t1 {sig} true");
        assert!(f.host.runtime.calls().contains(&all), "{all}");
    }
    for bad in [0, max + 1, 1000, u32::MAX] {
        for (exec, all) in [("", false), ("e1", false), ("", true)] {
            let r = f.kill("t1", exec, bad, all);
            assert_eq!(code(r), Code::INVALID_ARGUMENT, "{bad}");
        }
    }
    assert_eq!(f.host.signals.lock().unwrap().len(), signals.len());
}

/// Issue 14 item 1: a Kill of a process that has ended answers NotFound "process already
/// finished", and one with `all` succeeds, and neither runs anything (no runc kill --all on a
/// stopped container: containerd's CRI sends exactly that, Kill(SIGKILL, all), after every
/// TaskExit), whether the exit is visible or only reaped (held back by a running exec).
#[test]
fn kill_of_a_finished_process_is_not_found_and_runs_nothing() {
    let f = fixture();
    let pid = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let epid = f.start("t1", "e1").unwrap().pid;
    f.exit(pid, 0); // held: the exec still runs
    assert_eq!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::RUNNING
    );
    let calls_before = f.host.runtime.calls().len();
    for sig in [9, 15] {
        let kill = || f.kill("t1", "", sig, false);
        assert_eq!(code(kill()), Code::NOT_FOUND);
        let m = message(kill());
        assert!(m.contains("process already finished"), "{m}");
        f.kill("t1", "", sig, true).unwrap();
    }
    f.exit(epid, 137);
    assert_eq!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::STOPPED
    );
    for exec in ["", "e1"] {
        let r = f.kill("t1", exec, 9, false);
        assert_eq!(code(r), Code::NOT_FOUND, "{exec}");
    }
    f.kill("t1", "", 9, true).unwrap();
    assert_eq!(f.host.runtime.calls().len(), calls_before, "runc ran");
    assert!(
        f.host.signals.lock().unwrap().is_empty(),
        "a signal was sent"
    );
}

/// Issue 14 item 2: SIGKILL to a paused task (init, `all`, and StopSandbox's kill_all) thaws
/// its cgroup after the signal, as runc does; other signals and running tasks do not.
#[test]
fn sigkill_thaws_a_paused_task() {
    let f = fixture();
    running(&f, "t1");
    let thaws = || f.host.thaws.load(Ordering::SeqCst);
    f.kill("t1", "", 15, false).unwrap();
    assert_eq!(thaws(), 0, "not paused");
    f.pause("t1").unwrap();
    f.kill("t1", "", 15, false).unwrap();
    f.kill("t1", "", 15, true).unwrap();
    assert_eq!(thaws(), 0, "only SIGKILL thaws");
    f.kill("t1", "", 9, false).unwrap();
    assert_eq!(thaws(), 1);
    f.kill("t1", "", 9, true).unwrap();
    assert_eq!(thaws(), 2);
    f.tm.kill_all();
    assert_eq!(thaws(), 3);
}

/// Issue 14 item 2, the race: a Pause whose freeze lands after a SIGKILL would leave a dying
/// container frozen (v1) for ever; it thaws again and fails instead.
#[test]
fn a_pause_after_a_sigkill_thaws_and_fails() {
    let f = fixture();
    running(&f, "t1");
    f.kill("t1", "", 9, false).unwrap();
    assert_eq!(f.host.thaws.load(Ordering::SeqCst), 0, "it was not paused");
    let r = f.pause("t1");
    assert_eq!(code(r), Code::FAILED_PRECONDITION);
    assert_eq!(f.host.thaws.load(Ordering::SeqCst), 1);
    assert_ne!(
        f.state("t1").unwrap().status(),
        containerd_shim_protos::api::Status::PAUSED
    );
}

/// A fifo `name` in the fixture's directory.
fn fifo(f: &Fixture, name: &str) -> std::path::PathBuf {
    let fifo = f.dir.path().join(name);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    fifo
}

/// Registers exec `exec_id` of `id`, a `cat` whose stdin is `stdin`.
fn exec_reading(f: &Fixture, id: &str, exec_id: &str, stdin: &Path) -> ttrpc::Result<Empty> {
    f.svc.exec(
        &ctx(),
        ExecProcessRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            stdin: stdin.display().to_string(),
            spec: process_spec(br#"{"args":["cat"],"cwd":"/"}"#),
            ..Default::default()
        },
    )
}

#[test]
fn close_io_before_start_closes_stdin_as_soon_as_it_exists() {
    let f = fixture();
    running(&f, "t1");
    let fifo = fifo(&f, "stdin");
    let exec = |exec_id: &str| exec_reading(&f, "t1", exec_id, &fifo);
    let close_io = |exec_id: &str| {
        f.svc.close_io(
            &ctx(),
            CloseIORequest {
                id: "t1".into(),
                exec_id: exec_id.into(),
                stdin: true,
                ..Default::default()
            },
        )
    };
    // `echo x | ctr task exec`: the client's stdin ends (CloseIO) before Start ran.
    exec("early").unwrap();
    close_io("early").unwrap();
    f.start("t1", "early").unwrap();
    let (_, p) = f.tm.process("t1", "early").unwrap();
    assert!(
        !p.holds_stdin(),
        "an earlier CloseIO must close stdin at once"
    );

    // The usual order: the shim holds stdin until CloseIO.
    exec("late").unwrap();
    f.start("t1", "late").unwrap();
    let (_, p) = f.tm.process("t1", "late").unwrap();
    assert!(p.holds_stdin());
    close_io("late").unwrap();
    assert!(!p.holds_stdin());
}

#[test]
fn close_io_during_an_exec_start_still_ends_its_stdin() {
    // `ctr task exec` calls CloseIO as soon as its stdin reaches EOF, which can be while Start
    // still runs `runc exec`: the shim's stdin writer must not outlive that CloseIO.
    let f = fixture();
    running(&f, "t1");
    let fifo = fifo(&f, "e1-stdin");
    exec_reading(&f, "t1", "e1", &fifo).unwrap();
    let tm = f.tm.clone();
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new(move || {
        tm.close_io("t1", "e1", true).unwrap();
    }));
    f.start("t1", "e1").unwrap();
    let io = f.host.runtime.exec_io.lock().unwrap().pop().unwrap();
    let stdin = std::fs::File::from(io.stdin.expect("the exec got a stdin"));
    let flags = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
    let mut buf = [0u8; 8];
    let r = std::io::Read::read(&mut &stdin, &mut buf);
    assert_eq!(
        r.map_err(|e| e.kind()),
        Ok(0),
        "the process must read EOF: no client holds the fifo and CloseIO came"
    );
}

#[test]
fn deleting_a_container_whose_exit_is_held_publishes_it_first() {
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    f.start("t1", "e1").unwrap();
    // The init ended, but its exit waits for its exec's (which never came: a pod torn down
    // right now). Delete must not be refused, and TaskExit still precedes TaskDelete.
    f.exit(init, 137);
    assert_eq!(
        f.tm.state("t1", "").unwrap().status,
        crate::task::Status::Running
    );
    f.delete("t1", "").unwrap();
    let topics = f.events.topics();
    assert_eq!(
        &topics[topics.len() - 2..],
        ["/tasks/exit", "/tasks/delete"]
    );
    assert!(f.tm.is_empty());
}

/// Registers exec `exec_id` of `id` with a terminal or without.
fn exec_with_terminal(f: &Fixture, id: &str, exec_id: &str, terminal: bool) {
    f.svc
        .exec(
            &ctx(),
            ExecProcessRequest {
                id: id.into(),
                exec_id: exec_id.into(),
                terminal,
                spec: process_spec(br#"{"args":["sh"],"cwd":"/"}"#),
                ..Default::default()
            },
        )
        .unwrap();
}

/// Issue 20 item 2: an exec whose runc connects to the console socket and then sends nothing
/// (a real `Runc` with a stand-in binary, its timeout shortened) fails at that timeout, and
/// meanwhile another exec's Start, an exec's Delete and Pause/Resume of the container go
/// through: they used to queue behind it on the container's lifecycle lock.
#[test]
fn a_hung_exec_start_holds_up_nothing_else_of_its_container() {
    use crate::host::runtime::Runc;
    use crate::shim::reaper::Spawner;
    use std::time::Duration;
    let f = fixture();
    running(&f, "t1");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("runc");
    std::fs::write(&bin, format!("#!/bin/sh\n{FAKE_RUNC_EXEC}\n")).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Generous: what follows must finish while the hung exec waits; only its end is awaited.
    let timeout = Duration::from_secs(15);
    let runc = Runc::new(
        RuncConfig {
            binary: bin.display().to_string(),
            root: dir.path().join("root"),
            ..RuncConfig::defaults("ns")
        },
        Spawner::direct(),
        dir.path().join("s"),
    )
    .with_timeout(timeout);
    *f.host.runtime.exec_via.lock().unwrap() = Some(Arc::new(runc));

    // An exec that ran and ended, to be deleted meanwhile.
    exec_with_terminal(&f, "t1", "done", false);
    let done = f.start("t1", "done").unwrap().pid;
    f.exit(done, 0);
    exec_with_terminal(&f, "t1", "hung", true);
    exec_with_terminal(&f, "t1", "other", false);

    let (tx, rx) = std::sync::mpsc::channel();
    let tm = f.tm.clone();
    std::thread::spawn(move || {
        let _ = tx.send(tm.start("t1", "hung"));
    });
    let (conn, runc_pid) = connect_as_runc(dir.path());

    // While its runc sits on the console socket:
    f.delete("t1", "done").unwrap();
    let other = f.start("t1", "other").unwrap().pid;
    f.pause("t1").unwrap();
    f.resume("t1").unwrap();
    f.exit(other, 0);
    f.delete("t1", "other").unwrap();
    // A second Start or a Delete of the hung exec is refused at once, not queued.
    assert_eq!(code(f.start("t1", "hung")), Code::FAILED_PRECONDITION);
    assert_eq!(code(f.delete("t1", "hung")), Code::FAILED_PRECONDITION);
    assert!(
        rx.try_recv().is_err(),
        "all of the above finished only after the hung exec gave up ({timeout:?}): they \
         queued behind it"
    );

    let e = rx
        .recv_timeout(timeout + Duration::from_secs(120))
        .expect("the hung exec never gave up")
        .unwrap_err();
    assert!(
        e.message()
            .contains("timed out waiting for runc to send the console"),
        "{e}"
    );
    assert_eq!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(runc_pid), None),
        Err(nix::Error::ESRCH),
        "its runc was killed and reaped"
    );
    drop(conn);
    // It failed to start: its Wait answers, and it can be deleted.
    assert_eq!(
        f.tm.wait_blocking("t1", "hung").unwrap().status,
        UNKNOWN_EXIT_STATUS
    );
    f.delete("t1", "hung").unwrap();
    let topics = f.events.topics();
    assert_eq!(
        topics
            .iter()
            .filter(|t| **t == "/tasks/exec-started")
            .count(),
        2,
        "done and other: {topics:?}"
    );
}

/// Starts exec `exec_id` of `id` on a thread and holds it inside `runc exec` until the
/// returned sender sends (or is dropped); returns once `runc exec` runs.
fn start_held_in_runc_exec(
    f: &Fixture,
    id: &str,
    exec_id: &str,
) -> (
    std::thread::JoinHandle<crate::records::error::Result<u32>>,
    std::sync::mpsc::Sender<()>,
) {
    use std::sync::mpsc;
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.lock().unwrap().recv();
    }));
    let tm = f.tm.clone();
    let (id, exec_id) = (id.to_string(), exec_id.to_string());
    let start = std::thread::spawn(move || tm.start(&id, &exec_id));
    entered_rx.recv().unwrap();
    (start, release_tx)
}

/// The container's Delete never orphans a starting exec: it waits until the exec's Start
/// has published its outcome (so TaskExecStarted precedes TaskDelete) before `runc delete`
/// (which kills what the exec started), and an exec Start that comes after the init ended
/// runs nothing.
#[test]
fn the_containers_delete_waits_for_an_exec_start_under_way() {
    use std::sync::mpsc;
    use std::time::Duration;
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    f.exec("t1", "late").unwrap();
    let (start, release_tx) = start_held_in_runc_exec(&f, "t1", "e1");
    // runc exec runs; the init dies meanwhile and the container's Delete comes.
    f.exit(init, 137);
    let tm = f.tm.clone();
    let (deleted_tx, deleted_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = deleted_tx.send(tm.delete("t1", ""));
    });
    // An exec Start after the init ended runs nothing, and is not held up by the Delete.
    assert_eq!(code(f.start("t1", "late")), Code::FAILED_PRECONDITION);
    // Not a timing assertion: the Delete may only be slow to get here, never early.
    assert!(
        deleted_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the Delete went ahead of a starting exec"
    );
    assert!(
        !f.host
            .runtime
            .calls()
            .iter()
            .any(|c| c.starts_with("delete t1")),
        "runc delete ran while runc exec did"
    );
    release_tx.send(()).unwrap();
    let pid = start.join().unwrap().unwrap();
    deleted_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Delete never went on")
        .unwrap();
    let calls = f.host.runtime.calls();
    let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
    assert!(at("exec t1 e1") < at("delete t1 false"), "{calls:?}");
    let topics = f.events.topics();
    let at = |t: &str| topics.iter().rposition(|x| *x == t).unwrap();
    assert!(
        at("/tasks/exec-started") < at("/tasks/delete"),
        "{topics:?}"
    );
    assert_eq!(topics.last(), Some(&"/tasks/delete"), "{topics:?}");
    assert!(f.tm.is_empty());
    assert_eq!(
        f.tm.watched_pids(),
        0,
        "pid {pid} of the exec is forgotten with its container"
    );
}

/// A Kill of an exec whose Start is running `runc exec` waits for that Start and signals the
/// process it made, as containerd's runc shim (its exec Kill waits for the lock its Start
/// holds): refused with "not started", a probe's exec killed at its timeout would run on.
#[test]
fn killing_an_exec_being_started_signals_the_process_its_start_makes() {
    use std::sync::mpsc;
    use std::time::Duration;
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let (start, release_tx) = start_held_in_runc_exec(&f, "t1", "e1");
    let tm = f.tm.clone();
    let (killed_tx, killed_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = killed_tx.send(tm.kill("t1", "e1", 9, false));
    });
    // Not a timing assertion: the Kill may only be slow to get here, never early.
    assert!(
        killed_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the Kill answered while the exec's Start still ran"
    );
    release_tx.send(()).unwrap();
    let pid = start.join().unwrap().unwrap();
    killed_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Kill never went on")
        .unwrap();
    assert_eq!(*f.host.signals.lock().unwrap(), [(pid as i32, 9)]);
}

/// An exec Start that unwinds (a panic inside it, caught per call) fails the exec: a Kill that
/// waits for Starts to settle answers instead of waiting for ever, and the exec can be deleted.
#[test]
fn an_exec_start_that_panics_fails_its_exec() {
    use std::time::Duration;
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let init_wait = park_wait(&f, "t1", "");
    // The init ends while the exec is being started (its exit is held for the exec's
    // TaskExecStarted), then the start unwinds.
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new({
        let exit = exit_later(&f, init, 3);
        move || {
            exit();
            panic!("inside runc exec")
        }
    }));
    let tm = f.tm.clone();
    assert!(
        std::thread::spawn(move || tm.start("t1", "e1"))
            .join()
            .is_err()
    );
    let tm = f.tm.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(tm.kill("t1", "e1", 9, false));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the Kill waits for a Start that is gone")
        .unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert_eq!(
        f.tm.wait_blocking("t1", "e1").unwrap().status,
        UNKNOWN_EXIT_STATUS
    );
    // The exit the exec held back went out when its start failed.
    assert_eq!(
        init_wait
            .recv_timeout(Duration::from_secs(60))
            .expect("the init's Wait is answered")
            .status,
        3
    );
    assert_eq!(f.events.topics().last(), Some(&"/tasks/exit"));
    f.delete("t1", "e1").unwrap();
}

/// An exec's Delete takes it out of the table under the lock its Start claims it under: a
/// Start that looked the exec up before the Delete ran runs nothing (before, it could claim
/// the exec between the Delete's check and its removal, and `runc exec` started a process
/// nobody could reach any more).
#[test]
fn a_start_of_an_exec_its_delete_took_out_runs_nothing() {
    let f = fixture();
    running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    let (c, p) = f.tm.process("t1", "e1").unwrap();
    // The Delete's first half, then the Start that had looked the exec up.
    c.remove_exec("e1", &p).unwrap();
    let e = f.tm.start_process(&c, &p).unwrap_err();
    assert_eq!(e.kind(), crate::records::error::Kind::NotFound, "{e}");
    assert!(
        !f.host.runtime.calls().iter().any(|c| c.starts_with("exec")),
        "{:?}",
        f.host.runtime.calls()
    );
    // And a Start that claimed first makes the Delete refuse.
    f.exec("t1", "e2").unwrap();
    let (c, p) = f.tm.process("t1", "e2").unwrap();
    p.state().begin_start().unwrap();
    assert_eq!(
        c.remove_exec("e2", &p).unwrap_err().kind(),
        crate::records::error::Kind::FailedPrecondition
    );
    assert_eq!(c.exec_ids(), ["e2"]);
}

/// A container whose cgroupsPath has systemd's `slice:prefix:name` form (a pod with a
/// `.slice` parent) runs under runc's systemd cgroup driver, and its record says so for
/// `delete`; one with a cgroupfs path does not.
#[test]
fn a_systemd_cgroups_path_runs_the_container_with_runc_s_systemd_driver() {
    let f = fixture();
    for (id, path, systemd) in [
        (
            "c1",
            "kubepods-besteffort-pod1.slice:cri-containerd:c1",
            true,
        ),
        ("c2", "/kubepods/besteffort/pod1/c2", false),
    ] {
        let spec = SPEC.replace(
            r#""linux":{"#,
            &format!(r#""linux":{{"cgroupsPath":"{path}","#),
        );
        let bundle = f.bundle(id, &spec);
        f.svc.create(&ctx(), create_req(id, &bundle)).unwrap();
        let config = f.host.configs.lock().unwrap().last().cloned().unwrap();
        assert_eq!(config.systemd_cgroup, systemd, "{id}");
        let record: crate::task::TaskRecord = serde_json::from_slice(
            &std::fs::read(Path::new(&bundle).join(crate::task::TASK_STATE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(record.runc.systemd_cgroup, systemd, "{id}");
    }
}
