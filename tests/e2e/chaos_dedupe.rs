//! The idempotency promise under faults: 10 000 keyed POSTs, each sent as 5 concurrent
//! duplicates, against an upstream failing 20 % of the time (500, 503, connection resets),
//! while the gateway is killed and restarted twice, with state in real Redis.
//!
//! Asserted: no key executes twice at the upstream (a 503 is "not processed"; 2xx, 500 and a
//! reset after the request was sent count as executions), and after the leases expire no key
//! is left locked — every record ends stored or released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_idempotency::{IdempotencyKey, RecordKey, RecordState, RedisStore, Store};
use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::ports::free_addr;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::sync::Semaphore;

use crate::common::{client, BIN};

const KEYS: usize = 10_000;
const DUPLICATES: usize = 5;
/// Keys in flight at once (each with its duplicates).
const KEY_CONCURRENCY: usize = 24;
/// Per request: attempts through restarts, 409s and 503s before giving up on an answer.
const CLIENT_ATTEMPTS: usize = 100;

fn faulty_upstream_step() -> Step {
    Step::Random(vec![
        (80, Step::respond(201, &[], "created")),
        (6, Step::status(500)),
        (7, Step::status(503)),
        (7, Step::Close),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_duplicate_execution_and_no_stuck_key_through_faults_and_restarts() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], faulty_upstream_step()).await;
    let redis_url = portcullis_testkit::redis::shared_url();
    let tenant = format!("chaos{}", std::process::id());
    let config = format!(
        "[storage]\nstate = \"{redis_url}\"\nstate_timeout = \"200ms\"\n\n[[tenants]]\nid = \"{tenant}\"\napi_keys = [\"{tenant}-key\"]\nrate = 1000000\nper = \"1s\"\nburst = 1000000\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 2, base = \"5ms\", cap = \"20ms\", total = \"2s\", budget_percent = 50 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ lease = \"3s\" }}\n",
        upstream.url()
    );
    let options = GatewayOptions {
        listen: Some(free_addr()),
        admin_listen: Some(free_addr()),
        ..GatewayOptions::default()
    };
    let mut gateway = GatewayProcess::start_with(BIN, &config, options.clone()).await;
    let url = gateway.url();
    let api_key = format!("{tenant}-key");

    let http = client(); // one pooled client: keep-alive connections, as real clients do
    let done = Arc::new(AtomicUsize::new(0));
    let permits = Arc::new(Semaphore::new(KEY_CONCURRENCY));
    let mut groups = Vec::with_capacity(KEYS);
    for k in 0..KEYS {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (url, api_key, done, http) = (url.clone(), api_key.clone(), done.clone(), http.clone());
        groups.push(tokio::spawn(async move {
            let key = format!("chaos-{k}");
            let duplicates: Vec<_> = (0..DUPLICATES)
                .map(|_| {
                    tokio::spawn(send_until_answered(
                        http.clone(),
                        url.clone(),
                        api_key.clone(),
                        key.clone(),
                    ))
                })
                .collect();
            for duplicate in duplicates {
                let status = duplicate.await.unwrap();
                assert_ne!(
                    status,
                    Some(422),
                    "{key}: duplicates are identical, never a fingerprint mismatch"
                );
            }
            done.fetch_add(1, Ordering::Relaxed);
            drop(permit);
        }));
        // Kill the gateway (SIGKILL: no draining, leases left behind) and restart it twice.
        if k == KEYS / 3 || k == 2 * KEYS / 3 {
            gateway.guard().kill();
            tokio::time::sleep(Duration::from_millis(200)).await;
            gateway = GatewayProcess::start_with(BIN, &config, options.clone()).await;
        }
    }
    for group in groups {
        group.await.unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), KEYS);

    // Zero duplicate executions at the upstream.
    let mut executions: HashMap<String, usize> = HashMap::new();
    for hit in upstream.hits() {
        let Some(key) = hit
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
        else {
            continue;
        };
        if hit.answered != Some(503) {
            *executions.entry(key.to_owned()).or_default() += 1;
        }
    }
    let duplicated: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "keys executed more than once: {:?}",
        &duplicated[..duplicated.len().min(10)]
    );

    // No key stuck: once every lease has expired, each record is stored or gone (released).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let store = RedisStore::connect(&redis_url, Duration::from_secs(1))
        .await
        .unwrap();
    let mut stuck = Vec::new();
    for k in 0..KEYS {
        let key = IdempotencyKey::parse(format!("chaos-{k}").as_bytes(), 64).unwrap();
        let record = store
            .get(&RecordKey::new(tenant.clone(), "/", key))
            .await
            .unwrap();
        if let Some(info) = record {
            if matches!(info.state, RecordState::InFlight) {
                stuck.push(k);
            }
        }
    }
    assert!(
        stuck.is_empty(),
        "{} keys still locked after their lease: {:?}",
        stuck.len(),
        &stuck[..stuck.len().min(10)]
    );
    let total_hits = upstream.hit_count();
    eprintln!(
        "chaos: {KEYS} keys × {DUPLICATES} duplicates → {total_hits} upstream hits, {} executions",
        executions.len()
    );
}

/// Sends one duplicate until it gets a final answer: through restarts (connection errors),
/// 409 (the first copy is in flight) and 503 (released or store unavailable), bounded.
async fn send_until_answered(
    http: reqwest::Client,
    url: String,
    api_key: String,
    key: String,
) -> Option<u16> {
    let mut last = None;
    for _ in 0..CLIENT_ATTEMPTS {
        let sent = http
            .post(format!("{url}/orders"))
            .bearer_auth(&api_key)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body("{\"amount\":1}")
            .send()
            .await;
        // A connection error (the gateway is restarting) is simply tried again.
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            last = Some(status);
            if status != 409 && status != 503 {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}
