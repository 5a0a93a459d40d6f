#!/usr/bin/env bash
# hack/test.sh - run all tests (the README's test command; .ci/run calls it).
#
#   0. install everything the steps below use, before any of them runs:
#      hack/setup.sh (the bench, both runcs), cargo-machete (pinned),
#      gnuplot-nox (the bench's chart) and, unless RSANDBOX_GUEST=0, the
#      guests' QEMU, kernel and initramfs (hack/guest.sh --prepare)
#   1. cargo fmt --check
#   2. cargo clippy --all-targets -- -D warnings (with Cargo.toml's [lints])
#   3. hack/check-cycles.sh: module dependencies (cni/ self-contained, the
#      layer rule, no import cycles); hack/check-cycles-test.sh: it fails on a
#      planted layer violation; then hack/selftest.sh: the harness's own helpers
#      (with_heartbeat, the tally)
#   4. cargo machete: no unused dependency
#   5. cargo test -- --include-ignored (unit tests, the root-only ones too)
#   6. hack/build.sh: release shim, installed into the bench prefix
#   7. hack/setup.sh: the bench set up (idempotent, ~1 s when done) and
#      containerd running; every task/container left by an earlier run removed
#   7b. the previous release's shim, built once (hack/previous-release.sh, cached under
#      target/previous-release/): RSANDBOX_PREVIOUS_SHIM for the N-1 upgrade test
#   8. integration tests: cargo test --manifest-path integration/Cargo.toml --no-fail-fast
#      -- --test-threads=1 (skipped while integration/ does not exist), with
#      the bench's env exported (see hack/containerd.sh env, RSANDBOX_PREFIX),
#      once with runc 1.1 (the host's) and once with runc 1.3 (sid's, see
#      hack/lib/runc.sh): both CRI handlers and ctr use the selected runc;
#      then hack/selftest.sh --gates (a misfiring gate fails where expected)
#   8'. beside 8, launched once its test binaries are built: the cgroup v2 guest,
#      hack/guest.sh (QEMU, Debian's kernel booted with cgroup_no_v1=all; the cgroupv2
#      integration tests inside, both runcs; on copies of the bench's shim and config taken
#      at its launch); waited for and printed after 8's tests; RSANDBOX_GUEST=0 skips it
#   8a. the systemd node (cgroup v1): hack/node.sh run-tests (systemd 252 as PID 1 of
#      new namespaces on this host, booted in about a second; containerd as a unit; the
#      systemd integration tests inside, both CRI handlers, both runcs, and the shim's
#      ignored live_systemd unit tests); RSANDBOX_NODE=0 skips it
#   8b. the node installer: hack/installer/test.sh (deploy/kubernetes built with
#      kustomize and validated against Kubernetes' schemas; deploy/node/rsandbox-node.sh's
#      install / re-run / upgrade with a running pod / uninstall, and the DaemonSet's
#      container, on a systemd node, hack/node.sh -n installer; on a scratch containerd
#      where no node can run), after the node's stage, ~1.5-2 min
#   8c. release artefacts: hack/release.sh (two static release builds of HEAD compared byte
#      for byte: dist/ binary, .deb, SBOM, SHA256SUMS, provenance; RSANDBOX_RELEASE_REPRO=0
#      builds once), then hack/release/test-verify.sh (docs/install.md's verification of a
#      release signed with a throwaway key; tampered copies fail it), then
#      hack/release/test-deb.sh (the .deb installs, its binary checks the bench and runs
#      pods; the installed shim is put back)
#   8e. the systemd guest: hack/guest.sh --systemd (the same kernel, systemd as
#      PID 1 on cgroup v2, containerd as a unit; the systemd integration tests
#      inside, both CRI handlers, both runcs); RSANDBOX_GUEST=0 skips it too
#   8f. the SELinux guest: hack/guest.sh --selinux (the same kernel booted enforcing from a
#      labelled ext4 root, refpolicy plus its container module; containerd with CRI's
#      enable_selinux; integration/tests/selinux.rs's probes on both handlers, a denial of
#      rsandbox's that the runc path lacks fails); RSANDBOX_GUEST=0 skips it too
#   9. bench smoke run: hack/bench.sh --quick --compare bench/baseline.json
#      (rsandbox vs the runc path, under a minute; fails on a failed workload or
#      anything it leaves behind, never on a time: the comparison with the stored
#      baseline, the last release's full run, is printed for the log only)
#  10. hack/leftovers.sh with containerd running (tests must clean up), then
#      hack/containerd.sh stop and hack/leftovers.sh again (what stop and the
#      shim leave behind)
# Each step's header carries the wall clock and the time since the start; the long
# steps print a heartbeat (with_heartbeat, hack/lib.sh), and each test run a tally of the
# cases it ran and skipped, failing a run of zero (hack/lib/tally.sh; the stages that
# exist to run a suite also set RSANDBOX_EXPECT_GATES, so a test that would skip there fails:
# docs/testing.md).
# Exits non-zero when any step fails; containerd is stopped on exit.
# Needs root (containerd, runc, mounts). Environment: see hack/lib.sh.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
cd "$RSANDBOX_REPO"

