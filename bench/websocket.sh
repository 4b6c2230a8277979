#!/usr/bin/env bash
# WebSocket echo throughput: Portcullis (a route with `websocket = true`) against nginx
# proxying the same echo upstream (bench/peers/nginx-websocket.conf), and the echo reached
# directly as the reference of what the client and the upstream can do without a proxy.
#
# Usage:
#   bench/websocket.sh [--no-build]
#
#   --no-build   use the release binaries already in $CARGO_TARGET_DIR (default target-bench/)
#
# Environment (defaults in brackets): ROUNDS [3], DURATION [5] (s measured per target and
# round, after WARMUP [1] s), CONNS [32] WebSocket connections, SIZE [128] bytes per message,
# CLIENT_CPU [0], SUT_CPU [1], CARGO_TARGET_DIR [<repo>/target-bench].
#
# What it does (as bench/run.sh: the proxies and the upstream on CPU $SUT_CPU, the client on
# CPU $CLIENT_CPU, every proxy with one worker):
#   1. builds `portcullis`, `bench-wsecho` and `bench-wsload` (release) unless --no-build;
#   2. starts bench-wsecho, nginx (one worker) and Portcullis (worker_threads = 1, one route
#      `/ws` with websocket = true, no access log as nginx's access_log off); each must echo
#      one message through (bench-wsload --probe) before anything is measured;
#   3. ROUNDS rounds, every target once per round, the order reversed on even rounds:
#      bench-wsload, CONNS connections, closed loop (each waits for its echo), SIZE-byte
#      binary messages, DURATION s; around every run the upstream's own counters (what it
#      received and echoed; a run where it echoed fewer messages than the client counted
#      fails) and the CPU time of the proxy, the upstream and the client (schedstat);
#   4. prints a markdown table: messages/s per round, the median, the median of same-round
#      ratios to nginx (min–max), p50/p99 round trip, CPU µs per message.
# Everything binds 127.0.0.1; every loop is bounded; every process started here is stopped
# by PID on exit (bench/common.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-bench}
BIN=$CARGO_TARGET_DIR/release

BUILD=1
for arg in "$@"; do
    case $arg in
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done

ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} CONNS=${CONNS:-32} SIZE=${SIZE:-128}
CLIENT_CPU=${CLIENT_CPU:-0} SUT_CPU=${SUT_CPU:-1}
for v in ROUNDS DURATION WARMUP CONNS SIZE CLIENT_CPU SUT_CPU; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v=${!v}: want a non-negative integer" >&2; exit 2; }
done
((ROUNDS >= 1 && ROUNDS <= 50 && DURATION >= 1 && DURATION <= 60 && WARMUP <= 30)) || { echo "ROUNDS 1..50, DURATION 1..60, WARMUP 0..30" >&2; exit 2; }
((CONNS >= 1 && CONNS <= 4096 && SIZE >= 1 && SIZE <= 1048576)) || { echo "CONNS 1..4096, SIZE 1..1048576" >&2; exit 2; }
for tool in nginx taskset python3 curl; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done

