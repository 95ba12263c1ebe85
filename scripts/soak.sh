#!/usr/bin/env bash
# A long run on a plot: the service with every real sink (GCS emulator, ClickHouse, Kafka events)
# through alternating load and idle phases, sampled every few seconds — RSS, CPU, threads, file
# descriptors, consumer lag and commit rate — then drawn (docs/soak.png) and summed up
# (docs/soak.md): RSS and descriptors after warm-up, growth per message, lag at the end of each
# idle phase.
# Usage: scripts/soak.sh [MINUTES]      (default 60)
#   SOAK_RATE=N      messages/s during a load phase (default 100)
#   SOAK_FIXTURES="…" the message mix (default: the recorded segments under 64 KiB: real SDK
#                    traffic is mostly small segments, 78 of 80 in a recorded corpus)
# The emulator runs on its filesystem backend (its memory backend slows down as it fills).
#   SOAK_LOAD_S=N    seconds of each load phase (default 120)
#   SOAK_IDLE_S=N    seconds of each idle phase (default 60)
#   SOAK_SAMPLE_S=N  seconds between samples (default 5)
#   SOAK_OUT=DIR     where soak.md, soak.csv and soak.png go: docs/ for the one-hour run the docs
#                    show (its hand-written sections after the table are kept), a fresh directory
#                    under /tmp for any other length
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-60}
if [ -n "${SOAK_OUT:-}" ]; then
  out=$SOAK_OUT
elif [ "$MINUTES" = 60 ]; then
  out=docs
else
  out=$(mktemp -d "/tmp/replay-ingest-soak-${MINUTES}min.XXXXXX")
fi
mkdir -p "$out"
echo "soak: results go to $out/"
CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}

# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh soak
export REPLAY_INGEST_GCS_BACKEND=filesystem
pid=""
trap 'isolated_stack_down $? "$pid"' EXIT
scripts/setup.sh stack >/dev/null
scripts/stack.sh up >/dev/null
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
venv=$CACHE/bench-venv
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: -c scripts/python-constraints.txt matplotlib
fi
cargo build --locked --release --quiet --bin replay-ingest --example produce --example topics
# Copies of the binaries, so that a rebuild during the run does not change what runs.
release=$REPLAY_INGEST_STACK_DIR/bin
mkdir -p "$release/examples"
for bin in replay-ingest examples/produce examples/topics; do cp "${CARGO_TARGET_DIR:-target}/release/$bin" "$release/$bin"; done
topic=soak-$RANDOM$RANDOM
"$release/examples/topics" --brokers "$REPLAY_INGEST_TEST_BROKERS" "$topic:4:ingest-replay-recordings" "$topic-dlq:1" \
  "$topic-outcomes:1:outcomes-billing" "$topic-analytics:1" "$topic-issues:1:ingest-occurrences"
python3 -c "import urllib.request as u; u.urlopen(u.Request('$REPLAY_INGEST_TEST_GCS_ENDPOINT/storage/v1/b?project=soak', data=b'{\"name\":\"$topic\"}', headers={'content-type': 'application/json'}))"

port=$(free_port)
statsd=$(free_port)
"$release/replay-ingest" consume --brokers "$REPLAY_INGEST_TEST_BROKERS" --topic "$topic" --dlq-topic "$topic-dlq" \
  --group-id "$topic" --http-listen "127.0.0.1:$port" --statsd-address "127.0.0.1:$statsd" \
  --blob-sink gcs --gcs-bucket "$topic" --gcs-endpoint "$REPLAY_INGEST_TEST_GCS_ENDPOINT" --gcs-anonymous \
  --rows-sink clickhouse --clickhouse-url "$REPLAY_INGEST_TEST_CLICKHOUSE_URL" --clickhouse-table "soak_${topic//-/_}" \
  --migrate-on-start --events-sink kafka --outcomes-topic "$topic-outcomes" --analytics-topic "$topic-analytics" \
  --issues-topic "$topic-issues" 2>"$REPLAY_INGEST_STACK_DIR/service.log" &
pid=$!

"$venv/bin/python" - "$pid" "$port" "$statsd" "$MINUTES" "$topic" "$release/examples/produce" "$out" <<'PY'
import json, os, pathlib, re, socket, subprocess, sys, time, urllib.request
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

