//! Service discovery through the real binary: an `endpoints_file` rewritten by a
//! "deployment tool" moves traffic without a restart (a bad file keeps the last good set),
//! and a host name re-resolved through `[discovery] hosts_file` follows its address
//! records. The name's addresses are loopback aliases (127.0.0.2, 127.0.0.3) on one port,
//! as a name with several A records would give.

use std::net::SocketAddr;

use portcullis_testkit::upstream::ScriptedUpstream;

use crate::upstream_health::{get, proxied, start, upstreams, POLL, POLLS};

/// Sends requests until `target` has received one (bounded), then returns.
async fn until_served_by(
    gw: &portcullis_testkit::gateway::GatewayProcess,
    target: &ScriptedUpstream,
) {
    for _ in 0..POLLS {
        assert_eq!(get(gw, "/d").await, Some(200));
        if proxied(target) > 0 {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!(
        "traffic never moved: {}\n{}",
        upstreams(gw).await,
        gw.logs()
    );
}

#[tokio::test]
async fn endpoints_file_moves_traffic_without_restart() {
    let _trace = portcullis_testkit::trace_init();
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("endpoints.txt");
    std::fs::write(&file, format!("# deploy 1\n{}\n", a.url())).unwrap();
    let config = format!(
        r#"[[upstreams]]
name = "u"
endpoints_file = "{}"
resolve_interval = "50ms"
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "u"
"#,
        file.display()
    );
    let gw = start(&config).await;
    for _ in 0..5 {
        assert_eq!(get(&gw, "/d").await, Some(200));
    }
    assert_eq!((proxied(&a), proxied(&b)), (5, 0));

    // Deploy 2: B replaces A.
    std::fs::write(&file, format!("# deploy 2\n{} 1\n", b.url())).unwrap();
    until_served_by(&gw, &b).await;
    let a_before = proxied(&a);
    for _ in 0..10 {
        assert_eq!(get(&gw, "/d").await, Some(200));
    }
    assert_eq!(proxied(&a), a_before, "A is gone from the set");

    // A broken file keeps the last good set (and the gateway keeps serving).
    std::fs::write(&file, "ftp://nonsense\n").unwrap();
    for _ in 0..10 {
        tokio::time::sleep(POLL).await;
        assert_eq!(get(&gw, "/d").await, Some(200));
    }
    assert_eq!(proxied(&a), a_before);
    assert!(
        gw.logs().contains("keeping the last good endpoints"),
        "{}",
        gw.logs()
    );
    let view = upstreams(&gw).await;
    assert_eq!(
        view["upstreams"][0]["endpoints"][0]["url"],
        b.url(),
        "{view}"
    );
}

/// Two upstreams on 127.0.0.2 and 127.0.0.3 with the same port (bounded retries for a
/// port free on both).
async fn pair_on_one_port() -> (ScriptedUpstream, ScriptedUpstream) {
    for _ in 0..20 {
        let Some(first) =
            ScriptedUpstream::start_at(SocketAddr::from(([127, 0, 0, 2], 0)), vec![]).await
        else {
            continue;
        };
        let port = first.addr().port();
        if let Some(second) =
            ScriptedUpstream::start_at(SocketAddr::from(([127, 0, 0, 3], port)), vec![]).await
        {
            return (first, second);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

#[tokio::test]
async fn host_names_are_re_resolved_and_every_record_is_an_endpoint() {
    let _trace = portcullis_testkit::trace_init();
    let (two, three) = pair_on_one_port().await;
    let port = two.addr().port();
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.2 orders.internal\n").unwrap();
    let config = format!(
        r#"[discovery]
hosts_file = "{}"

[[upstreams]]
name = "orders"
endpoints = ["http://orders.internal:{port}"]
resolve_interval = "50ms"
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/"
upstream = "orders"
"#,
        hosts.display()
    );
    let gw = start(&config).await;
    for _ in 0..4 {
        assert_eq!(get(&gw, "/d").await, Some(200));
    }
    assert_eq!((proxied(&two), proxied(&three)), (4, 0));
    // The name is kept as the Host header.
    assert_eq!(
        two.hits()[0].headers["host"],
        format!("orders.internal:{port}").as_str()
    );

    // A second A record: both addresses become endpoints.
    std::fs::write(
        &hosts,
        "127.0.0.2 orders.internal\n127.0.0.3 orders.internal\n",
    )
    .unwrap();
    until_served_by(&gw, &three).await;
    let view = upstreams(&gw).await;
    assert_eq!(
        view["upstreams"][0]["endpoints"].as_array().map(Vec::len),
        Some(2),
        "{view}"
    );

    // The first record goes away: all traffic to the remaining one.
    std::fs::write(&hosts, "127.0.0.3 orders.internal\n").unwrap();
    let mut moved = false;
    for _ in 0..POLLS {
        let view = upstreams(&gw).await;
        if view["upstreams"][0]["endpoints"].as_array().map(Vec::len) == Some(1) {
            moved = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(moved, "{}", upstreams(&gw).await);
    let two_before = proxied(&two);
    for _ in 0..10 {
        assert_eq!(get(&gw, "/d").await, Some(200));
    }
    assert_eq!(
        proxied(&two),
        two_before,
        "127.0.0.2 is no longer an endpoint"
    );
}
