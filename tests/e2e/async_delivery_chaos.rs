//! Asynchronous delivery under chaos: 10 000 messages accepted (each `202` received by its
//! client) while the upstream fails 30 % of attempts at random (503s, connections dropped
//! before the request is executed, and connections dropped *after* it was executed, so the
//! answer is lost and the gateway must send it again), the gateway is killed with SIGKILL
//! twice and the queue's Redis is killed and restarted once, all during delivery.
//!
//! Asserted from the backend's own records, not the gateway's answers: every accepted
//! message is executed exactly once (the backend dedupes on the forwarded `Idempotency-Key`,
//! and each message's label is executed under exactly one key, the one derived from the
//! delivery id its client was given), nothing else is executed, and the messages built to
//! fail (answered 400 by the backend) are exactly the dead letters.
//!
//! The engine is a private `redis-server` with `appendonly yes` and `appendfsync always`
//! (`RedisServer::start_durable`): it is the one durable engine a test can kill and restart
//! in a second without touching the shared servers of `scripts/test.sh` that other tests
//! use, and with that fsync policy it promises to lose nothing it acknowledged
//! (docs/async-delivery.md), which is what the test holds it to. It needs only the
//! `redis-server` binary, not `scripts/test.sh`.
//!
//! The faults are random, but the backend never injects more than three in a row for one
//! message, so the route's eight retries always suffice: a dead letter of a good message is
//! a bug, not bad luck. Outlier ejection is off (one endpoint: ejecting it would only turn
//! the chaos into more 503s); the circuit breaker and retry layer are the defaults.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::ports::free_addr;
use portcullis_testkit::redis::RedisServer;
use rand::Rng;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::common::BIN;

/// Messages accepted in all.
const MESSAGES: usize = 10_000;
/// Message `i` with `i % BAD_EVERY == 7` is built to fail: the backend answers it 400.
const BAD_EVERY: usize = 100;
/// Clients sending at once.
const CLIENTS: usize = 48;
/// Per message: sends (through kills and a queue outage) before the client gives up.
const CLIENT_ATTEMPTS: usize = 400;
/// Pause between a client's sends of one message.
const CLIENT_PAUSE: Duration = Duration::from_millis(25);
/// Share of attempts the backend fails, in percent.
const FAULT_PERCENT: u32 = 30;
/// Faults in a row for one message at most (the route allows 8 retries).
const MAX_FAULT_STREAK: u32 = 3;
const ADMIN_TOKEN: &str = "e2e-admin-token-for-chaos-deliveries";
const API_KEY: &str = "key-chaos-0001";

fn is_bad(i: usize) -> bool {
    i % BAD_EVERY == 7
}

fn label(i: usize) -> String {
    if is_bad(i) {
        format!("fail-{i}")
    } else {
        format!("msg-{i}")
    }
}

/// What the backend saw and did.
#[derive(Debug, Default)]
struct Records {
    /// Idempotency-Key → executions (the backend dedupes, so at most 1 by construction).
    executed: HashMap<String, u32>,
    /// Message label → the keys it was executed under (more than one is a double execution
    /// the backend could not see).
    executed_labels: HashMap<String, Vec<String>>,
    /// Attempts per key that reached the backend.
    attempts: HashMap<String, u32>,
    /// Key → 400 answers (messages built to fail).
    refused: HashMap<String, u32>,
    /// Key → faults in a row just injected.
    streak: HashMap<String, u32>,
    /// Requests that came without an Idempotency-Key.
    unkeyed: u32,
    /// Redeliveries of an executed key, answered from the dedupe record.
    deduped: u32,
    /// Faults injected.
    faults: u32,
}

