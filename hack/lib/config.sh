# shellcheck shell=bash
# The templates' placeholders are variables that only render reads:
# shellcheck disable=SC2034
# hack/lib/config.sh - the bench's configuration: containerd's config, the shim's config
# (shim-owned networking), the CNI conflists (rendered from hack/templates/),
# the registry stub, and the snapshotter and OOM settings this host allows.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

overlay_works() { # mount an overlay on the same filesystem as the snapshotter root
	local t rc=0
	mkdir -p "$P/var"
	t=$(mktemp -d "$P/var/ovl-check.XXXXXX")
	mkdir -p "$t/l" "$t/u" "$t/w" "$t/m"
	echo x >"$t/l/f"
	if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
		[[ "$(cat "$t/m/f" 2>/dev/null)" = x ]] || rc=1
		umount "$t/m" || rc=1
	else
		rc=1
	fi
	rm -rf "$t"
	return "$rc"
}

snapshotter() {
	if [[ -n "${RSANDBOX_SNAPSHOTTER:-}" ]]; then
		echo "$RSANDBOX_SNAPSHOTTER"
	elif [[ -s "$CONF_DIR/snapshotter" ]]; then
		cat "$CONF_DIR/snapshotter"
	elif overlay_works; then
		echo overlayfs
	else
		echo native
	fi
}

