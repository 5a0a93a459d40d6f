# shellcheck shell=bash
# hack/lib/rust.sh - cargo tools that hack/test.sh runs (only the tests: the
# demo never needs them), installed from crates.io at pinned versions into
# ~/.cargo/bin by hack/test.sh before its first step.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

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
