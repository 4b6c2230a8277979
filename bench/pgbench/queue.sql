-- pgbench anchor for the PostgreSQL queue engine (bench/queue.sh): one enqueue without a
-- dedupe key = the one INSERT PostgresQueue::enqueue sends (queue/src/postgres.rs), with the
-- same columns and sizes as queue/examples/enqueue_load.rs (a 32-hex id, a 1-header list, a
-- :body-byte body), in its own implicit transaction, as the engine does.
-- Run with `pgbench -M prepared -D body=N` against a database the engine created its
-- schema in.
INSERT INTO queue_messages (id, queue, tenant, state, method, path, headers, body,
    enqueued_at, due_at, updated_at)
VALUES (md5(random()::text || clock_timestamp()::text), 'bench', 'bench', 0, 'POST', '/hooks/in',
    '\x0000000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e'::bytea,
    convert_to(repeat('x', :body), 'UTF8'),
    (extract(epoch from now()) * 1000)::bigint, (extract(epoch from now()) * 1000)::bigint + 0,
    (extract(epoch from now()) * 1000)::bigint);
