//! `bench-wsload`: a closed-loop WebSocket echo load client for `bench/websocket.sh`.
//!
//! ```text
//! bench-wsload --url ws://127.0.0.1:8080/ws [--conns 32] [--size 128] [--duration 5] \
//!     [--warmup 1] [--header 'Name: value']…
//! bench-wsload --url ws://127.0.0.1:8080/ws --probe
//! ```
//!
//! Opens `--conns` WebSocket connections (TCP_NODELAY) on one current-thread tokio runtime;
//! each sends a binary message of `--size` bytes and waits for its echo before sending the
//! next (closed loop), checking that the echo is the same bytes. Round trips that end in the
//! `--duration` seconds after `--warmup` seconds are counted; the rest (handshakes included)
//! are not. Prints one JSON line: `{"msgs_per_s":…,"completed":…,"errors":…,"p50_us":…,
//! "p99_us":…,"max_us":…,"client_busy":…,…}` (latency = send to echo received, per message;
//! `client_busy` = this process's CPU time over its run time, from `/proc/self/schedstat`:
//! near 1.0 means the client, not the proxy, may be the limit).
//!
//! `--probe` sends one message on one connection and exits 0 once it comes back intact,
//! retrying for at most 10 s (a readiness check that goes through the proxy).
//!
//! Loopback only; every wait is bounded (5 s per handshake or echo) and so is the run.
#![allow(missing_docs)]

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderName, HeaderValue};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const TIMEOUT: Duration = Duration::from_secs(5);
const PROBE_TRIES: u32 = 100;

struct Args {
    url: String,
    host_port: String,
    conns: usize,
    size: usize,
    duration: f64,
    warmup: f64,
    headers: Vec<(HeaderName, HeaderValue)>,
    probe: bool,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: String::new(),
        host_port: String::new(),
        conns: 32,
        size: 128,
        duration: 5.0,
        warmup: 1.0,
        headers: Vec::new(),
        probe: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = val()?,
            "--conns" => a.conns = val()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--size" => a.size = val()?.parse().map_err(|e| format!("--size: {e}"))?,
            "--duration" => a.duration = val()?.parse().map_err(|e| format!("--duration: {e}"))?,
            "--warmup" => a.warmup = val()?.parse().map_err(|e| format!("--warmup: {e}"))?,
            "--header" => {
                let h = val()?;
                let (n, v) = h
                    .split_once(':')
                    .ok_or(format!("--header {h}: want Name: value"))?;
                let n = HeaderName::try_from(n.trim()).map_err(|e| format!("--header: {e}"))?;
                let v = HeaderValue::try_from(v.trim()).map_err(|e| format!("--header: {e}"))?;
                a.headers.push((n, v));
            }
            "--probe" => a.probe = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    // ws://127.0.0.1:PORT/path only: the harness never points this anywhere else.
    let rest = a
        .url
        .strip_prefix("ws://")
        .ok_or("--url: want ws://127.0.0.1:PORT/path")?;
    let host_port = rest.split('/').next().unwrap_or_default();
    let host = host_port
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(host_port);
    let loopback = host
        .parse::<std::net::IpAddr>()
        .map(|ip| ip.is_loopback())
        .unwrap_or(false);
    if !loopback {
        return Err("--url must name a loopback address and port (ws://127.0.0.1:PORT/…)".into());
    }
    a.host_port = host_port.to_string();
    let ok = (1..=4096).contains(&a.conns)
        && (1..=1 << 20).contains(&a.size)
        && (0.1..=120.0).contains(&a.duration)
        && (0.0..=30.0).contains(&a.warmup);
    if !ok {
        return Err(
            "want conns 1..=4096, size 1..=1 MiB, duration 0.1..=120 s, warmup 0..=30 s".into(),
        );
    }
    Ok(a)
}

