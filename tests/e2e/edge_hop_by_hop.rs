//! Hop-by-hop headers at the edge, over raw sockets against the real binary: a client's
//! `Connection` header removes only the client's own fields, never one the gateway sets or
//! relies on (checked on every upstream attempt), an upstream's `Connection` header cannot
//! remove the gateway's response headers, and an oversized chunked body is the client's 413.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{still_serving, BIN};
use crate::idempotency_replay::TENANTS;

/// Upper bound on one raw exchange, so a gateway that never answers fails the test.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// Largest answer read; every response in these tests is a few hundred bytes.
const MAX_ANSWER: usize = 64 * 1024;

/// A response as read off the socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Lower-cased names, values as sent, in order.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

/// Writes `request` on a fresh connection and reads one response (framed by
/// `Content-Length`, chunked, or the connection's end), bounded in time and size.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    let run = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request).await.expect("write request");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = find(&buf, b"\r\n\r\n") {
                break at + 4;
            }
            let n = stream.read(&mut chunk).await.expect("read head");
            assert!(n > 0 && buf.len() < MAX_ANSWER, "no complete head: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok());
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        let mut body = buf.split_off(head_end);
        loop {
            let done = match length {
                Some(len) => body.len() >= len,
                None if chunked => body.ends_with(b"0\r\n\r\n"),
                None => false,
            };
            if done || body.len() > MAX_ANSWER {
                break;
            }
            let n = stream.read(&mut chunk).await.expect("read body");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, run)
        .await
        .expect("the gateway answered in time")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<missing>")
}

/// Tenants, an upstream `u` that dedupes on the key (3 retries, quick backoff), and a keyed
/// route; 127.0.0.1 is a trusted proxy so a client's `X-Forwarded-For` chain is kept.
fn config(upstream: &str) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n{TENANTS}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\ndedupes_idempotency_keys = true\nretry = {{ max_retries = 3, base = \"10ms\", cap = \"50ms\" }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ methods = [\"POST\", \"PATCH\"] }}\n"
    )
}

