//! The request target at the edge, over raw sockets: a path spelled differently
//! (`/x/../secure`, `//secure`, `/./secure`, `/%73ecure`) gets the policy of the route it
//! really names and reaches the upstream normalised; targets that cannot be normalised safely
//! and Host fields that break RFC 9112 §3.2 are 400 problem+json that never reach the upstream.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::h2frames::{self, kind, FrameReader};
use portcullis_testkit::upstream::ScriptedUpstream;
use tokio::io::AsyncWriteExt;

use crate::common::{still_serving, BIN};

const PROBLEMS: &str = "https://portcullis.dev/problems/";

/// Route `/secure` requires an Idempotency-Key, route `/` does not; both to `upstream`.
fn config(upstream: &ScriptedUpstream) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nh2c = true\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/secure\"\nupstream = \"u\"\nidempotency = {{ require_key = true }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n",
        upstream.url()
    )
}

/// A raw HTTP/1.x answer: status, lower-cased head, body.
struct Answer {
    status: Option<u16>,
    head: String,
    body: String,
}

// === impl Answer ===

impl Answer {
    /// The problem `type` of a problem+json answer (panics with the answer otherwise).
    fn problem_type(&self) -> String {
        assert!(
            self.head.contains("content-type: application/problem+json"),
            "not problem+json: {}{}",
            self.head,
            self.body
        );
        let json: serde_json::Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|_| panic!("problem body is not JSON: {}", self.body));
        assert!(json["detail"].is_string(), "{json}");
        json["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// Sends `bytes` on a fresh connection (the request should say `Connection: close`).
async fn send(gateway: &GatewayProcess, bytes: &[u8]) -> Answer {
    let raw = raw_request(gateway.addr, bytes).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: parse_status(&raw),
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn post(target: &str, extra: &str) -> Vec<u8> {
    format!("POST {target} HTTP/1.1\r\nHost: gw.test\r\nContent-Type: application/json\r\nContent-Length: 2\r\n{extra}Connection: close\r\n\r\n{{}}").into_bytes()
}

#[tokio::test]
async fn spelled_paths_get_the_policy_of_the_route_they_name() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream)).await;
    let spellings = [
        "/x/../secure/a",
        "//secure/a",
        "/./secure/a",
        "/%73ecure/a",
        "/%2e/secure//a",
        "/secure/b/%2E%2E/a",
        "http://gw.test/x/../secure/a",
    ];
    for target in spellings {
        let answer = send(&gateway, &post(target, "")).await;
        assert_eq!(answer.status, Some(400), "{target}: {}", answer.head);
        assert_eq!(
            answer.problem_type(),
            format!("{PROBLEMS}idempotency-key-missing"),
            "{target}"
        );
    }
    // Matrix parameters end a segment (Java backends strip them): still /secure's policy.
    let answer = send(&gateway, &post("/secure;jsessionid=1/a", "")).await;
    assert_eq!(answer.status, Some(400), "{}", answer.head);
    assert_eq!(
        answer.problem_type(),
        format!("{PROBLEMS}idempotency-key-missing")
    );
    assert_eq!(
        upstream.hit_count(),
        0,
        "a request refused by /secure's policy reached the upstream"
    );

    for (i, target) in spellings.iter().enumerate() {
        let key = format!("Idempotency-Key: spelled-{i}\r\n");
        let answer = send(&gateway, &post(target, &key)).await;
        assert_eq!(answer.status, Some(200), "{target}: {}", answer.head);
    }
    let hits = upstream.hits();
    assert_eq!(hits.len(), spellings.len());
    for hit in &hits {
        assert_eq!(
            hit.uri.path_and_query().map(|p| p.as_str()),
            Some("/secure/a")
        );
    }

