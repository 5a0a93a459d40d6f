#!/usr/bin/env bash
# hack/installer/image.sh [--binary PATH] [--tag TAG] [--rootfs DIR] [OUT] - the installer image
# (deploy/kubernetes's DaemonSet runs it), built locally as an OCI image layout tarball, from
# Debian packages of this host's release and the static shim binary; no registry is reached.
#
#   /opt/rsandbox-node/rsandbox-node.sh, lib/    deploy/node
#   /opt/rsandbox-node/containerd-shim-rsandbox-v1
#                                                --binary (default: dist/'s static binary if
#                                                there is one, else hack/build.sh's)
#   bash coreutils curl jq util-linux (flock) sed grep mawk diffutils, with the closure of
#   their dependencies: downloaded with apt-get download, unpacked with dpkg-deb -x (no
#   maintainer script runs; the two links those would make, /bin/sh and awk, are made here)
#
# --rootfs DIR: also leave the image's file system unpacked in DIR (the installer's tests run
# the DaemonSet's container from it).
# OUT: default target/installer-image/rsandbox-node-installer-TAG.oci.tar; TAG: the shim's
# version (`-v`). The image name inside: localhost/rsandbox-node-installer:TAG. The layer is
# reproducible for the same packages (fixed owners and mtimes, sorted).
# Push it (docs/install.md: Installing on a fleet), e.g.
#   skopeo copy oci-archive:OUT docker://REGISTRY/rsandbox-node-installer:TAG
#   crane push OUT REGISTRY/rsandbox-node-installer:TAG
#   ctr images import OUT && ctr images push REGISTRY/... localhost/rsandbox-node-installer:TAG
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$RSANDBOX_REPO"

PACKAGES=(bash coreutils curl jq util-linux sed grep mawk diffutils)
binary=
tag=
out=
keep_root=
while [[ $# -gt 0 ]]; do
	case "$1" in
	--binary) binary=$2 && shift 2 ;;
	--tag) tag=$2 && shift 2 ;;
	--rootfs) keep_root=$2 && shift 2 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*) out=$1 && shift ;;
	esac
done
if [[ -z "$binary" ]]; then
	binary=$(find dist -maxdepth 1 -name "$SHIM_NAME-*-linux-amd64" 2>/dev/null | sort -V | tail -n1) || true
	binary=${binary:-$(built_shim)}
fi
[[ -x "$binary" ]] || die "no shim binary at $binary (hack/build.sh, or --binary)"
if [[ -z "$tag" ]]; then
	tag=$("$binary" -v | sed -n 's/^ *Version: *//p' | head -n1)
	[[ -n "$tag" ]] || die "$binary -v prints no version"
fi
out=${out:-$RSANDBOX_REPO/target/installer-image/rsandbox-node-installer-$tag.oci.tar}
mkdir -p "$(dirname "$out")" "$P/tmp"

codename=$(host_codename)
dl=$P/debs/installer-image
mkdir -p "$dl"
# the closure of the packages' Depends and Pre-Depends (real packages only: apt-cache prints
# the virtual ones it resolves through in <...>)
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances "${PACKAGES[@]}" 2>/dev/null | grep -E '^[a-z0-9]' | sort -u)
((${#closure[@]} >= ${#PACKAGES[@]})) || die "apt-cache knows no closure of ${PACKAGES[*]} (apt-get update?)"
missing=()
for p in "${closure[@]}"; do
	compgen -G "$dl/${p}_*.deb" >/dev/null || missing+=("$p/$codename")
done
if ((${#missing[@]})); then
	log "downloading ${#missing[@]} packages from $codename for the installer image"
	(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "${missing[@]}" >/dev/null) ||
		(apt-get update -q >/dev/null && cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "${missing[@]}" >/dev/null)
fi

root=$(mktemp -d "$P/tmp/installer-image.XXXXXX")
trap 'rm -rf "$root"' EXIT
for p in "${closure[@]}"; do
	debs=("$dl/${p}_"*.deb)
	# the newest download of that package, should several versions lie there
	dpkg-deb -x "$(printf '%s\n' "${debs[@]}" | sort -V | tail -n1)" "$root"
done
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,bash-completion}
ln -sf bash "$root/bin/sh"
ln -sf mawk "$root/usr/bin/awk"
mkdir -p "$root"/{tmp,proc,sys,dev,run,host,etc,root} "$root/opt/rsandbox-node"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
cp -r deploy/node/rsandbox-node.sh deploy/node/lib "$root/opt/rsandbox-node/"
install -m 0755 "$binary" "$root/opt/rsandbox-node/$SHIM_NAME"
chmod -R go-w "$root/opt/rsandbox-node"

# the image runs what the installer needs (bash, curl with HTTP/2 for CRI's gRPC, jq, flock;
# systemd is reached through the shim's own D-Bus client, `unit`: no systemctl, no nsenter)
chroot "$root" /opt/rsandbox-node/rsandbox-node.sh --help >/dev/null
chroot "$root" curl --version | grep -w HTTP2 >/dev/null || die "the image's curl has no HTTP/2"
chroot "$root" jq --version >/dev/null
chroot "$root" flock --version >/dev/null
chroot "$root" "/opt/rsandbox-node/$SHIM_NAME" -v >/dev/null
chroot "$root" "/opt/rsandbox-node/$SHIM_NAME" unit -h >/dev/null

oci_archive "localhost/rsandbox-node-installer:$tag" "$root" "$out" '["/opt/rsandbox-node/rsandbox-node.sh"]' '["--help"]'
if [[ -n "$keep_root" ]]; then
	rm -rf "$keep_root"
	mkdir -p "$(dirname "$keep_root")"
	cp -a "$root" "$keep_root"
fi
log "installer image: $out ($(du -h "$out" | cut -f1)), ${#closure[@]} Debian packages from $codename + $binary"
