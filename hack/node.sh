#!/usr/bin/env bash
# hack/node.sh - a systemd node on this host, booted in about a second: systemd 252 (this
# machine's, never run here as the host's PID 1) as PID 1 of new pid, mount, uts, ipc, net and
# cgroup namespaces, on the host's cgroup v1 hybrid, the way kind runs its nodes; containerd as
# containerd.service (the bench's binaries, the node's own config, root, state and sockets).
# The fast path for every systemd test (the QEMU guest, hack/guest.sh --systemd, stays for
# cgroup v2).
#
# Usage: hack/node.sh [-n NAME] COMMAND [ARGS...]
#   boot              boot node NAME (a stale node of that name is removed first); returns
#                     once systemd reached the node's default target (containerd up, images
#                     imported) and prints how long that took
#   exec [--pty] [--] CMD...
#                     run CMD in the node as a transient service of its systemd
#                     (systemd-run --wait --pipe, or --pty), in the current directory, with
#                     the bench's env (CONTAINERD_ADDRESS, CONTAINER_RUNTIME_ENDPOINT,
#                     RSANDBOX_PREFIX, ...; see STATE/unit.env); exits with CMD's status
#   shell             an interactive shell in the node (exec --pty bash)
#   status            the node's PID 1, namespaces, systemd state, units, containerd
#   stop              SIGRTMIN+3 to its PID 1 (systemd halts), wait, remove its cgroups;
#                     then check that nothing of it is left on the host (exit 1 if anything is)
#   clean [--all]     remove node NAME whatever state it is in (a killed launcher, a stale
#                     pid file, cgroups left by a crash); --all: every node whose PID 1 is
#                     gone (running nodes, maybe another user's, are left alone)
#   leftovers         what node NAME left on the host (exit 1 if anything)
#   check             whether this host can run a node (cgroup v1 hybrid, the bench set up,
#                     the tools); says why not and exits 1 if it cannot
#   run-tests [FILTER...]
#                     build the systemd integration tests and the shim's unit tests, boot the
#                     node, run them in it (hack/node/tests.sh: integration/tests/systemd.rs
#                     once per runc, the ignored live_systemd unit tests once; FILTER goes to
#                     the integration test binary and skips the unit tests; a test that would
#                     skip fails there, and so does a binary that runs no case), check that no
#                     pod unit or cgroup is left, stop the node, check the host
#
# NAME: -n NAME or RSANDBOX_NODE_NAME (default "node"); nodes of different names do not
# collide (state /run/rsandbox-node/NAME, cgroups rsandbox-node-NAME, their own namespaces).
# Environment: RSANDBOX_RUNC (the runc the node boots with: 1.1 | 1.3), RSANDBOX_NODE_RUNCS
# (run-tests: "1.1 1.3"), RSANDBOX_NODE_SHIM (the shim binary the node runs; default the
# bench's installed one, copied at boot), RSANDBOX_NODE_BOOT_TIMEOUT (s, 120); see hack/lib.sh.
# The NODE_* globals are read by name (node_env) and in the node:
# shellcheck disable=SC2034
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/node/lib.sh
. "$RSANDBOX_REPO/hack/node/lib.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

console_tail() {
	[[ -f "$NODE_STATE/console.log" ]] || return 0
	log "node $NODE_NAME: last lines of its console ($NODE_STATE/console.log):"
	tail -n 30 "$NODE_STATE/console.log" >&2 || true
}

