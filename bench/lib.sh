# Functions shared by the bench scripts (sourced; defines functions only, so a script with
# its own temporary directory and cleanup can use them too; bench/common.sh adds those).

# A port on 127.0.0.1 that is free now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Waits up to ${2:-100} × 0.1 s for `$1` to answer 2xx.
wait_http() {
    local i
    for ((i = 0; i < ${2:-100}; i++)); do
        curl -fs -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
    done
    echo "not ready: $1" >&2
    return 1
}
