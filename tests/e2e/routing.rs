//! Routing through the real binary, over raw sockets: hosts (exact, wildcard, none), headers
//! (exact and regex), methods and 405, exact > pattern > prefix, rewrite, per-route timeout,
//! and oddly spelled hosts and paths that must not reach a route they do not name. Each
//! scripted upstream answers with its own name; the tests assert what each upstream
//! received, not only what the client saw.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

/// The three upstreams that answer, and one that never does (within the test).
struct Upstreams {
    a: ScriptedUpstream,
    b: ScriptedUpstream,
    c: ScriptedUpstream,
    silent: ScriptedUpstream,
}

impl Upstreams {
    async fn start() -> Self {
        Self {
            a: ScriptedUpstream::start_with_fallback(vec![], Step::ok("from-a")).await,
            b: ScriptedUpstream::start_with_fallback(vec![], Step::ok("from-b")).await,
            c: ScriptedUpstream::start_with_fallback(vec![], Step::ok("from-c")).await,
            silent: ScriptedUpstream::start_with_fallback(
                vec![],
                Step::stall(Duration::from_secs(60), Step::ok("too-late")),
            )
            .await,
        }
    }

    /// Paths every answering upstream received, as `a:/path`.
    fn received(&self) -> Vec<String> {
        let mut all = Vec::new();
        for (name, upstream) in [("a", &self.a), ("b", &self.b), ("c", &self.c)] {
            for hit in upstream.hits() {
                all.push(format!("{name}:{}", hit.uri));
            }
        }
        all
    }

    fn total(&self) -> usize {
        self.a.hit_count() + self.b.hit_count() + self.c.hit_count() + self.silent.hit_count()
    }
}

fn config(u: &Upstreams) -> String {
    let upstream = |name: &str, s: &ScriptedUpstream| {
        format!(
            "[[upstreams]]\nname = \"{name}\"\nendpoints = [\"{}\"]\nattempt_timeout = \"20s\"\nretry = {{ max_retries = 0 }}\n\n",
            s.url()
        )
    };
    let mut text = String::new();
    text.push_str(&upstream("a", &u.a));
    text.push_str(&upstream("b", &u.b));
    text.push_str(&upstream("c", &u.c));
    text.push_str(&upstream("silent", &u.silent));
    text.push_str(
        r#"
[[routes]]
name = "api-host"
prefix = "/"
hosts = ["api.example.com"]
upstream = "b"

[[routes]]
name = "any-example"
prefix = "/"
hosts = ["*.example.com"]
upstream = "c"

[[routes]]
name = "internal-admin"
prefix = "/admin"
hosts = ["admin.internal"]
upstream = "b"

[[routes]]
prefix = "/orders"
upstream = "a"

[[routes]]
name = "orders-v2"
prefix = "/orders"
headers = [{ name = "x-version", value = "2" }]
upstream = "b"

[[routes]]
name = "orders-eu"
prefix = "/orders"
headers = [{ name = "x-tenant", regex = "^eu-" }]
upstream = "c"

[[routes]]
pattern = "/orders/{id}/items"
upstream = "b"

[[routes]]
exact = "/orders/special"
upstream = "c"

[[routes]]
exact = "/reports"
methods = ["GET", "HEAD"]
upstream = "a"

[[routes]]
prefix = "/api"
rewrite = "/v2"
upstream = "a"

[[routes]]
prefix = "/legacy"
strip_prefix = true
upstream = "a"

[[routes]]
prefix = "/slow"
timeout = "300ms"
upstream = "silent"
"#,
    );
    text
}

/// An answer read off the socket: status, lower-cased head, body.
struct Answer {
    status: Option<u16>,
    head: String,
    body: String,
}

/// `method target` with `Host: host` and `extra` header lines, on a fresh connection.
async fn send(
    gateway: &GatewayProcess,
    method: &str,
    host: &str,
    target: &str,
    extra: &str,
) -> Answer {
    let request =
        format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    let raw = raw_request(gateway.addr, request.as_bytes())
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status: parse_status(&raw),
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

async fn gateway(u: &Upstreams) -> GatewayProcess {
    GatewayProcess::start(BIN, &config(u)).await
}

#[tokio::test]
async fn hosts_pick_their_upstream_exact_then_wildcard_then_none() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let local = gw.addr.to_string();
    for (host, want) in [
        ("api.example.com", "from-b"),
        // Case, port and a trailing dot do not change the host.
        ("API.Example.COM.:8443", "from-b"),
        ("shop.example.com", "from-c"),
        ("a.b.example.com", "from-c"),
        (local.as_str(), "from-a"),
    ] {
        let answer = send(&gw, "GET", host, "/orders/1", "").await;
        assert_eq!(answer.status, Some(200), "{host}: {}", answer.head);
        assert!(answer.body.contains(want), "{host}: {}", answer.body);
    }
    assert_eq!(
        u.received(),
        [
            "a:/orders/1",
            "b:/orders/1",
            "b:/orders/1",
            "c:/orders/1",
            "c:/orders/1"
        ]
    );
}

#[tokio::test]
async fn headers_pick_their_upstream_exact_value_and_regex() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    for (extra, want) in [
        ("", "from-a"),
        ("x-version: 2\r\n", "from-b"),
        ("x-version: 20\r\n", "from-a"),
        ("x-tenant: eu-west-1\r\n", "from-c"),
        ("x-tenant: us-eu-1\r\n", "from-a"),
        // A repeated field matches no header condition.
        ("x-version: 2\r\nx-version: 2\r\n", "from-a"),
    ] {
        let answer = send(&gw, "GET", &host, "/orders/1", extra).await;
        assert_eq!(answer.status, Some(200), "{extra:?}");
        assert!(answer.body.contains(want), "{extra:?}: {}", answer.body);
    }
    let b = u.b.hits();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].headers["x-version"], "2");
    let c = u.c.hits();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].headers["x-tenant"], "eu-west-1");
    assert_eq!(u.a.hit_count(), 4);
}

