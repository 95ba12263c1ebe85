#!/usr/bin/env bash
# Re-records fixtures/segments with the real @sentry/browser SDK in headless Debian Chromium,
# then regenerates fixtures/synthetic from them. Needs network access to npm and Debian.
# Usage: scripts/record-fixtures.sh            (every scenario, replacing fixtures/segments)
#        SCENARIOS=media scripts/record-fixtures.sh   (only those, the other fixtures kept)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian.sh

if ! command -v chromium >/dev/null; then
  apt_get update -qq
  apt_get install -y -qq chromium >/dev/null
fi
(cd fixtures/record && npm ci --no-audit --no-fund && { [ -n "${SCENARIOS:-}" ] || rm -f ../segments/*.msgpack; } && node record.mjs)
cargo run --locked --quiet --example make_synthetic_fixtures
echo "Then review every changed snapshot before accepting it: INSTA_UPDATE=new cargo test --test it fixtures::,"
echo "read each tests/it/snapshots/*.snap.new against its .snap, and move over only what you have read."
