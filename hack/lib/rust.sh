# shellcheck shell=bash
# hack/lib/rust.sh - the Rust toolchain every build needs (checked first, before any
# set-up is spent), and the cargo tools that hack/test.sh runs (only the tests: the
# demo never needs them), installed from crates.io at pinned versions into
# ~/.cargo/bin by hack/test.sh before its first step.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

# need_rust_toolchain [COMPONENT...]: cargo and rustc of the toolchain rust-toolchain.toml
# pins must run (rustup's ~/.cargo/bin is added to PATH for a non-login shell), with the
# components named (rustfmt, clippy for the tests); else stop at once naming what to install.
# The demo and the tests call it before their set-up: without it they spent minutes on
# packages and then stopped at the first build.
need_rust_toolchain() {
	local pinned comp missing=()
	pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$RSANDBOX_REPO/rust-toolchain.toml")
	if ! command -v cargo >/dev/null 2>&1 && [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
		PATH="${HOME:-/root}/.cargo/bin:$PATH"
		export PATH
	fi
	if ! command -v cargo >/dev/null 2>&1 || ! rustc -vV 2>/dev/null | grep '^host: ' >/dev/null; then
		missing+=("the Rust toolchain $pinned (cargo, rustc)")
	fi
	for comp in "$@"; do
		case "$comp" in
		rustfmt) cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt) ;;
		clippy) cargo clippy --version >/dev/null 2>&1 || missing+=(clippy) ;;
		esac
	done
	((${#missing[@]} == 0)) && return 0
	local components=rustfmt,clippy
	log "error: missing: ${missing[*]}"
	log "  this repository builds with Rust $pinned (rust-toolchain.toml); install it with rustup:"
	log "    curl --proto '=https' -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain $pinned --component $components"
	log "    (or, with rustup present: rustup toolchain install $pinned --component $components)"
	log "  then open a new shell, or: export PATH=\$HOME/.cargo/bin:\$PATH"
	exit 1
}

CARGO_MACHETE_VERSION=0.9.2

rust_tools() { # installs what is missing or at another version
	local have
	have=$(cargo machete --version 2>/dev/null) || true
	if [[ "$have" == "$CARGO_MACHETE_VERSION" ]]; then
		log "cargo-machete $have present"
		return 0
	fi
	log "installing cargo-machete $CARGO_MACHETE_VERSION from crates.io (a test tool; it compiles for several minutes on 2 cores)"
	with_heartbeat "cargo install cargo-machete" cargo install --locked --version "$CARGO_MACHETE_VERSION" cargo-machete
}
