#!/usr/bin/env bash
# Portcullis benchmark harness: Portcullis vs nginx, HAProxy, Caddy, a pingora proxy and the bare
# backend, on loopback, pinned. Every peer's configuration is in bench/peers/ (nothing outside
# the repository is read).
#
# Usage:
#   bench/run.sh [--no-build] [--quick] [--profile] [--no-amp] [--jemalloc] [--floor]
#
#   --no-build   use the release binaries already in $CARGO_TARGET_DIR (default target-bench/),
#                bench-pingora-proxy included
#   --quick      smoke run: 2 rounds x 2 s, short amplification scenario (numbers not citable)
#   --profile    also measure CPU/request, syscalls/request (strace -c -f) and a perf profile
#                of the pass-through gateway vs nginx (adds ~40 s)
#   --no-amp     skip the retry-amplification scenario
#   --jemalloc   add target pc-pass-je: the same pass-through gateway binary with
#                LD_PRELOAD=libjemalloc.so.2 (an allocator A/B without changing code)
#   --floor      add targets floor-pooled and floor-dedicated: `bench-bareproxy`, hyper's
#                server and client with nothing of the gateway between them (hyper-util's
#                pooled client, or one upstream connection per client connection), the
#                floor of pass-through cost on the gateway's building blocks
#
# Environment overrides (defaults in brackets): ROUNDS [5], DURATION [5] (s per target and
# round), CONNS [64], LAT_ROUNDS [3], LAT_DURATION [3] (s measured per open-loop run, after
# 1 s of warm-up), LAT_CONNS [64] (open-loop connections),
# ACCESS_LOG [0] (1: the gateways write their access log, which nginx does not),
# RT_N [200] (keyed requests for the round-trip count), AMP_RATE [200] (req/s),
# AMP_OUTAGE [20] (s), CLIENT_CPU [0], SUT_CPU [1], CARGO_TARGET_DIR [<repo>/target-bench],
# PG_POOL_SIZE [the store default] (gw-pg connections = pgbench anchor clients).
#
# Needs: wrk, nginx, redis-server + redis-cli, PostgreSQL server binaries
# (/usr/lib/postgresql/*/bin, with pg_stat_statements), python3, curl, ss, taskset; perf and
# strace for --profile. Run as root (PostgreSQL is started as user postgres via runuser).
# Optional peers, each skipped with a message when missing: haproxy, caddy (Debian packages of
# those names), bench-pingora-proxy (bench/pingora-proxy/, built here; its zlib-ng needs cmake).
#
# What it does (all on 127.0.0.1, every process started here is stopped by PID on exit):
#   1. builds `portcullis`, `bench-upstream` and `bench-pingora-proxy` (cargo build --release;
#      the pingora proxy is its own crate, outside the workspace) unless --no-build;
#   2. starts bench-upstream (1 thread); the peers from bench/peers/ with their @PORT@
#      placeholders filled in: nginx (nginx.conf: proxy_pass with upstream keep-alive + a
#      limit_req server), HAProxy (haproxy.cfg: the same + a stick-table rate check), Caddy
#      (Caddyfile, GOMAXPROCS=1) and bench-pingora-proxy (1 thread), each checked with a curl
#      that must reach the backend through it; redis-server,
#      PostgreSQL (initdb in a temp dir, trust auth), and seven Portcullis processes
#      (worker_threads = 1): pass-through; idempotency in memory; in Redis; in PostgreSQL;
#      local rate limit (tenant + global bucket, rates that never reject); local rate limit +
#      memory idempotency; Redis rate limit + Redis idempotency (storage.state = redis);
#      everything under test on CPU $SUT_CPU, wrk / the client on CPU $CLIENT_CPU;
#      rate-limited targets send "Authorization: Bearer <tenant key>", and so do the nginx
#      limit_req targets they are compared with;
#   3. throughput: ROUNDS rounds, every target once per round (order reversed on even rounds),
#      wrk -t1 -cCONNS -dDURATION --latency, same Lua script (bench/wrk/bench.lua) for all;
#   4. open-loop latency (bench-openloop, coordinated omission corrected): p50/p99/p99.9 at
#      25, 50 and 75 % of the saturation rate nginx reached in step 3, for pass-through GET,
#      local rate limit GET and keyed POST, nginx and Portcullis alike;
#   5. peak RSS (VmHWM) of every process;
#   6. store round trips per keyed request: RT_N first executions then RT_N replays over one
#      keep-alive connection; Redis INFO commandstats deltas, pg_stat_statements calls, and
#      data segments the store received (ss -i data_segs_in) for both; the same for the
#      Redis rate limiter: RT_N GETs (one decision each), RT_N keyed POSTs first/replay through
#      the Redis rate limit + Redis idempotency gateway, and EVALSHA per request of every
#      throughput run of pc-rl-redis (commandstats and the gateway's counters around the run);
#   7. (--profile) CPU µs/request from /proc/PID/stat, syscalls/request with strace -c -f,
#      perf record of the gateway;
#   8. retry amplification: the backend answers 503 to everything for AMP_OUTAGE s under a
#      constant AMP_RATE req/s open-loop GET load, then recovers; shipped defaults vs naive;
#   9. writes the markdown report to stdout and bench/results/latest.md (raw data in
#      bench/results/<timestamp>/).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
PEERS=$BENCH/peers
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
BIN=$CARGO_TARGET_DIR/release

BUILD=1 PROFILE=0 AMP=1 QUICK=0 JEMALLOC=0 FLOOR=0
for arg in "$@"; do
    case $arg in
        --no-build) BUILD=0 ;;
        --profile) PROFILE=1 ;;
        --no-amp) AMP=0 ;;
        --quick) QUICK=1 ;;
        --jemalloc) JEMALLOC=1 ;;
        --floor) FLOOR=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done

if [[ $QUICK == 1 ]]; then
    : "${ROUNDS:=2}" "${DURATION:=2}" "${LAT_ROUNDS:=1}" "${LAT_DURATION:=2}" "${RT_N:=50}"
    : "${AMP_OUTAGE:=8}" "${AMP_WARMUP:=2}" "${AMP_AFTER:=12}"
fi
ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} CONNS=${CONNS:-64}
LAT_ROUNDS=${LAT_ROUNDS:-3} LAT_DURATION=${LAT_DURATION:-3} LAT_CONNS=${LAT_CONNS:-64}
RT_N=${RT_N:-200}
AMP_RATE=${AMP_RATE:-200} AMP_WARMUP=${AMP_WARMUP:-5} AMP_OUTAGE=${AMP_OUTAGE:-20} AMP_AFTER=${AMP_AFTER:-15}
CLIENT_CPU=${CLIENT_CPU:-0} SUT_CPU=${SUT_CPU:-1}
for v in ROUNDS DURATION CONNS LAT_ROUNDS LAT_DURATION LAT_CONNS RT_N AMP_RATE AMP_OUTAGE; do
    [[ ${!v} =~ ^[0-9]+$ ]] && ((${!v} > 0 && ${!v} <= 100000)) || { echo "$v=${!v}: want a positive integer" >&2; exit 2; }
done
((ROUNDS <= 50 && DURATION <= 60 && LAT_ROUNDS <= 20 && LAT_DURATION <= 60 && AMP_OUTAGE <= 120)) || { echo "rounds/durations too large" >&2; exit 2; }

declare -A PKG=([wrk]=wrk [nginx]=nginx [redis-server]=redis-server [redis-cli]=redis-tools
    [python3]=python3 [curl]=curl [ss]=iproute2 [taskset]=util-linux [runuser]=util-linux)
for tool in wrk nginx redis-server redis-cli python3 curl ss taskset runuser; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool (Debian: apt-get install ${PKG[$tool]})" >&2; exit 1; }
done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
[[ -n $PGBIN && -x $PGBIN/initdb ]] || { echo "missing PostgreSQL server binaries (/usr/lib/postgresql/*/bin; Debian: apt-get install postgresql)" >&2; exit 1; }
for f in nginx.conf haproxy.cfg Caddyfile; do
    [[ -f $PEERS/$f ]] || { echo "missing $PEERS/$f" >&2; exit 1; }
