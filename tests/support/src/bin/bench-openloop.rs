//! `bench-openloop`: an open-loop HTTP/1.1 load generator with coordinated-omission
//! correction, for `bench/run.sh` (wrk2 and oha are not installed here).
//!
//! Requests are scheduled at a fixed rate, independent of responses: connection `k` of `C`
//! sends its `j`-th request at `start + (j·C + k) / rate`. Latency is measured from that
//! *intended* time to the end of the response, so a stalled server is charged for every
//! request it delayed, not just the one it was serving (the correction wrk2 makes). Requests
//! whose time came but that could not be sent before the end (their connection was still
//! waiting) are counted as `missed` with their wait so far as a lower bound.
//!
//! ```text
//! bench-openloop --addr 127.0.0.1:8080 --path /x --rate 10000 --duration 3 --warmup 1 \
//!     [--conns 64] [--method POST --body '{..}' --header 'Content-Type: application/json'] \
//!     [--seq-header Idempotency-Key --seq-prefix run1]
//! ```
//!
//! Prints one JSON object: offered and achieved rate, counts, p50/p90/p99/p99.9/max in µs.
//! Loopback only; every run is bounded by `--duration` plus a 5 s response timeout.
#![allow(clippy::disallowed_types, clippy::disallowed_methods, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(5);
/// Below this distance to the intended time, spin (yielding) instead of arming a timer:
/// tokio's timer wheel has 1 ms granularity, which would add up to 1 ms to every latency.
const SPIN: Duration = Duration::from_micros(1500);

struct Args {
    addr: SocketAddr,
    path: String,
    method: String,
    rate: f64,
    duration: f64,
    warmup: f64,
    conns: usize,
    headers: Vec<String>,
    body: String,
    seq_header: Option<String>,
    seq_prefix: String,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    ok: u64,
    non2xx: u64,
    errors: u64,
    missed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:8080".parse().map_err(|e| format!("{e}"))?,
        path: "/".into(),
        method: "GET".into(),
        rate: 1000.0,
        duration: 3.0,
        warmup: 1.0,
        conns: 64,
        headers: Vec::new(),
        body: String::new(),
        seq_header: None,
        seq_prefix: "k".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => a.addr = val()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--path" => a.path = val()?,
            "--method" => a.method = val()?,
            "--rate" => a.rate = val()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--duration" => a.duration = val()?.parse().map_err(|e| format!("--duration: {e}"))?,
            "--warmup" => a.warmup = val()?.parse().map_err(|e| format!("--warmup: {e}"))?,
            "--conns" => a.conns = val()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--header" => a.headers.push(val()?),
            "--body" => a.body = val()?,
            "--seq-header" => a.seq_header = Some(val()?),
            "--seq-prefix" => a.seq_prefix = val()?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !a.addr.ip().is_loopback() {
        return Err("--addr must be a loopback address".into());
    }
    let ok = a.rate > 0.0
        && a.rate <= 1e6
        && (0.1..=120.0).contains(&a.duration)
        && (0.0..=30.0).contains(&a.warmup)
        && (1..=4096).contains(&a.conns);
    if !ok {
        return Err(
            "want 0 < rate <= 1e6, duration 0.1..=120 s, warmup 0..=30 s, conns 1..=4096".into(),
        );
    }
    Ok(a)
}

fn request(a: &Args, k: usize, j: u64) -> Vec<u8> {
    let mut r = format!("{} {} HTTP/1.1\r\nHost: {}\r\n", a.method, a.path, a.addr);
    for h in &a.headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    if let Some(name) = &a.seq_header {
        r.push_str(&format!("{name}: {}-{k}-{j}\r\n", a.seq_prefix));
    }
    if !a.body.is_empty() || a.method != "GET" {
        r.push_str(&format!("Content-Length: {}\r\n", a.body.len()));
    }
    r.push_str("\r\n");
    r.push_str(&a.body);
    r.into_bytes()
}

