//! The Grafana dashboard in `deploy/grafana/portcullis.json` loads (the fields Grafana needs:
//! panels with a type, a grid position, unique ids, targets with an `expr`), and every metric
//! its queries name is one a running gateway exports at `/metrics`.

use std::collections::BTreeSet;

use portcullis_testkit::gateway::{parse_status, raw_request};
use portcullis_testkit::otlp::OtlpCollector;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use super::{config, keyed_post, start};
use crate::common::client;

const DASHBOARD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/grafana/portcullis.json"
));

/// PromQL words that are not metric names.
const PROMQL: &[&str] = &[
    "sum",
    "rate",
    "irate",
    "increase",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "histogram_quantile",
    "topk",
    "bottomk",
    "clamp_min",
    "clamp_max",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "le",
];

/// The metric names an expression uses: identifiers outside `{…}` label matchers, `[…]`
/// ranges and `by (…)` groupings that are not PromQL words.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut outside = String::new();
    let mut depth = 0i32;
    for c in expr.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    // Drop `by (labels)` / `without (labels)` groupings.
    let mut cleaned = String::new();
    let mut rest = outside.as_str();
    while let Some(at) = rest.find("by (").or_else(|| rest.find("without (")) {
        cleaned.push_str(&rest[..at]);
        rest = rest[at..].split_once(')').map_or("", |(_, after)| after);
    }
    cleaned.push_str(rest);
    cleaned
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter(|w| !PROMQL.contains(w))
        .map(str::to_owned)
        .collect()
}

#[test]
fn metric_names_are_found_in_expressions() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le, dependency) (rate(x_seconds_bucket{a=\"b\"}[5m]))) / sum(y_total)",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["x_seconds_bucket", "y_total"]
    );
}

#[tokio::test]
async fn the_dashboard_loads_and_names_only_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    assert!(dashboard["schemaVersion"].is_u64());
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    for panel in panels {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} is unique");
        assert!(
            panel["type"].is_string() && panel["title"].is_string(),
            "{panel}"
        );
        for field in ["h", "w", "x", "y"] {
            assert!(
                panel["gridPos"][field].is_u64(),
                "gridPos.{field} in {panel}"
            );
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            let expr = target["expr"].as_str().expect("targets[].expr");
            assert!(target["refId"].is_string());
            used.extend(metric_names(expr));
        }
    }

    // Traffic that makes every series exist: a retried keyed POST, its replay, the key
    // reused for another body (422), a 429.
    let collector = OtlpCollector::start().await;
    let upstream = ScriptedUpstream::start(vec![Step::status(503), Step::ok("created")]).await;
    let text = config(&upstream, &collector, "").replace(
        "rate = 100\nper = \"1s\"\nburst = 100",
        "rate = 1\nper = \"1h\"\nburst = 3",
    );
    let gateway = start(&text).await;
    let other_body = String::from_utf8(keyed_post("-"))
        .unwrap()
        .replace("book", "pens");
    for (request, want) in [
        (keyed_post("-"), 200),
        (keyed_post("-"), 200),
        (other_body.into_bytes(), 422),
        (keyed_post("-"), 429),
    ] {
        let response = raw_request(gateway.addr, &request).await.unwrap();
        assert_eq!(parse_status(&response), Some(want));
    }
    let scrape = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<_> = used
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard names metrics the gateway does not export: {missing:?}\n{scrape}"
    );
}
