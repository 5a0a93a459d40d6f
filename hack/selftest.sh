#!/usr/bin/env bash
# hack/selftest.sh - the test harness's own tests: the helpers the stages of hack/test.sh rely on
# to never look hung and never pass in silence. Each check fails when the helper breaks: a check
# that cannot fail would be one more silent pass.
#
# Usage: hack/selftest.sh [--gates]
#   (no flag)  hack/lib.sh's with_heartbeat (CMD's status and output kept, the caller's set -e
#              inside CMD, heartbeat lines while CMD runs, no process left, not even when the
#              caller is killed) and hack/lib/tally.sh (a run of zero cases fails, skips are
#              counted and listed, CMD's status kept) and need_rust_toolchain (holds for a present
#              toolchain, every time); no root, a few seconds
#   --gates    a real suite whose gate cannot hold here (integration/tests/installer.rs with
#              RSANDBOX_INSTALLER_NEW unset): it skips out loud without RSANDBOX_EXPECT_GATES
#              (one rsandbox-skip line, counted) and FAILS with the gate expected; builds the
#              installer's test binary (hack/test.sh runs it after the integration tests, which
#              built it already). Runs no containerd and nothing as root.
# No timed assertion: the waits below are bounded only to catch a hang (HANG s).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# its tallies of made-up failures are not hack/test.sh's failed cases
unset RSANDBOX_TALLY_RECAP
cd "$RSANDBOX_REPO"

