//! The access line in the default human log format, as the binary writes it to stderr (its
//! own formatter, not `tracing`'s): every field in order, absent values as `-`, the
//! timestamp as the other log lines have it, one line per request.

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

#[tokio::test]
async fn the_human_access_line_has_every_field_in_order() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n\n\
         [[upstreams]]\nname = \"orders\"\nendpoints = [\"{}\"]\n\n\
         [[routes]]\nprefix = \"/api\"\nupstream = \"orders\"\n",
        upstream.url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let ok = raw_request(
        gateway.addr,
        b"GET /api/things?q=secret HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-7\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(parse_status(&ok), Some(200));
    let missing = raw_request(
        gateway.addr,
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(parse_status(&missing), Some(404));

    let endpoint = upstream.url().trim_start_matches("http://").to_owned();
    let served = regex::Regex::new(&format!(
        r#"(?m)^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{6}}Z  INFO portcullis::access: request request_id=req-7 trace_id=[0-9a-f]{{32}} tenant=- client_ip=127\.0\.0\.1 method=GET path=/api/things route=/api upstream=orders endpoint={} attempts=1 status=200 bytes_in=0 bytes_out=4 duration_ms=\d+\.\d+ upstream_duration_ms=\d+\.\d+ rate_limit="[a-z_-]+" idempotency="-" idempotency_key=-$"#,
        regex::escape(&endpoint)
    ))
    .unwrap();
    let unrouted = regex::Regex::new(
        r#"(?m)^\S+  INFO portcullis::access: request request_id=\S+ trace_id=[0-9a-f]{32} tenant=- client_ip=127\.0\.0\.1 method=GET path=/nowhere route=unmatched upstream=- endpoint=- attempts=0 status=404 bytes_in=0 bytes_out=\d+ duration_ms=\d+\.\d+ upstream_duration_ms=0\.0 rate_limit="-" idempotency="-" idempotency_key=-$"#,
    )
    .unwrap();
    // The line is written when the response body ends, just after the client has it.
    let mut logs = String::new();
    for _ in 0..100 {
        logs = gateway.logs();
        if served.is_match(&logs) && unrouted.is_match(&logs) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(served.is_match(&logs), "{logs}");
    assert!(unrouted.is_match(&logs), "{logs}");
    assert!(!logs.contains("secret"), "no query unless access_log_query");
    assert_eq!(logs.matches("portcullis::access").count(), 2, "{logs}");
}
