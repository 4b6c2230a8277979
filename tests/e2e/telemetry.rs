//! Telemetry through the binary: W3C trace context continued from trusted peers only, the
//! exported span tree of a keyed POST that is retried (received by the test kit's OTLP/HTTP
//! collector), the `traceparent` each attempt carries upstream, and the JSON access-log line.

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::otlp::{CollectedSpan, OtlpCollector};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

mod access_text;
mod dashboard;

const API_KEY: &str = "acme-telemetry-key-0001";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A gateway exporting spans to `collector`, JSON logs, one tenant, one retried upstream.
fn config(upstream: &ScriptedUpstream, collector: &OtlpCollector, trusted: &str) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
log_format = "json"
trusted_proxies = [{trusted}]

[telemetry]
otlp_endpoint = "{endpoint}"
sampling_ratio = 0.1
tenant_labels = ["acme"]

[[tenants]]
id = "acme"
api_keys = ["{API_KEY}"]
rate = 100
per = "1s"
burst = 100

[[upstreams]]
name = "orders"
endpoints = ["{upstream}"]
retry = {{ max_retries = 2, base = "10ms", cap = "20ms" }}

[[routes]]
prefix = "/orders"
upstream = "orders"
idempotency = {{ methods = ["POST"] }}
"#,
        endpoint = collector.endpoint(),
        upstream = upstream.url(),
    )
}

async fn start(config: &str) -> GatewayProcess {
    // Export batches every 50 ms instead of 5 s, so the test waits briefly.
    let options = GatewayOptions {
        env: vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into())],
        ..GatewayOptions::default()
    };
    GatewayProcess::start_with(BIN, config, options).await
}

fn keyed_post(traceparent: &str) -> Vec<u8> {
    let body = r#"{"item":"book"}"#;
    format!(
        "POST /orders?secret=q HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {API_KEY}\r\n\
         Idempotency-Key: order-42\r\ntraceparent: {traceparent}\r\ntracestate: vendor=abc\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The one span named `name` with attribute `key = value`.
fn span<'a>(spans: &'a [CollectedSpan], name: &str, key: &str, value: &str) -> &'a CollectedSpan {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.name == name && s.attr(key) == Some(value))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} span with {key}={value}: {spans:#?}"
    );
    found[0]
}

/// `(trace id, parent id)` of a `traceparent` value.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// The JSON access-log lines in `logs`.
fn access_lines(logs: &str) -> Vec<serde_json::Value> {
    logs.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["target"] == "portcullis::access")
        .collect()
}

