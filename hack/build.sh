#!/usr/bin/env bash
# hack/build.sh - build the shim (release, a static-pie) and install it into the bench
# prefix, where containerd finds it next to its own binary.
# Honours CARGO_TARGET_DIR (default: target/ in the repository); the binary is
# <target dir>/<host triple>/release/containerd-shim-rsandbox-v1.
#
# Static (glibc linked in, `-C target-feature=+crt-static`, still position independent):
# containerd execs the shim three times per pod (`start`, the daemon, `delete`, the last one
# inside RemovePodSandbox), and gives its children LD_LIBRARY_PATH=<opt>/lib, where a
# dynamic binary's loader probes some twenty paths for libgcc_s and libc first. A `delete`
# with nothing to do: 46 system calls and 177k instructions static, 97 and 397k dynamic; a
# pod's daemon keeps ~70 KiB less private memory (no loader, libc and libgcc_s data of its
# own). crt-static needs an explicit --target, so that build scripts and proc macros stay
# dynamic.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$RSANDBOX_REPO"
section "cargo build --release --target $(host_triple) (static-pie)"
# a fresh build compiles ~60 crates, then links with LTO: a few minutes on 2 cores
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
	with_heartbeat "cargo build --release --target $(host_triple) --bin $SHIM_NAME" \
	cargo build --release --target "$(host_triple)" --bin "$SHIM_NAME"
"$RSANDBOX_REPO/hack/containerd.sh" install-shim "$(built_shim)"
