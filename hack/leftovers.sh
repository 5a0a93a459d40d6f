#!/usr/bin/env bash
# hack/leftovers.sh - print what the shim (or a test) may have left on this
# machine; exit 1 when anything is found.
#
# Meant to run after `hack/containerd.sh stop`: then every item below is a
# leftover. While our containerd runs it also lists containerd's own objects
# (containers, tasks, sandboxes) and counts everything a live pod holds, so a
# run with live pods reports them too (hack/test.sh runs it once before the
# stop, to catch tests that did not clean up, and once after).
#
# Checked: containerd objects (if running); shim processes (by name, or by
# `-address <our socket>`); mounts under the prefix (others with "rsandbox"
# in their path are notes: another prefix's); netns files under the prefix and CRI-style ones in /run/netns;
# shim sockets in /run/containerd/s with a name our containerd gives its shims;
# runc containers of this bench; /run/containerd/rsandbox; cgroups below
# default/, k8s.io/ or *rsandbox* dirs; veths on our bridge; portmap chains;
# host-local IP leases. Items that may belong to something else on the
# machine (another containerd, `ip netns add`) are printed as notes only: a
# shim socket counts only when its name is one our containerd gives (the
# sha256 of our address, namespace and ID, as containerd's SocketAddress), a
# cgroup below default/ or k8s.io/ only when this bench's containerd log names
# it (CRI logs the ID of every pod and container), so another containerd's
# shims and containers (a Kubernetes test beside ours) are never taken for ours.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root

found=0
leftover() {
	printf 'LEFTOVER %-10s %s\n' "[$1]" "$2"
	found=$((found + 1))
}
note() { printf 'note     %-10s %s\n' "[$1]" "$2"; }

cmdline_of() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | cut -c1-200; }

