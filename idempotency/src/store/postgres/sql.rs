//! SQL for [`PostgresStore`](super::PostgresStore). Every statement is one round trip and
//! decides on the server's `now()`.

/// Lock or report, in one statement.
///
/// The `INSERT … ON CONFLICT DO UPDATE … WHERE` takes the row when it is new, past its
/// retention, or an in-flight row whose lease ran out (a takeover, counted in `takeovers`).
/// Otherwise the conflicting row is left alone (but row-locked by the statement) and the
/// second half of the `UNION` reports it. That half reads the statement's snapshot, so a
/// row inserted by a concurrent transaction that committed after the snapshot yields no
/// row at all; the caller retries then (the next statement sees it).
///
/// $1 tenant, $2 route, $3 key, $4 fingerprint, $5 lease seconds, $6 retention seconds.
pub(super) const TRY_LOCK: &str = r#"
WITH ins AS (
    INSERT INTO idempotency_records AS r
        (tenant, route, key, fingerprint, state, fencing_token, lease_until, expires_at, created_at)
    VALUES ($1, $2, $3, $4, 'in_flight', nextval('idempotency_fencing_seq'),
            now() + make_interval(secs => $5), now() + make_interval(secs => $6), now())
    ON CONFLICT (tenant, route, key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint,
        state = 'in_flight',
        fencing_token = EXCLUDED.fencing_token,
        lease_until = EXCLUDED.lease_until,
        expires_at = EXCLUDED.expires_at,
        created_at = EXCLUDED.created_at,
        response_status = NULL,
        response_headers = NULL,
        response_body = NULL,
        takeovers = CASE WHEN r.expires_at > now() THEN r.takeovers + 1 ELSE 0 END
    WHERE r.expires_at <= now() OR (r.state = 'in_flight' AND r.lease_until <= now())
    RETURNING r.fencing_token, r.takeovers
)
SELECT 'acquired'::text AS outcome, ins.fencing_token, ins.takeovers > 0 AS took_over,
       NULL::bytea AS fingerprint, NULL::text AS state, NULL::bigint AS lease_ms,
       NULL::smallint AS response_status, NULL::text AS response_headers,
       NULL::bytea AS response_body
FROM ins
UNION ALL
SELECT 'existing', r.fencing_token, false, r.fingerprint, r.state,
       GREATEST(0, CEIL(EXTRACT(EPOCH FROM (r.lease_until - now())) * 1000))::bigint,
       r.response_status, r.response_headers::text, r.response_body
FROM idempotency_records r
WHERE r.tenant = $1 AND r.route = $2 AND r.key = $3 AND NOT EXISTS (SELECT 1 FROM ins)
"#;

/// Store an outcome iff the caller holds a live lease; otherwise report the current row
/// (from the statement snapshot) so the caller can tell `Fenced` from `LeaseLost`.
///
/// $1 tenant, $2 route, $3 key, $4 fencing, $5 state, $6 status, $7 headers json,
/// $8 body, $9 retention seconds.
pub(super) const COMPLETE: &str = r#"
WITH upd AS (
    UPDATE idempotency_records SET
        state = $5, response_status = $6, response_headers = $7::jsonb, response_body = $8,
        lease_until = NULL, expires_at = now() + make_interval(secs => $9)
    WHERE tenant = $1 AND route = $2 AND key = $3
      AND state = 'in_flight' AND fencing_token = $4 AND lease_until > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM upd) AS changed, r.fencing_token, r.state
FROM (SELECT 1) AS one
LEFT JOIN idempotency_records r
       ON r.tenant = $1 AND r.route = $2 AND r.key = $3 AND r.expires_at > now()
"#;

/// Delete the in-flight row iff the caller holds a live lease; report as for `COMPLETE`.
///
/// $1 tenant, $2 route, $3 key, $4 fencing.
pub(super) const RELEASE: &str = r#"
WITH del AS (
    DELETE FROM idempotency_records
    WHERE tenant = $1 AND route = $2 AND key = $3
      AND state = 'in_flight' AND fencing_token = $4 AND lease_until > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM del) AS changed, r.fencing_token, r.state
FROM (SELECT 1) AS one
LEFT JOIN idempotency_records r
       ON r.tenant = $1 AND r.route = $2 AND r.key = $3 AND r.expires_at > now()
"#;

/// Admin look-up of a live row.
pub(super) const GET: &str = r#"
SELECT state, fingerprint, fencing_token, response_status, created_at, expires_at
FROM idempotency_records
WHERE tenant = $1 AND route = $2 AND key = $3 AND expires_at > now()
"#;

/// Admin delete; reports whether the row was live.
pub(super) const DELETE: &str = r#"
DELETE FROM idempotency_records
WHERE tenant = $1 AND route = $2 AND key = $3
RETURNING expires_at > now() AS live
"#;

/// Delete up to $1 expired rows, oldest first. `ctid` lets the batch be picked by the index
/// and deleted without re-matching the primary key; `SKIP LOCKED` keeps concurrent reapers
/// (one per replica) from queueing behind each other or a `try_lock` holding a row.
pub(super) const REAP: &str = r#"
DELETE FROM idempotency_records
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM idempotency_records
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
))
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// The pgbench anchor of `bench/run.sh` and `bench/pg.sh` must run exactly the store's
    /// statements, or "store / anchor" compares different work.
    #[test]
    fn pgbench_script_matches() {
        let script = include_str!("../../../../bench/pgbench/idempotency.sql");
        let body: String = script
            .lines()
            .filter(|l| !l.starts_with("--") && !l.starts_with("\\set"))
            .collect::<Vec<_>>()
            .join("\n");
        let (lock, complete) = body.split_once("\\gset").expect("\\gset after try_lock");
        let fingerprint =
            r"'\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea";
        let key = [("$1", ":tenant"), ("$2", ":route"), ("$3", ":k")];
        let mut want_lock = TRY_LOCK.to_owned();
        for (from, to) in
            key.iter()
                .copied()
                .chain([("$4", fingerprint), ("$5", ":lease"), ("$6", ":retention")])
        {
            want_lock = want_lock.replace(from, to);
        }
        let mut want_complete = COMPLETE.to_owned();
        for (from, to) in key.iter().copied().chain([
            ("$4", ":fencing_token"),
            ("$5", "'completed'"),
            ("$6", "201"),
            ("$7", r#"'[["content-type","application/json"]]'"#),
            ("$8", r"'\x7b226964223a312c226f6b223a747275657d'::bytea"),
            ("$9", ":retention"),
        ]) {
            want_complete = want_complete.replace(from, to);
        }
        let norm = |s: &str| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .trim_end_matches(';')
                .to_owned()
        };
        assert_eq!(norm(lock), norm(&want_lock));
        assert_eq!(norm(complete), norm(&want_complete));
    }
}
