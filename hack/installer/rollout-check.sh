#!/usr/bin/env bash
# hack/installer/rollout-check.sh - the installer's restart slots and Events
# (deploy/node/lib/rollout.sh, lib/events.sh) against the API stub (kube-stub.py), no node
# needed: two slots taken by two nodes, a third node waits and gets one once it is given
# back; an expired lease taken over; a stale resourceVersion refused (409) and not taken; the
# rollback count per target; a Node Event in "default" as the API server accepts it.
# Exit status 1 on the first wrong answer.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$here/../../deploy/node/lib
# shellcheck source=deploy/node/lib/common.sh
. "$lib/common.sh"
# shellcheck source=deploy/node/lib/kube.sh
. "$lib/kube.sh"
# shellcheck source=deploy/node/lib/events.sh
. "$lib/events.sh"
# shellcheck source=deploy/node/lib/rollout.sh
. "$lib/rollout.sh"

d=$(mktemp -d)
# shellcheck source=hack/installer/check-lib.sh
. "$here/check-lib.sh"
trap 'kill $stubs 2>/dev/null || true; rm -rf "$d"' EXIT
start_stub "$d" node-a
SA_DIR=$d/sa
mkdir -p "$SA_DIR"
echo rsandbox-system >"$SA_DIR/namespace"
RESTART_SLOTS=2 LEASE_SECONDS=600 HOST_ROOT="" STATE_DIR=$d/statedir BINARY=$d/bin
echo binary >"$BINARY"

holder() { jq -r --arg k "rsandbox-system/$LEASE_PREFIX$1" '.[$k].spec.holderIdentity // "none"' "$d/node-a.leases"; }
path=/apis/coordination.k8s.io/v1/namespaces/rsandbox-system/leases

# node-a and node-b take the two slots (in subshells: each its own SLOT_HELD and EXIT trap)
(NODE_NAME="node-a" && acquire_restart_slot && trap - EXIT)
expect "node-a holds slot 0" "$(holder 0)" node-a
(NODE_NAME="node-b" && acquire_restart_slot && trap - EXIT)
expect "node-b holds slot 1" "$(holder 1)" node-b
# node-c waits: both are held and fresh
(NODE_NAME="node-c" && timeout 6 bash -c "$(declare -f); $(declare -p LEASE_PREFIX RESTART_SLOTS LEASE_SECONDS SA_DIR NODE_NAME KUBE_API); acquire_restart_slot" 2>"$d/c.err") && rc=0 || rc=$?
expect "node-c still waits after 6 s (both slots held)" "$rc" 124
said() { if grep "$1" "$2" >/dev/null; then echo yes; else echo no; fi; }
expect "node-c says it waits" "$(said 'waiting for a restart slot' "$d/c.err")" yes
# node-a gives its slot back: node-c gets it
(NODE_NAME="node-a" && SLOT_HELD=rsandbox-system/${LEASE_PREFIX}0 && release_restart_slot)
expect "slot 0 free after node-a gave it back" "$(holder 0)" none
(NODE_NAME="node-c" && acquire_restart_slot && trap - EXIT)
expect "node-c took slot 0" "$(holder 0)" node-c

# an expired lease (its holder gone) is taken over; leaseTransitions counts it
out=$d/lease.json
kube_request GET "$path/${LEASE_PREFIX}1" "" "$out" >/dev/null
jq -c '.spec.renewTime = "2020-01-01T00:00:00.000000Z" | .spec.leaseDurationSeconds = 10' "$out" >"$d/old.json"
expect "a test's update with the current resourceVersion" "$(kube_request PUT "$path/${LEASE_PREFIX}1" "$(<"$d/old.json")" "$out")" 200
(NODE_NAME="node-d" && acquire_restart_slot && trap - EXIT) 2>"$d/d.err"
expect "node-d took over node-b's expired slot 1" "$(holder 1)" node-d
expect "node-d says whose it took" "$(said 'taken over from node-b' "$d/d.err")" yes
expect "leaseTransitions counts the takeover" "$(jq -r --arg k "rsandbox-system/${LEASE_PREFIX}1" '.[$k].spec.leaseTransitions' "$d/node-a.leases")" 1

# a stale resourceVersion: 409, nothing changed
expect "an update with a stale resourceVersion: 409" "$(kube_request PUT "$path/${LEASE_PREFIX}1" "$(<"$d/old.json")" "$out")" 409
expect "the stale update changed nothing" "$(holder 1)" node-d
# a second create of a taken name: 409
expect "a second create: 409" "$(kube_request POST "$path" "$(jq -c 'del(.metadata.resourceVersion)' "$d/old.json")" "$out")" 409

# a node's own lease (a run killed while holding it) is taken again at once
(NODE_NAME="node-c" && acquire_restart_slot && trap - EXIT)
expect "node-c takes its own slot 0 again" "$(holder 0)" node-c

# the rollback count, per target
printf 'dropin\n' >"$d/text"
t=$(rollback_target "$d/text")
expect "no rollback yet" "$(rollbacks_of "$t")" 0
count_rollback "$t" >/dev/null
expect "one rollback" "$(count_rollback "$t")" 2
echo other >"$BINARY"
expect "another binary: another target, its own count" "$(rollbacks_of "$(rollback_target "$d/text")")" 0
forget_rollbacks
echo binary >"$BINARY"
expect "forgotten" "$(rollbacks_of "$t")" 0

# an Event on the Node, in "default", as the kubelet makes them
NODE_NAME="node-a" node_event Warning RolledBack "containerd did not come back" 2>/dev/null
expect "one Event" "$(wc -l <"$d/node-a.events")" 1
expect "the Event's namespace, object, reason" \
	"$(jq -r '[.metadata.namespace, .involvedObject.kind, .involvedObject.name, .involvedObject.uid, .type, .reason] | join(" ")' "$d/node-a.events")" \
	"default Node node-a node-a Warning RolledBack"
# the stub refuses one outside "default", as the API server does
expect "an Event about a Node in rsandbox-system: 422" \
	"$(kube_request POST /api/v1/namespaces/rsandbox-system/events "$(head -n1 "$d/node-a.events" | jq -c '.metadata = {generateName: "x.", namespace: "rsandbox-system"}')" "$out")" 422

((fails == 0)) || exit 1
echo "restart slots and Events: all answers right"
