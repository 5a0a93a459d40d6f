//! One process of a task (the init or an exec): its lifecycle as one state machine, and the
//! Waits parked on it.
//!
//! ```text
//!   Created ──begin_start──▶ Starting ──started──▶ Running ⇄ Paused
//!      │                        │                     │
//!      │                        └─start_failed──▶ FailedToStart(255)
//!      │                                              │
//!      └────────────── publish_exit ──────────────▶ Exited(status)
//!   (any phase) ──────────── delete ───────────────▶ Deleted(status or 255)
//! ```
//!
//! The reaper's view and containerd's view differ for a moment: an exit the reaper saw is kept
//! in `reaped` until it may be made visible (see `super::exits` for the ordering rules), and
//! only [`ProcState::publish_exit`] moves the process to `Exited`. `Exited`, `FailedToStart`
//! and `Deleted` are terminal: entering any of them hands back every parked waiter, so a Wait
//! always returns, whatever happened to the process.

use std::sync::Mutex;

use crate::records::error::{Error, Result};
use crate::shim::sync::Lock;
pub use crate::shim::waiters::{ExitInfo, ExitWaiter, UNKNOWN_EXIT_STATUS};
use crate::shim::waiters::{Waiters, wake};
use crate::task::stdio::{Keepalive, PipeCopier, StdioRequest, TtyCopier};

/// Where a process is in its life, as containerd sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Registered: an init is `runc create`d and waits for Start; an exec is only a spec.
    Created,
    /// Start (`runc start` / `runc exec`) is running.
    Starting,
    Running,
    /// The container is frozen (init only).
    Paused,
    /// The exit is visible: Wait returns it, TaskExit was published.
    Exited(ExitInfo),
    /// Start failed: Wait returns [`UNKNOWN_EXIT_STATUS`]; no TaskExit (as containerd's runc
    /// shim, which closes its wait channel when an exec fails to start).
    FailedToStart(ExitInfo),
    /// Deleted: Wait returns the exit, or [`UNKNOWN_EXIT_STATUS`] if none was seen.
    Deleted(ExitInfo),
}

impl Phase {
    /// The exit Wait returns, once the phase is terminal.
    pub fn terminal_exit(self) -> Option<ExitInfo> {
        match self {
            Phase::Exited(e) | Phase::FailedToStart(e) | Phase::Deleted(e) => Some(e),
            _ => None,
        }
    }
}

/// The Task API's status of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Paused,
    Stopped,
}

/// Mutable state of a process (behind [`Process::state`]).
pub struct ProcState {
    pid: i32,
    phase: Phase,
    /// The exit the reaper saw, not visible yet.
    reaped: Option<ExitInfo>,
    /// No more output will come: no terminal, or its copier flushed.
    output_done: bool,
    waiters: Waiters,
}

/// Waiters to answer once the state lock is released (see [`wake_all`]).
#[must_use = "wake the waiters after unlocking"]
pub struct Wakeup(Option<(Vec<Box<dyn ExitWaiter>>, ExitInfo)>);

impl Wakeup {
    pub fn none() -> Self {
        Wakeup(None)
    }
    /// Answers the waiters. Call with no lock held.
    pub fn wake(self) {
        if let Some((list, exit)) = self.0 {
            wake(list, exit);
        }
    }
}