HANG=120
fails=0
pass() { log "selftest: ok: $*"; }
fail() {
	log "selftest: FAILED: $*"
	fails=$((fails + 1))
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# descendants PID: DESC=every process below PID, read from /proc in this shell (a command
# substitution would be a process below it)
descendants() {
	local stat rest pid ppid
	local -A kids=()
	for stat in /proc/[0-9]*/stat; do
		read -r rest 2>/dev/null <"$stat" || continue
		pid=${rest%% *}
		rest=${rest##*) }
		read -r _ ppid _ <<<"$rest"
		kids[$ppid]+=" $pid"
	done
	DESC=()
	local todo=("$1") p c
	while ((${#todo[@]})); do
		p=${todo[0]}
		todo=("${todo[@]:1}")
		for c in ${kids[$p]:-}; do
			DESC+=("$c")
			todo+=("$c")
		done
	done
}

# wait_gone PID...: until none of PID runs (a hang after HANG s fails)
wait_gone() {
	local p deadline=$((SECONDS + HANG))
	for p in "$@"; do
		while kill -0 "$p" 2>/dev/null; do
			((SECONDS < deadline)) || return 1
			sleep 0.1
		done
	done
}

heartbeat_tests() {
	local rc out
	rc=0
	with_heartbeat "exit 3" bash -c 'exit 3' 2>/dev/null || rc=$?
	((rc == 3)) && pass "with_heartbeat returns CMD's status (3)" || fail "with_heartbeat returned $rc for exit 3"
	rc=0
	with_heartbeat "true" true 2>/dev/null || rc=$?
	((rc == 0)) && pass "with_heartbeat returns 0 for a passing CMD" || fail "with_heartbeat returned $rc for true"

	out=$(with_heartbeat "printf" printf 'a\n\nb c\n' 2>/dev/null)
	[[ "$out" == $'a\n\nb c' ]] && pass "CMD's output is untouched" || fail "CMD's output became: $(printf %q "$out")"

	# a function as CMD keeps the caller's set -e (from `CMD || ...` it would lose it), and its
	# exit ends CMD, not the caller
	stops_at_first_failure() {
		false
		echo "went on after a failure"
	}
	exits() { exit 4; }
	rc=0
	# (called as a plain command, as the stages call it: under `||` or in a command
	# substitution bash ignores -e for everything inside, set -e included)
	set +e
	(
		set -e
		with_heartbeat "set -e" stops_at_first_failure >"$tmp/set-e.out" 2>/dev/null
	)
	rc=$?
	set -e
	out=$(<"$tmp/set-e.out")
	[[ $rc == 1 && -z "$out" ]] && pass "set -e holds inside CMD" || fail "set -e inside CMD: status $rc, output $(printf %q "$out")"
	rc=0
	with_heartbeat "exit" exits 2>/dev/null || rc=$?
	((rc == 4)) && pass "an exit in CMD ends CMD only (status 4)" || fail "exit 4 in CMD gave $rc"

	# the lines come while CMD runs: CMD waits until it has seen one (HANG bounds only a hang)
	rc=0
	RSANDBOX_HEARTBEAT=1 with_heartbeat "napping" timeout "$HANG" bash -c \
		'until grep -q "still running: napping (" "$1"; do sleep 0.1; done' _ "$tmp/beat.err" 2>"$tmp/beat.err" || rc=$?
	((rc == 0)) && pass "heartbeat lines while CMD runs: $(grep -m1 'still running' "$tmp/beat.err")" ||
		fail "no heartbeat line in $HANG s (status $rc): $(cat "$tmp/beat.err")"
	descendants $BASHPID
	if ((${#DESC[@]} == 0)); then
		pass "no process left after with_heartbeat"
	else
		fail "left after with_heartbeat: $(ps -o pid=,args= -p "${DESC[*]}")"
	fi

	# the caller's EXIT trap runs once, in the caller: never in the heartbeat (a heartbeat
	# killed before it reset its traps ran hack/test.sh's, which stops containerd)
	(
		trap 'echo "exit trap in $BASHPID" >>"$tmp/traps"' EXIT
		for _ in $(seq 1 30); do with_heartbeat "quick" true 2>/dev/null; done
	)
	if [[ "$(wc -l <"$tmp/traps")" == 1 ]]; then
		pass "the caller's EXIT trap ran once (30 quick CMDs)"
	else
		fail "the caller's EXIT trap ran $(wc -l <"$tmp/traps") times: $(cat "$tmp/traps")"
	fi

	# the caller killed while CMD runs: the heartbeat ends by itself
	local caller p below=() sleepers=()
	(with_heartbeat "killed caller" sleep 300 2>/dev/null) &
	caller=$!
	# until CMD's sleep runs (the heartbeat loop started before it)
	while ((${#sleepers[@]} == 0)); do
		sleep 0.1
		descendants "$caller"
		for p in "${DESC[@]}"; do
			[[ "$(cat "/proc/$p/comm" 2>/dev/null)" == sleep ]] && sleepers+=("$p")
		done
	done
	below=("${DESC[@]}")
	kill -KILL "$caller"
	wait "$caller" 2>/dev/null || true
	# CMD (the sleep) is the caller's business: ended here by its pid
	kill "${sleepers[@]}" 2>/dev/null || true
	if wait_gone "${below[@]}"; then
		pass "the heartbeat ends when its caller is killed (${#below[@]} processes below it, all gone)"
	else
		fail "left $HANG s after the caller was killed: $(ps -o pid=,args= -p "${below[*]}")"
	fi
}

tally_tests() {
	local rc out i
	printf 'running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 0.00s\n' >"$tmp/zero"
	rc=0
	tally "zero" "$tmp/zero" 2>"$tmp/zero.err" || rc=$?
	((rc == 1)) && grep -q "ran zero cases" "$tmp/zero.err" && pass "a run of zero cases fails: $(head -n1 "$tmp/zero.err")" ||
		fail "a run of zero cases gave $rc: $(cat "$tmp/zero.err")"

	{
		printf 'test a ... ok\ntest b ... \nrsandbox-skip: suite::b: no systemd here [gate systemd-node]\nok\n'
		printf 'test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s\n'
		printf 'test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s\n'
	} >"$tmp/some"
	rc=0
	tally "some" "$tmp/some" 2>"$tmp/some.err" || rc=$?
	((rc == 0)) && grep -q "rsandbox-tests: some: 4 run (3 passed, 1 failed), 1 ignored, 1 skipped" "$tmp/some.err" &&
		grep -q "  rsandbox-skip: suite::b: no systemd here" "$tmp/some.err" &&
		pass "two binaries summed, the skip listed: $(head -n1 "$tmp/some.err")" || fail "tally of two binaries (status $rc): $(cat "$tmp/some.err")"

	rc=0
	out=$(run_tallied "status" bash -c 'cat "$1"; exit 5' _ "$tmp/some" 2>/dev/null) || rc=$?
	((rc == 5)) && [[ "$out" == "$(cat "$tmp/some")" ]] && pass "run_tallied keeps CMD's status (5) and output" ||
		fail "run_tallied: status $rc, output $(printf %q "$out")"
	rc=0
	run_tallied "none" cat "$tmp/zero" >/dev/null 2>&1 || rc=$?
	((rc == 1)) && pass "run_tallied fails a passing CMD that ran zero cases" || fail "run_tallied of zero cases gave $rc"

	# a failed case: named in the tally (with its binary), the end of its output in the
	# stage's recap, then its name; a binary that crashed before its result, the same
	{
		printf '     Running tests/s.rs (target/debug/deps/s-0123)\n\n'
		printf 'running 2 tests\ntest s::good ... ok\ntest s::bad ... FAILED\n\nfailures:\n\n'
		printf -- '---- s::bad stdout ----\n'
		for ((i = 1; i <= 40; i++)); do printf 'out %d\n' "$i"; done
		printf "thread 's::bad' panicked at tests/s.rs:9:5:\nthe reason\n\n\nfailures:\n    s::bad\n\n"
		printf 'test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s\n'
		printf 'error: test failed, to rerun pass `--test s`\n\nCaused by:\n'
		printf '  process didn'"'"'t exit successfully: `s-0123` (exit status: 101)\n'
		printf '     Running tests/t.rs (target/debug/deps/t-4567)\n\nrunning 1 test\n'
		printf 'fatal runtime error: stack overflow\nerror: test failed, to rerun pass `--test t`\n'
		printf '  process didn'"'"'t exit successfully: `t-4567` (signal: 6, SIGABRT: process abort signal)\n'
	} >"$tmp/failed"
	rc=0
	: >"$tmp/recap"
	RSANDBOX_TALLY_RECAP=$tmp/recap tally "one" "$tmp/failed" 2>"$tmp/failed.err" || rc=$?
	((rc == 0)) && grep -qx "  FAILED: tests/s.rs: s::bad" "$tmp/failed.err" && ! grep -q "s::good" "$tmp/failed.err" &&
		grep -qx "  FAILED: tests/t.rs: ended without a result (process didn't exit successfully: \`t-4567\` (signal: 6, SIGABRT: process abort signal))" "$tmp/failed.err" &&
		[[ "$(head -n1 "$tmp/recap")" == "--- one: tests/s.rs: s::bad (the last 30 lines of its output)" ]] &&
		[[ "$(sed -n 2p "$tmp/recap")" == "    out 13" && "$(sed -n 31p "$tmp/recap")" == "    the reason" ]] &&
		[[ "$(sed -n 32p "$tmp/recap")" == "--- one: tests/t.rs: ended without a result (the last 5 lines of its output)" ]] &&
		grep -qx "    fatal runtime error: stack overflow" "$tmp/recap" &&
		[[ "$(grep '^FAILED: ' "$tmp/recap" | head -n1)" == "FAILED: one: tests/s.rs: s::bad" ]] &&
		(($(grep -c '^FAILED: ' "$tmp/recap") == 2)) &&
		pass "failed cases named with their binary in the tally, the end of each one's output in the recap, a crashed binary too" ||
		fail "a failed case's tally (status $rc): $(cat "$tmp/failed.err") recap: $(cat "$tmp/recap")"
}

# need_rust_toolchain under this script's pipefail: its probe once piped rustc -vV into grep -q,
# which exits at the match; rustc then wrote on a closed pipe, and the pipeline failed about one
# time in three (CI stopped, "missing: the Rust toolchain", with cargo in PATH). 60 calls in a row.
toolchain_tests() {
	local i bad=0
	for ((i = 0; i < 60; i++)); do
		(need_rust_toolchain) >/dev/null 2>&1 || bad=$((bad + 1))
	done
	((bad == 0)) && pass "need_rust_toolchain holds 60 times in a row under pipefail" ||
		fail "need_rust_toolchain refused a present toolchain $bad times in 60"
}

gates_tests() {
	local exe rc=0
	exe=$(test_binary installer)
	# without the expectation: passes, says it skipped, and the tally counts it
	rc=0
	env -u RSANDBOX_INSTALLER_NEW -u "$EXPECT_GATES_VAR" "$exe" --exact a_blocking_check_changes_nothing >"$tmp/gate.out" 2>&1 || rc=$?
	if ((rc == 0)) && grep -q 'rsandbox-skip: installer::a_blocking_check_changes_nothing: RSANDBOX_INSTALLER_NEW is not set.*\[gate installer-node\]' "$tmp/gate.out" &&
		tally "installer (gate not expected)" "$tmp/gate.out" 2>"$tmp/gate.tally" && grep -q ', 1 skipped' "$tmp/gate.tally"; then
		pass "a misfired gate, not expected here: the test passes and says so ($(grep -o 'rsandbox-skip: .*' "$tmp/gate.out"))"
	else
		fail "the skip without expectation (status $rc): $(cat "$tmp/gate.out" "$tmp/gate.tally" 2>/dev/null)"
	fi
	# with the stage's expectation: the same skip fails the test
	rc=0
	env -u RSANDBOX_INSTALLER_NEW "$EXPECT_GATES_VAR=installer-node installer-daemonset" "$exe" --exact a_blocking_check_changes_nothing >"$tmp/gate.out" 2>&1 || rc=$?
	if ((rc != 0)) && grep -q 'gate installer-node must hold here' "$tmp/gate.out"; then
		pass "a misfired gate the stage expects fails the test (status $rc)"
	else
		fail "the gate expected but the test did not fail (status $rc): $(cat "$tmp/gate.out")"
	fi
}

EXPECT_GATES_VAR=RSANDBOX_EXPECT_GATES
if [[ "${1:-}" == --gates ]]; then
	section "selftest: a gate that misfires (integration/tests/installer.rs)"
	gates_tests
else
	section "selftest: with_heartbeat and the tally (hack/lib.sh)"
	heartbeat_tests
	tally_tests
	toolchain_tests
fi
if ((fails)); then
	log "selftest: $fails check(s) FAILED"
	exit 1
fi
log "selftest: all checks passed"
