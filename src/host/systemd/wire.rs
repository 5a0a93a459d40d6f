//! The D-Bus wire format: values, their marshalling, and messages.
//!
//! Only what talking to systemd's manager needs, but complete for it: every basic type and
//! every container (arrays, structs, dict entries, variants) decodes, so a reply or signal
//! of any signature can be read or skipped; encoding covers the types we send (`s o b i u t as
//! a(sv) a(sa(sv)) a(sasb) v au`). Messages we write are little-endian; messages we read may be of
//! either byte order (the header's first byte says which). Limits follow the specification:
//! a message is at most 128 MiB, an array at most 64 MiB, nesting at most 64 deep.

use std::fmt;

/// A decoded or to-be-encoded D-Bus value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Byte(u8),
    Bool(bool),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    /// A double, as its bits (only ever skipped or compared).
    Double(u64),
    Str(String),
    ObjectPath(String),
    Signature(String),
    /// A unix fd index (`h`); we never pass fds.
    Fd(u32),
    /// Elements of one type: its signature, then the elements.
    Array(String, Vec<Value>),
    Struct(Vec<Value>),
    DictEntry(Box<Value>, Box<Value>),
    Variant(Box<Value>),
}

impl Value {
    /// `as`: an array of strings.
    pub fn strings<S: AsRef<str>>(items: &[S]) -> Value {
        Value::Array(
            "s".into(),
            items
                .iter()
                .map(|s| Value::Str(s.as_ref().into()))
                .collect(),
        )
    }

    /// This value's type signature.
    pub fn signature(&self) -> String {
        match self {
            Value::Byte(_) => "y".into(),
            Value::Bool(_) => "b".into(),
            Value::I16(_) => "n".into(),
            Value::U16(_) => "q".into(),
            Value::I32(_) => "i".into(),
            Value::U32(_) => "u".into(),
            Value::I64(_) => "x".into(),
            Value::U64(_) => "t".into(),
            Value::Double(_) => "d".into(),
            Value::Str(_) => "s".into(),
            Value::ObjectPath(_) => "o".into(),
            Value::Signature(_) => "g".into(),
            Value::Fd(_) => "h".into(),
            Value::Array(elem, _) => format!("a{elem}"),
            Value::Struct(fields) => {
                let inner: String = fields.iter().map(Value::signature).collect();
                format!("({inner})")
            }
            Value::DictEntry(k, v) => format!("{{{}{}}}", k.signature(), v.signature()),
            Value::Variant(_) => "v".into(),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) | Value::ObjectPath(s) | Value::Signature(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_u32(&self) -> Option<u32> {
        match self {
            Value::U32(v) => Some(*v),
            _ => None,
        }
    }
}

/// A malformed message, or one beyond the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed D-Bus message: {}", self.0)
    }
}

impl std::error::Error for WireError {}

fn bad<T>(what: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(what.into()))
}

pub const MAX_MESSAGE: usize = 128 << 20;
const MAX_ARRAY: usize = 64 << 20;
const MAX_DEPTH: usize = 64;

/// The alignment of a type by its first signature character.
fn alignment(code: u8) -> usize {
    match code {
        b'y' | b'g' | b'v' => 1,
        b'n' | b'q' => 2,
        b'b' | b'i' | b'u' | b's' | b'o' | b'a' | b'h' => 4,
        _ => 8, // x t d ( {
    }
}

