//! Per-step timing of the slow calls, in the debug log (`-debug`, or containerd at debug
//! level): where a call's time goes, without a profiler.
//!
//! ```text
//! create task t1: 4183µs (read spec 41µs, mount rootfs 388µs, runc create 3602µs, ...)
//! ```
//!
//! Steps cost two `Instant::now()` calls each; the line is built only when debug logging is
//! on.

use std::time::Instant;

/// The steps of one call; logs them when dropped.
pub struct Steps {
    call: String,
    started: Instant,
    last: Instant,
    steps: Vec<(&'static str, u128)>,
    enabled: bool,
}

impl Steps {
    /// Starts timing `call` (e.g. "create task t1").
    pub fn new(call: impl FnOnce() -> String) -> Steps {
        let enabled = log::log_enabled!(log::Level::Debug);
        let now = Instant::now();
        Steps {
            call: if enabled { call() } else { String::new() },
            started: now,
            last: now,
            steps: Vec::new(),
            enabled,
        }
    }

    /// Ends the step that ran since the previous one (or the start) and names it.
    pub fn step(&mut self, name: &'static str) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        self.steps
            .push((name, now.duration_since(self.last).as_micros()));
        self.last = now;
    }

    /// The log line (also for tests).
    pub fn line(&self) -> String {
        let total = self.started.elapsed().as_micros();
        let parts: Vec<String> = self
            .steps
            .iter()
            .map(|(n, us)| format!("{n} {us}µs"))
            .collect();
        format!("{}: {total}µs ({})", self.call, parts.join(", "))
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if self.enabled {
            log::debug!("{}", self.line());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_each_step_and_the_total() {
        let mut s = Steps {
            call: "create task t1".into(),
            started: Instant::now(),
            last: Instant::now(),
            steps: Vec::new(),
            enabled: true,
        };
        s.step("read spec");
        s.step("runc create");
        let line = s.line();
        assert!(line.starts_with("create task t1: "), "{line}");
        assert!(line.contains("(read spec "), "{line}");
        assert!(line.contains(", runc create "), "{line}");
        s.enabled = false; // no logger in tests
    }
}
