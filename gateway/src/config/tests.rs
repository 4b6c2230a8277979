use std::collections::HashMap;
use std::time::Duration;

use super::*;
use portcullis_retry::HedgeAfter;

// Routing fields: hosts, methods, headers, exact/pattern, rewrite, timeout, names.
mod delivery;
mod routes;

fn env() -> HashMap<String, String> {
    HashMap::new()
}

const MINIMAL: &str = r#"
[[upstreams]]
name = "orders"
endpoints = ["http://127.0.0.1:9001"]

[[routes]]
prefix = "/orders"
upstream = "orders"
"#;

fn invalid_paths(text: &str) -> Vec<String> {
    match Config::parse(text, &env()) {
        Ok(_) => panic!("accepted invalid config:\n{text}"),
        Err(e) => {
            let paths = e.paths();
            assert!(!paths.is_empty(), "error names no field: {e}");
            paths
        }
    }
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../../config/portcullis.example.toml");
    let config = Config::parse(text, &env()).expect("example config");
    assert_eq!(config.routes[0].name, "/demo");
    assert_eq!(config.routes[0].path, PathRule::Prefix("/demo".into()));
    assert!(config.demo.enabled);
    assert_eq!(config.upstreams[0].retry.max_retries(), 3);
}

#[test]
fn defaults_follow_seed_002() {
    let config = Config::parse(MINIMAL, &env()).expect("minimal config");
    let retry = &config.routes[0].retry;
    assert_eq!(retry.base(), Duration::from_secs(1));
    assert_eq!(retry.cap(), Duration::from_secs(30));
    assert_eq!(retry.max_retries(), 3);
    assert_eq!(retry.total(), Duration::from_secs(30));
    assert_eq!(retry.jitter(), portcullis_retry::Jitter::Full);
    assert_eq!(config.upstreams[0].budget.percent(), 20);
    assert_eq!(config.upstreams[0].budget.window(), Duration::from_secs(30));
    assert_eq!(config.storage.state, StateBackend::Memory);
}

#[test]
fn unknown_field_is_refused_with_its_path() {
    let paths = invalid_paths(&format!("{MINIMAL}\n[server]\nlisten_adress = \"x\"\n"));
    assert_eq!(paths, vec!["server.listen_adress".to_owned()]);
    let err = Config::parse("[server]\nlisten_adress = \"x\"\n", &env()).unwrap_err();
    assert!(err.to_string().contains("listen_adress"), "{err}");
}

#[test]
fn out_of_range_values_name_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "retry = { max_retries = 6 }",
            "upstreams[0].retry.max_retries",
        ),
        (
            "retry = { jitter = \"equal\" }",
            "upstreams[0].retry.jitter",
        ),
        ("retry = { total = \"45s\" }", "upstreams[0].retry.total"),
        (
            "retry = { base = \"2s\", cap = \"1s\" }",
            "upstreams[0].retry.cap",
        ),
        (
            "retry = { budget_percent = 60 }",
            "upstreams[0].retry.budget_percent",
        ),
        ("connect_timeout = \"10s\"", "upstreams[0].connect_timeout"),
        (
            "connect_timeout = \"100ms\"",
            "upstreams[0].connect_timeout",
        ),
        (
            "circuit_breaker = { failure_rate = 1.5 }",
            "upstreams[0].circuit_breaker.failure_rate",
        ),
        (
            "circuit_breaker = { min_callers = 0 }",
            "upstreams[0].circuit_breaker.min_callers",
        ),
        (
            "circuit_breaker = { min_callers = 11 }",
            "upstreams[0].circuit_breaker.min_callers",
        ),
    ];
    for (line, path) in cases {
        let text = format!(
            "[[upstreams]]\nname = \"orders\"\nendpoints = [\"http://127.0.0.1:9001\"]\n{line}\n"
        );
        let paths = invalid_paths(&text);
        assert!(
            paths.iter().any(|p| p == path),
            "{line}: expected {path}, got {paths:?}"
        );
    }
}

