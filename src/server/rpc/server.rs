//! Our ttrpc server: both services on one socket, threads only for work in flight.
//!
//! containerd opens one connection for the sandbox and one per container, and keeps a
//! blocking call (WaitSandbox, Task.Wait) open on most of them. The stock ttrpc server runs
//! three threads plus a worker pool per connection; here each connection has one small reader
//! thread and requests run on one shared pool that shrinks when idle. It grows at once up to a
//! few workers; beyond that a monitor adds one only when calls are queued, the queue has stood
//! still for a couple of milliseconds and every busy worker is blocked (inside a
//! [`crate::shim::blocking`] section: waiting for runc, a CNI plugin, a contended lifecycle lock).
//! Workers that merely wait for a CPU on a loaded machine are busy, not blocked: another
//! thread would only compete for the same CPU, so a burst of quick calls (containerd sends a
//! Connect before every Wait) costs no threads however slow the machine, and no call waits long
//! behind blocked ones. A wait nobody marked (a bug, a hung disk) still gets a worker, one per
//! [`STALLED_AFTER`] of a queue that does not move.
//!
//! Generated method tables (`create_task`, `create_sandbox`) plug in unchanged, under any
//! service name (the Task table is registered as both `containerd.task.v3.Task` and `v2`).
//! Unknown methods answer UNIMPLEMENTED, as Go's ttrpc does (containerd's v3→v2 downgrade keys
//! on it). Peers must be root or our own user.
//!
//! Calls that wait for a process to end (`Task.Wait`, `WaitSandbox`) are registered as
//! [`ParkedMethod`]s: the connection's reader runs the handler inline (it never blocks), which
//! parks a [`Responder`], so a Wait holds no thread however long the workload runs and can
//! never starve the calls queued behind it. Parked replies go to the connection's outbox, which
//! one pool job drains: the thread that reports an exit never writes to a socket, and ten
//! thousand replies at once cost one job, not ten thousand threads.
//!
//! Calls answered from memory (a non-verbose SandboxStatus, Platform, PingSandbox: CRI asks
//! for the sandbox's status at every container event, several times per CRI call) are
//! registered as [`InlineMethod`]s: the reader answers them itself when it can without waiting
//! (no lock another call holds, no system call but the reply's write), saving the hand-over to
//! a worker, a thread wake-up, per call; otherwise they go to the pool like any other call.
//!
//! A panicking handler answers INTERNAL (the panic hook logs where); a write that cannot make
//! progress for [`WRITE_TIMEOUT`] drops the connection rather than a worker.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use protobuf::MessageField;
use ttrpc::proto::{Codec, MESSAGE_LENGTH_MAX, MESSAGE_TYPE_REQUEST, MESSAGE_TYPE_RESPONSE};
use ttrpc::{Code, MessageHeader, MethodHandler, Request, Response, TtrpcContext};

use crate::shim::sync::{Lock, Wait};
use crate::shim::wire::{FrameError, encode_frame, read_frame};

type Methods = HashMap<String, Box<dyn MethodHandler + Send + Sync>>;

/// A method that may answer later: it gets the request payload and a [`Responder`], and must
/// return without blocking (answering now, or parking the responder).
pub trait ParkedMethod: Send + Sync {
    fn call(&self, payload: &[u8], reply: Responder);
}

/// A method the connection's reader may answer itself: see the module docs. It must never
/// wait (for a lock another call may hold, a process, the disk).
pub trait InlineMethod: Send + Sync {
    /// The reply's payload, or `None` when this request needs the pool (a verbose status, a
    /// lock that is taken, a request that does not decode): the generated handler registered
    /// under the same path then runs it on a worker, as if there were no fast path.
    fn answer(&self, payload: &[u8]) -> Option<ttrpc::Result<Vec<u8>>>;
}

impl<F: Fn(&[u8]) -> Option<ttrpc::Result<Vec<u8>>> + Send + Sync> InlineMethod for F {
    fn answer(&self, payload: &[u8]) -> Option<ttrpc::Result<Vec<u8>>> {
        self(payload)
    }
}

