#!/usr/bin/env bash
# Measures how long rebalances stop consumption for the classic protocol's eager `range` and
# `cooperative-sticky` assignors and for the consumer group protocol (KIP-848,
# `group.protocol=consumer`), with two members under a steady load on the local Apache Kafka:
# member A runs alone, B joins (rebalance 1), then A leaves on SIGTERM (rebalance 2). Each
# member's `/status` is sampled every 20 ms; a pause is the longest time, in the 12 s after a
# rebalance began, that the member which stays (A on the join, B on the leave) consumed nothing
# under the steady load. An observer in
# a group of its own reads the same topic: its pauses are the broker's and the load's, not the
# group protocol's.
# Usage: scripts/rebalance-pause.sh [RATE] [STRATEGY...]
#   RATE       messages per second produced, default 400
#   STRATEGY   range, cooperative-sticky or consumer; default all three
#   REBALANCE_JSON=FILE   also append the results as JSON lines to FILE
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-400}
shift || true
STRATEGIES=("$@")
[ ${#STRATEGIES[@]} -gt 0 ] || STRATEGIES=(range cooperative-sticky consumer)

# shellcheck source=scripts/lib/isolated-stack.sh
source scripts/lib/isolated-stack.sh rebalance
trap 'isolated_stack_down $?' EXIT
scripts/setup.sh stack >/dev/null
scripts/stack.sh up >/dev/null
# shellcheck disable=SC1091
source "$REPLAY_INGEST_STACK_DIR/stack.env"
cargo build --locked --release --quiet --bin replay-ingest --example produce --example topics
export REBALANCE_BIN=${CARGO_TARGET_DIR:-target}/release/replay-ingest
export REBALANCE_PRODUCE=${CARGO_TARGET_DIR:-target}/release/examples/produce

for strategy in "${STRATEGIES[@]}"; do
  topic=rebalance-$strategy-$RANDOM$RANDOM
  "${CARGO_TARGET_DIR:-target}"/release/examples/topics --brokers "$REPLAY_INGEST_TEST_BROKERS" \
    "$topic:8:ingest-replay-recordings" "$topic-dlq:1"
  # The members' status ports, from the range below the ephemeral ports (lib/isolated-stack.sh);
  # a statement of its own, so that its failure stops the script.
  ports=$(free_ports 3)
  REBALANCE_PORTS=$ports python3 - "$strategy" "$topic" "$RATE" <<'PY'
import atexit, json, os, signal, subprocess, sys, threading, time, urllib.request, glob

strategy, topic, rate = sys.argv[1], sys.argv[2], int(sys.argv[3])
brokers = os.environ["REPLAY_INGEST_TEST_BROKERS"]
small = sorted(f for f in glob.glob("fixtures/segments/*.msgpack") if os.path.getsize(f) < 100_000)

ports = [int(p) for p in os.environ["REBALANCE_PORTS"].split()]

# The consumer protocol's assignor and timing are the broker's (group.consumer.* in
# scripts/stack.sh); librdkafka refuses partition.assignment.strategy alongside it.
protocol = (["--kafka-property", "group.protocol=consumer"] if strategy == "consumer"
            else ["--kafka-property", f"partition.assignment.strategy={strategy}"])

# Whatever this script started is stopped when it ends, also half way through (an exception).
children = []
atexit.register(lambda: [p.kill() for p in children if p.poll() is None])

def member(name, group=topic):
    port = ports.pop()
    args = [os.environ["REBALANCE_BIN"], "consume", "--brokers", brokers, "--topic", topic,
            "--dlq-topic", topic + "-dlq", "--group-id", group, "--http-listen", f"127.0.0.1:{port}",
            "--blob-sink", "null", "--rows-sink", "null", "--events-sink", "null", "--statsd-address", "",
            "--session-timeout-ms", "6000", "--drain-deadline-ms", "5000", "--buffer-max-age-ms", "500",
            *protocol]
    log = open(f"{os.environ['REPLAY_INGEST_STACK_DIR']}/{name}-{strategy}.log", "w")
    children.append(subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL))
    return children[-1], port

samples = {"A": [], "B": [], "observer": []}
stop = threading.Event()

def sample(name, port):
    while not stop.is_set():
        try:
            status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1))
            samples[name].append((time.monotonic(), status["consumed"], len(status["partitions"])))
        except Exception:
            pass
        time.sleep(0.02)

