//! One D-Bus connection over a unix socket: connect, SASL `EXTERNAL` authentication, and
//! method calls that wait for their reply, every step bounded by one deadline.
//!
//! Synchronous and single-threaded on purpose: the shim asks systemd two or three questions
//! per pod and waits for each answer, so a thread or an async runtime would buy nothing. The
//! socket is non-blocking and close-on-exec; every read and write waits in `poll(2)` for at
//! most the time left, so a peer that never answers costs the deadline, never a hang. Each
//! such wait is a [`crate::shim::blocking`] section: the RPC pool then knows the worker waits for
//! systemd rather than for a CPU.
//!
//! `BEGIN` goes out with the `AUTH` line, before the server's `OK`, as sd-bus's own client
//! sends it, so that the first message never shares a read with `BEGIN` on the server's side:
//! sd-bus (systemd's private socket) keeps the bytes it read past `BEGIN` in its buffer and
//! parses them only when the socket next becomes readable. A call sent right after `BEGIN`,
//! small enough to arrive in that same read (`StopUnit`, 200 bytes of the 256 sd-bus reads
//! during authentication) and read together with it by a systemd slow to get to the socket,
//! then waited there unanswered until the connection closed, when systemd ran it.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, connect, getsockopt, socket, sockopt,
};

use super::wire::{Kind, Message, Value, WireError};

/// The bus daemon's own name: the sender of its replies and signals (`NameOwnerChanged`),
/// which no client can take.
pub const BUS_DRIVER: &str = "org.freedesktop.DBus";

/// Why a D-Bus exchange failed, with the step it failed in.
#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    #[error("{step}: {source}")]
    Io {
        step: &'static str,
        source: io::Error,
    },
    /// `skipped`: the last messages that came meanwhile and were not the answer.
    #[error("{step}: no answer before the deadline{}", if .skipped.is_empty() { String::new() } else { format!(" (skipped: {})", .skipped) })]
    Timeout { step: &'static str, skipped: String },
    #[error("authentication refused: {0:?}")]
    Auth(String),
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The peer answered with an error message.
    #[error("{name}: {message}")]
    Remote { name: String, message: String },
    #[error("the peer closed the connection ({step})")]
    Closed { step: &'static str },
}

impl DbusError {
    /// The D-Bus error name of a remote error.
    pub fn remote_name(&self) -> Option<&str> {
        match self {
            DbusError::Remote { name, .. } => Some(name),
            _ => None,
        }
    }
}

type DResult<T> = std::result::Result<T, DbusError>;

/// The signals a connection keeps while it waits for a reply (the others are dropped).
pub type SignalFilter = fn(&Message) -> bool;

/// At most this many kept signals are buffered; older ones are dropped.
const MAX_KEPT_SIGNALS: usize = 1024;
/// A kept signal's body is at most this long (`JobRemoved`'s is `(uoss)`: a few hundred
/// bytes); a longer one is not systemd's answer and is dropped.
const MAX_KEPT_SIGNAL_BODY: usize = 4096;
/// A message longer than this is skipped as it arrives, never held whole: nothing the shim
/// waits for comes near it (systemd's replies and job signals are small), and a peer on the
/// bus could otherwise make the shim hold up to [`super::wire::MAX_MESSAGE`] per message.
const MAX_READ_MESSAGE: usize = 1 << 20;

/// On a bus: the well-known name we talk to and the unique name that owns it now.
struct Service {
    name: &'static str,
    /// `None` while nobody owns it (systemd re-executing: it leaves the bus and comes back
    /// under a new unique name).
    owner: Option<String>,
}

pub struct Conn {
    stream: UnixStream,
    inbuf: Vec<u8>,
    serial: u32,
    keep: Option<SignalFilter>,
    /// On the bus, once known: only signals from the service's current owner are kept (any
    /// local user may send us a signal there), and calls to it are answered by it alone.
    service: Option<Service>,
    /// Bytes still to skip of a message over [`MAX_READ_MESSAGE`].
    discard: usize,
    /// Signals that passed the filter, oldest first.
    pub signals: VecDeque<Message>,
    /// What the last messages skipped while waiting were, for a timeout's error.
    skipped: VecDeque<String>,
}

/// At most this many skipped messages are named in a timeout's error.
const MAX_SKIPPED_NAMED: usize = 4;

/// The whole authentication we send: a NUL byte, `AUTH EXTERNAL` with our uid (its decimal
/// digits, hex-encoded) and `BEGIN`.
fn auth_request() -> Vec<u8> {
    let uid = nix::unistd::getuid().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    format!("\0AUTH EXTERNAL {hex}\r\nBEGIN\r\n").into_bytes()
}

/// Milliseconds left until `deadline`, for poll; `None` when it has passed.
fn left(deadline: Instant) -> Option<PollTimeout> {
    let now = Instant::now();
    if now >= deadline {
        return None;
    }
    let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).ok()
}

