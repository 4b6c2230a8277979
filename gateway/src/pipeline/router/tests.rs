//! Matching and precedence, on tables built from configuration text as the binary builds
//! them.

use std::collections::HashMap;

use http::{HeaderMap, Method};

use super::*;
use crate::config::Config;

fn table(routes: &str) -> RouteTable {
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9001\"]\n\n{routes}\n"
    );
    let config = match Config::parse(&text, &HashMap::<String, String>::new()) {
        Ok(config) => config,
        Err(e) => panic!("{e}\n{text}"),
    };
    let states: Vec<_> = crate::start::upstreams(&config)
        .iter()
        .map(|u| u.state().clone())
        .collect();
    RouteTable::new(&config.routes, &states)
}

/// A request: `"GET api.example.com /orders/7"`, host `-` for none; `headers` as `name: value`.
fn lookup(table: &RouteTable, line: &str, headers: &[(&str, &str)]) -> Result<String, String> {
    let mut parts = line.splitn(3, ' ');
    let (Some(method), Some(host), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("bad request line {line:?}");
    };
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let request = RouteRequest {
        method: &method,
        authority: (host != "-").then_some(host.as_bytes()),
        path,
        headers: &map,
    };
    match table.find(&request) {
        Lookup::Route(route) => Ok(route.settings.name.clone()),
        Lookup::MethodNotAllowed => Err(format!(
            "405 {}",
            table
                .allowed_methods(&request)
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(",")
        )),
        Lookup::NotFound => Err("404".into()),
    }
}

fn route_of(table: &RouteTable, line: &str) -> String {
    lookup(table, line, &[]).unwrap_or_else(|e| e)
}

#[test]
fn prefixes_keep_todays_longest_segment_boundary_rule() {
    let t = table(
        r#"
[[routes]]
prefix = "/"
upstream = "u"
[[routes]]
prefix = "/orders"
upstream = "u"
[[routes]]
prefix = "/orders/archive/"
upstream = "u"
[[routes]]
prefix = "/secure"
upstream = "u"
"#,
    );
    for (line, want) in [
        ("GET - /orders", "/orders"),
        ("GET - /orders/7", "/orders"),
        ("GET - /ordersx", "/"),
        ("GET - /orders/archive", "/orders"),
        ("GET - /orders/archive/", "/orders/archive/"),
        ("GET - /orders/archive/2020", "/orders/archive/"),
        ("GET - /secure;jsessionid=1/pay", "/secure"),
        ("GET - /secure;x", "/secure"),
        ("GET - /", "/"),
    ] {
        assert_eq!(route_of(&t, line), want, "{line}");
    }
    let no_root = table("[[routes]]\nprefix = \"/orders\"\nupstream = \"u\"");
    assert_eq!(route_of(&no_root, "GET - /"), "404");
    assert_eq!(route_of(&no_root, "GET - /ordersx"), "404");
}

#[test]
fn exact_beats_pattern_beats_prefix_and_patterns_rank_by_literals() {
    let t = table(
        r#"
[[routes]]
prefix = "/orders"
upstream = "u"
[[routes]]
pattern = "/orders/{id}"
upstream = "u"
[[routes]]
pattern = "/{kind}/{id}"
upstream = "u"
[[routes]]
pattern = "/{kind}/new"
upstream = "u"
[[routes]]
exact = "/orders/new"
upstream = "u"
[[routes]]
pattern = "/orders/{id}/items"
upstream = "u"
[[routes]]
pattern = "/orders/{*rest}"
upstream = "u"
"#,
    );
    for (line, want) in [
        ("GET - /orders/new", "/orders/new"),
        ("GET - /orders/7", "/orders/{id}"),
        ("GET - /orders/7;v=2", "/orders/{id}"),
        ("GET - /carts/7", "/{kind}/{id}"),
        // One literal each: the earlier literal wins.
        ("GET - /carts/new", "/{kind}/new"),
        ("GET - /orders/7/items", "/orders/{id}/items"),
        // A fixed-length pattern before `{*rest}`; `{*rest}` before a prefix.
        ("GET - /orders/7/items/3", "/orders/{*rest}"),
        ("GET - /orders", "/orders"),
        // `{name}` needs a non-empty segment, `{*rest}` at least one.
        ("GET - /orders/", "/orders"),
        ("GET - /carts", "404"),
    ] {
        assert_eq!(route_of(&t, line), want, "{line}");
    }
}

