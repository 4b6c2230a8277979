//! Queue conformance suite: every behaviour of the `Queue` contract, run against every
//! engine — SQLite in a temporary file, and PostgreSQL, Redis and Redis Cluster on real
//! servers.
//!
//! Servers come from the environment (`scripts/test.sh` exports them):
//! - `PORTCULLIS_TEST_DATABASE_URL`, a PostgreSQL server on which the test may
//!   `CREATE DATABASE`: each test gets a fresh, randomly named database (the engine creates
//!   its schema on connect), dropped at the end;
//! - `PORTCULLIS_TEST_REDIS_URL`: each test uses a random key namespace (never `FLUSHALL`);
//! - `PORTCULLIS_TEST_REDIS_CLUSTER_URL` (`redis-cluster://h:p,…`): the same on a real
//!   3-master cluster.
//!
//! A missing variable **fails** the engine's tests with a message saying so, except the
//! cluster's, which print a note and pass (as in `idempotency/tests/conformance.rs`).
//!
//! Engines decide on their own clock (SQLite's, PostgreSQL's `now`, Redis `TIME`), which
//! paused tokio time cannot move, so leases and due times here are short real durations
//! (hundreds of milliseconds) and every wait and loop is bounded.

// Test code: a failed unwrap is a failed test (clippy only exempts `#[test]` fns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use portcullis_queue::{
    Attempt, AttemptOutcome, ConnectOptions, Dedupe, DeliveryId, Enqueued, ListFilter, NewMessage,
    PostgresQueue, Queue, QueueError, RedisQueue, SqliteQueue, State,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection, Executor};

/// Lease used throughout: long enough for a loaded CI machine to do a round trip or two.
const LEASE: Duration = Duration::from_millis(400);
/// Wait that is certainly past a lease (server clocks included).
const PAST_LEASE: Duration = Duration::from_millis(700);
/// A lease no test outlives.
const LONG: Duration = Duration::from_secs(60);

struct Backend {
    queue: Arc<dyn Queue>,
    /// Random per test: queue names never collide between tests on a shared server.
    prefix: String,
    cleanup: Option<(PgConnectOptions, String)>,
    _dir: Option<tempfile::TempDir>,
}

// === backends ===

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this conformance test needs a real server. Run \
             scripts/test.sh -p portcullis-queue, which starts Redis and PostgreSQL and \
             exports PORTCULLIS_TEST_REDIS_URL and PORTCULLIS_TEST_DATABASE_URL."
        )
    })
}

fn random_name() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn options() -> ConnectOptions {
    ConnectOptions {
        timeout: Duration::from_secs(5),
        pool_size: 8,
    }
}

async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let queue = SqliteQueue::open(&dir.path().join("queue.db"), &options())
        .await
        .unwrap();
    Backend {
        queue: Arc::new(queue),
        prefix: random_name(),
        cleanup: None,
        _dir: Some(dir),
    }
}

