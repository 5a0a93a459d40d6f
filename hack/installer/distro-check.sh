#!/usr/bin/env bash
# hack/installer/distro-check.sh - the node installer's node shapes (deploy/node/lib/distro.sh)
# on fixture trees, no node needed: for each shape under hack/installer/fixtures/distro/ (a
# host's files as that distribution writes them, each naming its source in a comment, and
# `units`: which systemd units are active or known there) the shape detected, the unit to
# restart, the config containerd loads, where the drop-in goes, the CRI socket and the install
# directory; the shapes whose containerd would not read a drop-in refused with the fix; CRI-O
# and a node without a known containerd unit refused by rsandbox-node.sh itself, exit status 3,
# nothing written and nothing restarted, and with `run` the pod staying, not Ready.
# Exit status 1 on the first wrong answer. Needs root (rsandbox-node.sh does).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
lib=$repo/deploy/node/lib
fixtures=$here/fixtures/distro

tmpd=$(mktemp -d)
pids=()
cleanup() {
	local p
	# each a session of its own (setsid): its `sleep infinity` goes with it (a sleep left
	# behind would keep every file descriptor this script inherited open, the bench lock too)
	for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done
	rm -rf "$tmpd"
}
trap cleanup EXIT

# the systemctl stand-in: answers from $UNITS ("active UNIT" / "known UNIT" lines), logs every
# call to $CALLS (a restart must never happen on a refused node)
cat >"$tmpd/systemctl" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$CALLS"
unit=${*: -1}
case "$1" in
is-active) grep -qx "active $unit" "$UNITS" ;;
show)
	case "$3" in
	LoadState) if grep -qE "^(active|known) $unit\$" "$UNITS"; then echo loaded; else echo not-found; fi ;;
	MainPID) echo 0 ;;
	*) echo ;;
	esac
	;;
*) exit 0 ;;
esac
EOF
chmod 755 "$tmpd/systemctl"

# shellcheck source=hack/installer/check-lib.sh
. "$here/check-lib.sh"

# tree FIXTURE: a copy of the fixture (the checks must not change the repository's files),
# with the empty directories git does not keep
tree() {
	rm -rf "$tmpd/root"
	mkdir -p "$tmpd/root"
	cp -a "$fixtures/$1/." "$tmpd/root/"
	mkdir -p "$tmpd/root/run" # the installer's lock directory goes there, as on a host
	case "$1" in
	eks) mkdir -p "$tmpd/root/etc/containerd/config.d" ;;
	cos) mkdir -p "$tmpd/root/home/kubernetes/bin" ;;
	esac
	UNITS=$tmpd/root/units CALLS=$tmpd/calls
	: >"$CALLS"
	export UNITS CALLS
}

# shape FIXTURE [DISTRO]: what lib/distro.sh makes of the fixture, one line:
# "<shape> <unit> <config> <drop-in> <socket or -> <install dir>", or "refused: <why>"
shape() {
	tree "$1"
	(
		# shellcheck source=deploy/node/lib/common.sh
		. "$lib/common.sh"
		# shellcheck source=deploy/node/lib/unit.sh
		. "$lib/unit.sh"
		# shellcheck source=deploy/node/lib/config.sh
		. "$lib/config.sh"
		# shellcheck source=deploy/node/lib/imports.sh
		. "$lib/imports.sh"
		# shellcheck source=deploy/node/lib/distro.sh
		. "$lib/distro.sh"
		HOST_ROOT=$tmpd/root HOST_EXEC="" SYSTEMCTL=$tmpd/systemctl HANDLER=rsandbox DISTRO=${2:-auto}
		CONTAINERD_UNIT=containerd.service INSTALL_DIR=/usr/local/bin CONTAINERD_CONFIG=""
		UNIT_SET="" INSTALL_DIR_SET=""
		# refuse exits: its message is the answer
		refuse() {
			echo "refused: $*"
			exit 0
		}
		resolve_distro
		CONFIG=$(containerd_config_path)
		why=$(distro_dropin "$DISTRO") || refuse "$why"
		echo "$DISTRO $CONTAINERD_UNIT $CONFIG $why ${DISTRO_SOCKET:--} $INSTALL_DIR"
	) 2>/dev/null
}

