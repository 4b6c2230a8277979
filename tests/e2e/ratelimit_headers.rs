//! Rate limiting through the real binary: burst then 429, the headers (the draft's `t` as
//! the wait for more quota, `violated-policies` in the 429), cost weights, tenant and client
//! isolation, shadow policies, load shedding.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{assert_problem, client, single_route_config, BIN};

fn config(upstream: &str, tenants: &str, extra: &str) -> String {
    format!(
        "{extra}\n{tenants}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n\n[[routes]]\nprefix = \"/heavy\"\nupstream = \"u\"\ncost = 3\n"
    )
}

const TWO_TENANTS: &str = "[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1\nper = \"2s\"\nburst = 5\n\n[[tenants]]\nid = \"globex\"\napi_keys = [\"globex-key-0001\"]\nrate = 1\nper = \"2s\"\nburst = 5\n";

async fn get(gateway: &GatewayProcess, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = client().get(gateway.url() + path);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn burst_is_admitted_then_429_tells_when_to_come_back() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), TWO_TENANTS, "")).await;
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let response = get(&gateway, "/x", Some("acme-key-0001")).await;
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-ratelimit-limit"), "5");
        assert!(
            header(&response, "ratelimit-policy").contains("\"tenant\";q=1;w=2"),
            "{}",
            header(&response, "ratelimit-policy")
        );
        remaining.push(
            header(&response, "x-ratelimit-remaining")
                .parse::<u64>()
                .unwrap(),
        );
    }
    assert_eq!(remaining, vec![4, 3, 2, 1, 0]);

    let rejected = get(&gateway, "/x", Some("acme-key-0001")).await;
    let retry_after: u64 = header(&rejected, "retry-after").parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    let reset: u64 = header(&rejected, "x-ratelimit-reset").parse().unwrap();
    assert!(
        reset > 1_700_000_000,
        "X-RateLimit-Reset is an epoch timestamp: {reset}"
    );
    assert!(
        header(&rejected, "ratelimit").contains("\"tenant\";r=0;t="),
        "{}",
        header(&rejected, "ratelimit")
    );
    let body = assert_problem(rejected, 429).await;
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["policy"], "tenant");
    assert_eq!(body["violated-policies"], serde_json::json!(["tenant"]));
    assert_eq!(body["retry_after"], retry_after);
    let detail = body["detail"].as_str().unwrap().to_lowercase();
    assert!(
        detail.contains("jitter") && detail.contains("idempotency-key"),
        "{detail}"
    );
    assert_eq!(
        upstream.hit_count(),
        5,
        "a rejected request never reaches the upstream"
    );

    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(
        get(&gateway, "/x", Some("acme-key-0001")).await.status(),
        200,
        "admitted after Retry-After"
    );
}

#[tokio::test]
async fn remaining_drops_by_the_route_cost_and_the_two_header_families_agree() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), TWO_TENANTS, "")).await;
    let first = get(&gateway, "/heavy/a", Some("acme-key-0001")).await;
    assert_eq!(header(&first, "x-ratelimit-remaining"), "2");
    let rl = header(&first, "ratelimit");
    assert!(
        rl.contains(";r=2;"),
        "RateLimit agrees with X-RateLimit-Remaining: {rl}"
    );
    // t: the next token, 2 s away (1 per 2 s); Reset: the bucket full again, 3 tokens (6 s)
    // away.
    assert!(rl.ends_with(";t=2"), "t is the next token's refill: {rl}");
    let reset: u64 = header(&first, "x-ratelimit-reset").parse().unwrap();
    let date = httpdate::parse_http_date(&header(&first, "date")).unwrap();
    let now = date
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        reset.abs_diff(now + 6) <= 1,
        "Reset {reset} vs now {now} + 6 s to a full bucket"
    );
    let second = get(&gateway, "/heavy/b", Some("acme-key-0001")).await;
    assert_eq!(second.status(), 429, "2 tokens left, the route costs 3");
    let t = header(&second, "ratelimit");
    assert!(
        t.ends_with(&format!(";t={}", header(&second, "retry-after"))),
        "refused: t is Retry-After, the wait for the third token: {t}"
    );
    let cheap = get(&gateway, "/c", Some("acme-key-0001")).await;
    assert_eq!(cheap.status(), 200, "a rejected request consumed nothing");
    assert_eq!(header(&cheap, "x-ratelimit-remaining"), "1");
}