/// Reads one response (Content-Length or chunked body); returns its status.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        fill(s, buf).await?;
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("head not UTF-8"))?;
    let status: u16 = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut length = None;
    let mut chunked = false;
    for line in head.split("\r\n").skip(1) {
        let Some((n, v)) = line.split_once(':') else {
            continue;
        };
        if n.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse::<usize>().ok();
        } else if n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked") {
            chunked = true;
        }
    }
    buf.drain(..head_end);
    if chunked {
        // Bounded: every iteration consumes a chunk or reads more bytes (or fails).
        loop {
            let Some(i) = buf.windows(2).position(|w| w == b"\r\n") else {
                fill(s, buf).await?;
                continue;
            };
            let size_txt = std::str::from_utf8(&buf[..i]).map_err(|_| bad("chunk size"))?;
            let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("chunk size"))?;
            let need = i + 2 + size + 2;
            while buf.len() < need {
                fill(s, buf).await?;
            }
            buf.drain(..need);
            if size == 0 {
                return Ok(status);
            }
        }
    }
    let n = length.unwrap_or(0);
    while buf.len() < n {
        fill(s, buf).await?;
    }
    buf.drain(..n);
    Ok(status)
}

async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut tmp = [0u8; 16 * 1024];
    let n = s.read(&mut tmp).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&tmp[..n]);
    Ok(())
}

async fn pace_until(at: Instant) {
    if let Some(early) = at.checked_duration_since(Instant::now()) {
        if early > SPIN {
            tokio::time::sleep_until(at - SPIN).await;
        }
        while Instant::now() < at {
            tokio::task::yield_now().await;
        }
    }
}

/// One connection's share of the schedule.
async fn connection(a: std::rc::Rc<Args>, k: usize, start: Instant) -> Tally {
    let mut t = Tally::default();
    let period = 1.0 / a.rate;
    let measure_from = start + Duration::from_secs_f64(a.warmup);
    let end = measure_from + Duration::from_secs_f64(a.duration);
    let mut conn: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(16 * 1024);
    // Bounded by the schedule: at most rate × (warmup + duration) / conns iterations.
    for j in 0u64.. {
        let intended =
            start + Duration::from_secs_f64((j * a.conns as u64 + k as u64) as f64 * period);
        if intended >= end {
            break;
        }
        let now = Instant::now();
        if now >= end {
            // Due but never sent: count it with its wait so far (a lower bound).
            if intended >= measure_from {
                t.missed += 1;
                t.latencies_us.push((now - intended).as_micros() as u64);
            }
            continue;
        }
        pace_until(intended).await;
        let outcome = tokio::time::timeout(TIMEOUT, async {
            if conn.is_none() {
                let s = TcpStream::connect(a.addr).await?;
                s.set_nodelay(true)?;
                conn = Some(s);
                buf.clear();
            }
            let s = conn.as_mut().ok_or(std::io::ErrorKind::NotConnected)?;
            s.write_all(&request(&a, k, j)).await?;
            read_response(s, &mut buf).await
        })
        .await;
        let done = Instant::now();
        match outcome {
            Ok(Ok(status)) => {
                if intended >= measure_from {
                    t.latencies_us.push((done - intended).as_micros() as u64);
                    if (200..300).contains(&status) {
                        t.ok += 1;
                    } else {
                        t.non2xx += 1;
                    }
                }
            }
            _ => {
                conn = None;
                if intended >= measure_from {
                    t.errors += 1;
                    t.latencies_us.push((done - intended).as_micros() as u64);
                }
            }
        }
    }
    t
}

fn pct(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    let a = match parse_args() {
        Ok(a) => std::rc::Rc::new(a),
        Err(e) => {
            eprintln!("bench-openloop: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-openloop: runtime: {e}");
            std::process::exit(1);
        }
    };
    let local = tokio::task::LocalSet::new();
    let total = local.block_on(&rt, async {
        let start = Instant::now() + Duration::from_millis(50);
        let tasks: Vec<_> = (0..a.conns)
            .map(|k| tokio::task::spawn_local(connection(a.clone(), k, start)))
            .collect();
        let mut total = Tally::default();
        for task in tasks {
            if let Ok(t) = task.await {
                total.latencies_us.extend(t.latencies_us);
                total.ok += t.ok;
                total.non2xx += t.non2xx;
                total.errors += t.errors;
                total.missed += t.missed;
            }
        }
        total
    });
    let mut l = total.latencies_us;
    l.sort_unstable();
    let completed = total.ok + total.non2xx;
    println!(
        "{{\"offered_rps\":{:.1},\"achieved_rps\":{:.1},\"completed\":{completed},\"non2xx\":{},\"errors\":{},\"missed\":{},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}}}",
        a.rate,
        completed as f64 / a.duration,
        total.non2xx,
        total.errors,
        total.missed,
        pct(&l, 0.5),
        pct(&l, 0.9),
        pct(&l, 0.99),
        pct(&l, 0.999),
        l.last().copied().unwrap_or(0),
    );
}
