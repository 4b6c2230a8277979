#!/usr/bin/env bash
# Instructions per proxied request, load-independent: the gateway (one worker) under
# `valgrind --tool=callgrind` with `bench-upstream` natively behind it, exactly N requests per
# mode from a fixed-count client (`benchtool.py fixed`), counted between `callgrind_control -z`
# and `callgrind_control -d`. Loopback only; every process it starts is stopped by PID.
#
#   bench/callgrind.sh [--build] [MODE ...]      MODE: pass rl keyed (default: all three)
#
# Modes (one gateway each, started and stopped in turn):
#   pass   GET /x, no rate limit, no idempotency;
#   rl     GET /x with the tenant's API key: tenant + global token bucket (local);
#   keyed  POST /orders (62-byte JSON body) with the API key and a new Idempotency-Key per
#          request: local rate limit + memory idempotency store, every request a first execution.
#
# Environment: BIN [target-bench/release] (portcullis and bench-upstream), N [10000],
# ACCESS_LOG [false, as bench/run.sh and nginx's `access_log off`; true measures it too],
# CONNS [8] keep-alive connections, WARMUP [500] requests before zeroing, OUT [a temporary
# directory, removed at exit] keeps the callgrind files (`callgrind.MODE.out*`) for
# `callgrind_annotate --inclusive=yes`. `--build` first builds both binaries into
# $CARGO_TARGET_DIR [target-bench] with `cargo build --release` (set e.g.
# CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 for a faster build,
# the same for both sides of a comparison).
#
# Prints one line per mode: mode, requests, instructions, instructions/request.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
BIN=${BIN:-$CARGO_TARGET_DIR/release}
N=${N:-10000} CONNS=${CONNS:-8} WARMUP=${WARMUP:-500} ACCESS_LOG=${ACCESS_LOG:-false}
[[ $ACCESS_LOG == true || $ACCESS_LOG == false ]] || { echo "ACCESS_LOG=$ACCESS_LOG: want true or false" >&2; exit 2; }
for v in N CONNS WARMUP; do
    [[ ${!v} =~ ^[0-9]+$ ]] && ((${!v} > 0 && ${!v} <= 1000000)) || { echo "$v=${!v}: want 1..=1000000" >&2; exit 2; }
done

BUILD=0 MODES=()
for arg in "$@"; do
    case $arg in
        --build) BUILD=1 ;;
        pass | rl | keyed) MODES+=("$arg") ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done
((${#MODES[@]})) || MODES=(pass rl keyed)

for tool in valgrind callgrind_control python3 curl; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done
if [[ $BUILD == 1 ]]; then
    (cd "$ROOT" && CARGO_INCREMENTAL=0 cargo build --release --locked -p portcullis-gateway --bin portcullis \
        -p portcullis-testkit --bin bench-upstream)
fi
for b in portcullis bench-upstream; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (run with --build)" >&2; exit 1; }
done

# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
if [[ -n ${OUT:-} ]]; then mkdir -p "$OUT"; else OUT=$TMP; fi
log() { printf '[callgrind %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
tool() { python3 "$ROOT/bench/benchtool.py" fixed "$@"; }

UP=$(free_port)
"$BIN/bench-upstream" --port "$UP" --threads 1 >"$TMP/upstream.log" 2>&1 &
UP_PID=$!
PIDS+=("$UP_PID")
wait_http "http://127.0.0.1:$UP/__bench/stats"

API_KEY="pc-callgrind-0123456789abcdef0123456789"
HUGE=1000000 # nothing is ever rejected: the decision is measured, not a rejection

# config MODE PORT ADMIN -> the gateway's configuration on stdout
config() {
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\nworker_threads = 1\nshutdown_grace = "1s"\n\n' "$2" "$3"
    printf '[telemetry]\naccess_log = %s\n\n' "$ACCESS_LOG"
    printf '[storage]\nstate = "memory"\nidempotency = "memory"\ndatabase = "sqlite://%s/%s.db"\n\n' "$TMP" "$1"
    if [[ $1 != pass ]]; then
        printf '[rate_limit]\nglobal = { rate = %s, per = "1s", burst = %s }\n\n' "$HUGE" "$HUGE"
        printf '[[tenants]]\nid = "bench"\napi_keys = ["%s"]\nrate = %s\nper = "1s"\nburst = %s\n\n' "$API_KEY" "$HUGE" "$HUGE"
    fi
    printf '[[upstreams]]\nname = "backend"\nendpoints = ["http://127.0.0.1:%s"]\n\n' "$UP"
    printf '[[routes]]\nprefix = "/"\nupstream = "backend"\n'
    if [[ $1 == keyed ]]; then printf 'idempotency = { methods = ["POST", "PATCH"] }\n'; fi
}

# drive MODE COUNT PHASE
drive() {
    case $1 in
        pass) tool --port "$GW_PORT" --count "$2" --conns "$CONNS" ;;
        rl) tool --port "$GW_PORT" --count "$2" --conns "$CONNS" --auth "$API_KEY" ;;
        keyed) tool --port "$GW_PORT" --count "$2" --conns "$CONNS" --auth "$API_KEY" \
            --method POST --path /orders --key-prefix "cg-$3-$$" ;;
    esac >/dev/null
}

printf 'mode\trequests\tinstructions\tinstructions/request\n'
for mode in "${MODES[@]}"; do
    GW_PORT=$(free_port)
    admin=$(free_port)
    config "$mode" "$GW_PORT" "$admin" >"$TMP/$mode.toml"
    rm -f "$OUT/callgrind.$mode.out"*
    log "$mode: starting the gateway under callgrind on :$GW_PORT"
    valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$mode.out" \
        "$BIN/portcullis" --config "$TMP/$mode.toml" >"$TMP/$mode.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    ready=0
    for ((i = 0; i < 600; i++)); do # up to 60 s: startup under valgrind is slow
        if curl -fs -o /dev/null --max-time 2 "http://127.0.0.1:$GW_PORT/readyz"; then ready=1; break; fi
        kill -0 "$GW_PID" 2>/dev/null || break
        sleep 0.1
    done
    ((ready)) || { echo "$mode: gateway not ready" >&2; tail -20 "$TMP/$mode.log" >&2; exit 1; }
    drive "$mode" "$WARMUP" warm
    callgrind_control -z "$GW_PID" >/dev/null 2>&1
    drive "$mode" "$N" run
    callgrind_control -d "$GW_PID" >/dev/null 2>&1
    kill "$GW_PID"
    wait "$GW_PID" 2>/dev/null || true
    # The first dump after zeroing is part 1 (the final dump at exit comes after it).
    dump=$OUT/callgrind.$mode.out.1
    [[ -f $dump ]] || { echo "$mode: no dump $dump" >&2; exit 1; }
    ir=$(awk '/^summary:/ { print $2 }' "$dump")
    awk -v m="$mode" -v n="$N" -v ir="$ir" 'BEGIN { printf "%s\t%d\t%d\t%.0f\n", m, n, ir, ir / n }'
done
if [[ $OUT != "$TMP" ]]; then log "callgrind files in $OUT (callgrind_annotate --inclusive=yes FILE.1)"; fi
