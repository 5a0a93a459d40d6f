#!/bin/bash
# hack/node/enter.sh STATE-DIR - the node's PID 1, first step (see hack/node.sh). It runs as
# PID 1 of the node's new pid, mount, uts, ipc and net namespaces (`unshare --pid --fork
# --mount --uts --ipc --net`), still in the host's cgroup namespace and with the host's /proc
# mounted: it writes its host pid for hack/node.sh, moves itself into the node's cgroup
# (NAME/node in every host hierarchy; the launcher stays in NAME), and only then makes the
# cgroup namespace, so that the namespace's root is that cgroup and nothing above it is seen
# from inside. hack/node/init.sh continues in the new cgroup namespace.
set -euo pipefail
STATE=$1
# shellcheck disable=SC1091 # written by hack/node.sh boot
. "$STATE/env"

# The host's pid of this process: /proc is still the host's, and bash opens /proc/self itself
# (no child process), so the link resolves to this shell in the host's pid namespace.
read -r host_pid _ </proc/self/stat
echo "$host_pid" >"$STATE/pid.tmp"
mv -f "$STATE/pid.tmp" "$STATE/pid"

# "0": the writing process itself (v1 and v2 alike)
while read -r _type mnt _opts; do
	echo 0 >"$mnt/$NODE_CG/node/cgroup.procs"
done <<<"$NODE_HIERARCHIES"

# the console is a pty (hack/node.sh runs this under script(1)): no CR before every LF in
# console.log
stty -onlcr 2>/dev/null || true
NODE_TTY=$(tty) || NODE_TTY=
export NODE_TTY
exec unshare --cgroup /bin/bash "$NODE_REPO/hack/node/init.sh" "$STATE"