k3s_etc=/var/lib/rancher/k3s/agent/etc/containerd
rke2_etc=/var/lib/rancher/rke2/agent/etc/containerd
expect "containerd.service: conf.d beside config.toml (config.toml may get an imports entry)" "$(shape containerd)" \
	"containerd containerd.service /etc/containerd/config.toml /etc/containerd/conf.d/rsandbox.toml - /usr/local/bin"
expect "EKS nodeadm: the config.d/ its rendered config imports, never config.toml" "$(shape eks)" \
	"eks containerd.service /etc/containerd/config.toml /etc/containerd/config.d/rsandbox.toml - /usr/local/bin"
r=$(shape eks-no-imports)
expect "EKS nodeadm without a drop-in import: refused" "${r%%:*}" refused
expect "... with the fix (the NodeConfig's spec.containerd.config)" "$(grep -o 'spec.containerd.config' <<<"$r")" spec.containerd.config
expect "COS: the shim in /home/kubernetes/bin" "$(shape cos)" \
	"cos containerd.service /etc/containerd/config.toml /etc/containerd/conf.d/rsandbox.toml - /home/kubernetes/bin"
expect "k3s: config-v3.toml.d/ (imported by the rendered config), k3s.service, k3s' socket" "$(shape k3s)" \
	"k3s k3s.service $k3s_etc/config.toml $k3s_etc/config-v3.toml.d/rsandbox.toml /run/k3s/containerd/containerd.sock /usr/local/bin"
expect "rke2 agent: the same under /var/lib/rancher/rke2, rke2-agent.service" "$(shape rke2)" \
	"rke2 rke2-agent.service $rke2_etc/config.toml $rke2_etc/config-v3.toml.d/rsandbox.toml /run/k3s/containerd/containerd.sock /usr/local/bin"
r=$(shape k3s-no-imports)
expect "k3s whose rendered config imports no drop-in directory: refused" "${r%%:*}" refused
expect "... naming the template to give the imports" "$(grep -o "$k3s_etc/config.toml.tmpl" <<<"$r")" "$k3s_etc/config.toml.tmpl"
expect "k0s worker: /etc/k0s/containerd.d/, k0sworker.service, k0s' socket" "$(shape k0s)" \
	"k0s k0sworker.service /etc/k0s/containerd.toml /etc/k0s/containerd.d/rsandbox.toml /run/k0s/containerd.sock /usr/local/bin"
r=$(shape microk8s)
expect "microk8s whose template imports nothing: refused" "${r%%:*}" refused
expect "... naming containerd-template.toml" "$(grep -o 'containerd-template.toml' <<<"$r" | head -n1)" containerd-template.toml
# the fix applied: an imports entry in the template, rendered into containerd.toml
cp -a "$fixtures/microk8s" "$tmpd/microk8s-fixed"
sed -i 's|^version = 2$|version = 2\nimports = ["/var/snap/microk8s/current/args/containerd.d/*.toml"]|' \
	"$tmpd/microk8s-fixed/var/snap/microk8s/current/args/containerd.toml"
fixtures_orig=$fixtures
fixtures=$tmpd
expect "microk8s with the fix: the imported directory, the snap's unit and socket" "$(shape microk8s-fixed)" \
	"microk8s snap.microk8s.daemon-containerd.service /var/snap/microk8s/current/args/containerd.toml /var/snap/microk8s/current/args/containerd.d/rsandbox.toml /var/snap/microk8s/common/run/containerd.sock /usr/local/bin"