on_exit() {
	local rc=$?
	# the cgroup v2 guest still running beside (a failure cut the run short): its session,
	# hack/guest.sh and QEMU with it; what it printed so far
	if [[ -n "${guest_bg:-}" && ! -s "$guest_rc" ]]; then
		kill -TERM -- -"$guest_bg" 2>/dev/null || true
		cat "$guest_log" 2>/dev/null || true
	fi
	if containerd_pid >/dev/null; then
		stop || rc=1
	fi
	if ((rc)); then
		# the failed cases again, last: a long log's tail is what a reader sees first
		if [[ -s "$RSANDBOX_TALLY_RECAP" ]]; then
			printf '\n=== the failed cases (hack/lib/tally.sh) ===\n' >&2
			# the end of each one's output, then all their names
			grep -v '^FAILED: ' "$RSANDBOX_TALLY_RECAP" >&2 || true
			grep '^FAILED: ' "$RSANDBOX_TALLY_RECAP" >&2 || true
		fi
		printf '\n=== hack/test.sh: FAILED (exit %s) ===\n' "$rc" >&2
	fi
	rm -f "$RSANDBOX_TALLY_RECAP"
	exit "$rc"
}
# First, before anything is trapped or set up: what every build needs.
need_rust_toolchain rustfmt clippy
# each failed case's name and the end of its output, gathered by the tallies (run_tallied) of
# the host's unit and integration runs and printed again at the end (the node and the guests
# print their own; hack/node.sh does not pass this into the node)
RSANDBOX_TALLY_RECAP=$(mktemp "${TMPDIR:-/tmp}/rsandbox-failed-cases.XXXXXX")
export RSANDBOX_TALLY_RECAP
trap on_exit EXIT

section "install what the tests need"
hack/setup.sh
rust_tools
gnuplot_install
hack/installer/test.sh --tools
if [[ "${RSANDBOX_GUEST:-1}" != 0 ]]; then
	hack/guest.sh --prepare
	hack/guest.sh --systemd --prepare
	hack/guest.sh --selinux --prepare
fi

section "a machine without Rust: hack/demo.sh stops at once and names what to install"
# A newcomer's first run: no cargo on PATH nor in ~/.cargo/bin. The demo must stop before any
# set-up (no section of it printed) and name the pinned toolchain and rustup.
if out=$(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/nonexistent hack/demo.sh 2>&1); then
	die "hack/demo.sh without a Rust toolchain exited 0:"$'\n'"$out"
fi
pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if [[ "$out" != *"rustup toolchain install $pinned"* || "$out" == *"=== "* ]]; then
	die "hack/demo.sh without a Rust toolchain did not stop first naming Rust $pinned:"$'\n'"$out"
fi
log "ok: $(grep -m1 'missing:' <<<"$out")"

section "cargo fmt --check"
cargo fmt --check
# the pause program is built by build.rs, outside the crate's module tree
rustfmt --check --edition 2024 pause/pause.rs
if [[ -f integration/Cargo.toml ]]; then
	cargo fmt --check --manifest-path integration/Cargo.toml
fi

section "cargo clippy --all-targets -- -D warnings"
with_heartbeat "cargo clippy" cargo clippy --all-targets -- -D warnings

section "module dependencies (hack/check-cycles.sh, hack/check-cycles-test.sh)"
hack/check-cycles.sh
hack/check-cycles-test.sh

section "the harness's own tests (hack/selftest.sh: with_heartbeat, the tally)"
hack/selftest.sh

section "unused dependencies (cargo machete)"
cargo machete --skip-target-dir

section "cargo test -- --include-ignored (unit tests, root-only ones too)"
# as root, the root-only tests must run: gate `root` holds (a test that would skip fails); the
# live_systemd ones skip here, out loud (the systemd node and guest run them)
RSANDBOX_EXPECT_GATES=root with_heartbeat "cargo test (unit tests)" \
	run_tallied "unit tests" cargo test -- --include-ignored

