//! gRPC over HTTP/2 through the real binary: a tonic client (h2c) → the gateway → a tonic
//! server. The backend's statuses are classified by the retry ladder, `grpc-timeout` is
//! the deadline and is rewritten per attempt, and the gateway's own refusals reach the
//! client as gRPC statuses, not problem+json it cannot read.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::grpc::{Code, GrpcStep, GrpcUpstream};
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::common::BIN;

/// The health service routed from `/grpc.health.v1.Health`, h2c on the listener, HTTP/2
/// to the upstream, fast backoff; `route` adds route fields, `extra` top-level tables.
fn config(upstream: &GrpcUpstream, route: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nh2c = true\n\n{extra}\n\n[[upstreams]]\nname = \"grpc\"\nendpoints = [\"{}\"]\nhttp2 = true\nretry = {{ base = \"10ms\", cap = \"50ms\", max_retries = 3 }}\n\n[[routes]]\nprefix = \"/grpc.health.v1.Health\"\nupstream = \"grpc\"\n{route}\n",
        upstream.url()
    )
}

async fn client(gateway: &GatewayProcess) -> HealthClient<Channel> {
    let channel = Channel::from_shared(gateway.url())
        .expect("gateway url")
        .connect()
        .await
        .expect("h2c to the gateway");
    HealthClient::new(channel)
}

fn check() -> tonic::Request<HealthCheckRequest> {
    tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    })
}

#[tokio::test]
async fn unavailable_is_retried_on_an_idempotent_route_with_the_deadline_rewritten() {
    let upstream = GrpcUpstream::start(vec![
        GrpcStep::Status(Code::Unavailable, None),
        GrpcStep::Status(Code::ResourceExhausted, Some("20")),
    ])
    .await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "idempotent = true", "")).await;
    let mut request = check();
    request.set_timeout(Duration::from_secs(8));
    let answer = client(&gateway).await.check(request).await;
    assert!(answer.is_ok(), "{answer:?}");
    let calls = upstream.calls();
    assert_eq!(calls.len(), 3, "two retries, then served");
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["x-retry-attempt"], (i + 1).to_string().as_str());
        // HTTP/2 upstream: the endpoint in `:authority` alone (no `Host` beside it), and
        // the client's `te: trailers`, which gRPC servers such as grpcio require.
        assert!(call.get("host").is_none(), "{call:?}");
        assert_eq!(call["te"], "trailers");
        // The client's 8 s, less what has passed: never more than the client allowed.
        let sent = call["grpc-timeout"].to_str().unwrap();
        let ms: u64 = sent.strip_suffix('m').unwrap().parse().unwrap();
        assert!(ms <= 8_000, "{sent}");
    }
}

#[tokio::test]
async fn final_statuses_and_unsafe_calls_are_not_retried() {
    let upstream = GrpcUpstream::start(vec![]).await;
    upstream.set_fallback(GrpcStep::Status(Code::InvalidArgument, None));
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "idempotent = true", "")).await;
    let status = client(&gateway).await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(upstream.calls().len(), 1);

    // Without `idempotent = true` a call is a plain POST: UNAVAILABLE is not retried.
    let upstream = GrpcUpstream::start(vec![]).await;
    upstream.set_fallback(GrpcStep::Status(Code::Unavailable, None));
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", "")).await;
    let status = client(&gateway).await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(upstream.calls().len(), 1);
}

#[tokio::test]
async fn the_gateways_refusals_are_grpc_statuses() {
    let upstream = GrpcUpstream::start(vec![]).await;
    let limits = "[rate_limit]\nanonymous = { rate = 1, per = \"60s\", burst = 1 }";
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", limits)).await;
    let mut health = client(&gateway).await;
    assert!(health.check(check()).await.is_ok());
    let limited = health.check(check()).await.unwrap_err();
    assert_eq!(limited.code(), Code::ResourceExhausted, "{limited:?}");
    let pushback = limited.metadata().get("grpc-retry-pushback-ms").unwrap();
    assert!(pushback.to_str().unwrap().parse::<u64>().unwrap() >= 1000);
    assert_eq!(
        upstream.calls().len(),
        1,
        "the refused call never left the gateway"
    );

    // A service no route serves: UNIMPLEMENTED, as a gRPC server would say.
    let rsp = raw_call(&gateway, "/other.Service/Method", None).await;
    assert_eq!(rsp.status(), 200);
    assert_eq!(rsp.headers()["grpc-status"], "12");
    assert_eq!(rsp.headers()["content-type"], "application/grpc");
    assert!(
        rsp.bytes().await.unwrap().is_empty(),
        "Trailers-Only: no body"
    );
}

/// A gRPC call sent by hand (h2c), for headers tonic's client manages itself.
async fn raw_call(
    gateway: &GatewayProcess,
    path: &str,
    grpc_timeout: Option<&str>,
) -> reqwest::Response {
    let client = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut request = client
        .post(gateway.url() + path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // One empty message: uncompressed flag and a zero length.
        .body(vec![0u8; 5]);
    if let Some(t) = grpc_timeout {
        request = request.header("grpc-timeout", t);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn an_expired_grpc_timeout_is_deadline_exceeded_without_reaching_the_backend() {
    let upstream = GrpcUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", "")).await;
    let rsp = raw_call(&gateway, "/grpc.health.v1.Health/Check", Some("0n")).await;
    assert_eq!(rsp.headers()["grpc-status"], "4", "{rsp:?}");
    assert!(upstream.calls().is_empty());
}
