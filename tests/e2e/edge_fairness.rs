//! One caller cannot hold every in-flight slot: an attacker tenant keeps hundreds of
//! responses it never takes (HTTP/2 streams whose window it never opens, HTTP/1.1 responses
//! it never reads) while two other tenants call at their normal rate. The upstream is a raw
//! socket server that streams an endless body to the attacker's requests, so the test sees
//! exactly when the gateway lets go of each upstream connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::h2frames::{self, FrameReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;

use crate::common::BIN;

/// Bounds every wait of this file: a test that needs it has failed.
const PATIENCE: Duration = Duration::from_secs(20);
/// The server-wide cap in these tests; the default `caller_share` (0.5) gives one caller 20.
const MAX_IN_FLIGHT: usize = 40;
/// The attack's shape: this many responses pending at once.
const ATTACK: usize = 300;

// === the upstream ===

/// What the upstream saw.
#[derive(Debug, Default)]
struct Seen {
    /// `/big` connections still open (the gateway has not let go of them).
    big_open: AtomicUsize,
    /// The most `/big` connections open at once.
    big_peak: AtomicUsize,
    /// `/big` requests received.
    big_hits: AtomicUsize,
    /// `/small` requests answered.
    small_hits: AtomicUsize,
    /// Body bytes written to `/big` requests.
    big_bytes: AtomicU64,
}

/// A raw HTTP/1.1 upstream on loopback: `/small` answers `ok` (keep-alive); `/big` streams
/// an endless body (1 GiB announced) until the gateway closes the connection.
async fn firehose() -> (SocketAddr, Arc<Seen>, JoinSet<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let mut tasks = JoinSet::new();
    let accepting = seen.clone();
    tasks.spawn(async move {
        let mut connections = JoinSet::new();
        // Bounded: the test ends (and aborts this task) long before.
        for _ in 0..100_000 {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            connections.spawn(serve_upstream(stream, accepting.clone()));
        }
    });
    (addr, seen, tasks)
}

async fn serve_upstream(mut stream: TcpStream, seen: Arc<Seen>) {
    let mut buf = Vec::new();
    // Bounded: one request per round, at most this many per connection.
    for _ in 0..10_000 {
        let Some(path) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        if !path.starts_with("/big") {
            seen.small_hits.fetch_add(1, Ordering::SeqCst);
            let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            if stream.write_all(reply).await.is_err() {
                return;
            }
            continue;
        }
        seen.big_hits.fetch_add(1, Ordering::SeqCst);
        let open = seen.big_open.fetch_add(1, Ordering::SeqCst) + 1;
        seen.big_peak.fetch_max(open, Ordering::SeqCst);
        let chunk = vec![b'x'; 16 * 1024];
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n";
        let (mut reader, mut writer) = stream.split();
        let write = async {
            writer.write_all(head).await?;
            for _ in 0..(1 << 16) {
                writer.write_all(&chunk).await?;
                seen.big_bytes
                    .fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
            Ok::<_, std::io::Error>(())
        };
        let mut sink = [0u8; 1024];
        // The gateway closing its side ends the read (0 or a reset) or fails the write.
        tokio::select! {
            _ = write => {}
            _ = reader.read(&mut sink) => {}
        }
        seen.big_open.fetch_sub(1, Ordering::SeqCst);
        return;
    }
}

/// Reads one request head (no body) and returns its path; `None` once the peer is gone.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return head.split(' ').nth(1).map(str::to_owned);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
}

// === the gateway ===

fn tenant(id: &str) -> String {
    format!(
        "[[tenants]]\nid = \"{id}\"\napi_keys = [\"{id}-key-0001\"]\nrate = 10000\nper = \"1s\"\nburst = 10000\n"
    )
}

async fn gateway(upstream: SocketAddr, server: &str) -> GatewayProcess {
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n{server}\n\n{}{}{}\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"http://{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n",
        tenant("mallory"),
        tenant("alice"),
        tenant("bob"),
    );
    GatewayProcess::start(BIN, &config).await
}