/// Splits the first complete type off `sig`: (`that type`, `the rest`).
pub fn split_type(sig: &str) -> Result<(&str, &str), WireError> {
    fn end(s: &[u8], i: usize, depth: usize) -> Result<usize, WireError> {
        if depth > MAX_DEPTH {
            return bad("signature nests too deep");
        }
        match s.get(i) {
            None => bad("signature ends inside a type"),
            Some(b'a') => end(s, i + 1, depth + 1),
            Some(open @ (b'(' | b'{')) => {
                let close = if *open == b'(' { b')' } else { b'}' };
                let mut j = i + 1;
                let mut n = 0;
                while s.get(j) != Some(&close) {
                    j = end(s, j, depth + 1)?;
                    n += 1;
                }
                if n == 0 || (*open == b'{' && n != 2) {
                    return bad("empty struct or dict entry without two fields");
                }
                Ok(j + 1)
            }
            Some(
                b'y' | b'b' | b'n' | b'q' | b'i' | b'u' | b'x' | b't' | b'd' | b's' | b'o' | b'g'
                | b'v' | b'h',
            ) => Ok(i + 1),
            Some(c) => bad(format!("unknown type code {:?}", *c as char)),
        }
    }
    let n = end(sig.as_bytes(), 0, 0)?;
    Ok(sig.split_at(n))
}

/// Marshals values into a buffer whose offset 0 is 8-aligned (a message, or its body).
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self, align: usize) {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
    }

    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn signature(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    pub fn put(&mut self, v: &Value) {
        match v {
            Value::Byte(b) => self.buf.push(*b),
            Value::Bool(b) => self.u32(u32::from(*b)),
            Value::I16(n) => {
                self.pad(2);
                self.buf.extend_from_slice(&n.to_le_bytes())
            }
            Value::U16(n) => {
                self.pad(2);
                self.buf.extend_from_slice(&n.to_le_bytes())
            }
            Value::I32(n) => {
                self.pad(4);
                self.buf.extend_from_slice(&n.to_le_bytes())
            }
            Value::U32(n) | Value::Fd(n) => self.u32(*n),
            Value::I64(n) => {
                self.pad(8);
                self.buf.extend_from_slice(&n.to_le_bytes())
            }
            Value::U64(n) | Value::Double(n) => {
                self.pad(8);
                self.buf.extend_from_slice(&n.to_le_bytes())
            }
            Value::Str(s) | Value::ObjectPath(s) => self.string(s),
            Value::Signature(s) => self.signature(s),
            Value::Array(elem, items) => {
                self.u32(0);
                let len_at = self.buf.len() - 4;
                // The padding to the first element is not part of the length.
                self.pad(alignment(elem.as_bytes().first().copied().unwrap_or(b'y')));
                let start = self.buf.len();
                for item in items {
                    self.put(item);
                }
                let len = (self.buf.len() - start) as u32;
                self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
            }
            Value::Struct(fields) => {
                self.pad(8);
                for f in fields {
                    self.put(f);
                }
            }
            Value::DictEntry(k, v) => {
                self.pad(8);
                self.put(k);
                self.put(v);
            }
            Value::Variant(inner) => {
                self.signature(&inner.signature());
                self.put(inner);
            }
        }
    }
}

