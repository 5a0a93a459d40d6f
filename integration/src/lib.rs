//! Harness of the rsandbox integration tests: the hack/ bench's real containerd 2.1.9, driven
//! through `ctr` and through CRI (`runtime.v1` over containerd's gRPC socket).
//!
//! Environment (exported by `hack/test.sh`, or `eval "$(hack/containerd.sh env)"`):
//! `CONTAINERD_ADDRESS` (default `$RSANDBOX_PREFIX/run/containerd.sock`), `RSANDBOX_PREFIX`
//! (default `/opt/rsandbox`), `PATH` holding `ctr` (else `$RSANDBOX_PREFIX/usr/bin/ctr`).
//!
//! Every test takes a [`Guard`] first (its baseline of shim processes and sockets) and calls
//! [`Guard::assert_clean`] at the end with every ID it used: no shim process, mount, runc
//! state, cgroup or extra socket may be left.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use k8s_cri::v1 as cri;

pub mod controller;
pub mod events;
pub mod images;
pub mod pods;
pub mod pty;
pub mod shim;
pub mod skip;
pub mod tasks;

/// Name of our shim binary.
pub const SHIM: &str = "containerd-shim-rsandbox-v1";
/// `argv[0]` of a pause process: the shim executes its pause program (from a sealed memfd,
/// `/proc/<pid>/exe` is `/memfd:rsandbox-pause (deleted)`) as `rsandbox-pause <pod id>`.
pub const PAUSE_ARGV0: &str = "rsandbox-pause";
/// Runtime type for `ctr run --runtime`.
pub const RUNTIME: &str = "io.containerd.rsandbox.v1";
/// CRI runtime handler of the shim sandboxer.
pub const HANDLER: &str = "rsandbox";
/// The CRI handler of containerd's podsandbox + runc path on the bench (the same probes run
/// against it to show both paths agree).
pub const RUNC_HANDLER: &str = "runc";

/// `ensure!(cond, "fmt", ...)`: in a test body returning `Result<_, String>`, fails with the
/// message prefixed by the file and line when `cond` is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($fmt)+)));
        }
    };
}
/// The bench's busybox image (namespaces `default` and `k8s.io`).
pub const BUSYBOX: &str = "localhost/busybox:latest";
/// Where containerd's shim code puts shim sockets (hard-coded).
pub const SOCKET_DIR: &str = "/run/containerd/s";
/// A deadline that only catches a hang (a call that never answers, a process that never
/// stops). Tests never bound how long a step takes: the machine may be busy or shared;
/// latency is the benchmark's (hack/bench.sh), or compared with the runc handler in the
/// same test.
pub const HANG: Duration = Duration::from_secs(30);
/// The containerd namespaces the tests use (CRI's, `ctr`'s default, the handshake tests').
pub const NAMESPACES: [&str; 3] = ["default", "k8s.io", "rsandbox-it"];

pub fn prefix() -> PathBuf {
    PathBuf::from(std::env::var("RSANDBOX_PREFIX").unwrap_or_else(|_| "/opt/rsandbox".into()))
}

pub fn address() -> PathBuf {
    match std::env::var("CONTAINERD_ADDRESS") {
        Ok(a) if !a.is_empty() => PathBuf::from(a.trim_start_matches("unix://")),
        _ => prefix().join("run/containerd.sock"),
    }
}

/// The `ctr` binary: from PATH if it is there, else the bench's.
pub fn ctr_bin() -> PathBuf {
    let bench = prefix().join("usr/bin/ctr");
    if bench.exists() {
        return bench;
    }
    PathBuf::from("ctr")
}

pub fn containerd_log() -> PathBuf {
    prefix().join("log/containerd.log")
}