fixtures=$fixtures_orig
r=$(shape crio)
expect "CRI-O (crio.service): refused" "${r%%:*}" refused
expect "... saying so" "$(grep -o 'CRI-O' <<<"$r" | head -n1)" CRI-O
r=$(NODE_RUNTIME_VERSION=cri-o://1.31.0 shape containerd)
expect "CRI-O by the Node's containerRuntimeVersion (even beside a containerd.service): refused" "$(grep -o 'CRI-O (cri-o://1.31.0)' <<<"$r")" "CRI-O (cri-o://1.31.0)"
r=$(shape none)
expect "no known containerd unit: refused" "${r%%:*}" refused
r=$(shape k3s eks)
expect "--distro eks on a k3s node: refused" "$(grep -o 'this node is k3s' <<<"$r")" "this node is k3s"
expect "--distro k3s on a k3s node: taken" "$(shape k3s k3s | cut -d' ' -f1)" k3s

# rsandbox-node.sh itself on a refused node: exit 3, nothing written, nothing restarted
node() { # FIXTURE ARGS...: runs the installer on the fixture tree; its exit status in $rc
	local f=$1
	shift
	tree "$f"
	cp /bin/true "$tmpd/shim" # a binary (never run: the refusal comes first)
	(cd "$tmpd/root" && find . -path ./run -prune -o -print0 | sort -z | xargs -0 sha256sum -- 2>/dev/null) >"$tmpd/before" || true
	rc=0
	HOST_ROOT=$tmpd/root SYSTEMCTL=$tmpd/systemctl BINARY=$tmpd/shim KUBE_API="" KUBERNETES_SERVICE_HOST="" \
		STATE_DIR=/var/lib/rsandbox-node bash "$repo/deploy/node/rsandbox-node.sh" "$@" >"$tmpd/out" 2>&1 || rc=$?
	(cd "$tmpd/root" && find . -path ./run -prune -o -print0 | sort -z | xargs -0 sha256sum -- 2>/dev/null) >"$tmpd/after" || true
}
unchanged() { if cmp -s "$tmpd/before" "$tmpd/after"; then echo yes; else diff "$tmpd/before" "$tmpd/after" | head -n 5; fi; }
restarts() { grep -c '^restart' "$CALLS" || true; }

node crio install
expect "install on CRI-O: exit 3" "$rc" 3
expect "... one refusal line naming CRI-O" "$(grep -c 'refused: this node.s container runtime is CRI-O' "$tmpd/out")" 1
expect "... nothing written" "$(unchanged)" yes
expect "... nothing restarted" "$(restarts)" 0
node crio uninstall
expect "uninstall on CRI-O: nothing to do, exit 0" "$rc" 0
expect "... nothing restarted" "$(restarts)" 0
node none install
expect "install with no known containerd unit: exit 3" "$rc" 3
expect "... nothing written" "$(unchanged)" yes
node k3s-no-imports install
expect "install on k3s without a drop-in import: exit 3" "$rc" 3
expect "... nothing written" "$(unchanged)" yes
expect "... nothing restarted" "$(restarts)" 0
node k3s install --distro=k0s
expect "install --distro k0s on k3s: exit 3" "$rc" 3
node containerd install --distro=bogus
expect "--distro bogus: usage, exit 2" "$rc" 2

# `run install` on CRI-O: the pod stays up, not Ready (no READY_FILE), no crash loop
tree crio
cp /bin/true "$tmpd/shim"
HOST_ROOT=$tmpd/root SYSTEMCTL=$tmpd/systemctl BINARY=$tmpd/shim KUBE_API="" KUBERNETES_SERVICE_HOST="" READY_FILE=$tmpd/ready \
	setsid bash "$repo/deploy/node/rsandbox-node.sh" run install >"$tmpd/run.out" 2>&1 &
pids+=($!)
# it says so once the refusal is done (no time bound: a hang fails the outer CI's timeout)
until grep 'staying, not Ready' "$tmpd/run.out" >/dev/null; do
	kill -0 "${pids[-1]}" 2>/dev/null || break
	sleep 0.2
done
expect "run install on CRI-O: still running (no crash loop)" "$(kill -0 "${pids[-1]}" 2>/dev/null && echo running)" running
expect "... not Ready" "$([[ -e "$tmpd/ready" ]] && echo ready || echo not-ready)" not-ready
expect "... exit status 3 logged" "$(grep -c 'exit status 3: staying, not Ready' "$tmpd/run.out")" 1
expect "... nothing restarted" "$(restarts)" 0
kill -- "-${pids[-1]}" 2>/dev/null || true
# the pod's whole session goes with it: its `sleep infinity` too (left behind, it would keep
# this script's inherited descriptors open: under `flock`, the bench lock)
while kill -0 -- "-${pids[-1]}" 2>/dev/null; do sleep 0.2; done
expect "... its session gone once terminated (no sleep left behind)" "$(pgrep -s "${pids[-1]}" || echo none)" none

((fails == 0)) || exit 1
echo "node shapes: all answers right"
