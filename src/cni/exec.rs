//! Plugin execution: the narrow [`PluginExec`] trait and the std-based [`StdExec`].
//!
//! Inside the shim daemon a single global reaper owns `waitpid(-1)`, so the daemon supplies its
//! own [`PluginExec`] built on that reaper. [`StdExec`] is for code outside the daemon (tools,
//! tests): it reaps its own child with `try_wait`.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
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

/// [`PluginExec`] on top of `std::process`: spawn, feed stdin and drain stdout/stderr on
/// threads, poll `try_wait` until the deadline, then SIGKILL and reap.
///
/// Must not be used inside the shim daemon (its global reaper would steal the exit status).
/// All pipe fds are `O_CLOEXEC` (std guarantees this). The plugin runs in its own process
/// group; on timeout the whole group is SIGKILLed. Spawning is retried a few times on
/// `ETXTBSY` like libcni's `RawExec` does ("text file busy" while a plugin is being installed).
#[derive(Debug, Clone, Default)]
pub struct StdExec;

const ETXTBSY_RETRIES: u32 = 5;
const ETXTBSY_BACKOFF: Duration = Duration::from_millis(200);

impl PluginExec for StdExec {
    fn exec(
        &self,
        path: &Path,
        env: &[(String, String)],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError> {
        let deadline = Instant::now() + timeout;
        let mut attempt = 0;
        let mut child = loop {
            let spawned = Command::new(path)
                // own process group, so a timeout also kills whatever the plugin forked
                .process_group(0)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            match spawned {
                Ok(c) => break c,
                Err(e)
                    if e.raw_os_error() == Some(libc::ETXTBSY)
                        && attempt < ETXTBSY_RETRIES
                        && Instant::now() < deadline =>
                {
                    attempt += 1;
                    thread::sleep(ETXTBSY_BACKOFF);
                }
                Err(source) => {
                    return Err(ExecError::Spawn {
                        path: path.to_path_buf(),
                        source,
                    });
                }
            }
        };

        // stdin on its own thread: a plugin that never reads must not block us (EPIPE ignored).
        let mut child_stdin = child.stdin.take().expect("stdin is piped");
        let input = stdin.to_vec();
        thread::spawn(move || {
            let _ = child_stdin.write_all(&input);
            // dropping closes the pipe → EOF for the plugin
        });
        let (tx, rx) = mpsc::channel::<(bool, io::Result<Vec<u8>>)>();
        let mut out = child.stdout.take().expect("stdout is piped");
        let tx_out = tx.clone();
        thread::spawn(move || {
            let mut buf = Vec::new();
            let r = out.read_to_end(&mut buf).map(|_| buf);
            let _ = tx_out.send((true, r));
        });
        let mut err = child.stderr.take().expect("stderr is piped");
        thread::spawn(move || {
            let mut buf = Vec::new();
            let r = err.read_to_end(&mut buf).map(|_| buf);
            let _ = tx.send((false, r));
        });

        let kill = |child: &mut std::process::Child| {
            // The group leader is not reaped yet, so its pid still names the group.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.kill();
            let _ = child.wait();
        };

        // Poll for exit with a gently growing interval.
        let mut interval = Duration::from_millis(2);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(source) => {
                    kill(&mut child);
                    return Err(ExecError::Io {
                        path: path.to_path_buf(),
                        source,
                    });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                kill(&mut child);
                return Err(ExecError::Timeout {
                    path: path.to_path_buf(),
                    timeout,
                });
            }
            thread::sleep(interval.min(deadline - now));
            interval = (interval * 2).min(Duration::from_millis(50));
        };

        // The plugin exited; collect its output. A daemonised grandchild could keep the pipes
        // open forever, so the same deadline applies (reader threads are then left behind until
        // the pipes close).
        let mut stdout = None;
        let mut stderr = None;
        while stdout.is_none() || stderr.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((is_out, r)) => {
                    let data = r.map_err(|source| ExecError::Io {
                        path: path.to_path_buf(),
                        source,
                    })?;
                    if is_out {
                        stdout = Some(data);
                    } else {
                        stderr = Some(data);
                    }
                }
                Err(_) => {
                    return Err(ExecError::Timeout {
                        path: path.to_path_buf(),
                        timeout,
                    });
                }
            }
        }
        let (stdout, stderr) = (stdout.unwrap_or_default(), stderr.unwrap_or_default());

        if status.success() {
            if !stderr.is_empty() {
                log::debug!(
                    "CNI plugin {} stderr: {}",
                    path.display(),
                    truncate(String::from_utf8_lossy(&stderr).trim(), 4096)
                );
            }
            Ok(stdout)
        } else {
            use std::os::unix::process::ExitStatusExt;
            Err(ExecError::Failed {
                path: path.to_path_buf(),
                code: status.code(),
                signal: status.signal(),
                stdout,
                stderr,
            })
        }
    }
}
