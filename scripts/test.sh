#!/usr/bin/env bash
# The test command: formatting, lints, then every test — unit, snapshot, property, CLI, and
# integration tests against the real local broker, which this script starts and stops.
# Usage: scripts/test.sh    (needs the Rust toolchain and python3/pip; installs the rest)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "local stack (scripts/stack.sh up)"
# A stack of its own (fresh state dir, free ports), so a developer's running stack is untouched.
export REPLAY_INGEST_STACK_DIR=${REPLAY_INGEST_STACK_DIR:-$(mktemp -d /tmp/replay-ingest-test.XXXXXX)}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export REPLAY_INGEST_KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-$(free_port)}
export REPLAY_INGEST_CLICKHOUSE_PORT=${REPLAY_INGEST_CLICKHOUSE_PORT:-$(free_port)}
export REPLAY_INGEST_CLICKHOUSE_TCP_PORT=${REPLAY_INGEST_CLICKHOUSE_TCP_PORT:-$(free_port)}
export REPLAY_INGEST_GCS_PORT=${REPLAY_INGEST_GCS_PORT:-$(free_port)}
log=$(mktemp)
trap 'scripts/stack.sh down; rm -f "$log"' EXIT
scripts/stack.sh up
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"

step "cargo test"
cargo test --locked --all-targets 2>&1 | tee "$log"

# One closing line over all test binaries (cargo prints one "test result" line per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "\ntests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log"
