#!/usr/bin/env bash
# hack/release/pause-syscalls.sh PAUSE_RS CPU HEADER - the system call numbers and the
# AUDIT_ARCH of one architecture's table in the pause program (pause/pause.rs's
# `#[cfg(target_arch = "CPU")] mod arch`) against the kernel's own headers, as Debian's
# linux-libc-dev installs them: HEADER is the table of `#define __NR_<name> <number>` lines
# (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h, the generic table aarch64 uses),
# and AUDIT_ARCH_<CPU> comes from linux/audit.h through the C preprocessor. Prints one
# line when all agree; else one line for each constant that differs or that the header lacks, and
# exit 1.
#
# Why: the pause program makes raw system calls and its seccomp filter allows them by number,
# one table per architecture (docs/install.md, arm64). A wrong aarch64 number builds and links
# and would only show on an arm64 kernel (qemu-user refuses seccomp); hack/release.sh checks
# the table of each architecture it builds before building it.
set -euo pipefail
(($# == 3)) || {
	echo "usage: $0 PAUSE_RS CPU HEADER" >&2
	exit 2
}
pause_rs=$1 cpu=$2 header=$3
[[ -f "$header" ]] || {
	echo "$0: no $header (Debian: linux-libc-dev, or linux-libc-dev-<arch>-cross)" >&2
	exit 1
}

# the constants of CPU's `mod arch { ... }`: NAME VALUE a line
consts=$(awk -v cfg="#[cfg(target_arch = \"$cpu\")]" '
	$0 == cfg { armed = 1; next }
	armed && /^mod arch \{/ { on = 1; armed = 0; next }
	{ armed = 0 }
	on && /^\}/ { exit }
	on && /pub const [A-Z_0-9]+: u32 = / {
		sub(/.*pub const /, ""); sub(/;.*/, ""); sub(/: u32 =/, ""); print
	}
' "$pause_rs")
[[ -n "$consts" ]] || {
	echo "$0: no mod arch for $cpu in $pause_rs" >&2
	exit 1
}

bad=0 n=0
while read -r name value; do
	value=${value//_/}
	if [[ "$name" == AUDIT_ARCH ]]; then
		macro=AUDIT_ARCH_${cpu^^}
		# audit.h defines it as (EM_...|__AUDIT_ARCH_64BIT|__AUDIT_ARCH_LE): let cpp expand it
		want=$(printf '#include <linux/audit.h>\n%s\n' "$macro" | cc -E -P - | tail -n 1)
		[[ "$want" != "$macro" ]] || {
			echo "$0: linux/audit.h has no $macro" >&2
			exit 1
		}
		want=$((want))
	else
		nr=${name#SYS_}
		nr=__NR_${nr,,}
		want=$(awk -v m="$nr" '$1 == "#define" && $2 == m && $3 ~ /^[0-9]+$/ { print $3; exit }' "$header")
		[[ -n "$want" ]] || {
			echo "$cpu $name: $header has no $nr" >&2
			bad=$((bad + 1))
			continue
		}
	fi
	n=$((n + 1))
	if (($((value)) != want)); then
		printf '%s %s = %s, the kernel'"'"'s headers say %#x (%d)\n' "$cpu" "$name" "$value" "$want" "$want" >&2
		bad=$((bad + 1))
	fi
done <<<"$consts"
((bad == 0)) || {
	echo "$0: $bad of pause.rs's $cpu constants differ from the kernel's headers (above)" >&2
	exit 1
}
echo "$cpu: $n constants of pause.rs as the kernel's headers ($header, linux/audit.h)"
