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
mod tests {
    use super::*;
    use containerd_shim_protos::api::{ConnectRequest, ConnectResponse};
    use containerd_shim_protos::shim_sync::{Task, TaskClient, create_task};

    // More than the instant workers: the monitor must add the rest.
    const RENDEZVOUS: usize = 2 * INSTANT_WORKERS;
    static ARRIVED: std::sync::LazyLock<(Mutex<usize>, Condvar)> =
        std::sync::LazyLock::new(|| (Mutex::new(0), Condvar::new()));
    /// Only catches a hang: no test here bounds how long a call takes.
    const HANG: Duration = Duration::from_secs(60);

    /// A gate that calls with id `hold:<name>` (in a blocking section) or `unmarked:<name>`
    /// (blocked where nobody marked it) wait at until the test opens it.
    #[derive(Default)]
    struct Gate {
        state: Mutex<(usize, bool)>, // (callers inside, open)
        changed: Condvar,
    }
    static GATES: std::sync::LazyLock<Mutex<HashMap<String, Arc<Gate>>>> =
        std::sync::LazyLock::new(Mutex::default);

    fn gate(name: &str) -> Arc<Gate> {
        GATES
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    impl Gate {
        fn pass(&self) -> bool {
            let mut st = self.state.lock().unwrap();
            st.0 += 1;
            self.changed.notify_all();
            let (st, timeout) = self
                .changed
                .wait_timeout_while(st, HANG, |st| !st.1)
                .unwrap();
            drop(st);
            !timeout.timed_out()
        }
        /// Waits until `n` callers are inside.
        fn await_inside(&self, n: usize) {
            let st = self.state.lock().unwrap();
            let (st, timeout) = self
                .changed
                .wait_timeout_while(st, HANG, |st| st.0 < n)
                .unwrap();
            assert!(!timeout.timed_out(), "only {} of {n} calls arrived", st.0);
        }
        fn open(&self) {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
        }
    }

    struct Echo;
    impl Task for Echo {
        fn connect(
            &self,
            _ctx: &TtrpcContext,
            req: ConnectRequest,
        ) -> ttrpc::Result<ConnectResponse> {
            if let Some(name) = req.id.strip_prefix("hold:") {
                // Blocked as a runc call is: inside a blocking section.
                let _blocked = crate::shim::blocking::blocking();
                if !gate(name).pass() {
                    return Err(ttrpc::Error::Others(format!("gate {name} never opened")));
                }
            }
            if let Some(name) = req.id.strip_prefix("unmarked:")
                && !gate(name).pass()
            {
                return Err(ttrpc::Error::Others(format!("gate {name} never opened")));
            }
            if req.id == "panic" {
                panic!("handler bug for {}", req.id);
            }
            if req.id == "rendezvous" {
                // Returns only once RENDEZVOUS calls are inside a handler at the same time.
                let _blocked = crate::shim::blocking::blocking();
                let (lock, cond) = &*ARRIVED;
                let mut n = lock.lock().unwrap();
                *n += 1;
                cond.notify_all();
                let (n, timeout) = cond
                    .wait_timeout_while(n, HANG, |n| *n < RENDEZVOUS)
                    .unwrap();
                if timeout.timed_out() {
                    return Err(ttrpc::Error::Others(format!(
                        "only {} calls ran at once",
                        *n
                    )));
                }
            }
            Ok(ConnectResponse {
                shim_pid: 7,
                version: req.id,
                ..Default::default()
            })
        }
    }

    /// Parks every call with id "park" until `release` is called; answers others at once.
    #[derive(Default)]
    struct Parker {
        parked: Mutex<Vec<Responder>>,
    }
    impl ParkedMethod for Parker {
        fn call(&self, payload: &[u8], reply: Responder) {
            let req: ConnectRequest = match protobuf::Message::parse_from_bytes(payload) {
                Ok(r) => r,
                Err(e) => {
                    return reply.send::<ConnectResponse>(Err(ttrpc::Error::Others(e.to_string())));
                }
            };
            match req.id.as_str() {
                "park" => self.parked.lock().unwrap().push(reply),
                "panic" => panic!("parked handler bug"),
                other => reply.send(Ok(ConnectResponse {
                    version: other.into(),
                    ..Default::default()
                })),
            }
        }
    }
    impl Parker {
        fn release(&self) -> usize {
            let all: Vec<_> = std::mem::take(&mut *self.parked.lock().unwrap());
            let n = all.len();
            for r in all {
                r.send(Ok(ConnectResponse {
                    version: "released".into(),
                    ..Default::default()
                }));
            }
            n
        }
    }

    const PARKED_PATH: &str = "/containerd.task.v3.Task/Wait";

    fn serve_with(dir: &std::path::Path, parker: Option<Arc<Parker>>) -> (String, ServerHandle) {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut b = ServerBuilder::default();
        b.register(create_task(Arc::new(Echo)));
        b.register_renamed(
            create_task(Arc::new(Echo)),
            "containerd.task.v3.Task",
            "containerd.task.v2.Task",
        );
        if let Some(p) = parker {
            b.register_parked(PARKED_PATH, p);
        }
        let handle = b.build().start(listener).unwrap();
        (format!("unix://{}", path.display()), handle)
    }

    /// One Connect call; [`Echo`] answers with `version` = `id` (`hold:<gate>` once the gate
    /// opens).
    fn connect(task: &TaskClient, id: &str) -> ttrpc::Result<ConnectResponse> {
        task.connect(
            ttrpc::context::with_timeout(HANG.as_nanos() as i64),
            &ConnectRequest {
                id: id.into(),
                ..Default::default()
            },
        )
    }

    fn serve(dir: &std::path::Path) -> String {
        serve_with(dir, None).0
    }

    /// A server with [`Echo`] and whatever `extra` adds; its address.
    fn serve_custom(dir: &std::path::Path, extra: impl FnOnce(&mut ServerBuilder)) -> String {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut b = ServerBuilder::default();
        b.register(create_task(Arc::new(Echo)));
        extra(&mut b);
        b.build().start(listener).unwrap();
        format!("unix://{}", path.display())
    }

    /// Connect answered on the reader thread for ids `inline:*` (version: the thread's name),
    /// an error for `inline-err`, a panic for `inline-panic`; anything else goes to the pool.
    fn inline_connect(payload: &[u8]) -> Option<ttrpc::Result<Vec<u8>>> {
        let req: ConnectRequest = protobuf::Message::parse_from_bytes(payload).ok()?;
        match req.id.as_str() {
            "inline-err" => Some(Err(
                crate::records::error::Error::not_found("no such task").into()
            )),
            "inline-panic" => panic!("inline bug"),
            id if id.starts_with("inline:") => Some(encode(&ConnectResponse {
                version: std::thread::current().name().unwrap_or("").into(),
                ..Default::default()
            })),
            _ => None,
        }
    }

    #[test]
    fn an_inline_method_answers_on_the_reader_or_hands_the_call_to_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let addr = serve_custom(dir.path(), |b| {
            b.register_inline("/containerd.task.v3.Task/Connect", Arc::new(inline_connect))
        });
        let task = TaskClient::new(ttrpc::Client::connect(&addr).unwrap());
        // answered by the connection's reader thread, not a worker
        assert_eq!(connect(&task, "inline:1").unwrap().version, "conn");
        // handed on: the generated handler (Echo) answers, as without a fast path
        assert_eq!(connect(&task, "pool").unwrap().version, "pool");
        match connect(&task, "inline-err") {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), Code::NOT_FOUND);
                assert_eq!(s.message, "no such task");
            }
            other => panic!("{other:?}"),
        }
        match connect(&task, "inline-panic") {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), Code::INTERNAL);
                assert!(s.message.contains("inline bug"), "{}", s.message);
            }
            other => panic!("{other:?}"),
        }
        // the connection still serves both ways after the panic
        assert_eq!(connect(&task, "inline:2").unwrap().version, "conn");
        assert_eq!(connect(&task, "again").unwrap().version, "again");
    }

    fn raw_call(client: &ttrpc::Client, path: &str, id: &str) -> ttrpc::Result<ConnectResponse> {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap();
        let req = Request {
            service: service.into(),
            method: method.into(),
            payload: protobuf::Message::write_to_bytes(&ConnectRequest {
                id: id.into(),
                ..Default::default()
            })
            .unwrap(),
            ..Default::default()
        };
        let res = client.request(req)?;
        Ok(protobuf::Message::parse_from_bytes(&res.payload).unwrap())
    }

    #[test]
    fn the_daemon_can_wait_for_its_peers_to_hang_up() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, handle) = serve_with(dir.path(), None);
        assert!(handle.wait_disconnected(Duration::ZERO), "no peer yet");
        let mut a = UnixStream::connect(addr.trim_start_matches("unix://")).unwrap();
        let b = UnixStream::connect(addr.trim_start_matches("unix://")).unwrap();
        // A call answered on `a`: the peer has its reply and still holds the connection.
        a.write_all(&request_frame(1, "Connect", "x")).unwrap();
        let (h, _) = crate::shim::wire::read_frame(&mut a).unwrap();
        assert_eq!(h.stream_id, 1);
        assert!(!handle.wait_disconnected(Duration::from_millis(50)));
        drop(a);
        assert!(
            !handle.wait_disconnected(Duration::from_millis(50)),
            "b is open"
        );
        drop(b);
        assert!(handle.wait_disconnected(Duration::from_secs(10)));
    }

    #[test]
    fn both_service_names_answer_and_unknown_is_unimplemented() {
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let client = ttrpc::Client::connect(&addr).unwrap();
        let task = TaskClient::new(client.clone());
        let r = connect(&task, "a").unwrap();
        assert_eq!((r.shim_pid, r.version.as_str()), (7, "a"));

        // The same method under the v2 service name, through a raw request.
        let req = Request {
            service: "containerd.task.v2.Task".into(),
            method: "Connect".into(),
            payload: protobuf::Message::write_to_bytes(&ConnectRequest {
                id: "b".into(),
                ..Default::default()
            })
            .unwrap(),
            ..Default::default()
        };
        let res = client.request(req).unwrap();
        let r: ConnectResponse = protobuf::Message::parse_from_bytes(&res.payload).unwrap();
        assert_eq!(r.version, "b");

        let req = Request {
            service: "containerd.task.v9.Task".into(),
            method: "Connect".into(),
            ..Default::default()
        };
        match client.request(req) {
            Err(ttrpc::Error::RpcStatus(s)) => assert_eq!(s.code(), Code::UNIMPLEMENTED),
            other => panic!("expected UNIMPLEMENTED, got {other:?}"),
        }
    }

    #[test]
    fn a_slow_call_does_not_block_others_on_the_same_connection() {
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let task = TaskClient::new(ttrpc::Client::connect(&addr).unwrap());
        let t2 = task.clone();
        let slow = std::thread::spawn(move || connect(&t2, "hold:same-conn").unwrap());
        gate("same-conn").await_inside(1);
        // Answered while the slow call still waits for its gate.
        let r = connect(&task, "fast").unwrap();
        assert_eq!(r.version, "fast");
        gate("same-conn").open();
        assert_eq!(slow.join().unwrap().version, "hold:same-conn");
    }

    #[test]
    fn a_burst_gets_one_worker_per_job_beyond_the_idle_ones() {
        // One idle worker, notified for the first job, has not woken when the second arrives.
        assert!(needs_worker(2, 1, 1));
        assert!(!needs_worker(1, 1, 1));
        assert!(needs_worker(1, 0, 0));
        // Beyond the first few, only the monitor adds workers.
        assert!(!needs_worker(5, 0, INSTANT_WORKERS));
    }

    #[test]
    fn more_workers_only_when_every_busy_worker_is_blocked() {
        let long = GROW_AFTER;
        // Every worker blocked, the queue still: grow.
        assert!(starved(1, 0, INSTANT_WORKERS, INSTANT_WORKERS, long));
        assert!(starved(3, 0, 10, 10, long * 10));
        // The workers are taking jobs: a quick burst, not blocked workers.
        assert!(!starved(
            100,
            0,
            INSTANT_WORKERS,
            INSTANT_WORKERS,
            GROW_AFTER / 2
        ));
        // Enough idle (notified) workers for the queued jobs.
        assert!(!starved(2, 2, INSTANT_WORKERS, 2, long));
        assert!(!starved(5, 0, MAX_WORKERS, MAX_WORKERS, long));
        // One worker not blocked (running, or waiting for a CPU on a loaded machine): it takes
        // the next job; however long the queue stood still, short of STALLED_AFTER.
        assert!(!starved(
            100,
            0,
            INSTANT_WORKERS,
            INSTANT_WORKERS - 1,
            long * 100
        ));
        assert!(!starved(100, 0, INSTANT_WORKERS, 0, STALLED_AFTER / 2));
        // Notified workers that have not run yet (no CPU for them): they will take jobs.
        assert!(!starved(100, 2, 10, 8, long * 100));
        assert!(!starved(
            100,
            INSTANT_WORKERS,
            INSTANT_WORKERS,
            0,
            long * 100
        ));
        // A worker blocked where nobody marked it: the queue that stood still STALLED_AFTER.
        assert!(starved(1, 0, INSTANT_WORKERS, 0, STALLED_AFTER));
        assert!(!starved(1, 0, MAX_WORKERS, 0, STALLED_AFTER));
    }

    /// `n` calls of `id`-prefix `<prefix><gate>` on their own threads.
    fn hold(task: &TaskClient, prefix: &str, name: &str, n: usize) -> Vec<JoinHandle> {
        (0..n)
            .map(|_| {
                let (t, id) = (task.clone(), format!("{prefix}{name}"));
                std::thread::spawn(move || connect(&t, &id).unwrap().version)
            })
            .collect()
    }

    type JoinHandle = std::thread::JoinHandle<String>;

    #[test]
    fn a_call_queued_behind_blocked_workers_gets_a_new_one() {
        // Every instant worker blocked in a slow call; one more call is answered while they
        // still are.
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let task = TaskClient::new(ttrpc::Client::connect(&addr).unwrap());
        let held = hold(&task, "hold:", "behind-blocked", INSTANT_WORKERS);
        gate("behind-blocked").await_inside(INSTANT_WORKERS);
        assert_eq!(connect(&task, "fast").unwrap().version, "fast");
        gate("behind-blocked").open();
        for h in held {
            assert_eq!(h.join().unwrap(), "hold:behind-blocked");
        }
    }

    #[test]
    fn a_call_behind_workers_blocked_where_nobody_marked_it_still_gets_one() {
        // The same with waits outside any blocking section: the stalled queue gets a worker.
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let task = TaskClient::new(ttrpc::Client::connect(&addr).unwrap());
        let held = hold(&task, "unmarked:", "unmarked", INSTANT_WORKERS);
        gate("unmarked").await_inside(INSTANT_WORKERS);
        assert_eq!(connect(&task, "fast").unwrap().version, "fast");
        gate("unmarked").open();
        for h in held {
            assert_eq!(h.join().unwrap(), "unmarked:unmarked");
        }
    }

    /// Busy-loop threads, two per CPU (as `stress -c`), until dropped.
    struct CpuLoad(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

    impl CpuLoad {
        fn start() -> CpuLoad {
            let stop = Arc::new(AtomicBool::new(false));
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            let spinners = (0..2 * cpus)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut x = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                        }
                    })
                })
                .collect();
            CpuLoad(stop, spinners)
        }
    }

    impl Drop for CpuLoad {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
            for t in self.1.drain(..) {
                let _ = t.join();
            }
        }
    }

    /// `n` quick calls at once, each on its own client thread; all must be answered.
    fn quick_burst(client: &ttrpc::Client, n: usize) {
        let callers: Vec<_> = (0..n)
            .map(|i| {
                let task = TaskClient::new(client.clone());
                std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || connect(&task, &format!("c{i}")).unwrap())
                    .unwrap()
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    }

    #[test]
    fn under_cpu_load_the_pool_grows_only_for_blocked_calls() {
        // Issue 20: on a loaded machine the workers of a quick burst wait for a CPU, the queue
        // stands still, and the old rule ("grow when the queue stood still for 2 ms") took the
        // pool to 48 workers. The bound here does not depend on the machine's speed: the
        // instant workers, plus one per call blocked at the same time.
        let dir = tempfile::tempdir().unwrap();
        let (addr, handle) = serve_with(dir.path(), None);
        let client = ttrpc::Client::connect(&addr).unwrap();
        let task = TaskClient::new(client.clone());
        let load = CpuLoad::start();
        let mut most = 0;
        for _ in 0..3 {
            quick_burst(&client, 300);
            most = most.max(handle.workers());
        }
        // Calls blocked at once, with a burst of quick ones behind them: each blocked call
        // gets a worker (the gate needs them all inside), the quick ones no more.
        const BLOCKED: usize = 3 * INSTANT_WORKERS;
        let held = hold(&task, "hold:", "under-load", BLOCKED);
        gate("under-load").await_inside(BLOCKED);
        quick_burst(&client, 300);
        let with_blocked = handle.workers();
        gate("under-load").open();
        for h in held {
            assert_eq!(h.join().unwrap(), "hold:under-load");
        }
        drop(load);
        eprintln!(
            "under CPU load: {most} workers after quick bursts, {with_blocked} with {BLOCKED} \
             calls blocked"
        );
        assert!(
            most <= INSTANT_WORKERS,
            "{most} workers for quick calls on a loaded machine"
        );
        assert!(
            with_blocked <= BLOCKED + INSTANT_WORKERS,
            "{with_blocked} workers with {BLOCKED} calls blocked"
        );
    }

    #[test]
    fn a_burst_of_quick_calls_leaves_few_threads() {
        // containerd sends a Connect before each Wait: a thousand Waits are a thousand quick
        // calls at once. They must not each get a thread (they did, up to MAX_WORKERS).
        let dir = tempfile::tempdir().unwrap();
        let (addr, handle) = serve_with(dir.path(), None);
        let client = ttrpc::Client::connect(&addr).unwrap();
        let callers: Vec<_> = (0..1000)
            .map(|i| {
                let task = TaskClient::new(client.clone());
                std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || connect(&task, &format!("c{i}")).unwrap())
                    .unwrap()
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert!(
            handle.workers() <= 32,
            "{} workers after a burst of quick calls",
            handle.workers()
        );
    }

    #[test]
    fn a_burst_of_blocking_calls_each_gets_a_worker() {
        // Calls that block until all of them run: with too few workers this never finishes.
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let task = TaskClient::new(ttrpc::Client::connect(&addr).unwrap());
        let calls: Vec<_> = (0..RENDEZVOUS)
            .map(|_| {
                let t = task.clone();
                std::thread::spawn(move || connect(&t, "rendezvous"))
            })
            .collect();
        for c in calls {
            c.join().unwrap().unwrap();
        }
    }

    #[test]
    fn parked_calls_hold_no_thread_and_never_delay_other_calls() {
        let dir = tempfile::tempdir().unwrap();
        let parker = Arc::new(Parker::default());
        let (addr, handle) = serve_with(dir.path(), Some(parker.clone()));
        let client = ttrpc::Client::connect(&addr).unwrap();
        const N: usize = 2000;
        let callers: Vec<_> = (0..N)
            .map(|_| {
                let c = client.clone();
                std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || raw_call(&c, PARKED_PATH, "park"))
                    .unwrap()
            })
            .collect();
        let deadline = Instant::now() + HANG;
        while parker.parked.lock().unwrap().len() < N {
            assert!(Instant::now() < deadline, "calls did not all arrive");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            handle.workers() <= 8,
            "{} workers for parked calls",
            handle.workers()
        );
        // Another call on the same connection is answered while they are parked.
        let task = TaskClient::new(client.clone());
        let r = connect(&task, "state").unwrap();
        assert_eq!(r.version, "state");
        assert_eq!(parker.release(), N);
        for c in callers {
            assert_eq!(c.join().unwrap().unwrap().version, "released");
        }
    }

    /// One request frame for `/containerd.task.v3.Task/<method>` with a ConnectRequest body.
    fn request_frame(stream_id: u32, method: &str, id: &str) -> Vec<u8> {
        let body = Request {
            service: "containerd.task.v3.Task".into(),
            method: method.into(),
            payload: protobuf::Message::write_to_bytes(&ConnectRequest {
                id: id.into(),
                ..Default::default()
            })
            .unwrap(),
            ..Default::default()
        }
        .encode()
        .unwrap();
        crate::shim::wire::encode_frame(stream_id, MESSAGE_TYPE_REQUEST, &body)
    }

    #[test]
    fn ten_thousand_parked_calls_on_one_connection() {
        let dir = tempfile::tempdir().unwrap();
        let parker = Arc::new(Parker::default());
        let (addr, handle) = serve_with(dir.path(), Some(parker.clone()));
        let mut conn = UnixStream::connect(addr.trim_start_matches("unix://")).unwrap();
        const N: u32 = 10_000;
        let mut frames = Vec::new();
        for i in 0..N {
            frames.extend(request_frame(2 * i + 1, "Wait", "park"));
        }
        conn.write_all(&frames).unwrap();
        let deadline = Instant::now() + HANG;
        while parker.parked.lock().unwrap().len() < N as usize {
            assert!(Instant::now() < deadline, "calls did not all arrive");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            handle.workers() <= 1,
            "{} workers for parked calls",
            handle.workers()
        );
        // A call behind ten thousand parked ones is answered while they are parked.
        conn.write_all(&request_frame(2 * N + 1, "Connect", "state"))
            .unwrap();
        let (h, _) = crate::shim::wire::read_frame(&mut conn).unwrap();
        assert_eq!(h.stream_id, 2 * N + 1);
        assert_eq!(parker.release(), N as usize);
        let mut answered = std::collections::HashSet::new();
        for _ in 0..N {
            let (h, body) = crate::shim::wire::read_frame(&mut conn).unwrap();
            let res = <Response as Codec>::decode(&body).unwrap();
            let r: ConnectResponse = protobuf::Message::parse_from_bytes(&res.payload).unwrap();
            assert_eq!(r.version, "released");
            answered.insert(h.stream_id);
        }
        assert_eq!(
            answered.len(),
            N as usize,
            "every parked call answered once"
        );
    }

    #[test]
    fn a_parked_method_may_answer_at_once_and_a_reply_after_close_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let parker = Arc::new(Parker::default());
        let (addr, _h) = serve_with(dir.path(), Some(parker.clone()));
        let client = ttrpc::Client::connect(&addr).unwrap();
        assert_eq!(
            raw_call(&client, PARKED_PATH, "now").unwrap().version,
            "now"
        );
        let c2 = ttrpc::Client::connect(&addr).unwrap();
        let t = std::thread::spawn(move || {
            let _ = raw_call(&c2, PARKED_PATH, "park");
        });
        while parker.parked.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(t); // the caller thread keeps its client; close ours instead
        let r = parker.parked.lock().unwrap().pop().unwrap();
        assert!(r.is_listening());
        r.send::<ConnectResponse>(Ok(ConnectResponse::default()));
    }

    #[test]
    fn a_panicking_handler_answers_internal_and_the_server_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let parker = Arc::new(Parker::default());
        let (addr, _h) = serve_with(dir.path(), Some(parker));
        let client = ttrpc::Client::connect(&addr).unwrap();
        for path in ["/containerd.task.v3.Task/Connect", PARKED_PATH] {
            match raw_call(&client, path, "panic") {
                Err(ttrpc::Error::RpcStatus(s)) => {
                    assert_eq!(s.code(), Code::INTERNAL, "{path}");
                    assert!(s.message().contains("internal error"), "{}", s.message());
                }
                other => panic!("{path}: expected INTERNAL, got {other:?}"),
            }
        }
        assert_eq!(
            raw_call(&client, "/containerd.task.v3.Task/Connect", "ok")
                .unwrap()
                .version,
            "ok"
        );
    }

    #[test]
    fn an_undecodable_request_body_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let client = ttrpc::Client::connect(&addr).unwrap();
        let req = Request {
            service: "containerd.task.v3.Task".into(),
            method: "Connect".into(),
            payload: vec![0xff, 0xff, 0xff],
            ..Default::default()
        };
        match client.request(req) {
            Err(ttrpc::Error::RpcStatus(s)) => assert_eq!(s.code(), Code::INVALID_ARGUMENT),
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }
}