/// Unmarshals values from a buffer whose offset 0 is 8-aligned.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], big_endian: bool) -> Self {
        Reader {
            buf,
            pos: 0,
            big_endian,
        }
    }

    fn at(buf: &'a [u8], pos: usize, big_endian: bool) -> Self {
        Reader {
            buf,
            pos,
            big_endian,
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    fn pad(&mut self, align: usize) -> Result<(), WireError> {
        while !self.pos.is_multiple_of(align) {
            match self.buf.get(self.pos) {
                Some(0) => self.pos += 1,
                Some(_) => return bad("non-zero padding"),
                None => return bad("truncated"),
            }
        }
        Ok(())
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.pad(N)?;
        let b = self
            .buf
            .get(self.pos..self.pos + N)
            .ok_or_else(|| WireError("truncated".into()))?;
        self.pos += N;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        if self.big_endian {
            a.reverse();
        }
        Ok(a)
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn bytes_nul(&mut self, len: usize) -> Result<String, WireError> {
        let b = self
            .buf
            .get(self.pos..self.pos + len + 1)
            .ok_or_else(|| WireError("truncated string".into()))?;
        if b[len] != 0 {
            return bad("string without its NUL");
        }
        let s = std::str::from_utf8(&b[..len])
            .map_err(|_| WireError("string is not UTF-8".into()))?
            .to_string();
        if s.contains('\0') {
            return bad("string with an inner NUL");
        }
        self.pos += len + 1;
        Ok(s)
    }

    fn signature(&mut self) -> Result<String, WireError> {
        let len = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| WireError("truncated signature".into()))? as usize;
        self.pos += 1;
        self.bytes_nul(len)
    }

    /// Reads every complete type of `sig` in turn.
    pub fn read_all(&mut self, mut sig: &str) -> Result<Vec<Value>, WireError> {
        let mut out = Vec::new();
        while !sig.is_empty() {
            let (one, rest) = split_type(sig)?;
            out.push(self.read(one, 0)?);
            sig = rest;
        }
        Ok(out)
    }

    /// Reads one value of the single complete type `sig`.
    pub fn read(&mut self, sig: &str, depth: usize) -> Result<Value, WireError> {
        if depth > MAX_DEPTH {
            return bad("value nests too deep");
        }
        let code = *sig
            .as_bytes()
            .first()
            .ok_or_else(|| WireError("empty signature".into()))?;
        Ok(match code {
            b'y' => {
                let b = *self
                    .buf
                    .get(self.pos)
                    .ok_or_else(|| WireError("truncated".into()))?;
                self.pos += 1;
                Value::Byte(b)
            }
            b'b' => match self.u32()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                n => return bad(format!("boolean {n}")),
            },
            b'n' => Value::I16(i16::from_le_bytes(self.take()?)),
            b'q' => Value::U16(u16::from_le_bytes(self.take()?)),
            b'i' => Value::I32(i32::from_le_bytes(self.take()?)),
            b'u' => Value::U32(self.u32()?),
            b'h' => Value::Fd(self.u32()?),
            b'x' => Value::I64(i64::from_le_bytes(self.take()?)),
            b't' => Value::U64(u64::from_le_bytes(self.take()?)),
            b'd' => Value::Double(u64::from_le_bytes(self.take()?)),
            b's' | b'o' => {
                let len = self.u32()? as usize;
                if len > MAX_MESSAGE {
                    return bad("string too long");
                }
                let s = self.bytes_nul(len)?;
                if code == b's' {
                    Value::Str(s)
                } else {
                    Value::ObjectPath(s)
                }
            }
            b'g' => Value::Signature(self.signature()?),
            b'v' => {
                let inner = self.signature()?;
                let (one, rest) = split_type(&inner)?;
                if !rest.is_empty() {
                    return bad("variant signature of more than one type");
                }
                Value::Variant(Box::new(self.read(one, depth + 1)?))
            }
            b'a' => {
                let elem = &sig[1..];
                let len = self.u32()? as usize;
                if len > MAX_ARRAY {
                    return bad("array too long");
                }
                self.pad(alignment(elem.as_bytes()[0]))?;
                let end = self.pos + len;
                if end > self.buf.len() {
                    return bad("truncated array");
                }
                let mut items = Vec::new();
                while self.pos < end {
                    items.push(self.read(elem, depth + 1)?);
                }
                if self.pos != end {
                    return bad("array elements overrun its length");
                }
                Value::Array(elem.to_string(), items)
            }
            b'(' | b'{' => {
                self.pad(8)?;
                let mut inner = &sig[1..sig.len() - 1];
                let mut fields = Vec::new();
                while !inner.is_empty() {
                    let (one, rest) = split_type(inner)?;
                    fields.push(self.read(one, depth + 1)?);
                    inner = rest;
                }
                if code == b'{' {
                    let v = fields.pop().expect("two fields");
                    let k = fields.pop().expect("two fields");
                    Value::DictEntry(Box::new(k), Box::new(v))
                } else {
                    Value::Struct(fields)
                }
            }
            c => return bad(format!("unknown type code {:?}", c as char)),
        })
    }
}

/// Message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    MethodCall = 1,
    MethodReturn = 2,
    Error = 3,
    Signal = 4,
}

