#!/usr/bin/env bash
# hack/build.sh - build the shim (release) and install it into the bench
# prefix, where containerd finds it next to its own binary.
# Honours CARGO_TARGET_DIR (default: target/ in the repository).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$RSANDBOX_REPO"
target_dir=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}
section "cargo build --release (the shim)"
# a fresh build compiles ~60 crates, then links with LTO: a few minutes on 2 cores
with_heartbeat "cargo build --release --bin $SHIM_NAME" cargo build --release --bin "$SHIM_NAME"
"$RSANDBOX_REPO/hack/containerd.sh" install-shim "$target_dir/release/$SHIM_NAME"
