//! One process of a task (the init or an exec): its state machine, exit, and waiters.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::SystemTime;

use crate::stdio::{Keepalive, StdioRequest, TtyCopier};

/// Lifecycle state of a process as containerd sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Paused,
    Stopped,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub status: u32,
    pub at: SystemTime,
}

/// Mutable state of a process, behind [`Process::state`].
#[derive(Debug)]
pub struct ProcState {
    pub status: Status,
    pub pid: i32,
    /// Set as soon as the reaper saw the exit.
    pub exit: Option<ExitInfo>,
    /// Set when the exit is made visible (Wait returns, TaskExit published): after the output
    /// was drained, after Start published TaskStart, and for an init after all its execs.
    pub exit_published: bool,
    /// Start (runc start / runc exec) is running: an exit seen now is published by Start,
    /// after TaskStart, so events keep their order.
    pub starting: bool,
    /// The exit is recorded but waits for output to drain or for execs to finish.
    pub exit_pending: bool,
    /// No more output will come: no terminal, or its copier finished.
    pub io_drained: bool,
}

/// An init or exec process.
pub struct Process {
    pub container_id: String,
    /// `None` for the init process.
    pub exec_id: Option<String>,
    pub stdio: StdioRequest,
    /// Exec process spec (JSON), for execs.
    pub spec: Option<Vec<u8>>,
    state: Mutex<ProcState>,
    exited: Condvar,
    pub keepalive: Mutex<Keepalive>,
    pub tty: Mutex<Option<TtyCopier>>,
}

impl Process {
    pub fn new(
        container_id: &str,
        exec_id: Option<String>,
        stdio: StdioRequest,
        spec: Option<Vec<u8>>,
    ) -> Self {
        Process {
            container_id: container_id.to_string(),
            exec_id,
            stdio,
            spec,
            state: Mutex::new(ProcState {
                status: Status::Created,
                pid: 0,
                exit: None,
                exit_published: false,
                starting: false,
                exit_pending: false,
                io_drained: false,
            }),
            exited: Condvar::new(),
            keepalive: Mutex::new(Keepalive::default()),
            tty: Mutex::new(None),
        }
    }

    /// The process's ID as containerd names it in events (exec ID, or the container ID).
    pub fn event_id(&self) -> &str {
        self.exec_id.as_deref().unwrap_or(&self.container_id)
    }

    pub fn lock(&self) -> MutexGuard<'_, ProcState> {
        self.state.lock().unwrap()
    }

    /// Marks the exit visible and wakes every waiter. Caller holds the state lock.
    pub fn publish_exit_locked(&self, st: &mut ProcState) {
        st.exit_published = true;
        st.exit_pending = false;
        st.status = Status::Stopped;
        self.exited.notify_all();
    }

    /// Blocks until the exit is visible.
    pub fn wait(&self) -> ExitInfo {
        let mut st = self.lock();
        loop {
            if st.exit_published
                && let Some(e) = st.exit
            {
                return e;
            }
            st = self.exited.wait(st).unwrap();
        }
    }

    /// The exit if visible, without waiting.
    pub fn exit_if_published(&self) -> Option<ExitInfo> {
        let st = self.lock();
        if st.exit_published { st.exit } else { None }
    }
}
