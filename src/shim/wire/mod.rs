//! ttrpc on the wire: frames (a 10-byte header, then the body), for our server and our client.
//!
//! A frame is `length: u32 BE | stream id: u32 BE | type: u8 | flags: u8 | body`; requests and
//! responses are protobuf `ttrpc.Request` / `ttrpc.Response` bodies.

pub mod client;

use std::io::Read;

use ttrpc::MessageHeader;
use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX};

/// Why a frame could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The peer closed the connection (or it broke).
    Closed,
    /// The header announces a body larger than ttrpc's maximum.
    TooLong { stream_id: u32, length: u32 },
}

/// Decodes a ttrpc frame header (big-endian length, stream id, type, flags).
pub fn parse_header(hdr: &[u8; MESSAGE_HEADER_LENGTH]) -> MessageHeader {
    MessageHeader {
        length: u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]),
        stream_id: u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]),
        type_: hdr[8],
        flags: hdr[9],
    }
}

/// Reads one whole frame. A body over [`MESSAGE_LENGTH_MAX`] is refused before it is read.
pub fn read_frame(r: &mut impl Read) -> Result<(MessageHeader, Vec<u8>), FrameError> {
    let mut hdr = [0u8; MESSAGE_HEADER_LENGTH];
    r.read_exact(&mut hdr).map_err(|_| FrameError::Closed)?;
    let header = parse_header(&hdr);
    if header.length as usize > MESSAGE_LENGTH_MAX {
        return Err(FrameError::TooLong {
            stream_id: header.stream_id,
            length: header.length,
        });
    }
    let mut payload = vec![0u8; header.length as usize];
    r.read_exact(&mut payload).map_err(|_| FrameError::Closed)?;
    Ok((header, payload))
}

/// One frame of `type_` for `stream_id` carrying `body`.
pub fn encode_frame(stream_id: u32, type_: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(MESSAGE_HEADER_LENGTH + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&stream_id.to_be_bytes());
    frame.push(type_);
    frame.push(0);
    frame.extend_from_slice(body);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use ttrpc::proto::MESSAGE_TYPE_REQUEST;

    #[test]
    fn frames_are_read_whole_and_oversized_ones_refused_unread() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&3u32.to_be_bytes());
        wire.extend_from_slice(&7u32.to_be_bytes());
        wire.extend_from_slice(&[MESSAGE_TYPE_REQUEST, 0, b'a', b'b', b'c']);
        wire.extend_from_slice(&u32::MAX.to_be_bytes());
        wire.extend_from_slice(&9u32.to_be_bytes());
        wire.extend_from_slice(&[MESSAGE_TYPE_REQUEST, 0]);
        let mut r = io::Cursor::new(wire);
        let (h, body) = read_frame(&mut r).unwrap();
        assert_eq!((h.stream_id, body.as_slice()), (7, &b"abc"[..]));
        assert_eq!(
            read_frame(&mut r).unwrap_err(),
            FrameError::TooLong {
                stream_id: 9,
                length: u32::MAX
            }
        );
        assert_eq!(read_frame(&mut r).unwrap_err(), FrameError::Closed);
        let mut short = io::Cursor::new(vec![0u8, 0, 0, 5, 0, 0, 0, 1, 1, 0, b'x']);
        assert_eq!(read_frame(&mut short).unwrap_err(), FrameError::Closed);
    }

    #[test]
    fn an_encoded_frame_reads_back() {
        let f = encode_frame(5, MESSAGE_TYPE_REQUEST, b"xyz");
        let (h, body) = read_frame(&mut io::Cursor::new(f)).unwrap();
        assert_eq!(
            (h.length, h.stream_id, h.type_, body.as_slice()),
            (3, 5, MESSAGE_TYPE_REQUEST, &b"xyz"[..])
        );
    }
}
