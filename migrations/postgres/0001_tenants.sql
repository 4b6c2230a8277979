-- Tenants, their API keys (SHA-256 hashes only) and quotas.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL DEFAULT '',
    disabled    BOOLEAN NOT NULL DEFAULT FALSE,
    rate        BIGINT NOT NULL CHECK (rate > 0),
    per_ms      BIGINT NOT NULL CHECK (per_ms > 0),
    burst       BIGINT NOT NULL CHECK (burst > 0),
    daily_quota   BIGINT CHECK (daily_quota IS NULL OR daily_quota > 0),
    monthly_quota BIGINT CHECK (monthly_quota IS NULL OR monthly_quota > 0),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    key_hash    BYTEA NOT NULL UNIQUE,          -- SHA-256 of the key; the plaintext is never stored
    prefix      TEXT NOT NULL,                  -- first characters, to recognise a key in listings
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE route_quotas (
    tenant_id    TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    route_prefix TEXT NOT NULL,
    rate         BIGINT NOT NULL CHECK (rate > 0),
    per_ms       BIGINT NOT NULL CHECK (per_ms > 0),
    burst        BIGINT NOT NULL CHECK (burst > 0),
    PRIMARY KEY (tenant_id, route_prefix)
);

-- Bumped by every change; replicas compare it to decide whether to reload their snapshot.
CREATE TABLE config_version (
    id       SMALLINT PRIMARY KEY CHECK (id = 1),
    version  BIGINT NOT NULL
);
INSERT INTO config_version (id, version) VALUES (1, 1);
