//! The `start` action: bind the shim's socket, start the daemon on it, answer containerd.
//!
//! The socket is 0600 in a 0700 directory, never abstract. The daemon gets the listening
//! socket as fd 3, `/dev/null` for stdio (containerd reads `start`'s combined output until
//! every writer closes it) and its own process group; the runtime options go into the bundle
//! for it. A live shim already serving the bundle's group (the CRI sandbox ID) is reused.
//! Whatever fails after the bind takes the socket and the daemon down again.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::bootstrap::StartParams;
use super::shim_cgroup;
use crate::records::bundle::{
    ADDRESS_FILE, CONFIG_FILE, LISTENER_FD, OPTIONS_FILE, SHIM_PID_FILE, SOCKET_DIR,
    SOCKET_DIR_LINK,
};
use crate::records::error::{Context, Error, Result};
use crate::shim::socket::{self, Probe};
use crate::shim::util::write_file_atomic;

/// The grouping key of a bundle: the CRI sandbox ID of a container spec, else the ID itself.
/// With bootstrap version 3 containerd reuses a sandbox's shim itself; grouping only matters
/// to a client that runs `start` per container (bootstrap v2 behaviour).
pub fn grouping(bundle: &Path, id: &str) -> String {
    let Ok(raw) = std::fs::read(bundle.join(CONFIG_FILE)) else {
        return id.to_string();
    };
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&raw) else {
        return id.to_string();
    };
    spec.pointer("/annotations/io.kubernetes.cri.sandbox-id")
        .and_then(|v| v.as_str())
        .filter(|s| crate::records::validate::id("sandbox id", s).is_ok())
        .unwrap_or(id)
        .to_string()
}

/// The directory of our sockets: containerd 2.3's `socket_dir`, else the default.
pub fn socket_dir(params: &StartParams) -> Result<String> {
    match &params.socket_dir {
        None => Ok(SOCKET_DIR.to_string()),
        Some(d) if Path::new(d).is_absolute() => Ok(d.clone()),
        Some(d) => Err(Error::invalid(format!(
            "bootstrap params: socket_dir {d:?} is not an absolute path"
        ))),
    }
}

/// Runs `start` with `daemon` as the daemon's executable (our own binary); returns the
/// address to give containerd. `cgroups` gives the host's cgroup hierarchies, asked for only
/// when the runtime options name a ShimCgroup.
pub fn start(
    params: &StartParams,
    bundle: &Path,
    daemon: &Path,
    cgroups: impl FnOnce() -> shim_cgroup::Host,
) -> Result<String> {
    crate::records::validate::id("shim id", &params.id)?;
    let runc_options = params.runc_options()?;
    let dir = socket_dir(params)?;
    let address = socket::address(
        &dir,
        &params.grpc_address,
        &params.namespace,
        &grouping(bundle, &params.id),
    );
    let path = PathBuf::from(address.trim_start_matches("unix://"));
    match socket::probe(&path) {
        Probe::Live => {
            // That shim is alive and serves this group.
            record_address(bundle, &address, &dir)?;
            return Ok(address);
        }
        Probe::Missing => {}
        Probe::Refused | Probe::Unknown(_) => {
            let _ = std::fs::remove_file(&path);
        }
    }
    let listener = socket::bind(&path).with_context(|| format!("bind {}", path.display()))?;
    let mut guard = Undo {
        socket: Some(path),
        daemon: None,
    };
    if let Some(any) = params.saved_options() {
        let data = protobuf::Message::write_to_bytes(any).context("encode runtime options")?;
        write_file_atomic(&bundle.join(OPTIONS_FILE), &data, 0o600)
            .context("save runtime options")?;
    }
    let child = spawn_daemon(daemon, params, bundle, &address, listener.as_raw_fd())?;
    let pid = child.id();
    guard.daemon = Some(child);
    if let Some(cgroup) = runc_options.as_ref().map(|o| o.shim_cgroup.as_str())
        && !cgroup.is_empty()
    {
        shim_cgroup::join(&cgroups(), cgroup, pid)
            .with_context(|| format!("move the shim into ShimCgroup {cgroup:?}"))?;
    }
    adjust_oom_score(pid, std::os::unix::process::parent_id())
        .context("adjust the shim's OOM score")?;
    write_file_atomic(
        &bundle.join(SHIM_PID_FILE),
        pid.to_string().as_bytes(),
        0o600,
    )
    .context("write shim.pid")?;
    record_address(bundle, &address, &dir)?;
    guard.disarm();
    Ok(address)
}

