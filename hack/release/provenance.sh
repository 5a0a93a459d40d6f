#!/usr/bin/env bash
# hack/release/provenance.sh DIR SRC TARGETS LIBCS COMMIT CLEAN RUSTFLAGS -- COMMAND... - prints the
# build provenance of the release artefacts in DIR (hack/release.sh calls it once per build):
# an in-toto Statement v1 (https://in-toto.io/Statement/v1) whose predicate is SLSA provenance
# v1 (https://slsa.dev/provenance/v1).
#
#   subject              each file DIR/SHA256SUMS names, with its sha256 (the same pairs)
#   buildType            urn:rsandbox:build-type:release-sh:v1: hack/release.sh at the source
#                        commit, which exports that commit's tree (`git archive`) and builds it
#   externalParameters   the exact command (argv, the script's path as hack/release.sh), the
#                        commit, the targets (TARGETS: comma-separated Rust triples)
#   internalParameters   what the script sets itself: the cargo commands, RUSTFLAGS (the work
#                        directories written as <src>, <target>, <cargo home>: they are remapped
#                        out of the binary), SOURCE_DATE_EPOCH, RSANDBOX_REVISION
#   resolvedDependencies the source (gitCommit, gitTree of the commit; whether the checkout's
#                        tracked files matched it: the release is the commit's tree either way),
#                        Cargo.lock, rustc (`rustc -vV`, the binary's sha256, the channel the
#                        source's rust-toolchain.toml pins), cargo, each target's Rust standard
#                        library (the dirHash of rustlib/TARGET/lib: linked into the binary), each
#                        target's static glibc (LIBCS: the Debian packages, comma-separated, in
#                        TARGETS' order: their versions, their libc.a's sha256), dpkg-deb and jq
#                        (they write the .deb and the SBOM)
#   runDetails           builder.id: RSANDBOX_RELEASE_BUILDER (a URI naming who or what ran the
#                        build, e.g. a CI job), else urn:rsandbox:builder:local (a person's
#                        machine: nothing vouches for it but the release key); builder.version:
#                        the OS; metadata.invocationId: RSANDBOX_RELEASE_INVOCATION when set
#                        (e.g. the CI run's address), else none
#
# The fields, as the specs name them: the Statement's _type, subject (ResourceDescriptors, each
# with a digest), predicateType, predicate (in-toto attestation spec/v1: statement.md,
# resource_descriptor.md, digest_set.md for sha256, gitCommit, gitTree and dirHash); the
# predicate's buildDefinition {buildType, externalParameters, internalParameters,
# resolvedDependencies} and runDetails {builder {id, version: a map of strings}, metadata
# {invocationId}} (slsa.dev/spec/v1.0/provenance). Annotation keys are lowerCamelCase without
# `.`, `$` or spaces (spec/v1/README.md, "Extension fields"). No metadata when there is nothing
# to put in it ("unset, null and empty MUST be interpreted equivalently").
#
# Deterministic for one commit on one machine: no clock (no startedOn/finishedOn: the
# commit's time is in internalParameters as SOURCE_DATE_EPOCH), no host name, no path of
# the work directories, keys sorted; hack/release.sh compares it byte for byte between its
# two builds like every artefact. It is a plain statement, not a DSSE envelope:
# hack/release/sign.sh signs the file with a detached signature (docs/install.md).
set -euo pipefail
{ (($# >= 9)) && [[ "$8" == -- ]]; } || {
	echo "usage: $0 DIR SRC TARGETS LIBCS COMMIT CLEAN RUSTFLAGS -- COMMAND..." >&2
	exit 2
}
dir=$1 src=$2 targets=$3 libcs=$4 commit=$5 clean=$6 rustflags=$7
shift 8
# one argument a line (jq 1.6 reads options among --args' words); none may hold a newline
for word in "$@"; do
	[[ "$word" != *$'\n'* ]] || {
		echo "$0: an argument of the command holds a newline" >&2
		exit 1
	}
done
command_json=$(printf '%s\n' "$@" | jq -R -s 'rtrimstr("\n") | split("\n")')

subjects=$(jq -R -n '[inputs | capture("^(?<sha>[0-9a-f]{64})  (?<name>.+)$")
	| {name, digest: {sha256: .sha}}] | sort_by(.name)' <"$dir/SHA256SUMS")
[[ "$(jq length <<<"$subjects")" -gt 0 ]] || {
	echo "$0: no subjects in $dir/SHA256SUMS" >&2
	exit 1
}
# run in the repository (hack/release.sh's working directory): SRC is an export, no .git
tree=$(git rev-parse "$commit^{tree}")
sysroot=$(cd "$src" && rustc --print sysroot)
rustc_vv=$(cd "$src" && rustc -vV)
cargo_v=$(cd "$src" && cargo -V)
sha() { sha256sum "$1" | cut -d' ' -f1; }
# dirhash DIR: digest_set.md's dirHash (Go's dirhash Hash1 in hex) of the files under DIR
dirhash() {
	(cd "$1" && find . -type f | cut -c3- | LC_ALL=C sort | xargs -r sha256sum | sha256sum | cut -d' ' -f1)
}
# the channel rust-toolchain.toml pins (rustup builds with it; rustc -vV must agree)
channel=$(sed -n 's/^channel = "\(.*\)"$/\1/p' "$src/rust-toolchain.toml")
[[ -n "$channel" ]] || {
	echo "$0: no channel in $src/rust-toolchain.toml" >&2
	exit 1
}
[[ "$rustc_vv" == *$'\nrelease: '"$channel"$'\n'* ]] || {
	echo "$0: rustc is not the pinned $channel: $rustc_vv" >&2
	exit 1
}
# each target's standard library: what rustup installed under the sysroot for it
std_deps=$(
	IFS=, read -r -a triples <<<"$targets"
	for t in "${triples[@]}"; do
		jq -n --arg t "$t" --arg h "$(dirhash "$sysroot/lib/rustlib/$t/lib")" \
			'{name: "rust-std-\($t)", digest: {dirHash: $h}, annotations: {path: "lib/rustlib/\($t)/lib"}}'
	done | jq -s .
)
deb_version() { dpkg-query -W -f='${Version}' "$1"; }
deb_arch() { dpkg-query -W -f='${Architecture}' "$1"; }
# each glibc package: its purl and its libc.a's sha256 (no grep -m1: dpkg would die of
# SIGPIPE under pipefail)
libc_deps=$(
	IFS=, read -r -a pkgs <<<"$libcs"
	for pkg in "${pkgs[@]}"; do
		libc_a=$(dpkg -L "$pkg" | grep '/libc\.a$')
		jq -n --arg pkg "$pkg" --arg v "$(deb_version "$pkg")" \
			--arg a "$(deb_arch "$pkg")" --arg sha "$(sha "$libc_a")" \
			'{name: $pkg, uri: "pkg:deb/debian/\($pkg)@\($v)?arch=\($a)", digest: {sha256: $sha},
			  annotations: {linked: "libc.a, statically"}}'
	done | jq -s 'unique_by(.name)'
)
os=$(. /etc/os-release && echo "${PRETTY_NAME:-$ID}")
epoch=${SOURCE_DATE_EPOCH:?}

jq -n --sort-keys \
	--argjson subjects "$subjects" --argjson command "$command_json" \
	--arg commit "$commit" --arg tree "$tree" --argjson clean "$clean" --arg targets "$targets" \
	--arg rustflags "$rustflags" --arg epoch "$epoch" \
	--arg lock_sha "$(sha "$src/Cargo.lock")" \
	--arg rustc_vv "$rustc_vv" --arg rustc_sha "$(sha "$sysroot/bin/rustc")" \
	--arg cargo_v "$cargo_v" --arg cargo_sha "$(sha "$sysroot/bin/cargo")" \
	--argjson libc_deps "$libc_deps" \
	--argjson std_deps "$std_deps" --arg channel "$channel" \
	--arg dpkg "$(deb_version dpkg)" --arg dpkg_a "$(deb_arch dpkg)" \
	--arg jq_v "$(deb_version jq)" --arg jq_a "$(deb_arch jq)" --arg os "$os" \
	--arg builder "${RSANDBOX_RELEASE_BUILDER:-urn:rsandbox:builder:local}" \
	--arg invocation "${RSANDBOX_RELEASE_INVOCATION:-}" '
{
  _type: "https://in-toto.io/Statement/v1",
  subject: $subjects,
  predicateType: "https://slsa.dev/provenance/v1",
  predicate: {
    buildDefinition: {
      buildType: "urn:rsandbox:build-type:release-sh:v1",
      externalParameters: {command: $command, source: {gitCommit: $commit}, targets: ($targets | split(","))},
      internalParameters: {
        cargo: [$targets | split(",")[]
          | ["cargo", "build", "--locked", "--release", "--target", ., "--bin", "containerd-shim-rsandbox-v1"]],
        env: {RUSTFLAGS: $rustflags, SOURCE_DATE_EPOCH: $epoch, RSANDBOX_REVISION: $commit}
      },
      resolvedDependencies: [
        {name: "source", digest: {gitCommit: $commit, gitTree: $tree},
         annotations: {exportedWith: "git archive", checkoutMatchedCommit: $clean}},
        {name: "Cargo.lock", digest: {sha256: $lock_sha}},
        {name: "rustc", digest: {sha256: $rustc_sha},
         annotations: {rustcVersionVerbose: $rustc_vv, toolchainFile: "rust-toolchain.toml", pinnedChannel: $channel}},
        {name: "cargo", digest: {sha256: $cargo_sha}, annotations: {cargoVersion: $cargo_v}},
        $std_deps[],
        $libc_deps[],
        {name: "dpkg-deb", uri: "pkg:deb/debian/dpkg@\($dpkg)?arch=\($dpkg_a)"},
        {name: "jq", uri: "pkg:deb/debian/jq@\($jq_v)?arch=\($jq_a)"}
      ]
    },
    runDetails: ({builder: {id: $builder, version: {os: $os}}}
      + (if $invocation == "" then {} else {metadata: {invocationId: $invocation}} end))
  }
}'
