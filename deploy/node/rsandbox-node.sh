#!/usr/bin/env bash
# deploy/node/rsandbox-node.sh - install, upgrade or remove rsandbox on one Kubernetes node
# (containerd 2.x under systemd: containerd.service, or as k3s, rke2, k0s, EKS nodeadm, GKE COS
# and microk8s run it; lib/distro.sh). Run as root on the node, or from the installer
# DaemonSet (deploy/kubernetes), which runs it unprivileged with the host paths it needs under
# /host and systemd reached over D-Bus (docs/install.md lists each).
#
# Usage: rsandbox-node.sh install|uninstall|status [options]
#
#   install    preflight (`containerd-shim-rsandbox-v1 check` of the new binary, on the host),
#              the binary (a new file renamed over the old: running shims keep theirs),
#              the runtime as a drop-in where the node's containerd reads it (the node
#              shape, --distro: containerd's conf.d, plus one `imports` entry in config.toml
#              where containerd would not read it otherwise; on k3s, rke2, EKS and microk8s
#              a directory the rendered config imports, never the rendered file; k0s'
#              containerd.d), containerd
#              restarted only when a config file changed (or the handler is missing), in a
#              restart slot (--restart-slots) and rolled back when it does not come back
#              healthy (--max-rollbacks), the wait for CRI to report the rsandbox handler, a
#              pod and container run through the handler and removed, then the Node's labels.
#              A re-run that finds everything in place changes and restarts nothing.
#   uninstall  the Node's labels removed (no new rsandbox pods are scheduled here), the
#              node's rsandbox pods awaited (--wait-for-pods: drain the node), every imports
#              entry naming the drop-in taken out, however spelled (config.toml as before,
#              byte for byte, when nobody changed it since), the drop-in deleted only once no
#              file containerd loads imports it (else left inert, configuring nothing, and
#              exit 1 naming the file to edit), containerd restarted, the binary removed once
#              no rsandbox pod is left on the node (kept, and said so, while one is).
#   status     what is installed, what containerd reports, which pods still need the binary.
#   run ACTION ACTION (install or uninstall), then stay (a DaemonSet's container): touch
#              $READY_FILE (the readiness probe's) and sleep until terminated.
#
# Options (the environment variable of the same name, upper case, works too):
#   --binary PATH           the shim binary to install (default: containerd-shim-rsandbox-v1
#                           next to this script)
#   --host-root DIR         where the host's paths are for this process (default /; the
#                           DaemonSet: /host, under which it mounts only the paths it needs)
#   --host-exec CMD         prefix that runs a host binary (containerd, readlink, test, the
#                           staged shim's `check`) on the host (default: none; the DaemonSet:
#                           "<shim> unit -socket /run/systemd/private run -host-root /host
#                           -output-dir /run/rsandbox-node/run --", a transient service of
#                           systemd's, over D-Bus)
#   --systemctl CMD         (default: "<host-exec> systemctl"; the DaemonSet: "<shim> unit
#                           -socket /run/systemd/private", systemd's D-Bus API)
#   --distro NAME           the node shape: auto (default: detected from the units, containerd's
#                           command line and config, the Node's containerRuntimeVersion),
#                           containerd, eks, cos, k3s, rke2, k0s or microk8s (refused when the
#                           node is another); a CRI-O or unknown node is refused (exit 3)
#   --unit NAME             the unit that runs containerd, restarted (the shape's:
#                           containerd.service, k3s.service, rke2-agent.service, ...)
#   --containerd-config P   (default: containerd's --config argument, else the shape's, else
#                           /etc/containerd/config.toml)
#   --containerd-socket P   CRI endpoint (default: containerd's --address, else the shape's,
#                           else the [grpc] address of the loaded config)
#   --install-dir DIR       where the shim goes, on containerd's PATH (/usr/local/bin; on COS
#                           /home/kubernetes/bin)
#   --state-dir DIR         what the installer remembers for the uninstall (/var/lib/rsandbox-node)
#   --handler NAME          the CRI runtime handler and RuntimeClass handler (rsandbox)
#   --node-name NAME        the Node to label (default: $NODE_NAME; the DaemonSet sets it from
#                           the downward API)
#   --wait SECONDS          deadline of each wait: containerd's restart, the CRI handler, the
#                           Node's status (120); a deadline only catches a hang
#   --wait-for-pods SECONDS uninstall: wait that long for the node's rsandbox pods to go
#                           before the config is removed (exec into a pod needs its handler
#                           configured; the labels are already gone: drain the node); 300
#                           by default, then the config goes anyway; -1: no limit
#   --no-wait-for-pods      uninstall: do not wait (--wait-for-pods 0)
#   --no-check              skip the preflight (only for a binary older than `check`)
#   --restart-slots N       install: at most N nodes restart containerd at once: a restart
#                           first takes one of N Leases (rsandbox-node-restart-<i>) in the
#                           pod's namespace, and gives it back once the node is verified or
#                           rolled back (1; 0: no pacing; without an API: none)
#   --lease-seconds S       how long a taken slot stays taken when its holder is gone (600)
#   --max-rollbacks N       install: after a restart with which containerd does not come back
#                           healthy within --wait, this run's config is undone and containerd
#                           restarted again (a rollback, exit status 4); after N rollbacks
#                           for the same release and drop-in, containerd is not restarted for
#                           it again (exit status 5) until $STATE_DIR/rollbacks is removed (2)
#   --verify-image REF      install: the image of the pod run through the handler before the
#                           Node is labelled (default: containerd's pinned sandbox image)
#   --no-verify             install: no such pod
# Kubernetes API: in-cluster (service account) by default; KUBE_API=URL points elsewhere (a
# test's stub); with neither, the labels are skipped with a log line.
#
# Exit status: 0 done; 1 a step failed (the message names it); 2 usage; 3 refused (the
# preflight found a blocking problem, or the node's config is one the installer will not edit:
# nothing was changed); 4 rolled back (containerd did not come back healthy after the restart:
# the previous config restored, containerd restarted on it); 5 held (--max-rollbacks reached:
# containerd not restarted). With `run`, 3, 4 and 5 leave the pod running, not Ready: a crash
# loop would only repeat them. Events on the Node report install, upgrade, refusal, rollback.
set -euo pipefail

SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/node/lib/common.sh
. "$SELF_DIR/lib/common.sh"
# shellcheck source=deploy/node/lib/unit.sh
. "$SELF_DIR/lib/unit.sh"
# shellcheck source=deploy/node/lib/config.sh
. "$SELF_DIR/lib/config.sh"
# shellcheck source=deploy/node/lib/imports.sh
. "$SELF_DIR/lib/imports.sh"
# shellcheck source=deploy/node/lib/distro.sh
. "$SELF_DIR/lib/distro.sh"
# shellcheck source=deploy/node/lib/cri.sh
. "$SELF_DIR/lib/cri.sh"
# shellcheck source=deploy/node/lib/binary.sh
. "$SELF_DIR/lib/binary.sh"
# shellcheck source=deploy/node/lib/kube.sh
. "$SELF_DIR/lib/kube.sh"
# shellcheck source=deploy/node/lib/events.sh
. "$SELF_DIR/lib/events.sh"
# shellcheck source=deploy/node/lib/rollout.sh
. "$SELF_DIR/lib/rollout.sh"
# shellcheck source=deploy/node/lib/verify.sh
. "$SELF_DIR/lib/verify.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

ACTION=${1:-}
[[ $# -gt 0 ]] && shift
STAY=0
if [[ "$ACTION" == run ]]; then
	STAY=1
	ACTION=${1:-}
	[[ $# -gt 0 ]] && shift
fi
BINARY=${BINARY:-$SELF_DIR/$SHIM_NAME}
HOST_ROOT=${HOST_ROOT:-}
HOST_EXEC=${HOST_EXEC:-}
SYSTEMCTL=${SYSTEMCTL:-}
# set by the environment or an option: kept whatever the node shape's default (lib/distro.sh)
UNIT_SET=${CONTAINERD_UNIT:+1}
INSTALL_DIR_SET=${INSTALL_DIR:+1}
DISTRO=${DISTRO:-auto}
CONTAINERD_UNIT=${CONTAINERD_UNIT:-containerd.service}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-}
CONTAINERD_SOCKET=${CONTAINERD_SOCKET:-}
INSTALL_DIR=${INSTALL_DIR:-/usr/local/bin}
STATE_DIR=${STATE_DIR:-/var/lib/rsandbox-node}
HANDLER=${HANDLER:-rsandbox}
NODE_NAME=${NODE_NAME:-}
WAIT_SECONDS=${WAIT_SECONDS:-120}
WAIT_FOR_PODS=${WAIT_FOR_PODS:-300}
NO_CHECK=${NO_CHECK:-0}
RESTART_SLOTS=${RESTART_SLOTS:-1}
LEASE_SECONDS=${LEASE_SECONDS:-600}
MAX_ROLLBACKS=${MAX_ROLLBACKS:-2}
VERIFY=${VERIFY:-1}
VERIFY_IMAGE=${VERIFY_IMAGE:-}
while [[ $# -gt 0 ]]; do
	opt=$1
	case "$opt" in
	--no-check)
		NO_CHECK=1
		shift
		continue
		;;
	--no-wait-for-pods)
		WAIT_FOR_PODS=0
		shift
		continue
		;;
	--no-verify)
		VERIFY=0
		shift
		continue
		;;
	--*=*)
		set -- "${opt%%=*}" "${opt#*=}" "${@:2}"
		continue
		;;
	esac
	[[ $# -ge 2 ]] || {
		usage >&2
		exit 2
	}
	case "$opt" in
	--binary) BINARY=$2 ;;
	--host-root) HOST_ROOT=${2%/} ;;
	--host-exec) HOST_EXEC=$2 ;;
	--systemctl) SYSTEMCTL=$2 ;;
	--unit) CONTAINERD_UNIT=$2 UNIT_SET=1 ;;
	--distro) DISTRO=$2 ;;
	--containerd-config) CONTAINERD_CONFIG=$2 ;;
	--containerd-socket) CONTAINERD_SOCKET=$2 ;;
	--install-dir) INSTALL_DIR=$2 INSTALL_DIR_SET=1 ;;
	--state-dir) STATE_DIR=$2 ;;
	--handler) HANDLER=$2 ;;
	--node-name) NODE_NAME=$2 ;;
	--wait) WAIT_SECONDS=$2 ;;
	--wait-for-pods) WAIT_FOR_PODS=$2 ;;
	--restart-slots) RESTART_SLOTS=$2 ;;
	--lease-seconds) LEASE_SECONDS=$2 ;;
	--max-rollbacks) MAX_ROLLBACKS=$2 ;;
	--verify-image) VERIFY_IMAGE=$2 ;;
	*)
		usage >&2
		exit 2
		;;
	esac
	shift 2