impl ProcState {
    fn new(output_done: bool) -> Self {
        ProcState {
            pid: 0,
            phase: Phase::Created,
            reaped: None,
            output_done,
            waiters: Waiters::default(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The Task API status: an exit that is not visible yet still reads as running.
    pub fn status(&self) -> Status {
        match self.phase {
            Phase::Created | Phase::Starting => Status::Created,
            Phase::Running => Status::Running,
            Phase::Paused => Status::Paused,
            Phase::Exited(_) | Phase::FailedToStart(_) | Phase::Deleted(_) => Status::Stopped,
        }
    }

    /// The exit Wait and State report (terminal phases only).
    pub fn visible_exit(&self) -> Option<ExitInfo> {
        self.phase.terminal_exit()
    }

    /// The process is known to be gone: the reaper saw it, or the phase is terminal.
    pub fn has_ended(&self) -> bool {
        self.reaped.is_some() || self.phase.terminal_exit().is_some()
    }

    /// The exit as soon as the reaper saw it, visible or not.
    pub fn known_exit(&self) -> Option<ExitInfo> {
        self.reaped.or(self.phase.terminal_exit())
    }

    /// For an exec: its init's exit must wait for it (started, exit not visible yet).
    pub fn holds_init_exit(&self) -> bool {
        matches!(self.phase, Phase::Starting | Phase::Running | Phase::Paused)
    }

    fn set_terminal(&mut self, phase: Phase) -> Wakeup {
        let Some(exit) = phase.terminal_exit() else {
            return Wakeup::none();
        };
        self.phase = phase;
        self.reaped = None;
        Wakeup(Some((self.waiters.take(), exit)))
    }

    /// Created → Starting, or why not (named for the caller's message).
    pub fn begin_start(&mut self) -> Result<()> {
        let why = match self.phase {
            Phase::Created if self.reaped.is_none() => {
                self.phase = Phase::Starting;
                return Ok(());
            }
            Phase::Created => "has already exited",
            Phase::Starting => "is being started",
            Phase::Running | Phase::Paused => "was already started",
            Phase::Exited(_) => "has already exited",
            Phase::FailedToStart(_) => "failed to start",
            Phase::Deleted(_) => "was deleted",
        };
        Err(Error::precondition(why))
    }

    /// Starting → Running. An exit seen meanwhile stays in `reaped`, to be published after
    /// TaskStart.
    pub fn started(&mut self, pid: i32) {
        if self.phase == Phase::Starting {
            self.phase = Phase::Running;
            if pid != 0 {
                self.pid = pid;
            }
        }
    }

    /// Starting → FailedToStart: every waiter learns [`UNKNOWN_EXIT_STATUS`] (or the exit,
    /// if the reaper saw the process end meanwhile).
    pub fn start_failed(&mut self) -> Wakeup {
        if self.phase != Phase::Starting {
            return Wakeup::none();
        }
        let exit = self.reaped.unwrap_or_else(ExitInfo::unknown);
        self.set_terminal(Phase::FailedToStart(exit))
    }

    pub fn set_pid(&mut self, pid: i32) {
        self.pid = pid;
    }

    /// Records the reaper's exit. False if one was recorded already or the phase is terminal.
    pub fn reap(&mut self, exit: ExitInfo) -> bool {
        if self.has_ended() {
            return false;
        }
        self.reaped = Some(exit);
        true
    }

    /// The terminal copier flushed the output.
    pub fn set_output_done(&mut self) {
        self.output_done = true;
    }

    /// The reaped exit, if nothing but the caller's own rules (execs of an init) holds it
    /// back: not while Start runs (TaskStart goes first), not before the output is flushed.
    pub fn publishable_exit(&self) -> Option<ExitInfo> {
        match self.phase {
            Phase::Created | Phase::Running | Phase::Paused if self.output_done => self.reaped,
            _ => None,
        }
    }

    /// → Exited with the reaped exit. Call after [`ProcState::publishable_exit`] said so.
    pub fn publish_exit(&mut self) -> Wakeup {
        match self.publishable_exit() {
            Some(exit) => self.set_terminal(Phase::Exited(exit)),
            None => Wakeup::none(),
        }
    }

    /// An exit the reaper saw that is still held back (not during Start), for Delete to make
    /// visible first: → Exited.
    pub fn release_held_exit(&mut self) -> Option<(ExitInfo, Wakeup)> {
        let exit = match self.phase {
            Phase::Created | Phase::Running | Phase::Paused => self.reaped?,
            _ => return None,
        };
        Some((exit, self.set_terminal(Phase::Exited(exit))))
    }

    /// Whether, as containerd sees it, the process never started: it is still Created and
    /// alive, or its start failed.
    pub fn never_started(&self) -> bool {
        match self.phase {
            Phase::Created => self.reaped.is_none(),
            Phase::FailedToStart(_) => true,
            _ => false,
        }
    }

    /// → Deleted; returns the exit Delete reports: the process's, or for one that never
    /// started [`ExitInfo::never_started`] (status 0, as containerd's runc shim answers:
    /// containerd's client suite checks it). Waits parked on such a process learn
    /// [`UNKNOWN_EXIT_STATUS`]: it will never run (containerd's runc shim would leave them
    /// blocked until it exits, which its client reads as the same unknown status).
    pub fn delete(&mut self) -> (ExitInfo, Wakeup) {
        let known = self.known_exit();
        let reply = if self.never_started() {
            ExitInfo::never_started()
        } else {
            known.unwrap_or_else(ExitInfo::unknown)
        };
        let waiters_learn = known.unwrap_or_else(ExitInfo::unknown);
        (reply, self.set_terminal(Phase::Deleted(waiters_learn)))
    }

    /// Running ⇄ Paused (init only).
    pub fn set_paused(&mut self, paused: bool) {
        self.phase = match (self.phase, paused) {
            (Phase::Running, true) => Phase::Paused,
            (Phase::Paused, false) => Phase::Running,
            (p, _) => p,
        };
    }

    /// Parks `w` until the process ends, or hands it back with the exit if it has.
    pub fn park(&mut self, w: Box<dyn ExitWaiter>) -> Option<(Box<dyn ExitWaiter>, ExitInfo)> {
        match self.phase.terminal_exit() {
            Some(exit) => Some((w, exit)),
            None => {
                self.waiters.push(w);
                None
            }
        }
    }

    #[cfg(test)]
    pub fn set_output_done_for_test(&mut self, done: bool) {
        self.output_done = done;
    }

    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.waiters.len()
    }
}

/// The descriptors and helper threads of a process's stdio.
#[derive(Default)]
pub struct ProcessIo {
    keepalive: Keepalive,
    tty: Option<TtyCopier>,
    /// A labelled process's copier (its stdio goes through the shim's pipes).
    pipes: Option<PipeCopier>,
    /// CloseIO(stdin) was called. It may come before the process's stdio exists (a client
    /// whose stdin is already at EOF when it starts the process, as `echo x | ctr task exec`):
    /// then stdin is closed the moment the stdio is attached.
    stdin_closed: bool,
}

impl ProcessIo {
    /// Keeps the stdio of a freshly spawned process (and honours an earlier CloseIO).
    pub fn attach(
        &mut self,
        keepalive: Keepalive,
        tty: Option<TtyCopier>,
        pipes: Option<PipeCopier>,
    ) {
        self.keepalive = keepalive;
        self.tty = tty;
        self.pipes = pipes;
        if self.stdin_closed {
            self.close_stdin();
        }
    }

    /// CloseIO(stdin), now or as soon as the stdio is attached. A pipe copier needs no
    /// word: its stdin fifo reads EOF once our writer (the keepalive) and the client's are
    /// closed.
    pub fn close_stdin(&mut self) {
        self.stdin_closed = true;
        self.keepalive.close_stdin();
        if let Some(t) = &self.tty {
            t.close_stdin();
        }
    }

    /// The process exited: output readers see EOF; a copier (terminal or pipes) flushes
    /// first. Returns whether a copier will report when its output is flushed.
    pub fn process_exited(&mut self) -> bool {
        self.keepalive.release();
        if let Some(p) = &self.pipes {
            p.process_exited();
            return true;
        }
        match &self.tty {
            Some(t) => {
                t.process_exited();
                true
            }
            None => false,
        }
    }

    /// Drops what the shim holds for the process (Delete, a failed start): a pipe copier
    /// delivers what is left and ends.
    fn release(&mut self) {
        self.keepalive.release();
        if let Some(p) = &self.pipes {
            p.process_exited();
        }
    }

    pub fn tty(&self) -> Option<&TtyCopier> {
        self.tty.as_ref()
    }
}

/// An init or exec process.
pub struct Process {
    container_id: String,
    /// `None` for the init process.
    exec_id: Option<String>,
    stdio: StdioRequest,
    /// Its stdio goes through the shim's pipes (a labelled process, see `stdio`).
    copies_stdio: bool,
    /// The exec's process spec (JSON).
    spec: Option<Vec<u8>>,
    state: Mutex<ProcState>,
    io: Mutex<ProcessIo>,
}

impl Process {
    pub fn new(
        container_id: &str,
        exec_id: Option<String>,
        stdio: StdioRequest,
        spec: Option<Vec<u8>>,
    ) -> Self {
        // A terminal's output is flushed by its copier; without one nothing is buffered.
        let output_done = !stdio.terminal;
        Process {
            container_id: container_id.to_string(),
            exec_id,
            stdio,
            copies_stdio: false,
            spec,
            state: Mutex::new(ProcState::new(output_done)),
            io: Mutex::default(),
        }
    }

    /// With `copy`, the process's stdio goes through the shim's pipes (a non-terminal
    /// process with an SELinux process label): its exit then waits for its copier.
    pub fn copying_stdio(mut self, copy: bool) -> Self {
        if copy && !self.stdio.terminal {
            self.copies_stdio = true;
            self.state
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .output_done = false;
        }
        self
    }

    /// Whether its stdio goes through the shim's pipes.
    pub fn copies_stdio(&self) -> bool {
        self.copies_stdio
    }

    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    pub fn exec_id(&self) -> Option<&str> {
        self.exec_id.as_deref()
    }

    pub fn is_init(&self) -> bool {
        self.exec_id.is_none()
    }

    pub fn stdio(&self) -> &StdioRequest {
        &self.stdio
    }

    pub fn spec(&self) -> &[u8] {
        self.spec.as_deref().unwrap_or_default()
    }

    /// The process's ID as containerd names it in events (exec ID, or the container ID).
    pub fn event_id(&self) -> &str {
        self.exec_id.as_deref().unwrap_or(&self.container_id)
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, ProcState> {
        self.state.locked()
    }

    pub fn io(&self) -> std::sync::MutexGuard<'_, ProcessIo> {
        self.io.locked()
    }

    /// Parks `w` until the process reaches a terminal phase (answers at once if it has).
    pub fn wait(&self, w: Box<dyn ExitWaiter>) {
        let ready = self.state().park(w);
        if let Some((w, exit)) = ready {
            w.exited(exit);
        }
    }

    /// Drops the stdio the shim holds for the process: output readers see EOF, stdin closes.
    pub fn release_io(&self) {
        self.io().release();
    }

    #[cfg(test)]
    pub fn holds_stdin(&self) -> bool {
        self.io().keepalive.holds_stdin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::waiters::ChannelWaiter;
    use std::sync::mpsc;
    use std::time::SystemTime;

    fn exit(status: u32) -> ExitInfo {
        ExitInfo {
            status,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    fn parked(st: &mut ProcState) -> mpsc::Receiver<ExitInfo> {
        let (tx, rx) = mpsc::channel();
        assert!(st.park(Box::new(ChannelWaiter(tx))).is_none());
        rx
    }

    #[test]
    fn normal_life_created_starting_running_exited_deleted() {
        let mut st = ProcState::new(true);
        let rx = parked(&mut st);
        assert_eq!(st.status(), Status::Created);
        st.begin_start().unwrap();
        assert_eq!(st.status(), Status::Created);
        st.started(42);
        assert_eq!((st.status(), st.pid()), (Status::Running, 42));
        assert!(st.reap(exit(3)));
        assert!(!st.reap(exit(4)), "a second exit is ignored");
        assert_eq!(st.status(), Status::Running, "not visible before publish");
        assert!(st.has_ended());
        assert_eq!(st.publishable_exit(), Some(exit(3)));
        st.publish_exit().wake();
        assert_eq!(rx.try_recv().unwrap(), exit(3));
        assert_eq!(
            (st.status(), st.visible_exit()),
            (Status::Stopped, Some(exit(3)))
        );
        let (e, w) = st.delete();
        w.wake();
        assert_eq!(e, exit(3));
        assert_eq!(st.phase(), Phase::Deleted(exit(3)));
    }

    #[test]
    fn an_exit_during_start_waits_for_started() {
        let mut st = ProcState::new(true);
        st.begin_start().unwrap();
        assert!(st.reap(exit(1)));
        assert_eq!(st.publishable_exit(), None, "TaskStart goes first");
        st.started(7);
        assert_eq!(st.publishable_exit(), Some(exit(1)));
    }

    #[test]
    fn a_failed_start_wakes_waiters_with_unknown_status() {
        let mut st = ProcState::new(true);
        let rx = parked(&mut st);
        st.begin_start().unwrap();
        st.start_failed().wake();
        assert_eq!(rx.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
        assert!(matches!(st.phase(), Phase::FailedToStart(_)));
        assert_eq!(st.status(), Status::Stopped);
        assert!(st.begin_start().is_err());
        // A late wait answers at once.
        let (tx, rx) = mpsc::channel();
        let back = st.park(Box::new(ChannelWaiter(tx)));
        let (w, e) = back.expect("terminal: answered at once");
        w.exited(e);
        assert_eq!(rx.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    }

    #[test]
    fn deleting_a_process_nobody_started_answers_0_and_wakes_its_waiters_with_unknown() {
        let mut st = ProcState::new(true);
        let rx = parked(&mut st);
        assert!(st.never_started());
        let (e, w) = st.delete();
        w.wake();
        assert_eq!(e, ExitInfo::never_started());
        assert_eq!(e.status, 0);
        assert_eq!(rx.try_recv().unwrap().status, UNKNOWN_EXIT_STATUS);
    }

    /// Where a process can be, from its creation on.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Created,
        /// An init that died before Start (its exit is published without a Start).
        CreatedThenDied,
        Starting,
        StartFailed,
        Running,
        Paused,
        /// Reaped, not visible yet (output flushing, execs holding an init back).
        ExitHeld,
        Exited,
    }

    fn reach(step: Step) -> ProcState {
        let mut st = ProcState::new(true);
        match step {
            Step::Created => {}
            Step::CreatedThenDied => {
                st.reap(exit(137));
                st.publish_exit().wake();
            }
            Step::Starting => st.begin_start().unwrap(),
            Step::StartFailed => {
                st.begin_start().unwrap();
                st.start_failed().wake();
            }
            Step::Running | Step::Paused | Step::ExitHeld | Step::Exited => {
                st.begin_start().unwrap();
                st.started(10);
                match step {
                    Step::Paused => st.set_paused(true),
                    Step::ExitHeld => {
                        st.set_output_done_for_test(false);
                        st.reap(exit(3));
                    }
                    Step::Exited => {
                        st.reap(exit(3));
                        st.publish_exit().wake();
                    }
                    _ => {}
                }
            }
        }
        st
    }

    /// Every State/Wait/Delete answer, against containerd's runc shim (pkg/process of v2.1.9:
    /// init_state.go, exec_state.go, exec.go; service.go's State, Wait and Delete).
    ///
    /// * State: runc's "created" until Start succeeded, "running"/"paused", "stopped" once
    ///   `SetExited` ran; exit status 0 until then.
    /// * Wait: blocks until `SetExited` or a failed start closes `waitBlock`.
    /// * Delete: refused while running ("cannot delete a running process"); otherwise the
    ///   process's `ExitStatus()`, which is 0 where no exit was ever set.
    ///
    /// Deliberate differences, each marked below: a failed start reads Stopped with 255 in State
    /// and Wait (runc: Created, and a Wait answer of 0 from the unset status; 255 is
    /// containerd's "unknown", which is what happened); a Wait parked on a process deleted
    /// before it ever ran is answered 255 (runc leaves it blocked until the shim exits).
    #[test]
    fn state_wait_and_delete_answers_match_containerds_runc_shim() {
        // (where, State status, State exit, Wait answers now, Delete reply or refused)
        type Row = (Step, Status, Option<u32>, Option<u32>, Option<u32>);
        let table: [Row; 8] = [
            (Step::Created, Status::Created, None, None, Some(0)),
            (
                Step::CreatedThenDied,
                Status::Stopped,
                Some(137),
                Some(137),
                Some(137),
            ),
            (Step::Starting, Status::Created, None, None, None),
            // runc: State created/0 and Wait 0 (see above); Delete 0 as runc.
            (
                Step::StartFailed,
                Status::Stopped,
                Some(255),
                Some(255),
                Some(0),
            ),
            (Step::Running, Status::Running, None, None, None),
            (Step::Paused, Status::Paused, None, None, None),
            // Not visible yet: still running for State and Wait; Delete makes it visible.
            (Step::ExitHeld, Status::Running, None, None, Some(3)),
            (Step::Exited, Status::Stopped, Some(3), Some(3), Some(3)),
        ];
        for (step, status, state_exit, wait, delete) in table {
            let mut st = reach(step);
            assert_eq!(st.status(), status, "{step:?}: State status");
            assert_eq!(
                st.visible_exit().map(|e| e.status),
                state_exit,
                "{step:?}: State exit"
            );
            let (tx, rx) = mpsc::channel();
            if let Some((w, e)) = st.park(Box::new(ChannelWaiter(tx))) {
                w.exited(e);
            }
            assert_eq!(rx.try_recv().ok().map(|e| e.status), wait, "{step:?}: Wait");
            // What task::delete does: refuse a running process, make a held exit visible first.
            let running = matches!(st.phase(), Phase::Starting | Phase::Running | Phase::Paused)
                && !st.has_ended();
            let reply = if running {
                None
            } else {
                if let Some((_, w)) = st.release_held_exit() {
                    w.wake();
                }
                let (e, w) = st.delete();
                w.wake();
                Some(e.status)
            };
            assert_eq!(reply, delete, "{step:?}: Delete");
            if reply.is_some() {
                // Every parked Wait is answered by the Delete at the latest.
                let answered = rx.try_recv().ok().map(|e| e.status).or(wait);
                let expected = match step {
                    Step::Created => UNKNOWN_EXIT_STATUS,
                    _ => wait.unwrap_or(3),
                };
                assert_eq!(answered, Some(expected), "{step:?}: Wait after Delete");
            }
        }
    }

    #[test]
    fn a_created_init_that_dies_is_published_without_start() {
        let mut st = ProcState::new(true);
        assert!(st.reap(exit(137)));
        assert_eq!(st.publishable_exit(), Some(exit(137)));
        let e = st.begin_start().unwrap_err();
        assert_eq!(e.message(), "has already exited");
        st.publish_exit().wake();
        assert_eq!(st.phase(), Phase::Exited(exit(137)));
    }

    #[test]
    fn terminal_output_holds_the_exit_until_flushed() {
        let mut st = ProcState::new(false);
        st.begin_start().unwrap();
        st.started(5);
        st.reap(exit(0));
        assert_eq!(st.publishable_exit(), None);
        st.set_output_done();
        assert_eq!(st.publishable_exit(), Some(exit(0)));
    }

    #[test]
    fn pause_and_resume_only_from_the_right_phase() {
        let mut st = ProcState::new(true);
        st.set_paused(true);
        assert_eq!(st.phase(), Phase::Created);
        st.begin_start().unwrap();
        st.started(1);
        st.set_paused(true);
        assert_eq!(st.status(), Status::Paused);
        assert!(st.holds_init_exit());
        st.set_paused(false);
        assert_eq!(st.status(), Status::Running);
    }

    #[test]
    fn begin_start_names_why_not() {
        let mut st = ProcState::new(true);
        st.begin_start().unwrap();
        assert_eq!(st.begin_start().unwrap_err().message(), "is being started");
        st.started(1);
        assert_eq!(
            st.begin_start().unwrap_err().message(),
            "was already started"
        );
        st.delete().1.wake();
        assert_eq!(st.begin_start().unwrap_err().message(), "was deleted");
    }

    #[test]
    fn exited_is_final_for_reap_and_publish() {
        let mut st = ProcState::new(true);
        st.reap(exit(2));
        st.publish_exit().wake();
        assert!(!st.reap(exit(9)));
        assert_eq!(st.publishable_exit(), None);
        assert_eq!(st.visible_exit(), Some(exit(2)));
    }

    #[test]
    fn a_held_exit_can_be_released_for_delete() {
        let mut st = ProcState::new(false); // a terminal: the exit waits for the flush
        st.begin_start().unwrap();
        st.started(3);
        assert!(st.release_held_exit().is_none(), "nothing reaped yet");
        st.reap(exit(9));
        assert_eq!(st.publishable_exit(), None);
        let (e, w) = st.release_held_exit().unwrap();
        w.wake();
        assert_eq!((e, st.phase()), (exit(9), Phase::Exited(exit(9))));
        assert!(st.release_held_exit().is_none());
    }
}
