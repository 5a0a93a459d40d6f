//! The shim's own handshake with containerd: `-info` (through containerd's introspection
//! service and run directly), `start` in both bootstrap protocols (run directly: the bench's
//! containerd 2.1.9 speaks only the legacy one), `ShimCgroup` (through the sandbox controller
//! API), and `delete` after `kill -9` of a shim (the socket must not be left behind).
//!
//! Not testable on containerd 2.1.9: CRI using `-info`'s features for this handler
//! (`recursive_read_only` mounts, user namespaces). 2.1.9's CRI introspects only
//! `io.containerd.runc.v2` (internal/cri/server/service.go:402-407; fixed by 61a8f6f45 in
//! 2.3.x), so it refuses a recursive read-only mount for the rsandbox handler
//! (internal/cri/opts/spec_linux_opts.go:182-185). What CRI 2.3.4 would call, containerd's
//! introspection PluginInfo for the runtime, is tested here through 2.1.9.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use containerd_client::services::v1::PluginInfoRequest;
use containerd_client::services::v1::introspection_client::IntrospectionClient;
use containerd_client::types::{RuntimeInfo, RuntimeRequest};
use prost::Message;
use prost_types::Any;
use rsandbox_integration::controller::*;
use rsandbox_integration::*;

/// typeurl's name for Go's `specs-go/features.Features` (value: JSON).
const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// `containerd.runc.v1.Options`, the fields used here.
#[derive(Clone, PartialEq, Message)]
struct RuncOptions {
    #[prost(string, tag = "3")]
    shim_cgroup: String,
    #[prost(string, tag = "6")]
    binary_name: String,
}

/// containerd 2.3's `containerd.runtime.bootstrap.v1.BootstrapParams`.
#[derive(Clone, PartialEq, Message)]
struct BootstrapParams {
    #[prost(string, tag = "1")]
    instance_id: String,
    #[prost(string, tag = "2")]
    namespace: String,
    #[prost(int32, tag = "3")]
    log_level: i32,
    #[prost(string, tag = "4")]
    containerd_version: String,
    #[prost(string, tag = "5")]
    containerd_ttrpc_address: String,
    #[prost(string, tag = "6")]
    containerd_grpc_address: String,
    #[prost(string, tag = "7")]
    containerd_binary: String,
    #[prost(message, repeated, tag = "8")]
    extensions: Vec<Extension>,
    #[prost(string, optional, tag = "9")]
    socket_dir: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Extension {
    #[prost(message, optional, tag = "1")]
    value: Option<Any>,
}

#[derive(Clone, PartialEq, Message)]
struct BootstrapResult {
    #[prost(int32, tag = "1")]
    version: i32,
    #[prost(string, tag = "2")]
    address: String,
    #[prost(string, tag = "3")]
    protocol: String,
}

#[derive(Clone, PartialEq, Message)]
struct DeleteResponse {
    #[prost(uint32, tag = "1")]
    pid: u32,
    #[prost(uint32, tag = "2")]
    exit_status: u32,
}

fn runc_options_any(o: &RuncOptions) -> Any {
    Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: o.encode_to_vec(),
    }
}

fn shim_bin() -> PathBuf {
    prefix().join("usr/bin").join(SHIM)
}

