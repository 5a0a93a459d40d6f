#!/usr/bin/env bash
# hack/fresh-prefix.sh - empties the bench prefix ($RSANDBOX_PREFIX, /opt/rsandbox) so the
# next hack/setup.sh starts as on a new machine, and refreshes the host's package lists
# (.ci/run calls it first). Stops the bench's containerd and its shims, removes what they
# left (hack/containerd.sh's reset), unmounts anything still mounted below the prefix, then
# removes it without crossing into another file system.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root

if [[ -d "$P" ]]; then
	log "fresh prefix: removing $P (a new machine has none)"
	stop || true
	findmnt -rn -o TARGET | awk -v p="$P/" 'index($0, p) == 1' | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
	done
	old=$P.old.$$
	mv "$P" "$old"
	rm -rf --one-file-system "$old" || log "warning: $old could not be removed whole"
fi
log "refreshing the host's package lists (apt-get update)"
apt-get update -q >/dev/null || log "warning: apt-get update failed; using the lists there are"
