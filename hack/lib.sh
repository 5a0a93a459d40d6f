# shellcheck shell=bash
# hack/lib.sh - shared variables and functions of the rsandbox bench scripts.
#
# Sourced by hack/*.sh; it only defines things and leaves the caller's shell
# options alone (the callers run under `set -euo pipefail`).
#
# The bench is a private, real containerd made from Debian packages only:
#   - runc, iptables, iproute2, gcc, protoc ... from the host's own release
#     (never from a newer suite: sid's runc would drag in a newer glibc);
#     sid's runc 1.3 beside it, on sid's glibc under the prefix (lib/runc.sh);
#   - containerd 2.1.9 and the CNI plugins from Debian sid, fetched with a
#     private apt state (the host's apt sources are never touched) and
#     extracted with `dpkg-deb -x` under $RSANDBOX_PREFIX;
#   - OCI images built locally from busybox-static (no registry is reached).
# Every containerd root/state dir, socket, log and the CNI config live under
# the prefix; see README / `hack/containerd.sh env`.
#
# This file holds the environment, the paths and the logging helpers; the
# functions live in hack/lib/, one file per job (all sourced below):
#   apt.sh     host packages; containerd, CNI plugins, busybox-static (and
#              crictl) from Debian through a private apt state
#   rust.sh    cargo tools the tests use (cargo-machete), pinned
#   config.sh  containerd config, the shim's config, CNI conflists: rendered
#              from hack/templates/*.in
#   net.sh     the iptables guard that keeps pod traffic on this machine
#   proc.sh    containerd and the shims: start, stop, reset, status, env
#   images.sh  the local OCI images, built from busybox-static and
#              hack/images/ (pause.c, pgrep, ipcs)
#   runc.sh    the second runc (sid's 1.3.x) and which runc the bench uses
#   testbin.sh the test executables the guests and the systemd node run
#   systemd.sh systemd and dbus extracted for the guest and the node when missing here
#   guest.sh   the cgroup v2 guest (QEMU, Debian's kernel): hack/guest.sh
#   tally.sh   what a run of test binaries ran and skipped (rsandbox-skip lines, zero cases)
#
# Environment (all optional):
#   RSANDBOX_PREFIX              install/state prefix              (/opt/rsandbox)
#   RSANDBOX_CONTAINERD_SUITE    Debian suite for containerd + CNI (sid)
#   RSANDBOX_CONTAINERD_VERSION  Debian version of containerd; default: the
#                                newest 2.1.9 one the suite has, else its newest
#   RSANDBOX_DEBIAN_URI          Debian archive URI (default: read off apt's config)
#   RSANDBOX_SNAPSHOTTER         overlayfs|native (default: overlayfs if it mounts here)
#   RSANDBOX_SUBNET              pod subnet                        (10.88.0.0/16)
#   RSANDBOX_BRIDGE              bridge name                       (rsandbox0)
#   RSANDBOX_SHIM_SUBNET         subnet of shim-owned pod networks (10.90.0.0/16)
#   RSANDBOX_SHIM_BRIDGE         bridge of shim-owned pod networks (rsandbox1)
#   RSANDBOX_LOG_LEVEL           containerd log level (info; debug also makes
#                                containerd start the shims with -debug)
#   RSANDBOX_REFRESH=1           re-download the packages even when present
#   RSANDBOX_RUNC                1.1 (the host's runc) | 1.3 (sid's) (1.1)

# The variables are used by the scripts that source this file and by the
# templates (hack/templates/*.in):
# shellcheck disable=SC2034

RSANDBOX_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

RSANDBOX_PREFIX=${RSANDBOX_PREFIX:-/opt/rsandbox}
RSANDBOX_CONTAINERD_SUITE=${RSANDBOX_CONTAINERD_SUITE:-sid}
RSANDBOX_CONTAINERD_VERSION=${RSANDBOX_CONTAINERD_VERSION:-}
RSANDBOX_SUBNET=${RSANDBOX_SUBNET:-10.88.0.0/16}
RSANDBOX_BRIDGE=${RSANDBOX_BRIDGE:-rsandbox0}
RSANDBOX_SHIM_SUBNET=${RSANDBOX_SHIM_SUBNET:-10.90.0.0/16}
RSANDBOX_SHIM_BRIDGE=${RSANDBOX_SHIM_BRIDGE:-rsandbox1}
RSANDBOX_LOG_LEVEL=${RSANDBOX_LOG_LEVEL:-info}

P=$RSANDBOX_PREFIX
BIN=$P/usr/bin
CNI_BIN=$P/usr/lib/cni
CONF_DIR=$P/conf
CONFIG=$CONF_DIR/containerd.toml
CNI_CONF_DIR=$CONF_DIR/cni/net.d
SHIM_CONFIG=$CONF_DIR/rsandbox.toml
SHIM_CNI_CONF_DIR=$CONF_DIR/cni/rsandbox.d
SHIM_CNI_NET=rsandbox-shim
SOCK=$P/run/containerd.sock
PIDFILE=$P/run/containerd.pid
LOGFILE=$P/log/containerd.log
ROOT_DIR=$P/var/lib/containerd
STATE_DIR=$P/run/containerd
RUNC_ROOT=$P/run/runc
IPAM_DIR=$P/var/lib/cni/networks
IMG_DIR=$P/images
SETUP_DONE=$P/.setup-complete
SHIM_NAME=containerd-shim-rsandbox-v1

# host_triple: rustc's host target (hack/build.sh builds the shim with an explicit --target)
host_triple() {
	local t
	t=$(rustc -vV | sed -n 's/^host: //p')
	[[ -n "$t" ]] || die "rustc -vV names no host triple"
	echo "$t"
}

