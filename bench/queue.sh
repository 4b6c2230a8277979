#!/usr/bin/env bash
# The delivery queue of asynchronous routes, measured through the release `portcullis` binary.
#
#   bench/queue.sh accept [--no-build]   (the default)
#     Accept rate: a gateway with one asynchronous route (`delivery = { mode = "async" }`,
#     everything else default: dedupe by Idempotency-Key) per engine, driven by wrk
#     (bench/wrk/accept.lua: BODY-byte JSON POSTs over CLIENTS keep-alive connections; only
#     202s count, any other status or socket error is reported), ROUNDS rounds alternating
#     with the pgbench anchors on the same PostgreSQL server, database and tables:
#       pgbench          the engine's INSERT of a message without a dedupe key
#                        (bench/pgbench/queue.sql), CLIENTS connections;
#       gw-pg            the gateway on that PostgreSQL, requests without Idempotency-Key
#                        (stored without deduplication: one insert, as pgbench);
#       pgbench-dedupe   the engine's statement for a message with a dedupe key (the dedupe
#                        record and the message, two inserts in one statement;
#                        bench/pgbench/queue-dedupe.sql);
#       gw-pg-key        the gateway on PostgreSQL, a unique Idempotency-Key on every request
#                        (the same two inserts);
#       gw-pg-held       as gw-pg, on a database of its own, with delivery held
#                        (`max_in_flight = 1, max_rate = 0.0001`): the database does only the
#                        accept's insert, as under pgbench;
#       gw-redis, gw-redis-key, gw-redis-always
#                        the gateway on Redis with `appendfsync everysec` (without and with a
#                        key), and on Redis with `appendfsync always` (without a key).
#     The upstream (bench-upstream) is up, so deliveries run during the other gateways' runs; after
#     each gateway run the script waits (at most DRAIN_WAIT s) until that gateway delivered
#     all it accepted, so no run pays for the previous one's deliveries. ENGINE=1 adds the
#     engine alone (queue/examples/enqueue_load.rs, CLIENTS pool connections) as rows
#     pg-engine and pg-engine-key. Beside each rate: the CPU time PostgreSQL's processes and the
#     gateway spent during the run, per message (from /proc; the gateway's includes the
#     deliveries it made meanwhile).
#
#   bench/queue.sh backlog [--no-build]
#     RSS while a backlog drains: a gateway on the embedded default engine (SQLite, no
#     `storage.queue`) with an asynchronous route whose delivery is held back while the
#     backlog fills (`max_in_flight = 1, max_rate = 0.0001`: one delivery, then the next
#     start is hours away); benchtool.py `fixed` sends exactly BACKLOG POSTs (BODY-byte
#     JSON, FILL_CONNS connections, each answer must be a 202); then the route is rewritten
#     to `max_in_flight = DRAIN_IN_FLIGHT` without `max_rate` and the gateway reloaded with
#     SIGHUP (delivery workers restart with the new settings), and it drains into
#     bench-upstream, which counts the distinct Portcullis-Delivery-Id values it received
#     and any repeat. VmRSS is sampled from /proc every SAMPLE s. Prints the fill and drain
#     rates, RSS at 0, 10, 50, 90 and 100 % drained, and the peak (VmHWM).
#     BACKLOG_QUEUE=redis puts the queue on a Redis server (`appendfsync everysec`) instead.
#
# PostgreSQL runs with its default durability (fsync and synchronous_commit on), as in
# bench/pg.sh. The gateways log at warn with `access_log = false` (no line per request or
# per delivery attempt; pgbench logs nothing either).
#
# Environment: CLIENTS [16], ROUNDS [3], DURATION [10] (seconds per run), BODY [512] (bytes
# per message), DRAIN_WAIT [120], ENGINE [0]; BACKLOG [1000000], FILL_CONNS [16],
# DRAIN_IN_FLIGHT [16], SAMPLE [2], FILL_TIMEOUT [3600], DRAIN_TIMEOUT [3600],
# BACKLOG_QUEUE [sqlite]; CARGO_TARGET_DIR [<repo>/target-bench]. Run as root (PostgreSQL
# runs as user postgres). Binds 127.0.0.1 only; every wait is bounded; every process started
# here is stopped by PID on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
BIN=$CARGO_TARGET_DIR/release
LOAD=$BIN/examples/enqueue_load
MODE=accept BUILD=1
for arg in "$@"; do
    case $arg in
        accept | backlog) MODE=$arg ;;
        --no-build) BUILD=0 ;;
        *) echo "usage: bench/queue.sh [accept|backlog] [--no-build]" >&2; exit 2 ;;
    esac