async fn postgres() -> Backend {
    let url = env("PORTCULLIS_TEST_DATABASE_URL");
    let server: PgConnectOptions = url.parse().expect("PORTCULLIS_TEST_DATABASE_URL");
    let db = format!("queue_test_{}", random_name());
    let mut admin = server
        .connect()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
    admin
        .execute(format!(r#"CREATE DATABASE "{db}""#).as_str())
        .await
        .expect("CREATE DATABASE");
    admin.close().await.ok();
    let queue = PostgresQueue::connect_with(server.clone().database(&db), &options())
        .await
        .expect("connect the queue");
    Backend {
        queue: Arc::new(queue),
        prefix: random_name(),
        cleanup: Some((server, db)),
        _dir: None,
    }
}

async fn redis() -> Backend {
    let url = env("PORTCULLIS_TEST_REDIS_URL");
    let queue = RedisQueue::connect(&url, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Redis at {url}: {e}"))
        .with_namespace(&format!("qt{}", random_name()));
    Backend {
        queue: Arc::new(queue),
        prefix: random_name(),
        cleanup: None,
        _dir: None,
    }
}

/// `None` (with a note) when no cluster URL is set.
async fn redis_cluster() -> Option<Backend> {
    let Ok(url) = std::env::var("PORTCULLIS_TEST_REDIS_CLUSTER_URL") else {
        eprintln!(
            "PORTCULLIS_TEST_REDIS_CLUSTER_URL is not set: skipping the Redis Cluster \
             instantiation (scripts/test.sh starts a 3-master cluster and exports it)"
        );
        return None;
    };
    let nodes: Vec<String> = url
        .trim_start_matches("redis-cluster://")
        .split(',')
        .map(|n| format!("redis://{n}"))
        .collect();
    let queue = RedisQueue::connect_cluster(&nodes, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the Redis Cluster at {url}: {e}"))
        .with_namespace(&format!("qt{}", random_name()));
    Some(Backend {
        queue: Arc::new(queue),
        prefix: random_name(),
        cleanup: None,
        _dir: None,
    })
}

impl Backend {
    fn q(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    async fn put(&self, queue: &str, tenant: Option<&str>, body: &str) -> DeliveryId {
        match self
            .queue
            .enqueue(message(queue, tenant, body))
            .await
            .unwrap()
        {
            Enqueued::New(id) => id,
            other => panic!("expected New, got {other:?}"),
        }
    }

    async fn lease_one(&self, queue: &str, lease_for: Duration) -> portcullis_queue::Leased {
        let mut got = self.queue.lease(queue, 1, lease_for).await.unwrap();
        assert_eq!(got.len(), 1, "expected one due message in {queue}");
        got.remove(0)
    }

    async fn state(&self, id: &DeliveryId) -> State {
        self.queue.get(id).await.unwrap().expect("message").state
    }

    async fn finish(self) {
        drop(self.queue);
        if let Some((server, db)) = self.cleanup {
            if let Ok(mut c) = server.connect().await {
                let _ = c
                    .execute(format!(r#"DROP DATABASE "{db}" WITH (FORCE)"#).as_str())
                    .await;
            }
        }
    }
}

fn message(queue: &str, tenant: Option<&str>, body: &str) -> NewMessage {
    NewMessage {
        queue: queue.to_owned(),
        tenant: tenant.map(str::to_owned),
        dedupe: None,
        method: "POST".into(),
        path_and_query: "/hooks/in?x=1".into(),
        headers: vec![
            (b"content-type".to_vec(), b"application/json".to_vec()),
            (b"x-repeat".to_vec(), b"a".to_vec()),
            (b"x-repeat".to_vec(), b"b".to_vec()),
            (b"x-obs-text".to_vec(), b"caf\xe9".to_vec()),
        ],
        body: Bytes::from(body.to_owned()),
        delay: Duration::ZERO,
    }
}

fn deduped(queue: &str, tenant: Option<&str>, key: &str, window: Duration) -> NewMessage {
    NewMessage {
        dedupe: Some(Dedupe {
            key: key.to_owned(),
            window,
        }),
        ..message(queue, tenant, key)
    }
}

fn attempt(status: u16) -> Attempt {
    Attempt {
        at_ms: 1_700_000_000_000,
        outcome: AttemptOutcome::Status(status),
        latency_ms: 12,
    }
}

fn assert_fenced(r: Result<(), QueueError>) {
    match r {
        Err(e) => assert!(e.is_fenced(), "expected a fencing error, got {e:?}"),
        Ok(()) => panic!("a stale holder must not succeed"),
    }
}

// === behaviours ===

async fn enqueue_then_get_round_trips(b: &Backend) {
    let q = b.q("rt");
    let mut m = message(&q, Some("acme"), "");
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    m.body = Bytes::from(body.clone());
    let id = match b.queue.enqueue(m.clone()).await.unwrap() {
        Enqueued::New(id) => id,
        other => panic!("expected New, got {other:?}"),
    };
    assert!(DeliveryId::parse(id.as_str()).is_some(), "ids are URL-safe");
    let got = b.queue.get(&id).await.unwrap().expect("stored");
    assert_eq!(got.id, id);
    assert_eq!(got.queue, q);
    assert_eq!(got.tenant.as_deref(), Some("acme"));
    assert_eq!(got.state, State::Pending);
    assert_eq!(got.method, "POST");
    assert_eq!(got.path_and_query, "/hooks/in?x=1");
    assert_eq!(got.headers, m.headers);
    assert_eq!(got.body, Bytes::from(body.clone()));
    assert!(got.attempts.is_empty());
    assert_eq!(got.reason, None);
    let leased = b.lease_one(&q, LONG).await;
    assert_eq!(leased.id, id);
    assert_eq!(leased.attempts, 0);
    assert_eq!(leased.leases, 1);
    assert_eq!(leased.headers, m.headers);
    assert_eq!(leased.body, Bytes::from(body));
    assert_eq!(leased.tenant.as_deref(), Some("acme"));
    assert_eq!(leased.enqueued_at_ms, got.enqueued_at_ms);
    assert!(leased.age < Duration::from_secs(30));
    let unknown = DeliveryId::parse("0123456789abcdef0123456789abcdef").unwrap();
    assert_eq!(b.queue.get(&unknown).await.unwrap(), None);
}

async fn concurrent_enqueues_each_keep_their_own_message(b: &Backend) {
    // Enqueues that arrive together may share a statement (PostgreSQL batches them): each
    // caller must still get the id of its own message, with its own tenant, body and delay.
    let q = b.q("together");
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let queue = b.queue.clone();
            let mut m = message(&q, (i % 2 == 0).then_some("even"), &format!("m{i}"));
            if i % 10 == 0 {
                m.delay = Duration::from_secs(3600);
            }
            tokio::spawn(async move { (i, queue.enqueue(m).await.unwrap()) })
        })
        .collect();
    let mut due = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        let (i, enqueued) = task.await.unwrap();
        let Enqueued::New(id) = enqueued else {
            panic!("expected New, got {enqueued:?}");
        };
        let got = b.queue.get(&id).await.unwrap().expect("stored");
        assert_eq!(got.body, Bytes::from(format!("m{i}")), "message {i}");
        assert_eq!(got.tenant.as_deref(), (i % 2 == 0).then_some("even"));
        assert!(ids.insert(id.clone()), "each message its own id");
        if i % 10 != 0 {
            due.insert(id);
        }
    }
    let leased = b.queue.lease(&q, 500, LONG).await.unwrap();
    let leased: std::collections::HashSet<_> = leased.into_iter().map(|l| l.id).collect();
    assert_eq!(leased, due, "exactly the messages without a delay are due");
}

async fn dedupe_returns_the_first_id(b: &Backend) {
    let q = b.q("dd");
    let window = Duration::from_secs(3600);
    let first = b
        .queue
        .enqueue(deduped(&q, Some("t1"), "evt-1", window))
        .await
        .unwrap();
    let Enqueued::New(id) = first else {
        panic!("expected New, got {first:?}")
    };
    let again = b
        .queue
        .enqueue(deduped(&q, Some("t1"), "evt-1", window))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Duplicate(id.clone()));
    // The key is scoped by tenant and queue.
    for m in [
        deduped(&q, Some("t2"), "evt-1", window),
        deduped(&q, None, "evt-1", window),
        deduped(&b.q("dd-other"), Some("t1"), "evt-1", window),
    ] {
        assert!(matches!(
            b.queue.enqueue(m).await.unwrap(),
            Enqueued::New(_)
        ));
    }
    // Only one message was stored for the duplicate pair.
    let page = b
        .queue
        .list(&ListFilter {
            queue: Some(q.clone()),
            tenant: Some("t1".into()),
            ..ListFilter::all(100)
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(
        b.queue
            .get(&id)
            .await
            .unwrap()
            .unwrap()
            .dedupe_key
            .as_deref(),
        Some("evt-1")
    );
}

async fn concurrent_duplicates_one_winner(b: &Backend) {
    let q = b.q("ddc");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let queue = b.queue.clone();
            let m = deduped(&q, Some("t"), "evt-race", Duration::from_secs(3600));
            tokio::spawn(async move { queue.enqueue(m).await })
        })
        .collect();
    let mut new = Vec::new();
    let mut ids = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        if let Enqueued::New(id) = &r {
            new.push(id.clone());
        }
        ids.push(r.id().clone());
    }
    assert_eq!(
        new.len(),
        1,
        "exactly one of 32 concurrent enqueuers stores"
    );
    assert!(
        ids.iter().all(|id| *id == new[0]),
        "every duplicate names the first id"
    );
    assert_eq!(b.queue.stats(&q).await.unwrap().depth, 1);
}

async fn dedupe_outlives_delivery_and_purge(b: &Backend) {
    let q = b.q("ddp");
    let window = Duration::from_secs(3600);
    let id = b
        .queue
        .enqueue(deduped(&q, None, "evt-kept", window))
        .await
        .unwrap()
        .id()
        .clone();
    let l = b.lease_one(&q, LONG).await;
    b.queue.delivered(&id, l.token, attempt(200)).await.unwrap();
    let again = b.queue.enqueue(deduped(&q, None, "evt-kept", window)).await;
    assert_eq!(again.unwrap(), Enqueued::Duplicate(id.clone()));
    assert!(b.queue.purge(&id).await.unwrap());
    let again = b.queue.enqueue(deduped(&q, None, "evt-kept", window)).await;
    assert_eq!(again.unwrap(), Enqueued::Duplicate(id));
}

async fn dedupe_window_ends(b: &Backend) {
    let q = b.q("ddw");
    let window = Duration::from_millis(400);
    let first = b
        .queue
        .enqueue(deduped(&q, None, "evt-w", window))
        .await
        .unwrap();
    assert!(matches!(first, Enqueued::New(_)));
    tokio::time::sleep(PAST_LEASE).await;
    let later = b
        .queue
        .enqueue(deduped(&q, None, "evt-w", window))
        .await
        .unwrap();
    match later {
        Enqueued::New(id) => assert_ne!(&id, first.id()),
        other => panic!("the window has ended: expected New, got {other:?}"),
    }
}

async fn leases_are_exclusive_under_concurrency(b: &Backend) {
    let q = b.q("lx");
    for i in 0..60 {
        b.put(&q, None, &format!("m{i}")).await;
    }
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let queue = b.queue.clone();
            let q = q.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                // Bounded: 60 messages, at least one per non-empty round.
                for _ in 0..100 {
                    let batch = queue.lease(&q, 5, LONG).await.unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    got.extend(batch.into_iter().map(|l| l.id));
                }
                got
            })
        })
        .collect();
    let mut seen: HashMap<DeliveryId, usize> = HashMap::new();
    for t in tasks {
        for id in t.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 60, "every message leased");
    assert!(
        seen.values().all(|n| *n == 1),
        "no message leased twice while its lease lives"
    );
    assert!(b.queue.lease(&q, 10, LONG).await.unwrap().is_empty());
    assert_eq!(
        b.queue.stats(&q).await.unwrap().depth,
        60,
        "leased is still pending"
    );
}

