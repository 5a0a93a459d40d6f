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
	# the failed cases by name, with their test binary: a case libtest reports FAILED, or a
	# binary that ended without its result (a crash, a signal); where a stage keeps a recap
	# (RSANDBOX_TALLY_RECAP, a file), each with the end of its own output: a long run's last
	# lines then still say which case failed and why
	failed_cases names "$what" "$log" >&2
	if [[ -n "${RSANDBOX_TALLY_RECAP:-}" ]]; then
		failed_cases recap "$what" "$log" >>"$RSANDBOX_TALLY_RECAP"
	fi
	if ((run == 0)); then
		printf 'rsandbox-tests: %s: ran zero cases: FAILED (the stage exists to run them)\n' "$what" >&2
		return 1
	fi
	return 0
}

# failed_cases MODE WHAT LOG: the cases LOG (cargo test's output, one or more binaries) shows
# failed: libtest's `test NAME ... FAILED`, and a binary that ended without its `test result:`
# line (cargo: "process didn't exit successfully"). MODE names: a line `  FAILED: BIN: NAME`
# each. MODE recap: for the first 10, the last 30 lines of the case's own output (libtest's
# `---- NAME stdout ----` block), or of the binary's; then one line `FAILED: WHAT: BIN: NAME`
# each (hack/test.sh prints those last).
failed_cases() {
	local mode=$1 what=$2 log=$3
	awk -v mode="$mode" -v what="$what" '
		function keep(line) { ring[++rn] = line; delete ring[rn - 30] }
		function show(head, first, last, from_ring,   i) {
			if (mode != "recap") return
			if (++blocks > 10) { hidden++; return }
			printf "--- %s: %s (the last %d lines of its output)\n", what, head, last - first + 1
			for (i = first; i <= last; i++) print "    " (from_ring ? ring[i] : buf[i])
		}
		function flush(   last) {
			if (name != "") {
				last = n
				while (last > 0 && buf[last] == "") last--
				show(of_bin(name), (last > 30 ? last - 29 : 1), last, 0)
			}
			name = ""; n = 0
		}
		function add(entry) { cases[++nc] = entry }
		function of_bin(x) { return bin == "" ? x : bin ": " x }
		function start(b) { flush(); bin = b; rn = 0; split("", ring); result = 0 }
		/^ *Running unittests / { start($3); next }
		/^ *Running / { start($2); next }
		/^ *Doc-tests / { start("doc-tests " $2); next }
		{ keep($0) }
		/^test .* \.\.\. FAILED$/ { add(of_bin(substr($0, 6, length($0) - 16))) }
		/^---- .* stdout ----$/ { flush(); name = substr($0, 6, length($0) - 17); next }
		/^failures:$/ { flush(); next }
		/^test result: / { flush(); result = 1; next }
		/process didn.t exit successfully/ && bin != "" && !result {
			flush(); result = 1
			line = $0; sub(/^ +/, "", line)
			add(bin ": ended without a result (" line ")")
			show(bin ": ended without a result", (rn > 30 ? rn - 29 : 1), rn, 1)
		}
		name != "" { buf[++n] = $0 }
		END {
			flush()
			if (mode == "recap" && hidden) printf "--- %s: %d more failed cases (names below)\n", what, hidden
			for (i = 1; i <= nc; i++)
				if (mode == "recap") printf "FAILED: %s: %s\n", what, cases[i]
				else printf "  FAILED: %s\n", cases[i]
		}
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
