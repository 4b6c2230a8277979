//! API keys (issue, list, revoke) and per-route quota overrides.

use rand::Rng;

use super::tenants::load_existing;
use super::{finish, millis, to_i64, to_json, AdminStore, IssuedKey, KeyView, RouteQuota};
use crate::admin::error::AdminError;
use crate::admin::sql::{Arg, Tx};
use crate::admin::validate;
use crate::db::hash_api_key;

/// Issued keys start with this, so they are recognisable in configs and secret scanners.
pub(crate) const KEY_PREFIX: &str = "pc_";
/// Random characters after [`KEY_PREFIX`]: 32 × 6 bits = 192 bits of entropy.
pub(crate) const KEY_RANDOM_CHARS: usize = 32;
/// Characters of an issued key stored in clear to recognise it (`pc_` + 7 random ones, i.e.
/// 42 of the 192 bits: enough to tell keys apart, far too few to guess the rest).
pub(crate) const VISIBLE_PREFIX_CHARS: usize = 10;

const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A new random key from the operating system's CSPRNG.
pub(crate) fn generate_key() -> String {
    let mut rng = rand::rngs::OsRng;
    let mut key = String::with_capacity(KEY_PREFIX.len() + KEY_RANDOM_CHARS);
    key.push_str(KEY_PREFIX);
    for _ in 0..KEY_RANDOM_CHARS {
        let index = rng.gen_range(0..URL_SAFE.len());
        key.push(char::from(URL_SAFE[index]));
    }
    key
}

/// An `api_keys` row as the admin API shows it (the hash is never read back).
#[derive(Debug, sqlx::FromRow)]
struct KeyRecord {
    id: i64,
    tenant_id: String,
    prefix: String,
    created_at: String,
    revoked_at: Option<String>,
}

fn key_select(tx: &Tx) -> String {
    format!(
        "SELECT CAST(id AS BIGINT) AS id, tenant_id, prefix, {}, {} FROM api_keys",
        tx.ts("created_at"),
        tx.ts("revoked_at")
    )
}

fn key_view(row: KeyRecord) -> KeyView {
    KeyView {
        id: row.id,
        tenant: row.tenant_id,
        prefix: row.prefix,
        created_at: row.created_at,
        revoked_at: row.revoked_at,
    }
}

async fn load_key(tx: &mut Tx, tenant: &str, key_id: i64) -> Result<KeyView, AdminError> {
    let sql = format!("{} WHERE id = $1 AND tenant_id = $2", key_select(tx));
    tx.fetch_optional::<KeyRecord>(&sql, vec![Arg::I64(key_id), Arg::Text(tenant.to_owned())])
        .await?
        .map(key_view)
        .ok_or_else(|| AdminError::NotFound(format!("tenant {tenant:?} has no key {key_id}")))
}

// === impl AdminStore ===

impl AdminStore {
    /// Issues a key for `tenant`. Only its SHA-256 and visible prefix are stored; the
    /// plaintext is in the returned value and nowhere else.
    pub(crate) async fn issue_key(
        &self,
        actor: &str,
        tenant: &str,
    ) -> Result<IssuedKey, AdminError> {
        let mut tx = Tx::begin_change(&self.db).await?;
        load_existing(&mut tx, tenant).await?;
        let api_key = generate_key();
        let prefix: String = api_key.chars().take(VISIBLE_PREFIX_CHARS).collect();
        let (id,): (i64,) = tx
            .fetch_optional(
                "INSERT INTO api_keys (tenant_id, key_hash, prefix) VALUES ($1, $2, $3) \
                 RETURNING CAST(id AS BIGINT)",
                vec![
                    Arg::Text(tenant.to_owned()),
                    Arg::Bytes(hash_api_key(&api_key)),
                    Arg::Text(prefix),
                ],
            )
            .await?
            .ok_or(AdminError::Database(sqlx::Error::RowNotFound))?;
        let key = load_key(&mut tx, tenant, id).await?;
        finish(tx, actor, "key.issue", tenant, None, to_json(&key)).await?;
        Ok(IssuedKey { key, api_key })
    }

