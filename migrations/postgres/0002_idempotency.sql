-- Idempotency-Key records (portcullis-idempotency, PostgresStore).
--
-- One row per (tenant, route, key): the scope that keeps tenants from seeing or blocking
-- each other's keys. All times are the database server's `now()`, so gateway replicas with
-- skewed clocks still agree on who holds a lease.

-- Fencing tokens: one global sequence, so a token is never issued twice, even after a row is
-- released, reaped and re-created. Sequence gaps (an ON CONFLICT that did not insert still
-- consumes a value) are harmless: tokens only need to grow.
CREATE SEQUENCE idempotency_fencing_seq AS bigint;

CREATE TABLE idempotency_records (
    tenant           text        NOT NULL,
    route            text        NOT NULL,
    key              text        NOT NULL,
    -- SHA-256 of method, path+query, tenant, content type and body.
    fingerprint      bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    state            text        NOT NULL CHECK (state IN ('in_flight', 'completed', 'too_large')),
    -- Token of the latest holder; complete/release must present it.
    fencing_token    bigint      NOT NULL,
    -- Set while in flight: after it, the lock may be taken over.
    lease_until      timestamptz,
    -- Retention end: the row is ignored after it and deleted by the reaper.
    expires_at       timestamptz NOT NULL,
    response_status  smallint,
    -- [["name", "value"], ...] in order; non-UTF-8 value bytes mapped as Latin-1.
    response_headers jsonb,
    response_body    bytea,
    -- How many times an abandoned lease on this record was taken over (operational signal).
    takeovers        integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, route, key),
    CHECK ((state = 'in_flight') = (lease_until IS NOT NULL)),
    CHECK (state <> 'completed' OR (response_status IS NOT NULL AND response_body IS NOT NULL))
);

-- The reaper deletes in expires_at order, in batches.
CREATE INDEX idempotency_records_expires_at_idx ON idempotency_records (expires_at);
