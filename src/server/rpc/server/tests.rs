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
    fn connect(&self, _ctx: &TtrpcContext, req: ConnectRequest) -> ttrpc::Result<ConnectResponse> {
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