async fn lease_respects_max_and_queue(b: &Backend) {
    let q = b.q("lm");
    for i in 0..5 {
        b.put(&q, None, &format!("m{i}")).await;
    }
    b.put(&b.q("lm-other"), None, "other").await;
    assert_eq!(b.queue.lease(&q, 3, LONG).await.unwrap().len(), 3);
    assert_eq!(b.queue.lease(&q, 10, LONG).await.unwrap().len(), 2);
    assert!(b.queue.lease(&q, 10, LONG).await.unwrap().is_empty());
    assert!(b
        .queue
        .lease(&b.q("empty"), 10, LONG)
        .await
        .unwrap()
        .is_empty());
}

async fn expired_lease_is_leased_again_with_a_new_token(b: &Backend) {
    let q = b.q("le");
    let id = b.put(&q, None, "x").await;
    let first = b.lease_one(&q, LEASE).await;
    assert!(b.queue.lease(&q, 10, LEASE).await.unwrap().is_empty());
    tokio::time::sleep(PAST_LEASE).await;
    // The expired holder is refused even before anyone takes over.
    assert_fenced(
        b.queue
            .retry_at(&id, first.token, attempt(503), Duration::ZERO)
            .await,
    );
    let second = b.lease_one(&q, LONG).await;
    assert_eq!(second.id, id);
    assert!(second.token > first.token, "fencing tokens grow");
    assert_eq!(second.leases, 2);
    assert_eq!(second.attempts, 0);
    assert_fenced(b.queue.delivered(&id, first.token, attempt(200)).await);
    assert_fenced(b.queue.dead(&id, first.token, None, "late").await);
    b.queue
        .delivered(&id, second.token, attempt(200))
        .await
        .unwrap();
    // Finished: the token that finished it is refused too.
    assert_fenced(b.queue.delivered(&id, second.token, attempt(200)).await);
    let got = b.queue.get(&id).await.unwrap().unwrap();
    assert_eq!(got.state, State::Delivered);
    assert_eq!(
        got.attempts,
        vec![attempt(200)],
        "refused outcomes record nothing"
    );
}

