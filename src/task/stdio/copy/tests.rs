//! The pipe copier with real pipes, fifos and files in a temporary directory.

use super::*;
use crate::host::runtime::ProcessIo;
use crate::task::stdio::{Keepalive, Opened, StdioRequest, open};
use std::fs::OpenOptions;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

fn mkfifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    p
}

/// The client's read end of an output fifo, opened first and non-blocking, as containerd's
/// cio opens it.
fn client_reader(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .unwrap()
}

fn nonblocking(fd: OwnedFd) -> File {
    let f = File::from(fd);
    set_nonblocking(&f);
    f
}

/// What `f` (non-blocking) gives within `limit`: data, EOF (empty), or WouldBlock if nothing.
fn read_within(f: &File, limit: Duration) -> io::Result<Vec<u8>> {
    let end = Instant::now() + limit;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match (&*f).read(&mut buf) {
            Ok(n) => return Ok(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Everything `f` (non-blocking) gives until EOF, which must come within `limit`.
fn read_to_eof(f: &File, limit: Duration) -> Vec<u8> {
    let end = Instant::now() + limit;
    let mut all = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match read_within(f, left) {
            Ok(b) if b.is_empty() => return all,
            Ok(b) => all.extend_from_slice(&b),
            Err(e) => panic!("no EOF within {limit:?} ({} bytes read): {e}", all.len()),
        }
    }
}

/// A labelled process's stdio, its copier started.
struct Copied {
    process: ProcessIo,
    keepalive: Keepalive,
    copier: PipeCopier,
    /// When the copier reported its output delivered.
    drained: mpsc::Receiver<Instant>,
}

fn start(req: &StdioRequest) -> Copied {
    let Opened {
        process,
        keepalive,
        pipes,
    } = open(req, true).unwrap();
    let (tx, drained) = mpsc::channel();
    let copier = PipeCopier::start(
        pipes.expect("a labelled process gets pipes"),
        "test".into(),
        Box::new(move || {
            let _ = tx.send(Instant::now());
        }),
    )
    .unwrap();
    Copied {
        process,
        keepalive,
        copier,
        drained,
    }
}

fn is_pipe(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd)
        .map(|s| s.st_mode & libc::S_IFMT == libc::S_IFIFO)
        .unwrap()
        && std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .starts_with("pipe:[")
}

#[test]
fn output_is_copied_in_order_to_a_fifo_and_a_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = mkfifo(dir.path(), "out");
    let reader = client_reader(&out);
    let log = dir.path().join("logs/err.log");
    let req = StdioRequest {
        stdout: out.display().to_string(),
        stderr: format!("file://{}", log.display()),
        ..Default::default()
    };
    let Copied {
        mut process,
        keepalive: _keepalive,
        copier,
        drained,
    } = start(&req);
    // The process gets pipes, never the client's fifo or file.
    let (stdout, stderr) = (
        process.stdout.take().unwrap(),
        process.stderr.take().unwrap(),
    );
    assert!(is_pipe(&stdout) && is_pipe(&stderr));
    // Far more than a pipe and the fifo hold: the copy must keep the order across refills.
    let writer = std::thread::spawn(move || {
        let (mut o, mut e) = (File::from(stdout), File::from(stderr));
        for i in 0..20_000 {
            writeln!(o, "out {i}").unwrap();
            if i % 10 == 0 {
                writeln!(e, "err {i}").unwrap();
            }
        }
    });
    let client = std::thread::spawn(move || read_to_eof(&reader, Duration::from_secs(20)));
    writer.join().unwrap();
    copier.process_exited();
    let got = client.join().unwrap();
    drained.recv_timeout(Duration::from_secs(5)).unwrap();
    let want: String = (0..20_000).map(|i| format!("out {i}\n")).collect();
    assert_eq!(String::from_utf8(got).unwrap(), want);
    let want: String = (0..20_000)
        .step_by(10)
        .map(|i| format!("err {i}\n"))
        .collect();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), want);
}

#[test]
fn stdout_and_stderr_to_one_target_share_one_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("c.log");
    let uri = format!("file://{}", log.display());
    let req = StdioRequest {
        stdout: uri.clone(),
        stderr: uri,
        ..Default::default()
    };
    let c = start(&req);
    let (o, e) = (c.process.stdout.unwrap(), c.process.stderr.unwrap());
    let ino = |f: &OwnedFd| nix::sys::stat::fstat(f).unwrap().st_ino;
    assert_eq!(ino(&o), ino(&e));
    File::from(o).write_all(b"out\n").unwrap();
    File::from(e).write_all(b"err\n").unwrap();
    c.copier.process_exited();
    c.drained.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "out\nerr\n");
}

