#!/usr/bin/env bash
# hack/layout-paths.sh - the path rewrite of the layout change (issue 36): every module that moved
# from src/ into a layer folder (records/, shim/, host/, server/; stdio into task/, cleanup into
# cli/), in the library's Rust paths (`crate::placement::` -> `crate::host::placement::`, doc links
# included; `rsandbox::placement::` in src/main.rs, tests/ and fuzz/ likewise) and in file paths
# anywhere (`src/placement.rs` -> `src/host/placement.rs`, `src/rpc/` -> `src/server/rpc/`).
#
# Usage: hack/layout-paths.sh [FILE...]
# With no FILE: every file of the tree that names an old path (CHANGELOG.md, history, left out).
# Idempotent: a rewritten path no longer matches, so it can be re-run on files another branch
# added or edited before the merge. `crate::` paths are rewritten only in src/ (the library):
# integration/ is a crate of its own with modules of the same names.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

records='error|bundle|state_file|config|flags|version|validate|cri|oci'
shim='sync|blocking|util|timing|logger|panic_hook|reaper|waiters|socket|events|wire'
host='cgroups|cgroup_ownership|placement|netns|mount|idmap|selinux|mcs|client_paths|runtime|network|reclaim|systemd'
old="$records|$shim|$host|stdio|rpc|daemon|cleanup"

rust_paths="
s/\\bcrate::($records)\\b/crate::records::\\1/g
s/\\bcrate::($shim)\\b/crate::shim::\\1/g
s/\\bcrate::($host)\\b/crate::host::\\1/g
s/\\bcrate::stdio\\b/crate::task::stdio/g
s/\\bcrate::(rpc|daemon)\\b/crate::server::\\1/g
s/\\bcrate::cleanup\\b/crate::cli::cleanup/g
s/include_bytes!\\(\"testdata\\//include_bytes!(\"..\\/testdata\\//g
s/\"($records)::tests::/\"records::\\1::tests::/g
s/\"($shim)::tests::/\"shim::\\1::tests::/g
s/\"($host)::tests::/\"host::\\1::tests::/g
s/\"stdio::tests::/\"task::stdio::tests::/g
s/\"(rpc|daemon)::tests::/\"server::\\1::tests::/g
s/\"cleanup::tests::/\"cli::cleanup::tests::/g
"
# (the include_bytes line: a file moved from src/ one folder down reads src/testdata one folder
# up; the "::tests::" lines: a test's name as a string, for a test that runs itself again in a
# child process with `--exact NAME`)

# The library's paths from outside it: src/main.rs, tests/, fuzz/.
lib_paths="
s/\\brsandbox::($records)\\b/rsandbox::records::\\1/g
s/\\brsandbox::($shim)\\b/rsandbox::shim::\\1/g
s/\\brsandbox::($host)\\b/rsandbox::host::\\1/g
s/\\brsandbox::stdio\\b/rsandbox::task::stdio/g
s/\\brsandbox::(rpc|daemon)\\b/rsandbox::server::\\1/g
s/\\brsandbox::cleanup\\b/rsandbox::cli::cleanup/g
"

file_paths="
s/\\bsrc\\/($records)\\.rs\\b/src\\/records\\/\\1.rs/g
s/\\bsrc\\/(${shim%|wire})\\.rs\\b/src\\/shim\\/\\1.rs/g
s/\\bsrc\\/wire\\b/src\\/shim\\/wire/g
s/\\bsrc\\/(${host%|systemd})\\.rs\\b/src\\/host\\/\\1.rs/g
s/\\bsrc\\/systemd\\b/src\\/host\\/systemd/g
s/\\bsrc\\/stdio\\.rs\\b/src\\/task\\/stdio.rs/g
s/\\bsrc\\/rpc\\b/src\\/server\\/rpc/g
s/\\bsrc\\/daemon\\.rs\\b/src\\/server\\/daemon.rs/g
s/\\bsrc\\/cleanup\\.rs\\b/src\\/cli\\/cleanup.rs/g
"

if (($# == 0)); then
	mapfile -t files < <(git grep -lE "(crate|rsandbox)::($old)\\b|src/($old)\\b|include_bytes!\\(\"testdata/|\"($old)::tests::" -- \
		':!CHANGELOG.md' ':!hack/layout-paths.sh')
else
	files=("$@")
fi
for f in "${files[@]}"; do
	case $f in
	src/*.rs) sed -E -i -e "$rust_paths" -e "$lib_paths" -e "$file_paths" "$f" ;;
	tests/*.rs | fuzz/*.rs) sed -E -i -e "$lib_paths" -e "$file_paths" "$f" ;;
	*) sed -E -i -e "$file_paths" "$f" ;;
	esac
done
