#!/usr/bin/env bash
# hack/guest.sh - the cgroup v2 bench: boots a throwaway QEMU guest on cgroup v2
# and runs the cgroupv2 integration tests inside it, with runc 1.1 and 1.3.
#
# This machine is cgroup v1 (hybrid); the node a current Kubernetes wants is v2.
# The guest is Debian's stock kernel (linux-image-amd64 of the host's release,
# extracted with dpkg-deb, never installed) booted with cgroup_no_v1=all:
#   - QEMU from bookworm-backports (10.x: about twice as fast as bookworm's 7.2
#     at starting processes), installed through a private apt sources list
#     (the host's apt sources are not touched); TCG: /dev/kvm here, if any, is
#     a PVM device that boots only PVM kernels;
#   - the uncompressed vmlinux (cut out of the bzImage, as the kernel's
#     extract-vmlinux does; booted through its PVH note: ~7 s less under TCG);
#   - an initramfs of the static busybox and the few modules that mount this
#     machine's / (virtio 9p, read-only) under a tmpfs overlay, then
#     switch_root into it and run hack/guest/run.sh;
#   - tmpfs for containerd's root and state, the shim's /run; a read-write 9p
#     share ($P/guest/out) for the results.
# Inside: the bench's containerd (same prefix, same config), the shim built
# here, the integration test binary `cgroupv2` built here. Processes start
# ~25x slower in the guest, so only those tests run there.
#
# --systemd: the systemd node instead. The same kernel, initramfs and overlay,
# booted with systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all; the
# initramfs switches into hack/guest/systemd-boot.sh, which writes the node's
# units into the overlay (containerd.service as containerd ships it, running
# the bench's containerd with the runc handler at SystemdCgroup = true; a test
# unit as the default target; journald, udev, getty, generators, timers ...
# masked), hides /.dockerenv and execs systemd (bookworm's, from this machine;
# extracted with dpkg-deb into a guest-only layer if it lacks it) as PID 1;
# dbus socket-activated. The test unit (hack/guest/systemd-run.sh) runs
# integration/tests/systemd.rs once per runc and powers off.
#
# --selinux: an SELinux-enforcing node (hack/guest/selinux-image.sh, hack/guest/selinux/). The
# same kernel, initramfs and QEMU, booted with security=selinux selinux=1 enforcing=1 from a
# labelled ext4 root image (virtio-blk; 9p holds no per-file labels) instead of the host's /:
# the policy is refpolicy's default plus its container and docker modules, loaded before init;
# containerd runs in dockerd_t with CRI's enable_selinux = true on both handlers (runc, rsandbox)
# and integration/tests/selinux.rs probes the same pod on each; the kernel's AVC lines are
# collected per handler. hack/test.sh runs it after the systemd guest.
#
# Usage: hack/guest.sh [--systemd|--selinux] [--prepare] [TEST-FILTER...]   (args go to the test binary)
# --prepare: only install and build what the guest boots from (QEMU, the kernel, the
# initramfs; the systemd layer with --systemd; with --selinux the SELinux packages and the
# policy: the root image holds the shim and the probes, so it is built at the boot, cached by
# content), boot nothing (hack/test.sh, before its steps).
# The serial console is copied to the log and to console*.log without its escape codes.
# Environment: see hack/lib.sh; RSANDBOX_GUEST_MEM (MiB, 2048),
# RSANDBOX_GUEST_TIMEOUT (s, 900; 1800 with --systemd, 1200 with --selinux), RSANDBOX_GUEST_RUNCS ("1.1 1.3"),
# RSANDBOX_GUEST_LIVE_ONLY=1 (systemd guest: only the shim's live_systemd unit tests, no
# containerd, no integration tests; RSANDBOX_LIVE_ROUNDS rounds per way, 5;
# RSANDBOX_GUEST_LIB_EXE: another unit-test binary to run, e.g. one built from an older
# commit; RSANDBOX_GUEST_TRACE=1: systemd at log level debug into the kernel log, strace of
# PID 1's and the test's socket calls, all written to the results share),
# RSANDBOX_GUEST_MODE (cgroupv2 | systemd: the same as --systemd),
# RSANDBOX_GUEST_BENCH_COPY (cgroup v2 mode: a directory holding the shim and conf/ to run
# instead of the bench's; hack/test.sh's copies), RSANDBOX_GUEST_NO_SWITCH_ROOT=1 (cgroup v2
# mode: / stays the initramfs, an initramfs root where pivot_root cannot work), RSANDBOX_GUEST_EXE (cgroup v2 mode: a test binary of this
# tree to run instead of cgroupv2's, e.g. the unit tests': the filter then goes to it).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
cd "$RSANDBOX_REPO"

