//! Our ttrpc server: both services on one socket, threads only for work in flight.
//!
//! containerd opens one connection for the sandbox and one per container, and keeps a
//! blocking call (WaitSandbox, Task.Wait) open on most of them. The stock ttrpc server runs
//! three threads plus a worker pool per connection; here each connection has one small reader
//! thread and requests run on one shared pool that grows with the calls in flight and shrinks
//! when idle. Generated method tables (`create_task`, `create_sandbox`) plug in unchanged, under
//! any service name (the Task table is registered as both `containerd.task.v3.Task` and `v2`).
//! Unknown methods answer UNIMPLEMENTED, as Go's ttrpc does (containerd's v3→v2 downgrade keys on
//! it). Peers must be root or our own user.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use protobuf::MessageField;
use ttrpc::proto::{
    Codec, MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX, MESSAGE_TYPE_REQUEST, MESSAGE_TYPE_RESPONSE,
};
use ttrpc::{Code, MessageHeader, MethodHandler, Request, Response, TtrpcContext};

type Methods = HashMap<String, Box<dyn MethodHandler + Send + Sync>>;

/// The most worker threads at once; more calls queue.
const MAX_WORKERS: usize = 256;
/// An idle worker beyond the first exits after this long.
const WORKER_IDLE: Duration = Duration::from_secs(30);

/// See the module docs.
pub struct Server {
    methods: Methods,
    pool: Arc<Pool>,
}

struct Conn {
    fd: i32,
    writer: Mutex<UnixStream>,
    res_tx: Sender<(MessageHeader, Vec<u8>)>,
    res_rx: Mutex<Receiver<(MessageHeader, Vec<u8>)>>,
    ctx: Arc<ttrpc::ConnectionContext>,
}

struct Job {
    conn: Arc<Conn>,
    header: MessageHeader,
    payload: Vec<u8>,
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
    in_flight: usize,
}

struct Pool {
    state: Mutex<PoolState>,
    work: Condvar,
    done: Condvar,
}

impl Default for Server {
    fn default() -> Self {
        Self::new()
    }
}

impl Server {
    pub fn new() -> Self {
        Server {
            methods: HashMap::new(),
            pool: Arc::new(Pool {
                state: Mutex::default(),
                work: Condvar::new(),
                done: Condvar::new(),
            }),
        }
    }

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

    /// The registered method paths (sorted), for tests and logs.
    pub fn method_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.methods.keys().cloned().collect();
        v.sort();
        v
    }

    /// Serves `listener` on a background accept thread. Returns a handle to wait for idleness.
    pub fn start(self, listener: UnixListener) -> io::Result<ServerHandle> {
        let pool = self.pool.clone();
        let server = Arc::new(self);
        let s = server.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                for stream in listener.incoming() {
                    match stream {
                        Ok(stream) => {
                            if let Err(e) = s.clone().accept(stream) {
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
        Ok(ServerHandle { pool })
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
        let (res_tx, res_rx) = mpsc::channel();
        let conn = Arc::new(Conn {
            fd: stream.as_raw_fd(),
            writer: Mutex::new(stream.try_clone()?),
            res_tx,
            res_rx: Mutex::new(res_rx),
            ctx: Arc::new(ttrpc::ConnectionContext::default()),
        });
        std::thread::Builder::new()
            .name("conn".into())
            .stack_size(128 * 1024)
            .spawn(move || self.read_loop(stream, conn))?;
        Ok(())
    }

    fn read_loop(self: Arc<Self>, mut stream: UnixStream, conn: Arc<Conn>) {
        loop {
            let mut hdr = [0u8; MESSAGE_HEADER_LENGTH];
            if stream.read_exact(&mut hdr).is_err() {
                return; // closed
            }
            let header = MessageHeader {
                length: u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]),
                stream_id: u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]),
                type_: hdr[8],
                flags: hdr[9],
            };
            if header.length as usize > MESSAGE_LENGTH_MAX {
                // Reject without reading the body, then drop the connection: we cannot
                // resynchronise on a stream whose length we refuse to read.
                respond_error(
                    &conn,
                    header.stream_id,
                    Code::RESOURCE_EXHAUSTED,
                    &format!(
                        "message length {} exceeds the maximum {MESSAGE_LENGTH_MAX}",
                        header.length
                    ),
                );
                flush(&conn);
                return;
            }
            let mut payload = vec![0u8; header.length as usize];
            if stream.read_exact(&mut payload).is_err() {
                return;
            }
            if header.type_ != MESSAGE_TYPE_REQUEST {
                continue; // streams are not used by containerd's shim APIs
            }
            self.pool.submit(
                self.clone(),
                Job {
                    conn: conn.clone(),
                    header,
                    payload,
                },
            );
        }
    }

    fn run(&self, job: Job) {
        let Job {
            conn,
            header,
            payload,
        } = job;
        let req = match <Request as Codec>::decode(&payload) {
            Ok(r) => r,
            Err(e) => {
                respond_error(
                    &conn,
                    header.stream_id,
                    Code::INVALID_ARGUMENT,
                    &format!("bad request: {e}"),
                );
                flush(&conn);
                return;
            }
        };
        let path = format!("/{}/{}", req.service, req.method);
        match self.methods.get(&path) {
            None => respond_error(
                &conn,
                header.stream_id,
                Code::UNIMPLEMENTED,
                &format!("{path} is not implemented"),
            ),
            Some(handler) => {
                let ctx = TtrpcContext {
                    fd: conn.fd,
                    cancel_rx: crossbeam_channel::never(),
                    mh: header,
                    res_tx: conn.res_tx.clone(),
                    metadata: ttrpc::context::from_pb(&req.metadata),
                    timeout_nano: req.timeout_nano,
                    conn_ctx: conn.ctx.clone(),
                };
                let started = Instant::now();
                if let Err(e) = handler.handler(ctx, req) {
                    log::warn!("{path}: {e:?}");
                }
                log::debug!("{path} took {:?}", started.elapsed());
            }
        }
        flush(&conn);
    }
}

