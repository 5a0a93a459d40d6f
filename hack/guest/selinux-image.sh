# shellcheck shell=bash
# hack/guest/selinux-image.sh - what the SELinux guest (hack/guest.sh --selinux) boots from,
# built on this machine without installing anything into its /. Sourced by hack/guest.sh (its
# $G, $KVER, log, die, busybox_bin, module_closure, test_binary, built_shim in scope).
#
# - Debian's SELinux packages (bookworm: selinux-policy-default/-dev/-src 2:2.20221101,
#   policycoreutils, semodule-utils, checkpolicy, m4, libsemanage-common), fetched with
#   `apt-get download` and extracted with dpkg-deb into $G/selinux/tools (the libraries they
#   need, libselinux1/libsepol2/libsemanage2, are the host's own);
# - refpolicy's `container` and `docker` modules, which the default policy does not ship, built
#   from selinux-policy-src's .te/.fc with selinux-policy-dev's Makefile (docker.fc labels
#   /usr/bin/containerd dockerd_exec_t: containerd runs in dockerd_t, an engine domain of
#   container.te's template); hack/guest/selinux/harness.cil (initrc_t permissive, dockerd_t
#   enforced with the one rule runc needs that refpolicy lacks);
# - the policy: every module of selinux-policy-default (its .pp turned into CIL with the
#   package's own hll/pp) plus those, linked by `semodule -p ROOT -n` into a private root
#   ($G/selinux/policyroot: policy.33, file_contexts, lxc_contexts);
# - the root: an ext4 image (`mkfs.ext4 -d`) of a staging tree labelled with `setfiles -r`
#   against that file_contexts: busybox (and /usr/sbin/init, a copy: init_exec_t), the bench's
#   containerd, ctr and runc shim, runc 1.1 (/usr/sbin/runc), the CNI plugins bridge,
#   host-local and loopback, the shim built by hack/build.sh, the probe binary
#   (integration/tests/selinux.rs), setfiles, the shared libraries they load, the test images' OCI
#   tarballs, the bridge and veth modules, the guest's scripts and config
#   (hack/guest/selinux/). Cached by the content of all of it: $G/selinux/root-<hash>.ext4.

SEL_DEBS="selinux-policy-default selinux-policy-dev selinux-policy-src policycoreutils semodule-utils checkpolicy m4 libsemanage-common"

