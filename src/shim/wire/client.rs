//! A minimal ttrpc client: one connection, one call at a time, no threads of its own.
//!
//! The shim calls containerd for one thing: forwarding events. ttrpc's own client keeps two
//! threads per connection, one of which wakes every 10 ms for as long as the connection lives:
//! 100 wake-ups a second per pod for an idle shim. This one blocks in `read` only while a call
//! is in flight, with a deadline.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use protobuf::Message;
use ttrpc::proto::{Codec, MESSAGE_TYPE_REQUEST, MESSAGE_TYPE_RESPONSE};
use ttrpc::{Code, Request, Response};

use super::{encode_frame, read_frame};

/// One connection to a ttrpc server, (re)opened on demand.
pub struct Client {
    path: PathBuf,
    timeout: Duration,
    stream: Option<UnixStream>,
    /// Client-initiated streams have odd ids.
    next_stream: u32,
}

impl Client {
    /// A client of `address` (a path, or `unix://path`); calls give up after `timeout`.
    pub fn new(address: &str, timeout: Duration) -> Client {
        Client {
            path: PathBuf::from(address.strip_prefix("unix://").unwrap_or(address)),
            timeout,
            stream: None,
            next_stream: 1,
        }
    }

    /// Calls `/service/method` with `req`; the reply's payload, or why not. After an error the
    /// connection is dropped and the next call opens a new one.
    pub fn call(
        &mut self,
        service: &str,
        method: &str,
        req: &impl Message,
    ) -> Result<Vec<u8>, String> {
        let r = self.call_inner(service, method, req);
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn call_inner(
        &mut self,
        service: &str,
        method: &str,
        req: &impl Message,
    ) -> Result<Vec<u8>, String> {
        let stream = match &mut self.stream {
            Some(s) => s,
            None => {
                let s = UnixStream::connect(&self.path)
                    .map_err(|e| format!("connect {}: {e}", self.path.display()))?;
                s.set_read_timeout(Some(self.timeout))
                    .and_then(|()| s.set_write_timeout(Some(self.timeout)))
                    .map_err(|e| format!("socket timeouts: {e}"))?;
                self.stream.insert(s)
            }
        };
        let stream_id = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(2) | 1;
        let body = Request {
            service: service.into(),
            method: method.into(),
            payload: req
                .write_to_bytes()
                .map_err(|e| format!("encode request: {e}"))?,
            timeout_nano: i64::try_from(self.timeout.as_nanos()).unwrap_or(i64::MAX),
            ..Default::default()
        }
        .encode()
        .map_err(|e| format!("encode request: {e}"))?;
        let frame = encode_frame(stream_id, MESSAGE_TYPE_REQUEST, &body);
        stream
            .write_all(&frame)
            .map_err(|e| format!("send /{service}/{method}: {e}"))?;
        loop {
            let (header, payload) =
                read_frame(stream).map_err(|e| format!("/{service}/{method}: no reply ({e:?})"))?;
            if header.type_ != MESSAGE_TYPE_RESPONSE || header.stream_id != stream_id {
                continue; // a late reply to a call that timed out, or a stream message
            }
            let res = <Response as Codec>::decode(&payload)
                .map_err(|e| format!("/{service}/{method}: bad reply: {e}"))?;
            return match res.status.as_ref() {
                Some(s) if s.code() != Code::OK => Err(format!(
                    "/{service}/{method}: {:?}: {}",
                    s.code(),
                    s.message()
                )),
                _ => Ok(res.payload),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
    use containerd_shim_protos::shim::events::ForwardRequest;
    use containerd_shim_protos::shim_sync::{Events, create_events};
    use std::sync::{Arc, Mutex};
    use ttrpc::TtrpcContext;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);
    impl Events for Recorder {
        fn forward(&self, _ctx: &TtrpcContext, req: ForwardRequest) -> ttrpc::Result<Empty> {
            let topic = req.envelope.topic.clone();
            if topic == "/fail" {
                return Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                    Code::UNAVAILABLE,
                    "not now",
                )));
            }
            self.0.lock().unwrap().push(topic);
            Ok(Empty::new())
        }
    }

    fn forward(topic: &str) -> ForwardRequest {
        let mut r = ForwardRequest::new();
        r.envelope.mut_or_insert_default().topic = topic.into();
        r
    }

    const EVENTS: &str = "containerd.services.events.ttrpc.v1.Events";

    #[test]
    fn calls_reuse_one_connection_and_report_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev.sock");
        let rec = Arc::new(Recorder::default());
        // ttrpc's own server: the client must speak the protocol, not just our dialect of it.
        let mut server = ttrpc::Server::new()
            .bind(&format!("unix://{}", path.display()))
            .unwrap()
            .register_service(create_events(rec.clone()));
        server.start().unwrap();
        let mut c = Client::new(
            &format!("unix://{}", path.display()),
            Duration::from_secs(5),
        );
        c.call(EVENTS, "Forward", &forward("/tasks/create"))
            .unwrap();
        c.call(EVENTS, "Forward", &forward("/tasks/start")).unwrap();
        let e = c.call(EVENTS, "Forward", &forward("/fail")).unwrap_err();
        assert!(e.contains("UNAVAILABLE") && e.contains("not now"), "{e}");
        // A new connection after the error.
        c.call(EVENTS, "Forward", &forward("/tasks/exit")).unwrap();
        assert_eq!(
            *rec.0.lock().unwrap(),
            ["/tasks/create", "/tasks/start", "/tasks/exit"]
        );
        let e = c.call(EVENTS, "Nope", &forward("/x")).unwrap_err();
        assert!(e.contains("Nope") && e.contains("does not exist"), "{e}");
    }

    #[test]
    fn no_server_is_an_error_not_a_hang() {
        let mut c = Client::new("/nonexistent/sock", Duration::from_millis(100));
        assert!(c.call(EVENTS, "Forward", &forward("/x")).is_err());
    }
}
