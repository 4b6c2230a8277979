//! The gateway on a real Redis Cluster (`storage.state = "redis-cluster://…"`): shared rate
//! limits with a global ceiling in another slot, keyed replays across replicas, and a master
//! killed under load. Requests go over raw sockets; the upstream counts what got through.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::redis_cluster::{self, RedisCluster};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

/// The shared cluster from `scripts/test.sh`; a cluster test must not pass without one.
fn shared_cluster_url() -> String {
    redis_cluster::shared_url().unwrap_or_else(|| {
        panic!(
            "{} is not set: run the suite with scripts/test.sh, which starts a 3-master Redis Cluster",
            redis_cluster::SHARED_URL_ENV
        )
    })
}

fn config(upstream: &str, storage: &str, rate_limit: &str, tenants: &str) -> String {
    format!(
        "[storage]\n{storage}\nstate_timeout = \"100ms\"\n\n[rate_limit]\n{rate_limit}\n\n{tenants}\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n\
         idempotency = {{ methods = [\"POST\"] }}\n"
    )
}

fn tenant(id: &str, burst: u32) -> String {
    format!(
        "[[tenants]]\nid = \"{id}\"\napi_keys = [\"{id}-key\"]\nrate = 1\nper = \"60s\"\nburst = {burst}\n"
    )
}

/// One raw request; `None` if no complete answer came within 5 s (a hang).
async fn send(addr: SocketAddr, request: &str) -> Option<(u16, String)> {
    let bytes = raw_request(addr, request.as_bytes()).await?;
    let status = parse_status(&bytes)?;
    Some((status, String::from_utf8_lossy(&bytes).into_owned()))
}

fn get(tenant: &str, path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {tenant}-key\r\n\
         Connection: close\r\n\r\n"
    )
}

fn keyed_post(tenant: &str, key: &str, body: &str) -> String {
    format!(
        "POST /pay HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {tenant}-key\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

fn unique(name: &str) -> String {
    format!("{name}{}x{:x}", std::process::id(), rand::random::<u32>())
}

#[tokio::test]
async fn replicas_on_a_redis_cluster_share_limits_refund_the_global_ceiling_and_replay() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let (hammer, other) = (unique("hammer"), unique("other"));
    let storage = format!("state = \"{}\"", shared_cluster_url());
    // The global ceiling (8, no refill to speak of) lives in its own slot, apart from every
    // tenant's: each decision runs one script per slot.
    let text = config(
        &upstream.url(),
        &storage,
        "global = { rate = 1, per = \"60s\", burst = 8 }",
        &(tenant(&hammer, 3) + &tenant(&other, 10)),
    );
    let a = GatewayProcess::start(BIN, &text).await;
    let b = GatewayProcess::start(BIN, &text).await;

    // `hammer` (burst 3) through both replicas: 3 pass in total, not 3 per replica.
    let mut statuses = Vec::new();
    for i in 0..10 {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        let (status, _) = send(addr, &get(&hammer, "/d")).await.expect("an answer");
        statuses.push(status);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        7,
        "{statuses:?}"
    );

    // The 7 refusals were admitted by the global slot and refunded: the ceiling lost only
    // the 3 admitted requests, so `other` (burst 10) gets exactly 8 − 3 = 5.
    let mut admitted = 0;
    let mut last = String::new();
    for i in 0..8 {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        let (status, text) = send(addr, &get(&other, "/d")).await.expect("an answer");
        admitted += usize::from(status == 200);
        last = text;
    }
    assert_eq!(admitted, 5, "global ceiling 8 minus the 3 admitted: {last}");
    assert!(
        last.contains("global"),
        "the refusal names the global ceiling: {last}"
    );
    assert_eq!(
        upstream.hit_count(),
        8,
        "the upstream saw exactly the admitted requests"
    );

    // A keyed POST through replica a, its duplicate through replica b: replayed from the
    // cluster, executed once (on a fresh tenant with room under its own limit).
    let payer = unique("payer");
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::respond(201, &[], "charged")).await;
    let text = config(&upstream.url(), &storage, "", &tenant(&payer, 10));
    let (a, b) = (
        GatewayProcess::start(BIN, &text).await,
        GatewayProcess::start(BIN, &text).await,
    );
    let key = unique("pay-");
    let (first, _) = send(a.addr, &keyed_post(&payer, &key, "{\"amount\":100}"))
        .await
        .expect("an answer");
    let (second, replay) = send(b.addr, &keyed_post(&payer, &key, "{\"amount\":100}"))
        .await
        .expect("an answer");
    assert_eq!((first, second), (201, 201));
    assert!(
        replay
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{replay}"
    );
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "one execution across replicas");
    assert_eq!(hits[0].headers["idempotency-key"], key.as_str());
    assert_eq!(&hits[0].body[..], b"{\"amount\":100}");
}

/// Client side of the load: `rounds` requests, each answered within 5 s or counted as a hang.
async fn load(addr: SocketAddr, tenant: String, rounds: usize) -> Vec<Option<u16>> {
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        out.push(send(addr, &get(&tenant, "/d")).await.map(|(s, _)| s));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    out
}