log() { printf '[wsbench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ $BUILD == 1 ]]; then
    log "building release binaries into $CARGO_TARGET_DIR"
    (cd "$ROOT" && cargo build --release --locked -p portcullis-gateway -p portcullis-testkit \
        --bin portcullis --bin bench-wsecho --bin bench-wsload)
fi
for b in portcullis bench-wsecho bench-wsload; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (run without --no-build)" >&2; exit 1; }
done

# TMP, PIDS (all stopped on exit), free_port, wait_http.
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# CPU time in ns of every thread of process $1 (and its children's threads, for nginx's
# master + worker), from schedstat: precise, unlike the clock ticks of /proc/PID/stat.
cpu_ns() {
    local pids=("$1") kids
    kids=$(cat "/proc/$1/task/$1/children" 2>/dev/null || true)
    # shellcheck disable=SC2206
    pids+=($kids)
    local p sum=0 t
    for p in "${pids[@]}"; do
        for t in /proc/"$p"/task/*/schedstat; do
            [[ -r $t ]] && sum=$((sum + $(cut -d' ' -f1 "$t" 2>/dev/null || echo 0)))
        done
    done
    echo "$sum"
}

# --------------------------------------------------------------------------- echo upstream
ECHO_PORT=$(free_port)
ECHO_STATS=$(free_port)
taskset -c "$SUT_CPU" "$BIN/bench-wsecho" --port "$ECHO_PORT" --stats-port "$ECHO_STATS" >"$TMP/echo.log" 2>&1 &
ECHO_PID=$!
PIDS+=("$ECHO_PID")
wait_http "http://127.0.0.1:$ECHO_STATS/"
echo_messages() {
    curl -fs --max-time 5 "http://127.0.0.1:$ECHO_STATS/" | python3 -c 'import json, sys; print(json.load(sys.stdin)["messages"])'
}

# --------------------------------------------------------------------------- nginx
NGX_PORT=$(free_port)
mkdir -p "$TMP/nginx"
sed -e "s/@NGINX_WS@/$NGX_PORT/g" -e "s/@WS_UPSTREAM@/$ECHO_PORT/g" \
    "$ROOT/bench/peers/nginx-websocket.conf" >"$TMP/nginx/nginx.conf"
if grep -n '^[^#]*@[A-Z_]*@' "$TMP/nginx/nginx.conf" >&2; then echo "nginx-websocket.conf: unknown placeholder" >&2; exit 1; fi
taskset -c "$SUT_CPU" nginx -p "$TMP/nginx/" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" >"$TMP/nginx.log" 2>&1 &
NGX_PID=$!
PIDS+=("$NGX_PID")

# --------------------------------------------------------------------------- portcullis
GW_PORT=$(free_port)
GW_ADMIN=$(free_port)
cat >"$TMP/gw.toml" <<TOML
# generated by bench/websocket.sh
[server]
listen = "127.0.0.1:$GW_PORT"
admin_listen = "127.0.0.1:$GW_ADMIN"
worker_threads = 1
shutdown_grace = "1s"

# As nginx's access_log off.
[telemetry]
access_log = false

[storage]
state = "memory"
idempotency = "memory"
database = "sqlite://$TMP/gw.db"

[[upstreams]]
name = "echo"
endpoints = ["http://127.0.0.1:$ECHO_PORT"]

[[routes]]
prefix = "/ws"
upstream = "echo"
websocket = true
TOML
taskset -c "$SUT_CPU" "$BIN/portcullis" --config "$TMP/gw.toml" >"$TMP/gw.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_http "http://127.0.0.1:$GW_PORT/readyz" || { tail -20 "$TMP/gw.log" >&2; exit 1; }

# --------------------------------------------------------------------------- targets
# name | URL | PID whose CPU is the proxy's (none for direct)
TARGETS=(
    "direct|ws://127.0.0.1:$ECHO_PORT/ws|"
    "nginx|ws://127.0.0.1:$NGX_PORT/ws|$NGX_PID"
    "portcullis|ws://127.0.0.1:$GW_PORT/ws|$GW_PID"
)
for spec in "${TARGETS[@]}"; do
    IFS='|' read -r name url _ <<<"$spec"
    before=$(echo_messages)
    taskset -c "$CLIENT_CPU" timeout 20 "$BIN/bench-wsload" --url "$url" --size "$SIZE" --probe ||
        { echo "$name: no echo through $url" >&2; tail -5 "$TMP/nginx/error.log" "$TMP/gw.log" >&2 || true; exit 1; }
    after=$(echo_messages)
    ((after > before)) || { echo "$name: the probe's message never reached the upstream" >&2; exit 1; }
done
log "echo :$ECHO_PORT, nginx :$NGX_PORT, portcullis :$GW_PORT; $ROUNDS rounds x ${DURATION}s, $CONNS connections, $SIZE-byte messages"

# --------------------------------------------------------------------------- rounds
printf 'round\ttarget\tmsgs_per_s\tp50_us\tp99_us\tcompleted\terrors\tupstream_echoed\tproxy_ns\techo_ns\tclient_busy\n' >"$TMP/runs.tsv"
run_one() { # ROUND SPEC
    local round=$1 name url pid
    IFS='|' read -r name url pid <<<"$2"
    local m0 m1 p0=0 p1=0 e0 e1 out
    m0=$(echo_messages)
    [[ -n $pid ]] && p0=$(cpu_ns "$pid")
    e0=$(cpu_ns "$ECHO_PID")
    # The client measures its own CPU: started here, its PID is gone by the time it ends.
    out=$(taskset -c "$CLIENT_CPU" timeout $((WARMUP + DURATION + 30)) "$BIN/bench-wsload" --url "$url" \
        --conns "$CONNS" --size "$SIZE" --duration "$DURATION" --warmup "$WARMUP") ||
        { echo "$name r$round: bench-wsload failed" >&2; exit 1; }
    e1=$(cpu_ns "$ECHO_PID")
    [[ -n $pid ]] && p1=$(cpu_ns "$pid")
    m1=$(echo_messages)
    python3 - "$round" "$name" "$out" $((m1 - m0)) $((p1 - p0)) $((e1 - e0)) >>"$TMP/runs.tsv" <<'PY'
import json, sys
r, name, out, echoed, proxy_ns, echo_ns = sys.argv[1:]
d = json.loads(out)
if d["errors"]:
    sys.exit(f"{name} r{r}: {d['errors']} connection(s) failed: {d['first_error']}")
if int(echoed) < d["completed"]:
    sys.exit(f"{name} r{r}: the upstream echoed {echoed} messages, the client counted {d['completed']}")
print("\t".join(str(x) for x in (r, name, d["msgs_per_s"], d["p50_us"], d["p99_us"], d["completed"],
      d["errors"], echoed, proxy_ns, echo_ns, d["client_busy"])))
PY
    log "r$round $name: $(tail -1 "$TMP/runs.tsv" | cut -f3) msg/s"
}
for ((round = 1; round <= ROUNDS; round++)); do
    order=("${TARGETS[@]}")
    if ((round % 2 == 0)); then order=("${TARGETS[2]}" "${TARGETS[1]}" "${TARGETS[0]}"); fi
    for spec in "${order[@]}"; do run_one "$round" "$spec"; done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --------------------------------------------------------------------------- report
python3 - "$TMP/runs.tsv" <<PY
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
rounds = sorted({int(r["round"]) for r in rows})
by = {(int(r["round"]), r["target"]): r for r in rows}
print(f"WebSocket echo, $CONNS connections x $SIZE-byte binary messages, closed loop, ${DURATION} s x $ROUNDS rounds")
print(f"date $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), load average $LOAD_START at the start, $LOAD_END at the end")
print()
print("| target | msg/s per round | median msg/s | × nginx (same round) | p50 / p99 round trip | proxy CPU µs/msg | upstream CPU µs/msg | client CPU busy |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for t in ("direct", "nginx", "portcullis"):
    rs = [by[(n, t)] for n in rounds]
    mps = [float(r["msgs_per_s"]) for r in rs]
    ratios = [float(by[(n, t)]["msgs_per_s"]) / float(by[(n, "nginx")]["msgs_per_s"]) for n in rounds]
    done = sum(int(r["upstream_echoed"]) for r in rs)
    per = lambda k: sum(int(r[k]) for r in rs) / 1000 / max(done, 1)
    p50 = statistics.median(int(r["p50_us"]) for r in rs)
    p99 = statistics.median(int(r["p99_us"]) for r in rs)
    proxy = "–" if t == "direct" else f"{per('proxy_ns'):.1f}"
    busy = statistics.median(float(r["client_busy"]) for r in rs)
    print(f"| {t} | {', '.join(f'{m:,.0f}' for m in mps)} | {statistics.median(mps):,.0f} | "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {p50:.0f} / {p99:.0f} µs | "
          f"{proxy} | {per('echo_ns'):.1f} | {busy:.0%} |")
PY
