#!/usr/bin/env bash
# hack/check-cycles-test.sh - hack/check-cycles.sh fails on a planted layer violation: a copy of
# src/ passes, the same copy with `use crate::pod::sandbox;` planted in a module of host/ (a
# lower layer importing a higher one) fails with exit 1, naming the file and line; a top-level
# module in no layer fails too. Run by hack/test.sh's "module dependencies" stage. No root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r src "$tmp/src"

fail() {
	echo "check-cycles-test: $*" >&2
	exit 1
}

hack/check-cycles.sh "$tmp/src" >"$tmp/out" || fail "the unchanged copy of src/ fails: $(cat "$tmp/out")"

# host/netns.rs: a plain module of a low layer; the import is its last line.
victim=$tmp/src/host/netns.rs
[[ -f $victim ]] || fail "no $victim to plant the import in"
echo 'use crate::pod::sandbox;' >>"$victim"
line=$(wc -l <"$victim")
rc=0
hack/check-cycles.sh "$tmp/src" >"$tmp/out" || rc=$?
((rc == 1)) || fail "a planted import of pod/ in host/ gave exit $rc, not 1: $(cat "$tmp/out")"
grep -qF "layer rule: $victim:$line imports pod" "$tmp/out" ||
	fail "the violation is not named with its file and line: $(cat "$tmp/out")"
sed -i '$d' "$victim"

echo '//! A module in no layer.' >"$tmp/src/stray.rs"
rc=0
hack/check-cycles.sh "$tmp/src" >"$tmp/out" || rc=$?
((rc == 1)) || fail "a top-level module in no layer gave exit $rc, not 1: $(cat "$tmp/out")"
grep -qF "top-level module stray is in no layer" "$tmp/out" ||
	fail "the module in no layer is not named: $(cat "$tmp/out")"

echo "check-cycles-test: a planted higher-layer import and a module in no layer both fail"
