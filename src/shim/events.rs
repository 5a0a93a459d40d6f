//! Task events to containerd, without ever blocking an RPC.
//!
//! Events are queued in order into one channel; a single thread forwards them to containerd's
//! ttrpc `Events/Forward` on `$TTRPC_ADDRESS`, (re)connecting as needed. A single queue keeps
//! the order the task manager enqueued them in (Create < Start < Exit < Delete).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use protobuf::well_known_types::any::Any;
use protobuf::{Message, MessageField};

use crate::shim::sync::{Lock, Wait};
use crate::shim::util::timestamp;

/// One task event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Create(TaskCreate),
    Start(TaskStart),
    Exit(TaskExit),
    Delete(TaskDelete),
    ExecAdded(TaskExecAdded),
    ExecStarted(TaskExecStarted),
    Paused(TaskPaused),
    Resumed(TaskResumed),
    Oom(TaskOOM),
}

impl Event {
    /// containerd's topic for the event.
    pub fn topic(&self) -> &'static str {
        match self {
            Event::Create(_) => "/tasks/create",
            Event::Start(_) => "/tasks/start",
            Event::Exit(_) => "/tasks/exit",
            Event::Delete(_) => "/tasks/delete",
            Event::ExecAdded(_) => "/tasks/exec-added",
            Event::ExecStarted(_) => "/tasks/exec-started",
            Event::Paused(_) => "/tasks/paused",
            Event::Resumed(_) => "/tasks/resumed",
            Event::Oom(_) => "/tasks/oom",
        }
    }

    /// The message's full protobuf name, the Any type URL containerd's typeurl reads.
    ///
    /// Spelled out, not read from `M::descriptor()`: the first descriptor lookup builds the
    /// reflection tables of the events' proto file and everything it imports, about 0.5 MB of
    /// heap that stays for the daemon's life (half of a pod's shim memory) for nine names. A
    /// test checks each against the descriptor.
    pub fn type_url(&self) -> &'static str {
        match self {
            Event::Create(_) => "containerd.events.TaskCreate",
            Event::Start(_) => "containerd.events.TaskStart",
            Event::Exit(_) => "containerd.events.TaskExit",
            Event::Delete(_) => "containerd.events.TaskDelete",
            Event::ExecAdded(_) => "containerd.events.TaskExecAdded",
            Event::ExecStarted(_) => "containerd.events.TaskExecStarted",
            Event::Paused(_) => "containerd.events.TaskPaused",
            Event::Resumed(_) => "containerd.events.TaskResumed",
            Event::Oom(_) => "containerd.events.TaskOOM",
        }
    }

    /// The event as an Any (see [`Event::type_url`]).
    pub fn to_any(&self) -> Any {
        let value = match self {
            Event::Create(m) => m.write_to_bytes(),
            Event::Start(m) => m.write_to_bytes(),
            Event::Exit(m) => m.write_to_bytes(),
            Event::Delete(m) => m.write_to_bytes(),
            Event::ExecAdded(m) => m.write_to_bytes(),
            Event::ExecStarted(m) => m.write_to_bytes(),
            Event::Paused(m) => m.write_to_bytes(),
            Event::Resumed(m) => m.write_to_bytes(),
            Event::Oom(m) => m.write_to_bytes(),
        };
        Any {
            type_url: self.type_url().to_string(),
            value: value.unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// Where the task manager sends events. Implementations must not block.
pub trait EventSink: Send + Sync {
    fn publish(&self, event: Event);
}

/// Events waiting to be forwarded, oldest first.
#[derive(Default)]
struct Queue {
    items: VecDeque<(Event, SystemTime)>,
    /// Events dropped because the queue was full, not yet reported in the log.
    overflowed: usize,
    /// The publisher is gone: the forwarder ends once the queue is empty.
    closed: bool,
}

/// The queue and its wake-ups, shared by publishers and the forwarding thread.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Notified whenever the forwarder took an event off the queue ([`RemotePublisher::drain`]).
    taken: Condvar,
}

/// How events leave the shim (containerd's `Events/Forward`; a fake in tests).
trait Forwarder: Send + 'static {
    fn forward(&mut self, req: &ForwardRequest) -> Result<(), String>;
}

/// Retry rules: how long an event may wait for containerd, and how many may wait.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// containerd's Go publisher retries an event for about 15 s (1+2+3+4+5 s); so do we.
    retry_window: Duration,
    /// Most events kept while containerd is away; beyond it the oldest are dropped.
    queue_limit: usize,
    /// First pause between attempts; it doubles up to `max_backoff`.
    backoff: Duration,
    max_backoff: Duration,
}

