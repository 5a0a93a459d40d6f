#!/usr/bin/env bash
# hack/setup.sh - one idempotent command that sets up the rsandbox bench on a
# fresh Debian machine (run as root):
#   host packages from the host's release (runc, iptables, iproute2, gcc,
#   libc6-dev, protobuf-compiler, ...); containerd 2.1.9 + CNI plugins (and
#   crictl, when Debian has it) from sid into $RSANDBOX_PREFIX (/opt/rsandbox);
#   busybox-static -> local OCI images localhost/busybox:latest and
#   localhost/pause:3.10, imported into namespaces default and k8s.io;
#   containerd config + CNI conflist; containerd started.
# A second run only checks and is fast. It does not build the shim: that is
# hack/build.sh. Environment: see hack/lib.sh.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

setup
