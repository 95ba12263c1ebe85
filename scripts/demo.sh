#!/usr/bin/env bash
# Demo, end to end on local infrastructure: starts the local Kafka broker (Apache Kafka), ClickHouse and
# the GCS emulator; runs the service with every real sink; publishes every recorded real-SDK
# segment and every hostile/unusual synthetic message; waits until all offsets are committed;
# shuts the service down (SIGTERM drain) and reports what landed where, and the metrics a
# DogStatsD listener received — then stops everything.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh demo
work=$(mktemp -d /tmp/replay-ingest-demo-data.XXXXXX)
pid=""
statsd=""
cleanup() {
  local status=$?
  [ -z "$statsd" ] || kill "$statsd" 2>/dev/null || true
  isolated_stack_down $status "$pid"
  rm -rf "$work"
}
trap cleanup EXIT

echo "== local stack: Apache Kafka, ClickHouse, GCS emulator"
scripts/setup.sh stack
scripts/stack.sh up
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
echo "== building replay-ingest (release)"
cargo build --locked --release --quiet --bin replay-ingest --example produce --example topics
bin=${CARGO_TARGET_DIR:-target}/release/replay-ingest
produce=${CARGO_TARGET_DIR:-target}/release/examples/produce
# Every topic with the settings Sentry gives it (the recordings topic takes 15 MB messages).
"${CARGO_TARGET_DIR:-target}"/release/examples/topics --brokers "$REPLAY_INGEST_TEST_BROKERS" \
  ingest-replay-recordings:4 ingest-replay-recordings-dlq:1 outcomes-billing:1 replay-analytics:1 ingest-occurrences:1 \
  snuba-items:1
python3 -c "import urllib.request as u; u.urlopen(u.Request('$REPLAY_INGEST_TEST_GCS_ENDPOINT/storage/v1/b?project=demo', data=b'{\"name\":\"replays\"}', headers={'content-type': 'application/json'}), timeout=10)"

port=$(free_port)
# DogStatsD's side: a listener on a UDP port of its own that keeps each metric's name and how
# many datagrams came, reported after the drain.
statsd_port=$(free_port)
python3 - "$statsd_port" "$work/statsd.json" <<'PY' &
import json, socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", int(sys.argv[1])))
datagrams, names = 0, set()
while True:
    data = sock.recv(65536)
    datagrams += 1
    names.update(line.split(b":", 1)[0].decode(errors="replace") for line in data.splitlines() if line)
    with open(sys.argv[2] + ".tmp", "w") as f:
        json.dump({"datagrams": datagrams, "names": sorted(names)}, f)
    __import__("os").replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
statsd=$!
echo "== starting the service (status on http://127.0.0.1:$port/status)"
"$bin" consume --brokers "$REPLAY_INGEST_TEST_BROKERS" \
  --blob-sink gcs --gcs-bucket replays --gcs-endpoint "$REPLAY_INGEST_TEST_GCS_ENDPOINT" --gcs-anonymous \
  --rows-sink clickhouse --clickhouse-url "$REPLAY_INGEST_TEST_CLICKHOUSE_URL" --migrate-on-start \
  --events-sink kafka --trace-items-rollout 1.0 --statsd-address "127.0.0.1:$statsd_port" --http-listen "127.0.0.1:$port" \
  --session-timeout-ms 6000 --drain-deadline-ms 5000 --buffer-max-age-ms 1000 2>"$work/service.log" &
pid=$!

