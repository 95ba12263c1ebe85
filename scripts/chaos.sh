#!/usr/bin/env bash
# The chaos harness (tests/chaos.rs), on a stack of its own: two members with every real sink,
# fixtures and crafted messages produced throughout, while members are killed (SIGKILL), leave
# and join, ClickHouse stops (once with a member joining half way), GCS hangs or answers late,
# the broker hangs, is SIGKILLed or restarted cleanly; then every store is checked.
# Prints one summary line (and the failure, if any).
# Usage: scripts/chaos.sh [SECONDS]   seconds of faults, default 900 (the test command runs 150)
#        CHAOS_GROUP_PROTOCOL=consumer scripts/chaos.sh [SECONDS]   every member on KIP-848's group protocol
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-900}
log=$(mktemp)
# The harness's own stack lives here, so that it is stopped when the harness is stopped half way
# (Ctrl-C or a SIGTERM skips the harness's own clean-up, and the servers would run on).
stack=$(mktemp -d /tmp/replay-ingest-chaos.XXXXXX)
export REPLAY_INGEST_CHAOS_STACK_DIR=$stack
trap 'status=$?
  REPLAY_INGEST_STACK_DIR=$stack scripts/stack.sh down >/dev/null 2>&1 || true
  if [ "$status" -ne 0 ] && [ -n "$(ls -A "$stack" 2>/dev/null)" ]; then
    echo "the chaos stack logs are kept in $stack" >&2
  else
    rm -rf "$stack"
  fi
  rm -f "$log"' EXIT
# The harness brings up (and stops) a stack of its own; a bare `cargo test` leaves it out (it is
# marked ignored), this script runs it.
if CHAOS_SECONDS=$seconds cargo test --locked --quiet --test chaos -- --include-ignored --nocapture >"$log" 2>&1; then
  # The summary, and what the members' rebalances waited on when a scale-out or a join was slow.
  grep -E '^(chaos:|slow scale-out|slow join)' "$log"
else
  grep '^chaos:' "$log" || true
  echo "chaos harness FAILED; the end of its output:" >&2
  tail -60 "$log" >&2
  exit 1
fi