/// The most worker threads at once; more calls queue.
const MAX_WORKERS: usize = 256;
/// Up to this many workers, a call that finds every worker busy gets a new one at once.
const INSTANT_WORKERS: usize = 4;
/// Beyond [`INSTANT_WORKERS`], a new worker starts only when every busy worker is blocked and
/// the queue has not moved for this long (a blocking section that ends at once needs none).
const GROW_AFTER: Duration = Duration::from_millis(2);
/// A queue that has not moved for this long gets a worker even though not every busy worker
/// is in a blocking section (one blocked somewhere nobody marked): at most one a second.
const STALLED_AFTER: Duration = Duration::from_secs(1);
/// An idle worker beyond the first exits after this long.
const WORKER_IDLE: Duration = Duration::from_secs(10);
/// A reply that cannot be written for this long means a peer that stopped reading: the
/// connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// See the module docs.
pub struct Server {
    methods: Methods,
    parked: HashMap<String, Arc<dyn ParkedMethod>>,
    inline: HashMap<String, Arc<dyn InlineMethod>>,
    pool: Arc<Pool>,
    connections: Arc<Connections>,
    me: Weak<Server>,
}

/// How many connections are open, so that the daemon can leave the closing to its peers.
#[derive(Default)]
struct Connections {
    open: Mutex<usize>,
    changed: Condvar,
}

impl Connections {
    fn opened(&self) {
        *self.open.locked() += 1;
    }

    fn closed(&self) {
        let mut open = self.open.locked();
        *open = open.saturating_sub(1);
        self.changed.notify_all();
    }
}

struct Conn {
    fd: i32,
    writer: Mutex<UnixStream>,
    ctx: Arc<ttrpc::ConnectionContext>,
    /// Set when the peer closed or the connection was dropped: parked replies are discarded.
    closed: AtomicBool,
    /// Parked calls' replies waiting to be written.
    outbox: Mutex<Outbox>,
}

#[derive(Default)]
struct Outbox {
    frames: VecDeque<Vec<u8>>,
    /// A pool job is draining the outbox.
    draining: bool,
}

enum Job {
    /// A request to run.
    Call {
        conn: Arc<Conn>,
        header: MessageHeader,
        req: Request,
    },
    /// Write the connection's outbox.
    Drain(Arc<Conn>),
}

/// The answer to one parked call; see [`ParkedMethod`]. Cheap to keep (three words).
pub struct Responder {
    server: Weak<Server>,
    conn: Weak<Conn>,
    stream_id: u32,
}

impl Responder {
    /// Sends the answer (from any thread, without blocking on the socket).
    pub fn send<M: protobuf::Message>(self, result: ttrpc::Result<M>) {
        let res = response(result.and_then(|m| encode(&m)));
        let (Some(server), Some(conn)) = (self.server.upgrade(), self.conn.upgrade()) else {
            return; // the connection is gone: nobody to answer
        };
        if conn.closed.load(Ordering::Relaxed) {
            return;
        }
        let Ok(body) = res.encode() else { return };
        let frame = encode_frame(self.stream_id, MESSAGE_TYPE_RESPONSE, &body);
        let start_drain = {
            let mut outbox = conn.outbox.locked();
            outbox.frames.push_back(frame);
            !std::mem::replace(&mut outbox.draining, true)
        };
        if start_drain {
            server.pool.submit(&server, Job::Drain(conn));
        }
    }

    /// False once the client's connection is gone.
    pub fn is_listening(&self) -> bool {
        self.conn
            .upgrade()
            .is_some_and(|c| !c.closed.load(Ordering::Relaxed))
    }
}

/// A reply message's payload.
pub fn encode<M: protobuf::Message>(m: &M) -> ttrpc::Result<Vec<u8>> {
    m.write_to_bytes()
        .map_err(|e| ttrpc::Error::Others(format!("encode response: {e}")))
}

/// The ttrpc response carrying `result`: OK and the payload, or the error's status.
fn response(result: ttrpc::Result<Vec<u8>>) -> Response {
    match result {
        Ok(payload) => Response {
            status: MessageField::some(ttrpc::get_status(Code::OK, String::new())),
            payload,
            ..Default::default()
        },
        Err(ttrpc::Error::RpcStatus(s)) => Response {
            status: MessageField::some(s),
            ..Default::default()
        },
        Err(e) => Response {
            status: MessageField::some(ttrpc::get_status(Code::INTERNAL, format!("{e:?}"))),
            ..Default::default()
        },
    }
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
    in_flight: usize,
    /// Workers inside a blocking section ([`crate::shim::blocking`]).
    blocked: usize,
    /// When the queue last moved: a job queued on an empty queue, a job taken, a worker added.
    moved: Option<Instant>,
    /// The starvation monitor thread runs (see [`Pool::monitor`]).
    monitoring: bool,
}

