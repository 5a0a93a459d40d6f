# shellcheck shell=bash
# hack/lib.sh - shared variables and functions of the rsandbox bench scripts.
#
# Sourced by hack/*.sh; it only defines things and leaves the caller's shell
# options alone (the callers run under `set -euo pipefail`).
#
# The bench is a private, real containerd made from Debian packages only:
#   - runc, iptables, iproute2, gcc, protoc ... from the host's own release
#     (never from a newer suite: sid's runc would drag in a newer glibc);
#   - containerd 2.1.9 and the CNI plugins from Debian sid, fetched with a
#     private apt state (the host's apt sources are never touched) and
#     extracted with `dpkg-deb -x` under $RSANDBOX_PREFIX;
#   - OCI images built locally from busybox-static (no registry is reached).
# Every containerd root/state dir, socket, log and the CNI config live under
# the prefix; see README / `hack/containerd.sh env`.
#
# Environment (all optional):
#   RSANDBOX_PREFIX              install/state prefix              (/opt/rsandbox)
#   RSANDBOX_CONTAINERD_SUITE    Debian suite for containerd + CNI (sid)
#   RSANDBOX_CONTAINERD_VERSION  Debian version of containerd; default: the
#                                newest 2.1.9 one the suite has, else its newest
#   RSANDBOX_DEBIAN_URI          Debian archive URI (default: read off apt's config)
#   RSANDBOX_SNAPSHOTTER         overlayfs|native (default: overlayfs if it mounts here)
#   RSANDBOX_SUBNET              pod subnet                        (10.88.0.0/16)
#   RSANDBOX_BRIDGE              bridge name                       (rsandbox0)
#   RSANDBOX_SHIM_SUBNET         subnet of shim-owned pod networks (10.90.0.0/16)
#   RSANDBOX_SHIM_BRIDGE         bridge of shim-owned pod networks (rsandbox1)
#   RSANDBOX_LOG_LEVEL           containerd log level (info; debug also makes
#                                containerd start the shims with -debug)
#   RSANDBOX_REFRESH=1           re-download the packages even when present

RSANDBOX_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

RSANDBOX_PREFIX=${RSANDBOX_PREFIX:-/opt/rsandbox}
RSANDBOX_CONTAINERD_SUITE=${RSANDBOX_CONTAINERD_SUITE:-sid}
RSANDBOX_CONTAINERD_VERSION=${RSANDBOX_CONTAINERD_VERSION:-}
RSANDBOX_SUBNET=${RSANDBOX_SUBNET:-10.88.0.0/16}
RSANDBOX_BRIDGE=${RSANDBOX_BRIDGE:-rsandbox0}
RSANDBOX_SHIM_SUBNET=${RSANDBOX_SHIM_SUBNET:-10.90.0.0/16}
RSANDBOX_SHIM_BRIDGE=${RSANDBOX_SHIM_BRIDGE:-rsandbox1}
RSANDBOX_LOG_LEVEL=${RSANDBOX_LOG_LEVEL:-info}

