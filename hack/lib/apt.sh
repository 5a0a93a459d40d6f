# shellcheck shell=bash
# hack/lib/apt.sh - packages: the host's own (its release only) and containerd, the
# CNI plugins, busybox-static and crictl from a private apt state under the
# prefix (the system's apt sources are never touched); VERSIONS.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

host_codename() {
	local VERSION_CODENAME=
	# shellcheck disable=SC1091
	. /etc/os-release
	[[ -n "$VERSION_CODENAME" ]] || die "no VERSION_CODENAME in /etc/os-release"
	echo "$VERSION_CODENAME"
}

pkg_installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

# --- host packages -----------------------------------------------------------
deps() {
	local want=() p codename
	for p in "${HOST_PACKAGES[@]}"; do pkg_installed "$p" || want+=("$p"); done
	if ((${#want[@]} == 0)); then
		log "host packages present: ${HOST_PACKAGES[*]}"
		return 0
	fi
	codename=$(host_codename)
	log "installing from $codename: ${want[*]}"
	# -t <host release>: should the sources hold a newer suite too, its runc
	# would win and apt would upgrade libc6 for it.
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -q --no-install-recommends -t "$codename" "${want[@]}"; then
		apt-get update -q
		apt-get install -y -q --no-install-recommends -t "$codename" "${want[@]}"
	fi
}

# --- packages from another suite, through a private apt state -----------------
debian_uri() {
	if [[ -n "${RSANDBOX_DEBIAN_URI:-}" ]]; then
		echo "${RSANDBOX_DEBIAN_URI%/}"
		return
	fi
	local codename uri
	codename=$(host_codename)
	# shellcheck disable=SC2016 # apt's own $(FIELD) placeholders
	uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
		awk -v c="$codename" '$2 == c { print $1; exit }')
	if [[ -z "$uri" ]]; then
		uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list |
			grep -oE '(https?|file)://[^ ]*debian[^ ]*' | grep -v -- '-security' | head -n1) || true
	fi
	[[ -n "$uri" ]] || die "cannot find the Debian archive URI in apt's config; set RSANDBOX_DEBIAN_URI"
	echo "${uri%/}"
}

# apt_private apt-get|apt-cache ARGS: apt with a sources list holding only
# $RSANDBOX_CONTAINERD_SUITE, its lists and cache under the prefix
apt_private() {
	local tool=$1 d=$P/apt
	shift
	"$tool" -o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts="$d/empty" \
		-o Dir::Etc::Preferences="$d/empty/none" -o Dir::Etc::PreferencesParts="$d/empty" \
		-o Dir::State::Lists="$d/lists" -o Dir::State::Status="$d/status" \
		-o Dir::Cache="$d/cache" -o APT::Default-Release= -o APT::Sandbox::User=root -q "$@"
}

apt_private_update() {
	local d=$P/apt keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	[[ -n "${_APT_PRIVATE_FRESH:-}" ]] && return 0
	[[ -r "$keyring" ]] || die "missing $keyring (package debian-archive-keyring)"
	mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/empty"
	# an empty dpkg status: the private state must not think host packages are
	# installed (it only downloads, it never installs)
	: >"$d/status"
	printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$(debian_uri)" "$RSANDBOX_CONTAINERD_SUITE" >"$d/sources.list"
	log "updating the private apt state for $RSANDBOX_CONTAINERD_SUITE ($P/apt): the suite's package lists, a minute or two"
	with_heartbeat "apt-get update ($RSANDBOX_CONTAINERD_SUITE)" apt_private apt-get update >/dev/null
	_APT_PRIVATE_FRESH=1
}

extract_debs() { # dest deb...
	local dest=$1 deb
	shift
	mkdir -p "$dest"
	for deb in "$@"; do dpkg-deb -x "$deb" "$dest"; done
}

containerd_pick_version() { # the Debian version of containerd to fetch
	local versions v
	if [[ -n "$RSANDBOX_CONTAINERD_VERSION" ]]; then
		echo "$RSANDBOX_CONTAINERD_VERSION"
		return
	fi
	versions=$(apt_private apt-cache madison containerd | awk -F'|' '{ gsub(/ /, "", $2); print $2 }')
	# the project targets containerd 2.1.9: take it when the suite still has it
	v=$(grep -E '^([0-9]+:)?2\.1\.9([~+-]|$)' <<<"$versions" | head -n1) || true
	if [[ -z "$v" ]]; then
		v=$(head -n1 <<<"$versions")
		[[ -n "$v" ]] || die "no containerd in $RSANDBOX_CONTAINERD_SUITE"
		log "WARNING: $RSANDBOX_CONTAINERD_SUITE has no containerd 2.1.9 any more; using $v" \
			"(set RSANDBOX_CONTAINERD_VERSION to pin another one)"
	fi
	echo "$v"
}

busybox_bin() { # the extracted static busybox (bin/ before usrmerge, usr/bin/ after)
	local f
	for f in "$P/busybox/bin/busybox" "$P/busybox/usr/bin/busybox"; do
		[[ -x "$f" ]] && {
			echo "$f"
			return 0
		}
	done
	return 0
}

fetch() {
	local dl=$P/debs codename v
	mkdir -p "$dl"
	if [[ "${RSANDBOX_REFRESH:-0}" = 1 || ! -x "$BIN/containerd" || ! -x "$CNI_BIN/bridge" ]]; then
		apt_private_update
		v=$(containerd_pick_version)
		log "downloading containerd $v + containernetworking-plugins from $RSANDBOX_CONTAINERD_SUITE"
		rm -f "$dl"/containerd_*.deb "$dl"/containernetworking-plugins_*.deb
		(cd "$dl" && apt_private apt-get download "containerd=$v" containernetworking-plugins)
		with_heartbeat "extracting containerd and the CNI plugins" extract_debs "$P" "$dl"/containerd_*.deb "$dl"/containernetworking-plugins_*.deb
	fi
	"$BIN/containerd" --version >/dev/null || die "$BIN/containerd does not run on this host"
	[[ -x "$BIN/ctr" && -x "$BIN/containerd-shim-runc-v2" ]] || die "ctr / containerd-shim-runc-v2 missing in $BIN"
	[[ -x "$CNI_BIN/bridge" && -x "$CNI_BIN/host-local" && -x "$CNI_BIN/loopback" && -x "$CNI_BIN/portmap" ]] ||
		die "CNI plugins missing in $CNI_BIN"
	if [[ "${RSANDBOX_REFRESH:-0}" = 1 || -z "$(busybox_bin)" ]]; then
		codename=$(host_codename)
		log "downloading busybox-static from $codename"
		rm -f "$dl"/busybox-static_*.deb
		(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "busybox-static/$codename") ||
			(apt-get update -q >/dev/null && cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "busybox-static/$codename")
		rm -rf "$P/busybox"
		with_heartbeat "extracting busybox-static" extract_debs "$P/busybox" "$dl"/busybox-static_*.deb
	fi
	[[ -n "$(busybox_bin)" ]] || die "no busybox binary in $P/busybox"
	fetch_crictl
}

cri_tools_in_private_suite() { apt_private apt-cache show cri-tools >/dev/null 2>&1; }

# crictl is a convenience only: Debian packages it as cri-tools in some
# suites. Look in the host's release first, then in the private suite.
fetch_crictl() {
	local dl=$P/debs codename
	[[ "${RSANDBOX_REFRESH:-0}" = 1 || ! -x "$BIN/crictl" ]] || return 0
	[[ ! -f "$P/apt/no-cri-tools" || "${RSANDBOX_REFRESH:-0}" = 1 ]] || return 0
	rm -f "$dl"/cri-tools_*.deb
	codename=$(host_codename)
	if apt-cache show "cri-tools/$codename" >/dev/null 2>&1; then
		log "downloading cri-tools (crictl) from $codename"
		(cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "cri-tools/$codename")
	else
		apt_private_update
		if with_heartbeat "looking for cri-tools in $RSANDBOX_CONTAINERD_SUITE" cri_tools_in_private_suite; then
			log "downloading cri-tools (crictl) from $RSANDBOX_CONTAINERD_SUITE"
			(cd "$dl" && apt_private apt-get download cri-tools)
		else
			log "no cri-tools package in $codename or $RSANDBOX_CONTAINERD_SUITE: no crictl (optional)"
			: >"$P/apt/no-cri-tools" # remembered, so later runs do not ask again
			return 0
		fi
	fi
	# only usr/bin/crictl is wanted; extract aside and copy it in
	rm -rf "$P/tmp/cri-tools"
	extract_debs "$P/tmp/cri-tools" "$dl"/cri-tools_*.deb
	install -m 0755 "$(find "$P/tmp/cri-tools" -type f -name crictl | head -n1)" "$BIN/crictl"
	rm -rf "$P/tmp/cri-tools"
}

gnuplot_install() { # gnuplot-nox (hack/bench.sh's chart), from the host's release
	command -v gnuplot >/dev/null && return 0
	log "installing gnuplot-nox (the benchmark's chart) from $(host_codename)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null; } ||
		log "warning: gnuplot-nox could not be installed: no chart"
}

write_versions() {
	{
		echo "containerd: $("$BIN/containerd" --version)"
		echo "runc: $("$BIN/runc" --version | head -n1) (RSANDBOX_RUNC=$RSANDBOX_RUNC)"
		echo "runc 1.1: $("$(runc11_bin)" --version | head -n1)"
		echo "runc 1.3: $("$RUNC13_BIN" --version 2>/dev/null | head -n1)"
		echo "cni: $("$CNI_BIN/bridge" --version 2>&1 | head -n1)"
		echo "busybox: $("$(busybox_bin)" 2>&1 | head -n1)"
		if [[ -x "$BIN/crictl" ]]; then echo "crictl: $("$BIN/crictl" --version)"; else echo "crictl: none"; fi
		echo "debs:" "$(cd "$P/debs" && echo ./*.deb)"
	} >"$P/VERSIONS"
}
