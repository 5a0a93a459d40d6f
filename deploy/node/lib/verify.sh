# shellcheck shell=bash
# deploy/node/lib/verify.sh - before the Node is labelled, one real pod through the handler:
# RunPodSandbox on $HANDLER, CreateContainer + StartContainer of one container, its status
# read until it runs (or ran to exit status 0), then StopContainer, RemoveContainer,
# StopPodSandbox, RemovePodSandbox. CRI answering Status with the handler only proves the
# config loaded; this proves the shim starts a sandbox and a container on this node.
#
# The requests are built as the kubelet builds them (pkg/kubelet/kuberuntime:
# generatePodSandboxConfig, generateContainerConfig), minus what belongs to a kubelet's pod
# (its QoS cgroup parent, which only the kubelet creates and removes: containerd's default is
# used; mounts of volumes): metadata, hostname, log directory, DNS (verify_dns_config), the
# io.kubernetes.* labels, the pod network with the container's own PID namespace, the image resolved to its
# ID first (the kubelet's EnsureImageExists: ImageStatus, PullImage when absent), a
# BestEffort container's resources, the default masked and read-only /proc paths.
# Field numbers: k8s.io/cri-api runtime/v1 api.proto (as vendored by containerd 2.1.9).

VERIFY_NAME=rsandbox-node-verify
VERIFY_NAMESPACE=rsandbox-system

