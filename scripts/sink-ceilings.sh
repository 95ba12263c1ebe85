#!/usr/bin/env bash
# Sinks at their limit, side by side. For each real destination: the service with only that sink
# real and the others null (scripts/load.sh, LOAD_SINKS=gcs|clickhouse|events, or
# LOAD_TRACE_ITEMS=1 for the EAP trace items, a backlog of the recorded mix), next to a bare client of the same destination — the service's client and
# settings, the same data, nothing else (examples/bare_upload, bare_insert, bare_produce) — at
# the service's batch size and in bulk. The emulator runs on its filesystem backend (the memory
# one slows down as it fills). Prints a markdown section; scripts/bench.sh puts it in
# docs/benchmarks.md.
# Usage: scripts/sink-ceilings.sh [COUNT]     (messages per service run, default 6000)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-6000}
results=$(mktemp) items_results=$(mktemp)
export REPLAY_INGEST_GCS_BACKEND=filesystem
for sink in gcs clickhouse events; do
  echo "== ceilings: the service, $sink only" >&2
  LOAD_SINKS=$sink LOAD_JSON=$results bash scripts/load.sh "$COUNT" >/dev/null
done
echo "== ceilings: the service, trace items only (rollout 1.0)" >&2
LOAD_TRACE_ITEMS=1 LOAD_JSON=$items_results bash scripts/load.sh "$COUNT" >/dev/null

# The bare clients, on a stack of their own.
# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh ceilings
trap 'status=$?; rm -f "$results" "$items_results"; isolated_stack_down "$status"' EXIT
scripts/setup.sh stack >/dev/null
scripts/stack.sh up >/dev/null
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
cargo build --locked --release --quiet --example bare_upload --example bare_insert --example bare_produce --example topics
echo "== ceilings: the bare clients" >&2
python3 - "$results" "${CARGO_TARGET_DIR:-target}/release/examples" "$items_results" <<'PY'
import json, pathlib, random, subprocess, sys, urllib.request

runs = {r["sinks"]: r for r in map(json.loads, open(sys.argv[1]))}
runs["trace_items"] = json.loads(open(sys.argv[3]).readline())
examples = pathlib.Path(sys.argv[2])
fixtures = sorted(str(p) for p in pathlib.Path("fixtures/segments").glob("*.msgpack"))
env = __import__("os").environ
def bare(name, *args):
    out = subprocess.run([str(examples / name), *map(str, args), *fixtures], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)
def fresh(prefix):
    return f"{prefix}{random.randrange(10**9)}"
def bucket():
    name = fresh("ceiling")
    urllib.request.urlopen(urllib.request.Request(f"{env['REPLAY_INGEST_TEST_GCS_ENDPOINT']}/storage/v1/b?project=ceilings",
                                                  data=json.dumps({"name": name}).encode(), headers={"content-type": "application/json"}))
    return name
def topics():
    prefix = fresh("ceiling-")
    subprocess.run([str(examples / "topics"), "--brokers", env["REPLAY_INGEST_TEST_BROKERS"], f"{prefix}-outcomes:1:outcomes-billing",
                    f"{prefix}-analytics:1", f"{prefix}-issues:1:ingest-occurrences"], check=True, capture_output=True)
    return prefix

rows = []
def row(what, sink, unit, same, bulk, bulk_label):
    r = runs[sink]
    own = r["sink_items"][sink]
    seconds = r["sink_seconds"][sink]
    writes = r["sink_writes"][sink]
    service = own / seconds
    rows.append(f"| {what} | {own / writes:.0f} {unit} | {service:.0f} | {same:.0f} | {service / same:.2f}× | {bulk:.0f} ({bulk_label}) | {r['msgs_per_s']:.0f} |")
    return round(own / writes)

# GCS: the service uploads each flush's blobs 32 at a time; the bare uploader the same objects.
r = runs["gcs"]
blobs = r["sink_items"]["gcs"]
same = bare("bare_upload", env["REPLAY_INGEST_TEST_GCS_ENDPOINT"], bucket(), blobs, 32)["per_second"]
by_concurrency = {c: bare("bare_upload", env["REPLAY_INGEST_TEST_GCS_ENDPOINT"], bucket(), blobs, c)["per_second"] for c in (8, 64)}
by_concurrency[32] = same
row("GCS blobs (emulator, filesystem backend)", "gcs", "blobs", same, max(by_concurrency.values()),
    "best of " + ", ".join(f"{c}: {v:.0f}" for c, v in sorted(by_concurrency.items())) + " at a time")
# ClickHouse: one INSERT per flush; the bare client the same rows per INSERT, and 100 000.
per_write = round(runs["clickhouse"]["sink_items"]["clickhouse"] / runs["clickhouse"]["sink_writes"]["clickhouse"])
url = env["REPLAY_INGEST_TEST_CLICKHOUSE_URL"]
same = bare("bare_insert", url, fresh("ceiling_"), max(per_write * 50, 20000), per_write)["per_second"]
bulk = bare("bare_insert", url, fresh("ceiling_"), 200000, 100000)["per_second"]
row("ClickHouse 18.16 rows", "clickhouse", "rows", same, bulk, "100 000 rows per INSERT")
# Kafka: each flush's events awaited together; the bare producer the same records per batch, and
# in delivery windows only.
per_write = round(runs["events"]["sink_items"]["events"] / runs["events"]["sink_writes"]["events"])
same = bare("bare_produce", env["REPLAY_INGEST_TEST_BROKERS"], topics(), max(per_write * 50, 20000), per_write)["per_second"]
bulk = bare("bare_produce", env["REPLAY_INGEST_TEST_BROKERS"], topics(), 200000, 0)["per_second"]
row("Kafka event records (outcomes, analytics, occurrences)", "events", "records", same, bulk, "awaited in 8 MiB windows only")
# EAP trace items: the same, the items the fixtures make at rollout 1.0 to a topic of their own.
def items_topic():
    prefix = fresh("ceiling-")
    subprocess.run([str(examples / "topics"), "--brokers", env["REPLAY_INGEST_TEST_BROKERS"], f"{prefix}-items:1:snuba-items"],
                   check=True, capture_output=True)
    return prefix
per_write = round(runs["trace_items"]["sink_items"]["trace_items"] / runs["trace_items"]["sink_writes"]["trace_items"])
same = bare("bare_produce", "--trace-items", env["REPLAY_INGEST_TEST_BROKERS"], items_topic(), max(per_write * 50, 20000), per_write)["per_second"]
bulk = bare("bare_produce", "--trace-items", env["REPLAY_INGEST_TEST_BROKERS"], items_topic(), 200000, 0)["per_second"]
row("Kafka EAP trace items (rollout 1.0)", "trace_items", "items", same, bulk, "awaited in 8 MiB windows only")

print("## Sinks at their limit\n")
print("Made by `scripts/sink-ceilings.sh`. Each destination alone: the service with only that sink real (a backlog")
print(f"of {runs['gcs']['messages']} messages of the recorded mix), against a bare client of the destination with the service's")
print("client and settings writing the same data. *Per second of its own time* is what the sink wrote divided by the")
print("time its writes took (summed over flushes): the sink's rate while it works, next to the bare client's.")
print("The emulator runs on its filesystem backend: on its memory backend each upload costs more the more objects")
print("it holds (0.9 ms at first, 15 ms past 11 000 objects, measured with the bare uploader on 2026-12-01), which")
print("no real GCS does; on disk it holds a flat rate.\n")
print("| destination | service: per flush | service: per second of its own time | bare, same batch | service / bare | bare, best | service msgs/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
PY