async fn retry_at_sets_the_due_time(b: &Backend) {
    let q = b.q("ra");
    let id = b.put(&q, None, "x").await;
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .retry_at(&id, l.token, attempt(503), Duration::from_millis(400))
        .await
        .unwrap();
    assert_fenced(
        b.queue
            .retry_at(&id, l.token, attempt(503), Duration::ZERO)
            .await,
    );
    assert!(
        b.queue.lease(&q, 10, LONG).await.unwrap().is_empty(),
        "not due yet"
    );
    let got = b.queue.get(&id).await.unwrap().unwrap();
    assert_eq!(got.state, State::Pending);
    assert!(got.due_at_ms > got.updated_at_ms);
    tokio::time::sleep(PAST_LEASE).await;
    let again = b.lease_one(&q, LONG).await;
    assert_eq!(again.id, id);
    assert_eq!(again.attempts, 1);
    assert!(again.token > l.token);
    // A zero delay is due at once.
    b.queue
        .retry_at(&id, again.token, attempt(502), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(b.lease_one(&q, LONG).await.attempts, 2);
}

async fn delayed_enqueue_waits(b: &Backend) {
    let q = b.q("de");
    let mut m = message(&q, None, "later");
    m.delay = Duration::from_millis(400);
    b.queue.enqueue(m).await.unwrap();
    let now = b.put(&q, None, "now").await;
    let first = b.queue.lease(&q, 10, LONG).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].id, now);
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(b.queue.lease(&q, 10, LONG).await.unwrap().len(), 1);
}

