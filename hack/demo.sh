#!/usr/bin/env bash
# hack/demo.sh - the README's "main job" command: run a real container through
# the rsandbox shim.
#
# Sets the bench up if needed (hack/setup.sh), builds and installs the shim
# (hack/build.sh), starts containerd and runs busybox with
# `ctr run --runtime io.containerd.rsandbox.v1`, then shows that a container's
# exit status comes back through the shim. containerd is stopped at the end
# unless --keep is given (then: eval "$(hack/containerd.sh env)"; ctr ...).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
cd "$RSANDBOX_REPO"

keep=0
case "${1:-}" in
--keep) keep=1 ;;
"") ;;
*) die "usage: $0 [--keep]" ;;
esac

on_exit() {
	local rc=$?
	if ((rc)); then
		log "demo FAILED; containerd log: $LOGFILE (last lines below)"
		tail -n 20 "$LOGFILE" >&2 || true
	fi
	if ((keep == 0)) && containerd_pid >/dev/null; then stop || rc=1; fi
	exit "$rc"
}
trap on_exit EXIT

section "set up the bench (idempotent)"
hack/setup.sh

section "build and install the shim"
hack/build.sh

section "containerd"
start
status

snap=$(snapshotter)
# a hung shim must not hang the demo
run_() { # id cmd...: ctr run --rm through the rsandbox shim
	local id=$1
	shift
	timeout 120 "$BIN/ctr" --address "$SOCK" -n default run --rm --runtime "$SHIM_RUNTIME" \
		--snapshotter "$snap" "$BUSYBOX_IMAGE" "$id" "$@"
}
cleanup_container() { # a failed run may leave its task/container record behind
	ctr_ -n default tasks kill -s SIGKILL "$1" >/dev/null 2>&1 || true
	ctr_ -n default tasks rm -f "$1" >/dev/null 2>&1 || true
	ctr_ -n default containers rm "$1" >/dev/null 2>&1 || true
}

section "ctr run --runtime $SHIM_RUNTIME $BUSYBOX_IMAGE: hello"
id=demo-$$
echo "+ ctr run --rm --runtime $SHIM_RUNTIME $BUSYBOX_IMAGE $id sh -c 'echo hello from rsandbox; uname -a; id'"
if ! run_ "$id" sh -c 'echo hello from rsandbox; uname -a; id'; then
	cleanup_container "$id"
	die "ctr run through the shim failed"
fi

section "exit status propagation: sh -c 'exit 3'"
id=demo-exit-$$
echo "+ ctr run --rm --runtime $SHIM_RUNTIME $BUSYBOX_IMAGE $id sh -c 'exit 3'"
rc=0
run_ "$id" sh -c 'exit 3' || rc=$?
cleanup_container "$id"
echo "exit status: $rc"
[[ "$rc" == 3 ]] || die "expected exit status 3, got $rc"

section "demo OK"
if ((keep)); then
	log "containerd keeps running; eval \"\$(hack/containerd.sh env)\" to use ctr; hack/containerd.sh stop when done"
fi
