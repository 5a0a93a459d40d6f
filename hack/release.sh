#!/usr/bin/env bash
# hack/release.sh [--once] [--clean] [--arch amd64,arm64] [--ssh-key KEY] [--gpg-key ID] -
# build the release artefacts of HEAD into dist/:
#
#   dist/containerd-shim-rsandbox-v1-<version>-linux-amd64   static x86_64 binary
#   dist/rsandbox_<version>_amd64.deb                         the binary, the containerd drop-in
#                                                             snippet, README, CHANGELOG, license
#   dist/rsandbox-<version>.cdx.json                          SBOM (CycloneDX 1.5, hack/release/sbom.sh)
#   dist/SHA256SUMS                                           sha256sum of the three
#   dist/rsandbox-<version>.intoto.json                       build provenance of the three: in-toto
#                                                             Statement v1, SLSA provenance v1
#                                                             (hack/release/provenance.sh)
#   dist/SHA256SUMS.sig, dist/rsandbox-<version>.intoto.json.sig
#                                                             detached SSH signatures (with a key)
#   dist/SHA256SUMS.asc, dist/rsandbox-<version>.intoto.json.asc
#                                                             detached OpenPGP signatures (with an ID)
#
# Signing (hack/release/sign.sh, after the builds): `--ssh-key KEY` or RSANDBOX_RELEASE_SSH_KEY
# (`ssh-keygen -Y sign -n file -f KEY`: a private key, or the public key of one in ssh-agent);
# `--gpg-key ID` or RSANDBOX_RELEASE_GPG_KEY (`gpg --detach-sign --local-user ID`). Without
# either the release is unsigned and the script says so loudly at the end; hack/release/sign.sh
# DIR signs a dist/ later (on another machine: the key need not be where the build runs).
# docs/install.md shows how a node verifies the signatures, the sums and the provenance;
# hack/release/test-verify.sh runs those commands.
#
# The release is HEAD's tree (`git archive`: what is not committed is not in it), built twice,
# in two directories (target/release-work/{a,b}: path, target dir and all), and every artefact
# of both builds must be the same bytes, or the script fails naming the files that differ.
# `--once` builds once and skips that check; `--clean` empties the work directories first (a
# second run otherwise reuses their compiled dependencies).
#
# Determinism: SOURCE_DATE_EPOCH is the commit's time (dpkg-deb's member times, the SBOM's
# timestamp); --remap-path-prefix maps the source, the target dir and $CARGO_HOME to fixed
# names; the revision comes from RSANDBOX_REVISION (no .git in an archive); build.rs builds
# the embedded pause program with fixed flags from a relative path; the .deb's files get fixed
# modes, owners and times, and one compressor thread. The provenance has no clock and no work
# directory in it, and is compared like the rest; the signatures are made once, after the
# comparison (an Ed25519 SSH signature is deterministic, an OpenPGP one carries its time).
#
# `--arch` (default: this machine's) names the architectures to build, amd64 and/or arm64
# (aarch64). arm64 adds dist/containerd-shim-rsandbox-v1-<version>-linux-arm64,
# rsandbox_<version>_arm64.deb and rsandbox-<version>-arm64.cdx.json, in the same SHA256SUMS
# and provenance. On an x86_64
# host arm64 is a cross build: rustup's aarch64-unknown-linux-gnu standard library, Debian's
# gcc-aarch64-linux-gnu (the linker, also of the pause program: build.rs passes it on) and
# libc6-dev-arm64-cross (the static glibc), and qemu-user's qemu-aarch64 to run `-v`; the
# script names what is missing. hack/test.sh builds this machine's architecture only
# (docs/install.md, arm64). Before each architecture's build, hack/release/pause-syscalls.sh
# checks the pause program's system call numbers and AUDIT_ARCH for it against the kernel's
# headers (linux-libc-dev): a wrong number would build and only fail on that kernel.
#
# Static: the gnu target with `-C target-feature=+crt-static` and glibc's static libraries
# (libc6-dev): the one toolchain (1.95.0) has no musl target, and the shim calls glibc's
# mallopt. The shim resolves no user, group or host name (no NSS) and loads nothing (no
# dlopen), which a static glibc cannot do; the link's warnings would name such calls and the
# script fails on them. `file`, `ldd` and `readelf` must all say: no interpreter, no NEEDED.
#
# Needs: cargo (the repository's toolchain), git, jq, dpkg-deb, file, binutils (readelf); to
# sign, ssh-keygen (openssh-client) or gpg.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RSANDBOX_REPO"