done

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# --------------------------------------------------------------------------- build
if [[ $BUILD == 1 ]]; then
    log "building release binaries into $CARGO_TARGET_DIR"
    (cd "$ROOT" && cargo build --release -p portcullis-gateway -p portcullis-testkit)
    # Not a workspace member (the root Cargo.toml excludes it): its own lock file, same target dir.
    cargo build --release --locked --manifest-path "$BENCH/pingora-proxy/Cargo.toml" ||
        log "bench-pingora-proxy did not build: the pingora peer will be skipped"
fi
for b in portcullis bench-upstream bench-openloop; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (run without --no-build)" >&2; exit 1; }
done

# --------------------------------------------------------------------------- bookkeeping
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RUN_ID=$(date +%s)
OUT=$BENCH/results/$STAMP
RAW=$OUT/raw
mkdir -p "$RAW"
TMP=$(mktemp -d /tmp/portcullis-bench.XXXXXX)
chmod 755 "$TMP" # PostgreSQL runs as user postgres and needs to traverse it
PIDS=()
PGDATA=$TMP/pg
PG_STARTED=0

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [[ $PG_STARTED == 1 ]]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 10 stop >/dev/null 2>&1
    fi
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 1 30); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    wait 2>/dev/null
    if [[ ${BENCH_KEEP_TMP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Picks a free loopback port >= $2 into the variable named $1 (bounded search).
TAKEN=" "
pick_port() {
    local p
    for ((p = $2; p < $2 + 500; p++)); do
        [[ $TAKEN == *" $p "* ]] && continue
        if [[ -z $(ss -Htan "sport = :$p") ]]; then
            TAKEN+="$p "
            printf -v "$1" '%s' "$p"
            return 0
        fi
    done
    echo "no free port from $2" >&2
    return 1
}

# wait_http URL [tries]: bounded readiness wait (tries x 0.1 s).
wait_http() {
    local i
    for ((i = 0; i < ${2:-100}; i++)); do
        curl -fs -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
    done
    echo "not ready: $1" >&2
    return 1
}

# Everything under test runs on $SUT_CPU. Background processes are started as
# `taskset -c CPU cmd &` (taskset execs cmd, so $! is the real PID; a function in the
# background would leave $! pointing at a subshell).

pick_port UP 28080
pick_port AMP_UP 28100
pick_port NGX_PROXY 28190
pick_port NGX_LIMIT 28191
pick_port HAP_PROXY 28200
pick_port HAP_LIMIT 28201
pick_port CADDY_PROXY 28210
pick_port PINGORA_PROXY 28220
pick_port REDIS_PORT 28300
pick_port PG_PORT 28400
pick_port GW_PASS 28500
pick_port GW_MEM 28510
pick_port GW_REDIS 28520
pick_port GW_PG 28530
pick_port GW_AMP 28540
pick_port GW_JE 28560
pick_port GW_AMP2 28550
pick_port GW_RL 28570
pick_port GW_RL_MEM 28575
pick_port FLOOR_POOLED 28580
pick_port FLOOR_DEDICATED 28585
pick_port GW_RL_REDIS 28580
pick_port ADMIN_BASE 28600

# --------------------------------------------------------------------------- machine facts
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "dirty=$([[ -n $(git -C "$ROOT" status --porcelain -- gateway ratelimit idempotency Cargo.lock 2>/dev/null) ]] && echo 1 || echo 0)"
    echo "binary_built=$(date -u -r "$BIN/portcullis" '+%Y-%m-%d %H:%M UTC')"
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "nproc=$(nproc)"
    echo "client_cpu=$CLIENT_CPU"
    echo "sut_cpu=$SUT_CPU"
    echo "conns=$CONNS"
    echo "duration=$DURATION"
    echo "rounds=$ROUNDS"
    echo "lat_conns=$LAT_CONNS"
    echo "lat_rounds=$LAT_ROUNDS"
    echo "lat_duration=$LAT_DURATION"
    echo "wrk=$(wrk -v 2>&1 | sed -n 1p)"
    echo "nginx=$(nginx -v 2>&1)"
    echo "haproxy=$(haproxy -v 2>/dev/null | sed -n 1p || true)"
    echo "caddy=$(caddy version 2>/dev/null || true)"
    echo "pingora=$(grep -A1 '^name = "pingora"$' "$BENCH/pingora-proxy/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')"
    echo "redis=$(redis-server --version)"
    echo "postgres=$("$PGBIN/postgres" --version)"
    echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$RAW/meta.env"

# --------------------------------------------------------------------------- backend
log "bench-upstream on :$UP (CPU $SUT_CPU)"
taskset -c "$SUT_CPU" "$BIN/bench-upstream" --port "$UP" --threads 1 >"$RAW/upstream.log" 2>&1 &
UP_PID=$!
PIDS+=("$UP_PID")
wait_http "http://127.0.0.1:$UP/__bench/stats"

# --------------------------------------------------------------------------- peers
# render_peer FILE DEST: bench/peers/FILE with every @NAME@ placeholder replaced by a port picked
# above; refuses a placeholder it does not know (a typo would otherwise bind a literal "@X@").
render_peer() {
    sed -e "s/@UPSTREAM@/$UP/g" -e "s/@NGINX_PROXY@/$NGX_PROXY/g" -e "s/@NGINX_LIMIT@/$NGX_LIMIT/g" \
        -e "s/@HAPROXY_PROXY@/$HAP_PROXY/g" -e "s/@HAPROXY_LIMIT@/$HAP_LIMIT/g" \
        -e "s/@CADDY_PROXY@/$CADDY_PROXY/g" "$PEERS/$1" >"$2"
    if grep -n '^[^#]*@[A-Z_]*@' "$2" >&2; then echo "$1: unknown placeholder" >&2; exit 1; fi
    cp "$2" "$RAW/peer-$1"
}
# check_proxies NAME:PORT...: one GET through each must come back as the backend's answer and
# be counted by the backend (so a peer answering by itself, or an error page, is caught).
check_proxies() {
    local np name port hits0 hits1 body
    for np in "$@"; do
        name=${np%%:*} port=${np#*:}
        hits0=$(curl -fs --max-time 5 "http://127.0.0.1:$UP/__bench/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"])')
        body=$(curl -fs --max-time 5 "http://127.0.0.1:$port/x") || { echo "$name (:$port) does not answer 2xx" >&2; exit 1; }
        hits1=$(curl -fs --max-time 5 "http://127.0.0.1:$UP/__bench/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"])')
        [[ $body == "$EXPECTED_BODY" && $hits1 -gt $hits0 ]] ||
            { echo "$name (:$port) is not proxying to the backend (body '$body', backend hits $hits0 -> $hits1)" >&2; exit 1; }
        log "$name proxies to the backend (:$port)"
    done
}
# Peers that are present; the optional ones are skipped with a message when missing.
PEER_NAMES=(nginx)

mkdir -p "$TMP/nginx"
render_peer nginx.conf "$TMP/nginx/nginx.conf"
log "nginx on :$NGX_PROXY (proxy_pass) :$NGX_LIMIT (limit_req)"
taskset -c "$SUT_CPU" nginx -p "$TMP/nginx/" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" >"$RAW/nginx.log" 2>&1 &
NGX_PID=$!
PIDS+=("$NGX_PID")
wait_http "http://127.0.0.1:$NGX_PROXY/x"
wait_http "http://127.0.0.1:$NGX_LIMIT/x"
NGX_WORKER=$(pgrep -P "$NGX_PID" | sed -n 1p)

HAP_PID=""
if command -v haproxy >/dev/null; then
    render_peer haproxy.cfg "$TMP/haproxy.cfg"
    log "HAProxy on :$HAP_PROXY (proxy) :$HAP_LIMIT (stick-table rate check)"
    taskset -c "$SUT_CPU" haproxy -db -f "$TMP/haproxy.cfg" >"$RAW/haproxy.log" 2>&1 &
    HAP_PID=$!
    PIDS+=("$HAP_PID")
    wait_http "http://127.0.0.1:$HAP_PROXY/x"
    wait_http "http://127.0.0.1:$HAP_LIMIT/x"
    PEER_NAMES+=(haproxy)
else
    log "SKIPPED peer HAProxy: no haproxy on PATH (apt-get install haproxy)"
fi

CADDY_PID=""
if command -v caddy >/dev/null; then
    render_peer Caddyfile "$TMP/Caddyfile"
    mkdir -p "$TMP/caddy"
    log "Caddy on :$CADDY_PROXY (reverse_proxy, GOMAXPROCS=1)"
    # Caddy keeps its state under XDG_DATA_HOME/XDG_CONFIG_HOME: the temp directory, not $HOME.
    GOMAXPROCS=1 XDG_DATA_HOME=$TMP/caddy XDG_CONFIG_HOME=$TMP/caddy \
        taskset -c "$SUT_CPU" caddy run --adapter caddyfile --config "$TMP/Caddyfile" >"$RAW/caddy.log" 2>&1 &
    CADDY_PID=$!
    PIDS+=("$CADDY_PID")
    wait_http "http://127.0.0.1:$CADDY_PROXY/x"
    PEER_NAMES+=(caddy)
else
    log "SKIPPED peer Caddy: no caddy on PATH (apt-get install caddy)"
fi

PINGORA_PID=""
if [[ -x $BIN/bench-pingora-proxy ]]; then
    log "pingora proxy on :$PINGORA_PROXY (bench/pingora-proxy, 1 thread)"
    taskset -c "$SUT_CPU" "$BIN/bench-pingora-proxy" --listen "127.0.0.1:$PINGORA_PROXY" \
        --upstream "127.0.0.1:$UP" >"$RAW/pingora.log" 2>&1 &
    PINGORA_PID=$!
    PIDS+=("$PINGORA_PID")
    wait_http "http://127.0.0.1:$PINGORA_PROXY/x"
    PEER_NAMES+=(pingora)
else
    log "SKIPPED peer pingora: no $BIN/bench-pingora-proxy (cargo build --release --manifest-path bench/pingora-proxy/Cargo.toml)"
fi

EXPECTED_BODY=$(curl -fs --max-time 5 "http://127.0.0.1:$UP/x")
PEER_PORTS=("nginx:$NGX_PROXY" "nginx-limit:$NGX_LIMIT")
[[ -n $HAP_PID ]] && PEER_PORTS+=("haproxy:$HAP_PROXY" "haproxy-limit:$HAP_LIMIT")
[[ -n $CADDY_PID ]] && PEER_PORTS+=("caddy:$CADDY_PROXY")
[[ -n $PINGORA_PID ]] && PEER_PORTS+=("pingora:$PINGORA_PROXY")
check_proxies "${PEER_PORTS[@]}"
echo "peers=${PEER_NAMES[*]}" >>"$RAW/meta.env"

# --------------------------------------------------------------------------- redis
mkdir -p "$TMP/redis"
log "redis-server on :$REDIS_PORT"
taskset -c "$SUT_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$TMP/redis" --daemonize no --loglevel warning >"$RAW/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for ((i = 0; i < 100; i++)); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null

# --------------------------------------------------------------------------- postgres
log "PostgreSQL on :$PG_PORT ($PGBIN)"
mkdir -p "$PGDATA" && chown postgres "$PGDATA"
runuser -u postgres -- "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres --no-sync >"$RAW/initdb.log" 2>&1
PG_STARTED=1
taskset -c "$SUT_CPU" runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$PGDATA -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
    start >"$RAW/pg_ctl.log" 2>&1
PG_PID=$(head -1 "$PGDATA/postmaster.pid")
PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
psql_() { "$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }
psql_ -c "create extension if not exists pg_stat_statements" >/dev/null

# --------------------------------------------------------------------------- portcullis
ADMIN_NEXT=$ADMIN_BASE
declare -A GW_PID GW_ADMIN GW_WHAT
# The rate-limited gateways' one tenant. Rates are so high that nothing is ever rejected: the
# benchmark measures the cost of a decision, not of a rejection (as nginx's limit_req zone).
BENCH_API_KEY="pc-bench-$RUN_ID-0123456789abcdef"
MEMORY_MAX_BYTES=$((4 << 30)) # 4 GiB: accounted, not reserved; RSS follows what is stored
HUGE=1000000 # far above what one worker serves; the limiter accepts up to 1 per ns (10⁹/s), beyond that it logs "invalid stored limit ignored" and skips the policy
RL_BLOCK="[rate_limit]
global = { rate = $HUGE, per = \"1s\", burst = $HUGE }

[[tenants]]
id = \"bench\"
api_keys = [\"$BENCH_API_KEY\"]
rate = $HUGE
per = \"1s\"
burst = $HUGE"
# write_config NAME LISTEN IDEMPOTENCY_STORE ROUTE_IDEMPOTENCY(0/1) [UPSTREAM_PORT] [UPSTREAM_EXTRA]
#              [STATE_STORE (memory)] [RATE_LIMIT (0/1)]
# Writes $TMP/NAME.toml; sets GW_ADMIN[NAME] (admin port).
write_config() {
    local name=$1 listen=$2 store=$3 idem=$4 upstream=${5:-$UP} extra=${6:-} state=${7:-memory} rl=${8:-0}
    local admin
    pick_port admin "$ADMIN_NEXT"
    ADMIN_NEXT=$((admin + 1))
    GW_ADMIN[$name]=$admin
    {
        echo "# generated by bench/run.sh ($name)"
        echo "[server]"
        echo "listen = \"127.0.0.1:$listen\""
        echo "admin_listen = \"127.0.0.1:$admin\""
        echo "worker_threads = 1"
        echo "shutdown_grace = \"2s\""
        echo
        echo "[storage]"
        echo "state = \"$state\""
        echo "idempotency = \"$store\""
        echo "database = \"sqlite://$TMP/$name.db\""
        # The memory store never evicts a live record (a full share answers 503
        # idempotency-store-full) and a record lives at least 24 h: a bound far above what a
        # run writes (~1 M keyed requests, ~0.5 KB each; half of it is the tenant's share in
        # the rate-limited gateways), so keyed runs measure stores, not refusals.
        echo "memory_max_bytes = $MEMORY_MAX_BYTES"
        echo
        # nginx runs with `access_log off` (the peer configuration): the gateway too, unless
        # ACCESS_LOG=1 asks to measure the cost of its per-request line.
        echo "[telemetry]"
        echo "access_log = $([[ ${ACCESS_LOG:-0} == 1 ]] && echo true || echo false)"
        echo
        if [[ $rl == 1 ]]; then printf '%s\n\n' "$RL_BLOCK"; fi
        echo "[[upstreams]]"
        echo "name = \"backend\""
        echo "endpoints = [\"http://127.0.0.1:$upstream\"]"
        if [[ -n $extra ]]; then printf '%s\n' "$extra"; fi
        echo
        echo "[[routes]]"
        echo "prefix = \"/\""
        echo "upstream = \"backend\""
        if [[ $idem == 1 ]]; then echo 'idempotency = { methods = ["POST", "PATCH"] }'; fi
    } >"$TMP/$name.toml"
    cp "$TMP/$name.toml" "$RAW/$name.toml"
}

start_gateway() { # NAME PORT WHAT [LD_PRELOAD]
    local name=$1 port=$2
    LD_PRELOAD=${4:-} taskset -c "$SUT_CPU" "$BIN/portcullis" --config "$TMP/$name.toml" >"$RAW/$name.log" 2>&1 &
    GW_PID[$name]=$!
    GW_WHAT[$name]=$3
    PIDS+=("${GW_PID[$name]}")
    wait_http "http://127.0.0.1:$port/readyz" 200 || { tail -20 "$RAW/$name.log" >&2; exit 1; }
    kill -0 "${GW_PID[$name]}" 2>/dev/null || { echo "$name exited:" >&2; tail -20 "$RAW/$name.log" >&2; exit 1; }
}

write_config gw-pass "$GW_PASS" memory 0
write_config gw-mem "$GW_MEM" memory 1
write_config gw-redis "$GW_REDIS" "redis://127.0.0.1:$REDIS_PORT" 1
write_config gw-pg "$GW_PG" "$PG_URL" 1
# gw-pg's pool size (storage.postgres_pool_size): the store's default unless PG_POOL_SIZE is set.
if [[ -n ${PG_POOL_SIZE:-} ]]; then sed -i "s/^idempotency = \"postgres:.*/&\npostgres_pool_size = $PG_POOL_SIZE/" "$TMP/gw-pg.toml"; cp "$TMP/gw-pg.toml" "$RAW/gw-pg.toml"; fi
REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
write_config gw-rl "$GW_RL" memory 0 "$UP" "" memory 1
write_config gw-rl-mem "$GW_RL_MEM" memory 1 "$UP" "" memory 1
write_config gw-rl-redis "$GW_RL_REDIS" "$REDIS_URL" 1 "$UP" "" "$REDIS_URL" 1
log "portcullis: pass :$GW_PASS, memory :$GW_MEM, redis :$GW_REDIS, postgres :$GW_PG, rl-local :$GW_RL, rl-local+mem :$GW_RL_MEM, rl-redis+redis :$GW_RL_REDIS"
start_gateway gw-pass "$GW_PASS" "GET pass-through"
start_gateway gw-mem "$GW_MEM" "POST keyed (memory store) + unkeyed"
start_gateway gw-redis "$GW_REDIS" "POST keyed (Redis store)"
start_gateway gw-pg "$GW_PG" "POST keyed (PostgreSQL store)"
start_gateway gw-rl "$GW_RL" "GET, local rate limit"
start_gateway gw-rl-mem "$GW_RL_MEM" "POST keyed, local rate limit + memory store"
start_gateway gw-rl-redis "$GW_RL_REDIS" "GET + POST keyed, Redis rate limit + Redis store"
# The tenant key must be accepted (200, not 401) by every rate-limited gateway before we measure.
for g in gw-rl:$GW_RL gw-rl-mem:$GW_RL_MEM gw-rl-redis:$GW_RL_REDIS; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "Authorization: Bearer $BENCH_API_KEY" "http://127.0.0.1:${g#*:}/x")
    [[ $code == 200 ]] || { echo "${g%%:*}: GET with the tenant key answered $code" >&2; tail -20 "$RAW/${g%%:*}.log" >&2; exit 1; }
done
JEMALLOC_SO=""
if [[ $JEMALLOC == 1 ]]; then
    JEMALLOC_SO=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | sed -n 1p)
    [[ -n $JEMALLOC_SO ]] || { echo "--jemalloc: libjemalloc.so.2 not found (apt-get install libjemalloc2)" >&2; exit 1; }
    write_config gw-pass-je "$GW_JE" memory 0
    start_gateway gw-pass-je "$GW_JE" "GET pass-through, jemalloc (LD_PRELOAD)" "$JEMALLOC_SO"
fi

if [[ $FLOOR == 1 ]]; then
    [[ -x $BIN/bench-bareproxy ]] || { echo "--floor: missing $BIN/bench-bareproxy (build portcullis-testkit)" >&2; exit 1; }
    for kind in pooled dedicated; do
        port=$([[ $kind == pooled ]] && echo "$FLOOR_POOLED" || echo "$FLOOR_DEDICATED")
        taskset -c "$SUT_CPU" "$BIN/bench-bareproxy" --port "$port" --upstream "127.0.0.1:$UP" \
            --client "$kind" >"$RAW/floor-$kind.log" 2>&1 &
        PIDS+=($!)
        wait_http "http://127.0.0.1:$port/x"
    done
fi

# --------------------------------------------------------------------------- targets
# name | group | url | method | per-request header | "auth": send the tenant's API key
TARGETS=(
    "direct|get|http://127.0.0.1:$UP/x|GET|"
    "nginx|get|http://127.0.0.1:$NGX_PROXY/x|GET|"
    "nginx-limit|get|http://127.0.0.1:$NGX_LIMIT/x|GET||auth"
    $([[ -n $HAP_PID ]] && echo "haproxy|get|http://127.0.0.1:$HAP_PROXY/x|GET|" || true) # || true: set -e
    $([[ -n $HAP_PID ]] && echo "haproxy-limit|get|http://127.0.0.1:$HAP_LIMIT/x|GET||auth" || true)
    $([[ -n $CADDY_PID ]] && echo "caddy|get|http://127.0.0.1:$CADDY_PROXY/x|GET|" || true)
    $([[ -n $PINGORA_PID ]] && echo "pingora|get|http://127.0.0.1:$PINGORA_PROXY/x|GET|" || true)
    "pc-pass|get|http://127.0.0.1:$GW_PASS/x|GET|"
    "pc-rl-local|get|http://127.0.0.1:$GW_RL/x|GET||auth"
    "pc-rl-redis|get|http://127.0.0.1:$GW_RL_REDIS/x|GET||auth"
    $([[ $JEMALLOC == 1 ]] && echo "pc-pass-je|get|http://127.0.0.1:$GW_JE/x|GET|" || true) # || true: set -e
    $([[ $FLOOR == 1 ]] && echo "floor-pooled|get|http://127.0.0.1:$FLOOR_POOLED/x|GET|" || true)
    $([[ $FLOOR == 1 ]] && echo "floor-dedicated|get|http://127.0.0.1:$FLOOR_DEDICATED/x|GET|" || true)
    "direct-post|post|http://127.0.0.1:$UP/orders|POST|X-Bench-Seq"
    "nginx-post|post|http://127.0.0.1:$NGX_PROXY/orders|POST|X-Bench-Seq"
    "pc-unkeyed|post|http://127.0.0.1:$GW_MEM/orders|POST|X-Bench-Seq"
    "pc-keyed-mem|post|http://127.0.0.1:$GW_MEM/orders|POST|Idempotency-Key"
    "pc-keyed-redis|post|http://127.0.0.1:$GW_REDIS/orders|POST|Idempotency-Key"
    "pc-keyed-pg|post|http://127.0.0.1:$GW_PG/orders|POST|Idempotency-Key"
    "nginx-limit-post|post|http://127.0.0.1:$NGX_LIMIT/orders|POST|X-Bench-Seq|auth"
    "pc-rl-keyed-mem|post|http://127.0.0.1:$GW_RL_MEM/orders|POST|Idempotency-Key|auth"
    "pc-rl-keyed-redis|post|http://127.0.0.1:$GW_RL_REDIS/orders|POST|Idempotency-Key|auth"
)

printf 'phase\tround\ttarget\tgroup\trps\tp50_us\tp99_us\trequests\tnon2xx\terrors\n' >"$RAW/runs.tsv"

printf 'round\twrk_requests\tgateway_requests\tredis_decisions\tevalsha\tredis_commands\n' >"$RAW/rl-redis-load.tsv"
# gw_counter NAME METRIC: sum of every sample of METRIC on gateway NAME's /metrics.
gw_counter() {
    { curl -fs --max-time 5 "http://127.0.0.1:${GW_ADMIN[$1]}/metrics" || true; } | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}
# run_wrk PHASE ROUND SPEC SECONDS CONNS DELAY_MS
run_wrk() {
    local phase=$1 round=$2 spec=$3 secs=$4 conns=$5 delay=$6
    local name group url method hdr auth
    IFS='|' read -r name group url method hdr auth <<<"$spec"
    local file=$RAW/$phase-r$round-$name.txt
    # Redis commands per rate-limit decision under load: INFO commandstats and the gateway's
    # request / Redis-decision counters around every pc-rl-redis throughput run.
    local count=0 b_req b_dec
    if [[ $name == pc-rl-redis && $phase == tput ]]; then
        count=1
        redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/rlload-r$round-before.txt"
        b_req=$(gw_counter gw-rl-redis http_requests_total)
        b_dec=$(gw_counter gw-rl-redis ratelimit_redis_decision_seconds_count)
    fi
    BENCH_METHOD=$method BENCH_SEQ_HEADER=$hdr BENCH_KEY_PREFIX="$RUN_ID-$phase$round-$name" \
        BENCH_DELAY_MS=$delay BENCH_AUTH=$([[ $auth == auth ]] && echo "$BENCH_API_KEY") \
        taskset -c "$CLIENT_CPU" timeout $((secs + 20)) \
        wrk -t1 -c"$conns" -d"${secs}s" --timeout 5s --latency -s "$BENCH/wrk/bench.lua" "$url" >"$file" 2>&1 || true
    printf '%s\t%s\t%s\t%s\t%s\n' "$phase" "$round" "$name" "$group" \
        "$(python3 "$BENCH/benchtool.py" parse-wrk "$file")" >>"$RAW/runs.tsv"
    if [[ $count == 1 ]]; then
        sleep 0.2 # let the requests wrk abandoned at the end finish
        redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/rlload-r$round-after.txt"
        local a_req a_dec evals cmds
        a_req=$(gw_counter gw-rl-redis http_requests_total)
        a_dec=$(gw_counter gw-rl-redis ratelimit_redis_decision_seconds_count)
        IFS=$'\t' read -r evals cmds _ < <(python3 "$BENCH/benchtool.py" delta-cmdstats "$RAW/rlload-r$round-before.txt" "$RAW/rlload-r$round-after.txt" 1)
        printf '%s\t%s\t%s\t%s\t%.0f\t%.0f\n' "$round" "$(tail -1 "$RAW/runs.tsv" | cut -f8)" $((a_req - b_req)) $((a_dec - b_dec)) "$evals" "$cmds" >>"$RAW/rl-redis-load.tsv"
    fi
    # RSS growth of the memory idempotency stores: VmRSS and the store's own accounting after
    # every throughput run, against the cumulative number of keyed first executions.
    if [[ $phase == tput && ( $name == pc-keyed-mem || $name == pc-rl-keyed-mem ) ]]; then
        local g=gw-mem
        [[ $name == pc-rl-keyed-mem ]] && g=gw-rl-mem
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$round" \
            "$(awk -F'\t' -v t="$name" '$3 == t { s += $8 } END { print s + 0 }' "$RAW/runs.tsv")" \
            "$(awk '/^VmRSS/ {print $2}' "/proc/${GW_PID[$g]}/status" 2>/dev/null || echo 0)" \
            "$(gw_counter "$g" idempotency_stored_bytes)" >>"$RAW/mem-growth.tsv"
    fi
    log "$phase r$round $name: $(grep -m1 Requests/sec "$file" | awk '{print $2}') req/s"
}

spec_of() { local s; for s in "${TARGETS[@]}"; do [[ ${s%%|*} == "$1" ]] && { echo "$s"; return; }; done; return 1; }

log "warm-up: 1 s per target"
for spec in "${TARGETS[@]}"; do run_wrk warm 0 "$spec" 1 "$CONNS" 0; done

log "throughput: $ROUNDS rounds x ${#TARGETS[@]} targets x $DURATION s"
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${TARGETS[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do order+=("${TARGETS[i]}"); done
    fi
    log "round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    for spec in "${order[@]}"; do run_wrk tput "$r" "$spec" "$DURATION" "$CONNS" 0; done
done

# Keyed targets must measure stores, not refusals (503 idempotency-store-full) or errors.
BAD_KEYED=$(awk -F'\t' '$1 == "tput" && $3 ~ /keyed/ && $9 > 0 { printf "%s r%s: %s non-2xx; ", $3, $2, $9 }' "$RAW/runs.tsv")
if [[ -n $BAD_KEYED ]]; then log "WARNING: keyed targets answered non-2xx: $BAD_KEYED"; else log "keyed targets: every answer 2xx"; fi

# --------------------------------------------------------------------------- open-loop latency
# Each pair: mode | nginx reference (its saturation rate sets the offered rates) | Portcullis.
OL_PAIRS=("pass-through GET|nginx|pc-pass" "local rate limit GET|nginx-limit|pc-rl-local" "keyed POST|nginx-post|pc-keyed-mem")
OL_PCTS=(25 50 75)
# openloop_run ROUND TARGET RATE PCT: one bench-openloop run, appended to $RAW/openloop.tsv.
openloop_run() {
    local round=$1 t=$2 rate=$3 pct=$4 name group url method hdr auth
    IFS='|' read -r name group url method hdr auth <<<"$(spec_of "$t")"
    local hostport=${url#http://} args=()
    hostport=${hostport%%/*}
    args=(--addr "$hostport" --path "/${url#http://*/}" --method "$method" --rate "$rate"
        --duration "$LAT_DURATION" --warmup 1 --conns "$LAT_CONNS")
    if [[ $method == POST ]]; then
        args+=(--header "Content-Type: application/json" --body '{"item":"book","qty":1,"note":"portcullis benchmark payload"}')
    fi
    [[ -n $hdr ]] && args+=(--seq-header "$hdr" --seq-prefix "$RUN_ID-ol$round-$pct-$name")
    [[ $auth == auth ]] && args+=(--header "Authorization: Bearer $BENCH_API_KEY")
    local file=$RAW/ol-r$round-$pct-$t.json
    taskset -c "$CLIENT_CPU" timeout $((LAT_DURATION + 30)) "$BIN/bench-openloop" "${args[@]}" >"$file" 2>"$file.err" || true
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$pct" "$rate" "$(tr -d '\n' <"$file")" >>"$RAW/openloop.tsv"
    log "open loop r$round $t at $pct % ($rate req/s): $(cat "$file")"
}
openloop_latency() {
    : >"$RAW/openloop.tsv"
    declare -A sat
    local pair mode ref pc r pct rate
    for pair in "${OL_PAIRS[@]}"; do
        IFS='|' read -r mode ref pc <<<"$pair"
        sat[$ref]=$(awk -F'\t' -v t="$ref" '$1 == "tput" && $3 == t { print $5 }' "$RAW/runs.tsv" | sort -g |
            awk '{ a[NR] = $1 } END { if (NR) printf "%.0f", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
        [[ -n ${sat[$ref]} && ${sat[$ref]} -gt 0 ]] || { echo "no saturation rate for $ref" >&2; return 1; }
    done
    log "open-loop latency: $LAT_ROUNDS rounds x ${#OL_PCTS[@]} rates x ${#OL_PAIRS[@]} pairs x (${LAT_DURATION} + 1) s"
    for ((r = 1; r <= LAT_ROUNDS; r++)); do
        for pct in "${OL_PCTS[@]}"; do
            for pair in "${OL_PAIRS[@]}"; do
                IFS='|' read -r mode ref pc <<<"$pair"
                rate=$((sat[$ref] * pct / 100))
                # Alternate which of the two goes first, as the throughput rounds do.
                if ((r % 2)); then
                    openloop_run "$r" "$ref" "$rate" "$pct"; openloop_run "$r" "$pc" "$rate" "$pct"
                else
                    openloop_run "$r" "$pc" "$rate" "$pct"; openloop_run "$r" "$ref" "$rate" "$pct"
                fi
            done
        done
    done
    local spec=""
    for pair in "${OL_PAIRS[@]}"; do IFS='|' read -r mode ref pc <<<"$pair"; spec+="$mode|$ref|$pc|${sat[$ref]};"; done
    python3 "$BENCH/benchtool.py" openloop-summary "$RAW/openloop.tsv" "$spec" "$LAT_CONNS" "$LAT_DURATION" "$LAT_ROUNDS" >"$OUT/openloop.md"
}
openloop_latency

# --------------------------------------------------------------------------- store round trips
BODY_FILE=$TMP/body.json
printf '%s' '{"item":"book","qty":1,"note":"portcullis benchmark payload"}' >"$BODY_FILE"
# keyed_batch PORT PREFIX N [AUTH_KEY] -> "<201 count> <replayed count>" (one keep-alive connection)
keyed_batch() {
    local port=$1 prefix=$2 n=$3 key=${4:-} cfg=$TMP/curl-$2.cfg i
    : >"$cfg"
    for ((i = 1; i <= n; i++)); do
        printf 'url = "http://127.0.0.1:%s/orders"\nrequest = "POST"\nheader = "Idempotency-Key: %s-%d"\nheader = "Content-Type: application/json"\ndata-binary = "@%s"\noutput = "/dev/null"\nwrite-out = "%%{http_code} %%header{idempotent-replayed}\\n"\n' \
            "$port" "$prefix" "$i" "$BODY_FILE" >>"$cfg"
        if [[ -n $key ]]; then printf 'header = "Authorization: Bearer %s"\n' "$key" >>"$cfg"; fi
        if ((i < n)); then echo "next" >>"$cfg"; fi
    done
    timeout 120 curl -s -K "$cfg" | awk '$1 == 201 { ok++ } $2 == "true" { rep++ } END { printf "%d %d\n", ok, rep }'
}
# get_batch PORT N KEY -> "<200 count> <429 count>" (N GETs with the tenant key, one connection)
get_batch() {
    local port=$1 n=$2 key=$3 cfg=$TMP/curl-get-$1.cfg i
    : >"$cfg"
    for ((i = 1; i <= n; i++)); do
        printf 'url = "http://127.0.0.1:%s/x"\nheader = "Authorization: Bearer %s"\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n' "$port" "$key" >>"$cfg"
        if ((i < n)); then echo "next" >>"$cfg"; fi
    done
    timeout 120 curl -s -K "$cfg" | awk '$1 == 200 { ok++ } $1 == 429 { rej++ } END { printf "%d %d\n", ok, rej }'
}
segs() { ss -Htin state established "( sport = :$1 )" >"$2"; }

log "store round trips: $RT_N first executions + $RT_N replays per store"
{
    echo "### Store round trips per keyed request"
    echo
    echo "$RT_N keyed POSTs with fresh keys (first executions), then the same $RT_N keys again (replays),"
    echo "sequentially over one keep-alive connection (curl -K). *Commands* are counted by the store"
    echo "(Redis \`INFO commandstats\` deltas; PostgreSQL \`pg_stat_statements\` calls, utility statements"
    echo "such as BEGIN/COMMIT included); *segments* are TCP data segments the store's listening socket"
    echo "received from the gateway (\`ss -ti\` \`data_segs_in\` deltas over established connections) — one"
    echo "per request message, so this also counts what the statement statistics cannot see (e.g. sqlx"
    echo "connection pings, Sync-only messages). Goal: 2 round trips for a first execution"
    echo "(lock, complete), 1 for a replay."
    echo
    echo "| store | phase | answers 201 / replayed | commands per request (Redis: incl. those run inside Lua) | EVAL/EVALSHA per request | segments into store per request | detail (per request) |"
    echo "|---|---|---:|---:|---:|---:|---|"
} >"$OUT/roundtrips.md"

# Redis
for phase in first replay; do
    redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/redis-$phase-before.txt"
    segs "$REDIS_PORT" "$RAW/redis-$phase-segs-before.txt"
    got=$(keyed_batch "$GW_REDIS" "rt-$RUN_ID-redis" "$RT_N")
    redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/redis-$phase-after.txt"
    segs "$REDIS_PORT" "$RAW/redis-$phase-segs-after.txt"
    IFS=$'\t' read -r evals cmds detail < <(python3 "$BENCH/benchtool.py" delta-cmdstats "$RAW/redis-$phase-before.txt" "$RAW/redis-$phase-after.txt" "$RT_N")
    IFS=$'\t' read -r segper _ < <(python3 "$BENCH/benchtool.py" delta-segs "$RAW/redis-$phase-segs-before.txt" "$RAW/redis-$phase-segs-after.txt" "$RT_N")
    echo "| Redis | $phase | ${got// / \/ } | $cmds | $evals | $segper | $detail |" >>"$OUT/roundtrips.md"
done

# PostgreSQL
for phase in first replay; do
    psql_ -c "select pg_stat_statements_reset()" >/dev/null
    segs "$PG_PORT" "$RAW/pg-$phase-segs-before.txt"
    got=$(keyed_batch "$GW_PG" "rt-$RUN_ID-pg" "$RT_N")
    segs "$PG_PORT" "$RAW/pg-$phase-segs-after.txt"
    psql_ -F $'\t' -c "select calls, regexp_replace(query, '\s+', ' ', 'g') from pg_stat_statements
        where query !~* 'pg_stat_statements' and dbid = (select oid from pg_database where datname = 'postgres')
        order by calls desc" >"$RAW/pg-$phase-statements.tsv"
    IFS=$'\t' read -r segper _ < <(python3 "$BENCH/benchtool.py" delta-segs "$RAW/pg-$phase-segs-before.txt" "$RAW/pg-$phase-segs-after.txt" "$RT_N")
    stmts=$(awk -F'\t' -v n="$RT_N" '{ s += $1 } END { printf "%.2f", s / n }' "$RAW/pg-$phase-statements.tsv")
    detail=$(awk -F'\t' -v n="$RT_N" '$1 > 0 { q = substr($2, 1, 60); gsub(/\|/, "\\|", q); printf "%s%.2f× `%s…`", sep, $1 / n, q; sep = "; " }' "$RAW/pg-$phase-statements.tsv")
    echo "| PostgreSQL | $phase | ${got// / \/ } | $stmts | – | $segper | $detail |" >>"$OUT/roundtrips.md"
done

# --------------------------------------------------------------------------- pgbench anchor
# What the database itself does for the PostgreSQL store's two statements (bench/pg-anchor.sh),
# on the same server, with as many clients as gw-pg has connections, against pc-keyed-pg.
# shellcheck source=bench/pg-anchor.sh
source "$BENCH/pg-anchor.sh"
PG_POOL=${PG_POOL_SIZE:-$(($(nproc) * 8 < 16 ? 16 : ($(nproc) * 8 > 64 ? 64 : $(nproc) * 8)))} # = default_pool_size()
log "pgbench anchor: $PG_POOL clients, $ROUNDS x $DURATION s"
ANCHOR_TPS=$(pgbench_anchor "$PGBIN" "$PG_PORT" "$PG_POOL" "$DURATION" "$ROUNDS" "$CLIENT_CPU" "$RAW")
{
    echo
    echo "### PostgreSQL idempotency: pgbench anchor"
    echo
    echo "\`pgbench -M prepared -c $PG_POOL -j 1\` on CPU $CLIENT_CPU running \`bench/pgbench/idempotency.sql\` (the"
    echo "store's try_lock + complete, one implicit transaction each) against the harness's PostgreSQL;"
    echo "median of $ROUNDS × $DURATION s. *pc-keyed-pg* is the median of its throughput rounds above."
    echo
    echo "| pgbench first executions/s | pc-keyed-pg req/s | pc-keyed-pg / pgbench |"
    echo "|---:|---:|---:|"
    PG_RPS=$(awk -F'\t' '$1 == "tput" && $3 == "pc-keyed-pg" { print $5 }' "$RAW/runs.tsv" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    awk -v a="$ANCHOR_TPS" -v m="$PG_RPS" 'BEGIN { printf "| %.0f | %.0f | %.2f |\n", a, m, (a > 0 ? m / a : 0) }'
} >"$OUT/pg-anchor.md"

# Redis rate limiter: GETs (rate limit only), then keyed POSTs (rate limit + idempotency)
{
    echo
    echo "### Redis commands per rate-limited request"
    echo
    echo "Through \`gw-rl-redis\` (\`storage.state\` = Redis: tenant + global bucket in one Lua script;"
    echo "idempotency in the same Redis for POST/PATCH), $RT_N requests sequentially over one keep-alive"
    echo "connection. *Decisions* = the gateway's \`ratelimit_redis_decision_seconds\` count. Goal:"
    echo "exactly 1 Redis round trip (1 EVALSHA) per rate-limit decision; the idempotency store adds its own"
    echo "2 (first execution) / 1 (replay), measured above."
    echo
    echo "| requests | answers 200-or-201 / 429 (or replayed) | Redis decisions per request | commands per request (incl. inside Lua) | EVALSHA per request | EVALSHA for the rate limit per request | segments into Redis per request | detail (per request) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
} >"$OUT/rl-roundtrips.md"
for phase in get first replay; do
    redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/rlredis-$phase-before.txt"
    segs "$REDIS_PORT" "$RAW/rlredis-$phase-segs-before.txt"
    d0=$(gw_counter gw-rl-redis ratelimit_redis_decision_seconds_count)
    if [[ $phase == get ]]; then
        got=$(get_batch "$GW_RL_REDIS" "$RT_N" "$BENCH_API_KEY") idem=0 what="GET (rate limit only)"
    else
        got=$(keyed_batch "$GW_RL_REDIS" "rt-$RUN_ID-rlredis" "$RT_N" "$BENCH_API_KEY")
        if [[ $phase == first ]]; then idem=2 what="keyed POST, first execution"; else idem=1 what="keyed POST, replay"; fi
    fi
    d1=$(gw_counter gw-rl-redis ratelimit_redis_decision_seconds_count)
    redis-cli -p "$REDIS_PORT" info commandstats >"$RAW/rlredis-$phase-after.txt"
    segs "$REDIS_PORT" "$RAW/rlredis-$phase-segs-after.txt"
    IFS=$'\t' read -r evals cmds detail < <(python3 "$BENCH/benchtool.py" delta-cmdstats "$RAW/rlredis-$phase-before.txt" "$RAW/rlredis-$phase-after.txt" "$RT_N")
    IFS=$'\t' read -r segper _ < <(python3 "$BENCH/benchtool.py" delta-segs "$RAW/rlredis-$phase-segs-before.txt" "$RAW/rlredis-$phase-segs-after.txt" "$RT_N")
    rl_evals=$(awk -v e="$evals" -v i="$idem" 'BEGIN { printf "%.2f", e - i }')
    dec=$(awk -v a="$d0" -v b="$d1" -v n="$RT_N" 'BEGIN { printf "%.2f", (b - a) / n }')
    echo "| $RT_N × $what | ${got// / \/ } | $dec | $cmds | $evals | $rl_evals | $segper | $detail |" >>"$OUT/rl-roundtrips.md"
done

# --------------------------------------------------------------------------- peak memory
rss_line() { # NAME WHAT PID
    local hwm cur
    hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$3/status" 2>/dev/null || echo 0)
    cur=$(awk '/^VmRSS/ {print $2}' "/proc/$3/status" 2>/dev/null || echo 0)
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${hwm:-0}" "${cur:-0}"
}
{
    for g in gw-pass gw-mem gw-redis gw-pg gw-rl gw-rl-mem gw-rl-redis; do rss_line "portcullis $g" "${GW_WHAT[$g]}" "${GW_PID[$g]}"; done
    if [[ $JEMALLOC == 1 ]]; then rss_line "portcullis gw-pass-je" "${GW_WHAT[gw-pass-je]}" "${GW_PID[gw-pass-je]}"; fi
    rss_line "nginx worker" "GET + POST proxy_pass, limit_req" "$NGX_WORKER"
    if [[ -n $HAP_PID ]]; then rss_line "haproxy" "GET proxy, stick-table rate check" "$HAP_PID"; fi
    if [[ -n $CADDY_PID ]]; then rss_line "caddy" "GET reverse_proxy" "$CADDY_PID"; fi
    if [[ -n $PINGORA_PID ]]; then rss_line "bench-pingora-proxy" "GET proxy" "$PINGORA_PID"; fi
    rss_line "bench-upstream" "every target" "$UP_PID"
    rss_line "redis-server" "idempotency records" "$REDIS_PID"
} >"$RAW/rss.tsv"

# --------------------------------------------------------------------------- profile
if [[ $PROFILE == 1 ]]; then
    log "profile: CPU per request, syscalls per request, perf record"
    ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
    ctxsw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'; }
    HZ=$(getconf CLK_TCK)
    {
        echo "### Where the time goes (wrk -c$CONNS, 4 s per measurement)"
        echo
        echo "CPU time from \`/proc/PID/stat\` (utime+stime, all threads) over a saturated 4 s run;"
        echo "syscalls from \`strace -c -f -p PID\` over a 3 s run (strace slows the process; the counts per"
        echo "request stay meaningful). Requests = wrk's completed count."
        echo
        echo "| proxy | req/s | proxy CPU µs/req | backend CPU µs/req | proxy context switches/req | backend context switches/req | proxy syscalls/req | top syscalls (per request) |"
        echo "|---|---:|---:|---:|---:|---:|---:|---|"
    } >"$OUT/profile.md"
    PAIRS=("nginx:$NGX_WORKER" "pc-pass:${GW_PID[gw-pass]}" "pc-rl-local:${GW_PID[gw-rl]}"
        "nginx-limit-post:$NGX_WORKER" "pc-rl-keyed-mem:${GW_PID[gw-rl-mem]}")
    [[ $JEMALLOC == 1 ]] && PAIRS+=("pc-pass-je:${GW_PID[gw-pass-je]}")
    for pair in "${PAIRS[@]}"; do
        t=${pair%%:*} pid=${pair#*:}
        spec=$(spec_of "$t")
        p0=$(ticks "$pid") u0=$(ticks "$UP_PID") c0=$(ctxsw "$pid") cu0=$(ctxsw "$UP_PID")
        run_wrk prof 1 "$spec" 4 "$CONNS" 0
        p1=$(ticks "$pid") u1=$(ticks "$UP_PID") c1=$(ctxsw "$pid") cu1=$(ctxsw "$UP_PID")
        req=$(tail -1 "$RAW/runs.tsv" | cut -f8) rps=$(tail -1 "$RAW/runs.tsv" | cut -f5)
        timeout 30 strace -c -f -p "$pid" -o "$RAW/strace-$t.txt" &
        ST=$!
        sleep 1
        run_wrk prof 2 "$spec" 3 "$CONNS" 0
        kill -INT "$ST" 2>/dev/null
        wait "$ST" 2>/dev/null || true
        sreq=$(tail -1 "$RAW/runs.tsv" | cut -f8)
        IFS=$'\t' read -r scalls top < <(python3 "$BENCH/benchtool.py" strace-summary "$RAW/strace-$t.txt" "$sreq")
        awk -v t="$t" -v rps="$rps" -v req="$req" -v dp=$((p1 - p0)) -v du=$((u1 - u0)) -v hz="$HZ" -v sc="$scalls" -v top="$top" \
            -v cp=$((c1 - c0)) -v cu=$((cu1 - cu0)) \
            'BEGIN { printf "| %s | %.0f | %.1f | %.1f | %.2f | %.2f | %s | %s |\n", t, rps, dp * 1e6 / hz / req, du * 1e6 / hz / req, cp / req, cu / req, sc, top }' >>"$OUT/profile.md"
    done
    if command -v perf >/dev/null; then
        (sleep 1; timeout 20 perf record -F 2000 -g -o "$RAW/perf-gateway.data" -p "${GW_PID[gw-pass]}" -- sleep 4 >/dev/null 2>&1) &
        PR=$!
        run_wrk prof 3 "$(spec_of pc-pass)" 6 "$CONNS" 0
        wait "$PR" || true
        perf report -i "$RAW/perf-gateway.data" --no-children -g none --sort dso --stdio >"$RAW/perf-dso-full.txt" 2>/dev/null || true
        perf report -i "$RAW/perf-gateway.data" --no-children -g none --sort symbol --stdio >"$RAW/perf-symbols-full.txt" 2>/dev/null || true
        # Drop comments/blank lines and perf's trailing padding columns; keep the top lines.
        clean() { awk '!/^#/ && NF { sub(/[[:space:]]+-[[:space:]]+-[[:space:]]*$/, ""); sub(/[[:space:]]+$/, ""); print }' "$1" | awk -v n="$2" 'NR <= n'; }
        clean "$RAW/perf-dso-full.txt" 8 >"$RAW/perf-dso.txt"
        clean "$RAW/perf-symbols-full.txt" 30 >"$RAW/perf-symbols.txt"
        # Share of samples in glibc's allocator and memcpy, summed over symbols.
        ALLOC=$(awk '!/^#/ && /\[\.\] (_int_malloc|_int_free|malloc|cfree|free|realloc|_int_realloc|unlink_chunk|malloc_consolidate|__memmove|__memcpy|__memset)/ { sub(/%/, "", $1); s += $1 } END { printf "%.1f", s }' "$RAW/perf-symbols-full.txt")
        {
            echo
            echo "perf record -F 2000 -g of the pass-through gateway under load (cpu-clock; no hardware counters in this VM):"
            echo
            echo '```'
            echo "# by DSO"
            cat "$RAW/perf-dso.txt"
            echo "# top symbols (self)"
            cat "$RAW/perf-symbols.txt"
            echo '```'
            echo
            echo "glibc malloc/free/memmove family: ${ALLOC} % of all samples."
        } >>"$OUT/profile.md"
    fi
fi

# --------------------------------------------------------------------------- retry amplification
if [[ $AMP == 1 ]]; then
    log "retry amplification: $AMP_RATE req/s, ${AMP_WARMUP}s healthy, ${AMP_OUTAGE}s of 503, ${AMP_AFTER}s recovered"
    taskset -c "$SUT_CPU" "$BIN/bench-upstream" --port "$AMP_UP" --threads 1 >"$RAW/amp-upstream.log" 2>&1 &
    AMP_UP_PID=$!
    PIDS+=("$AMP_UP_PID")
    wait_http "http://127.0.0.1:$AMP_UP/__bench/stats"
    DEFAULTS_EXTRA='retry = { total = "5s" }   # everything else: shipped defaults (full jitter, base 1s, cap 30s, max_retries 3, budget 20 % / 30 s, floor 1/s; breaker 0.5 / 20 / 30s / open 10s / 3 probes)'
    NAIVE_EXTRA='retry = { max_retries = 3, base = "10ms", cap = "10ms", total = "5s", budget_percent = 50 }
circuit_breaker = { failure_rate = 1.0, min_requests = 1000000 }   # effectively off'
    {
        echo "### Retry amplification"
        echo
        echo "Open-loop client (\`bench/benchtool.py openloop\`, one new connection per request, each a distinct operation (\`?op=N\`), CPU $CLIENT_CPU):"
        echo "GET at a constant $AMP_RATE req/s; backend healthy for ${AMP_WARMUP} s, then \`503\` (no \`Retry-After\`)"
        echo "for every request for ${AMP_OUTAGE} s, then healthy for ${AMP_AFTER} s. *Attempts* = requests the backend"
        echo "received between the two switches; *requests* = client requests sent in that interval."
        echo "Goal: attempts / requests ≤ 1.25 during the outage."
        echo
        echo "| config | client requests in outage | backend attempts | attempts / request | attempts by number (1st, 2nd, 3rd, 4th) | client answers during outage | client p50 / p99 during outage | first success after recovery | all OK after |"
        echo "|---|---:|---:|---:|---|---|---:|---:|---:|"
    } >"$OUT/amplification.md"
    for cfg in defaults naive; do
        if [[ $cfg == defaults ]]; then extra=$DEFAULTS_EXTRA port=$GW_AMP; else extra=$NAIVE_EXTRA port=$GW_AMP2; fi
        write_config "gw-amp-$cfg" "$port" memory 0 "$AMP_UP" "$extra"
        start_gateway "gw-amp-$cfg" "$port" "retry scenario"
        curl -fs -o /dev/null "http://127.0.0.1:$AMP_UP/__bench/ok"
        curl -fs -o /dev/null "http://127.0.0.1:$AMP_UP/__bench/reset"
        taskset -c "$CLIENT_CPU" timeout $((AMP_WARMUP + AMP_OUTAGE + AMP_AFTER + 60)) \
            python3 "$BENCH/benchtool.py" openloop --url "http://127.0.0.1:$port/amp" \
            --control "http://127.0.0.1:$AMP_UP/__bench" --rate "$AMP_RATE" --warmup "$AMP_WARMUP" \
            --outage "$AMP_OUTAGE" --after "$AMP_AFTER" --timeout 10 --label "$cfg" >"$RAW/amp-$cfg.json"
        curl -fs "http://127.0.0.1:${GW_ADMIN[gw-amp-$cfg]}/metrics" | grep -E '^(retry_|circuit_breaker|upstream_)' >"$RAW/amp-$cfg-metrics.txt" || true
        python3 - "$RAW/amp-$cfg.json" "$cfg" >>"$OUT/amplification.md" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a = d["outage_attempts_by_number"]
f = lambda x, s: "–" if x is None else format(x, s)
st = ", ".join(f"{k}: {v}" for k, v in sorted(d["outage_client_statuses"].items(), key=lambda kv: -kv[1]))
print(f"| {sys.argv[2]} | {d['outage_requests']} | {d['outage_attempts']} | {f(d['amplification'], '.3f')} | "
      f"{a[0]}, {a[1]}, {a[2]}, {a[3]} | {st} | {f(d['outage_client_p50_s'], '.3f')} s / {f(d['outage_client_p99_s'], '.3f')} s | "
      f"{f(d['first_success_after_recovery_s'], '.3f')} s | {f(d['all_ok_after_s'], '.3f')} s |")
PY
        pid=${GW_PID[gw-amp-$cfg]}
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        log "amplification $cfg: $(tail -1 "$OUT/amplification.md")"
    done
    {
        echo
        echo "Configurations (upstream section; route \`/\`, no idempotency):"
        echo
        echo '```toml'
        echo "# defaults"
        echo "$DEFAULTS_EXTRA"
        echo "# naive"
        echo "$NAIVE_EXTRA"
        echo '```'
    } >>"$OUT/amplification.md"
fi

# --------------------------------------------------------------------------- store memory
for g in gw-pass gw-mem gw-redis gw-pg gw-rl gw-rl-mem gw-rl-redis; do
    curl -fs --max-time 5 "http://127.0.0.1:${GW_ADMIN[$g]}/metrics" >"$RAW/metrics-$g.txt" || true
done
redis-cli -p "$REDIS_PORT" info memory >"$RAW/redis-memory.txt" 2>/dev/null || true
{
    echo "keyed_mem_requests=$(awk -F'\t' '$3 == "pc-keyed-mem" { s += $8 } END { print s + 0 }' "$RAW/runs.tsv")"
    echo "mem_stored_bytes=$(awk '/^idempotency_stored_bytes/ { print $NF }' "$RAW/metrics-gw-mem.txt" | sed -n 1p)"
    echo "memory_max_bytes=$MEMORY_MAX_BYTES"
    echo "mem_evictions=$(awk '/^idempotency_evictions_total/ { s += $NF } END { print s + 0 }' "$RAW/metrics-gw-mem.txt")"
    echo "rl_mem_keyed_requests=$(awk -F'\t' '$3 == "pc-rl-keyed-mem" { s += $8 } END { print s + 0 }' "$RAW/runs.tsv")"
    echo "rl_mem_stored_bytes=$(awk '/^idempotency_stored_bytes/ { print $NF }' "$RAW/metrics-gw-rl-mem.txt" | sed -n 1p)"
    echo "rl_rejected=$(cat "$RAW"/metrics-gw-rl*.txt | awk '/^ratelimit_decisions_total/ && /outcome="rejected"/ { s += $NF } END { print s + 0 }')"
    echo "rl_fallback=$(cat "$RAW"/metrics-gw-rl*.txt | awk '/^ratelimit_fallback_decisions_total/ { s += $NF } END { print s + 0 }')"
    echo "redis_keys=$(redis-cli -p "$REDIS_PORT" dbsize 2>/dev/null)"
    echo "redis_used_memory=$(awk -F: '/^used_memory:/ { print $2 }' "$RAW/redis-memory.txt" | tr -d '\r')"
    echo "pg_records=$(psql_ -c 'select count(*) from idempotency_records' 2>/dev/null)"
    echo "pg_table_bytes=$(psql_ -c "select pg_total_relation_size('idempotency_records')" 2>/dev/null)"
    echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
} >>"$RAW/meta.env"

# --------------------------------------------------------------------------- report
python3 "$BENCH/benchtool.py" summarize "$OUT" >"$OUT/report.md"
cp "$OUT/report.md" "$BENCH/results/latest.md"
cat "$OUT/report.md"
log "report: $BENCH/results/latest.md (raw data in $OUT)"
