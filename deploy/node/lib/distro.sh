# shellcheck shell=bash
# deploy/node/lib/distro.sh - which node shape this is, and where its containerd reads.
#
# Kubernetes distributions run containerd differently, and a file written where that
# containerd does not read (or where a bootstrapper overwrites it) is the worst installer bug
# there is. The shapes recognised, and what each means for the installer:
#
#   containerd  containerd.service reading /etc/containerd/config.toml (or its --config): the
#               drop-in in conf.d, plus one imports entry in config.toml where none reads it.
#   eks         Amazon Linux 2023 with nodeadm (nodeadm-config.service, nodeadm-run.service:
#               awslabs/amazon-eks-ami templates/al2023/runtime/rootfs/etc/systemd/system/):
#               nodeadm writes /etc/containerd/config.toml at every boot
#               (nodeadm/internal/containerd/config.go writeContainerdConfig), so an imports
#               entry added there is lost; the drop-in goes into a directory the rendered
#               config already imports (/etc/containerd/config.d/*.toml, as the AL2 config
#               files/containerd-config.toml does and a NodeConfig's spec.containerd.config can).
#   cos         GKE's Container-Optimized OS (/etc/os-release ID=cos): / and /usr are
#               read-only and GKE's containerd finds its shims in /home/kubernetes/bin, the
#               shim's install directory there; the config as for `containerd`.
#   k3s, rke2   containerd embedded, started by k3s.service / k3s-agent.service or
#               rke2-server.service / rke2-agent.service as their child; its config.toml under
#               /var/lib/rancher/{k3s,rke2}/agent/etc/containerd/ is rendered from
#               config-v3.toml.tmpl (or config.toml.tmpl, or the built-in template) at every
#               start (k3s pkg/agent/containerd/config.go), so it is never edited: the drop-in
#               goes into the versioned drop-in directory (config-v3.toml.d/, config.toml.d/
#               for a version-2 config) only when the rendered config imports it (as kata-deploy
#               does); otherwise the install is refused with the fix. CRI socket
#               /run/k3s/containerd/containerd.sock (both).
#   k0s         k0sworker.service / k0scontroller.service run containerd with
#               --config=/etc/k0s/containerd.toml --address=/run/k0s/containerd.sock (k0s
#               docs/runtime.md); k0s merges the CRI sections of /etc/k0s/containerd.d/*.toml
#               into the config it generates (/run/k0s/containerd-cri.toml, imported by its
#               containerd.toml) when it starts: the drop-in goes into containerd.d/, and
#               only containerd restarted by k0s shows whether it was read.
#   microk8s    snap.microk8s.daemon-containerd.service renders args/containerd.toml from
#               args/containerd-template.toml at start (/var/snap/microk8s/current/args/),
#               socket /var/snap/microk8s/common/run/containerd.sock: the drop-in goes into a
#               directory the rendered config imports, otherwise refused with the fix (an
#               imports entry in containerd-template.toml).
# Everything else is refused at once, before anything is changed (exit 3; with `run` the pod
# stays, not Ready, without a restart): a node whose runtime is CRI-O (its unit, or
# `cri-o://` in the Node's status.nodeInfo.containerRuntimeVersion), a containerd not run by a
# systemd unit the installer knows, a declared --distro the node is not.

# shellcheck disable=SC2034 # read by rsandbox-node.sh
DISTROS="containerd eks cos k3s rke2 k0s microk8s"

# unit_active UNIT: systemd runs UNIT now
unit_active() { systemctl_ is-active --quiet "$1" 2>/dev/null; }
# unit_known UNIT: systemd has a unit file for UNIT (loaded, whether it runs or not)
unit_known() { [[ "$(systemctl_ show --property LoadState --value "$1" 2>/dev/null)" == loaded ]]; }

# os_release_id: ID= of the host's /etc/os-release
os_release_id() {
	sed -n 's/^ID=//p' "$(hp /etc/os-release)" 2>/dev/null | tr -d '"'\' | head -n1
}

