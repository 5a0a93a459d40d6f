#!/usr/bin/env bash
# hack/demo.sh - the README's "main job" command: a real pod through
# containerd's CRI on the rsandbox shim, and plain containers through ctr.
#
# Sets the bench up if needed (hack/setup.sh --demo: what the demo uses, no
# test tools), builds and installs the shim (hack/build.sh), starts
# containerd, runs busybox with
# `ctr run --runtime io.containerd.rsandbox.v1` (hello, exit status 3), then
# runs the CRI demo (integration/src/bin/rsandbox-demo.rs): RunPodSandbox with
# the `rsandbox` handler, two containers, the pod IP and what they share, and
# the pod's teardown. containerd is stopped at the end unless --keep is given
# (then: eval "$(hack/containerd.sh env)"; ctr ...).
# Every stage prints its wall clock and the time since the start; the long
# ones (package downloads, the two builds) print a line at least every 10 s
# when the output is not a terminal (on one, cargo's progress bar shows).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
cd "$RSANDBOX_REPO"

# Before anything is set up or trapped: without a toolchain the first build would stop the
# demo minutes in.
need_rust_toolchain

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

section "set up the bench (idempotent; the first time: Debian packages, a few minutes)"
hack/setup.sh --demo

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

section "build the demo's CRI client (integration/: tonic, k8s-cri; the first time ~150 crates, several minutes)"
with_heartbeat "cargo build --bin rsandbox-demo" cargo build --manifest-path integration/Cargo.toml --bin rsandbox-demo

section "a pod through CRI: RunPodSandbox (handler rsandbox) + two containers"
eval "$(print_env)"
cargo run --quiet --manifest-path integration/Cargo.toml --bin rsandbox-demo

section "demo OK (in $(elapsed))"
if ((keep)); then
	log "containerd keeps running; eval \"\$(hack/containerd.sh env)\" to use ctr; hack/containerd.sh stop when done"
fi
