#!/usr/bin/env bash
# hack/fuzz.sh - run the libFuzzer targets (fuzz/fuzz_targets/*) on the shim's decoders of
# client input: CRI pod config, OCI spec edits, runtime options, CNI results/configs, the
# shim config file, ttrpc frames.
#
# Usage: hack/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default: 600 s, every target)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`; installed here if
# missing). Each run starts from the committed seeds (fuzz/corpus/<target>) and grows a
# scratch corpus under fuzz/target/corpus (never committed: the repo keeps only the seeds).
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the script; add the input
# to fuzz/corpus/<target>/ once fixed, so tests/fuzz_corpus.rs replays it in CI forever.
# Not part of CI's time budget (CI replays the seeds on stable: cargo test --test fuzz_corpus).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-600}
shift || true
mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^rsandbox-fuzz$')
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

if ! command -v cargo-fuzz >/dev/null 2>&1 && [[ ! -x "${HOME:-/root}/.cargo/bin/cargo-fuzz" ]]; then
	echo "== installing cargo-fuzz" >&2
	cargo install --locked cargo-fuzz
fi
PATH="${HOME:-/root}/.cargo/bin:$PATH"

cargo +nightly fuzz build --fuzz-dir fuzz "${targets[@]}" >&2 || {
	# older cargo-fuzz builds one target per call
	for t in "${targets[@]}"; do cargo +nightly fuzz build --fuzz-dir fuzz "$t"; done
}

failed=()
for t in "${targets[@]}"; do
	work=fuzz/target/corpus/$t
	mkdir -p "$work" "fuzz/artifacts/$t"
	echo "== $t: ${secs}s" >&2
	if cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$work" "fuzz/corpus/$t" -- \
		-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 2>"fuzz/target/$t.log"; then
		grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "fuzz/target/$t.log" >&2 || true
		echo "== $t: no crash ($(ls "$work" | wc -l) inputs in the scratch corpus)" >&2
	else
		tail -n 30 "fuzz/target/$t.log" >&2
		failed+=("$t")
	fi
done
if ((${#failed[@]})); then
	echo "== crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
	exit 1
fi
echo "== every target ran ${secs}s without a crash" >&2
