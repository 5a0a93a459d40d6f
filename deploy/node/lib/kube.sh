# shellcheck shell=bash
# deploy/node/lib/kube.sh - the Node object: wait for its status.runtimeHandlers, set and
# remove the installer's labels. The DaemonSet's service account may patch Nodes only as its
# ValidatingAdmissionPolicy lets it (its own Node, labels under rsandbox.io/ only).
#
# Where the API is: KUBE_API (e.g. a test's stub, http allowed), else the in-cluster
# service (KUBERNETES_SERVICE_HOST/PORT, the service account's token and CA). With neither,
# labelling is skipped with a log line: everything else still runs (the CI node has no API
# server).

SA_DIR=${SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
# shellcheck disable=SC2034 # read by rsandbox-node.sh
LABEL_PREFIX=rsandbox.io

kube_api() { # the API's base URL, empty when none is configured
	if [[ -n "${KUBE_API:-}" ]]; then
		echo "${KUBE_API%/}"
	elif [[ -n "${KUBERNETES_SERVICE_HOST:-}" ]]; then
		local host=$KUBERNETES_SERVICE_HOST
		[[ "$host" == *:* ]] && host="[$host]"
		echo "https://$host:${KUBERNETES_SERVICE_PORT:-443}"
	fi
}

# kube_request METHOD PATH BODY_JSON OUT_FILE: one request; OUT_FILE gets the response body,
# stdout the HTTP status (000 when there was no answer). The body goes as a JSON merge patch
# with PATCH, as JSON otherwise (POST, PUT).
kube_request() {
	local method=$1 path=$2 body=$3 out=$4 url args=() token config=""
	url=$(kube_api)
	# the token is read at each call (the kubelet rotates the projected token), never put on
	# an argv: /proc/<pid>/cmdline is readable by every local user and every hostPID pod. It
	# reaches curl as a config (`--config -`) on its standard input: a here-string is written
	# by bash itself (no process of its own) into a pipe, or a 0600 file bash unlinks at once
	if [[ -r "$SA_DIR/token" ]]; then
		token=$(<"$SA_DIR/token")
		[[ "$token" != *[$'\n\r"\\']* ]] || fail "read the token" "$SA_DIR/token holds a newline, quote or backslash"
		config="header = \"Authorization: Bearer $token\""
	fi
	[[ -r "$SA_DIR/ca.crt" && "$url" == https:* ]] && args+=(--cacert "$SA_DIR/ca.crt")
	if [[ -n "$body" ]]; then
		if [[ "$method" == PATCH ]]; then
			args+=(-H 'Content-Type: application/merge-patch+json')
		else
			args+=(-H 'Content-Type: application/json')
		fi
		args+=(--data-binary "$body")
	fi
	local code
	code=$(curl --config - --silent --show-error --max-time 20 -o "$out" -w '%{http_code}' -X "$method" \
		-H 'Accept: application/json' "${args[@]}" "$url$path" <<<"$config") || code=000
	echo "$code"
}

# kube METHOD PATH [BODY_JSON]: one request; prints the response body, fails on a non-2xx
kube() {
	local out code
	out=$(mktemp)
	code=$(kube_request "$1" "$2" "${3:-}" "$out")
	if [[ "$code" != 2?? ]]; then
		log "Kubernetes API $1 $2: HTTP $code $(jq -r '.message? // empty' "$out" 2>/dev/null | head -c 300)"
		rm -f "$out"
		return 1
	fi
	cat "$out"
	rm -f "$out"
}

kube_configured() {
	[[ -n "$(kube_api)" ]] && return 0
	log "no Kubernetes API configured (KUBERNETES_SERVICE_HOST and KUBE_API unset): the Node is not labelled"
	return 1
}

# wait_node_handler: until the kubelet reports the handler in the Node's
# status.runtimeHandlers (Kubernetes >= 1.30; older API servers have no such field: skipped)
wait_node_handler() {
	local end node
	end=$(deadline_in "$WAIT_SECONDS")
	while :; do
		node=$(kube GET "/api/v1/nodes/$NODE_NAME") || fail "wait for the Node" "cannot read Node $NODE_NAME"
		if [[ "$(jq '.status | has("runtimeHandlers")' <<<"$node")" != true ]]; then
			log "Node $NODE_NAME has no status.runtimeHandlers (Kubernetes < 1.30): not waiting for it"
			return 0
		fi
		jq -e --arg h "$HANDLER" '.status.runtimeHandlers | any(.name == $h)' <<<"$node" >/dev/null && {
			log "Node $NODE_NAME reports the $HANDLER runtime handler"
			return 0
		}
		before "$end" || fail "wait for the Node" "the kubelet did not report the $HANDLER handler in Node $NODE_NAME's status.runtimeHandlers within ${WAIT_SECONDS}s"
		sleep 2
	done
}

# label_node JSON_LABELS: merge-patch the Node's labels (null removes one), only when the
# Node's labels differ from them. The Node is read first: a re-run whose labels are already
# there, or an uninstall on a Node that carries none of them, sends no PATCH, so neither needs
# the label grant (deploy/kubernetes/node-labels). The uninstall's case matters most: without
# the read, an uninstall pod on a node the grant never reached (or after the grant was
# deleted) failed at "unlabel the Node" with HTTP 403 and restarted for ever, although there
# was nothing to remove.
label_node() {
	local node out code
	node=$(kube GET "/api/v1/nodes/$NODE_NAME") || fail "label the Node" "cannot read Node $NODE_NAME"
	if jq -e --argjson want "$1" \
		'(.metadata.labels // {}) as $have | $want | to_entries | all(.value == $have[.key])' <<<"$node" >/dev/null; then
		log "Node $NODE_NAME labels already as wanted: $1"
		return 0
	fi
	out=$(mktemp)
	code=$(kube_request PATCH "/api/v1/nodes/$NODE_NAME" "{\"metadata\":{\"labels\":$1}}" "$out")
	if [[ "$code" == 403 ]]; then
		log "Kubernetes API PATCH /api/v1/nodes/$NODE_NAME: HTTP 403 $(jq -r '.message? // empty' "$out" 2>/dev/null | head -c 300)"
		rm -f "$out"
		fail "label the Node" "PATCH of Node $NODE_NAME's labels refused (HTTP 403): the installer may change them only once deploy/kubernetes/node-labels is applied (and until every node is uninstalled)"
	fi
	if [[ "$code" != 2?? ]]; then
		log "Kubernetes API PATCH /api/v1/nodes/$NODE_NAME: HTTP $code $(jq -r '.message? // empty' "$out" 2>/dev/null | head -c 300)"
		rm -f "$out"
		fail "label the Node" "PATCH of Node $NODE_NAME's labels failed"
	fi
	rm -f "$out"
	log "Node $NODE_NAME labels: $1"
}
