#!/usr/bin/env bash
# Benchmark report: runs the criterion benchmark of the per-message core, `process` against
# libdeflate interleaved (examples/process_cpu --vs-libdeflate), the Python baselines,
# and end-to-end load runs through the local broker (null sink at several buffer sizes and
# thread counts, small segments only at 1 and 2 threads, and real sinks on the mix and on small
# segments), then writes docs/benchmarks.md with tables — throughput, CPU per message against
# `process` + a bare consumer, with null and with real sinks — and
# docs/benchmarks.png (throughput vs buffer size and threads, peak RSS), and the sinks' ceilings
# side by side (scripts/sink-ceilings.sh).
# Usage: scripts/bench.sh [COUNT]     (messages per load run, default 3000)
set -euo pipefail
cd "$(dirname "$0")/.."
# The build tools, python3-venv and the local stack's servers, for the steps below.
scripts/setup.sh stack >/dev/null
COUNT=${1:-3000}
# The emulator on disk: its memory backend slows down as it fills (scripts/stack.sh).
export REPLAY_INGEST_GCS_BACKEND=filesystem
CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
results=$(mktemp)
trap 'rm -f "$results"' EXIT

echo "== criterion: cargo bench --bench process"
# Its report is read from target/criterion below; on a failure, its output says why.
bench_log=$(mktemp)
cargo bench --locked --bench process >"$bench_log" 2>&1 || { tail -n 30 "$bench_log" >&2; exit 1; }
rm -f "$bench_log"

