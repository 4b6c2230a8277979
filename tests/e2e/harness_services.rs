use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::{postgres, redis};
use sqlx::Connection;

use crate::common::{client, BIN};

#[tokio::test]
async fn real_redis_answers() {
    let client = ::redis::Client::open(redis::shared_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = ::redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn real_postgres_has_the_migrations() {
    let url = postgres::fresh_database().await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    for table in ["api_keys", "audit_log", "tenants"] {
        assert!(
            tables.iter().any(|t| t == table),
            "{table} missing from {tables:?}"
        );
    }
}

#[tokio::test]
async fn gateway_runs_on_redis_and_postgres_and_upserts_tenants() {
    let database = postgres::fresh_database().await;
    let config = format!(
        "[storage]\nstate = \"{}\"\ndatabase = \"{database}\"\n\n[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-harness-key\"]\nrate = 5\nper = \"1s\"\nburst = 5\n",
        redis::shared_url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let ready = client()
        .get(gateway.admin_url() + "/readyz")
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());

    let mut conn = sqlx::PgConnection::connect(&database).await.unwrap();
    let (rate, keys): (i64, i64) = sqlx::query_as(
        "SELECT t.rate, (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id) FROM tenants t WHERE t.id = 'acme'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((rate, keys), (5, 1));
    let stored: Vec<u8> = sqlx::query_scalar("SELECT key_hash FROM api_keys")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_ne!(
        stored,
        b"acme-harness-key".to_vec(),
        "keys are stored hashed"
    );
    assert_eq!(stored.len(), 32);
}

#[tokio::test]
async fn readiness_fails_when_redis_is_down() {
    let mut server = redis::RedisServer::start().await;
    let config = format!("[storage]\nstate = \"{}\"\n", server.url());
    let gateway = GatewayProcess::start(BIN, &config).await;
    assert_eq!(
        client()
            .get(gateway.admin_url() + "/readyz")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    server.kill();
    let response = client()
        .get(gateway.admin_url() + "/readyz")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        client()
            .get(gateway.url() + "/healthz")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}