/// The last `n` lines of containerd's log that mention `needle` (for failure messages).
pub fn log_lines(needle: &str, n: usize) -> String {
    let text = fs::read_to_string(containerd_log()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Fails the test with `res`'s error and the containerd log lines that mention `id`.
pub fn expect_ok<E: std::fmt::Display>(id: &str, res: Result<(), E>) {
    if let Err(e) = res {
        panic!("{e}\n--- containerd log ---\n{}", log_lines(id, 20));
    }
}

/// A unique ID for this test: `it-<name>-<pid>`, lower case.
pub fn unique_id(name: &str) -> String {
    format!("it-{}-{}", name.replace('_', "-"), std::process::id())
}

/// Output of a command, as strings.
#[derive(Debug, Clone)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    #[track_caller]
    pub fn expect_ok(&self, what: &str) -> &Self {
        assert!(self.ok(), "{what}: {self:?}");
        self
    }
}

impl From<Output> for Out {
    fn from(o: Output) -> Self {
        Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// A `ctr` command for namespace `ns`, talking to the bench's containerd.
pub fn ctr_cmd(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new(ctr_bin());
    c.arg("--address").arg(address()).arg("--namespace").arg(ns);
    c.args(args);
    c.stdin(Stdio::null());
    c
}

/// Runs `ctr` in `ns` with a timeout; stdin is empty.
pub fn ctr(ns: &str, args: &[&str]) -> Out {
    run_timeout(ctr_cmd(ns, args), None, Duration::from_secs(60))
}

/// Runs `ctr` in `ns` with `input` on its stdin.
pub fn ctr_input(ns: &str, args: &[&str], input: &[u8]) -> Out {
    run_timeout(ctr_cmd(ns, args), Some(input), Duration::from_secs(60))
}

/// Runs a command to completion, killing it after `timeout` (then the test fails).
#[track_caller]
pub fn run_timeout(mut cmd: Command, input: Option<&[u8]>, timeout: Duration) -> Out {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let desc = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {desc}: {e}"));
    if let Some(input) = input {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let out = read_child(child, timeout);
    match out {
        Some(o) => o,
        None => panic!("{desc}: still running after {timeout:?} (killed)"),
    }
}

fn read_child(mut child: Child, timeout: Duration) -> Option<Out> {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = status?;
    Some(Out {
        code: status.code(),
        stdout: String::from_utf8_lossy(&t1.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t2.join().unwrap()).into_owned(),
    })
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes `ctr` objects of its IDs when dropped, so a failing test cleans up too.
pub struct CtrObjects {
    pub ns: &'static str,
    pub ids: Vec<String>,
}

impl Drop for CtrObjects {
    fn drop(&mut self) {
        ctr_force_remove(self.ns, &self.ids);
    }
}

/// Removes `ctr` objects of `ids` in `ns` whatever their state (test clean-up; errors ignored).
pub fn ctr_force_remove(ns: &str, ids: &[String]) {
    for id in ids {
        let _ = ctr(ns, &["task", "kill", "-s", "SIGKILL", id]);
    }
    for id in ids {
        let _ = poll(Duration::from_secs(5), || {
            let o = ctr(ns, &["task", "delete", "-f", id]);
            (o.ok() || o.stderr.contains("not found")).then_some(())
        });
        let _ = ctr(ns, &["container", "delete", id]);
        let _ = ctr(ns, &["snapshot", "rm", id]);
    }
}

// --- processes ------------------------------------------------------------------------------

/// A process seen in /proc.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// NULs replaced by blanks, trailing blanks removed.
    pub cmdline: String,
    pub cwd: String,
    pub exe: String,
}

impl Proc {
    /// A pause process.
    pub fn is_pause(&self) -> bool {
        self.cmdline.split(' ').next() == Some(PAUSE_ARGV0)
    }
}

/// All shim and pause processes that serve the bench's containerd: shims started with `-address <its socket>` (another
/// containerd on the machine may run shims of its own), and pause processes whose parent is
/// one of those.
pub fn shim_procs() -> Vec<Proc> {
    shim_procs_at(&address())
}

/// [`shim_procs`] of the containerd serving `socket` (a node shape's own, e.g. k3s').
pub fn shim_procs_at(socket: &Path) -> Vec<Proc> {
    let addr = format!(" -address {} ", socket.display());
    let all = all_shim_procs();
    let shims: BTreeSet<i32> = all
        .iter()
        .filter(|p| format!("{} ", p.cmdline).contains(&addr))
        .map(|p| p.pid)
        .collect();
    all.into_iter()
        .filter(|p| shims.contains(&p.pid) || (p.is_pause() && shims.contains(&p.ppid)))
        .collect()
}

/// Pause processes (of any shim) of the pod `id`: command line `rsandbox-pause <id>`.
pub fn pause_procs_of(id: &str) -> Vec<Proc> {
    all_shim_procs()
        .into_iter()
        .filter(|p| p.is_pause() && p.cmdline.split(' ').nth(1) == Some(id))
        .collect()
}

/// All processes whose executable is our shim, and all pause processes (`rsandbox-pause <id>`
/// run from the shim's memfd), whoever started them.
pub fn all_shim_procs() -> Vec<Proc> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let d = e.path();
        let exe = fs::read_link(d.join("exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cmdline = fs::read(d.join("cmdline"))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .trim_end()
                    .to_string()
            })
            .unwrap_or_default();
        let first = cmdline.split(' ').next().unwrap_or("");
        let is_shim = exe.trim_end_matches(" (deleted)").ends_with(SHIM)
            || first.ends_with(SHIM)
            || first == PAUSE_ARGV0;
        if !is_shim {
            continue;
        }
        let cwd = fs::read_link(d.join("cwd"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold blanks
        let stat = fs::read_to_string(d.join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        v.push(Proc {
            pid,
            ppid,
            cmdline,
            cwd,
            exe,
        });
    }
    v
}

/// Shim processes that belong to `id` (their cwd is its bundle, or their command line names
/// it), and its pause processes, even orphaned ones.
pub fn shim_procs_of(id: &str) -> Vec<Proc> {
    let mut v: Vec<Proc> = shim_procs()
        .into_iter()
        .filter(|p| p.cwd.ends_with(&format!("/{id}")) || p.cmdline.split(' ').any(|w| w == id))
        .collect();
    for p in pause_procs_of(id) {
        if !v.iter().any(|q| q.pid == p.pid) {
            v.push(p);
        }
    }
    v
}

/// The socket a shim (ours or containerd's runc shim) of the bench's containerd serves for
/// `id` (a task, or a pod's group) in `ns`: `<SOCKET_DIR>/<sha256(address/ns/id)>`, as
/// src/shim/socket.rs and containerd name it. Another containerd on the machine (a Kubernetes test
/// beside ours) names its shims' sockets after its own address: they are never ours.
pub fn shim_socket(ns: &str, id: &str) -> PathBuf {
    let input = address().join(ns).join(id);
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("piped stdin")
                .write_all(input.as_os_str().as_encoded_bytes())?;
            c.wait_with_output()
        })
        .unwrap_or_else(|e| panic!("sha256sum: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.split_whitespace().next().unwrap_or_default();
    assert_eq!(hex.len(), 64, "sha256sum printed {text:?}");
    Path::new(SOCKET_DIR).join(hex)
}

/// Shim sockets of `ids` (in any of [`NAMESPACES`]) that exist.
fn sockets_of(ids: &[String]) -> Vec<PathBuf> {
    ids.iter()
        .flat_map(|id| NAMESPACES.iter().map(move |ns| shim_socket(ns, id)))
        .filter(|p| fs::symlink_metadata(p).is_ok())
        .collect()
}

fn list_dir(d: &Path) -> BTreeSet<String> {
    fs::read_dir(d)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// CRI's netns files (the bench mounts them under containerd's state dir) and /run/netns.
fn netns_files() -> BTreeSet<String> {
    let mut s = list_dir(&prefix().join("run/containerd/io.containerd.grpc.v1.cri/netns"));
    s.extend(list_dir(Path::new("/run/netns")));
    // Shim-owned network namespaces (netns_dir of the shim's config).
    s.extend(list_dir(&prefix().join("run/netns")));
    s
}

/// libcni-style result cache entries of the shim-owned networks.
pub fn cni_cache_entries() -> BTreeSet<String> {
    list_dir(&prefix().join("var/lib/cni/results"))
}

/// Network interfaces attached to the bridges of the bench (pod veths).
pub fn bridge_ports() -> BTreeSet<String> {
    let out = Command::new("ip").args(["-o", "link", "show"]).output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(" master rsandbox"))
        .filter_map(|l| {
            l.split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap_or(n).to_string())
        })
        .collect()
}

/// host-local IP leases of the bench's CNI network.
fn ip_leases() -> BTreeSet<String> {
    let mut s = list_dir(&prefix().join("var/lib/cni/networks/rsandbox"));
    // The network of shim-owned pods (hack/lib.sh: rsandbox-shim).
    s.extend(list_dir(
        &prefix().join("var/lib/cni/networks/rsandbox-shim"),
    ));
    s.into_iter()
        .filter(|f| !f.contains("last_reserved_ip") && !f.ends_with("/lock"))
        .collect()
}

/// Shim daemons (not their pause processes) started with `-id <id>`.
pub fn shim_daemons_for(id: &str) -> Vec<Proc> {
    shim_daemons_at(&address(), id)
}

/// [`shim_daemons_for`] of the containerd serving `socket`.
pub fn shim_daemons_at(socket: &Path, id: &str) -> Vec<Proc> {
    let procs = shim_procs_at(socket);
    let pids: BTreeSet<i32> = procs.iter().map(|p| p.pid).collect();
    procs
        .into_iter()
        .filter(|p| {
            !pids.contains(&p.ppid) && format!("{} ", p.cmdline).contains(&format!(" -id {id} "))
        })
        .collect()
}

// --- leftover checks ------------------------------------------------------------------------

static SERIAL: Mutex<()> = Mutex::new(());

/// A test's baseline, taken at its start; tests in one binary are serialised through it (the
/// leftover checks count machine-wide objects). Everything counted is of the bench's
/// containerd: shims started with its address, sockets named after it, its state directory,
/// the bench's networks, objects named by the test's (unique) IDs; never what another
/// containerd on the machine makes meanwhile.
pub struct Guard {
    _serial: MutexGuard<'static, ()>,
    shims: usize,
    netns: BTreeSet<String>,
    leases: BTreeSet<String>,
    cni_cache: BTreeSet<String>,
    ports: BTreeSet<String>,
}

impl Guard {
    pub fn new() -> Guard {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        Guard {
            _serial: serial,
            shims: shim_procs().len(),
            netns: netns_files(),
            leases: ip_leases(),
            cni_cache: cni_cache_entries(),
            ports: bridge_ports(),
        }
    }

    /// What is left of `ids` (and beyond the baseline); empty when clean.
    pub fn leftovers(&self, ids: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        for id in ids {
            for p in shim_procs_of(id) {
                found.push(format!("shim process of {id}: {p:?}"));
            }
        }
        let procs = shim_procs();
        if procs.len() > self.shims {
            found.push(format!(
                "{} shim processes, {} before the test: {procs:?}",
                procs.len(),
                self.shims
            ));
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for l in mountinfo.lines() {
            if ids.iter().any(|id| l.contains(id.as_str())) {
                found.push(format!("mount: {l}"));
            }
        }
        for ns in NAMESPACES {
            for id in ids {
                let d = Path::new("/run/containerd/runc").join(ns).join(id);
                if d.exists() {
                    found.push(format!("runc state {}", d.display()));
                }
                for kind in [
                    "io.containerd.runtime.v2.task",
                    "io.containerd.sandbox.controller.v1.shim",
                ] {
                    let b = prefix().join("run/containerd").join(kind).join(ns).join(id);
                    if b.exists() {
                        found.push(format!("bundle {}", b.display()));
                    }
                }
            }
        }
        for s in sockets_of(ids) {
            found.push(format!("shim socket {}", s.display()));
        }
        let now = netns_files();
        let extra: Vec<_> = now.difference(&self.netns).collect();
        if !extra.is_empty() {
            found.push(format!("new netns files: {extra:?}"));
        }
        let now = ip_leases();
        let extra: Vec<_> = now.difference(&self.leases).collect();
        if !extra.is_empty() {
            found.push(format!("new IP leases: {extra:?}"));
        }
        let now = cni_cache_entries();
        let extra: Vec<_> = now.difference(&self.cni_cache).collect();
        if !extra.is_empty() {
            found.push(format!("new CNI cache entries: {extra:?}"));
        }
        let now = bridge_ports();
        let extra: Vec<_> = now.difference(&self.ports).collect();
        if !extra.is_empty() {
            found.push(format!("new bridge ports (veths): {extra:?}"));
        }
        for c in cgroups_named(ids) {
            found.push(format!("cgroup {}", c.display()));
        }
        found
    }

    /// Asserts, polling up to 15 s (containerd deletes shims asynchronously), that nothing of
    /// `ids` is left.
    #[track_caller]
    pub fn assert_clean(&self, ids: &[String]) {
        let mut last = Vec::new();
        let ok = poll(Duration::from_secs(15), || {
            last = self.leftovers(ids);
            last.is_empty().then_some(())
        });
        assert!(ok.is_some(), "leftovers of {ids:?}:\n{}", last.join("\n"));
    }
}

impl Default for Guard {
    fn default() -> Self {
        Self::new()
    }
}

/// cgroup directories (cgroup v2 or any v1 hierarchy, 6 levels deep) whose name contains one
/// of `ids`.
pub fn cgroups_named(ids: &[String]) -> Vec<PathBuf> {
    fn walk(d: &Path, depth: usize, ids: &[String], out: &mut Vec<PathBuf>) {
        if depth == 0 {
            return;
        }
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if ids.iter().any(|id| name.contains(id.as_str())) {
                out.push(e.path());
            }
            walk(&e.path(), depth - 1, ids, out);
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), 6, ids, &mut out);
    out
}

// --- CRI ------------------------------------------------------------------------------------

pub type Runtime = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;
pub type Images = cri::image_service_client::ImageServiceClient<tonic::transport::Channel>;

/// CRI clients on the bench's containerd socket.
pub async fn cri_clients() -> (Runtime, Images) {
    cri_clients_at(&address())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// CRI clients of the containerd serving `socket` (a node shape's own, e.g. k3s').
pub async fn cri_clients_at(socket: &Path) -> Result<(Runtime, Images), String> {
    let ch = containerd_client::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    Ok((Runtime::new(ch.clone()), Images::new(ch)))
}

/// Directory for CRI logs etc. of one test, emptied.
pub fn scratch_dir(id: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rsandbox-{id}"));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}
