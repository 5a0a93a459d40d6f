//! The pipe copier: a labelled process's stdio goes through pipes of the shim's own.
//!
//! Under SELinux a process with a process label (`container_t`) may not write containerd's
//! fifos (`container_runtime_t`). containerd's runc shim never lets it: it gives the process
//! pipes of its own and copies between them and the client's fifos (`pkg/process/io.go`). So
//! do we, for a labelled process; an unlabelled one keeps the zero-copy path (see the parent
//! module).
//!
//! One thread per process moves bytes with `splice` between the pipes and the client's fifos
//! (pipe to pipe: no copy through user space), and with `read`/`write` into a `file://` log (an
//! `O_APPEND` file refuses splice). Every descriptor the thread polls is non-blocking, so it
//! always hears the process's exit:
//!
//! * output: the process's pipe -> the client's fifo, written through our `O_RDWR` descriptor
//!   (our keepalive: while containerd restarts and nobody reads, the splice waits, the pipe
//!   fills and the process blocks writing, never SIGPIPE), or the log file;
//! * stdin: the client's fifo (our read end) -> the process's pipe. Our writer on the fifo (the
//!   parent module's keepalive, dropped at CloseIO) keeps a detaching client from ending the
//!   input; once no writer is left the fifo reads EOF, what it held has been forwarded, and the
//!   copier closes the pipe: the process reads EOF (containerd's runc shim: the same rule);
//! * the exit: the copier delivers what the pipes hold, then drops its descriptors (the client
//!   reads EOF) and reports, and only then may the exit be published: a client that reads
//!   until EOF after TaskExit has it all. containerd's runc shim publishes TaskExit at once and
//!   waits for its copy at Delete instead (10 s for an init, 2 s for an exec:
//!   `cmd/containerd-shim-runc-v2/process/init.go`, v2.1.9); here the wait is before the exit
//!   and bounded, see [`DRAIN_LIMIT`].

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::records::error::{Context, Result};

/// How long a copier waits for more output once the process has exited and nothing is
/// pending.
pub const DRAIN_IDLE: Duration = Duration::from_millis(50);

/// How long a copier may take, after the process exited, to deliver what is left. The exit
/// is held until then (TaskExit after the last output), but
/// never longer: a client that keeps its fifo open without reading, or a child of the process
/// that inherited its stdout and keeps it open (a daemon, `sleep 1000 &`), must not hold the
/// exit (and with it the init's) hostage. What is not delivered by then is dropped and logged.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// At most this many bytes move per stream per wake-up, so a busy stream does not starve the
/// others (or the exit notice).
const BURST: usize = 1 << 20;

pub fn set_nonblocking(f: &File) {
    if let Ok(flags) = fcntl(f.as_fd(), FcntlArg::F_GETFL) {
        let _ = fcntl(
            f.as_fd(),
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        );
    }
}

/// How long a copier's poll may wait: without end while the process runs, then until the
/// next [`DRAIN_IDLE`] check or the drain's `deadline`, whichever comes first (both copiers).
pub fn drain_timeout(deadline: Option<Instant>, now: Instant) -> PollTimeout {
    match deadline {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.saturating_duration_since(now).min(DRAIN_IDLE).as_millis();
            PollTimeout::from(ms.max(1) as u16)
        }
    }
}

/// Wakes a copier (both copiers' wake-up pipes are non-blocking). A full pipe (EAGAIN) already
/// holds a wake-up, and the copier's flags say why.
pub fn poke(wake: &File) {
    let _ = (&*wake).write(b"!");
}

/// A pipe whose ends are both the shim's (close-on-exec), the caller's end non-blocking.
fn pipe() -> Result<(File, File)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).context("stdio pipe")?;
    Ok((File::from(r), File::from(w)))
}

/// Where an output stream goes.
#[derive(Debug)]
pub enum Sink {
    /// The client's fifo (our `O_RDWR` descriptor): spliced into.
    Fifo(File),
    /// A `file://` log, appended to.
    File(File),
}

