//! No single caller can open the circuit breaker for everyone: failures one caller provokes
//! alone (a path answering 500 or 503, retried) leave other tenants served, and so do
//! failures (503s or attempt timeouts) provoked from several anonymous addresses, which
//! count as one caller; an outage seen by several tenants still opens it within its window.
//! Raw HTTP/1.1 over loopback; the scripted upstream records what really reached it.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

const VICTIM_KEY: &str = "victim-key-0001";
/// Tenants that all see the outage in `an_outage_seen_by_several_tenants_still_opens_it`.
const WITNESS_KEYS: [&str; 3] = ["witness-key-0001", "witness-key-0002", "witness-key-0003"];

/// One upstream `u` routed from `/`, retried 3 times with fast backoff; a breaker that the
/// old per-attempt, unattributed rule opened after 10 failed attempts (min_callers is left
/// at its default, 3); client addresses believed from `X-Forwarded-For` sent by loopback.
fn config(upstream: &str) -> String {
    config_timing_out_after(upstream, "10s")
}

/// [`config`] with the upstream's `attempt_timeout`.
fn config_timing_out_after(upstream: &str, attempt_timeout: &str) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
trusted_proxies = ["127.0.0.1/32"]

[[tenants]]
id = "victim"
api_keys = ["{VICTIM_KEY}"]
rate = 100000
per = "1s"
burst = 100000

[[tenants]]
id = "witnesses"
api_keys = ["{w0}"]
rate = 100000
per = "1s"
burst = 100000

[[tenants]]
id = "witnesses-2"
api_keys = ["{w1}"]
rate = 100000
per = "1s"
burst = 100000

[[tenants]]
id = "witnesses-3"
api_keys = ["{w2}"]
rate = 100000
per = "1s"
burst = 100000

[[upstreams]]
name = "u"
endpoints = ["{upstream}"]
attempt_timeout = "{attempt_timeout}"
retry = {{ max_retries = 3, base = "10ms", cap = "50ms" }}
circuit_breaker = {{ failure_rate = 0.5, min_requests = 10, window = "30s", open_for = "30s", half_open_probes = 1 }}

[[routes]]
prefix = "/"
upstream = "u"
"#,
        w0 = WITNESS_KEYS[0],
        w1 = WITNESS_KEYS[1],
        w2 = WITNESS_KEYS[2],
    )
}

/// A parsed raw answer.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// `GET path` over a fresh connection with `extra` header lines (each ending in CRLF).
async fn get(addr: SocketAddr, path: &str, extra: &str) -> Answer {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n");
    let raw = raw_request(addr, request.as_bytes())
        .await
        .expect("the gateway answers");
    let status = parse_status(&raw).expect("a status line");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn from_ip(ip: &str) -> String {
    format!("X-Forwarded-For: {ip}\r\n")
}

fn is_circuit_open(answer: &Answer) -> bool {
    answer.body.contains("/problems/circuit-open")
}

/// One anonymous client hammers a failing path; then another tenant is still served.
async fn one_caller_cannot_open_it(failing: u16) {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(failing)).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;

    // 12 requests (≥ min_requests even counted once each), each retried: 48 attempts.
    for _ in 0..12 {
        let answer = get(gateway.addr, "/failing", &from_ip("203.0.113.66")).await;
        assert_eq!(answer.status, failing, "{}", answer.body);
        assert!(
            !is_circuit_open(&answer),
            "the breaker opened: {}",
            answer.body
        );
    }
    let attack_hits = upstream.hit_count();
    assert!(
        attack_hits > 12,
        "retries happened ({attack_hits} attempts), as in the reported incident"
    );

    // The upstream serves its healthy paths; another tenant is not failed fast.
    upstream.set_fallback(Step::ok("healthy"));
    let key = format!("X-API-Key: {VICTIM_KEY}\r\n");
    let answer = get(gateway.addr, "/healthy", &key).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body, "healthy");
    let hits = upstream.hits();
    assert_eq!(
        hits.len(),
        attack_hits + 1,
        "the victim's request reached the upstream"
    );
    let last = hits.last().expect("a hit");
    assert_eq!(last.uri.path(), "/healthy");
    assert_eq!(last.headers["x-portcullis-tenant"], "victim");
    assert!(
        !last.headers.contains_key("x-api-key"),
        "the credential never goes upstream"
    );
}