#[test]
fn cross_references_and_formats_are_checked() {
    let cases: &[(&str, &str)] = &[
        ("[server]\nlisten = \"localhost\"", "server.listen"),
        ("[storage]\nstate = \"mongodb://x\"", "storage.state"),
        ("[storage]\ndatabase = \"mysql://x\"", "storage.database"),
        ("[storage]\npostgres_pool_size = 0", "storage.postgres_pool_size"),
        ("[rate_limit]\non_store_error = \"maybe\"", "rate_limit.on_store_error"),
        ("[[routes]]\nprefix = \"/x\"\nupstream = \"nope\"", "routes[0].upstream"),
        ("[[routes]]\nprefix = \"x\"\nupstream = \"orders\"", "routes[0].prefix"),
        ("[[upstreams]]\nname = \"b\"\nendpoints = [\"ftp://h:1\"]", "upstreams[1].endpoints[0]"),
        ("[[upstreams]]\nname = \"b\"\nendpoints = []", "upstreams[1].endpoints"),
        ("[[tenants]]\nid = \"t\"\nrate = 0\nper = \"1s\"\nburst = 1", "tenants[0].rate"),
        ("[[tenants]]\nid = \"t\"\nrate = 1\nper = \"soon\"\nburst = 1", "tenants[0].per"),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nidempotency = { ttl = \"1h\" }",
            "routes[0].idempotency.ttl",
        ),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nidempotency = { max_key_length = 300 }",
            "routes[0].idempotency.max_key_length",
        ),
        ("[server]\ncritical_reserve = 0.95", "server.critical_reserve"),
        ("[server]\ncritical_reserve = -0.1", "server.critical_reserve"),
        ("[server]\ncritical_reserve = nan", "server.critical_reserve"),
        ("[server]\ncaller_share = 0.0", "server.caller_share"),
        ("[server]\ncaller_share = 1.5", "server.caller_share"),
        ("[server]\ncaller_share = nan", "server.caller_share"),
        ("[server]\nresponse_buffer_bytes = 1024", "server.response_buffer_bytes"),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nconcurrency_per_caller = 0",
            "routes[0].concurrency_per_caller",
        ),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\npriority = \"urgent\"",
            "routes[0].priority",
        ),
        (
            "[[tenants]]\nid = \"t\"\nrate = 1\nper = \"1s\"\nburst = 1\nconcurrency_limit = 100001",
            "tenants[0].concurrency_limit",
        ),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nwebsocket_idle_timeout = \"1m\"",
            "routes[0].websocket_idle_timeout",
        ),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nwebsocket = true\nmax_websockets = 0",
            "routes[0].max_websockets",
        ),
        (
            "[[routes]]\nprefix = \"/y\"\nupstream = \"orders\"\nwebsocket = true\nwebsocket_max_lifetime = \"0s\"",
            "routes[0].websocket_max_lifetime",
        ),
        (
            "[[upstreams]]\nname = \"grpc\"\nendpoints = [\"http://127.0.0.1:9002\"]\nhttp2 = true\n[[routes]]\nprefix = \"/y\"\nupstream = \"grpc\"\nwebsocket = true",
            "routes[0].websocket",
        ),
        (
            "[[tenants]]\nid = \"t\"\nrate = 1\nper = \"1s\"\nburst = 1\nmax_websockets = 0",
            "tenants[0].max_websockets",
        ),
    ];
    let base = "[[upstreams]]\nname = \"orders\"\nendpoints = [\"http://127.0.0.1:9001\"]\n";
    for (snippet, path) in cases {
        let text = if snippet.starts_with("[[upstreams]]")
            || snippet.starts_with("[[routes]]")
            || snippet.starts_with("[[tenants]]")
        {
            format!("{base}\n{snippet}\n")
        } else {
            format!("{snippet}\n\n{base}")
        };
        let paths = invalid_paths(&text);
        assert!(
            paths.iter().any(|p| p == path),
            "{snippet}: expected {path}, got {paths:?}"
        );
    }
}

#[test]
fn every_issue_is_reported_at_once() {
    let text = "[[upstreams]]\nname = \"o\"\nendpoints = [\"http://127.0.0.1:1\"]\nretry = { max_retries = 9, jitter = \"fixed\" }\n";
    let paths = invalid_paths(text);
    assert!(paths.contains(&"upstreams[0].retry.max_retries".to_owned()));
    assert!(paths.contains(&"upstreams[0].retry.jitter".to_owned()));
}

