#!/usr/bin/env bash
# PostgreSQL idempotency store only (a few minutes instead of bench/run.sh's ten): on one
# PostgreSQL started like bench/run.sh's (default durability: fsync and synchronous_commit on),
# everything under test on CPU $SUT_CPU, clients on CPU $CLIENT_CPU:
#   1. anchor: pgbench running the store's two statements (bench/pg-anchor.sh), PG_CONNS clients;
#   2. store: the criterion harness `postgres_store` (idempotency/benches/store.rs), PG_CONNS
#      first executions in flight on PG_CONNS connections, one client thread;
#   3. gateway: keyed POSTs (wrk -t1 -cCONNS, bench/wrk/bench.lua, every request a first
#      execution) through a memory-store gateway and a PostgreSQL-store gateway
#      (storage.postgres_pool_size = PG_CONNS), ROUNDS alternating rounds of DURATION s.
#   4. with BEFORE_BIN=/path/to/an/older/portcullis, a third gateway on that binary (same
#      PostgreSQL, no postgres_pool_size: an A/B of two builds in the same rounds).
# Usage: bench/pg.sh [--no-build]. Environment: PG_CONNS [store default], ROUNDS [3],
# DURATION [5], CONNS [64], CLIENT_CPU [0], SUT_CPU [1], CARGO_TARGET_DIR [<repo>/target-bench],
# BEFORE_BIN [unset].
# Run as root (PostgreSQL runs as user postgres). Every process started here is stopped by PID.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
BIN=$CARGO_TARGET_DIR/release
BUILD=1
for arg in "$@"; do
    case $arg in
        --no-build) BUILD=0 ;;
        *) echo "usage: bench/pg.sh [--no-build]" >&2; exit 2 ;;
    esac
done
NPROC=$(nproc)
DEFAULT_CONNS=$((NPROC * 8 < 16 ? 16 : (NPROC * 8 > 64 ? 64 : NPROC * 8))) # = default_pool_size()
PG_CONNS=${PG_CONNS:-$DEFAULT_CONNS} ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5} CONNS=${CONNS:-64}
CLIENT_CPU=${CLIENT_CPU:-0} SUT_CPU=${SUT_CPU:-1}
for v in PG_CONNS ROUNDS DURATION CONNS; do
    [[ ${!v} =~ ^[0-9]+$ ]] && ((${!v} > 0 && ${!v} <= 1000)) || { echo "$v=${!v}: want 1..1000" >&2; exit 2; }
