//! Conformance suite of the admin store: one `async fn` per behaviour, each run against a
//! SQLite file and a fresh database on a real PostgreSQL (`PORTCULLIS_TEST_DATABASE_URL`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;
use crate::admin::sql::{Arg, Tx};
use crate::directory::Directory;

struct Fixture {
    store: AdminStore,
    db: Database,
    _dir: Option<tempfile::TempDir>,
}

fn routes() -> Arc<[ConfiguredRoute]> {
    Arc::from(vec![
        ConfiguredRoute {
            name: "/orders".into(),
            cost: 2,
        },
        ConfiguredRoute {
            name: "/".into(),
            cost: 1,
        },
    ])
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::sqlite(&dir.path().join("admin.db"))
        .await
        .unwrap();
    Fixture {
        store: AdminStore::new(db.clone(), routes()),
        db,
        _dir: Some(dir),
    }
}

async fn postgres() -> Fixture {
    let url = portcullis_testkit::postgres::fresh_database().await;
    let db = Database::postgres(&url).await.unwrap();
    Fixture {
        store: AdminStore::new(db.clone(), routes()),
        db,
        _dir: None,
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[tokio::test] async fn $name() { super::$name(super::sqlite().await).await; })*
        }
        mod postgres_backend {
            $(#[tokio::test] async fn $name() { super::$name(super::postgres().await).await; })*
        }
    };
}

conformance!(
    create_get_list_round_trip,
    duplicate_id_conflicts_and_writes_nothing,
    update_merges_and_audits_before_and_after,
    unchanged_update_writes_nothing,
    invalid_limits_write_nothing,
    keys_are_stored_hashed_listed_by_prefix_and_revocable,
    route_overrides_must_name_a_route_and_reach_the_snapshot,
    delete_removes_keys_and_overrides_but_keeps_history,
    pagination_visits_every_tenant_once,
    audit_log_filters_by_tenant_and_pages_newest_first,
    search_matches_id_or_name_ignoring_case_and_wildcards,
    audit_log_filters_by_action_and_actor,
);

fn new_tenant(id: &str, rate: u64, burst: u64) -> NewTenant {
    NewTenant {
        id: id.into(),
        name: format!("{id} inc"),
        limits: Limits {
            rate,
            per: Duration::from_secs(1),
            burst,
            daily_quota: None,
            monthly_quota: Some(1000),
            max_in_flight: Some(8),
            max_websockets: Some(4),
            websocket_idle_timeout: Some(Duration::from_secs(30)),
            websocket_max_lifetime: None,
        },
    }
}

async fn audit_count(f: &Fixture) -> usize {
    f.store
        .audit_log(&AuditFilter::default(), MAX_PAGE, None)
        .await
        .unwrap()
        .items
        .len()
}

async fn create_get_list_round_trip(f: Fixture) {
    let version = f.db.config_version().await.unwrap();
    let created = f
        .store
        .create_tenant("tester", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    assert_eq!(
        (created.rate, created.per.as_str(), created.burst),
        (10, "1s", 20)
    );
    assert_eq!(
        (
            created.daily_quota,
            created.monthly_quota,
            created.max_in_flight
        ),
        (None, Some(1000), Some(8))
    );
    assert!(created.created_at.ends_with('Z') && created.created_at.contains('T'));
    assert_eq!(f.store.get_tenant("acme").await.unwrap(), created);
    let page = f.store.list_tenants(10, None, None).await.unwrap();
    assert_eq!(page.items, vec![created]);
    assert_eq!(page.next_cursor, None);
    assert!(matches!(
        f.store.get_tenant("nope").await,
        Err(AdminError::NotFound(_))
    ));
    assert!(
        f.db.config_version().await.unwrap() > version,
        "changes bump the version"
    );
    let snapshot = load_snapshot(&f.db).await;
    assert_eq!(
        snapshot
            .by_id("acme")
            .unwrap()
            .policy
            .as_ref()
            .unwrap()
            .burst(),
        20
    );
    assert_eq!(snapshot.by_id("acme").unwrap().max_in_flight, Some(8));
}

async fn duplicate_id_conflicts_and_writes_nothing(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let (version, audits) = (f.db.config_version().await.unwrap(), audit_count(&f).await);
    let err = f
        .store
        .create_tenant("a", &new_tenant("acme", 1, 2))
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::Conflict(_)), "{err:?}");
    assert_eq!(f.store.get_tenant("acme").await.unwrap().rate, 10);
    assert_eq!(f.db.config_version().await.unwrap(), version);
    assert_eq!(audit_count(&f).await, audits);
}

