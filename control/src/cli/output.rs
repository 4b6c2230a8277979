//! The admin CLI's output: plain aligned text tables (no colours, so output pipes cleanly
//! into `grep`/`awk`).

use serde_json::Value;

/// A JSON value as a table cell: strings bare, `null` as `-`.
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders `rows` under `headers`, columns padded to their widest cell.
pub(super) fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let width = widths.get(i).copied().unwrap_or(0);
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Prints a table to stdout.
pub(super) fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    print!("{}", render(headers, &rows));
}

pub(super) fn print_tenants(tenants: &[Value]) {
    let rows = tenants
        .iter()
        .map(|t| {
            let state = if t["disabled"].as_bool() == Some(true) {
                "disabled"
            } else {
                "active"
            };
            vec![
                text(&t["id"]),
                text(&t["name"]),
                state.to_owned(),
                text(&t["rate"]),
                text(&t["per"]),
                text(&t["burst"]),
                text(&t["daily_quota"]),
                text(&t["monthly_quota"]),
                text(&t["max_in_flight"]),
                text(&t["max_websockets"]),
                text(&t["websocket_idle_timeout"]),
                text(&t["websocket_max_lifetime"]),
                t["route_quotas"].as_array().map_or(0, Vec::len).to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "NAME",
            "STATE",
            "RATE",
            "PER",
            "BURST",
            "DAILY",
            "MONTHLY",
            "MAX IN FLIGHT",
            "MAX WEBSOCKETS",
            "WS IDLE",
            "WS LIFETIME",
            "ROUTE OVERRIDES",
        ],
        rows,
    );
}

pub(super) fn print_keys(keys: &[Value]) {
    let rows = keys
        .iter()
        .map(|k| {
            vec![
                text(&k["id"]),
                text(&k["tenant"]),
                format!("{}…", text(&k["prefix"])),
                text(&k["created_at"]),
                text(&k["revoked_at"]),
            ]
        })
        .collect();
    print_table(&["ID", "TENANT", "PREFIX", "CREATED", "REVOKED"], rows);
}

pub(super) fn print_quota(quota: &Value) {
    let mut rows = vec![vec![
        "(tenant)".to_owned(),
        text(&quota["rate"]),
        text(&quota["per"]),
        text(&quota["burst"]),
        text(&quota["daily_quota"]),
        text(&quota["monthly_quota"]),
        text(&quota["max_in_flight"]),
        text(&quota["max_websockets"]),
        text(&quota["websocket_idle_timeout"]),
        text(&quota["websocket_max_lifetime"]),
    ]];
    for r in quota["route_quotas"].as_array().into_iter().flatten() {
        rows.push(vec![
            text(&r["route"]),
            text(&r["rate"]),
            text(&r["per"]),
            text(&r["burst"]),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
        ]);
    }
    println!("Tenant {}", text(&quota["tenant"]));
    print_table(
        &[
            "ROUTE",
            "RATE",
            "PER",
            "BURST",
            "DAILY",
            "MONTHLY",
            "MAX IN FLIGHT",
            "MAX WEBSOCKETS",
            "WS IDLE",
            "WS LIFETIME",
        ],
        rows,
    );
}

pub(super) fn print_upstreams(list: &Value) {
    for upstream in list["upstreams"].as_array().into_iter().flatten() {
        println!(
            "Upstream {} ({}): {} healthy, breaker {}{}",
            text(&upstream["name"]),
            text(&upstream["load_balancer"]),
            text(&upstream["healthy_endpoints"]),
            text(&upstream["circuit_breaker"]),
            if upstream["panic"].as_bool() == Some(true) {
                ", PANIC (balancing over all endpoints)"
            } else {
                ""
            }
        );
        let latency = &upstream["latency"];
        if latency.is_object() {
            println!(
                "  latency p50 {} ms, p99 {} ms, p99.9 {} ms ({} attempts); attempt_timeout {} ms, recommended {} ms",
                text(&latency["p50_ms"]),
                text(&latency["p99_ms"]),
                text(&latency["p999_ms"]),
                text(&latency["samples"]),
                text(&upstream["attempt_timeout_ms"]),
                text(&latency["recommended_attempt_timeout_ms"]),
            );
        } else {
            println!(
                "  latency: fewer than 100 attempts measured; attempt_timeout {} ms",
                text(&upstream["attempt_timeout_ms"])
            );
        }
        let rows = upstream["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let state = match e["ejected_for_ms"].as_u64() {
                    Some(ms) => format!("{} ({ms} ms)", text(&e["state"])),
                    None => text(&e["state"]),
                };
                vec![
                    text(&e["url"]),
                    text(&e["host"]),
                    text(&e["weight"]),
                    state,
                    text(&e["ejections"]),
                    text(&e["consecutive_failures"]),
                    text(&e["in_flight"]),
                ]
            })
            .collect();
        print_table(
            &[
                "ENDPOINT",
                "HOST",
                "WEIGHT",
                "STATE",
                "EJECTIONS",
                "FAILURES",
                "IN FLIGHT",
            ],
            rows,
        );
    }
}

pub(super) fn print_usage(usage: &Value) {
    println!(
        "Tenant {}: {} rejected (429) by this replica",
        text(&usage["tenant"]),
        text(&usage["rejected_total"])
    );
    let buckets = usage["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            vec![
                text(&b["policy"]),
                text(&b["route"]),
                text(&b["limit"]),
                text(&b["remaining"]),
                format!("{}s", text(&b["reset_after_secs"])),
            ]
        })
        .collect();
    print_table(
        &["BUCKET", "ROUTE", "LIMIT", "REMAINING", "FULL IN"],
        buckets,
    );
    let periods: Vec<Vec<String>> = usage["periods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                text(&p["period"]),
                text(&p["limit"]),
                text(&p["used"]),
                format!("{}s", text(&p["resets_in_secs"])),
            ]
        })
        .collect();
    if !periods.is_empty() {
        println!();
        print_table(&["PERIOD", "LIMIT", "USED", "RESETS IN"], periods);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let out = render(
            &["ID", "RATE"],
            &[
                vec!["acme".into(), "100".into()],
                vec!["a".into(), "5".into()],
            ],
        );
        assert_eq!(out, "ID    RATE\nacme  100\na     5\n");
        assert_eq!(text(&Value::Null), "-");
        assert_eq!(text(&Value::from("x")), "x");
        assert_eq!(text(&Value::from(3)), "3");
    }
}
