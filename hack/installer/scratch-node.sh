#!/usr/bin/env bash
# hack/installer/scratch-node.sh - a throwaway containerd 2.1.9 (the bench's binary) with its
# own root, state, socket, config and CNI network under one directory, for the installer's
# tests where no systemd node is at hand; and a stand-in for `systemctl` that drives it the
# way containerd.service does (KillMode=process: a restart stops containerd only, the shims
# live on). Not a node: no systemd, paths under DIR instead of /etc and /usr/local/bin.
#
# Usage: hack/installer/scratch-node.sh DIR setup|start|stop|env
#        hack/installer/scratch-node.sh DIR systemctl restart|show|is-active ... (as systemctl)
#   setup   DIR/etc/containerd/config.toml (version 3, no imports: a hand-written config),
#           a CNI bridge network (rsinst0, 10.92.0.0/16, no masquerade), dirs
#   env     the installer's options for this node, as shell assignments
# Needs the bench's binaries ($RSANDBOX_PREFIX, hack/setup.sh).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

D=${1:?usage: $0 DIR COMMAND}
D=$(mkdir -p "$D" && cd "$D" && pwd)
shift
cmd=${1:-}
[[ $# -gt 0 ]] && shift
S_CONFIG=$D/etc/containerd/config.toml
S_SOCK=$D/run/containerd.sock
S_PID=$D/run/containerd.pid
S_LOG=$D/log/containerd.log
S_BIN=$D/bin # the node's "/usr/local/bin": on containerd's PATH, before the bench's binaries

S_SUBNET=10.92.0.0/16
# pod traffic stays on this machine, as on the bench (hack/lib/net.sh)
S_GUARD=(FORWARD -s "$S_SUBNET" ! -d "$S_SUBNET" -m comment --comment rsandbox-installer-scratch -j DROP)

s_pid() {
	local pid
	pid=$(cat "$S_PID" 2>/dev/null) || return 1
	[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
		[[ "$(readlink "/proc/$pid/exe")" == "$(readlink -f "$BIN/containerd")" ]] || return 1
	echo "$pid"
}

s_start() {
	local pid _
	s_pid >/dev/null && return 0
	mkdir -p "$D/run" "$D/log"
	rm -f "$S_SOCK" "$S_SOCK.ttrpc" "$S_PID"
	[[ -f "$D/ip_forward.orig" ]] || cat /proc/sys/net/ipv4/ip_forward >"$D/ip_forward.orig"
	iptables -C "${S_GUARD[@]}" 2>/dev/null || iptables -I "${S_GUARD[@]}"
	# shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
	# as a unit's process: working directory /, a PATH of its own (the node's "/usr/local/bin"
	# first), no descriptor of the caller (a tool waiting for its output would wait forever)
	(cd / && PATH="$S_BIN:$BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" exec setsid bash -c \
		'for fd in /proc/$$/fd/*; do fd=${fd##*/}; ((fd > 2)) && eval "exec $fd>&-"; done; echo $$ >"$1" && shift && exec "$@"' \
		scratch-containerd "$S_PID" "$BIN/containerd" --config "$S_CONFIG") </dev/null >>"$S_LOG" 2>&1 &
	for _ in $(seq 1 300); do
		if pid=$(s_pid) && [[ -S "$S_SOCK" ]] && "$BIN/ctr" --address "$S_SOCK" version >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	tail -n 20 "$S_LOG" >&2
	return 1
}

s_stop() {
	local pid _
	pid=$(s_pid) || return 0
	kill -TERM "$pid"
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

case "$cmd" in
setup)
	mkdir -p "$D/etc/containerd" "$D/root" "$D/state" "$D/tmp" "$D/opt" "$D/cni/net.d" "$D/cni/ipam" "$S_BIN" "$D/run" "$D/log"
	cat >"$S_CONFIG" <<TOML
# a hand-written containerd 2.x config (no imports), as an older node has
version = 3
root = '$D/root'
state = '$D/state'
temp = '$D/tmp'

[grpc]
  address = '$S_SOCK'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = '$(snapshotter)'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '$CONF_DIR/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = $(has_cap_sys_resource && echo false || echo true)
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        sandboxer = 'podsandbox'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$CNI_BIN']
      conf_dir = '$D/cni/net.d'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
  [plugins.'io.containerd.internal.v1.opt']
    path = '$D/opt'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '$D/image-verifier'
TOML
	NET_NAME=rsinst NET_BRIDGE=rsinst0 NET_SUBNET=$S_SUBNET IPAM_DIR=$D/cni/ipam render bridge.conflist.in >"$D/cni/net.d/10-rsinst.conflist"
	;;
start)
	s_start
	"$BIN/ctr" --address "$S_SOCK" -n k8s.io images ls -q | grep -xF "$BUSYBOX_IMAGE" >/dev/null ||
		"$BIN/ctr" --address "$S_SOCK" -n k8s.io images import --snapshotter "$(snapshotter)" "$IMG_DIR/busybox.oci.tar" >/dev/null
	;;
stop)
	s_stop
	ip link del rsinst0 2>/dev/null || true
	while iptables -C "${S_GUARD[@]}" 2>/dev/null; do iptables -D "${S_GUARD[@]}"; done
	if [[ -f "$D/ip_forward.orig" ]]; then
		cat "$D/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
		rm -f "$D/ip_forward.orig"
	fi
	;;
env)
	cat <<ENV
CONTAINERD_CONFIG=$S_CONFIG
CONTAINERD_SOCKET=$S_SOCK
INSTALL_DIR=$S_BIN
STATE_DIR=$D/state-installer
SYSTEMCTL='$RSANDBOX_REPO/hack/installer/scratch-node.sh $D systemctl'
ENV
	;;
systemctl)
	# the subset of systemctl the installer uses, for the unit containerd.service
	case "${1:-}" in
	restart) # [--no-block] UNIT: always waits here
		s_stop
		s_start
		;;
	show) # show --property MainPID --value UNIT
		s_pid || echo 0
		;;
	is-active) # [--quiet] UNIT: prints the state unless --quiet, as systemctl does
		if s_pid >/dev/null; then
			[[ "${2:-}" == --quiet ]] || echo active
		else
			[[ "${2:-}" == --quiet ]] || echo inactive
			exit 3
		fi
		;;
	reset-failed) ;; # no start rate limit here
	*)
		echo "scratch systemctl: unsupported: $*" >&2
		exit 1
		;;
	esac
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