async fn update_merges_and_audits_before_and_after(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let patch = TenantPatch {
        burst: Some(5),
        per: Some(Duration::from_millis(1500)),
        daily_quota: Some(Some(100)),
        monthly_quota: Some(None),
        max_in_flight: Some(Some(3)),
        ..TenantPatch::default()
    };
    let after = f
        .store
        .update_tenant("admin-token:alice", "quota.update", "acme", &patch)
        .await
        .unwrap();
    assert_eq!((after.rate, after.burst), (10, 5), "rate kept, burst set");
    assert_eq!(after.per, "1s 500ms");
    assert_eq!((after.daily_quota, after.monthly_quota), (Some(100), None));
    assert_eq!(after.max_in_flight, Some(3));
    let entry = &f
        .store
        .audit_log(&AuditFilter::of_tenant("acme"), 1, None)
        .await
        .unwrap()
        .items[0];
    assert_eq!(
        (entry.actor.as_str(), entry.action.as_str()),
        ("admin-token:alice", "quota.update")
    );
    assert_eq!(entry.before["burst"], 20);
    assert_eq!(entry.after["burst"], 5);
    assert_eq!(entry.before["monthly_quota"], 1000);
    assert_eq!(entry.after["monthly_quota"], json!(null));
    assert_eq!(entry.before["max_in_flight"], 8);
    assert_eq!(entry.after["max_in_flight"], 3);
    let disabled = f
        .store
        .update_tenant(
            "a",
            "tenant.disable",
            "acme",
            &TenantPatch {
                disabled: Some(true),
                ..TenantPatch::default()
            },
        )
        .await
        .unwrap();
    assert!(disabled.disabled);
    assert!(load_snapshot(&f.db).await.by_id("acme").unwrap().disabled);
}

async fn unchanged_update_writes_nothing(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let (version, audits) = (f.db.config_version().await.unwrap(), audit_count(&f).await);
    let patch = TenantPatch {
        burst: Some(20),
        ..TenantPatch::default()
    };
    f.store
        .update_tenant("a", "quota.update", "acme", &patch)
        .await
        .unwrap();
    assert_eq!(f.db.config_version().await.unwrap(), version);
    assert_eq!(audit_count(&f).await, audits);
}

async fn invalid_limits_write_nothing(f: Fixture) {
    let err = f
        .store
        .create_tenant("a", &new_tenant("acme", 10, 1))
        .await
        .unwrap_err();
    let AdminError::Invalid(errors) = err else {
        panic!("expected 422, got {err:?}")
    };
    assert_eq!(errors[0].field, "burst", "below the /orders cost of 2");
    assert!(matches!(
        f.store.get_tenant("acme").await,
        Err(AdminError::NotFound(_))
    ));
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let patch = TenantPatch {
        rate: Some(2_000_000_000), // more than one token per nanosecond
        ..TenantPatch::default()
    };
    let err = f
        .store
        .update_tenant("a", "quota.update", "acme", &patch)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AdminError::Invalid(e) if e[0].field == "rate"),
        "{err:?}"
    );
    assert_eq!(f.store.get_tenant("acme").await.unwrap().rate, 10);
}

async fn keys_are_stored_hashed_listed_by_prefix_and_revocable(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let issued = f.store.issue_key("a", "acme").await.unwrap();
    assert!(issued.api_key.starts_with("pc_") && issued.api_key.len() == 35);
    assert_eq!(issued.key.prefix, issued.api_key[..10]);
    let hash: [u8; 32] = Sha256::digest(issued.api_key.as_bytes()).into();
    let snapshot = load_snapshot(&f.db).await;
    assert_eq!(&*snapshot.by_key_hash(&hash).unwrap().id, "acme");

    let mut tx = Tx::begin(&f.db).await.unwrap();
    let (stored, prefix): (Vec<u8>, String) = tx
        .fetch_optional(
            "SELECT key_hash, prefix FROM api_keys WHERE id = $1",
            vec![Arg::I64(issued.key.id)],
        )
        .await
        .unwrap()
        .unwrap();
    drop(tx);
    assert_eq!(
        (stored.as_slice(), prefix.as_str()),
        (&hash[..], &issued.api_key[..10])
    );
    let audit = serde_json::to_string(
        &f.store
            .audit_log(&AuditFilter::default(), MAX_PAGE, None)
            .await
            .unwrap()
            .items,
    )
    .unwrap();
    assert!(
        !audit.contains(&issued.api_key),
        "the audit log never holds the key"
    );

    let keys = f.store.list_keys("acme").await.unwrap();
    assert_eq!(keys, vec![issued.key.clone()]);
    let revoked = f
        .store
        .revoke_key("a", "acme", issued.key.id)
        .await
        .unwrap();
    assert!(revoked.revoked_at.is_some());
    assert!(load_snapshot(&f.db).await.by_key_hash(&hash).is_none());
    let audits = audit_count(&f).await;
    let again = f
        .store
        .revoke_key("a", "acme", issued.key.id)
        .await
        .unwrap();
    assert_eq!(again, revoked, "revoking twice changes nothing");
    assert_eq!(audit_count(&f).await, audits);
    assert!(matches!(
        f.store.revoke_key("a", "other", issued.key.id).await,
        Err(AdminError::NotFound(_))
    ));
    assert!(matches!(
        f.store.issue_key("a", "nope").await,
        Err(AdminError::NotFound(_))
    ));
}

