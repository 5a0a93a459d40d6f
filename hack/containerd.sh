#!/usr/bin/env bash
# hack/containerd.sh - control the bench's containerd (set up by hack/setup.sh).
#
# Usage: hack/containerd.sh COMMAND
#   start              start containerd in the background (no-op if running),
#                      wait for its socket, import missing images
#   stop               remove CRI pods (if crictl exists), kill all tasks in all
#                      namespaces, stop containerd by its pid file, delete
#                      leftover runc containers and shims of this bench,
#                      unmount leftovers under the prefix, undo net tweaks
#   restart            stop + start
#   reset              (running) kill every task, remove every container and
#                      sandbox record in every namespace; images stay
#   status             whether containerd runs, what it serves, the shim
#   env                exports for ctr/crictl: eval "$(hack/containerd.sh env)"
#   config             rewrite the containerd config + CNI conflist
#   clean              stop + remove containerd's state (metadata, snapshots,
#                      the bridge); the next start re-imports the images
#   install-shim PATH  copy a built containerd-shim-rsandbox-v1 into the prefix
#                      atomically (running shims keep their old binary)
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

cmd=${1:-}
case "$cmd" in
start | stop | clean)
	need_root
	"$cmd"
	;;
restart)
	need_root
	stop
	start
	;;
reset)
	need_root
	reset_objects
	;;
config)
	need_root
	if config && pid=$(containerd_pid); then
		log "containerd (pid $pid) still runs the old config: hack/containerd.sh restart"
	fi
	;;
status) status ;;
env) print_env ;;
install-shim)
	[[ $# -eq 2 ]] || die "usage: $0 install-shim PATH"
	install_shim "$2"
	;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
