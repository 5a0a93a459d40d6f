//! Process stdio: containerd's fifos (or files) handed straight to the container.
//!
//! Without a terminal the shim copies no output: the stdout/stderr fifo (or log file)
//! descriptors go to runc, which gives them to the process as fds 1 and 2. The shim keeps one
//! `O_RDWR` "keepalive" descriptor per output fifo while the process runs: while containerd
//! restarts nobody reads, and our keepalive (a reader) makes the container block on a full pipe
//! instead of dying of SIGPIPE, as with containerd's own shim. It is dropped when the process
//! exits, so the client then sees EOF.
//!
//! stdin is not copied either: the process reads the client's fifo directly, and the shim
//! keeps a write end of that fifo open until CloseIO (or the process's exit). A fifo reader sees
//! EOF only when no writer is left, so a client that closes its end merely detaches (`ctr task
//! attach`, `kubectl attach -i`): the process waits, and a client that opens the fifo later
//! reattaches. CloseIO closes our end, and the process reads EOF once no client holds the fifo
//! open either: containerd's runc shim has the same rule (its own writer, closed on CloseIO).
//! Our writer also exists before the process starts, so it never reads a premature EOF.
//!
//! With a terminal, runc gives us the pty master and one small thread copies between it and
//! the fifos (see [`TtyCopier`]).
//!
//! A process with an SELinux process label (`process.selinuxLabel`) gets neither the fifos
//! nor the log file: under enforcing, its domain (`container_t`) may not write containerd's
//! fifos (`container_runtime_t`). It gets pipes of the shim's own, and one thread copies
//! between them and the client's fifos (see [`copy`]), as containerd's runc shim does for
//! every process. The rules above hold there too: the keepalives, stdin's EOF after CloseIO
//! once no client holds the fifo, a detaching client, and the exit published only after the
//! output is delivered.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, poll};

use crate::host::client_paths::{self, FifoEnd};
use crate::host::runtime::ProcessIo;
use crate::records::error::{Context, Error, Result};
pub use copy::{DRAIN_LIMIT, PipeCopier};
use copy::{Pipes, Sink, drain_timeout, poke, set_nonblocking};

pub mod copy;

/// Where one stdio stream goes, parsed from containerd's string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nothing (empty string): /dev/null.
    None,
    /// A fifo created by the client (a plain path, or `fifo://path`).
    Fifo(PathBuf),
    /// A file to append to (`file:///path`), e.g. `ctr run --log-uri file:///...`.
    File(PathBuf),
}

/// Parses containerd's stdio string. `binary://` loggers are refused with Unimplemented.
pub fn parse_target(stream: &str, s: &str) -> Result<Target> {
    if s.is_empty() {
        return Ok(Target::None);
    }
    let (path, file) = if let Some(p) = s.strip_prefix("file://") {
        (p, true)
    } else if let Some(p) = s.strip_prefix("fifo://") {
        (p, false)
    } else if s.starts_with("binary://") {
        return Err(Error::unimplemented(format!(
            "{stream} {s:?}: binary:// loggers are not supported, use a fifo or file://"
        )));
    } else if s.contains("://") {
        return Err(Error::invalid(format!(
            "{stream} {s:?}: unsupported scheme"
        )));
    } else {
        (s, false)
    };
    let p = Path::new(path);
    if !p.is_absolute()
        || path.contains('\0')
        || p.components().any(|c| c == std::path::Component::ParentDir)
    {
        return Err(Error::invalid(format!(
            "{stream} {s:?}: must be an absolute path without '..'"
        )));
    }
    Ok(if file {
        Target::File(p.to_path_buf())
    } else {
        Target::Fifo(p.to_path_buf())
    })
}

/// The client's stdio request for one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioRequest {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

impl StdioRequest {
    /// Checks every stream string without opening anything.
    pub fn validate(&self) -> Result<()> {
        parse_target("stdin", &self.stdin)?;
        parse_target("stdout", &self.stdout)?;
        parse_target("stderr", &self.stderr)?;
        if matches!(parse_target("stdin", &self.stdin)?, Target::File(_)) {
            return Err(Error::invalid("stdin cannot be a file:// target"));
        }
        Ok(())
    }
}

