# shellcheck shell=bash
# hack/lib/rust.sh - cargo tools that hack/test.sh runs, installed from crates.io
# at pinned versions into ~/.cargo/bin.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

CARGO_MACHETE_VERSION=0.9.2

rust_tools() { # installs what is missing or at another version
	local have
	have=$(cargo machete --version 2>/dev/null) || true
	if [[ "$have" == "$CARGO_MACHETE_VERSION" ]]; then
		log "cargo-machete $have present"
		return 0
	fi
	log "installing cargo-machete $CARGO_MACHETE_VERSION from crates.io (a few minutes)"
	cargo install --locked --version "$CARGO_MACHETE_VERSION" cargo-machete
}