# the environment of the node's units and of every exec: the bench's (hack/containerd.sh env)
unit_env() {
	cat <<-EOF
		PATH=$BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		HOME=/root
		LANG=C.UTF-8
		CONTAINERD_ADDRESS=$SOCK
		CONTAINERD_SNAPSHOTTER=$(snapshotter)
		CONTAINER_RUNTIME_ENDPOINT=unix://$SOCK
		IMAGE_SERVICE_ENDPOINT=unix://$SOCK
		RSANDBOX_PREFIX=$RSANDBOX_PREFIX
		RSANDBOX_RUNC=$RSANDBOX_RUNC
		RSANDBOX_SUBNET=$RSANDBOX_SUBNET
		RSANDBOX_BRIDGE=$RSANDBOX_BRIDGE
		RSANDBOX_SHIM_SUBNET=$RSANDBOX_SHIM_SUBNET
		RSANDBOX_SHIM_BRIDGE=$RSANDBOX_SHIM_BRIDGE
		RSANDBOX_LOG_LEVEL=$RSANDBOX_LOG_LEVEL
		RSANDBOX_NODE_NAME=$NODE_NAME
	EOF
}

# what the node's PID 1 reads (hack/node/enter.sh, init.sh, units.sh)
node_env() {
	local v
	for v in NODE_NAME NODE_CG NODE_HOSTNAME NODE_REPO RSANDBOX_PREFIX NODE_BIN NODE_LOGFILE NODE_PIDFILE \
		NODE_RUNC_BIN NODE_SHIM_SRC NODE_SHIM_NAME NODE_SYSTEMD_LAYER NODE_HIERARCHIES NODE_SYSCTL_KEYS NODE_LIVE_DIRS; do
		printf '%s=%q\n' "$v" "${!v}"
	done
}

# host_unfit: why this machine cannot run a node (nothing when it can)
host_unfit() {
	local h c
	[[ -f "$SETUP_DONE" && -x "$BIN/containerd" ]] || {
		echo "the bench is not set up: hack/setup.sh first"
		return
	}
	[[ -x "$NODE_SHIM_SRC" ]] || {
		echo "no shim at $NODE_SHIM_SRC: hack/build.sh (or RSANDBOX_NODE_SHIM)"
		return
	}
	[[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]] || {
		echo "/sys/fs/cgroup is cgroup v2 only: this node is the cgroup v1 (hybrid) one; hack/guest.sh --systemd is the v2 node"
		return
	}
	h=$(node_hierarchies)
	grep -q ' name=systemd$' <<<"$h" || {
		echo "no name=systemd hierarchy under /sys/fs/cgroup: not a cgroup v1 hybrid host"
		return
	}
	grep -q '^cgroup2 ' <<<"$h" || {
		echo "no cgroup2 (unified) hierarchy under /sys/fs/cgroup"
		return
	}
	for c in script unshare nsenter setsid setpriv; do
		command -v "$c" >/dev/null || {
			echo "$c missing (util-linux, bsdutils)"
			return
		}
	done
}

host_checks() {
	local why
	why=$(host_unfit)
	[[ -z "$why" ]] || die "cannot run a systemd node here: $why"
}

cmd_check() {
	local why
	why=$(host_unfit)
	[[ -z "$why" ]] && return 0
	echo "$why"
	return 1
}

# boot_on_time CMD...: CMD succeeds (what the boot waits on is still there, its errors unsaid)
# and the boot's deadline (cmd_boot's) has not passed
boot_on_time() {
	"$@" 2>/dev/null && ((SECONDS <= deadline))
}

# boot_give_up WHY: the boot failed: the console's last lines, the node removed, and die saying WHY
boot_give_up() {
	console_tail
	cmd_clean || true
	die "node $NODE_NAME: $1"
}