once=0 clean=0
# this machine's architecture unless --arch says otherwise (uname: x86_64, aarch64)
case "$(uname -m)" in
aarch64) arches=(arm64) ;;
*) arches=(amd64) ;;
esac
# the command as typed, for the provenance (the script's own path as in the repository)
command=(hack/release.sh "$@")
while (($#)); do
	case "$1" in
	--once) once=1 ;;
	--clean) clean=1 ;;
	--arch)
		(($# >= 2)) || die "$1 needs a value"
		IFS=, read -r -a arches <<<"$2"
		shift
		;;
	--ssh-key | --gpg-key)
		(($# >= 2)) || die "$1 needs a value"
		if [[ "$1" == --ssh-key ]]; then
			export RSANDBOX_RELEASE_SSH_KEY=$2
		else
			export RSANDBOX_RELEASE_GPG_KEY=$2
		fi
		shift
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $1 (want --once, --clean, --arch LIST, --ssh-key KEY, --gpg-key ID)" ;;
	esac
	shift
done
for tool in git jq dpkg-deb file readelf sha256sum; do
	command -v "$tool" >/dev/null || die "$tool is missing (hack/setup.sh installs it)"
done

commit=$(git rev-parse HEAD)
version=$(git show HEAD:Cargo.toml | sed -n 's/^version = "\(.*\)"$/\1/p' | head -n 1)
[[ -n "$version" ]] || die "no version in HEAD's Cargo.toml"
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
checkout_clean=true
if ! git diff --quiet HEAD -- 2>/dev/null; then
	checkout_clean=false
	log "note: the working tree differs from HEAD; the release is HEAD's tree ($commit)"
fi
work=${RSANDBOX_RELEASE_WORK:-$RSANDBOX_REPO/target/release-work}
prov_name=rsandbox-$version.intoto.json
cargo_home=${CARGO_HOME:-${HOME:-/root}/.cargo}
host=$(host_triple)

# arch_set ARCH: one architecture's target, file names and tools, in globals: TARGET, elf
# (what `file` says), libc_pkg (the Debian package of the static glibc), bin_name, deb_name,
# sbom_name, linker_env (cargo's linker for a cross build), run (how `-v` runs on this host),
# unistd_h (the kernel's system call table of ARCH, from linux-libc-dev: the pause program's
# numbers are checked against it).
arch_set() {
	arch=$1
	case "$arch" in
	amd64)
		TARGET=x86_64-unknown-linux-gnu elf=x86-64
		unistd_h=/usr/include/x86_64-linux-gnu/asm/unistd_64.h
		[[ "$host" == x86_64-* ]] || unistd_h=/usr/x86_64-linux-gnu/include/asm/unistd_64.h
		;;
	arm64)
		# aarch64 has no table of its own: it uses the generic one, the same on every host
		TARGET=aarch64-unknown-linux-gnu elf="ARM aarch64" unistd_h=/usr/include/asm-generic/unistd.h
		;;
	*) die "unknown architecture $arch (want amd64, arm64)" ;;
	esac
	bin_name=$SHIM_NAME-$version-linux-$arch
	deb_name=rsandbox_${version}_$arch.deb
	# amd64's keeps the name it had before there were two
	sbom_name=rsandbox-$version.cdx.json
	[[ "$arch" == amd64 ]] || sbom_name=rsandbox-$version-$arch.cdx.json
	libc_pkg=libc6-dev linker_env=() run=()
	if [[ "$TARGET" != "$host" ]]; then
		local cpu=${TARGET%%-*} var
		var=${TARGET^^}
		libc_pkg=libc6-dev-$arch-cross
		linker_env=("CARGO_TARGET_${var//-/_}_LINKER=$cpu-linux-gnu-gcc")
		run=("qemu-$cpu")
	fi
}

