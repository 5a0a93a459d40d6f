#!/usr/bin/env bash
# hack/release/test-deb.sh - the .deb of dist/ on the bench (after hack/release.sh):
#
#   1. dpkg installs it (into a throwaway root with a dpkg database of its own: the host's
#      packages are never touched) and lists its files; the binary is dist's, byte for byte;
#   2. the binary it installed runs `check` against the bench's containerd (exit 0: nothing
#      blocking) and `-v` names dist's version;
#   3. containerd runs pods with it: it is installed into the bench (as hack/build.sh installs a
#      build) and integration/tests/check.rs and two CRI pod tests of cri.rs run; whatever shim
#      was installed before is put back on every exit path;
#   4. dpkg removes it again.
#
# Needs the bench up (hack/setup.sh) and, when run by hand, its lock:
#   flock /tmp/rsandbox-bench.lock hack/release/test-deb.sh
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
need_root
cd "$RSANDBOX_REPO"

debs=(dist/rsandbox_*_amd64.deb)
deb=${debs[0]}
[[ -f "$deb" ]] || die "no dist/rsandbox_*_amd64.deb: run hack/release.sh first"
((${#debs[@]} == 1)) || die "more than one .deb in dist/: ${debs[*]}"
version=$(dpkg-deb -f "$deb" Version)
bin=dist/$SHIM_NAME-$version-linux-amd64
[[ -f "$bin" ]] || die "no $bin beside $deb"
(cd dist && sha256sum --check --quiet SHA256SUMS) || die "dist/SHA256SUMS does not match dist/"

root=$(mktemp -d /tmp/rsandbox-deb.XXXXXX)
saved=$root.shim
had_shim=0
restore() {
	local rc=$?
	# install_shim dies on failure: in a subshell, so the clean-up below still runs
	if ((had_shim)); then
		(install_shim "$saved") >/dev/null 2>&1 || {
			log "error: could not put back $BIN/$SHIM_NAME (a copy is in $saved)"
			exit 1
		}
		log "put back the shim that was installed before ($BIN/$SHIM_NAME)"
	else
		rm -f "$BIN/$SHIM_NAME"
	fi
	rm -rf "$root" "$saved"
	exit "$rc"
}
trap restore EXIT
if [[ -x "$BIN/$SHIM_NAME" ]]; then
	install -m 0755 "$BIN/$SHIM_NAME" "$saved"
	had_shim=1
fi

section "dpkg -i $deb (root $root)"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/log"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
dpkg --root="$root" --log="$root/var/log/dpkg.log" --force-not-root -i "$deb"
[[ "$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Status} ${Version}' rsandbox)" == "install ok installed $version" ]] ||
	die "dpkg does not list rsandbox $version as installed"
for f in usr/bin/$SHIM_NAME usr/share/rsandbox/conf.d/rsandbox.toml usr/share/doc/rsandbox/README.md \
	usr/share/doc/rsandbox/CHANGELOG.md usr/share/doc/rsandbox/copyright; do
	[[ -f "$root/$f" ]] || die "the package did not install /$f"
done
cmp "$root/usr/bin/$SHIM_NAME" "$bin" || die "the installed binary is not $bin"
[[ "$(stat -c %a "$root/usr/bin/$SHIM_NAME")" == 755 ]] || die "the binary is not mode 0755"
"$root/usr/bin/$SHIM_NAME" -v | grep "Version:  $version" >/dev/null || die "-v does not say $version"

section "check, with the installed binary, against the bench's containerd"
rc=0
"$root/usr/bin/$SHIM_NAME" check --containerd "$BIN/containerd" --containerd-config "$CONFIG" \
	--runtime rsandbox --runc "$BIN/runc" || rc=$?
((rc == 0)) || die "check exited $rc on the bench"

section "pods with the installed binary"
install_shim "$root/usr/bin/$SHIM_NAME"
eval "$(print_env)"
export RSANDBOX_PREFIX
cargo test --manifest-path integration/Cargo.toml --test check -- --test-threads=1
cargo test --manifest-path integration/Cargo.toml --test cri -- --test-threads=1 --exact \
	pod_lifecycle containers_share_the_pod

section "dpkg -r rsandbox"
dpkg --root="$root" --log="$root/var/log/dpkg.log" --force-not-root -r rsandbox
[[ ! -e "$root/usr/bin/$SHIM_NAME" ]] || die "dpkg -r left /usr/bin/$SHIM_NAME"
log "the .deb installs, its binary checks the node and runs pods, and it removes cleanly"