P=$RSANDBOX_PREFIX
BIN=$P/usr/bin
CNI_BIN=$P/usr/lib/cni
CONF_DIR=$P/conf
CONFIG=$CONF_DIR/containerd.toml
CNI_CONF_DIR=$CONF_DIR/cni/net.d
SHIM_CONFIG=$CONF_DIR/rsandbox.toml
SHIM_CNI_CONF_DIR=$CONF_DIR/cni/rsandbox.d
SHIM_CNI_NET=rsandbox-shim
SOCK=$P/run/containerd.sock
PIDFILE=$P/run/containerd.pid
LOGFILE=$P/log/containerd.log
ROOT_DIR=$P/var/lib/containerd
STATE_DIR=$P/run/containerd
RUNC_ROOT=$P/run/runc
IPAM_DIR=$P/var/lib/cni/networks
IMG_DIR=$P/images
SETUP_DONE=$P/.setup-complete
SHIM_NAME=containerd-shim-rsandbox-v1
SHIM_RUNTIME=io.containerd.rsandbox.v1
PAUSE_IMAGE=localhost/pause:3.10
BUSYBOX_IMAGE=localhost/busybox:latest
CNI_NET=rsandbox
NAMESPACES=(default k8s.io)
# the FORWARD guard rule; its comment lets stop find exactly our rule
GUARD_RULE=(FORWARD -s "$RSANDBOX_SUBNET" ! -d "$RSANDBOX_SUBNET" -m comment --comment rsandbox-bench -j DROP)
SHIM_GUARD_RULE=(FORWARD -s "$RSANDBOX_SHIM_SUBNET" ! -d "$RSANDBOX_SHIM_SUBNET" -m comment --comment rsandbox-bench -j DROP)
# host packages, from the host's own release (protobuf-compiler: the
# integration tests build tonic/prost code; gcc + libc6-dev: the static pause)
HOST_PACKAGES=(runc iptables iproute2 util-linux procps gcc libc6-dev protobuf-compiler pkg-config
	tar gzip ca-certificates debian-archive-keyring)

# rustup's cargo lives in ~/.cargo/bin, which non-login shells (sudo, CI) may lack
if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
	PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
# runc, iptables, findmnt ... live in sbin, which a non-root PATH may lack
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin:/sbin" ;; esac

log() { printf '[rsandbox] %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
section() { printf '\n=== %s ===\n' "$*" >&2; }
need_root() { [[ $EUID -eq 0 ]] || die "run as root (containerd, runc, mounts and iptables need it)"; }

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
	log "updating the private apt state for $RSANDBOX_CONTAINERD_SUITE ($P/apt)"
	apt_private apt-get update >/dev/null
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
		extract_debs "$P" "$dl"/containerd_*.deb "$dl"/containernetworking-plugins_*.deb
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
		extract_debs "$P/busybox" "$dl"/busybox-static_*.deb
	fi
	[[ -n "$(busybox_bin)" ]] || die "no busybox binary in $P/busybox"
	fetch_crictl
	write_versions
}

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
		if apt_private apt-cache show cri-tools >/dev/null 2>&1; then
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

write_versions() {
	{
		echo "containerd: $("$BIN/containerd" --version)"
		echo "runc: $(runc --version | head -n1)"
		echo "cni: $("$CNI_BIN/bridge" --version 2>&1 | head -n1)"
		echo "busybox: $("$(busybox_bin)" 2>&1 | head -n1)"
		if [[ -x "$BIN/crictl" ]]; then echo "crictl: $("$BIN/crictl" --version)"; else echo "crictl: none"; fi
		echo "debs:" "$(cd "$P/debs" && echo ./*.deb)"
	} >"$P/VERSIONS"
}

# --- config ------------------------------------------------------------------
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