section "build + install the release shim"
hack/build.sh

section "bench: set up and start containerd"
hack/setup.sh
reset_objects

failed=()
section "the previous release (N-1) for the upgrade test: hack/previous-release.sh"
# Built once from this repository's history (cached under target/); a clone without that
# commit (a shallow one) cannot: that fails here, and integration/tests/upgrade.rs fails too.
if RSANDBOX_PREVIOUS_SHIM=$(with_heartbeat "hack/previous-release.sh" hack/previous-release.sh); then
	export RSANDBOX_PREVIOUS_SHIM
	log "previous release: $RSANDBOX_PREVIOUS_SHIM"
else
	failed+=("the previous release's build (hack/previous-release.sh, message above)")
fi
# The cgroup v2 guest runs beside the host's integration tests: they leave the two cores
# mostly idle (about a third busy, waiting on containerd and runc), the guest keeps them busy
# (TCG). Launched once the test binaries are built and before any test runs, it works on copies
# of the bench's shim and config taken then (hack/guest.sh, hack/guest/run.sh); waited for after
# them, its output printed then.
guest_bg=
guest_log=$P/guest/cgroupv2-beside.log
guest_rc=$P/guest/cgroupv2-beside.rc
if [[ -f integration/Cargo.toml ]]; then
	eval "$(print_env)"
	export RSANDBOX_PREFIX
	if [[ "${RSANDBOX_GUEST:-1}" != 0 ]]; then
		section "the cgroup v2 guest, launched beside the integration tests"
		if with_heartbeat "build the integration tests" \
			cargo test --manifest-path integration/Cargo.toml --no-run; then
			# what the host's tests change while they run, copied before any of them starts
			guest_copy=$P/guest/bench-copy
			rm -rf "$guest_copy" "$guest_rc"
			mkdir -p "$guest_copy"
			cp "$BIN/$SHIM_NAME" "$guest_copy/"
			cp -a "$P/conf" "$guest_copy/conf"
			# a session of its own, so that on_exit can end it whole (QEMU included); its exit
			# status into a file (its pid may name another process once it has ended); a longer
			# bound than alone (about 5 min), as the host's tests share the cores
			RSANDBOX_GUEST_BENCH_COPY=$guest_copy RSANDBOX_GUEST_TIMEOUT=${RSANDBOX_GUEST_TIMEOUT:-1500} \
				setsid bash -c 'hack/guest.sh >"$1" 2>&1; echo $? >"$2"' _ "$guest_log" "$guest_rc" &
			guest_bg=$!
			log "hack/guest.sh: session $guest_bg, output in $guest_log (printed after the integration tests)"
		else
			failed+=("integration tests (build)")
			log "the integration tests did not build: the cgroup v2 guest is not launched"
		fi
	fi
	for RSANDBOX_RUNC in 1.1 1.3; do
		section "integration tests, runc $RSANDBOX_RUNC"
		# no container may outlive a switch: runc's state belongs to one version
		reset_objects
		select_runc
		# the tally lists each skip (systemd.rs and installer.rs skip on this host: no systemd
		# as PID 1, no installer node; their stages run them) and fails a run of zero cases
		if ! with_heartbeat "integration tests, runc $RSANDBOX_RUNC" \
			run_tallied "integration tests, runc $RSANDBOX_RUNC" \
			cargo test --manifest-path integration/Cargo.toml --no-fail-fast -- --test-threads=1; then
			failed+=("integration tests (runc $RSANDBOX_RUNC)")
			log "containerd log (last 40 lines of $LOGFILE):"
			tail -n 40 "$LOGFILE" >&2 || true
			{
				echo "--- containerd log while integration tests, runc $RSANDBOX_RUNC ran (last 15 lines)"
				tail -n 15 "$LOGFILE" | sed 's/^/    /'
			} >>"$RSANDBOX_TALLY_RECAP" 2>/dev/null || true
		fi
	done
	reset_objects
	RSANDBOX_RUNC=1.1
	select_runc
	section "cgroup v2 guest: hack/guest.sh (launched beside the integration tests)"
	if [[ -n "$guest_bg" ]]; then
		# until its exit status is written, or its session is gone without one (killed)
		with_heartbeat "the cgroup v2 guest" bash -c \
			'until [[ -s $1 ]] || ! kill -0 -- "-$2" 2>/dev/null; do sleep 2; done' _ "$guest_rc" "$guest_bg"
		wait "$guest_bg" || true
		cat "$guest_log"
		[[ "$(cat "$guest_rc" 2>/dev/null)" == 0 ]] || failed+=("cgroup v2 guest")
		guest_bg=
	elif [[ "${RSANDBOX_GUEST:-1}" != 0 ]]; then
		failed+=("cgroup v2 guest (not launched)")
	else
		log "SKIPPED: RSANDBOX_GUEST=0"
	fi
	section "a gate that misfires fails where a stage expects it (hack/selftest.sh --gates)"
	hack/selftest.sh --gates || failed+=("hack/selftest.sh --gates")
