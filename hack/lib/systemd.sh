# shellcheck shell=bash
# hack/lib/systemd.sh - systemd and dbus for the systemd guest (hack/guest.sh --systemd) and the
# systemd node (hack/node.sh) on a machine that lacks them: their packages extracted with
# dpkg-deb into a layer the guest or node copies into its own root. Never installed here,
# never started here.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

# systemd_layer DIR: prints DIR/systemd-layer, the layer holding systemd and dbus (and what they
# need), extracted when missing; nothing when this machine has them.
systemd_layer() {
	local layer=$1/systemd-layer dl=$1/debs-systemd pkgs d
	[[ -x /lib/systemd/systemd && -x /usr/bin/dbus-daemon && -x /usr/bin/busctl ]] && return 0
	if [[ ! -f "$layer/.complete" ]]; then
		# what installing them would add: apt's simulation (nothing is installed)
		pkgs=$(apt-get -s -q install --no-install-recommends systemd dbus | awk '/^Inst / { print $2 }')
		[[ -n "$pkgs" ]] || die "systemd layer: /lib/systemd/systemd is missing, but apt would install nothing"
		log "systemd layer: extracting $(echo "$pkgs" | tr '\n' ' ')into $layer (not installed)"
		rm -rf "$layer" "$dl"
		mkdir -p "$layer" "$dl"
		# shellcheck disable=SC2086 # one package per word
		(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download $pkgs)
		for d in "$dl"/*.deb; do dpkg-deb -x "$d" "$layer"; done
		touch "$layer/.complete"
	fi
	echo "$layer"
}
