#!/usr/bin/env bash
# hack/release/test-verify.sh - a node's verification of a release, run as docs/install.md
# writes it, on dist/ (after hack/release.sh; it builds nothing, needs no root and no bench):
#
#   1. dist/ is copied to a scratch directory; its binary's `-v` must name HEAD (the release
#      is HEAD's, so HEAD is the commit a node would expect);
#   2. a throwaway Ed25519 key signs the copy (hack/release/sign.sh, as hack/release.sh does)
#      and an allowed_signers file names it;
#   3. the commands between the `release-verify` markers of docs/install.md run one by one in
#      the copy, the first line (the reader's settings) replaced by this test's: each must
#      succeed;
#   4. then each tampering below, on a fresh signed copy, must fail, and at the command that
#      catches it: a byte of the binary changed (`sha256sum --check`), a digest in SHA256SUMS
#      changed (SHA256SUMS's signature), the provenance's commit changed (its signature), the
#      files signed by another key (SHA256SUMS's signature), a provenance of other files signed
#      by the right key (its subjects), another commit expected (its source revision);
#   5. a copy signed without a key (sign.sh with none, as CI's release) says UNSIGNED, has no
#      signature, and fails the first command;
#   6. the same for the OpenPGP commands (the `release-verify-gpg` block; a throwaway key in a
#      scratch GNUPGHOME): the untouched copy passes, a changed SHA256SUMS and a changed
#      provenance fail; and for the python3 lines (`release-verify-python`): the untouched
#      copy passes, a signed provenance of other files and another expected commit fail;
#   7. dist/'s provenance has the shape the specs give (provenance_shape below), and a copy
#      with a field broken the way a producer could break it fails that check.
# Exit 1 on any surprise, naming the case and the command.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$RSANDBOX_REPO"

for tool in ssh-keygen jq sha256sum gpg gpgv; do
	command -v "$tool" >/dev/null || die "$tool is missing"
