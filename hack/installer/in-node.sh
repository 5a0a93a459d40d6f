#!/usr/bin/env bash
# hack/installer/in-node.sh TEST-EXE NEW-SHIM OLD-SHIM [FILTER...] - runs the installer's integration tests
# (integration/tests/installer.rs, built as TEST-EXE) where the installer runs: inside the
# systemd node (hack/installer/test.sh runs this through `hack/node.sh exec`), or beside a
# scratch containerd (its variables exported by the caller). Starts the Kubernetes API stub
# (hack/installer/kube-stub.py on 127.0.0.1 of this network namespace) so that the labels
# are exercised too, with a ServiceAccount token in SA_DIR (the stub fails the run when it
# sees the token on a process's argv); finds containerd's config file (the unit's --config,
# else /etc/containerd/config.toml) unless RSANDBOX_INSTALLER_CONFIG says it. FILTER goes to
# the test binary (e.g. `distro::`: the node shapes only).
set -euo pipefail
exe=$1
export RSANDBOX_INSTALLER_NEW=$2 RSANDBOX_INSTALLER_OLD=$3
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SYSTEMCTL=${SYSTEMCTL:-systemctl}

if [[ -z "${RSANDBOX_INSTALLER_CONFIG:-}" ]]; then
	# shellcheck disable=SC2086 # SYSTEMCTL is a command with arguments
	pid=$($SYSTEMCTL show --property MainPID --value containerd.service)
	RSANDBOX_INSTALLER_CONFIG=$(tr '\0' '\n' <"/proc/$pid/cmdline" | awk 'c { print; exit } $0 == "--config" || $0 == "-c" { c = 1 } sub(/^--config=/, "") { print; exit }')
	RSANDBOX_INSTALLER_CONFIG=${RSANDBOX_INSTALLER_CONFIG:-/etc/containerd/config.toml}
fi
export RSANDBOX_INSTALLER_CONFIG

stub_dir=$(mktemp -d)
export NODE_NAME=rsandbox-installer-test
export RSANDBOX_INSTALLER_KUBE_STATE=$stub_dir/labels.json
# a ServiceAccount's token, as the kubelet projects it: the stub refuses a request without
# it, and reports any process that has it on its argv (see kube-stub.py)
export SA_DIR=$stub_dir/serviceaccount
mkdir -m 0700 "$SA_DIR"
(umask 077 && head -c 48 /dev/urandom | base64 -w0 | tr '+/' '-_' >"$SA_DIR/token")
# the pod's namespace, as the projected service account volume has it: the restart slots'
# (Leases) namespace
echo rsandbox-system >"$SA_DIR/namespace"
# the verification pod's image: the bench's busybox (imported on the node; a kubelet's node
# has containerd's pinned sandbox image, the installer's default)
export VERIFY_IMAGE=${VERIFY_IMAGE:-localhost/busybox:latest}
python3 "$here/kube-stub.py" "$NODE_NAME" "$RSANDBOX_INSTALLER_KUBE_STATE" "$stub_dir/port" --token "$SA_DIR/token" &
stub=$!
trap 'kill "$stub" 2>/dev/null || true; rm -rf "$stub_dir"' EXIT
for _ in $(seq 1 100); do
	[[ -s "$stub_dir/port" ]] && break
	sleep 0.1
done
[[ -s "$stub_dir/port" ]] || {
	echo "in-node: the API stub did not start" >&2
	exit 1
}
KUBE_API=http://127.0.0.1:$(<"$stub_dir/port")
export KUBE_API
echo "in-node: containerd config $RSANDBOX_INSTALLER_CONFIG, API stub $KUBE_API, new $RSANDBOX_INSTALLER_NEW, old $RSANDBOX_INSTALLER_OLD" >&2
rc=0
# a binary that runs no case fails; RSANDBOX_EXPECT_GATES (hack/installer/test.sh) makes a test
# that would skip here fail
# shellcheck source=hack/lib/tally.sh
. "$here/../lib/tally.sh"
run_tallied "installer.rs" "$exe" "$@" --test-threads=1 --nocapture || rc=$?
echo "in-node: requests the API stub saw:" >&2
cat "$RSANDBOX_INSTALLER_KUBE_STATE.log" >&2 2>/dev/null || true
# whatever test made the request: the token was never on an argv while it was served
if grep -q 'token-seen=[1-9]' "$RSANDBOX_INSTALLER_KUBE_STATE.log" 2>/dev/null; then
	echo "in-node: FAILED: the API stub saw the token on a process's argv (token-seen above)" >&2
	rc=1
fi
exit "$rc"
