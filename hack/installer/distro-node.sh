#!/usr/bin/env bash
# hack/installer/distro-node.sh up|down|reboot SHAPE - a node shape of the node installer
# (deploy/node/lib/distro.sh) on the systemd node (hack/node.sh), for
# integration/tests/installer/distro.rs: containerd started the way that distribution starts
# it, with its config where that distribution renders it, re-rendered at every start. Runs in
# the node as root; BASE is the node's containerd config without an rsandbox runtime (the
# test's `prepare`), CTRD the containerd binary, CTRD_PATH containerd.service's PATH.
#
#   k3s   k3s.service: renders $K/config.toml from $K/config-v3.toml.tmpl at every start
#         (as k3s pkg/agent/containerd does; the template is BASE with the versioned drop-in
#         directory import of k3s' built-in template, imports = ['$K/config-v3.toml.d/*.toml'])
#         and runs containerd as its child, `-c $K/config.toml -a
#         /run/k3s/containerd/containerd.sock` (k3s' command line), KillMode=process
#   rke2  as k3s, under /var/lib/rancher/rke2, the unit rke2-agent.service
#   k0s   k0sworker.service: at every start writes /run/k0s/containerd-cri.toml (BASE) and
#         /etc/k0s/containerd.toml importing it and every /etc/k0s/containerd.d/*.toml (k0s
#         docs/runtime.md: k0s picks the files of containerd.d up and adds them to the config
#         it generates), runs containerd as its child, `--config=/etc/k0s/containerd.toml
#         --address=/run/k0s/containerd.sock` (k0s' command line)
#   microk8s  snap.microk8s.daemon-containerd.service: renders args/containerd.toml from
#         args/containerd-template.toml (${SNAP_DATA} replaced) at every start and runs
#         containerd `--config ${SNAP_DATA}/args/containerd.toml --address
#         ${SNAP_COMMON}/run/containerd.sock` (microk8s' args/containerd); the template is BASE
#         with the fix the installer asks for: imports = ['${SNAP_DATA}/args/containerd.d/*.toml']
#   eks   nodeadm-config.service (a oneshot, before containerd.service, as AL2023's): writes
#         /etc/containerd/config.toml at every start (BASE plus nodeadm's
#         imports = ['/etc/containerd/config.d/*.toml']); containerd.service runs containerd
#         without --config (it reads /etc/containerd/config.toml, as on AL2023)
#   cos   /usr read-only (a read-only bind, as COS' root), /etc/os-release ID=cos, a
#         configure-helper stand-in writing /etc/containerd/config.toml (BASE: GKE's has no
#         imports) at every start, containerd.service with /home/kubernetes/bin first on its
#         PATH and no --config
#   crio  containerd.service stopped, a crio.service stand-in running (CRI-O's unit name)
# `reboot` restarts the shape's rendering unit(s) and containerd: the bootstrapper rewrites its
# file, and the handler must survive. `down` undoes `up` and starts containerd.service again.
# The node's root is a throwaway overlay in its own mount namespace (hack/node/init.sh).
set -euo pipefail
action=$1 shape=$2
self=$(readlink -f "${BASH_SOURCE[0]}")
U=/etc/systemd/system
K=/var/lib/rancher/$shape/agent/etc/containerd
K0S=/etc/k0s
SNAP_DATA=/var/snap/microk8s/current
SNAP_COMMON=/var/snap/microk8s/common
# the unit that runs containerd as its child
case "$shape" in
k3s) child_unit=k3s.service ;;
rke2) child_unit=rke2-agent.service ;;
k0s) child_unit=k0sworker.service ;;
microk8s) child_unit=snap.microk8s.daemon-containerd.service ;;
*) child_unit= ;;
esac
# the unit that writes containerd.service's config
render_unit=nodeadm-config.service
[[ "$shape" == cos ]] && render_unit=configure-helper.service

unit() { # NAME: stdin into the unit file NAME
	cat >"$U/$1"
}