files=(fixtures/segments/*.msgpack fixtures/synthetic/*.msgpack)
echo "== publishing ${#files[@]} messages (every fixture once, each with a fresh replay id)"
produced=$("$produce" --brokers "$REPLAY_INGEST_TEST_BROKERS" --count "${#files[@]}" "${files[@]}")

python3 - "$port" "$produced" "$REPLAY_INGEST_TEST_GCS_ENDPOINT" "$REPLAY_INGEST_TEST_CLICKHOUSE_URL" "$pid" "$work/service.log" <<'PY'
import json, os, sys, time, urllib.parse, urllib.request
port, produced, gcs, clickhouse = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
service, log = sys.argv[5], sys.argv[6]
def fail(why):
    # The service's log goes with the demo's temporary directory: its end is shown here.
    with open(log, errors="replace") as f:
        tail = f.readlines()[-50:]
    sys.exit(f"{why}\nthe service's log ends:\n" + "".join(tail))
def alive():
    try:
        with open(f"/proc/{service}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
target = {str(p): o + 1 for p, o in produced["last_offsets"].items()}
def get(url):
    return urllib.request.urlopen(url, timeout=5).read()
def status():
    try:
        return json.loads(get(f"http://127.0.0.1:{port}/status"))
    except Exception:
        return None
deadline, start, s = time.monotonic() + 180, None, None
while time.monotonic() < deadline:
    if not alive():
        fail("the service exited before committing everything")
    s = status()
    if s and s["consumed"] and start is None:
        start = time.monotonic()
    if s and all(s["committed"].get(p) == o for p, o in target.items()):
        break
    time.sleep(0.1)
else:
    fail(f"timed out waiting for commits; last status: {s}")
elapsed = time.monotonic() - start
print(f"== committed {produced['messages']} messages on {len(target)} partitions in {elapsed:.2f} s: {s['committed']}")

objects = json.loads(get(f"{gcs}/storage/v1/b/replays/o")).get("items", [])
print(f"\nGCS bucket 'replays': {len(objects)} blobs, {sum(int(o['size']) for o in objects) / 1e6:.2f} MB")
for o in sorted(objects, key=lambda o: o["name"])[:4]:
    print(f"  {o['name']:<50} {int(o['size']):>8} B")

def query(sql):
    return get(f"{clickhouse}/?query=" + urllib.parse.quote(sql)).decode().strip()
print("\nClickHouse default.replays_local (snuba's schema, after merging duplicates):")
kind = "multiIf(segment_id IS NOT NULL, 'segment', click_node_id != 0, 'click', 'tap')"
print("  " + query(f"SELECT {kind} AS kind, count() FROM default.replays_local FINAL GROUP BY kind ORDER BY kind FORMAT TSV").replace("\n", "\n  "))
print("  dead clicks: " + query("SELECT count() FROM default.replays_local FINAL WHERE click_is_dead = 1")
      + ", rage clicks: " + query("SELECT count() FROM default.replays_local FINAL WHERE click_is_rage = 1"))

sinks = s["sinks"]
print(f"\nanalytics events published (outcomes, first replay, rage-click / hydration-error occurrences): {sinks['events']['items']}")
print(f"breadcrumbs as EAP trace items on snuba-items (every one: --trace-items-rollout 1.0): {sinks['trace_items']['items']}")
print(f"\ninvalid messages, dead-lettered with their original bytes: {s['invalid']}")
for reason, n in sorted(s["invalid_by_reason"].items()):
    print(f"  {reason:<22} {n}")
print("\ntime per sink: " + ", ".join(f"{k} {v['seconds'] * 1000:.0f} ms" for k, v in sorted(sinks.items())))
PY
echo
echo "== SIGTERM: draining"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
if [ "$status" -ne 0 ]; then
  echo "the service exited $status after SIGTERM: its drain failed; its log ends:" >&2
  tail -n 50 "$work/service.log" >&2
  exit 1
fi
echo "service exited 0 after a clean drain"
python3 - "$work/statsd.json" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        m = json.load(f)
except OSError:
    sys.exit("no metric reached the DogStatsD listener")
shown = [n for n in m["names"] if n.endswith(("messages.consumed", "flush.duration_ms", "consumer.lag", "sink.outage_ms"))]
print(f"metrics: {m['datagrams']} DogStatsD datagrams, {len(m['names'])} metrics, e.g. {', '.join(shown) or ', '.join(m['names'][:4])}")
PY
