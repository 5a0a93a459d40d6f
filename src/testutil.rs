//! Helpers shared by the unit tests of the ttrpc services and the runtime.

use std::sync::Arc;

use ttrpc::{Code, TtrpcContext};

/// A request context for calling a service trait directly (no connection behind it).
pub fn ctx() -> TtrpcContext {
    TtrpcContext {
        fd: -1,
        cancel_rx: crossbeam_channel::never(),
        mh: Default::default(),
        res_tx: std::sync::mpsc::channel().0,
        metadata: Default::default(),
        timeout_nano: 0,
        conn_ctx: Arc::new(Default::default()),
    }
}

/// The status code of a failed call (panics on success).
pub fn code<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> Code {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => s.code(),
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// The status message of a failed call (panics on success).
pub fn message<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> String {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => s.message().to_string(),
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// The body of a stand-in `runc exec` (a shell script in a directory of its own). Without a
/// terminal it writes a pid above the kernel's `pid_max` to `--pid-file` and succeeds. With
/// one (`--console-socket`) it plays a runc that connects to the console socket and then sends
/// nothing: it writes its own pid to `runc.pid` and the socket's path to `console` beside the
/// script, and sleeps; [`connect_as_runc`] makes the connection (sh has no socket client).
pub const FAKE_RUNC_EXEC: &str = r#"while [ $# -gt 0 ]; do
  case "$1" in --console-socket) sock="$2";; --pid-file) pidf="$2";; esac
  shift
done
here="$(dirname "$0")"
if [ -n "$sock" ]; then
  echo $$ > "$here/runc.pid"
  echo "$sock" > "$here/console.tmp" && mv "$here/console.tmp" "$here/console"
  exec sleep 600
fi
echo $((8388608 + $$)) > "$pidf""#;

/// Connects to the console socket the [`FAKE_RUNC_EXEC`] in `dir` was given, as runc would;
/// returns the connection and the fake runc's pid.
pub fn connect_as_runc(dir: &std::path::Path) -> (std::os::unix::net::UnixStream, i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let (Ok(sock), Ok(pid)) = (
            std::fs::read_to_string(dir.join("console")),
            std::fs::read_to_string(dir.join("runc.pid")),
        ) && let Ok(pid) = pid.trim().parse()
        {
            let s = std::os::unix::net::UnixStream::connect(sock.trim()).unwrap();
            return (s, pid);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fake runc never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// For root tests that need a PID namespace of their own (`waitpid(-1)` that takes no other
/// test's child, `/proc/sys/kernel/ns_last_pid`): runs test `name` (its full path) again as
/// PID 1 of a new PID namespace with its own /proc (`unshare --pid --fork --mount-proc`),
/// checks that run passed and returns false; returns true inside that run, where the caller
/// does the test's work. Without root: prints that it is skipped, returns false.
pub fn in_own_pid_namespace(name: &str) -> bool {
    const INNER: &str = "RSANDBOX_TEST_IN_PID_NAMESPACE";
    if std::env::var_os(INNER).is_some() {
        assert_eq!(
            std::process::id(),
            1,
            "not PID 1 of a PID namespace of its own"
        );
        return true;
    }
    if !nix::unistd::getuid().is_root() {
        skip("root", "needs root");
        return false;
    }
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--include-ignored", "--test-threads=1"])
        .arg("--nocapture")
        .env(INNER, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
    eprintln!("{text}");
    false
}

/// The variable a stage sets to the gates that hold where it runs (names separated by spaces or
/// commas): `hack/test.sh`'s unit-test stage names `root`, the systemd node and guest
/// `live-systemd`.
const EXPECT_GATES: &str = "RSANDBOX_EXPECT_GATES";

/// Says that the calling test skips, as one `rsandbox-skip: <crate>::<test>: <reason> [gate
/// <gate>]` line written straight to stderr (past libtest's capture; the stage scripts count
/// these lines, `hack/lib/tally.sh`), or panics when the stage says `gate` holds here (a gate
/// that misfires there must fail, not pass silently). The caller returns right after. The
/// integration tests' twin is `integration/src/skip.rs`.
pub fn skip(gate: &str, reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let case = thread.name().unwrap_or("?");
    let suite = env!("CARGO_CRATE_NAME");
    let expected = std::env::var(EXPECT_GATES).unwrap_or_default();
    if expected
        .split(|c: char| c == ',' || c.is_whitespace())
        .any(|g| g == gate)
    {
        panic!(
            "{suite}::{case} would skip, but gate {gate} must hold here ({EXPECT_GATES}={expected:?}): {reason}"
        );
    }
    // One write of the whole line, after a newline: with --test-threads=1 libtest has printed
    // "test <name> ... " on this line already.
    let line = format!("\nrsandbox-skip: {suite}::{case}: {reason} [gate {gate}]\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