# protobuf encoding, as hex: a varint; a tag with a varint; a length-delimited field
pb_varint() {
	local n=$1 out=""
	while ((n >= 128)); do
		out+=$(printf '%02x' $(((n & 127) | 128)))
		n=$((n >> 7))
	done
	printf '%s%02x' "$out" "$n"
}
pb_uint() { pb_varint $(($1 << 3)); pb_varint "$2"; }          # FIELD VALUE (varint)
pb_bytes() { pb_varint $((($1 << 3) | 2)); pb_varint $((${#2} / 2)); printf '%s' "$2"; } # FIELD HEX
pb_str() { pb_bytes "$1" "$(printf '%s' "$2" | od -An -v -tx1 | tr -d ' \n')"; } # FIELD STRING
pb_map() { # FIELD KEY VALUE: one entry of a map<string,string>
	pb_bytes "$1" "$(pb_str 1 "$2")$(pb_str 2 "$3")"
}

# the kubelet's NamespaceOption for an ordinary pod: network POD (0, the default: not sent),
# pid CONTAINER (1), ipc POD (0)
verify_namespaces() { pb_uint 2 1; }

# verify_dns_config: DNSConfig (servers = 1, searches = 2, options = 3) from this process's
# /etc/resolv.conf, parsed as the kubelet parses a resolv.conf (pkg/kubelet/network/dns/dns.go,
# parseResolvConf: comments cut, every `nameserver`'s address, the last `search` line's
# domains without a trailing dot, every `options` word). In the DaemonSet's container that file
# is the one the kubelet wrote for this pod (dnsPolicy ClusterFirst: the cluster's DNS
# service, the namespace's search list, ndots:5), so the shim gets a DNSConfig as the kubelet
# builds it for a pod of that namespace; run on the host, the host's (dnsPolicy Default).
# Empty when the file is missing: then the field is not sent. VERIFY_RESOLV_CONF: another file
# (a test's).
verify_dns_config() {
	local line servers=() searches=() options=() w
	local conf=${VERIFY_RESOLV_CONF:-/etc/resolv.conf}
	[[ -r "$conf" ]] || return 0
	while IFS= read -r line || [[ -n "$line" ]]; do
		line=${line%%[#;]*}
		# shellcheck disable=SC2086 # split on blanks, as strings.Fields does
		set -- $line
		(($# >= 1)) || continue
		case $1 in
		nameserver) (($# >= 2)) && servers+=("$2") ;;
		search)
			searches=()
			shift
			for w in "$@"; do [[ "$w" == . ]] || searches+=("${w%.}"); done
			;;
		options)
			shift
			options+=("$@")
			;;
		esac
	done <"$conf"
	for w in "${servers[@]}"; do pb_str 1 "$w"; done
	for w in "${searches[@]}"; do pb_str 2 "$w"; done
	for w in "${options[@]}"; do pb_str 3 "$w"; done
}

# verify_sandbox_config UID LOG_DIR: PodSandboxConfig
verify_sandbox_config() {
	local uid=$1 logdir=$2
	pb_bytes 1 "$(pb_str 1 "$VERIFY_NAME")$(pb_str 2 "$uid")$(pb_str 3 "$VERIFY_NAMESPACE")"
	pb_str 2 "$VERIFY_NAME"
	pb_str 3 "$logdir"
	local dns
	dns=$(verify_dns_config)
	[[ -z "$dns" ]] || pb_bytes 4 "$dns"
	pb_map 6 io.kubernetes.pod.name "$VERIFY_NAME"
	pb_map 6 io.kubernetes.pod.namespace "$VERIFY_NAMESPACE"
	pb_map 6 io.kubernetes.pod.uid "$uid"
	pb_map 7 kubernetes.io/config.source api
	# linux: security_context { namespace_options }
	pb_bytes 8 "$(pb_bytes 2 "$(pb_bytes 1 "$(verify_namespaces)")")"
}

# verify_container_config UID IMAGE_ID IMAGE_REF: ContainerConfig
verify_container_config() {
	local uid=$1 image_id=$2 ref=$3 p sc=""
	pb_bytes 1 "$(pb_str 1 verify)" # attempt 0: not sent (proto3)
	pb_bytes 2 "$(pb_str 1 "$image_id")$(pb_str 18 "$ref")"
	pb_map 9 io.kubernetes.container.name verify
	pb_map 9 io.kubernetes.pod.name "$VERIFY_NAME"
	pb_map 9 io.kubernetes.pod.namespace "$VERIFY_NAMESPACE"
	pb_map 9 io.kubernetes.pod.uid "$uid"
	pb_str 11 verify/0.log
	# linux: resources of a BestEffort container (cpu_period 100000, cpu_shares 2,
	# oom_score_adj 1000), security_context (namespace_options, the kubelet's default
	# masked and read-only paths)
	sc+=$(pb_bytes 3 "$(verify_namespaces)")
	for p in /proc/asound /proc/acpi /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list \
		/proc/timer_stats /proc/sched_debug /proc/scsi /sys/firmware /sys/devices/virtual/powercap; do
		sc+=$(pb_str 13 "$p")
	done
	for p in /proc/bus /proc/fs /proc/irq /proc/sys /proc/sysrq-trigger; do
		sc+=$(pb_str 14 "$p")
	done
	pb_bytes 15 "$(pb_bytes 1 "$(pb_uint 1 100000)$(pb_uint 3 2)$(pb_uint 5 1000)")$(pb_bytes 2 "$sc")"
}

# verify_image_default: the sandbox image containerd pins (the kubelet's nodes have it; it
# runs /pause until stopped), from the loaded config
verify_image_default() {
	local dump img
	dump=$(mktemp)
	config_dump "$dump" || true
	img=$(awk '/^[ \t]*\[/ { p = ($0 ~ /pinned_images\]$/) ; next } p && $1 == "sandbox" { sub(/^[^=]*=[ \t]*/, ""); gsub(/["'\'' ]/, ""); print; exit }' "$dump")
	rm -f "$dump" "$dump.err"
	echo "${img:-registry.k8s.io/pause:3.10}"
}

# verify_image_id REF: the image's ID (ImageStatus), pulled first when absent
verify_image_id() {
	local ref=$1 msg id
	msg=$(mktemp)
	cri_call_image ImageStatus "$(pb_bytes 1 "$(pb_str 1 "$ref")")" "$msg" || {
		rm -f "$msg"
		return 1
	}
	id=$(proto_fields "$msg" 1 | sed -n 's/^1\[1\]\.1 //p')
	if [[ -z "$id" ]]; then
		log "verification image $ref is not on the node: pulling it (PullImage, as the kubelet would)"
		cri_call_image PullImage "$(pb_bytes 1 "$(pb_str 1 "$ref")")" "$msg" || {
			rm -f "$msg"
			return 1
		}
		cri_call_image ImageStatus "$(pb_bytes 1 "$(pb_str 1 "$ref")")" "$msg" || {
			rm -f "$msg"
			return 1
		}
		id=$(proto_fields "$msg" 1 | sed -n 's/^1\[1\]\.1 //p')
	fi
	rm -f "$msg"
	[[ -n "$id" ]] || return 1
	echo "$id"
}

# verify_handler IMAGE: the pod and its container, run and removed; non-zero (the failed
# step logged) when either does not run. Whatever was created is removed on the way out.
verify_handler() {
	local ref=$1 uid logdir msg sbx="" ctr="" image_id state exit_code end rc=0 why=""
	uid=$(cat /proc/sys/kernel/random/uuid)
	logdir=$STATE_DIR/verify/$uid
	# the kubelet makes the pod's log directory and each container's in it
	mkdir -p "$(hp "$logdir/verify")"
	msg=$(mktemp)
	local sandbox_config
	sandbox_config=$(verify_sandbox_config "$uid" "$logdir")
	if ! image_id=$(verify_image_id "$ref"); then
		why="the image $ref is not on the node and could not be pulled"
	elif ! cri_call RunPodSandbox "$(pb_bytes 1 "$sandbox_config")$(pb_str 2 "$HANDLER")" "$msg"; then
		why="RunPodSandbox on the $HANDLER handler failed"
	else
		sbx=$(proto_fields "$msg" | sed -n 's/^1 //p')
		log "verification pod sandbox $sbx runs on the $HANDLER handler"
		if ! cri_call CreateContainer "$(pb_str 1 "$sbx")$(pb_bytes 2 "$(verify_container_config "$uid" "$image_id" "$ref")")$(pb_bytes 3 "$sandbox_config")" "$msg"; then
			why="CreateContainer ($ref) in the verification pod failed"
		else
			ctr=$(proto_fields "$msg" | sed -n 's/^1 //p')
			if ! cri_call StartContainer "$(pb_str 1 "$ctr")" "$msg"; then
				why="StartContainer of the verification container failed"
			else
				# RUNNING (1), or EXITED (2) with exit status 0; CREATED (0) is not sent
				end=$(deadline_in 30)
				while :; do
					state="" exit_code=0
					if cri_call ContainerStatus "$(pb_str 1 "$ctr")" "$msg"; then
						state=$(proto_fields "$msg" 1 | sed -n 's/^1\[1\]\.3 //p')
						exit_code=$(proto_fields "$msg" 1 | sed -n 's/^1\[1\]\.7 //p')
					fi
					[[ "$state" == 1 || ("$state" == 2 && "${exit_code:-0}" == 0) ]] && break
					if [[ "$state" == 2 ]]; then
						why="the verification container exited with status $exit_code"
						break
					fi
					before "$end" || {
						why="the verification container did not start running within 30s (state ${state:-0})"
						break
					}
					sleep 0.5
				done
				[[ -z "$why" ]] && log "verification container $ctr ran on the $HANDLER handler (state $state)"
			fi
		fi
	fi
	if [[ -n "$ctr" ]]; then
		cri_call StopContainer "$(pb_str 1 "$ctr")$(pb_uint 2 10)" "$msg" &&
			cri_call RemoveContainer "$(pb_str 1 "$ctr")" "$msg" || rc=1
	fi
	if [[ -n "$sbx" ]]; then
		cri_call StopPodSandbox "$(pb_str 1 "$sbx")" "$msg" &&
			cri_call RemovePodSandbox "$(pb_str 1 "$sbx")" "$msg" || rc=1
	fi
	rm -f "$msg"
	rm -rf "$(hp "$logdir")"
	rmdir "$(hp "$STATE_DIR/verify")" 2>/dev/null || true
	if [[ -n "$why" ]]; then
		echo "$why"
		return 1
	fi
	((rc == 0)) || log "warning: the verification pod's removal failed (CRI above): containerd's or the kubelet's GC takes it"
	log "verification pod removed"
}
