//! Task events to containerd, without ever blocking an RPC.
//!
//! Events are queued in order into one channel; a single thread forwards them to containerd's
//! ttrpc `Events/Forward` on `$TTRPC_ADDRESS`, (re)connecting as needed. A single queue keeps
//! the order the task manager enqueued them in (Create < Start < Exit < Delete).

use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_sync::EventsClient;
use protobuf::well_known_types::any::Any;
use protobuf::{MessageField, MessageFull};

use crate::util::timestamp;

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

    /// The event as an Any (type URL = the message's full name, as containerd's typeurl reads it).
    pub fn to_any(&self) -> Any {
        fn any<M: MessageFull>(m: &M) -> Any {
            Any {
                type_url: M::descriptor().full_name().to_string(),
                value: m.write_to_bytes().unwrap_or_default(),
                ..Default::default()
            }
        }
        match self {
            Event::Create(m) => any(m),
            Event::Start(m) => any(m),
            Event::Exit(m) => any(m),
            Event::Delete(m) => any(m),
            Event::ExecAdded(m) => any(m),
            Event::ExecStarted(m) => any(m),
            Event::Paused(m) => any(m),
            Event::Resumed(m) => any(m),
            Event::Oom(m) => any(m),
        }
    }
}

/// Where the task manager sends events. Implementations must not block.
pub trait EventSink: Send + Sync {
    fn publish(&self, event: Event);
}

/// Forwards events to containerd from one background thread.
pub struct RemotePublisher {
    tx: Mutex<Sender<(Event, SystemTime)>>,
}

/// How often one event is tried before it is dropped (with a log line).
const ATTEMPTS: u32 = 5;

impl RemotePublisher {
    /// Starts the forwarding thread for containerd's ttrpc socket `address` (a plain path or
    /// `unix://` URL) and `namespace`.
    pub fn start(address: String, namespace: String) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("events".into())
            .stack_size(256 * 1024)
            .spawn(move || forward_loop(rx, &address, &namespace))?;
        Ok(RemotePublisher { tx: Mutex::new(tx) })
    }
}

impl EventSink for RemotePublisher {
    fn publish(&self, event: Event) {
        let _ = self.tx.lock().unwrap().send((event, SystemTime::now()));
    }
}

fn forward_loop(rx: Receiver<(Event, SystemTime)>, address: &str, namespace: &str) {
    let url = if address.contains("://") {
        address.to_string()
    } else {
        format!("unix://{address}")
    };
    let mut client: Option<EventsClient> = None;
    for (event, at) in rx {
        let req = ForwardRequest {
            envelope: MessageField::some(Envelope {
                timestamp: MessageField::some(timestamp(at)),
                namespace: namespace.to_string(),
                topic: event.topic().to_string(),
                event: MessageField::some(event.to_any()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            if client.is_none() {
                match ttrpc::Client::connect(&url) {
                    Ok(c) => client = Some(EventsClient::new(c)),
                    Err(e) => log::warn!("connect to containerd events at {url}: {e}"),
                }
            }
            if let Some(c) = &client {
                match c.forward(
                    ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64),
                    &req,
                ) {
                    Ok(_) => break,
                    Err(e) => {
                        log::warn!("forward {} event: {e}", event.topic());
                        client = None;
                    }
                }
            }
            if attempt >= ATTEMPTS {
                log::error!("dropping {} event after {ATTEMPTS} attempts", event.topic());
                break;
            }
            std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
        }
    }
}

/// Records events (tests).
#[derive(Default)]
pub struct RecordingSink {
    pub events: Mutex<Vec<Event>>,
}

impl EventSink for RecordingSink {
    fn publish(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

impl RecordingSink {
    /// The topics seen so far, in order.
    pub fn topics(&self) -> Vec<&'static str> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(Event::topic)
            .collect()
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
}
