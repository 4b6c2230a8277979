//! `[rate_limit] sync = "batched"`: three real gateway replicas leasing a global ceiling's
//! tokens from one real Redis. Requests go over raw sockets; what the upstream received is
//! counted; Redis is asked (raw RESP) how many scripts ran and what the bucket holds.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::ScriptedUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::BIN;

/// 3 000 tokens, refilling one per 200 ms: refill is negligible over the test, so the
/// bucket's arithmetic is independent of how fast this machine is. Leases: 5 % × 3 000 / 3
/// replicas = 50 tokens.
const BURST: u64 = 3_000;
const PER_SECS: u64 = 600;
const LEASE: u64 = 50;

fn config(upstream: &str, redis: &str) -> String {
    format!(
        "[storage]\nstate = \"{redis}\"\nstate_timeout = \"500ms\"\n\n[rate_limit]\nsync = \"batched\"\nmax_overshoot = 0.05\nreplicas = 3\nglobal = {{ rate = {BURST}, per = \"{PER_SECS}s\", burst = {BURST} }}\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n"
    )
}

/// One anonymous `GET /d` over a fresh connection: the status and the raw answer.
async fn get(addr: SocketAddr) -> (u16, Vec<u8>) {
    let answer = raw_request(
        addr,
        b"GET /d HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_default();
    (parse_status(&answer).unwrap_or(0), answer)
}

/// Sends one inline command to Redis and returns the raw reply (bounded to 5 s).
async fn redis_raw(port: u16, command: &str) -> String {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(format!("{command}\r\nQUIT\r\n").as_bytes())
            .await
            .ok()?;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        Some(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Scripts run by the server so far (`EVALSHA` + `EVAL` calls).
async fn scripts_run(port: u16) -> u64 {
    redis_raw(port, "INFO commandstats")
        .await
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Tokens missing from the global bucket now (its TAT ahead of server time, in tokens,
/// rounded up); 0 when the key is absent (a full bucket).
async fn global_tokens_taken(port: u16) -> u64 {
    let tat = redis_raw(port, "GET rl:{global}:global").await;
    // A bulk reply: "$19\r\n<ns>\r\n", or "$-1" when absent.
    let Some(tat_ns) = tat
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse::<u64>().ok())
    else {
        return 0;
    };
    let time = redis_raw(port, "TIME").await;
    // "*2\r\n$10\r\n<secs>\r\n$6\r\n<micros>\r\n"
    let numbers: Vec<u64> = time
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let now_ns = (numbers[0] * 1_000_000 + numbers[1]) * 1_000;
    let interval_ns = PER_SECS * 1_000_000_000 / BURST;
    tat_ns.saturating_sub(now_ns).div_ceil(interval_ns)
}

#[tokio::test]
async fn three_batched_replicas_keep_the_global_ceiling_within_the_overshoot() {
    // Its own server: the script counts below are this test's alone.
    let redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let text = config(&upstream.url(), &redis.url());
    let gateways = [
        GatewayProcess::start(BIN, &text).await,
        GatewayProcess::start(BIN, &text).await,
        GatewayProcess::start(BIN, &text).await,
    ];
    let scripts_before = scripts_run(redis.port()).await;
    let started = tokio::time::Instant::now();
    // 4 500 requests (1.5× the burst), two connections' worth of loops per replica.
    let mut loops = Vec::new();
    for gateway in &gateways {
        for _ in 0..2 {
            let addr = gateway.addr;
            loops.push(tokio::spawn(async move {
                let (mut ok, mut limited, mut retry_after) = (0u64, 0u64, true);
                for _ in 0..750 {
                    match get(addr).await {
                        (200, _) => ok += 1,
                        (429, answer) => {
                            limited += 1;
                            let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
                            retry_after &= text.contains("\r\nretry-after: ");
                        }
                        (other, answer) => {
                            panic!("unexpected {other}: {}", String::from_utf8_lossy(&answer))
                        }
                    }
                }
                (ok, limited, retry_after)
            }));
        }
    }
    let (mut ok, mut limited) = (0u64, 0u64);
    for task in loops {
        let (o, l, retry_after) = task.await.unwrap();
        assert!(retry_after, "every 429 carries Retry-After");
        ok += o;
        limited += l;
    }
    // Refill over the run, as an input to the bound (never asserted), rounded up.
    let refill = started.elapsed().as_secs() * BURST / PER_SECS + 1;
    let scripts = scripts_run(redis.port()).await - scripts_before;

    eprintln!("admitted {ok}, refused {limited}, {scripts} scripts");
    assert_eq!(
        upstream.hit_count() as u64,
        ok,
        "the upstream saw exactly the admitted"
    );
    assert_eq!(ok + limited, 4_500);
    let bound = BURST + BURST / 20 + refill;
    assert!(
        ok <= bound,
        "admitted {ok} > {bound} (burst + 5 % + refill)"
    );
    assert!(
        ok + 3 * LEASE >= BURST,
        "admitted {ok}: under-admission beyond the three leases"
    );
    // Exact mode runs one script per request (4 500). Batched: leases of 50 for the burst,
    // then one per request near the limit (the 1 500 refused ones and a few more).
    assert!(scripts < 2_000, "{scripts} scripts for 4 500 requests");
}

#[tokio::test]
async fn leases_go_back_to_redis_on_graceful_shutdown() {
    let redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let text = config(&upstream.url(), &redis.url());
    let mut gateways = [
        GatewayProcess::start(BIN, &text).await,
        GatewayProcess::start(BIN, &text).await,
        GatewayProcess::start(BIN, &text).await,
    ];
    for gateway in &gateways {
        assert_eq!(get(gateway.addr).await.0, 200);
    }
    // Each replica leased 50 and spent 1 (less one token per 200 ms of refill since).
    let taken = global_tokens_taken(redis.port()).await;
    assert!((3 * LEASE - 5..=3 * LEASE).contains(&taken), "{taken}");
    for gateway in &mut gateways {
        assert!(gateway.terminate(Duration::from_secs(10)).await.is_some());
    }
    // The 147 unspent went back: at most the 3 admitted requests' tokens are missing.
    let taken = global_tokens_taken(redis.port()).await;
    assert!(
        taken <= 3,
        "{taken} tokens missing: leases were not returned"
    );
    assert_eq!(upstream.hit_count(), 3);
}