#[test]
fn stdin_is_copied_a_detach_is_not_eof_and_close_io_is() {
    let dir = tempfile::tempdir().unwrap();
    let inp = mkfifo(dir.path(), "in");
    let req = StdioRequest {
        stdin: inp.display().to_string(),
        ..Default::default()
    };
    let Copied {
        mut process,
        mut keepalive,
        copier,
        drained,
    } = start(&req);
    let stdin = process.stdin.take().unwrap();
    assert!(is_pipe(&stdin));
    let stdin = nonblocking(stdin);
    let quiet = Duration::from_millis(150);
    // No client yet: no data and no premature EOF.
    assert_eq!(
        read_within(&stdin, quiet).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
    client.write_all(b"one\n").unwrap();
    drop(client); // the client detaches
    assert_eq!(
        read_within(&stdin, Duration::from_secs(2)).unwrap(),
        b"one\n"
    );
    assert_eq!(
        read_within(&stdin, quiet).unwrap_err().kind(),
        io::ErrorKind::WouldBlock,
        "a detached client must not end the process's input"
    );
    // A client reattaches, writes its last line and closes; CloseIO right after (as `ctr`).
    let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
    client.write_all(b"two\n").unwrap();
    drop(client);
    keepalive.close_stdin();
    assert_eq!(read_to_eof(&stdin, Duration::from_secs(2)), b"two\n");
    copier.process_exited();
    drained.recv_timeout(Duration::from_secs(2)).unwrap();
}

#[test]
fn after_close_io_stdin_ends_once_the_client_closes_too() {
    let dir = tempfile::tempdir().unwrap();
    let inp = mkfifo(dir.path(), "in");
    let req = StdioRequest {
        stdin: inp.display().to_string(),
        ..Default::default()
    };
    let mut c = start(&req);
    let stdin = nonblocking(c.process.stdin.take().unwrap());
    let mut client = OpenOptions::new().write(true).open(&inp).unwrap();
    c.keepalive.close_stdin();
    client.write_all(b"late\n").unwrap();
    assert_eq!(
        read_within(&stdin, Duration::from_secs(2)).unwrap(),
        b"late\n"
    );
    assert_eq!(
        read_within(&stdin, Duration::from_millis(150))
            .unwrap_err()
            .kind(),
        io::ErrorKind::WouldBlock,
        "the client still holds the fifo: no EOF yet"
    );
    drop(client);
    assert_eq!(read_to_eof(&stdin, Duration::from_secs(2)), b"");
    drop(c.copier);
    c.drained.recv_timeout(Duration::from_secs(2)).unwrap();
}

#[test]
fn the_exit_is_reported_only_once_the_output_is_in_the_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let out = mkfifo(dir.path(), "out");
    let reader = client_reader(&out);
    let req = StdioRequest {
        stdout: out.display().to_string(),
        ..Default::default()
    };
    let c = start(&req);
    let mut w = File::from(c.process.stdout.unwrap());
    w.write_all(b"last words\n").unwrap();
    drop(w); // the process exits
    c.copier.process_exited();
    c.drained.recv_timeout(Duration::from_secs(2)).unwrap();
    // Reported: the output is already in the fifo, and our end is closed (EOF).
    let mut buf = [0u8; 64];
    assert_eq!((&reader).read(&mut buf).unwrap(), 11);
    assert_eq!(&buf[..11], b"last words\n");
    assert_eq!((&reader).read(&mut buf).unwrap(), 0);
}

