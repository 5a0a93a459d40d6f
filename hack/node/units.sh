# shellcheck shell=bash
# hack/node/units.sh - the node's own files, written into its root's tmpfs upper by
# hack/node/init.sh (never into the host's files): hostname, machine-id, the units (containerd
# as containerd ships containerd.service, the images, the node's default target), the masks
# that keep the boot to what a node needs and keep the node's systemd off the host's global
# state, journald's and the manager's settings, containerd's config, the runc and the shim the
# node runs. Sourced by hack/node/init.sh (the variables of STATE/env in scope).

# Masked: logins and consoles, device management, timers, networking and time, the one-shot
# set-up of a persistent machine, and whatever writes global kernel state from a container
# (sysctls, kernel modules, binfmt_misc, the random seed, the clock). journald stays (the
# journal is in /run; the kernel's log is not read: ReadKMsg=no), dbus stays (runc's systemd
# driver and the shim talk to systemd over the system bus).
NODE_MASKED_UNITS=(
	systemd-journald-audit.socket systemd-journal-flush.service systemd-journal-catalog-update.service
	systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket
	systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service
	getty.target getty@.service serial-getty@.service console-getty.service container-getty@.service
	systemd-logind.service systemd-user-sessions.service systemd-ask-password-console.path
	systemd-ask-password-wall.path timers.target systemd-timesyncd.service systemd-pstore.service
	networking.service systemd-networkd.service systemd-networkd-wait-online.service
	systemd-resolved.service ssh.service cron.service postgresql.service
	systemd-remount-fs.service systemd-firstboot.service systemd-random-seed.service
	systemd-update-utmp.service systemd-update-utmp-runlevel.service systemd-sysusers.service
	systemd-repart.service systemd-pcrphase.service systemd-pcrphase-sysinit.service
	systemd-machine-id-commit.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount
	proc-sys-fs-binfmt_misc.mount systemd-modules-load.service kmod-static-nodes.service
	modprobe@.service systemd-sysctl.service systemd-tmpfiles-setup.service
	systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.service ldconfig.service
	systemd-update-done.service sys-kernel-debug.mount sys-kernel-tracing.mount
	sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount
	systemd-initctl.socket e2scrub_reap.service cryptsetup.target integritysetup.target
	veritysetup.target remote-fs.target systemd-hostnamed.service systemd-timedated.service
)

# node_files ROOT: writes the node's files under ROOT
node_files() {
	local r=$1 u g
	u=$r/etc/systemd/system

	# systemd and dbus from a node-only layer when the host lacks them (hack/node.sh extracts
	# their packages; nothing is installed on the host)
	if [[ -n "${NODE_SYSTEMD_LAYER:-}" ]]; then
		cp -a "$NODE_SYSTEMD_LAYER/." "$r/"
		grep -q '^messagebus:' "$r/etc/group" || echo 'messagebus:x:990:' >>"$r/etc/group"
		grep -q '^messagebus:' "$r/etc/passwd" ||
			echo 'messagebus:x:990:990::/nonexistent:/usr/sbin/nologin' >>"$r/etc/passwd"
	fi
	[[ -x "$r/lib/systemd/systemd" ]] || fail "no /lib/systemd/systemd in the node"

	echo "$NODE_HOSTNAME" >"$r/etc/hostname"
	# its own machine ID, as kind gives each node
	read -r g </proc/sys/kernel/random/uuid
	echo "${g//-/}" >"$r/etc/machine-id"

	# what the node runs: the runc of RSANDBOX_RUNC, the shim copied at boot (a shim the host
	# bench installs later does not change the node's)
	ln -sfn "$NODE_RUNC_BIN" "$r$NODE_BIN/runc"
	install -m 0755 "$NODE_SHIM_SRC" "$r$NODE_BIN/$NODE_SHIM_NAME"
	mkdir -p "$r/etc/rsandbox-node" "$u" "$r/etc/systemd/system-generators" "$r/etc/systemd/journald.conf.d" \
		"$r/etc/systemd/system.conf.d"
	cp "$STATE/containerd.toml" "$r/etc/rsandbox-node/containerd.toml"
	cp "$STATE/unit.env" "$r/etc/rsandbox-node/env"
	# masked: an empty file masks a unit or a generator as a link to /dev/null does (and takes
	# no process to make)
	for g in "${NODE_MASKED_UNITS[@]}"; do
		: >"$u/$g"
	done
	# every generator (fstab, getty, sysv, ... would read the host's configuration)
	for g in "$r"/lib/systemd/system-generators/* "$r"/usr/lib/systemd/system-generators/*; do
		[[ -e "$g" ]] && : >"$r/etc/systemd/system-generators/${g##*/}"
	done

	write_file "$r/etc/systemd/journald.conf.d/rsandbox-node.conf" <<-EOF
		[Journal]
		Storage=volatile
		ReadKMsg=no
		RuntimeMaxUse=64M
	EOF
	# a shutdown must not wait 90 s for a process that ignores SIGTERM
	write_file "$r/etc/systemd/system.conf.d/rsandbox-node.conf" <<-EOF
		[Manager]
		DefaultTimeoutStopSec=15s
		LogColor=no
	EOF

	# containerd as its containerd.service ships (Type=notify, Delegate=yes, KillMode=process),
	# running the bench's binary with the node's config (runc handler at SystemdCgroup = true);
	# Restart=no: a crash must fail the tests, not be papered over. The log where the bench
	# keeps it (the tests read it), the pid file after every start (the bench's scripts and
	# the tests find containerd by it).
	write_file "$u/containerd.service" <<-EOF
		[Unit]
		Description=containerd container runtime (rsandbox node $NODE_NAME)
		Documentation=https://containerd.io
		Wants=dbus.socket
		After=network.target dbus.socket local-fs.target

		[Service]
		Type=notify
		Environment=PATH=$NODE_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		ExecStart=$NODE_BIN/containerd --config /etc/rsandbox-node/containerd.toml
		ExecStartPost=/bin/sh -c 'echo \$MAINPID >$NODE_PIDFILE'
		StandardOutput=append:$NODE_LOGFILE
		StandardError=inherit
		Delegate=yes
		KillMode=process
		Restart=no
		TimeoutStartSec=120
		LimitNPROC=infinity
		LimitCORE=infinity
		TasksMax=infinity
		OOMScoreAdjust=-999
	EOF
	write_file "$u/rsandbox-node-images.service" <<-EOF
		[Unit]
		Description=the bench's images in the node's containerd
		Requires=containerd.service
		After=containerd.service

		[Service]
		Type=oneshot
		RemainAfterExit=yes
		EnvironmentFile=/etc/rsandbox-node/env
		ExecStart=/bin/bash $NODE_REPO/hack/node/images.sh
	EOF
	write_file "$u/rsandbox-node.target" <<-EOF
		[Unit]
		Description=rsandbox node $NODE_NAME
		Requires=basic.target containerd.service rsandbox-node-images.service
		After=basic.target containerd.service rsandbox-node-images.service
		AllowIsolate=yes
	EOF
	ln -sfn rsandbox-node.target "$u/default.target"
}

write_file() { # FILE: stdin into FILE, without a process (cat) per file
	local text
	IFS= read -r -d '' text || true
	printf '%s' "$text" >"$1"
}
