//! A systemd whose listen backlog is full.

use super::*;

/// A full listen backlog (the peer is slow to accept): the connect is tried again until the
/// peer accepts, not taken as made (a non-blocking unix connect's EAGAIN is nothing under
/// way: the first write would fail ENOTCONN).
#[test]
fn a_full_listen_backlog_is_waited_out() {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    // Backlog 0 holds one pending connection: this one fills it.
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::from(fd);
    let filler = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
        Conn::connect(&path, soon()).map(|_| ())
    });
    let tid = rx.recv().unwrap();
    // Accept only once the client waits between attempts (or gave up): its first connect
    // met the full backlog.
    let sleeping = || {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<libc::c_long>().ok())
            .is_some_and(|nr| nr == libc::SYS_nanosleep || nr == libc::SYS_clock_nanosleep)
    };
    while !sleeping() && !client.is_finished() {
        std::thread::yield_now();
    }
    let (first, _) = listener.accept().unwrap();
    drop((first, filler));
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
        s.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
            .unwrap();
        let _ = s.read(&mut b);
    });
    client.join().unwrap().unwrap();
    server.join().unwrap();
}
