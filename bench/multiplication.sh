#!/usr/bin/env bash
# Retry multiplication: upstream attempts per client operation when a client that retries
# (python-requests with urllib3 Retry(total=3) on 503, as a typical SDK does) calls an
# always-503 upstream through the gateway, with the gateway's `client_retry_window` at its
# default (30 s) and disabled ("0s"). Issue 18's bound: ≤ 1 + max_retries + the client's
# retries = 7 per operation (16 without it: (1 + 3) × (1 + 3)).
#
# Usage: bench/multiplication.sh   (after: cargo build -p portcullis-gateway -p portcullis-testkit,
#                                   or the release build in target-bench)
#
# Environment: OPS [10] operations per kind (GETs to distinct paths, and keyed POSTs),
# BIN [<repo>/target-bench/release, else <repo>/target/debug]. Everything on 127.0.0.1;
# every process started here is stopped by PID on exit. Counts, not timings: the result
# does not depend on the machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target-bench/release}
[[ -x $BIN/portcullis && -x $BIN/bench-upstream ]] || BIN=$ROOT/target/debug
OPS=${OPS:-10}

# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

UP=$(free_port)
"$BIN/bench-upstream" --port "$UP" --threads 1 --fail-503 >"$TMP/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UP/__bench/stats"

run() { # name window
    local name=$1 window=$2 port
    start_gateway "$name" <<CONF
[rate_limit]
anonymous = { rate = 100000, per = "1s", burst = 100000 }

[[upstreams]]
name = "failing"
endpoints = ["http://127.0.0.1:$UP"]
retry = { max_retries = 3, base = "20ms", cap = "100ms", budget_percent = 50, budget_min_retries_per_second = 1000, client_retry_window = "$window" }

[[routes]]
prefix = "/"
upstream = "failing"
idempotency = { methods = ["POST"] }
CONF
    port=$GW_PORT
    python3 - "$port" "$UP" "$OPS" "$name" <<'PY'
import json, sys, urllib.request, uuid
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

port, up, ops, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def stats(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{up}/__bench/{path}") as r:
        return json.loads(r.read() or b"{}") if path == "stats" else None
session = requests.Session()
retry = Retry(total=3, status_forcelist=[503], allowed_methods=None, backoff_factor=0.05,
              respect_retry_after_header=True, raise_on_status=False)
session.mount("http://", HTTPAdapter(max_retries=retry))
for kind in ("GET", "keyed POST"):
    stats("reset")
    for i in range(ops):
        url = f"http://127.0.0.1:{port}/op/{uuid.uuid4()}"
        if kind == "GET":
            session.get(url, timeout=10)
        else:
            session.post(url, data=b'{"n":1}', timeout=10,
                         headers={"Idempotency-Key": str(uuid.uuid4())})
    hits = stats("stats")["hits"]
    print(f"{name:>14}  {kind:<10}  {ops} operations  {hits} upstream attempts  "
          f"{hits / ops:.1f} per operation")
PY
    stop_gateway
}

echo "client: urllib3 Retry(total=3) on 503; gateway: max_retries = 3; upstream: always 503"
run "window 30s" 30s
run "window 0s" 0s