config() { # writes the containerd config + CNI conflist; 0 when something changed
	local snap runc_bin restrict_oom changed=1
	snap=$(snapshotter)
	restrict_oom=false
	has_cap_sys_resource || restrict_oom=true
	runc_bin=$(command -v runc) || die "runc not found (run hack/setup.sh)"
	mkdir -p "$CONF_DIR" "$CNI_CONF_DIR" "$IPAM_DIR" "$P/opt" "$P/tmp" "$P/log" "$P/run" "$CONF_DIR/certs.d/_default"
	echo "$snap" >"$CONF_DIR/snapshotter"
	printf '%s\n' '# rsandbox bench: no registry is reached; images are built by hack/setup.sh' \
		'server = "http://127.0.0.1:1"' >"$CONF_DIR/certs.d/_default/hosts.toml"
	cat >"$CONFIG.tmp" <<EOF
# Written by hack/lib.sh (hack/setup.sh) - a local bench, everything under $P.
version = 3
root = '$ROOT_DIR'
state = '$STATE_DIR'
temp = '$P/tmp'

[grpc]
  address = '$SOCK'

[ttrpc]
  address = '$SOCK.ttrpc'

[debug]
  address = '$P/run/containerd-debug.sock'
  # 'debug' also makes containerd start the shims with -debug
  level = '$RSANDBOX_LOG_LEVEL'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = '$snap'

    # only the runc/podsandbox handler runs a pause container
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'

    # every registry resolves to a closed loopback port: pulls fail at once,
    # nothing is looked up or fetched off this machine
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '$CONF_DIR/certs.d'

  [plugins.'io.containerd.cri.v1.runtime']
    # network namespaces are bind-mounted under the state dir, not /var/run/netns
    netns_mounts_under_state_dir = true
    # without CAP_SYS_RESOURCE oom_score_adj cannot go below containerd's own;
    # the pause container's -998 would make runc create fail
    restrict_oom_score_adj = $restrict_oom
    enable_cdi = false

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      # containerd's own runc shim, CRI pods through the podsandbox controller
      # (kept for side-by-side comparisons)
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        sandboxer = 'podsandbox'

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$runc_bin'
          Root = '$RUNC_ROOT'
          SystemdCgroup = false

      # the shim of this project: binary $SHIM_NAME (found next to
      # containerd in $BIN), sandbox API served by the shim itself ("shim"
      # sandbox controller). No options table: it breaks containerd 2.1.9.
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]
        runtime_type = '$SHIM_RUNTIME'
        sandboxer = 'shim'

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$CNI_BIN']
      conf_dir = '$CNI_CONF_DIR'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.internal.v1.opt']
    path = '$P/opt'

  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '$P/image-verifier/bin'

  [plugins.'io.containerd.transfer.v1.local']
    config_path = '$CONF_DIR/certs.d'

  # containerd passes this env to 'containerd-shim-rsandbox-v1 start'; the shim
  # daemon inherits it and reads its own config file (shim-owned networking).
  [plugins.'io.containerd.shim.v1.manager']
    env = ['RSANDBOX_CONFIG=$SHIM_CONFIG']
EOF
	replace_if_changed "$CONFIG.tmp" "$CONFIG" && changed=0
	# The shim's own config: pods created without a netns (containerd's sandbox
	# controller API) get a netns and CNI from the shim, on their own bridge and
	# subnet. standalone_tasks stays off (ctr run behaves as with runc); tests
	# that need it rewrite this file for the shims they start.
	cat >"$SHIM_CONFIG.tmp" <<EOF
# Written by hack/lib.sh - containerd-shim-rsandbox-v1 configuration (see README).
[network]
sandboxes = true
standalone_tasks = false
cni_conf_dir = '$SHIM_CNI_CONF_DIR'
cni_bin_dirs = ['$CNI_BIN']
cni_cache_dir = '$P/var/lib/cni'
netns_dir = '$P/run/netns'
EOF
	replace_if_changed "$SHIM_CONFIG.tmp" "$SHIM_CONFIG" && changed=0
	mkdir -p "$SHIM_CNI_CONF_DIR"
	cat >"$SHIM_CNI_CONF_DIR/.10-$SHIM_CNI_NET.conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$SHIM_CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$RSANDBOX_SHIM_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$RSANDBOX_SHIM_SUBNET" }]],
        "dataDir": "$IPAM_DIR"
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
	replace_if_changed "$SHIM_CNI_CONF_DIR/.10-$SHIM_CNI_NET.conflist.tmp" "$SHIM_CNI_CONF_DIR/10-$SHIM_CNI_NET.conflist" && changed=0
	# Pods reach each other and the host (the bridge address) only: ipMasq
	# false and no default route, so nothing is routed off this machine.
	# Written to a dot-file and renamed: containerd watches this dir and would
	# read a half-written file.
	cat >"$CNI_CONF_DIR/.10-$CNI_NET.conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$RSANDBOX_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$RSANDBOX_SUBNET" }]],
        "dataDir": "$IPAM_DIR"
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
	replace_if_changed "$CNI_CONF_DIR/.10-$CNI_NET.conflist.tmp" "$CNI_CONF_DIR/10-$CNI_NET.conflist" && changed=0
	if ((changed == 0)); then
		log "config written: $CONFIG, $CNI_CONF_DIR/10-$CNI_NET.conflist (snapshotter $snap, restrict_oom_score_adj $restrict_oom)"
	else
		log "config unchanged: $CONFIG"
	fi
	return "$changed"
}