/// Descriptors the shim keeps while the process lives (see the module docs).
#[derive(Debug, Default)]
pub struct Keepalive {
    /// Our write end of the stdin fifo.
    stdin: Option<File>,
    outputs: Vec<File>,
}

impl Keepalive {
    /// CloseIO: the process reads EOF once no client holds the stdin fifo open.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
    /// Whether the shim still holds the stdin fifo open (tests).
    pub fn holds_stdin(&self) -> bool {
        self.stdin.is_some()
    }
    /// The process exited: let output readers see EOF.
    pub fn release(&mut self) {
        self.stdin = None;
        self.outputs.clear();
    }
}

/// What [`open`] produced for a non-terminal process.
#[derive(Debug)]
pub struct Opened {
    pub process: ProcessIo,
    pub keepalive: Keepalive,
    /// The shim's ends of the process's pipes, for a [`PipeCopier`] (a labelled process).
    pub pipes: Option<Pipes>,
}

/// Whether a process (the OCI `process` object) runs with an SELinux process label: its
/// stdio then goes through the shim's pipes (see the module docs).
pub fn has_process_label(process: &serde_json::Value) -> bool {
    process
        .get("selinuxLabel")
        .and_then(|l| l.as_str())
        .is_some_and(|l| !l.is_empty())
}

fn open_fifo_rdwr(path: &Path) -> Result<File> {
    client_paths::open_fifo(path, FifoEnd::ReadWrite).and_then(|f| client_paths::blocking(f, path))
}

/// Opens the write end of `path` (a fifo with a live reader: our keepalive) without
/// blocking, then makes the descriptor blocking for the container.
fn open_fifo_writer(path: &Path) -> Result<File> {
    client_paths::open_fifo(path, FifoEnd::Write).and_then(|f| client_paths::blocking(f, path))
}

/// Opens the streams of a non-terminal process: descriptors for the process and keepalives,
/// and with `copy` the pipes the process gets instead of the client's fifos and files.
pub fn open(req: &StdioRequest, copy: bool) -> Result<Opened> {
    if copy {
        return open_copied(req);
    }
    let mut keepalive = Keepalive::default();
    let mut process = ProcessIo::default();
    if let Target::Fifo(p) = parse_target("stdin", &req.stdin)? {
        // The process's read end first (no writer is needed to open it), then our writer
        // (which needs a reader), then the read end becomes blocking for the process.
        let reader = client_paths::open_fifo(&p, FifoEnd::Read)?;
        keepalive.stdin = Some(client_paths::open_fifo(&p, FifoEnd::Write)?);
        process.stdin = Some(OwnedFd::from(client_paths::blocking(reader, &p)?));
    }
    let mut output = |name: &str, s: &str| -> Result<Option<OwnedFd>> {
        Ok(match parse_target(name, s)? {
            Target::None => None,
            Target::File(p) => Some(OwnedFd::from(client_paths::open_log_file(&p)?)),
            Target::Fifo(p) => {
                keepalive.outputs.push(open_fifo_rdwr(&p)?);
                Some(OwnedFd::from(open_fifo_writer(&p)?))
            }
        })
    };
    process.stdout = output("stdout", &req.stdout)?;
    // Same target as stdout (e.g. a single log file): share the description.
    process.stderr = match &process.stdout {
        Some(out) if req.stderr == req.stdout => Some(out.try_clone().context("dup stdout")?),
        _ => output("stderr", &req.stderr)?,
    };
    Ok(Opened {
        process,
        keepalive,
        pipes: None,
    })
}

