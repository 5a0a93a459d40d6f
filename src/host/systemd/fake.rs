//! A fake systemd for tests: a unix socket server thread that speaks the D-Bus wire
//! protocol as systemd's private socket does (SASL EXTERNAL, then messages), answering each
//! call with what the test's script says. [`FakeSystemd::serve_like_sd_bus`] also reads the
//! authentication as sd-bus's server does (see [`serve_one_like_sd_bus`]).

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

/// How the fake reads the client's authentication.
#[derive(Clone, Copy)]
enum Auth {
    /// Line by line, whatever the timing.
    Plain,
    /// As sd-bus's server, slow to get to the socket (see [`serve_one_like_sd_bus`]).
    SdBus,
}

impl FakeSystemd {
    /// Serves `connections` connections one after the other with `script`.
    pub fn serve(connections: usize, script: Script) -> FakeSystemd {
        FakeSystemd::serve_with(connections, Auth::Plain, script)
    }

    /// [`Self::serve`], reading the authentication as systemd's sd-bus does.
    pub fn serve_like_sd_bus(connections: usize, script: Script) -> FakeSystemd {
        FakeSystemd::serve_with(connections, Auth::SdBus, script)
    }

    fn serve_with(connections: usize, auth: Auth, mut script: Script) -> FakeSystemd {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, calls) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for _ in 0..connections {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                match auth {
                    Auth::Plain => serve_one(stream, &mut script, &tx),
                    Auth::SdBus => serve_one_like_sd_bus(stream, &mut script, &tx),
                }
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
        super::manager::Endpoints::with_bus(
            self.path.clone(),
            self.path.with_file_name("no-system-bus"),
        )
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
            if m.member.as_deref() == Some(HANG_UP) {
                return;
            }
            serial += 1;
            m.serial = serial;
            if s.write_all(&m.encode()).is_err() {
                return;
            }
        }
    }
}

/// sd-bus's server side (`bus_socket_read_auth` and `bus_socket_auth_verify_server` in
/// systemd's `src/libsystemd/sd-bus/bus-socket.c`), as systemd serves its private socket:
/// - while authenticating it reads at most `MAX(256, 2 * what it holds)` bytes at a time and
///   keeps the lines it processed in its buffer;
/// - `AUTH EXTERNAL <uid>` is answered `OK <guid>`; `BEGIN` is processed once that answer
///   is written, and what followed `BEGIN` in the buffer stays there: the connection is then
///   running, and a running sd-bus connection with no parsed message waits for the socket to
///   become readable (`sd_bus_get_events`: `POLLIN` while `rqueue_size` is 0; no timeout),
///   so those bytes are parsed only with the next read (or at EOF, when systemd runs what it
///   holds and cannot answer any more);
/// - slow to get to the socket: it sleeps before each read, as a systemd busy elsewhere.
///
/// Messages once running are then read and answered as [`serve_one`] does.
fn serve_one_like_sd_bus(mut s: UnixStream, script: &mut Script, tx: &mpsc::Sender<Message>) {
    use std::time::Duration;
    const SLOW: Duration = Duration::from_millis(200);
    let mut buf: Vec<u8> = Vec::new();
    let mut begin = 1; // after the NUL byte
    let parked = loop {
        std::thread::sleep(SLOW);
        let want = 256usize.max(buf.len() * 2) - buf.len();
        let mut chunk = vec![0u8; want];
        let n = match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut parked = None;
        while let Some(end) = buf[begin..].windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&buf[begin..begin + end]).into_owned();
            begin += end + 2;
            if line.starts_with("AUTH EXTERNAL") {
                if s.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
                    .is_err()
                {
                    return;
                }
            } else if line == "BEGIN" {
                parked = Some(buf[begin..].to_vec());
                break;
            } else if s.write_all(b"ERROR\r\n").is_err() {
                return;
            }
        }
        if let Some(p) = parked {
            break p;
        }
    };
    let mut pending = parked;
    let mut serial = 1000;
    loop {
        // Running: only a readable socket (or its EOF) makes it look at its buffer again.
        std::thread::sleep(SLOW);
        let mut chunk = [0u8; 4096];
        let eof = match s.read(&mut chunk) {
            Ok(0) | Err(_) => true,
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                false
            }
        };
        while pending.len() >= 16 {
            let head: [u8; 16] = pending[..16].try_into().unwrap();
            let total = Message::total_len(&head).unwrap();
            if pending.len() < total {
                break;
            }
            let call = Message::decode(&pending[..total]).unwrap();
            pending.drain(..total);
            let _ = tx.send(call.clone());
            for mut m in script(&call) {
                serial += 1;
                m.serial = serial;
                if s.write_all(&m.encode()).is_err() {
                    break;
                }
            }
        }
        if eof {
            return;
        }
    }
}

/// Not sent: makes the fake close the connection there (systemd re-executing).
pub fn hang_up() -> Message {
    let mut m = Message::empty(Kind::Signal);
    m.member = Some(HANG_UP.into());
    m
}

const HANG_UP: &str = "rsandbox.fake.HangUp";

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

/// The bus daemon's `NameOwnerChanged(name, old, new)`, sent as the daemon sends it.
pub fn name_owner_changed(name: &str, old: &str, new: &str) -> Message {
    let mut m = Message::empty(Kind::Signal).with_body(&[
        Value::Str(name.into()),
        Value::Str(old.into()),
        Value::Str(new.into()),
    ]);
    m.path = Some("/org/freedesktop/DBus".into());
    m.interface = Some("org.freedesktop.DBus".into());
    m.member = Some("NameOwnerChanged".into());
    m.sender = Some("org.freedesktop.DBus".into());
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
