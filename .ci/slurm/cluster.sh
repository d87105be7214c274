#!/usr/bin/env bash
# A real one-node Slurm cluster with accounting on this machine (Debian 12, as root, no systemd):
# munge, MariaDB, slurmdbd, slurmctld and slurmd, each started as a daemon with a pid file.
#   bash .ci/slurm/cluster.sh install   # Debian's packages (about 20 s), once per machine
#   bash .ci/slurm/cluster.sh start     # writes /etc/slurm/*.conf, starts the daemons, waits for idle
#   bash .ci/slurm/cluster.sh stop      # stops every daemon it started and waits for each to exit
# Overwrites /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf: meant for CI and throw-away machines.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
HOST="$(hostname -s)"
LOGS=/var/log/slurm
DB_PASSWORD=ci-slurm-only   # MariaDB listens on 127.0.0.1 and a local socket only
PIDS=(/run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /run/mysqld/mysqld.pid /run/munge/munged.pid)

say() { echo "[slurm] $*"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local limit=$1 what=$2 t=0
  shift 2
  until "$@" >/dev/null 2>&1; do
    sleep 0.5
    t=$((t + 1))
    if [ "$t" -ge $((limit * 2)) ]; then
      say "error: $what not ready after ${limit}s; logs in $LOGS and /var/log/mysql*" >&2
      return 1
    fi
  done
}

install() {
  if command -v slurmctld slurmd slurmdbd sacct munged mysqld_safe >/dev/null 2>&1 \
      && [ "$(command -v slurmctld slurmd slurmdbd sacct munged mysqld_safe | wc -l)" -eq 6 ]; then
    say "packages already installed"
    return 0
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurm-client slurmdbd munge mariadb-server >/dev/null
  say "installed $(slurmctld -V)"
}

start_munge() {
  mkdir -p /run/munge /etc/munge
  [ -s /etc/munge/munge.key ] || mungekey --create
  chown -R munge:munge /run/munge /etc/munge
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 munged bash -c 'munge -n | unmunge'
}

start_mariadb() {
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld
  # mysqld_safe watches mysqld in the foreground: detach it, with its output in a log.
  setsid mysqld_safe --bind-address=127.0.0.1 --pid-file=/run/mysqld/mysqld.pid \
    >"$LOGS/mysqld_safe.log" 2>&1 < /dev/null &
  wait_for 30 MariaDB mysqladmin ping
  mysql -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

write_configs() {
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGS"
  sed "s/@HOST@/$HOST/g" "$HERE/slurm.conf.in" > /etc/slurm/slurm.conf
  sed "s/@DB_PASSWORD@/$DB_PASSWORD/" "$HERE/slurmdbd.conf.in" > /etc/slurm/slurmdbd.conf
  chmod 600 /etc/slurm/slurmdbd.conf  # slurmdbd refuses a readable one (it holds the password)
}

start() {
  [ "$(id -u)" -eq 0 ] || { say "error: starting Slurm's daemons needs root (run as root, as CI does)" >&2; return 1; }
  for pidfile in "${PIDS[@]}"; do
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      say "error: $pidfile names a running daemon; run '$0 stop' first" >&2
      return 1
    fi
  done
  write_configs
  start_munge
  start_mariadb
  slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  # Register the cluster, an account and root in it (each command is a no-op when already there).
  sacctmgr -i add cluster ci >/dev/null || true
  sacctmgr -i add account ci Cluster=ci Description=ci Organization=ci >/dev/null || true
  sacctmgr -i add user root Account=ci DefaultAccount=ci >/dev/null || true
  slurmctld
  wait_for 30 slurmctld scontrol ping
  slurmd
  wait_for 30 "node $HOST idle" bash -c "sinfo -h -N -o %t | grep -qx idle"
  say "up: $(sinfo -h -o '%P %D nodes %c CPUs %T')"
}

stop_pidfile() {  # stop_pidfile FILE: SIGTERM the daemon it names, wait up to 30 s, then SIGKILL
  local pidfile=$1 pid t=0
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    while kill -0 "$pid" 2>/dev/null && [ "$t" -lt 60 ]; do sleep 0.5; t=$((t + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      say "warning: pid $pid ($pidfile) ignored SIGTERM for 30 s; killing it" >&2
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

stop() {
  # Reverse order of start; MariaDB through mysqladmin so that mysqld_safe exits too.
  stop_pidfile /run/slurmd.pid
  stop_pidfile /run/slurmctld.pid
  stop_pidfile /run/slurmdbd.pid
  if [ -s /run/mysqld/mysqld.pid ]; then
    mysqladmin -u root shutdown 2>/dev/null || true
    stop_pidfile /run/mysqld/mysqld.pid
  fi
  stop_pidfile /run/munge/munged.pid
  say "stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
