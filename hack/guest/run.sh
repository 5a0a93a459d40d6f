#!/bin/bash
# hack/guest/run.sh - PID 1 of the cgroup v2 guest (see hack/guest.sh): mounts what
# a host has (cgroup2, /run, /tmp, devpts), loads the network modules, starts the
# bench's containerd on tmpfs, runs the cgroupv2 integration tests with each runc
# and writes the exit code to the results share (/mnt); then powers off.
set -uo pipefail
t0=$(cut -d' ' -f1 /proc/uptime)
OUT=/mnt
finish() { # rc
	echo "$1" >"$OUT/rc"
	sync
	echo b >/proc/sysrq-trigger # -no-reboot: QEMU exits
	sleep 10
}
trap 'finish 99' EXIT
# shellcheck disable=SC1091
. "$OUT/env"
# shellcheck source=hack/guest/common.sh
. "$GUEST_REPO/hack/guest/common.sh"
ln -sf /proc/self/fd /dev/fd
exec > >(tee "$OUT/guest.log") 2>&1

mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
# The repository (and the test binaries in its target dir) and the bench prefix may live
# under a directory the tmpfs mounts below cover (a CI clone in /tmp, RSANDBOX_PREFIX under
# /tmp): keep a handle on each, put them back after.
mkdir -p /.guest-repo /.guest-prefix
mount --bind "$GUEST_REPO" /.guest-repo
mount --bind "$RSANDBOX_PREFIX" /.guest-prefix
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue
if [[ ! -d "$RSANDBOX_PREFIX/usr/bin" ]]; then
	mkdir -p "$RSANDBOX_PREFIX"
	mount --bind /.guest-prefix "$RSANDBOX_PREFIX"
fi
guest_state_tmpfs
if [[ ! -e "$GUEST_REPO/hack/lib.sh" ]]; then
	mkdir -p "$GUEST_REPO"
	mount --bind /.guest-repo "$GUEST_REPO"
fi
hostname rsandbox-guest
guest_modules
ip link set lo up
boot=$(awk -v a="$t0" '{ printf "%.1f", $1 }' /proc/uptime)
echo "$boot" >"$OUT/boot-secs"
echo "guest: up after ${boot} s (kernel $(uname -r), $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup: $(cat /sys/fs/cgroup/cgroup.controllers))"

# cgroup_verdicts: every cgroup left after the tests, each with whether that is fine. Fine:
# the empty parent of a containerd namespace (/default, /k8s.io, /rsandbox-it): runc makes it
# for a container's /<namespace>/<id> and removes only the leaf at delete, with the runc shim
# as with ours, and containerd never removes it. Anything else (a container's or a pod's
# cgroup, a process in one) is a leftover: 1.
cgroup_verdicts() {
	local d procs kids bad=0
	while read -r d; do
		procs=$(wc -l <"$d/cgroup.procs" 2>/dev/null || echo '?')
		kids=$(find "$d" -mindepth 1 -type d | wc -l)
		case "${d#/sys/fs/cgroup/}" in
		default | k8s.io | rsandbox-it)
			if [[ "$procs" == 0 && "$kids" == 0 ]]; then
				echo "guest: cgroup $d after the tests: fine (the empty parent of a containerd namespace, which runc leaves)"
				continue
			fi
			;;
		esac
		echo "guest: LEFTOVER cgroup $d after the tests: $procs processes, $kids cgroups below"
		bad=1
	done < <(find /sys/fs/cgroup -mindepth 1 -maxdepth 1 -type d ! -name init.scope)
	[[ $bad == 0 ]] && echo "guest: cgroups after the tests with runc $RSANDBOX_RUNC: nothing left over"
	return "$bad"
}

cd "$GUEST_REPO" || exit 1
# shellcheck source=hack/lib.sh
. hack/lib.sh
eval "$(print_env)"
export RSANDBOX_PREFIX
# The bench as it was when hack/guest.sh launched this guest, whatever the host's tests do to
# it meanwhile (hack/test.sh runs both at once): its copies of the shim and the config dir,
# and a runc link of the guest's own (select_runc writes it into the overlay only if absent
# or different: an untouched link would still follow the host's).
cp "$OUT/$SHIM_NAME" "$BIN/$SHIM_NAME"
mount --bind "$OUT/conf" "$P/conf"
rm -f "$BIN/runc"
# hack/guest.sh's config: the bench's plus the cgroup_writable handlers (runc-cgw, rsandbox-cgw)
CONFIG=$GUEST_CONTAINERD_CONFIG
rc=0
for RSANDBOX_RUNC in $GUEST_RUNCS; do
	section "guest: runc $RSANDBOX_RUNC: containerd and the cgroup v2 tests"
	select_runc
	s=$(cut -d' ' -f1 /proc/uptime)
	start >/dev/null || { echo "guest: containerd did not start"; tail -n 30 "$LOGFILE"; rc=1; break; }
	echo "guest: containerd up after $(awk -v a="$s" '{ printf "%.1f", $1 - a }' /proc/uptime) s; runc $RSANDBOX_RUNC"
	s=$(cut -d' ' -f1 /proc/uptime)
	ok=1
	# this guest exists to run these: every gate they have holds here (a test that would skip
	# fails), and a binary that runs no case fails (hack/lib/tally.sh)
	RSANDBOX_EXPECT_GATES=no-systemd run_tallied "guest: cgroupv2.rs, runc $RSANDBOX_RUNC" \
		"$GUEST_EXE" --test-threads=1 "${GUEST_ARGS[@]}" || ok=0
	if ((${#GUEST_ARGS[@]} == 0)); then
		RSANDBOX_EXPECT_GATES=no-systemd run_tallied "guest: handshake.rs shim_cgroup, runc $RSANDBOX_RUNC" \
			"$GUEST_HS_EXE" --test-threads=1 shim_cgroup || ok=0
	fi
	if ((!ok)); then
		rc=1
		echo "guest: tests FAILED with runc $RSANDBOX_RUNC; containerd log:"
		tail -n 60 "$LOGFILE"
	fi
	echo "guest: tests with runc $RSANDBOX_RUNC took $(awk -v a="$s" '{ printf "%.1f", $1 - a }' /proc/uptime) s"
	reset_objects >/dev/null 2>&1 || true
	cgroup_verdicts || rc=1
done
stop >/dev/null 2>&1 || true
trap - EXIT
finish "$rc"