/// As containerd's runc shim: the daemon's `oom_score_adj` is containerd's (our parent's) plus
/// one, so that under memory pressure the kernel picks a shim before containerd. Raising a
/// score needs no privilege; where the kernel refuses anyway (a user namespace), the score
/// stays as inherited.
fn adjust_oom_score(pid: u32, parent: u32) -> Result<()> {
    let path = format!("/proc/{parent}/oom_score_adj");
    let score: i32 = std::fs::read_to_string(&path)
        .with_context(|| format!("read {path}"))?
        .trim()
        .parse()
        .map_err(|e| Error::internal(format!("{path}: {e}")))?;
    let target = (score + 1).min(1000);
    match std::fs::write(format!("/proc/{pid}/oom_score_adj"), target.to_string()) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => Ok(()),
        Err(e) => Err(Error::from(e).context(format!("set /proc/{pid}/oom_score_adj"))),
    }
}

/// Saves our address (and a non-default socket dir) in the bundle for `delete`.
fn record_address(bundle: &Path, address: &str, dir: &str) -> Result<()> {
    write_file_atomic(&bundle.join(ADDRESS_FILE), address.as_bytes(), 0o600)
        .context("write the address file")?;
    let link = bundle.join(SOCKET_DIR_LINK);
    let _ = std::fs::remove_file(&link);
    if dir.trim_end_matches('/') != SOCKET_DIR {
        std::os::unix::fs::symlink(dir, &link).context("write the socket-dir link")?;
    }
    Ok(())
}

fn spawn_daemon(
    exe: &Path,
    params: &StartParams,
    bundle: &Path,
    address: &str,
    listener_fd: i32,
) -> Result<std::process::Child> {
    let mut cmd = Command::new(exe);
    cmd.current_dir(bundle)
        .args([
            "-namespace",
            &params.namespace,
            "-id",
            &params.id,
            "-address",
            &params.grpc_address,
            "-socket",
            address,
        ])
        .env("TTRPC_ADDRESS", &params.ttrpc_address)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if params.debug {
        cmd.arg("-debug");
    }
    // SAFETY: between fork and exec the closure only makes the dup2, fcntl and close_range
    // system calls, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 clears FD_CLOEXEC on the copy, so the daemon inherits exactly fd 3; when the
            // listener already is fd 3, dup2 does nothing and the flag is cleared by hand.
            let r = if listener_fd == LISTENER_FD {
                libc::fcntl(listener_fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(listener_fd, LISTENER_FD)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else: an fd our caller leaked to us (a pipe it reads until EOF, a
            // jobserver) must not live on in a daemon that runs for the pod's lifetime.
            // Best effort (close_range needs Linux 5.9; our own fds are all O_CLOEXEC).
            libc::syscall(
                libc::SYS_close_range,
                LISTENER_FD as u32 + 1,
                u32::MAX,
                0u32,
            );
            Ok(())
        });
    }
    cmd.spawn().context("start the shim daemon")
}

/// Takes down what a failed `start` created: the daemon, then the socket file.
struct Undo {
    socket: Option<PathBuf>,
    daemon: Option<std::process::Child>,
}

