# shellcheck shell=bash
# hack/guest/common.sh - what both guests of hack/guest.sh set up before containerd can run:
# tmpfs for the bench's state, the guest kernel's modules and the ones the CNI bridge, the
# iptables guard and runc need. Sourced by hack/guest/run.sh (cgroup v2 guest) and
# hack/guest/systemd-boot.sh (systemd guest), after they read the results share's env file.

# guest_state_tmpfs: containerd's root and state, CNI leases, the log on tmpfs (containerd's
# overlayfs snapshotter cannot put its upper dirs on the overlay that / is here)
guest_state_tmpfs() {
	local d
	for d in var/lib/containerd run var/lib/cni log; do
		mkdir -p "$RSANDBOX_PREFIX/$d"
		mount -t tmpfs tmpfs "$RSANDBOX_PREFIX/$d"
	done
}

# guest_modules: the guest kernel's modules at /lib/modules, busybox's modprobe (the host
# has no kmod) as /sbin/modprobe, and the network modules loaded
guest_modules() {
	local bb m
	mkdir -p /lib/modules
	mount --bind "${GUEST_KMOD%/*}" /lib/modules
	bb=$(ls "$RSANDBOX_PREFIX"/busybox/{usr/,}bin/busybox 2>/dev/null | head -n1)
	ln -sf "$bb" /sbin/modprobe
	for m in bridge br_netfilter veth nf_tables nft_compat nft_chain_nat xt_comment xt_conntrack xt_MASQUERADE \
		xt_mark xt_addrtype nf_nat nf_conntrack iptable_filter iptable_nat ip6table_filter; do
		"$bb" modprobe "$m" 2>/dev/null || echo "guest: modprobe $m failed"
	done
}
