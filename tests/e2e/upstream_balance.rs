//! Load balancing through the real binary: weights split round robin exactly; least_request
//! and peak_ewma send less to a slow endpoint than to fast ones (orders of counts, never
//! timings). Counts are what each upstream received.

use std::time::Duration;

use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::upstream_health::{get, proxied, start};

fn config(balancer: &str, endpoints: &[String]) -> String {
    let list = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"[[upstreams]]
name = "u"
endpoints = [{list}]
load_balancer = "{balancer}"
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "u"
"#
    )
}

#[tokio::test]
async fn weights_split_round_robin_smoothly() {
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        r#"[[upstreams]]
name = "u"
endpoints = [{{ url = "{}", weight = 3 }}, "{}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "u"
"#,
        a.url(),
        b.url()
    );
    let gw = start(&config).await;
    for _ in 0..40 {
        assert_eq!(get(&gw, "/w").await, Some(200));
    }
    assert_eq!((proxied(&a), proxied(&b)), (30, 10));
}

/// 3 fast endpoints and 1 slow (each answer 300 ms late); 8 clients × 12 sequential
/// requests. Round robin would give each endpoint a quarter.
async fn slow_endpoint_gets_less(balancer: &str) {
    let _trace = portcullis_testkit::trace_init();
    let fast: Vec<ScriptedUpstream> =
        futures_util::future::join_all((0..3).map(|_| ScriptedUpstream::start(vec![]))).await;
    let slow = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(Duration::from_millis(300), Step::ok("slow")),
    )
    .await;
    let mut urls: Vec<String> = fast.iter().map(ScriptedUpstream::url).collect();
    urls.push(slow.url());
    let gw = start(&config(balancer, &urls)).await;
    let clients = (0..8).map(|_| {
        let gw = &gw;
        async move {
            for _ in 0..12 {
                assert_eq!(get(gw, "/load").await, Some(200));
            }
        }
    });
    futures_util::future::join_all(clients).await;
    let counts: Vec<usize> = fast.iter().map(proxied).collect();
    let slow_count = proxied(&slow);
    assert_eq!(counts.iter().sum::<usize>() + slow_count, 96);
    assert!(
        counts.iter().all(|&c| c > slow_count),
        "{balancer}: fast {counts:?}, slow {slow_count}"
    );
    assert!(
        slow_count < 96 / 4,
        "{balancer}: below round robin's share: {slow_count}"
    );
}

#[tokio::test]
async fn least_request_sends_less_to_a_slow_endpoint() {
    slow_endpoint_gets_less("least_request").await;
}

#[tokio::test]
async fn peak_ewma_sends_less_to_a_slow_endpoint() {
    slow_endpoint_gets_less("peak_ewma").await;
}
