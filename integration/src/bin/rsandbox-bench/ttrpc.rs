//! The smallest ttrpc client that can ask a shim to shut down or time its round trip: unary
//! requests on a unix socket, protobuf encoded by hand (strings, bytes and a bool are all it
//! needs).
//!
//! Frame: 10-byte header (payload length u32 BE, stream id u32 BE, type u8: 1 request,
//! 2 response; flags u8), then a `ttrpc.Request` {service=1, method=2, payload=3,
//! timeout_nano=4, metadata=5 (KeyValue key=1 value=2)} or a `ttrpc.Response` {status=1
//! (google.rpc.Status code=1 message=2), payload=2}.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;
/// gRPC's UNIMPLEMENTED.
pub const UNIMPLEMENTED: i32 = 12;
/// Pseudo status: the connection closed before a reply came.
pub const CLOSED_WITHOUT_REPLY: i32 = -1;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A length-delimited field (string, bytes, message).
pub fn field_bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    varint(out, u64::from(field) << 3 | 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// A varint field (int, bool).
#[cfg(test)]
fn field_varint(out: &mut Vec<u8>, field: u32, v: u64) {
    varint(out, u64::from(field) << 3);
    varint(out, v);
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// A decoded field value.
#[derive(Debug, PartialEq)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The top-level fields of a message: (field number, value); fixed-size fields are skipped.
fn fields(buf: &[u8]) -> Option<Vec<(u32, Value<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        let field = u32::try_from(key >> 3).ok()?;
        match key & 7 {
            0 => out.push((field, Value::Varint(read_varint(buf, &mut pos)?))),
            2 => {
                let len = usize::try_from(read_varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                out.push((field, Value::Bytes(&buf[pos..end])));
                pos = end;
            }
            1 => pos = pos.checked_add(8)?,
            5 => pos = pos.checked_add(4)?,
            _ => return None,
        }
    }
    Some(out)
}

/// The status code and message of a `ttrpc.Response` (0 and "" when OK).
pub fn response_status(resp: &[u8]) -> Option<(i32, String)> {
    let mut code = 0;
    let mut msg = String::new();
    for (f, v) in fields(resp)? {
        if let (1, Value::Bytes(status)) = (f, v) {
            for (sf, sv) in fields(status)? {
                match (sf, sv) {
                    (1, Value::Varint(c)) => code = c as i32,
                    (2, Value::Bytes(m)) => msg = String::from_utf8_lossy(m).into_owned(),
                    _ => {}
                }
            }
        }
    }
    Some((code, msg))
}

/// A `ttrpc.Request` for `service`/`method` with `payload`, in containerd namespace `ns`.
pub fn request(service: &str, method: &str, payload: &[u8], ns: &str) -> Vec<u8> {
    let mut kv = Vec::new();
    field_bytes(&mut kv, 1, b"containerd-namespace-ttrpc");
    field_bytes(&mut kv, 2, ns.as_bytes());
    let mut r = Vec::new();
    field_bytes(&mut r, 1, service.as_bytes());
    field_bytes(&mut r, 2, method.as_bytes());
    field_bytes(&mut r, 3, payload);
    field_bytes(&mut r, 5, &kv);
    r
}

/// A frame of type `kind` ([`REQUEST`] or [`RESPONSE`]): the header, then `body`.
fn frame(stream_id: u32, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(10 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&stream_id.to_be_bytes());
    frame.push(kind);
    frame.push(0);
    frame.extend_from_slice(body);
    frame
}

/// A frame header's (payload length, stream id, type).
fn header(hdr: &[u8; 10]) -> (usize, u32, u8) {
    let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    let stream = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    (len, stream, hdr[8])
}

/// The next response frame's `ttrpc.Response`, which must answer `stream`, or None when the
/// peer closed the connection before it.
fn read_response(s: &mut UnixStream, stream: u32) -> std::io::Result<Option<Vec<u8>>> {
    let mut hdr = [0u8; 10];
    if let Err(e) = s.read_exact(&mut hdr) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Ok(None);
        }
        return Err(e);
    }
    let (len, answers, kind) = header(&hdr);
    if kind != RESPONSE || len > 4 << 20 || answers != stream {
        return Err(std::io::Error::other(format!(
            "unexpected ttrpc frame: type {kind}, length {len}, stream {answers} (asked on {stream})"
        )));
    }
    let mut resp = vec![0u8; len];
    s.read_exact(&mut resp)?;
    Ok(Some(resp))
}

/// One unary call on a fresh connection; returns (status code, message), or
/// [`CLOSED_WITHOUT_REPLY`] when the peer closed the connection instead of replying. The
/// connection is returned too, so a caller can watch it close.
pub fn call(
    socket: &Path,
    service: &str,
    method: &str,
    payload: &[u8],
    ns: &str,
) -> std::io::Result<((i32, String), UnixStream)> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&frame(1, REQUEST, &request(service, method, payload, ns)))?;
    // The peer closed without a reply: containerd takes that as done for Shutdown
    // (core/runtime/v2/shim.go: a ttrpc.ErrClosed is no error); the Go shim often exits
    // before its reply is written.
    let Some(resp) = read_response(&mut s, 1)? else {
        return Ok(((CLOSED_WITHOUT_REPLY, String::new()), s));
    };
    let status =
        response_status(&resp).ok_or_else(|| std::io::Error::other("malformed ttrpc response"))?;
    Ok((status, s))
}