#[tokio::test]
async fn a_retried_keyed_post_exports_its_span_tree_and_one_access_line() {
    let collector = OtlpCollector::start().await;
    let upstream = ScriptedUpstream::start(vec![Step::status(503), Step::ok("created")]).await;
    let gateway = start(&config(&upstream, &collector, r#""127.0.0.1/32""#)).await;

    let incoming = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let response = raw_request(gateway.addr, &keyed_post(&incoming))
        .await
        .unwrap();
    assert_eq!(
        parse_status(&response),
        Some(200),
        "{}",
        String::from_utf8_lossy(&response)
    );

    // The tree: one server span (child of the caller's span), two attempt spans under it.
    let spans = collector
        .wait_for(|spans| spans.iter().filter(|s| s.trace_id == TRACE_ID).count() >= 3)
        .await;
    let ours: Vec<_> = spans
        .iter()
        .filter(|s| s.trace_id == TRACE_ID)
        .cloned()
        .collect();
    assert_eq!(
        ours.len(),
        3,
        "sampled through the caller's flag despite ratio 0.1: {spans:#?}"
    );
    let server = span(&ours, "gateway request", "portcullis.tenant", "acme");
    assert_eq!(server.kind, 2, "server span");
    assert_eq!(
        server.parent_span_id, CALLER_SPAN,
        "continues the trusted caller's trace"
    );
    assert_eq!(server.service_name, "portcullis");
    assert_eq!(server.attr("portcullis.idempotency"), Some("first"));
    assert_eq!(server.attr("portcullis.ratelimit"), Some("allowed"));
    assert_eq!(server.attr("portcullis.attempts"), Some("2"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    assert_eq!(server.attr("http.route"), Some("/orders"));
    let first = span(&ours, "upstream attempt", "portcullis.attempt", "1");
    let second = span(&ours, "upstream attempt", "portcullis.attempt", "2");
    for (attempt, outcome, status) in [(first, "5xx", "503"), (second, "2xx", "200")] {
        assert_eq!(attempt.kind, 3, "client span");
        assert_eq!(
            attempt.parent_span_id, server.span_id,
            "attempts are children of the server span"
        );
        assert_eq!(attempt.attr("portcullis.attempt.outcome"), Some(outcome));
        assert_eq!(attempt.attr("http.response.status_code"), Some(status));
        assert_eq!(attempt.attr("portcullis.upstream"), Some("orders"));
        assert_eq!(
            attempt.attr("server.address"),
            Some(upstream.addr().to_string().as_str())
        );
        assert!(attempt.attr("portcullis.backoff_ms").is_some());
    }
    assert_eq!(first.attr("portcullis.backoff_ms"), Some("0"));

    // Upstream: each attempt carried a traceparent naming its own attempt span.
    let hits = upstream.hits();
    assert_eq!(hits.len(), 2);
    for (hit, attempt) in hits.iter().zip([first, second]) {
        let value = hit.headers["traceparent"].to_str().unwrap();
        assert_eq!(ids(value), (TRACE_ID.to_owned(), attempt.span_id.clone()));
        assert_eq!(hit.headers["tracestate"], "vendor=abc");
        assert_eq!(hit.headers["idempotency-key"], "order-42");
    }

    // The access log: exactly one line for the request, every field, no API key anywhere.
    let logs = gateway.logs();
    assert!(!logs.contains(API_KEY), "the API key never reaches the log");
    assert!(
        !logs.contains("Some("),
        "no Option debug formatting in logs"
    );
    let lines = access_lines(&logs);
    let lines: Vec<_> = lines
        .iter()
        .filter(|l| l["fields"]["path"] == "/orders")
        .collect();
    assert_eq!(lines.len(), 1, "one access line per request:\n{logs}");
    let line = lines[0];
    assert!(line["timestamp"].is_string(), "{line}");
    assert_eq!(line["level"], "INFO");
    let fields = &line["fields"];
    for (field, want) in [
        ("trace_id", serde_json::json!(TRACE_ID)),
        ("tenant", serde_json::json!("acme")),
        ("client_ip", serde_json::json!("127.0.0.1")),
        ("method", serde_json::json!("POST")),
        ("route", serde_json::json!("/orders")),
        ("upstream", serde_json::json!("orders")),
        ("endpoint", serde_json::json!(upstream.addr().to_string())),
        ("attempts", serde_json::json!(2)),
        ("status", serde_json::json!(200)),
        ("bytes_in", serde_json::json!(15)),
        ("bytes_out", serde_json::json!(7)),
        ("rate_limit", serde_json::json!("allowed")),
        ("idempotency", serde_json::json!("first")),
        ("idempotency_key", serde_json::json!("order-42")),
    ] {
        assert_eq!(fields[field], want, "{field} in {line}");
    }
    let request_id = fields["request_id"].as_str().unwrap();
    assert_eq!(hits[0].headers["x-request-id"], request_id);
    let duration = fields["duration_ms"].as_f64().unwrap();
    let upstream_ms = fields["upstream_duration_ms"].as_f64().unwrap();
    assert!(upstream_ms >= 0.0 && duration >= upstream_ms, "{line}");
}

#[tokio::test]
async fn trace_context_from_an_untrusted_peer_or_malformed_starts_a_new_trace() {
    let collector = OtlpCollector::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    // Nobody is trusted: the client's traceparent must not be continued nor passed on.
    let gateway = start(&config(&upstream, &collector, "")).await;
    let incoming = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let response = raw_request(gateway.addr, &keyed_post(&incoming))
        .await
        .unwrap();
    assert_eq!(parse_status(&response), Some(200));
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    let (trace, parent) = ids(hits[0].headers["traceparent"].to_str().unwrap());
    assert_ne!(
        trace, TRACE_ID,
        "an untrusted caller cannot choose the trace"
    );
    assert_ne!(parent, CALLER_SPAN);
    assert!(
        !hits[0].headers.contains_key("tracestate"),
        "nor pass its tracestate on"
    );
    let line = access_lines(&gateway.logs()).pop().unwrap();
    assert_eq!(
        line["fields"]["trace_id"],
        trace.as_str(),
        "the log names the new trace"
    );

    // From a trusted peer, a malformed traceparent is not an error: a new trace starts.
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = start(&config(&upstream, &collector, r#""127.0.0.1/32""#)).await;
    let response = raw_request(gateway.addr, &keyed_post("00-not-a-trace-01"))
        .await
        .unwrap();
    assert_eq!(parse_status(&response), Some(200));
    let (trace, _) = ids(upstream.hits()[0].headers["traceparent"].to_str().unwrap());
    assert_eq!(trace.len(), 32);
    assert_ne!(trace, "0".repeat(32));
    // Spans of new traces are sampled at 0.1: if this one was, it is a root.
    let spans = collector.spans();
    for server in spans.iter().filter(|s| s.trace_id == trace && s.kind == 2) {
        assert!(
            server.parent_span_id.is_empty(),
            "a new trace's server span is a root"
        );
    }
}
