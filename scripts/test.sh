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
cargo test --locked --all-targets
