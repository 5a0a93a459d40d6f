//! Plugin execution: the narrow [`PluginExec`] trait, its [`ExecError`], and the `ETXTBSY`
//! retry every implementation wraps its spawn in ([`retry_text_busy`]).
//!
//! The shim runs plugins through its own implementation on top of its process spawner (in the
//! daemon a single global reaper owns `waitpid(-1)`, so plugins must be reaped through it); this
//! module only says what running a plugin means.

use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::util::truncate;

/// Runs one CNI plugin binary.
pub trait PluginExec: Send + Sync {
    /// Run `path` with exactly `env` (no inherited environment), write `stdin`, return stdout.
    /// Non-zero exit → Err with exit code, stdout and stderr. Killed after `timeout`.
    fn exec(
        &self,
        path: &Path,
        env: &[(String, String)],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError>;
}

/// Why running a plugin binary failed (before its output is interpreted).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The binary could not be started.
    #[error("failed to start {}: {source}", path.display())]
    Spawn {
        /// Binary path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// An I/O error while talking to the running plugin.
    #[error("I/O error running {}: {source}", path.display())]
    Io {
        /// Binary path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The plugin exited unsuccessfully (non-zero code or killed by a signal).
    #[error("{} {}{}{}", path.display(), exit_description(*code, *signal), output_suffix("stdout", stdout), output_suffix("stderr", stderr))]
    Failed {
        /// Binary path.
        path: PathBuf,
        /// Exit code, if it exited normally.
        code: Option<i32>,
        /// Terminating signal, if it was killed.
        signal: Option<i32>,
        /// Everything it wrote to stdout (CNI error objects go here).
        stdout: Vec<u8>,
        /// Everything it wrote to stderr.
        stderr: Vec<u8>,
    },
    /// The plugin did not finish in time and was killed.
    #[error("{} timed out after {timeout:?} and was killed", path.display())]
    Timeout {
        /// Binary path.
        path: PathBuf,
        /// The timeout that expired.
        timeout: Duration,
    },
}

fn exit_description(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "exited abnormally".to_string(),
    }
}

fn output_suffix(label: &str, data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!("; {label}: {}", truncate(text, 1024))
    }
}

/// How often a spawn failing with `ETXTBSY` is retried, and how long to wait before each retry.
const ETXTBSY_RETRIES: u32 = 5;
const ETXTBSY_BACKOFF: Duration = Duration::from_millis(200);

/// Runs `spawn` (given the time left of `timeout`) and runs it again while it fails with
/// `ETXTBSY`, at most 5 more times, 200 ms apart, and not past `timeout`: libcni's `RawExec`
/// does the same, as "text file busy" happens while a plugin binary is being installed (or
/// while a forked child of another thread still holds it open for writing).
///
/// Only a spawn fails with `ETXTBSY` (execve), so `spawn` may also run the plugin to the end:
/// any other error, and success, are returned at once.
pub fn retry_text_busy<T>(
    timeout: Duration,
    mut spawn: impl FnMut(Duration) -> io::Result<T>,
) -> io::Result<T> {
    let deadline = Instant::now() + timeout;
    let mut attempt = 0;
    loop {
        match spawn(deadline.saturating_duration_since(Instant::now())) {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && attempt < ETXTBSY_RETRIES
                    && Instant::now() + ETXTBSY_BACKOFF < deadline =>
            {
                attempt += 1;
                log::debug!("plugin spawn: {e}; retry {attempt} of {ETXTBSY_RETRIES}");
                thread::sleep(ETXTBSY_BACKOFF);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_busy() -> io::Error {
        io::Error::from_raw_os_error(libc::ETXTBSY)
    }

    #[test]
    fn text_busy_is_retried_until_the_spawn_succeeds() {
        let mut calls = 0;
        let r = retry_text_busy(Duration::from_secs(10), |left| {
            calls += 1;
            assert!(left <= Duration::from_secs(10));
            if calls < 3 {
                Err(text_busy())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn text_busy_is_retried_five_times_then_returned() {
        let mut calls = 0;
        let r: io::Result<()> = retry_text_busy(Duration::from_secs(10), |_| {
            calls += 1;
            Err(text_busy())
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ETXTBSY));
        assert_eq!(calls, 1 + ETXTBSY_RETRIES);
    }

    #[test]
    fn text_busy_is_not_retried_past_the_timeout() {
        let mut calls = 0;
        let r: io::Result<()> = retry_text_busy(Duration::from_millis(300), |_| {
            calls += 1;
            Err(text_busy())
        });
        assert!(r.is_err());
        assert_eq!(
            calls, 2,
            "one retry fits into 300 ms, a second one does not"
        );
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        let mut calls = 0;
        let r: io::Result<()> = retry_text_busy(Duration::from_secs(10), |_| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::ENOENT))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert_eq!(calls, 1);
    }
}
