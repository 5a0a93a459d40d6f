# shellcheck shell=bash
# hack/installer/check-lib.sh - what the installer's no-node checks share (rollout-check.sh,
# label-check.sh, distro-check.sh, fixtures/check.sh): one way to judge an answer and count the
# wrong ones, and the API stub started for a Node. Sourced; defines only.

fails=0
# expect WHAT GOT WANT: "ok: WHAT", or the difference on stderr and one more in $fails
expect() {
	if [[ "$2" == "$3" ]]; then
		echo "ok: $1"
	else
		printf 'FAILED: %s\n  got:  %q\n  want: %q\n' "$1" "$2" "$3" >&2
		fails=$((fails + 1))
	fi
}

# start_stub DIR NODE [STUB ARGS...]: kube-stub.py for Node NODE in the background, its state
# DIR/NODE (labels; .log, .leases, .events beside it); exports KUBE_API once it listens and
# adds its pid to $stubs (the caller's EXIT trap kills them)
stubs=
start_stub() {
	local dir=$1 node=$2
	shift 2
	python3 "$(dirname "${BASH_SOURCE[0]}")/kube-stub.py" "$node" "$dir/$node" "$dir/$node.port" "$@" &
	stubs="$stubs $!"
	for _ in $(seq 1 100); do
		[[ -s "$dir/$node.port" ]] && break
		sleep 0.1
	done
	KUBE_API=http://127.0.0.1:$(<"$dir/$node.port")
	export KUBE_API
}