/// The copier's ends of a process's pipes, before the process and the copier exist. Dropped
/// without [`PipeCopier::start`] (the process was not spawned), everything is closed.
#[derive(Debug, Default)]
pub struct Pipes {
    streams: Vec<Stream>,
}

impl Pipes {
    /// stdin: the client's fifo, opened for reading (non-blocking), into a new pipe. Returns
    /// the process's read end.
    pub fn add_stdin(&mut self, fifo: File) -> Result<OwnedFd> {
        let (r, w) = pipe()?;
        set_nonblocking(&fifo);
        set_nonblocking(&w);
        self.streams.push(Stream {
            name: "stdin",
            src: Some(fifo),
            dst: Dst::Pipe(w),
            blocked: false,
        });
        Ok(OwnedFd::from(r))
    }

    /// An output stream into `sink`. Returns the process's write end.
    pub fn add_output(&mut self, name: &'static str, sink: Sink) -> Result<OwnedFd> {
        let (r, w) = pipe()?;
        set_nonblocking(&r);
        let dst = match sink {
            Sink::Fifo(f) => {
                set_nonblocking(&f);
                Dst::Pipe(f)
            }
            Sink::File(f) => Dst::File(f),
        };
        self.streams.push(Stream {
            name,
            src: Some(r),
            dst,
            blocked: false,
        });
        Ok(OwnedFd::from(w))
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// The copy thread of one process, told of the exit through a wake-up pipe. Dropping it tells
/// the copier too (the wake-up pipe hangs up): a process that is forgotten without an exit (a
/// failed Create) does not leave the thread behind.
pub struct PipeCopier {
    exited: Arc<AtomicBool>,
    /// Write end of the wake-up pipe (non-blocking: the reaper thread pokes it).
    wake: File,
}

impl PipeCopier {
    /// Starts the copy thread. `on_drained` runs on it once the output is delivered (or
    /// dropped, see [`DRAIN_LIMIT`]) after the process exited. `label` names the process in
    /// the log.
    pub fn start(
        pipes: Pipes,
        label: String,
        on_drained: Box<dyn FnOnce() + Send>,
    ) -> Result<PipeCopier> {
        let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .context("stdio wake-up pipe")?;
        let exited = Arc::new(AtomicBool::new(false));
        let e = exited.clone();
        std::thread::Builder::new()
            .name("stdio".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                // Whatever happens to the copy, the exit must not stay held behind it.
                crate::shim::panic_hook::survive("stdio copier", || {
                    copy_loop(pipes.streams, File::from(rx), &e, &label)
                });
                on_drained();
            })
            .context("start stdio copier")?;
        Ok(PipeCopier {
            exited,
            wake: File::from(tx),
        })
    }

    /// The process exited: deliver what is left (within [`DRAIN_LIMIT`]) and finish. Never
    /// blocks: the reaper thread calls it.
    pub fn process_exited(&self) {
        self.exited.store(true, Ordering::SeqCst);
        poke(&self.wake);
    }
}

#[derive(Debug)]
enum Dst {
    /// A pipe or fifo: spliced into, non-blocking.
    Pipe(File),
    /// A regular file: written.
    File(File),
    /// The target broke: what comes is read and dropped, so the process never blocks on it.
    Discard,
}

/// One direction of bytes: `src` (a pipe or fifo, non-blocking) into `dst`.
#[derive(Debug)]
struct Stream {
    name: &'static str,
    /// `None` once it read EOF.
    src: Option<File>,
    dst: Dst,
    /// `dst` was full with bytes waiting in `src`: wait for `dst` to take more.
    blocked: bool,
}

/// Moves up to `len` bytes from the pipe `from` into the pipe `to` in the kernel, without
/// blocking.
fn splice(from: &File, to: &File, len: usize) -> io::Result<usize> {
    // SAFETY: splice takes two descriptors we own and null offsets (pipes have none).
    let r = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Bytes readable from a pipe now.
fn queued(f: &File) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer, which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 { 0 } else { n.max(0) as usize }
}

impl Stream {
    /// Whether its source is still open (it has not read EOF).
    fn open(&self) -> bool {
        self.src.is_some()
    }

