//! The smallest ttrpc client that can ask a shim to shut down: one unary request on a unix
//! socket, protobuf encoded by hand (strings, bytes and a bool are all it needs).
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
    let body = request(service, method, payload, ns);
    let mut frame = Vec::with_capacity(10 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&1u32.to_be_bytes());
    frame.push(REQUEST);
    frame.push(0);
    frame.extend_from_slice(&body);
    s.write_all(&frame)?;
    let mut hdr = [0u8; 10];
    if let Err(e) = s.read_exact(&mut hdr) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            // The peer closed without a reply: containerd takes that as done for Shutdown
            // (core/runtime/v2/shim.go: a ttrpc.ErrClosed is no error); the Go shim often
            // exits before its reply is written.
            return Ok(((CLOSED_WITHOUT_REPLY, String::new()), s));
        }
        return Err(e);
    }
    let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    if hdr[8] != RESPONSE || len > 4 << 20 {
        return Err(std::io::Error::other(format!(
            "unexpected ttrpc frame type {} length {len}",
            hdr[8]
        )));
    }
    let mut resp = vec![0u8; len];
    s.read_exact(&mut resp)?;
    let status =
        response_status(&resp).ok_or_else(|| std::io::Error::other("malformed ttrpc response"))?;
    Ok((status, s))
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
