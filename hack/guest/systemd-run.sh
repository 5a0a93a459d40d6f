#!/bin/bash
# hack/guest/systemd-run.sh - the test unit (rsandbox-guest.service) of the systemd guest (see
# hack/guest.sh --systemd; hack/guest/systemd-boot.sh wrote the units): prints how long the
# boot took, then per runc starts containerd.service, runs the systemd integration tests,
# removes what is left, checks that no pod unit or cgroup remains, stops containerd; writes the
# exit code to the results share (/mnt) and powers off.
set -uo pipefail
t0=$(cut -d' ' -f1 /proc/uptime)
OUT=/mnt
finish() { # rc
	echo "$1" >"$OUT/rc"
	sync
	systemctl --force --force poweroff # -no-reboot: QEMU exits
	sleep 10
}
trap 'finish 99' EXIT
# shellcheck disable=SC1091
. "$OUT/env"
exec > >(tee "$OUT/guest.log") 2>&1

# kernel start -> this unit, and how much of it is systemd's (from its exec as PID 1)
sd=$(systemctl show -p UserspaceTimestampMonotonic --value)
echo "$t0" >"$OUT/boot-secs"
echo "guest: test unit started ${t0} s after the kernel ($(awk -v a="$t0" -v u="$sd" 'BEGIN { printf "%.1f", a - u / 1e6 }') s of it systemd's);" \
	"kernel $(uname -r), $(systemctl --version | head -n1), PID 1 $(cat /proc/1/comm)," \
	"$(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup: $(cat /sys/fs/cgroup/cgroup.controllers)"
systemctl is-system-running --wait >/dev/null 2>&1 || true
systemd-analyze time 2>/dev/null | sed 's/^/guest: /'
ip link set lo up

cd "$GUEST_REPO" || exit 1
if [[ -n "${GUEST_LIVE_ONLY:-}" ]]; then
	# the shim's D-Bus client against this systemd, nothing else (hack/guest.sh
	# RSANDBOX_GUEST_LIVE_ONLY=1)
	rc=0
	run=("$GUEST_LIB_EXE" --ignored --test-threads=1 --nocapture live_systemd)
	if [[ -n "${GUEST_TRACE:-}" ]]; then
		# what each end did on the sockets: PID 1 (accept, reads, writes) and the test
		systemd-analyze log-level debug
		calls=accept4,recvmsg,sendmsg,readv,writev,read,write,connect,close,epoll_wait,ppoll,poll
		strace -p 1 -tt -s 512 -e trace=$calls -o "$OUT/pid1.strace" &
		tracer=$!
		sleep 2
		run=(strace -f -tt -s 512 -e trace=$calls -o "$OUT/test.strace" "${run[@]}")
	fi
	RSANDBOX_EXPECT_GATES=live-systemd RSANDBOX_LIVE_ROUNDS=$RSANDBOX_LIVE_ROUNDS "${run[@]}" || rc=1
	if [[ -n "${GUEST_TRACE:-}" ]]; then
		kill "$tracer"
		wait "$tracer"
		dmesg >"$OUT/kernel.log"
	fi
	trap - EXIT
	finish "$rc"
fi
# shellcheck source=hack/lib.sh
. hack/lib.sh
eval "$(print_env)"
export RSANDBOX_PREFIX
# this guest exists to run these tests: every gate they have holds here but systemd.rs's v1-only
# one (a test that would skip fails), and a binary that runs no case fails (hack/lib/tally.sh)
export RSANDBOX_EXPECT_GATES="systemd-node live-systemd"
# kubepods.slice and its QoS slices stay, as on a node; nothing of a pod may
pod_leftovers() {
	systemctl list-units --plain --no-legend 'cri-containerd-*' 'kubepods-*-pod*' | awk '{ print "unit " $1 }'
	find /sys/fs/cgroup/kubepods.slice -mindepth 2 -type d 2>/dev/null | sed 's/^/cgroup /'
}
rc=0
for RSANDBOX_RUNC in $GUEST_RUNCS; do
	select_runc
	s=$(cut -d' ' -f1 /proc/uptime)
	net_guard_on
	if ! systemctl start containerd.service; then
		echo "guest: containerd.service did not start"
		systemctl status --no-pager containerd.service
		tail -n 30 "$LOGFILE"
		rc=1
		break
	fi
	systemctl show -p MainPID --value containerd.service >"$PIDFILE"
	ensure_images
	echo "guest: containerd.service up after $(awk -v a="$s" '{ printf "%.1f", $1 - a }' /proc/uptime) s; runc $RSANDBOX_RUNC"
	section "guest: runc $RSANDBOX_RUNC: the systemd tests"
	s=$(cut -d' ' -f1 /proc/uptime)
	# --nocapture: each handler's view (scope units, pod stats) and the runc path's known
	# leftovers are printed by the tests, for the log
	ok=1
	# the shim's own D-Bus client against this systemd (once: it runs no runc), first: after
	# the integration tests PID 1 works for tens of seconds under TCG through their mount
	# and cgroup events (containerd's clean-up goes on after them); this test measures calls
	if ((${#GUEST_ARGS[@]} == 0)) && [[ -n "$GUEST_LIB_EXE" && "$RSANDBOX_RUNC" == "${GUEST_RUNCS%% *}" ]]; then
		run_tallied "guest: live_systemd unit tests" \
			"$GUEST_LIB_EXE" --ignored --test-threads=1 --nocapture live_systemd || ok=0
	fi
	run_tallied "guest: systemd.rs, runc $RSANDBOX_RUNC" \
		"$GUEST_EXE" --test-threads=1 --nocapture "${GUEST_ARGS[@]}" || ok=0
	if ((!ok)); then
		rc=1
		echo "guest: tests FAILED with runc $RSANDBOX_RUNC; containerd log:"
		tail -n 60 "$LOGFILE"
	fi
	echo "guest: tests with runc $RSANDBOX_RUNC took $(awk -v a="$s" '{ printf "%.1f", $1 - a }' /proc/uptime) s"
	# systemd.rs restarts containerd.service: the MainPID reset_objects checks is a new one
	systemctl show -p MainPID --value containerd.service >"$PIDFILE"
	reset_objects >/dev/null 2>&1 || true
	left=$(pod_leftovers)
	if [[ -n "$left" ]]; then
		echo "guest: left after the tests with runc $RSANDBOX_RUNC:"
		echo "$left"
		rc=1
	fi
	systemctl stop containerd.service
	net_guard_off
done
failed=$(systemctl list-units --failed --plain --no-legend)
[[ -z "$failed" ]] || echo "guest: failed units: $failed"
trap - EXIT
finish "$rc"