G=$P/guest
OUT=$G/out
MEM=${RSANDBOX_GUEST_MEM:-2048}
TIMEOUT=${RSANDBOX_GUEST_TIMEOUT:-}
RUNCS=${RSANDBOX_GUEST_RUNCS:-1.1 1.3}
MODE=${RSANDBOX_GUEST_MODE:-cgroupv2}
PREPARE=0
while [[ "${1:-}" == --systemd || "${1:-}" == --selinux || "${1:-}" == --prepare ]]; do
	case $1 in
	--systemd) MODE=systemd ;;
	--selinux) MODE=selinux ;;
	--prepare) PREPARE=1 ;;
	esac
	shift
done
case $MODE in
cgroupv2)
	WHAT="cgroup v2 guest"
	CONSOLE=$G/console.log
	TIMEOUT=${TIMEOUT:-900}
	;;
systemd)
	WHAT="systemd guest"
	OUT=$G/out-systemd
	CONSOLE=$G/console-systemd.log
	TIMEOUT=${TIMEOUT:-1800}
	;;
selinux)
	WHAT="SELinux guest"
	OUT=$G/out-selinux
	CONSOLE=$G/console-selinux.log
	TIMEOUT=${TIMEOUT:-1200}
	;;
*) die "RSANDBOX_GUEST_MODE=$MODE: expected cgroupv2, systemd or selinux" ;;
esac

[[ -f "$SETUP_DONE" ]] || die "the bench is not set up: hack/setup.sh first"
((PREPARE)) || [[ -x "$BIN/$SHIM_NAME" ]] || die "the shim is not installed: hack/build.sh first"
[[ -x "$RUNC13_BIN" ]] || die "runc 1.3 missing: hack/setup.sh"

qemu_install() {
	local d=$P/apt-bpo codename
	command -v qemu-system-x86_64 >/dev/null && return 0
	codename=$(host_codename)
	log "installing qemu-system-x86 from $codename-backports (private sources list)"
	mkdir -p "$d/lists/partial" "$d/empty"
	printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
		"$(debian_uri)" "$codename" "$(debian_uri)" "$codename-backports" >"$d/sources.list"
	local apt=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts="$d/empty"
		-o Dir::State::Lists="$d/lists" -o APT::Sandbox::User=root -q)
	apt-get "${apt[@]}" update >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get "${apt[@]}" install -y --no-install-recommends \
		-t "$codename-backports" qemu-system-x86
}

kernel_fetch() { # Debian's kernel, extracted; sets KVER and KPKG
	local dl=$G/debs pkg ver
	# the package apt gives now, revalidated on every run: a cached kernel from an older
	# update must never hide what a new machine gets
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	[[ -n "$pkg" ]] || die "apt-cache knows no linux-image-amd64 dependency"
	ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2; exit }')
	KPKG="$pkg $ver"
	KVER=$(ls "$G/kernel/lib/modules" 2>/dev/null | head -n1) || true
	if [[ -n "$KVER" && -s "$G/vmlinux" && -f "$G/kernel/lib/modules/$KVER/modules.dep" &&
		"$(cat "$G/kernel.pkg" 2>/dev/null)" == "$KPKG" ]]; then
		return 0
	fi
	log "downloading $KPKG (Debian's kernel, extracted only)"
	rm -rf "$dl" "$G/kernel" "$G/vmlinux" "$G/kernel.pkg" "$G/initramfs.cpio"
	mkdir -p "$dl"
	(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "$pkg")
	dpkg-deb -x "$dl"/"$pkg"_*.deb "$G/kernel"
	KVER=$(ls "$G/kernel/lib/modules" | head -n1)
	vmlinux_extract "$G/kernel/boot/vmlinuz-$KVER" "$G/vmlinux"
	# busybox's depmod: the host has no kmod; modprobe in the guest reads modules.dep
	"$(busybox_bin)" depmod -b "$G/kernel" "$KVER"
	echo "$KPKG" >"$G/kernel.pkg"
}

