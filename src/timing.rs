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

/// One time budget shared by the steps of a bounded job (`delete`, which containerd kills after
/// 5 s): each step waits at most its own bound or what is left, whichever is less, so a slow
/// step costs the later ones time, never their run. Past the end each still gets
/// [`Budget::FLOOR`]: a quick try is better than none while nobody has killed us yet.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    until: Instant,
}

impl Budget {
    /// What a step still gets once the budget is spent.
    pub const FLOOR: std::time::Duration = std::time::Duration::from_millis(100);

    pub fn new(total: std::time::Duration) -> Self {
        Budget {
            until: Instant::now() + total,
        }
    }

    /// How long a step whose own bound is `own` may wait now.
    pub fn bound(&self, own: std::time::Duration) -> std::time::Duration {
        own.min(self.until.saturating_duration_since(Instant::now()))
            .max(Self::FLOOR.min(own))
    }

    /// [`Budget::bound`] as a deadline.
    pub fn deadline(&self, own: std::time::Duration) -> Instant {
        Instant::now() + self.bound(own)
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_step_gets_its_own_bound_or_what_is_left_and_the_floor_at_least() {
        let b = Budget::new(Duration::from_secs(3600));
        assert_eq!(b.bound(Duration::from_secs(2)), Duration::from_secs(2));
        assert!(b.bound(Duration::from_secs(7200)) <= Duration::from_secs(3600));
        let spent = Budget::new(Duration::ZERO);
        assert_eq!(spent.bound(Duration::from_secs(2)), Budget::FLOOR);
        assert_eq!(
            spent.bound(Duration::from_millis(10)),
            Duration::from_millis(10)
        );
    }
}
