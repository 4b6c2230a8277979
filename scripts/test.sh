#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust:
#   1. installs redis-server, PostgreSQL, docker-compose, PyYAML, Prometheus (its promtool)
#      and Chromium with its chromedriver (the admin console's browser test) with apt-get when missing, and the
#      Python grpcio (the gRPC tests' stock client and server) with pip;
#   2. starts one real Redis, a real 3-master Redis Cluster and one real PostgreSQL on free
#      loopback ports, in a temp dir;
#   3. exports PORTCULLIS_TEST_REDIS_URL, PORTCULLIS_TEST_REDIS_CLUSTER_URL and
#      PORTCULLIS_TEST_DATABASE_URL for the tests;
#   4. checks the container rules (scripts/check-container: Dockerfile, .dockerignore,
#      docker-compose.yml, no engine needed), then runs every test of the workspace (unit,
#      conformance, end-to-end, chaos);
#   5. stops every server by PID, on success, failure or Ctrl-C.
# Safe to run twice in a row: nothing is left behind. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }

need_install=()
command -v redis-server >/dev/null 2>&1 || need_install+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || need_install+=(docker-compose)
python3 -c 'import yaml' >/dev/null 2>&1 || need_install+=(python3-yaml)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_install+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_install+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_install+=(chromium-driver)
# promtool checks deploy/prometheus/portcullis-alerts.yml (tests/e2e/alert_rules.rs).
command -v promtool >/dev/null 2>&1 || need_install+=(prometheus)
if [ ${#need_install[@]} -gt 0 ]; then
  log "installing ${need_install[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_install[@]}" >/dev/null
fi
# The stock gRPC implementation the gRPC end-to-end tests run (tests/e2e/grpcio/).
if ! python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1; then
  log "installing grpcio grpcio-tools"
  python3 -m pip install --quiet grpcio grpcio-tools
fi
# The WebSocket end-to-end tests use the stock Python `websockets` library (tests/e2e/websocket.rs).
if ! python3 -c 'import websockets' >/dev/null 2>&1; then
  log "installing the Python websockets library"
  python3 -m pip install --quiet websockets >/dev/null
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

workdir=$(mktemp -d /tmp/portcullis-test.XXXXXX)
redis_pid=""
cluster_pids=()
pg_data="$workdir/pg/data"
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_postgres=()
[ "$(id -u)" -eq 0 ] && as_postgres=(runuser -u postgres --)

cleanup() {
  local status=$?
  if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  for pid in "${cluster_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${cluster_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -f "$pg_data/postmaster.pid" ]; then
    pg_pid=$(head -n 1 "$pg_data/postmaster.pid")
    "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -m fast -w stop >/dev/null 2>&1 || kill "$pg_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
  exit $status
}
trap cleanup EXIT INT TERM

log "starting redis-server"
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$workdir" >"$workdir/redis.log" 2>&1 &
redis_pid=$!

log "starting PostgreSQL ($pg_bin)"
pg_port=$(free_port)
mkdir -p "$workdir/pg"
[ "$(id -u)" -eq 0 ] && chown -R postgres "$workdir/pg"
chmod 755 "$workdir"
"${as_postgres[@]}" "$pg_bin/initdb" -D "$pg_data" -A trust -U postgres >"$workdir/initdb.log" 2>&1 \
  || { cat "$workdir/initdb.log" >&2; exit 1; }
"${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -w -l "$workdir/pg/log" \
  -o "-p $pg_port -k $workdir/pg -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null \
  || { cat "$workdir/pg/log" >&2; exit 1; }

for _ in $(seq 1 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$redis_port" ping >/dev/null || { echo "redis-server did not start" >&2; cat "$workdir/redis.log" >&2; exit 1; }

# The cluster: three masters, no replicas; each node's bus port is chosen too (port + 10000
# may not exist). `--cluster create` assigns the slots; then wait for cluster_state:ok.
log "starting a 3-master Redis Cluster"
cluster_nodes=()
for _ in 1 2 3; do
  port=$(free_port)
  redis-server --port "$port" --cluster-port "$(free_port)" --bind 127.0.0.1 --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file "$workdir/nodes-$port.conf" --dir "$workdir" \
    >"$workdir/redis-cluster-$port.log" 2>&1 &
  cluster_pids+=($!)
  cluster_nodes+=("127.0.0.1:$port")
done
for node in "${cluster_nodes[@]}"; do
  for _ in $(seq 1 100); do
    redis-cli -p "${node#*:}" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
done
redis-cli --cluster create "${cluster_nodes[@]}" --cluster-replicas 0 --cluster-yes >"$workdir/cluster-create.log" 2>&1 \
  || { cat "$workdir/cluster-create.log" "$workdir"/redis-cluster-*.log >&2; exit 1; }
for node in "${cluster_nodes[@]}"; do
  for _ in $(seq 1 100); do
    redis-cli -p "${node#*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
    sleep 0.1
  done
  redis-cli -p "${node#*:}" cluster info | grep -q '^cluster_state:ok' \
    || { echo "redis cluster node $node is not ok" >&2; exit 1; }
done

export PORTCULLIS_TEST_REDIS_URL="redis://127.0.0.1:$redis_port"
export PORTCULLIS_TEST_REDIS_CLUSTER_URL="redis-cluster://$(IFS=,; echo "${cluster_nodes[*]}")"
export PORTCULLIS_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
log "redis: $PORTCULLIS_TEST_REDIS_URL  cluster: $PORTCULLIS_TEST_REDIS_CLUSTER_URL  postgres: $PORTCULLIS_TEST_DATABASE_URL"

log "checking the container rules (no engine needed)"
scripts/check-container
log "checking the Kubernetes manifests (no cluster needed)"
scripts/check-kubernetes

# `scripts/test.sh -p <crate> ...` narrows the run; without `-p` it is the whole workspace.
scope=(--workspace)
for arg in "$@"; do
  case "$arg" in -p|--package|-p*|--package=*) scope=() ;; esac
done
log "cargo test ${scope[*]:-} $*"
cargo test "${scope[@]}" --locked "$@"
