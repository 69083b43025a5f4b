#!/usr/bin/env bash
# A DynaPipe cluster on this machine, on loopback: Redis, a planner and N
# executors (when the executor binary is built).
#
#   deploy/local-cluster.sh start [--executors N]   start everything, print addresses
#   deploy/local-cluster.sh status                  what runs, planner health
#   deploy/local-cluster.sh restart-planner         SIGTERM the planner, start it again on its ports
#                                                   (jobs, executors and `dynapipe watch` ride through)
#   deploy/local-cluster.sh stop                    stop everything (SIGTERM, then SIGKILL after 10 s)
#
# State (pids, logs, ports, token) lives in $DYNAPIPE_RUN_DIR (default out/local-cluster).
# Relative dataset paths resolve against $DYNAPIPE_DATA_ROOT (default: the repository).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="${DYNAPIPE_RUN_DIR:-$root/out/local-cluster}"
bin="${DYNAPIPE_BIN:-$root/bazel-bin}"
redis_port="${DYNAPIPE_REDIS_PORT:-16379}"
planner_port="${DYNAPIPE_PLANNER_PORT:-50051}"
http_port="${DYNAPIPE_HTTP_PORT:-8080}"
data_root="${DYNAPIPE_DATA_ROOT:-$root}"

running() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds, with a deadline
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then return 1; fi
    sleep 0.2
  done
}

start_planner() {
  "$bin/planner/service/dynapipe-planner" --listen="127.0.0.1:$planner_port" --http-port="$http_port" \
    --redis="127.0.0.1:$redis_port" --token-file="$run/token" --data-root="$data_root" \
    --log-file="$run/planner.log" >> "$run/planner.out" 2>&1 &
  echo $! > "$run/planner.pid"
  wait_for 15 curl -sf "http://127.0.0.1:$http_port/healthz" ||
    { echo "local-cluster: planner did not start (see $run/planner.out)" >&2; return 1; }
}

# SIGTERM, wait (SIGKILL after 10 s), start again on the same ports.
restart_planner() {
  running planner || { echo "local-cluster: no planner running (start first)" >&2; exit 1; }
  local pid; pid="$(cat "$run/planner.pid")"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.1
  done
  start_planner || exit 1
  echo "local-cluster: planner restarted (pid $(cat "$run/planner.pid"))"
}

start() {
  local executors=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --executors) executors="${2:?--executors needs a number}"; shift 2 ;;
      *) echo "local-cluster: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$run"
  if running planner || running redis; then echo "local-cluster: already running (stop it first)" >&2; exit 1; fi
  [ -x "$bin/planner/service/dynapipe-planner" ] || { echo "local-cluster: build first: bazel build //..." >&2; exit 1; }
  # The daemons and the CLI refuse a token other users can read: 0600, also
  # for a token an older version left behind.
  [ -f "$run/token" ] || (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$run/token")
  chmod 600 "$run/token"

  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly yes --dir "$run" \
    --daemonize no > "$run/redis.log" 2>&1 &
  echo $! > "$run/redis.pid"
  wait_for 10 redis-cli -p "$redis_port" ping || { echo "local-cluster: redis did not start (see $run/redis.log)" >&2; stop; exit 1; }

  start_planner || { stop; exit 1; }

  if [ "$executors" -gt 0 ]; then
    if [ ! -x "$bin/runtime/executor/dynapipe-executor" ]; then
      echo "local-cluster: no executor binary at $bin/runtime/executor/dynapipe-executor; started Redis and the planner only" >&2
    else
      for i in $(seq 0 $((executors - 1))); do
        "$bin/runtime/executor/dynapipe-executor" --planner="127.0.0.1:$planner_port" --device="$i" --node=local \
          --backend=cpu --token-file="$run/token" --data-root="$data_root" --http-port=0 \
          --port-file="$run/executor-$i.port" --log-file="$run/executor-$i.log" > "$run/executor-$i.out" 2>&1 &
        echo $! > "$run/executor-$i.pid"
      done
    fi
  fi
  cat <<MSG
local-cluster: running
  planner   127.0.0.1:$planner_port   (export DYNAPIPE_PLANNER=127.0.0.1:$planner_port DYNAPIPE_TOKEN_FILE=$run/token)
  status    http://127.0.0.1:$http_port/status
  redis     127.0.0.1:$redis_port
  logs      $run
MSG
}

stop() {
  local pids=()
  for f in "$run"/executor-*.pid "$run/planner.pid" "$run/redis.pid"; do
    [ -f "$f" ] || continue
    local pid; pid="$(cat "$f")"
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
      sleep 0.1
    done
  done
  echo "local-cluster: stopped ${#pids[@]} process(es)"
}

status() {
  for name in redis planner; do
    if running "$name"; then echo "$name: running (pid $(cat "$run/$name.pid"))"; else echo "$name: stopped"; fi
  done
  for f in "$run"/executor-*.pid; do
    [ -f "$f" ] || continue
    local n; n="$(basename "$f" .pid)"
    if running "$n"; then echo "$n: running"; else echo "$n: stopped"; fi
  done
  if running planner; then
    echo "planner health: $(curl -s "http://127.0.0.1:$http_port/healthz" || echo unreachable)"
  fi
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  restart-planner) restart_planner ;;
  *) echo "usage: deploy/local-cluster.sh start [--executors N] | status | restart-planner | stop" >&2; exit 2 ;;
esac