# named_in_our_log NAME...: prints those of the NAMEs (socket paths, IDs) that
# this bench's containerd log mentions, one grep over the log for all of them.
named_in_our_log() {
	(($#)) && [[ -f "$LOGFILE" ]] || return 0
	grep -ohF -f <(printf '%s\n' "$@") "$LOGFILE" | sort -u
}

is_our_shim() { # pid: a shim (or pause process) of this bench's containerd
	local cmd ppid
	cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
	# Only shims of this bench's containerd (another containerd on this machine may run
	# rsandbox shims too).
	[[ "$cmd" == *containerd-shim*" -address $SOCK "* ]] && return 0
	# Pause processes run the shim's pause program as `rsandbox-pause <pod id>`: ours
	# when their parent is one of our shims, and any orphaned one (its shim is gone).
	[[ "$cmd" == "rsandbox-pause "* ]] || return 1
	ppid=$(awk '{ print $4 }' "/proc/$1/stat" 2>/dev/null) || return 0
	is_our_shim "$ppid" && return 0
	! tr '\0' ' ' 2>/dev/null <"/proc/$ppid/cmdline" | grep containerd-shim-rsandbox >/dev/null
}

# --- containerd's objects ------------------------------------------------------
if containerd_pid >/dev/null; then
	note containerd "running (pid $(containerd_pid)); live objects count as leftovers"
	for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
		for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do leftover task "$ns/$id"; done
		for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do leftover container "$ns/$id"; done
		# (ctr sandboxes ls has no -q: skip its header line)
		for id in $(ctr_ -n "$ns" sandboxes ls 2>/dev/null | awk 'NR > 1 { print $1 }'); do leftover sandbox "$ns/$id"; done
	done
fi

# --- processes -------------------------------------------------------------------
for d in /proc/[0-9]*; do
	pid=${d#/proc/}
	[[ "$pid" != "$$" ]] || continue
	if is_our_shim "$pid"; then leftover process "pid $pid: $(cmdline_of "$pid")"; fi
done

# --- mounts ----------------------------------------------------------------------
while read -r m; do
	m=$(printf '%b' "$m") # findmnt -r escapes blanks as \x20
	if [[ "$m" == "$P"/* ]]; then
		leftover mount "$m"
	elif [[ "$m" == *rsandbox* ]]; then
		# everything this bench's shims mount is under the prefix (netns_dir, bundles):
		# another prefix's bench (a demo beside this one) or another containerd's rsandbox
		note mount "$m (outside $P: not this bench's)"
	fi
done < <(findmnt -rn -o TARGET)

# --- network namespaces ----------------------------------------------------------
for f in "$STATE_DIR"/*/netns/* "$P"/run/netns/*; do
	if [[ -e "$f" ]]; then leftover netns "$f"; fi
done
for f in /run/netns/*; do
	[[ -e "$f" ]] || continue
	# CRI names its netns cni-<uuid>; anything else may be someone's `ip netns add`
	case "${f##*/}" in
	cni-* | *rsandbox*) leftover netns "$f" ;;
	*) note netns "$f (not ours by name)" ;;
	esac
done

# --- shim sockets (/run/containerd/s is shared by every containerd) -----------------
# Ours by name only (lib/proc.sh: our_shim_sockets, containerd's SocketAddress); alive or
# stale by a connect(2) probe, which reaches a listener in any network namespace. A stale
# socket of ours is a leftover, as is a live one (our shims are gone after a stop); any
# other socket belongs to another containerd and is a note.
if compgen -G "$SHIM_SOCKET_DIR/*" >/dev/null; then
	declare -A inode_of=() our_socket=()
	while read -r _ _ _ _ _ _ inode path; do
		if [[ "$path" == "$SHIM_SOCKET_DIR"/* ]]; then inode_of[$path]=$inode; fi
	done < <(tail -n +2 /proc/net/unix)
	while read -r s; do our_socket[$s]=1; done < <(our_shim_sockets)
	for s in "$SHIM_SOCKET_DIR"/*; do
		[[ -S "$s" ]] || continue
		rc=0
		socket_accepts "$s" || rc=$?
		if ((rc == 1)); then
			if [[ -n "${our_socket[$s]:-}" ]]; then
				leftover socket "$s (stale: nobody accepts on it)"
			else
				note socket "$s (stale, not a name our containerd gives: another containerd's)"
			fi
			continue
		fi
		# the listener, when it lives in this network namespace (find fails on fds of
		# processes that exit meanwhile: ignore that)
		owners=
		if [[ -n "${inode_of[$s]:-}" ]]; then
			owners=$({ find /proc/[0-9]*/fd -lname "socket:\[${inode_of[$s]}\]" 2>/dev/null || true; } | cut -d/ -f3 | sort -u | tr '\n' ' ')
		fi
		served="served by ${owners:+pid }${owners:-a process in another network namespace}"
		ours=0
		for pid in $owners; do if is_our_shim "$pid"; then ours=1; fi; done
		if ((ours)) || [[ -n "${our_socket[$s]:-}" ]]; then
			leftover socket "$s (${served% }, a name our containerd gives)"
		elif ((rc == 0)); then
			note socket "$s (${served% }: another containerd's)"
		else
			note socket "$s (cannot tell whether anything accepts on it; not a name our containerd gives)"
		fi
	done
fi

# --- runtime state dirs ----------------------------------------------------------
while read -r root id; do
	leftover runc "$id in $root ($(runc --root "$root" state "$id" 2>/dev/null | sed -n 's/^ *"status": *"\(.*\)",$/\1/p'))"
done < <(bench_runc_containers)
for f in "$RUNC_ROOT"/*/* /run/containerd/rsandbox/* "$STATE_DIR"/io.containerd.runtime.v2.task/*/*; do
	[[ -e "$f" ]] || continue
	# runc containers were reported just above with their state
	if [[ "$f" == "$RUNC_ROOT"/* ]] && runc --root "${f%/*}" state "${f##*/}" >/dev/null 2>&1; then continue; fi
	leftover state "$f"
done

# --- cgroups ---------------------------------------------------------------------
# ctr puts containers in /<namespace>/<id>, CRI uses the pod's parent; runc
# removes the leaf on delete, so any child below these parents is left over.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
	cg_roots=(/sys/fs/cgroup)
else
	cg_roots=()
	for d in /sys/fs/cgroup/*/; do cg_roots+=("${d%/}"); done
fi
# Below default/ and k8s.io/ another containerd on the machine makes cgroups
# too: ours are those named after an ID our containerd's log names.
ns_cgroups=()
for r in "${cg_roots[@]}"; do
	while read -r d; do ns_cgroups+=("$d"); done < <(find "$r"/default "$r"/k8s.io -mindepth 1 -maxdepth 1 -type d 2>/dev/null)
done
declare -A our_id=()
if ((${#ns_cgroups[@]})); then
	mapfile -t names < <(printf '%s\n' "${ns_cgroups[@]##*/}" | sort -u)
	while read -r id; do our_id[$id]=1; done < <(named_in_our_log "${names[@]}")
fi
for d in "${ns_cgroups[@]}"; do
	n=$(wc -l <"$d/cgroup.procs" 2>/dev/null || echo 0)
	if [[ -n "${our_id[${d##*/}]:-}" ]]; then
		leftover cgroup "$d ($n processes)"
	else
		note cgroup "$d ($n processes; not named in our containerd's log: another containerd's)"
	fi
done
for r in "${cg_roots[@]}"; do
	while read -r d; do
		[[ -n "$d" ]] || continue
		n=$(wc -l <"$d/cgroup.procs" 2>/dev/null || echo 0)
		leftover cgroup "$d ($n processes)"
	done < <(
		find "$r" -maxdepth 3 -type d -name '*rsandbox*' 2>/dev/null | while read -r p; do
			# the parent dir itself is fine when empty; report what is inside
			find "$p" -mindepth 1 -maxdepth 1 -type d
			if [[ -s "$p/cgroup.procs" ]]; then echo "$p"; fi
		done
	)
done

# --- network ---------------------------------------------------------------------
if ip link show "$RSANDBOX_BRIDGE" >/dev/null 2>&1; then
	while read -r _ ifname _; do
		leftover veth "${ifname%:} on $RSANDBOX_BRIDGE"
	done < <(ip -o link show master "$RSANDBOX_BRIDGE" 2>/dev/null)
fi
if command -v iptables >/dev/null; then
	while read -r _ chain; do
		leftover iptables "nat chain $chain (portmap)"
	done < <(iptables -w -t nat -S 2>/dev/null | grep -E '^-N CNI-DN-' || true)
	if ! containerd_pid >/dev/null && iptables -C "${GUARD_RULE[@]}" 2>/dev/null; then
		note iptables "the FORWARD guard is still in place (hack/containerd.sh stop removes it)"
	fi
fi
for f in "$IPAM_DIR/$CNI_NET"/*; do
	[[ -e "$f" ]] || continue
	case "${f##*/}" in last_reserved_ip.* | lock) continue ;; esac
	leftover ipam "lease ${f##*/} ($(head -n1 "$f" 2>/dev/null | cut -c1-64))"
done

if ((found)); then
	echo "leftovers: $found item(s)"
	exit 1
fi
echo "leftovers: none"
