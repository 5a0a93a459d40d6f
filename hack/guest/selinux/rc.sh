#!/bin/sh
# hack/guest/selinux/rc.sh - the SELinux guest's boot script (busybox sh), installed as
# /etc/init.d/rsandbox-selinux (initrc_exec_t: busybox init, in init_t, runs it in initrc_t).
# Mounts what a node has, starts containerd (the policy moves it to dockerd_t: refpolicy's
# docker module labels /usr/bin/containerd dockerd_exec_t), imports the test images, runs the
# probes (integration/tests/selinux.rs) once per handler with the kernel log's AVC lines
# collected around each, prints a summary, writes the exit status to the results share (/mnt)
# and powers off. Fails if SELinux is not enforcing, containerd is not in dockerd_t, a probe
# fails, a domain other than the harness's logs a permissive denial, or rsandbox has a denial
# the runc path does not also have.
set -u
OUT=/mnt
export PATH=/usr/sbin:/usr/bin
finish() {
	echo "$1" >"$OUT/rc"
	sync
	echo b >/proc/sysrq-trigger
	sleep 10
}

# avc_keys FILE: the denials of FILE as "perms scontext-type -> tcontext-type : tclass
# [permissive]", once each
avc_keys() {
	sed -n 's/.*avc:  denied  { \([^}]*\) }.* scontext=\([^ ]*\) tcontext=\([^ ]*\) tclass=\([^ ]*\) permissive=\([01]\).*/\1|\2|\3|\4|\5/p' "$1" |
		awk -F'|' '{ split($2, s, ":"); split($3, t, ":"); print $1 " " s[3] " -> " t[3] " : " $4 ($5 == 1 ? " (permissive)" : "") }' | sort -u
}

