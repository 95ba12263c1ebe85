# Debian packages and binaries for the scripts, sourced. The scripts run on Debian (x86_64).
#
# apt_get ARGS…: apt-get as root, through sudo otherwise, non-interactive; it waits for another
# apt run holding dpkg's lock (unattended-upgrades on a fresh VM, a second script) instead of
# failing at once.
apt_get() {
  local as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}

# ensure_build_tools: what building the service needs besides Rust — a C compiler and make
# (librdkafka, zlib and zstd are compiled from source), pkg-config and OpenSSL's headers (the
# Kafka client's TLS links the system's OpenSSL) — installed from Debian when missing.
ensure_build_tools() {
  local missing=()
  { command -v cc && command -v make; } >/dev/null || missing+=(build-essential)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup: installing ${missing[*]} (Debian), to build the service"
  apt_get update -qq >/dev/null || { echo "setup: apt-get update failed" >&2; return 1; }
  apt_get install -y -qq "${missing[@]}" >/dev/null || { echo "setup: apt-get could not install ${missing[*]}" >&2; return 1; }
}

# java_major: the major version of the default java, 0 without one.
java_major() {
  local major
  major=$( (java -version 2>&1 || true) | sed -n 's/.* version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n 1)
  echo "${major:-0}"
}

# clickhouse_server: the path of Debian's clickhouse-server, installed in /usr/sbin, which is not
# on a user's PATH; nothing (status 1) when it is not installed.
clickhouse_server() {
  command -v clickhouse-server || { [ -x /usr/sbin/clickhouse-server ] && echo /usr/sbin/clickhouse-server; }
}
