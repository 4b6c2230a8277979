//! The edge scan: every malformed or ambiguous HTTP/1.1 request head an attacker (or a sloppy
//! client) tries, and every TLS ALPN combination, against the real binary — and the upstream
//! must see none of them.
//!
//! Each head goes on a fresh connection, followed by a pipelined `GET /smuggled` that a
//! desynchronised parser would serve. The gateway must answer each with a 4xx/5xx
//! problem+json (or close without a word); afterwards the upstream has received nothing and
//! the gateway still serves an ordinary request. A separate target (not a module of `e2e`)
//! so the scan can be run alone: `scripts/test.sh -p portcullis-gateway --test edge_scan`.

// Test code: a failed step should panic with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod upgrades;

use std::net::SocketAddr;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::h2frames;
use portcullis_testkit::tls::{tls_raw_request_offering, TestCa};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

const BIN: &str = env!("CARGO_BIN_EXE_portcullis");

/// A request hidden behind each case: a desynchronised parser would serve it.
const SMUGGLED: &[u8] = b"GET /smuggled HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

fn config(upstream: &str, tls: Option<(&std::path::Path, &std::path::Path)>) -> String {
    let tls = tls
        .map(|(cert, key)| format!("[server.tls]\ncert = {cert:?}\nkey = {key:?}\n"))
        .unwrap_or_default();
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
max_header_bytes = 8192
{tls}
[[tenants]]
id = "acme"
api_keys = ["acme-key-0001"]
rate = 100000
per = "1s"
burst = 100000

[[upstreams]]
name = "u"
endpoints = ["{upstream}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "u"
idempotency = {{ }}

[[routes]]
prefix = "/secure"
upstream = "u"
idempotency = {{ require_key = true }}
"#
    )
}

/// What the gateway answered one case with, judged: `Err` says what was wrong.
fn judge(name: &str, answer: Option<Vec<u8>>) -> Result<(), String> {
    let Some(answer) = answer else {
        return Err(format!("{name}: no answer and no close within 5 s"));
    };
    if answer.is_empty() {
        return Ok(()); // closed without a word
    }
    let text = String::from_utf8_lossy(&answer);
    let responses = count_responses(&answer);
    match parse_status(&answer) {
        Some(status) if (400..=505).contains(&status) => {}
        other => return Err(format!("{name}: status {other:?}: {text}")),
    }
    if !text
        .to_ascii_lowercase()
        .contains("content-type: application/problem+json")
    {
        return Err(format!("{name}: not problem+json: {text}"));
    }
    if responses != 1 {
        return Err(format!(
            "{name}: {responses} responses (a smuggled one?): {text}"
        ));
    }
    Ok(())
}

/// How many HTTP/1.1 responses `bytes` holds, each framed by its `content-length`.
fn count_responses(mut bytes: &[u8]) -> usize {
    let mut count = 0;
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        count += 1;
        bytes = bytes.get(end + 4 + length..).unwrap_or_default();
    }
    count
}

async fn ordinary_get_answers_200(addr: SocketAddr) {
    let answer = raw_request(
        addr,
        b"GET /still-serving HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.as_deref().and_then(parse_status), Some(200));
}

#[tokio::test]
async fn malformed_and_ambiguous_heads_never_reach_the_upstream() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("reached")).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), None)).await;
    let cases = cases::heads();
    assert!(cases.len() >= 75, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (name, head) in &cases {
        let bytes = [head.as_slice(), SMUGGLED].concat();
        if let Err(why) = judge(name, raw_request(gateway.addr, &bytes).await) {
            failures.push(why);
        }
    }
    let reached: Vec<String> = upstream.hits().iter().map(|h| h.uri.to_string()).collect();
    assert!(
        failures.is_empty() && reached.is_empty(),
        "{} of {} cases answered wrongly:\n{}\nupstream received: {reached:?}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    ordinary_get_answers_200(gateway.addr).await;
    assert_eq!(upstream.hit_count(), 1);
}

/// Opens TLS offering `alpn`, sends `bytes`, returns what came back before the close (`None`:
/// the handshake failed).
async fn over_tls(addr: SocketAddr, ca: &TestCa, alpn: &[&[u8]], bytes: &[u8]) -> Option<Vec<u8>> {
    tls_raw_request_offering(addr, &ca.pem(), alpn, bytes).await
}

#[tokio::test]
async fn no_alpn_combination_bypasses_the_framing_guard() {
    let ca = TestCa::new("scan-ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "server");
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("reached")).await;
    let options = GatewayOptions {
        tls_ca: Some(ca.pem()),
        ..GatewayOptions::default()
    };
    let gateway =
        GatewayProcess::start_with(BIN, &config(&upstream.url(), Some((&cert, &key))), options)
            .await;

    let mut preface = h2frames::PREFACE.to_vec();
    preface.extend(h2frames::settings(&[]));
    preface.extend(h2frames::headers(
        1,
        &[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/h2-after-http11"),
            (":authority", "localhost"),
        ],
        true,
    ));
    let h2: &[&[u8]] = &[b"h2"];
    let http11: &[&[u8]] = &[b"http/1.1"];
    let both: &[&[u8]] = &[b"http/1.1", b"h2"];
    let none: &[&[u8]] = &[];
    let mut failures = Vec::new();
    // Every framing case over TLS, under each ALPN a client may choose.
    for (alpn_name, alpn) in [
        ("h2", h2),
        ("http/1.1", http11),
        ("both", both),
        ("none", none),
    ] {
        for (name, head) in cases::heads()
            .iter()
            .filter(|(name, _)| name.starts_with("framing"))
        {
            let bytes = [head.as_slice(), SMUGGLED].concat();
            let answer = over_tls(gateway.addr, &ca, alpn, &bytes).await;
            // After ALPN h2 (the server prefers it when both are offered) these bytes are not
            // an HTTP/2 preface: the connection fails.
            let verdict = if alpn_name == "h2" || alpn_name == "both" {
                match &answer {
                    Some(bytes) if bytes.starts_with(b"HTTP/") => {
                        Err(format!("HTTP/1 answered after ALPN h2: {name}"))
                    }
                    _ => Ok(()),
                }
            } else {
                judge(&format!("{alpn_name} {name}"), answer)
            };
            if let Err(why) = verdict {
                failures.push(why);
            }
        }
    }
    // An HTTP/2 preface after ALPN http/1.1 (or none) is not served as HTTP/2.
    for alpn in [http11, none] {
        let answer = over_tls(gateway.addr, &ca, alpn, &preface)
            .await
            .unwrap_or_default();
        if parse_status(&answer) != Some(505) {
            failures.push(format!(
                "preface after {alpn:?}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
    }
    // A protocol the gateway does not offer: no handshake, nothing served.
    let unknown: &[&[u8]] = &[b"spdy/3.1"];
    if let Some(answer) = over_tls(gateway.addr, &ca, unknown, SMUGGLED).await {
        if answer.starts_with(b"HTTP/") {
            failures.push("served after an unknown ALPN".to_owned());
        }
    }
    let reached: Vec<String> = upstream.hits().iter().map(|h| h.uri.to_string()).collect();
    assert!(
        failures.is_empty() && reached.is_empty(),
        "{}\nupstream received: {reached:?}",
        failures.join("\n")
    );
}