#[test]
fn secrets_are_redacted() {
    let text = format!(
        "{MINIMAL}\n[storage]\ndatabase = \"postgres://u:hunter2@127.0.0.1/db\"\n\n[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-secret-key\"]\nrate = 1\nper = \"1s\"\nburst = 1\n"
    );
    let mut env = env();
    env.insert(ENV_ADMIN_TOKEN.into(), "an-admin-token-long-enough".into());
    let config = Config::parse(&text, &env).expect("valid");
    let shown = format!("{config:?}");
    for secret in ["hunter2", "acme-secret-key", "an-admin-token-long-enough"] {
        assert!(!shown.contains(secret), "{secret} leaked in Debug");
    }
    let effective = effective_toml(&text).expect("effective");
    assert!(
        !effective.contains("hunter2") && !effective.contains("acme-secret-key"),
        "{effective}"
    );
    assert!(
        effective.contains("max_retries = 3"),
        "defaults are filled in: {effective}"
    );
}

#[test]
fn route_retry_overrides_inherit_the_rest_and_refuse_budget_fields() {
    let text = format!("{MINIMAL}retry = {{ max_retries = 1 }}\n");
    let config = Config::parse(&text, &env()).expect("valid");
    assert_eq!(config.routes[0].retry.max_retries(), 1);
    assert_eq!(config.routes[0].retry.total(), Duration::from_secs(30));
    let paths = invalid_paths(&format!("{MINIMAL}retry = {{ budget_percent = 10 }}\n"));
    assert!(paths[0].starts_with("routes[0].retry"), "{paths:?}");
    let paths = invalid_paths(&format!("{MINIMAL}retry = {{ max_retries = 7 }}\n"));
    assert_eq!(paths, vec!["routes[0].retry.max_retries".to_owned()]);
}