#[tokio::test]
async fn tenants_anonymous_clients_and_spoofed_forwarding_are_isolated() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let anonymous = "[rate_limit]\nanonymous = { rate = 1, per = \"10s\", burst = 3 }\n";
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream.url(), TWO_TENANTS, anonymous)).await;
    for _ in 0..5 {
        assert_eq!(
            get(&gateway, "/a", Some("acme-key-0001")).await.status(),
            200
        );
    }
    assert_eq!(
        get(&gateway, "/a", Some("acme-key-0001")).await.status(),
        429
    );
    assert_eq!(
        get(&gateway, "/a", Some("globex-key-0001")).await.status(),
        200,
        "globex has its own bucket"
    );
    // Anonymous traffic has its own per-IP bucket: it neither spends nor is blocked by acme's.
    for _ in 0..3 {
        assert_eq!(get(&gateway, "/a", None).await.status(), 200);
    }
    // 127.0.0.1 is not a trusted proxy here: a forged X-Forwarded-For does not buy a new bucket.
    let spoofed = client()
        .get(gateway.url() + "/a")
        .header("x-forwarded-for", "198.51.100.77")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), 429);
    assert_eq!(
        header(&spoofed, "ratelimit-policy")
            .split(';')
            .next()
            .unwrap(),
        "\"ip\""
    );
}

#[tokio::test]
async fn shadow_policy_counts_but_never_rejects() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let shadow =
        "[rate_limit]\nanonymous = { rate = 1, per = \"10s\", burst = 1, shadow = true }\n";
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), "", shadow)).await;
    for _ in 0..5 {
        let response = get(&gateway, "/s", None).await;
        assert_eq!(response.status(), 200, "shadow mode never rejects");
        assert!(
            response.headers().contains_key("x-ratelimit-limit"),
            "headers are still emitted"
        );
    }
    let metrics = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shadow_line = metrics
        .lines()
        .find(|l| l.starts_with("ratelimit_shadow_rejections_total"))
        .unwrap_or_else(|| panic!("no shadow counter in:\n{metrics}"));
    let count: f64 = shadow_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 3.0, "{shadow_line}");
}

#[tokio::test]
async fn load_shedding_answers_503_at_once_over_the_cap() {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(Duration::from_millis(1500), Step::ok("slow")),
    )
    .await;
    let cap =
        "[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin_listen}\"\nload_shed_limit = 2\ncaller_share = 1.0\n";
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), "", cap)).await;
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let url = gateway.url() + "/slow";
            tokio::spawn(async move { client().get(url).send().await.unwrap().status() })
        })
        .collect();
    for _ in 0..100 {
        if upstream.hit_count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shed = get(&gateway, "/third", None).await;
    assert_eq!(header(&shed, "retry-after"), "1");
    assert_problem(shed, 503).await;
    for task in slow {
        assert_eq!(task.await.unwrap(), 200);
    }
    assert_eq!(
        get(&gateway, "/after", None).await.status(),
        200,
        "permits come back with the responses"
    );
}