/// `n` Task `Connect` calls for `id` on one connection, `pause` apart (so that each meets a
/// shim that went idle, as a CRI call does), as containerd's client sends them: the time
/// from each request's write to its whole response. The answer's content does not matter
/// (without a task runc's shim answers pid 0 and rsandbox NOT_FOUND): the round trip does.
pub fn connect_round_trips(
    socket: &Path,
    id: &str,
    ns: &str,
    n: usize,
    pause: Duration,
) -> std::io::Result<Vec<Duration>> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut payload = Vec::new();
    field_bytes(&mut payload, 1, id.as_bytes());
    let body = request("containerd.task.v3.Task", "Connect", &payload, ns);
    let mut times = Vec::with_capacity(n);
    for k in 0..n {
        // Client-initiated ttrpc streams have odd ids.
        let stream = 2 * k as u32 + 1;
        let f = frame(stream, REQUEST, &body);
        std::thread::sleep(pause);
        let t = std::time::Instant::now();
        s.write_all(&f)?;
        read_response(&mut s, stream)?
            .ok_or_else(|| std::io::Error::other("Connect: closed without a reply"))?;
        times.push(t.elapsed());
    }
    Ok(times)
}

/// `containerd.task.v3.Task/Shutdown` (v2 if the shim answers UNIMPLEMENTED) for `id`.
pub fn shutdown_task(socket: &Path, id: &str, ns: &str) -> std::io::Result<UnixStream> {
    let mut payload = Vec::new();
    field_bytes(&mut payload, 1, id.as_bytes());
    let mut last = (0, String::new());
    for service in ["containerd.task.v3.Task", "containerd.task.v2.Task"] {
        let (status, conn) = call(socket, service, "Shutdown", &payload, ns)?;
        if status.0 == 0 || status.0 == CLOSED_WITHOUT_REPLY {
            return Ok(conn);
        }
        last = status;
        if last.0 != UNIMPLEMENTED {
            break;
        }
    }
    Err(std::io::Error::other(format!(
        "Shutdown: code {}: {}",
        last.0, last.1
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            varint(&mut b, v);
            let mut pos = 0;
            assert_eq!(read_varint(&b, &mut pos), Some(v));
            assert_eq!(pos, b.len());
        }
    }

    #[test]
    fn request_encodes_service_method_payload_and_namespace() {
        let r = request("s.v1.S", "M", b"\x0a\x01x", "ns");
        let f = fields(&r).unwrap();
        assert_eq!(f[0], (1, Value::Bytes(b"s.v1.S")));
        assert_eq!(f[1], (2, Value::Bytes(b"M")));
        assert_eq!(f[2], (3, Value::Bytes(b"\x0a\x01x")));
        let kv = fields(match f[3].1 {
            Value::Bytes(b) => b,
            Value::Varint(_) => panic!("metadata is a message"),
        })
        .unwrap();
        assert_eq!(kv[1], (2, Value::Bytes(b"ns")));
    }

    /// A peer that answers each request, `delay` after reading it, with an empty OK response on
    /// the request's stream plus `skew`, and returns the stream ids it saw once the client
    /// hangs up (or once it has answered a skewed one: the client gives up then).
    fn answering_peer(
        socket: &Path,
        delay: Duration,
        skew: u32,
    ) -> std::thread::JoinHandle<Vec<u32>> {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut streams = Vec::new();
            let mut hdr = [0u8; 10];
            while s.read_exact(&mut hdr).is_ok() {
                let (len, stream, kind) = header(&hdr);
                assert_eq!(kind, REQUEST);
                let mut body = vec![0u8; len];
                s.read_exact(&mut body).unwrap();
                streams.push(stream);
                std::thread::sleep(delay);
                let reply = frame(stream + skew, RESPONSE, &[]);
                if s.write_all(&reply).is_err() || skew != 0 {
                    break;
                }
            }
            streams
        })
    }

    fn socket_path(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("rsandbox-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn round_trips_are_one_timed_call_each_on_new_odd_streams() {
        // Each reply comes 5 ms after its request: a call timed without waiting for its reply
        // (or requests written before the replies are read) would take less.
        let delay = Duration::from_millis(5);
        let socket = socket_path("rtt");
        let peer = answering_peer(&socket, delay, 0);
        let times = connect_round_trips(&socket, "id", "ns", 3, Duration::ZERO);
        let _ = std::fs::remove_file(&socket);
        let times = times.unwrap();
        assert_eq!(times.len(), 3);
        assert!(times.iter().all(|t| *t >= delay), "{times:?}");
        assert_eq!(peer.join().unwrap(), vec![1, 3, 5]);
    }

    #[test]
    fn a_reply_on_another_stream_is_an_error() {
        let socket = socket_path("rtt-skew");
        let peer = answering_peer(&socket, Duration::ZERO, 2);
        let r = connect_round_trips(&socket, "id", "ns", 3, Duration::ZERO);
        let _ = std::fs::remove_file(&socket);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("stream 3 (asked on 1)"), "{e}");
        assert_eq!(peer.join().unwrap(), vec![1]);
    }

    #[test]
    fn response_status_reads_code_and_message() {
        let mut status = Vec::new();
        field_varint(&mut status, 1, 12);
        field_bytes(&mut status, 2, b"nope");
        let mut resp = Vec::new();
        field_bytes(&mut resp, 1, &status);
        field_bytes(&mut resp, 2, b"");
        assert_eq!(response_status(&resp), Some((12, "nope".into())));
        assert_eq!(response_status(b""), Some((0, String::new())));
        assert_eq!(response_status(b"\x0a\x05ab"), None);
    }
}
