-- pgbench anchor for the PostgreSQL idempotency store (bench/pg.sh, bench/run.sh): one keyed
-- first execution = the two statements PostgresStore runs, with the same parameters, each in
-- its own implicit transaction (no BEGIN/COMMIT), as the store does:
--   1. try_lock  (idempotency/src/store/postgres/sql.rs TRY_LOCK)
--   2. complete  (sql.rs COMPLETE) with the fencing token the first statement returned.
-- The statement texts are checked against sql.rs by a unit test in that module
-- (`pgbench_script_matches`): the anchor cannot drift from what the store sends.
-- Run with `pgbench -M prepared -D tenant=bench -D route=/orders` (parse once per connection, then one Bind/Execute/Sync
-- exchange per statement: what the store does).
\set k random(1, 1000000000000)
\set lease 30
\set retention 86400
WITH ins AS (
    INSERT INTO idempotency_records AS r
        (tenant, route, key, fingerprint, state, fencing_token, lease_until, expires_at, created_at)
    VALUES (:tenant, :route, :k, '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'::bytea, 'in_flight', nextval('idempotency_fencing_seq'),
            now() + make_interval(secs => :lease), now() + make_interval(secs => :retention), now())
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
WHERE r.tenant = :tenant AND r.route = :route AND r.key = :k AND NOT EXISTS (SELECT 1 FROM ins)
\gset
WITH upd AS (
    UPDATE idempotency_records SET
        state = 'completed', response_status = 201, response_headers = '[["content-type","application/json"]]'::jsonb, response_body = '\x7b226964223a312c226f6b223a747275657d'::bytea,
        lease_until = NULL, expires_at = now() + make_interval(secs => :retention)
    WHERE tenant = :tenant AND route = :route AND key = :k
      AND state = 'in_flight' AND fencing_token = :fencing_token AND lease_until > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM upd) AS changed, r.fencing_token, r.state
FROM (SELECT 1) AS one
LEFT JOIN idempotency_records r
       ON r.tenant = :tenant AND r.route = :route AND r.key = :k AND r.expires_at > now();
