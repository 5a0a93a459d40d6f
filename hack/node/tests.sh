#!/bin/bash
# hack/node/tests.sh - the systemd tests inside the node, run by `hack/node.sh run-tests` as a
# transient service of the node's systemd (so the tests run in a real unit and cgroup): per
# runc of RSANDBOX_NODE_RUNCS it selects that runc (containerd.service keeps running: the
# handlers exec $BIN/runc anew each time), runs the shim's ignored live_systemd unit tests
# (RSANDBOX_NODE_LIB_EXE, with the first runc only: they run no runc) and the systemd
# integration tests (RSANDBOX_NODE_EXE, with RSANDBOX_NODE_ARGS), removes what is left in
# containerd, and checks that no pod unit and no cgroup below kubepods.slice's QoS slices is
# left in any hierarchy. The mirror of hack/guest/systemd-run.sh (the cgroup v2 guest).
# This node exists to run these tests: every gate they have holds here (RSANDBOX_EXPECT_GATES:
# a test that would skip fails instead), and a binary that runs no case fails
# (hack/lib/tally.sh).
set -uo pipefail
now_s() { date +%s.%N; }
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
# shellcheck source=hack/lib.sh
. hack/lib.sh
eval "ARGS=(${RSANDBOX_NODE_ARGS:-})"
# systemd is PID 1, on the v1 hybrid layout
export RSANDBOX_EXPECT_GATES="systemd-node cgroup-v1 live-systemd"

# kubepods.slice and its QoS slices stay, as on a node; nothing of a pod may
pod_leftovers() {
	systemctl list-units --plain --no-legend 'cri-containerd-*' 'kubepods-*-pod*' | awk '{ print "unit " $1 }'
	find /sys/fs/cgroup/*/kubepods.slice -mindepth 2 -type d 2>/dev/null | sed 's/^/cgroup /'
}

echo "node: systemd $(systemctl is-system-running), $(systemctl --version | head -n1), kernel $(uname -r);" \
	"cgroup v1 hybrid: $(cd /sys/fs/cgroup && echo *); this unit: $(grep name=systemd /proc/self/cgroup)"
rc=0
first=1
for RSANDBOX_RUNC in $RSANDBOX_NODE_RUNCS; do
	export RSANDBOX_RUNC
	select_runc
	s=$(now_s)
	ok=1
	if ((first)) && [[ -n "${RSANDBOX_NODE_LIB_EXE:-}" ]]; then
		run_tallied "node: live_systemd unit tests" \
			"$RSANDBOX_NODE_LIB_EXE" --ignored --test-threads=1 --nocapture live_systemd || ok=0
	fi
	first=0
	run_tallied "node: systemd.rs, runc $RSANDBOX_RUNC" \
		"$RSANDBOX_NODE_EXE" --test-threads=1 --nocapture "${ARGS[@]}" || ok=0
	if ((!ok)); then
		rc=1
		echo "node: tests FAILED with runc $RSANDBOX_RUNC; containerd log:"
		tail -n 60 "$LOGFILE"
	fi
	echo "node: tests with runc $RSANDBOX_RUNC took $(awk -v a="$s" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }') s"
	# no container may outlive a runc switch; what a failed test left goes here
	reset_objects >/dev/null 2>&1 || true
	left=$(pod_leftovers)
	if [[ -n "$left" ]]; then
		echo "node: left after the tests with runc $RSANDBOX_RUNC:"
		echo "$left"
		rc=1
	fi
done
failed=$(systemctl list-units --failed --plain --no-legend)
[[ -z "$failed" ]] || echo "node: failed units: $failed"
exit "$rc"
