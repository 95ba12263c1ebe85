# Sourced by scripts that bring up a local stack of their own (tests, demo, load runs): a fresh
# state directory and free ports, so a developer's running stack is left alone — also when its
# stack.env is sourced in the same shell (its settings are not taken over). Stop it, and remove its
# state directory (logs, GCS's files), with `isolated_stack_down $?` in the script's exit trap.
# Usage: source scripts/lib/isolated-stack.sh NAME
# N distinct ports nothing listens on, below the kernel's ephemeral range: a port in that range
# can also go to an outgoing connection between the pick and the server's start (it did: a bench
# run's ClickHouse failed with "Address already in use").
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
if low - 10000 < 1000:
    sys.exit(f"free_ports: the ephemeral range starts at {low}: no room below it above 10000")
ports = set()
while len(ports) < int(sys.argv[1]):
    port = random.randrange(10000, low)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    ports.add(port)
print(" ".join(map(str, ports)))
PY
}
free_port() { free_ports 1; }
# (Its own statement: a failure inside `<<<"$(...)"` would go unnoticed, and every port with it.)
_ports=$(free_ports 5)
read -r _kafka _controller _clickhouse _clickhouse_tcp _gcs <<<"$_ports"
[ -n "$_gcs" ] || { echo "isolated-stack: no free ports ($_ports)" >&2; exit 1; }
REPLAY_INGEST_STACK_DIR=$(mktemp -d "/tmp/replay-ingest-$1.XXXXXX")
export REPLAY_INGEST_STACK_DIR
export REPLAY_INGEST_KAFKA_PORT=$_kafka
export REPLAY_INGEST_KAFKA_CONTROLLER_PORT=$_controller
export REPLAY_INGEST_CLICKHOUSE_PORT=$_clickhouse
export REPLAY_INGEST_CLICKHOUSE_TCP_PORT=$_clickhouse_tcp
export REPLAY_INGEST_GCS_PORT=$_gcs
unset _ports _kafka _controller _clickhouse _clickhouse_tcp _gcs

# Stops the service the script started, if a PID is given (SIGTERM, and its exit awaited: left
# running, it would outlive the stack), then the stack, and removes the stack's state directory,
# unless the script is failing (STATUS is not 0): then the logs there tell why, and stay. For exit
# traps: never fails.
# Usage: isolated_stack_down STATUS [PID]
isolated_stack_down() {
  if [ -n "${2:-}" ]; then
    kill -TERM "$2" 2>/dev/null || true
    wait "$2" 2>/dev/null || true
  fi
  scripts/stack.sh down >/dev/null 2>&1 || true
  if [ "${1:-0}" -ne 0 ]; then
    echo "the local stack's logs are kept in $REPLAY_INGEST_STACK_DIR" >&2
  else
    rm -rf "$REPLAY_INGEST_STACK_DIR"
  fi
}
