//! Live reload of the configuration file through the real binary: ten reloads under an
//! open-loop load (HTTP/1.1 keep-alive and HTTP/2 clients, at `common::load_rate`) fail no
//! request, a new route answers at once, spent tokens stay spent, an
//! invalid file or a restart-only change changes nothing and says which field, SIGHUP and
//! the file watcher (a ConfigMap-style symlink swap) apply, an upstream the reload did not
//! touch keeps its pooled connection, asynchronous deliveries follow the new endpoints with
//! none lost or doubled, and the first asynchronous route needs a restart.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::ScriptedUpstream;

use crate::common::{assert_problem, client, load_rate, BIN};

const TOKEN: &str = "reload-test-admin-token-0123456789";
const METER_KEY: &str = "meter-key-0001";

/// One version of the test configuration.
struct Shape<'a> {
    server: &'a str,
    steady: &'a str,
    moving: &'a str,
    /// Serve `/extra` (toward `steady`).
    extra: bool,
    /// Burst of tenant `meter` (rate 1 per hour, so nothing refills during a test).
    meter_burst: u32,
    /// Tenant `other`'s burst: a tenant change that leaves `meter` alone.
    other_burst: u32,
}

fn config(shape: &Shape<'_>) -> String {
    let extra = if shape.extra {
        "[[routes]]\nname = \"extra\"\nprefix = \"/extra\"\nupstream = \"steady\"\n"
    } else {
        ""
    };
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
worker_threads = 1
{server}

[[tenants]]
id = "meter"
api_keys = ["{METER_KEY}"]
rate = 1
per = "1h"
burst = {meter}

[[tenants]]
id = "other"
api_keys = ["other-key-0001"]
rate = 1
per = "1h"
burst = {other}

[[upstreams]]
name = "steady"
endpoints = ["{steady}"]
retry = {{ max_retries = 0 }}
attempt_timeout = "30s"

[[upstreams]]
name = "moving"
endpoints = ["{moving}"]
retry = {{ max_retries = 0 }}
attempt_timeout = "30s"

[[routes]]
name = "steady"
prefix = "/steady"
upstream = "steady"

[[routes]]
name = "moving"
prefix = "/moving"
upstream = "moving"

{extra}"#,
        server = shape.server,
        meter = shape.meter_burst,
        other = shape.other_burst,
        steady = shape.steady,
        moving = shape.moving,
    )
}

fn options() -> GatewayOptions {
    GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), TOKEN.to_owned())],
        ..GatewayOptions::default()
    }
}

/// Replaces the gateway's configuration file by rename (never half a file on disk).
fn install(gateway: &GatewayProcess, text: &str) {
    let rendered = text
        .replace("{listen}", &gateway.addr.to_string())
        .replace("{admin_listen}", &gateway.admin_addr.to_string());
    let next = gateway.dir().join("next.toml");
    std::fs::write(&next, rendered).unwrap();
    std::fs::rename(&next, gateway.dir().join("portcullis.toml")).unwrap();
}

async fn reload(gateway: &GatewayProcess) -> reqwest::Response {
    client()
        .post(gateway.admin_url() + "/admin/v1/config/reload")
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
}

async fn reload_ok(gateway: &GatewayProcess) -> serde_json::Value {
    let response = reload(gateway).await;
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "reload refused: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn status(gateway: &GatewayProcess, path: &str, key: Option<&str>) -> u16 {
    let mut request = client().get(gateway.url() + path);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap().status().as_u16()
}

