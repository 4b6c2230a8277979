use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::ports::closed_addr;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{assert_problem, client, gateway_for, single_route_config, still_serving, BIN};

#[tokio::test]
async fn unknown_route_is_404_problem() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\n\n[[routes]]\nprefix = \"/api\"\nupstream = \"u\"\n\n[[routes]]\nprefix = \"/after\"\nupstream = \"u\"\n",
        upstream.url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let response = client().get(gateway.url() + "/apix").send().await.unwrap();
    assert!(response.headers().contains_key("x-request-id"));
    let body = assert_problem(response, 404).await;
    assert_eq!(body["type"], "https://portcullis.dev/problems/no-route");
    assert_eq!(upstream.hit_count(), 0);
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn oversized_bodies_are_413_declared_or_streamed() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::Echo).await;
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nmax_body_bytes = 1024\n\n{}",
        single_route_config(&upstream.url(), "")
    );
    let gateway = GatewayProcess::start(BIN, &config).await;

    let declared = client()
        .post(gateway.url() + "/p")
        .body(vec![b'x'; 2048])
        .send()
        .await
        .unwrap();
    let body = assert_problem(declared, 413).await;
    assert_eq!(body["limit"], 1024);
    assert_eq!(
        upstream.hit_count(),
        0,
        "a declared oversize body never reaches the upstream"
    );

    // Chunked, no Content-Length: counted while streaming.
    let stream =
        futures_util::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 512])));
    let streamed = client()
        .post(gateway.url() + "/p")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_problem(streamed, 413).await;

    // HTTP/2 (h2c, prior knowledge): the declared length is hyper's exact body size there
    // too, so the same 413 comes before any byte is forwarded. (The streamed request above
    // may still be recorded by the upstream later: it counts a hit once the body ends, so
    // its own path tells this request's hits apart.)
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let declared_h2 = h2
        .post(gateway.url() + "/p-h2")
        .body(vec![b'z'; 2048])
        .send()
        .await
        .unwrap();
    assert_eq!(declared_h2.version(), reqwest::Version::HTTP_2);
    let body = assert_problem(declared_h2, 413).await;
    assert_eq!(body["limit"], 1024);
    assert!(
        upstream.hits().iter().all(|hit| hit.uri.path() != "/p-h2"),
        "a declared oversize HTTP/2 body never reaches the upstream"
    );
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn oversized_headers_are_431_problem() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = gateway_for(&upstream).await;
    let response = client()
        .get(gateway.url() + "/h")
        .header("x-big", "z".repeat(20 * 1024))
        .send()
        .await
        .unwrap();
    assert_problem(response, 431).await;
    assert_eq!(upstream.hit_count(), 0);
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn unreachable_upstream_is_502_problem() {
    let dead = format!("http://{}", closed_addr());
    let live = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "[[upstreams]]\nname = \"dead\"\nendpoints = [\"{dead}\"]\nretry = {{ max_retries = 0 }}\n\n[[upstreams]]\nname = \"live\"\nendpoints = [\"{}\"]\n\n[[routes]]\nprefix = \"/dead\"\nupstream = \"dead\"\n\n[[routes]]\nprefix = \"/after\"\nupstream = \"live\"\n",
        live.url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let response = client()
        .get(gateway.url() + "/dead/x")
        .send()
        .await
        .unwrap();
    let body = assert_problem(response, 502).await;
    assert!(
        body["type"].as_str().unwrap().contains("unreachable"),
        "{body}"
    );
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn stalled_upstream_is_504_problem() {
    let upstream =
        ScriptedUpstream::start(vec![Step::stall(Duration::from_secs(5), Step::ok("late"))]).await;
    let config = single_route_config(&upstream.url(), "attempt_timeout = \"300ms\"");
    let gateway = GatewayProcess::start(BIN, &config).await;
    let response = client().get(gateway.url() + "/slow").send().await.unwrap();
    assert_problem(response, 504).await;
    still_serving(&gateway, "/after").await;
}

#[tokio::test]
async fn malformed_http_gets_400_and_the_process_keeps_serving() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = gateway_for(&upstream).await;
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
        b"GET /\x01\x02 HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let answer = raw_request(gateway.addr, garbage).await.unwrap_or_default();
        assert_eq!(
            parse_status(&answer),
            Some(400),
            "{:?}",
            String::from_utf8_lossy(&answer)
        );
        // Refused before hyper parses it, so the answer is problem+json like every other.
        assert!(
            String::from_utf8_lossy(&answer)
                .to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{:?}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(upstream.hit_count(), 0);
    still_serving(&gateway, "/after").await;
}
