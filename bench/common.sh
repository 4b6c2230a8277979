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

# A port on 127.0.0.1 that is free now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Waits up to 10 s for `$1` to answer 2xx.
wait_http() {
    local i
    for ((i = 0; i < 100; i++)); do
        curl -fs -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
    done
    echo "not ready: $1" >&2
    return 1
}

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