/// Polls `path` until it answers `want`; how many polls it took (20 ms apart, at most 50:
/// one second, the issue's bound).
async fn polls_until(gateway: &GatewayProcess, path: &str, want: u16) -> Option<usize> {
    for attempt in 1..=50 {
        if status(gateway, path, None).await == want {
            return Some(attempt);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// `config_reloads_total{result}` from the admin `/metrics`.
async fn reloads(gateway: &GatewayProcess, result: &str) -> u64 {
    let text = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_reloads_under_open_loop_load_fail_no_request() {
    let steady = ScriptedUpstream::start(vec![]).await;
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let (steady_url, a_url, b_url) = (steady.url(), a.url(), b.url());
    let shape = |generation: u32| Shape {
        server: "",
        steady: &steady_url,
        moving: if generation.is_multiple_of(2) {
            &a_url
        } else {
            &b_url
        },
        extra: generation % 2 == 1,
        meter_burst: 5 + generation % 2,
        other_burst: 5,
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&shape(0)), options()).await;
    assert_eq!(status(&gateway, "/extra/x", None).await, 404);

    // Open loop: one request every 1/rate s (400/s unless `PORTCULLIS_TEST_LOAD_RATE` says
    // otherwise) on its schedule, whatever the answers take; two of three over an HTTP/1.1
    // keep-alive pool, one of three over one HTTP/2 connection (h2c, prior knowledge), each
    // marked with `x-client`. A fixed budget (20 s of sends), and it stops once the reloads
    // are done and at least 3 s of sends went out.
    let rate = load_rate();
    let max_requests = 20 * rate as usize;
    let min_requests = 3 * rate as usize;
    let interval = Duration::from_secs(1) / rate;
    // Generous timeouts: on a starved machine a slow answer is not what this test looks for
    // (a request dropped by a reload fails at once).
    let h1 = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(32)
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap();
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap();
    let reloads_done = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    // Answers that came over HTTP/2, and HTTP/2 requests sent.
    let over_h2 = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let started = tokio::time::Instant::now();
    let load = {
        let (url, reloads_done) = (gateway.url(), reloads_done.clone());
        let (failed, served, over_h2) = (failed.clone(), served.clone(), over_h2.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            let mut tasks = Vec::new();
            for i in 0..max_requests {
                tick.tick().await;
                if i >= min_requests && reloads_done.load(Ordering::Relaxed) {
                    break;
                }
                let which = i % 2;
                let path = ["steady", "moving"][which];
                let http2 = i % 3 == 2;
                let http = if http2 { h2.clone() } else { h1.clone() };
                over_h2[1].fetch_add(usize::from(http2), Ordering::Relaxed);
                let url = url.clone();
                let (failed, served, over_h2) = (failed.clone(), served.clone(), over_h2.clone());
                tasks.push(tokio::spawn(async move {
                    let request = http
                        .get(format!("{url}/{path}/{i}"))
                        .header("x-client", if http2 { "h2" } else { "h1" });
                    match request.send().await {
                        Ok(r) if r.status() == 200 => {
                            if r.version() == http::Version::HTTP_2 {
                                over_h2[0].fetch_add(1, Ordering::Relaxed);
                            }
                            served[which].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => {
                            eprintln!("request {i} to /{path}: {}", r.status());
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            eprintln!("request {i} to /{path}: {err}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            let sent = tasks.len();
            for task in tasks {
                task.await.unwrap();
            }
            sent
        })
    };

    let mut extra_polls = 0;
    for generation in 1..=10u32 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        install(&gateway, &config(&shape(generation)));
        let summary = reload_ok(&gateway).await;
        assert_eq!(summary["changed"], true, "{summary}");
        assert_eq!(summary["generation"], generation, "{summary}");
        assert_eq!(
            summary["upstreams"]["changed"],
            serde_json::json!(["moving"])
        );
        assert_eq!(summary["upstreams"]["kept"], serde_json::json!(["steady"]));
        assert_eq!(summary["tenants_changed"], true, "{summary}");
        let (list, want) = if generation % 2 == 1 {
            ("added", 200)
        } else {
            ("removed", 404)
        };
        assert_eq!(summary["routes"][list], serde_json::json!(["extra"]));
        let polls = polls_until(&gateway, &format!("/extra/{generation}"), want)
            .await
            .unwrap_or_else(|| panic!("/extra not {want} within 1 s of reload {generation}"));
        // Only the poll that got 200 reached the upstream.
        let _ = polls;
        extra_polls += usize::from(want == 200);
    }
    reloads_done.store(true, Ordering::Relaxed);
    let sent = load.await.unwrap();
    // For the record only (no assertion on time): the rate the schedule held.
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{sent} requests in {seconds:.2} s ({:.0}/s) across 10 reloads",
        sent as f64 / seconds
    );

    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failed requests of {sent}"
    );
    let [to_steady, to_moving] = [0, 1].map(|i| served[i].load(Ordering::Relaxed));
    assert_eq!(to_steady + to_moving, sent);
    assert!(sent >= min_requests, "{sent}");
    // A third really went over HTTP/2.
    let [h2_answered, h2_sent] = [0, 1].map(|i| over_h2[i].load(Ordering::Relaxed));
    assert_eq!(h2_answered, h2_sent);
    assert!(h2_sent >= sent / 3, "{h2_sent} of {sent}");
    // What the upstreams received: every steady request (and the /extra polls that got 200)
    // at the steady upstream, every moving one at A or B, and both took a share.
    assert_eq!(steady.hit_count(), to_steady + extra_polls);
    assert_eq!(a.hit_count() + b.hit_count(), to_moving);
    assert!(a.hit_count() > 0 && b.hit_count() > 0);
    // Each client's requests, counted where they arrived.
    let upstream_hits = [steady.hits(), a.hits(), b.hits()].concat();
    let from = |client: &str| {
        upstream_hits
            .iter()
            .filter(|h| h.headers.get("x-client").is_some_and(|v| v == client))
            .count()
    };
    assert_eq!(from("h2"), h2_sent);
    assert_eq!(from("h1"), sent - h2_sent);
    assert_eq!(reloads(&gateway, "applied").await, 10);
    assert_eq!(reloads(&gateway, "rejected").await, 0);
}

#[tokio::test]
async fn tokens_spent_before_a_reload_stay_spent() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let url = upstream.url();
    let mut shape = Shape {
        server: "",
        steady: &url,
        moving: &url,
        extra: false,
        meter_burst: 5,
        other_burst: 5,
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&shape), options()).await;
    for _ in 0..3 {
        assert_eq!(status(&gateway, "/steady/x", Some(METER_KEY)).await, 200);
    }
    // A route added and another tenant's limit changed; `meter`'s own limit is the same.
    shape.extra = true;
    shape.other_burst = 9;
    install(&gateway, &config(&shape));
    let summary = reload_ok(&gateway).await;
    assert_eq!(summary["tenants_changed"], true, "{summary}");
    let after: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(status(&gateway, "/extra/x", Some(METER_KEY)).await);
        }
        statuses
    };
    assert_eq!(after, [200, 200, 429], "the remainder is what was left");
    assert_eq!(
        upstream.hit_count(),
        5,
        "the upstream saw the burst, no more"
    );
}

#[tokio::test]
async fn an_invalid_file_or_a_restart_only_change_changes_nothing() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let url = upstream.url();
    let shape = Shape {
        server: "",
        steady: &url,
        moving: &url,
        extra: false,
        meter_burst: 5,
        other_burst: 5,
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&shape), options()).await;

    // Invalid: a route toward an upstream that does not exist, next to a new route.
    let invalid = config(&Shape {
        extra: true,
        ..shape
    })
    .replace(
        "prefix = \"/moving\"\nupstream = \"moving\"",
        "prefix = \"/moving\"\nupstream = \"nowhere\"",
    );
    install(&gateway, &invalid);
    let body = assert_problem(reload(&gateway).await, 422).await;
    assert_eq!(body["field"], "routes[1].upstream", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("nowhere"),
        "{body}"
    );
    // Nothing changed: the new route is not served, the old ones are.
    assert_eq!(status(&gateway, "/extra/x", None).await, 404);
    assert_eq!(status(&gateway, "/moving/x", None).await, 200);
    assert_eq!(reloads(&gateway, "rejected").await, 1);
    assert!(
        gateway.logs().contains("configuration reload refused"),
        "{}",
        gateway.logs()
    );

    // Restart-only: the worker count, refused with its reason, and the new route still not
    // served.
    let restart = config(&Shape {
        extra: true,
        ..shape
    })
    .replace("worker_threads = 1", "worker_threads = 2");
    install(&gateway, &restart);
    let body = assert_problem(reload(&gateway).await, 422).await;
    assert_eq!(body["field"], "server.worker_threads", "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("worker"),
        "{body}"
    );
    assert_eq!(status(&gateway, "/extra/x", None).await, 404);

    // The listen address: refused too (documented as restart-only).
    let moved = config(&Shape {
        extra: true,
        ..shape
    })
    .replace("listen = \"{listen}\"", "listen = \"127.0.0.1:1\"");
    install(&gateway, &moved);
    let body = assert_problem(reload(&gateway).await, 422).await;
    assert_eq!(body["field"], "server.listen", "{body}");
    assert_eq!(reloads(&gateway, "rejected").await, 3);
    assert_eq!(reloads(&gateway, "applied").await, 0);

    // Without the token: 401, and nothing reloaded.
    let response = client()
        .post(gateway.admin_url() + "/admin/v1/config/reload")
        .send()
        .await
        .unwrap();
    assert_problem(response, 401).await;
    assert_eq!(reloads(&gateway, "rejected").await, 3);
    // Only the requests above reached the upstream.
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn the_file_watcher_follows_a_symlink_swap_and_sighup_reloads() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let url = upstream.url();
    let shape = Shape {
        server: "watch_config = true",
        steady: &url,
        moving: &url,
        extra: false,
        meter_burst: 5,
        other_burst: 5,
    };
    let mut gateway = GatewayProcess::start_with(BIN, &config(&shape), options()).await;
    let render = |text: &str| {
        text.replace("{listen}", &gateway.addr.to_string())
            .replace("{admin_listen}", &gateway.admin_addr.to_string())
    };
    // As a ConfigMap update does: the file becomes a symlink into a new directory, swapped
    // in by rename. This version adds /extra and turns watching off.
    let first = gateway.dir().join("data-1");
    std::fs::create_dir(&first).unwrap();
    let text = render(&config(&Shape {
        server: "watch_config = false",
        extra: true,
        ..shape
    }));
    std::fs::write(first.join("portcullis.toml"), text).unwrap();
    let link = gateway.dir().join("link.tmp");
    std::os::unix::fs::symlink(first.join("portcullis.toml"), &link).unwrap();
    std::fs::rename(&link, gateway.dir().join("portcullis.toml")).unwrap();
    // Checked once a second: allow a few.
    let mut applied = false;
    for _ in 0..100 {
        if status(&gateway, "/extra/x", None).await == 200 {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(applied, "file change not applied; log:\n{}", gateway.logs());
    assert_eq!(reloads(&gateway, "applied").await, 1);
    assert!(gateway.logs().contains("file change"), "{}", gateway.logs());

    // Watching is off now: the next version waits for SIGHUP.
    let second = gateway.dir().join("data-2");
    std::fs::create_dir(&second).unwrap();
    let text = render(&config(&Shape {
        server: "watch_config = false",
        extra: false,
        ..shape
    }));
    std::fs::write(second.join("portcullis.toml"), text).unwrap();
    std::os::unix::fs::symlink(second.join("portcullis.toml"), &link).unwrap();
    std::fs::rename(&link, gateway.dir().join("portcullis.toml")).unwrap();
    gateway.guard().signal("HUP");
    assert!(
        polls_until(&gateway, "/extra/x", 404).await.is_some(),
        "SIGHUP did not reload; log:\n{}",
        gateway.logs()
    );
    assert_eq!(reloads(&gateway, "applied").await, 2);
    assert!(gateway.logs().contains("SIGHUP"), "{}", gateway.logs());
    assert_eq!(
        upstream.hit_count(),
        1,
        "one /extra request reached the upstream"
    );
}

#[tokio::test]
async fn an_upstream_the_reload_did_not_touch_keeps_its_pooled_connection() {
    let steady = ScriptedUpstream::start(vec![]).await;
    let moving = ScriptedUpstream::start(vec![]).await;
    let (steady_url, moving_url) = (steady.url(), moving.url());
    let shape = Shape {
        server: "",
        steady: &steady_url,
        moving: &moving_url,
        extra: false,
        meter_burst: 5,
        other_burst: 5,
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&shape), options()).await;
    for path in ["/steady/1", "/steady/2", "/moving/1", "/moving/2"] {
        assert_eq!(status(&gateway, path, None).await, 200);
    }
    assert_eq!((steady.connections(), moving.connections()), (1, 1));

    // `moving` changes a setting (same endpoint), `steady` does not; a route is added.
    let text = config(&Shape {
        extra: true,
        ..shape
    })
    .replace(
        "name = \"moving\"\nendpoints = [\"",
        "name = \"moving\"\nconnect_timeout = \"3s\"\nendpoints = [\"",
    );
    install(&gateway, &text);
    let summary = reload_ok(&gateway).await;
    assert_eq!(status(&gateway, "/steady/3", None).await, 200);
    // The steady upstream saw no new TCP connection: its pool carried over.
    assert_eq!(steady.connections(), 1, "steady pool was rebuilt");
    for path in ["/extra/4", "/moving/3"] {
        assert_eq!(status(&gateway, path, None).await, 200);
    }
    // The changed one was rebuilt and connected again.
    assert_eq!(moving.connections(), 2);
    assert_eq!(steady.connections(), 1);
    assert_eq!(steady.hit_count(), 4);
    assert_eq!(summary["upstreams"]["kept"], serde_json::json!(["steady"]));
    assert_eq!(
        summary["upstreams"]["changed"],
        serde_json::json!(["moving"])
    );
}

/// An asynchronous route `/hooks` toward upstream `u` at `endpoint`, tenant `acme`.
fn async_config(endpoint: &str) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"

[[tenants]]
id = "acme"
api_keys = ["key-acme-0001"]
rate = 1000
per = "1s"
burst = 1000

[[upstreams]]
name = "u"
endpoints = ["{endpoint}"]
retry = {{ max_retries = 0 }}

[[routes]]
name = "hooks"
prefix = "/hooks"
upstream = "u"
timeout = "30s"
delivery = {{ mode = "async" }}
"#
    )
}

