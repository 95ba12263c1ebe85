#!/usr/bin/env bash
# The test command: formatting, lints, and every test (unit, snapshot, property, CLI).
# Usage: scripts/test.sh            (from any directory; needs only the Rust toolchain)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --all-targets 2>&1 | tee "$log"

# One closing line over all test binaries (cargo prints one "test result" line per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "\ntests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log"
