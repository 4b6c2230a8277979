#!/usr/bin/env bash
# Accept (enqueue) rate of the queue engines, with the raw database as the anchor:
#   - PostgreSQL: pgbench running the engine's own INSERT (bench/pgbench/queue.sql), and the
#     engine (queue/examples/enqueue_load.rs) on the same server, database and table,
#     ROUNDS alternating rounds, CLIENTS connections each; then the engine with a dedupe key
#     on every message (the dedupe record written in the same statement);
#   - Redis: the engine on a server with `appendonly yes` and `appendfsync everysec`, and on
#     one with `appendfsync always` (nothing acknowledged lost, docs/async-delivery.md).
# PostgreSQL runs with its default durability (fsync and synchronous_commit on), as in
# bench/pg.sh. Prints a markdown table: enqueues/s per round, the median, and the engine's
# median ratio to the pgbench anchor of the same rounds.
#
# Usage: bench/queue.sh [--no-build]. Environment: CLIENTS [16], ROUNDS [3], DURATION [5]
# (seconds per run), BODY [512] (bytes per message), CARGO_TARGET_DIR [<repo>/target-bench].
# Run as root (PostgreSQL runs as user postgres). Binds 127.0.0.1 only; every process
# started here is stopped by PID on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
LOAD=$CARGO_TARGET_DIR/release/examples/enqueue_load
BUILD=1
for arg in "$@"; do
    case $arg in
        --no-build) BUILD=0 ;;
        *) echo "usage: bench/queue.sh [--no-build]" >&2; exit 2 ;;
    esac
done
CLIENTS=${CLIENTS:-16} ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5} BODY=${BODY:-512}
for v in CLIENTS ROUNDS DURATION BODY; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v=${!v}: want a positive integer" >&2; exit 2; }
done
((CLIENTS >= 1 && CLIENTS <= 256 && ROUNDS >= 1 && ROUNDS <= 20 && DURATION >= 1 && DURATION <= 120 && BODY <= 1048576)) \
    || { echo "CLIENTS 1..256, ROUNDS 1..20, DURATION 1..120, BODY 0..1048576" >&2; exit 2; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
[[ -n $PGBIN && -x $PGBIN/pgbench ]] || { echo "missing PostgreSQL server binaries with pgbench" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "missing redis-server" >&2; exit 1; }
log() { printf '[queue-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ $BUILD == 1 ]]; then
    log "building the load example (release) into $CARGO_TARGET_DIR"
    (cd "$ROOT" && cargo build --release --locked -p portcullis-queue --example enqueue_load)
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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# PostgreSQL with default durability.
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

# Two Redis servers: AOF fsynced every second, and on every write.
declare -A REDIS
for fsync in everysec always; do
    port=$(free_port)
    mkdir -p "$TMP/redis-$fsync"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync "$fsync" \
        --dir "$TMP/redis-$fsync" >"$TMP/redis-$fsync.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    REDIS[$fsync]="redis://127.0.0.1:$port"
done

# The engine creates its schema; a short warm-up run does that before pgbench needs the table.
"$LOAD" "$PG_URL" "$CLIENTS" 1 "$BODY" >/dev/null
echo "postgres=$("$PGBIN/postgres" --version) redis=$(redis-server --version | awk '{print $3}') commit=$(git -C "$ROOT" rev-parse --short HEAD) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" >"$TMP/meta.txt"

rate() { awk -F'rate=' '/rate=/ { split($2, a, " "); print a[1] }'; }
pgbench_rate() {
    timeout $((DURATION + 30)) "$PGBIN/pgbench" -n -M prepared -D body="$BODY" -h 127.0.0.1 -p "$PG_PORT" \
        -U postgres -c "$CLIENTS" -j 2 -T "$DURATION" -f "$ROOT/bench/pgbench/queue.sql" queue_bench 2>&1 \
        | awk '/^tps = / { printf "%.0f\n", $3 }'
}
declare -A R
TARGETS=(pgbench pg pg-dedupe redis-everysec redis-always)
for ((r = 1; r <= ROUNDS; r++)); do
    order=("${TARGETS[@]}")
    ((r % 2 == 0)) && order=(pg-dedupe pg pgbench redis-always redis-everysec)
    for t in "${order[@]}"; do
        case $t in
            pgbench) v=$(pgbench_rate) ;;
            pg) v=$("$LOAD" "$PG_URL" "$CLIENTS" "$DURATION" "$BODY" | rate) ;;
            pg-dedupe) v=$("$LOAD" "$PG_URL" "$CLIENTS" "$DURATION" "$BODY" dedupe | rate) ;;
            redis-everysec) v=$("$LOAD" "${REDIS[everysec]}" "$CLIENTS" "$DURATION" "$BODY" | rate) ;;
            redis-always) v=$("$LOAD" "${REDIS[always]}" "$CLIENTS" "$DURATION" "$BODY" | rate) ;;
        esac
        R[$t,$r]=${v:-0}
        log "round $r $t: ${v:-0}/s"
    done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "$(cat "$TMP/meta.txt") clients=$CLIENTS body=$BODY duration=${DURATION}s rounds=$ROUNDS"
echo
header="| target |"; sep="|---|"
for ((r = 1; r <= ROUNDS; r++)); do header+=" round $r |"; sep+="---|"; done
echo "$header median enqueues/s | median ratio to pgbench (same round) |"
echo "$sep---|---|"
for t in "${TARGETS[@]}"; do
    row="| $t |"
    for ((r = 1; r <= ROUNDS; r++)); do row+=" ${R[$t,$r]} |"; done
    med=$(for ((r = 1; r <= ROUNDS; r++)); do echo "${R[$t,$r]}"; done | median)
    ratio=$(for ((r = 1; r <= ROUNDS; r++)); do
        awk -v a="${R[$t,$r]}" -v b="${R[pgbench,$r]}" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print 0 }'
    done | median)
    echo "$row $med | ${ratio} |"
done
