# shellcheck shell=bash
# The pgbench anchor of the PostgreSQL idempotency store, sourced by bench/run.sh and
# bench/pg.sh: pgbench runs bench/pgbench/idempotency.sql — the store's two statements per
# keyed first execution (try_lock, complete), prepared, one implicit transaction each —
# against the same server and settings the store is measured on, so "store / anchor" is an
# honest ratio.
#
# pgbench_anchor PGBIN PORT CLIENTS SECONDS ROUNDS CPU RAWDIR
#   creates database pg_anchor (idempotency migration only), runs ROUNDS pgbench runs of
#   SECONDS with CLIENTS connections (-j 1, pinned to CPU), keeps pgbench's output in
#   RAWDIR/pgbench-rN.txt and prints the median transactions/s (= first executions/s).
pgbench_anchor() {
    local pgbin=$1 port=$2 clients=$3 secs=$4 rounds=$5 cpu=$6 raw=$7 r
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local psql=("$pgbin/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres)
    "${psql[@]}" -d postgres -c "drop database if exists pg_anchor" -c "create database pg_anchor" >/dev/null
    "${psql[@]}" -d pg_anchor -f "$root/migrations/postgres/0002_idempotency.sql" >/dev/null
    for ((r = 1; r <= rounds; r++)); do
        taskset -c "$cpu" timeout $((secs + 30)) "$pgbin/pgbench" -n -M prepared \
            -D tenant=bench -D route=/orders -h 127.0.0.1 -p "$port" -U postgres \
            -c "$clients" -j 1 -T "$secs" -f "$root/bench/pgbench/idempotency.sql" pg_anchor \
            >"$raw/pgbench-r$r.txt" 2>&1 || true
    done
    for ((r = 1; r <= rounds; r++)); do
        awk '/^tps = / { print $3 }' "$raw/pgbench-r$r.txt"
    done | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
