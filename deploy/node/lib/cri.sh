# shellcheck shell=bash
# deploy/node/lib/cri.sh - two CRI calls on containerd's socket, as the kubelet makes them:
# Status (which runtime handlers containerd serves: `runtime_handlers`, what the kubelet
# copies into the Node's status.runtimeHandlers) and ListPodSandbox (which pods run on which
# handler). gRPC is HTTP/2 with a 5-byte frame header; curl speaks it over the unix socket,
# and the answer is read by a small protobuf reader (proto_fields) that knows only the
# fields below, so no CRI client (crictl is not packaged by Debian) and no protoc is needed.
#
# Fields read (k8s.io/cri-api runtime/v1 api.proto, as vendored by containerd 2.1.9):
#   StatusResponse.runtime_handlers = 3 (RuntimeHandler: name = 1)
#   ListPodSandboxResponse.items = 1 (PodSandbox: id = 1, metadata = 2, state = 3,
#     runtime_handler = 7; PodSandboxMetadata: name = 1, uid = 2, namespace = 3)

# cri_call METHOD REQUEST_HEX OUT_FILE: one unary call (of runtime.v1.RuntimeService, or of
# $CRI_SERVICE); OUT_FILE gets the response message
# (frame header removed). Non-zero when containerd is not there or answers an error.
cri_call() {
	local method=$1 req_hex=$2 out=$3 tmp rc=0 status
	tmp=$(mktemp -d)
	# frame: compressed flag 0, 4-byte big-endian length, the message
	# shellcheck disable=SC2059 # the format is the bytes, as \xHH escapes
	printf "$(printf '%02x%08x%s' 0 $((${#req_hex} / 2)) "$req_hex" | sed 's/../\\x&/g')" >"$tmp/req"
	curl --silent --show-error --max-time 20 --http2-prior-knowledge \
		--unix-socket "$(hp "$CONTAINERD_SOCKET")" \
		-H 'content-type: application/grpc' -H 'te: trailers' \
		--data-binary @"$tmp/req" -D "$tmp/headers" -o "$tmp/body" \
		"http://localhost/runtime.v1.${CRI_SERVICE:-RuntimeService}/$method" 2>"$tmp/err" || rc=$?
	if ((rc == 0)); then
		status=$(tr -d '\r' <"$tmp/headers" | sed -n 's/^grpc-status: *//p' | tail -n1)
		if [[ "$status" != 0 ]]; then
			log "CRI $method: grpc-status ${status:-missing}: $(tr -d '\r' <"$tmp/headers" | sed -n 's/^grpc-message: *//p' | tail -n1)"
			rc=1
		else
			tail -c +6 "$tmp/body" >"$out"
		fi
	else
		log "CRI $method on $CONTAINERD_SOCKET: $(head -c 300 "$tmp/err")"
	fi
	rm -rf "$tmp"
	return "$rc"
}

# cri_call_image METHOD REQUEST_HEX OUT_FILE: cri_call on runtime.v1.ImageService
cri_call_image() { CRI_SERVICE=ImageService cri_call "$@"; }

# proto_fields MESSAGE_FILE SUBMESSAGE_PATH...: prints one line per scalar field,
# "<path> <value>": path is the field numbers from the top, dot-separated, with the index
# of each repeated submessage (e.g. `3[1].1 rsandbox`); a length-delimited field is read as
# a submessage when its path (without indexes) is listed, as a string otherwise (bytes other
# than printable ASCII as \ooo, so a value stays on its line); varints in decimal. Only the wire types CRI uses here (varint, 64-bit, length-delimited, 32-bit).
proto_fields() {
	local file=$1
	shift
	od -An -v -tu1 "$file" | awk -v msgs=" $* " '
	function varint(   v, m, b) {
		v = 0; m = 1
		do { b = B[P++]; v += (b % 128) * m; m *= 128 } while (b >= 128)
		return v
	}
	function walk(end, path, plain,   key, f, wt, len, fend, fp, s, i, n, str) {
		while (P < end) {
			key = varint(); f = int(key / 8); wt = key % 8
			fp = (path == "" ? f : path "." f); s = (plain == "" ? f : plain "." f)
			if (wt == 0) { print fp, varint() }
			else if (wt == 1) { P += 8 }
			else if (wt == 5) { P += 4 }
			else if (wt == 2) {
				len = varint(); fend = P + len
				if (index(msgs, " " s " ")) {
					n = ++COUNT[path "|" f]
					walk(fend, fp "[" n "]", s)
				} else {
					str = ""
					for (i = P; i < fend; i++)
						str = str (B[i] >= 32 && B[i] < 127 && B[i] != 92 ? sprintf("%c", B[i]) : sprintf("\\%03o", B[i]))
					print fp, str
				}
				P = fend
			} else { print "error unsupported-wire-type", wt; exit 1 }
		}
	}
	{ for (i = 1; i <= NF; i++) B[N++] = $i }
	END { P = 0; walk(N, "", "") }'
}

# runtime_handlers_in STATUS_RESPONSE_FILE: the handler names in it (one a line; the default
# handler has no name and is left out)
runtime_handlers_in() {
	proto_fields "$1" 3 | sed -n 's/^3\[[0-9]*\]\.1 //p'
}

# pods_on_handler_in LIST_POD_SANDBOX_RESPONSE_FILE HANDLER: "<id> <namespace>/<name> <state>"
# of each pod sandbox on HANDLER (state 0 = READY, 1 = NOTREADY), one a line
pods_on_handler_in() {
	proto_fields "$1" 1 1.2 | awk -v h="$2" '
	{ split($1, p, "."); item = p[1]; field = substr($1, length(item) + 2); $1 = ""; v = substr($0, 2) }
	field == "1" { id[item] = v }
	field ~ /^2\[1\]\.1$/ { name[item] = v }
	field ~ /^2\[1\]\.3$/ { ns[item] = v }
	field == "3" { state[item] = v }
	field == "7" { handler[item] = v }
	END { for (i in id) if (handler[i] == h) print id[i], ns[i] "/" name[i], (state[i] == "" ? 0 : state[i]) }'
}

# cri_runtime_handlers: the handler names containerd's CRI reports now
cri_runtime_handlers() {
	local msg rc=0
	msg=$(mktemp)
	cri_call Status "" "$msg" || rc=$?
	((rc == 0)) && runtime_handlers_in "$msg"
	rm -f "$msg"
	return "$rc"
}

# cri_pods_on_handler HANDLER: the pod sandboxes (any state) CRI knows on HANDLER now
cri_pods_on_handler() {
	local msg rc=0
	msg=$(mktemp)
	cri_call ListPodSandbox "" "$msg" || rc=$?
	((rc == 0)) && pods_on_handler_in "$msg" "$1"
	rm -f "$msg"
	return "$rc"
}