#[tokio::test]
async fn connection_cannot_name_away_the_gateways_headers_on_any_attempt() {
    let upstream = ScriptedUpstream::start(vec![
        Step::status(502),
        Step::status(502),
        Step::respond(201, &[("content-type", "application/json")], "{\"id\":1}"),
    ])
    .await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;
    let body = "{\"amount\":100}";
    let request = format!(
        "POST /payments HTTP/1.1\r\nHost: localhost\r\n\
         Connection: Idempotency-Key, X-Portcullis-Tenant, X-Request-Id, X-Forwarded-For, X-Request-Deadline, X-Retry-Attempt, Authorization, X-Forwarded-Proto\r\n\
         Authorization: Bearer acme-key-0001\r\nIdempotency-Key: pay-1\r\nX-Request-Id: req-hop-1\r\n\
         X-Forwarded-For: 203.0.113.7\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = exchange(gateway.addr, request.as_bytes()).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.header("x-request-id"), Some("req-hop-1"));

    let hits = upstream.hits();
    assert_eq!(hits.len(), 3, "502, 502, then 201: {hits:#?}");
    for (n, hit) in hits.iter().enumerate() {
        let attempt = (n + 1).to_string();
        let h = &hit.headers;
        // Without the key on a retry, a deduping backend would execute the payment again.
        assert_eq!(header(h, "idempotency-key"), "pay-1", "attempt {attempt}");
        assert_eq!(
            header(h, "x-portcullis-tenant"),
            "acme",
            "attempt {attempt}"
        );
        assert_eq!(header(h, "x-request-id"), "req-hop-1", "attempt {attempt}");
        assert_eq!(
            header(h, "x-forwarded-for"),
            "203.0.113.7, 127.0.0.1",
            "attempt {attempt}: the trusted chain plus the peer"
        );
        assert_eq!(header(h, "x-forwarded-proto"), "http", "attempt {attempt}");
        assert_eq!(header(h, "x-retry-attempt"), attempt, "attempt {attempt}");
        assert!(h.contains_key("x-request-deadline"), "attempt {attempt}");
        assert!(
            !h.contains_key("authorization"),
            "the tenant's key never reaches the backend"
        );
        assert!(
            !h.get_all("connection")
                .iter()
                .any(|v| v.to_str().unwrap_or_default().contains("dempotency")),
            "the client's Connection header is not forwarded: {h:?}"
        );
        assert_eq!(hit.body, body.as_bytes());
    }
}

#[tokio::test]
async fn plain_get_keeps_forwarded_for_and_request_id_named_in_connection() {
    let upstream = ScriptedUpstream::start(vec![Step::ok("plain")]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;
    let answer = exchange(
        gateway.addr,
        b"GET /things HTTP/1.1\r\nHost: localhost\r\nConnection: X-Forwarded-For, X-Request-Id, close\r\n\
          X-Forwarded-For: 198.51.100.4\r\nX-Request-Id: req-hop-2\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, b"plain");
    assert_eq!(answer.header("x-request-id"), Some("req-hop-2"));
    assert_eq!(
        answer.header("connection"),
        Some("close"),
        "`close` still applies to the client's connection"
    );
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(header(&hits[0].headers, "x-request-id"), "req-hop-2");
    assert_eq!(
        header(&hits[0].headers, "x-forwarded-for"),
        "198.51.100.4, 127.0.0.1"
    );
}

#[tokio::test]
async fn a_client_field_named_in_connection_is_removed() {
    let upstream = ScriptedUpstream::start(vec![Step::ok("ok")]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;
    let answer = exchange(
        gateway.addr,
        b"GET /c HTTP/1.1\r\nHost: localhost\r\nConnection: X-Custom, keep-alive\r\nX-Custom: 1\r\n\
          Keep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nX-Kept: 1\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    let h = &hits[0].headers;
    for name in ["x-custom", "keep-alive", "te", "proxy-authorization"] {
        assert!(!h.contains_key(name), "{name} reached the upstream: {h:?}");
    }
    assert_eq!(header(h, "x-kept"), "1");
}

#[tokio::test]
async fn an_upstream_cannot_name_away_the_gateways_response_headers() {
    let upstream_headers = [
        (
            "connection",
            "X-RateLimit-Remaining, X-Request-Id, RateLimit, X-Upstream-Private, Idempotent-Replayed",
        ),
        ("x-upstream-private", "1"),
        ("x-upstream-public", "1"),
    ];
    let upstream = ScriptedUpstream::start(vec![
        Step::respond(200, &upstream_headers, "get"),
        Step::respond(201, &upstream_headers, "created"),
    ])
    .await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;

    let answer = exchange(
        gateway.addr,
        b"GET /r HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer acme-key-0001\r\nX-Request-Id: req-hop-3\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("x-request-id"), Some("req-hop-3"));
    assert!(
        answer.header("x-ratelimit-remaining").is_some(),
        "{answer:?}"
    );
    assert!(answer.header("ratelimit").is_some(), "{answer:?}");
    assert!(answer.header("x-upstream-private").is_none(), "{answer:?}");
    assert_eq!(answer.header("x-upstream-public"), Some("1"));

    // A keyed POST: the first answer is stored, the second is a replay. Neither carries the
    // upstream's connection-level fields, and the replay still gets the gateway's headers.
    let keyed = "POST /o HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer acme-key-0001\r\n\
                 Idempotency-Key: replay-1\r\nContent-Length: 2\r\n\r\n{}";
    let first = exchange(gateway.addr, keyed.as_bytes()).await;
    let replay = exchange(gateway.addr, keyed.as_bytes()).await;
    assert_eq!(upstream.hit_count(), 2, "the POST executed once");
    for (answer, replayed) in [(&first, false), (&replay, true)] {
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(answer.body, b"created");
        assert!(
            answer.header("x-ratelimit-remaining").is_some(),
            "{answer:?}"
        );
        assert!(answer.header("x-request-id").is_some(), "{answer:?}");
        assert!(answer.header("x-upstream-private").is_none(), "{answer:?}");
        assert_eq!(answer.header("x-upstream-public"), Some("1"));
        assert_eq!(
            answer.header("idempotent-replayed"),
            replayed.then_some("true"),
            "{answer:?}"
        );
    }
}

#[tokio::test]
async fn an_oversized_chunked_body_is_a_client_413() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("after")).await;
    // `/buffered` reads the body for replay (retries allowed); `/once` streams it to the
    // upstream (no retries); `/prefix` buffers 256 bytes, then streams the rest; `/h2`
    // streams it to an upstream spoken to over HTTP/2; `/keyed` is read whole by the
    // idempotency layer to fingerprint it. Both upstreams' breakers open on a
    // single counted failure, so one that blamed the upstream would show as a 503 below.
    const BREAKER: &str =
        "circuit_breaker = { failure_rate = 0.5, min_requests = 1, open_for = \"60s\" }";
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nmax_body_bytes = 1024\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{0}\"]\nretry = {{ max_retries = 2, base = \"10ms\", cap = \"50ms\" }}\n{BREAKER}\n\n[[routes]]\nprefix = \"/buffered\"\nupstream = \"u\"\n\n[[routes]]\nprefix = \"/once\"\nupstream = \"u\"\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/prefix\"\nupstream = \"u\"\nretry = {{ body_replay_limit = 256 }}\n\n[[upstreams]]\nname = \"u2\"\nendpoints = [\"{0}\"]\nhttp2 = true\nretry = {{ max_retries = 0 }}\n{BREAKER}\n\n[[routes]]\nprefix = \"/h2\"\nupstream = \"u2\"\n\n[[routes]]\nprefix = \"/keyed\"\nupstream = \"u\"\nidempotency = {{ methods = [\"POST\"] }}\n\n[[routes]]\nprefix = \"/after\"\nupstream = \"u\"\n",
        upstream.url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    // 8 chunks of 512 bytes: 4096 bytes against a limit of 1024.
    let mut chunked = Vec::new();
    for _ in 0..8 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b'z'; 512]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");

    for path in ["/buffered", "/once", "/prefix", "/h2", "/keyed"] {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: big-1\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        request.extend_from_slice(&chunked);
        let answer = exchange(gateway.addr, &request).await;
        assert_eq!(answer.status, 413, "{path}: {answer:?}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        let problem = answer.json();
        assert_eq!(
            problem["type"], "https://portcullis.dev/problems/body-too-large",
            "{path}: {problem}"
        );
        assert_eq!(problem["status"], 413);
        if path != "/keyed" {
            // The idempotency layer meets the limit only as its body's error: no number.
            assert_eq!(problem["limit"], 1024, "{path}: {problem}");
        }
    }

    // What the upstream saw: `/buffered` and `/keyed` nothing at all (the body failed while
    // being read for replay or fingerprinting); `/once`, `/prefix` and `/h2` stream, so the upstream may have received the
    // head and part of the body before the gateway aborted it (HTTP/1.1: connection closed
    // mid-chunk; HTTP/2: RST_STREAM) — never a complete request: its body read failed
    // (recorded as empty), and no hit carries the full 4096 bytes.
    let hits = upstream.hits();
    assert!(hits.len() <= 3, "{hits:#?}");
    for hit in &hits {
        assert!(
            !["/buffered", "/keyed"].contains(&hit.uri.path()),
            "{hit:#?}"
        );
        assert!(
            hit.body.len() < 1024,
            "a complete body got through: {hit:#?}"
        );
    }

    // Neither breaker counted the client's body as an upstream failure.
    still_serving(&gateway, "/after").await;
    still_serving(&gateway, "/h2/after").await;
    let logs = gateway.logs();
    assert!(
        !logs.contains("upstream request failed"),
        "a client's oversized body is not an upstream failure: {logs}"
    );
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.starts_with("retry_attempts_total") && !line.starts_with("retry_exhausted_total"),
            "a client's body never counts as a retried upstream failure: {line}"
        );
    }
}