pid, port, statsd_port, minutes, topic, produce, out = sys.argv[1:8]
rate = int(os.environ.get("SOAK_RATE", 100))
load_s, idle_s = int(os.environ.get("SOAK_LOAD_S", 120)), int(os.environ.get("SOAK_IDLE_S", 60))
sample_s = float(os.environ.get("SOAK_SAMPLE_S", 5))
duration = float(minutes) * 60
fixtures = os.environ.get("SOAK_FIXTURES", "").split() or sorted(
    str(p) for p in pathlib.Path("fixtures/segments").glob("*.msgpack") if p.stat().st_size < 64 * 1024)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", int(statsd_port)))
udp.setblocking(False)
tick = os.sysconf("SC_CLK_TCK")

def status():
    try:
        return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
    except Exception:
        return None

def proc():
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rfind(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / tick
    info = {l.split(":")[0]: l.split(":")[1].strip() for l in open(f"/proc/{pid}/status")}
    return cpu, int(info["VmRSS"].split()[0]) / 1024, int(info["Threads"]), len(os.listdir(f"/proc/{pid}/fd"))

lag, commits = {}, 0.0
def drain():
    global commits
    while True:
        try:
            data = udp.recv(65536).decode()
        except BlockingIOError:
            return
        for line in data.splitlines():
            m = re.match(r"replay_ingest\.consumer\.lag:([0-9.e+-]+)\|g.*partition:(\d+)", line)
            if m:
                lag[m.group(2)] = float(m.group(1))
            m = re.match(r"replay_ingest\.commits:([0-9.e+-]+)\|c", line)
            if m:
                commits += float(m.group(1))

# Waits for the member to be ready and to own its partitions.
deadline = time.monotonic() + 120
while not ((s := status()) and s["ready"] and s["assigned"]):
    if time.monotonic() > deadline:
        sys.exit("the service did not become ready")
    time.sleep(0.5)

start = time.monotonic()
rows, producers, phase, phase_end, phases = [], [], "idle", start, []
cpu0, _, _, _ = proc()
last = (start, cpu0, 0.0)
while time.monotonic() - start < duration:
    now = time.monotonic()
    if now >= phase_end:
        if phase == "idle":
            phase, phase_end = "load", now + load_s
            # Its errors reach the soak's own output; its exit status is checked at the end.
            producers.append(subprocess.Popen([produce, "--brokers", os.environ["REPLAY_INGEST_TEST_BROKERS"], "--topic", topic,
                                               "--rate", str(rate), "--count", str(rate * load_s), *fixtures],
                                              stdout=subprocess.DEVNULL))
        else:
            phase, phase_end = "idle", now + idle_s
        phases.append((now - start, phase))
    drain()
    cpu, rss, threads, fds = proc()
    s = status() or {}
    t = now - start
    rows.append({"t": t, "phase": phase, "rss_mib": rss, "cpu_pct": (cpu - last[1]) / max(now - last[0], 1e-9) * 100,
                 "threads": threads, "fds": fds, "lag": sum(lag.values()), "commits_per_s": (commits - last[2]) / max(now - last[0], 1e-9),
                 "consumed": s.get("consumed", 0), "flushed": s.get("flushed", 0)})
    last = (now, cpu, commits)
    time.sleep(sample_s)
# A soak whose load never came would plot flat lines and zero lag: a failed producer, or fewer
# messages consumed than were produced, fails it.
failed = [p.returncode for p in producers if p.wait() != 0]
if failed:
    sys.exit(f"soak: {len(failed)} of {len(producers)} load phases failed to produce (exit {failed})")
produced = rate * load_s * len(producers)
# (The last phase may have been cut by the end of the run: its tail is waited for.)
deadline = time.monotonic() + 120
while (consumed := (status() or {}).get("consumed", 0)) < produced and time.monotonic() < deadline:
    time.sleep(1)
if consumed < produced:
    sys.exit(f"soak: {consumed} messages consumed of {produced} produced")

docs = pathlib.Path(out)
with open(docs / "soak.csv", "w") as out:
    out.write(",".join(rows[0]) + "\n")
    for r in rows:
        out.write(",".join(str(round(v, 3)) if isinstance(v, float) else str(v) for v in r.values()) + "\n")
fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
ts = [r["t"] / 60 for r in rows]
for (t0, p), (t1, _) in zip(phases, phases[1:] + [(duration, None)]):
    if p == "load":
        for ax in axes:
            ax.axvspan(t0 / 60, t1 / 60, color="0.92")
axes[0].plot(ts, [r["rss_mib"] for r in rows], label="RSS (MiB)")
axes[0].plot(ts, [r["fds"] for r in rows], label="file descriptors")
axes[1].plot(ts, [r["cpu_pct"] for r in rows], label="CPU (% of a core)")
axes[1].plot(ts, [r["threads"] for r in rows], label="threads")
axes[2].plot(ts, [r["lag"] for r in rows], label="consumer lag (messages)")
axes[3].plot(ts, [r["commits_per_s"] for r in rows], label="commits/s")
for ax in axes:
    ax.legend(loc="upper right")
axes[3].set_xlabel("minutes (grey: load phases)")
fig.suptitle(f"soak: {minutes} min, {rate} msg/s for {load_s} s then {idle_s} s idle, every real sink")
fig.tight_layout()
fig.savefig(docs / "soak.png", dpi=100)

warm = [r for r in rows if r["t"] >= min(600, duration / 6)] or rows
def spread(key):
    values = [r[key] for r in warm]
    mid = (max(values) + min(values)) / 2
    return min(values), max(values), (max(values) - min(values)) / 2 / mid * 100 if mid else 0.0
n = len(warm)
mean_x = sum(r["consumed"] for r in warm) / n
mean_y = sum(r["rss_mib"] for r in warm) / n
var = sum((r["consumed"] - mean_x) ** 2 for r in warm) or 1
slope = sum((r["consumed"] - mean_x) * (r["rss_mib"] - mean_y) for r in warm) / var * 2**20
idle_ends = [prev["lag"] for prev, r in zip(rows, rows[1:]) if prev["phase"] == "idle" and r["phase"] == "load"]
idle_rss = [prev["rss_mib"] for prev, r in zip(rows, rows[1:]) if prev["phase"] == "idle" and r["phase"] == "load"]
rss, fds, threads = spread("rss_mib"), spread("fds"), spread("threads")
lines = ["# Soak", "", "Made by `scripts/soak.sh`: the service with every real sink (GCS emulator, ClickHouse, Kafka events)",
         f"for {minutes} minutes, {rate} messages/s of {len(fixtures)} recorded segments for {load_s} s then {idle_s} s idle, sampled",
         f"every {sample_s:g} s; the warm-up is the first {min(600, duration / 6) / 60:.0f} minutes. Raw samples: `soak.csv`.", "",
         "| | after warm-up |", "|---|---|",
         f"| messages consumed (whole run) | {rows[-1]['consumed']} |",
         f"| RSS | {rss[0]:.0f}–{rss[1]:.0f} MiB (±{rss[2]:.1f} %) |",
         f"| file descriptors | {fds[0]:.0f}–{fds[1]:.0f} (±{fds[2]:.1f} %) |",
         f"| threads | {threads[0]:.0f}–{threads[1]:.0f} |",
         f"| RSS growth per message (least squares) | {slope:.1f} bytes |",
         f"| consumer lag at the end of each idle phase | {', '.join(f'{v:.0f}' for v in idle_ends) or '—'} |",
         f"| RSS at the end of each idle phase (MiB) | {', '.join(f'{v:.1f}' for v in idle_rss) or '—'} |",
         "", "![soak](soak.png)", ""]
# What was written by hand after the table (from its first section on) stays.
previous = (docs / "soak.md").read_text() if (docs / "soak.md").exists() else ""
kept = previous[previous.index("\n## ") + 1:] if "\n## " in previous else ""
(docs / "soak.md").write_text("\n".join(lines) + ("\n" + kept if kept else ""))
print("\n".join(lines))
PY
# The service drains and exits 0, as a pod does at a rollout (one that died earlier fails here).
kill -TERM "$pid" 2>/dev/null || true
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 0 ] || { echo "soak: the service exited $status when asked to stop (its log: $REPLAY_INGEST_STACK_DIR/service.log)" >&2; exit 1; }