impl Undo {
    fn disarm(&mut self) {
        self.socket = None;
        self.daemon = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(path) = self.socket.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bootstrap::Protocol;

    fn no_cgroups() -> shim_cgroup::Host {
        shim_cgroup::Host {
            unified: false,
            mounts: vec![],
        }
    }

    fn params() -> StartParams {
        StartParams {
            protocol: Protocol::Legacy,
            id: "c1".into(),
            namespace: "k8s.io".into(),
            ttrpc_address: "/t".into(),
            grpc_address: "/g".into(),
            debug: false,
            socket_dir: None,
            extensions: vec![],
        }
    }

    #[test]
    fn grouping_follows_the_cri_sandbox_annotation() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(grouping(tmp.path(), "c1"), "c1");
        std::fs::write(
            tmp.path().join(CONFIG_FILE),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}"#,
        )
        .unwrap();
        assert_eq!(grouping(tmp.path(), "c1"), "pod1");
        // An unusable sandbox ID is never a socket name component.
        std::fs::write(
            tmp.path().join(CONFIG_FILE),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"../x"}}"#,
        )
        .unwrap();
        assert_eq!(grouping(tmp.path(), "c1"), "c1");
    }

    #[test]
    fn socket_dir_is_the_default_or_an_absolute_2_3_dir() {
        assert_eq!(socket_dir(&params()).unwrap(), SOCKET_DIR);
        let mut p = params();
        p.socket_dir = Some("/var/run/s".into());
        assert_eq!(socket_dir(&p).unwrap(), "/var/run/s");
        p.socket_dir = Some("run/s".into());
        assert!(socket_dir(&p).is_err());
    }

    #[test]
    fn the_address_file_and_socket_dir_link() {
        let tmp = tempfile::tempdir().unwrap();
        record_address(tmp.path(), "unix:///run/containerd/s/ab", SOCKET_DIR).unwrap();
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(ADDRESS_FILE)).unwrap(),
            "unix:///run/containerd/s/ab"
        );
        assert!(std::fs::symlink_metadata(tmp.path().join(SOCKET_DIR_LINK)).is_err());
        record_address(tmp.path(), "unix:///x/s/ab", "/x/s").unwrap();
        assert_eq!(
            std::fs::read_link(tmp.path().join(SOCKET_DIR_LINK)).unwrap(),
            Path::new("/x/s")
        );
    }

    #[test]
    fn a_live_shim_of_the_group_is_reused_without_a_new_daemon() {
        let tmp = tempfile::tempdir().unwrap();
        let sockets = tmp.path().join("s");
        let mut p = params();
        p.socket_dir = Some(sockets.to_string_lossy().into_owned());
        let address = socket::address(&sockets.to_string_lossy(), "/g", "k8s.io", "c1");
        let _live = socket::bind(Path::new(address.trim_start_matches("unix://"))).unwrap();
        let bundle = tmp.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let no_daemon = Path::new("/nonexistent/daemon");
        assert_eq!(start(&p, &bundle, no_daemon, no_cgroups).unwrap(), address);
        assert!(!bundle.join(SHIM_PID_FILE).exists());
        assert_eq!(
            std::fs::read_to_string(bundle.join(ADDRESS_FILE)).unwrap(),
            address
        );
    }

    /// A fake daemon: saves its arguments in `daemon.args` in its working directory, then
    /// becomes `sleep` with whatever fds and environment it was given (the test reads them
    /// from /proc).
    fn fake_daemon(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-daemon");
        std::fs::write(
            &p,
            // No subshell: a forked copy with the same command line could outlive a killed
            // parent for a moment (the redirection of a builtin ends with the command anyway).
            "#!/bin/sh\necho \"$*\" > \"$PWD/daemon.args\"\nexec sleep 30\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Polls `f` until it answers; the 60 s bound only catches a hang (a loaded machine may
    /// take seconds to run the fake daemon).
    fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Some(v) = f() {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{what}: timed out");
    }

    /// Whether `pid` is blocked in a sleep system call: then `sleep`'s own start-up is over
    /// (its setlocale opens and closes `/etc/locale.alias`, which a look at its fds in the
    /// middle of it would take for an inherited descriptor).
    fn in_sleep_syscall(pid: i32) -> bool {
        let Ok(syscall) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) else {
            return false;
        };
        let nr = syscall
            .split(' ')
            .next()
            .and_then(|n| n.parse::<i64>().ok());
        nr == Some(libc::SYS_clock_nanosleep) || nr == Some(libc::SYS_nanosleep)
    }

    fn kill(pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    }

    #[test]
    fn start_binds_hands_fd_3_to_the_daemon_and_moves_it_into_shim_cgroup() {
        use containerd_shim_protos::shim::oci::Options as RuncOptions;
        use protobuf::Message;
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        let sockets = dir.join("s");
        let bundle = dir.join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let cg = dir.join("cg");
        std::fs::create_dir_all(cg.join("cpu/shims")).unwrap();
        std::fs::write(cg.join("cpu/shims/cgroup.procs"), b"").unwrap();
        let cgroups = shim_cgroup::Host {
            unified: false,
            mounts: vec![crate::host::cgroups::CgroupMount {
                unified: false,
                controllers: vec!["cpu".into()],
                mountpoint: cg.join("cpu"),
            }],
        };
        let options = protobuf::well_known_types::any::Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: RuncOptions {
                shim_cgroup: "/shims".into(),
                ..Default::default()
            }
            .write_to_bytes()
            .unwrap(),
            ..Default::default()
        };
        let mut p = params();
        p.socket_dir = Some(sockets.to_string_lossy().into_owned());
        p.debug = true;
        p.extensions = vec![options.clone()];

        let address = start(&p, &bundle, &fake_daemon(&dir), || cgroups).unwrap();
        let pid: i32 = std::fs::read_to_string(bundle.join(SHIM_PID_FILE))
            .unwrap()
            .parse()
            .unwrap();
        let args = wait_for("daemon.args", || {
            std::fs::read_to_string(bundle.join("daemon.args")).ok()
        });
        let proc = PathBuf::from(format!("/proc/{pid}"));
        wait_for("exec sleep", || {
            let cmd = std::fs::read(proc.join("cmdline")).ok()?;
            (cmd.starts_with(b"sleep\0") && in_sleep_syscall(pid)).then_some(())
        });
        let mut fds: Vec<(i32, String)> = std::fs::read_dir(proc.join("fd"))
            .unwrap()
            .flatten()
            .map(|e| {
                let fd = e.file_name().to_string_lossy().parse().unwrap();
                (
                    fd,
                    std::fs::read_link(e.path())
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                )
            })
            .collect();
        fds.sort();
        let environ = String::from_utf8(std::fs::read(proc.join("environ")).unwrap()).unwrap();
        let stat = std::fs::read_to_string(proc.join("stat")).unwrap();
        let cwd = std::fs::read_link(proc.join("cwd")).unwrap();
        kill(pid);

        assert_eq!(
            address,
            socket::address(&sockets.to_string_lossy(), "/g", "k8s.io", "c1")
        );
        let path = Path::new(address.trim_start_matches("unix://"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(path), mode(&sockets)), (0o600, 0o700));
        assert_eq!(
            args,
            format!("-namespace k8s.io -id c1 -address /g -socket {address} -debug\n")
        );
        // Exactly stdio and fd 3, the listening socket; stdio is /dev/null: no pipe to
        // containerd, which reads start's output until every writer has closed it.
        let names: Vec<&str> = fds.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            fds.iter().map(|(fd, _)| *fd).collect::<Vec<_>>(),
            [0, 1, 2, 3],
            "{fds:?}"
        );
        assert_eq!(&names[..3], ["/dev/null"; 3]);
        assert!(names[3].starts_with("socket:["), "{fds:?}");
        let env: Vec<&str> = environ.split('\0').collect();
        assert!(env.contains(&"TTRPC_ADDRESS=/t"));
        assert_eq!(cwd, bundle);
        // Its own process group: "pid (comm) state ppid pgrp ...".
        let pgrp = stat.rsplit_once(") ").unwrap().1.split(' ').nth(2).unwrap();
        assert_eq!(pgrp, pid.to_string());
        assert_eq!(
            std::fs::read_to_string(cg.join("cpu/shims/cgroup.procs")).unwrap(),
            pid.to_string()
        );
        assert_eq!(
            std::fs::read(bundle.join(OPTIONS_FILE)).unwrap(),
            options.write_to_bytes().unwrap()
        );
        assert_eq!(
            std::fs::read_to_string(bundle.join(ADDRESS_FILE)).unwrap(),
            address
        );
        assert_eq!(
            std::fs::read_link(bundle.join(SOCKET_DIR_LINK)).unwrap(),
            sockets
        );
    }

    #[test]
    fn a_failed_start_takes_the_daemon_and_the_socket_down() {
        use containerd_shim_protos::shim::oci::Options as RuncOptions;
        use protobuf::Message;
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        let bundle = dir.join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let mut p = params();
        p.socket_dir = Some(dir.join("s").to_string_lossy().into_owned());
        p.extensions = vec![protobuf::well_known_types::any::Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: RuncOptions {
                shim_cgroup: "/does-not-exist".into(),
                ..Default::default()
            }
            .write_to_bytes()
            .unwrap(),
            ..Default::default()
        }];
        let e = start(&p, &bundle, &fake_daemon(&dir), no_cgroups).unwrap_err();
        assert!(
            e.to_string().contains("ShimCgroup \"/does-not-exist\""),
            "{e}"
        );
        let address = socket::address(&dir.join("s").to_string_lossy(), "/g", "k8s.io", "c1");
        assert!(!Path::new(address.trim_start_matches("unix://")).exists());
        assert!(!bundle.join(SHIM_PID_FILE).exists());
        // The daemon was killed and reaped: no process runs with its socket argument.
        let alive = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(address.as_str()))
                .unwrap_or(false)
        });
        assert!(!alive);
    }

    #[test]
    fn the_daemon_gets_its_parents_oom_score_plus_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let mine: i32 = std::fs::read_to_string(format!("/proc/{me}/oom_score_adj"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        adjust_oom_score(child.id(), me).unwrap();
        let theirs: i32 = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id()))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(theirs, (mine + 1).min(1000));
        assert!(adjust_oom_score(child.id(), 0).is_err(), "no such parent");
    }
}