echo "== process against libdeflate, interleaved (examples/process_cpu --vs-libdeflate)"
cargo build --locked --release --quiet --example process_cpu
interleaved=$("${CARGO_TARGET_DIR:-target}"/release/examples/process_cpu --vs-libdeflate 100 fixtures/segments/*.msgpack)

echo "== Python baseline"
venv=$CACHE/bench-venv
if ! "$venv/bin/python" -c 'import msgpack, matplotlib, orjson, msgspec' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: -c scripts/python-constraints.txt msgpack matplotlib orjson msgspec
fi
python_lines=$("$venv/bin/python" benches/python_baseline.py)
# `process` again right after Python: the msgspec ratio uses the mean of the runs on either side.
interleaved_after=$("${CARGO_TARGET_DIR:-target}"/release/examples/process_cpu --vs-libdeflate 50 fixtures/segments/*.msgpack)

for threads in 1 2; do
  for buffer in 33554432 67108864 268435456; do
    echo "== load: null sink, $threads thread(s), buffer $((buffer >> 20)) MiB"
    LOAD_THREADS=$threads LOAD_JSON=$results bash scripts/load.sh "$COUNT" "$buffer" >/dev/null
  done
done
small=$(find fixtures/segments -name '*.msgpack' -size -64k | sort | tr '\n' ' ')
# Three runs each: the ratio to the work is the target here, and one run moves with the machine.
for run in 1 2 3; do
  for threads in 1 2; do
    echo "== load: null sink, small segments only, $threads thread(s), run $run"
    LOAD_THREADS=$threads LOAD_FIXTURES=$small LOAD_JSON=$results bash scripts/load.sh "$((COUNT * 20))" 67108864 >/dev/null
  done
done
echo "== load: real sinks"
LOAD_SINKS=real LOAD_JSON=$results bash scripts/load.sh "$COUNT" 67108864 >/dev/null
echo "== load: real sinks, small segments only"
LOAD_SINKS=real LOAD_FIXTURES=$small LOAD_JSON=$results bash scripts/load.sh "$((COUNT * 4))" 67108864 >/dev/null
echo "== sinks at their limit"
ceilings=$(bash scripts/sink-ceilings.sh "$((COUNT * 2))")

"$venv/bin/python" - "$results" "$python_lines" "${CARGO_TARGET_DIR:-target}/criterion" "$ceilings" "$interleaved" "$interleaved_after" <<'PY'
import json, pathlib, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

runs = [json.loads(l) for l in open(sys.argv[1])]
python = {line.split(":")[0].split()[1]: float(line.split(":")[1].split()[0]) for line in sys.argv[2].splitlines()}
criterion = pathlib.Path(sys.argv[3])
def estimate(group, name):
    estimates = json.loads((criterion / group / name / "new" / "estimates.json").read_text())
    info = json.loads((criterion / group / name / "new" / "benchmark.json").read_text())
    return estimates["mean"]["point_estimate"] / 1e9, info["throughput"]
bench = {}
for name in ["libdeflate_only", "inflate_only", "process", "sonic_lazy", "inflate_sonic_value", "inflate_serde_json_value"]:
    seconds, throughput = estimate("fixture_mix", name)
    bench[name] = throughput["Bytes"] / seconds / 2**20

floor = bench["libdeflate_only"]
out = ["# Benchmarks", "", "Made by `scripts/bench.sh` on a 2-core machine; the broker, ClickHouse and the GCS",
       "emulator run on the same cores. Numbers on this shared machine vary by about ±10 % from run to run.",
       "", "## Per message (one core, recorded fixture mix)", "",
       "| path | MiB/s of decompressed JSON | vs. libdeflate inflate |", "|---|---:|---:|"]
labels = {"libdeflate_only": "inflate only, libdeflate (the floor; what `process` uses)",
          "inflate_only": "inflate only, zlib-rs streaming (the decoder before)",
          "process": "**recording::process** (whole per-message function)",
          "sonic_lazy": "libdeflate + UTF-8 + sonic-rs lazy iterators (walk only)",
          "inflate_sonic_value": "inflate + sonic-rs DOM", "inflate_serde_json_value": "inflate + serde_json::Value"}
for name, label in labels.items():
    out.append(f"| {label} | {bench[name]:.0f} | {bench[name] / floor:.2f}× |")
python_labels = {"json": "msgpack + zlib + json.loads", "orjson": "msgpack + zlib + orjson", "msgspec": "msgpack + zlib + msgspec (typed, lazy)"}
for name, label in python_labels.items():
    out.append(f"| Python: {label} + classification | {python[name]:.1f} | {python[name] / floor:.2f}× |")
interleaved = json.loads(sys.argv[5])
out += ["", f"Interleaved on one thread (`examples/process_cpu --vs-libdeflate`, {interleaved['rounds']} rounds, each timing "
        "both over the mix in turn, so that both see the machine at the same speed): `process` at "
        f"{interleaved['ratio_median']:.2f}× libdeflate's inflate (median; quartiles {interleaved['ratio_p25']:.2f}–{interleaved['ratio_p75']:.2f}; "
        f"{interleaved['process_mib_s']:.0f} against {interleaved['libdeflate_mib_s']:.0f} MiB/s). The criterion ratio above "
        "compares two runs seconds apart and moves with the machine."]
# Python's CPU-time rates against `process` interleaved just before and just after them.
interleaved_after = json.loads(sys.argv[6])
process_cpu_mib_s = (interleaved["process_mib_s"] + interleaved_after["process_mib_s"]) / 2
out += ["", f"`process` is {process_cpu_mib_s / python['msgspec']:.1f}× the fastest Python path (msgspec) and "
        f"{process_cpu_mib_s / python['json']:.0f}× the standard-library one, in CPU time: `process` at "
        f"{process_cpu_mib_s:.0f} MiB/s, the mean of the interleaved runs just before and just after Python's "
        f"({interleaved['process_mib_s']:.0f} and {interleaved_after['process_mib_s']:.0f}); against criterion's "
        f"`process` {bench['process'] / python['msgspec']:.1f}×.", "",
        "## EAP trace items (`--trace-items-rollout`)", "",
        "`process` with the rollout at 0 (the default: no item is built) and at 1.0 (every breadcrumb an item).", "",
        "| group | rollout 0 | rollout 1.0 | ratio |", "|---|---:|---:|---:|"]
for group, unit in [("fixture_mix", "MiB/s"), ("small_segments", "segments/s")]:
    rates = []
    for name in ["process", "process_trace_items"]:
        seconds, throughput = estimate(group, name)
        rates.append(throughput["Bytes"] / seconds / 2**20 if "Bytes" in throughput else throughput["Elements"] / seconds)
    out.append(f"| {group} ({unit}) | {rates[0]:.0f} | {rates[1]:.0f} | {rates[1] / rates[0]:.2f}× |")
out += ["", sys.argv[4], "",
        "## Through the broker", "",
        "Whole run (first message to the last flushed), and steady state (10 % to 90 % of the messages",
        "flushed; the bare consumer measured the same way), without the fetch ramp-up and the tail.", "",
        "| sinks | mix | threads | buffer budget | msgs/s | MB/s | steady msgs/s | bare consumer steady msgs/s | steady ratio | peak RSS | time per sink (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
def mix_of(r):
    return "small" if r.get("fixtures") else "all"
for r in runs:
    sinks = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["sink_seconds"].items())) or "—"
    out.append(f"| {r['sinks']} | {mix_of(r)} | {r['threads'] or 'all'} | {r['buffer_bytes'] >> 20} MiB | {r['msgs_per_s']:.0f} | {r['mb_per_s']:.1f} | "
               f"{r['steady_msgs_per_s']:.0f} | {r['bare_steady_msgs_per_s']:.0f} | {r['steady_msgs_per_s'] / r['bare_steady_msgs_per_s']:.2f}× | "
               f"{r['peak_rss_mib']:.0f} MiB | {sinks} |")
out += ["", "## CPU per message (null sinks)", "",
        "The service's CPU (every thread, from `/proc`, steady state) per message, against what the work itself",
        "costs: `process` alone on one thread over as many messages of the same mix (`examples/process_cpu`, the",
        "service's allocator) plus a bare rdkafka consumer reading the same messages. With null sinks the service",
        "builds no rows or events, so neither does the work here; what building them would add is its own column",
        "(criterion's `process` includes it). The bare consumer runs just before the service; `process` runs",
        "just before it and again just after it, and the column is the mean of the two (the machine's speed",
        "drifts within minutes by more than the differences sought; the two are in brackets).", "",
        "| mix | threads | buffer | service µs/msg | process µs/msg (before, after) | rows + events µs/msg | bare consumer µs/msg | service / (process + bare) | kernel µs/msg | page faults/msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
def work_ratio(r):
    return r["steady_cpu_us_per_msg"] / (r["process_cpu_us_per_msg"] + r["bare_steady_cpu_us_per_msg"])
for r in runs:
    if r["sinks"] != "null":
        continue
    bare_us, work_us = r["bare_steady_cpu_us_per_msg"], r["process_cpu_us_per_msg"]
    before, after = r["process_cpu_us_before_after"]
    out.append(f"| {mix_of(r)} | {r['threads'] or 'all'} | {r['buffer_bytes'] >> 20} MiB | {r['steady_cpu_us_per_msg']:.1f} | {work_us:.1f} ({before:.1f}, {after:.1f}) | "
               f"{r['outputs_cpu_us_per_msg']:.1f} | {bare_us:.1f} | {work_ratio(r):.2f}× | {r['system_us_per_msg']:.1f} | {r['faults_per_msg']:.2f} |")
medians = []
for threads in (1, 2):
    ratios = sorted(work_ratio(r) for r in runs if r["sinks"] == "null" and mix_of(r) == "small" and r["threads"] == threads)
    if ratios:
        medians.append(f"{ratios[len(ratios) // 2]:.2f}× on {threads} thread{'s' if threads > 1 else ''} "
                       f"({', '.join(f'{x:.2f}' for x in ratios)})")
out += ["", "Small segments, service / work, median of the runs: " + "; ".join(medians) + "."]
out += ["", "Where the service's CPU goes (the whole run, µs per message, by thread; `process-N` are the",
        "processing threads, `kafka-poll` the polling thread, `replay-ingest` the pipeline's task, `rdk:*`",
        "librdkafka's, `tokio-rt-worker` the flushes):", "",
        "| mix | threads | buffer | by thread |", "|---|---:|---:|---|"]
for r in runs:
    if r["sinks"] == "null":
        out.append(f"| {mix_of(r)} | {r['threads'] or 'all'} | {r['buffer_bytes'] >> 20} MiB | " + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_us_by_thread"].items()) + " |")
out += ["", "## CPU per message (real sinks)", "",
        "The same measure with every real destination: blobs to the GCS emulator (one upload per message),",
        "rows to ClickHouse, events to Kafka. `tokio-rt-worker` threads are the async runtime's and the",
        "blocking pool's: the flushes, their sink clients and their I/O. `process` is the work alone on one",
        "thread, with the rows and events a flush builds; service µs/msg is the steady state, by thread the",
        "whole run.", "",
        "| mix | service µs/msg | process µs/msg | process share | kernel µs/msg | by thread |", "|---|---:|---:|---:|---:|---|"]
for r in runs:
    if r["sinks"] != "real":
        continue
    work_us = r["process_cpu_us_per_msg"]  # with the rows and events: the sinks are real
    out.append(f"| {mix_of(r)} | {r['steady_cpu_us_per_msg']:.1f} | {work_us:.1f} | {work_us / r['steady_cpu_us_per_msg']:.0%} | "
               f"{r['system_us_per_msg']:.1f} | " + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_us_by_thread"].items()) + " |")
out += ["", "![throughput and peak RSS](benchmarks.png)", ""]
docs = pathlib.Path("docs")
docs.mkdir(exist_ok=True)
(docs / "benchmarks.md").write_text("\n".join(out))

null = [r for r in runs if r["sinks"] == "null" and not r.get("fixtures")]
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for threads in sorted({r["threads"] for r in null}):
    xs = [r for r in null if r["threads"] == threads]
    left.plot([r["buffer_bytes"] >> 20 for r in xs], [r["msgs_per_s"] for r in xs], marker="o", label=f"{threads} thread(s)")
    right.plot([r["buffer_bytes"] >> 20 for r in xs], [r["peak_rss_mib"] for r in xs], marker="o", label=f"{threads} thread(s)")
right.plot([r["buffer_bytes"] >> 20 for r in null if r["threads"] == 2], [(r["buffer_bytes"] >> 20) + 128 for r in null if r["threads"] == 2],
           linestyle="--", color="grey", label="budget + 128 MiB")
left.set(title="pipeline throughput (null sink)", xlabel="--buffer-max-bytes (MiB)", ylabel="messages/s", xscale="log")
right.set(title="peak RSS", xlabel="--buffer-max-bytes (MiB)", ylabel="MiB", xscale="log")
left.legend(); right.legend()
fig.tight_layout()
fig.savefig(docs / "benchmarks.png", dpi=110)
print("\n".join(out))
PY