/// [`open`] for a labelled process: the client's fifos and files are the copier's, the
/// process gets pipes. Nothing blocks: the fifos are opened non-blocking.
fn open_copied(req: &StdioRequest) -> Result<Opened> {
    let mut keepalive = Keepalive::default();
    let mut process = ProcessIo::default();
    let mut pipes = Pipes::default();
    if let Target::Fifo(p) = parse_target("stdin", &req.stdin)? {
        // Our reader first (no writer is needed to open it), then our writer, the keepalive
        // CloseIO drops (it needs a reader).
        let reader = client_paths::open_fifo(&p, FifoEnd::Read)?;
        keepalive.stdin = Some(client_paths::open_fifo(&p, FifoEnd::Write)?);
        process.stdin = Some(pipes.add_stdin(reader)?);
    }
    let mut output = |name: &'static str, s: &str| -> Result<Option<OwnedFd>> {
        let sink = match parse_target(name, s)? {
            Target::None => return Ok(None),
            Target::File(p) => Sink::File(client_paths::open_log_file(&p)?),
            Target::Fifo(p) => Sink::Fifo(open_fifo_rdwr(&p)?),
        };
        pipes.add_output(name, sink).map(Some)
    };
    process.stdout = output("stdout", &req.stdout)?;
    // Same target as stdout: one pipe, so the two keep their order.
    process.stderr = match &process.stdout {
        Some(out) if req.stderr == req.stdout => Some(out.try_clone().context("dup stdout")?),
        _ => output("stderr", &req.stderr)?,
    };
    Ok(Opened {
        process,
        keepalive,
        pipes: (!pipes.is_empty()).then_some(pipes),
    })
}

/// What a terminal's copier is told, set before its wake-up pipe is poked: flags rather than
/// bytes in the pipe, so that no notice is lost when the pipe is full.
#[derive(Default)]
struct Notices {
    /// CloseIO: forward what stdin holds, send the EOF character, stop forwarding.
    stdin_closed: AtomicBool,
    /// The process exited: deliver what is left, within [`DRAIN_LIMIT`].
    exited: AtomicBool,
}

/// The terminal side of a process: the pty master plus the copy thread.
pub struct TtyCopier {
    master: Arc<File>,
    notices: Arc<Notices>,
    /// Write end of the copier's wake-up pipe (non-blocking: the reaper thread pokes it).
    wake: File,
}

impl TtyCopier {
    /// Starts the copy thread between `master` and the client's fifos. `on_drained` runs on
    /// that thread once the output is delivered (or dropped, see [`DRAIN_LIMIT`]) after the
    /// process exited. `label` names the process in the log.
    pub fn start(
        master: File,
        req: &StdioRequest,
        label: String,
        on_drained: Box<dyn FnOnce() + Send>,
    ) -> Result<TtyCopier> {
        let stdin = match parse_target("stdin", &req.stdin)? {
            Target::Fifo(p) => Some(open_fifo_rdwr(&p)?),
            _ => None,
        };
        let stdout = match parse_target("stdout", &req.stdout)? {
            Target::Fifo(p) => Some(open_fifo_rdwr(&p)?),
            Target::File(p) => Some(client_paths::open_log_file(&p)?),
            Target::None => None,
        };
        let (rx, tx) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).context("tty wake-up pipe")?;
        let master = Arc::new(master);
        let notices = Arc::new(Notices::default());
        let (m, n) = (master.clone(), notices.clone());
        std::thread::Builder::new()
            .name("tty".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                // Whatever happens to the copy, the exit must not stay held behind it.
                crate::shim::panic_hook::survive("tty copier", || {
                    let ends = TtyEnds {
                        master: &m,
                        stdin,
                        stdout,
                    };
                    copy_loop(ends, File::from(rx), &n, &label)
                });
                on_drained();
            })
            .context("start tty copier")?;
        Ok(TtyCopier {
            master,
            notices,
            wake: File::from(tx),
        })
    }

    /// ResizePty.
    pub fn resize(&self, width: u16, height: u16) -> Result<()> {
        let ws = libc::winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
        let r = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if r < 0 {
            return Err(Error::from(io::Error::last_os_error()).context("resize pty"));
        }
        Ok(())
    }

    /// CloseIO on a terminal: forward what stdin holds, send the EOF, stop forwarding.
    pub fn close_stdin(&self) {
        self.notices.stdin_closed.store(true, Ordering::SeqCst);
        poke(&self.wake);
    }

    /// The process exited: deliver what is left (within [`DRAIN_LIMIT`]) and finish. Never
    /// blocks: the reaper thread calls it.
    pub fn process_exited(&self) {
        self.notices.exited.store(true, Ordering::SeqCst);
        poke(&self.wake);
    }
}