# built_shim: where hack/build.sh leaves the release shim (a static-pie, built for
# host_triple; CARGO_TARGET_DIR honoured)
built_shim() {
	echo "${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/$(host_triple)/release/$SHIM_NAME"
}
SHIM_RUNTIME=io.containerd.rsandbox.v1
PAUSE_IMAGE=localhost/pause:3.10
BUSYBOX_IMAGE=localhost/busybox:latest
CNI_NET=rsandbox
NAMESPACES=(default k8s.io)
# the FORWARD guard rule; its comment lets stop find exactly our rule
GUARD_RULE=(FORWARD -s "$RSANDBOX_SUBNET" ! -d "$RSANDBOX_SUBNET" -m comment --comment rsandbox-bench -j DROP)
SHIM_GUARD_RULE=(FORWARD -s "$RSANDBOX_SHIM_SUBNET" ! -d "$RSANDBOX_SHIM_SUBNET" -m comment --comment rsandbox-bench -j DROP)
# host packages, from the host's own release (protobuf-compiler: the
# integration tests build tonic/prost code; gcc + libc6-dev: the static pause and the static
# release binary; jq, file, binutils: hack/release.sh's SBOM and static checks)
HOST_PACKAGES=(runc iptables iproute2 util-linux procps gcc libc6-dev protobuf-compiler pkg-config
	tar gzip ca-certificates debian-archive-keyring jq file binutils)

# rustup's cargo lives in ~/.cargo/bin, which non-login shells (sudo, CI) may lack
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
	PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
# runc, iptables, findmnt ... live in sbin, which a non-root PATH may lack
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin:/sbin" ;; esac

log() { printf '[rsandbox] %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
# The start of the whole run: exported, so a script called by another (demo.sh ->
# setup.sh) counts from the outermost one's start.
RSANDBOX_T0=${RSANDBOX_T0:-$(date +%s)}
export RSANDBOX_T0
elapsed() { # time since RSANDBOX_T0, as 1m05s
	local s=$(($(date +%s) - RSANDBOX_T0))
	printf '%dm%02ds' $((s / 60)) $((s % 60))
}
# A stage header with the wall clock and the time since the run started.
section() { printf '\n=== %s === [%s, +%s]\n' "$*" "$(date +%H:%M:%S)" "$(elapsed)" >&2; }
# with_heartbeat WHAT CMD...: runs CMD, its output untouched; while it runs, a line on stderr
# every RSANDBOX_HEARTBEAT seconds (10) saying what still runs and for how long, so a long step
# never looks hung (cargo test prints nothing until a test ends). On a terminal cargo draws its
# own progress bar: the lines then only come every minute, for the steps that show none (cargo's
# final link with LTO). Returns CMD's status. CMD runs in a subshell with the caller's `set -e`
# in force inside it when with_heartbeat is called as a plain command (under `||`, bash ignores
# -e for all inside), so an `exit` or `die` in it ends CMD only; its variables do not come back.
with_heartbeat() {
	local what=$1 every=${RSANDBOX_HEARTBEAT:-10} t0=$SECONDS beat_fd beat rc opts=$-
	shift
	[[ -t 2 ]] && every=60
	# The heartbeat waits on a pipe nobody writes to (`read -t`, a builtin: no sleep process of
	# its own) and ends at its EOF: when this function closes it after CMD, or when the caller
	# dies (the kernel closes its end). No signal is sent to it: bash runs the caller's EXIT
	# trap in a child killed before it has reset its traps (hack/test.sh's stops containerd).
	exec {beat_fd}> >(
		while :; do
			st=0
			read -r -t "$every" _ || st=$?
			((st > 128)) || break # not a timeout: EOF
			printf '[rsandbox]   ... still running: %s (%ds)\n' "$what" $((SECONDS - t0)) >&2
		done >/dev/null
	)
	beat=$!
	set +e
	(
		# CMD and what it starts (a daemon) must not hold the heartbeat's pipe open
		exec {beat_fd}>&-
		[[ $opts == *e* ]] && set -e
		"$@"
	)
	rc=$?
	[[ $opts == *e* ]] && set -e
	exec {beat_fd}>&-
	wait "$beat" 2>/dev/null || true
	if ((rc)); then log "$what: exit status $rc after $((SECONDS - t0)) s"; else log "$what: done in $((SECONDS - t0)) s"; fi
	return "$rc"
}
need_root() { [[ $EUID -eq 0 ]] || die "run as root (containerd, runc, mounts and iptables need it)"; }

# shellcheck source=hack/lib/apt.sh
. "$RSANDBOX_REPO/hack/lib/apt.sh"
# shellcheck source=hack/lib/rust.sh
. "$RSANDBOX_REPO/hack/lib/rust.sh"
# shellcheck source=hack/lib/config.sh
. "$RSANDBOX_REPO/hack/lib/config.sh"
# shellcheck source=hack/lib/net.sh
. "$RSANDBOX_REPO/hack/lib/net.sh"
# shellcheck source=hack/lib/proc.sh
. "$RSANDBOX_REPO/hack/lib/proc.sh"
# shellcheck source=hack/lib/images.sh
. "$RSANDBOX_REPO/hack/lib/images.sh"
# shellcheck source=hack/lib/runc.sh
. "$RSANDBOX_REPO/hack/lib/runc.sh"
# shellcheck source=hack/lib/testbin.sh
. "$RSANDBOX_REPO/hack/lib/testbin.sh"
# shellcheck source=hack/lib/systemd.sh
. "$RSANDBOX_REPO/hack/lib/systemd.sh"
# shellcheck source=hack/lib/tally.sh
. "$RSANDBOX_REPO/hack/lib/tally.sh"