/// A backend that executes each `Idempotency-Key` once and fails 30 % of attempts.
struct Backend {
    addr: SocketAddr,
    records: Arc<Mutex<Records>>,
    task: JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

enum Fault {
    Unavailable,
    DropBefore,
    DropAfter,
}

impl Backend {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let records = Arc::new(Mutex::new(Records::default()));
        let state = records.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(req, state.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Self {
            addr,
            records,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn executed_count(&self) -> usize {
        self.records.lock().unwrap().executed_labels.len()
    }
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<Records>>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let label = String::from_utf8_lossy(&body).into_owned();
    let answer = |status: u16| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::new()))
            .map_err(|_| Dropped)
    };
    let Some(key) = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        state.lock().unwrap().unkeyed += 1;
        return answer(400);
    };
    let fault = {
        let mut records = state.lock().unwrap();
        *records.attempts.entry(key.clone()).or_default() += 1;
        let streak = records.streak.get(&key).copied().unwrap_or(0);
        let mut rng = rand::thread_rng();
        let fault = if streak < MAX_FAULT_STREAK && rng.gen_range(0..100) < FAULT_PERCENT {
            Some(match rng.gen_range(0..3) {
                0 => Fault::Unavailable,
                1 => Fault::DropBefore,
                _ => Fault::DropAfter,
            })
        } else {
            None
        };
        match fault {
            Some(_) => {
                records.faults += 1;
                records.streak.insert(key.clone(), streak + 1);
            }
            None => {
                records.streak.insert(key.clone(), 0);
            }
        }
        fault
    };
    match fault {
        Some(Fault::Unavailable) => return answer(503),
        Some(Fault::DropBefore) => return Err(Dropped),
        Some(Fault::DropAfter) | None => {}
    }
    let mut records = state.lock().unwrap();
    if label.starts_with("fail-") {
        *records.refused.entry(key).or_default() += 1;
        drop(records);
        // A message built to fail is refused whatever happens; a dropped answer is moot.
        return answer(400);
    }
    if records.executed.contains_key(&key) {
        records.deduped += 1;
    } else {
        records.executed.insert(key.clone(), 1);
        records.executed_labels.entry(label).or_default().push(key);
    }
    drop(records);
    match fault {
        Some(Fault::DropAfter) => Err(Dropped),
        _ => answer(200),
    }
}

fn config(backend: &Backend, redis: &RedisServer) -> String {
    format!(
        "[storage]\nqueue = \"{}\"\n\n\
         [[tenants]]\nid = \"chaos\"\napi_keys = [\"{API_KEY}\"]\nrate = 1000000\nper = \"1s\"\nburst = 1000000\n\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\
         outlier = {{ consecutive_failures = 0 }}\n\n\
         [[routes]]\nname = \"chaos\"\nprefix = \"/hooks\"\nupstream = \"u\"\ntimeout = \"2s\"\n\
         delivery = {{ mode = \"async\", max_retries = 8, schedule = [\"5ms\", \"10ms\", \"20ms\", \"50ms\", \"100ms\", \"200ms\", \"500ms\", \"1s\"], max_in_flight = 256 }}\n",
        redis.url(),
        backend.url()
    )
}