main() {
	rc=0
	t0=$(cut -d' ' -f1 /proc/uptime)
	mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
	mount -t tmpfs -o mode=1777 tmpfs /tmp
	mkdir -p /dev/pts /dev/shm /dev/mqueue
	mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
	mount -t tmpfs -o mode=1777 tmpfs /dev/shm
	mount -t mqueue mqueue /dev/mqueue
	# devtmpfs' nodes were made before the policy: label them as udev/systemd would
	setfiles -q /etc/selinux/default/contexts/files/file_contexts /dev /tmp /run || echo "guest: setfiles /dev failed"
	hostname rsandbox-selinux
	while read -r m; do insmod "/lib/modules/rsandbox/$m" || echo "guest: insmod $m failed"; done </lib/modules/rsandbox/order
	ip link set lo up
	enforce=$(cat /sys/fs/selinux/enforce 2>/dev/null || echo none)
	echo "guest: up after $(cut -d' ' -f1 /proc/uptime) s; kernel $(uname -r); enforce=$enforce; policy version $(cat /sys/fs/selinux/policyvers); mls=$(cat /sys/fs/selinux/mls); this script: $(tr -d '\000' </proc/self/attr/current)"
	if [ "$enforce" != 1 ]; then
		echo "guest: FAIL: SELinux is not enforcing"
		return 1
	fi
	dmesg | grep 'avc:  denied' >"$OUT/avc-boot.log"
	echo "guest: AVC denials during boot: $(wc -l <"$OUT/avc-boot.log") (avc-boot.log)"
	avc_keys "$OUT/avc-boot.log" | sed 's/^/guest:   denied /'

	containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &
	cpid=$!
	i=0
	while [ ! -S /run/containerd/containerd.sock ] && [ $i -lt 120 ]; do sleep 1; i=$((i + 1)); done
	if [ ! -S /run/containerd/containerd.sock ]; then
		echo "guest: FAIL: containerd did not start"
		tail -n 40 /var/log/containerd.log
		return 1
	fi
	clabel=$(tr -d '\000' </proc/$cpid/attr/current)
	echo "guest: containerd pid $cpid up after $(cut -d' ' -f1 /proc/uptime) s, label $clabel"
	case $clabel in
	*:dockerd_t:*) ;;
	*)
		echo "guest: FAIL: containerd is not in dockerd_t"
		rc=1
		;;
	esac
	for img in /images/*.oci.tar; do
		ctr -a /run/containerd/containerd.sock -n k8s.io images import --snapshotter overlayfs "$img" >/dev/null ||
			{ echo "guest: FAIL: import $img"; return 1; }
	done
	echo "guest: images: $(ctr -a /run/containerd/containerd.sock -n k8s.io images ls -q | tr '\n' ' ')"

	for h in runc rsandbox; do
		echo "===== guest: handler $h ====="
		dmesg -c >/dev/null
		s=$(cut -d' ' -f1 /proc/uptime)
		# the selinux-guest gate is expected here: a probe that would skip fails
		RSANDBOX_EXPECT_GATES=selinux-guest CONTAINERD_ADDRESS=/run/containerd/containerd.sock RUST_BACKTRACE=1 timeout 420 \
			/usr/local/bin/selinux-probes --exact "probes_$h" --test-threads=1 --nocapture 2>&1 | tee "$OUT/probes-$h.log"
		trc=$?
		grep -q "^test probes_$h \.\.\. " "$OUT/probes-$h.log" || { echo "guest: FAIL: the probes of $h did not run"; trc=1; }
		grep -q '^summary ' "$OUT/probes-$h.log" || { echo "guest: FAIL: the probes of $h did not finish (exit $trc; 143: killed at 420 s)"; trc=1; }
		if [ $trc != 0 ]; then
			rc=1
			echo "guest: containerd's log, last lines:"
			tail -n 40 /var/log/containerd.log
		fi
		dmesg | grep 'avc:  denied' >"$OUT/avc-$h.log"
		avc_keys "$OUT/avc-$h.log" | grep -v ' initrc_t -> ' >"$OUT/avc-keys-$h.txt"
		echo "guest: $h: probes exit $trc in $(awk -v a="$s" '{ printf "%.1f", $1 - a }' /proc/uptime) s;" \
			"AVC denials: $(grep -c 'permissive=0' "$OUT/avc-$h.log") enforced," \
			"$(grep 'permissive=1' "$OUT/avc-$h.log" | grep -vc 'scontext=[^ ]*:initrc_t:') permissive outside the harness," \
			"$(grep -c 'scontext=[^ ]*:initrc_t:' "$OUT/avc-$h.log") of the harness (initrc_t, permissive, not compared)"
		sed 's/^/guest:   denied /' "$OUT/avc-keys-$h.txt"
		# the fail-closed cases (selinux.rs `refusals`): pods with a type or categories the policy
		# lacks, refused on both handlers; the denials they provoke are shown, not compared
		dmesg -c >/dev/null
		RSANDBOX_EXPECT_GATES=selinux-guest CONTAINERD_ADDRESS=/run/containerd/containerd.sock RUST_BACKTRACE=1 timeout 300 \
			/usr/local/bin/selinux-probes --exact "refusals_$h" --test-threads=1 --nocapture 2>&1 | tee "$OUT/refusals-$h.log"
		trc=$?
		grep -q '^summary refusals ' "$OUT/refusals-$h.log" || { echo "guest: FAIL: the refusals of $h did not finish (exit $trc)"; trc=1; }
		[ $trc = 0 ] || rc=1
		dmesg | grep 'avc:  denied' >"$OUT/avc-refusals-$h.log"
		avc_keys "$OUT/avc-refusals-$h.log" | sed 's/^/guest:   refusals provoked: denied /'
	done

	echo "===== guest: summary ====="
	for h in runc rsandbox; do
		echo "guest: $h: $(grep '^summary ' "$OUT/probes-$h.log" || echo 'no summary (the test did not finish)')"
		echo "guest: $h: $(grep '^summary refusals ' "$OUT/refusals-$h.log" || echo 'no summary of the refusals')"
		echo "guest: $h: $(grep -vc '(permissive)' "$OUT/avc-keys-$h.txt") distinct enforced denials, $(grep -c '(permissive)' "$OUT/avc-keys-$h.txt") distinct permissive ones"
		# only the harness (initrc_t) is permissive (harness.cil): a permissive denial of any
		# other domain means the engine or the containers ran unenforced
		if grep -q '(permissive)' "$OUT/avc-keys-$h.txt"; then
			echo "guest: FAIL: $h: a domain other than the harness's ran permissive"
			rc=1
		fi
	done
	only=$(grep -vxF -f "$OUT/avc-keys-runc.txt" "$OUT/avc-keys-rsandbox.txt")
	if [ -n "$only" ]; then
		echo "guest: FAIL: denials of rsandbox that the runc path does not have:"
		echo "$only" | sed 's/^/guest:   /'
		rc=1
	else
		echo "guest: no denial is rsandbox's alone"
	fi
	kill "$cpid" 2>/dev/null
	echo "guest: total $(awk -v a="$t0" '{ printf "%.1f", $1 - a }' /proc/uptime) s in the script; exit $rc"
	return $rc
}

# the results share again, with one label for all of it: 9p cannot store the security.selinux
# a new file gets, and refuses its creation (a context= mount needs the policy loaded)
umount /mnt && mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,context=system_u:object_r:tmp_t:s0 out /mnt ||
	echo "guest: cannot mount the results share with a context"
set -o pipefail
main 2>&1 | tee "$OUT/guest.log"
finish $?
