#!/usr/bin/env bash
# hack/setup.sh [--demo] - one idempotent command that sets up the rsandbox
# bench on a fresh Debian machine (run as root):
#   host packages from the host's release (runc, iptables, iproute2, gcc,
#   libc6-dev, protobuf-compiler, ...);
#   containerd 2.1.9 + CNI plugins (and crictl, when Debian has it) from sid
#   and sid's runc 1.3 (beside the host's 1.1; RSANDBOX_RUNC picks one)
#   into $RSANDBOX_PREFIX (/opt/rsandbox); busybox-static -> local OCI images
#   localhost/busybox:latest and localhost/pause:3.10, imported into
#   namespaces default and k8s.io; containerd config + CNI conflists;
#   containerd started.
# --demo: only what hack/demo.sh uses (no runc 1.3: the demo runs the host's).
# What only the tests use (cargo-machete, the guests' QEMU and kernel, gnuplot)
# is hack/test.sh's to install. A second run only checks and is fast. It does
# not build the shim: that is hack/build.sh. Environment: see hack/lib.sh.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

demo=0
case "${1:-}" in
--demo) demo=1 ;;
"") ;;
*) die "usage: $0 [--demo]" ;;
esac
need_root
section "setup: host packages"
deps
section "setup: containerd, CNI plugins, busybox into $P"
fetch
if ((demo)); then
	[[ "$RSANDBOX_RUNC" == 1.1 ]] || die "--demo runs the host's runc (RSANDBOX_RUNC=1.1), not $RSANDBOX_RUNC"
else
	section "setup: runc 1.3 (beside the host's)"
	fetch_runc13
fi
section "setup: config, images, containerd"
select_runc
write_versions
if config && pid=$(containerd_pid); then
	log "config changed while containerd runs (pid $pid): restarting it"
	stop
fi
start
: >"$SETUP_DONE"
log "$(head -n1 "$P/VERSIONS")"
log "crictl: $(sed -n 's/^crictl: //p' "$P/VERSIONS")"
log "setup complete; env: eval \"\$(hack/containerd.sh env)\""
