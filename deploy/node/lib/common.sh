# shellcheck shell=bash
# deploy/node/lib/common.sh - logging, the host's paths and commands, atomic file writes.
# Sourced by deploy/node/rsandbox-node.sh; defines only.

log() { printf '[rsandbox-node] %s\n' "$*" >&2; }
# fail STEP MESSAGE: the step that failed and why; exit status 1
fail() {
	log "error: $1: ${*:2}"
	exit 1
}
# refuse MESSAGE: a preflight verdict the installer will not install over; exit status 3,
# nothing on the node changed
refuse() {
	log "refused: $*"
	# an Event on the Node when lib/events.sh is loaded (the installer; not a lib's own test)
	if declare -F node_event >/dev/null; then node_event Warning Refused "$*"; fi
	exit 3
}

# hp PATH: where a path of the host's file system is for this process. On the host itself
# HOST_ROOT is empty; in the DaemonSet's container the host paths it mounts are under
# HOST_ROOT (/host), each at its own path (docs/install.md lists them). Paths written into containerd's config and compared with /proc/<pid>/exe are
# always the host's own (without HOST_ROOT).
hp() { printf '%s%s' "$HOST_ROOT" "$1"; }

# host_run CMD...: runs a host binary on the host's terms (its file system, libraries and
# configuration): directly on the host, through HOST_EXEC from the DaemonSet's container
# (`containerd-shim-rsandbox-v1 unit run ... --`: a transient service of systemd's, over
# D-Bus; its output and exit status passed back). Used for containerd, readlink, test and
# the staged binary's `check`.
host_run() {
	# HOST_EXEC is a command prefix, split on blanks on purpose
	# shellcheck disable=SC2086
	$HOST_EXEC "$@"
}

# write_if_changed CONTENT_FILE TARGET MODE: 0 when TARGET was written (it was missing or
# different), 1 when it already had these bytes. The new bytes go to a temporary file in
# TARGET's directory, then rename(2) replaces TARGET: a reader (containerd, a running shim
# that maps the file) sees the old file or the new one, never a truncated one.
write_if_changed() {
	local src=$1 dst=$2 mode=$3 tmp
	if [[ -f "$dst" ]] && cmp -s "$src" "$dst"; then
		return 1
	fi
	mkdir -p "$(dirname "$dst")"
	tmp=$(mktemp "$(dirname "$dst")/.$(basename "$dst").rsandbox-new.XXXXXX")
	if ! { cat "$src" >"$tmp" && chmod "$mode" "$tmp" && sync "$tmp" && mv -f "$tmp" "$dst"; }; then
		rm -f "$tmp"
		fail "write $dst" "could not write the new file"
	fi
	return 0
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# deadline helpers: waits end at a deadline only to catch a hang (a containerd that never
# comes back), never to judge speed
deadline_in() { echo $((SECONDS + $1)); }
before() { ((SECONDS < $1)); }