/// `NO_REPLY_EXPECTED` header flag.
pub const FLAG_NO_REPLY: u8 = 0x1;

/// One message, its body kept raw until asked for ([`Message::body`]): the signals we do
/// not want are skipped without decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub kind: Kind,
    pub flags: u8,
    pub serial: u32,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    pub error_name: Option<String>,
    pub reply_serial: Option<u32>,
    pub destination: Option<String>,
    pub sender: Option<String>,
    pub signature: String,
    pub body: Vec<u8>,
    pub big_endian: bool,
}

impl Message {
    /// A method call of `interface.member` on `path` with `args`.
    pub fn call(
        destination: Option<&str>,
        path: &str,
        interface: &str,
        member: &str,
        args: &[Value],
    ) -> Message {
        let mut w = Writer::default();
        for a in args {
            w.put(a);
        }
        Message {
            kind: Kind::MethodCall,
            flags: 0,
            serial: 0,
            path: Some(path.into()),
            interface: Some(interface.into()),
            member: Some(member.into()),
            error_name: None,
            reply_serial: None,
            destination: destination.map(String::from),
            sender: None,
            signature: args.iter().map(Value::signature).collect(),
            body: w.buf,
            big_endian: false,
        }
    }

    /// A message of `kind` without header fields; tests and replies fill in the rest.
    pub fn empty(kind: Kind) -> Message {
        Message {
            kind,
            flags: 0,
            serial: 0,
            path: None,
            interface: None,
            member: None,
            error_name: None,
            reply_serial: None,
            destination: None,
            sender: None,
            signature: String::new(),
            body: Vec::new(),
            big_endian: false,
        }
    }

    /// Sets the body to `args`.
    pub fn with_body(mut self, args: &[Value]) -> Message {
        let mut w = Writer::default();
        for a in args {
            w.put(a);
        }
        self.signature = args.iter().map(Value::signature).collect();
        self.body = w.buf;
        self
    }

    /// The body's values.
    pub fn body(&self) -> Result<Vec<Value>, WireError> {
        let mut r = Reader::new(&self.body, self.big_endian);
        let v = r.read_all(&self.signature)?;
        if r.pos() != self.body.len() {
            return bad("body longer than its signature");
        }
        Ok(v)
    }

