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

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::client_paths::{self, FifoEnd};
use crate::error::{Context, Error, Result};
use crate::runtime::ProcessIo;

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
}

fn open_fifo_rdwr(path: &Path) -> Result<File> {
    client_paths::open_fifo(path, FifoEnd::ReadWrite).and_then(|f| client_paths::blocking(f, path))
}

/// Opens the write end of `path` (a fifo with a live reader: our keepalive) without
/// blocking, then makes the descriptor blocking for the container.
fn open_fifo_writer(path: &Path) -> Result<File> {
    client_paths::open_fifo(path, FifoEnd::Write).and_then(|f| client_paths::blocking(f, path))
}

/// Opens the streams of a non-terminal process: descriptors for the process and keepalives.
pub fn open(req: &StdioRequest) -> Result<Opened> {
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
    Ok(Opened { process, keepalive })
}

/// The terminal side of a process: the pty master plus the copy thread.
pub struct TtyCopier {
    master: Arc<File>,
    /// Writing a byte tells the thread: stdin is closed (`b'i'`) or the process exited (`b'x'`).
    control: File,
}

impl TtyCopier {
    /// Starts the copy thread between `master` and the client's fifos. `on_drained` runs on
    /// that thread once the output is flushed after the process exited.
    pub fn start(
        master: File,
        req: &StdioRequest,
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
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC).context("tty control pipe")?;
        let master = Arc::new(master);
        let m = master.clone();
        std::thread::Builder::new()
            .name("tty".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                // Whatever happens to the copy, the exit must not stay held behind it.
                crate::panic_hook::survive("tty copier", || {
                    copy_loop(&m, stdin, stdout, File::from(rx))
                });
                on_drained();
            })
            .context("start tty copier")?;
        Ok(TtyCopier {
            master,
            control: File::from(tx),
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
        let _ = (&self.control).write_all(b"i");
    }

    /// The process exited: flush what is left and finish.
    pub fn process_exited(&self) {
        let _ = (&self.control).write_all(b"x");
    }
}

/// CloseIO on a terminal: the terminal's end-of-file character (VEOF, ^D by default), so a
/// process reading the terminal in canonical mode reads EOF as it would from a keyboard.
/// Raw-mode programs get nothing: they decide themselves what ends their input.
fn send_eof(master: &File) {
    let Ok(t) = nix::sys::termios::tcgetattr(master.as_fd()) else {
        return;
    };
    if t.local_flags
        .contains(nix::sys::termios::LocalFlags::ICANON)
    {
        let eof = t.control_chars[nix::sys::termios::SpecialCharacterIndices::VEOF as usize];
        let _ = (&*master).write_all(&[eof]);
    }
}

/// Copies what the stdin fifo holds right now to the terminal (CloseIO may be seen before the
/// last bytes a client wrote, and they must not be lost). We hold a writer on the fifo
/// ourselves, so the read must not block once it is empty.
fn forward_pending(stdin: &File, master: &File, buf: &mut [u8]) {
    let Ok(flags) = fcntl(stdin.as_fd(), FcntlArg::F_GETFL) else {
        return;
    };
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    if fcntl(stdin.as_fd(), FcntlArg::F_SETFL(flags)).is_err() {
        return;
    }
    loop {
        match (&*stdin).read(buf) {
            Ok(0) => return,
            Ok(n) => {
                if (&*master).write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return, // EAGAIN: nothing more
        }
    }
}

/// How long the copier waits for more output once the process has exited.
const DRAIN_IDLE: Duration = Duration::from_millis(50);

fn copy_loop(master: &File, mut stdin: Option<File>, mut stdout: Option<File>, mut control: File) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut draining = false;
    loop {
        let mut fds = vec![PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        if !draining {
            fds.push(PollFd::new(control.as_fd(), PollFlags::POLLIN));
            if let Some(s) = &stdin {
                fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
            }
        }
        let timeout = if draining {
            PollTimeout::from(DRAIN_IDLE.as_millis() as u16)
        } else {
            PollTimeout::NONE
        };
        match poll(&mut fds, timeout) {
            Ok(0) => break, // drained: nothing more within DRAIN_IDLE
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            match (&*master).read(&mut buf) {
                Ok(0) | Err(_) => break, // EIO: every slave fd is closed
                Ok(n) => {
                    if let Some(out) = stdout.as_mut()
                        && out.write_all(&buf[..n]).is_err()
                    {
                        stdout = None;
                    }
                }
            }
        }
        if draining {
            continue;
        }
        if ready[1] {
            let mut c = [0u8; 16];
            match control.read(&mut c) {
                Ok(0) | Err(_) => draining = true,
                Ok(n) => {
                    if c[..n].contains(&b'i')
                        && let Some(s) = stdin.take()
                    {
                        // What the client wrote before CloseIO goes first, then the EOF.
                        forward_pending(&s, master, &mut buf);
                        send_eof(master);
                    }
                    if c[..n].contains(&b'x') {
                        draining = true;
                    }
                }
            }
        }
        if ready.get(2) == Some(&true)
            && let Some(s) = stdin.as_mut()
        {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => stdin = None,
                Ok(n) => {
                    let _ = (&*master).write_all(&buf[..n]);
                }
            }
        }
    }
    drop(stdout);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;

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
        } = open(&req).unwrap();
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
        } = open(&req).unwrap();
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
        } = open(&req).unwrap();
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
        File::from(tx).write_all(b"ix").unwrap();
        copy_loop(&master, Some(stdin), None, File::from(rx));
        // The process reads the line, then end-of-file.
        let mut slave = slave;
        assert_eq!(read_now(&mut slave).unwrap(), b"two\n");
        assert_eq!(read_now(&mut slave).unwrap(), b"", "VEOF after the line");
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
        let Opened { process, .. } = open(&req).unwrap();
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
        assert_eq!(open(&req).unwrap_err().kind(), Kind::InvalidArgument);
    }
}
