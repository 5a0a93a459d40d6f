# shellcheck shell=bash
# hack/lib/runc.sh - the two runcs of the bench and which one it uses.
#
#   1.1  the host's runc (bookworm: 1.1.5), from HOST_PACKAGES
#   1.3  Debian sid's runc (1.3.x). It needs sid's glibc, which must never reach
#        the host: sid's runc, libc6 and libseccomp2 are extracted (dpkg-deb -x)
#        into $RUNC13_ROOT and the runc binary's ELF interpreter and rpath are
#        pointed at them with patchelf (from the host's release).
#
# RSANDBOX_RUNC=1.1|1.3 picks one (default 1.1): $BIN/runc becomes a symlink to
# it. Both CRI handlers then use it: containerd's PATH starts with $BIN (the
# shim runs `runc` from PATH) and the runc handler's BinaryName is $BIN/runc.
# The symlink is read at every exec, so switching needs no containerd restart,
# but must not happen while containers exist (runc's state is per version).
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

RSANDBOX_RUNC=${RSANDBOX_RUNC:-1.1}
RUNC13_ROOT=$P/runc-1.3
RUNC13_BIN=$RUNC13_ROOT/runc

runc11_bin() { # the host's runc: the first in PATH that is not $BIN/runc (our symlink)
	local d
	local IFS=:
	for d in $PATH /usr/sbin /usr/bin /sbin /bin; do
		[[ -n "$d" && "$(readlink -f "$d")" != "$(readlink -f "$BIN")" && -x "$d/runc" ]] && {
			echo "$d/runc"
			return 0
		}
	done
	echo /usr/sbin/runc
}

# fetch_runc13: sid's runc + its libc6 and libseccomp2, patched onto them
fetch_runc13() {
	local dl=$P/debs/runc-1.3 lib
	if [[ "${RSANDBOX_REFRESH:-0}" != 1 ]] && "$RUNC13_BIN" --version >/dev/null 2>&1; then
		return 0
	fi
	command -v patchelf >/dev/null || {
		log "installing patchelf from $(host_codename)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -t "$(host_codename)" patchelf
	}
	apt_private_update
	log "downloading runc, libc6, libseccomp2 from $RSANDBOX_CONTAINERD_SUITE (runc 1.3 beside the host's)"
	rm -rf "$dl" "$RUNC13_ROOT"
	mkdir -p "$dl"
	(cd "$dl" && apt_private apt-get download runc libc6 libseccomp2)
	extract_debs "$RUNC13_ROOT/root" "$dl"/*.deb
	lib=$RUNC13_ROOT/root/usr/lib/x86_64-linux-gnu
	[[ -e "$lib/ld-linux-x86-64.so.2" ]] || die "no ld-linux-x86-64.so.2 in sid's libc6 ($lib)"
	cp "$RUNC13_ROOT/root/usr/sbin/runc" "$RUNC13_BIN.tmp"
	patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --set-rpath "$lib" "$RUNC13_BIN.tmp"
	mv -f "$RUNC13_BIN.tmp" "$RUNC13_BIN"
	"$RUNC13_BIN" --version >/dev/null || die "$RUNC13_BIN does not run on this host"
	"$RUNC13_BIN" features >/dev/null || die "$RUNC13_BIN features fails on this host"
	log "runc 1.3: $("$RUNC13_BIN" --version | head -n1) ($RUNC13_BIN)"
}

runc_path_for() { # version: the runc binary of RSANDBOX_RUNC=version
	case "$1" in
	1.1) runc11_bin ;;
	1.3) echo "$RUNC13_BIN" ;;
	*) die "RSANDBOX_RUNC=$1: expected 1.1 or 1.3" ;;
	esac
}

# select_runc: $BIN/runc -> the runc of $RSANDBOX_RUNC (atomically)
select_runc() {
	local target
	target=$(runc_path_for "$RSANDBOX_RUNC")
	[[ -x "$target" ]] || die "runc $RSANDBOX_RUNC missing at $target (run hack/setup.sh)"
	mkdir -p "$BIN"
	if [[ "$(readlink "$BIN/runc" 2>/dev/null)" != "$target" ]]; then
		ln -sfn "$target" "$BIN/.runc.tmp"
		mv -Tf "$BIN/.runc.tmp" "$BIN/runc"
		log "runc $RSANDBOX_RUNC selected: $BIN/runc -> $target ($("$target" --version | head -n1))"
	fi
}
