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
