# shellcheck shell=bash
# hack/lib/proc.sh - containerd and the shims of this bench: start, stop, reset,
# status, the env for ctr/crictl, installing the shim; cleaning up what a
# crash left (runc containers, shims, mounts, bundles, sockets).
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

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
	# Descriptors above 2 are closed first: containerd (and every shim it starts) must not
	# inherit a caller's lock or pipe (a `flock LOCK hack/setup.sh` would otherwise stay
	# locked for as long as containerd runs).
	# shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
	PATH="$BIN:$PATH" setsid bash -c 'for fd in /proc/$$/fd/*; do fd=${fd##*/}; ((fd > 2)) && eval "exec $fd>&-"; done; echo $$ >"$1" && shift && exec "$@"' \
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
	# after a crash (shim or containerd killed), shim sockets and bundles stay;
	# containerd is down and our shims are gone, so they are dead for sure. The
	# sockets first: the bundles name the shims whose sockets are ours.
	for d in $(stale_shim_sockets); do
		log "removing stale shim socket $d"
		rm -f "$d"
	done
	for d in "$STATE_DIR"/io.containerd.runtime.v2.task/*/*/; do
		[[ -d "$d" ]] || continue
		log "removing dead task bundle ${d%/}"
		rm -rf "${d:?}"
	done
	# every pod is gone now: drop stale IP leases
	rm -rf "${IPAM_DIR:?}/$CNI_NET"
	net_guard_off
	rm -f "$SOCK" "$SOCK.ttrpc"
	log "containerd stopped"
}

# --- shim sockets -------------------------------------------------------------------
# /run/containerd/s is shared by every containerd on the machine (containerd's shim code
# hard-codes it up to 2.2), so a socket there is ours only by its name: containerd's
# SocketAddress (pkg/shim/util_unix.go) names a shim's socket sha256("<its address>/
# <namespace>/<grouping id>"), plus "/debug" for the debug one. Listing the listening
# sockets in /proc/net/unix would not do: it shows only this network namespace's, so the
# live shim of a containerd in another one would look stale.
SHIM_SOCKET_DIR=/run/containerd/s

our_shim_sockets() { # the socket paths in $SHIM_SOCKET_DIR our containerd gave its shims
	local d ns id h
	{
		# after a crash: the bundles in our state dir name the shims (grouping = the
		# sandbox's ID, which has a bundle too)
		for d in "$STATE_DIR"/io.containerd.runtime.v2.task/*/*/; do
			[[ -d "$d" ]] || continue
			d=${d%/} id=${d##*/} ns=${d%/*} ns=${ns##*/}
			for h in "$SOCK/$ns/$id" "$SOCK/$ns/$id/debug"; do
				printf '%s/%s\n' "$SHIM_SOCKET_DIR" "$(printf '%s' "$h" | sha256sum | cut -d' ' -f1)"
			done
		done
		# and our log: containerd logs `connecting to shim <id>` with the socket's address
		# for every shim it starts (our log: no other containerd's address is in it)
		if [[ -f "$LOGFILE" ]]; then
			grep -o 'address="unix://'"$SHIM_SOCKET_DIR"'/[0-9a-f]\{64\}"' "$LOGFILE" 2>/dev/null |
				sed -e 's/^address="unix:\/\///' -e 's/"$//' || true
		fi
	} | sort -u
}

# socket_accepts PATH: 0 when something accepts connections on the socket at PATH, 1 when
# nobody does (refused, or gone), 2 when it cannot tell. A connect(2) by path reaches the
# socket whatever network namespace its listener lives in; a listener that does not accept
# in time (its backlog full) counts as alive. perl-base is Essential on Debian.
socket_accepts() {
	perl -MSocket -e '
		socket(my $s, PF_UNIX, SOCK_STREAM, 0) or exit 2;
		$SIG{ALRM} = sub { exit 0 };
		alarm 2;
		exit 0 if connect($s, pack_sockaddr_un($ARGV[0]));
		exit(($!{ECONNREFUSED} || $!{ENOENT}) ? 1 : 2);' "$1"
}

stale_shim_sockets() { # our shims' sockets that nobody accepts on (their shim is gone)
	local s rc
	while read -r s; do
		[[ -S "$s" ]] || continue
		rc=0
		socket_accepts "$s" || rc=$?
		((rc == 1)) && echo "$s"
	done < <(our_shim_sockets)
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
