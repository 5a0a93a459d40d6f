# shellcheck shell=bash
# hack/node/lib.sh - the host's side of a systemd node (hack/node.sh): its name, its state
# directory, the host's cgroup hierarchies and the node's subtree in each, the node's
# processes and namespaces. Sourced by hack/node.sh after hack/lib.sh (log/die in scope).
#
# A node NAME owns, on the host:
#   /run/rsandbox-node/NAME/            state: env (what the node's PID 1 reads), pid (its PID 1,
#                                       host view), ns (its namespaces' inodes), console.log (its
#                                       /dev/console), containerd.toml, sysctls (values at boot);
#                                       fs/ is the mount point of its staging tmpfs, mounted in
#                                       the node's own mount namespace only
#   <hierarchy>/rsandbox-node-NAME      in every cgroup hierarchy the host mounts under
#                                       /sys/fs/cgroup: the launcher (script, unshare) sits here;
#   <hierarchy>/rsandbox-node-NAME/node the node itself: its cgroup namespace's root
# Nothing else: every mount the node makes is in its own mount namespace.

# The NODE_* variables are used by the scripts that source this file:
# shellcheck disable=SC2034
NODE_STATE_BASE=/run/rsandbox-node
# the global sysctls a node's PID 1 (fs.file-max, fs.nr_open: systemd's
# bump_file_max_and_nr_open) or a kubelet (setupKernelTunables: vm.*, kernel.panic*,
# kernel.keys.root_max*) write: the node sees regular files bound over them
NODE_SYSCTLS=(fs/file-max fs/nr_open vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
	kernel/keys/root_maxkeys kernel/keys/root_maxbytes kernel/printk_devkmsg kernel/core_pattern)

# node_set NAME: the variables of node NAME
node_set() {
	[[ "$1" =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "node name '$1': lower-case letters, digits and '-' (at most 31)"
	NODE_NAME=$1
	NODE_STATE=$NODE_STATE_BASE/$NODE_NAME
	NODE_CG=rsandbox-node-$NODE_NAME
	NODE_HOSTNAME=rsandbox-$NODE_NAME
}

# node_hierarchies: one line per cgroup hierarchy the host mounts under /sys/fs/cgroup:
# "TYPE MOUNTPOINT OPTIONS" (OPTIONS: the controllers and flags a mount of the same hierarchy
# must name, "-" for none). A hierarchy mounted twice is listed once.
node_hierarchies() {
	awk '$5 ~ "^/sys/fs/cgroup(/|$)" {
		for (i = 7; i <= NF && $i != "-"; i++) {}
		type = $(i + 1)
		if (type != "cgroup" && type != "cgroup2") next
		if (seen[$3]++) next
		opts = ""
		n = split($(i + 3), o, ",")
		for (j = 1; j <= n; j++) {
			if (o[j] == "rw" || o[j] == "ro") continue
			# cgroup2 flags (nsdelegate, memory_recursiveprot) belong to the host: a mount
			# from inside a cgroup namespace takes none
			if (type == "cgroup2") continue
			opts = opts (opts == "" ? "" : ",") o[j]
		}
		print type, $5, (opts == "" ? "-" : opts)
	}' /proc/self/mountinfo
}

# node_cgroup_dirs [SUFFIX]: the node's directory (plus SUFFIX) in every host hierarchy
node_cgroup_dirs() {
	local _type mnt _opts
	while read -r _type mnt _opts; do
		echo "$mnt/$NODE_CG${1:-}"
	done < <(node_hierarchies)
}

# node_cgroup_make: the node's subtree (NAME and NAME/node) in every host hierarchy; cpuset's
# new directories get their parent's CPUs and memory nodes (v1 leaves them empty, and no task
# can join an empty cpuset)
node_cgroup_make() {
	local d sub f v dirs=()
	for d in $(node_cgroup_dirs); do
		dirs+=("$d" "$d/node")
	done
	mkdir -p "${dirs[@]}"
	for sub in "${dirs[@]}"; do
		for f in cpuset.cpus cpuset.mems; do
			[[ -f "$sub/$f" ]] || continue
			read -r v <"$sub/$f" || true
			[[ -z "$v" ]] || continue
			read -r v <"${sub%/*}/$f" || true
			echo "$v" >"$sub/$f"
		done
	done
}

# node_cgroup_join DIR-SUFFIX: moves the calling shell ($BASHPID) into the node's DIR-SUFFIX
# ("" or "/node") in every host hierarchy
node_cgroup_join() {
	local d
	for d in $(node_cgroup_dirs "$1"); do
		echo "$BASHPID" >"$d/cgroup.procs"
	done
}

# node_cgroup_pids: every process in the node's subtree, in any hierarchy (host pids)
node_cgroup_pids() {
	local d
	for d in $(node_cgroup_dirs); do
		[[ -d "$d" ]] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -un
	return 0
}

# node_cgroup_remove: removes the subtree, deepest first, in every hierarchy (a cgroup whose
# last task just exited can stay busy a moment: tried for 10 s); 1 if some directory stays
node_cgroup_remove() {
	local d left _
	for _ in $(seq 1 100); do
		left=0
		for d in $(node_cgroup_dirs); do
			[[ -d "$d" ]] || continue
			find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
			[[ -d "$d" ]] && left=1
		done
		((left)) || return 0
		sleep 0.1
	done
	return 1
}

# node_pid: the node's PID 1 (host view) when it runs: its pid file names a live process in
# the node's cgroup
node_pid() {
	local pid d
	[[ -f "$NODE_STATE/pid" ]] || return 1
	pid=$(<"$NODE_STATE/pid")
	[[ "$pid" =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
	grep -q ":/$NODE_CG/node\(/.*\)\{0,1\}$" "/proc/$pid/cgroup" 2>/dev/null || return 1
	echo "$pid"
}

# node_ns_find WHAT INODE...: the /proc entries of host processes that are in (WHAT=ns) or hold
# a descriptor of (WHAT=fd) any of the namespaces INODE ("net:[4026...]" ...), one find over
# /proc (no process per entry)
node_ns_find() {
	local what=$1 n expr=()
	shift
	for n in "$@"; do
		[[ -n "$n" ]] || continue
		# find's patterns are globs: the brackets of "net:[...]" literally
		n=${n//[/\\[}
		expr+=(${expr[@]:+-o} -lname "${n//]/\\]}")
	done
	((${#expr[@]})) || return 0
	find /proc/[0-9]*/"$what"/ -maxdepth 1 \( "${expr[@]}" \) -print 2>/dev/null || true
}

# node_ns_pids INODE...: host processes in any of the namespaces INODE
node_ns_pids() {
	node_ns_find ns "$@" | cut -d/ -f3 | sort -un
}

# node_enter PID ARGS...: runs ARGS in every namespace of the node (mount, uts, ipc, net, pid,
# cgroup); the process itself stays in the caller's cgroups
node_enter() {
	local pid=$1
	shift
	nsenter --target "$pid" --mount --uts --ipc --net --pid --cgroup -- "$@"
}

# node_sysctl_values: "key value" of each protected sysctl that exists here
node_sysctl_values() {
	local k v
	for k in "${NODE_SYSCTLS[@]}"; do
		[[ -f /proc/sys/$k ]] || continue
		IFS= read -r v </proc/sys/"$k" || true
		printf '%s %s\n' "$k" "$v"
	done
}
