//! The CNI tests' [`PluginExec`]: plugins run with `std::process`, reaped by `try_wait` (test
//! processes have no reaper). The shim itself runs plugins through its own spawner, which
//! reaps through the daemon's reaper.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::exec::{ExecError, PluginExec, retry_text_busy};
use super::util::truncate;

/// [`PluginExec`] on top of `std::process`: spawn, feed stdin and drain stdout/stderr on
/// threads, poll `try_wait` until the deadline, then SIGKILL and reap.
///
/// Must not be used inside the shim daemon (its global reaper would steal the exit status).
/// All pipe fds are `O_CLOEXEC` (std guarantees this). The plugin runs in its own process
/// group; on timeout the whole group is SIGKILLed. Spawning is retried on `ETXTBSY`
/// ([`retry_text_busy`]).
#[derive(Debug, Clone, Default)]
pub struct StdExec;

impl PluginExec for StdExec {
    fn exec(
        &self,
        path: &Path,
        env: &[(String, String)],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError> {
        let deadline = Instant::now() + timeout;
        let mut child = retry_text_busy(timeout, |_| {
            Command::new(path)
                // own process group, so a timeout also kills whatever the plugin forked
                .process_group(0)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .map_err(|source| ExecError::Spawn {
            path: path.to_path_buf(),
            source,
        })?;

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