/// A response read off a raw socket: status, lower-cased header fields, body.
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    fn secs(&self, name: &str) -> u64 {
        self.header(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {:?}", self.header(name)))
    }

    /// The `Date` field as Unix seconds.
    fn date(&self) -> u64 {
        httpdate::parse_http_date(self.header("date"))
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// The `t` parameter of the `RateLimit` field (`None` when absent).
    fn t(&self) -> Option<u64> {
        let field = self.header("ratelimit");
        field
            .split(';')
            .find_map(|p| p.strip_prefix("t="))
            .map(|t| t.parse().unwrap_or_else(|_| panic!("RateLimit: {field}")))
    }
}

/// `GET path` with `key` as bearer token over a fresh raw connection.
async fn raw_get(gateway: &GatewayProcess, path: &str, key: &str) -> RawResponse {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let bytes = raw_request(gateway.addr, request.as_bytes())
        .await
        .expect("the gateway answers");
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = std::str::from_utf8(&bytes[..split]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status = parse_status(lines.next().unwrap_or_default().as_bytes()).expect("a status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawResponse {
        status,
        headers,
        body: bytes[split + 4..].to_vec(),
    }
}

const ONE_PER_SECOND_BURST_TEN: &str = "[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1\nper = \"1s\"\nburst = 10\n";

/// draft-ietf-httpapi-ratelimit-headers-10: `t` is the time until *additional* quota is made
/// available, i.e. the next token (≤ 1 s on a 1/s bucket), not the time until the bucket is
/// full (up to 10 s here), and on the 429 it is the same moment as `Retry-After`.
#[tokio::test]
async fn t_is_the_wait_for_the_next_unit_not_for_a_full_bucket() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream.url(), ONE_PER_SECOND_BURST_TEN, "")).await;
    // The burst is spent in far less than the 30 s this loop could take at 1 token/s; a
    // slow machine only refills a token now and then, which must not change `t`.
    let mut admitted = 0;
    let rejected = loop {
        assert!(admitted < 30, "a 1/s bucket never answered 429");
        let response = raw_get(&gateway, "/x", "acme-key-0001").await;
        if response.status == 429 {
            break response;
        }
        assert_eq!(response.status, 200);
        admitted += 1;
        assert_eq!(
            response.t(),
            Some(1),
            "a token comes back within 1 s: {}",
            response.header("ratelimit")
        );
        assert!(response.header("retry-after").is_empty());
    };
    assert!(admitted >= 10, "the burst of 10 was admitted: {admitted}");
    assert_eq!(rejected.secs("retry-after"), 1);
    assert_eq!(
        rejected.t(),
        Some(rejected.secs("retry-after")),
        "t of the violated policy is Retry-After: {}",
        rejected.header("ratelimit")
    );
    assert!(rejected.header("ratelimit").starts_with("\"tenant\";r=0;"));
    // X-RateLimit-Reset keeps its meaning: the bucket is full again ~10 s from now.
    let to_full = rejected.secs("x-ratelimit-reset") - rejected.date();
    assert!((9..=11).contains(&to_full), "full again in {to_full} s");
    assert_eq!(
        upstream.hit_count(),
        admitted,
        "the 429 never reached the upstream"
    );
    assert!(
        upstream
            .hits()
            .iter()
            .all(|hit| hit.headers["x-portcullis-tenant"] == "acme"),
        "every admitted request reached the upstream as acme's"
    );
}

const BUCKET_AND_DAILY_QUOTA: &str = "[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1\nper = \"60s\"\nburst = 1\ndaily_quota = 1\n";

/// A request refused by two policies at once names both in the draft's `violated-policies`
/// member; `policy`, `Retry-After` and the `RateLimit` field describe the longer wait.
#[tokio::test]
async fn the_429_names_every_violated_policy() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "{BUCKET_AND_DAILY_QUOTA}\n{}",
        single_route_config(&upstream.url(), "")
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let first = raw_get(&gateway, "/x", "acme-key-0001").await;
    assert_eq!(first.status, 200);
    let refused = raw_get(&gateway, "/x", "acme-key-0001").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), "application/problem+json");
    let body: serde_json::Value = serde_json::from_slice(&refused.body).expect("JSON body");
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["tenant", "daily_quota"]),
        "{body}"
    );
    // The daily quota waits until midnight, longer than the bucket's 60 s — unless the test
    // runs in the last minute of a UTC day, when the bucket's wait is the longer one.
    let retry_after = refused.secs("retry-after");
    let reported = body["policy"].as_str().unwrap_or_default();
    assert!(
        refused
            .header("ratelimit")
            .starts_with(&format!("\"{reported}\";r=0;")),
        "{}",
        refused.header("ratelimit")
    );
    assert_eq!(refused.t(), Some(retry_after), "t equals Retry-After");
    assert_eq!(body["retry_after"], retry_after);
    assert_eq!(
        upstream.hit_count(),
        1,
        "the refused request never reached the upstream"
    );
}
