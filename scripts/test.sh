#!/usr/bin/env bash
# The test command: formatting, lints, then every test — unit, snapshot, property, CLI, and
# integration tests against the real local broker, which this script starts and stops.
# Usage: scripts/test.sh    (needs the Rust toolchain and python3/pip; installs the rest)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s  [%d s]\n' "$*" "$SECONDS"; }

cache=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
venv=$cache/chart-venv
chdb_venv=$cache/chdb-venv
export REPLAY_INGEST_CHDB_PYTHON=$chdb_venv/bin/python

# Installing (scripts/setup.sh) and starting the local stack are network and disk work; they
# run in the background while the foreground compiles (on a cold cache this saves minutes).
prepare() {
  set -e
  echo "== setup (scripts/setup.sh)"
  scripts/setup.sh test
  echo "== local stack (scripts/stack.sh up)"
  scripts/stack.sh up
}

# What compiling needs comes first (the rest installs while it compiles), before anything is
# made that the trap below would have to remove.
# shellcheck source=scripts/lib/debian.sh
source scripts/lib/debian.sh
ensure_build_tools

# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh test
chaos_log=$(mktemp)
chaos=""
# The chaos harness's own stacks live here, one directory per run (classic, consumer), so that
# this script can stop them when the harness is stopped half way (a SIGTERM skips the harness's
# own clean-up), and a failed run's logs are not mixed with the next run's.
chaos_stack=$(mktemp -d /tmp/replay-ingest-chaos.XXXXXX)
prepared=$(mktemp)
prepare >"$prepared" 2>&1 &
preparing=$!
# On the way out, an early failure (fmt, clippy) waits for the preparation instead of killing
# it: a kill would stop its shell but not what it runs (apt-get, `stack.sh up`), which would go
# on starting servers after the stack was brought down.
# (errexit applies inside the trap too: each command may fail without changing the exit status.)
# A failing run keeps both stacks' logs (the chaos harness removes its own when it passes).
trap 'status=$?
  [ -z "$chaos" ] || { kill "$chaos" 2>/dev/null || true; wait "$chaos" 2>/dev/null || true; }
  [ -z "$preparing" ] || wait "$preparing" 2>/dev/null || true
  isolated_stack_down "$status"
  for run in classic consumer; do
    REPLAY_INGEST_STACK_DIR=$chaos_stack/$run scripts/stack.sh down >/dev/null 2>&1 || true
  done
  rm -rf "$chaos_log" "$prepared"
  if [ "$status" -ne 0 ] && [ -n "$(ls -A "$chaos_stack" 2>/dev/null)" ]; then
    echo "the chaos harness stack logs are kept in $chaos_stack" >&2
  else
    rm -rf "$chaos_stack"
  fi' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "build"
# `examples/topics`: the chart check makes its topics with it.
cargo build --locked --quiet --bin replay-ingest --example topics
cargo test --locked --all-targets --no-run --quiet

step "tools and local stack (prepared in the background)"
prepare_status=0
wait "$preparing" || prepare_status=$?
preparing=""
cat "$prepared"
[ "$prepare_status" -eq 0 ] || { echo "preparing the tools or the stack failed" >&2; exit 1; }
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"

step "helm chart: lint, render, validate (helm-python-sdk, kubernetes-validate)"
"$venv/bin/python" scripts/check-chart.py "${CARGO_TARGET_DIR:-target}/debug/replay-ingest"

step "cargo test"
# Two test binaries: tests/it (every integration test, a module per area) and the chaos harness
# (tests/chaos.rs), which brings up a stack of its own and so runs beside the other, straight from
# its executable (a second cargo would wait for the first one's lock); its output follows. The
# integration tests that need the stack (or chDB) are marked ignored, so that a bare `cargo test`
# reports them as not run; here every one runs. Each binary runs even when another fails, so a
# red run shows all its failures; libtest prints each binary's result and its failed tests, and
# the last lines here say which steps failed. (Benchmarks run once each as a smoke test; their
# harness takes no test flags.)
failed=()
chaos_bin=$(cargo test --locked --test chaos --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys; print(next(m["executable"] for m in map(json.loads, sys.stdin)
    if m.get("executable") and m["target"]["name"] == "chaos" and m["profile"]["test"]))')
# Once with each group protocol, classic then KIP-848's, in turn (each brings up a stack of its
# own); both run even when the first fails, and print their summary line. Bounded as the tests
# beside them are: a harness that hangs fails its step, not the whole run (timeout signals its
# whole process group, both runs included).
timeout -k 30s 45m bash -c 'status=0
  REPLAY_INGEST_CHAOS_STACK_DIR=$1/classic "$0" --include-ignored --nocapture || status=$?
  REPLAY_INGEST_CHAOS_STACK_DIR=$1/consumer CHAOS_GROUP_PROTOCOL=consumer \
    "$0" --include-ignored --nocapture || status=$?
  exit "$status"' "$chaos_bin" "$chaos_stack" >"$chaos_log" 2>&1 &
chaos=$!
# A test that hangs (libtest has no per-test deadline) fails this step at 45 min, which is three
# times what the step takes on a loaded 2-core machine, instead of the whole run being stopped at
# its limit without the steps after it: libtest has already printed which tests were still
# running ("has been running for over 60 seconds").
tests_status=0
timeout 45m cargo test --locked --lib --bins --examples --test it --no-fail-fast -- --include-ignored ||
  tests_status=$?
case $tests_status in
  0) ;;
  124) failed+=("cargo test (unit, example and integration tests): stopped after 45 min; the tests still running are named above") ;;
  *) failed+=("cargo test (unit, example and integration tests)") ;;
esac
cargo test --locked --bench process --no-fail-fast || failed+=("benchmark smoke test")
chaos_status=0
wait "$chaos" || chaos_status=$?
chaos=""
step "chaos harness (tests/chaos.rs, ran beside the tests above)"
cat "$chaos_log"
case $chaos_status in
  0) ;;
  124) failed+=("chaos harness: stopped after 45 min") ;;
  *) failed+=("chaos harness (exit $chaos_status)") ;;
esac

# The scanner's NEON path, on aarch64 under qemu-user (its own crate: tools/scan-aarch64).
step "scanner on aarch64 (NEON, qemu-user)"
bash scripts/test-aarch64.sh || failed+=("scanner on aarch64")

step "done"
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "every step passed"