def produce():
    # One producer, `rate` a second in steps of 20 ms: a steady stream for the whole run.
    children.append(subprocess.Popen([os.environ["REBALANCE_PRODUCE"], "--brokers", brokers, "--topic", topic,
                                      "--count", str(rate * 60), "--rate", str(rate), *small],
                                     stdout=subprocess.DEVNULL))
    return children[-1]

a, a_port = member("A")
threading.Thread(target=sample, args=("A", a_port), daemon=True).start()
observer, observer_port = member("observer", topic + "-observer")
threading.Thread(target=sample, args=("observer", observer_port), daemon=True).start()
producer = produce()
time.sleep(10)
b, b_port = member("B")
threading.Thread(target=sample, args=("B", b_port), daemon=True).start()
joined = time.monotonic()
time.sleep(15)
a.send_signal(signal.SIGTERM)
left = time.monotonic()
time.sleep(15)
stop.set()
producer.terminate()
b.send_signal(signal.SIGTERM)
observer.send_signal(signal.SIGTERM)
producer.wait()
# A member that did not start, or did not drain cleanly, would show as no pause at all.
exits = {name: p.wait(timeout=60) for name, p in [("A", a), ("B", b), ("observer", observer)]}
if any(exits.values()):
    sys.exit(f"rebalance-pause: a member exited non-zero {exits} (logs in {os.environ['REPLAY_INGEST_STACK_DIR']})")

def longest_stall(series, start, end):
    """Longest time without a new consumed message between start and end."""
    points = [(t, c, p) for t, c, p in series if start <= t <= end]
    if len(points) < 2:
        sys.exit(f"rebalance-pause: fewer than two status samples in a {end - start:.0f} s window: no pause can be measured")
    longest, since, last = 0.0, None, None
    for t, consumed, partitions in points:
        if last is None or consumed > last:
            if since is not None:
                longest = max(longest, t - since)
            since, last = t, consumed
    if since is not None and points:
        longest = max(longest, points[-1][0] - since)
    return longest

def drains(name):
    """Revoke drains in a member's log, and the longest (revoke logged → drained logged)."""
    import re
    lines = open(f"{os.environ['REPLAY_INGEST_STACK_DIR']}/{name}-{strategy}.log").read().splitlines()
    stamp = lambda l: time.mktime(time.strptime(l[:19], "%Y-%m-%dT%H:%M:%S")) + float("0." + l[20:26])
    clean = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines]
    revokes = [stamp(l) for l in clean if "partitions revoked: draining" in l]
    drained = [stamp(l) for l in clean if "drained pending" in l]
    longest = max((min((d for d in drained if d >= r), default=r) - r for r in revokes), default=0.0)
    return len(revokes), round(longest, 3)

join_pause = longest_stall(samples["A"], joined, joined + 12)
leave_pause = longest_stall(samples["B"], left, left + 12)
observer_pause = max(longest_stall(samples["observer"], joined, joined + 12),
                     longest_stall(samples["observer"], left, left + 12))
total = lambda s: s[-1][1] if s else 0
(a_drains, a_longest), (b_drains, b_longest) = drains("A"), drains("B")
result = {"strategy": strategy, "rate": rate, "join_pause_s": round(join_pause, 2),
          "leave_pause_s": round(leave_pause, 2), "observer_pause_s": round(observer_pause, 2),
          "drains": {"A": a_drains, "B": b_drains}, "longest_drain_s": max(a_longest, b_longest),
          "consumed": total(samples["A"]) + total(samples["B"])}
print(json.dumps(result))
if os.environ.get("REBALANCE_JSON"):
    with open(os.environ["REBALANCE_JSON"], "a") as out:
        out.write(json.dumps(result) + "\n")
PY
done
