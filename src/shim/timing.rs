//! Per-step timing of the slow calls, in the debug log (`-debug`, or containerd at debug
//! level): where a call's time goes, without a profiler.
//!
//! ```text
//! create task t1: 4183µs (read spec 41µs, mount rootfs 388µs, runc create 3602µs, ...)
//! ```
//!
//! Steps cost two `Instant::now()` calls each; the line is built only when debug logging is
//! on.

use std::time::{Duration, Instant};

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

/// One hard deadline shared by the steps of a bounded job (`delete`, which containerd kills
/// after 5 s): each step waits at most its own bound or what is left, whichever is less, and a
/// step that must leave later ones their share runs within [`Budget::before`]. Once the budget
/// is spent, a step gets nothing: the job stops at its deadline and reports what was left,
/// rather than running on until containerd kills it in the middle of a step.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    until: Instant,
}

impl Budget {
    pub fn new(total: Duration) -> Self {
        Budget {
            until: Instant::now() + total,
        }
    }

    /// When the budget ends.
    pub fn until(&self) -> Instant {
        self.until
    }

    /// What is left of it.
    pub fn left(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now())
    }

    pub fn is_spent(&self) -> bool {
        self.left().is_zero()
    }

    /// How long a step whose own bound is `own` may wait now (zero once the budget is spent).
    pub fn bound(&self, own: Duration) -> Duration {
        own.min(self.left())
    }

    /// [`Budget::bound`] as a deadline.
    pub fn deadline(&self, own: Duration) -> Instant {
        Instant::now() + self.bound(own)
    }

    /// The part of this budget that ends `reserve` before it: what the steps that come first
    /// may use, leaving the later ones `reserve`.
    pub fn before(&self, reserve: Duration) -> Budget {
        let now = Instant::now();
        Budget {
            until: self.until.checked_sub(reserve).unwrap_or(now).max(now),
        }
    }

    /// At most `own` from now, within this budget.
    pub fn at_most(&self, own: Duration) -> Budget {
        Budget {
            until: self.until.min(Instant::now() + own),
        }
    }

    /// Runs `f` on a thread of its own and waits for it until the budget ends. `None` when it
    /// has not finished by then: it goes on unwatched (its own waits are bounded by the same
    /// budget; whatever still runs ends with the process) and the caller reports the step as
    /// left. This is what makes the deadline hard: no wait inside a step (a helper in an
    /// uninterruptible sleep, a kernel call on a hung file system) can hold the job past it.
    /// A thread that cannot be started runs `f` here instead.
    pub fn run<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let f = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
        let in_thread = f.clone();
        let spawned = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || {
                let f = in_thread.lock().ok().and_then(|mut f| f.take());
                if let Some(f) = f {
                    let _ = tx.send(f());
                }
            });
        if spawned.is_err() {
            let f = f.lock().ok().and_then(|mut f| f.take());
            return f.map(|f| f());
        }
        rx.recv_timeout(self.left()).ok()
    }
}

/// What a bounded job left undone: the steps that failed, and those its deadline cut off (not
/// run, or still running when it came), for its report.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Undone {
    pub failed: Vec<String>,
    pub cut_off: Vec<String>,
}

impl Undone {
    pub fn failed(&mut self, what: impl Into<String>) {
        self.failed.push(what.into());
    }

    pub fn cut_off(&mut self, what: impl Into<String>) {
        self.cut_off.push(what.into());
    }

    pub fn extend(&mut self, other: Undone) {
        self.failed.extend(other.failed);
        self.cut_off.extend(other.cut_off);
    }

    pub fn is_empty(&self) -> bool {
        self.failed.is_empty() && self.cut_off.is_empty()
    }

    /// The report: each failure, then, when the deadline cut steps off, one line saying that
    /// the job stopped there (`budget` after it began) and what was left.
    pub fn lines(&self, budget: Duration) -> Vec<String> {
        let mut lines = self.failed.clone();
        if !self.cut_off.is_empty() {
            lines.push(format!(
                "stopped at its deadline ({budget:?} after it began); left undone: {}",
                self.cut_off.join("; ")
            ));
        }
        lines
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn a_step_gets_its_own_bound_or_what_is_left_and_nothing_once_spent() {
        let b = Budget::new(Duration::from_secs(3600));
        assert_eq!(b.bound(Duration::from_secs(2)), Duration::from_secs(2));
        assert!(b.bound(Duration::from_secs(7200)) <= Duration::from_secs(3600));
        let spent = Budget::new(Duration::ZERO);
        assert_eq!(spent.bound(Duration::from_secs(2)), Duration::ZERO);
        assert!(spent.is_spent());
    }

    #[test]
    fn before_leaves_the_reserve_and_at_most_caps() {
        let b = Budget::new(Duration::from_secs(100));
        let first = b.before(Duration::from_secs(30));
        assert!(first.left() <= Duration::from_secs(70));
        assert!(first.left() > Duration::from_secs(60));
        // A reserve larger than what is left: nothing for the first steps.
        assert!(b.before(Duration::from_secs(200)).is_spent());
        let capped = b.at_most(Duration::from_secs(1));
        assert!(capped.left() <= Duration::from_secs(1));
        assert_eq!(b.at_most(Duration::from_secs(500)).until(), b.until());
    }

    /// A step that does not finish by the deadline is given up there, not waited for.
    #[test]
    fn the_report_lists_failures_then_what_the_deadline_left() {
        let mut u = Undone::default();
        assert!(u.lines(Duration::from_secs(4)).is_empty());
        u.failed("container c1: runc delete: exit 1");
        u.cut_off("container c2 (at: runc delete --force)");
        u.cut_off("the pod network");
        assert_eq!(
            u.lines(Duration::from_secs(4)),
            vec![
                "container c1: runc delete: exit 1".to_string(),
                "stopped at its deadline (4s after it began); left undone: container c2 (at: \
                 runc delete --force); the pod network"
                    .to_string()
            ]
        );
    }

    #[test]
    fn run_stops_waiting_at_the_deadline() {
        let b = Budget::new(Duration::from_millis(50));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let r = b.run("stuck", move || {
            let _ = wait.recv();
            1
        });
        assert_eq!(r, None);
        drop(release);
        let b = Budget::new(Duration::from_secs(3600));
        assert_eq!(b.run("quick", || 7), Some(7));
    }
}