async fn dead_letters_keep_payload_headers_and_history(b: &Backend) {
    let q = b.q("dl");
    let id = b.put(&q, Some("acme"), "payload").await;
    let l = b.lease_one(&q, LONG).await;
    let failed = Attempt {
        at_ms: 1_700_000_000_001,
        outcome: AttemptOutcome::Error("connect refused".into()),
        latency_ms: 3,
    };
    b.queue
        .retry_at(&id, l.token, failed.clone(), Duration::ZERO)
        .await
        .unwrap();
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .dead(&id, l.token, Some(attempt(400)), "upstream answered 400")
        .await
        .unwrap();
    assert_fenced(b.queue.delivered(&id, l.token, attempt(200)).await);
    let got = b.queue.get(&id).await.unwrap().unwrap();
    assert_eq!(got.state, State::Dead);
    assert_eq!(got.body, Bytes::from("payload"));
    assert_eq!(got.headers, message(&q, None, "").headers);
    assert_eq!(got.attempts, vec![failed, attempt(400)]);
    assert_eq!(got.reason.as_deref(), Some("upstream answered 400"));
    assert!(
        b.queue.lease(&q, 10, LONG).await.unwrap().is_empty(),
        "dead is not leased"
    );
    // Dead-lettered without an attempt (too old to try again).
    let id2 = b.put(&q, None, "old").await;
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .dead(&id2, l.token, None, "max_age exceeded")
        .await
        .unwrap();
    let got = b.queue.get(&id2).await.unwrap().unwrap();
    assert!(got.attempts.is_empty());
    assert_eq!(got.reason.as_deref(), Some("max_age exceeded"));
    assert_eq!(b.queue.stats(&q).await.unwrap().dead, 2);
}

