#!/usr/bin/env bash
# Adaptive throttling (issue 18 item 1): an upstream that accepts 50 req/s (a token bucket,
# 5 deep; 429 above it) is driven at 200 req/s by 20 clients (10 req/s each) through the
# gateway, with `adaptive = true` and with it off. Each client performs OPS operations; an
# operation is repeated until it gets a 200, honouring Retry-After on 429/503 (as a client
# SDK does). The upstream counts, per second, what it received and what it accepted.
#
# Goal: after 5 s the upstream sees ≤ 1.1 × its capacity (55 req/s) and keeps ≥ 90 % of it
# in use (45 req/s accepted), and every client finishes.
#
# Usage: bench/adaptive.sh   (after: cargo build -p portcullis-gateway, or the release build
#                             in target-bench)
#
# Environment: OPS [50] operations per client, CAPACITY [50] req/s, CLIENTS [20], RATE [10]
# req/s per client, BIN [<repo>/target-bench/release, else <repo>/target/debug], ADAPTIVE
# [adaptive = true] the upstream's adaptive line, OFF [1] (0: skip the run without it),
# STALL [none] "LASTING/EVERY" in seconds (e.g. 0.15/2): the upstream is stopped (SIGSTOP)
# that long that often during the runs, as a loaded machine does to it; it then answers
# what came meanwhile at once, late.
# Everything on 127.0.0.1; every process started here is stopped by PID on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target-bench/release}
[[ -x $BIN/portcullis ]] || BIN=$ROOT/target/debug
OPS=${OPS:-50}
CAPACITY=${CAPACITY:-50}
CLIENTS=${CLIENTS:-20}
RATE=${RATE:-10}

# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# The upstream: CAPACITY req/s, a 5-deep bucket, 429 + Retry-After: 1 above it. Counts
# per second since the first request; GET /__stats returns them and resets.
UP=$(free_port)
python3 - "$UP" "$CAPACITY" >"$TMP/upstream.log" 2>&1 <<'PY' &
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, capacity = int(sys.argv[1]), float(sys.argv[2])
lock = threading.Lock()
state = {"tokens": 5.0, "at": time.monotonic(), "start": None, "seconds": {}}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def answer(self, status, body, extra=()):
        data = body.encode()
        self.send_response(status)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/__stats":
            with lock:
                out = json.dumps(state["seconds"])
                state["seconds"], state["start"] = {}, None
            return self.answer(200, out)
        now = time.monotonic()
        with lock:
            if state["start"] is None:
                state["start"] = now
            s = state["seconds"].setdefault(str(int(now - state["start"])), [0, 0])
            s[0] += 1
            state["tokens"] = min(5.0, state["tokens"] + (now - state["at"]) * capacity)
            state["at"] = now
            ok = state["tokens"] >= 1.0
            if ok:
                state["tokens"] -= 1.0
                s[1] += 1
        if ok:
            self.answer(200, "ok\n")
        else:
            self.answer(429, "slow down\n", [("Retry-After", "1")])

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
PY
UP_PID=$!
PIDS+=("$UP_PID")
wait_http "http://127.0.0.1:$UP/__stats"

if [[ -n ${STALL:-} ]]; then
    # Bounded: at most an hour of stalls; stopped with the other PIDs on exit (the upstream
    # is continued first, so it can be stopped).
    (
        for ((i = 0; i < 3600; i++)); do
            sleep "${STALL#*/}"
            kill -STOP "$UP_PID" 2>/dev/null || exit 0
            sleep "${STALL%/*}"
            kill -CONT "$UP_PID" 2>/dev/null || exit 0
        done
    ) &
    STALLER=$!
    PIDS=("$STALLER" "${PIDS[@]}")
    trap 'kill "$STALLER" 2>/dev/null; wait "$STALLER" 2>/dev/null; kill -CONT "$UP_PID" 2>/dev/null; cleanup' EXIT
fi