done
CLIENTS=${CLIENTS:-16} ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-10} BODY=${BODY:-512}
DRAIN_WAIT=${DRAIN_WAIT:-120} ENGINE=${ENGINE:-0}
BACKLOG=${BACKLOG:-1000000} FILL_CONNS=${FILL_CONNS:-16} DRAIN_IN_FLIGHT=${DRAIN_IN_FLIGHT:-16}
SAMPLE=${SAMPLE:-2} FILL_TIMEOUT=${FILL_TIMEOUT:-3600} DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-3600}
BACKLOG_QUEUE=${BACKLOG_QUEUE:-sqlite}
for v in CLIENTS ROUNDS DURATION BODY DRAIN_WAIT BACKLOG FILL_CONNS DRAIN_IN_FLIGHT SAMPLE FILL_TIMEOUT DRAIN_TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v=${!v}: want a positive integer" >&2; exit 2; }
done
((CLIENTS >= 1 && CLIENTS <= 256 && ROUNDS >= 1 && ROUNDS <= 20 && DURATION >= 1 && DURATION <= 120 && BODY >= 32 && BODY <= 1048576)) \
    || { echo "CLIENTS 1..256, ROUNDS 1..20, DURATION 1..120, BODY 32..1048576" >&2; exit 2; }
((BACKLOG >= 1 && BACKLOG <= 1000000 && FILL_CONNS >= 1 && FILL_CONNS <= 256 && DRAIN_IN_FLIGHT >= 1 && DRAIN_IN_FLIGHT <= 10000)) \
    || { echo "BACKLOG 1..1000000, FILL_CONNS 1..256, DRAIN_IN_FLIGHT 1..10000" >&2; exit 2; }
((SAMPLE >= 1 && SAMPLE <= 60 && FILL_TIMEOUT <= 86400 && DRAIN_TIMEOUT <= 86400 && DRAIN_WAIT <= 3600)) \
    || { echo "SAMPLE 1..60, FILL_TIMEOUT and DRAIN_TIMEOUT ≤ 86400, DRAIN_WAIT ≤ 3600" >&2; exit 2; }
