#!/bin/bash
# hack/node/init.sh STATE-DIR - the node's PID 1, second step (see hack/node.sh and
# hack/node/enter.sh): in all of the node's namespaces now (pid, mount, uts, ipc, net,
# cgroup), it builds the node's root and becomes systemd, the way kind's entrypoint and
# docker run a systemd node:
#   - / : an overlay of the host's / (read-only lower) with a tmpfs upper, so nothing the
#     node writes reaches the host's files;
#   - a fresh /proc, with regular files bound over the global sysctls that systemd and a
#     kubelet write (NODE_SYSCTLS) and over /proc/cgroups (only the controllers the host
#     mounts a hierarchy for: systemd would mount a new hierarchy for the others);
#     /proc/sysrq-trigger read-only;
#   - /sys read-only; /sys/fs/cgroup a tmpfs holding every host hierarchy (v1 controllers,
#     name=systemd, cgroup2 `unified`), each mounted from inside the cgroup namespace: its
#     root is the node's cgroup; the tmpfs then read-only;
#   - /dev a tmpfs with the basic nodes, a new devpts, /dev/shm, /dev/mqueue, and the
#     launcher's pty as /dev/console (no /dev/kmsg: the host's kernel log stays the host's);
#   - tmpfs /run and /tmp, and fresh tmpfs for containerd's root and state, CNI's state and the
#     log under the bench prefix (containerd's overlayfs snapshotter cannot work on an
#     overlay upper; nothing of the host bench's state is seen or touched); a prefix below
#     /tmp or /run gets an overlay of its own, as /'s;
#   - the repository bound read-only (live, not through the overlay);
#   - the node's files (hack/node/units.sh): units, masks, containerd's config, machine-id;
#   - pivot_root, the old root detached, `mount --make-rshared /`, then
#     `exec env -i container=docker /lib/systemd/systemd` without CAP_SYS_MODULE, CAP_SYS_TIME
#     and CAP_SYSLOG in its bounding set.
set -euo pipefail
STATE=$1
# shellcheck disable=SC1091 # written by hack/node.sh boot
. "$STATE/env"
# shellcheck source=hack/node/units.sh
. "$NODE_REPO/hack/node/units.sh"

fail() {
	echo "node init: $*" >&2
	exit 1
}

FS=$STATE/fs
mount -t tmpfs -o mode=0755 rsandbox-node "$FS"
mkdir -p "$FS"/{upper,work,root,files}
R=$FS/root
mount -t overlay rsandbox-node -o "lowerdir=/,upperdir=$FS/upper,workdir=$FS/work" "$R"

# /proc, and the host's global knobs out of reach
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
for k in $NODE_SYSCTL_KEYS; do
	[[ -f "$R/proc/sys/$k" ]] || continue
	f=$FS/files/sysctl-${k//\//.}
	IFS= read -r v <"/proc/sys/$k" || true
	printf '%s\n' "$v" >"$f"
	mount --bind "$f" "$R/proc/sys/$k"
done
awk 'NR == 1 || $2 != 0' /proc/cgroups >"$FS/files/cgroups"
mount --bind "$FS/files/cgroups" "$R/proc/cgroups"
if [[ -e "$R/proc/sysrq-trigger" ]]; then
	mount --bind "$R/proc/sysrq-trigger" "$R/proc/sysrq-trigger"
	mount -o remount,bind,ro "$R/proc/sysrq-trigger"
fi

# /sys read-only; the cgroup hierarchies, rooted at the node's cgroup
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup "$R/sys/fs/cgroup"
cg_dirs=()
while read -r _ mnt _; do cg_dirs+=("$R/sys/fs/cgroup/${mnt##*/}"); done <<<"$NODE_HIERARCHIES"
mkdir -p "${cg_dirs[@]}"
while read -r type mnt opts; do
	d=$R/sys/fs/cgroup/${mnt##*/}
	if [[ $type == cgroup2 ]]; then
		mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$d"
	else
		mount -t cgroup -o "nosuid,nodev,noexec,$opts" cgroup "$d"
	fi
done <<<"$NODE_HIERARCHIES"
# the host's links (cpu -> cpu,cpuacct where it co-mounts them)
for l in /sys/fs/cgroup/*; do
	[[ -L "$l" ]] && ln -s "$(readlink "$l")" "$R/sys/fs/cgroup/${l##*/}"
done
mount -o remount,ro,nosuid,nodev,noexec "$R/sys/fs/cgroup"

# /dev: the basic nodes only
mount -t tmpfs -o mode=0755,nosuid,size=65536k dev "$R/dev"
# the host's nodes copied (cp makes them with mknod: one process for all)
cp -a /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty "$R/dev/"
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5,nosuid,noexec devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$R/dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue "$R/dev/mqueue"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
if [[ -n "${NODE_TTY:-}" && -c "$NODE_TTY" ]]; then
	touch "$R/dev/console"
	mount --bind "$NODE_TTY" "$R/dev/console"
fi

mount -t tmpfs -o mode=0755,nosuid,nodev run "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$R/tmp"
# A bench prefix below /tmp or /run (RSANDBOX_PREFIX=/tmp/...) is gone under those tmpfs: it
# gets the same overlay as / (the host's prefix the read-only lower, the node's writes, such
# as its runc link, in a tmpfs upper).
case "$RSANDBOX_PREFIX/" in
/tmp/* | /run/*)
	mkdir -p "$FS"/prefix-{upper,work} "$R$RSANDBOX_PREFIX"
	mount -t overlay rsandbox-node-prefix \
		-o "lowerdir=$RSANDBOX_PREFIX,upperdir=$FS/prefix-upper,workdir=$FS/prefix-work" \
		"$R$RSANDBOX_PREFIX"
	;;
esac
# containerd's root and state, CNI's leases and cache, the log, containerd's temp dir
state_dirs=("$R$RSANDBOX_PREFIX"/{var/lib/containerd,run,var/lib/cni,log,tmp} "$R/var/lib/cni")
mkdir -p "${state_dirs[@]}"
for d in "${state_dirs[@]}"; do
	mount -t tmpfs -o mode=0755 node-state "$d"
done

# The repository (and a cargo target dir outside it), read-only, as it is now and later: an
# overlay lower keeps the file it looked up first, so a test binary rebuilt after the boot
# would stay the old one through the overlay.
for d in $NODE_LIVE_DIRS; do
	[[ -d "$d" ]] || continue
	mkdir -p "$R$d" # a directory below /tmp or /run is gone under their tmpfs
	mount --bind "$d" "$R$d"
	mount -o remount,bind,ro "$R$d"
done

node_files "$R"

# the new root; the host's tree (and the staging tmpfs' other mounts) detached from it
mkdir -p "$R/.rsandbox-old-root"
cd "$R"
pivot_root . .rsandbox-old-root
cd /
umount -l /.rsandbox-old-root
rmdir /.rsandbox-old-root
mount --make-rshared /
hostname "$NODE_HOSTNAME"
# Without the capabilities that reach past every namespace: loading kernel modules (systemd
# loads autofs4, ipv6 ... when it may), setting the clock, the kernel's log buffer.
exec setpriv --bounding-set=-sys_module,-sys_time,-syslog env -i container=docker /lib/systemd/systemd
