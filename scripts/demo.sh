#!/usr/bin/env bash
# Demo, end to end on local infrastructure: starts the local Kafka broker (tansu), runs the
# service, publishes every recorded real-SDK segment and every hostile/unusual synthetic message,
# waits until all offsets are committed, shuts the service down (SIGTERM drain) and reports what
# was stored and what was rejected — then stops everything it started.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

export REPLAY_INGEST_STACK_DIR=${REPLAY_INGEST_STACK_DIR:-$(mktemp -d /tmp/replay-ingest-demo.XXXXXX)}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export REPLAY_INGEST_KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-$(free_port)}
work=$(mktemp -d /tmp/replay-ingest-demo-data.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  scripts/stack.sh down >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

echo "== local stack"
scripts/stack.sh up
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
echo "== building replay-ingest (release)"
cargo build --locked --release --quiet --bin replay-ingest
bin=target/release/replay-ingest
for topic in ingest-replay-recordings:4 ingest-replay-recordings-dlq:1; do
  "$REPLAY_INGEST_TANSU" topic create --broker "tcp://$REPLAY_INGEST_TEST_BROKERS" --partitions "${topic#*:}" "${topic%:*}" >/dev/null
done

port=$(free_port)
echo "== starting the service (status on http://127.0.0.1:$port/status)"
"$bin" consume --brokers "$REPLAY_INGEST_TEST_BROKERS" --blob-sink filesystem --blob-dir "$work/blobs" \
  --rows-sink null --events-sink null --statsd-address "" --http-listen "127.0.0.1:$port" \
  --session-timeout-ms 6000 --drain-deadline-ms 5000 --buffer-max-age-ms 1000 2>"$work/service.log" &
pid=$!

files=(fixtures/segments/*.msgpack fixtures/synthetic/*.msgpack)
echo "== publishing ${#files[@]} messages (${#files[@]} fixtures, each with a fresh replay id)"
produced=$("$bin" produce --brokers "$REPLAY_INGEST_TEST_BROKERS" --count "${#files[@]}" "${files[@]}")

python3 - "$port" "$produced" "$work/blobs" <<'PY'
import json, os, sys, time, urllib.request, zlib
port, produced, blob_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
target = {str(p): o + 1 for p, o in produced["last_offsets"].items()}
def status():
    try:
        return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
    except Exception:
        return None
deadline, start, s = time.monotonic() + 120, None, None
while time.monotonic() < deadline:
    s = status()
    if s and s["consumed"] and start is None:
        start = time.monotonic()
    if s and all(s["committed"].get(p) == o for p, o in target.items()):
        break
    time.sleep(0.1)
else:
    sys.exit(f"timed out waiting for commits; last status: {s}")
elapsed = time.monotonic() - start
print(f"== committed {produced['messages']} messages on {len(target)} partitions in {elapsed:.2f} s: {s['committed']}")
blobs = []
for root, _, names in os.walk(blob_dir):
    blobs += [os.path.join(root, n) for n in names]
total = sum(os.path.getsize(b) for b in blobs)
print(f"\nblobs stored: {len(blobs)} ({total / 1e6:.2f} MB, zlib) under {blob_dir}")
for b in sorted(blobs)[:4]:
    events = json.loads(zlib.decompress(open(b, "rb").read()))
    print(f"  {os.path.relpath(b, blob_dir):<58} {os.path.getsize(b):>8} B  {len(events):>3} rrweb events")
print(f"\ninvalid messages (dead-lettered with their original bytes): {s['invalid']}")
for reason, n in sorted(s["invalid_by_reason"].items()):
    print(f"  {reason:<22} {n}")
PY
echo
echo "== SIGTERM: draining"
kill -TERM "$pid"
wait "$pid" && echo "service exited 0 after a clean drain"
pid=""
