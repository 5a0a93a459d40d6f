//! containerd's Tasks API over gRPC with the test's own fifos, as containerd's Go client drives
//! it (`cio` fifos, `task.Exec` with a process spec, `CloseIO`), plus what the tests measure
//! about a shim (its threads, its socket).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::MountsRequest;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::*;
use containerd_client::types::Mount;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tonic::transport::Channel;

use crate::{SOCKET_DIR, address, prefix};

/// containerd's type URL of an OCI process spec (what its Go client puts in ExecProcessRequest).
pub const PROCESS_SPEC_TYPE: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";

/// Task options naming the runc binary (`containerd.runc.v1.Options{binary_name}`, field 6,
/// encoded by hand), as containerd's Go client sends its runtime's `BinaryName`.
pub fn runc_binary_options(binary: &Path) -> prost_types::Any {
    let name = binary.to_string_lossy().into_owned().into_bytes();
    let mut value = vec![0x32]; // field 6, length-delimited
    let mut len = name.len();
    while len >= 0x80 {
        value.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    value.push(len as u8);
    value.extend_from_slice(&name);
    prost_types::Any {
        type_url: "containerd.runc.v1.Options".into(),
        value,
    }
}

/// A request carrying the containerd namespace.
pub fn in_ns<T>(ns: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("containerd-namespace", ns.parse().unwrap());
    r
}

/// A gRPC channel to the bench's containerd.
pub async fn channel() -> Channel {
    containerd_client::connect(address())
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", address().display()))
}

/// The stdio paths of one process, as containerd's Tasks API takes them ("" = none).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

/// containerd's Tasks, Containers and Snapshots services in one namespace.
#[derive(Clone)]
pub struct TaskApi {
    pub ns: String,
    pub tasks: TasksClient<Channel>,
    pub containers: ContainersClient<Channel>,
    pub snapshots: SnapshotsClient<Channel>,
}

fn status_err(what: &str) -> impl FnOnce(tonic::Status) -> String + '_ {
    move |s| format!("{what}: {:?}: {}", s.code(), s.message())
}

impl TaskApi {
    pub async fn connect(ns: &str) -> TaskApi {
        let ch = channel().await;
        TaskApi {
            ns: ns.into(),
            tasks: TasksClient::new(ch.clone()),
            containers: ContainersClient::new(ch.clone()),
            snapshots: SnapshotsClient::new(ch),
        }
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        in_ns(&self.ns, msg)
    }

    /// The container record `id` (created e.g. by `ctr container create` or `ctr run`).
    pub async fn container(&mut self, id: &str) -> Result<Container, String> {
        let r = self
            .containers
            .get(self.req(GetContainerRequest { id: id.into() }))
            .await
            .map_err(status_err("Containers.Get"))?;
        r.into_inner()
            .container
            .ok_or_else(|| format!("container {id}: no record"))
    }