struct Pool {
    state: Mutex<PoolState>,
    work: Condvar,
    done: Condvar,
    /// Wakes the starvation monitor: jobs are queued that no worker is free for.
    queued: Condvar,
}

impl Server {
    pub fn new() -> Arc<Self> {
        ServerBuilder::default().build()
    }

    fn with_methods(b: ServerBuilder) -> Arc<Self> {
        Arc::new_cyclic(|me| Server {
            methods: b.methods,
            parked: b.parked,
            inline: b.inline,
            pool: Arc::new(Pool {
                state: Mutex::default(),
                work: Condvar::new(),
                done: Condvar::new(),
                queued: Condvar::new(),
            }),
            connections: Arc::default(),
            me: me.clone(),
        })
    }
}

/// Collects method tables, then builds the [`Server`].
#[derive(Default)]
pub struct ServerBuilder {
    methods: Methods,
    parked: HashMap<String, Arc<dyn ParkedMethod>>,
    inline: HashMap<String, Arc<dyn InlineMethod>>,
}

impl ServerBuilder {
    /// Adds a generated method table (keys like `/pkg.Service/Method`).
    pub fn register(&mut self, methods: Methods) {
        self.methods.extend(methods);
    }

    /// Adds a method table under another service name: `/from/M` is served as `/to/M`.
    pub fn register_renamed(&mut self, methods: Methods, from: &str, to: &str) {
        let prefix = format!("/{from}/");
        for (k, v) in methods {
            let key = match k.strip_prefix(&prefix) {
                Some(m) => format!("/{to}/{m}"),
                None => k,
            };
            self.methods.insert(key, v);
        }
    }

    /// Serves `path` (`/pkg.Service/Method`) with a method that may answer later. It takes
    /// precedence over a generated handler of the same path.
    pub fn register_parked(&mut self, path: &str, method: Arc<dyn ParkedMethod>) {
        self.parked.insert(path.to_string(), method);
    }

    /// Lets the connection's reader answer `path` itself when `method` can (see
    /// [`InlineMethod`]); the method's generated handler must be registered too: it serves
    /// every request the fast path hands on.
    pub fn register_inline(&mut self, path: &str, method: Arc<dyn InlineMethod>) {
        self.inline.insert(path.to_string(), method);
    }

    /// The registered method paths (sorted), for tests and logs.
    pub fn method_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .methods
            .keys()
            .chain(self.parked.keys())
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn build(self) -> Arc<Server> {
        Server::with_methods(self)
    }
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl Server {
    /// Serves `listener` on a background accept thread. Returns a handle to wait for idleness.
    pub fn start(self: &Arc<Self>, listener: UnixListener) -> io::Result<ServerHandle> {
        let server = self.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                for stream in listener.incoming() {
                    match stream {
                        Ok(stream) => {
                            if let Err(e) = server.clone().accept(stream) {
                                log::warn!("ttrpc connection rejected: {e}");
                            }
                        }
                        Err(e) => {
                            log::warn!("ttrpc accept: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })?;
        Ok(ServerHandle {
            pool: self.pool.clone(),
            connections: self.connections.clone(),
        })
    }

    fn accept(self: Arc<Self>, stream: UnixStream) -> io::Result<()> {
        let cred =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .map_err(io::Error::from)?;
        let me = nix::unistd::geteuid().as_raw();
        if cred.uid() != 0 && cred.uid() != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("peer uid {} is not allowed", cred.uid()),
            ));
        }
        let writer = stream.try_clone()?;
        writer.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let conn = Arc::new(Conn {
            fd: stream.as_raw_fd(),
            writer: Mutex::new(writer),
            ctx: Arc::new(ttrpc::ConnectionContext::default()),
            closed: AtomicBool::new(false),
            outbox: Mutex::default(),
        });
        let connections = self.connections.clone();
        connections.opened();
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                let connections = self.connections.clone();
                self.read_loop(stream, conn);
                connections.closed();
            });
        if let Err(e) = spawned {
            connections.closed();
            return Err(e);
        }
        Ok(())
    }

