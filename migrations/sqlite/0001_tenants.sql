-- Tenants, their API keys (SHA-256 hashes only) and quotas: SQLite dialect of
-- migrations/postgres/0001_tenants.sql for the embedded default.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL DEFAULT '',
    disabled    INTEGER NOT NULL DEFAULT 0,
    rate        INTEGER NOT NULL CHECK (rate > 0),
    per_ms      INTEGER NOT NULL CHECK (per_ms > 0),
    burst       INTEGER NOT NULL CHECK (burst > 0),
    daily_quota   INTEGER CHECK (daily_quota IS NULL OR daily_quota > 0),
    monthly_quota INTEGER CHECK (monthly_quota IS NULL OR monthly_quota > 0),
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE api_keys (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id   TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    key_hash    BLOB NOT NULL UNIQUE,
    prefix      TEXT NOT NULL,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    revoked_at  TEXT
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE route_quotas (
    tenant_id    TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    route_prefix TEXT NOT NULL,
    rate         INTEGER NOT NULL CHECK (rate > 0),
    per_ms       INTEGER NOT NULL CHECK (per_ms > 0),
    burst        INTEGER NOT NULL CHECK (burst > 0),
    PRIMARY KEY (tenant_id, route_prefix)
);

CREATE TABLE config_version (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    version  INTEGER NOT NULL
);
INSERT INTO config_version (id, version) VALUES (1, 1);

CREATE TABLE audit_log (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    tenant_id  TEXT,
    before     TEXT,
    after      TEXT
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, at);