[[ $BACKLOG_QUEUE == sqlite || $BACKLOG_QUEUE == redis ]] || { echo "BACKLOG_QUEUE: sqlite or redis" >&2; exit 2; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [[ $MODE == accept ]]; then
    [[ -n $PGBIN && -x $PGBIN/pgbench ]] || { echo "missing PostgreSQL server binaries with pgbench" >&2; exit 1; }
    command -v wrk >/dev/null || { echo "missing wrk" >&2; exit 1; }
fi
command -v redis-server >/dev/null || { echo "missing redis-server" >&2; exit 1; }
log() { printf '[queue-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ $BUILD == 1 ]]; then
    log "building portcullis and bench-upstream (release) into $CARGO_TARGET_DIR"
    (cd "$ROOT" && cargo build --release --locked -p portcullis-gateway --bin portcullis \
        -p portcullis-testkit --bin bench-upstream)
    if [[ $MODE == accept && $ENGINE == 1 ]]; then
        (cd "$ROOT" && cargo build --release --locked -p portcullis-queue --example enqueue_load)
    fi
fi

TMP=$(mktemp -d /tmp/portcullis-queuebench.XXXXXX)
chmod 755 "$TMP"
PGDATA=$TMP/pg PG_STARTED=0 PIDS=()
cleanup() {
    local rc=$? pid
    set +e
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    [[ $PG_STARTED == 1 ]] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 10 stop >/dev/null 2>&1
    rm -rf "$TMP"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
# A counter of bench-upstream's /__bench/stats.
upstream_stat() {
    { curl -fs --max-time 5 "http://127.0.0.1:$UP/__bench/stats" || true; } \
        | grep -o "\"$1\":[0-9]*" | cut -d: -f2 || echo 0
}

UP=$(free_port)
"$BIN/bench-upstream" --port "$UP" --threads 1 >"$TMP/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UP/__bench/stats"

# Redis servers with AOF: $1 = everysec or always.
declare -A REDIS
start_redis() {
    local fsync=$1 port
    port=$(free_port)
    mkdir -p "$TMP/redis-$fsync"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync "$fsync" \
        --dir "$TMP/redis-$fsync" >"$TMP/redis-$fsync.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    REDIS[$fsync]="redis://127.0.0.1:$port"
}

# Gateway NAME with QUEUE (empty: the embedded SQLite default) and the route's DELIVERY
# fields; sets GW_PORT[NAME], GW_ADMIN[NAME], GW_PID[NAME]. write_config alone rewrites the
# file (for a reload).
declare -A GW_PORT GW_ADMIN GW_PID
write_config() {
    local name=$1 queue=$2 delivery=$3
    {
        echo "# generated by bench/queue.sh ($name)"
        echo "[server]"
        echo "listen = \"127.0.0.1:${GW_PORT[$name]}\""
        echo "admin_listen = \"127.0.0.1:${GW_ADMIN[$name]}\""
        echo
        echo "[storage]"
        echo "database = \"sqlite://$TMP/$name.db\""
        [[ -n $queue ]] && echo "queue = \"$queue\""
        echo
        echo "[telemetry]"
        echo "access_log = false"
        echo
        echo "[[upstreams]]"
        echo "name = \"backend\""
        echo "endpoints = [\"http://127.0.0.1:$UP\"]"
        echo
        echo "[[routes]]"
        echo "name = \"hooks\""
        echo "prefix = \"/hooks\""
        echo "upstream = \"backend\""
        echo "delivery = { mode = \"async\"$delivery }"
    } >"$TMP/$name.toml.new"
    mv "$TMP/$name.toml.new" "$TMP/$name.toml"
}
start_gateway() {
    local name=$1
    GW_PORT[$name]=$(free_port)
    GW_ADMIN[$name]=$(free_port)
    write_config "$@"
    RUST_LOG=warn "$BIN/portcullis" --config "$TMP/$name.toml" >"$TMP/$name.log" 2>&1 &
    GW_PID[$name]=$!
    PIDS+=($!)
    wait_http "http://127.0.0.1:${GW_PORT[$name]}/healthz" || { cat "$TMP/$name.log" >&2; return 1; }
}
# Sum of every sample of metric $2 on gateway $1's /metrics.
gw_counter() {
    { curl -fs --max-time 5 "http://127.0.0.1:${GW_ADMIN[$1]}/metrics" || true; } \
        | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}
# Waits (at most DRAIN_WAIT s) until gateway $1 delivered all it accepted; prints the seconds.
wait_delivered() {
    local name=$1 start=$SECONDS acc ok i
    for ((i = 0; i < DRAIN_WAIT * 5; i++)); do
        acc=$(gw_counter "$name" deliveries_accepted_total)
        ok=$(gw_counter "$name" deliveries_succeeded_total)
        ((ok >= acc)) && { echo $((SECONDS - start)); return 0; }
        sleep 0.2
    done
    log "$name: $((acc - ok)) of $acc accepted not delivered after ${DRAIN_WAIT}s"
    echo "-"
}
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# The anonymous part of VmRSS (heap, stacks; not the binary's pages or shared memory).
anon_kib() { awk '/^RssAnon/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
hwm_kib() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
meta() {
    echo "mode=$MODE date=$(date -u +%Y-%m-%dT%H:%MZ) commit=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- gateway queue bench || echo +dirty) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) redis=$(redis-server --version | awk '{print $3}')${PGBIN:+ postgres=$("$PGBIN/postgres" --version | awk '{print $3}')}"
}

# ---------------------------------------------------------------------------------- backlog
if [[ $MODE == backlog ]]; then
    queue=""
    if [[ $BACKLOG_QUEUE == redis ]]; then start_redis everysec; queue=${REDIS[everysec]}; fi
    HOLD=", max_in_flight = 1, max_rate = 0.0001"
    start_gateway backlog "$queue" "$HOLD"
    pid=${GW_PID[backlog]}
    samples=$TMP/samples.tsv
    # t (s since start), VmRSS (KiB), distinct delivery ids the upstream received, RssAnon.
    (
        for ((i = 0; i < (FILL_TIMEOUT + DRAIN_TIMEOUT) / SAMPLE + 10; i++)); do
            kill -0 "$pid" 2>/dev/null || exit 0
            printf '%s\t%s\t%s\t%s\n' "$SECONDS" "$(rss_kib "$pid")" "$(upstream_stat delivery_ids)" "$(anon_kib "$pid")" >>"$samples"
            sleep "$SAMPLE"
        done
    ) &
    PIDS+=($!)
    log "filling: $BACKLOG POSTs of $BODY bytes over $FILL_CONNS connections (delivery held)"
    fill_start=$SECONDS
    timeout "$FILL_TIMEOUT" python3 "$ROOT/bench/benchtool.py" fixed --port "${GW_PORT[backlog]}" \
        --count "$BACKLOG" --conns "$FILL_CONNS" --method POST --path /hooks/in --body "$BODY" \
        --status 202 --timeout 30 >"$TMP/fill.txt"
    fill_secs=$((SECONDS - fill_start))
    ((fill_secs > 0)) || fill_secs=1
    filled_rss=$(rss_kib "$pid") filled_anon=$(anon_kib "$pid")
    early=$(upstream_stat delivery_ids)
    log "filled in ${fill_secs}s ($(cat "$TMP/fill.txt")); delivered while held: $early; RSS ${filled_rss} KiB"
    write_config backlog "$queue" ", max_in_flight = $DRAIN_IN_FLIGHT"
    reload_at=$SECONDS
    kill -HUP "$pid"
    drained=0
    for ((i = 0; i < DRAIN_TIMEOUT * 2; i++)); do
        drained=$(upstream_stat delivery_ids)
        ((drained >= BACKLOG)) && break
        kill -0 "$pid" 2>/dev/null || { log "the gateway exited"; break; }
        sleep 0.5
    done
    drain_secs=$((SECONDS - reload_at))
    ((drain_secs > 0)) || drain_secs=1
    sleep "$SAMPLE" # one more sample at 100 %
    repeats=$(upstream_stat delivery_repeats)
    hits=$(upstream_stat hits)
    hwm=$(hwm_kib "$pid")
    end_rss=$(rss_kib "$pid") end_anon=$(anon_kib "$pid")
    echo
    meta
    echo "engine=$BACKLOG_QUEUE backlog=$BACKLOG body=$BODY fill_conns=$FILL_CONNS drain_in_flight=$DRAIN_IN_FLIGHT sample=${SAMPLE}s"
    echo "fill: ${fill_secs}s, $((BACKLOG / fill_secs))/s; delivered while held: $early"
    echo "drain: ${drain_secs}s after the reload, $(((drained - early) / drain_secs))/s; upstream: $drained distinct delivery ids of $BACKLOG, $repeats repeats, $hits hits"
    # RSS at the first sample at or past each share drained (after the reload).
    awk -F'\t' -v from="$reload_at" -v n="$BACKLOG" -v filled="$filled_rss" -v hwm="$hwm" -v end="$end_rss" \
        -v fa="$filled_anon" -v ea="$end_anon" '
        BEGIN { split("10 50 90 100", p, " ") }
        $1 >= from && $3 != "" {
            for (i = 1; i <= 4; i++) if (!(i in at) && $3 >= n * p[i] / 100) at[i] = $2
        }
        { if ($2 > peak) peak = $2; if (NR == 1) first = $4 }
        END {
            printf "RSS MiB: 0%% %.1f", filled / 1024
            for (i = 1; i <= 4; i++) printf " | %s%% %s", p[i], (i in at) ? sprintf("%.1f", at[i] / 1024) : "-"
            printf " | end %.1f | peak sampled %.1f | VmHWM %.1f\n", end / 1024, peak / 1024, hwm / 1024
            printf "RssAnon MiB: first sample %.1f | filled %.1f | end %.1f\n", first / 1024, fa / 1024, ea / 1024
        }' "$samples"
    exit 0
fi

# ---------------------------------------------------------------------------------- accept
PG_PORT=$(free_port)
mkdir -p "$PGDATA" && chown postgres "$PGDATA"
runuser -u postgres -- "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres --no-sync >"$TMP/initdb.log" 2>&1
PG_STARTED=1
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$PGDATA -c max_connections=600" \
    start >"$TMP/pg_ctl.log" 2>&1
PSQL=("$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$PG_PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "create database queue_bench" >/dev/null
PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/queue_bench"
"${PSQL[@]}" -d postgres -c "create database queue_held" >/dev/null
HOLD=", max_in_flight = 1, max_rate = 0.0001"
start_redis everysec
start_redis always

# The gateways create the engines' schemas on start-up (before pgbench needs the tables).
start_gateway gw-pg "$PG_URL" ""
start_gateway gw-pg-held "postgres://postgres@127.0.0.1:$PG_PORT/queue_held" "$HOLD"
start_gateway gw-redis "${REDIS[everysec]}" ""
start_gateway gw-redis-always "${REDIS[always]}" ""
META=$(meta)

# pgbench_rate SCRIPT: prints "transactions/s transactions".
pgbench_rate() {
    timeout $((DURATION + 30)) "$PGBIN/pgbench" -n -M prepared -D body="$BODY" -h 127.0.0.1 -p "$PG_PORT" \
        -U postgres -c "$CLIENTS" -j 2 -T "$DURATION" -f "$ROOT/bench/pgbench/$1" queue_bench 2>&1 \
        | awk '/^tps = / { tps = $3 } /actually processed/ { split($NF, a, "/"); n = a[1] }
               END { printf "%.0f %d\n", tps, n }'
}
# CPU time in clock ticks of PostgreSQL's processes (the live ones, and what the postmaster
# reaped: the backends of pgbench's connections exit with it), and of one process.
pg_ticks() {
    local t=0 f a
    for f in /proc/[0-9]*/stat; do
        read -r -a a <"$f" 2>/dev/null || continue
        [[ ${a[1]} == "(postgres)" ]] && t=$((t + a[13] + a[14] + a[15] + a[16]))
    done
    echo "$t"
}
pid_ticks() { local a; read -r -a a <"/proc/$1/stat" 2>/dev/null && echo $((a[13] + a[14])) || echo 0; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))
# per_message TICKS N: microseconds of CPU per message.
per_message() { echo $(($1 * TICK_US / ($2 > 0 ? $2 : 1))); }
# wrk_rate GATEWAY KEYED RUN: prints wrk's line (accepted=…, rate=…); RUN, unique in the
# script's run, names the output and prefixes the keys (none repeats, so no request is a
# duplicate).
declare -A R BAD DRAIN CPU_PG CPU_GW
wrk_rate() {
    local name=$1 keyed=$2 run=$3 file out
    file=$TMP/wrk-$run.txt
    BENCH_BODY=$BODY BENCH_KEY_PREFIX=$([[ $keyed == 1 ]] && echo "q$$-$run") \
        timeout $((DURATION + 20)) wrk -t1 -c"$CLIENTS" -d"${DURATION}s" --timeout 5s \
        -s "$ROOT/bench/wrk/accept.lua" "http://127.0.0.1:${GW_PORT[$name]}/hooks/in" >"$file" 2>&1 || true
    out=$(grep '^accepted=' "$file" || echo "accepted=0 other=0 errors=0 rate=0")
    echo "$out"
}
engine_rate() {
    "$LOAD" "$PG_URL" "$CLIENTS" "$DURATION" "$BODY" ${1:+dedupe} | awk -F'rate=' '/rate=/ { split($2, a, " "); printf "%.0f\n", a[1] }'
}
TARGETS=(pgbench gw-pg gw-pg-held pgbench-dedupe gw-pg-key gw-redis gw-redis-key gw-redis-always)
[[ $ENGINE == 1 ]] && TARGETS+=(pg-engine pg-engine-key)
# One second of each gateway target first (connections, schema, caches).
for t in gw-pg gw-pg-held gw-redis gw-redis-always; do
    DURATION=1 wrk_rate "$t" 0 "warm-$t" >/dev/null
    [[ $t == *-held ]] || wait_delivered "$t" >/dev/null
done
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${TARGETS[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do order+=("${TARGETS[$i]}"); done
    fi
    for t in "${order[@]}"; do
        case $t in
            pgbench | pgbench-dedupe)
                script=queue.sql
                [[ $t == pgbench-dedupe ]] && script=queue-dedupe.sql
                p0=$(pg_ticks)
                read -r v n < <(pgbench_rate "$script")
                sleep 0.3 # the postmaster reaps the backends
                CPU_PG[$t,$r]=$(per_message $(($(pg_ticks) - p0)) "$n")
                ;;
            pg-engine) v=$(engine_rate "") ;;
            pg-engine-key) v=$(engine_rate dedupe) ;;
            gw-*)
                gw=${t%-key}
                keyed=0
                [[ $t == *-key ]] && keyed=1
                p0=$(pg_ticks) g0=$(pid_ticks "${GW_PID[$gw]}")
                out=$(wrk_rate "$gw" "$keyed" "$r-$t")
                p1=$(pg_ticks) g1=$(pid_ticks "${GW_PID[$gw]}")
                v=$(sed 's/.*rate=//' <<<"$out")
                n=$(sed 's/^accepted=\([0-9]*\).*/\1/' <<<"$out")
                CPU_GW[$t,$r]=$(per_message $((g1 - g0)) "$n")
                [[ $gw == gw-pg* ]] && CPU_PG[$t,$r]=$(per_message $((p1 - p0)) "$n")
                read -r other errors < <(sed 's/.*other=\([0-9]*\) errors=\([0-9]*\).*/\1 \2/' <<<"$out")
                BAD[$t]=$((${BAD[$t]:-0} + other + errors))
                ((other + errors > 0)) && log "round $r $t: $other answers other than 202, $errors socket errors"
                [[ $t == *-held ]] || DRAIN[$t,$r]=$(wait_delivered "$gw")
                ;;
        esac
        R[$t,$r]=${v:-0}
        log "round $r $t: ${v:-0}/s${DRAIN[$t,$r]:+ (then ${DRAIN[$t,$r]} s to deliver the rest)}"
    done
done
accepted=0 delivered=0
for g in gw-pg gw-redis gw-redis-always; do
    accepted=$((accepted + $(gw_counter "$g" deliveries_accepted_total)))
    delivered=$((delivered + $(gw_counter "$g" deliveries_succeeded_total)))
done

# cpu_median ARRAY TARGET: the median over rounds of ARRAY[TARGET,round], or – without one.
cpu_median() {
    local r
    case $1 in
        CPU_PG) [[ -n ${CPU_PG[$2,1]:-} ]] || { echo "–"; return; }
            for ((r = 1; r <= ROUNDS; r++)); do echo "${CPU_PG[$2,$r]}"; done | median ;;
        CPU_GW) [[ -n ${CPU_GW[$2,1]:-} ]] || { echo "–"; return; }
            for ((r = 1; r <= ROUNDS; r++)); do echo "${CPU_GW[$2,$r]}"; done | median ;;
    esac
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
anchor_of() {
    case $1 in
        gw-pg | gw-pg-held | pg-engine) echo pgbench ;;
        gw-pg-key | pg-engine-key) echo pgbench-dedupe ;;
        *) echo "" ;;
    esac
}
echo
echo "$META"
echo "clients=$CLIENTS body=$BODY duration=${DURATION}s rounds=$ROUNDS; gateways: accepted $accepted, delivered $delivered; upstream: $(upstream_stat delivery_ids) distinct delivery ids, $(upstream_stat delivery_repeats) repeats"
echo
header="| target |"; sep="|---|"
for ((r = 1; r <= ROUNDS; r++)); do header+=" round $r |"; sep+="---|"; done
echo "$header median /s | × anchor (median of same-round ratios) | CPU µs per message, PostgreSQL / gateway (medians) | non-202 + errors |"
echo "$sep---|---|---|---|"
for t in "${TARGETS[@]}"; do
    row="| $t |"
    for ((r = 1; r <= ROUNDS; r++)); do row+=" ${R[$t,$r]} |"; done
    med=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${R[$t,$r]}"; done | median)
    anchor=$(anchor_of "$t")
    ratio="–"
    if [[ -n $anchor ]]; then
        ratio="$(for ((r = 1; r <= ROUNDS; r++)); do
            awk -v a="${R[$t,$r]}" -v b="${R[$anchor,$r]}" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print 0 }'
        done | median) × $anchor"
    fi
    cpu="$(cpu_median CPU_PG "$t") / $(cpu_median CPU_GW "$t")"
    echo "$row $med | $ratio | $cpu | ${BAD[$t]:-–} |"
done