async fn replay_makes_dead_and_delivered_pending(b: &Backend) {
    let q = b.q("rp");
    let id = b.put(&q, None, "x").await;
    assert!(matches!(
        b.queue.replay(&id).await,
        Err(QueueError::StillPending(_))
    ));
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .dead(&id, l.token, Some(attempt(400)), "bad")
        .await
        .unwrap();
    // Older than the age bound below since its enqueue, but replayed just now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    b.queue.replay(&id).await.unwrap();
    assert_eq!(b.state(&id).await, State::Pending);
    let again = b.lease_one(&q, LONG).await;
    assert_eq!(again.id, id);
    assert_eq!(again.attempts, 0, "a replay starts a fresh schedule");
    assert_eq!(again.leases, 1);
    assert!(
        again.age < Duration::from_millis(300),
        "age counts from the replay"
    );
    assert_eq!(
        b.queue.get(&id).await.unwrap().unwrap().attempts,
        vec![attempt(400)]
    );
    assert!(again.token > l.token);
    assert_fenced(b.queue.delivered(&id, l.token, attempt(200)).await);
    b.queue
        .delivered(&id, again.token, attempt(200))
        .await
        .unwrap();
    b.queue.replay(&id).await.unwrap();
    let third = b.lease_one(&q, LONG).await;
    assert_eq!(third.attempts, 0);
    let got = b.queue.get(&id).await.unwrap().unwrap();
    assert_eq!(got.attempts, vec![attempt(400), attempt(200)]);
    let unknown = DeliveryId::parse("0123456789abcdef0123456789abcdef").unwrap();
    assert!(b.queue.replay(&unknown).await.unwrap_err().is_not_found());
}

async fn purge_removes_in_any_state(b: &Backend) {
    let q = b.q("pg");
    let id = b.put(&q, None, "x").await;
    let l = b.lease_one(&q, LONG).await;
    assert!(b.queue.purge(&id).await.unwrap());
    assert!(!b.queue.purge(&id).await.unwrap());
    assert_eq!(b.queue.get(&id).await.unwrap(), None);
    let late = b
        .queue
        .delivered(&id, l.token, attempt(200))
        .await
        .unwrap_err();
    assert!(late.is_not_found(), "{late:?}");
    let dead = b.put(&q, None, "y").await;
    let l = b.lease_one(&q, LONG).await;
    b.queue.dead(&dead, l.token, None, "r").await.unwrap();
    assert!(b.queue.purge(&dead).await.unwrap());
    let stats = b.queue.stats(&q).await.unwrap();
    assert_eq!((stats.depth, stats.dead), (0, 0));
    assert!(b.queue.lease(&q, 10, LONG).await.unwrap().is_empty());
}