# node_runtime_version: the Node's status.nodeInfo.containerRuntimeVersion (the kubelet's view
# of its CRI: "containerd://2.1.5-k3s1", "cri-o://1.31.0"); empty without an API.
# NODE_RUNTIME_VERSION set: that (a test's, or a hand-run's)
node_runtime_version() {
	if [[ -n "${NODE_RUNTIME_VERSION:-}" ]]; then
		echo "$NODE_RUNTIME_VERSION"
		return
	fi
	declare -F kube_configured >/dev/null && kube_configured && [[ -n "${NODE_NAME:-}" ]] || return 0
	kube GET "/api/v1/nodes/$NODE_NAME" 2>/dev/null | jq -r '.status.nodeInfo.containerRuntimeVersion // empty' 2>/dev/null || true
}

# detect_distro: prints the shape's name and its unit ("k3s k3s-agent.service"), or fails
# (status 1) with the reason and what to do on stdout
detect_distro() {
	local rv u
	rv=$(node_runtime_version)
	if [[ "$rv" == cri-o://* ]] || { unit_active crio.service && ! unit_active containerd.service; }; then
		echo "this node's container runtime is CRI-O${rv:+ ($rv)}: rsandbox is a containerd shim and runs only under containerd. Keep the DaemonSet off such nodes (a nodeSelector or node affinity on a label your containerd nodes carry)"
		return 1
	fi
	# the distributions' own units first: their containerd is not containerd.service
	if unit_active snap.microk8s.daemon-containerd.service; then
		echo "microk8s snap.microk8s.daemon-containerd.service"
		return
	fi
	for u in rke2-server rke2-agent; do
		unit_active "$u.service" && {
			echo "rke2 $u.service"
			return
		}
	done
	for u in k3s k3s-agent; do
		unit_active "$u.service" && {
			echo "k3s $u.service"
			return
		}
	done
	for u in k0sworker k0scontroller; do
		unit_active "$u.service" && {
			echo "k0s $u.service"
			return
		}
	done
	if unit_active containerd.service; then
		if unit_known nodeadm-config.service || unit_known nodeadm-run.service; then
			echo "eks containerd.service"
		elif [[ "$(os_release_id)" == cos ]]; then
			echo "cos containerd.service"
		else
			echo "containerd containerd.service"
		fi
		return
	fi
	echo "no containerd run by a systemd unit the installer knows (containerd.service, k3s, k3s-agent, rke2-server, rke2-agent, k0sworker, k0scontroller, snap.microk8s.daemon-containerd) is active${rv:+ (the Node reports $rv)}: start containerd under systemd, or install rsandbox by hand (docs/install.md)"
	return 1
}

# distro_defaults NAME UNIT: the shape's unit and install directory where the options did not
# set them (UNIT_SET, INSTALL_DIR_SET), and DISTRO_CONFIG, DISTRO_SOCKET: the config and CRI
# socket used when neither the options nor containerd's command line name them. Also what the
# installer must know of the shape:
#   DISTRO_EDITS_CONFIG=1: config.toml is nobody's rendering (containerd, COS until its next
#     boot): the installer may add its imports entry there;
#   DISTRO_MERGES_AT_START=1: the shape merges its drop-in directory into the config it
#     generates when it starts containerd (k0s): the dump before the restart cannot show the
#     drop-in or the handler, CRI after the restart does.
# shellcheck disable=SC2034 # DISTRO_*, INSTALL_DIR: read by rsandbox-node.sh and lib/config.sh
distro_defaults() {
	local name=$1 unit=$2 base
	[[ -n "${UNIT_SET:-}" ]] || CONTAINERD_UNIT=$unit
	DISTRO_EDITS_CONFIG=0 DISTRO_MERGES_AT_START=0
	[[ "$name" == containerd || "$name" == cos ]] && DISTRO_EDITS_CONFIG=1
	[[ "$name" == k0s ]] && DISTRO_MERGES_AT_START=1
	case "$name" in
	k3s | rke2)
		base=/var/lib/rancher/$name/agent/etc/containerd
		DISTRO_CONFIG=$base/config.toml
		DISTRO_SOCKET=/run/k3s/containerd/containerd.sock
		;;
	k0s)
		DISTRO_CONFIG=/etc/k0s/containerd.toml
		DISTRO_SOCKET=/run/k0s/containerd.sock
		;;
	microk8s)
		DISTRO_CONFIG=/var/snap/microk8s/current/args/containerd.toml
		DISTRO_SOCKET=/var/snap/microk8s/common/run/containerd.sock
		;;
	cos)
		[[ -n "${INSTALL_DIR_SET:-}" ]] || INSTALL_DIR=/home/kubernetes/bin
		;;
	esac
	return 0
}