#[tokio::test]
async fn one_anonymous_caller_hitting_a_500_path_cannot_open_the_breaker() {
    one_caller_cannot_open_it(500).await;
}

#[tokio::test]
async fn one_anonymous_caller_hitting_a_503_path_cannot_open_the_breaker() {
    one_caller_cannot_open_it(503).await;
}

/// Three anonymous addresses (cheap to have) fail a path 15 times each, with `failure` as the
/// upstream's answer; then a tenant that never failed is still served.
async fn anonymous_addresses_cannot_open_it(failure: Step, attempt_timeout: &str) {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], failure).await;
    let config = config_timing_out_after(&upstream.url(), attempt_timeout);
    let gateway = GatewayProcess::start(BIN, &config).await;

    // The three addresses at once, each 15 requests in a row.
    let addr = gateway.addr;
    let attackers = ["203.0.113.1", "203.0.113.2", "203.0.113.3"].map(|ip| {
        tokio::spawn(async move {
            for n in 0..15 {
                let answer = get(addr, "/failing", &from_ip(ip)).await;
                assert!(
                    matches!(answer.status, 503 | 504),
                    "request {n} from {ip}: {} {}",
                    answer.status,
                    answer.body
                );
                assert!(
                    !is_circuit_open(&answer),
                    "request {n} from {ip}: the breaker opened: {}",
                    answer.body
                );
            }
        })
    });
    for attacker in attackers {
        attacker.await.expect("the attacker's requests");
    }
    let attack_hits = upstream.hit_count();
    assert!(attack_hits >= 45, "every request reached the upstream");

    upstream.set_fallback(Step::ok("healthy"));
    let key = format!("X-API-Key: {VICTIM_KEY}\r\n");
    let answer = get(gateway.addr, "/healthy", &key).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let hits = upstream.hits();
    assert_eq!(
        hits.len(),
        attack_hits + 1,
        "the victim's request reached the upstream"
    );
    assert_eq!(hits[attack_hits].headers["x-portcullis-tenant"], "victim");
}

#[tokio::test]
async fn three_anonymous_addresses_answered_503_cannot_open_the_breaker() {
    anonymous_addresses_cannot_open_it(Step::status(503), "10s").await;
}

#[tokio::test]
async fn three_anonymous_addresses_timing_out_cannot_open_the_breaker() {
    // Far slower than `attempt_timeout`: every attempt times out (504).
    let slow = Step::stall(Duration::from_secs(5), Step::ok("late"));
    anonymous_addresses_cannot_open_it(slow, "100ms").await;
}

#[tokio::test]
async fn an_outage_seen_by_several_tenants_still_opens_it() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(503)).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;
    // Three tenants and the anonymous callers (one caller together, however many addresses).
    let callers = [
        format!("X-API-Key: {}\r\n", WITNESS_KEYS[0]),
        format!("X-API-Key: {}\r\n", WITNESS_KEYS[1]),
        format!("X-API-Key: {}\r\n", WITNESS_KEYS[2]),
        from_ip("198.51.100.4"),
    ];

    // Round robin over the callers until one is failed fast (bounded).
    let mut opened = None;
    for n in 0..40 {
        let before = upstream.hit_count();
        let answer = get(gateway.addr, "/orders", &callers[n % callers.len()]).await;
        assert_eq!(answer.status, 503, "{}", answer.body);
        if is_circuit_open(&answer) {
            assert_eq!(upstream.hit_count(), before, "failed fast: nothing sent");
            opened = Some((n, answer));
            break;
        }
    }
    let (n, answer) = opened.expect("the breaker opened within 40 requests");
    assert!(
        n >= 10,
        "not before min_requests = 10 requests (opened at {n})"
    );
    assert!(
        answer
            .head
            .contains("content-type: application/problem+json"),
        "{}",
        answer.head
    );
    let retry_after: u64 = answer
        .head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Retry-After in whole seconds");
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");

    // Open for everyone now, including a caller that never failed.
    let before = upstream.hit_count();
    let key = format!("X-API-Key: {VICTIM_KEY}\r\n");
    let answer = get(gateway.addr, "/orders", &key).await;
    assert_eq!(answer.status, 503);
    assert!(is_circuit_open(&answer), "{}", answer.body);
    assert_eq!(upstream.hit_count(), before);
}
