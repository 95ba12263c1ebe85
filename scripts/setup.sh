#!/usr/bin/env bash
# Installs what the demo and the tests need, in one place: the build tools when missing (their
# own apt-get run: lib/debian.sh), then the Debian packages in one apt-get run (Java 17 and Maven for Apache Kafka, clickhouse-server, qemu-user for the aarch64 tests),
# Apache Kafka's jars and fake-gcs-server (`scripts/stack.sh install`) and, for the tests, the
# chart-check and chDB venvs and the Rust aarch64 target. Idempotent: what is there is left
# alone, so a second run costs seconds. Installs go to $REPLAY_INGEST_CACHE
# (default ~/.cache/replay-ingest).
# Usage: scripts/setup.sh [stack|test]   (stack: what the local stack needs, for the demo and the
#                                          load scripts; test, the default: that and the test tools)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian.sh

what=${1:-test}
case "$what" in stack | test) ;; *) echo "usage: scripts/setup.sh [stack|test]" >&2; exit 2 ;; esac
cache=${REPLAY_INGEST_CACHE:-$HOME/.cache/replay-ingest}
ensure_build_tools

packages=()
# Kafka 4 needs Java 17 or later: an older default java gets 17 beside it (it becomes the default).
[ "$(java_major)" -ge 17 ] || packages+=(openjdk-17-jre-headless)
# Debian's python3 has no venv module without python3-venv (the chart check, chDB and the bench
# scripts make venvs; the README asks only for python3 and pip).
python3 -c 'import ensurepip' 2>/dev/null || packages+=(python3-venv)
command -v mvn >/dev/null || packages+=(maven)
clickhouse_server >/dev/null || packages+=(clickhouse-server)
optional=()
if [ "$what" = test ] && ! command -v qemu-aarch64 >/dev/null; then optional+=(qemu-user); fi
apt_install() {
  apt_get install -y -qq "$@" >/dev/null
}
if [ $((${#packages[@]} + ${#optional[@]})) -gt 0 ]; then
  echo "setup: installing ${packages[*]} ${optional[*]} (Debian)"
  apt_get update -qq >/dev/null || { echo "setup: apt-get update failed" >&2; exit 1; }
  # qemu-user is optional (the aarch64 tests say they were skipped without it).
  if ! apt_install "${packages[@]}" "${optional[@]}"; then
    [ ${#packages[@]} -gt 0 ] && { apt_install "${packages[@]}" || { echo "setup: apt-get could not install ${packages[*]}" >&2; exit 1; }; }
  fi
fi
scripts/stack.sh install
[ "$what" = test ] || exit 0

# A venv of the cache with `packages` at the versions scripts/python-constraints.txt pins: made
# again whenever the pins (or Python) change — an import that works says nothing of versions,
# and a venv made before a pin kept whatever was newest then, unlike a fresh machine's.
pinned_venv() {
  local venv=$1 check=$2 what=$3
  shift 3
  local stamp
  stamp=$({ cat scripts/python-constraints.txt; python3 --version; } | sha256sum | cut -c1-16)
  if [ "$(cat "$venv/.pinned" 2>/dev/null)" = "$stamp" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
    return 0
  fi
  echo "setup: $what"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: -c scripts/python-constraints.txt "$@"
  echo "$stamp" >"$venv/.pinned"
}
pinned_venv "$cache/chart-venv" 'import helm_python, kubernetes_validate' \
  "helm-python-sdk, kubernetes-validate (chart check)" helm-python-sdk kubernetes-validate
pinned_venv "$cache/chdb-venv" 'import chdb' \
  "chDB (ClickHouse 26.9 in-process) for the production schema test" chdb
# A failure here (a download cut short) is not the run's: the aarch64 step at the end of the
# test command prepares again, and fails then if it must.
REPLAY_INGEST_REQUIRE_ALL= bash scripts/test-aarch64.sh --prepare ||
  echo "setup: the aarch64 tools could not be prepared now; the aarch64 step tries again" >&2