else
	log "SKIPPED: integration/Cargo.toml does not exist yet"
fi

section "systemd node (cgroup v1): hack/node.sh run-tests"
if [[ "${RSANDBOX_NODE:-1}" = 0 ]]; then
	log "SKIPPED: RSANDBOX_NODE=0"
elif ! why=$(hack/node.sh check); then
	log "SKIPPED: $why"
elif [[ -f integration/Cargo.toml ]]; then
	# the node runs the shim hack/build.sh installed above (copied at its boot)
	hack/node.sh -n test run-tests || failed+=("systemd node (cgroup v1)")
else
	log "SKIPPED: integration/Cargo.toml does not exist yet"
fi

section "node installer: hack/installer/test.sh"
if [[ ! -f integration/Cargo.toml ]]; then
	log "SKIPPED: integration/Cargo.toml does not exist yet"
elif [[ "${RSANDBOX_NODE:-1}" != 0 ]] && why=$(hack/node.sh check); then
	hack/installer/test.sh || failed+=("node installer")
else
	log "no systemd node here (${why:-RSANDBOX_NODE=0}): the installer's tests run on a scratch containerd"
	hack/installer/test.sh --scratch || failed+=("node installer (scratch)")
fi

section "release artefacts: hack/release.sh, hack/release/test-verify.sh, hack/release/test-deb.sh"
# Two release builds of HEAD in two directories, every artefact and the provenance compared
# byte for byte (the reproducibility check; RSANDBOX_RELEASE_REPRO=0 builds once); then the
# verification docs/install.md shows, on dist/ signed with a throwaway key (tampered copies
# must fail it); then the .deb installed into a throwaway dpkg root, its binary's check against
# the bench and pods with it.
release_flags=()
[[ "${RSANDBOX_RELEASE_REPRO:-1}" = 0 ]] && release_flags=(--once)
if with_heartbeat "hack/release.sh" hack/release.sh "${release_flags[@]}"; then
	hack/release/test-verify.sh || failed+=("the release's verification (hack/release/test-verify.sh)")
	with_heartbeat "hack/release/test-deb.sh" hack/release/test-deb.sh || failed+=("the release's .deb on the bench")
else
	failed+=("release artefacts (hack/release.sh)")
fi

section "systemd guest: hack/guest.sh --systemd"
if [[ "${RSANDBOX_GUEST:-1}" = 0 ]]; then
	log "SKIPPED: RSANDBOX_GUEST=0"
elif [[ -f integration/Cargo.toml ]]; then
	hack/guest.sh --systemd || failed+=("systemd guest")
else
	log "SKIPPED: integration/Cargo.toml does not exist yet"
fi

section "SELinux guest: hack/guest.sh --selinux"
if [[ "${RSANDBOX_GUEST:-1}" = 0 ]]; then
	log "SKIPPED: RSANDBOX_GUEST=0"
elif [[ -f integration/Cargo.toml ]]; then
	hack/guest.sh --selinux || failed+=("SELinux guest")
else
	log "SKIPPED: integration/Cargo.toml does not exist yet"
fi

section "bench smoke run: hack/bench.sh --quick --compare bench/baseline.json"
if [[ -f integration/Cargo.toml ]]; then
	# the comparison is informational: 3 samples on a shared machine show a trend, no more
	compare=()
	[[ -f bench/baseline.json ]] && compare=(--compare bench/baseline.json)
	with_heartbeat "hack/bench.sh --quick" hack/bench.sh --quick "${compare[@]}" || failed+=("bench --quick")
else
	log "SKIPPED: integration/Cargo.toml does not exist yet"
fi

section "leftovers while containerd runs (tests must clean up after themselves)"
hack/leftovers.sh || failed+=("leftovers before stop")

section "stop containerd, then leftovers"
stop
hack/leftovers.sh || failed+=("leftovers after stop")

if ((${#failed[@]})); then
	section "FAILED: ${failed[*]}"
	exit 1
fi
section "all tests passed (in $(elapsed))"
