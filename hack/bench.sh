#!/usr/bin/env bash
# hack/bench.sh - rsandbox against containerd's podsandbox + runc path, side by
# side, on the bench's containerd (hack/setup.sh, then hack/build.sh).
#
# Usage: hack/bench.sh [--quick] [--compare OLD.json] [rsandbox-bench options...]
#        hack/bench.sh --report RUN.json [--compare OLD.json]
#   --quick             smoke run, under a minute (hack/test.sh runs it, compared with
#                       bench/baseline.json)
#   --compare OLD.json  after the tables: per metric, OLD's rsandbox/runc ratio, this run's
#                       and the change (informational, never fails the run); OLD is any
#                       JSON this script wrote, e.g. bench/baseline.json (the last release's
#                       full run)
#   --report RUN.json   runs nothing (no root, no containerd): the tables of a stored run,
#                       and with --compare the comparison
#   --help              every option (samples, pods, in flight, density, --only, ...)
#
# Both CRI runtime handlers run the same workload, interleaved (runc, rsandbox,
# rsandbox, runc, ...): every CRI call of a pod's life (then containerd's garbage
# collection of the pod, run and timed), pod + container from scratch and back,
# N pods with K in flight, density (110 pods with a sleeping container: Ready?,
# wall time, PSS of the per-pod shim and pause processes, containerd's RSS), and
# the shim binaries' start/delete actions (and a ttrpc round trip). Prints
# markdown tables (p50/p95/min/max, p50 ratio rsandbox/runc) and writes
#   target/bench/rsandbox-bench[-quick].json   (override: --json PATH)
#   target/bench/rsandbox-bench[-quick].png    bar chart of the ratios (gnuplot:
#                                              Debian's gnuplot-nox, installed
#                                              here when missing)
# Everything it creates is removed at the end, on failure and on Ctrl-C; it
# exits non-zero when a workload fails or something is left behind.
# The full run takes several minutes on 2 cores. Needs root and a running
# bench containerd with the shim installed. Environment: see hack/lib.sh;
# CARGO_TARGET_DIR is honoured.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case " $* " in
*" -h "* | *" --help "*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
	;;
esac
cd "$RSANDBOX_REPO"
case " $* " in *" --report "*)
	# a stored run: nothing is measured, the debug build is enough
	target_dir=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/integration/target}
	cargo build -q --manifest-path integration/Cargo.toml --bin rsandbox-bench
	exec "$target_dir/debug/rsandbox-bench" "$@"
	;;
esac
need_root
containerd_pid >/dev/null || die "the bench's containerd is not running: hack/setup.sh (or hack/containerd.sh start)"
[[ -x "$BIN/$SHIM_NAME" ]] || die "$BIN/$SHIM_NAME is not installed: hack/build.sh"
# the chart: what the benchmark needs is installed when it runs, so a new machine shows it
# (hack/test.sh installs it before it starts: a no-op here then)
gnuplot_install

target_dir=${CARGO_TARGET_DIR:-$RSANDBOX_REPO/integration/target}
name=rsandbox-bench
# The full run uses a release build of the benchmark; the quick smoke run reuses the debug
# build the integration tests already made (what it times is containerd and the shims, not
# itself), which saves CI a release build of tonic and friends.
profile=release
case " $* " in *" --quick "*)
	name=rsandbox-bench-quick
	profile=debug
	;;
esac
if [[ $profile == release ]]; then
	section "cargo build --release --bin rsandbox-bench"
	cargo build --release --manifest-path integration/Cargo.toml --bin rsandbox-bench
else
	section "cargo build --bin rsandbox-bench"
	cargo build --manifest-path integration/Cargo.toml --bin rsandbox-bench
fi
out_dir=$RSANDBOX_REPO/target/bench
mkdir -p "$out_dir"
args=(--json "$out_dir/$name.json")
# a later --json on the command line wins
args+=("$@")

eval "$(print_env)"
export RSANDBOX_PREFIX
commit=$(git -C "$RSANDBOX_REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git -C "$RSANDBOX_REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
	commit="$commit+dirty"
fi
# the tree this script runs from; the installed shim is named by its sha256 in the output
export RSANDBOX_BENCH_COMMIT=${RSANDBOX_BENCH_COMMIT:-$commit}

section "rsandbox-bench ${*:-(full run)}"
exec "$target_dir/$profile/rsandbox-bench" "${args[@]}"
