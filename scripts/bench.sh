#!/usr/bin/env bash
# Benchmark report: runs the criterion benchmark of the per-message core, the Python baseline,
# and end-to-end load runs through the local broker (null sink at several buffer sizes and
# thread counts, and real sinks), then writes docs/benchmarks.md with tables and
# docs/benchmarks.png (throughput vs buffer size and threads, peak RSS).
# Usage: scripts/bench.sh [COUNT]     (messages per load run, default 3000)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-3000}
CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
results=$(mktemp)
trap 'rm -f "$results"' EXIT

echo "== criterion: cargo bench --bench process"
cargo bench --locked --bench process >/dev/null 2>&1

echo "== Python baseline"
venv=$CACHE/bench-venv
if ! "$venv/bin/python" -c 'import msgpack, matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check msgpack==1.1.0 matplotlib==3.10.7
fi
python_line=$("$venv/bin/python" benches/python_baseline.py)

for threads in 1 2; do
  for buffer in 33554432 67108864 268435456; do
    echo "== load: null sink, $threads thread(s), buffer $((buffer >> 20)) MiB"
    LOAD_THREADS=$threads LOAD_JSON=$results bash scripts/load.sh "$COUNT" "$buffer" >/dev/null
  done
done
echo "== load: real sinks"
LOAD_SINKS=real LOAD_JSON=$results bash scripts/load.sh "$COUNT" 67108864 >/dev/null

"$venv/bin/python" - "$results" "$python_line" "${CARGO_TARGET_DIR:-target}/criterion" <<'PY'
import json, pathlib, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

runs = [json.loads(l) for l in open(sys.argv[1])]
python_mib = float(sys.argv[2].split(":")[1].split()[0])
criterion = pathlib.Path(sys.argv[3]) / "fixture_mix"
bench = {}
for name in ["inflate_only", "process", "inflate_sonic_value", "inflate_serde_json_value"]:
    estimates = json.loads((criterion / name / "new" / "estimates.json").read_text())
    info = json.loads((criterion / name / "new" / "benchmark.json").read_text())
    bench[name] = info["throughput"]["Bytes"] / (estimates["mean"]["point_estimate"] / 1e9) / 2**20

out = ["# Benchmarks", "", "Made by `scripts/bench.sh` on a 2-core machine; the broker, ClickHouse and the GCS",
       "emulator run on the same cores.", "", "## Per message (one core, recorded fixture mix)", "",
       "| path | MiB/s of decompressed JSON | vs. inflate |", "|---|---:|---:|"]
labels = {"inflate_only": "inflate only (zlib-rs)", "process": "**recording::process** (whole per-message function)",
          "inflate_sonic_value": "inflate + sonic-rs DOM", "inflate_serde_json_value": "inflate + serde_json::Value"}
for name, label in labels.items():
    out.append(f"| {label} | {bench[name]:.0f} | {bench[name] / bench['inflate_only']:.2f}× |")
out.append(f"| Python: msgpack + zlib + json.loads + classification | {python_mib:.1f} | {python_mib / bench['inflate_only']:.2f}× |")
out += ["", f"`process` is {bench['process'] / python_mib:.0f}× the Python path.", "",
        "## Through the broker", "", "| sinks | threads | buffer budget | msgs/s | MB/s | bare consumer msgs/s | ratio | peak RSS | time per sink (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
for r in runs:
    sinks = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["sink_seconds"].items())) or "—"
    out.append(f"| {r['sinks']} | {r['threads'] or 'all'} | {r['buffer_bytes'] >> 20} MiB | {r['msgs_per_s']:.0f} | {r['mb_per_s']:.1f} | "
               f"{r['bare_msgs_per_s']:.0f} | {r['msgs_per_s'] / r['bare_msgs_per_s']:.2f}× | {r['peak_rss_mib']:.0f} MiB | {sinks} |")
out += ["", "![throughput and peak RSS](benchmarks.png)", ""]
docs = pathlib.Path("docs")
docs.mkdir(exist_ok=True)
(docs / "benchmarks.md").write_text("\n".join(out))

null = [r for r in runs if r["sinks"] == "null"]
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
