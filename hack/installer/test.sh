#!/usr/bin/env bash
# hack/installer/test.sh [--scratch] [--manifests-only] [--tools] - the node installer's tests (issue 25
# item 3); hack/test.sh runs it after the systemd node's stage.
#
#   1. the Kubernetes side: `kustomize build` of deploy/kubernetes and of its uninstall overlay
#      (kustomize from Debian sid, through the bench's private apt state, extracted under
#      $RSANDBOX_PREFIX/tools), each validated by kubernetes-validate --strict (PyPI, pinned, in
#      a venv under $RSANDBOX_PREFIX/tools: Kubernetes' own OpenAPI schemas, offline) against
#      Kubernetes 1.30 (the oldest the manifests support) and the newest schema it has, and
#      deploy/kubernetes/node-labels (the second step's grant) likewise; then the admission
#      policies' CEL evaluated on admission requests as the API server builds them, and the
#      RBAC judged, by hack/installer/policy-check.py (cel-python, pinned, same venv);
#   2. the installer's CRI reader on responses captured from containerd 2.1.9
#      (hack/installer/fixtures); its restart slots (Leases) and Events against the API stub
#      (hack/installer/rollout-check.sh); its Node labels with and without the label grant
#      (hack/installer/label-check.sh); the node shapes it recognises (k3s, rke2, k0s, EKS
#      nodeadm, GKE COS, microk8s; CRI-O and unknown nodes refused) on fixture trees
#      (hack/installer/distro-check.sh, hack/installer/fixtures/distro);
#   3. integration/tests/installer.rs on a systemd node (hack/node.sh -n installer: systemd as
#      PID 1, containerd.service), through hack/installer/in-node.sh: fresh install, re-run,
#      upgrade with a running pod of the previous release, uninstall, both config.toml
#      flavours, a blocking preflight. --scratch: on a throwaway containerd of its own instead
#      (hack/installer/scratch-node.sh, a systemctl stand-in), where no node can boot.
# --tools: only install step 1's tools (hack/test.sh does it in its install stage, before any
# test runs).
#
# The new binary is this tree's release build (hack/build.sh makes it); the previous release's
# is RSANDBOX_INSTALLER_OLD. Needs root and the bench (hack/setup.sh); run it under the bench
# lock (it restarts no bench containerd, but the node uses the bench's binaries and images).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
need_root
cd "$RSANDBOX_REPO"

scratch=0
manifests_only=0
tools_only=0
for a in "$@"; do
	case "$a" in
	--scratch) scratch=1 ;;
	--manifests-only) manifests_only=1 ;;
	--tools) tools_only=1 ;;
	*)
		sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
		exit 2
		;;
	esac
done

TOOLS=$P/tools
KUSTOMIZE=$TOOLS/kustomize/usr/bin/kustomize
VALIDATE_VENV=$TOOLS/kubernetes-validate
# the schemas of Kubernetes 1.30 .. 1.37; pinned so that a new release cannot change a verdict
VALIDATE_PIN=kubernetes-validate==1.37.0
# a CEL evaluator for the policies' expressions (hack/installer/policy-check.py), in the same venv
CEL_PIN=cel-python==0.5.0

tools() {
	if [[ ! -x "$KUSTOMIZE" ]]; then
		apt_private_update
		rm -rf "$TOOLS/kustomize" "$P/debs"/kustomize_*.deb
		mkdir -p "$P/debs"
		log "downloading kustomize from $RSANDBOX_CONTAINERD_SUITE"
		(cd "$P/debs" && apt_private apt-get download kustomize)
		extract_debs "$TOOLS/kustomize" "$P/debs"/kustomize_*.deb
	fi
	"$KUSTOMIZE" version >/dev/null || die "$KUSTOMIZE does not run here"
	if [[ ! -x "$VALIDATE_VENV/bin/kubernetes-validate" ]] ||
		! "$VALIDATE_VENV/bin/pip" show kubernetes-validate 2>/dev/null | grep -x "Version: ${VALIDATE_PIN#*==}" >/dev/null; then
		log "installing $VALIDATE_PIN into $VALIDATE_VENV"
		# python3's venv module (a new Debian machine may have no python3 at all; only these
		# tests use it, so hack/setup.sh and the demo do not install it)
		if ! pkg_installed python3-venv; then
			local saved=("${HOST_PACKAGES[@]}")
			HOST_PACKAGES=(python3 python3-venv)
			deps
			HOST_PACKAGES=("${saved[@]}")
		fi
		rm -rf "$VALIDATE_VENV"
		python3 -m venv "$VALIDATE_VENV"
		"$VALIDATE_VENV/bin/pip" install -q "$VALIDATE_PIN"
	fi
	if ! "$VALIDATE_VENV/bin/pip" show cel-python 2>/dev/null | grep -x "Version: ${CEL_PIN#*==}" >/dev/null; then
		log "installing $CEL_PIN into $VALIDATE_VENV"
		"$VALIDATE_VENV/bin/pip" install -q "$CEL_PIN"
	fi
	"$VALIDATE_VENV/bin/python" -c 'import celpy' || die "cel-python does not import in $VALIDATE_VENV"
}

