-- SQLite dialect of migrations/postgres/0004_tenant_max_in_flight.sql: a tenant's
-- concurrency limit, NULL = unlimited.
ALTER TABLE tenants ADD COLUMN max_in_flight INTEGER
    CHECK (max_in_flight IS NULL OR (max_in_flight > 0 AND max_in_flight <= 100000));
