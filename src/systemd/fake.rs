//! A fake systemd for tests: a unix socket server thread that speaks the D-Bus wire
//! protocol as systemd's private socket does (SASL EXTERNAL, then messages), answering each
//! call with what the test's script says.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::wire::{Kind, Message, Value};

/// What the script answers a call with.
pub type Script = Box<dyn FnMut(&Message) -> Vec<Message> + Send>;

pub struct FakeSystemd {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
    /// Every call received, in order, across connections.
    pub calls: mpsc::Receiver<Message>,
    thread: Option<JoinHandle<()>>,
}

impl FakeSystemd {
    /// Serves `connections` connections one after the other with `script`.
    pub fn serve(connections: usize, mut script: Script) -> FakeSystemd {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, calls) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for _ in 0..connections {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                serve_one(stream, &mut script, &tx);
            }
        });
        FakeSystemd {
            path,
            _dir: dir,
            calls,
            thread: Some(thread),
        }
    }

    /// Endpoints with the fake as the private socket and no system bus.
    pub fn endpoints(&self) -> super::manager::Endpoints {
        super::manager::Endpoints {
            private: self.path.clone(),
            system_bus: self.path.with_file_name("no-system-bus"),
        }
    }

    /// The calls received so far, once the server is done (all connections closed).
    pub fn finish(mut self) -> Vec<Message> {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.calls.try_iter().collect()
    }

    /// [`Self::finish`], as the member (method name) of each call.
    pub fn finish_members(self) -> Vec<String> {
        self.finish()
            .iter()
            .map(|c| c.member.clone().unwrap())
            .collect()
    }
}

fn serve_one(mut s: UnixStream, script: &mut Script, tx: &mpsc::Sender<Message>) {
    // SASL: "\0AUTH EXTERNAL <hex uid>\r\n" ... "BEGIN\r\n".
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n") {
        if s.read(&mut byte).unwrap_or(0) == 0 {
            return;
        }
        buf.push(byte[0]);
    }
    let uid = nix::unistd::getuid().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        String::from_utf8_lossy(&buf),
        format!("\0AUTH EXTERNAL {hex}\r\n")
    );
    s.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
        .unwrap();
    let mut begin = [0u8; 7];
    if s.read_exact(&mut begin).is_err() {
        return;
    }
    assert_eq!(&begin, b"BEGIN\r\n");
    let mut serial = 1000;
    loop {
        let mut head = [0u8; 16];
        if s.read_exact(&mut head).is_err() {
            return; // the client closed
        }
        let total = Message::total_len(&head).unwrap();
        let mut msg = head.to_vec();
        msg.resize(total, 0);
        s.read_exact(&mut msg[16..]).unwrap();
        let call = Message::decode(&msg).unwrap();
        let _ = tx.send(call.clone());
        for mut m in script(&call) {
            serial += 1;
            m.serial = serial;
            if s.write_all(&m.encode()).is_err() {
                return;
            }
        }
    }
}

/// A method return to `call` with `body`.
pub fn reply(call: &Message, body: &[Value]) -> Message {
    let mut m = Message::empty(Kind::MethodReturn).with_body(body);
    m.reply_serial = Some(call.serial);
    m
}

/// An error reply to `call`.
pub fn error(call: &Message, name: &str, text: &str) -> Message {
    let mut m = Message::empty(Kind::Error).with_body(&[Value::Str(text.into())]);
    m.reply_serial = Some(call.serial);
    m.error_name = Some(name.into());
    m
}

/// The manager's `JobRemoved(u, o, s, s)` signal.
pub fn job_removed(id: u32, job: &str, unit: &str, result: &str) -> Message {
    let mut m = Message::empty(Kind::Signal).with_body(&[
        Value::U32(id),
        Value::ObjectPath(job.into()),
        Value::Str(unit.into()),
        Value::Str(result.into()),
    ]);
    m.path = Some("/org/freedesktop/systemd1".into());
    m.interface = Some("org.freedesktop.systemd1.Manager".into());
    m.member = Some("JobRemoved".into());
    m
}

/// A signal the client must skip: a `PropertiesChanged` with a dictionary body.
pub fn noise() -> Message {
    let mut m = Message::empty(Kind::Signal).with_body(&[
        Value::Str("org.freedesktop.systemd1.Unit".into()),
        Value::Array(
            "{sv}".into(),
            vec![Value::DictEntry(
                Box::new(Value::Str("ActiveState".into())),
                Box::new(Value::Variant(Box::new(Value::Str("active".into())))),
            )],
        ),
        Value::strings(&["Names"]),
    ]);
    m.path = Some("/org/freedesktop/systemd1/unit/x".into());
    m.interface = Some("org.freedesktop.DBus.Properties".into());
    m.member = Some("PropertiesChanged".into());
    m
}

/// The string at `index` of a call's body.
pub fn arg(call: &Message, index: usize) -> String {
    call.body().unwrap()[index].as_str().unwrap().to_string()
}
