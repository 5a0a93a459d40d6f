#!/bin/bash
# hack/guest/systemd-boot.sh - PID 1 of the systemd guest until it becomes systemd (see
# hack/guest.sh --systemd). The initramfs switched into this machine's / (read-only 9p under a
# tmpfs overlay); what is written here lands in the overlay's upper layer, i.e. in this guest
# only: the bench's state on tmpfs, the guest kernel's modules, the units of the node
# (containerd as containerd.service ships it, the test unit, the default target), the masks
# that keep the boot short, and then `exec systemd` as PID 1.
set -uo pipefail
OUT=/mnt
fail() {
	echo "guest: $*"
	echo 99 >"$OUT/rc"
	sync
	echo b >/proc/sysrq-trigger # -no-reboot: QEMU exits
	sleep 10
}
# shellcheck disable=SC1091
. "$OUT/env" || fail "no $OUT/env"
# shellcheck source=hack/guest/common.sh
. "$GUEST_REPO/hack/guest/common.sh" || fail "no $GUEST_REPO/hack/guest/common.sh"
ln -sf /proc/self/fd /dev/fd

# systemd and dbus from a guest-only layer (hack/guest.sh extracts them when the host lacks them)
if [[ -n "${GUEST_SYSTEMD_LAYER:-}" ]]; then
	cp -a "$GUEST_SYSTEMD_LAYER/." / || fail "cannot copy $GUEST_SYSTEMD_LAYER"
	# what dbus's postinst would have made: the bus daemon's user
	getent group messagebus >/dev/null || echo 'messagebus:x:990:' >>/etc/group
	getent passwd messagebus >/dev/null || echo 'messagebus:x:990:990::/nonexistent:/usr/sbin/nologin' >>/etc/passwd
fi
[[ -x /lib/systemd/systemd ]] || fail "no /lib/systemd/systemd"
# This machine's image has a /.dockerenv: systemd would believe it runs in a container and
# ignore the kernel command line (systemd.unified_cgroup_hierarchy ...).
rm -f /.dockerenv /run/.containerenv

guest_state_tmpfs
guest_modules
echo rsandbox-guest >/etc/hostname

U=/etc/systemd/system
mkdir -p "$U" /etc/systemd/system-generators
# Not needed on this node, and slow to start under TCG: logging, device management, logins,
# timers, networking, and the one-shot set-up services of a persistent machine. Output goes
# to the console and to files on the results share instead of the journal.
for u in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket \
	systemd-journald-audit.socket systemd-journal-flush.service systemd-journal-catalog-update.service \
	systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
	systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service \
	getty.target getty@.service serial-getty@.service console-getty.service \
	systemd-logind.service systemd-user-sessions.service systemd-ask-password-console.path \
	systemd-ask-password-wall.path timers.target systemd-timesyncd.service systemd-pstore.service \
	networking.service systemd-networkd.service systemd-resolved.service ssh.service cron.service \
	systemd-remount-fs.service systemd-firstboot.service systemd-random-seed.service \
	systemd-update-utmp.service systemd-update-utmp-runlevel.service systemd-sysusers.service \
	systemd-repart.service systemd-pcrphase.service systemd-pcrphase-sysinit.service \
	systemd-machine-id-commit.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
	systemd-modules-load.service kmod-static-nodes.service modprobe@.service systemd-sysctl.service \
	systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service ldconfig.service \
	systemd-update-done.service sys-kernel-debug.mount sys-kernel-tracing.mount \
	sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
	systemd-initctl.socket e2scrub_reap.service; do
	ln -sfn /dev/null "$U/$u"
done
# generators: fstab, getty, sysv, ... (this node has nothing for them to do)
for g in /lib/systemd/system-generators/* /usr/lib/systemd/system-generators/*; do
	[[ -e "$g" ]] && ln -sfn /dev/null "/etc/systemd/system-generators/${g##*/}"
done

# containerd as its containerd.service ships (Delegate=yes, KillMode=process, notify), running
# the bench's containerd with the guest's config (runc handler at SystemdCgroup = true);
# Restart=no: a crash must fail the tests, not be papered over. The system bus first: runc's
# systemd driver (go-systemd) talks to systemd through it.
cat >"$U/containerd.service" <<UNIT
[Unit]
Description=containerd container runtime (rsandbox bench)
Wants=dbus.socket
After=dbus.socket local-fs.target

[Service]
Type=notify
Environment=PATH=$RSANDBOX_PREFIX/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=$RSANDBOX_PREFIX/usr/bin/containerd --config $GUEST_CONTAINERD_CONFIG
StandardOutput=append:$RSANDBOX_PREFIX/log/containerd.log
StandardError=inherit
Delegate=yes
KillMode=process
Restart=no
TimeoutStartSec=300
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
UNIT

# the test unit: the tests with each runc, the result on the share, then power off
cat >"$U/rsandbox-guest.service" <<UNIT
[Unit]
Description=rsandbox systemd-node integration tests
Wants=dbus.socket
After=dbus.socket local-fs.target

[Service]
Type=simple
ExecStart=/bin/bash $GUEST_REPO/hack/guest/systemd-run.sh
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/console
UNIT
cat >"$U/rsandbox-guest.target" <<UNIT
[Unit]
Description=rsandbox systemd guest
Requires=rsandbox-guest.service
After=rsandbox-guest.service
AllowIsolate=yes
UNIT
ln -sfn rsandbox-guest.target "$U/default.target"

exec env -i TERM=linux PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /lib/systemd/systemd