/// Two tenants calling `/small` one request after another, `rounds` times each, 25 ms
/// apart; returns how many of their requests were answered 200.
async fn victims(gateway: &GatewayProcess, rounds: usize) -> usize {
    let mut tasks = JoinSet::new();
    for who in ["alice", "bob"] {
        let url = gateway.url() + "/small";
        tasks.spawn(async move {
            let client = crate::common::client();
            let mut ok = 0;
            for _ in 0..rounds {
                let answer = client
                    .get(&url)
                    .header("x-api-key", format!("{who}-key-0001"))
                    .send()
                    .await;
                if answer.is_ok_and(|a| a.status() == 200) {
                    ok += 1;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(done) = tasks.join_next().await {
        ok += done.unwrap();
    }
    ok
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// === the HTTP/2 attacker ===

/// What the attacker's connections saw.
#[derive(Debug, Default)]
struct Attack {
    /// Stop opening streams.
    stop: AtomicBool,
    /// Streams answered 200 (admitted), and answered otherwise (refused at once).
    admitted: AtomicUsize,
    refused: AtomicUsize,
    /// Streams the gateway reset.
    reset: AtomicUsize,
    /// Once stopped, keep reading until every admitted stream has been reset.
    drain: bool,
}

fn h2_request(stream: u32, path: &str) -> Vec<u8> {
    h2frames::headers(
        stream,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("x-api-key", "mallory-key-0001"),
        ],
        true,
    )
}

/// One h2c connection that keeps `streams` requests for `/big` open and never opens a
/// window (SETTINGS_INITIAL_WINDOW_SIZE = 0): each stream answered or reset is replaced
/// by a new one until `attack.stop`. It reads everything else, so its connection stays
/// healthy. Returns the connection, still open, once stopped.
async fn h2_attacker(addr: SocketAddr, streams: u32, attack: Arc<Attack>) -> TcpStream {
    h2_attacker_with_window(addr, streams, 0, attack).await
}

/// [`h2_attacker`] whose streams each take `window` bytes first (the connection's window
/// opened wide), then stall: a client that read for a while and then stopped.
async fn h2_attacker_with_window(
    addr: SocketAddr,
    streams: u32,
    window: u32,
    attack: Arc<Attack>,
) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let mut hello = h2frames::PREFACE.to_vec();
    hello.extend(h2frames::settings(&[(
        h2frames::setting::INITIAL_WINDOW_SIZE,
        window,
    )]));
    if window > 0 {
        let wide = (1u32 << 30).to_be_bytes();
        hello.extend(h2frames::encode(h2frames::kind::WINDOW_UPDATE, 0, 0, &wide));
    }
    let mut next = 1u32;
    for _ in 0..streams {
        hello.extend(h2_request(next, &format!("/big/{next}")));
        next += 2;
    }
    conn.write_all(&hello).await.unwrap();
    let mut reader = FrameReader::new(conn);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    // Bounded by PATIENCE and by the number of streams one connection may open.
    while tokio::time::Instant::now() < deadline && next < 40_000 {
        let stopping = attack.stop.load(Ordering::SeqCst);
        let Some(frame) = reader.next(Duration::from_millis(50)).await else {
            // Stopped, and every admitted stream has been reset (or none will be).
            let settled = attack.reset.load(Ordering::SeqCst)
                >= attack.admitted.load(Ordering::SeqCst)
                || !attack.drain;
            if stopping && settled {
                break;
            }
            continue;
        };
        let replace = match frame.kind {
            h2frames::kind::SETTINGS if frame.flags & h2frames::ACK == 0 => {
                let ack = h2frames::settings_ack();
                reader.get_mut().write_all(&ack).await.unwrap();
                false
            }
            h2frames::kind::HEADERS => match frame.static_status() {
                Some(200) => {
                    attack.admitted.fetch_add(1, Ordering::SeqCst);
                    false
                }
                _ => {
                    attack.refused.fetch_add(1, Ordering::SeqCst);
                    // Done with it: cancel it and ask again, as an attacker would.
                    let cancel = h2frames::encode(
                        h2frames::kind::RST_STREAM,
                        0,
                        frame.stream,
                        &8u32.to_be_bytes(),
                    );
                    reader.get_mut().write_all(&cancel).await.unwrap();
                    true
                }
            },
            h2frames::kind::RST_STREAM => {
                attack.reset.fetch_add(1, Ordering::SeqCst);
                true
            }
            _ => false,
        };
        if replace && !stopping {
            // A little pause per replacement, so the attack does not only burn the CPU.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let request = h2_request(next, &format!("/big/{next}"));
            reader.get_mut().write_all(&request).await.unwrap();
            next += 2;
        }
    }
    reader.into_inner()
}

#[tokio::test]
async fn stalled_h2_streams_of_one_tenant_leave_others_served_and_are_reset() {
    let (upstream, seen, _upstream_tasks) = firehose().await;
    let gateway = gateway(
        upstream,
        &format!("load_shed_limit = {MAX_IN_FLIGHT}\nsend_timeout = \"1s\""),
    )
    .await;
    let attack = Arc::new(Attack {
        drain: true,
        ..Attack::default()
    });
    let mut attackers = JoinSet::new();
    let per_connection = (ATTACK / 3) as u32;
    for _ in 0..3 {
        attackers.spawn(h2_attacker(gateway.addr, per_connection, attack.clone()));
    }
    eventually("the attacker's first streams reach the upstream", || {
        seen.big_hits.load(Ordering::SeqCst) > 0
    })
    .await;

    // Other tenants, at their normal rate, while the attack goes on (~2.5 s).
    let rounds = 50;
    let served = victims(&gateway, rounds).await;
    assert!(
        served * 100 >= 2 * rounds * 95,
        "only {served} of {} requests of other tenants served",
        2 * rounds
    );
    assert!(seen.small_hits.load(Ordering::SeqCst) >= served);
    // The attacker never held more than its share of the cap …
    let peak = seen.big_peak.load(Ordering::SeqCst);
    assert!(
        peak <= MAX_IN_FLIGHT / 2,
        "{peak} stalled upstream requests"
    );
    assert!(attack.refused.load(Ordering::SeqCst) > 0);

    // … and once it stops asking, every stalled stream is reset within send_timeout and
    // its upstream connection closed, while the attacker's connections stay open.
    attack.stop.store(true, Ordering::SeqCst);
    eventually("the upstream sees every stalled request let go", || {
        seen.big_open.load(Ordering::SeqCst) == 0
    })
    .await;
    let mut open = Vec::new();
    while let Some(conn) = attackers.join_next().await {
        open.push(conn.unwrap());
    }
    assert!(attack.admitted.load(Ordering::SeqCst) > 0);
    assert!(
        attack.reset.load(Ordering::SeqCst) >= attack.admitted.load(Ordering::SeqCst),
        "admitted {} streams, {} reset",
        attack.admitted.load(Ordering::SeqCst),
        attack.reset.load(Ordering::SeqCst)
    );
    assert_eq!(open.len(), 3);
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("http2_streams_reset_total{listener=\"proxy\",reason=\"send_timeout\"}"),
        "{metrics}"
    );
}

// === the HTTP/1.1 attacker ===

/// A connection that asks for `/big` as the attacker and never reads (a 4 KiB receive
/// buffer, so little sits in the kernel).
async fn h1_unread(addr: SocketAddr, n: usize) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.set_recv_buffer_size(4096).ok()?;
    let mut conn = socket.connect(addr).await.ok()?;
    let request =
        format!("GET /big/{n} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: mallory-key-0001\r\n\r\n");
    conn.write_all(request.as_bytes()).await.ok()?;
    Some(conn)
}

#[tokio::test]
async fn unread_h1_responses_of_one_tenant_leave_others_served_and_are_released() {
    let (upstream, seen, _upstream_tasks) = firehose().await;
    let gateway = gateway(
        upstream,
        &format!("load_shed_limit = {MAX_IN_FLIGHT}\nsend_timeout = \"1s\""),
    )
    .await;
    let addr = gateway.addr;
    // 300 connections at once, then one more every 10 ms for as long as the others call
    // (a slot the gateway frees is asked for again at once): none of them ever reads.
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            for n in 0..ATTACK {
                held.extend(h1_unread(addr, n).await);
            }
            let mut n = ATTACK;
            while !stop.load(Ordering::SeqCst) && n < 2_000 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                held.extend(h1_unread(addr, n).await);
                n += 1;
            }
            held
        })
    };
    eventually("the attacker's requests reach the upstream", || {
        seen.big_hits.load(Ordering::SeqCst) > 0
    })
    .await;

    let rounds = 50;
    let served = victims(&gateway, rounds).await;
    assert!(
        served * 100 >= 2 * rounds * 95,
        "only {served} of {} requests of other tenants served",
        2 * rounds
    );
    assert!(seen.small_hits.load(Ordering::SeqCst) >= served);
    let peak = seen.big_peak.load(Ordering::SeqCst);
    assert!(
        peak <= MAX_IN_FLIGHT / 2,
        "{peak} stalled upstream requests"
    );

    // Every unread response is given up at send_timeout: the upstream sees its connection
    // closed while the attacker still holds every socket open.
    stop.store(true, Ordering::SeqCst);
    let held = attacker.await.unwrap();
    eventually("the upstream sees every unread request let go", || {
        seen.big_open.load(Ordering::SeqCst) == 0
    })
    .await;
    assert!(held.len() >= ATTACK);
}