done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
[[ -n $PGBIN && -x $PGBIN/pgbench ]] || { echo "missing PostgreSQL server binaries with pgbench" >&2; exit 1; }
log() { printf '[pg-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ $BUILD == 1 ]]; then
    (cd "$ROOT" && cargo build --release -p portcullis-gateway -p portcullis-testkit \
        && cargo bench -p portcullis-idempotency --bench store --no-run)
fi

OUT=$BENCH/results/pg-$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/raw
mkdir -p "$RAW"
TMP=$(mktemp -d /tmp/portcullis-pgbench.XXXXXX)
chmod 755 "$TMP"
PGDATA=$TMP/pg PG_STARTED=0 PIDS=()
cleanup() {
    local rc=$? pid
    set +e
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 1 30); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    [[ $PG_STARTED == 1 ]] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 10 stop >/dev/null 2>&1
    wait 2>/dev/null
    rm -rf "$TMP"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=bench/lib.sh
source "$BENCH/lib.sh"

# PostgreSQL exactly as bench/run.sh starts it.
PG_PORT=$(free_port)
mkdir -p "$PGDATA" && chown postgres "$PGDATA"
runuser -u postgres -- "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres --no-sync >"$RAW/initdb.log" 2>&1
PG_STARTED=1
taskset -c "$SUT_CPU" runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$PGDATA -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
    start >"$RAW/pg_ctl.log" 2>&1
PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
echo "postgres=$("$PGBIN/postgres" --version) commit=$(git -C "$ROOT" rev-parse --short HEAD) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" >"$RAW/meta.txt"

# 1. anchor
# shellcheck source=bench/pg-anchor.sh
source "$BENCH/pg-anchor.sh"
log "pgbench anchor: $PG_CONNS clients, $ROUNDS x $DURATION s"
ANCHOR=$(pgbench_anchor "$PGBIN" "$PG_PORT" "$PG_CONNS" "$DURATION" "$ROUNDS" "$CLIENT_CPU" "$RAW")
log "anchor: $ANCHOR first executions/s"

# 2. store harness (criterion: "thrpt: [lo mid hi]")
log "store harness: $PG_CONNS connections"
(cd "$ROOT" && PORTCULLIS_TEST_DATABASE_URL=$PG_URL PORTCULLIS_BENCH_PG_CONNS=$PG_CONNS \
    taskset -c "$CLIENT_CPU" cargo bench -p portcullis-idempotency --bench store -- postgres_store) >"$RAW/store-bench.txt" 2>&1 || true
STORE=$(awk '/thrpt:/ && !seen { seen = 1; for (i = 1; i <= NF; i++) if ($i ~ /^\[/ ) { v = $(i + 2); u = $(i + 3); break } }
    END { if (u ~ /^Kelem/) v *= 1000; printf "%.0f\n", v }' "$RAW/store-bench.txt")
log "store: $STORE first executions/s"

# 3. gateways
UP=$(free_port)
taskset -c "$SUT_CPU" "$BIN/bench-upstream" --port "$UP" --threads 1 >"$RAW/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UP/__bench/stats" 200
declare -A PORT
GATEWAYS=(mem pg)
[[ -n ${BEFORE_BIN:-} ]] && GATEWAYS+=(pg-before)
for g in "${GATEWAYS[@]}"; do
    PORT[$g]=$(free_port)
    store=memory
    [[ $g == pg* ]] && store=$PG_URL
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\nworker_threads = 1\n\n' "${PORT[$g]}" "$(free_port)"
        printf '[storage]\nidempotency = "%s"\ndatabase = "sqlite://%s/%s.db"\n' "$store" "$TMP" "$g"
        [[ $g == pg ]] && printf 'postgres_pool_size = %s\n' "$PG_CONNS"
        printf '\n[[upstreams]]\nname = "backend"\nendpoints = ["http://127.0.0.1:%s"]\n\n' "$UP"
        printf '[[routes]]\nprefix = "/"\nupstream = "backend"\nidempotency = { methods = ["POST", "PATCH"] }\n'
    } >"$TMP/gw-$g.toml"
    cp "$TMP/gw-$g.toml" "$RAW/"
    gw_bin=$BIN/portcullis
    [[ $g == pg-before ]] && gw_bin=$BEFORE_BIN
    taskset -c "$SUT_CPU" "$gw_bin" --config "$TMP/gw-$g.toml" >"$RAW/gw-$g.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:${PORT[$g]}/readyz" 200
done
printf 'round\tgateway\trps\tp50\tp99\tnon2xx\n' >"$RAW/gateway.tsv"
RUN_ID=$(date +%s)
for ((r = 0; r <= ROUNDS; r++)); do # round 0: 1 s warm-up, not reported
    order=("${GATEWAYS[@]}")
    ((r % 2 == 0)) && order=($(printf '%s\n' "${GATEWAYS[@]}" | tac))
    for g in "${order[@]}"; do
        secs=$DURATION
        ((r == 0)) && secs=1
        f=$RAW/wrk-r$r-$g.txt
        BENCH_METHOD=POST BENCH_SEQ_HEADER=Idempotency-Key BENCH_KEY_PREFIX="$RUN_ID-$r-$g" BENCH_DELAY_MS=0 BENCH_AUTH= \
            taskset -c "$CLIENT_CPU" timeout $((secs + 20)) wrk -t1 -c"$CONNS" -d"${secs}s" --timeout 5s --latency \
            -s "$BENCH/wrk/bench.lua" "http://127.0.0.1:${PORT[$g]}/orders" >"$f" 2>&1 || true
        ((r == 0)) && continue
        printf '%s\t%s\t%s\n' "$r" "$g" "$(python3 "$BENCH/benchtool.py" parse-wrk "$f" | cut -f1-3,5)" >>"$RAW/gateway.tsv"
        log "round $r $g: $(grep -m1 Requests/sec "$f" | awk '{print $2}') req/s"
    done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
MEM=$(awk -F'\t' '$2 == "mem" { print $3 }' "$RAW/gateway.tsv" | median)
PG=$(awk -F'\t' '$2 == "pg" { print $3 }' "$RAW/gateway.tsv" | median)
RATIO=$(awk -F'\t' '$2 == "mem" { m[$1] = $3 } $2 == "pg" { p[$1] = $3 } END { for (r in m) if (m[r] > 0) print p[r] / m[r] }' "$RAW/gateway.tsv" | median)
PGP50=$(awk -F'\t' '$2 == "pg" { print $4 }' "$RAW/gateway.tsv" | median)
{
    echo "| measure | value |"
    echo "|---|---:|"
    echo "| pgbench anchor (two statements, $PG_CONNS clients), first executions/s | $ANCHOR |"
    echo "| store harness ($PG_CONNS connections), first executions/s | $STORE |"
    echo "| store / anchor | $(awk -v s="$STORE" -v a="$ANCHOR" 'BEGIN { printf "%.2f", (a > 0 ? s / a : 0) }') |"
    echo "| gateway, memory store, keyed POST req/s | $MEM |"
    echo "| gateway, PostgreSQL store, keyed POST req/s (p50 µs) | $PG ($PGP50) |"
    echo "| PostgreSQL / memory through the gateway (median of same-round ratios) | $(printf '%.2f' "$RATIO") |"
    if [[ -n ${BEFORE_BIN:-} ]]; then
        B=$(awk -F'\t' '$2 == "pg-before" { print $3 }' "$RAW/gateway.tsv" | median)
        BR=$(awk -F'\t' '$2 == "mem" { m[$1] = $3 } $2 == "pg-before" { p[$1] = $3 } END { for (r in m) if (m[r] > 0) print p[r] / m[r] }' "$RAW/gateway.tsv" | median)
        BP50=$(awk -F'\t' '$2 == "pg-before" { print $4 }' "$RAW/gateway.tsv" | median)
        echo "| BEFORE_BIN gateway, PostgreSQL store, keyed POST req/s (p50 µs) | $B ($BP50) |"
        echo "| BEFORE_BIN PostgreSQL / memory (median of same-round ratios) | $(printf '%.2f' "$BR") |"
    fi
} | tee "$OUT/report.md"
log "report: $OUT/report.md"
