# Sourced by scripts that bring up a local stack of their own (tests, demo, load runs): a fresh
# state directory and free ports, so a developer's running stack is left alone.
# Usage: source scripts/lib/isolated-stack.sh NAME
# N distinct ports nothing listens on, below the kernel's ephemeral range: a port in that range
# can also go to an outgoing connection between the pick and the server's start (it did: a bench
# run's ClickHouse failed with "Address already in use").
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
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
read -r _kafka _controller _clickhouse _clickhouse_tcp _gcs <<<"$(free_ports 5)"
export REPLAY_INGEST_STACK_DIR=${REPLAY_INGEST_STACK_DIR:-$(mktemp -d "/tmp/replay-ingest-$1.XXXXXX")}
export REPLAY_INGEST_KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-$_kafka}
export REPLAY_INGEST_KAFKA_CONTROLLER_PORT=${REPLAY_INGEST_KAFKA_CONTROLLER_PORT:-$_controller}
export REPLAY_INGEST_CLICKHOUSE_PORT=${REPLAY_INGEST_CLICKHOUSE_PORT:-$_clickhouse}
export REPLAY_INGEST_CLICKHOUSE_TCP_PORT=${REPLAY_INGEST_CLICKHOUSE_TCP_PORT:-$_clickhouse_tcp}
export REPLAY_INGEST_GCS_PORT=${REPLAY_INGEST_GCS_PORT:-$_gcs}
unset _kafka _controller _clickhouse _clickhouse_tcp _gcs
