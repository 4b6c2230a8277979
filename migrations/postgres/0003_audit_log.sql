-- Every administrative change, with who made it and the state before and after.
CREATE TABLE audit_log (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor      TEXT NOT NULL,
    action     TEXT NOT NULL,
    tenant_id  TEXT,
    before     JSONB,
    after      JSONB
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, at);