cmd_boot() {
	local t0 pid launcher deadline state sd_start sd_finish ns
	if [[ -d "$NODE_STATE" ]] || [[ -n "$(node_cgroup_dirs | while read -r d; do [[ -d $d ]] && echo "$d"; done)" ]]; then
		log "node $NODE_NAME: removing what an earlier run left"
		cmd_clean || die "node $NODE_NAME: could not remove the earlier node"
	fi
	t0=$(now)
	host_checks
	NODE_SYSTEMD_LAYER=$(systemd_layer "$P/guest")
	mkdir -p "$NODE_STATE/fs"
	node_env >"$NODE_STATE/env"
	unit_env >"$NODE_STATE/unit.env"
	containerd_config true >"$NODE_STATE/containerd.toml"
	node_sysctl_values >"$NODE_STATE/sysctls"
	node_cgroup_make
	# The launcher: script(1) gives the node a pty as /dev/console and keeps its output in
	# console.log; it and unshare's waiting parent stay in the node's outer cgroup, the node's
	# PID 1 moves into NAME/node before it makes the cgroup namespace (hack/node/enter.sh).
	# Descriptors above 2 are closed first: the node must not hold a caller's lock or pipe (a
	# `flock LOCK hack/node.sh boot` would stay locked for as long as the node runs).
	(
		for fd in /proc/"$BASHPID"/fd/*; do
			fd=${fd##*/}
			((fd > 2)) && eval "exec $fd>&-"
		done
		node_cgroup_join ""
		exec setsid script -qfec "exec unshare --pid --fork --mount --uts --ipc --net --propagation private /bin/bash $NODE_REPO/hack/node/enter.sh $NODE_STATE" \
			"$NODE_STATE/console.log" </dev/null >/dev/null 2>&1
	) &
	launcher=$!
	echo "$launcher" >"$NODE_STATE/launcher.pid"
	deadline=$((SECONDS + ${RSANDBOX_NODE_BOOT_TIMEOUT:-120}))
	until pid=$(node_pid); do
		boot_on_time kill -0 "$launcher" || boot_give_up "its PID 1 did not start"
		sleep 0.01
	done
	ns=$(readlink "/proc/$pid/ns/pid" "/proc/$pid/ns/mnt" "/proc/$pid/ns/net" | tr '\n' ' ')
	echo "$ns" >"$NODE_STATE/ns"
	# systemd answers on its private socket once it runs its manager loop
	until [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == systemd && -S /proc/$pid/root/run/systemd/private ]]; do
		boot_on_time test -d "/proc/$pid" || boot_give_up "systemd did not come up"
		sleep 0.01
	done
	state=$(timeout $((deadline - SECONDS + 1)) nsenter --target "$pid" --mount --pid \
		systemctl is-system-running --wait 2>/dev/null) || true
	if [[ "$state" != running ]]; then
		log "node $NODE_NAME: systemd is '$state', not running"
		node_enter "$pid" systemctl --no-pager list-units --failed >&2 || true
		node_enter "$pid" systemctl --no-pager list-jobs >&2 || true
		console_tail
		cmd_stop >/dev/null 2>&1 || true
		die "node $NODE_NAME did not boot"
	fi
	# launcher start -> systemd's exec, -> the default target reached (systemd's own clock:
	# realtime, microseconds)
	sd_start=$(node_enter "$pid" systemctl show --timestamp=us+utc -P UserspaceTimestamp)
	sd_finish=$(node_enter "$pid" systemctl show --timestamp=us+utc -P FinishTimestamp)
	sd_start=$(date -d "$sd_start" +%s.%N)
	sd_finish=$(date -d "$sd_finish" +%s.%N)
	awk -v t0="$t0" -v s="$sd_start" -v f="$sd_finish" -v n="$NODE_NAME" -v pid="$pid" -v r="$RSANDBOX_RUNC" 'BEGIN {
		printf "[rsandbox] node %s booted in %.2f s (launcher -> systemd %.2f s, systemd -> default target %.2f s); PID 1 = host pid %d, runc %s\n",
			n, f - t0, s - t0, f - s, pid, r > "/dev/stderr" }'
	printf '%s\n' "$sd_finish" >"$NODE_STATE/booted"
}

# node_exec_args: systemd-run's arguments for a command in the node: the unit's environment (the
# bench's, then the caller's RSANDBOX_* and RUST_* over it), the working directory
node_exec_args() {
	local kv v
	while IFS= read -r kv; do
		echo "--setenv=$kv"
	done < <(unit_env)
	# not the host's recap file of failed cases (hack/test.sh): a path on the host, which the
	# node's own /tmp would take instead
	for v in $(compgen -e | grep -E '^(RSANDBOX|RUST)_' | grep -vx RSANDBOX_TALLY_RECAP || true); do
		echo "--setenv=$v=${!v}"
	done
	# the caller's directory, when the node sees it (not one of its own tmpfs: /tmp, /run)
	[[ -d "/proc/$1/root$PWD" ]] && echo "--working-directory=$PWD"
	return 0
}

