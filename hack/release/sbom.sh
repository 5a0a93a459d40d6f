#!/usr/bin/env bash
# hack/release/sbom.sh SRC BINARY VERSION COMMIT EPOCH [TARGET LIBC_PKG] - prints the CycloneDX
# 1.5 JSON SBOM of the shim built from SRC into BINARY for TARGET (x86_64-unknown-linux-gnu),
# glibc linked in from the Debian package LIBC_PKG (libc6-dev; a cross build's is e.g.
# libc6-dev-arm64-cross). hack/release.sh calls it.
#
# Components: the crates linked into the binary (the normal-dependency closure of the rsandbox
# package for TARGET, from `cargo metadata --locked` and Cargo.lock's
# checksums; proc-macros included: their code expands into the binary), scope "required"; the
# build-dependency closure (protobuf-codegen, which generates the CRI types), scope
# "excluded" (used to build, not in the product); the Rust standard library and GNU libc
# (statically linked). Dev-dependencies are left out. The document is a function of its
# inputs: no clock (the timestamp is the commit's SOURCE_DATE_EPOCH), no random serial number
# (a UUID made from the version, the commit and the binary's hash).
#
# Why not cargo-cyclonedx or cargo-sbom: each is ~150 crates to compile on every CI run (a
# clean machine; minutes on 2 cores), and both stamp the run's clock and a random serial into
# the document, so two builds would never give the same bytes. jq is a Debian package.
set -euo pipefail
src=$1 binary=$2 version=$3 commit=$4 epoch=$5
target=${6:-x86_64-unknown-linux-gnu} libc_pkg=${7:-libc6-dev}

meta=$(cd "$src" && cargo metadata --locked --format-version 1 --filter-platform "$target")
# Cargo.lock: "name@version" -> sha256 of the .crate
sums=$(awk '
	/^\[\[package\]\]/ { name = ""; ver = "" }
	/^name = / { gsub(/"/, "", $3); name = $3 }
	/^version = / { gsub(/"/, "", $3); ver = $3 }
	/^checksum = / { gsub(/"/, "", $3); printf "%s@%s %s\n", name, ver, $3 }
' "$src/Cargo.lock" | jq -R -n '[inputs | split(" ") | {key: .[0], value: .[1]}] | from_entries')
bin_sha=$(sha256sum "$binary" | cut -d' ' -f1)
rustc=$(rustc --version)
rust_version=$(awk '{print $2}' <<<"$rustc")
glibc=$(dpkg-query -W -f='${Version}' "$libc_pkg")
libc_arch=$(dpkg-query -W -f='${Architecture}' "$libc_pkg")
ts=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
h=$(printf 'rsandbox %s %s %s' "$version" "$commit" "$bin_sha" | sha256sum | cut -c1-32)
uuid="${h:0:8}-${h:8:4}-5${h:13:3}-a${h:17:3}-${h:20:12}"

jq --sort-keys --argjson sums "$sums" \
	--arg version "$version" --arg commit "$commit" --arg ts "$ts" --arg uuid "$uuid" \
	--arg bin_sha "$bin_sha" --arg rust_version "$rust_version" --arg rustc "$rustc" \
	--arg glibc "$glibc" --arg libc_pkg "$libc_pkg" --arg libc_arch "$libc_arch" --arg target "$target" '
. as $meta
| ($meta.resolve.nodes | map({key: .id, value: .deps}) | from_entries) as $deps
| ($meta.packages | map({key: .id, value: .}) | from_entries) as $pkgs
| $meta.resolve.root as $root
| def edges($id; $kinds): [($deps[$id] // [])[] | select(any(.dep_kinds[]; .kind as $k | any($kinds[]; . == $k))) | .pkg];
  def reach($starts; $kinds):
    {seen: {}, todo: $starts}
    | until((.todo | length) == 0;
        .todo[0] as $x | .todo |= .[1:]
        | if .seen[$x] then . else .seen[$x] = true | .todo += edges($x; $kinds) end)
    | .seen | keys;
  def ref($id): $pkgs[$id] | if .id == $root then "rsandbox@\(.version)" else "pkg:cargo/\(.name)@\(.version | @uri)" end;
  def license($p): if $p.license then [{expression: ($p.license | gsub("/"; " OR "))}]
    elif $p.license_file then [{license: {name: "see \($p.license_file)"}}] else [] end;
  (reach([$root]; [null]) - [$root]) as $normal
  | ([($normal + [$root])[] | edges(.; ["build"])[]] | unique) as $build_starts
  | (reach($build_starts; [null, "build"]) - $normal - [$root]) as $build
  | def component($id; $scope): $pkgs[$id] as $p | {
      type: "library", "bom-ref": ref($id), name: $p.name, version: $p.version,
      purl: "pkg:cargo/\($p.name)@\($p.version | @uri)", scope: $scope, licenses: license($p),
      hashes: (if $sums["\($p.name)@\($p.version)"] then [{alg: "SHA-256", content: $sums["\($p.name)@\($p.version)"]}] else [] end),
      externalReferences: [{type: "distribution", url: "https://crates.io/api/v1/crates/\($p.name)/\($p.version)/download"}]
    };
  {
    bomFormat: "CycloneDX", specVersion: "1.5", version: 1, serialNumber: "urn:uuid:\($uuid)",
    metadata: {
      timestamp: $ts,
      tools: {components: [{type: "application", name: "hack/release/sbom.sh", version: $version}]},
      component: {
        type: "application", "bom-ref": "rsandbox@\($version)", name: "containerd-shim-rsandbox-v1",
        version: $version, licenses: [{expression: "Apache-2.0"}],
        hashes: [{alg: "SHA-256", content: $bin_sha}],
        properties: [{name: "rsandbox:git-revision", value: $commit}, {name: "rsandbox:rustc", value: $rustc},
          {name: "rsandbox:target", value: "\($target), +crt-static"}]
      }
    },
    components: (
      ([$normal[] | component(.; "required")] + [$build[] | component(.; "excluded")]
       + [{type: "library", "bom-ref": "rust-std@\($rust_version)", name: "rust-std", version: $rust_version,
           scope: "required", licenses: [{expression: "MIT OR Apache-2.0"}]},
          {type: "library", "bom-ref": "glibc@\($glibc)", name: "glibc", version: $glibc, scope: "required",
           purl: "pkg:deb/debian/\($libc_pkg)@\($glibc)?arch=\($libc_arch)", licenses: [{expression: "LGPL-2.1-or-later"}],
           description: "GNU C library, statically linked (Debian \($libc_pkg))"}])
      | sort_by(.name, .version)),
    dependencies: (
      [($normal + [$root])[] | {ref: ref(.), dependsOn: ([edges(.; [null])[] | ref(.)] | unique)}]
      + [$build[] | {ref: ref(.), dependsOn: ([edges(.; [null, "build"])[] | ref(.)] | unique)}]
      | sort_by(.ref))
  }' <<<"$meta"