async fn list_filters_and_pages(b: &Backend) {
    let q = b.q("ls");
    let other = b.q("ls-other");
    let mut ids = Vec::new();
    for i in 0..7 {
        let tenant = if i % 2 == 0 { "even" } else { "odd" };
        ids.push(b.put(&q, Some(tenant), &format!("m{i}")).await);
    }
    b.put(&other, Some("even"), "elsewhere").await;
    // One message delivered, one dead (which two is the engine's choice among the due).
    let leased = b.queue.lease(&q, 2, LONG).await.unwrap();
    assert_eq!(leased.len(), 2);
    let (delivered, dead) = (leased[0].id.clone(), leased[1].id.clone());
    b.queue
        .delivered(&delivered, leased[0].token, attempt(200))
        .await
        .unwrap();
    b.queue
        .dead(&dead, leased[1].token, None, "r")
        .await
        .unwrap();
    let pending: Vec<&DeliveryId> = ids
        .iter()
        .filter(|id| **id != delivered && **id != dead)
        .collect();
    // Pages of 3 over the queue, oldest first, every id once.
    let mut filter = ListFilter {
        queue: Some(q.clone()),
        ..ListFilter::all(3)
    };
    let mut listed = Vec::new();
    for _ in 0..10 {
        let page = b.queue.list(&filter).await.unwrap();
        assert!(page.items.len() <= 3);
        listed.extend(page.items.iter().map(|s| s.id.clone()));
        match page.next {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(listed, ids, "all pages, in enqueue order, no repeats");
    let by = |state: Option<State>, tenant: Option<&str>| ListFilter {
        state,
        queue: Some(q.clone()),
        tenant: tenant.map(str::to_owned),
        ..ListFilter::all(100)
    };
    let page = b.queue.list(&by(Some(State::Dead), None)).await.unwrap();
    assert_eq!(
        page.items.iter().map(|s| &s.id).collect::<Vec<_>>(),
        vec![&dead]
    );
    assert_eq!(page.items[0].reason.as_deref(), Some("r"));
    assert_eq!(page.next, None);
    let page = b
        .queue
        .list(&by(Some(State::Delivered), None))
        .await
        .unwrap();
    assert_eq!(
        page.items.iter().map(|s| &s.id).collect::<Vec<_>>(),
        vec![&delivered]
    );
    assert_eq!(page.items[0].attempts, 1);
    let page = b.queue.list(&by(Some(State::Pending), None)).await.unwrap();
    assert_eq!(
        page.items.iter().map(|s| &s.id).collect::<Vec<_>>(),
        pending
    );
    // Tenant "odd" is ids 1, 3, 5: its pending ones, in order.
    let page = b
        .queue
        .list(&by(Some(State::Pending), Some("odd")))
        .await
        .unwrap();
    let odd: Vec<&DeliveryId> = [&ids[1], &ids[3], &ids[5]]
        .into_iter()
        .filter(|id| pending.contains(id))
        .collect();
    assert_eq!(page.items.iter().map(|s| &s.id).collect::<Vec<_>>(), odd);
    assert!(page
        .items
        .iter()
        .all(|s| s.tenant.as_deref() == Some("odd")));
    let page = b.queue.list(&by(None, Some("even"))).await.unwrap();
    assert_eq!(page.items.len(), 4);
    assert!(page
        .items
        .iter()
        .all(|s| s.tenant.as_deref() == Some("even")));
    // Without a queue filter, the other queue's message shows up too.
    let everything = ListFilter {
        tenant: Some("even".into()),
        ..ListFilter::all(1000)
    };
    let all: Vec<_> = collect_all(b, everything).await;
    assert!(all.iter().any(|s| s.queue == other));
    assert!(all.iter().any(|s| s.queue == q));
    let bad = ListFilter {
        cursor: Some(portcullis_queue::Cursor("not a cursor".into())),
        ..ListFilter::all(10)
    };
    assert!(matches!(
        b.queue.list(&bad).await,
        Err(QueueError::InvalidCursor(_))
    ));
}

async fn collect_all(b: &Backend, mut filter: ListFilter) -> Vec<portcullis_queue::Summary> {
    let mut out = Vec::new();
    for _ in 0..1000 {
        let page = b.queue.list(&filter).await.unwrap();
        out.extend(page.items);
        match page.next {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    out
}

async fn stats_count_depth_age_and_dead(b: &Backend) {
    let q = b.q("st");
    let empty = b.queue.stats(&q).await.unwrap();
    assert_eq!((empty.depth, empty.dead, empty.oldest_age), (0, 0, None));
    for i in 0..3 {
        b.put(&q, None, &format!("m{i}")).await;
    }
    let l = b.lease_one(&q, LONG).await;
    b.queue.dead(&l.id, l.token, None, "r").await.unwrap();
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .delivered(&l.id, l.token, attempt(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = b.queue.stats(&q).await.unwrap();
    assert_eq!((s.depth, s.dead), (1, 1));
    let age = s.oldest_age.expect("one pending");
    assert!(
        age >= Duration::from_millis(20) && age < Duration::from_secs(60),
        "{age:?}"
    );
}

async fn sweep_removes_delivered_after_retention(b: &Backend) {
    let q = b.q("sw");
    let delivered = b.put(&q, None, "d").await;
    let l = b.lease_one(&q, LONG).await;
    b.queue
        .delivered(&delivered, l.token, attempt(200))
        .await
        .unwrap();
    let dead = b.put(&q, None, "x").await;
    let l = b.lease_one(&q, LONG).await;
    b.queue.dead(&dead, l.token, None, "r").await.unwrap();
    let pending = b.put(&q, None, "p").await;
    let retention = Duration::from_millis(400);
    assert_eq!(b.queue.sweep(retention, 100).await.unwrap(), 0, "too young");
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(b.queue.sweep(retention, 100).await.unwrap(), 1);
    assert_eq!(b.queue.get(&delivered).await.unwrap(), None);
    assert_eq!(b.state(&dead).await, State::Dead, "dead letters stay");
    assert_eq!(b.state(&pending).await, State::Pending);
    assert_eq!(b.queue.sweep(retention, 100).await.unwrap(), 0);
}

async fn sweep_is_bounded(b: &Backend) {
    let q = b.q("swb");
    for i in 0..5 {
        b.put(&q, None, &format!("m{i}")).await;
    }
    for l in b.queue.lease(&q, 5, LONG).await.unwrap() {
        b.queue
            .delivered(&l.id, l.token, attempt(200))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retention = Duration::from_millis(100);
    let mut total = 0;
    for _ in 0..10 {
        let n = b.queue.sweep(retention, 2).await.unwrap();
        assert!(n <= 2, "one sweep removes at most its limit");
        total += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(total, 5);
}

async fn each_message_is_recorded_delivered_once_under_lease_churn(b: &Backend) {
    let q = b.q("churn");
    let mut ids = Vec::new();
    for i in 0..24 {
        ids.push(b.put(&q, None, &format!("m{i}")).await);
    }
    // Six workers with short leases; some "crash" (drop what they leased), some stall past
    // their lease before reporting. Only live holders may record an outcome.
    let lease = Duration::from_millis(250);
    let tasks: Vec<_> = (0..6u64)
        .map(|w| {
            let queue = b.queue.clone();
            let q = q.clone();
            tokio::spawn(async move {
                let mut delivered = Vec::new();
                let mut refused = 0u32;
                // Bounded: at most 120 rounds of at most 3 messages.
                for round in 0..120u64 {
                    let batch = queue.lease(&q, 3, lease).await.unwrap();
                    if batch.is_empty() {
                        if queue.stats(&q).await.unwrap().depth == 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    for (i, l) in batch.into_iter().enumerate() {
                        match (w + round + i as u64) % 5 {
                            0 => continue, // crashed: never reports
                            1 => tokio::time::sleep(lease + Duration::from_millis(150)).await,
                            _ => {}
                        }
                        match queue.delivered(&l.id, l.token, attempt(200)).await {
                            Ok(()) => delivered.push(l.id),
                            Err(e) if e.is_fenced() => refused += 1,
                            Err(e) => panic!("unexpected {e:?}"),
                        }
                    }
                }
                (delivered, refused)
            })
        })
        .collect();
    let mut count: HashMap<DeliveryId, usize> = HashMap::new();
    let mut refused = 0;
    for t in tasks {
        let (delivered, r) = t.await.unwrap();
        refused += r;
        for id in delivered {
            *count.entry(id).or_default() += 1;
        }
    }
    assert!(
        count.values().all(|n| *n == 1),
        "an outcome recorded twice: {count:?}"
    );
    assert_eq!(count.len(), ids.len(), "every message delivered");
    assert!(refused > 0, "the stalled holders were refused");
    for id in &ids {
        let m = b.queue.get(id).await.unwrap().unwrap();
        assert_eq!(m.state, State::Delivered);
        assert_eq!(m.attempts.len(), 1, "one recorded attempt per message");
    }
}

/// Expands each behaviour into one test per engine: `sqlite::name`, `postgres::name`,
/// `redis::name`, `redis_cluster::name`, on a multi-threaded runtime and the real clock.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = super::sqlite().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = super::postgres().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = super::redis().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(b) = super::redis_cluster().await {
                        super::$name(&b).await;
                        b.finish().await;
                    }
                }
            )*
        }
    };
}

conformance!(
    enqueue_then_get_round_trips,
    concurrent_enqueues_each_keep_their_own_message,
    dedupe_returns_the_first_id,
    concurrent_duplicates_one_winner,
    dedupe_outlives_delivery_and_purge,
    dedupe_window_ends,
    leases_are_exclusive_under_concurrency,
    lease_respects_max_and_queue,
    expired_lease_is_leased_again_with_a_new_token,
    retry_at_sets_the_due_time,
    delayed_enqueue_waits,
    dead_letters_keep_payload_headers_and_history,
    replay_makes_dead_and_delivered_pending,
    purge_removes_in_any_state,
    list_filters_and_pages,
    stats_count_depth_age_and_dead,
    sweep_removes_delivered_after_retention,
    sweep_is_bounded,
    each_message_is_recorded_delivered_once_under_lease_churn,
);
