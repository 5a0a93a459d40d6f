#!/bin/sh
# hack/guest/selinux/preinit.sh - PID 1 of the SELinux guest right after switch_root (busybox
# sh, installed as /usr/lib/rsandbox/preinit in the guest's ext4 root; see hack/guest.sh
# --selinux). Still the kernel's context: no policy is loaded yet. Loads the policy the way
# an init does (the binary policy written to selinuxfs' load), then execs /usr/sbin/init
# (busybox init, labelled init_exec_t: the policy moves kernel_t to init_t), which runs
# /etc/init.d/rsandbox-selinux (initrc_exec_t: initrc_t; hack/guest/selinux/rc.sh).
set -e
mkdir -p /sys/fs/selinux
mount -t selinuxfs selinuxfs /sys/fs/selinux
# every AVC line reaches the kernel log (no auditd here; kauditd's printk is rate limited)
echo 0 >/proc/sys/kernel/printk_ratelimit
# one write(2) of the whole policy (selinuxfs refuses a load at an offset: cat's chunks fail)
dd if=/etc/selinux/default/policy/policy.33 of=/sys/fs/selinux/load bs=64M 2>/dev/null
echo "preinit: policy loaded, enforce=$(cat /sys/fs/selinux/enforce), PID 1: $(tr -d '\000' </proc/self/attr/current)"
exec /usr/sbin/init
