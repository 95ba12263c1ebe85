#!/usr/bin/env bash
# End-to-end load run on the local broker: publishes COUNT messages of the recorded fixture mix,
# then measures (1) a bare rdkafka consumer reading them, (2) the work itself, `process` on one
# thread over as many messages of the same mix (examples/process_cpu), and (3) the service with the
# null sink processing them, from a backlog far larger than its buffer. Prints throughput, peak
# RSS, and the service's CPU per message against (1) + (2); (2) runs right before the service and
# right after it, and counts the rows and events a flush builds only when the sinks are real.
# The buffer age is 200 ms here: with the 5 s default the last partial buffer would wait out its
# age and dominate a short run.
# Usage: scripts/load.sh [COUNT] [BUFFER_MAX_BYTES]      (defaults 10000, 64 MiB)
#   LOAD_SINKS=real scripts/load.sh   GCS emulator + ClickHouse + event topics instead of the null sink
#   LOAD_SINKS=gcs|clickhouse|events  that one real destination, the others null (its ceiling:
#                                      scripts/sink-ceilings.sh)
#   REPLAY_INGEST_GCS_BACKEND=filesystem  the emulator on disk (see scripts/stack.sh)
#   LOAD_THREADS=N                     processing threads (default: one per CPU)
#   LOAD_JSON=FILE                     also append the results as one JSON line to FILE
#   LOAD_FIXTURES="fixtures/segments/console-*.msgpack" scripts/load.sh   picks the message mix
#   LOAD_BIN=FILE                      the service binary to measure (an A/B against another build)
#   LOAD_LOG=FILE                      keeps the service's log (RUST_LOG applies)
#   LOAD_STATSD=1                      sends metrics (to a UDP port nobody reads), as in production
#   LOAD_TRACE_ITEMS=SHARE             breadcrumbs as EAP trace items at that rollout (0.0 … 1.0), to
#                                      a topic of their own on the broker; the work counts them too
#   LOAD_BROKER_IDLE=1                 once the backlog is produced, the broker runs as SCHED_IDLE: it
#                                      gets only the CPU what is measured leaves, as on a node of its
#                                      own (the bare consumer and the work are measured so too)
#   LOAD_PERF=FILE                     records the whole machine during the service's run (`perf record -a -g`)
#                                      (`perf report -i FILE`); LOAD_PERF_STAT=1 prints its
#                                      context switches, wake-ups and task clock instead;
#                                      LOAD_PERF_EVENTS="-e sched:sched_switch" records those events
#                                      with their stacks instead of CPU samples (who sleeps on what)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-10000}
BUFFER=${2:-67108864}

# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh load
pid=""
# The service too, when the measurement stops half way (a stall): left running, it and perf
# would outlive the stack.
trap 'isolated_stack_down $? "$pid"' EXIT
scripts/setup.sh stack >/dev/null
scripts/stack.sh up >/dev/null
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
cargo build --locked --release --quiet --bin replay-ingest --example bare_consume --example produce --example topics --example process_cpu
bin=${LOAD_BIN:-${CARGO_TARGET_DIR:-target}/release/replay-ingest}
topic=load-$RANDOM$RANDOM
topics=${CARGO_TARGET_DIR:-target}/release/examples/topics
"$topics" --brokers "$REPLAY_INGEST_TEST_BROKERS" "$topic:4:ingest-replay-recordings" "$topic-dlq:1"
if [ -n "${LOAD_TRACE_ITEMS:-}" ]; then
  "$topics" --brokers "$REPLAY_INGEST_TEST_BROKERS" "$topic-items:1:snuba-items"
  # Read by the service and by the work (examples/process_cpu) alike.
  export REPLAY_INGEST_TRACE_ITEMS_ROLLOUT=$LOAD_TRACE_ITEMS REPLAY_INGEST_TRACE_ITEMS_TOPIC=$topic-items
fi

