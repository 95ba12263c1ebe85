#!/usr/bin/env bash
# Peak RSS and time of `replay-ingest inspect` on each crafted message (tests/support/hostile.rs)
# and, for comparison, the largest recorded segment and the decompression bomb. Each message is
# inspected alone, in its own process, so the peak is that message's.
# Usage: scripts/hostile-rss.sh            (release build; prints one table row per message)
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
cargo build --locked --quiet --release --bin replay-ingest --example make_hostile_fixtures
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$target/release/examples/make_hostile_fixtures" "$dir" >"$dir/index.tsv"
printf '%s\t%s\t%s\n' fixtures/segments/large-dom-0.msgpack "$(stat -c %s fixtures/segments/large-dom-0.msgpack)" valid \
  fixtures/synthetic/zlib-bomb.msgpack "$(stat -c %s fixtures/synthetic/zlib-bomb.msgpack)" too_large >>"$dir/index.tsv"

# Runs a command and writes its peak RSS (KiB) and wall time (s) to the file named first
# (what GNU time's `-f '%M %e'` prints, without needing it installed).
measure() {
  python3 -c '
import resource, subprocess, sys, time
start = time.monotonic()
subprocess.run(sys.argv[2:], check=True)
with open(sys.argv[1], "w") as out:
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, f"{time.monotonic() - start:.2f}", file=out)
' "$@"
}
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
printf '%-28s %10s %-22s %-22s %12s %9s %8s\n' message bytes expected outcome held_bytes peak_MiB time_s
worst=0
while IFS=$'\t' read -r path bytes expected; do
  measure "$dir/time" "$target/release/replay-ingest" inspect "$path" >"$dir/line"
  read -r peak_kib seconds <"$dir/time"
  read -r outcome held < <(python3 -c 'import json,sys; r=json.load(sys.stdin); print("valid" if r["ok"] else r["reason"], r.get("memory_bytes", "-"))' <"$dir/line")
  printf '%-28s %10d %-22s %-22s %12s %9s %8.2f\n' "$(basename "$path" .msgpack)" "$bytes" "$expected" "$outcome" \
    "$held" "$(mib "$peak_kib")" "$seconds"
  [ "$outcome" = "$expected" ] || { echo "unexpected outcome for $path" >&2; exit 1; }
  [ "$peak_kib" -gt "$worst" ] && worst=$peak_kib
done <"$dir/index.tsv"
printf 'worst peak RSS: %s MiB (limit 512 MiB)\n' "$(mib "$worst")"
[ "$worst" -lt $((512 * 1024)) ]