    /// Moves what it can without blocking, at most [`BURST`] bytes.
    fn pump(&mut self, buf: &mut [u8], label: &str) {
        let Some(src) = self.src.take() else { return };
        let mut moved = 0;
        let mut eof = false;
        while moved < BURST {
            let r = match &self.dst {
                Dst::Pipe(d) => splice(&src, d, BURST - moved),
                Dst::File(d) => match (&src).read(buf) {
                    Ok(n) if n > 0 => {
                        if let Err(e) = (&*d).write_all(&buf[..n]) {
                            log::warn!(
                                "{label}: {}: write the log file: {e}; output dropped",
                                self.name
                            );
                            self.dst = Dst::Discard;
                        }
                        Ok(n)
                    }
                    r => r,
                },
                Dst::Discard => (&src).read(buf),
            };
            match r {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => moved += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Either the source is empty or the target is full.
                    self.blocked = queued(&src) > 0;
                    break;
                }
                Err(e) if self.is_input() => {
                    // The process closed its stdin (EPIPE): nothing more to forward.
                    log::debug!("{label}: stdin: {e}; input no longer forwarded");
                    eof = true;
                    break;
                }
                Err(e) => {
                    log::warn!("{label}: {}: {e}; output dropped", self.name);
                    self.dst = Dst::Discard;
                }
            }
        }
        if eof {
            if self.is_input() {
                // Closing our end of the process's stdin is its EOF.
                self.dst = Dst::Discard;
            }
        } else {
            self.src = Some(src);
        }
    }

    fn is_input(&self) -> bool {
        self.name == "stdin"
    }
}

/// Copies until the process exited and its output is delivered, or [`DRAIN_LIMIT`] after the
/// exit, or the exit notice's pipe hung up (the [`PipeCopier`] was dropped).
fn copy_loop(mut streams: Vec<Stream>, wake: File, exited: &AtomicBool, label: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    // Set once the process exited: the copier ends by then.
    let mut deadline: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if deadline.is_some() {
            // The input is of no use any more: only output is drained.
            streams.retain(|s| !s.is_input());
            if streams.iter().all(|s| !s.open()) {
                break;
            }
            if deadline.is_some_and(|d| now >= d) {
                for s in streams.iter().filter(|s| s.open()) {
                    let left = s.src.as_ref().map(queued).unwrap_or_default();
                    if left > 0 || s.blocked {
                        log::warn!(
                            "{label}: {}: {left} bytes of output dropped: not delivered within {DRAIN_LIMIT:?} of the exit",
                            s.name
                        );
                    }
                }
                break;
            }
        }
        let mut fds = Vec::with_capacity(streams.len() + 1);
        let mut slots = Vec::with_capacity(streams.len());
        if deadline.is_none() {
            fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        }
        for (i, s) in streams.iter().enumerate() {
            let Some(src) = &s.src else { continue };
            let fd = match (&s.dst, s.blocked) {
                (Dst::Pipe(d), true) => PollFd::new(d.as_fd(), PollFlags::POLLOUT),
                _ => PollFd::new(src.as_fd(), PollFlags::POLLIN),
            };
            slots.push((i, fds.len()));
            fds.push(fd);
        }
        let timeout = drain_timeout(deadline, now);
        let n = match poll(&mut fds, timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                log::warn!("{label}: stdio poll: {e}");
                break;
            }
        };
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if n == 0 && deadline.is_some() && streams.iter().all(|s| !s.blocked) {
            // Drained: nothing more came within DRAIN_IDLE. A child of the process may
            // still hold the pipe open; it is not waited for.
            break;
        }
        if deadline.is_none() && ready[0] {
            let mut b = [0u8; 64];
            let hung_up = matches!((&wake).read(&mut b), Ok(0));
            while (&wake).read(&mut b).is_ok_and(|n| n > 0) {}
            if hung_up || exited.load(Ordering::SeqCst) {
                deadline = Some(Instant::now() + DRAIN_LIMIT);
            }
        }
        for (i, k) in slots {
            if ready[k] {
                streams[i].blocked = false;
                streams[i].pump(&mut buf, label);
            }
        }
    }
}

#[cfg(test)]
mod tests;
