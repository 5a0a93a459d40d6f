# shellcheck shell=bash
# deploy/node/lib/unit.sh - containerd as a systemd unit: its main PID, a restart and the wait
# for it. Every call goes through SYSTEMCTL (default: the host's `systemctl`; the DaemonSet:
# `containerd-shim-rsandbox-v1 unit`, the same commands over systemd's D-Bus API), the one
# seam a test replaces. Only these forms are used (`unit` accepts exactly them): show
# --property MainPID|LoadState --value, is-active [--quiet], restart [--no-block], reset-failed.

systemctl_() {
	# SYSTEMCTL is a command (with its arguments), split on blanks on purpose
	# shellcheck disable=SC2086
	$SYSTEMCTL "$@"
}

# descendants_of PID: the PIDs of PID's descendants, nearest first, from the parent PID in each
# /proc/N/stat. Not the unit's cgroup: the DaemonSet's pod sees the node's processes (hostPID)
# but neither the unit's ControlGroup (`unit` does not give it) nor the node's cgroup tree.
descendants_of() {
	local s line pid ppid p queue=("$1")
	local -A children=()
	for s in /proc/[0-9]*/stat; do
		read -r line <"$s" 2>/dev/null || continue
		pid=${line%% *}
		# the fields after the command name (which may hold blanks and parentheses): state ppid ...
		line=${line##*) }
		ppid=${line#* }
		ppid=${ppid%% *}
		children[$ppid]+=" $pid"
	done
	while [[ ${#queue[@]} -gt 0 ]]; do
		p=${queue[0]}
		queue=("${queue[@]:1}")
		for pid in ${children[$p]:-}; do
			echo "$pid"
			queue+=("$pid")
		done
	done
}

# containerd_main_pid: containerd's PID, empty when it does not run: the unit's MainPID when
# that is containerd (containerd.service, microk8s' snap unit), else the nearest containerd
# process below it (k3s, rke2 and k0s run containerd as a child of their own process)
containerd_main_pid() {
	local pid p exe
	pid=$(systemctl_ show --property MainPID --value "$CONTAINERD_UNIT" 2>/dev/null) || pid=
	[[ "$pid" =~ ^[1-9][0-9]*$ ]] || return 0
	for p in "$pid" $(descendants_of "$pid"); do
		exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
		[[ "$(basename "${exe% (deleted)}")" == containerd ]] && {
			echo "$p"
			return 0
		}
	done
	# a unit whose containerd could not be found: its MainPID (as before distro.sh)
	echo "$pid"
	return 0
}

# restart_containerd: `systemctl restart` (it waits for the unit's start job: containerd.service
# is Type=notify, so until containerd said READY), then the new MainPID
restart_containerd() {
	local before_pid after_pid
	before_pid=$(containerd_main_pid)
	log "restarting $CONTAINERD_UNIT (MainPID ${before_pid:-none})"
	systemctl_ restart "$CONTAINERD_UNIT" ||
		fail "restart containerd" "systemctl restart $CONTAINERD_UNIT failed (see: journalctl -u $CONTAINERD_UNIT)"
	systemctl_ is-active --quiet "$CONTAINERD_UNIT" ||
		fail "restart containerd" "$CONTAINERD_UNIT is not active after its restart (see: journalctl -u $CONTAINERD_UNIT)"
	after_pid=$(containerd_main_pid)
	[[ -n "$after_pid" ]] || fail "restart containerd" "$CONTAINERD_UNIT has no MainPID after its restart"
	log "$CONTAINERD_UNIT restarted (MainPID $after_pid)"
}
