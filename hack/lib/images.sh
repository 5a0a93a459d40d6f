# shellcheck shell=bash
# hack/lib/images.sh - the bench's local OCI images (no registry is reached):
# localhost/busybox:latest from Debian's busybox-static plus hack/images/pgrep
# and ipcs, localhost/pause:3.10 from hack/images/pause.c; built reproducibly
# and imported into every namespace.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

write_pause_c() { # path: the static pause's source
	cp "$RSANDBOX_REPO/hack/images/pause.c" "$1"
}

# Debian's busybox-static has no pgrep/ipcs applets; critest's stock busybox
# image has them, so the image carries two small stand-ins.
write_busybox_helpers() { # rootfs
	install -m 0755 "$RSANDBOX_REPO/hack/images/pgrep" "$RSANDBOX_REPO/hack/images/ipcs" "$1/bin/"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# oci_archive NAME ROOTFS OUT.tar ENTRYPOINT_JSON CMD_JSON
# Writes an OCI image layout tarball with one gzip layer, reproducibly (fixed
# owners and mtimes), so a rebuild gives the same digests.
oci_archive() { # name rootfs out entrypoint cmd [user]
	local name=$1 rootfs=$2 out=$3 entrypoint=$4 cmd=$5 user=${6:-}
	local w arch layer_tar diff_id layer_gz layer_digest cfg cfg_digest man man_digest
	arch=$(dpkg --print-architecture)
	w=$(mktemp -d "$P/tmp/oci.XXXXXX")
	mkdir -p "$w/layout/blobs/sha256"
	layer_tar=$w/layer.tar
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
		-C "$rootfs" -cf "$layer_tar" .
	diff_id=$(sha256_of "$layer_tar")
	gzip -n -9 -c "$layer_tar" >"$w/layer.tar.gz"
	layer_digest=$(sha256_of "$w/layer.tar.gz")
	mv "$w/layer.tar.gz" "$w/layout/blobs/sha256/$layer_digest"
	layer_gz=$w/layout/blobs/sha256/$layer_digest

	cfg=$w/config.json
	printf '%s' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
\"config\":{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\
\"Entrypoint\":$entrypoint,\"Cmd\":$cmd,\"WorkingDir\":\"/\"${user:+,\"User\":\"$user\"}},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$diff_id\"]},\
\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"rsandbox hack/setup.sh\"}]}" >"$cfg"
	cfg_digest=$(sha256_of "$cfg")

	man=$w/manifest.json
	printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$cfg_digest\",\"size\":$(size_of "$cfg")},\
\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer_digest\",\"size\":$(size_of "$layer_gz")}]}" >"$man"
	man_digest=$(sha256_of "$man")
	mv "$cfg" "$w/layout/blobs/sha256/$cfg_digest"
	printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\
\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$man_digest\",\"size\":$(size_of "$man"),\
\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"},\
\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}]}" >"$w/layout/index.json"
	mv "$man" "$w/layout/blobs/sha256/$man_digest"
	printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$w/layout/oci-layout"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
		-C "$w/layout" -cf "$out.part" oci-layout index.json blobs
	mv "$out.part" "$out"
	rm -rf "$w"
	log "built $name -> $out (manifest sha256:$man_digest)"
}

base_rootfs() { # dir: the skeleton both images share
	local r=$1
	mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,dev,proc,sys,root,var,run,tmp,home}
	chmod 1777 "$r/tmp"
	chmod 0700 "$r/root"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
	: >"$r/etc/hosts"
	: >"$r/etc/resolv.conf"
}

build_images() {
	local b=$P/tmp/build bb applet
	bb=$(busybox_bin)
	[[ -n "$bb" ]] || die "no busybox under $P/busybox: run hack/setup.sh"
	mkdir -p "$IMG_DIR" "$P/src" "$P/tmp"
	rm -rf "$b"
	mkdir -p "$b"

	# busybox: like the stock busybox image, every applet is a hard link in
	# /bin (a symlink would let a masked path such as /bin/ls mask busybox itself)
	base_rootfs "$b/busybox"
	cp "$bb" "$b/busybox/bin/busybox"
	for applet in $("$bb" --list); do
		[[ -e "$b/busybox/bin/$applet" ]] || ln "$b/busybox/bin/busybox" "$b/busybox/bin/$applet"
	done
	write_busybox_helpers "$b/busybox"
	oci_archive "$BUSYBOX_IMAGE" "$b/busybox" "$IMG_DIR/busybox.oci.tar" '["/bin/sh"]' 'null'

	# pause: one static binary (fallback: busybox sleeping in a loop), run as 65535:65535 like
	# registry.k8s.io/pause (its Dockerfile's USER), so the runc path's pause container is the
	# one a real node runs (the isolation tests compare what a container reaches through it)
	mkdir -p "$b/pause"
	write_pause_c "$P/src/pause.c"
	if gcc -static -Os -s -o "$b/pause/pause" "$P/src/pause.c" 2>"$P/tmp/pause-gcc.log"; then
		oci_archive "$PAUSE_IMAGE" "$b/pause" "$IMG_DIR/pause.oci.tar" '["/pause"]' 'null' 65535:65535
	else
		log "warning: static gcc build failed ($(head -n1 "$P/tmp/pause-gcc.log")), pause = busybox sleep loop"
		base_rootfs "$b/pause"
		cp "$bb" "$b/pause/bin/busybox"
		ln -sf /bin/busybox "$b/pause/bin/sh"
		ln -sf /bin/busybox "$b/pause/bin/sleep"
		oci_archive "$PAUSE_IMAGE" "$b/pause" "$IMG_DIR/pause.oci.tar" \
			'["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]' 'null' 65535:65535
	fi
	rm -rf "$b"
	echo "$IMAGES_RECIPE" >"$IMG_DIR/recipe"
}

# Bumped whenever build_images makes different images: a bench with older ones rebuilds and
# re-imports them.
IMAGES_RECIPE=2

ensure_images() { # build the tarballs if missing or stale, import what a namespace lacks
	local ns snap have img rebuilt=0
	if [[ ! -f "$IMG_DIR/busybox.oci.tar" || ! -f "$IMG_DIR/pause.oci.tar" || "${RSANDBOX_REFRESH:-0}" == 1 ||
		"$(cat "$IMG_DIR/recipe" 2>/dev/null)" != "$IMAGES_RECIPE" ]]; then
		with_heartbeat "building the images (busybox, pause)" build_images
		rebuilt=1
	fi
	snap=$(snapshotter)
	for ns in "${NAMESPACES[@]}"; do
		have=$(ctr_ -n "$ns" images ls -q)
		for img in busybox:"$BUSYBOX_IMAGE" pause:"$PAUSE_IMAGE"; do
			((rebuilt)) || ! grep -qxF "${img#*:}" <<<"$have" || continue
			log "importing ${img#*:} into namespace $ns"
			ctr_ -n "$ns" images import --snapshotter "$snap" "$IMG_DIR/${img%%:*}.oci.tar" >/dev/null
		done
		have=$(ctr_ -n "$ns" images ls -q)
		for img in "$BUSYBOX_IMAGE" "$PAUSE_IMAGE"; do
			grep -qxF "$img" <<<"$have" || die "import of $img into $ns failed"
		done
	done
}
