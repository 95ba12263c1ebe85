#!/usr/bin/env bash
# Demo: runs the recording core over every recorded real-SDK segment and every synthetic
# (hostile or unusual) message, and prints what it extracted and what it rejected and why.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --release --quiet
bin=target/release/replay-ingest
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$bin" inspect fixtures/segments/*.msgpack fixtures/synthetic/*.msgpack >"$out"

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
valid = [r for r in rows if r["ok"]]
print(f"{'segment':<40} {'enc':<5} {'wire B':>8} {'json B':>9} {'events':>6} {'clicks':>6} {'dead':>4} {'rage':>4} {'taps':>4} {'reqs':>4} {'bad ev':>6}")
for r in valid:
    name = r["file"].split("/", 1)[1]
    clicks = r["clicks"]
    print(f"{name:<40} {r['body_encoding']:<5} {r['compressed_bytes']:>8} {r['uncompressed_bytes']:>9} {r['events']:>6} "
          f"{len(clicks):>6} {sum(c['is_dead'] for c in clicks):>4} {sum(c['is_rage'] for c in clicks):>4} "
          f"{len(r['taps']):>4} {len(r['requests']):>4} {r['invalid_events']:>6}")
print()
print("blob keys (first 3):", *[r["blob_key"] for r in valid[:3]], sep="\n  ")
print()
print(f"{'rejected message':<40} reason")
for r in rows:
    if not r["ok"]:
        print(f"{r['file'].split('/', 1)[1]:<40} {r['reason']}: {r['detail'][:70]}")
PY