#[tokio::test]
async fn exact_beats_pattern_beats_prefix() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    for (path, want) in [
        ("/orders/special", "from-c"),
        ("/orders/7/items", "from-b"),
        // Matrix parameters do not hide a segment from the pattern.
        ("/orders/7;v=1/items", "from-b"),
        ("/orders/7/items/3", "from-a"),
        ("/orders/7", "from-a"),
    ] {
        let answer = send(&gw, "GET", &host, path, "").await;
        assert_eq!(answer.status, Some(200), "{path}");
        assert!(answer.body.contains(want), "{path}: {}", answer.body);
    }
    assert_eq!(
        u.received(),
        [
            "a:/orders/7/items/3",
            "a:/orders/7",
            "b:/orders/7/items",
            "b:/orders/7;v=1/items",
            "c:/orders/special"
        ]
    );
}

#[tokio::test]
async fn a_method_no_route_allows_is_405_with_allow() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    let answer = send(&gw, "POST", &host, "/reports", "content-length: 0\r\n").await;
    assert_eq!(answer.status, Some(405), "{}", answer.head);
    assert!(
        answer.head.contains("\r\nallow: get, head"),
        "{}",
        answer.head
    );
    assert!(
        answer
            .head
            .contains("content-type: application/problem+json"),
        "{}",
        answer.head
    );
    assert!(
        answer.body.contains("method-not-allowed"),
        "{}",
        answer.body
    );
    assert_eq!(u.total(), 0, "nothing reached an upstream");
    // The allowed method goes through; an unknown path stays 404.
    assert_eq!(
        send(&gw, "GET", &host, "/reports", "").await.status,
        Some(200)
    );
    assert_eq!(
        send(&gw, "GET", &host, "/nowhere", "").await.status,
        Some(404)
    );
    assert_eq!(u.received(), ["a:/reports"]);
}

#[tokio::test]
async fn rewrite_and_strip_prefix_change_the_path_the_upstream_receives() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    for path in ["/api/orders?x=1", "/api", "/legacy/things/7", "/legacy"] {
        let answer = send(&gw, "GET", &host, path, "").await;
        assert_eq!(answer.status, Some(200), "{path}");
    }
    assert_eq!(
        u.received(),
        ["a:/v2/orders?x=1", "a:/v2", "a:/things/7", "a:/"]
    );
}

#[tokio::test]
async fn a_route_timeout_is_its_deadline_504() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    // The upstream's attempt timeout is 20 s; the route's 300 ms deadline answers first.
    let answer = send(&gw, "GET", &host, "/slow/report", "").await;
    assert_eq!(answer.status, Some(504), "{}", answer.head);
    assert!(answer.body.contains("upstream-timeout"), "{}", answer.body);
    assert_eq!(u.silent.hit_count(), 1, "the request reached the upstream");
    assert_eq!(u.silent.hits()[0].uri, "/slow/report");
}

#[tokio::test]
async fn oddly_spelled_hosts_and_paths_reach_only_their_own_route() {
    let u = Upstreams::start().await;
    let gw = gateway(&u).await;
    let host = gw.addr.to_string();
    // A host that only starts or ends like a configured one is not it.
    for (odd_host, path) in [
        ("admin.internal.evil.net", "/admin/users"),
        ("evil-admin.internal", "/admin/users"),
        ("api.example.com.evil.net", "/x"),
        ("example.com", "/x"),
    ] {
        let answer = send(&gw, "GET", odd_host, path, "").await;
        assert_eq!(
            answer.status,
            Some(404),
            "{odd_host}{path}: {}",
            answer.body
        );
    }
    assert_eq!(u.total(), 0, "none of them reached an upstream");
    // Spellings of the right host reach it; odd paths are normalised first.
    for (odd_host, target) in [
        ("ADMIN.INTERNAL", "/admin/users"),
        ("admin.internal.", "//admin/users"),
        ("admin.internal:8080", "/x/../admin/users"),
    ] {
        let answer = send(&gw, "GET", odd_host, target, "").await;
        assert_eq!(
            answer.status,
            Some(200),
            "{odd_host}{target}: {}",
            answer.head
        );
    }
    assert_eq!(
        u.received(),
        ["b:/admin/users", "b:/admin/users", "b:/admin/users"]
    );
    // Another host never reaches the admin route, however the path is spelled.
    for target in [
        "/admin/users",
        "//admin/users",
        "/%61dmin/users",
        "/x/../admin",
    ] {
        let answer = send(&gw, "GET", &host, target, "").await;
        assert_eq!(answer.status, Some(404), "{target}");
    }
    // What cannot be normalised safely is refused before routing.
    for target in ["/orders%2F7/items", "/admin%2Fusers"] {
        let answer = send(&gw, "GET", "admin.internal", target, "").await;
        assert_eq!(answer.status, Some(400), "{target}");
    }
    // `//orders/7` is `/orders/7` for the router and for the upstream.
    let answer = send(&gw, "GET", &host, "//orders/7", "").await;
    assert!(answer.body.contains("from-a"), "{}", answer.body);
    // Path case matters: `/Orders` is not `/orders`.
    assert_eq!(
        send(&gw, "GET", &host, "/Orders/7", "").await.status,
        Some(404)
    );
    assert_eq!(
        u.received(),
        [
            "a:/orders/7",
            "b:/admin/users",
            "b:/admin/users",
            "b:/admin/users"
        ]
    );
}