selinux_tools() { # the packages, extracted: $G/selinux/tools
	local sd=$G/selinux d
	if [[ -f "$sd/tools.ok" && "$(cat "$sd/tools.ok")" == "$SEL_DEBS" ]]; then
		return 0
	fi
	log "SELinux guest: downloading $SEL_DEBS (extracted only)"
	rm -rf "$sd/debs" "$sd/tools" "$sd/tools.ok"
	mkdir -p "$sd/debs" "$sd/tools"
	# shellcheck disable=SC2086
	(cd "$sd/debs" && apt-get -q -o APT::Sandbox::User=root download $SEL_DEBS >/dev/null)
	for d in "$sd"/debs/*.deb; do dpkg-deb -x "$d" "$sd/tools"; done
	echo "$SEL_DEBS" >"$sd/tools.ok"
}

selinux_policy() { # the default policy + container, docker, harness: $G/selinux/policyroot
	local sd=$G/selinux t=$G/selinux/tools r=$G/selinux/policyroot key f n
	key=$( (ls "$sd/debs"; cat "$RSANDBOX_REPO/hack/guest/selinux/harness.cil") | sha256sum | cut -c1-16)
	if [[ -s "$r/etc/selinux/default/policy/policy.33" && "$(cat "$sd/policy.key" 2>/dev/null)" == "$key" ]]; then
		return 0
	fi
	log "SELinux guest: building the policy (default + container + docker modules)"
	rm -rf "$sd/mod" "$sd/src" "$sd/cil" "$r" "$sd/policy.key"
	mkdir -p "$sd/mod" "$sd/src" "$sd/cil" "$r/etc/selinux" "$r/var/lib/selinux"
	tar -C "$sd/src" -xf "$t/usr/src/selinux-policy-src.tar.zst"
	cp "$sd"/src/selinux-policy-src/policy/modules/services/{container,docker}.{te,fc} "$sd/mod/"
	# the .if are in selinux-policy-dev's headers already
	(cd "$sd/mod" && PATH=$t/usr/bin:$PATH make -s -f "$t/usr/share/selinux/devel/Makefile" \
		HEADERDIR="$t/usr/share/selinux/devel/include" SHAREDIR="$t/usr/share/selinux" AWK=awk NAME=default \
		BINDIR="$t/usr/bin" SBINDIR="$t/usr/sbin" container.pp docker.pp >"$sd/mod/make.log" 2>&1) ||
		die "SELinux guest: building container.pp/docker.pp failed: $(tail -n 20 "$sd/mod/make.log")"
	# CIL from each .pp with the package's converter (libsemanage would look for it in /usr/libexec)
	for f in "$t"/usr/share/selinux/default/*.pp.bz2; do
		n=$(basename "$f" .pp.bz2)
		bzip2 -dc "$f" | "$t/usr/libexec/selinux/hll/pp" >"$sd/cil/$n.cil" || die "pp $n failed"
	done
	for n in container docker; do
		"$t/usr/libexec/selinux/hll/pp" <"$sd/mod/$n.pp" >"$sd/cil/$n.cil" || die "pp $n failed"
	done
	cp "$RSANDBOX_REPO/hack/guest/selinux/harness.cil" "$sd/cil/rsandbox_harness.cil"
	cp -a "$t/etc/selinux/default" "$r/etc/selinux/"
	printf 'SELINUX=enforcing\nSELINUXTYPE=default\n' >"$r/etc/selinux/config"
	{
		cat "$t/etc/selinux/semanage.conf"
		printf '[setfiles]\npath = %s\nargs = -q -c $@ $<\n[end]\n' "$t/sbin/setfiles"
		printf '[sefcontext_compile]\npath = /bin/true\nargs = $@\n[end]\n'
	} >"$r/etc/selinux/semanage.conf"
	(cd "$sd/cil" && "$t/usr/sbin/semodule" -p "$r" -s default -n -i base.cil $(ls ./*.cil | grep -v '^./base.cil$')) \
		>"$sd/semodule.log" 2>&1 || die "SELinux guest: semodule failed: $(tail -n 20 "$sd/semodule.log")"
	[[ -s "$r/etc/selinux/default/policy/policy.33" ]] || die "SELinux guest: semodule wrote no policy.33"
	echo "$key" >"$sd/policy.key"
}

# selinux_copy_libs STAGE FILE...: the shared libraries FILE... load, into STAGE (same paths
# below usr/: / is usr-merged there)
selinux_copy_libs() {
	local st=$1 f l
	shift
	for f in "$@"; do
		file -L "$f" | grep -q 'dynamically linked' || continue
		for l in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
			l=$(realpath -s "$l")
			mkdir -p "$st/usr$(dirname "${l#/usr}")"
			[[ -e "$st/usr${l#/usr}" ]] || cp -L "$l" "$st/usr${l#/usr}"
		done
	done
}

selinux_image() { # prints the path of the labelled root image, building it if its inputs changed
	local sd=$G/selinux r=$G/selinux/policyroot st img key inputs exe shim m mods kdir bb a size runc
	selinux_tools
	selinux_policy
	exe=$(test_binary selinux)
	shim=$(built_shim)
	[[ -x "$shim" ]] || shim=$BIN/$SHIM_NAME
	[[ -x "$shim" ]] || die "the shim is not built: hack/build.sh first"
	bb=$(busybox_bin)
	kdir=$G/kernel/lib/modules/$KVER
	mods=$(module_closure "$kdir" bridge veth) || die "kernel $KVER: cannot resolve bridge, veth"
	# runc 1.1, the host's, whichever runc the bench has selected: sid's 1.3 needs sid's libc,
	# which the image does not carry
	runc=$(runc_path_for 1.1)
	inputs=("$bb" "$BIN/containerd" "$BIN/ctr" "$BIN/containerd-shim-runc-v2" "$runc"
		"$P/usr/lib/cni/bridge" "$P/usr/lib/cni/host-local" "$P/usr/lib/cni/loopback" "$shim" "$exe"
		"$P/images/busybox.oci.tar" "$P/images/pause.oci.tar" "$r/etc/selinux/default/policy/policy.33"
		"$RSANDBOX_REPO"/hack/guest/selinux/* "$RSANDBOX_REPO/hack/guest/selinux-image.sh")
	key=$( (
		sha256sum "${inputs[@]}" | cut -d' ' -f1
		echo "$mods"
	) | sha256sum | cut -c1-16)
	img=$sd/root-$key.ext4
	if [[ -s "$img" ]]; then
		echo "$img"
		return 0
	fi
	log "SELinux guest: building the labelled root image ($key)"
	st=$sd/stage
	rm -rf "$st"
	mkdir -p "$st"/usr/{bin,sbin,lib/rsandbox,lib64,local/bin} "$st"/{dev,proc,sys,run,tmp,mnt,root,images} \
		"$st"/etc/{init.d,containerd,cni/net.d} "$st"/var/lib/{containerd,cni,kubelet/pods} "$st"/var/log/pods \
		"$st/opt/cni/bin" "$st"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots \
		"$st"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes
	# ^ the two trees refpolicy labels container_ro_file_t made before setfiles: what containerd
	# makes below them inherits it (the policy has no name-based transition for them)
	ln -s usr/bin "$st/bin"
	ln -s usr/sbin "$st/sbin"
	ln -s usr/lib "$st/lib"
	ln -s usr/lib64 "$st/lib64"
	ln -s ../run "$st/var/run"
	mkdir -p "$st/usr/lib/modules/rsandbox"
	cp "$bb" "$st/usr/bin/busybox"
	for a in $("$bb" --list); do
		[[ -e "$st/usr/bin/$a" ]] || ln -s busybox "$st/usr/bin/$a"
	done
	cp "$bb" "$st/usr/sbin/init"
	cp "$BIN/containerd" "$BIN/ctr" "$BIN/containerd-shim-runc-v2" "$st/usr/bin/"
	cp "$shim" "$st/usr/bin/$SHIM_NAME"
	cp -L "$runc" "$st/usr/sbin/runc"
	cp "$P/usr/lib/cni/bridge" "$P/usr/lib/cni/host-local" "$P/usr/lib/cni/loopback" "$st/opt/cni/bin/"
	cp "$exe" "$st/usr/local/bin/selinux-probes"
	# /dev is labelled after the policy is loaded, as udev or systemd would (restorecon)
	cp "$sd/tools/sbin/setfiles" "$st/usr/sbin/setfiles"
	selinux_copy_libs "$st" "$st"/usr/bin/* "$st/usr/sbin/runc" "$st/usr/sbin/setfiles" "$st"/opt/cni/bin/* \
		"$st/usr/local/bin/selinux-probes"
	cp "$P/images/busybox.oci.tar" "$P/images/pause.oci.tar" "$st/images/"
	for m in $mods; do
		case $m in
		*.ko) cp "$kdir/$m" "$st/usr/lib/modules/rsandbox/" ;;
		*.ko.xz) xz -dc "$kdir/$m" >"$st/usr/lib/modules/rsandbox/$(basename "$m" .xz)" ;;
		*.ko.zst) zstd -qdc "$kdir/$m" >"$st/usr/lib/modules/rsandbox/$(basename "$m" .zst)" ;;
		esac
		m=${m##*/}
		echo "${m%.ko*}.ko" >>"$st/usr/lib/modules/rsandbox/order"
	done
	install -m 0755 "$RSANDBOX_REPO/hack/guest/selinux/preinit.sh" "$st/usr/lib/rsandbox/preinit"
	install -m 0755 "$RSANDBOX_REPO/hack/guest/selinux/rc.sh" "$st/etc/init.d/rsandbox-selinux"
	cp "$RSANDBOX_REPO/hack/guest/selinux/inittab" "$st/etc/inittab"
	cp "$RSANDBOX_REPO/hack/guest/selinux/containerd.toml" "$st/etc/containerd/config.toml"
	cp "$RSANDBOX_REPO/hack/guest/selinux/cni.conflist" "$st/etc/cni/net.d/10-selinux.conflist"
	echo 'root:x:0:0:root:/root:/bin/sh' >"$st/etc/passwd"
	echo 'root:x:0:' >"$st/etc/group"
	printf '127.0.0.1 localhost\n' >"$st/etc/hosts"
	mkdir -p "$st/etc/selinux"
	cp -a "$r/etc/selinux/config" "$r/etc/selinux/default" "$st/etc/selinux/"
	"$sd/tools/sbin/setfiles" -r "$st" "$r/etc/selinux/default/contexts/files/file_contexts" "$st" ||
		die "SELinux guest: setfiles failed"
	size=$(($(du -sm "$st" | cut -f1) + 512))
	rm -f "$sd"/root-*.ext4
	mkfs.ext4 -q -F -L rsandbox-selinux -d "$st" "$img.tmp" "${size}M" >&2 || die "SELinux guest: mkfs.ext4 -d failed"
	mv -f "$img.tmp" "$img"
	log "SELinux guest: root image $img ($(du -h "$img" | cut -f1) used of ${size} MiB)"
	echo "$img"
}