    /// Replaces the container's OCI spec (Containers.Update of `spec`).
    pub async fn set_spec(&mut self, id: &str, spec: &serde_json::Value) -> Result<(), String> {
        let mut c = self.container(id).await?;
        let any = c
            .spec
            .as_mut()
            .ok_or_else(|| format!("container {id} has no spec"))?;
        any.value = serde_json::to_vec(spec).unwrap();
        self.containers
            .update(self.req(UpdateContainerRequest {
                container: Some(c),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["spec".into()],
                }),
            }))
            .await
            .map_err(status_err("Containers.Update"))?;
        Ok(())
    }

    /// The container's OCI spec (JSON).
    pub async fn spec(&mut self, id: &str) -> Result<serde_json::Value, String> {
        let c = self.container(id).await?;
        let any = c
            .spec
            .ok_or_else(|| format!("container {id} has no spec"))?;
        serde_json::from_slice(&any.value).map_err(|e| format!("spec of {id}: {e}"))
    }

    /// The rootfs mounts of the container's snapshot, as the Go client's `NewTask` gets them.
    pub async fn rootfs(&mut self, id: &str) -> Result<Vec<Mount>, String> {
        let c = self.container(id).await?;
        let r = self
            .snapshots
            .mounts(self.req(MountsRequest {
                snapshotter: c.snapshotter,
                key: c.snapshot_key,
            }))
            .await
            .map_err(status_err("Snapshots.Mounts"))?;
        Ok(r.into_inner().mounts)
    }

    /// Tasks.Create of the container's init with `stdio`, its rootfs from the snapshotter.
    pub async fn create(
        &mut self,
        id: &str,
        io: &StdioPaths,
        terminal: bool,
    ) -> Result<u32, String> {
        self.create_with_options(id, io, terminal, None).await
    }

    /// [`TaskApi::create`] with task options (e.g. [`runc_binary_options`]).
    pub async fn create_with_options(
        &mut self,
        id: &str,
        io: &StdioPaths,
        terminal: bool,
        options: Option<prost_types::Any>,
    ) -> Result<u32, String> {
        let rootfs = self.rootfs(id).await?;
        let r = self
            .tasks
            .create(self.req(CreateTaskRequest {
                container_id: id.into(),
                rootfs,
                stdin: io.stdin.clone(),
                stdout: io.stdout.clone(),
                stderr: io.stderr.clone(),
                terminal,
                options,
                ..Default::default()
            }))
            .await
            .map_err(status_err("Tasks.Create"))?;
        Ok(r.into_inner().pid)
    }

    /// Tasks.Exec with `process` (an OCI process spec) and the request's own `terminal`.
    pub async fn exec(
        &mut self,
        id: &str,
        exec_id: &str,
        process: &serde_json::Value,
        io: &StdioPaths,
        terminal: bool,
    ) -> Result<(), String> {
        let spec = prost_types::Any {
            type_url: PROCESS_SPEC_TYPE.into(),
            value: serde_json::to_vec(process).unwrap(),
        };
        self.tasks
            .exec(self.req(ExecProcessRequest {
                container_id: id.into(),
                stdin: io.stdin.clone(),
                stdout: io.stdout.clone(),
                stderr: io.stderr.clone(),
                terminal,
                spec: Some(spec),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(status_err("Tasks.Exec"))?;
        Ok(())
    }

    /// Tasks.Start of the init (`exec_id` empty) or an exec. Returns the pid.
    pub async fn start(&mut self, id: &str, exec_id: &str) -> Result<u32, String> {
        let r = self
            .tasks
            .start(self.req(StartRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(status_err("Tasks.Start"))?;
        Ok(r.into_inner().pid)
    }

    /// Tasks.Wait; the exit status.
    pub async fn wait(&mut self, id: &str, exec_id: &str) -> Result<u32, String> {
        let r = self
            .tasks
            .wait(self.req(WaitRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(status_err("Tasks.Wait"))?;
        Ok(r.into_inner().exit_status)
    }

    /// Tasks.Kill.
    pub async fn kill(&mut self, id: &str, exec_id: &str, signal: u32) -> Result<(), String> {
        self.tasks
            .kill(self.req(KillRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
                signal,
                all: false,
            }))
            .await
            .map_err(status_err("Tasks.Kill"))?;
        Ok(())
    }

    /// Tasks.CloseIO of stdin.
    pub async fn close_stdin(&mut self, id: &str, exec_id: &str) -> Result<(), String> {
        self.tasks
            .close_io(self.req(CloseIoRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
                stdin: true,
            }))
            .await
            .map_err(status_err("Tasks.CloseIO"))?;
        Ok(())
    }

    /// Tasks.Get: the process (status, pid, exit).
    pub async fn get(
        &mut self,
        id: &str,
        exec_id: &str,
    ) -> Result<containerd_client::types::v1::Process, String> {
        let r = self
            .tasks
            .get(self.req(GetRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(status_err("Tasks.Get"))?;
        r.into_inner()
            .process
            .ok_or_else(|| format!("Tasks.Get {id} {exec_id}: no process"))
    }

    /// Tasks.DeleteProcess of an exec.
    pub async fn delete_exec(&mut self, id: &str, exec_id: &str) -> Result<u32, String> {
        let r = self
            .tasks
            .delete_process(self.req(DeleteProcessRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(status_err("Tasks.DeleteProcess"))?;
        Ok(r.into_inner().exit_status)
    }

    /// Tasks.Delete of the init.
    pub async fn delete(&mut self, id: &str) -> Result<u32, String> {
        let r = self
            .tasks
            .delete(self.req(DeleteTaskRequest {
                container_id: id.into(),
            }))
            .await
            .map_err(status_err("Tasks.Delete"))?;
        Ok(r.into_inner().exit_status)
    }
}

// --- fifos ----------------------------------------------------------------------------------

/// stdin/stdout/stderr fifos of one process in `dir`, made as containerd's `cio` makes them.
pub struct Fifos {
    pub stdin: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Fifos {
    /// `<dir>/<name>-{stdin,stdout,stderr}`, created with mode 0700.
    pub fn new(dir: &Path, name: &str) -> Fifos {
        let mk = |stream: &str| {
            let p = dir.join(format!("{name}-{stream}"));
            let _ = std::fs::remove_file(&p);
            nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o700))
                .unwrap_or_else(|e| panic!("mkfifo {}: {e}", p.display()));
            p
        };
        Fifos {
            stdin: mk("stdin"),
            stdout: mk("stdout"),
            stderr: mk("stderr"),
        }
    }

    /// The paths for the Tasks API; a terminal has no separate stderr (as `cio`).
    pub fn paths(&self, terminal: bool) -> StdioPaths {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        StdioPaths {
            stdin: s(&self.stdin),
            stdout: s(&self.stdout),
            stderr: if terminal {
                String::new()
            } else {
                s(&self.stderr)
            },
        }
    }
}

/// Opens the write end of a fifo whose reader is already open (the shim's), writes `data`
/// and closes it again: a client that attaches, types and detaches.
pub fn write_and_detach(fifo: &Path, data: &[u8]) -> io::Result<()> {
    // Non-blocking open: ENXIO (instead of hanging) if nobody holds the read end.
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(fifo)?;
    let flags = OFlag::from_bits_truncate(fcntl(f.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(f.as_fd(), FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    (&f).write_all(data)?;
    drop(f);
    Ok(())
}

/// Collects what arrives on an output fifo, on a thread of its own. The read end is opened
/// non-blocking before the process is created, as containerd's `cio` does, so the shim's open
/// of the write end never waits.
pub struct OutputReader {
    data: Arc<Mutex<Vec<u8>>>,
    eof: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl OutputReader {
    pub fn open(fifo: &Path) -> io::Result<OutputReader> {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(fifo)?;
        let data = Arc::new(Mutex::new(Vec::new()));
        let eof = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, e, s) = (data.clone(), eof.clone(), stop.clone());
        let thread = std::thread::spawn(move || read_fifo(f, &d, &e, &s));
        Ok(OutputReader {
            data,
            eof,
            stop,
            thread: Some(thread),
        })
    }

    /// What arrived so far.
    pub fn so_far(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }

    /// Waits until the output holds `needle` `times` times, at most `timeout`.
    pub fn wait_for(&self, needle: &str, times: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let text = String::from_utf8_lossy(&self.so_far()).into_owned();
            if text.matches(needle).count() >= times {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for end-of-file at most `timeout`; returns everything and whether EOF came.
    pub fn finish(mut self, timeout: Duration) -> (Vec<u8>, bool) {
        let deadline = Instant::now() + timeout;
        while !self.eof.load(Ordering::Relaxed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let data = std::mem::take(&mut *self.data.lock().unwrap());
        (data, self.eof.load(Ordering::Relaxed))
    }
}

impl Drop for OutputReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads `f` (non-blocking) until EOF after some writer was seen, or until `stop`.
fn read_fifo(mut f: File, data: &Mutex<Vec<u8>>, eof: &AtomicBool, stop: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut writer_seen = false;
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [nix::poll::PollFd::new(
            f.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u16));
        match f.read(&mut buf) {
            Ok(0) if writer_seen => {
                eof.store(true, Ordering::Relaxed);
                return;
            }
            // No writer has opened the fifo yet (a fifo without writers reads as EOF).
            Ok(0) => std::thread::sleep(Duration::from_millis(10)),
            Ok(n) => {
                writer_seen = true;
                data.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writer_seen = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

// --- the shim seen from outside -------------------------------------------------------------

/// Threads of process `pid` (`/proc/<pid>/task`); 0 if it is gone.
pub fn thread_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

/// Threads of process `pid` by name (`comm`), for messages about where threads went.
pub fn thread_names(pid: i32) -> std::collections::BTreeMap<String, usize> {
    let mut names = std::collections::BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            *names.entry(comm.trim().to_string()).or_insert(0) += 1;
        }
    }
    names
}

/// The ttrpc address (`unix:///run/containerd/s/...`) of the shim serving `id` in `ns`: from
/// its bundle (`bootstrap.json`, or the older `address` file), else from the listening socket
/// the shim process `pid` holds.
pub fn shim_address(ns: &str, id: &str, pid: i32) -> Option<String> {
    for kind in [
        "io.containerd.runtime.v2.task",
        "io.containerd.sandbox.controller.v1.shim",
    ] {
        let bundle = prefix().join("run/containerd").join(kind).join(ns).join(id);
        if let Ok(text) = std::fs::read_to_string(bundle.join("bootstrap.json"))
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let Some(a) = v["address"].as_str()
        {
            return Some(a.to_string());
        }
        if let Ok(a) = std::fs::read_to_string(bundle.join("address")) {
            return Some(a.trim().to_string());
        }
    }
    listening_socket_of(pid).map(|p| format!("unix://{p}"))
}

/// The path of a unix socket under [`SOCKET_DIR`] that process `pid` holds open.
fn listening_socket_of(pid: i32) -> Option<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_string)
        })
        .collect();
    // /proc/net/unix: "Num RefCount Protocol Flags Type St Inode Path"
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    table.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let (inode, path) = (cols.get(6)?, cols.get(7)?);
        (path.starts_with(SOCKET_DIR) && inodes.iter().any(|i| i == inode))
            .then(|| path.to_string())
    })
}