run() { # name adaptive-line
    local name=$1 adaptive=$2 port admin
    start_gateway "$name" <<CONF
[rate_limit]
anonymous = { rate = 100000, per = "1s", burst = 100000 }

[[upstreams]]
name = "capped"
endpoints = ["http://127.0.0.1:$UP"]
$adaptive

[[routes]]
prefix = "/"
upstream = "capped"
CONF
    port=$GW_PORT
    admin=$(sed -n 's/^admin_listen = "127.0.0.1:\(.*\)"$/\1/p' "$TMP/$name.toml")
    curl -fs -o /dev/null "http://127.0.0.1:$UP/__stats"
    python3 - "$port" "$UP" "$OPS" "$CLIENTS" "$RATE" "$CAPACITY" "$name" "$admin" <<'PY'
import http.client, json, re, sys, threading, time, urllib.request

port, up, ops, clients, rate, capacity, name, admin = sys.argv[1:]
ops, clients, rate, capacity = int(ops), int(clients), float(rate), float(capacity)
counts = {"sent": 0, "edge": 0, "upstream_refused": 0, "errors": 0}
finished, lock = [], threading.Lock()
start = time.monotonic()

def client(n):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    slot = time.monotonic() + n / (clients * rate)  # spread the clients' phases
    done = 0
    while done < ops:
        pause = slot - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        slot = max(slot + 1 / rate, time.monotonic())
        try:
            conn.request("GET", f"/op/{n}/{done}")
            r = conn.getresponse()
            body = r.read()
        except Exception:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
            with lock:
                counts["errors"] += 1
            continue
        with lock:
            counts["sent"] += 1
        if r.status == 200:
            done += 1
            continue
        edge = b"upstream-throttled" in body
        with lock:
            counts["edge" if edge else "upstream_refused"] += 1
        wait = r.getheader("Retry-After")
        if wait is not None and wait.isdigit():
            slot = max(slot, time.monotonic() + int(wait))
    with lock:
        finished.append(time.monotonic() - start)

# The controller over time, from the admin /metrics every 100 ms: its rate and its
# decreases by cause (throttled = 429/503, latency = the latency gradient, timeout).
samples, running = [], [True]
def sampler():
    pattern = re.compile(r'^adaptive_(rate_limit|decreases_total)\{([^}]*)\} (\S+)$')
    while running[0]:
        t = time.monotonic() - start
        rate_now, cuts = None, {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=2) as r:
                for line in r.read().decode().splitlines():
                    m = pattern.match(line)
                    if m and m.group(1) == "rate_limit":
                        rate_now = float(m.group(3))
                    elif m:
                        cause = re.search(r'cause="(\w+)"', m.group(2))
                        if cause:
                            cuts[cause.group(1)] = int(float(m.group(3)))
        except Exception:
            pass
        samples.append((t, rate_now, cuts))
        time.sleep(0.1)
watcher = threading.Thread(target=sampler, daemon=True)
watcher.start()

threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
running[0] = False
watcher.join()
with urllib.request.urlopen(f"http://127.0.0.1:{up}/__stats") as r:
    seconds = {int(k): v for k, v in json.loads(r.read()).items()}
# Steady state: from second 5 until the first client finished (after that, demand falls).
end = int(min(finished))
window = [seconds.get(s, [0, 0]) for s in range(5, end)]
peak = max((w[0] for w in window), default=0)
mean_received = sum(w[0] for w in window) / max(len(window), 1)
mean_accepted = sum(w[1] for w in window) / max(len(window), 1)
series = " ".join(f"{seconds.get(s, [0, 0])[0]}/{seconds.get(s, [0, 0])[1]}" for s in range(0, end + 1))
print(f"{name:>9}: {len(finished)}/{clients} clients finished {clients * ops} operations in {max(finished):.1f} s; "
      f"client requests {counts['sent']} (503 upstream-throttled at the edge {counts['edge']}, "
      f"429 from the upstream {counts['upstream_refused']}, errors {counts['errors']})")
print(f"{'':>9}  seconds 5..{end}: upstream received peak {peak}/s ({peak / capacity:.2f}x), "
      f"mean {mean_received:.1f}/s ({mean_received / capacity:.2f}x); accepted mean {mean_accepted:.1f}/s "
      f"({mean_accepted / capacity:.0%} of capacity)")
print(f"{'':>9}  per second received/accepted: {series}")
# Per second: the controller's rate at its end, and the decreases in it by cause
# (T throttled, L latency, O timeout).
timeline, last = [], {}
for s in range(0, int(max(finished)) + 1):
    inside = [x for x in samples if s <= x[0] < s + 1]
    if not inside:
        continue
    _, rate_now, cuts = inside[-1]
    mark = "".join(k[0].upper() * (cuts.get(c, 0) - last.get(c, 0))
                   for c, k in (("throttled", "T"), ("latency", "L"), ("timeout", "O")))
    last = cuts
    timeline.append(f"{'-' if rate_now is None else f'{rate_now:.0f}'}{mark}")
if any(x[1] is not None for x in samples):
    total = {c: last.get(c, 0) for c in ("throttled", "latency", "timeout")}
    print(f"{'':>9}  controller rate per second (T/L/O: a decrease by 429-503/latency/timeout): {' '.join(timeline)}")
    print(f"{'':>9}  decreases: {total}")
PY
    curl -fs "http://127.0.0.1:$admin/metrics" | grep -E '^(adaptive_|retry_suppressed_total|upstream_(requests|attempts)_total)' | sort | sed 's/^/           /' || true
    stop_gateway
}

echo "upstream: $CAPACITY req/s (429 above); $CLIENTS clients x $RATE req/s, $OPS operations each, honouring Retry-After"
run adaptive "${ADAPTIVE:-adaptive = true}"
[[ ${OFF:-1} == 0 ]] || run off ""
