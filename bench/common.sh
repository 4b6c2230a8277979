# Shared by the bench scripts (sourced, not run): a temporary directory, the PIDs of every
# process a script starts (all stopped on exit), a free loopback port, and a bounded wait
# for an HTTP endpoint to answer.

TMP=$(mktemp -d)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Starts a gateway called $1 on free loopback ports: its config is a server and SQLite
# preamble followed by stdin. Sets GW_PORT (the proxy port) and GW_PID; stop_gateway ends it.
start_gateway() {
    local name=$1 admin
    GW_PORT=$(free_port)
    admin=$(free_port)
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n\n' "$GW_PORT" "$admin"
        printf '[storage]\ndatabase = "sqlite://%s/%s.db"\n\n' "$TMP" "$name"
        cat
    } >"$TMP/$name.toml"
    "$BIN/portcullis" --config "$TMP/$name.toml" >"$TMP/$name.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_http "http://127.0.0.1:$GW_PORT/healthz"
}

stop_gateway() {
    kill "$GW_PID"
    wait "$GW_PID" 2>/dev/null || true
}