// === memory ===

/// The gateway's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Waits (bounded) until the upstream has stopped writing: every buffer between it and the
/// stalled clients is full.
async fn buffers_full(seen: &Seen) {
    let mut last = u64::MAX;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = seen.big_bytes.load(Ordering::SeqCst);
        if now == last {
            return;
        }
        last = now;
    }
    panic!("the upstream never stopped writing");
}

/// Starts a gateway for the memory tests: every stalled response admitted and kept (no
/// fairness, no send timeout in reach), `extra` added to `[server]`; warmed up.
async fn memory_gateway(upstream: SocketAddr, extra: &str) -> (GatewayProcess, u32) {
    let mut gateway = gateway(
        upstream,
        &format!("load_shed_limit = 1000\ncaller_share = 1.0\nsend_timeout = \"600s\"\n{extra}"),
    )
    .await;
    let pid = gateway.guard().pid();
    assert_eq!(victims(&gateway, 20).await, 40, "warm-up");
    (gateway, pid)
}

/// The gateway's RSS growth per stalled response, in KiB, once every buffer is full.
async fn growth_per_response(seen: &Seen, pid: u32, before: u64, what: &str) -> u64 {
    eventually("every stalled response reaches the upstream", || {
        seen.big_open.load(Ordering::SeqCst) == ATTACK
    })
    .await;
    buffers_full(seen).await;
    let during = rss_kib(pid);
    let each = during.saturating_sub(before) / ATTACK as u64;
    println!(
        "{what}: RSS {before} KiB before, {during} KiB with {ATTACK} write-stalled responses: \
         {each} KiB each; the upstream wrote {} MiB in all",
        seen.big_bytes.load(Ordering::SeqCst) >> 20
    );
    each
}