    fn read_loop(self: Arc<Self>, mut stream: UnixStream, conn: Arc<Conn>) {
        loop {
            match read_frame(&mut stream) {
                Ok((header, payload)) => {
                    if header.type_ != MESSAGE_TYPE_REQUEST {
                        continue; // streams are not used by containerd's shim APIs
                    }
                    self.dispatch(&conn, header, &payload);
                }
                Err(FrameError::TooLong { stream_id, length }) => {
                    // Refused without reading the body, then the connection is dropped: we
                    // cannot resynchronise on a stream whose length we refuse to read.
                    respond_error(
                        &conn,
                        stream_id,
                        Code::RESOURCE_EXHAUSTED,
                        &format!(
                            "message length {length} exceeds the maximum {MESSAGE_LENGTH_MAX}"
                        ),
                    );
                    break;
                }
                Err(FrameError::Closed) => break,
            }
        }
        conn.closed.store(true, Ordering::Relaxed);
    }

    /// Decodes a request; parked methods run right here (they never block), the rest on the
    /// pool.
    fn dispatch(&self, conn: &Arc<Conn>, header: MessageHeader, payload: &[u8]) {
        let req = match <Request as Codec>::decode(payload) {
            Ok(r) => r,
            Err(e) => {
                respond_error(
                    conn,
                    header.stream_id,
                    Code::INVALID_ARGUMENT,
                    &format!("bad request: {e}"),
                );
                return;
            }
        };
        let path = format!("/{}/{}", req.service, req.method);
        if let Some(method) = self.parked.get(&path) {
            let reply = Responder {
                server: self.me.clone(),
                conn: Arc::downgrade(conn),
                stream_id: header.stream_id,
            };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| method.call(&req.payload, reply))) {
                respond_error(
                    conn,
                    header.stream_id,
                    Code::INTERNAL,
                    &format!("{path}: internal error: {}", panic_text(p.as_ref())),
                );
            }
            return;
        }
        if let Some(method) = self.inline.get(&path) {
            let started = Instant::now();
            match catch_unwind(AssertUnwindSafe(|| method.answer(&req.payload))) {
                Ok(Some(result)) => {
                    if let Ok(body) = response(result).encode() {
                        write_frame(
                            conn,
                            &encode_frame(header.stream_id, MESSAGE_TYPE_RESPONSE, &body),
                        );
                    }
                    log::debug!("{path} took {:?} (inline)", started.elapsed());
                    return;
                }
                Ok(None) => {} // the pool's worker runs it
                Err(p) => {
                    respond_error(
                        conn,
                        header.stream_id,
                        Code::INTERNAL,
                        &format!("{path}: internal error: {}", panic_text(p.as_ref())),
                    );
                    return;
                }
            }
        }
        let Some(server) = self.me.upgrade() else {
            return;
        };
        self.pool.submit(
            &server,
            Job::Call {
                conn: conn.clone(),
                header,
                req,
            },
        );
    }

    fn run(&self, job: Job) {
        match job {
            Job::Call { conn, header, req } => self.call(&conn, header, req),
            Job::Drain(conn) => drain(&conn),
        }
    }

    fn call(&self, conn: &Arc<Conn>, header: MessageHeader, req: Request) {
        let path = format!("/{}/{}", req.service, req.method);
        let started = Instant::now();
        // Each call gets its own reply channel: its reply is written by this worker before the
        // call counts as done (a shared channel let another worker take it, and the daemon could
        // exit after a Shutdown whose reply was still in that worker's hands).
        let (res_tx, res_rx) = mpsc::channel();
        if let Some(handler) = self.methods.get(&path) {
            let ctx = TtrpcContext {
                fd: conn.fd,
                cancel_rx: crossbeam_channel::never(),
                mh: header,
                res_tx,
                metadata: ttrpc::context::from_pb(&req.metadata),
                timeout_nano: req.timeout_nano,
                conn_ctx: conn.ctx.clone(),
            };
            match catch_unwind(AssertUnwindSafe(|| handler.handler(ctx, req))) {
                Ok(Ok(())) => {}
                // The generated handler answers every error of the method itself; what comes
                // back here failed before that (the request did not decode) or after it.
                Ok(Err(e)) => {
                    log::warn!("{path}: {e:?}");
                    respond_error(
                        conn,
                        header.stream_id,
                        Code::INVALID_ARGUMENT,
                        &format!("{path}: {e:?}"),
                    );
                }
                Err(p) => respond_error(
                    conn,
                    header.stream_id,
                    Code::INTERNAL,
                    &format!("{path}: internal error: {}", panic_text(p.as_ref())),
                ),
            }
        } else {
            respond_error(
                conn,
                header.stream_id,
                Code::UNIMPLEMENTED,
                &format!("{path} is not implemented"),
            );
        }
        for (header, body) in res_rx.try_iter() {
            write_frame(
                conn,
                &encode_frame(header.stream_id, MESSAGE_TYPE_RESPONSE, &body),
            );
        }
        log::debug!("{path} took {:?}", started.elapsed());
    }
}