done
HOST_ROOT=${HOST_ROOT%/}
SYSTEMCTL=${SYSTEMCTL:-${HOST_EXEC:+$HOST_EXEC }systemctl}
SHIM_PATH=${INSTALL_DIR%/}/$SHIM_NAME
[[ "$WAIT_SECONDS" =~ ^[0-9]+$ && "$WAIT_FOR_PODS" =~ ^-?[0-9]+$ && "$RESTART_SLOTS" =~ ^[0-9]+$ &&
	"$LEASE_SECONDS" =~ ^[1-9][0-9]*$ && "$MAX_ROLLBACKS" =~ ^[1-9][0-9]*$ ]] || {
	usage >&2
	exit 2
}
[[ " auto $DISTROS " == *" $DISTRO "* ]] || {
	log "--distro $DISTRO: one of auto $DISTROS"
	exit 2
}
[[ "$HANDLER" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || {
	log "--handler $HANDLER: not a DNS label (a RuntimeClass handler must be one)"
	exit 2
}

# which node shape this is (lib/distro.sh: refused when not one the installer knows), where
# its containerd's config and the drop-in are, which socket serves CRI, where the shim goes
locate_containerd() {
	local why
	resolve_distro
	SHIM_PATH=${INSTALL_DIR%/}/$SHIM_NAME
	CONFIG=$(containerd_config_path)
	[[ "$CONFIG" == /* ]] || fail "locate containerd's config" "not an absolute path: $CONFIG"
	why=$(distro_dropin "$DISTRO") || refuse "$why"
	DROPIN=$why
	# the socket: the option, containerd's --address, the shape's, the loaded config's
	[[ -n "$CONTAINERD_SOCKET" ]] || CONTAINERD_SOCKET=$(containerd_arg address a)
	[[ -n "$CONTAINERD_SOCKET" ]] || CONTAINERD_SOCKET=${DISTRO_SOCKET:-}
	if [[ -z "$CONTAINERD_SOCKET" ]]; then
		local dump
		dump=$(mktemp)
		config_dump "$dump" || fail "read containerd's config" "containerd cannot load $CONFIG"
		CONTAINERD_SOCKET=$(awk '/^\[grpc\]/ { g = 1; next } /^\[/ { g = 0 } g && $1 == "address" { gsub(/'\''/, "", $3); print $3; exit }' "$dump")
		rm -f "$dump" "$dump.err"
		CONTAINERD_SOCKET=${CONTAINERD_SOCKET:-/run/containerd/containerd.sock}
	fi
}

# shim_resolution_problem: why containerd would not run $SHIM_PATH for the handler (nothing
# when it would). containerd (core/runtime/v2 resolveRuntimePath) takes the first of: the
# binary name in its working directory, then its PATH, then its own executable's directory.
shim_resolution_problem() {
	local pid path dirs=() d cwd exe
	pid=$(containerd_main_pid)
	[[ -n "$pid" ]] || return 0 # not running: nothing to ask (its unit's PATH is systemd's default)
	cwd=$(readlink "/proc/$pid/cwd") || cwd=/
	path=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^PATH=//p')
	exe=$(readlink "/proc/$pid/exe") || exe=
	dirs=("$cwd")
	IFS=: read -r -a d <<<"$path"
	dirs+=("${d[@]}")
	[[ -n "$exe" ]] && dirs+=("$(dirname "${exe% (deleted)}")")
	for d in "${dirs[@]}"; do
		[[ -n "$d" ]] || continue
		if [[ "${d%/}/$SHIM_NAME" == "$SHIM_PATH" ]]; then
			return 0
		fi
		# asked on the host: the installer's pod mounts only the install directory
		if host_run test -e "${d%/}/$SHIM_NAME"; then
			echo "containerd (pid $pid) would run ${d%/}/$SHIM_NAME, found before $SHIM_PATH (its PATH: ${path:-unset}); remove it or pass --install-dir ${d%/}"
			return 0
		fi
	done
	echo "$INSTALL_DIR is neither on containerd's PATH (${path:-unset}) nor containerd's own directory: pass --install-dir with one of them"
}

# preflight STAGED [--runtime HANDLER]: `containerd-shim-rsandbox-v1 check` of the new binary,
# run on the host (its kernel, cgroups, runc, systemd, containerd binary and config files):
# once before anything is changed, and once more with --runtime after the config is written
# and before containerd is restarted (check reads the files, so it judges what containerd is
# about to load). Its report goes to the log; exit status 1 = a blocking finding, 2 = it could
# not run (usage).
preflight() {
	local staged=$1 out rc=0
	shift
	if [[ "$NO_CHECK" == 1 ]]; then
		log "WARNING: --no-check: the preflight is skipped"
		return 0
	fi
	out=$(host_run "${staged#"$HOST_ROOT"}" check --containerd "$(containerd_binary)" \
		--containerd-config "$CONFIG" --drop-in "$DROPIN" "$@" 2>&1) || rc=$?
	if ((rc == 0)); then
		# passed: the findings worth a look (warnings and worse, with their detail lines) and
		# the verdict; the whole report when it refuses
		out=$(awk '/^\[/ { show = ($0 !~ /^\[ *(ok|info)\]/) } /^verdict:/ { show = 1 } show && NF' <<<"$out")
	fi
	[[ -n "$out" ]] && printf '  check: %s\n' "${out//$'\n'/$'\n'  check: }" >&2
	if ((rc != 0)); then
		if grep -q 'unknown action "check"' <<<"$out"; then
			echo "$BINARY has no \`check\` (a release before the preflight): pass --no-check to install it anyway"
		elif ((rc == 1)); then
			echo "\`$SHIM_NAME check${*:+ $*}\` found a blocking problem on this node (see its report above)"
		else
			echo "\`$SHIM_NAME check\` could not run (exit status $rc, see above)"
		fi
		return 1
	fi
	log "preflight passed${*:+ ($*)}"
}

# stage_binary: a copy of the new binary beside the installed path (the same file system,
# so that the rename is atomic); prints its path for this process
stage_binary() {
	local dir staged
	dir=$(hp "$INSTALL_DIR")
	mkdir -p "$dir"
	staged=$(mktemp "$dir/.$SHIM_NAME.rsandbox-new.XXXXXX")
	if ! { cat "$BINARY" >"$staged" && chmod 755 "$staged" && sync "$staged"; }; then
		rm -f "$staged"
		fail "stage the binary" "cannot write $staged"
	fi
	echo "$staged"
}

wait_cri_handler() { # WANT (present|absent)
	local want=$1 end handlers
	end=$(deadline_in "$WAIT_SECONDS")
	while :; do
		if handlers=$(cri_runtime_handlers 2>/dev/null); then
			if grep -qxF "$HANDLER" <<<"$handlers"; then
				[[ "$want" == present ]] && {
					log "CRI reports the $HANDLER runtime handler"
					return 0
				}
			elif [[ "$want" == absent ]]; then
				log "CRI no longer reports the $HANDLER runtime handler"
				return 0
			fi
		fi
		before "$end" || fail "wait for CRI" "containerd's CRI ($CONTAINERD_SOCKET) did not report the $HANDLER handler $want within ${WAIT_SECONDS}s (handlers: ${handlers//$'\n'/ })"
		sleep 1
	done
}

handler_reported() { cri_runtime_handlers 2>/dev/null | grep -xF "$HANDLER" >/dev/null; }

node_labels() { # the labels the installer sets (JSON object)
	local version cver crash=null
	# a label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends
	version=$(host_run "$SHIM_PATH" -v 2>/dev/null | sed -n 's/^ *Version: *//p' | head -n1 |
		tr -c 'A-Za-z0-9_.\n-' '_' | cut -c1-63 | sed 's/^[^A-Za-z0-9]*//; s/[^A-Za-z0-9]*$//')
	cver=$(containerd_version)
	# containerd 2.1/2.2 crash on a hostNetwork pod with a shim sandboxer (fixed in 2.3): the
	# label lets the admission policy's switch be decided by looking (see deploy/kubernetes)
	if [[ "$cver" =~ ^([0-9]+)\.([0-9]+)\. ]] && ((BASH_REMATCH[1] < 2 || (BASH_REMATCH[1] == 2 && BASH_REMATCH[2] < 3))); then
		crash='"true"'
	fi
	printf '{"%s/installed":"true","%s/shim-version":"%s","%s/containerd-hostnetwork-crash":%s}' \
		"$LABEL_PREFIX" "$LABEL_PREFIX" "${version:-unknown}" "$LABEL_PREFIX" "$crash"
}

do_install() {
	local staged version changed=0 dump problem why text prev import_added=0 target fresh=1 binary_changed=0 restarted=0 n runtime_args
	[[ -f "$BINARY" && -x "$BINARY" ]] || fail "find the binary" "$BINARY is not an executable file"
	locate_containerd
	log "node shape $DISTRO; containerd: unit $CONTAINERD_UNIT, config $CONFIG, CRI $CONTAINERD_SOCKET; drop-in $DROPIN; shim $SHIM_PATH"

	# 1. what the node is: nothing is changed before these pass
	version=$(root_config_version)
	[[ "$version" == 2 || "$version" == 3 ]] ||
		refuse "$CONFIG is config version $version: only versions 2 and 3 (containerd 2.x) are supported; migrate it with \`containerd config migrate\`"
	dump=$(mktemp)
	config_dump "$dump" || fail "read containerd's config" "containerd cannot load $CONFIG as it is now"
	if [[ ! -e "$(hp "$DROPIN")" ]] && dump_has_handler_table "$dump"; then
		refuse "containerd's config already defines the runtime $HANDLER outside $DROPIN (by hand?): the installer manages only its drop-in; remove that definition or pass --handler with another name"
	fi
	problem=$(shim_resolution_problem)
	[[ -z "$problem" ]] || refuse "$problem"
	# a read-only install directory (COS' /usr/local) is refused before anything is written
	if [[ -d "$(hp "$INSTALL_DIR")" && ! -w "$(hp "$INSTALL_DIR")" ]]; then
		refuse "$INSTALL_DIR is not writable (a read-only file system?): pass --install-dir with a writable directory on containerd's PATH"
	fi
	# Installed or Upgraded (the Event): whether containerd served the handler before this run
	# (a release whose first install was rolled back is still a new install)
	handler_reported && fresh=0
	# a release whose restarts were rolled back --max-rollbacks times is not tried again
	text=$(mktemp)
	dropin_text "$version" >"$text"
	target=$(rollback_target "$text")
	n=$(rollbacks_of "$target")
	if ((n >= MAX_ROLLBACKS)); then
		why="containerd did not come back healthy with this release's config $n time(s) (rolled back each time): it is not restarted for it again. See journalctl -u $CONTAINERD_UNIT; remove $STATE_DIR/rollbacks (or ship another release) to try again"
		log "held: $why"
		node_event Warning RestartHeld "$why"
		exit 5
	fi
	staged=$(stage_binary)
	if ! why=$(preflight "$staged"); then
		rm -f "$staged"
		refuse "$why"
	fi

	# 2. the config: the drop-in, and an imports entry where containerd would not read it
	mkdir -p "$(hp "$STATE_DIR")"
	if [[ ! -d "$(hp "$(dirname "$DROPIN")")" ]]; then
		mkdir -p "$(hp "$(dirname "$DROPIN")")"
		: >"$(hp "$STATE_DIR")/dropin-dir-created"
	fi
	prev=$(mktemp)
	if [[ -e "$(hp "$DROPIN")" ]]; then cp "$(hp "$DROPIN")" "$prev"; else rm -f "$prev"; fi
	if write_if_changed "$text" "$(hp "$DROPIN")" 644; then
		changed=1
		log "drop-in written: $DROPIN"
	else
		log "drop-in $DROPIN unchanged"
	fi
	rm -f "$text"
	config_dump "$dump" || {
		undo_config "$prev" 0
		fail "check the config" "containerd cannot load its config with $DROPIN (undone)"
	}
	if ((DISTRO_MERGES_AT_START)); then
		# k0s merges containerd.d/ into the config it generates when it (re)starts
		# containerd: the restart below and the CRI's handler list show whether it was read
		log "k0s reads $DROPIN when it restarts containerd: checked through CRI after the restart"
	elif ! dump_reads_dropin "$dump"; then
		# only a config.toml nobody rewrites gets an imports entry (lib/distro.sh)
		if ((!DISTRO_EDITS_CONFIG)); then
			undo_config "$prev" 0
			fail "check the config" "containerd does not read $DROPIN although $CONFIG imports its directory (undone)"
		fi
		add_import
		changed=1
		import_added=1
		if ! config_dump "$dump" || ! dump_reads_dropin "$dump"; then
			undo_config "$prev" 1
			fail "check the config" "containerd still does not read $DROPIN after the imports entry in $CONFIG (undone)"
		fi
	fi
	if ((!DISTRO_MERGES_AT_START)) && ! dump_defines_handler "$dump"; then
		undo_config "$prev" "$import_added"
		fail "check the config" "the loaded config does not define runtimes.$HANDLER as runtime_type $RSANDBOX_RUNTIME_TYPE with sandboxer shim (another file overrides it?) (undone)"
	fi
	rm -f "$dump" "$dump.err"
	# check again, now on the config containerd is about to load (on k0s the handler is in it
	# only once k0s has merged containerd.d at the restart: checked without it)
	runtime_args=(--runtime "$HANDLER")
	((DISTRO_MERGES_AT_START)) && runtime_args=()
	if ! why=$(preflight "$staged" "${runtime_args[@]}"); then
		undo_config "$prev" "$import_added"
		rm -f "$staged"
		refuse "$why (the config changes were undone)"
	fi

	# 3. the binary, before containerd knows the handler
	if cmp -s "$staged" "$(hp "$SHIM_PATH")"; then
		rm -f "$staged"
		log "binary $SHIM_PATH unchanged"
	else
		binary_changed=1
		mv -f "$staged" "$(hp "$SHIM_PATH")" || {
			rm -f "$staged"
			fail "install the binary" "rename into $SHIM_PATH failed"
		}
		log "binary installed: $SHIM_PATH (running shims keep the binary they started with; new pods get this one)"
	fi
	record_installed

	# 4. containerd: restarted only when its config files changed, or when it does not serve
	# the handler although they did not (a run that stopped between the write and the restart)
	# the restart takes a restart slot first (lib/rollout.sh), and is rolled back when
	# containerd does not come back healthy
	if ((changed)) || ! handler_reported; then
		((changed)) || log "config unchanged, but CRI does not report the $HANDLER handler: containerd runs an older config"
		acquire_restart_slot
		why=$(restart_for present) || rollback "$why" "$prev" "$import_added" "$target"
		restarted=1
	else
		log "config unchanged and the $HANDLER handler served: containerd not restarted"
	fi
	rm -f "$prev"
	wait_cri_handler present

	# 5. a real pod and container through the handler, removed again, before any label
	if ((VERIFY)); then
		if ! why=$(verify_handler "${VERIFY_IMAGE:-$(verify_image_default)}"); then
			node_event Warning VerificationFailed "$why: the Node is not labelled"
			fail "verify the handler" "$why: the Node is not labelled"
		fi
	else
		log "WARNING: --no-verify: no pod is run through the handler before the labels"
	fi
	forget_rollbacks

	# 6. the Node: labelled once the kubelet reports the handler
	if kube_configured; then
		[[ -n "$NODE_NAME" ]] || fail "label the Node" "no node name (--node-name or NODE_NAME)"
		wait_node_handler
		label_node "$(node_labels)"
	fi
	release_restart_slot
	if ((fresh)); then
		node_event Normal Installed "rsandbox installed: $SHIM_PATH, handler $HANDLER$( ((restarted)) && echo ", containerd restarted")$( ((VERIFY)) && echo ", a pod ran through the handler")"
	elif ((binary_changed || changed)); then
		node_event Normal Upgraded "rsandbox upgraded:$( ((binary_changed)) && echo " a new $SHIM_PATH")$( ((changed)) && echo " a new drop-in $DROPIN")$( ((restarted)) && echo ", containerd restarted")$( ((VERIFY)) && echo ", a pod ran through the handler")"
	fi
	log "install done"
}

# rollback WHY PREVIOUS_DROPIN IMPORT_ADDED TARGET: containerd did not come back healthy
# after the restart: this run's config changes undone, containerd restarted on the previous
# config, the rollback counted (lib/rollout.sh). The new binary stays in place (containerd
# runs it only for a handler the restored config defines). Exits 4, or 1 when containerd does
# not come back on the previous config either.
rollback() {
	local why=$1 prev=$2 import_added=$3 target=$4 n again
	n=$(count_rollback "$target")
	log "containerd did not come back healthy: $why. Rolling back (rollback $n of at most $MAX_ROLLBACKS for this release)"
	undo_config "$prev" "$import_added"
	if again=$(restart_for any); then
		why="containerd did not come back healthy with the new config ($why): the previous config is restored and containerd runs on it (rollback $n of at most $MAX_ROLLBACKS)"
		log "rolled back: $why"
		node_event Warning RolledBack "$why"
		release_restart_slot
		exit 4
	fi
	node_event Warning RollbackFailed "containerd did not come back healthy with the new config ($why), nor with the previous one restored ($again)"
	fail "roll back" "containerd did not come back healthy with the previous config restored either: $again"
}

# undo_config PREVIOUS_DROPIN IMPORT_ADDED: take back this run's config changes (the imports
# entry first, then the drop-in: its previous bytes, or none)
undo_config() {
	local prev=$1 import_added=$2
	((import_added)) && { remove_import || true; forget_import_state; }
	if [[ -f "$prev" ]]; then
		write_if_changed "$prev" "$(hp "$DROPIN")" 644 || true
		rm -f "$prev"
	else
		rm -f "$(hp "$DROPIN")"
		if [[ -f "$(hp "$STATE_DIR")/dropin-dir-created" ]]; then
			rmdir "$(hp "$(dirname "$DROPIN")")" 2>/dev/null || true
			rm -f "$(hp "$STATE_DIR")/dropin-dir-created"
		fi
	fi
}

# record_installed: what the uninstall works on (the node shape, its unit and socket too: a
# k3s node's uninstall restarts k3s.service and asks /run/k3s/containerd/containerd.sock)
record_installed() {
	printf 'shim=%s\ndropin=%s\nconfig=%s\ndistro=%s\nunit=%s\nsocket=%s\n' "$SHIM_PATH" "$DROPIN" \
		"$CONFIG" "$DISTRO" "$CONTAINERD_UNIT" "$CONTAINERD_SOCKET" >"$(hp "$STATE_DIR")/installed"
}

# load_installed: what the install recorded (the uninstall works on those paths, whatever
# options it is given; a record from before lib/distro.sh has no distro, unit or socket)
load_installed() {
	local f v
	f=$(hp "$STATE_DIR")/installed
	[[ -f "$f" ]] || return 1
	SHIM_PATH=$(sed -n 's/^shim=//p' "$f")
	DROPIN=$(sed -n 's/^dropin=//p' "$f")
	CONFIG=$(sed -n 's/^config=//p' "$f")
	v=$(sed -n 's/^distro=//p' "$f")
	DISTRO=${v:-$DISTRO}
	v=$(sed -n 's/^unit=//p' "$f")
	CONTAINERD_UNIT=${v:-$CONTAINERD_UNIT}
	v=$(sed -n 's/^socket=//p' "$f")
	CONTAINERD_SOCKET=${v:-$CONTAINERD_SOCKET}
}

# keep_inert_dropin PROBLEMS: the walk found what would stop containerd from starting without
# the drop-in (an entry the installer could not take out, a link to the drop-in, ...). The
# drop-in stays, made inert (it configures nothing: containerd restarted starts without the
# runtime, which the uninstall is for), and so does the state; exits 1 with what to edit.
keep_inert_dropin() {
	local problems=$1 text dump version
	version=$(root_config_version)
	[[ "$version" == 2 ]] || version=3
	text=$(mktemp)
	inert_dropin_text "$version" >"$text"
	# changed: do_uninstall's (bash's dynamic scope)
	if write_if_changed "$text" "$(hp "$DROPIN")" 644; then
		changed=1
		log "drop-in $DROPIN made inert (it configures nothing)"
	fi
	rm -f "$text"
	dump=$(mktemp)
	if config_walk "" | grep '^problem ' >/dev/null; then
		log "containerd's config files would not load even with $DROPIN in place: containerd not restarted"
	elif ((changed)) && config_dump "$dump"; then
		restart_containerd
		wait_cri_handler absent
	fi
	rm -f "$dump" "$dump.err"
	fail "remove the imports entry" "containerd would not start without $DROPIN: ${problems//$'\n'/; }. Edit what is named there (take $DROPIN out of the imports, remove a link to it), then run the uninstall again; until then $DROPIN stays, configuring nothing"
}

do_uninstall() {
	local changed=0 need end problems found
	if ! load_installed; then
		# a node the installer does not know (CRI-O, ...) has nothing of it to remove
		if ! found=$(detect_distro); then
			log "nothing to uninstall: $found"
			return 0
		fi
		locate_containerd
		log "no install recorded in $STATE_DIR: removing what is at the default places"
	fi
	[[ -n "$CONTAINERD_SOCKET" ]] || locate_containerd
	log "containerd: config $CONFIG, CRI $CONTAINERD_SOCKET; drop-in $DROPIN; shim $SHIM_PATH"

	# 1. no new rsandbox pod is scheduled here
	if kube_configured; then
		[[ -n "$NODE_NAME" ]] || fail "unlabel the Node" "no node name (--node-name or NODE_NAME)"
		label_node "{\"$LABEL_PREFIX/installed\":null,\"$LABEL_PREFIX/shim-version\":null,\"$LABEL_PREFIX/containerd-hostnetwork-crash\":null}"
	fi

	# 2. the pods go first (--wait-for-pods, 300 s by default): while the handler is configured they stay
	# fully manageable (containerd 2.1.9's ExecSync looks the pod's handler up in the config:
	# once it is gone, exec into a remaining pod fails "no runtime for ... is configured";
	# stop and remove still work)
	end=$(deadline_in "$((WAIT_FOR_PODS < 0 ? 0 : WAIT_FOR_PODS))")
	while ((WAIT_FOR_PODS != 0)) && need=$(binary_in_use) && [[ -n "$need" ]]; do
		if ((WAIT_FOR_PODS > 0)) && ! before "$end"; then
			log "rsandbox pods still here after ${WAIT_FOR_PODS}s ($need): removing the config anyway"
			break
		fi
		log "waiting for the node's rsandbox pods to go (drain the node): $need"
		sleep 5
	done

	# 3. the config. containerd does not start while a file it loads imports a missing file,
	# so the drop-in goes last, and only once the walk finds no such file: config.toml put
	# back where nobody changed it since the install, else every entry naming the drop-in taken
	# out, however it is spelled now (also without the installer's state). What cannot be
	# taken out leaves an inert drop-in and a failed uninstall (keep_inert_dropin).
	if [[ -e "$(hp "$DROPIN")" ]] && ! head -n1 "$(hp "$DROPIN")" | grep -F "$MARK" >/dev/null; then
		log "warning: $DROPIN was not written by the installer: it and the imports naming it are left in place"
	else
		if remove_import; then changed=1; fi
		if take_out_entries; then changed=1; fi
		problems=$(config_walk "$DROPIN" | sed -n 's/^problem //p')
		[[ -z "$problems" ]] || keep_inert_dropin "$problems"
		forget_import_state
		if [[ -e "$(hp "$DROPIN")" ]]; then
			rm -f "$(hp "$DROPIN")"
			changed=1
			log "drop-in removed: $DROPIN (no file containerd loads imports it)"
		fi
		if [[ -f "$(hp "$STATE_DIR")/dropin-dir-created" ]]; then
			rmdir "$(hp "$(dirname "$DROPIN")")" 2>/dev/null || true
			rm -f "$(hp "$STATE_DIR")/dropin-dir-created"
		fi
	fi
	if ((changed)); then
		local dump
		dump=$(mktemp)
		config_dump "$dump" || fail "check the config" "containerd cannot load $CONFIG after the uninstall's changes"
		dump_has_handler_table "$dump" && log "warning: containerd's config still defines the $HANDLER runtime elsewhere"
		rm -f "$dump" "$dump.err"
		acquire_restart_slot
		restart_containerd
		wait_cri_handler absent
		release_restart_slot
	else
		log "no config of the installer left: containerd not restarted"
	fi

	# 4. the binary, once no pod can need it
	need=$(binary_in_use)
	if [[ -n "$need" ]]; then
		log "binary $SHIM_PATH kept: $need. Run the uninstall again once they are gone (drain the node)."
		mkdir -p "$(hp "$STATE_DIR")"
		record_installed
		return 0
	fi
	if [[ -e "$(hp "$SHIM_PATH")" ]]; then
		rm -f "$(hp "$SHIM_PATH")"
		log "binary removed: $SHIM_PATH"
	fi
	rm -f "$(hp "$STATE_DIR")/installed"
	rmdir "$(hp "$STATE_DIR")" 2>/dev/null || true
	log "uninstall done"
}

do_status() {
	local need handlers
	load_installed || locate_containerd
	[[ -n "$CONTAINERD_SOCKET" ]] || locate_containerd
	echo "binary:   $SHIM_PATH $([[ -e "$(hp "$SHIM_PATH")" ]] && echo present || echo absent)"
	echo "drop-in:  $DROPIN $([[ -e "$(hp "$DROPIN")" ]] && echo present || echo absent)"
	echo "config:   $CONFIG (imports entry: $(cat "$(hp "$STATE_DIR")/import-mode" 2>/dev/null || echo none added))"
	echo "unit:     $CONTAINERD_UNIT MainPID $(containerd_main_pid)"
	handlers=$(cri_runtime_handlers 2>/dev/null | tr '\n' ' ') || handlers="(CRI not answering)"
	echo "handlers: ${handlers:-none}"
	need=$(binary_in_use)
	echo "in use:   ${need:-no}"
}

[[ $EUID -eq 0 ]] || {
	log "run as root"
	exit 1
}
# lock_installer: one install or uninstall at a time on a node (a hand-run beside the
# DaemonSet's pod). The lock file lives in $LOCK_DIR, a directory made (or found) owned by
# root with mode 0700 before the file is opened: bash cannot open with O_NOFOLLOW, but in such
# a directory no one else can plant a link (which the open would follow, as root) or a file
# (which would block every install); world-writable /run/lock would allow both. Opened for
# appending (>>): never truncated. The host's /run is a tmpfs: nothing is left on disk.
LOCK_DIR=/run/rsandbox-node
lock_installer() {
	local dir
	dir=$(hp "$LOCK_DIR")
	mkdir -m 0700 "$dir" 2>/dev/null || true # there already: judged below
	# the DaemonSet's hostPath volume (DirectoryOrCreate) makes it root's with mode 0755: no
	# one else could have written into it, so it is narrowed to 0700 rather than refused
	if [[ ! -L "$dir" && -d "$dir" && "$(stat -c '%u %a' "$dir")" == "0 755" ]]; then
		chmod 0700 "$dir"
	fi
	[[ ! -L "$dir" && -d "$dir" && "$(stat -c '%u %a' "$dir")" == "0 700" ]] ||
		fail "lock" "$LOCK_DIR is not a directory of root's with mode 0700 ($(stat -c '%U %a %F' "$dir" 2>&1)): remove it"
	exec 9>>"$dir/lock"
	flock -w "$WAIT_SECONDS" 9 || fail "lock" "another rsandbox-node.sh holds $LOCK_DIR/lock (waited ${WAIT_SECONDS}s)"
}
if [[ "$ACTION" == install || "$ACTION" == uninstall ]]; then
	lock_installer
	# a binary staged by a run that was killed before its rename
	rm -f "$(hp "$INSTALL_DIR")/.$SHIM_NAME.rsandbox-new."*
fi
case "$ACTION" in
install)
	if ((STAY)); then
		# a refusal, a rollback or a hold would only repeat in a crash loop: the pod stays,
		# not Ready (the rollout stops there), and its log and the Node's Events say why
		rc=0
		(do_install) || rc=$?
		if ((rc == 3 || rc == 4 || rc == 5)); then
			exec 9>&-
			log "install ended with exit status $rc: staying, not Ready (terminating this pod changes nothing on the node)"
			trap 'exit 0' TERM INT
			sleep infinity &
			wait
			exit 0
		fi
		((rc == 0)) || exit "$rc"
	else
		do_install
	fi
	;;
uninstall) do_uninstall ;;
status) do_status ;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
# the lock is for the work only: the DaemonSet's pod stays without it, so that a hand-run
# install or uninstall on its node can take it (closed before `sleep` could inherit it)
exec 9>&-
if ((STAY)); then
	[[ -n "${READY_FILE:-}" ]] && : >"$READY_FILE"
	log "$ACTION done: staying (terminating this pod changes nothing on the node)"
	trap 'exit 0' TERM INT
	sleep infinity &
	wait
fi
