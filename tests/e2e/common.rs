//! Shared helpers for the end-to-end tests.

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::ScriptedUpstream;

/// The gateway binary Cargo built for this test target.
pub const BIN: &str = env!("CARGO_BIN_EXE_portcullis");

/// The environment variable that sets the open-loop rate (requests per second) of the reload
/// and upgrade load tests.
pub const LOAD_RATE_ENV: &str = "PORTCULLIS_TEST_LOAD_RATE";

/// The open-loop rate of the reload and upgrade load tests: [`LOAD_RATE_ENV`], else 400 per
/// second. Bounded to 50..=20 000 (a typo must not turn a test into a flood or a crawl).
pub fn load_rate() -> u32 {
    match std::env::var(LOAD_RATE_ENV) {
        Ok(text) => {
            let rate: u32 = text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{LOAD_RATE_ENV}={text:?}: requests per second"));
            assert!(
                (50..=20_000).contains(&rate),
                "{LOAD_RATE_ENV}={rate}: between 50 and 20000"
            );
            rate
        }
        Err(_) => 400,
    }
}

/// An HTTP client without connection reuse surprises: no proxy, short timeouts.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .expect("reqwest client")
}

/// Asserts that an ordinary `GET path` through `gateway` still answers 200.
pub async fn still_serving(gateway: &GatewayProcess, path: &str) {
    let response = client().get(gateway.url() + path).send().await.unwrap();
    assert_eq!(
        response.status(),
        200,
        "the gateway keeps serving after bad input"
    );
}

/// A config with one upstream `u` at `upstream_url` routed from `/`, no retries, plus `extra`
/// lines inside the upstream table.
pub fn single_route_config(upstream_url: &str, upstream_extra: &str) -> String {
    format!(
        r#"[[upstreams]]
name = "u"
endpoints = ["{upstream_url}"]
retry = {{ max_retries = 0 }}
{upstream_extra}

[[routes]]
prefix = "/"
upstream = "u"
"#
    )
}

/// Starts a gateway in front of `upstream` with [`single_route_config`].
pub async fn gateway_for(upstream: &ScriptedUpstream) -> GatewayProcess {
    GatewayProcess::start(BIN, &single_route_config(&upstream.url(), "")).await
}

/// Asserts a problem+json response with `status`, returning the parsed body.
pub async fn assert_problem(response: reqwest::Response, status: u16) -> serde_json::Value {
    let actual = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.expect("response body");
    assert_eq!(actual, status, "unexpected status; body: {text}");
    assert_eq!(content_type, "application/problem+json", "body: {text}");
    let body: serde_json::Value = serde_json::from_str(&text).expect("problem body is JSON");
    assert_eq!(body["status"], status);
    assert!(
        body["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("https://")),
        "{body}"
    );
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    body
}