async fn open(a: &Args) -> Result<WebSocketStream<TcpStream>, String> {
    let mut request = a
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("request: {e}"))?;
    for (n, v) in &a.headers {
        request.headers_mut().append(n.clone(), v.clone());
    }
    let tcp = timeout(TIMEOUT, TcpStream::connect(&a.host_port))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let (ws, _) = timeout(TIMEOUT, tokio_tungstenite::client_async(request, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

/// Sends `payload` and waits for the same bytes to come back (pings and pongs skipped).
async fn round_trip(ws: &mut WebSocketStream<TcpStream>, payload: &Bytes) -> Result<(), String> {
    timeout(TIMEOUT, ws.send(Message::Binary(payload.clone())))
        .await
        .map_err(|_| "send timed out".to_string())?
        .map_err(|e| format!("send: {e}"))?;
    // Bounded: at most a few control frames precede the echo, and the whole wait is capped.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let next = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| "echo timed out".to_string())?;
        match next {
            Some(Ok(Message::Binary(got))) if got == *payload => return Ok(()),
            Some(Ok(Message::Binary(got))) => {
                return Err(format!("echo differs ({} bytes back)", got.len()))
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(other)) => return Err(format!("unexpected {other:?}")),
            Some(Err(e)) => return Err(format!("receive: {e}")),
            None => return Err("connection closed".into()),
        }
    }
}

async fn connection(a: Rc<Args>, k: usize, from: Instant, end: Instant) -> Tally {
    let mut t = Tally::default();
    let mut ws = match open(&a).await {
        Ok(ws) => ws,
        Err(e) => {
            t.fail(e);
            return t;
        }
    };
    // A distinct payload per connection: a proxy that mixed connections up would be caught.
    let payload = Bytes::from(vec![b'a' + (k % 26) as u8; a.size]);
    // Bounded by `end` (plus one 5 s timeout).
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        if let Err(e) = round_trip(&mut ws, &payload).await {
            t.fail(e);
            return t;
        }
        let done = Instant::now();
        if done >= from && done < end {
            t.latencies_us
                .push(done.duration_since(sent).as_micros() as u64);
        }
    }
    // A clean close, bounded: send ours, read until the peer's close or the end.
    let _ = timeout(Duration::from_secs(1), async {
        let _ = ws.close(None).await;
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    t
}

/// CPU time of this process's threads in ns (Linux schedstat; 0 where unreadable).
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

fn pct(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn probe(a: &Args) -> Result<(), String> {
    let payload = Bytes::from(vec![b'p'; a.size]);
    let mut last = String::new();
    for _ in 0..PROBE_TRIES {
        match open(a).await {
            Ok(mut ws) => match round_trip(&mut ws, &payload).await {
                Ok(()) => {
                    let _ = timeout(Duration::from_secs(1), ws.close(None)).await;
                    return Ok(());
                }
                Err(e) => last = e,
            },
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

async fn run(a: Rc<Args>) -> Result<(), String> {
    if a.probe {
        return probe(&a).await;
    }
    let (started, cpu_start) = (Instant::now(), cpu_ns());
    let from = started + Duration::from_secs_f64(a.warmup);
    let end = from + Duration::from_secs_f64(a.duration);
    let tasks: Vec<_> = (0..a.conns)
        .map(|k| tokio::task::spawn_local(connection(a.clone(), k, from, end)))
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(t) => {
                total.latencies_us.extend(t.latencies_us);
                total.errors += t.errors;
                if let Some(e) = t.first_error {
                    total.first_error.get_or_insert(e);
                }
            }
            Err(e) => total.fail(format!("task: {e}")),
        }
    }
    let busy =
        cpu_ns().saturating_sub(cpu_start) as f64 / started.elapsed().as_nanos().max(1) as f64;
    let mut l = total.latencies_us;
    l.sort_unstable();
    let first_error = total
        .first_error
        .unwrap_or_default()
        .replace(['"', '\\'], "'");
    println!(
        "{{\"conns\":{},\"size\":{},\"duration_s\":{},\"completed\":{},\"msgs_per_s\":{:.1},\"errors\":{},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"max_us\":{},\"client_busy\":{busy:.3},\"first_error\":\"{first_error}\"}}",
        a.conns,
        a.size,
        a.duration,
        l.len(),
        l.len() as f64 / a.duration,
        total.errors,
        pct(&l, 0.5),
        pct(&l, 0.9),
        pct(&l, 0.99),
        l.last().copied().unwrap_or(0),
    );
    Ok(())
}

fn main() {
    let a = match parse_args() {
        Ok(a) => Rc::new(a),
        Err(e) => {
            eprintln!("bench-wsload: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-wsload: runtime: {e}");
            std::process::exit(1);
        }
    };
    let local = tokio::task::LocalSet::new();
    if let Err(e) = local.block_on(&rt, run(a)) {
        eprintln!("bench-wsload: {e}");
        std::process::exit(1);
    }
}
