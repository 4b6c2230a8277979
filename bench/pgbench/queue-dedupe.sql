-- pgbench anchor for the PostgreSQL queue engine with a dedupe key on the message
-- (bench/queue.sh): the one statement PostgresQueue::enqueue sends then (queue/src/postgres.rs),
-- the dedupe insert chained to the message insert in a data-modifying CTE (two inserts, one
-- commit), with a unique key per message (client number and a random number), a 7-day
-- window, the final look-up of the key included, and the same
-- columns and sizes as bench/pgbench/queue.sql, in its own implicit transaction.
-- Run with `pgbench -M prepared -D body=N` against a database the engine created its
-- schema in.
\set k random(1, 1000000000000)
WITH d AS (INSERT INTO queue_dedupe (queue, tenant, key, id, expires_at)
    VALUES ('bench', 'bench', :client_id::text || '-' || :k::text, md5(random()::text || clock_timestamp()::text),
        (extract(epoch from now()) * 1000)::bigint + 604800000)
    ON CONFLICT (queue, tenant, key) DO UPDATE SET id = EXCLUDED.id, expires_at = EXCLUDED.expires_at
    WHERE queue_dedupe.expires_at <= (extract(epoch from now()) * 1000)::bigint
    RETURNING id, key),
m AS (INSERT INTO queue_messages (id, queue, tenant, state, method, path, headers, body,
        dedupe_key, enqueued_at, due_at, updated_at)
    SELECT d.id, 'bench', 'bench', 0, 'POST', '/hooks/in',
        '\x0000000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e'::bytea,
        convert_to(repeat('x', :body), 'UTF8'), d.key,
        (extract(epoch from now()) * 1000)::bigint, (extract(epoch from now()) * 1000)::bigint + 0,
        (extract(epoch from now()) * 1000)::bigint
    FROM d RETURNING id)
SELECT (SELECT id FROM m), (SELECT id FROM queue_dedupe
    WHERE queue = 'bench' AND tenant = 'bench' AND key = :client_id::text || '-' || :k::text AND expires_at > (extract(epoch from now()) * 1000)::bigint);
