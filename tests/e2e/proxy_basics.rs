use std::time::Duration;

use bytes::Bytes;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{client, gateway_for};

#[tokio::test]
async fn get_is_proxied_with_request_id_and_forwarded_headers() {
    let _trace = portcullis_testkit::trace_init();
    let upstream = ScriptedUpstream::start(vec![Step::respond(
        200,
        &[("x-from-upstream", "yes")],
        "hello",
    )])
    .await;
    let gateway = gateway_for(&upstream).await;

    let response = client()
        .get(format!("{}/things/1?q=a%20b", gateway.url()))
        .header("x-custom", "kept")
        .header("x-forwarded-for", "6.6.6.6")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-from-upstream"], "yes");
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        request_id.len(),
        36,
        "generated ids are UUIDs: {request_id}"
    );
    assert_eq!(response.text().await.unwrap(), "hello");

    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    let hit = &hits[0];
    assert_eq!(hit.uri.to_string(), "/things/1?q=a%20b");
    assert_eq!(hit.headers["x-custom"], "kept");
    assert_eq!(hit.headers["x-request-id"], request_id.as_str());
    // 127.0.0.1 is not a trusted proxy in this config: the spoofed chain is replaced.
    assert_eq!(hit.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(hit.headers["x-forwarded-proto"], "http");
    assert_eq!(
        hit.headers["x-forwarded-host"],
        gateway.addr.to_string().as_str()
    );
    assert_eq!(hit.headers["host"], upstream.addr().to_string().as_str());
}

#[tokio::test]
async fn client_request_id_is_propagated() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = gateway_for(&upstream).await;
    let response = client()
        .get(gateway.url() + "/x")
        .header("x-request-id", "client-chosen-id-42")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "client-chosen-id-42");
    assert_eq!(
        upstream.hits()[0].headers["x-request-id"],
        "client-chosen-id-42"
    );
}

#[tokio::test]
async fn post_with_one_mebibyte_body_arrives_intact() {
    let upstream = ScriptedUpstream::start(vec![Step::Echo]).await;
    let gateway = portcullis_testkit::gateway::GatewayProcess::start(
        crate::common::BIN,
        &format!(
            "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nmax_body_bytes = 2097152\n\n{}",
            crate::common::single_route_config(&upstream.url(), "")
        ),
    )
    .await;
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let response = client()
        .post(gateway.url() + "/upload")
        .header("content-type", "application/octet-stream")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap(), Bytes::from(body.clone()));
    assert_eq!(upstream.hits()[0].body.len(), body.len());
    assert_eq!(upstream.hits()[0].method, "POST");
}

#[tokio::test]
async fn chunked_response_is_streamed_not_buffered() {
    let chunks: Vec<Bytes> = (0..4).map(|i| Bytes::from(format!("part-{i};"))).collect();
    let upstream = ScriptedUpstream::start(vec![Step::Chunked {
        chunks: chunks.clone(),
        interval: Duration::from_millis(300),
    }])
    .await;
    let gateway = gateway_for(&upstream).await;
    let mut response = client()
        .get(gateway.url() + "/stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers().get("content-length").is_none(),
        "no length: the body streams"
    );
    // The first chunk arrives on its own while the upstream is still producing: the gateway
    // forwards frames as they come instead of collecting the whole body first.
    let first = response.chunk().await.unwrap().expect("first chunk");
    assert_eq!(first, chunks[0]);
    let mut rest = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"part-1;part-2;part-3;");
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways() {
    let upstream = ScriptedUpstream::start(vec![Step::respond(
        200,
        &[
            ("connection", "x-upstream-private"),
            ("x-upstream-private", "1"),
            ("x-upstream-public", "1"),
        ],
        "ok",
    )])
    .await;
    let gateway = gateway_for(&upstream).await;
    let response = client()
        .get(gateway.url() + "/h")
        .header("connection", "x-client-private")
        .header("x-client-private", "secret")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("x-client-public", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-upstream-private").is_none());
    assert_eq!(response.headers()["x-upstream-public"], "1");
    let hit = &upstream.hits()[0];
    for name in ["x-client-private", "te", "proxy-authorization"] {
        assert!(
            hit.headers.get(name).is_none(),
            "{name} reached the upstream"
        );
    }
    assert_eq!(hit.headers["x-client-public"], "1");
}

#[tokio::test]
async fn round_robin_over_endpoints() {
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\", \"{}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n",
        a.url(),
        b.url()
    );
    let gateway =
        portcullis_testkit::gateway::GatewayProcess::start(crate::common::BIN, &config).await;
    for _ in 0..6 {
        assert_eq!(
            client()
                .get(gateway.url() + "/rr")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert_eq!(a.hit_count(), 3);
    assert_eq!(b.hit_count(), 3);
}
