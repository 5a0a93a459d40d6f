#!/usr/bin/env bash
# hack/previous-release.sh - the previous release's shim, for the N-1 upgrade test: builds it
# once from this repository's history and prints the binary's path on stdout.
#
#   The release is the commit in hack/previous-release. Its tree is taken with `git archive`
#   (no worktree left registered in .git) and built with its own Cargo.lock and toolchain
#   file into ${CARGO_TARGET_DIR:-target}/previous-release/<commit>/, which keeps only the
#   binary once built: a second run prints the cached path at once.
#   RSANDBOX_PREVIOUS_PROFILE: debug (default: a third of a release build's time, and the
#   upgrade test does not measure speed) or release.
#
# Fails loudly, never silently: a clone without that commit (a shallow clone: CI's checkout
# with depth 1) cannot build it; the message says how to fetch it.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

file=$RSANDBOX_REPO/hack/previous-release
commit=$(grep -v '^[[:space:]]*\(#\|$\)' "$file" | head -n 1 | tr -d '[:space:]')
[[ "$commit" =~ ^[0-9a-f]{7,40}$ ]] || die "$file names no commit (got '$commit')"
profile=${RSANDBOX_PREVIOUS_PROFILE:-debug}
case "$profile" in
debug) flags=() ;;
release) flags=(--release) ;;
*) die "RSANDBOX_PREVIOUS_PROFILE=$profile: want debug or release" ;;
esac

if ! full=$(git -C "$RSANDBOX_REPO" rev-parse --verify --quiet "$commit^{commit}"); then
	shallow=""
	if [[ "$(git -C "$RSANDBOX_REPO" rev-parse --is-shallow-repository 2>/dev/null)" == true ]]; then
		shallow=" This is a shallow clone."
	fi
	die "the previous release $commit (hack/previous-release) is not in this clone.$shallow \
The N-1 upgrade test needs it: fetch it (\`git fetch --unshallow\`, or \`git fetch origin $commit\`), \
or point RSANDBOX_PREVIOUS_SHIM at a previous release's containerd-shim-rsandbox-v1."
fi

cache=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/target}/previous-release/$full-$profile
bin=$cache/$SHIM_NAME
if [[ -x "$bin" ]]; then
	printf '%s\n' "$bin"
	exit 0
fi
log "building the previous release ${full:0:12} ($profile) into $cache"
rm -rf "$cache"
mkdir -p "$cache/src"
git -C "$RSANDBOX_REPO" archive "$full" | tar -x -C "$cache/src"
start=$(date +%s)
(
	cd "$cache/src"
	# a release newer than 0.1.0 records its revision (build.rs); the archive has no .git
	RSANDBOX_REVISION=$full CARGO_TARGET_DIR="$cache/target" \
		cargo build --locked "${flags[@]}" --bin "$SHIM_NAME" >&2
)
cp "$cache/target/$profile/$SHIM_NAME" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
rm -rf "$cache/src" "$cache/target"
log "built $bin in $(($(date +%s) - start)) s"
printf '%s\n' "$bin"