async fn route_overrides_must_name_a_route_and_reach_the_snapshot(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let quota = |route: &str, burst| RouteQuota {
        route: route.into(),
        rate: 5,
        per: Duration::from_secs(1),
        burst,
    };
    let err = f
        .store
        .put_route_quota("a", "acme", &quota("/nope", 5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AdminError::Invalid(e) if e[0].field == "route"),
        "{err:?}"
    );
    let err = f
        .store
        .put_route_quota("a", "acme", &quota("/orders", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AdminError::Invalid(e) if e[0].field == "burst"),
        "{err:?}"
    );
    f.store
        .put_route_quota("a", "acme", &quota("/orders", 5))
        .await
        .unwrap();
    let tenant = f
        .store
        .put_route_quota("a", "acme", &quota("/orders", 7))
        .await
        .unwrap();
    assert_eq!(tenant.route_quotas.len(), 1, "set replaces");
    assert_eq!(tenant.route_quotas[0].burst, 7);
    let snapshot = load_snapshot(&f.db).await;
    assert_eq!(
        snapshot.by_id("acme").unwrap().route_policies["/orders"]
            .1
            .burst(),
        7
    );
    let tenant = f
        .store
        .delete_route_quota("a", "acme", "/orders")
        .await
        .unwrap();
    assert!(tenant.route_quotas.is_empty());
    assert!(matches!(
        f.store.delete_route_quota("a", "acme", "/orders").await,
        Err(AdminError::NotFound(_))
    ));
}

async fn delete_removes_keys_and_overrides_but_keeps_history(f: Fixture) {
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    let issued = f.store.issue_key("a", "acme").await.unwrap();
    let route = RouteQuota {
        route: "/".into(),
        rate: 1,
        per: Duration::from_secs(1),
        burst: 1,
    };
    f.store.put_route_quota("a", "acme", &route).await.unwrap();
    f.store.delete_tenant("a", "acme").await.unwrap();
    assert!(matches!(
        f.store.get_tenant("acme").await,
        Err(AdminError::NotFound(_))
    ));
    let hash: [u8; 32] = Sha256::digest(issued.api_key.as_bytes()).into();
    assert!(load_snapshot(&f.db).await.by_key_hash(&hash).is_none());
    // Re-creating the id starts clean: no key, no override.
    f.store
        .create_tenant("a", &new_tenant("acme", 10, 20))
        .await
        .unwrap();
    assert!(f.store.list_keys("acme").await.unwrap().is_empty());
    assert!(f
        .store
        .get_tenant("acme")
        .await
        .unwrap()
        .route_quotas
        .is_empty());
    let actions: Vec<String> = f
        .store
        .audit_log(&AuditFilter::of_tenant("acme"), MAX_PAGE, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(
        actions,
        [
            "tenant.create",
            "tenant.delete",
            "route_quota.set",
            "key.issue",
            "tenant.create"
        ]
    );
}

async fn pagination_visits_every_tenant_once(f: Fixture) {
    for i in 0..7 {
        f.store
            .create_tenant("a", &new_tenant(&format!("t{i}"), 10, 20))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = f
            .store
            .list_tenants(3, cursor.as_deref(), None)
            .await
            .unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.into_iter().map(|t| t.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["t0", "t1", "t2", "t3", "t4", "t5", "t6"]);
}

async fn audit_log_filters_by_tenant_and_pages_newest_first(f: Fixture) {
    for id in ["a", "b"] {
        f.store
            .create_tenant("x", &new_tenant(id, 10, 20))
            .await
            .unwrap();
        f.store.issue_key("x", id).await.unwrap();
    }
    f.store
        .record("x", "period.reset", "a", None, Some(json!({"used": 0})))
        .await
        .unwrap();
    let first = f
        .store
        .audit_log(&AuditFilter::of_tenant("a"), 2, None)
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.items[0].action, "period.reset");
    assert_eq!(first.items[0].after, json!({"used": 0}));
    let cursor: i64 = first.next_cursor.as_deref().unwrap().parse().unwrap();
    let rest = f
        .store
        .audit_log(&AuditFilter::of_tenant("a"), 2, Some(cursor))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.items[0].action, "tenant.create");
    assert_eq!(rest.items[0].before, json!(null));
    assert_eq!(rest.next_cursor, None);
    assert!(first.items[0].id > first.items[1].id && first.items[1].id > rest.items[0].id);
    assert!(first
        .items
        .iter()
        .chain(&rest.items)
        .all(|e| e.tenant.as_deref() == Some("a")));
    assert_eq!(audit_count(&f).await, 5);
}

