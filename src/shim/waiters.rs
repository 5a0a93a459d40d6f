//! Parked waits: who is told when a process (or the pod) ends.
//!
//! `Task.Wait` and `WaitSandbox` block for as long as the workload runs, hours or months. They
//! hold no thread: the RPC layer parks a reply ([`ExitWaiter`]) in the waited-for object's
//! [`Waiters`], and whoever makes the terminal transition takes the list and answers every
//! waiter (outside its locks). A waiter whose client went away says so through
//! [`ExitWaiter::is_listening`], and is dropped the next time the list grows, so a client
//! that keeps calling Wait and disconnecting cannot grow the list without bound.

use std::sync::mpsc;
use std::time::SystemTime;

/// containerd's "exit status unknown" (`UnknownExitStatus` in its client): what a process that
/// never ran, or whose end was never seen, reports.
pub const UNKNOWN_EXIT_STATUS: u32 = 255;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub status: u32,
    pub at: SystemTime,
}

impl ExitInfo {
    /// An exit with [`UNKNOWN_EXIT_STATUS`], now.
    pub fn unknown() -> Self {
        ExitInfo {
            status: UNKNOWN_EXIT_STATUS,
            at: SystemTime::now(),
        }
    }

    /// What Delete reports for a process that never started: status 0 and no exit time (the
    /// epoch), as containerd's runc shim reports the zero values it holds then.
    pub fn never_started() -> Self {
        ExitInfo {
            status: 0,
            at: SystemTime::UNIX_EPOCH,
        }
    }
}

/// One parked wait.
pub trait ExitWaiter: Send {
    /// Delivers the exit. Called once, never under the lock of the waited-for object.
    fn exited(self: Box<Self>, exit: ExitInfo);
    /// The wait was refused before it was parked (e.g. the object does not exist).
    fn refused(self: Box<Self>, _error: crate::records::error::Error) {}
    /// False once nobody can receive the answer (the client's connection is gone).
    fn is_listening(&self) -> bool {
        true
    }
}

/// The waiters of one object.
#[derive(Default)]
pub struct Waiters {
    list: Vec<Box<dyn ExitWaiter>>,
    /// Length at which deaf waiters are swept out next (doubles, so pushing stays O(1)
    /// amortised).
    sweep_at: usize,
}

/// Smallest list that is ever swept.
const FIRST_SWEEP: usize = 64;

impl Waiters {
    /// Parks `w` until [`Waiters::take`].
    pub fn push(&mut self, w: Box<dyn ExitWaiter>) {
        if self.list.len() >= self.sweep_at.max(FIRST_SWEEP) {
            self.list.retain(|w| w.is_listening());
            self.sweep_at = 2 * self.list.len();
        }
        self.list.push(w);
    }

    /// Every parked waiter, for [`wake`].
    pub fn take(&mut self) -> Vec<Box<dyn ExitWaiter>> {
        self.sweep_at = 0;
        std::mem::take(&mut self.list)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Answers every waiter in `list` with `exit`. Call with no lock held.
pub fn wake(list: Vec<Box<dyn ExitWaiter>>, exit: ExitInfo) {
    for w in list {
        w.exited(exit);
    }
}

/// A waiter that sends the exit on a channel: blocking waits inside the shim and in tests.
pub struct ChannelWaiter(pub mpsc::Sender<ExitInfo>);

impl ExitWaiter for ChannelWaiter {
    fn exited(self: Box<Self>, exit: ExitInfo) {
        let _ = self.0.send(exit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    struct Probe {
        listening: Arc<AtomicBool>,
        woken: Arc<AtomicUsize>,
    }
    impl ExitWaiter for Probe {
        fn exited(self: Box<Self>, _exit: ExitInfo) {
            self.woken.fetch_add(1, Ordering::SeqCst);
        }
        fn is_listening(&self) -> bool {
            self.listening.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn every_waiter_is_woken_once() {
        let woken = Arc::new(AtomicUsize::new(0));
        let mut w = Waiters::default();
        for _ in 0..1000 {
            w.push(Box::new(Probe {
                listening: Arc::new(AtomicBool::new(true)),
                woken: woken.clone(),
            }));
        }
        assert_eq!(w.len(), 1000);
        wake(w.take(), ExitInfo::unknown());
        assert_eq!(woken.load(Ordering::SeqCst), 1000);
        assert!(w.is_empty());
    }

    #[test]
    fn waiters_of_closed_connections_do_not_pile_up() {
        let woken = Arc::new(AtomicUsize::new(0));
        let mut w = Waiters::default();
        for _ in 0..100_000 {
            w.push(Box::new(Probe {
                listening: Arc::new(AtomicBool::new(false)),
                woken: woken.clone(),
            }));
        }
        assert!(w.len() <= FIRST_SWEEP + 1, "{} deaf waiters kept", w.len());
        let live = Arc::new(AtomicBool::new(true));
        w.push(Box::new(Probe {
            listening: live,
            woken: woken.clone(),
        }));
        wake(w.take(), ExitInfo::unknown());
        assert!(woken.load(Ordering::SeqCst) >= 1);
    }

    #[test]
    fn channel_waiter_delivers() {
        let (tx, rx) = mpsc::channel();
        let mut w = Waiters::default();
        w.push(Box::new(ChannelWaiter(tx)));
        let e = ExitInfo {
            status: 3,
            at: SystemTime::UNIX_EPOCH,
        };
        wake(w.take(), e);
        assert_eq!(rx.recv().unwrap(), e);
    }
}