done
provs=(dist/rsandbox-*.intoto.json)
prov=${provs[0]}
[[ -f "$prov" && -f dist/SHA256SUMS ]] || die "no dist/SHA256SUMS or dist/rsandbox-*.intoto.json: run hack/release.sh first"
((${#provs[@]} == 1)) || die "more than one provenance in dist/: ${provs[*]}"
version=${prov#dist/rsandbox-}
version=${version%.intoto.json}
commit=$(git rev-parse HEAD)
# the binary this machine runs (dist/ may hold other architectures' too)
case "$(uname -m)" in
aarch64) bin=dist/$SHIM_NAME-$version-linux-arm64 ;;
*) bin=dist/$SHIM_NAME-$version-linux-amd64 ;;
esac
[[ "$("$bin" -v)" == *"Revision: $commit"$'\n'* ]] ||
	die "$bin is not HEAD's ($commit) build: run hack/release.sh"

scratch=$(mktemp -d /tmp/rsandbox-verify.XXXXXX)
# the gpg-agent that gpg starts for the scratch GNUPGHOME goes with it
trap 'gpgconf --kill gpg-agent 2>/dev/null || true; rm -rf "$scratch"' EXIT
identity=release@rsandbox.test
ssh-keygen -q -t ed25519 -N '' -C "$identity" -f "$scratch/key"
ssh-keygen -q -t ed25519 -N '' -C other -f "$scratch/other-key"
echo "$identity namespaces=\"file\" $(cat "$scratch/key.pub")" >"$scratch/allowed_signers"
export GNUPGHOME=$scratch/gnupg
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --pinentry-mode loopback --passphrase '' --quick-gen-key "$identity" ed25519 sign never 2>/dev/null
gpg --batch --export "$identity" >"$scratch/rsandbox-release.gpg"

# block MARKER: the lines of docs/install.md between <!-- MARKER --> and the fence's end,
# without the fence and comment lines; one command a line (a continued line would be run
# in pieces).
block() {
	local lines
	lines=$(awk -v m="<!-- $1 -->" '
		$0 == m { on = 1; next }
		on && /^```/ { if (started) exit; started = 1; next }
		on && started && !/^#/ && NF { print }
	' docs/install.md)
	[[ -n "$lines" ]] || die "no block after <!-- $1 --> in docs/install.md"
	! grep -q '\\$' <<<"$lines" || die "docs/install.md's $1 block continues a line: one command a line"
	printf '%s\n' "$lines"
}
mapfile -t ssh_block < <(block release-verify)
mapfile -t gpg_block < <(block release-verify-gpg)
mapfile -t py_block < <(block release-verify-python)
settings='^version=[^ ]+ commit=[^ ]+ identity=[^ ]+$'
[[ "${ssh_block[0]}" =~ $settings ]] ||
	die "docs/install.md's release-verify block must start with 'version=... commit=... identity=...': ${ssh_block[0]}"
[[ "${gpg_block[0]}" =~ ^version=[^\ ]+$ ]] ||
	die "docs/install.md's release-verify-gpg block must start with 'version=...': ${gpg_block[0]}"
[[ "${py_block[0]}" =~ ^version=[^\ ]+\ commit=[^\ ]+$ ]] ||
	die "docs/install.md's release-verify-python block must start with 'version=... commit=...': ${py_block[0]}"

# fresh NAME: a signed copy of dist/ with the key files beside it; prints its path.
fresh() {
	local d=$scratch/cases/$1
	rm -rf "$d"
	mkdir -p "$d"
	cp dist/* "$d/"
	cp "$scratch/allowed_signers" "$scratch/rsandbox-release.gpg" "$d/"
	RSANDBOX_RELEASE_SSH_KEY=$scratch/key RSANDBOX_RELEASE_GPG_KEY=$identity \
		hack/release/sign.sh "$d" 2>/dev/null || die "hack/release/sign.sh $d failed"
	echo "$d"
}

# run DIR SETTINGS COMMANDS...: each command in DIR after SETTINGS (a plain shell, as a
# reader's: no pipefail); prints the first that fails, or nothing.
run() {
	local d=$1 settings=$2 line
	shift 2
	for line in "$@"; do
		if ! (cd "$d" && bash -c "$settings; $line") >"$scratch/out" 2>&1; then
			echo "$line"
			return
		fi
	done
}

failures=0
# expect CASE DIR SETTINGS PATTERN BLOCK...: the first command of BLOCK that fails must be
# the one containing PATTERN (empty: none may fail).
expect() {
	local name=$1 d=$2 settings=$3 pattern=$4 failed
	shift 4
	failed=$(run "$d" "$settings" "$@")
	if [[ -z "$pattern" && -z "$failed" ]]; then
		log "ok: $name: every command passes"
	elif [[ -n "$pattern" && "$failed" == *"$pattern"* ]]; then
		log "ok: $name: fails at: $failed"
	else
		log "FAILED: $name: wanted ${pattern:+a failure at the command with }${pattern:-no failure}, got ${failed:-no failure}"
		[[ -z "$failed" ]] || sed 's/^/    /' "$scratch/out" >&2
		failures=$((failures + 1))
	fi
}

p=rsandbox-$version.intoto.json
ok_settings="version=$version commit=$commit identity=$identity"
ssh_cmds=("${ssh_block[@]:1}")
gpg_cmds=("${gpg_block[@]:1}")
py_cmds=("${py_block[@]:1}")
section "a release's verification (docs/install.md), $version at $commit"

d=$(fresh untouched)
expect "the release as made" "$d" "$ok_settings" "" "${ssh_cmds[@]}"

d=$(fresh artefact)
# one byte in the middle of the binary, as a corrupted or replaced download
bin_copy=$d/${bin#dist/}
printf '\x00' | dd of="$bin_copy" bs=1 seek=$(($(stat -c %s "$bin_copy") / 2)) conv=notrunc status=none
cmp -s "$bin_copy" "$bin" && printf '\x01' | dd of="$bin_copy" bs=1 seek=$(($(stat -c %s "$bin_copy") / 2)) conv=notrunc status=none
expect "a changed binary" "$d" "$ok_settings" "sha256sum --check SHA256SUMS" "${ssh_cmds[@]}"

d=$(fresh sums)
# SHA256SUMS made to match a replaced binary: its first digest rewritten
sed -i '1s/^./'"$(head -c 1 "$d/SHA256SUMS" | tr '0-9a-f' '1-9a-f0')"'/' "$d/SHA256SUMS"
expect "a changed SHA256SUMS" "$d" "$ok_settings" "SHA256SUMS.sig" "${ssh_cmds[@]}"

d=$(fresh provenance)
jq --sort-keys '.predicate.buildDefinition.resolvedDependencies[0].digest.gitCommit = "0000000000000000000000000000000000000000"' \
	"$d/$p" >"$d/$p.new" && mv "$d/$p.new" "$d/$p"
expect "a changed provenance" "$d" "$ok_settings" "intoto.json.sig" "${ssh_cmds[@]}"

d=$(fresh other-key)
rm "$d/SHA256SUMS.sig" "$d/$p.sig"
ssh-keygen -q -Y sign -n file -f "$scratch/other-key" "$d/SHA256SUMS"
ssh-keygen -q -Y sign -n file -f "$scratch/other-key" "$d/$p"
expect "signed by another key" "$d" "$ok_settings" "SHA256SUMS.sig" "${ssh_cmds[@]}"

d=$(fresh other-files)
# a provenance the release key did sign, but of other files (another build of this version)
jq --sort-keys '.subject[0].digest.sha256 = ("0" * 64)' "$d/$p" >"$d/$p.new" && mv "$d/$p.new" "$d/$p"
rm "$d/$p.sig"
ssh-keygen -q -Y sign -n file -f "$scratch/key" "$d/$p"
expect "a signed provenance of other files" "$d" "$ok_settings" ".subject[]" "${ssh_cmds[@]}"
expect "python3: a signed provenance of other files" "$d" "$ok_settings" '["subject"]' "${py_cmds[@]}"

d=$(fresh untouched)
other_commit=$(git rev-parse HEAD~1)
expect "another commit expected" "$d" "version=$version commit=$other_commit identity=$identity" \
	"predicateType" "${ssh_cmds[@]}"
expect "python3: another commit expected" "$d" "version=$version commit=$other_commit" \
	"gitCommit" "${py_cmds[@]}"
expect "python3: the release as made" "$d" "version=$version commit=$commit" "" "${py_cmds[@]}"

d=$(fresh untouched)
expect "OpenPGP: the release as made" "$d" "version=$version" "" "${gpg_cmds[@]}"
sed -i '1s/^./'"$(head -c 1 "$d/SHA256SUMS" | tr '0-9a-f' '1-9a-f0')"'/' "$d/SHA256SUMS"
expect "OpenPGP: a changed SHA256SUMS" "$d" "version=$version" "SHA256SUMS.asc" "${gpg_cmds[@]}"
d=$(fresh provenance)
jq --sort-keys '.predicateType = "x"' "$d/$p" >"$d/$p.new" && mv "$d/$p.new" "$d/$p"
expect "OpenPGP: a changed provenance" "$d" "version=$version" "intoto.json.asc" "${gpg_cmds[@]}"

d=$(fresh unsigned)
unsigned_log=$(hack/release/sign.sh "$d" 2>&1) || die "hack/release/sign.sh without a key failed: $unsigned_log"
if [[ "$unsigned_log" != *UNSIGNED* ]] || compgen -G "$d/*.sig" >/dev/null || compgen -G "$d/*.asc" >/dev/null; then
	log "FAILED: an unsigned release: sign.sh without a key must say UNSIGNED and leave no signature"
	failures=$((failures + 1))
fi
expect "an unsigned release" "$d" "$ok_settings" "SHA256SUMS.sig" "${ssh_cmds[@]}"

# provenance_shape FILE: prints each rule of the specs that FILE breaks, one a line (nothing:
# none). The rules (in-toto attestation spec/v1: statement.md, resource_descriptor.md,
# digest_set.md, README.md's parsing rules; slsa.dev/spec/v1.0/provenance): _type; subject,
# each with a sha256, names unique; predicateType; buildDefinition.buildType (a URI),
# externalParameters (an object, no name shared with internalParameters), resolvedDependencies
# (each a uri, a digest or a content); runDetails.builder.id (a URI), builder.version
# (strings), metadata (an object if set); digests lowercase hex; annotation keys lowerCamelCase
# (no `.`, `$` or space).
provenance_shape() {
	jq -r '
		def uri: type == "string" and test("^[a-z][a-z0-9+.-]*:[^ ]+$");
		def digests: type == "object" and length > 0 and all(.[]; type == "string" and test("^[0-9a-f]+$"));
		def descriptor: type == "object" and (has("uri") or has("digest") or has("content"))
			and (if has("uri") then .uri | uri else true end)
			and (if has("digest") then .digest | digests else true end);
		def annotation_keys: (.annotations // {}) | type == "object" and all(keys[]; test("^[a-z][A-Za-z0-9]*$"));
		.predicate.buildDefinition as $b | .predicate.runDetails as $r
		| {
			"_type is https://in-toto.io/Statement/v1": (._type == "https://in-toto.io/Statement/v1"),
			"subject is a non-empty array of descriptors, each with a sha256":
				(.subject | type == "array" and length > 0
				and all(.[]; descriptor and (.digest.sha256 // "" | test("^[0-9a-f]{64}$")))),
			"subject names are unique": ([.subject[]?.name] | length == (unique | length)),
			"predicateType is https://slsa.dev/provenance/v1": (.predicateType == "https://slsa.dev/provenance/v1"),
			"buildDefinition.buildType is a URI": ($b.buildType | uri),
			"buildDefinition.externalParameters is an object": ($b.externalParameters | type == "object"),
			"buildDefinition.internalParameters is an object if set": (($b.internalParameters // {}) | type == "object"),
			"no parameter name is both external and internal":
				([$b.externalParameters // {}, $b.internalParameters // {} | keys?] | .[0] - .[1] == .[0]),
			"resolvedDependencies are descriptors": (($b.resolvedDependencies // []) | type == "array" and all(.[]; descriptor)),
			"annotation names are lowerCamelCase": ([.subject[]?, $b.resolvedDependencies[]?] | all(annotation_keys)),
			"runDetails.builder.id is a URI": ($r.builder.id | uri),
			"runDetails.builder.version maps names to strings":
				(($r.builder.version // {}) | type == "object" and all(.[]; type == "string")),
			"runDetails.metadata is an object if set": (($r.metadata // {}) | type == "object")
		}
		| to_entries[] | select(.value | not) | .key
	' "$1"
}
broken_rules=$(provenance_shape "$prov")
if [[ -z "$broken_rules" ]]; then
	log "ok: $prov has the in-toto Statement v1 / SLSA provenance v1 shape"
	# each a way a producer could get a field wrong, and the rule that must catch it
	broken=(
		'del(.subject[0].digest)|subject is'
		'.subject[1].name = .subject[0].name|subject names'
		'.predicate.buildDefinition.buildType = "release-sh"|buildType'
		'del(.predicate.buildDefinition.externalParameters)|externalParameters is'
		'.predicate.runDetails.builder.version.os = 1|builder.version'
		'.predicate.buildDefinition.resolvedDependencies[0].annotations["git archive"] = true|annotation names'
		'.predicate.buildDefinition.resolvedDependencies += [{name: "nothing"}]|resolvedDependencies are'
	)
	for case in "${broken[@]}"; do
		edit=${case%|*} rule=${case##*|}
		jq "$edit" "$prov" >"$scratch/shape.json"
		got=$(provenance_shape "$scratch/shape.json")
		if [[ "$got" == *"$rule"* ]]; then
			log "ok: the provenance's shape check catches $edit: $got"
		else
			log "FAILED: the provenance's shape check, on $edit: wanted the rule '$rule', got '${got:-none}'"
			failures=$((failures + 1))
		fi
	done
else
	log "FAILED: $prov breaks the specs' rules: ${broken_rules//$'\n'/; }"
	failures=$((failures + 1))
fi

((failures == 0)) || die "$failures verification case(s) went wrong (above)"
log "the documented verification passes on the release and catches each tampering"
