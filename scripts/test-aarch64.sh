#!/usr/bin/env bash
# The JSON scanner on aarch64: its NEON masks are checked against the byte loop by the scanner's
# own unit and property tests, built for aarch64 (musl, linked by rust-lld) and run under
# qemu-user. Installs the Rust target and qemu-user when missing (apt-get: needs root); where
# either cannot be installed it says so, with the installer's error, and skips, so the test
# command still runs on a machine without them — except with REPLAY_INGEST_REQUIRE_ALL=1 (CI sets
# it), where a skip is a failure: CI installs everything its tests need.
# Usage: scripts/test-aarch64.sh [--prepare]    (--prepare: only install the target and qemu-user)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian.sh

target=aarch64-unknown-linux-musl
installing=$(mktemp)
trap 'rm -f "$installing"' EXIT
skip() {
  tail -n 5 "$installing" | sed 's/^/  /'
  if [ "${REPLAY_INGEST_REQUIRE_ALL:-}" = 1 ]; then
    echo "scanner on aarch64: FAILED — $* (REPLAY_INGEST_REQUIRE_ALL=1: nothing may be skipped)" >&2
    exit 1
  fi
  echo "scanner on aarch64: SKIPPED — $*"
  exit 0
}
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target" >"$installing" 2>&1 || skip "the Rust target $target cannot be installed here"
fi
if ! command -v qemu-aarch64 >/dev/null; then
  { apt_get update -qq && apt_get install -y -qq qemu-user; } >"$installing" 2>&1 ||
    skip "qemu-user cannot be installed here"
fi
[ "${1:-}" = --prepare ] && exit 0
manifest=tools/scan-aarch64/Cargo.toml
config=(--config "target.$target.linker=\"rust-lld\"" --config "target.$target.runner=\"qemu-aarch64\"")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/scan-aarch64"
cargo clippy --locked --quiet --manifest-path "$manifest" --target "$target" --all-targets -- -D warnings
cargo test --locked --manifest-path "$manifest" --target "$target" "${config[@]}"