# vmlinux_extract BZIMAGE OUT: the kernel's extract-vmlinux, for the xz/zstd/gzip
# payloads Debian uses: decompress from each magic until one yields an ELF
vmlinux_extract() {
	local img=$1 out=$2 magic cmd off
	for pair in '\xfd7zXZ\x00|xz -dc' '\x28\xb5\x2f\xfd|zstd -dc' '\x1f\x8b\x08|gzip -dc'; do
		magic=${pair%%|*} cmd=${pair#*|}
		for off in $(LC_ALL=C grep -obUaP "$magic" "$img" | cut -d: -f1); do
			tail -c +$((off + 1)) "$img" | $cmd >"$out.tmp" 2>/dev/null || true
			if [[ "$(head -c 4 "$out.tmp" | od -An -c | tr -d ' ')" == '177ELF' ]]; then
				mv -f "$out.tmp" "$out"
				log "vmlinux: $(du -h "$out" | cut -f1) (from $(basename "$img"), $cmd at $off)"
				return 0
			fi
		done
	done
	rm -f "$out.tmp"
	die "no ELF kernel found in $img"
}

# module_closure MODDIR NAME...: the modules NAME... need, dependencies first, as
# paths relative to MODDIR, from the kernel's own modules.dep (the order of its
# dependency lists changes between kernel builds: 6.1.192's virtio.ko needs
# virtio_ring.ko). A module built into the kernel (modules.builtin) needs nothing.
module_closure() {
	local dir=$1
	shift
	awk -v want="$*" '
		FNR == 1 { file++ }
		file == 1 { n = $0; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n); builtin[n] = 1; next }
		{
			m = $1; sub(/:$/, "", m)
			n = m; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n)
			path[n] = m; deps[m] = ""
			for (i = 2; i <= NF; i++) deps[m] = deps[m] " " $i
		}
		function visit(m,   d, k, i) {
			if (m in done) return
			done[m] = 1
			k = split(deps[m], d, " ")
			for (i = 1; i <= k; i++) visit(d[i])
			print m
		}
		END {
			k = split(want, w, " ")
			for (i = 1; i <= k; i++) {
				n = w[i]; gsub(/-/, "_", n)
				if (n in path) visit(path[n])
				else if (!(n in builtin)) { print "module " w[i] " is neither in modules.dep nor built in" > "/dev/stderr"; exit 1 }
			}
		}' "$dir/modules.builtin" "$dir/modules.dep"
}

initramfs_build() { # busybox + the modules that mount / over 9p
	local root=$G/initramfs bb m mods kdir
	bb=$(busybox_bin)
	if [[ -s "$G/initramfs.cpio" && "$G/initramfs.cpio" -nt hack/guest/init && "$G/initramfs.cpio" -nt "$bb" &&
		"$G/initramfs.cpio" -nt "$G/kernel.pkg" && "$G/initramfs.cpio" -nt hack/guest.sh &&
		"$(cat "$G/initramfs.mods" 2>/dev/null)" == "virtio_blk ext4 crc32c_generic" ]]; then
		return 0
	fi
	rm -rf "$root"
	mkdir -p "$root"/{bin,dev,proc,sys,lower,up,newroot,modules}
	cp "$bb" "$root/bin/busybox"
	for m in sh mount umount mkdir insmod switch_root sleep cat echo reboot sed; do ln -s busybox "$root/bin/$m"; done
	kdir=$G/kernel/lib/modules/$KVER
	# virtio PCI transport, 9p over virtio, overlayfs (and virtio-blk, ext4 and the crc32c its
	# checksums need, which the kernel would otherwise ask modprobe for: the SELinux
	# guest's root): the closure in modules.dep order
	mods=$(module_closure "$kdir" virtio_pci 9pnet_virtio 9p overlay virtio_blk ext4 crc32c_generic) || die "kernel $KVER: cannot resolve the guest's modules"
	for m in $mods; do
		[[ -f "$kdir/$m" ]] || die "kernel module $m missing in $KVER"
		case $m in
		*.ko) cp "$kdir/$m" "$root/modules/" ;;
		*.ko.xz) xz -dc "$kdir/$m" >"$root/modules/$(basename "$m" .xz)" ;;
		*.ko.zst) zstd -qdc "$kdir/$m" >"$root/modules/$(basename "$m" .zst)" ;;
		*) die "kernel module $m: unknown compression" ;;
		esac
		m=${m##*/}
		echo "${m%.ko*}.ko" >>"$root/modules/order"
	done
	log "initramfs modules ($KVER): $(tr '\n' ' ' <"$root/modules/order")"
	install -m 0755 hack/guest/init "$root/init"
	(cd "$root" && find . | "$bb" cpio -o -H newc >"$G/initramfs.cpio.tmp" 2>/dev/null)
	mv -f "$G/initramfs.cpio.tmp" "$G/initramfs.cpio"
	echo "virtio_blk ext4 crc32c_generic" >"$G/initramfs.mods"
}
# shellcheck source=hack/guest/selinux-image.sh
. hack/guest/selinux-image.sh