cmd_exec() {
	local pid mode=--pipe args=()
	if [[ "${1:-}" == --pty ]]; then
		mode=--pty
		shift
	fi
	[[ "${1:-}" == -- ]] && shift
	(($#)) || die "usage: hack/node.sh exec [--pty] [--] CMD..."
	pid=$(node_pid) || die "node $NODE_NAME is not running (hack/node.sh -n $NODE_NAME boot)"
	# systemd-run looks a bare name up in PATH and wants any other path absolute
	if [[ "$1" == */* && "$1" != /* ]]; then
		set -- "$PWD/$1" "${@:2}"
	fi
	mapfile -t args < <(node_exec_args "$pid")
	node_enter "$pid" systemd-run --quiet --wait --collect "$mode" --service-type=exec \
		--description="rsandbox node exec: $*" "${args[@]}" -- "$@"
}

cmd_status() {
	local pid
	pid=$(node_pid) || {
		echo "node $NODE_NAME: not running"
		return 1
	}
	echo "node $NODE_NAME: PID 1 = host pid $pid ($(cat "/proc/$pid/comm")), namespaces $(cat "$NODE_STATE/ns" 2>/dev/null)"
	echo "its cgroup on the host: $(grep ':name=systemd:' "/proc/$pid/cgroup")"
	echo "systemd: $(node_enter "$pid" systemctl is-system-running)"
	node_enter "$pid" systemctl --no-pager list-units --plain --no-legend --state=active --type=service,socket |
		awk '{ print "  " $1 }'
	echo "/sys/fs/cgroup:" /proc/"$pid"/root/sys/fs/cgroup/* | sed "s|/proc/$pid/root/sys/fs/cgroup/||g"
	echo "file systems: / $(node_enter "$pid" findmnt -no FSTYPE /), /run $(node_enter "$pid" findmnt -no FSTYPE /run)," \
		"containerd root $(node_enter "$pid" findmnt -no FSTYPE "$ROOT_DIR")"
}

# node_leftovers: prints what node NAME left on the host, one line each
node_leftovers() {
	local d p ns s k v now_v
	for d in $(node_cgroup_dirs); do
		[[ -d "$d" ]] && echo "cgroup $d"
	done
	for p in $(node_cgroup_pids); do
		echo "process $p in the node's cgroups: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
	done
	if [[ -s "$NODE_STATE/ns" ]]; then
		ns=$(<"$NODE_STATE/ns")
		# shellcheck disable=SC2086 # one namespace per word
		for p in $(node_ns_pids $ns); do
			echo "process $p in the node's namespaces: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
		done
		# a namespace can also be held by an open descriptor or an nsfs mount
		for s in $ns; do
			grep -qF "$s" /proc/self/mountinfo && echo "mount of the node's namespace $s"
		done
		# shellcheck disable=SC2086 # one namespace per word
		node_ns_find fd $ns | sed "s/^/descriptor of the node's namespaces: /"
	fi
	grep -F " $NODE_STATE" /proc/self/mountinfo | awk '{ print "mount in the host namespace: " $5 }'
	# the node's shim sockets (recorded at stop) must not be in the host's /run/containerd/s
	if [[ -f "$NODE_STATE/sockets" ]]; then
		while read -r s; do
			[[ -n "$s" && -e "/run/containerd/s/$s" ]] && echo "socket /run/containerd/s/$s (one of the node's)"
		done <"$NODE_STATE/sockets"
	fi
	if [[ -f "$NODE_STATE/sysctls" ]]; then
		while read -r k v; do
			IFS= read -r now_v </proc/sys/"$k" || true
			[[ "$now_v" == "$v" ]] || echo "sysctl ${k//\//.} changed: '$v' -> '$now_v'"
		done <"$NODE_STATE/sysctls"
	fi
	return 0
}

# node_wait_gone SECONDS: until no process is in the node's cgroups or namespaces
node_wait_gone() {
	local end=$((SECONDS + $1)) ns=
	[[ -s "$NODE_STATE/ns" ]] && ns=$(<"$NODE_STATE/ns")
	while ((SECONDS < end)); do
		# shellcheck disable=SC2086 # one namespace per word
		[[ -z "$(node_cgroup_pids)" && -z "$([[ -n $ns ]] && node_ns_pids $ns)" ]] && return 0
		sleep 0.1
	done
	return 1
}

# node_remove: ends whatever is left of node NAME (SIGKILL, by pid: every process in its
# cgroups or namespaces), removes its cgroups and its state (the console log is kept beside)
node_remove() {
	local p ns=
	[[ -s "$NODE_STATE/ns" ]] && ns=$(<"$NODE_STATE/ns")
	if ! node_wait_gone 5; then
		# shellcheck disable=SC2086 # one namespace per word
		for p in $(node_cgroup_pids) $([[ -n $ns ]] && node_ns_pids $ns); do
			log "node $NODE_NAME: killing leftover process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-80))"
			kill -KILL "$p" 2>/dev/null || true
		done
		node_wait_gone 10 || log "node $NODE_NAME: processes still there after SIGKILL"
	fi
	node_cgroup_remove || log "node $NODE_NAME: cgroups still there"
}

node_forget() { # the state directory (never crossing into a file system mounted below it)
	[[ -d "$NODE_STATE" ]] || return 0
	if mountpoint -q "$NODE_STATE/fs" 2>/dev/null; then
		log "node $NODE_NAME: $NODE_STATE/fs is mounted in the host's namespace: state kept"
		return 1
	fi
	[[ -f "$NODE_STATE/console.log" ]] && mv -f "$NODE_STATE/console.log" "$NODE_STATE_BASE/$NODE_NAME.console.log"
	rm -rf --one-file-system "${NODE_STATE:?}"
}

cmd_stop() {
	local pid t0 left rc=0
	t0=$(now)
	if pid=$(node_pid); then
		ls /proc/"$pid"/root/run/containerd/s/ 2>/dev/null >"$NODE_STATE/sockets" || true
		log "node $NODE_NAME: SIGRTMIN+3 to its PID 1 (host pid $pid)"
		kill -s RTMIN+3 "$pid"
		local end=$((SECONDS + 60))
		while [[ -d /proc/$pid ]] && ((SECONDS < end)); do sleep 0.05; done
		if [[ -d /proc/$pid ]]; then
			log "node $NODE_NAME: still up after 60 s: SIGKILL to its PID 1"
			console_tail
			kill -KILL "$pid" 2>/dev/null || true
			rc=1
		fi
	else
		log "node $NODE_NAME: not running"
	fi
	node_remove
	left=$(node_leftovers)
	if [[ -n "$left" ]]; then
		log "node $NODE_NAME: LEFT ON THE HOST:"
		print_leftovers "$left" >&2
		return 1
	fi
	node_forget || rc=1
	log "node $NODE_NAME: stopped in $(secs_since "$t0") s; nothing left on the host (processes, mounts, cgroups, namespaces, sockets, sysctls)"
	return "$rc"
}

cmd_clean() {
	local left
	if node_pid >/dev/null; then
		cmd_stop
		return
	fi
	node_remove
	left=$(node_leftovers | grep -v '^sysctl ' || true)
	if [[ -n "$left" ]]; then
		log "node $NODE_NAME: LEFT ON THE HOST:"
		print_leftovers "$left" >&2
		return 1
	fi
	node_forget
}

cmd_clean_all() { # every stale node (a state directory or a cgroup, no live PID 1); running ones stay
	local names n d rc=0
	names=$({
		for d in "$NODE_STATE_BASE"/*/ /sys/fs/cgroup/*/rsandbox-node-*/; do
			[[ -d "$d" ]] || continue
			d=${d%/}
			d=${d##*/}
			echo "${d#rsandbox-node-}"
		done
	} | sort -u)
	for n in $names; do
		# shellcheck disable=SC2030,SC2031 # node_set's variables are the subshell's
		(
			node_set "$n"
			if pid=$(node_pid); then
				log "node $n runs (host pid $pid): left alone (hack/node.sh -n $n stop)"
			else
				cmd_clean
			fi
		) || rc=1
	done
	return "$rc"
}

print_leftovers() { # the lines of $1, each as a LEFTOVER
	local l
	while IFS= read -r l; do
		echo "  LEFTOVER $l"
	done <<<"$1"
}

cmd_leftovers() {
	local left
	left=$(node_leftovers)
	[[ -z "$left" ]] && return 0
	print_leftovers "$left"
	return 1
}

cmd_run_tests() {
	local exe lib_exe t0 rc=0 args=()
	t0=$(now)
	exe=$(with_heartbeat "building integration/tests/systemd.rs" test_binary systemd)
	lib_exe=
	(($#)) || lib_exe=$(with_heartbeat "building the shim's unit tests" lib_test_binary)
	log "node tests: $exe${lib_exe:+ and $lib_exe}"
	cmd_boot
	# interrupted or failed: the node goes too
	trap 'cmd_stop >/dev/null 2>&1 || true' EXIT
	for a in "$@"; do args+=("$(printf '%q' "$a")"); done
	cd "$NODE_REPO"
	RSANDBOX_NODE_EXE=$exe RSANDBOX_NODE_LIB_EXE=$lib_exe RSANDBOX_NODE_RUNCS=${RSANDBOX_NODE_RUNCS:-1.1 1.3} \
		RSANDBOX_NODE_ARGS="${args[*]}" with_heartbeat "the node's tests (hack/node/tests.sh)" \
		cmd_exec bash "$NODE_REPO/hack/node/tests.sh" || rc=$?
	trap - EXIT
	cmd_stop || rc=1
	log "node tests: exit $rc, $(secs_since "$t0") s in all (build, boot, tests, stop)"
	return "$rc"
}

NODE=${RSANDBOX_NODE_NAME:-node}
if [[ "${1:-}" == -n ]]; then
	NODE=${2:-}
	shift 2 || die "usage: hack/node.sh -n NAME COMMAND"
fi
node_set "$NODE"
# what node_env hands to the node's PID 1 (read there; here by name only)
NODE_REPO=$RSANDBOX_REPO
NODE_BIN=$BIN
NODE_LOGFILE=$LOGFILE
NODE_PIDFILE=$PIDFILE
NODE_SHIM_NAME=$SHIM_NAME
NODE_SHIM_SRC=${RSANDBOX_NODE_SHIM:-$BIN/$SHIM_NAME}
NODE_HIERARCHIES=$(node_hierarchies)
NODE_SYSCTL_KEYS="${NODE_SYSCTLS[*]}"
NODE_SYSTEMD_LAYER=
NODE_LIVE_DIRS=$RSANDBOX_REPO${CARGO_TARGET_DIR:+ $(realpath -m "$CARGO_TARGET_DIR")}
NODE_RUNC_BIN=$(runc_path_for "$RSANDBOX_RUNC")

cmd=${1:-}
shift || true
case "$cmd" in
boot | stop | leftovers | run-tests | check)
	need_root
	"cmd_${cmd//-/_}" "$@"
	;;
clean)
	need_root
	if [[ "${1:-}" == --all ]]; then
		cmd_clean_all
	else
		cmd_clean
	fi
	;;
exec)
	need_root
	cmd_exec "$@"
	;;
shell)
	need_root
	cmd_exec --pty bash
	;;
status) cmd_status ;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