/// Writes the outbox until it is empty.
fn drain(conn: &Conn) {
    loop {
        let frame = {
            let mut outbox = conn.outbox.locked();
            match outbox.frames.pop_front() {
                Some(f) => f,
                None => {
                    outbox.draining = false;
                    return;
                }
            }
        };
        write_frame(conn, &frame);
    }
}

/// Writes an error response for `stream_id`.
fn respond_error(conn: &Conn, stream_id: u32, code: Code, msg: &str) {
    let res = Response {
        status: MessageField::some(ttrpc::get_status(code, msg.to_string())),
        ..Default::default()
    };
    if let Ok(body) = res.encode() {
        write_frame(conn, &encode_frame(stream_id, MESSAGE_TYPE_RESPONSE, &body));
    }
}

/// Writes one frame; a peer that does not read for [`WRITE_TIMEOUT`] loses its connection.
fn write_frame(conn: &Conn, frame: &[u8]) {
    if conn.closed.load(Ordering::Relaxed) {
        return;
    }
    let mut w = conn.writer.locked();
    if let Err(e) = w.write_all(frame) {
        log::warn!("ttrpc write: {e}; dropping the connection");
        conn.closed.store(true, Ordering::Relaxed);
        let _ = w.shutdown(std::net::Shutdown::Both);
    }
}

/// Whether a new worker must start at once: every idle worker takes one queued job, so more
/// queued jobs than idle workers need another one. (A notified worker counts as idle until it
/// wakes, so spawning only when `idle == 0` strands the second job of a quick burst.) Beyond
/// [`INSTANT_WORKERS`] the monitor decides ([`starved`]): a burst of a thousand quick calls
/// (containerd sends a Connect before every Wait) must not leave hundreds of threads behind.
fn needs_worker(queued: usize, idle: usize, threads: usize) -> bool {
    queued > idle && threads < INSTANT_WORKERS
}

/// Whether queued jobs are starved, so that one more worker must start: more of them than
/// idle workers, and either every worker is blocked ([`all_blocked`]) and the queue has not
/// moved for [`GROW_AFTER`], or it has not moved for [`STALLED_AFTER`].
fn starved(
    queued: usize,
    idle: usize,
    threads: usize,
    blocked: usize,
    unmoved_for: Duration,
) -> bool {
    queued > idle
        && threads < MAX_WORKERS
        && ((all_blocked(idle, threads, blocked) && unmoved_for >= GROW_AFTER)
            || unmoved_for >= STALLED_AFTER)
}

/// Whether no worker can take a job before something outside the pool happens: every one is
/// inside a blocking section. A worker that is not (idle and notified but not yet running,
/// just started, or busy with a call) is running or waiting for a CPU: it will take the next
/// job, and another thread would only compete for the same CPU.
fn all_blocked(idle: usize, threads: usize, blocked: usize) -> bool {
    idle == 0 && blocked >= threads
}

impl Pool {
    fn submit(self: &Arc<Self>, server: &Arc<Server>, job: Job) {
        let mut st = self.state.locked();
        if st.jobs.is_empty() {
            st.moved = Some(Instant::now());
        }
        st.jobs.push_back(job);
        st.in_flight += 1;
        if needs_worker(st.jobs.len(), st.idle, st.threads) {
            self.add_worker(&mut st, server);
        } else if st.jobs.len() > st.idle {
            // Every worker is busy: the monitor adds one if none frees up soon.
            if !st.monitoring {
                let pool = self.clone();
                let server = server.clone();
                st.monitoring = std::thread::Builder::new()
                    .name("rpc-monitor".into())
                    .stack_size(128 * 1024)
                    .spawn(move || pool.monitor(server))
                    .is_ok();
            }
            self.queued.notify_one();
        }
        drop(st);
        self.work.notify_one();
    }