/// The bound asserted per stalled response with the default `response_buffer_bytes`
/// (64 KiB): hyper's chunk waiting for the window or the socket, the chunk in the body
/// channel and the upstream read buffer, each at most that, plus per-request state: about
/// 4 × 64 KiB (≈ 235 KiB measured on a quiet machine). Asserted with room for the
/// allocator's variance under a loaded machine (275 KiB seen during a full suite run); the
/// buffering before the bound held 780–980 KiB.
const BOUND_KIB: u64 = 6 * 64;

#[tokio::test]
async fn write_stalled_h2_streams_hold_bounded_memory() {
    let (upstream, seen, _upstream_tasks) = firehose().await;
    let (gateway, pid) = memory_gateway(upstream, "").await;
    let before = rss_kib(pid);
    let attack = Arc::new(Attack::default());
    attack.stop.store(true, Ordering::SeqCst); // no replacements
    let mut attackers = JoinSet::new();
    for _ in 0..3 {
        // 256 KiB per stream first, so the upstream reads grow, then nothing.
        let streams = (ATTACK / 3) as u32;
        attackers.spawn(h2_attacker_with_window(
            gateway.addr,
            streams,
            256 << 10,
            attack.clone(),
        ));
    }
    let each = growth_per_response(&seen, pid, before, "HTTP/2").await;
    assert!(each <= BOUND_KIB, "{each} KiB per stalled stream");
    drop(attackers);
}

#[tokio::test]
async fn unread_h1_responses_hold_bounded_memory() {
    let (upstream, seen, _upstream_tasks) = firehose().await;
    let (gateway, pid) = memory_gateway(upstream, "").await;
    let before = rss_kib(pid);
    let mut held = Vec::new();
    for n in 0..ATTACK {
        held.extend(h1_unread(gateway.addr, n).await);
    }
    let each = growth_per_response(&seen, pid, before, "HTTP/1.1").await;
    assert!(each <= BOUND_KIB, "{each} KiB per unread response");
    drop(held);
}