#[test]
fn hosts_exact_then_longest_wildcard_then_none_with_fall_through() {
    let t = table(
        r#"
[[routes]]
name = "any"
prefix = "/"
upstream = "u"
[[routes]]
name = "wild"
prefix = "/"
hosts = ["*.example.com"]
upstream = "u"
[[routes]]
name = "wild-eu"
prefix = "/"
hosts = ["*.eu.example.com"]
upstream = "u"
[[routes]]
name = "api"
prefix = "/api"
hosts = ["api.example.com", "API2.example.com"]
upstream = "u"
[[routes]]
name = "exact-any-host"
exact = "/api/special"
upstream = "u"
"#,
    );
    for (line, want) in [
        ("GET api.example.com /api/x", "api"),
        ("GET API.Example.COM /api/x", "api"),
        ("GET api.example.com. /api/x", "api"),
        ("GET api.example.com:8443 /api/x", "api"),
        ("GET api.example.com.:8443 /api/x", "api"),
        ("GET api2.example.com /api", "api"),
        // The host comes first: a host's prefix beats an exact path without hosts.
        ("GET api.example.com /api/special", "api"),
        // Its other paths fall through to the wildcard.
        ("GET api.example.com /web", "wild"),
        ("GET shop.example.com /api/x", "wild"),
        ("GET a.b.example.com /", "wild"),
        ("GET x.eu.example.com /", "wild-eu"),
        ("GET x.y.eu.example.com /", "wild-eu"),
        // A wildcard needs one more label.
        ("GET example.com /", "any"),
        ("GET eu.example.com /", "wild"),
        ("GET api.example.com.evil.net /api/x", "any"),
        ("GET evilapi.example.com /api/x", "wild"),
        ("GET other.net /api/special", "exact-any-host"),
        ("GET - /api/x", "any"),
        ("GET [::1]:8080 /api/x", "any"),
    ] {
        assert_eq!(route_of(&t, line), want, "{line}");
    }
}

#[test]
fn headers_then_methods_then_file_order_break_ties() {
    let t = table(
        r#"
[[routes]]
name = "plain"
prefix = "/orders"
upstream = "u"
[[routes]]
name = "v2"
prefix = "/orders"
headers = [{ name = "x-version", value = "2" }]
upstream = "u"
[[routes]]
name = "v2-eu"
prefix = "/orders"
headers = [{ name = "x-version", value = "2" }, { name = "x-tenant", regex = "^eu-" }]
upstream = "u"
[[routes]]
name = "get-only"
prefix = "/orders"
methods = ["GET"]
upstream = "u"
[[routes]]
name = "longer"
prefix = "/orders/archive"
upstream = "u"
"#,
    );
    let get = "GET - /orders/1";
    assert_eq!(lookup(&t, get, &[]).unwrap(), "get-only");
    assert_eq!(lookup(&t, "POST - /orders/1", &[]).unwrap(), "plain");
    assert_eq!(lookup(&t, get, &[("x-version", "2")]).unwrap(), "v2");
    assert_eq!(lookup(&t, get, &[("x-version", "3")]).unwrap(), "get-only");
    assert_eq!(
        lookup(&t, get, &[("x-version", "2"), ("x-tenant", "eu-west")]).unwrap(),
        "v2-eu"
    );
    assert_eq!(
        lookup(&t, get, &[("x-version", "2"), ("x-tenant", "us-eu-1")]).unwrap(),
        "v2"
    );
    // Path length comes before header matchers.
    assert_eq!(
        lookup(&t, "GET - /orders/archive/1", &[("x-version", "2")]).unwrap(),
        "longer"
    );
    // A header sent twice matches no header condition.
    assert_eq!(
        lookup(&t, get, &[("x-version", "2"), ("x-version", "2")]).unwrap(),
        "get-only"
    );
}

#[test]
fn method_mismatch_is_405_only_when_nothing_else_matches() {
    let t = table(
        r#"
[[routes]]
exact = "/orders"
methods = ["GET", "HEAD"]
upstream = "u"
[[routes]]
name = "orders-post"
pattern = "/orders"
methods = ["POST"]
upstream = "u"
[[routes]]
prefix = "/items"
methods = ["DELETE"]
headers = [{ name = "x-admin", value = "1" }]
upstream = "u"
[[routes]]
prefix = "/open"
upstream = "u"
[[routes]]
name = "open-get"
exact = "/open/x"
methods = ["GET"]
upstream = "u"
"#,
    );
    assert_eq!(route_of(&t, "GET - /orders"), "/orders");
    assert_eq!(route_of(&t, "POST - /orders"), "orders-post");
    assert_eq!(route_of(&t, "PUT - /orders"), "405 GET,HEAD,POST");
    // A route whose headers do not match does not count for 405.
    assert_eq!(route_of(&t, "GET - /items/1"), "404");
    assert_eq!(
        lookup(&t, "GET - /items/1", &[("x-admin", "1")]),
        Err("405 DELETE".into())
    );
    // Another route matches: it serves the request.
    assert_eq!(route_of(&t, "POST - /open/x"), "/open");
}

#[test]
fn lookups_are_bounded_on_many_routes() {
    // 1 000 routes of every kind, on three hosts: each lookup still finds its own.
    let mut text = String::new();
    for i in 0..1000 {
        let host = match i % 4 {
            0 => "hosts = [\"api.example.com\"]\n",
            1 => "hosts = [\"*.example.com\"]\n",
            _ => "",
        };
        let path = match i % 3 {
            0 => format!("prefix = \"/svc{i}\""),
            1 => format!("exact = \"/svc{i}/status\""),
            _ => format!("pattern = \"/svc{i}/{{id}}/items\""),
        };
        text.push_str(&format!("[[routes]]\n{path}\n{host}upstream = \"u\"\n"));
    }
    let t = table(&text);
    assert_eq!(route_of(&t, "GET api.example.com /svc0/x"), "/svc0");
    assert_eq!(
        route_of(&t, "GET a.example.com /svc1/status"),
        "/svc1/status"
    );
    assert_eq!(route_of(&t, "GET - /svc2/7/items"), "/svc2/{id}/items");
    assert_eq!(route_of(&t, "GET - /svc0/x"), "404");
    assert_eq!(route_of(&t, "GET - /svc998/7/items"), "/svc998/{id}/items");
}