const LIMITS: Limits = Limits {
    retry_window: Duration::from_secs(15),
    queue_limit: 4096,
    backoff: Duration::from_millis(100),
    max_backoff: Duration::from_secs(2),
};

/// Forwards events to containerd from one background thread, in order, retrying each for
/// [`Limits::retry_window`]; publishing never blocks (a full queue drops its oldest event,
/// with a log line).
pub struct RemotePublisher {
    shared: Arc<Shared>,
}

impl RemotePublisher {
    /// Starts the forwarding thread for containerd's ttrpc socket `address` (a plain path or
    /// `unix://` URL) and `namespace`.
    pub fn start(address: String, namespace: String) -> std::io::Result<Self> {
        Self::with_forwarder(move || TtrpcForwarder::new(&address), namespace, LIMITS)
    }

    fn with_forwarder<F: Forwarder>(
        make: impl FnOnce() -> F + Send + 'static,
        namespace: String,
        limits: Limits,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("events".into())
            .stack_size(256 * 1024)
            .spawn(move || forward_loop(&s, &mut make(), &namespace, limits))?;
        Ok(RemotePublisher { shared })
    }

    /// Before the daemon exits: waits until every event published so far has reached
    /// containerd, at most `within` (containerd's shim library gives its publisher 5 s).
    /// Returns how many were still waiting at the deadline (logged: they are lost).
    pub fn drain(&self, within: Duration) -> usize {
        let mut q = self.shared.queue.locked();
        let deadline = std::time::Instant::now() + within;
        while !q.items.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            q = self.shared.taken.wait_on_timeout(q, left).0;
        }
        let lost = q.items.len();
        if lost > 0 {
            let topics: Vec<&str> = q.items.iter().map(|(e, _)| e.topic()).collect();
            log::error!(
                "exiting with {lost} event(s) containerd did not take within {within:?}: {topics:?}"
            );
        }
        lost
    }
}

impl Drop for RemotePublisher {
    fn drop(&mut self) {
        self.shared.queue.locked().closed = true;
        self.shared.ready.notify_all();
    }
}

impl EventSink for RemotePublisher {
    fn publish(&self, event: Event) {
        enqueue(&self.shared, event, LIMITS.queue_limit);
    }
}

fn enqueue(shared: &Shared, event: Event, limit: usize) {
    let mut q = shared.queue.locked();
    if q.items.len() >= limit {
        q.items.pop_front();
        q.overflowed += 1;
    }
    q.items.push_back((event, SystemTime::now()));
    drop(q);
    shared.ready.notify_one();
}

/// containerd's events service over ttrpc ([`crate::shim::wire::client`]: no threads of its own).
struct TtrpcForwarder {
    client: crate::shim::wire::client::Client,
}

impl TtrpcForwarder {
    fn new(address: &str) -> Self {
        TtrpcForwarder {
            client: crate::shim::wire::client::Client::new(address, Duration::from_secs(5)),
        }
    }
}

impl Forwarder for TtrpcForwarder {
    fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
        self.client
            .call("containerd.services.events.ttrpc.v1.Events", "Forward", req)
            .map(drop)
    }
}