    /// The message as bytes (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut fields = Vec::new();
        let mut field = |code: u8, v: Value| {
            fields.push(Value::Struct(vec![
                Value::Byte(code),
                Value::Variant(Box::new(v)),
            ]))
        };
        let opt = |s: &Option<String>| s.clone();
        if let Some(p) = opt(&self.path) {
            field(1, Value::ObjectPath(p));
        }
        if let Some(s) = opt(&self.interface) {
            field(2, Value::Str(s));
        }
        if let Some(s) = opt(&self.member) {
            field(3, Value::Str(s));
        }
        if let Some(s) = opt(&self.error_name) {
            field(4, Value::Str(s));
        }
        if let Some(n) = self.reply_serial {
            field(5, Value::U32(n));
        }
        if let Some(s) = opt(&self.destination) {
            field(6, Value::Str(s));
        }
        if let Some(s) = opt(&self.sender) {
            field(7, Value::Str(s));
        }
        if !self.signature.is_empty() {
            field(8, Value::Signature(self.signature.clone()));
        }
        let mut w = Writer::default();
        w.buf
            .extend_from_slice(&[b'l', self.kind as u8, self.flags, 1]);
        w.buf
            .extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        w.buf.extend_from_slice(&self.serial.to_le_bytes());
        w.put(&Value::Array("(yv)".into(), fields));
        w.pad(8);
        w.buf.extend_from_slice(&self.body);
        w.buf
    }

    /// The total length of the message that starts with `head` (at least its first 16
    /// bytes), or an error for a header beyond the limits.
    pub fn total_len(head: &[u8; 16]) -> Result<usize, WireError> {
        let big = match head[0] {
            b'l' => false,
            b'B' => true,
            _ => return bad("unknown byte order"),
        };
        let n = |b: &[u8]| {
            let a = [b[0], b[1], b[2], b[3]];
            (if big {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }) as usize
        };
        let body = n(&head[4..8]);
        let fields = n(&head[12..16]);
        let header = (16 + fields).next_multiple_of(8);
        let total = header
            .checked_add(body)
            .filter(|t| *t <= MAX_MESSAGE)
            .ok_or_else(|| WireError("message too long".into()))?;
        Ok(total)
    }

    /// Decodes one whole message (`buf` is exactly [`Message::total_len`] long).
    pub fn decode(buf: &[u8]) -> Result<Message, WireError> {
        if buf.len() < 16 {
            return bad("truncated header");
        }
        let big_endian = buf[0] == b'B';
        if !big_endian && buf[0] != b'l' {
            return bad("unknown byte order");
        }
        let kind = match buf[1] {
            1 => Kind::MethodCall,
            2 => Kind::MethodReturn,
            3 => Kind::Error,
            4 => Kind::Signal,
            t => return bad(format!("message type {t}")),
        };
        if buf[3] != 1 {
            return bad(format!("protocol version {}", buf[3]));
        }
        let mut r = Reader::at(buf, 4, big_endian);
        let body_len = r.u32()? as usize;
        let serial = r.u32()?;
        let fields = r.read("a(yv)", 0)?;
        r.pad(8)?;
        let body_start = r.pos();
        if body_start + body_len != buf.len() {
            return bad("body length does not match");
        }
        let mut m = Message::empty(kind);
        m.flags = buf[2];
        m.serial = serial;
        m.big_endian = big_endian;
        let Value::Array(_, fields) = fields else {
            return bad("header fields");
        };
        for f in fields {
            let Value::Struct(mut kv) = f else {
                return bad("header field");
            };
            let (Some(Value::Variant(v)), Some(Value::Byte(code))) = (kv.pop(), kv.pop()) else {
                return bad("header field");
            };
            let s = || v.as_str().map(String::from);
            match code {
                1 => m.path = s(),
                2 => m.interface = s(),
                3 => m.member = s(),
                4 => m.error_name = s(),
                5 => m.reply_serial = v.as_u32(),
                6 => m.destination = s(),
                7 => m.sender = s(),
                8 => m.signature = s().unwrap_or_default(),
                _ => {} // unknown fields are ignored, as the specification says
            }
        }
        m.body = buf[body_start..].to_vec();
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(values: Vec<Value>) {
        let sig: String = values.iter().map(Value::signature).collect();
        let mut w = Writer::default();
        for v in &values {
            w.put(v);
        }
        let mut r = Reader::new(&w.buf, false);
        assert_eq!(r.read_all(&sig).unwrap(), values, "{sig}");
        assert_eq!(r.pos(), w.buf.len());
    }

    fn prop(name: &str, v: Value) -> Value {
        Value::Struct(vec![Value::Str(name.into()), Value::Variant(Box::new(v))])
    }

    #[test]
    fn start_transient_unit_arguments_round_trip() {
        round_trip(vec![
            Value::Str("cri-containerd-a.scope".into()),
            Value::Str("replace".into()),
            Value::Array(
                "(sv)".into(),
                vec![
                    prop("Slice", Value::Str("kubepods.slice".into())),
                    prop("Delegate", Value::Bool(true)),
                    prop("PIDs", Value::Array("u".into(), vec![Value::U32(42)])),
                    prop("MemoryMax", Value::U64(u64::MAX)),
                    prop("Names", Value::strings(&["a", "b"])),
                ],
            ),
            Value::Array("(sa(sv))".into(), vec![]),
        ]);
    }

    #[test]
    fn every_basic_type_and_container_round_trips() {
        round_trip(vec![
            Value::Byte(7),
            Value::U64(1 << 40),
            Value::I16(-2),
            Value::U16(3),
            Value::I32(-4),
            Value::I64(-5),
            Value::Double(6),
            Value::Signature("a{sv}".into()),
            Value::ObjectPath("/org/freedesktop/systemd1/job/1".into()),
            Value::Fd(0),
            Value::Array(
                "{sv}".into(),
                vec![Value::DictEntry(
                    Box::new(Value::Str("k".into())),
                    Box::new(Value::Variant(Box::new(Value::Byte(1)))),
                )],
            ),
            Value::Array("t".into(), vec![]),
            Value::Struct(vec![Value::Byte(1), Value::U64(2)]),
        ]);
    }

    /// The padding after an array's length belongs to no element: an empty array of
    /// 8-aligned elements is `00000000` plus padding, and its length stays 0.
    #[test]
    fn empty_arrays_of_structs_are_padded_but_have_length_zero() {
        let mut w = Writer::default();
        w.put(&Value::Array("(sv)".into(), vec![]));
        assert_eq!(w.buf, vec![0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn messages_round_trip_through_bytes() {
        let mut m = Message::call(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StopUnit",
            &[Value::Str("x.scope".into()), Value::Str("replace".into())],
        );
        m.serial = 9;
        let bytes = m.encode();
        let head: [u8; 16] = bytes[..16].try_into().unwrap();
        assert_eq!(Message::total_len(&head).unwrap(), bytes.len());
        let back = Message::decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(
            back.body().unwrap(),
            vec![Value::Str("x.scope".into()), Value::Str("replace".into())]
        );
    }

    /// A big-endian peer's message (byte order `B`) decodes the same.
    #[test]
    fn big_endian_messages_decode() {
        // A method return, serial 2, reply to 1, body "o" = "/j".
        let mut b = vec![b'B', 2, 0, 1];
        b.extend_from_slice(&7u32.to_be_bytes()); // body: u32 len, "/j", NUL
        b.extend_from_slice(&2u32.to_be_bytes());
        // fields: (5, v u 1) and (8, v g "o")
        let mut fields = Vec::new();
        fields.extend_from_slice(&[5, 1, b'u', 0]);
        fields.extend_from_slice(&1u32.to_be_bytes());
        fields.extend_from_slice(&[8, 1, b'g', 0, 1, b'o', 0]);
        b.extend_from_slice(&(fields.len() as u32).to_be_bytes());
        b.extend_from_slice(&fields);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b.extend_from_slice(&2u32.to_be_bytes());
        b.extend_from_slice(b"/j\0");
        let head: [u8; 16] = b[..16].try_into().unwrap();
        assert_eq!(Message::total_len(&head).unwrap(), b.len());
        let m = Message::decode(&b).unwrap();
        assert_eq!(m.reply_serial, Some(1));
        assert_eq!(m.body().unwrap(), vec![Value::ObjectPath("/j".into())]);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for sig in ["", "a", "(", "()", "{s}", "{sss}", "z", "(s"] {
            assert!(
                split_type(sig).is_err() || Reader::new(&[], false).read(sig, 0).is_err(),
                "{sig}"
            );
        }
        // A string whose length runs past the end; a bool of 2; an array past the end.
        assert!(
            Reader::new(&[9, 0, 0, 0, b'a', 0], false)
                .read("s", 0)
                .is_err()
        );
        assert!(Reader::new(&[2, 0, 0, 0], false).read("b", 0).is_err());
        assert!(
            Reader::new(&[0xff, 0xff, 0, 0], false)
                .read("ay", 0)
                .is_err()
        );
        let head = [
            b'l', 2, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(Message::total_len(&head).is_err());
        // Every prefix of a real message fails cleanly.
        let bytes = Message::call(None, "/p", "i.f", "m", &[Value::Str("s".into())]).encode();
        for n in 0..bytes.len() {
            assert!(Message::decode(&bytes[..n]).is_err(), "{n}");
        }
    }
}