# console_filter: the serial console as a person reads it: no terminal escape codes (the
# firmware clears the screen and sets modes: ESC c, ESC [2J, ESC [?7l ...), no carriage
# returns, a line break after the firmware's "Booting from ROM.." (the guest's first line
# follows it on the same line otherwise). Line by line, as it comes.
console_filter() {
	sed -u -e 's/\x1b\[[0-9;?]*[ -\/]*[@-~]//g' -e 's/\x1b[@-Z\\-_a-z]//g' -e 's/\r//g' \
		-e 's/^\(Booting from ROM\.\.\)\(.\)/\1\n\2/'
}

qemu_install
kernel_fetch
initramfs_build
if ((PREPARE)); then
	[[ $MODE == systemd ]] && systemd_layer "$G" >/dev/null
	if [[ $MODE == selinux ]]; then
		selinux_tools
		selinux_policy
	fi
	log "$WHAT prepared: $(qemu-system-x86_64 --version | head -n1), kernel $KVER ($KPKG), initramfs"
	exit 0
fi
rm -rf "$OUT"
mkdir -p "$OUT"
if [[ $MODE == cgroupv2 ]]; then
	# hack/test.sh runs this guest beside the host's integration tests, which change the
	# bench while they run (upgrade.rs installs the previous release's shim for a while,
	# network.rs adds a broken conflist, others wrap runc): the guest works on copies of the
	# shim and the config dir (hack/guest/run.sh), taken by hack/test.sh before any of those
	# tests starts (RSANDBOX_GUEST_BENCH_COPY), else now
	copy=${RSANDBOX_GUEST_BENCH_COPY:-}
	cp "${copy:-$BIN}/$SHIM_NAME" "$OUT/$SHIM_NAME"
	cp -a "${copy:-$P}/conf" "$OUT/conf"
fi
EXTRA=()
if [[ $MODE == selinux ]]; then
	# the labelled root, copied (sparse) for this boot: the guest writes to it
	IMG=$(selinux_image)
	cp --sparse=always "$IMG" "$G/selinux/boot.ext4"
	EXTRA=(-drive "file=$G/selinux/boot.ext4,format=raw,if=virtio,cache=unsafe")
	EXE= HS_EXE= LIB_EXE= LAYER=
	RUN=/usr/lib/rsandbox/preinit
	CMDLINE="security=selinux selinux=1 enforcing=1 audit=1 cgroup_no_v1=all rsandbox.root=vda"
elif [[ $MODE == systemd ]]; then
	# the guest runs integration/tests/systemd.rs (or the filter given), and the shim's
	# ignored unit tests named live_systemd (its D-Bus client against the real systemd)
	if [[ -n "${RSANDBOX_GUEST_LIVE_ONLY:-}" ]]; then
		EXE=
	else
		EXE=$(test_binary systemd)
	fi
	HS_EXE=
	LIB_EXE=${RSANDBOX_GUEST_LIB_EXE:-$(lib_test_binary)}
	LAYER=$(systemd_layer "$G")
	containerd_config true >"$OUT/containerd.toml"
	RUN=$RSANDBOX_REPO/hack/guest/systemd-boot.sh
	# show_status=0: PID 1 writes no unit status lines to the serial console (slow under
	# TCG); the console carries the tests' output
	CMDLINE="systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all systemd.show_status=0"
	# the trace keeps all of PID 1's debug log in the kernel's buffer (no journald here)
	[[ -n "${RSANDBOX_GUEST_TRACE:-}" ]] && CMDLINE+=" printk.devkmsg=on log_buf_len=64M"