manifests() {
	local out=$P/tmp/installer-manifests k v rel
	mkdir -p "$out"
	tools
	"$KUSTOMIZE" build deploy/kubernetes >"$out/install.yaml"
	"$KUSTOMIZE" build deploy/kubernetes/uninstall >"$out/uninstall.yaml"
	"$KUSTOMIZE" build deploy/kubernetes/node-labels >"$out/node-labels.yaml"
	for v in 1.30.0 "$("$VALIDATE_VENV/bin/kubernetes-validate" --version)"; do
		for k in install uninstall node-labels; do
			"$VALIDATE_VENV/bin/kubernetes-validate" --quiet --strict -k "$v" "$out/$k.yaml" ||
				die "deploy/kubernetes ($k) does not validate against Kubernetes $v"
		done
		log "deploy/kubernetes (install, uninstall, node-labels): $(grep -c '^kind:' "$out/install.yaml") + $(grep -c '^kind:' "$out/node-labels.yaml") objects, valid (strict) for Kubernetes $v"
	done
	# the control-plane component, as an overlay of a platform team's uses it (kustomize
	# accepts only relative paths to the bases)
	mkdir -p "$out/control-plane-overlay"
	rel=$(realpath --relative-to="$out/control-plane-overlay" deploy/kubernetes)
	printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s/control-plane\n' \
		"$rel" "$rel" >"$out/control-plane-overlay/kustomization.yaml"
	"$KUSTOMIZE" build "$out/control-plane-overlay" >"$out/control-plane.yaml"
	"$VALIDATE_VENV/bin/kubernetes-validate" --quiet --strict "$out/control-plane.yaml" ||
		die "deploy/kubernetes with the control-plane component does not validate"
	diff <(grep -v -e '^      tolerations:' -e '^      - effect: NoSchedule$' -e '^        key: node-role.kubernetes.io/control-plane$' -e '^        operator: Exists$' -e '^      tolerations: \[\]$' "$out/install.yaml") \
		<(grep -v -e '^      tolerations:' -e '^      - effect: NoSchedule$' -e '^        key: node-role.kubernetes.io/control-plane$' -e '^        operator: Exists$' "$out/control-plane.yaml") >/dev/null ||
		die "deploy/kubernetes/control-plane changes more than the DaemonSet's tolerations"
	grep -x '        key: node-role.kubernetes.io/control-plane' "$out/control-plane.yaml" >/dev/null ||
		die "deploy/kubernetes/control-plane does not tolerate the control-plane taint"
	# the node-shape components (deploy/kubernetes/shapes/*), each over deploy/kubernetes as a
	# platform team's overlay uses it: valid, changing only the DaemonSet's host paths and
	# --distro; their installer pods go to the node test (RSANDBOX_INSTALLER_SHAPE_MANIFESTS),
	# under the target directory, which the node sees
	local d shape_args=() shape_out=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/installer/shape-manifests name
	rm -rf "$shape_out"
	mkdir -p "$shape_out"
	for d in deploy/kubernetes/shapes/*/; do
		name=$(basename "$d")
		mkdir -p "$out/shape-$name"
		printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s/shapes/%s\n' \
			"$rel" "$rel" "$name" >"$out/shape-$name/kustomization.yaml"
		"$KUSTOMIZE" build "$out/shape-$name" >"$out/shape-$name.yaml" ||
			die "deploy/kubernetes/shapes/$name does not build over deploy/kubernetes"
		"$VALIDATE_VENV/bin/kubernetes-validate" --quiet --strict "$out/shape-$name.yaml" ||
			die "deploy/kubernetes with the $name component does not validate"
		shape_args+=("$name=$out/shape-$name.yaml")
	done
	"$VALIDATE_VENV/bin/python" hack/installer/shape-manifest-check.py "$out/install.yaml" "$shape_out" "${shape_args[@]}" ||
		die "deploy/kubernetes/shapes: a component changes more than its node's paths"
	"$VALIDATE_VENV/bin/python" hack/installer/policy-check.py "$out/install.yaml" "$out/node-labels.yaml" ||
		die "deploy/kubernetes: the admission policies or the RBAC fail their checks"
	# the overlay changes the DaemonSet's action, nothing else
	diff <(grep -v -e '- install$' -e '- uninstall$' -e '- --wait-for-pods=-1$' "$out/install.yaml") \
		<(grep -v -e '- install$' -e '- uninstall$' -e '- --wait-for-pods=-1$' "$out/uninstall.yaml") >/dev/null ||
		die "deploy/kubernetes/uninstall changes more than the DaemonSet's arguments"
}

cri_reader() {
	bash hack/installer/fixtures/check.sh
	bash hack/installer/rollout-check.sh
	bash hack/installer/label-check.sh
	bash hack/installer/distro-check.sh
}

node_tests() {
	local new old exe rc=0 started
	new=$(built_shim)
	[[ -x "$new" ]] || die "no release build at $new: hack/build.sh"
	# the previous release (hack/previous-release.sh builds it once; hack/test.sh exports
	# RSANDBOX_PREVIOUS_SHIM)
	old=${RSANDBOX_INSTALLER_OLD:-${RSANDBOX_PREVIOUS_SHIM:-}}
	if [[ -z "$old" && -x hack/previous-release.sh ]]; then
		old=$(hack/previous-release.sh) || die "hack/previous-release.sh could not build the previous release"
	fi
	if [[ -z "$old" ]]; then
		# without a previous release: a copy of the new binary with one byte appended, another
		# file (the upgrade's rename and the old pod's "(deleted)" binary are exercised), not
		# another release. Under target/: the node sees the repository and its target
		# directory, not the prefix's tmp/
		old=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/installer/old-$SHIM_NAME
		mkdir -p "$(dirname "$old")"
		cat "$new" >"$old" && printf '\n' >>"$old" && chmod 755 "$old"
		log "WARNING: no previous release (hack/previous-release.sh, RSANDBOX_INSTALLER_OLD): the upgrade starts from a copy of the new binary"
	fi
	[[ -x "$old" ]] || die "no previous release's binary at $old"
	log "building the installer's integration test"
	exe=$(cargo test --manifest-path integration/Cargo.toml --test installer --no-run --message-format=json 2>/dev/null |
		jq -r 'select(.reason == "compiler-artifact" and .target.name == "installer" and .executable != null) | .executable' | tail -n1)
	[[ -x "$exe" ]] || die "could not build integration/tests/installer.rs"
	started=$(date +%s)
	if ((scratch)); then
		local d=$P/tmp/installer-scratch
		hack/installer/scratch-node.sh "$d" stop || true
		rm -rf "$d"
		hack/installer/scratch-node.sh "$d" setup
		hack/installer/scratch-node.sh "$d" start
		(
			# the DaemonSet's test needs a systemd node: it skips here, out loud
			export RSANDBOX_EXPECT_GATES=installer-node
			eval "$(hack/installer/scratch-node.sh "$d" env)"
			export CONTAINERD_CONFIG CONTAINERD_SOCKET INSTALL_DIR STATE_DIR SYSTEMCTL
			export RSANDBOX_INSTALLER_CONFIG=$CONTAINERD_CONFIG CONTAINERD_ADDRESS=$CONTAINERD_SOCKET
			with_heartbeat "installer.rs on the scratch containerd" hack/installer/in-node.sh "$exe" "$new" "$old"
		) || rc=$?
		hack/installer/scratch-node.sh "$d" stop
		rm -rf "$d"
	else
		# the DaemonSet's container: the installer image's file system, unpacked where the
		# node sees it (the target directory)
		export RSANDBOX_INSTALLER_IMAGE_ROOT=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/installer/image-root
		# the node shapes' installer pods, as manifests() built them from deploy/kubernetes/shapes
		export RSANDBOX_INSTALLER_SHAPE_MANIFESTS=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/installer/shape-manifests
		hack/installer/image.sh --binary "$new" --tag test --rootfs "$RSANDBOX_INSTALLER_IMAGE_ROOT" \
			"${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/installer/rsandbox-node-installer-test.oci.tar"
		hack/node.sh -n installer boot
		# every test runs on the node: one that would skip fails (hack/node.sh exec passes
		# RSANDBOX_* on)
		RSANDBOX_EXPECT_GATES="installer-node installer-daemonset" \
			with_heartbeat "installer.rs on the node" \
			hack/node.sh -n installer exec -- bash hack/installer/in-node.sh "$exe" "$new" "$old" || rc=$?
		hack/node.sh -n installer stop || rc=1
	fi
	log "installer tests on the $( ((scratch)) && echo scratch containerd || echo systemd node): $(($(date +%s) - started)) s"
	return "$rc"
}

if ((tools_only)); then
	section "installer: tools (kustomize, kubernetes-validate, cel-python)"
	tools
	exit 0
fi
section "installer: manifests (kustomize build + kubernetes-validate --strict)"
manifests
section "installer: CRI reader on captured responses; restart slots and Events on the API stub; node shapes"
cri_reader
if ((!manifests_only)); then
	section "installer: integration/tests/installer.rs on a $( ((scratch)) && echo scratch containerd || echo systemd node)"
	node_tests
fi
