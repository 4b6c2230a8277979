//! Start-up rules of the engines that the conformance suite cannot show on a shared server:
//! the Redis engine refuses an evicting server (a private `redis-server`), and `connect`
//! picks the engine from the URL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use portcullis_queue::{connect, ConnectOptions, QueueError, RedisQueue};
use portcullis_testkit::redis::RedisServer;

fn refused<T>(r: Result<T, QueueError>) -> QueueError {
    match r {
        Err(e) => e,
        Ok(_) => panic!("expected connect to fail"),
    }
}

async fn config_set(url: &str, name: &str, value: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_engine_refuses_an_evicting_server() {
    let server = RedisServer::start().await;
    let url = server.url();
    config_set(&url, "maxmemory", "104857600").await;
    config_set(&url, "maxmemory-policy", "allkeys-lru").await;
    match RedisQueue::connect(&url, Duration::from_secs(2)).await {
        Err(QueueError::Evicting { maxmemory, policy }) => {
            assert_eq!(maxmemory, 104_857_600);
            assert_eq!(policy, "allkeys-lru");
        }
        other => panic!("an evicting Redis must be refused, got {other:?}"),
    }
    let via_url = connect(&url, &ConnectOptions::default()).await;
    assert!(matches!(via_url, Err(QueueError::Evicting { .. })));
    config_set(&url, "maxmemory-policy", "noeviction").await;
    let queue = connect(&url, &ConnectOptions::default()).await.unwrap();
    assert_eq!(queue.engine(), "redis");
}

#[tokio::test]
async fn connect_picks_sqlite_from_the_url_and_names_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let queue = connect(&url, &ConnectOptions::default()).await.unwrap();
    assert_eq!(queue.engine(), "sqlite");
    let missing = format!("sqlite://{}", dir.path().join("no/such/dir/q.db").display());
    let err = refused(connect(&missing, &ConnectOptions::default()).await);
    assert!(matches!(err, QueueError::File { .. }), "{err:?}");
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    let err = refused(connect("mysql://u:hunter2@h/db", &ConnectOptions::default()).await);
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
