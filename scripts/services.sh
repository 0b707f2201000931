#!/usr/bin/env bash
# Make sure the services the test suite talks to are up: Redis on 6379, PostgreSQL on 5432.
# This machine kind starts both before a session; this restarts them if they are down,
# and installs them from Debian's packages if they are missing.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v pg_ctlcluster >/dev/null || need_apt+=(postgresql)
if ((${#need_apt[@]})); then
  echo "services: installing ${need_apt[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "services: starting Redis" >&2
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "services: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
# Podman's Docker-compatible API for the container runtime (ci_relay uses this socket by default)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "$0")/.." && pwd)/docker/containers.conf}
if command -v podman >/dev/null && ! curl -sf --unix-socket /run/ci-relay/podman.sock http://d/_ping >/dev/null 2>&1; then
  echo "services: starting Podman's API socket" >&2
  mkdir -p /run/ci-relay
  # its own copy of the settings and its own working folder: conmon drops files (an `oom`
  # marker when a container is OOM-killed) in the service's current folder
  cp "$CONTAINERS_CONF" /run/ci-relay/containers.conf
  (cd /run/ci-relay && CONTAINERS_CONF=/run/ci-relay/containers.conf \
    exec nohup podman system service --time=0 unix:///run/ci-relay/podman.sock) \
    </dev/null >/var/log/ci-relay-podman.log 2>&1 &
  for _ in $(seq 1 30); do
    curl -sf --unix-socket /run/ci-relay/podman.sock http://d/_ping >/dev/null 2>&1 && break
    sleep 0.5
  done
fi

for _ in $(seq 1 60); do
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -p 5432 -q; then
    psql -h 127.0.0.1 -U postgres -d test -tAc "select 1" >/dev/null 2>&1 \
      || psql -h 127.0.0.1 -U postgres -tAc "create database test" >/dev/null
    exit 0
  fi
  sleep 1
done
echo "services: Redis or PostgreSQL did not come up" >&2
exit 1