async fn search_matches_id_or_name_ignoring_case_and_wildcards(f: Fixture) {
    for id in ["Acme-eu", "acme_us", "globex", "initech"] {
        f.store
            .create_tenant("a", &new_tenant(id, 10, 20))
            .await
            .unwrap();
    }
    let ids = |page: Page<TenantView>| page.items.into_iter().map(|t| t.id).collect::<Vec<_>>();
    let search = |q: &'static str| f.store.list_tenants(10, None, Some(q));
    assert_eq!(ids(search("ACME").await.unwrap()), ["Acme-eu", "acme_us"]);
    // `_` and `%` are literal, not wildcards.
    assert_eq!(
        ids(search("e_e").await.unwrap()),
        Vec::<String>::new(),
        "no wildcard for acme-eu"
    );
    assert_eq!(ids(search("e_us").await.unwrap()), ["acme_us"]);
    assert_eq!(ids(search("%").await.unwrap()), Vec::<String>::new());
    // Names match too ("globex inc").
    assert_eq!(ids(search("x inc").await.unwrap()), ["globex"]);
    // A non-ASCII name matches itself spelled the same on both databases (case folding
    // beyond ASCII is the database's own).
    let ecole = NewTenant {
        name: "ÉCOLE Lyon".into(),
        ..new_tenant("ecole", 10, 20)
    };
    f.store.create_tenant("a", &ecole).await.unwrap();
    assert_eq!(ids(search("ÉCOLE").await.unwrap()), ["ecole"]);
    assert_eq!(ids(search("École LYON").await.unwrap()), ["ecole"]);
    // Paging within a search.
    let first = f.store.list_tenants(1, None, Some("acme")).await.unwrap();
    let cursor = first.next_cursor.clone().unwrap();
    assert_eq!(ids(first), ["Acme-eu"]);
    let rest = f
        .store
        .list_tenants(1, Some(&cursor), Some("acme"))
        .await
        .unwrap();
    assert_eq!(ids(rest), ["acme_us"]);
}

async fn audit_log_filters_by_action_and_actor(f: Fixture) {
    f.store
        .create_tenant("alice", &new_tenant("a", 10, 20))
        .await
        .unwrap();
    f.store.issue_key("bob", "a").await.unwrap();
    f.store.issue_key("alice", "a").await.unwrap();
    let filter = |action: Option<&str>, actor: Option<&str>| AuditFilter {
        action: action.map(str::to_owned),
        actor: actor.map(str::to_owned),
        ..AuditFilter::default()
    };
    let page = f
        .store
        .audit_log(&filter(Some("key.issue"), None), MAX_PAGE, None)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let page = f
        .store
        .audit_log(&filter(Some("key.issue"), Some("alice")), MAX_PAGE, None)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].actor, "alice");
    let page = f
        .store
        .audit_log(&filter(None, Some("nobody")), MAX_PAGE, None)
        .await
        .unwrap();
    assert!(page.items.is_empty());
}

/// What the request path would see after a reload.
async fn load_snapshot(db: &Database) -> std::sync::Arc<crate::directory::Snapshot> {
    Directory::open(db).await.unwrap().snapshot()
}