/// The runc the bench's containerd finds (its PATH: the prefix first, then the host's).
fn bench_runc() -> PathBuf {
    let path = format!(
        "{}:{}",
        prefix().join("usr/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    std::env::split_paths(&path)
        .map(|d| d.join("runc"))
        .find(|p| p.is_file())
        .expect("runc in PATH")
}

/// `runc features` of `runc`, parsed.
fn features_of(runc: &Path) -> serde_json::Value {
    let out = Command::new(runc).arg("features").output().unwrap();
    assert!(out.status.success(), "{runc:?} features: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs the installed shim binary with `args`, `stdin` and `env`, in `cwd`.
fn shim(args: &[&str], stdin: &[u8], env: &[(&str, &str)], cwd: &Path) -> std::process::Output {
    let mut c = Command::new(shim_bin());
    c.args(args)
        .current_dir(cwd)
        .env_remove("TTRPC_ADDRESS")
        .env_remove("GRPC_ADDRESS")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn introspection_request(options: Option<Any>) -> tonic::Request<PluginInfoRequest> {
    let rr = RuntimeRequest {
        runtime_path: RUNTIME.into(),
        options,
    };
    tonic::Request::new(PluginInfoRequest {
        r#type: "io.containerd.runtime.v2".into(),
        id: "task".into(),
        options: Some(Any {
            type_url: "containerd.types.RuntimeRequest".into(),
            value: rr.encode_to_vec(),
        }),
    })
}

/// containerd 2.1.9 runs `<shim> -info` for PluginInfo(io.containerd.runtime.v2, task) and
/// returns the RuntimeInfo as the reply's `extra`: the same call CRI (2.3.4) makes per handler.
#[tokio::test]
async fn info_through_containerd_introspection() {
    let ch = containerd_client::connect(address()).await.unwrap();
    let mut intro = IntrospectionClient::new(ch);
    let runc = bench_runc();
    for options in [
        None,
        Some(runc_options_any(&RuncOptions {
            binary_name: runc.to_string_lossy().into_owned(),
            ..Default::default()
        })),
    ] {
        let resp = intro
            .plugin_info(introspection_request(options.clone()))
            .await
            .unwrap_or_else(|s| panic!("PluginInfo: {}", s.message()))
            .into_inner();
        let extra = resp.extra.expect("PluginInfo extra");
        assert_eq!(extra.type_url, "containerd.types.RuntimeInfo");
        let info = RuntimeInfo::decode(extra.value.as_slice()).unwrap();
        assert_eq!(info.name, RUNTIME);
        assert!(!info.version.unwrap_or_default().version.is_empty());
        let features = info.features.expect("features");
        assert_eq!(features.type_url, FEATURES_TYPE_URL);
        let got: serde_json::Value = serde_json::from_slice(&features.value).unwrap();
        assert_eq!(got, features_of(&runc));
        assert!(
            got["mountOptions"]
                .as_array()
                .is_some_and(|a| a.contains(&serde_json::json!("rro"))),
            "runc {runc:?} supports rro: {got}"
        );
        // The runc options come back as given, as containerd-shim-runc-v2 does.
        assert_eq!(info.options, options);
    }
}

/// A runc too old for `features`: no features, no error.
#[test]
fn info_without_runc_features() {
    let tmp = scratch_dir(&unique_id("oldrunc"));
    let old = tmp.join("runc");
    std::fs::write(
        &old,
        "#!/bin/sh\necho 'No help topic for features' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let opts = runc_options_any(&RuncOptions {
        binary_name: old.to_string_lossy().into_owned(),
        ..Default::default()
    });
    let out = shim(&["-info"], &opts.encode_to_vec(), &[], &tmp);
    assert!(out.status.success(), "{out:?}");
    let info = RuntimeInfo::decode(out.stdout.as_slice()).unwrap();
    assert_eq!(info.name, RUNTIME);
    assert!(info.features.is_none());
    assert_eq!(info.options, Some(opts));
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Whether `pid` still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// What a direct `start` made; the daemon is killed and `delete` run on drop, unless the test
/// did it.
struct Started {
    bundle: PathBuf,
    ns: String,
    id: String,
    done: bool,
}

impl Started {
    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.bundle.join("shim.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `kill -9` of the daemon, then `delete` as containerd runs it; returns delete's output.
    fn kill_and_delete(&mut self) -> std::process::Output {
        self.done = true;
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            poll(HANG, || (!alive(pid)).then_some(()));
        }
        shim(
            &[
                "-namespace",
                &self.ns,
                "-address",
                &address().to_string_lossy(),
                "-id",
                &self.id,
                "-bundle",
                &self.bundle.to_string_lossy(),
                "delete",
            ],
            b"",
            &[],
            &self.bundle,
        )
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.kill_and_delete();
        }
    }
}

/// `start` run directly, as containerd 2.3 runs it: BootstrapParams on stdin without the
/// TTRPC address (it is in the environment), a socket_dir of our own; the reply is a
/// BootstrapResult, the daemon serves the socket, and `delete` after `kill -9` removes it.
#[test]
fn start_speaks_the_2_3_protocol_and_delete_removes_the_killed_shims_socket() {
    let g = Guard::new();
    let id = unique_id("boot23");
    let ns = "rsandbox-it";
    let tmp = std::fs::canonicalize(scratch_dir(&id)).unwrap();
    let bundle = tmp.join("bundle");
    let sockets = tmp.join("s");
    std::fs::create_dir_all(&bundle).unwrap();
    let grpc = address().to_string_lossy().into_owned();
    let ttrpc = format!("{grpc}.ttrpc");
    let params = BootstrapParams {
        instance_id: id.clone(),
        namespace: ns.into(),
        containerd_version: "v2.3.4".into(),
        containerd_grpc_address: grpc.clone(),
        containerd_binary: prefix().join("usr/bin/containerd").to_string_lossy().into(),
        socket_dir: Some(sockets.to_string_lossy().into_owned()),
        ..Default::default()
    };
    let args = [
        "-namespace",
        ns,
        "-address",
        &grpc,
        "-publish-binary",
        "/usr/bin/containerd",
        "-id",
        &id,
        "start",
    ];

    // Neither in the params nor in the environment: a clear error, nothing started.
    let out = shim(&args, &params.encode_to_vec(), &[], &bundle);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TTRPC_ADDRESS"), "{err}");
    assert!(out.stdout.is_empty());
    assert!(!bundle.join("shim.pid").exists());

    let out = shim(
        &args,
        &params.encode_to_vec(),
        &[("TTRPC_ADDRESS", &ttrpc)],
        &bundle,
    );
    let mut started = Started {
        bundle: bundle.clone(),
        ns: ns.into(),
        id: id.clone(),
        done: false,
    };
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let reply = BootstrapResult::decode(out.stdout.as_slice()).expect("a BootstrapResult");
    assert_eq!((reply.version, reply.protocol.as_str()), (3, "ttrpc"));
    let path = PathBuf::from(reply.address.strip_prefix("unix://").unwrap());
    assert_eq!(path.parent(), Some(sockets.as_path()));
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    let pid = started.pid().expect("shim.pid");
    // spawn() returns once the exec has closed the CLOEXEC fds, a moment before the kernel
    // lays out the new stack: until then /proc/<pid>/environ reads empty.
    let environ = poll(HANG, || {
        let e = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        (!e.is_empty()).then_some(e)
    })
    .unwrap_or_default();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == format!("TTRPC_ADDRESS={ttrpc}").as_bytes()),
        "the daemon publishes events to $TTRPC_ADDRESS"
    );

    let out = started.kill_and_delete();
    assert!(out.status.success(), "{out:?}");
    let resp = DeleteResponse::decode(out.stdout.as_slice()).unwrap();
    assert_eq!(resp.exit_status, 137);
    assert!(
        !path.exists(),
        "delete left the killed shim's socket {path:?}"
    );
    drop(started);
    g.assert_clean(&[id]);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `start` as containerd 2.1.9 runs it (runtime options Any on stdin): the JSON reply, byte
/// for byte, and the socket in the default directory.
#[test]
fn start_speaks_the_legacy_protocol() {
    let g = Guard::new();
    let id = unique_id("boot21");
    let ns = "rsandbox-it";
    let tmp = scratch_dir(&id);
    let bundle = std::fs::canonicalize(&tmp).unwrap();
    let grpc = address().to_string_lossy().into_owned();
    let ttrpc = format!("{grpc}.ttrpc");
    let opts = runc_options_any(&RuncOptions::default());
    let out = shim(
        &[
            "-namespace",
            ns,
            "-address",
            &grpc,
            "-publish-binary",
            "/c",
            "-id",
            &id,
            "start",
        ],
        &opts.encode_to_vec(),
        &[("TTRPC_ADDRESS", &ttrpc), ("GRPC_ADDRESS", &grpc)],
        &bundle,
    );
    let started = Started {
        bundle: bundle.clone(),
        ns: ns.into(),
        id: id.clone(),
        done: false,
    };
    assert!(out.status.success(), "{out:?}");
    let reply = String::from_utf8(out.stdout).unwrap();
    let addr = reply
        .strip_prefix(r#"{"version":3,"address":""#)
        .and_then(|r| r.strip_suffix(r#"","protocol":"ttrpc"}"#))
        .unwrap_or_else(|| panic!("reply {reply:?}"));
    let path = PathBuf::from(addr.strip_prefix("unix://").unwrap());
    assert_eq!(path.parent(), Some(Path::new(SOCKET_DIR)));
    // The leak guard finds the sockets of our containerd's shims by this name.
    assert_eq!(path, shim_socket(ns, &id));
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    assert_eq!(
        std::fs::read(bundle.join("rsandbox-options.pb")).unwrap(),
        opts.encode_to_vec()
    );
    drop(started);
    assert!(
        !path.exists(),
        "delete left the killed shim's socket {path:?}"
    );
    g.assert_clean(&[id]);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Whether /sys/fs/cgroup is the unified (v2-only) hierarchy.
fn unified() -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 2 && f[1] == "/sys/fs/cgroup" && f[2] == "cgroup2"
        })
}

/// The cgroup `name` made in the hierarchies where a process can join it without setup
/// (v1: memory, pids, name=systemd, not cpuset; v2: the unified one); removed on drop.
struct TestCgroup(Vec<PathBuf>);

impl TestCgroup {
    fn new(name: &str) -> TestCgroup {
        let roots: Vec<PathBuf> = if unified() {
            vec![PathBuf::from("/sys/fs/cgroup")]
        } else {
            ["memory", "pids", "systemd"]
                .iter()
                .map(|h| Path::new("/sys/fs/cgroup").join(h))
                .filter(|p| p.is_dir())
                .collect()
        };
        let dirs: Vec<PathBuf> = roots.iter().map(|r| r.join(name)).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("mkdir {d:?}: {e}"));
        }
        TestCgroup(dirs)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in &self.0 {
            // Empty once the shim and its pause process are gone.
            poll(HANG, || std::fs::remove_dir(d).ok());
        }
    }
}

/// `containerd.runc.v1.Options.shim_cgroup` in the sandbox's runtime options (containerd
/// passes them to `start`'s stdin): the shim daemon runs in that cgroup.
#[tokio::test]
async fn shim_cgroup_moves_the_shim() {
    let g = Guard::new();
    let id = unique_id("shimcg");
    let cgroup = TestCgroup::new(&id);
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    let mut sandbox = sandbox_info(&id);
    sandbox.runtime.as_mut().unwrap().options = Some(runc_options_any(&RuncOptions {
        shim_cgroup: format!("/{id}"),
        ..Default::default()
    }));
    let res: Result<(), String> = async {
        c.create(req(ControllerCreateRequest {
            sandbox_id: id.clone(),
            netns_path: format!("/run/netns/{id}"),
            sandbox: Some(sandbox),
            sandboxer: "shim".into(),
            ..Default::default()
        }))
        .await
        .map_err(|s| format!("Controller.Create: {}", s.message()))?;
        c.start(req(ControllerStartRequest {
            sandbox_id: id.clone(),
            sandboxer: "shim".into(),
        }))
        .await
        .map_err(|s| format!("Controller.Start: {}", s.message()))?;
        let daemons = shim_daemons_for(&id);
        let [shim] = daemons.as_slice() else {
            return Err(format!("shim daemons of {id}: {daemons:?}"));
        };
        for d in &cgroup.0 {
            let procs =
                std::fs::read_to_string(d.join("cgroup.procs")).map_err(|e| e.to_string())?;
            if !procs.lines().any(|p| p == shim.pid.to_string()) {
                return Err(format!(
                    "shim {} not in {}: {procs:?}",
                    shim.pid,
                    d.display()
                ));
            }
        }
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", shim.pid))
            .map_err(|e| e.to_string())?;
        if !own.lines().any(|l| l.ends_with(&format!(":/{id}"))) {
            return Err(format!("/proc/{}/cgroup: {own}", shim.pid));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop(netns);
    drop(cgroup);
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id]);
}

/// The `-socket` path of a shim daemon's command line.
fn socket_of(p: &Proc) -> PathBuf {
    let mut words = p.cmdline.split(' ');
    words.find(|w| *w == "-socket").expect("-socket");
    PathBuf::from(words.next().unwrap().trim_start_matches("unix://"))
}

#[track_caller]
fn kill9(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// `kill -9` of a `ctr run` task's shim: containerd runs `delete`, which removes the socket.
#[test]
fn killed_task_shim_leaves_no_socket() {
    let g = Guard::new();
    let id = unique_id("kill9ctr");
    let objs = CtrObjects {
        ns: "default",
        ids: vec![id.clone()],
    };
    ctr(
        "default",
        &[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            BUSYBOX,
            &id,
            "sleep",
            "300",
        ],
    )
    .expect_ok("ctr run -d");
    let daemons = shim_daemons_for(&id);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let socket = socket_of(&daemons[0]);
    assert!(socket.exists());
    // The leak guard finds the sockets of our containerd's shims by this name.
    assert_eq!(socket, shim_socket("default", &id));
    kill9(daemons[0].pid);
    let gone = poll(HANG, || (!socket.exists()).then_some(()));
    drop(objs);
    assert!(
        gone.is_some(),
        "{socket:?} left after kill -9\n{}",
        log_lines(&id, 20)
    );
    g.assert_clean(&[id]);
}

/// A named netns (`ip netns add`), deleted on drop.
struct NetNs(String);

impl NetNs {
    fn new(name: &str) -> NetNs {
        let mut c = Command::new("ip");
        c.args(["netns", "add", name]);
        run_timeout(c, None, HANG).expect_ok("ip netns add");
        NetNs(name.into())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `kill -9` of a pod's shim (sandbox controller API): containerd runs `delete` for the
/// sandbox, which takes the pause process down and removes the socket.
#[tokio::test]
async fn killed_pod_shim_leaves_no_socket() {
    let g = Guard::new();
    let id = unique_id("kill9pod");
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pause = create_and_start(&mut c, &id, &format!("/run/netns/{id}")).await?;
        let daemons = shim_daemons_for(&id);
        let [shim] = daemons.as_slice() else {
            return Err(format!("shim daemons of {id}: {daemons:?}"));
        };
        let socket = socket_of(shim);
        kill9(shim.pid);
        poll(HANG, || (!socket.exists()).then_some(()))
            .ok_or(format!("{socket:?} left after kill -9"))?;
        poll(HANG, || (!alive(pause as i32)).then_some(())).ok_or(format!(
            "pause process {pause} left after kill -9 of its shim"
        ))?;
        Ok(())
    }
    .await;
    // The shim is gone: containerd answers Shutdown with NotFound; nothing else to check.
    let _ = stop_and_shutdown(&mut c, &id).await;
    drop(netns);
    expect_ok(&id, res);
    g.assert_clean(&[id]);
}