/// The terminal's end-of-file character (VEOF, ^D by default) when the terminal is in
/// canonical mode, so a process reading it reads EOF as it would from a keyboard. Raw-mode
/// programs get nothing: they decide themselves what ends their input.
fn eof_char(master: &File) -> Option<u8> {
    let t = nix::sys::termios::tcgetattr(master.as_fd()).ok()?;
    t.local_flags
        .contains(nix::sys::termios::LocalFlags::ICANON)
        .then(|| t.control_chars[nix::sys::termios::SpecialCharacterIndices::VEOF as usize])
}

/// The descriptors a copier moves bytes between.
struct TtyEnds<'a> {
    master: &'a File,
    /// The client's stdin fifo (our `O_RDWR` descriptor), until CloseIO.
    stdin: Option<File>,
    /// The client's stdout fifo or log file.
    stdout: Option<File>,
}

/// Bytes read but not written yet.
#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    at: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }
    fn len(&self) -> usize {
        self.data.len() - self.at
    }
    fn fill(&mut self, bytes: &[u8]) {
        if self.is_empty() {
            self.data.clear();
            self.at = 0;
        }
        self.data.extend_from_slice(bytes);
    }
    fn clear(&mut self) {
        self.data.clear();
        self.at = 0;
    }
    /// Writes what it can without blocking. Err: the target is broken (not just full).
    fn write_to(&mut self, mut target: &File) -> io::Result<()> {
        while !self.is_empty() {
            match target.write(&self.data[self.at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        self.clear();
        Ok(())
    }
}

/// Reads what `from` holds now (non-blocking) into `to`, at most `limit` bytes. Ok(false): EOF
/// or a broken descriptor.
fn read_available(from: &File, to: &mut Pending, buf: &mut [u8], limit: usize) -> bool {
    let mut total = 0;
    while total < limit {
        match (&*from).read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                to.fill(&buf[..n]);
                total += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Copies between the pty master and the client's fifos with non-blocking descriptors only,
/// so it always hears its notices: while the process runs, a client that does not read holds
/// the process back (it blocks writing its terminal, as with containerd's runc shim); once the
/// process exited, the copier finishes within [`DRAIN_LIMIT`] whatever the client does.
fn copy_loop(mut ends: TtyEnds<'_>, wake: File, notices: &Notices, label: &str) {
    let master = ends.master;
    set_nonblocking(master);
    for f in [&ends.stdin, &ends.stdout].into_iter().flatten() {
        set_nonblocking(f);
    }
    const CHUNK: usize = 32 * 1024;
    let mut buf = vec![0u8; CHUNK];
    let mut to_client = Pending::default();
    let mut to_tty = Pending::default();
    // Set once the process exited: the copier ends by then.
    let mut deadline: Option<Instant> = None;
    // The master reported a hang-up or error: every slave is closed and its buffer was read.
    let mut master_done = false;
    loop {
        let now = Instant::now();
        if let Some(d) = deadline
            && now >= d
        {
            if !to_client.is_empty() {
                log::warn!(
                    "tty of {label}: {} bytes of output dropped: not read within {DRAIN_LIMIT:?} of the exit",
                    to_client.len()
                );
            }
            break;
        }
        if deadline.is_some() && master_done && to_client.is_empty() {
            break;
        }
        // Read more output only once the last is delivered: a client that does not read
        // stops the process at its terminal, not the shim's memory.
        let mut master_events = PollFlags::empty();
        if !master_done && to_client.is_empty() {
            master_events |= PollFlags::POLLIN;
        }
        if !to_tty.is_empty() {
            master_events |= PollFlags::POLLOUT;
        }
        let mut fds = Vec::with_capacity(4);
        let mut slot = [None::<usize>; 4]; // master, wake, stdin, stdout
        if !master_events.is_empty() {
            slot[0] = Some(fds.len());
            fds.push(PollFd::new(master.as_fd(), master_events));
        }
        if deadline.is_none() {
            slot[1] = Some(fds.len());
            fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
            if let Some(s) = &ends.stdin
                && to_tty.is_empty()
            {
                slot[2] = Some(fds.len());
                fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            }
        }
        if let Some(o) = &ends.stdout
            && !to_client.is_empty()
        {
            slot[3] = Some(fds.len());
            fds.push(PollFd::new(o.as_fd(), PollFlags::POLLOUT));
        }
        let timeout = drain_timeout(deadline, now);
        let n = match poll(&mut fds, timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                log::warn!("tty of {label}: poll: {e}");
                break;
            }
        };
        if n == 0 && deadline.is_some() && to_client.is_empty() {
            break; // drained: nothing more within DRAIN_IDLE
        }
        let ready: Vec<PollFlags> = fds
            .iter()
            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let is_ready = |i: usize| slot[i].is_some_and(|k| !ready[k].is_empty());
        if is_ready(0) {
            let ev = ready[slot[0].unwrap_or_default()];
            if ev.contains(PollFlags::POLLOUT) && to_tty.write_to(master).is_err() {
                to_tty.clear();
            }
            let hangup = ev.intersects(PollFlags::POLLHUP | PollFlags::POLLERR);
            if hangup && !master_events.contains(PollFlags::POLLIN) {
                // Every slave is closed: input has no reader. The master is polled again
                // (to read the rest of the output) once the pending output is delivered.
                to_tty.clear();
            }
            if master_events.contains(PollFlags::POLLIN)
                && (hangup || ev.contains(PollFlags::POLLIN))
            {
                // EIO once every slave fd is closed; with no output target, output is dropped.
                master_done = !read_available(master, &mut to_client, &mut buf, CHUNK);
                if ends.stdout.is_none() {
                    to_client.clear();
                }
            }
        }
        if !to_client.is_empty()
            && let Some(o) = &ends.stdout
            && to_client.write_to(o).is_err()
        {
            log::debug!("tty of {label}: output target broken, output dropped");
            ends.stdout = None;
            to_client.clear();
        }
        if is_ready(1) {
            while (&wake).read(&mut buf[..64]).is_ok_and(|n| n > 0) {}
            if notices.stdin_closed.load(Ordering::SeqCst)
                && let Some(s) = ends.stdin.take()
            {
                // What the client wrote before CloseIO goes first, then the EOF.
                read_available(&s, &mut to_tty, &mut buf, usize::MAX);
                if let Some(eof) = eof_char(master) {
                    to_tty.fill(&[eof]);
                }
            }
            if notices.exited.load(Ordering::SeqCst) {
                deadline = Some(Instant::now() + DRAIN_LIMIT);
            }
        }
        if is_ready(2)
            && let Some(s) = &ends.stdin
            && !read_available(s, &mut to_tty, &mut buf, CHUNK)
        {
            ends.stdin = None;
        }
        if !to_tty.is_empty() && to_tty.write_to(master).is_err() {
            to_tty.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::error::Kind;
    use nix::fcntl::{FcntlArg, fcntl};
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Duration;

    #[test]
    fn parses_the_schemes_containerd_sends() {
        assert_eq!(parse_target("stdout", "").unwrap(), Target::None);
        assert_eq!(
            parse_target("stdout", "/run/x/fifo").unwrap(),
            Target::Fifo("/run/x/fifo".into())
        );
        assert_eq!(
            parse_target("stdout", "fifo:///run/f").unwrap(),
            Target::Fifo("/run/f".into())
        );
        assert_eq!(
            parse_target("stdout", "file:///var/log/c.log").unwrap(),
            Target::File("/var/log/c.log".into())
        );
        assert_eq!(
            parse_target("stdout", "binary:///bin/logger")
                .unwrap_err()
                .kind(),
            Kind::Unimplemented
        );
        for bad in ["relative/fifo", "/a/../b", "tcp://x", "file://rel"] {
            assert_eq!(
                parse_target("stdout", bad).unwrap_err().kind(),
                Kind::InvalidArgument,
                "{bad}"
            );
        }
    }

    fn mkfifo(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn output_reaches_reader_and_eof_follows_release() {
        let dir = tempfile::tempdir().unwrap();
        let out = mkfifo(dir.path(), "out");
        // The client opens its read end first, non-blocking, as containerd's cio does.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&out)
            .unwrap();
        let req = StdioRequest {
            stdout: out.display().to_string(),
            ..Default::default()
        };
        let Opened {
            process,
            mut keepalive,
            ..
        } = open(&req, false).unwrap();
        let mut w = File::from(process.stdout.unwrap());
        w.write_all(b"hello").unwrap();
        drop(w); // the "container" exits
        let mut buf = [0u8; 16];
        assert_eq!(reader.read(&mut buf).unwrap(), 5);
        // The keepalive still holds a writer: no EOF yet, only EAGAIN.
        assert_eq!(
            reader.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        keepalive.release();
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
    }

    /// The process's stdin, made non-blocking so a test can tell "no data yet" from EOF.
    fn nonblocking(fd: OwnedFd) -> File {
        let f = File::from(fd);
        let flags = OFlag::from_bits_truncate(fcntl(f.as_fd(), FcntlArg::F_GETFL).unwrap());
        fcntl(f.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).unwrap();
        f
    }

    fn read_now(f: &mut File) -> io::Result<Vec<u8>> {
        let mut buf = [0u8; 64];
        let n = f.read(&mut buf)?;
        Ok(buf[..n].to_vec())
    }

    #[test]
    fn stdin_survives_a_client_that_detaches_and_ends_at_close_io() {
        let dir = tempfile::tempdir().unwrap();
        let inp = mkfifo(dir.path(), "in");
        let req = StdioRequest {
            stdin: inp.display().to_string(),
            ..Default::default()
        };
        let Opened {
            process,
            mut keepalive,
            ..
        } = open(&req, false).unwrap();
        let mut r = nonblocking(process.stdin.unwrap());
        // No client yet: no data, and no premature EOF.
        assert_eq!(
            read_now(&mut r).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
        client.write_all(b"one\n").unwrap();
        drop(client); // the client detaches
        assert_eq!(read_now(&mut r).unwrap(), b"one\n");
        assert_eq!(
            read_now(&mut r).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "a detached client must not end the process's input"
        );
        // A second client reattaches.
        let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
        client.write_all(b"two\n").unwrap();
        drop(client);
        assert_eq!(read_now(&mut r).unwrap(), b"two\n");
        keepalive.close_stdin(); // CloseIO
        assert_eq!(read_now(&mut r).unwrap(), b"", "EOF after CloseIO");
    }

    #[test]
    fn after_close_io_eof_comes_once_the_client_closes_too() {
        let dir = tempfile::tempdir().unwrap();
        let inp = mkfifo(dir.path(), "in");
        let req = StdioRequest {
            stdin: inp.display().to_string(),
            ..Default::default()
        };
        let Opened {
            process,
            mut keepalive,
            ..
        } = open(&req, false).unwrap();
        let mut r = nonblocking(process.stdin.unwrap());
        let client = OpenOptions::new().write(true).open(&inp).unwrap();
        keepalive.close_stdin();
        assert_eq!(
            read_now(&mut r).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(client);
        assert_eq!(read_now(&mut r).unwrap(), b"");
    }

    #[test]
    fn close_io_on_a_tty_forwards_what_stdin_holds_before_the_eof() {
        let dir = tempfile::tempdir().unwrap();
        let inp = mkfifo(dir.path(), "in");
        let stdin = open_fifo_rdwr(&inp).unwrap(); // as TtyCopier::start opens it
        // The client writes its last line and detaches; CloseIO and the exit arrive before
        // the copier has read the line (`ctr` calls CloseIO right after its last write).
        let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
        client.write_all(b"two\n").unwrap();
        drop(client);
        let pty = nix::pty::openpty(None, None).unwrap();
        let master = File::from(pty.master);
        let slave = nonblocking(pty.slave);
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        File::from(tx).write_all(b"!").unwrap();
        let notices = Notices::default();
        notices.stdin_closed.store(true, Ordering::SeqCst);
        notices.exited.store(true, Ordering::SeqCst);
        let ends = TtyEnds {
            master: &master,
            stdin: Some(stdin),
            stdout: None,
        };
        copy_loop(ends, File::from(rx), &notices, "test");
        // The process reads the line, then end-of-file.
        let mut slave = slave;
        assert_eq!(read_now(&mut slave).unwrap(), b"two\n");
        assert_eq!(read_now(&mut slave).unwrap(), b"", "VEOF after the line");
    }

    /// Issue 14 item 4: a client that holds its stdout fifo open and never reads must not hold
    /// the exit: once told the process exited, the copier gives up within the drain limit
    /// (the bound for the exit to become visible is 2 s).
    #[test]
    fn a_client_that_never_reads_does_not_hold_the_copier_after_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let out = mkfifo(dir.path(), "out");
        let stdout = open_fifo_rdwr(&out).unwrap(); // as TtyCopier::start opens it
        let pty = nix::pty::openpty(None, None).unwrap();
        let master = File::from(pty.master);
        // The "process": writes far more than the fifo and the pty hold (like `yes`).
        let slave = File::from(pty.slave);
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'y'; 64 * 1024];
            let mut total = 0usize;
            while total < 8 << 20 {
                match (&slave).write(&chunk) {
                    Ok(n) => total += n,
                    Err(_) => break, // EIO: the master was closed
                }
            }
            total
        });
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let wake = File::from(tx);
        let notices = Arc::new(Notices::default());
        let (n2, m2) = (notices.clone(), master.try_clone().unwrap());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let ends = TtyEnds {
                master: &m2,
                stdin: None,
                stdout: Some(stdout),
            };
            copy_loop(ends, File::from(rx), &n2, "test");
            let _ = done_tx.send(());
        });
        // The copier is stuck on the full fifo, and must stay: the process still runs.
        std::thread::sleep(Duration::from_millis(300));
        assert!(done_rx.try_recv().is_err(), "gave up while the process ran");
        let told = Instant::now();
        notices.exited.store(true, Ordering::SeqCst);
        poke(&wake);
        done_rx
            .recv_timeout(Duration::from_secs(2))
            .expect("the copier still holds the exit 2 s after it was told");
        assert!(told.elapsed() >= DRAIN_LIMIT / 2, "gave up too early");
        drop(master);
        writer.join().unwrap();
    }

    #[test]
    fn file_targets_append_and_stderr_can_share_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("logs/c.log");
        let uri = format!("file://{}", log.display());
        let req = StdioRequest {
            stdout: uri.clone(),
            stderr: uri,
            ..Default::default()
        };
        let Opened { process, .. } = open(&req, false).unwrap();
        File::from(process.stdout.unwrap())
            .write_all(b"out\n")
            .unwrap();
        File::from(process.stderr.unwrap())
            .write_all(b"err\n")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "out\nerr\n");
    }

    #[test]
    fn a_regular_file_is_not_taken_for_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plain");
        std::fs::write(&p, "").unwrap();
        let req = StdioRequest {
            stdout: p.display().to_string(),
            ..Default::default()
        };
        assert_eq!(open(&req, false).unwrap_err().kind(), Kind::InvalidArgument);
        assert_eq!(open(&req, true).unwrap_err().kind(), Kind::InvalidArgument);
    }
}
