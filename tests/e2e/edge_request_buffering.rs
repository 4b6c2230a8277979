//! Request buffering (`server.request_buffer_bytes`): a body is read whole before the
//! upstream is contacted, so a client that trickles a POST body and stops half-way gets a
//! 408 and the upstream receives nothing, not a partial request, even when the body is
//! larger than the retry layer's `body_replay_limit` (which would otherwise stream it).

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{still_serving, BIN};

fn config(upstream: &ScriptedUpstream) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nbody_read_timeout = \"1s\"\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 2, body_replay_limit = 1024 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n",
        upstream.url()
    )
}

/// Sends `head`, then `parts` one by one with a pause (a trickling client), then stalls
/// with the connection open; returns what the gateway answered before closing.
async fn trickle(gateway: &GatewayProcess, head: &str, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    for part in parts {
        stream.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    answer
}

#[tokio::test]
async fn a_trickled_body_that_stops_half_way_never_reaches_the_upstream() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::Echo).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream)).await;

    // 4 KiB of a declared 8 KiB: over body_replay_limit (1 KiB), within the buffer (1 MiB).
    let parts: Vec<Vec<u8>> = (0..4).map(|_| vec![b'x'; 1024]).collect();
    let head = "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 8192\r\n\r\n";
    let answer = trickle(&gateway, head, &parts).await;
    assert_eq!(
        parse_status(&answer),
        Some(408),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // The same without a declared length: chunks, then silence.
    let chunks: Vec<Vec<u8>> = (0..4)
        .map(|_| {
            let mut chunk = b"400\r\n".to_vec();
            chunk.extend_from_slice(&[b'y'; 1024]);
            chunk.extend_from_slice(b"\r\n");
            chunk
        })
        .collect();
    let head = "POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    let answer = trickle(&gateway, head, &chunks).await;
    assert_eq!(
        parse_status(&answer),
        Some(408),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // What the upstream received: nothing at all.
    assert_eq!(upstream.hit_count(), 0, "{:?}", upstream.hits());

    // A whole body of the same size still goes through, once, intact.
    let body = vec![b'z'; 8192];
    let response = crate::common::client()
        .post(gateway.url() + "/orders")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].body, body);
    still_serving(&gateway, "/ok").await;
}