# --- process control ---------------------------------------------------------
containerd_pid() { # prints the pid when our containerd runs
	local pid
	[[ -f "$PIDFILE" ]] || return 1
	pid=$(<"$PIDFILE")
	[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	[[ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$BIN/containerd")" ]] || return 1
	echo "$pid"
}

ctr_() { "$BIN/ctr" --address "$SOCK" "$@"; }
crictl_() { "$BIN/crictl" --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" --timeout 30s "$@"; }

net_guard_on() { # keep pod traffic on this machine even when the bridge plugin turns on forwarding
	[[ -f "$P/run/ip_forward.orig" ]] || cat /proc/sys/net/ipv4/ip_forward >"$P/run/ip_forward.orig"
	iptables -C "${GUARD_RULE[@]}" 2>/dev/null || iptables -I "${GUARD_RULE[@]}" ||
		log "warning: could not add the iptables FORWARD guard"
	iptables -C "${SHIM_GUARD_RULE[@]}" 2>/dev/null || iptables -I "${SHIM_GUARD_RULE[@]}" ||
		log "warning: could not add the iptables FORWARD guard for the shim-owned subnet"
}

net_guard_off() {
	if command -v iptables >/dev/null; then
		while iptables -C "${GUARD_RULE[@]}" 2>/dev/null; do iptables -D "${GUARD_RULE[@]}"; done
		while iptables -C "${SHIM_GUARD_RULE[@]}" 2>/dev/null; do iptables -D "${SHIM_GUARD_RULE[@]}"; done
	fi
	if [[ -f "$P/run/ip_forward.orig" ]]; then
		cat "$P/run/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
		rm -f "$P/run/ip_forward.orig"
	fi
}

start() {
	local pid _
	if pid=$(containerd_pid); then
		log "containerd already running (pid $pid)"
		ensure_images
		return 0
	fi
	[[ -x "$BIN/containerd" ]] || die "$BIN/containerd missing: run hack/setup.sh"
	[[ -f "$CONFIG" ]] || config || true
	mkdir -p "$P/run" "$P/log" "$ROOT_DIR" "$STATE_DIR"
	rm -f "$SOCK" "$SOCK.ttrpc"
	net_guard_on
	[[ -x "$BIN/$SHIM_NAME" ]] || log "note: $BIN/$SHIM_NAME is not installed yet (hack/build.sh)"
	log "starting containerd, log $LOGFILE"
	# shims are looked up in PATH and next to the containerd binary: $BIN goes
	# first so that our shim and containerd-shim-runc-v2 win.
	# setsid may fork (when it leads a process group), so the pid is written
	# by the process that then execs containerd.
	rm -f "$PIDFILE"
	# shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
	PATH="$BIN:$PATH" setsid bash -c 'echo $$ >"$1" && shift && exec "$@"' \
		rsandbox-containerd "$PIDFILE" "$BIN/containerd" --config "$CONFIG" </dev/null >>"$LOGFILE" 2>&1 &
	for _ in $(seq 1 50); do
		[[ -s "$PIDFILE" ]] && break
		sleep 0.1
	done
	pid=$(cat "$PIDFILE" 2>/dev/null) || die "containerd did not start (see $LOGFILE)"
	for _ in $(seq 1 150); do
		if [[ -S "$SOCK" ]] && ctr_ version >/dev/null 2>&1 && containerd_pid >/dev/null; then
			log "containerd up (pid $pid, socket $SOCK)"
			ensure_images
			return 0
		fi
		# (only "alive" here: right after the fork /proc/$pid/exe is still bash/setsid)
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	tail -n 30 "$LOGFILE" >&2 || true
	die "containerd did not come up"
}

kill_pid() { # pid [seconds]: TERM, wait, KILL
	local pid=$1 t=${2:-10} _
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 $((t * 10))); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

bench_shim_pids() { # shims started by this bench's containerd (their -address is our socket)
	local d cmd
	for d in /proc/[0-9]*; do
		cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
		[[ "$cmd" == *containerd-shim*" -address $SOCK "* ]] && echo "${d#/proc/}"
	done
	return 0
}

runc_roots() { # runc roots that may hold containers of this bench
	local d
	for d in "$RUNC_ROOT"/*/ /run/containerd/runc/*/; do
		[[ -d "$d" ]] && echo "${d%/}"
	done
	return 0
}

bench_runc_containers() { # "root id" of runc containers whose bundle is under our state dir
	local root id bundle
	command -v runc >/dev/null || return 0
	while read -r root; do
		for id in $(runc --root "$root" list -q 2>/dev/null); do
			bundle=$(runc --root "$root" state "$id" 2>/dev/null | sed -n 's/^ *"bundle": *"\(.*\)",\{0,1\}$/\1/p')
			# /run/containerd/runc/<ns> is shared with any other containerd:
			# only touch containers whose bundle is ours
			[[ "$root" == "$RUNC_ROOT"/* || "$bundle" == "$P"/* ]] && echo "$root $id"
		done
	done < <(runc_roots)
	return 0
}

kill_all_tasks() { # every task in every namespace, so the shims exit on their own
	local ns id
	# CRI pods first, through CRI: that also tears down their network and
	# removes their netns (crictl only when Debian or the user gave us one)
	if [[ -x "$BIN/crictl" ]] && [[ -n "$(crictl_ pods -q 2>/dev/null)" ]]; then
		log "removing CRI pods"
		timeout 120 "$BIN/crictl" --runtime-endpoint "unix://$SOCK" --timeout 30s rmp -a -f >/dev/null 2>&1 ||
			log "warning: crictl rmp -a -f failed"
	fi
	for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
		for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
			ctr_ -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
		done
		for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
			ctr_ -n "$ns" tasks rm -f "$id" >/dev/null 2>&1 || true
		done
	done
}

reset_objects() { # kill every task, remove every container and sandbox record; images stay
	local ns id
	containerd_pid >/dev/null || die "containerd is not running"
	kill_all_tasks
	for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
		for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
			log "removing container $ns/$id"
			ctr_ -n "$ns" containers rm "$id" >/dev/null 2>&1 || log "warning: cannot remove container $ns/$id"
		done
		for id in $(ctr_ -n "$ns" sandboxes ls 2>/dev/null | awk 'NR > 1 { print $1 }'); do
			log "removing sandbox $ns/$id"
			ctr_ -n "$ns" sandboxes rm -f "$id" >/dev/null 2>&1 || log "warning: cannot remove sandbox $ns/$id"
		done
	done
}

stop() {
	local pid id root
	if pid=$(containerd_pid); then
		kill_all_tasks
		log "stopping containerd (pid $pid)"
		kill_pid "$pid" 20
	fi
	rm -f "$PIDFILE"
	# containers whose shim is gone
	bench_runc_containers | while read -r root id; do
		log "runc delete --force $id (root $root)"
		runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
	done
	for pid in $(bench_shim_pids); do
		log "killing leftover shim pid $pid: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-120)"
		kill_pid "$pid" 5
	done
	umount_leftovers
	# after a crash (shim or containerd killed), bundles and shim sockets stay;
	# containerd is down and our shims are gone, so they are dead for sure
	for d in "$STATE_DIR"/io.containerd.runtime.v2.task/*/*/; do
		[[ -d "$d" ]] || continue
		log "removing dead task bundle ${d%/}"
		rm -rf "${d:?}"
	done
	for d in $(stale_shim_sockets); do
		log "removing stale shim socket $d"
		rm -f "$d"
	done
	# every pod is gone now: drop stale IP leases
	rm -rf "${IPAM_DIR:?}/$CNI_NET"
	net_guard_off
	rm -f "$SOCK" "$SOCK.ttrpc"
	log "containerd stopped"
}

stale_shim_sockets() { # sockets in /run/containerd/s that nobody listens on
	local s listening
	compgen -G '/run/containerd/s/*' >/dev/null || return 0
	# bound unix sockets of this netns (shims live in the host's); path is field 8
	listening=$(awk 'NR > 1 && $8 ~ "^/run/containerd/s/" { print $8 }' /proc/net/unix)
	for s in /run/containerd/s/*; do
		[[ -S "$s" ]] || continue
		grep -qxF "$s" <<<"$listening" || echo "$s"
	done
	return 0
}

umount_leftovers() {
	local m
	# deepest first; netns bind mounts and rootfs mounts under the prefix
	findmnt -rn -o TARGET | awk -v p="$P/" 'index($0, p) == 1' | sort -r | while read -r m; do
		m=$(printf '%b' "$m") # findmnt -r escapes blanks as \x20
		log "unmounting leftover $m"
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
	done
}

clean() { # stop + remove containerd's state (metadata, snapshots, leases) and the bridge
	stop
	log "removing state under $P (var, run, tmp)"
	rm -rf "${P:?}/var" "${P:?}/run" "${P:?}/tmp"
	ip link del "$RSANDBOX_BRIDGE" 2>/dev/null || true
	ip link del "$RSANDBOX_SHIM_BRIDGE" 2>/dev/null || true
}

status() {
	local pid ns
	if [[ -x "$BIN/$SHIM_NAME" ]]; then
		echo "shim: $BIN/$SHIM_NAME ($(stat -c '%s bytes, %y' "$BIN/$SHIM_NAME"))"
	else
		echo "shim: not installed ($BIN/$SHIM_NAME; run hack/build.sh)"
	fi
	if pid=$(containerd_pid); then
		echo "containerd running: pid $pid, socket $SOCK, config $CONFIG, log $LOGFILE"
		ctr_ version
		for ns in "${NAMESPACES[@]}"; do
			echo "images in $ns: $(ctr_ -n "$ns" images ls -q | tr '\n' ' ')"
		done
		echo "shims: $(bench_shim_pids | tr '\n' ' ')"
	else
		echo "containerd not running (prefix $P)"
		return 1
	fi
}

print_env() {
	cat <<EOF
export PATH="$BIN:\$PATH"
export CONTAINERD_ADDRESS="$SOCK"
export CONTAINERD_SNAPSHOTTER="$(cat "$CONF_DIR/snapshotter" 2>/dev/null || echo overlayfs)"
export CONTAINER_RUNTIME_ENDPOINT="unix://$SOCK"
export IMAGE_SERVICE_ENDPOINT="unix://$SOCK"
EOF
}

install_shim() { # path: copy a built shim in atomically (running shims keep the old inode)
	local src=$1 tmp
	[[ -f "$src" && -x "$src" ]] || die "no executable shim at $src"
	mkdir -p "$BIN"
	tmp=$(mktemp "$BIN/.$SHIM_NAME.XXXXXX")
	cp "$src" "$tmp"
	chmod 0755 "$tmp"
	mv -f "$tmp" "$BIN/$SHIM_NAME"
	log "installed $BIN/$SHIM_NAME (from $src)"
}

# --- images ------------------------------------------------------------------
write_pause_c() {
	cat >"$1" <<'EOF'
/* pause for the local bench: sleeps in pause(2), reaps children, exits on TERM/INT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	struct sigaction sa;
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("rsandbox-pause 1");
		return 0;
	}
	if (getpid() != 1) fprintf(stderr, "pause: not pid 1\n");
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) return 1;
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) return 2;
	for (;;) pause();
}
EOF
}

# Debian's busybox-static has no pgrep/ipcs applets; critest's stock busybox
# image has them, so the image carries two small stand-ins.
write_busybox_helpers() { # rootfs
	cat >"$1/bin/pgrep" <<'EOF'
#!/bin/sh
# pgrep stand-in (bench image): pgrep [-f] PATTERN -> matching pids
full=0
[ "$1" = -f ] && { full=1; shift; }
[ $# -eq 1 ] || { echo "usage: pgrep [-f] PATTERN" >&2; exit 2; }
rc=1
for d in /proc/[0-9]*; do
	pid=${d#/proc/}
	[ "$pid" = "$$" ] && continue
	if [ $full = 1 ]; then
		name=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
	else
		name=$(cat "$d/comm" 2>/dev/null) || continue
	fi
	echo "$name" | grep -qE -- "$1" && { echo "$pid"; rc=0; }
done
exit $rc
EOF
	cat >"$1/bin/ipcs" <<'EOF'
#!/bin/sh
# ipcs stand-in (bench image): shared memory segments from /proc/sysvipc/shm
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm 2>/dev/null | while read -r key shmid perms size cpid lpid nattch uid rest; do
	printf '%-10s %-10s %-10s %-10s %-10s %-10s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
EOF
	chmod 0755 "$1/bin/pgrep" "$1/bin/ipcs"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# oci_archive NAME ROOTFS OUT.tar ENTRYPOINT_JSON CMD_JSON
# Writes an OCI image layout tarball with one gzip layer, reproducibly (fixed
# owners and mtimes), so a rebuild gives the same digests.
oci_archive() {
	local name=$1 rootfs=$2 out=$3 entrypoint=$4 cmd=$5
	local w arch layer_tar diff_id layer_gz layer_digest cfg cfg_digest man man_digest
	arch=$(dpkg --print-architecture)
	w=$(mktemp -d "$P/tmp/oci.XXXXXX")
	mkdir -p "$w/layout/blobs/sha256"
	layer_tar=$w/layer.tar
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
		-C "$rootfs" -cf "$layer_tar" .
	diff_id=$(sha256_of "$layer_tar")
	gzip -n -9 -c "$layer_tar" >"$w/layer.tar.gz"
	layer_digest=$(sha256_of "$w/layer.tar.gz")
	mv "$w/layer.tar.gz" "$w/layout/blobs/sha256/$layer_digest"
	layer_gz=$w/layout/blobs/sha256/$layer_digest

	cfg=$w/config.json
	printf '%s' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
\"config\":{\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"],\
\"Entrypoint\":$entrypoint,\"Cmd\":$cmd,\"WorkingDir\":\"/\"},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$diff_id\"]},\
\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"rsandbox hack/setup.sh\"}]}" >"$cfg"
	cfg_digest=$(sha256_of "$cfg")

	man=$w/manifest.json
	printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$cfg_digest\",\"size\":$(size_of "$cfg")},\
\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer_digest\",\"size\":$(size_of "$layer_gz")}]}" >"$man"
	man_digest=$(sha256_of "$man")
	mv "$cfg" "$w/layout/blobs/sha256/$cfg_digest"
	printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\
\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$man_digest\",\"size\":$(size_of "$man"),\
\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"},\
\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}]}" >"$w/layout/index.json"
	mv "$man" "$w/layout/blobs/sha256/$man_digest"
	printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$w/layout/oci-layout"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
		-C "$w/layout" -cf "$out.part" oci-layout index.json blobs
	mv "$out.part" "$out"
	rm -rf "$w"
	log "built $name -> $out (manifest sha256:$man_digest)"
}

base_rootfs() { # dir: the skeleton both images share
	local r=$1
	mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,dev,proc,sys,root,var,run,tmp,home}
	chmod 1777 "$r/tmp"
	chmod 0700 "$r/root"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
	: >"$r/etc/hosts"
	: >"$r/etc/resolv.conf"
}

build_images() {
	local b=$P/tmp/build bb applet
	bb=$(busybox_bin)
	[[ -n "$bb" ]] || die "no busybox under $P/busybox: run hack/setup.sh"
	mkdir -p "$IMG_DIR" "$P/src" "$P/tmp"
	rm -rf "$b"
	mkdir -p "$b"

	# busybox: like the stock busybox image, every applet is a hard link in
	# /bin (a symlink would let a masked path such as /bin/ls mask busybox itself)
	base_rootfs "$b/busybox"
	cp "$bb" "$b/busybox/bin/busybox"
	for applet in $("$bb" --list); do
		[[ -e "$b/busybox/bin/$applet" ]] || ln "$b/busybox/bin/busybox" "$b/busybox/bin/$applet"
	done
	write_busybox_helpers "$b/busybox"
	oci_archive "$BUSYBOX_IMAGE" "$b/busybox" "$IMG_DIR/busybox.oci.tar" '["/bin/sh"]' 'null'

	# pause: one static binary (fallback: busybox sleeping in a loop)
	mkdir -p "$b/pause"
	write_pause_c "$P/src/pause.c"
	if gcc -static -Os -s -o "$b/pause/pause" "$P/src/pause.c" 2>"$P/tmp/pause-gcc.log"; then
		oci_archive "$PAUSE_IMAGE" "$b/pause" "$IMG_DIR/pause.oci.tar" '["/pause"]' 'null'
	else
		log "warning: static gcc build failed ($(head -n1 "$P/tmp/pause-gcc.log")), pause = busybox sleep loop"
		base_rootfs "$b/pause"
		cp "$bb" "$b/pause/bin/busybox"
		ln -sf /bin/busybox "$b/pause/bin/sh"
		ln -sf /bin/busybox "$b/pause/bin/sleep"
		oci_archive "$PAUSE_IMAGE" "$b/pause" "$IMG_DIR/pause.oci.tar" \
			'["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]' 'null'
	fi
	rm -rf "$b"
}

ensure_images() { # build the tarballs if missing, import what a namespace lacks
	local ns snap have img
	[[ -f "$IMG_DIR/busybox.oci.tar" && -f "$IMG_DIR/pause.oci.tar" && "${RSANDBOX_REFRESH:-0}" != 1 ]] || build_images
	snap=$(snapshotter)
	for ns in "${NAMESPACES[@]}"; do
		have=$(ctr_ -n "$ns" images ls -q)
		for img in busybox:"$BUSYBOX_IMAGE" pause:"$PAUSE_IMAGE"; do
			grep -qxF "${img#*:}" <<<"$have" && continue
			log "importing ${img#*:} into namespace $ns"
			ctr_ -n "$ns" images import --snapshotter "$snap" "$IMG_DIR/${img%%:*}.oci.tar" >/dev/null
		done
		have=$(ctr_ -n "$ns" images ls -q)
		for img in "$BUSYBOX_IMAGE" "$PAUSE_IMAGE"; do
			grep -qxF "$img" <<<"$have" || die "import of $img into $ns failed"
		done
	done
}

setup() {
	local pid
	need_root
	deps
	fetch
	if config && pid=$(containerd_pid); then
		log "config changed while containerd runs (pid $pid): restarting it"
		stop
	fi
	start
	: >"$SETUP_DONE"
	log "$(head -n1 "$P/VERSIONS")"
	log "crictl: $(sed -n 's/^crictl: //p' "$P/VERSIONS")"
	log "setup complete; env: eval \"\$(hack/containerd.sh env)\""
}