else
	# the guest runs: every test of integration/tests/cgroupv2.rs (or the filter
	# given), and handshake.rs's shim_cgroup test (ShimCgroup)
	EXE=${RSANDBOX_GUEST_EXE:-$(test_binary cgroupv2)}
	HS_EXE=$(test_binary handshake)
	LIB_EXE=
	LAYER=
	RUN=$RSANDBOX_REPO/hack/guest/run.sh
	CMDLINE="cgroup_no_v1=all"
	# the bench's config plus the cgroup_writable handler pair (cgroup v2 only, so not in
	# this host's config): run.sh starts containerd with this file
	{
		containerd_config false
		cgroup_writable_runtimes
	} >"$OUT/containerd.toml"
fi
# what run.sh needs, handed over through the results share
{
	printf 'export RSANDBOX_PREFIX=%q RSANDBOX_SUBNET=%q RSANDBOX_BRIDGE=%q\n' "$RSANDBOX_PREFIX" "$RSANDBOX_SUBNET" "$RSANDBOX_BRIDGE"
	printf 'export RSANDBOX_SHIM_SUBNET=%q RSANDBOX_SHIM_BRIDGE=%q RSANDBOX_LOG_LEVEL=%q\n' "$RSANDBOX_SHIM_SUBNET" "$RSANDBOX_SHIM_BRIDGE" "$RSANDBOX_LOG_LEVEL"
	# the guest's stage headers count from the start of the whole run too
	printf 'export RSANDBOX_T0=%q\n' "$RSANDBOX_T0"
	printf 'GUEST_REPO=%q GUEST_EXE=%q GUEST_HS_EXE=%q GUEST_KMOD=%q GUEST_RUNCS=%q\n' \
		"$RSANDBOX_REPO" "$EXE" "$HS_EXE" "$G/kernel/lib/modules/$KVER" "$RUNCS"
	printf 'GUEST_CONTAINERD_CONFIG=%q GUEST_SYSTEMD_LAYER=%q GUEST_LIB_EXE=%q\n' /mnt/containerd.toml "$LAYER" "$LIB_EXE"
	printf 'GUEST_LIVE_ONLY=%q RSANDBOX_LIVE_ROUNDS=%q GUEST_TRACE=%q\n' "${RSANDBOX_GUEST_LIVE_ONLY:-}" "${RSANDBOX_LIVE_ROUNDS:-5}" "${RSANDBOX_GUEST_TRACE:-}"
	printf 'GUEST_ARGS=('
	(($#)) && printf '%q ' "$@"
	printf ')\n'
} >"$OUT/env"

section "$WHAT: kernel $KVER ($KPKG), $(qemu-system-x86_64 --version | head -n1), ${MEM} MiB, TCG"
start=$(date +%s.%N)
rc=0
guest_run() {
	timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
		-M pc -accel tcg,thread=multi -cpu max -smp "$(nproc)" -m "$MEM" \
		-kernel "$G/vmlinux" -initrd "$G/initramfs.cpio" \
		-append "console=ttyS0 $CMDLINE panic=-1 quiet loglevel=3 rdinit=/init rsandbox.run=$RUN${RSANDBOX_GUEST_NO_SWITCH_ROOT:+ rsandbox.no_switch_root=$RSANDBOX_GUEST_NO_SWITCH_ROOT}" \
		-nographic -no-reboot -nic none \
		-fsdev local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap \
		-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
		-fsdev local,id=out,path="$OUT",security_model=passthrough \
		-device virtio-9p-pci,fsdev=out,mount_tag=out "${EXTRA[@]}" \
		</dev/null 2>&1 | console_filter | tee "$CONSOLE"
}
# under TCG a single test can run for minutes without a line on the console
with_heartbeat "$WHAT (QEMU)" guest_run || rc=$?
end=$(date +%s.%N)
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
if [[ ! -f "$OUT/rc" ]]; then
	log "the guest ended without a result (qemu/timeout exit $rc; console: $CONSOLE)"
	log "$WHAT took ${secs} s"
	exit 1
fi
grc=$(<"$OUT/rc")
log "$WHAT took ${secs} s (boot to tests: $(cat "$OUT/boot-secs" 2>/dev/null || echo ?) s in the guest); tests exit $grc"
exit "$grc"
