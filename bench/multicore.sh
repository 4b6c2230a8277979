#!/usr/bin/env bash
# Multi-core check (issue 14): 2 workers each, nothing pinned. nginx (worker_processes 2,
# bench/peers/nginx.conf) vs Portcullis (worker_threads 2), pass-through and local rate
# limit (tenant + global bucket that never rejects), wrk -t2 -c128 -d5s, 3 rounds alternating.
# Also `pc-pass-2x1`: two Portcullis processes with one worker each (19815, 19817), each
# driven by its own wrk -t1 -c64 at the same time, their req/s summed: what one process per
# core (nginx's model) would give on this machine. And `pc-pass-h2up`: pass-through to an
# HTTP/2 upstream (`http2 = true`, bench-upstream --http2 on 19820), whose connections go
# through hyper-util's client rather than the HTTP/1.1 pool (no nginx counterpart: nginx
# proxies to upstreams over HTTP/1.x only). And `pc-pass-tlsup`: pass-through to an HTTPS
# upstream (HTTP/1.1 over TLS, bench-upstream --tls on 19823, nginx's peer would be
# `proxy_pass https://` with `proxy_ssl_session_reuse`), also through hyper-util's client.
# Uses the release binaries of bench/run.sh (target-bench/); ports 18080-18094 and
# 19811-19825 on 127.0.0.1; every process is stopped by PID.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target-bench}/release
D=$(mktemp -d /tmp/portcullis-multicore.XXXXXX); mkdir -p $D/nginx
P1= P2= P3= P4= P5= P6= NGP= UPP= UP2P= UP3P=
trap 'kill $P1 $P2 $P3 $P4 $P5 $P6 $NGP $UPP $UP2P $UP3P 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT
UP=18080
$BIN/bench-upstream --port $UP --threads 2 > $D/up.log 2>&1 & UPP=$!
UP2=19820
$BIN/bench-upstream --port $UP2 --threads 2 --http2 > $D/up2.log 2>&1 & UP2P=$!
UP3=19823
$BIN/bench-upstream --port $UP3 --threads 2 --tls $D/ca.pem > $D/up3.log 2>&1 & UP3P=$!
sed -e 's/^worker_processes 1;/worker_processes 2;/' -e 's/@UPSTREAM@/18080/g' -e 's/@NGINX_PROXY@/18090/g' \
    -e 's/@NGINX_LIMIT@/18091/g' $ROOT/bench/peers/nginx.conf > $D/nginx/nginx.conf
nginx -p $D/nginx/ -c $D/nginx/nginx.conf -e $D/nginx/error.log > $D/nginx.log 2>&1 & NGP=$!
mk() { # name port admin rl [workers] [upstream: 0 HTTP/1.1, 1 HTTP/2, 2 HTTPS]
cat > $D/$1.toml <<TOML
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
worker_threads = ${5:-2}
shutdown_grace = "1s"

# As nginx's access_log off in the peer configuration (and bench/run.sh).
[telemetry]
access_log = false

[storage]
state = "memory"
idempotency = "memory"
database = "sqlite://$D/$1.db"
TOML
if [[ $4 == 1 ]]; then cat >> $D/$1.toml <<'TOML'

[rate_limit]
global = { rate = 1000000, per = "1s", burst = 1000000 }

[[tenants]]
id = "bench"
api_keys = ["pc-bench-0123456789abcdef"]
rate = 1000000
per = "1s"
burst = 1000000
TOML
fi
cat >> $D/$1.toml <<TOML

[[upstreams]]
name = "backend"
$(case ${6:-0} in
    1) printf 'endpoints = ["http://127.0.0.1:%s"]\nhttp2 = true' $UP2 ;;
    2) printf 'endpoints = ["https://127.0.0.1:%s"]\ntls = { ca = "%s", server_name = "localhost" }' $UP3 $D/ca.pem ;;
    *) printf 'endpoints = ["http://127.0.0.1:%s"]' $UP ;;
esac)

[[routes]]
prefix = "/"
upstream = "backend"
TOML
}
mk pass 19811 19812 0; mk rl 19813 19814 1; mk one-a 19815 19816 0 1; mk one-b 19817 19818 0 1
mk h2up 19821 19822 0 2 1; mk tlsup 19824 19825 0 2 2
for i in $(seq 50); do [[ -s $D/ca.pem ]] && break; sleep 0.1; done
$BIN/portcullis --config $D/pass.toml > $D/pass.log 2>&1 & P1=$!
$BIN/portcullis --config $D/rl.toml > $D/rl.log 2>&1 & P2=$!
$BIN/portcullis --config $D/one-a.toml > $D/one-a.log 2>&1 & P3=$!
$BIN/portcullis --config $D/one-b.toml > $D/one-b.log 2>&1 & P4=$!
$BIN/portcullis --config $D/h2up.toml > $D/h2up.log 2>&1 & P5=$!
$BIN/portcullis --config $D/tlsup.toml > $D/tlsup.log 2>&1 & P6=$!
for p in 19811 19813 19815 19817 19821 19824; do for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$p/readyz && break; sleep 0.1; done; done
AUTH=(-H "Authorization: Bearer pc-bench-0123456789abcdef")
run() { wrk -t2 -c128 -d5s "${@:2}" http://127.0.0.1:$1/x 2>/dev/null | awk '/Requests\/sec/{print $2}'; }
run_1() { wrk -t1 -c64 -d5s http://127.0.0.1:$1/x 2>/dev/null | awk '/Requests\/sec/{print $2}'; }
two() { (run_1 19815 & run_1 19817 & wait) | awk '{s += $1} END {printf "%.2f", s}'; }
for r in 1 2 3; do
  echo "round $r nginx-pass $(run 18090) pc-pass $(run 19811) nginx-limit $(run 18091 "${AUTH[@]}") pc-rl $(run 19813 "${AUTH[@]}") pc-pass-2x1 $(two) pc-pass-h2up $(run 19821) pc-pass-tlsup $(run 19824)"
done