    /// A tenant's keys (prefixes only), oldest first, revoked ones included.
    pub(crate) async fn list_keys(&self, tenant: &str) -> Result<Vec<KeyView>, AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        load_existing(&mut tx, tenant).await?;
        let sql = format!("{} WHERE tenant_id = $1 ORDER BY id", key_select(&tx));
        let rows: Vec<KeyRecord> = tx
            .fetch_all(&sql, vec![Arg::Text(tenant.to_owned())])
            .await?;
        Ok(rows.into_iter().map(key_view).collect())
    }

    /// Revokes a key. Revoking an already revoked key changes nothing and succeeds, so a
    /// retried revocation is safe.
    pub(crate) async fn revoke_key(
        &self,
        actor: &str,
        tenant: &str,
        key_id: i64,
    ) -> Result<KeyView, AdminError> {
        let mut tx = Tx::begin_change(&self.db).await?;
        load_existing(&mut tx, tenant).await?;
        let before = load_key(&mut tx, tenant, key_id).await?;
        if before.revoked_at.is_some() {
            return Ok(before);
        }
        let sql = format!(
            "UPDATE api_keys SET revoked_at = {} WHERE id = $1 AND tenant_id = $2",
            tx.now()
        );
        tx.execute(&sql, vec![Arg::I64(key_id), Arg::Text(tenant.to_owned())])
            .await?;
        let after = load_key(&mut tx, tenant, key_id).await?;
        finish(
            tx,
            actor,
            "key.revoke",
            tenant,
            to_json(&before),
            to_json(&after),
        )
        .await?;
        Ok(after)
    }

    /// Sets (creates or replaces) a per-route override.
    pub(crate) async fn put_route_quota(
        &self,
        actor: &str,
        tenant: &str,
        quota: &RouteQuota,
    ) -> Result<super::TenantView, AdminError> {
        let cost = validate::route(&quota.route, self.routes())
            .map_err(|reason| AdminError::invalid("route", reason))?;
        let errors = validate::bucket(quota.rate, quota.per, quota.burst, cost);
        if !errors.is_empty() {
            return Err(AdminError::Invalid(errors));
        }
        let mut tx = Tx::begin_change(&self.db).await?;
        let before = load_existing(&mut tx, tenant).await?;
        tx.execute(
            "INSERT INTO route_quotas (tenant_id, route_prefix, rate, per_ms, burst) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id, route_prefix) DO UPDATE SET rate = excluded.rate, per_ms = excluded.per_ms, burst = excluded.burst",
            vec![
                Arg::Text(tenant.to_owned()),
                Arg::Text(quota.route.clone()),
                Arg::I64(to_i64(quota.rate)),
                Arg::I64(millis(quota.per)),
                Arg::I64(to_i64(quota.burst)),
            ],
        )
        .await?;
        let after = load_existing(&mut tx, tenant).await?;
        if after == before {
            return Ok(after);
        }
        finish(
            tx,
            actor,
            "route_quota.set",
            tenant,
            to_json(&before),
            to_json(&after),
        )
        .await?;
        Ok(after)
    }

    /// Removes a per-route override; 404 when there is none for `route`.
    pub(crate) async fn delete_route_quota(
        &self,
        actor: &str,
        tenant: &str,
        route: &str,
    ) -> Result<super::TenantView, AdminError> {
        let mut tx = Tx::begin_change(&self.db).await?;
        let before = load_existing(&mut tx, tenant).await?;
        let deleted = tx
            .execute(
                "DELETE FROM route_quotas WHERE tenant_id = $1 AND route_prefix = $2",
                vec![Arg::Text(tenant.to_owned()), Arg::Text(route.to_owned())],
            )
            .await?;
        if deleted == 0 {
            return Err(AdminError::NotFound(format!(
                "tenant {tenant:?} has no override for route {route:?}"
            )));
        }
        let after = load_existing(&mut tx, tenant).await?;
        finish(
            tx,
            actor,
            "route_quota.delete",
            tenant,
            to_json(&before),
            to_json(&after),
        )
        .await?;
        Ok(after)
    }
}
