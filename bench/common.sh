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
