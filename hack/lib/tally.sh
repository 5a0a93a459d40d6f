# shellcheck shell=bash
# hack/lib/tally.sh - what a run of cargo test binaries ran and skipped, so that a suite whose
# gate misfired cannot pass in silence.
#
# A test whose gate does not hold skips out loud: one line `rsandbox-skip: <suite>::<test>:
# <reason> [gate <gate>]` (integration/src/skip.rs, src/testutil.rs's skip); where a stage sets
# RSANDBOX_EXPECT_GATES to the gates that hold there, such a skip fails its test instead. What
# the tests cannot see, a suite that ran no case at all (a filter that matches nothing, a binary
# built without its tests), is caught here, from libtest's own `test result:` lines.
#
# Sourced by hack/lib.sh, and alone by scripts that must not take hack/lib.sh's variables
# (hack/installer/in-node.sh): it defines functions only and uses nothing else of hack/.

# tally WHAT LOG: prints one summary line for the test output in LOG (one or more test
# binaries): `rsandbox-tests: WHAT: N run (P passed, F failed), I ignored, S skipped`, then each
# skip line. Returns 1 when no case ran.
tally() {
	local what=$1 log=$2 counts run skipped
	# libtest's summary per binary: "test result: ok. 3 passed; 0 failed; 1 ignored; ..."
	counts=$(sed -n 's/.*test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored;.*/\1 \2 \3/p' "$log" |
		awk '{ p += $1; f += $2; i += $3 } END { printf "%d %d %d", p, f, i }')
	read -r passed failed ignored <<<"$counts"
	run=$((passed + failed))
	skipped=$(grep -c 'rsandbox-skip: ' "$log" || true)
	printf 'rsandbox-tests: %s: %d run (%d passed, %d failed), %d ignored, %d skipped\n' \
		"$what" "$run" "$passed" "$failed" "$ignored" "$skipped" >&2
	grep -o 'rsandbox-skip: .*' "$log" | sed 's/^/  /' >&2 || true
	# the failed cases by name (libtest's "test NAME ... FAILED"), and where a stage keeps a
	# recap (RSANDBOX_TALLY_RECAP, a file), each with the end of its own output: a long run's
	# last lines then still say which case failed and why
	grep -o '^test .* \.\.\. FAILED$' "$log" | sed 's/^test \(.*\) \.\.\. FAILED$/  FAILED: \1/' >&2 || true
	if ((failed)) && [[ -n "${RSANDBOX_TALLY_RECAP:-}" ]]; then
		failure_recap "$what" "$log" >>"$RSANDBOX_TALLY_RECAP"
	fi
	if ((run == 0)); then
		printf 'rsandbox-tests: %s: ran zero cases: FAILED (the stage exists to run them)\n' "$what" >&2
		return 1
	fi
	return 0
}

# failure_recap WHAT LOG: for each case LOG names as failed, its name and the last 30 lines of
# its own output (libtest's "---- NAME stdout ----" block, printed after all cases ran).
failure_recap() {
	local what=$1 log=$2
	awk -v what="$what" '
		function flush() { blank = 0; if (name != "") { printf "--- %s: %s (the last %d lines of its output)\n", what, name, (n < 30 ? n : 30); for (i = (n > 30 ? n - 29 : 1); i <= n; i++) print "    " buf[i] } name = ""; n = 0 }
		/^---- .* stdout ----$/ { flush(); name = $2; next }
		/^failures:$/ || /^test result: / { flush(); next }
		name != "" && $0 == "" { blank++; next }
		name != "" && blank { while (blank) { buf[++n] = ""; blank-- } }
		name != "" { buf[++n] = $0 }
		END { flush() }
	' "$log"
}

# run_tallied WHAT CMD...: runs CMD (test binaries, or cargo test), its output unchanged (stdout
# and stderr both to stdout, and into a log), then `tally WHAT`. Returns CMD's status, or 1 when
# CMD passed but ran no case.
run_tallied() {
	local what=$1 log rc=0
	shift
	log=$(mktemp "${TMPDIR:-/tmp}/rsandbox-tally.XXXXXX")
	# CMD's status through a file: it does not depend on the caller's pipefail, and `||` keeps
	# a caller's `set -e` from ending the group before the status is written
	{ "$@" 2>&1 || echo "$?" >"$log.rc"; } | tee "$log" || true
	[[ -s "$log.rc" ]] && rc=$(<"$log.rc")
	tally "$what" "$log" || ((rc)) || rc=1
	rm -f "$log" "$log.rc"
	return "$rc"
}