#[test]
fn route_cost_above_an_enforced_burst_is_refused() {
    let text = format!(
        "{MINIMAL}cost = 5\n\n[rate_limit]\nanonymous = {{ rate = 1, per = \"1s\", burst = 2 }}\n"
    );
    assert_eq!(invalid_paths(&text), vec!["routes[0].cost".to_owned()]);
    let shadow = format!("{MINIMAL}cost = 5\n\n[rate_limit]\nanonymous = {{ rate = 1, per = \"1s\", burst = 2, shadow = true }}\n");
    assert!(
        Config::parse(&shadow, &env()).is_ok(),
        "a shadow bucket never rejects"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Arbitrary text never panics the loader; a refusal always names where.
    #[test]
    fn arbitrary_text_is_refused_cleanly(text in "\\PC{0,200}") {
        if let Err(e) = Config::parse(&text, &env()) {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Any value spliced into a known field is accepted or refused with that field's path.
    #[test]
    fn bad_values_name_their_field(value in "[a-z0-9\"]{0,12}", field in 0usize..5) {
        let names = ["max_body_bytes", "load_shed_limit", "listen", "shutdown_grace", "log_format"];
        let text = format!("[server]\n{} = {}\n", names[field], value);
        if let Err(e) = Config::parse(&text, &env()) {
            let shown = e.to_string();
            proptest::prop_assert!(shown.contains("server") || shown.contains("<root>"), "{}", shown);
        }
    }
}

#[test]
fn buckets_the_limiter_cannot_enforce_are_refused() {
    // More than one token per nanosecond.
    let text = "[rate_limit]\nglobal = { rate = 2000000000, per = \"1s\", burst = 10 }\n";
    assert_eq!(invalid_paths(text), vec!["rate_limit.global".to_owned()]);
}

#[test]
fn route_prefixes_must_be_in_the_normal_form_requests_are_matched_in() {
    for prefix in ["/api//v1", "/a/./b", "/%7euser", "/a/%2e%2e/b", "/a%2Fb"] {
        let text = MINIMAL.replace("prefix = \"/orders\"", &format!("prefix = {prefix:?}"));
        assert_eq!(invalid_paths(&text), ["routes[0].prefix"], "{prefix}");
    }
    let text = MINIMAL.replace("prefix = \"/orders\"", "prefix = \"/api/v1/\"");
    assert!(Config::parse(&text, &env()).is_ok());
}

#[test]
fn batched_sync_and_its_overshoot_are_validated() {
    let text = "[rate_limit]\nsync = \"batched\"\nmax_overshoot = 0.1\nreplicas = 3\n";
    let config = Config::parse(text, &env()).unwrap();
    assert_eq!(
        config.rate_limit.sync,
        SyncMode::Batched { max_overshoot: 0.1 }
    );
    assert_eq!(
        Config::parse("", &env()).unwrap().rate_limit.sync,
        SyncMode::Exact
    );
    let text = "[rate_limit]\nsync = \"lazy\"\n";
    assert_eq!(invalid_paths(text), vec!["rate_limit.sync".to_owned()]);
    for bad in ["0.0", "-0.5", "1.5", "nan", "inf"] {
        let text = format!("[rate_limit]\nsync = \"batched\"\nmax_overshoot = {bad}\n");
        assert_eq!(
            invalid_paths(&text),
            vec!["rate_limit.max_overshoot".to_owned()],
            "{bad}"
        );
    }
}

#[test]
fn an_auto_attempt_timeout_and_its_bounds_are_validated() {
    let auto = MINIMAL.replace(
        "endpoints = [\"http://127.0.0.1:9001\"]",
        "endpoints = [\"http://127.0.0.1:9001\"]\nattempt_timeout = \"auto\"\nattempt_timeout_floor = \"100ms\"\nattempt_timeout_max = \"3s\"",
    );
    let config = Config::parse(&auto, &env()).expect("auto");
    let params = config.upstreams[0].retry.params();
    assert_eq!(params.attempt_timeout, Duration::from_secs(3));
    assert_eq!(
        params.auto_attempt_timeout_floor,
        Some(Duration::from_millis(100))
    );
    assert_eq!(
        config.routes[0].retry.params().auto_attempt_timeout_floor,
        Some(Duration::from_millis(100))
    );

    let inverted = auto.replace(
        "attempt_timeout_floor = \"100ms\"",
        "attempt_timeout_floor = \"5s\"",
    );
    assert_eq!(
        invalid_paths(&inverted),
        ["upstreams[0].attempt_timeout_floor"]
    );
    let garbage = MINIMAL.replace(
        "endpoints = [\"http://127.0.0.1:9001\"]",
        "endpoints = [\"http://127.0.0.1:9001\"]\nattempt_timeout = \"soonish\"",
    );
    assert!(Config::parse(&garbage, &env()).is_err());
}

#[test]
fn a_route_hedge_is_a_percentile_or_a_short_delay() {
    let with = |after: &str| {
        MINIMAL.replace(
            "upstream = \"orders\"\n",
            &format!("upstream = \"orders\"\nhedge = {{ after = \"{after}\" }}\n"),
        )
    };
    let config = Config::parse(&with("p95"), &env()).expect("p95");
    assert_eq!(
        config.routes[0].retry.params().hedge_after,
        Some(HedgeAfter::Quantile(0.95))
    );
    let config = Config::parse(&with("40ms"), &env()).expect("40ms");
    assert_eq!(
        config.routes[0].retry.params().hedge_after,
        Some(HedgeAfter::Fixed(Duration::from_millis(40)))
    );
    for bad in ["p100", "p5", "soon", "0ms", "1m"] {
        assert_eq!(
            invalid_paths(&with(bad)),
            ["routes[0].hedge.after"],
            "{bad}"
        );
    }
}

#[test]
fn adaptive_is_off_by_default_and_true_or_a_table_turns_it_on() {
    let with = |value: &str| {
        MINIMAL.replace(
            "endpoints = [\"http://127.0.0.1:9001\"]",
            &format!("endpoints = [\"http://127.0.0.1:9001\"]\nadaptive = {value}"),
        )
    };
    let config = Config::parse(MINIMAL, &env()).unwrap();
    assert_eq!(config.upstreams[0].adaptive, None);
    let config = Config::parse(&with("false"), &env()).unwrap();
    assert_eq!(config.upstreams[0].adaptive, None);
    let config = Config::parse(&with("true"), &env()).unwrap();
    assert_eq!(
        config.upstreams[0].adaptive,
        Some(portcullis_retry::AdaptiveConfig::default())
    );
    // The effective file (`check-config`) prints both forms and reads them back.
    for value in ["false", "{ min_rate = 2, max_rate = 500 }"] {
        let raw: raw::RawConfig = toml::from_str(&with(value)).unwrap();
        let printed = toml::to_string(&raw).unwrap();
        assert!(Config::parse(&printed, &env()).is_ok(), "{printed}");
    }
    let config = Config::parse(&with("{ min_rate = 2, max_rate = 500 }"), &env()).unwrap();
    assert_eq!(
        config.upstreams[0].adaptive,
        Some(portcullis_retry::AdaptiveConfig::try_new(2.0, Some(500.0), 2.0).unwrap())
    );
    for (value, field) in [
        ("{ min_rate = 0 }", "upstreams[0].adaptive.min_rate"),
        (
            "{ min_rate = 5, max_rate = 1 }",
            "upstreams[0].adaptive.max_rate",
        ),
        (
            "{ latency_tolerance = 1.1 }",
            "upstreams[0].adaptive.latency_tolerance",
        ),
        ("{ min_rate = nan }", "upstreams[0].adaptive.min_rate"),
    ] {
        assert_eq!(
            invalid_paths(&with(value)),
            vec![field.to_owned()],
            "{value}"
        );
    }
    // Unknown fields and wrong types name the field too.
    let err = Config::parse(&with("{ rate = 5 }"), &env()).unwrap_err();
    assert!(err.to_string().contains("upstreams[0].adaptive"), "{err}");
    assert!(err.to_string().contains("rate"), "{err}");
    let err = Config::parse(&with("\"yes\""), &env()).unwrap_err();
    assert!(err.to_string().contains("upstreams[0].adaptive"), "{err}");
}

#[test]
fn the_old_max_in_flight_names_still_work_with_a_warning() {
    let text = "[server]\nmax_in_flight = 500\n\n[[tenants]]\nid = \"t\"\nrate = 1\nper = \"1s\"\nburst = 1\nmax_in_flight = 7\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9001\"]\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nmax_in_flight = 3\n";
    let config = Config::parse(text, &env()).unwrap();
    assert_eq!(config.server.load_shed_limit, 500);
    assert_eq!(config.tenants[0].concurrency_limit, Some(7));
    assert_eq!(config.routes[0].concurrency_per_caller, Some(3));
    let warnings: Vec<String> = config.renamed.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "server.max_in_flight is deprecated: use server.load_shed_limit (same meaning)",
            "tenants[0].max_in_flight is deprecated: use tenants[0].concurrency_limit (same meaning)",
            "routes[0].max_in_flight is deprecated: use routes[0].concurrency_per_caller (same meaning)",
        ]
    );
    let effective = super::effective_toml(text).unwrap();
    assert!(effective.contains("load_shed_limit = 500"), "{effective}");
    assert!(!effective.contains("max_in_flight"), "{effective}");
}

#[test]
fn an_old_and_a_new_name_together_are_refused() {
    let err = Config::parse(
        "[server]\nmax_in_flight = 500\nload_shed_limit = 600\n",
        &env(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("server.max_in_flight"), "{err}");
    assert!(err.contains("keep only server.load_shed_limit"), "{err}");
}

#[test]
fn routes_on_one_path_for_different_hosts_or_methods_need_no_name() {
    let text = "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9001\"]\n\n\
        [[routes]]\nprefix = \"/\"\nhosts = [\"API.example.com\"]\nupstream = \"u\"\n\n\
        [[routes]]\nprefix = \"/\"\nhosts = [\"admin.example.com\"]\nmethods = [\"get\", \"HEAD\"]\nupstream = \"u\"\n\n\
        [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n\n\
        [[routes]]\nprefix = \"/orders\"\nhosts = [\"api.example.com\"]\nupstream = \"u\"\n";
    let config = Config::parse(text, &env()).unwrap();
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "/@api.example.com",
            "/@admin.example.com#GET,HEAD",
            "/",
            "/orders"
        ],
        "qualified only where the path is shared; the catch-all and a unique path stay plain"
    );
}

#[test]
fn routes_that_differ_only_in_headers_still_need_a_name() {
    let text = "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9001\"]\n\n\
        [[routes]]\nprefix = \"/\"\nupstream = \"u\"\nheaders = [{ name = \"x-v\", value = \"2\" }]\n\n\
        [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n";
    let err = Config::parse(text, &env()).unwrap_err().to_string();
    assert!(err.contains("routes[1].prefix"), "{err}");
    assert!(err.contains("give one of them a `name`"), "{err}");
}
