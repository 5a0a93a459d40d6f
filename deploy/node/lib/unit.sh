# shellcheck shell=bash
# deploy/node/lib/unit.sh - containerd as a systemd unit: its main PID, a restart and the wait
# for it. Every call goes through SYSTEMCTL (default: the host's `systemctl`; the DaemonSet:
# `containerd-shim-rsandbox-v1 unit`, the same commands over systemd's D-Bus API), the one
# seam a test replaces. Only these forms are used (`unit` accepts exactly them): show
# --property MainPID --value, is-active [--quiet], restart [--no-block], reset-failed.

systemctl_() {
	# SYSTEMCTL is a command (with its arguments), split on blanks on purpose
	# shellcheck disable=SC2086
	$SYSTEMCTL "$@"
}

# containerd_main_pid: the unit's MainPID, empty when it does not run
containerd_main_pid() {
	local pid
	pid=$(systemctl_ show --property MainPID --value "$CONTAINERD_UNIT" 2>/dev/null) || pid=
	[[ "$pid" =~ ^[1-9][0-9]*$ ]] && echo "$pid"
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
