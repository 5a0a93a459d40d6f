# shellcheck shell=bash
# deploy/node/lib/binary.sh - the shim binary on the node: installed by rename, kept while a
# pod may still need it.
#
# containerd runs the shim binary for every pod action that outlives the shim daemon: `start`
# of each new pod, and `delete` after a pod's daemon exited or died (which cleans up what a
# crashed daemon left). So:
#   - the binary is replaced by writing a new file beside it and renaming it over the path:
#     a running shim keeps the inode it maps (writing into that file would fail with "Text file
#     busy", or, truncated, crash it); containerd execs the new file for new pods;
#   - the uninstall removes it only when no pod of this node can still need it: no shim
#     daemon runs this binary (also an old one: its /proc/<pid>/exe reads "... (deleted)" once
#     replaced) and CRI lists no pod sandbox on the rsandbox handler (a pod whose shim died
#     still needs `delete` when the kubelet removes it).

# shellcheck disable=SC2034 # read by rsandbox-node.sh
SHIM_NAME=containerd-shim-rsandbox-v1

install_binary() { # SRC: 0 when the installed binary changed
	write_if_changed "$1" "$(hp "$SHIM_PATH")" 755
}

# shim_processes: PIDs of processes running the installed binary (or a binary that was
# replaced or removed at that path), one a line
shim_processes() {
	local d exe
	for d in /proc/[0-9]*; do
		exe=$(readlink "$d/exe" 2>/dev/null) || continue
		[[ "$exe" == "$SHIM_PATH" || "$exe" == "$SHIM_PATH (deleted)" ]] && echo "${d#/proc/}"
	done
	return 0
}

# binary_in_use: prints why the binary is still needed (nothing when it is not)
binary_in_use() {
	local pids pods
	pids=$(shim_processes | tr '\n' ' ')
	[[ -n "$pids" ]] && echo "shim processes running it: ${pids% }"
	if pods=$(cri_pods_on_handler "$HANDLER"); then
		[[ -n "$pods" ]] && echo "pod sandboxes on the $HANDLER handler: $(awk '{ printf "%s%s (%s)", sep, $2, $1; sep = ", " }' <<<"$pods")"
	else
		echo "CRI ListPodSandbox failed: whether a pod needs the binary is unknown"
	fi
	return 0
}