    // The query string is forwarded untouched, whatever it contains.
    let answer = send(
        &gateway,
        b"GET /a/./b/../%7Ec%3b?q=%2F..%2e&r=/./ HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, Some(200), "{}", answer.head);
    let last = upstream.hits().pop().unwrap();
    assert_eq!(
        last.uri.path_and_query().map(|p| p.as_str()),
        Some("/a/~c%3B?q=%2F..%2e&r=/./")
    );
}

#[tokio::test]
async fn unnormalisable_targets_are_400_and_never_forwarded() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream)).await;
    for (method, target) in [
        ("GET", "/secure%2Fa"),
        ("GET", "/a%2fb"),
        ("GET", "/a%00b"),
        ("GET", "/a%0Ab"),
        ("GET", "/a%zz"),
        ("GET", "/a%4"),
        ("GET", "/../a"),
        ("GET", "/a/../../b"),
        ("GET", "/%2e%2e/a"),
        ("GET", "*"),
        ("OPTIONS", "*"),
    ] {
        let request =
            format!("{method} {target} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n");
        let answer = send(&gateway, request.as_bytes()).await;
        assert_eq!(
            answer.status,
            Some(400),
            "{method} {target}: {}",
            answer.head
        );
        assert_eq!(
            answer.problem_type(),
            format!("{PROBLEMS}invalid-path"),
            "{method} {target}"
        );
    }
    assert_eq!(upstream.hit_count(), 0);
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn host_rules_follow_rfc_9112() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream)).await;
    for request in [
        &b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        b"GET /a HTTP/1.1\r\nHost: gw.test\r\nHost: other.test\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: gw.test\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: gw test\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: gw.test/evil\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: gw.test:99999\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: user@gw.test\r\nConnection: close\r\n\r\n",
        b"GET http://user@gw.test/a HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
        b"GET http://user:pw@gw.test/a HTTP/1.0\r\n\r\n",
        // Absolute-form does not excuse a missing or invalid Host on HTTP/1.1.
        b"GET http://gw.test/a HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET http://gw.test/a HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
    ] {
        let answer = send(&gateway, request).await;
        let shown = String::from_utf8_lossy(request);
        assert_eq!(answer.status, Some(400), "{shown:?}: {}", answer.head);
        assert_eq!(
            answer.problem_type(),
            format!("{PROBLEMS}invalid-host"),
            "{shown:?}"
        );
    }
    assert_eq!(upstream.hit_count(), 0, "{:?}", upstream.hits());

    // HTTP/1.0 needs no Host; nothing is invented for X-Forwarded-Host.
    let answer = send(&gateway, b"GET /old HTTP/1.0\r\n\r\n").await;
    assert_eq!(answer.status, Some(200), "{}", answer.head);
    let hit = upstream.hits().pop().unwrap();
    assert_eq!(hit.uri.path(), "/old");
    assert!(!hit.headers.contains_key("x-forwarded-host"), "{hit:?}");

    // Absolute-form: its authority wins over Host (RFC 9112 §3.2.2).
    let answer = send(
        &gateway,
        b"GET http://API.example:8080/x/../abs?q=1 HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, Some(200), "{}", answer.head);
    let hit = upstream.hits().pop().unwrap();
    assert_eq!(
        hit.uri.path_and_query().map(|p| p.as_str()),
        Some("/abs?q=1")
    );
    assert_eq!(hit.headers["x-forwarded-host"], "API.example:8080");
    assert_eq!(hit.headers["host"], upstream.addr().to_string());
    assert_eq!(hit.headers.get_all("host").iter().count(), 1);

    // An ordinary Host with a port and an IPv6 literal are fine.
    for host in ["gw.test:8443", "[::1]:80", "127.0.0.1"] {
        let request = format!("GET /ok HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = send(&gateway, request.as_bytes()).await;
        assert_eq!(answer.status, Some(200), "{host}: {}", answer.head);
        let hit = upstream.hits().pop().unwrap();
        assert_eq!(hit.headers["x-forwarded-host"], host);
    }
    still_serving(&gateway, "/after").await;
}

/// Connects with h2c prior knowledge and finishes the SETTINGS exchange.
async fn h2c_connect(addr: std::net::SocketAddr) -> FrameReader<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(h2frames::PREFACE).await.unwrap();
    stream.write_all(&h2frames::settings(&[])).await.unwrap();
    stream.write_all(&h2frames::settings_ack()).await.unwrap();
    FrameReader::new(stream)
}

/// The status of the response HEADERS on `stream`, or the RST_STREAM code as `Err`.
async fn h2_status(
    reader: &mut FrameReader<tokio::net::TcpStream>,
    stream: u32,
) -> Result<u16, Option<u32>> {
    for _ in 0..20 {
        let Some(frame) = reader.next(Duration::from_secs(5)).await else {
            break;
        };
        if frame.stream != stream {
            continue;
        }
        match frame.kind {
            kind::HEADERS => return frame.static_status().ok_or(None),
            kind::RST_STREAM => return Err(frame.error_code()),
            _ => {}
        }
    }
    Err(None)
}

#[tokio::test]
async fn h2_host_must_agree_with_authority() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream)).await;
    let mut reader = h2c_connect(gateway.addr).await;
    let request = |stream: u32, path: &str, host: &str| {
        h2frames::headers(
            stream,
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "gw.test"),
                ("host", host),
            ],
            true,
        )
    };
    reader
        .get_mut()
        .write_all(&request(1, "/h2/mismatch", "evil.test"))
        .await
        .unwrap();
    assert_eq!(h2_status(&mut reader, 1).await, Ok(400));
    assert_eq!(upstream.hit_count(), 0);

    // Agreeing fields (case aside) pass, and the path is normalised over HTTP/2 as well.
    reader
        .get_mut()
        .write_all(&request(3, "/h2/./x//y", "GW.test"))
        .await
        .unwrap();
    assert_eq!(h2_status(&mut reader, 3).await, Ok(200));
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].uri.path(), "/h2/x/y");
    assert_eq!(hits[0].headers["x-forwarded-host"], "GW.test");
    still_serving(&gateway, "/after").await;
}