fn envelope(event: &Event, at: SystemTime, namespace: &str) -> ForwardRequest {
    ForwardRequest {
        envelope: MessageField::some(Envelope {
            timestamp: MessageField::some(timestamp(at)),
            namespace: namespace.to_string(),
            topic: event.topic().to_string(),
            event: MessageField::some(event.to_any()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Forwards the oldest event until it is accepted or too old, then the next: the order the
/// task manager published in is the order containerd sees. Returns when the publisher is gone
/// and the queue is empty (tests); the daemon's never ends.
fn forward_loop(shared: &Arc<Shared>, fwd: &mut dyn Forwarder, namespace: &str, limits: Limits) {
    let mut backoff = limits.backoff;
    loop {
        let head = {
            let mut q = shared.queue.locked();
            loop {
                if q.overflowed > 0 {
                    log::error!(
                        "dropped {} event(s): more than {} waited for containerd",
                        q.overflowed,
                        limits.queue_limit
                    );
                    q.overflowed = 0;
                }
                if let Some(head) = q.items.front() {
                    break head.clone();
                }
                if q.closed {
                    return;
                }
                // No timeout: an idle pod's forwarder sleeps until there is an event (it
                // woke five times a second, 550 wake-ups a second on a node of 110 pods).
                q = shared.ready.wait_on(q);
            }
        };
        let (event, at) = head;
        let req = envelope(&event, at, namespace);
        let sent = crate::shim::panic_hook::survive("forward event", || fwd.forward(&req))
            .unwrap_or_else(|| Err("the forwarder panicked".into()));
        match sent {
            Ok(()) => {
                pop_if_head(shared, &event);
                backoff = limits.backoff;
            }
            Err(e) => {
                let age = at.elapsed().unwrap_or_default();
                if age >= limits.retry_window {
                    log::error!(
                        "dropping {} event after {age:?} of retries: {e}",
                        event.topic()
                    );
                    pop_if_head(shared, &event);
                    backoff = limits.backoff;
                } else {
                    log::warn!("forward {} event: {e}; retrying", event.topic());
                    std::thread::sleep(backoff.min(limits.retry_window - age));
                    backoff = (backoff * 2).min(limits.max_backoff);
                }
            }
        }
    }
}

/// Removes the head of the queue if it is still `event` (a full queue may have dropped it).
fn pop_if_head(shared: &Shared, event: &Event) {
    let mut q = shared.queue.locked();
    if q.items.front().is_some_and(|(e, _)| e == event) {
        q.items.pop_front();
    }
    drop(q);
    shared.taken.notify_all();
}

/// Records events (tests).
#[derive(Default)]
pub struct RecordingSink {
    pub events: Mutex<Vec<Event>>,
}

impl EventSink for RecordingSink {
    fn publish(&self, event: Event) {
        self.events.locked().push(event);
    }
}

impl RecordingSink {
    /// The topics seen so far, in order.
    pub fn topics(&self) -> Vec<&'static str> {
        self.events.locked().iter().map(Event::topic).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_type_url_is_the_full_message_name() {
        let e = Event::Exit(TaskExit {
            container_id: "c".into(),
            exit_status: 3,
            ..Default::default()
        });
        assert_eq!(e.topic(), "/tasks/exit");
        let any = e.to_any();
        assert_eq!(any.type_url, "containerd.events.TaskExit");
        let back = <TaskExit as protobuf::Message>::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.exit_status, 3);
    }

    #[test]
    fn every_type_url_is_the_descriptor_s_full_name() {
        use protobuf::MessageFull;
        fn name<M: MessageFull>(_: &M) -> String {
            M::descriptor().full_name().to_string()
        }
        let all = [
            Event::Create(Default::default()),
            Event::Start(Default::default()),
            Event::Exit(Default::default()),
            Event::Delete(Default::default()),
            Event::ExecAdded(Default::default()),
            Event::ExecStarted(Default::default()),
            Event::Paused(Default::default()),
            Event::Resumed(Default::default()),
            Event::Oom(Default::default()),
        ];
        for e in &all {
            let want = match e {
                Event::Create(m) => name(m),
                Event::Start(m) => name(m),
                Event::Exit(m) => name(m),
                Event::Delete(m) => name(m),
                Event::ExecAdded(m) => name(m),
                Event::ExecStarted(m) => name(m),
                Event::Paused(m) => name(m),
                Event::Resumed(m) => name(m),
                Event::Oom(m) => name(m),
            };
            assert_eq!(e.type_url(), want, "{}", e.topic());
            assert_eq!(e.to_any().type_url, want);
        }
    }

    /// Fails the first `fail` attempts, records what got through.
    struct Flaky {
        fail: usize,
        attempts: usize,
        sent: Vec<String>,
    }
    impl Forwarder for Flaky {
        fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
            self.attempts += 1;
            if self.attempts <= self.fail {
                return Err("containerd is restarting".into());
            }
            self.sent.push(req.envelope.topic.clone());
            Ok(())
        }
    }

    fn exit_event(status: u32) -> Event {
        Event::Exit(TaskExit {
            exit_status: status,
            ..Default::default()
        })
    }

    fn run(fail: usize, events: Vec<Event>, limits: Limits) -> Flaky {
        let shared = Arc::new(Shared::default());
        for e in events {
            enqueue(&shared, e, limits.queue_limit);
        }
        // no publisher: the forwarder returns once the queue is empty
        shared.queue.locked().closed = true;
        let mut f = Flaky {
            fail,
            attempts: 0,
            sent: Vec::new(),
        };
        forward_loop(&shared, &mut f, "ns", limits);
        f
    }

    const FAST: Limits = Limits {
        retry_window: Duration::from_secs(5),
        queue_limit: 10,
        backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
    };

    #[test]
    fn events_survive_a_containerd_restart_in_order() {
        let f = run(
            20,
            vec![
                Event::Create(Default::default()),
                Event::Start(Default::default()),
                exit_event(0),
            ],
            FAST,
        );
        assert_eq!(f.sent, ["/tasks/create", "/tasks/start", "/tasks/exit"]);
    }

    #[test]
    fn an_event_older_than_the_retry_window_is_dropped_and_the_next_goes() {
        let limits = Limits {
            retry_window: Duration::from_millis(30),
            ..FAST
        };
        // Fails long enough for the first event's window to pass.
        let f = run(10_000_000, vec![exit_event(1)], limits);
        assert!(f.sent.is_empty());
        let f = run(
            1,
            vec![exit_event(1), exit_event(2)],
            Limits {
                retry_window: Duration::ZERO,
                ..FAST
            },
        );
        // With no window the failed first attempt drops the head; the next goes through.
        assert_eq!(f.sent, ["/tasks/exit"]);
        assert_eq!(f.attempts, 2);
    }

    /// A containerd that takes `delay` per event (or refuses them all), recording what it got.
    struct Slow {
        delay: Duration,
        refuse: bool,
        got: Arc<Mutex<Vec<u32>>>,
    }
    impl Forwarder for Slow {
        fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
            std::thread::sleep(self.delay);
            if self.refuse {
                return Err("containerd is gone".into());
            }
            let any = &req.envelope.event;
            let exit = <TaskExit as protobuf::Message>::parse_from_bytes(&any.value).unwrap();
            self.got.lock().unwrap().push(exit.exit_status);
            Ok(())
        }
    }

    fn slow_publisher(delay: Duration, refuse: bool) -> (RemotePublisher, Arc<Mutex<Vec<u32>>>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        let p = RemotePublisher::with_forwarder(
            move || Slow {
                delay,
                refuse,
                got: g,
            },
            "ns".into(),
            FAST,
        )
        .unwrap();
        (p, got)
    }

    /// Says when the forwarding thread let go of it (its loop returned).
    struct Dropped(std::sync::mpsc::Sender<()>);
    impl Forwarder for Dropped {
        fn forward(&mut self, _: &ForwardRequest) -> Result<(), String> {
            Ok(())
        }
    }
    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    #[test]
    fn the_idle_forwarder_ends_with_its_publisher() {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = RemotePublisher::with_forwarder(move || Dropped(tx), "ns".into(), FAST).unwrap();
        p.publish(exit_event(1));
        assert_eq!(p.drain(Duration::from_secs(60)), 0);
        // The forwarder now sleeps without a timeout: only the publisher's drop wakes it.
        std::thread::sleep(Duration::from_millis(50));
        drop(p);
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the forwarder thread did not end after its publisher was dropped");
    }

    #[test]
    fn drain_returns_once_containerd_has_every_event() {
        let (p, got) = slow_publisher(Duration::from_millis(20), false);
        for i in 0..10 {
            p.publish(exit_event(i));
        }
        assert_eq!(p.drain(Duration::from_secs(5)), 0);
        // Not one event short: the last TaskExit/TaskDelete is what a drain is for.
        assert_eq!(*got.lock().unwrap(), (0..10).collect::<Vec<_>>());
        assert_eq!(
            p.drain(Duration::from_secs(5)),
            0,
            "an empty queue drains at once"
        );
    }

    #[test]
    fn drain_gives_up_at_its_bound_and_counts_what_is_lost() {
        let (p, got) = slow_publisher(Duration::from_millis(1), true);
        p.publish(exit_event(1));
        p.publish(exit_event(2));
        let t = std::time::Instant::now();
        assert_eq!(p.drain(Duration::from_millis(100)), 2);
        // Gave up: only a hang could take this long.
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
        assert!(got.lock().unwrap().is_empty());
    }

    #[test]
    fn a_full_queue_drops_its_oldest_events_without_blocking() {
        let shared = Shared::default();
        for i in 0..25 {
            enqueue(&shared, exit_event(i), 10);
        }
        let q = shared.queue.lock().unwrap();
        assert_eq!(q.items.len(), 10);
        assert_eq!(q.overflowed, 15);
        assert_eq!(q.items.front().unwrap().0, exit_event(15));
    }
}