fn wait_for(
    fd: std::os::fd::BorrowedFd<'_>,
    flags: PollFlags,
    deadline: Instant,
    step: &'static str,
) -> DResult<()> {
    // Waiting for the peer, not for a CPU (see crate::shim::blocking).
    let _blocked = crate::shim::blocking::blocking();
    loop {
        let timeout = left(deadline).ok_or(DbusError::Timeout {
            step,
            skipped: String::new(),
        })?;
        let mut fds = [PollFd::new(fd, flags)];
        match poll(&mut fds, timeout) {
            Ok(0) => continue, // loop to re-check the deadline
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                return Err(DbusError::Io {
                    step,
                    source: e.into(),
                });
            }
        }
    }
}

impl Conn {
    /// Connects to the socket at `path` and authenticates as our uid.
    pub fn connect(path: &Path, deadline: Instant) -> DResult<Conn> {
        let io = |step| {
            move |e: nix::errno::Errno| DbusError::Io {
                step,
                source: e.into(),
            }
        };
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(io("socket"))?;
        let addr = UnixAddr::new(path).map_err(io("socket address"))?;
        // A full listen backlog makes a non-blocking unix connect fail with EAGAIN; unlike
        // TCP's EINPROGRESS nothing is under way (POLLOUT is at once, SO_ERROR 0, the first
        // write ENOTCONN), so it is tried again, briefly apart, until the deadline.
        let mut attempt = connect(fd.as_raw_fd(), &addr);
        while attempt == Err(nix::errno::Errno::EAGAIN) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DbusError::Timeout {
                    step: "connect (the listen backlog is full)",
                    skipped: String::new(),
                });
            }
            {
                let _blocked = crate::shim::blocking::blocking();
                std::thread::sleep(left.min(std::time::Duration::from_millis(10)));
            }
            attempt = connect(fd.as_raw_fd(), &addr);
        }
        match attempt {
            Ok(()) => {}
            Err(nix::errno::Errno::EINPROGRESS) => {
                wait_for(fd.as_fd(), PollFlags::POLLOUT, deadline, "connect")?;
                let err = getsockopt(&fd, sockopt::SocketError).map_err(io("connect"))?;
                if err != 0 {
                    return Err(DbusError::Io {
                        step: "connect",
                        source: io::Error::from_raw_os_error(err),
                    });
                }
            }
            Err(e) => return Err(io("connect")(e)),
        }
        let mut conn = Conn {
            stream: UnixStream::from(fd),
            inbuf: Vec::new(),
            serial: 0,
            keep: None,
            service: None,
            discard: 0,
            signals: VecDeque::new(),
            skipped: VecDeque::new(),
        };
        conn.authenticate(deadline)?;
        Ok(conn)
    }

    /// SASL: a NUL byte, `AUTH EXTERNAL <our uid, its decimal digits hex-encoded>` and
    /// `BEGIN` in one write, then `OK <guid>` back; from there on the stream carries messages.
    /// `BEGIN` is not held back for the `OK` (see the module docs: sd-bus would otherwise
    /// park a first message that arrives in the same read as `BEGIN`). A server that refuses
    /// the `AUTH` answers the `BEGIN` with `ERROR`; we have failed on its `REJECTED` by then.
    fn authenticate(&mut self, deadline: Instant) -> DResult<()> {
        self.write_all(&auth_request(), deadline, "authenticate")?;
        let line = self.read_line(deadline)?;
        if !line.starts_with("OK ") {
            return Err(DbusError::Auth(line));
        }
        Ok(())
    }

    fn read_line(&mut self, deadline: Instant) -> DResult<String> {
        loop {
            if let Some(i) = self.inbuf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.inbuf.drain(..i + 2).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            if self.inbuf.len() > 4096 {
                return Err(DbusError::Auth("authentication line too long".into()));
            }
            self.fill(deadline, "authenticate")?;
        }
    }

    /// Keeps the signals `keep` accepts in [`Conn::signals`] while waiting for replies.
    pub fn keep_signals(&mut self, keep: SignalFilter) {
        self.keep = Some(keep);
    }

    /// On a bus: from now on the service `name` is owned by `owner` (its unique name) until
    /// the bus daemon's `NameOwnerChanged` for `name` says otherwise (the caller asked the
    /// daemon for those signals). Only signals from the current owner are kept (those kept
    /// from anyone else are dropped), and a call addressed to `name` is answered only by its
    /// owner (or, in its stead, with an error by the bus daemon).
    pub fn follow_service(&mut self, name: &'static str, owner: String) {
        self.signals
            .retain(|m| m.sender.as_deref() == Some(owner.as_str()));
        self.service = Some(Service {
            name,
            owner: Some(owner),
        });
    }

    /// The current owner of the followed service (`None`: none, or no service followed).
    pub fn service_owner(&self) -> Option<&str> {
        self.service.as_ref().and_then(|s| s.owner.as_deref())
    }

    fn write_all(&mut self, mut data: &[u8], deadline: Instant, step: &'static str) -> DResult<()> {
        while !data.is_empty() {
            match self.stream.write(data) {
                Ok(0) => return Err(DbusError::Closed { step }),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_for(self.stream.as_fd(), PollFlags::POLLOUT, deadline, step)?
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DbusError::Io { step, source: e }),
            }
        }
        Ok(())
    }

    /// Reads what is there (waiting for something until the deadline) into the buffer.
    fn fill(&mut self, deadline: Instant, step: &'static str) -> DResult<()> {
        let mut chunk = [0u8; 8192];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(DbusError::Closed { step }),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_for(self.stream.as_fd(), PollFlags::POLLIN, deadline, step)?
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DbusError::Io { step, source: e }),
            }
        }
    }

    /// The next whole message from the peer that decodes. One that is too long to hold
    /// ([`MAX_READ_MESSAGE`]) or does not decode (an unknown type, a malformed body) while its
    /// frame is sound is skipped and named for a timeout's error; a broken frame is an error
    /// (the stream cannot be followed past it).
    pub fn receive(&mut self, deadline: Instant, step: &'static str) -> DResult<Message> {
        loop {
            // Here too: skipped messages never go back to the caller's own check.
            self.check_deadline(deadline, step)?;
            if self.discard > 0 {
                let n = self.discard.min(self.inbuf.len());
                self.inbuf.drain(..n);
                self.discard -= n;
            }
            if self.discard == 0 && self.inbuf.len() >= 16 {
                let head: [u8; 16] = self.inbuf[..16].try_into().expect("16 bytes");
                let total = Message::total_len(&head)?;
                if total > MAX_READ_MESSAGE {
                    self.note(format!("a message of {total} bytes, skipped unread"));
                    self.discard = total;
                    continue;
                }
                if self.inbuf.len() >= total {
                    let m = Message::decode(&self.inbuf[..total]);
                    self.inbuf.drain(..total);
                    match m {
                        Ok(m) => return Ok(m),
                        Err(e) => {
                            self.note(format!("a message that does not decode: {e}"));
                            continue;
                        }
                    }
                }
            }
            self.fill(deadline, step)?;
        }
    }

    /// Sends `msg` with the next serial; returns the serial.
    pub fn send(
        &mut self,
        mut msg: Message,
        deadline: Instant,
        step: &'static str,
    ) -> DResult<u32> {
        self.serial = self.serial.wrapping_add(1).max(1);
        msg.serial = self.serial;
        self.write_all(&msg.encode(), deadline, step)?;
        Ok(msg.serial)
    }

    /// Calls a method and waits for its reply; an error reply is [`DbusError::Remote`].
    /// Kept signals that arrive meanwhile are buffered; other messages are dropped.
    pub fn call(
        &mut self,
        msg: Message,
        deadline: Instant,
        step: &'static str,
    ) -> DResult<Message> {
        self.skipped.clear();
        let destination = msg.destination.clone();
        let serial = self.send(msg, deadline, step)?;
        loop {
            // Checked here too, not only when a read would block: a peer that keeps the
            // socket readable (a flood of other messages) must not hold the call past it.
            self.check_deadline(deadline, step)?;
            let m = match self.receive(deadline, step) {
                Ok(m) => m,
                Err(e) => return Err(self.annotate(e)),
            };
            let answer =
                m.reply_serial == Some(serial) && self.may_answer(destination.as_deref(), &m);
            match m.kind {
                Kind::MethodReturn if answer => return Ok(m),
                Kind::Error if answer => {
                    let message = m
                        .body()
                        .ok()
                        .and_then(|b| b.first().and_then(|v| v.as_str().map(String::from)))
                        .unwrap_or_default();
                    return Err(DbusError::Remote {
                        name: m.error_name.unwrap_or_default(),
                        message,
                    });
                }
                Kind::Signal => {
                    self.skip(&m);
                    self.keep_signal(m)
                }
                _ => self.skip(&m),
            }
        }
    }

    /// Whether `m` may be the answer to a call to `destination`: on a direct connection
    /// (no destination) only the peer can send; on a bus the bus daemon sets every sender, so
    /// a call to the daemon is answered by the daemon, a call to the followed service by its
    /// current owner or, with an error (`NoReply`, `ServiceUnknown`...), by the daemon in its
    /// stead. Any other local user on a bus whose policy lets them send us a method return
    /// with our serial is not taken for systemd.
    fn may_answer(&self, destination: Option<&str>, m: &Message) -> bool {
        let sender = m.sender.as_deref();
        match destination {
            None => true,
            Some(BUS_DRIVER) => sender == Some(BUS_DRIVER),
            Some(d) => match &self.service {
                Some(s) if s.name == d => {
                    (s.owner.is_some() && sender == s.owner.as_deref())
                        || (m.kind == Kind::Error && sender == Some(BUS_DRIVER))
                }
                // A destination we do not follow: only the daemon's error is known to be true.
                _ => m.kind == Kind::Error && sender == Some(BUS_DRIVER),
            },
        }
    }

    /// The bus daemon's `NameOwnerChanged(name, old, new)` for the followed service: its
    /// owner is `new` from now on (none when empty). Only the daemon's own signal counts.
    fn observe_owner(&mut self, m: &Message) {
        let Some(service) = self.service.as_mut() else {
            return;
        };
        if m.kind != Kind::Signal
            || m.sender.as_deref() != Some(BUS_DRIVER)
            || m.interface.as_deref() != Some(BUS_DRIVER)
            || m.member.as_deref() != Some("NameOwnerChanged")
        {
            return;
        }
        let Ok(body) = m.body() else { return };
        if let [Value::Str(name), Value::Str(_old), Value::Str(new)] = body.as_slice()
            && name == service.name
        {
            log::debug!("D-Bus: {name} is now owned by {new:?}");
            service.owner = (!new.is_empty()).then(|| new.clone());
        }
    }

    /// Notes a message that was not what we waited for.
    fn skip(&mut self, m: &Message) {
        self.note(format!(
            "{:?} {}.{} serial {} reply to {:?}",
            m.kind,
            m.interface.as_deref().unwrap_or("-"),
            m.member.as_deref().unwrap_or("-"),
            m.serial,
            m.reply_serial
        ));
    }

    fn note(&mut self, what: String) {
        if self.skipped.len() == MAX_SKIPPED_NAMED {
            self.skipped.pop_front();
        }
        self.skipped.push_back(what);
    }

    /// A timeout (naming what was skipped) once `deadline` has passed.
    fn check_deadline(&mut self, deadline: Instant, step: &'static str) -> DResult<()> {
        if Instant::now() < deadline {
            return Ok(());
        }
        Err(self.annotate(DbusError::Timeout {
            step,
            skipped: String::new(),
        }))
    }

    /// A timeout's error names the messages skipped meanwhile.
    fn annotate(&mut self, e: DbusError) -> DbusError {
        match e {
            DbusError::Timeout { step, .. } => DbusError::Timeout {
                step,
                skipped: self.skipped.drain(..).collect::<Vec<_>>().join("; "),
            },
            e => e,
        }
    }

    fn keep_signal(&mut self, m: Message) {
        self.observe_owner(&m);
        let from_ok = match &self.service {
            Some(s) => s.owner.is_some() && m.sender.as_deref() == s.owner.as_deref(),
            None => true,
        };
        if from_ok && m.body.len() <= MAX_KEPT_SIGNAL_BODY && self.keep.is_some_and(|keep| keep(&m))
        {
            if self.signals.len() == MAX_KEPT_SIGNALS {
                self.signals.pop_front();
            }
            self.signals.push_back(m);
        }
    }

    /// Waits for the next kept signal (buffered ones first).
    pub fn next_signal(&mut self, deadline: Instant, step: &'static str) -> DResult<Message> {
        loop {
            if let Some(m) = self.signals.pop_front() {
                return Ok(m);
            }
            self.check_deadline(deadline, step)?;
            let m = match self.receive(deadline, step) {
                Ok(m) => m,
                Err(e) => return Err(self.annotate(e)),
            };
            self.skip(&m);
            if m.kind == Kind::Signal {
                self.keep_signal(m);
            }
        }
    }
}
