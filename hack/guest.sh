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
# Usage: hack/guest.sh [TEST-FILTER...]   (args go to the test binary)
# Environment: see hack/lib.sh; RSANDBOX_GUEST_MEM (MiB, 2048),
# RSANDBOX_GUEST_TIMEOUT (s, 900), RSANDBOX_GUEST_RUNCS ("1.1 1.3").
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
cd "$RSANDBOX_REPO"

G=$P/guest
OUT=$G/out
MEM=${RSANDBOX_GUEST_MEM:-2048}
TIMEOUT=${RSANDBOX_GUEST_TIMEOUT:-900}
RUNCS=${RSANDBOX_GUEST_RUNCS:-1.1 1.3}

[[ -f "$SETUP_DONE" && -x "$BIN/$SHIM_NAME" ]] || die "the bench is not set up: hack/setup.sh and hack/build.sh first"
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

kernel_fetch() { # Debian's kernel, extracted; sets KVER
	local dl=$G/debs pkg
	KVER=$(ls "$G/kernel/lib/modules" 2>/dev/null | head -n1) || true
	if [[ -n "$KVER" && -s "$G/vmlinux" && -f "$G/kernel/lib/modules/$KVER/modules.dep" ]]; then
		return 0
	fi
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	[[ -n "$pkg" ]] || die "apt-cache knows no linux-image-amd64 dependency"
	log "downloading $pkg (Debian's kernel, extracted only)"
	rm -rf "$dl" "$G/kernel" "$G/vmlinux"
	mkdir -p "$dl"
	(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "$pkg")
	dpkg-deb -x "$dl"/"$pkg"_*.deb "$G/kernel"
	KVER=$(ls "$G/kernel/lib/modules" | head -n1)
	vmlinux_extract "$G/kernel/boot/vmlinuz-$KVER" "$G/vmlinux"
	# busybox's depmod: the host has no kmod; modprobe in the guest reads modules.dep
	"$(busybox_bin)" depmod -b "$G/kernel" "$KVER"
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

initramfs_build() { # busybox + the modules that mount / over 9p
	local root=$G/initramfs bb m k
	bb=$(busybox_bin)
	if [[ -s "$G/initramfs.cpio" && "$G/initramfs.cpio" -nt hack/guest/init && "$G/initramfs.cpio" -nt "$bb" ]]; then
		return 0
	fi
	rm -rf "$root"
	mkdir -p "$root"/{bin,dev,proc,sys,lower,up,newroot,modules}
	cp "$bb" "$root/bin/busybox"
	for m in sh mount umount mkdir insmod switch_root sleep cat echo reboot sed; do ln -s busybox "$root/bin/$m"; done
	k=$G/kernel/lib/modules/$KVER/kernel
	# dependency order (modules.dep): virtio transport, 9p, overlayfs
	for m in drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko drivers/virtio/virtio_pci_modern_dev.ko \
		drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci.ko fs/netfs/netfs.ko fs/fscache/fscache.ko \
		net/9p/9pnet.ko net/9p/9pnet_virtio.ko fs/9p/9p.ko fs/overlayfs/overlay.ko; do
		[[ -f "$k/$m" ]] || die "kernel module $m missing in $KVER"
		cp "$k/$m" "$root/modules/"
		echo "${m##*/}" >>"$root/modules/order"
	done
	install -m 0755 hack/guest/init "$root/init"
	(cd "$root" && find . | "$bb" cpio -o -H newc >"$G/initramfs.cpio.tmp" 2>/dev/null)
	mv -f "$G/initramfs.cpio.tmp" "$G/initramfs.cpio"
}

test_binary() { # NAME: builds integration test binary NAME; prints its path
	local exe
	exe=$(cargo test --manifest-path integration/Cargo.toml --test "$1" --no-run --message-format=json 2>/dev/null |
		grep "\"name\":\"$1\"" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
	[[ -x "$exe" ]] || die "could not build the $1 test binary (cargo test --test $1 --no-run)"
	echo "$exe"
}

qemu_install
kernel_fetch
initramfs_build
# the guest runs: every test of integration/tests/cgroupv2.rs (or the filter
# given), and handshake.rs's shim_cgroup test (ShimCgroup)
EXE=$(test_binary cgroupv2)
HS_EXE=$(test_binary handshake)
rm -rf "$OUT"
mkdir -p "$OUT"
# what run.sh needs, handed over through the results share
{
	printf 'export RSANDBOX_PREFIX=%q RSANDBOX_SUBNET=%q RSANDBOX_BRIDGE=%q\n' "$RSANDBOX_PREFIX" "$RSANDBOX_SUBNET" "$RSANDBOX_BRIDGE"
	printf 'export RSANDBOX_SHIM_SUBNET=%q RSANDBOX_SHIM_BRIDGE=%q RSANDBOX_LOG_LEVEL=%q\n' "$RSANDBOX_SHIM_SUBNET" "$RSANDBOX_SHIM_BRIDGE" "$RSANDBOX_LOG_LEVEL"
	printf 'GUEST_REPO=%q GUEST_EXE=%q GUEST_HS_EXE=%q GUEST_KMOD=%q GUEST_RUNCS=%q\n' \
		"$RSANDBOX_REPO" "$EXE" "$HS_EXE" "$G/kernel/lib/modules/$KVER" "$RUNCS"
	printf 'GUEST_ARGS=('
	(($#)) && printf '%q ' "$@"
	printf ')\n'
} >"$OUT/env"

section "cgroup v2 guest: $KVER, $(qemu-system-x86_64 --version | head -n1), ${MEM} MiB, TCG"
start=$(date +%s.%N)
rc=0
timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
	-M pc -accel tcg,thread=multi -cpu max -smp "$(nproc)" -m "$MEM" \
	-kernel "$G/vmlinux" -initrd "$G/initramfs.cpio" \
	-append "console=ttyS0 cgroup_no_v1=all panic=-1 quiet loglevel=3 rdinit=/init rsandbox.run=$RSANDBOX_REPO/hack/guest/run.sh" \
	-nographic -no-reboot -nic none \
	-fsdev local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap \
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
	-fsdev local,id=out,path="$OUT",security_model=passthrough \
	-device virtio-9p-pci,fsdev=out,mount_tag=out \
	</dev/null 2>&1 | tee "$G/console.log" || rc=$?
end=$(date +%s.%N)
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
if [[ ! -f "$OUT/rc" ]]; then
	log "the guest ended without a result (qemu/timeout exit $rc; console: $G/console.log)"
	log "cgroup v2 guest took ${secs} s"
	exit 1
fi
grc=$(<"$OUT/rc")
log "cgroup v2 guest took ${secs} s (boot to tests: $(cat "$OUT/boot-secs" 2>/dev/null || echo ?) s in the guest); tests exit $grc"
exit "$grc"