echo "producing $COUNT messages (${LOAD_FIXTURES:-recorded fixture mix}) to $topic"
# shellcheck disable=SC2086
produced=$("${CARGO_TARGET_DIR:-target}"/release/examples/produce --brokers "$REPLAY_INGEST_TEST_BROKERS" --topic "$topic" --count "$COUNT" ${LOAD_FIXTURES:-fixtures/segments/*.msgpack})
if [ -n "${LOAD_BROKER_IDLE:-}" ]; then
  chrt --all-tasks --idle --pid 0 "$(cat "$REPLAY_INGEST_STACK_DIR/kafka.pid")"
fi
bare=$("${CARGO_TARGET_DIR:-target}"/release/examples/bare_consume "$REPLAY_INGEST_TEST_BROKERS" "$topic" "$COUNT")
# The work itself on one thread, the same mix and count, right before the service's run and again
# right after it: the machine's speed drifts within minutes, and the mean of the two cancels a steady
# drift (both are printed, so a jump shows). It times `process` alone and `process` with the rows and
# events a flush builds, interleaved.
# shellcheck disable=SC2206
work_command=("${CARGO_TARGET_DIR:-target}"/release/examples/process_cpu "$COUNT" ${LOAD_FIXTURES:-fixtures/segments/*.msgpack})
work=$("${work_command[@]}")

port=$(free_port)
# One real destination at a time (gcs, clickhouse, events: the others null) or all of them (real).
real=${LOAD_SINKS:-null}
[ "$real" = real ] && real="gcs clickhouse events"
blob=(--blob-sink null) rows=(--rows-sink null) events=(--events-sink null)
for sink in $real; do
  case $sink in
    null) ;;
    gcs)
      python3 -c "import urllib.request as u; u.urlopen(u.Request('$REPLAY_INGEST_TEST_GCS_ENDPOINT/storage/v1/b?project=load', data=b'{\"name\":\"$topic\"}', headers={'content-type': 'application/json'}))"
      blob=(--blob-sink gcs --gcs-bucket "$topic" --gcs-endpoint "$REPLAY_INGEST_TEST_GCS_ENDPOINT" --gcs-anonymous) ;;
    clickhouse)
      rows=(--rows-sink clickhouse --clickhouse-url "$REPLAY_INGEST_TEST_CLICKHOUSE_URL" --clickhouse-table "load_${topic//-/_}" --migrate-on-start) ;;
    events)
      "$topics" --brokers "$REPLAY_INGEST_TEST_BROKERS" "$topic-outcomes:1:outcomes-billing" "$topic-analytics:1" "$topic-issues:1:ingest-occurrences"
      events=(--events-sink kafka --outcomes-topic "$topic-outcomes" --analytics-topic "$topic-analytics" --issues-topic "$topic-issues") ;;
    *) echo "LOAD_SINKS is null, real, gcs, clickhouse or events, not $sink" >&2; exit 2 ;;
  esac
done
sinks=("${blob[@]}" "${rows[@]}" "${events[@]}")
statsd=""
[ -n "${LOAD_STATSD:-}" ] && statsd=127.0.0.1:$(free_port)
"$bin" consume --brokers "$REPLAY_INGEST_TEST_BROKERS" --topic "$topic" --dlq-topic "$topic-dlq" \
  --group-id "load-$RANDOM" "${sinks[@]}" --statsd-address "$statsd" --http-listen "127.0.0.1:$port" \
  --processing-threads "${LOAD_THREADS:-0}" \
  --buffer-max-bytes "$BUFFER" --session-timeout-ms 6000 --drain-deadline-ms 5000 \
  --buffer-max-age-ms 200 \
  2>"${LOAD_LOG:-/dev/null}" &
pid=$!
# perf attaches to the threads that exist, so it starts once the service serves its status (the
# pools are up by then).
if [ -n "${LOAD_PERF:-}${LOAD_PERF_STAT:-}" ]; then
  started=$SECONDS
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "load: the service exited before serving its status" >&2; exit 1; }
    [ $((SECONDS - started)) -lt 120 ] || { echo "load: the service did not serve its status within 120 s" >&2; exit 1; }
    sleep 0.05
  done
  if [ -n "${LOAD_PERF:-}" ]; then
    perf record -q -a ${LOAD_PERF_EVENTS:--F 999} -g -o "$LOAD_PERF" -- sh -c "while kill -0 $pid 2>/dev/null; do sleep 0.2; done" 2>/dev/null &
  else
    perf stat -e task-clock,context-switches,cpu-migrations,sched:sched_wakeup -p "$pid" 2>&1 | sed 's/^/perf: /' &
  fi
fi
python3 - "$port" "$pid" "$COUNT" "$produced" "$bare" "$BUFFER" "${LOAD_SINKS:-null}" "${LOAD_THREADS:-0}" "${LOAD_JSON:-}" "$work" "${work_command[@]}" <<'PY'
import json, subprocess, sys, time, urllib.request
port, pid, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
produced, bare, buffer = json.loads(sys.argv[4]), json.loads(sys.argv[5]), int(sys.argv[6])
def status():
    try:
        return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
    except Exception:
        return None
def cpu_seconds():
    """User + system CPU of the service so far (all threads), from /proc/PID/stat."""
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
def hwm():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import os
start, deadline, samples = None, time.monotonic() + 900, []
while True:
    if not os.path.exists(f"/proc/{pid}") or time.monotonic() > deadline:
        sys.exit("the service exited or stalled before processing the backlog (see its flags above)")
    s = status()
    if s and s["consumed"] > 0 and start is None:
        start, cpu_start = time.monotonic(), cpu_seconds()
    if s and start is not None:
        samples.append((time.monotonic(), s["flushed"], cpu_seconds()))
    if s and s["flushed"] >= count:
        break
    time.sleep(0.05)
seconds = time.monotonic() - start
cpu_us = (cpu_seconds() - cpu_start) / count * 1e6
bare_cpu_us = bare["cpu_seconds"] / bare["messages"] * 1e6
# Steady state: from the first sample with 10 % of the messages flushed to the first with 90 %,
# without the fetch ramp-up and the tail (the last buffer waits out its age); the bare consumer
# is measured the same way.
(t1, f1, c1) = next(x for x in samples if x[1] >= count / 10)
(t2, f2, c2) = next(x for x in samples if x[1] >= count * 9 / 10)
steady_rate = (f2 - f1) / (t2 - t1) if t2 > t1 else count / seconds
steady_cpu_us = (c2 - c1) / (f2 - f1) * 1e6 if f2 > f1 else cpu_us
bare_steady_rate = bare["steady_messages"] / bare["steady_seconds"]
bare_steady_cpu_us = bare["steady_cpu_seconds"] / bare["steady_messages"] * 1e6
mb = produced["bytes"] / 1e6
bare_rate = bare["messages"] / bare["seconds"]
rate = count / seconds
print(f"{'':28} {'msgs/s':>10} {'MB/s':>8}")
print(f"{'bare rdkafka consumer':28} {bare_rate:>10.0f} {bare['bytes'] / 1e6 / bare['seconds']:>8.1f}")
print(f"{'pipeline, ' + sys.argv[7] + ' sinks':28} {rate:>10.0f} {mb / seconds:>8.1f}   ({rate / bare_rate:.2f}x bare)")
final = status() or s
print("time per sink (s, summed over flushes): " + ", ".join(f"{k} {v['seconds']:.2f}" for k, v in sorted(final["sinks"].items())))
print("written per second of its own time: " + ", ".join(f"{k} {v['items'] / v['seconds']:.0f}" for k, v in sorted(final["sinks"].items()) if v["seconds"] > 0))
print(f"backpressure pauses: {final['pauses']}")
print(f"CPU per message: service {cpu_us:.1f} µs, bare consumer {bare_cpu_us:.1f} µs")
# Where the CPU went, by thread (pool threads grouped by name without their number): the
# whole run, startup included, per message.
threads, kernel, switches, faulted = {}, {}, {}, {}
for task in os.listdir(f"/proc/{pid}/task"):
    try:
        stat = open(f"/proc/{pid}/task/{task}/stat").read()
    except OSError:
        continue
    name = stat[stat.find("(") + 1:stat.rfind(")")].rstrip("0123456789").rstrip("-#") or "?"
    fields = stat[stat.rfind(")") + 2:].split()
    user, sys_ = (int(fields[i]) / os.sysconf("SC_CLK_TCK") for i in (11, 12))
    threads[name] = threads.get(name, 0) + user + sys_
    kernel[name] = kernel.get(name, 0) + sys_
    faulted[name] = faulted.get(name, 0) + int(fields[7])
    for line in open(f"/proc/{pid}/task/{task}/status"):
        if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
            k = name + (" sleeps" if line.startswith("vol") else " preempted")
            switches[k] = switches.get(k, 0) + int(line.split()[1])
# The work again, now that the service is idle (and its threads' CPU has been read).
work_after = json.loads(subprocess.run(sys.argv[11:], check=True, capture_output=True, text=True).stdout)
# With null sinks the service builds no rows or events: its work is `process` alone. Real sinks
# build them in the flush.
side = "process_us" if sys.argv[7] == "null" else "with_outputs_us"
works = (json.loads(sys.argv[10]), work_after)
works_us = [w[side] for w in works]
work_us = sum(works_us) / 2
outputs_us = sum(w["with_outputs_us"] - w["process_us"] for w in works) / 2
print(f"the work: process {work_us:.1f} µs per message on one thread ({works_us[0]:.1f} before the service, {works_us[1]:.1f} after; "
      f"{'rows and events not built, as null sinks do not: they would add' if side == 'process_us' else 'with rows and events, of which'} {outputs_us:.1f} µs) "
      f"+ bare consumer {bare_steady_cpu_us:.1f} µs; service (steady) / work = {steady_cpu_us / (work_us + bare_steady_cpu_us):.2f}x")
print(f"steady state (10–90 %): pipeline {steady_rate:.0f} msgs/s, bare consumer {bare_steady_rate:.0f} msgs/s "
      f"({steady_rate / bare_steady_rate:.2f}x); CPU per message: service {steady_cpu_us:.1f} µs, bare {bare_steady_cpu_us:.1f} µs")
by_thread = {k: v / count * 1e6 for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0}
print("CPU per message by thread (µs): " + ", ".join(f"{k} {v:.1f}" for k, v in by_thread.items()))
system, faults = sum(kernel.values()), sum(faulted.values())
print("context switches per message: " + ", ".join(f"{k} {v / count:.3f}" for k, v in sorted(switches.items(), key=lambda kv: -kv[1]) if v > count / 1000))
print(f"of which in the kernel: {system / count * 1e6:.1f} µs (" + ", ".join(f"{k} {v / count * 1e6:.1f}" for k, v in sorted(kernel.items(), key=lambda kv: -kv[1]) if v > 0) + f"); page faults per message: {faults / count:.2f} ("
      + ", ".join(f"{k} {v / count:.2f}" for k, v in sorted(faulted.items(), key=lambda kv: -kv[1]) if v > count / 100) + ")")
peak = hwm()
print(f"peak RSS {peak / 2**20:.0f} MiB with --buffer-max-bytes {buffer / 2**20:.0f} MiB and a {mb:.0f} MB backlog")
if sys.argv[9]:
    with open(sys.argv[9], "a") as out:
        out.write(json.dumps({
            "sinks": sys.argv[7], "threads": int(sys.argv[8]), "buffer_bytes": buffer, "messages": count,
            "backlog_mb": mb, "msgs_per_s": rate, "mb_per_s": mb / seconds,
            "bare_msgs_per_s": bare_rate, "bare_mb_per_s": bare["bytes"] / 1e6 / bare["seconds"],
            "peak_rss_mib": peak / 2**20, "cpu_us_per_msg": cpu_us, "bare_cpu_us_per_msg": bare_cpu_us,
            "steady_msgs_per_s": steady_rate, "bare_steady_msgs_per_s": bare_steady_rate,
            "steady_cpu_us_per_msg": steady_cpu_us, "process_cpu_us_per_msg": work_us, "process_cpu_us_before_after": works_us, "outputs_cpu_us_per_msg": outputs_us, "bare_steady_cpu_us_per_msg": bare_steady_cpu_us,
            "fixtures": os.environ.get("LOAD_FIXTURES", ""), "broker_idle": bool(os.environ.get("LOAD_BROKER_IDLE")), "pauses": final["pauses"], "cpu_us_by_thread": by_thread, "system_us_per_msg": system / count * 1e6, "faults_per_msg": faults / count, "sink_seconds": {k: v["seconds"] for k, v in final["sinks"].items()},
            "sink_items": {k: v["items"] for k, v in final["sinks"].items()},
            "sink_writes": {k: v["writes"] for k, v in final["sinks"].items()},
        }) + "\n")
PY
kill -TERM "$pid"
wait "$pid"
pid=""
wait
