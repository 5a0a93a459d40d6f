# shellcheck shell=bash
# deploy/node/lib/events.sh - Kubernetes Events on the Node (core/v1), so that a platform team
# sees the installer's install, upgrade, refusal and rollback in `kubectl describe node` and
# `kubectl get events`. Made as the kubelet makes its Node events: involvedObject
# {kind: Node, name, uid: the node's name} (kubectl describe node looks the Node's events up
# by that uid), in the namespace "default": an Event without eventTime whose involvedObject is
# cluster-scoped is valid only there (the API server's ValidateEvent: "does not match
# event.namespace" otherwise). The RBAC grants `create` on events in "default" only.
# An Event is a report: one that cannot be posted is logged and never fails the run.

EVENT_COMPONENT=rsandbox-node-installer

# node_event TYPE(Normal|Warning) REASON MESSAGE
node_event() {
	local type=$1 reason=$2 msg=$3 now body
	[[ -n "$(kube_api)" && -n "${NODE_NAME:-}" ]] || return 0
	now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	body=$(jq -nc --arg node "$NODE_NAME" --arg type "$type" --arg reason "$reason" \
		--arg msg "${msg:0:1000}" --arg now "$now" --arg comp "$EVENT_COMPONENT" '{
		apiVersion: "v1", kind: "Event",
		metadata: {generateName: ($node + "."), namespace: "default"},
		involvedObject: {apiVersion: "v1", kind: "Node", name: $node, uid: $node},
		type: $type, reason: $reason, message: $msg,
		source: {component: $comp, host: $node},
		firstTimestamp: $now, lastTimestamp: $now, count: 1,
		reportingComponent: $comp, reportingInstance: $node}')
	if kube POST /api/v1/namespaces/default/events "$body" >/dev/null; then
		log "Event on Node $NODE_NAME: $type $reason"
	else
		log "warning: the Event $reason on Node $NODE_NAME could not be posted"
	fi
}
