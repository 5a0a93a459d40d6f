# shellcheck shell=bash
# hack/lib/testbin.sh - the test executables that run elsewhere than under cargo: in the QEMU
# guests (hack/guest.sh) and in the systemd node (hack/node.sh), built here with
# `cargo test --no-run`, run there by path.
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

lib_test_binary() { # builds the shim crate's unit-test binary; prints its path
	local exe
	exe=$(cd "$RSANDBOX_REPO" && cargo test --lib --no-run --message-format=json 2>/dev/null |
		sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
	[[ -x "$exe" ]] || die "could not build the shim's unit tests (cargo test --lib --no-run)"
	echo "$exe"
}

test_binary() { # NAME: builds integration test binary NAME; prints its path
	local exe
	exe=$(cd "$RSANDBOX_REPO" && cargo test --manifest-path integration/Cargo.toml --test "$1" --no-run --message-format=json 2>/dev/null |
		grep "\"name\":\"$1\"" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
	[[ -x "$exe" ]] || die "could not build the $1 test binary (cargo test --test $1 --no-run)"
	echo "$exe"
}
