//! Skipping a test out loud, and refusing to skip where a stage says the test must run.
//!
//! A test whose precondition (its gate) does not hold here returns early and counts as passed
//! under cargo: a gate that misfires on the machine meant to run the test would turn the suite
//! into a silent pass. So every skip goes through [`skip`]:
//! - it prints one machine-readable line, `rsandbox-skip: <suite>::<test>: <reason> [gate
//!   <gate>]`, straight to stderr (past libtest's capture, so it shows in a captured run too);
//!   the stage scripts count these lines (`hack/lib/tally.sh`);
//! - where the stage running the suite names the gate in `RSANDBOX_EXPECT_GATES` (it exists to
//!   run the suite there: the systemd node, the guests, the installer's node), the skip panics
//!   instead and the test fails.
//!
//! The same vocabulary for the shim's own unit tests is `src/testutil.rs`'s `skip`.

use std::io::Write;

/// The variable a stage sets to the gates that hold where it runs (names separated by spaces or
/// commas).
pub const EXPECT_GATES: &str = "RSANDBOX_EXPECT_GATES";

/// Whether `gate` is one of `expected` (the value of [`EXPECT_GATES`]).
pub fn gate_expected(expected: &str, gate: &str) -> bool {
    expected
        .split(|c: char| c == ',' || c.is_whitespace())
        .any(|g| g == gate)
}

/// Says that the calling test skips (`suite` is its test binary, the test is the running
/// thread's name, as libtest names it), or panics when the stage says `gate` holds here. The
/// caller returns right after.
pub fn skip(suite: &str, gate: &str, reason: &str) {
    let thread = std::thread::current();
    let case = thread.name().unwrap_or("?");
    let expected = std::env::var(EXPECT_GATES).unwrap_or_default();
    if gate_expected(&expected, gate) {
        panic!(
            "{suite}::{case} would skip, but gate {gate} must hold here ({EXPECT_GATES}={expected:?}): {reason}"
        );
    }
    // One write of the whole line (a leading newline: with --test-threads=1 libtest has
    // printed "test <name> ... " on this line already); eprintln! would be captured.
    let line = format!("\nrsandbox-skip: {suite}::{case}: {reason} [gate {gate}]\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `skip!(gate, "reason {}", ...)`: [`skip`] for the calling test, then `return` from it.
#[macro_export]
macro_rules! skip {
    ($gate:expr, $($fmt:tt)+) => {{
        $crate::skip::skip(env!("CARGO_CRATE_NAME"), $gate, &format!($($fmt)+));
        return;
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_is_expected_only_when_named_whole() {
        assert!(gate_expected("systemd-node cgroup-v1", "cgroup-v1"));
        assert!(gate_expected("systemd-node,live-systemd", "systemd-node"));
        assert!(!gate_expected("systemd-node", "systemd"));
        assert!(!gate_expected("", "systemd-node"));
    }

    #[test]
    fn a_skip_where_its_gate_is_not_expected_returns() {
        // (no stage names this gate: the line is printed and the test passes)
        skip("skip", "not-expected-anywhere", "a test of the skip itself");
    }

    /// Runs this test binary again with the gate expected: the skip must fail the test there.
    #[test]
    fn a_skip_where_its_gate_is_expected_fails() {
        if std::env::var_os("RSANDBOX_SKIP_SELF_TEST").is_some() {
            skip("skip", "planted", "the child run");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "skip::tests::a_skip_where_its_gate_is_expected_fails",
            ])
            .env("RSANDBOX_SKIP_SELF_TEST", "1")
            .env(EXPECT_GATES, "other planted")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "the child passed: {stdout}");
        assert!(
            stdout.contains("gate planted must hold here"),
            "the child's output: {stdout}"
        );
    }
}