    fn add_worker(self: &Arc<Self>, st: &mut PoolState, server: &Arc<Server>) {
        st.threads += 1;
        let pool = self.clone();
        let server = server.clone();
        let spawned = std::thread::Builder::new()
            .name("rpc".into())
            .stack_size(512 * 1024)
            .spawn(move || pool.worker(server));
        if spawned.is_err() {
            st.threads -= 1;
            log::error!("cannot start an rpc worker thread");
        }
    }

    /// While jobs are queued, adds a worker whenever [`starved`] says so, so a call never waits
    /// long behind blocked ones; woken when a worker blocks; exits when nothing was queued for
    /// [`WORKER_IDLE`].
    fn monitor(self: Arc<Self>, server: Arc<Server>) {
        let mut st = self.state.locked();
        loop {
            if st.jobs.is_empty() {
                let (next, timeout) = self.queued.wait_on_timeout(st, WORKER_IDLE);
                st = next;
                if timeout.timed_out() && st.jobs.is_empty() {
                    st.monitoring = false;
                    return;
                }
                continue;
            }
            let unmoved_for = st.moved.map_or(Duration::ZERO, |m| m.elapsed());
            let wait = if starved(st.jobs.len(), st.idle, st.threads, st.blocked, unmoved_for) {
                self.add_worker(&mut st, &server);
                // The new worker gets its own GROW_AFTER to start and take a job.
                st.moved = Some(Instant::now());
                GROW_AFTER
            } else if all_blocked(st.idle, st.threads, st.blocked) {
                GROW_AFTER.saturating_sub(unmoved_for).max(GROW_AFTER / 4)
            } else {
                // Busy workers will take the jobs; a worker that blocks wakes us.
                STALLED_AFTER.saturating_sub(unmoved_for).max(GROW_AFTER)
            };
            st = self.queued.wait_on_timeout(st, wait).0;
        }
    }

    fn worker(self: Arc<Self>, server: Arc<Server>) {
        crate::shim::blocking::observe_this_thread(self.clone());
        loop {
            let job = {
                let mut st = self.state.locked();
                loop {
                    if let Some(job) = st.jobs.pop_front() {
                        st.moved = Some(Instant::now());
                        break job;
                    }
                    st.idle += 1;
                    let (next, timeout) = self.work.wait_on_timeout(st, WORKER_IDLE);
                    st = next;
                    st.idle -= 1;
                    if timeout.timed_out() && st.jobs.is_empty() && st.threads > 1 {
                        st.threads -= 1;
                        return;
                    }
                }
            };
            server.run(job);
            let mut st = self.state.locked();
            st.in_flight -= 1;
            if st.in_flight == 0 {
                self.done.notify_all();
            }
        }
    }
}

impl crate::shim::blocking::Observer for Pool {
    fn blocked(&self) {
        let mut st = self.state.locked();
        st.blocked += 1;
        if !st.jobs.is_empty() {
            self.queued.notify_one();
        }
    }

    fn unblocked(&self) {
        let mut st = self.state.locked();
        st.blocked = st.blocked.saturating_sub(1);
    }
}

/// Lets the daemon wait for in-flight calls (e.g. the Shutdown reply) and for its peers to
/// hang up before it exits.
pub struct ServerHandle {
    pool: Arc<Pool>,
    connections: Arc<Connections>,
}

impl ServerHandle {
    /// Waits until no call is in flight except `except` (the caller's own), at most `timeout`.
    /// Parked calls are not in flight.
    pub fn wait_idle(&self, except: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.pool.state.locked();
        while st.in_flight > except {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.pool.done.wait_on_timeout(st, left).0;
        }
        true
    }

    /// Waits until every peer has closed its connection, at most `timeout`.
    ///
    /// A daemon that exits right after writing its last reply races Go's ttrpc client (1.2):
    /// when the reply and the end of the connection arrive together, the waiting call picks
    /// one of them at random and may fail with "ttrpc: closed" although its answer arrived
    /// (RemovePodSandbox failed that way under load). containerd closes its connection as
    /// soon as it has the ShutdownSandbox (or Shutdown) reply, so leaving the closing to it
    /// costs nothing.
    pub fn wait_disconnected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut open = self.connections.open.locked();
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            open = self.connections.changed.wait_on_timeout(open, left).0;
        }
        true
    }

    /// Worker threads alive now (tests, diagnostics).
    pub fn workers(&self) -> usize {
        self.pool.state.locked().threads
    }
}

#[cfg(test)]
mod tests;
