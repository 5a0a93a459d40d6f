#!/bin/bash
# hack/node/images.sh - rsandbox-node-images.service (see hack/node/units.sh): imports the
# bench's OCI tarballs ($RSANDBOX_PREFIX/images, built by hack/setup.sh) into the node's fresh
# containerd, in every namespace the bench uses, all at once (the node's boot waits for them).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
[[ -f "$IMG_DIR/busybox.oci.tar" && -f "$IMG_DIR/pause.oci.tar" ]] ||
	die "no image tarballs in $IMG_DIR: hack/setup.sh first"
snap=$(snapshotter)
pids=()
for ns in "${NAMESPACES[@]}"; do
	for tar in busybox pause; do
		ctr_ -n "$ns" images import --snapshotter "$snap" "$IMG_DIR/$tar.oci.tar" >/dev/null &
		pids+=($!)
	done
done
for p in "${pids[@]}"; do wait "$p"; done
for ns in "${NAMESPACES[@]}"; do
	have=$(ctr_ -n "$ns" images ls -q)
	for img in "$BUSYBOX_IMAGE" "$PAUSE_IMAGE"; do
		grep -qxF "$img" <<<"$have" || die "import of $img into $ns failed"
	done
done
