//! `ctr` on a pseudo-terminal of its own (`ctr run -t`, `ctr task exec -t` need one).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::ctr_cmd;

/// A child with a pty as its controlling terminal; output collected from the master.
pub struct PtyChild {
    pub child: std::process::Child,
    pub master: std::fs::File,
    rx: mpsc::Receiver<Vec<u8>>,
    out: Vec<u8>,
}

pub fn set_winsize(fd: &impl AsRawFd, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(r, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

impl PtyChild {
    /// `ctr` in namespace `ns` with `args`, on a new pty of `rows` x `cols`.
    pub fn spawn(ns: &str, args: &[&str], rows: u16, cols: u16) -> PtyChild {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        set_winsize(&pty.master, rows, cols);
        let slave: OwnedFd = pty.slave;
        let mut cmd = ctr_cmd(ns, args);
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn ctr on a pty");
        drop(cmd); // closes our copies of the slave
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break, // EIO once every slave fd is closed
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        PtyChild {
            child,
            master,
            rx,
            out: Vec::new(),
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    /// Reads until the output contains `needle`; panics after `timeout`.
    #[track_caller]
    pub fn expect(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.text().contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(b) => self.out.extend_from_slice(&b),
                Err(_) => panic!(
                    "pty: no {needle:?} within {timeout:?}; got {:?}",
                    self.text()
                ),
            }
        }
    }

    /// Writes `input` until the output contains `needle`, waiting up to `each` for it after
    /// each write; panics after `timeout`. For what reaches the child at a moment nobody can
    /// see from here (the console size ctr sets once the task has started, or on SIGWINCH): a
    /// fixed sleep before one write is a race a busy machine loses.
    #[track_caller]
    pub fn prompt_until(&mut self, input: &str, needle: &str, each: Duration, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.text().contains(needle) {
            if Instant::now() >= deadline {
                panic!(
                    "pty: no {needle:?} within {timeout:?} of writing {input:?}; got {:?}",
                    self.text()
                );
            }
            self.write(input);
            let until = (Instant::now() + each).min(deadline);
            while !self.text().contains(needle) {
                match self
                    .rx
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    Ok(b) => self.out.extend_from_slice(&b),
                    Err(_) => break,
                }
            }
        }
    }

    pub fn write(&mut self, s: &str) {
        self.master.write_all(s.as_bytes()).unwrap();
    }

    /// Waits for the child's exit code, killing it after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // drain what is left
                while let Ok(b) = self.rx.recv_timeout(Duration::from_millis(200)) {
                    self.out.extend_from_slice(&b);
                }
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
