//! `ctr events` in the background: what containerd publishes, read as it comes.
//!
//! A test that waits for an event subscribes first and knows when it is subscribed: a fixed
//! sleep before the action (the stream may not be subscribed yet) or after it (the event may
//! not be printed yet) is a race a busy machine loses.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{HANG, ctr, ctr_cmd, unique_id};

/// `ctr events` running, its lines gathered.
pub struct EventStream {
    child: Child,
    rx: mpsc::Receiver<String>,
    lines: Vec<String>,
}

/// The label [`EventStream::subscribe`] sets on the namespace to see its stream subscribed.
const PROBE_LABEL: &str = "rsandbox-test-events-probe";

impl EventStream {
    /// `ctr events` in `ns`, returned once it is subscribed: a label it set on `ns` (containerd
    /// publishes `/namespaces/update`) has come back through it. The label is taken off again.
    pub fn subscribe(ns: &str) -> Result<EventStream, String> {
        let mut cmd = ctr_cmd(ns, &["events"]);
        // stderr read only once it has exited (it says little: why it could not subscribe)
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("spawn ctr events: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut s = EventStream {
            child,
            rx,
            lines: Vec::new(),
        };
        let probe = unique_id("events");
        let deadline = Instant::now() + HANG;
        let mut subscribed = false;
        while !subscribed && Instant::now() < deadline {
            if let Ok(Some(status)) = s.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = s.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Err(format!(
                    "ctr events in {ns} ended ({status}): {}",
                    err.trim()
                ));
            }
            let o = ctr(
                ns,
                &["namespaces", "label", ns, &format!("{PROBE_LABEL}={probe}")],
            );
            if !o.ok() {
                return Err(format!("ctr namespaces label (the events probe): {o:?}"));
            }
            subscribed = s.wait_until(
                |lines| {
                    lines
                        .iter()
                        .any(|l| l.contains("/namespaces/update") && l.contains(&probe))
                },
                Duration::from_millis(500),
            );
        }
        let _ = ctr(ns, &["namespaces", "label", ns, &format!("{PROBE_LABEL}=")]);
        if !subscribed {
            return Err(format!(
                "ctr events in {ns}: its own probe (/namespaces/update) did not come back within {HANG:?}"
            ));
        }
        Ok(s)
    }

    /// Reads lines until `done` holds for all read so far, at most `timeout`; whether it held.
    pub fn wait_until(&mut self, done: impl Fn(&[String]) -> bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.lines) {
                return true;
            }
            match self
                .rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => self.lines.push(l),
                Err(_) => return done(&self.lines),
            }
        }
    }

    /// Every line read so far.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
