#!/usr/bin/env bash
# hack/installer/label-check.sh - the installer's Node labels (deploy/node/lib/kube.sh's
# label_node) against the API stub (kube-stub.py), no node needed:
# - with the label grant (PATCH allowed): install's labels are set, a re-run sends no second
#   PATCH, the uninstall's nulls remove them;
# - without it (the stub answers every PATCH 403, as RBAC does before deploy/kubernetes/
#   node-labels is applied or after it is deleted): an uninstall on a Node that carries none
#   of the labels, and a re-run whose labels are all there, succeed without a PATCH; an
#   uninstall on a Node that still carries them fails, naming the 403 and the grant.
# Exit status 1 on the first wrong answer.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$here/../../deploy/node/lib
# shellcheck source=deploy/node/lib/common.sh
. "$lib/common.sh"
# shellcheck source=deploy/node/lib/kube.sh
. "$lib/kube.sh"

d=$(mktemp -d)
trap 'kill $stubs 2>/dev/null || true; rm -rf "$d"' EXIT
SA_DIR=$d/sa
mkdir -p "$SA_DIR"

# shellcheck source=hack/installer/check-lib.sh
. "$here/check-lib.sh"
patches() { grep -c '^PATCH ' "$d/$1.log" || true; }
installed='{"rsandbox.io/installed":"true","rsandbox.io/shim-version":"0.2.0","rsandbox.io/containerd-hostnetwork-crash":"true"}'
removed='{"rsandbox.io/installed":null,"rsandbox.io/shim-version":null,"rsandbox.io/containerd-hostnetwork-crash":null}'
run() { (label_node "$1") 2>"$d/err" && echo 0 || echo $?; }

# with the grant
NODE_NAME=granted
start_stub "$d" granted
expect "install labels the Node" "$(run "$installed")" 0
expect "the Node's labels" "$(jq -c '[to_entries[] | select(.key | startswith("rsandbox.io/"))] | from_entries' "$d/granted")" \
	'{"rsandbox.io/installed":"true","rsandbox.io/shim-version":"0.2.0","rsandbox.io/containerd-hostnetwork-crash":"true"}'
expect "one PATCH" "$(patches granted)" 1
expect "a re-run with the same labels" "$(run "$installed")" 0
expect "sends no second PATCH" "$(patches granted)" 1
expect "uninstall unlabels" "$(run "$removed")" 0
expect "no rsandbox.io label left" "$(jq -c '[keys[] | select(startswith("rsandbox.io/"))]' "$d/granted")" '[]'

# without the grant, a Node that carries none of the labels: the uninstall has nothing to do
NODE_NAME=ungranted
start_stub "$d" ungranted --forbid-patch
expect "uninstall on an unlabelled Node without the grant succeeds" "$(run "$removed")" 0
expect "and sends no PATCH" "$(patches ungranted)" 0

# without the grant, a Node already labelled as the install wants (a re-run)
NODE_NAME=relabel
start_stub "$d" relabel --forbid-patch --labels "rsandbox.io/installed=true,rsandbox.io/shim-version=0.2.0,rsandbox.io/containerd-hostnetwork-crash=true"
expect "a re-run without the grant, labels already there, succeeds" "$(run "$installed")" 0
expect "and sends no PATCH" "$(patches relabel)" 0

# without the grant, a Node still labelled: the uninstall fails and says why
NODE_NAME=stuck
start_stub "$d" stuck --forbid-patch --labels "rsandbox.io/installed=true"
expect "uninstall on a labelled Node without the grant fails" "$(run "$removed")" 1
said() { if grep -F "$1" "$d/err" >/dev/null; then echo yes; else echo no; fi; }
expect "naming the 403" "$(said 'refused (HTTP 403)')" yes
expect "and the grant to apply" "$(said 'deploy/kubernetes/node-labels')" yes
expect "the label is still there" "$(jq -r '."rsandbox.io/installed"' "$d/stuck")" true

((fails == 0)) || exit 1
echo "Node labels: all answers right"