# arch_check ARCH: what a build of ARCH needs on this host, each missing piece named.
arch_check() {
	arch_set "$1"
	[[ -d "$(rustc --print sysroot)/lib/rustlib/$TARGET/lib" ]] ||
		die "no standard library for $TARGET: rustup target add $TARGET"
	[[ "$(dpkg-query -W -f='${Status}' "$libc_pkg" 2>/dev/null)" == *"ok installed" ]] ||
		die "$libc_pkg is not installed (the static glibc of $arch)"
	if ((${#linker_env[@]})); then
		local linker=${linker_env[0]#*=}
		local pkg=gcc-${linker%-gcc}
		command -v "$linker" >/dev/null || die "$linker is missing (Debian: ${pkg//_/-})"
		command -v "${run[0]}" >/dev/null || die "${run[0]} is missing (Debian: qemu-user): it runs $arch's -v"
	fi
}
# the artefacts of each architecture, in SHA256SUMS's order
artefacts=()
for a in "${arches[@]}"; do
	arch_check "$a"
	artefacts+=("$bin_name" "$deb_name" "$sbom_name")
done

# rustflags SRC TARGET CARGO_HOME: the build's RUSTFLAGS (the provenance gets them with
# placeholders for the three directories, which differ between builds a and b).
rustflags() {
	echo "-C target-feature=+crt-static --remap-path-prefix=$1=/rsandbox" \
		"--remap-path-prefix=$2=/target --remap-path-prefix=$3=/cargo"
}

# build DIR: HEAD's tree into DIR/src, built into DIR/target, artefacts into DIR/dist.
build() {
	local dir=$1 src out a targets=() libcs=()
	src=$dir/src out=$dir/dist
	((clean)) && rm -rf "$dir/target"
	rm -rf "$src" "$out" "$dir/pkg"
	mkdir -p "$src" "$out"
	git archive "$commit" | tar -x -C "$src"
	for a in "${arches[@]}"; do
		arch_set "$a"
		build_arch "$dir"
		targets+=("$TARGET") libcs+=("$libc_pkg")
	done
	(cd "$out" && sha256sum "${artefacts[@]}" >SHA256SUMS)
	hack/release/provenance.sh "$out" "$src" "$(
		IFS=,
		echo "${targets[*]}"
	)" "$(
		IFS=,
		echo "${libcs[*]}"
	)" "$commit" "$checkout_clean" \
		"$(rustflags '<src>' '<target>' '<cargo home>')" -- "${command[@]}" >"$out/$prov_name"
}

# build_arch DIR: DIR/src built for arch_set's architecture; its binary, SBOM and .deb into
# DIR/dist.
build_arch() {
	local dir=$1 src target out start warnings
	src=$dir/src target=$dir/target out=$dir/dist
	# the pause program's raw system calls and seccomp filter, by number: a wrong one builds
	hack/release/pause-syscalls.sh "$src/pause/pause.rs" "${TARGET%%-*}" "$unistd_h" >&2
	start=$(date +%s)
	section "cargo build --release --target $TARGET (+crt-static) in $dir"
	warnings=$dir/link-warnings-$arch.txt
	(
		cd "$src"
		env "${linker_env[@]}" RUSTFLAGS="$(rustflags "$src" "$target" "$cargo_home")" \
			RSANDBOX_REVISION="$commit" CARGO_TARGET_DIR="$target" \
			cargo build --locked --release --target "$TARGET" --bin "$SHIM_NAME" 2>&1
	) | tee "$warnings" >&2
	log "build took $(($(date +%s) - start)) s"
	# glibc's static link warns about each NSS or dlopen use ("Using 'getpwnam' in
	# statically linked applications requires at runtime the shared libraries ...").
	if grep -q "statically linked applications requires" "$warnings"; then
		grep "statically linked applications requires" "$warnings" >&2
		die "the static binary calls into NSS or dlopen (above): it would break on other glibc versions"
	fi
	local bin=$target/$TARGET/release/$SHIM_NAME
	check_static "$bin"
	install -m 0755 "$bin" "$out/$bin_name"
	hack/release/sbom.sh "$src" "$out/$bin_name" "$version" "$commit" "$SOURCE_DATE_EPOCH" \
		"$TARGET" "$libc_pkg" >"$out/$sbom_name"
	make_deb "$dir" "$out/$bin_name" "$out/$deb_name"
}

# check_static BINARY: no interpreter, no shared library, runs and names HEAD's commit.
check_static() {
	local bin=$1 kind
	kind=$(file -b "$bin")
	log "file: $kind"
	[[ "$kind" == *"static-pie linked"* || "$kind" == *"statically linked"* ]] || die "not static: $kind"
	[[ "$kind" != *interpreter* ]] || die "has an ELF interpreter: $kind"
	[[ "$kind" == *"$elf"* ]] || die "not $elf: $kind"
	if readelf -d "$bin" | grep NEEDED >/dev/null; then
		readelf -d "$bin" | grep NEEDED >&2
		die "$bin needs shared libraries"
	fi
	# ldd exits 1 on a static binary ("not a dynamic executable"), or says "statically linked"
	local ldd_out
	ldd_out=$(ldd "$bin" 2>&1 || true)
	log "ldd: $ldd_out"
	[[ "$ldd_out" == *"not a dynamic executable"* || "$ldd_out" == *"statically linked"* ]] ||
		die "ldd lists libraries: $ldd_out"
	local v
	v=$("${run[@]}" "$bin" -v)
	[[ "$v" == *"Version:  $version"* && "$v" == *"Revision: $commit"$'\n'* ]] ||
		die "$bin -v does not name $version and $commit: $v"
}

# make_deb DIR BINARY OUT: the package tree under DIR/pkg, then dpkg-deb. Its files come from
# DIR/src (the commit's export), not the checkout, which may differ from the commit.
make_deb() {
	local dir=$1 bin=$2 deb=$3 root size src
	root=$dir/pkg src=$dir/src
	rm -rf "$root"
	(
		umask 022
		mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/usr/share/rsandbox/conf.d" "$root/usr/share/doc/rsandbox"
		install -m 0755 "$bin" "$root/usr/bin/$SHIM_NAME"
		install -m 0644 "$src/hack/release/rsandbox.toml" "$root/usr/share/rsandbox/conf.d/rsandbox.toml"
		install -m 0644 "$src/hack/release/copyright" "$root/usr/share/doc/rsandbox/copyright"
		cp "$src/README.md" "$src/CHANGELOG.md" "$root/usr/share/doc/rsandbox/"
		chmod 0644 "$root/usr/share/doc/rsandbox/README.md" "$root/usr/share/doc/rsandbox/CHANGELOG.md"
		size=$(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)
		sed -e "s/@VERSION@/$version/" -e "s/@INSTALLED_SIZE@/$size/" -e "s/@REVISION@/$commit/" \
			-e "s/@ARCH@/$arch/" \
			"$src/hack/release/control.in" >"$root/DEBIAN/control"
		(cd "$root" && find usr -type f | LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
		chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
		find "$root" -type d -exec chmod 0755 {} +
		find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
	)
	dpkg-deb --root-owner-group --threads-max=1 -Zxz --build "$root" "$deb" >/dev/null
	dpkg-deb --info "$deb" >/dev/null
	log "built $(basename "$deb"): $(dpkg-deb -c "$deb" | wc -l) entries"
}

total_start=$(date +%s)
build "$work/a"
if ((once)); then
	log "--once: no reproducibility check"
else
	build "$work/b"
	section "reproducibility: build a vs build b"
	differ=()
	for f in "${artefacts[@]}" SHA256SUMS "$prov_name"; do
		if cmp -s "$work/a/dist/$f" "$work/b/dist/$f"; then
			log "same bytes: $f"
		else
			differ+=("$f")
		fi
	done
	if ((${#differ[@]})); then
		die "not reproducible: ${differ[*]} differ between $work/a/dist and $work/b/dist (diffoscope shows how)"
	fi
fi

rm -rf dist
mkdir -p dist
cp "$work/a/dist/"* dist/
hack/release/sign.sh dist
section "dist/ (HEAD $commit, version $version, SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH)"
(cd dist && ls -l && cat SHA256SUMS) >&2
log "hack/release.sh took $(($(date +%s) - total_start)) s"
if [[ ! -e dist/SHA256SUMS.sig && ! -e dist/SHA256SUMS.asc ]]; then
	section "UNSIGNED release: no --ssh-key nor --gpg-key (RSANDBOX_RELEASE_SSH_KEY, _GPG_KEY)"
	log "WARNING: nothing in dist/ is signed; sign it with hack/release/sign.sh dist before publishing"
fi