/// Sends message `i` until a 202 comes back (through kills, refused connections and 503s
/// while the queue is down), with the same client Idempotency-Key each time; the delivery
/// id of that 202.
async fn send(http: &reqwest::Client, url: &str, i: usize) -> String {
    let mut last = String::new();
    for _ in 0..CLIENT_ATTEMPTS {
        let sent = http
            .post(format!("{url}/hooks/event"))
            .header("x-api-key", API_KEY)
            .header("idempotency-key", format!("client-{i}"))
            .body(label(i))
            .send()
            .await;
        match sent {
            Ok(response) if response.status() == 202 => {
                return response
                    .headers()
                    .get("portcullis-delivery-id")
                    .and_then(|v| v.to_str().ok())
                    .expect("a 202 names its delivery id")
                    .to_owned();
            }
            Ok(response) => {
                let status = response.status();
                assert!(
                    status == 503 || status == 502,
                    "message {i}: unexpected {status}"
                );
                last = format!("{status}");
            }
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(CLIENT_PAUSE).await;
    }
    panic!("message {i} never accepted; last: {last}");
}

/// Waits until the backend executed at least `n` messages, polling every 50 ms, at most
/// `limit` in all.
async fn executed_at_least(backend: &Backend, n: usize, limit: Duration) {
    let polls = limit.as_millis() / 50;
    for _ in 0..polls {
        if backend.executed_count() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "only {} messages executed, waited for {n}",
        backend.executed_count()
    );
}

/// The ids of the dead letters of queue `chaos`, by the admin API (all pages).
async fn dead_ids(gateway: &GatewayProcess) -> Option<HashSet<String>> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut ids = HashSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut request = http
            .get(format!("{}/admin/v1/deliveries", gateway.admin_url()))
            .query(&[("state", "dead"), ("queue", "chaos"), ("limit", "1000")])
            .bearer_auth(ADMIN_TOKEN);
        if let Some(cursor) = &cursor {
            request = request.query(&[("cursor", cursor.as_str())]);
        }
        let response = request.send().await.ok()?;
        if response.status() != 200 {
            return None;
        }
        let json: serde_json::Value = response.json().await.ok()?;
        let items = json["items"].as_array()?;
        for item in items {
            ids.insert(item["id"].as_str()?.to_owned());
        }
        match json["next"].as_str() {
            Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
            _ => return Some(ids),
        }
    }
    Some(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_message_is_executed_once_through_faults_kills_and_a_queue_restart() {
    let backend = Backend::start().await;
    let mut redis = RedisServer::start_durable().await;
    let config = config(&backend, &redis);
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".into(), ADMIN_TOKEN.into())],
        listen: Some(free_addr()),
        admin_listen: Some(free_addr()),
        ..GatewayOptions::default()
    };
    let mut gateway = GatewayProcess::start_with(BIN, &config, options.clone()).await;
    let url = gateway.url();

    // The clients: every message sent until its 202, MESSAGES in all.
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let permits = Arc::new(Semaphore::new(CLIENTS));
    let mut clients = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES {
        let permit = permits.clone().acquire_owned();
        let http = http.clone();
        let url = url.clone();
        clients.push(tokio::spawn(async move {
            let _permit = permit.await.unwrap();
            (i, send(&http, &url, i).await)
        }));
    }

    // The chaos, while messages are accepted and delivered.
    let limit = Duration::from_secs(120);
    executed_at_least(&backend, 1_500, limit).await;
    gateway.guard().kill();
    gateway = GatewayProcess::start_with(BIN, &config, options.clone()).await;
    executed_at_least(&backend, 4_000, limit).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart().await;
    executed_at_least(&backend, 6_500, limit).await;
    gateway.guard().kill();
    gateway = GatewayProcess::start_with(BIN, &config, options.clone()).await;

    let mut accepted: HashMap<usize, String> = HashMap::with_capacity(MESSAGES);
    for client in clients {
        let (i, id) = client.await.unwrap();
        accepted.insert(i, id);
    }
    assert_eq!(accepted.len(), MESSAGES);
    let ids: HashSet<&String> = accepted.values().collect();
    assert_eq!(ids.len(), MESSAGES, "two messages share a delivery id");
    let good = (0..MESSAGES).filter(|i| !is_bad(*i)).count();
    let bad: HashSet<String> = accepted
        .iter()
        .filter(|(i, _)| is_bad(**i))
        .map(|(_, id)| id.clone())
        .collect();

    // Every good message executed, every bad one dead (bounded waits).
    executed_at_least(&backend, good, limit).await;
    let mut dead = HashSet::new();
    for _ in 0..1_200 {
        if let Some(ids) = dead_ids(&gateway).await {
            dead = ids;
            if dead.len() >= bad.len() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The backend's records.
    let records = backend.records.lock().unwrap();
    assert_eq!(records.unkeyed, 0, "deliveries without an Idempotency-Key");
    for (i, id) in &accepted {
        let key = format!("delivery-{id}");
        if is_bad(*i) {
            assert!(
                records.refused.get(&key).copied().unwrap_or(0) >= 1,
                "message {i} built to fail never reached the backend"
            );
            assert!(!records.executed.contains_key(&key));
            continue;
        }
        let keys = records.executed_labels.get(&label(*i));
        assert_eq!(
            keys,
            Some(&vec![key.clone()]),
            "message {i} (delivery {id}) not executed exactly once under its own key"
        );
        assert_eq!(records.executed.get(&key), Some(&1));
    }
    assert_eq!(
        records.executed_labels.len(),
        good,
        "something executed that no client was told was accepted"
    );
    assert!(
        records.deduped > 0,
        "no redelivery reached the backend: the chaos did not bite"
    );
    assert_eq!(
        dead, bad,
        "dead letters other than the messages built to fail"
    );
    let attempts: u32 = records.attempts.values().sum();
    eprintln!(
        "chaos: {MESSAGES} accepted, {good} executed once, {} dead; {attempts} attempts, {} faults, {} redeliveries answered from the dedupe record",
        dead.len(),
        records.faults,
        records.deduped
    );
    drop(records);
    gateway.guard().kill();
    redis.kill();
}