/// Queues an error response for `stream_id`.
fn respond_error(conn: &Conn, stream_id: u32, code: Code, msg: &str) {
    let res = Response {
        status: MessageField::some(ttrpc::get_status(code, msg.to_string())),
        ..Default::default()
    };
    if let Ok(buf) = res.encode() {
        let _ = conn.res_tx.send((
            MessageHeader::new_response(stream_id, buf.len() as u32),
            buf,
        ));
    }
}

/// Writes every queued response of `conn`, one whole frame at a time.
fn flush(conn: &Conn) {
    let rx = conn.res_rx.lock().unwrap();
    while let Ok((header, body)) = rx.try_recv() {
        let mut frame = Vec::with_capacity(MESSAGE_HEADER_LENGTH + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&header.stream_id.to_be_bytes());
        frame.push(MESSAGE_TYPE_RESPONSE);
        frame.push(0);
        frame.extend_from_slice(&body);
        let mut w = conn.writer.lock().unwrap();
        if let Err(e) = w.write_all(&frame) {
            log::debug!("ttrpc write: {e}");
        }
    }
}

impl Pool {
    fn submit(self: &Arc<Self>, server: Arc<Server>, job: Job) {
        let mut st = self.state.lock().unwrap();
        st.jobs.push_back(job);
        st.in_flight += 1;
        // `idle` still counts a worker that was notified but has not woken yet: two calls
        // submitted back to back would both see idle == 1, the one worker would take the
        // first (e.g. a WaitSandbox that blocks until the pod exits) and the second would
        // wait for it forever. Spawn whenever the queue outgrows the idle workers.
        if st.jobs.len() > st.idle && st.threads < MAX_WORKERS {
            st.threads += 1;
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name("rpc".into())
                .stack_size(512 * 1024)
                .spawn(move || pool.worker(server));
            if spawned.is_err() {
                st.threads -= 1;
                log::error!("cannot start an rpc worker thread");
            }
        }
        drop(st);
        self.work.notify_one();
    }

    fn worker(self: Arc<Self>, server: Arc<Server>) {
        loop {
            let job = {
                let mut st = self.state.lock().unwrap();
                loop {
                    if let Some(job) = st.jobs.pop_front() {
                        break job;
                    }
                    st.idle += 1;
                    let (next, timeout) = self.work.wait_timeout(st, WORKER_IDLE).unwrap();
                    st = next;
                    st.idle -= 1;
                    if timeout.timed_out() && st.jobs.is_empty() && st.threads > 1 {
                        st.threads -= 1;
                        return;
                    }
                }
            };
            server.run(job);
            let mut st = self.state.lock().unwrap();
            st.in_flight -= 1;
            if st.in_flight == 0 {
                self.done.notify_all();
            }
        }
    }
}

/// Lets the daemon wait for in-flight calls (e.g. the Shutdown reply) before it exits.
pub struct ServerHandle {
    pool: Arc<Pool>,
}

impl ServerHandle {
    /// Waits until no call is in flight except `except` (the caller's own), at most `timeout`.
    pub fn wait_idle(&self, except: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.pool.state.lock().unwrap();
        while st.in_flight > except {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.pool.done.wait_timeout(st, left).unwrap().0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::api::{ConnectRequest, ConnectResponse};
    use containerd_shim_protos::shim_sync::{Task, TaskClient, create_task};

    struct Echo;
    impl Task for Echo {
        fn connect(
            &self,
            _ctx: &TtrpcContext,
            req: ConnectRequest,
        ) -> ttrpc::Result<ConnectResponse> {
            if req.id == "slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(ConnectResponse {
                shim_pid: 7,
                version: req.id,
                ..Default::default()
            })
        }
    }

    fn serve(dir: &std::path::Path) -> String {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut server = Server::new();
        server.register(create_task(Arc::new(Echo)));
        server.register_renamed(
            create_task(Arc::new(Echo)),
            "containerd.task.v3.Task",
            "containerd.task.v2.Task",
        );
        server.start(listener).unwrap();
        format!("unix://{}", path.display())
    }

    #[test]
    fn both_service_names_answer_and_unknown_is_unimplemented() {
        let dir = tempfile::tempdir().unwrap();
        let addr = serve(dir.path());
        let client = ttrpc::Client::connect(&addr).unwrap();
        let task = TaskClient::new(client.clone());
        let r = task
            .connect(
                ttrpc::context::with_timeout(0),
                &ConnectRequest {
                    id: "a".into(),
                    ..Default::default()
                },
            )
            .unwrap();
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
        let slow = std::thread::spawn(move || {
            t2.connect(
                ttrpc::context::with_timeout(0),
                &ConnectRequest {
                    id: "slow".into(),
                    ..Default::default()
                },
            )
            .unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let r = task
            .connect(
                ttrpc::context::with_timeout(0),
                &ConnectRequest {
                    id: "fast".into(),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(r.version, "fast");
        assert!(
            start.elapsed() < Duration::from_millis(250),
            "fast call waited {:?}",
            start.elapsed()
        );
        assert_eq!(slow.join().unwrap().version, "slow");
    }
}
