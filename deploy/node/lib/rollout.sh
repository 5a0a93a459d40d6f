# shellcheck shell=bash
# deploy/node/lib/rollout.sh - the pacing and the safety net of a containerd restart:
#
# Restart slots. A containerd restart makes every pod of the node briefly unmanageable (no
# exec, no new pod), so a fleet's installers restart it a few nodes at a time, also on the
# first `kubectl apply`, when every node's pod starts at once. A slot is a
# coordination.k8s.io/v1 Lease named rsandbox-node-restart-<i> (i < RESTART_SLOTS) in the
# installer's namespace: taken (holderIdentity: the node's name) before the restart, given
# back (holderIdentity removed) once the node is verified or rolled back. Taking one is a
# create (409 AlreadyExists: someone else was quicker) or an update carrying the
# resourceVersion that was read (409 Conflict: idem): the API server lets exactly one
# installer win. A lease whose holder is gone (renewTime + leaseDurationSeconds in the past)
# is taken over; one of this node's own (a run killed while holding it) is taken again.
#
# Rollback. A restart after which containerd is not active and serving CRI with the handler
# within --wait seconds is rolled back: this run's config changes undone, containerd
# restarted once more. Each rollback is counted in $STATE_DIR/rollbacks for what was being
# installed (the drop-in's text and the binary: a new release is a new target); once
# --max-rollbacks is reached for a target, the installer no longer restarts containerd for
# it, so a pod in a crash loop cannot restart the node's containerd again and again. Remove
# the file (or ship a new release) to try again.

LEASE_PREFIX=rsandbox-node-restart-
SLOT_HELD=

lease_namespace() {
	if [[ -n "${POD_NAMESPACE:-}" ]]; then
		echo "$POD_NAMESPACE"
	elif [[ -r "$SA_DIR/namespace" ]]; then
		cat "$SA_DIR/namespace"
	fi
}

now_micro() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }

# try_slot NAMESPACE NAME: 0 when this node now holds the lease NAME
try_slot() {
	local ns=$1 name=$2 path out code holder renew dur expired=0 body now
	path=/apis/coordination.k8s.io/v1/namespaces/$ns/leases
	out=$(mktemp)
	now=$(now_micro)
	code=$(kube_request GET "$path/$name" "" "$out")
	case "$code" in
	404)
		body=$(jq -nc --arg ns "$ns" --arg name "$name" --arg node "$NODE_NAME" --arg now "$now" \
			--argjson dur "$LEASE_SECONDS" '{apiVersion: "coordination.k8s.io/v1", kind: "Lease",
			metadata: {name: $name, namespace: $ns, labels: {"app.kubernetes.io/name": "rsandbox-node-installer"}},
			spec: {holderIdentity: $node, leaseDurationSeconds: $dur, acquireTime: $now, renewTime: $now, leaseTransitions: 0}}')
		code=$(kube_request POST "$path" "$body" "$out")
		;;
	200)
		holder=$(jq -r '.spec.holderIdentity // ""' "$out")
		renew=$(jq -r '.spec.renewTime // .spec.acquireTime // ""' "$out")
		dur=$(jq -r '.spec.leaseDurationSeconds // 0' "$out")
		if [[ -n "$holder" && "$holder" != "$NODE_NAME" ]]; then
			if [[ -n "$renew" ]] && (($(date -d "$renew" +%s 2>/dev/null || echo 0) + dur < $(date +%s))); then
				expired=1
			else
				rm -f "$out"
				echo "held by $holder"
				return 1
			fi
		fi
		# the object as read (its resourceVersion: the update is refused with 409 if anyone
		# changed it since), the holder and times set
		body=$(jq -c --arg node "$NODE_NAME" --arg now "$now" --argjson dur "$LEASE_SECONDS" '
			(if (.spec.holderIdentity // "") != $node then .spec.leaseTransitions = ((.spec.leaseTransitions // 0) + 1) else . end)
			| .spec.holderIdentity = $node | .spec.leaseDurationSeconds = $dur
			| .spec.acquireTime = $now | .spec.renewTime = $now' "$out")
		code=$(kube_request PUT "$path/$name" "$body" "$out")
		((expired)) && [[ "$code" == 200 ]] && log "restart slot $name: taken over from $holder (its lease expired at $renew + ${dur}s)"
		;;
	esac
	if [[ "$code" == 200 || "$code" == 201 ]]; then
		rm -f "$out"
		return 0
	fi
	if [[ "$code" == 409 ]]; then
		echo "taken by another node meanwhile"
	else
		echo "HTTP $code $(jq -r '.message? // empty' "$out" 2>/dev/null | head -c 200)"
	fi
	rm -f "$out"
	return 1
}

# acquire_restart_slot: waits (without a limit: the holders' leases expire) until this node
# holds one of the RESTART_SLOTS leases; nothing to do without an API or with 0 slots
acquire_restart_slot() {
	local ns i why last_log=-1000 name
	if ((RESTART_SLOTS == 0)); then
		log "restart slots off (--restart-slots 0): containerd restarted without pacing"
		return 0
	fi
	if [[ -z "$(kube_api)" ]]; then
		log "no Kubernetes API: containerd restarted without a restart slot"
		return 0
	fi
	[[ -n "$NODE_NAME" ]] || fail "take a restart slot" "no node name (--node-name or NODE_NAME)"
	ns=$(lease_namespace)
	[[ -n "$ns" ]] || fail "take a restart slot" "no namespace for the leases (POD_NAMESPACE, or $SA_DIR/namespace)"
	while :; do
		for ((i = 0; i < RESTART_SLOTS; i++)); do
			name=$LEASE_PREFIX$i
			if why=$(try_slot "$ns" "$name"); then
				SLOT_HELD=$ns/$name
				trap release_restart_slot EXIT
				log "restart slot $ns/$name taken (leases of ${LEASE_SECONDS}s; ${RESTART_SLOTS} slot(s) in all)"
				return 0
			fi
		done
		if ((SECONDS - last_log >= 30)); then
			log "waiting for a restart slot (${RESTART_SLOTS} in $ns; $LEASE_PREFIX$((RESTART_SLOTS - 1)): $why)"
			last_log=$SECONDS
		fi
		sleep $((3 + RANDOM % 5))
	done
}

# release_restart_slot: gives the held lease back (its holder removed); a failure is logged,
# the lease then expires on its own
release_restart_slot() {
	local ns=${SLOT_HELD%%/*} name=${SLOT_HELD#*/} path out code body
	[[ -n "$SLOT_HELD" ]] || return 0
	SLOT_HELD=
	path=/apis/coordination.k8s.io/v1/namespaces/$ns/leases/$name
	out=$(mktemp)
	code=$(kube_request GET "$path" "" "$out")
	if [[ "$code" == 200 && "$(jq -r '.spec.holderIdentity // ""' "$out")" == "$NODE_NAME" ]]; then
		body=$(jq -c 'del(.spec.holderIdentity) | .spec.leaseDurationSeconds = 1' "$out")
		code=$(kube_request PUT "$path" "$body" "$out")
	fi
	if [[ "$code" == 200 ]]; then
		log "restart slot $ns/$name given back"
	else
		log "warning: restart slot $ns/$name not given back (HTTP $code): it expires after ${LEASE_SECONDS}s"
	fi
	rm -f "$out"
}

# rollback_target DROPIN_TEXT_FILE: what this run installs (a new release or a new drop-in
# is another target, with its own count)
rollback_target() {
	cat "$1" "$BINARY" | sha256sum | cut -d' ' -f1
}

rollbacks_of() { # TARGET: how often a restart for it was rolled back
	local n
	n=$(awk -v t="$1" '$1 == t { print $2 }' "$(hp "$STATE_DIR")/rollbacks" 2>/dev/null)
	echo "${n:-0}"
}

count_rollback() { # TARGET: one more
	local f n
	f=$(hp "$STATE_DIR")/rollbacks
	n=$(($(rollbacks_of "$1") + 1))
	mkdir -p "$(dirname "$f")"
	{
		grep -v "^$1 " "$f" 2>/dev/null || true
		echo "$1 $n"
	} >"$f.new"
	mv -f "$f.new" "$f"
	echo "$n"
}

forget_rollbacks() { rm -f "$(hp "$STATE_DIR")/rollbacks"; }

# containerd_healthy WANT(present|absent|any): the unit active (a new MainPID since
# OLD_PID) and CRI answering Status with the handler as wanted, within WAIT_SECONDS; prints
# why not
containerd_healthy() {
	local want=$1 old_pid=$2 end state pid handlers cri
	end=$(deadline_in "$WAIT_SECONDS")
	while :; do
		state=$(systemctl_ is-active "$CONTAINERD_UNIT" 2>/dev/null) || true
		pid=$(containerd_main_pid)
		cri="does not answer"
		if [[ "$state" == active && -n "$pid" && "$pid" != "$old_pid" ]] &&
			handlers=$(cri_runtime_handlers 2>/dev/null); then
			cri="reports the handlers: ${handlers//$'\n'/ }"
			case "$want" in
			present) grep -xF "$HANDLER" <<<"$handlers" >/dev/null && return 0 ;;
			absent) grep -xF "$HANDLER" <<<"$handlers" >/dev/null || return 0 ;;
			*) return 0 ;;
			esac
		fi
		# failed: systemd gave up on this start (the failed state of an earlier one was
		# reset before the restart; a unit with Restart= shows activating between tries)
		if [[ "$state" == failed ]]; then
			echo "$CONTAINERD_UNIT failed to start (see: journalctl -u $CONTAINERD_UNIT)"
			return 1
		fi
		before "$end" || {
			echo "$CONTAINERD_UNIT is ${state:-unknown} (MainPID ${pid:-none}) and CRI $cri, ${WAIT_SECONDS}s after the restart"
			return 1
		}
		sleep 1
	done
}

# restart_for WANT: a restart that does not wait on systemd's job (a containerd that hangs in
# its start would hold `systemctl restart` for the unit's whole start timeout), judged by
# containerd_healthy; prints why it failed
restart_for() {
	local old_pid
	old_pid=$(containerd_main_pid)
	log "restarting $CONTAINERD_UNIT (MainPID ${old_pid:-none})"
	# a unit that hit systemd's start limit would refuse the restart
	systemctl_ reset-failed "$CONTAINERD_UNIT" 2>/dev/null || true
	systemctl_ restart --no-block "$CONTAINERD_UNIT" || {
		echo "systemctl restart $CONTAINERD_UNIT failed"
		return 1
	}
	containerd_healthy "$1" "$old_pid" || return 1
	log "$CONTAINERD_UNIT restarted (MainPID $(containerd_main_pid)) and serving CRI"
}