/// A child of the process that inherited its stdout (`sleep 1000 &`, a daemon) holds the pipe
/// open for ever: the exit must not wait for it, whether it is silent or keeps writing.
#[test]
fn the_drain_is_bounded_when_a_child_holds_the_pipe() {
    for chatty in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let out = mkfifo(dir.path(), "out");
        let reader = client_reader(&out);
        let req = StdioRequest {
            stdout: out.display().to_string(),
            ..Default::default()
        };
        let c = start(&req);
        let w = File::from(c.process.stdout.unwrap());
        (&w).write_all(b"bye\n").unwrap();
        let child = w.try_clone().unwrap();
        drop(w); // the process exits, its child lives on
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let child = std::thread::spawn(move || {
            if !chatty {
                let _ = stop_rx.recv();
                return false;
            }
            // Writes until the pipe breaks (EPIPE: the copier closed its end).
            loop {
                if (&child).write_all(b"still here\n").is_err() {
                    return true;
                }
                if stop_rx.try_recv().is_ok() {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let client = std::thread::spawn(move || read_to_eof(&reader, Duration::from_secs(5)));
        let told = Instant::now();
        c.copier.process_exited();
        let at = c
            .drained
            .recv_timeout(DRAIN_LIMIT + Duration::from_secs(1))
            .expect("the copier waited for the child");
        let took = at - told;
        assert!(
            took <= DRAIN_LIMIT + Duration::from_millis(300),
            "chatty {chatty}: {took:?}"
        );
        if !chatty {
            assert!(
                took < DRAIN_LIMIT / 2,
                "a silent child is not waited for: {took:?}"
            );
        }
        let got = client.join().unwrap();
        assert!(got.starts_with(b"bye\n"), "chatty {chatty}");
        if !chatty {
            stop_tx.send(()).unwrap();
        }
        assert_eq!(
            child.join().unwrap(),
            chatty,
            "the pipe broke for the chatty child"
        );
    }
}

/// Issue 14 item 4 for pipes: a client that holds its stdout fifo open and never reads holds
/// the process back while it runs, and the exit within the drain limit once it ended.
#[test]
fn a_client_that_never_reads_does_not_hold_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let out = mkfifo(dir.path(), "out");
    let _reader = client_reader(&out);
    let req = StdioRequest {
        stdout: out.display().to_string(),
        ..Default::default()
    };
    let c = start(&req);
    let w = File::from(c.process.stdout.unwrap());
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'y'; 64 * 1024];
        let mut total = 0usize;
        while total < 8 << 20 {
            match (&w).write(&chunk) {
                Ok(n) => total += n,
                Err(_) => break, // EPIPE: the copier gave up
            }
        }
        total
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        c.drained.try_recv().is_err(),
        "gave up while the process ran"
    );
    assert!(
        !writer.is_finished(),
        "the process must block on the full pipe"
    );
    let told = Instant::now();
    c.copier.process_exited();
    let at = c
        .drained
        .recv_timeout(Duration::from_secs(2))
        .expect("the copier still holds the exit 2 s after it was told");
    assert!(at - told >= DRAIN_LIMIT / 2, "gave up too early");
    assert!(writer.join().unwrap() < 8 << 20);
}

/// The descriptors of this process that name `dir`, or one of the pipes in `pipes` (inodes).
fn open_fds(dir: &Path, pipes: &[u64]) -> Vec<String> {
    let names: Vec<String> = pipes.iter().map(|i| format!("pipe:[{i}]")).collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.starts_with(&*dir.to_string_lossy()) || names.contains(l))
        .collect()
}

/// Nothing is left open once the copier reported: not the client's fifos or log file, not the
/// process's pipes. (Descriptors are told apart by what they name, not counted: other tests
/// open and close descriptors in parallel.) Also when the copier is dropped without an exit
/// (the process was forgotten: a failed Create).
#[test]
fn nothing_is_left_open() {
    for exit in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (inp, out, err) = (
            mkfifo(dir.path(), "in"),
            mkfifo(dir.path(), "out"),
            dir.path().join("err.log"),
        );
        let reader = client_reader(&out);
        let req = StdioRequest {
            stdin: inp.display().to_string(),
            stdout: out.display().to_string(),
            stderr: format!("file://{}", err.display()),
            ..Default::default()
        };
        let c = start(&req);
        let ends = [&c.process.stdin, &c.process.stdout, &c.process.stderr];
        let inodes: Vec<u64> = ends
            .iter()
            .map(|f| {
                std::fs::metadata(format!("/proc/self/fd/{}", f.as_ref().unwrap().as_raw_fd()))
                    .unwrap()
                    .ino()
            })
            .collect();
        assert!(open_fds(dir.path(), &inodes).len() >= 3 + 4);
        File::from(c.process.stdout.unwrap())
            .write_all(b"x")
            .unwrap();
        drop((c.process.stdin, c.process.stderr));
        drop(c.keepalive);
        if exit {
            c.copier.process_exited();
        } else {
            drop(c.copier);
        }
        c.drained.recv_timeout(Duration::from_secs(3)).unwrap();
        drop(reader);
        assert_eq!(
            open_fds(dir.path(), &inodes),
            Vec::<String>::new(),
            "exit {exit}"
        );
    }
}