#[tokio::test]
async fn killing_a_cluster_master_under_load_degrades_as_configured_and_recovers() {
    // Failure detection after 1 s, so the cluster also goes through CLUSTERDOWN.
    let mut cluster = RedisCluster::start(Duration::from_secs(1)).await;
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let id = unique("acme");
    let storage = format!("state = \"{}\"", cluster.url());
    let open = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            &storage,
            "on_store_error = \"fail_open\"",
            &tenant(&id, 1000),
        ),
    )
    .await;
    let closed = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            &storage,
            "on_store_error = \"fail_closed\"",
            &tenant(&id, 1000),
        ),
    )
    .await;
    let bucket = format!("rl:{{tenant:{id}}}:tenant");
    let victim = cluster.port_of_key(&bucket).expect("the slot's master");
    for gateway in [&open, &closed] {
        assert_eq!(
            send(gateway.addr, &get(&id, "/d")).await.map(|r| r.0),
            Some(200)
        );
    }

    // Load on both replicas while the master holding the tenant's bucket dies.
    let loads = [
        tokio::spawn(load(open.addr, id.clone(), 150)),
        tokio::spawn(load(closed.addr, id.clone(), 150)),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(victim);
    let [open_load, closed_load] = loads;
    let (open_seen, closed_seen) = (open_load.await.unwrap(), closed_load.await.unwrap());
    assert!(
        open_seen.iter().all(Option::is_some),
        "a request hung: {open_seen:?}"
    );
    assert!(
        closed_seen.iter().all(Option::is_some),
        "a request hung: {closed_seen:?}"
    );
    assert!(
        open_seen.iter().all(|s| *s == Some(200)),
        "fail_open keeps admitting from the local share: {open_seen:?}"
    );
    assert!(
        closed_seen.iter().all(|s| matches!(s, Some(200 | 503))),
        "fail_closed answers 503 while the store is down: {closed_seen:?}"
    );
    assert!(
        closed_seen.last() == Some(&Some(503)),
        "fail_closed refuses once the master is gone: {closed_seen:?}"
    );
    let (status, text) = send(closed.addr, &get(&id, "/d")).await.expect("an answer");
    assert_eq!(status, 503, "{text}");
    assert!(text.to_ascii_lowercase().contains("retry-after:"), "{text}");

    // Same port, same nodes.conf: the master rejoins with its slots (and an empty dataset).
    cluster.restart(victim).await;
    let mut recovered = false;
    for _ in 0..100 {
        if send(closed.addr, &get(&id, "/d")).await.map(|r| r.0) == Some(200) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "fail_closed replica serves again without a restart"
    );
    // The bucket is on the cluster again (the restarted master started empty): shared state,
    // not a local stand-in.
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &victim.to_string(), "exists", &bucket])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let mut open_shared = false;
    for _ in 0..50 {
        let before = bucket_tat(victim, &bucket);
        assert_eq!(
            send(open.addr, &get(&id, "/d")).await.map(|r| r.0),
            Some(200)
        );
        if bucket_tat(victim, &bucket) > before {
            open_shared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        open_shared,
        "the fail_open replica decides on the cluster again"
    );
}

/// The stored GCRA TAT of `key` on the node at `port` (0 when absent).
fn bucket_tat(port: u16, key: &str) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "get", key])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// `GET /readyz` on `addr`: the status and the whole answer.
async fn readyz(addr: SocketAddr) -> Option<(u16, String)> {
    send(
        addr,
        "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
}

#[tokio::test]
async fn readyz_names_the_cluster_store_as_soon_as_a_master_dies_and_recovers() {
    // Failure detection after 5 s: the first answers after the kill come while the rest of
    // the cluster still says cluster_state:ok and every other master answers PING.
    let mut cluster = RedisCluster::start(Duration::from_secs(5)).await;
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let id = unique("ready");
    let storage = format!("state = \"{}\"", cluster.url());
    let gw = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            &storage,
            "on_store_error = \"fail_closed\"",
            &tenant(&id, 1000),
        ),
    )
    .await;
    let (status, text) = readyz(gw.addr).await.expect("an answer");
    assert_eq!(status, 200, "{text}");
    let (status, text) = readyz(gw.admin_addr).await.expect("an answer");
    assert_eq!(status, 200, "{text}");

    // The master of the tenant's keys dies: its keyed writes are refused from now on.
    let bucket = format!("rl:{{tenant:{id}}}:tenant");
    let victim = cluster.port_of_key(&bucket).expect("the slot's master");
    cluster.kill(victim);
    // Within 2 s (20 polls 100 ms apart; each answer is bounded by the check's 1 s, and a
    // dead master refuses its connection at once).
    let mut named = None;
    for _ in 0..20 {
        if let Some((503, text)) = readyz(gw.addr).await {
            named = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text =
        named.unwrap_or_else(|| panic!("/readyz still 200 with a dead master\n{}", gw.logs()));
    assert!(text.contains("storage.state"), "names the store: {text}");
    assert!(
        text.contains(&format!(":{victim}")),
        "names the dead master: {text}"
    );
    assert!(text.to_ascii_lowercase().contains("problem+json"), "{text}");
    // /healthz stays liveness only.
    let (status, _) = send(
        gw.addr,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(status, 200);
    // What readiness promised: a rate-limited request on that master's slots is refused
    // (fail_closed), and nothing of it reached the upstream.
    let before = upstream.hit_count();
    let (status, text) = send(gw.addr, &get(&id, "/d")).await.expect("an answer");
    assert_eq!(status, 503, "{text}");
    assert_eq!(upstream.hit_count(), before);

    // The master returns with its slots: ready again.
    cluster.restart(victim).await;
    let mut ready = false;
    for _ in 0..100 {
        if readyz(gw.addr).await.map(|r| r.0) == Some(200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "ready again after the master returned\n{}",
        gw.logs()
    );
}
