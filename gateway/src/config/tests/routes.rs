//! Validation of the routing fields: each error names its field, valid ones are typed.

use std::time::Duration;

use super::{env, invalid_paths};
use crate::config::{Config, HeaderValueRule, HostRule, PathRule};

const UPSTREAM: &str =
    "[[upstreams]]\nname = \"orders\"\nendpoints = [\"http://127.0.0.1:9001\"]\n";

fn with_routes(routes: &str) -> String {
    format!("{UPSTREAM}\n{routes}\n")
}

#[test]
fn every_routing_field_is_parsed_into_its_rule() {
    let text = with_routes(
        r#"
[[routes]]
name = "orders-eu"
pattern = "/orders/{id}/items"
hosts = ["API.example.com", "*.example.com"]
methods = ["get", "POST"]
headers = [{ name = "X-Version", value = "2" }, { name = "x-tenant", regex = "^eu-" }]
timeout = "2s"
upstream = "orders"

[[routes]]
exact = "/health/deep"
rewrite = "/status"
upstream = "orders"

[[routes]]
prefix = "/legacy"
strip_prefix = true
upstream = "orders"
"#,
    );
    let config = Config::parse(&text, &env()).unwrap();
    let r = &config.routes[0];
    assert_eq!(r.name, "orders-eu");
    assert!(matches!(&r.path, PathRule::Pattern(p) if p.text() == "/orders/{id}/items"));
    assert_eq!(
        r.hosts,
        [
            HostRule::Exact("api.example.com".into()),
            HostRule::Wildcard(".example.com".into())
        ]
    );
    assert_eq!(r.methods, [http::Method::GET, http::Method::POST]);
    assert_eq!(r.headers[0].name, "x-version");
    assert!(matches!(&r.headers[0].value, HeaderValueRule::Exact(v) if &v[..] == b"2"));
    assert!(matches!(&r.headers[1].value, HeaderValueRule::Regex(_)));
    assert_eq!(r.retry.total(), Duration::from_secs(2));
    assert_eq!(config.routes[1].name, "/health/deep");
    assert_eq!(config.routes[1].rewrite.as_deref(), Some("/status"));
    assert_eq!(config.routes[2].rewrite.as_deref(), Some("/"));
    assert_eq!(config.routes[2].retry.total(), Duration::from_secs(30));
}

#[test]
fn routing_errors_name_their_field() {
    let cases: &[(&str, &[&str])] = &[
        ("upstream = \"orders\"", &["routes[0].prefix"]),
        (
            "prefix = \"/a\"\npattern = \"/a/{id}\"\nupstream = \"orders\"",
            &["routes[0].pattern"],
        ),
        ("pattern = \"/a/{id\"\nupstream = \"orders\"", &["routes[0].pattern"]),
        ("pattern = \"/a/{*rest}/b\"\nupstream = \"orders\"", &["routes[0].pattern"]),
        ("pattern = \"/a//{id}\"\nupstream = \"orders\"", &["routes[0].pattern"]),
        ("exact = \"/a/{id}\"\nupstream = \"orders\"", &["routes[0].exact"]),
        ("exact = \"/a/./b\"\nupstream = \"orders\"", &["routes[0].exact"]),
        (
            "prefix = \"/a\"\nhosts = [\"a.example.com:80\"]\nupstream = \"orders\"",
            &["routes[0].hosts[0]"],
        ),
        (
            "prefix = \"/a\"\nhosts = [\"ok.example.com\", \"*\"]\nupstream = \"orders\"",
            &["routes[0].hosts[1]"],
        ),
        (
            "prefix = \"/a\"\nmethods = [\"GET\", \"G E T\"]\nupstream = \"orders\"",
            &["routes[0].methods[1]"],
        ),
        (
            "prefix = \"/a\"\nheaders = [{ name = \"x\", regex = \"(\" }]\nupstream = \"orders\"",
            &["routes[0].headers[0].regex"],
        ),
        (
            "prefix = \"/a\"\nheaders = [{ name = \"x\", value = \"1\", regex = \"1\" }]\nupstream = \"orders\"",
            &["routes[0].headers[0].regex"],
        ),
        (
            "prefix = \"/a\"\nheaders = [{ name = \"bad name\", value = \"1\" }]\nupstream = \"orders\"",
            &["routes[0].headers[0].name"],
        ),
        (
            "prefix = \"/a\"\nheaders = [{ name = \"x\" }]\nupstream = \"orders\"",
            &["routes[0].headers[0].value"],
        ),
        (
            "prefix = \"/a\"\nrewrite = \"/b\"\nstrip_prefix = true\nupstream = \"orders\"",
            &["routes[0].rewrite"],
        ),
        ("prefix = \"/a\"\nrewrite = \"b\"\nupstream = \"orders\"", &["routes[0].rewrite"]),
        (
            "pattern = \"/a/{id}\"\nrewrite = \"/b\"\nupstream = \"orders\"",
            &["routes[0].rewrite"],
        ),
        (
            "pattern = \"/a/{id}\"\nstrip_prefix = true\nupstream = \"orders\"",
            &["routes[0].strip_prefix"],
        ),
        ("prefix = \"/a\"\ntimeout = \"31s\"\nupstream = \"orders\"", &["routes[0].timeout"]),
        ("prefix = \"/a\"\ntimeout = \"0s\"\nupstream = \"orders\"", &["routes[0].timeout"]),
        (
            "prefix = \"/a\"\ntimeout = \"1s\"\nretry = { total = \"2s\" }\nupstream = \"orders\"",
            &["routes[0].timeout"],
        ),
        ("prefix = \"/a\"\nname = \"\"\nupstream = \"orders\"", &["routes[0].name"]),
        ("prefix = \"/a\"\nname = \"has space\"\nupstream = \"orders\"", &["routes[0].name"]),
    ];
    for (route, want) in cases {
        let text = with_routes(&format!("[[routes]]\n{route}"));
        assert_eq!(invalid_paths(&text), *want, "{route}");
    }
}

#[test]
fn route_names_default_to_the_path_and_must_be_unique() {
    // Two routes on one prefix for different hosts: the host-bound one's default name says
    // its host; the catch-all keeps the path.
    let twice =
        "[[routes]]\nprefix = \"/orders\"\nhosts = [\"a.example.com\"]\nupstream = \"orders\"\n\
                 [[routes]]\nprefix = \"/orders\"\nupstream = \"orders\"";
    let config = Config::parse(&with_routes(twice), &env()).unwrap();
    assert_eq!(config.routes[0].name, "/orders@a.example.com");
    assert_eq!(config.routes[1].name, "/orders");
    // Twice the same path with nothing to tell them apart needs a name.
    let same = "[[routes]]\nprefix = \"/orders\"\nupstream = \"orders\"\n\
                [[routes]]\nprefix = \"/orders\"\nupstream = \"orders\"";
    assert_eq!(invalid_paths(&with_routes(same)), ["routes[1].prefix"]);
    let named = twice.replacen(
        "prefix = \"/orders\"\nupstream",
        "name = \"orders-any\"\nprefix = \"/orders\"\nupstream",
        1,
    );
    let config = Config::parse(&with_routes(&named), &env()).unwrap();
    assert_eq!(config.routes[0].name, "/orders");
    assert_eq!(config.routes[1].name, "orders-any");
    // An explicit name may not take another route's default one.
    let clash = "[[routes]]\nexact = \"/a\"\nupstream = \"orders\"\n\
                 [[routes]]\nname = \"/a\"\nprefix = \"/b\"\nupstream = \"orders\"";
    assert_eq!(invalid_paths(&with_routes(clash)), ["routes[1].name"]);
}