# the child shapes' config, written at each start of their unit; prints containerd's arguments
# (one a line)
render_child() {
	local f
	case "$shape" in
	k3s | rke2)
		cp "$K/config-v3.toml.tmpl" "$K/config.toml.new"
		mv -f "$K/config.toml.new" "$K/config.toml"
		printf '%s\n' -c "$K/config.toml" -a /run/k3s/containerd/containerd.sock
		;;
	k0s)
		cp "$K0S/.distro-node-base.toml" /run/k0s/containerd-cri.toml
		{
			echo "# k0s_managed=true"
			echo "version = 3"
			echo "imports = ["
			echo "  \"/run/k0s/containerd-cri.toml\","
			for f in "$K0S"/containerd.d/*.toml; do
				[[ -e "$f" ]] && echo "  \"$f\","
			done
			echo "]"
		} >"$K0S/containerd.toml"
		printf '%s\n' --config="$K0S/containerd.toml" --address=/run/k0s/containerd.sock
		;;
	microk8s)
		sed -e "s|\${SNAP_DATA}|$SNAP_DATA|g" -e "s|\${SNAP_COMMON}|$SNAP_COMMON|g" \
			"$SNAP_DATA/args/containerd-template.toml" >"$SNAP_DATA/args/containerd.toml"
		printf '%s\n' --config "$SNAP_DATA/args/containerd.toml" --address "$SNAP_COMMON/run/containerd.sock"
		;;
	esac
}

case "$action:$shape" in
up:k3s | up:rke2 | up:k0s | up:microk8s)
	systemctl stop containerd.service
	case "$shape" in
	k3s | rke2)
		mkdir -p "$K/config-v3.toml.d" /run/k3s/containerd
		{
			echo "# config-v3.toml.tmpl of hack/installer/distro-node.sh: the node's config with"
			echo "# the versioned drop-in directory import of $shape's built-in template"
			echo "imports = ['$K/config-v3.toml.d/*.toml']"
			cat "$BASE"
		} >"$K/config-v3.toml.tmpl"
		;;
	k0s)
		mkdir -p "$K0S/containerd.d" /run/k0s
		cp "$BASE" "$K0S/.distro-node-base.toml"
		;;
	microk8s)
		mkdir -p "$SNAP_DATA/args/containerd.d" "$SNAP_COMMON/run"
		{
			echo "# containerd-template.toml of hack/installer/distro-node.sh: the node's config"
			echo "# with a drop-in directory import (the fix the installer asks microk8s users for)"
			# shellcheck disable=SC2016 # the template's own variable, replaced at render
			echo 'imports = ["${SNAP_DATA}/args/containerd.d/*.toml"]'
			cat "$BASE"
		} >"$SNAP_DATA/args/containerd-template.toml"
		;;
	esac
	unit "$child_unit" <<-EOF
		[Unit]
		Description=$shape stand-in (hack/installer/distro-node.sh): containerd as its child, its config rendered at every start
		[Service]
		# as k3s.service: systemctl start returns once containerd (the child, hence
		# NotifyAccess=all) says READY, with the config rendered and the socket served
		Type=notify
		NotifyAccess=all
		Environment=PATH=$CTRD_PATH
		Environment=CTRD=$CTRD
		ExecStart=/bin/bash $self main $shape
		KillMode=process
		Delegate=yes
		Restart=no
	EOF
	systemctl daemon-reload
	systemctl start "$child_unit"
	;;
main:*)
	# the unit's main process: render, then containerd as its child (MainPID is not
	# containerd), stopped with it
	mapfile -t args < <(render_child)
	"$CTRD" "${args[@]}" &
	pid=$!
	trap 'kill -TERM "$pid"; wait "$pid"; exit 0' TERM
	wait "$pid"
	;;
up:eks | up:cos)
	systemctl stop containerd.service
	mkdir -p /etc/containerd
	if [[ "$shape" == eks ]]; then
		mkdir -p /etc/containerd/config.d
	else
		mkdir -p /home/kubernetes/bin
		printf 'NAME="Container-Optimized OS"\nID=cos\n' >/run/rsandbox-cos-os-release
		mount --bind /usr /usr
		mount -o remount,bind,ro /usr
		mount --bind /run/rsandbox-cos-os-release /etc/os-release
	fi
	unit "$render_unit" <<-EOF
		[Unit]
		Description=$render_unit stand-in (hack/installer/distro-node.sh): writes /etc/containerd/config.toml at every start
		Before=containerd.service
		[Service]
		Type=oneshot
		RemainAfterExit=yes
		Environment=BASE=$BASE
		ExecStart=/bin/bash $self render $shape
	EOF
	mkdir -p "$U/containerd.service.d"
	{
		echo "[Unit]"
		echo "Requires=$render_unit"
		echo "After=$render_unit"
		echo "[Service]"
		[[ "$shape" == cos ]] && echo "Environment=PATH=/home/kubernetes/bin:$CTRD_PATH"
		echo "ExecStart="
		echo "ExecStart=$CTRD"
	} | unit containerd.service.d/50-distro.conf
	systemctl daemon-reload
	systemctl start "$render_unit" containerd.service
	;;
render:eks)
	{
		echo "# written by the nodeadm stand-in at every start (hack/installer/distro-node.sh)"
		echo "imports = ['/etc/containerd/config.d/*.toml']"
		cat "$BASE"
	} >/etc/containerd/config.toml
	;;
render:cos)
	{
		echo "# written by the configure-helper stand-in at every start (hack/installer/distro-node.sh)"
		cat "$BASE"
	} >/etc/containerd/config.toml
	;;
up:crio)
	systemctl stop containerd.service
	unit crio.service <<-EOF
		[Unit]
		Description=CRI-O stand-in (hack/installer/distro-node.sh)
		[Service]
		ExecStart=/bin/sleep infinity
	EOF
	systemctl daemon-reload
	systemctl start crio.service
	;;
reboot:k3s | reboot:rke2 | reboot:k0s | reboot:microk8s)
	systemctl restart "$child_unit"
	;;
reboot:eks | reboot:cos)
	systemctl restart "$render_unit"
	systemctl restart containerd.service
	;;
down:k3s | down:rke2 | down:k0s | down:microk8s)
	systemctl stop "$child_unit" || true
	rm -f "${U:?}/$child_unit"
	rm -rf /var/lib/rancher "$K0S" /run/k0s /var/snap/microk8s
	systemctl daemon-reload
	systemctl start containerd.service
	;;
down:eks | down:cos)
	systemctl stop containerd.service || true
	systemctl stop "$render_unit" || true
	rm -rf "${U:?}/$render_unit" "${U:?}/containerd.service.d" /etc/containerd
	if [[ "$shape" == cos ]]; then
		# lazily: a process started since (dbus, a shim, bash) still runs from the read-only
		# bind, and a plain umount would fail busy and leave /usr read-only for what follows
		umount -l /etc/os-release || true
		umount -l /usr || true
		if ! touch /usr/local/bin/.distro-node-rw 2>/dev/null; then
			echo "distro-node.sh: /usr is still read-only after the cos shape" >&2
			exit 1
		fi
		rm -f /usr/local/bin/.distro-node-rw
		rm -rf /home/kubernetes
	fi
	systemctl daemon-reload
	systemctl start containerd.service
	;;
down:crio)
	systemctl stop crio.service || true
	rm -f "${U:?}/crio.service"
	systemctl daemon-reload
	systemctl start containerd.service
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
