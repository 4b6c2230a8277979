#!/usr/bin/env bash
# Batched rate limiting: throughput of the rate-limited gateway with the state in memory, in
# Redis with `sync = "exact"` and `sync = "batched"`, and in a 3-master Redis Cluster with
# both, all in the same rounds (BENCHMARKS.md, "Batched rate limiting"). Each gateway has a
# tenant + a global bucket that never reject.
#
# Usage: bench/batched.sh   (after: cargo build --release --target-dir target-bench
#                            -p portcullis-gateway -p portcullis-testkit)
#
# Environment (defaults in brackets): ROUNDS [3], DURATION [5] (s per target and round),
# CONNS [64], CLIENT_CPU [0], SUT_CPU [1], CARGO_TARGET_DIR [<repo>/target-bench].
# Gateways (worker_threads = 1), redis-server and bench-upstream (1 thread) run on CPU
# $SUT_CPU, wrk -t1 on CPU $CLIENT_CPU, all on 127.0.0.1; every process started here is
# stopped by PID on exit. Prints one line per run and a summary (median req/s per target and
# its ratio to memory).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target-bench}/release
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
CLIENT_CPU=${CLIENT_CPU:-0}
SUT_CPU=${SUT_CPU:-1}

# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

UP=$(free_port)
taskset -c "$SUT_CPU" "$BIN/bench-upstream" --port "$UP" --threads 1 >"$TMP/upstream.log" 2>&1 &
PIDS+=($!)
REDIS_PORT=$(free_port)
taskset -c "$SUT_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)

# A 3-master Redis Cluster on the same CPU (the caller's bucket and the global ceiling are in
# different slots: the exact mode sends one script per slot, see README).
CLUSTER_PORTS=()
for i in 1 2 3; do
    port=$(free_port)
    CLUSTER_PORTS+=("$port")
    mkdir -p "$TMP/cluster-$port"
    taskset -c "$SUT_CPU" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --cluster-enabled yes --cluster-config-file "$TMP/cluster-$port/nodes.conf" \
        --dir "$TMP/cluster-$port" >"$TMP/cluster-$port.log" 2>&1 &
    PIDS+=($!)
done
for port in "${CLUSTER_PORTS[@]}"; do
    for ((i = 0; i < 100; i++)); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create "${CLUSTER_PORTS[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$TMP/cluster-create.log" 2>&1
for ((i = 0; i < 100; i++)); do
    redis-cli -p "${CLUSTER_PORTS[0]}" cluster info | grep -q 'cluster_state:ok' && break
    sleep 0.1
done
CLUSTER_URL="redis-cluster://$(IFS=,; echo "${CLUSTER_PORTS[*]/#/127.0.0.1:}")"

TARGETS=(memory redis-exact redis-batched cluster-exact cluster-batched)
KEY="pc-bench-batched-0123456789abcdef"
HUGE=1000000 # never rejects at what one worker serves (the limiter accepts up to 10⁹/s)
declare -A PORT
for name in "${TARGETS[@]}"; do
    PORT[$name]=$(free_port)
    admin=$(free_port)
    case $name in
        memory) state=memory sync=exact ;;
        redis-exact) state="redis://127.0.0.1:$REDIS_PORT" sync=exact ;;
        redis-batched) state="redis://127.0.0.1:$REDIS_PORT" sync=batched ;;
        cluster-exact) state="$CLUSTER_URL" sync=exact ;;
        cluster-batched) state="$CLUSTER_URL" sync=batched ;;
    esac
    cat >"$TMP/$name.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[$name]}"
admin_listen = "127.0.0.1:$admin"
worker_threads = 1
shutdown_grace = "2s"

[storage]
state = "$state"
database = "sqlite://$TMP/$name.db"

[rate_limit]
sync = "$sync"
max_overshoot = 0.05
global = { rate = $HUGE, per = "1s", burst = $HUGE }

[[tenants]]
id = "bench"
api_keys = ["$KEY"]
rate = $HUGE
per = "1s"
burst = $HUGE

[[upstreams]]
name = "backend"
endpoints = ["http://127.0.0.1:$UP"]

[[routes]]
prefix = "/"
upstream = "backend"
EOF
    taskset -c "$SUT_CPU" "$BIN/portcullis" --config "$TMP/$name.toml" >"$TMP/$name.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$admin/readyz"
    status=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:${PORT[$name]}/")
    [[ $status == 200 ]] || { echo "$name answered $status" >&2; exit 1; }
done

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
evalsha_on() {
    redis-cli -p "$1" info commandstats | tr -d '\r' |
        awk -F'[=,]' '/^cmdstat_evalsha:/ {print $2} END {}' | grep . || echo 0
}
evalsha() { # scripts run by the store of target $1 (all masters of the cluster)
    local total=0 port
    case $1 in
        cluster-*) for port in "${CLUSTER_PORTS[@]}"; do total=$((total + $(evalsha_on "$port"))); done ;;
        *) total=$(evalsha_on "$REDIS_PORT") ;;
    esac
    echo "$total"
}
declare -A RESULTS
for ((round = 1; round <= ROUNDS; round++)); do
    for name in "${TARGETS[@]}"; do
        scripts_before=$(evalsha "$name")
        out=$(BENCH_AUTH=$KEY taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" \
            -s "$ROOT/bench/wrk/bench.lua" "http://127.0.0.1:${PORT[$name]}/")
        rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
        non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
        requests=$(awk '/requests in/ {print $1}' <<<"$out")
        scripts=$(($(evalsha "$name") - scripts_before))
        echo "round $round  $name  $rps req/s  non-2xx ${non2xx:-0}  scripts $scripts for $requests requests  (load $(cut -d' ' -f1 /proc/loadavg))"
        RESULTS[$name]+="$rps "
        sleep 0.5
    done
done

echo
for name in "${TARGETS[@]}"; do
    median=$(tr ' ' '\n' <<<"${RESULTS[$name]}" | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    RESULTS[$name.median]=$median
done
for name in "${TARGETS[@]}"; do
    python3 -c "import sys; m=float(sys.argv[2]); b=float(sys.argv[3]); print(f'{sys.argv[1]:14} median {m:9.0f} req/s  {m / b:.2f}x memory  runs: {sys.argv[4]}')" \
        "$name" "${RESULTS[$name.median]}" "${RESULTS[memory.median]}" "${RESULTS[$name]}"
done