has_cap_sys_resource() { # CAP_SYS_RESOURCE (bit 24) in our effective set
	local eff
	eff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
	(((16#$eff >> 24) & 1))
}

replace_if_changed() { # new-file target: 0 when target changed
	if [[ -f "$2" ]] && cmp -s "$1" "$2"; then
		rm -f "$1"
		return 1
	fi
	mv -f "$1" "$2"
}

# render TEMPLATE: prints hack/templates/TEMPLATE with each @NAME@ replaced by
# the value of the shell variable NAME (a global of hack/lib.sh or a local of
# the caller); a placeholder that names no variable is an error. Values go in
# as they are (paths, names, subnets: nothing to escape).
render() {
	local _file=$RSANDBOX_REPO/hack/templates/$1 _text _name
	[[ -f "$_file" ]] || die "no template $_file"
	IFS= read -r -d '' _text <"$_file" || true
	for _name in $(grep -o '@[A-Za-z_][A-Za-z0-9_]*@' "$_file" | tr -d @ | sort -u); do
		[[ -v "$_name" ]] || die "$_file: @$_name@ names no variable"
		# quoted: no glob in the pattern, no & (patsub_replacement) in the value
		_text=${_text//"@$_name@"/"${!_name}"}
	done
	printf '%s' "$_text"
}

# containerd_config SYSTEMD_CGROUP: prints containerd's config; SYSTEMD_CGROUP (true|false) is
# the runc handler's SystemdCgroup option: false on this machine, true in the systemd guest
# (hack/guest.sh --systemd), as on a node whose kubelet uses the systemd cgroup driver
containerd_config() {
	# the template's own placeholders, besides the globals of hack/lib.sh
	local SNAPSHOTTER RUNC_BIN RESTRICT_OOM_SCORE_ADJ RUNC_SYSTEMD_CGROUP=$1
	SNAPSHOTTER=$(snapshotter)
	RESTRICT_OOM_SCORE_ADJ=false
	has_cap_sys_resource || RESTRICT_OOM_SCORE_ADJ=true
	RUNC_BIN=$BIN/runc # the symlink of select_runc (hack/lib/runc.sh)
	render containerd.toml.in
}

# cgroup_writable_runtimes: CRI handlers to append to containerd_config's output on a cgroup v2
# host (the v2 guest): `runc-cgw` and `rsandbox-cgw`, each the same as `runc` and `rsandbox` plus
# containerd's `cgroup_writable = true` (a runtime's option of its own in containerd 2.1, beside
# runtime_type, not in its options table): a non-privileged container then gets a private cgroup
# namespace with a writable /sys/fs/cgroup, the shape docker:dind and systemd-as-init pods run
# in (issue 33, integration/tests/cgroupv2.rs). A pair of their own, not the option on `runc` and
# `rsandbox`: every other test keeps the read-only /sys/fs/cgroup a default node gives. Never on
# this (v1) host: containerd refuses to start with `cgroup_writable` on cgroup v1.
cgroup_writable_runtimes() {
	cat <<EOT

      # issue 33: the dind shape (hack/lib/config.sh, cgroup_writable_runtimes)
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc-cgw]
        runtime_type = 'io.containerd.runc.v2'
        sandboxer = 'podsandbox'
        cgroup_writable = true

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc-cgw.options]
          BinaryName = '$BIN/runc'
          Root = '$RUNC_ROOT'
          SystemdCgroup = false

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox-cgw]
        runtime_type = '$SHIM_RUNTIME'
        sandboxer = 'shim'
        cgroup_writable = true
EOT
}

config() { # writes the containerd config, the shim's config, the CNI conflists; 0 when something changed
	# the templates' own placeholders, besides the globals of hack/lib.sh
	local SNAPSHOTTER NET_NAME NET_BRIDGE NET_SUBNET changed=1
	SNAPSHOTTER=$(snapshotter)
	mkdir -p "$CONF_DIR" "$CNI_CONF_DIR" "$IPAM_DIR" "$P/opt" "$P/tmp" "$P/log" "$P/run" "$CONF_DIR/certs.d/_default"
	echo "$SNAPSHOTTER" >"$CONF_DIR/snapshotter"
	printf '%s\n' '# rsandbox bench: no registry is reached; images are built by hack/setup.sh' \
		'server = "http://127.0.0.1:1"' >"$CONF_DIR/certs.d/_default/hosts.toml"
	containerd_config false >"$CONFIG.tmp"
	replace_if_changed "$CONFIG.tmp" "$CONFIG" && changed=0
	# The shim's own config: pods created without a netns (containerd's sandbox
	# controller API) get a netns and CNI from the shim, on their own bridge and
	# subnet. standalone_tasks stays off (ctr run behaves as with runc); tests
	# that need it rewrite this file for the shims they start.
	render rsandbox.toml.in >"$SHIM_CONFIG.tmp"
	replace_if_changed "$SHIM_CONFIG.tmp" "$SHIM_CONFIG" && changed=0
	mkdir -p "$SHIM_CNI_CONF_DIR"
	NET_NAME=$SHIM_CNI_NET NET_BRIDGE=$RSANDBOX_SHIM_BRIDGE NET_SUBNET=$RSANDBOX_SHIM_SUBNET
	render bridge.conflist.in >"$SHIM_CNI_CONF_DIR/.10-$SHIM_CNI_NET.conflist.tmp"
	replace_if_changed "$SHIM_CNI_CONF_DIR/.10-$SHIM_CNI_NET.conflist.tmp" "$SHIM_CNI_CONF_DIR/10-$SHIM_CNI_NET.conflist" && changed=0
	# Pods reach each other and the host (the bridge address) only: ipMasq
	# false and no default route, so nothing is routed off this machine.
	# Written to a dot-file and renamed: containerd watches this dir and would
	# read a half-written file.
	NET_NAME=$CNI_NET NET_BRIDGE=$RSANDBOX_BRIDGE NET_SUBNET=$RSANDBOX_SUBNET
	render bridge.conflist.in >"$CNI_CONF_DIR/.10-$CNI_NET.conflist.tmp"
	replace_if_changed "$CNI_CONF_DIR/.10-$CNI_NET.conflist.tmp" "$CNI_CONF_DIR/10-$CNI_NET.conflist" && changed=0
	if ((changed == 0)); then
		log "config written: $CONFIG, $CNI_CONF_DIR/10-$CNI_NET.conflist (snapshotter $SNAPSHOTTER, restrict_oom_score_adj $(has_cap_sys_resource && echo false || echo true))"
	else
		log "config unchanged: $CONFIG"
	fi
	return "$changed"
}
