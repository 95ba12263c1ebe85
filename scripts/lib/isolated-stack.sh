# Sourced by scripts that bring up a local stack of their own (tests, demo, load runs): a fresh
# state directory and free ports, so a developer's running stack is left alone.
# Usage: source scripts/lib/isolated-stack.sh NAME
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export REPLAY_INGEST_STACK_DIR=${REPLAY_INGEST_STACK_DIR:-$(mktemp -d "/tmp/replay-ingest-$1.XXXXXX")}
export REPLAY_INGEST_KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-$(free_port)}
export REPLAY_INGEST_KAFKA_CONTROLLER_PORT=${REPLAY_INGEST_KAFKA_CONTROLLER_PORT:-$(free_port)}
export REPLAY_INGEST_CLICKHOUSE_PORT=${REPLAY_INGEST_CLICKHOUSE_PORT:-$(free_port)}
export REPLAY_INGEST_CLICKHOUSE_TCP_PORT=${REPLAY_INGEST_CLICKHOUSE_TCP_PORT:-$(free_port)}
export REPLAY_INGEST_GCS_PORT=${REPLAY_INGEST_GCS_PORT:-$(free_port)}
