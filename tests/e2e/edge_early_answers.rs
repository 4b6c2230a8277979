//! Early answers reach clients that send their whole body before reading (Python's
//! http.client, many SDKs; no `Expect: 100-continue`): the gateway answers 413, 429 or 401
//! before reading the body, then reads and discards the rest (lingering close) so that the
//! answer is not destroyed by a connection reset.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::BIN;

/// Larger than every socket buffer between client and gateway on loopback.
const BODY_BYTES: usize = 8 << 20;

fn config(upstream: &str) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
max_body_bytes = 65536

[[tenants]]
id = "acme"
api_keys = ["acme-key-0001"]
rate = 1
per = "1h"
burst = 1

[[upstreams]]
name = "u"
endpoints = ["{upstream}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "u"
"#
    )
}

/// Writes the head and the whole body, only then reads: what the gateway answered, or
/// `Err` with what went wrong (a reset instead of the answer).
async fn send_all_then_read(gateway: &GatewayProcess, headers: &str) -> Result<Vec<u8>, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(gateway.addr)
            .await
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: {BODY_BYTES}\r\n{headers}\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| format!("head: {e}"))?;
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..BODY_BYTES / chunk.len() {
            stream
                .write_all(&chunk)
                .await
                .map_err(|e| format!("body: {e}"))?;
        }
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok(answer)
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| "timed out".to_owned())?
}

#[tokio::test]
async fn early_413s_reach_a_client_that_sends_everything_first() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("stored")).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url())).await;

    // Spend the tenant's only token with a small request.
    let first = crate::common::client()
        .post(gateway.url() + "/small")
        .bearer_auth("acme-key-0001")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);

    for (headers, status, problem) in [
        ("", 413, "body-too-large"),
        (
            "Authorization: Bearer acme-key-0001\r\n",
            413,
            "body-too-large",
        ),
    ] {
        let answer = send_all_then_read(&gateway, headers)
            .await
            .unwrap_or_else(|err| panic!("{headers:?}: the {status} was lost: {err}"));
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(parse_status(&answer), Some(status), "{text}");
        assert!(text.contains("application/problem+json"), "{text}");
        assert!(text.contains(problem), "{text}");
    }
    assert_eq!(
        upstream.hit_count(),
        1,
        "only the small request went upstream"
    );
}

#[tokio::test]
async fn early_429_and_401_reach_a_client_that_sends_everything_first() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("stored")).await;
    // A body under the size limit but sent whole before reading: the limiter answers first.
    let gateway = GatewayProcess::start(
        BIN,
        &config(&upstream.url()).replace("max_body_bytes = 65536", "max_body_bytes = 16777216"),
    )
    .await;
    let first = crate::common::client()
        .post(gateway.url() + "/small")
        .bearer_auth("acme-key-0001")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let answer = send_all_then_read(&gateway, "Authorization: Bearer acme-key-0001\r\n")
        .await
        .unwrap_or_else(|err| panic!("the 429 was lost: {err}"));
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(parse_status(&answer), Some(429), "{text}");
    assert!(text.to_ascii_lowercase().contains("retry-after:"), "{text}");

    let answer = send_all_then_read(&gateway, "Authorization: Bearer wrong-key-0001\r\n")
        .await
        .unwrap_or_else(|err| panic!("the 401 was lost: {err}"));
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(parse_status(&answer), Some(401), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert_eq!(upstream.hit_count(), 1);
}