/// The delivery ids an upstream was sent (its `Portcullis-Delivery-Id`), in arrival order.
fn delivered_ids(upstream: &ScriptedUpstream) -> Vec<String> {
    upstream
        .hits()
        .iter()
        .map(|hit| crate::async_delivery::header(hit, "portcullis-delivery-id").to_owned())
        .collect()
}

#[tokio::test]
async fn async_deliveries_follow_a_reload_to_the_new_endpoints_none_lost_or_doubled() {
    use crate::async_delivery::{accept, status_of, until};
    use portcullis_testkit::upstream::{Gate, Step};

    // A holds the first delivery until after the reload: a message the old workers leased.
    let gate = Gate::new();
    let a = ScriptedUpstream::start_with_fallback(
        vec![Step::gated(&gate, Step::ok("a"))],
        Step::ok("a"),
    )
    .await;
    let b = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start_with(BIN, &async_config(&a.url()), options()).await;
    let key = [("x-api-key", "key-acme-0001")];
    let mut before = Vec::new();
    before.push(accept(&gateway, &key, "{\"n\":0}").await.0);
    until("A holds the first delivery", || a.hit_count() == 1).await;
    for n in 1..5 {
        before.push(accept(&gateway, &key, &format!("{{\"n\":{n}}}")).await.0);
    }
    until("A got the first five", || a.hit_count() == 5).await;

    install(&gateway, &async_config(&b.url()));
    let summary = reload_ok(&gateway).await;
    assert_eq!(summary["upstreams"]["changed"], serde_json::json!(["u"]));
    let mut after = Vec::new();
    for n in 5..10 {
        after.push(accept(&gateway, &key, &format!("{{\"n\":{n}}}")).await.0);
    }
    until("B got the five accepted after the reload", || {
        b.hit_count() >= 5
    })
    .await;
    // The leased one finishes on the worker that leased it, through A.
    gate.open();
    let all: Vec<&String> = before.iter().chain(&after).collect();
    for id in &all {
        let mut delivered = false;
        for _ in 0..300 {
            if status_of(&gateway, id, Some("key-acme-0001")).await.1["state"] == "delivered" {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(delivered, "{id} never delivered; log:\n{}", gateway.logs());
    }

    // From the upstreams' records: the five accepted before at A, the five after at B, each
    // once.
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let (at_a, at_b) = (delivered_ids(&a), delivered_ids(&b));
    assert_eq!(at_a[0], before[0], "the held one first: {at_a:?}");
    assert_eq!(sorted(at_a.clone()), sorted(before.clone()), "A: {at_a:?}");
    assert_eq!(sorted(at_b.clone()), sorted(after.clone()), "B: {at_b:?}");
    for hit in a.hits().iter().chain(b.hits().iter()) {
        let id = crate::async_delivery::header(hit, "portcullis-delivery-id");
        assert_eq!(
            crate::async_delivery::header(hit, "idempotency-key"),
            format!("delivery-{id}")
        );
    }
}

#[tokio::test]
async fn a_reload_adding_the_first_async_route_is_refused_naming_the_field() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let url = upstream.url();
    let shape = Shape {
        server: "",
        steady: &url,
        moving: &url,
        extra: false,
        meter_burst: 5,
        other_burst: 5,
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&shape), options()).await;
    // `/extra` added, asynchronous.
    let text = config(&Shape {
        extra: true,
        ..shape
    })
    .replace(
        "prefix = \"/extra\"\nupstream = \"steady\"\n",
        "prefix = \"/extra\"\nupstream = \"steady\"\ndelivery = { mode = \"async\" }\n",
    );
    assert!(text.contains("mode = \"async\""));
    install(&gateway, &text);
    let body = assert_problem(reload(&gateway).await, 422).await;
    // `/extra` is the third route of the file.
    assert_eq!(body["field"], "routes[2].delivery", "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("storage.queue"),
        "{body}"
    );
    assert_eq!(reloads(&gateway, "rejected").await, 1);
    assert_eq!(reloads(&gateway, "applied").await, 0);
    // Nothing changed: no `/extra`, synchronous or not, and nothing reached the upstream
    // but the one request below.
    let response = client()
        .post(gateway.url() + "/extra/event")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(status(&gateway, "/steady/x", None).await, 200);
    assert_eq!(upstream.hit_count(), 1);
}