# imported_dropin_dir CONFIG_HOST_PATH PREFERRED...: the directory of the first top-level
# imports entry of CONFIG of the form DIR/*.toml, PREFERRED directories first; nothing when
# the config imports no such directory
imported_dropin_dir() {
	local cfg=$1 dirs=() kind val d
	shift
	while read -r kind val; do
		[[ "$kind" == entry && "$val" == */\*.toml ]] || continue
		d=${val%/\*.toml}
		[[ "$d" == *'*'* ]] || dirs+=("$d")
	done < <(imports_in "$(hp "$cfg")" "$(dirname "$cfg")" 2>/dev/null)
	for d in "$@"; do
		grep -qxF "$d" <<<"$(printf '%s\n' "${dirs[@]}")" && {
			echo "$d"
			return
		}
	done
	[[ ${#dirs[@]} -gt 0 ]] && echo "${dirs[0]}"
	return 0
}

# distro_dropin NAME: where the drop-in goes for this shape (CONFIG set). Only the
# `containerd` and `cos` shapes may get an imports entry in CONFIG (nobody rewrites it).
# Fails (status 1) with the reason and the fix when the shape's containerd would not read it.
distro_dropin() {
	local name=$1 version dir tmpl base
	case "$name" in
	containerd | cos)
		echo "$(dirname "$CONFIG")/conf.d/$HANDLER.toml"
		;;
	k0s)
		echo "/etc/k0s/containerd.d/$HANDLER.toml"
		;;
	k3s | rke2)
		base=$(dirname "$CONFIG")
		version=$(top_level_key "$(hp "$CONFIG")" version 2>/dev/null)
		if [[ "$version" == 2 ]]; then
			dir=$base/config.toml.d tmpl=config.toml.tmpl
		else
			dir=$base/config-v3.toml.d tmpl=config-v3.toml.tmpl
		fi
		if [[ "$(imported_dropin_dir "$CONFIG" "$dir")" == "$dir" ]]; then
			echo "$dir/$HANDLER.toml"
			return 0
		fi
		echo "$CONFIG (rendered by $name from its template at every start) does not import $dir/*.toml, so a drop-in there would not be read, and the rendered file itself is rewritten: upgrade $name to a release whose built-in template imports $dir/*.toml, or give $base/$tmpl a top-level imports = [\"$dir/*.toml\"] and restart $CONTAINERD_UNIT, then re-run"
		return 1
		;;
	eks)
		dir=$(imported_dropin_dir "$CONFIG" /etc/containerd/config.d)
		if [[ -n "$dir" ]]; then
			echo "$dir/$HANDLER.toml"
			return 0
		fi
		echo "$CONFIG is rewritten by nodeadm at every boot and imports no drop-in directory: an imports entry added to it would be lost at the next reboot. Put imports = [\"/etc/containerd/config.d/*.toml\"] into the NodeConfig's spec.containerd.config (nodeadm merges it into $CONFIG), reboot or re-run nodeadm, then re-run"
		return 1
		;;
	microk8s)
		dir=$(imported_dropin_dir "$CONFIG")
		if [[ -n "$dir" ]]; then
			echo "$dir/$HANDLER.toml"
			return 0
		fi
		echo "$CONFIG is rendered from $(dirname "$CONFIG")/containerd-template.toml at every start of $CONTAINERD_UNIT and imports no drop-in directory: add a top-level imports = [\"\${SNAP_DATA}/args/containerd.d/*.toml\"] to containerd-template.toml (and create that directory), restart $CONTAINERD_UNIT, then re-run"
		return 1
		;;
	esac
}

# resolve_distro: DISTRO (the --distro option: auto or a shape) checked against the node and
# its defaults applied. Refuses (exit 3) an unrecognised node or a declared shape it is not.
resolve_distro() {
	local found name unit
	if ! found=$(detect_distro); then
		refuse "$found"
	fi
	read -r name unit <<<"$found"
	if [[ "$DISTRO" != auto && "$DISTRO" != "$name" ]]; then
		refuse "--distro $DISTRO was given, but this node is $name ($unit): nothing was changed. Pass --distro $name (or auto) if that is right"
	fi
	DISTRO=$name
	distro_defaults "$name" "$unit"
}
