-- SQLite dialect of migrations/postgres/0005_tenant_websockets.sql: a tenant's WebSocket
-- limits (open tunnels per replica, idle timeout and maximum lifetime in milliseconds),
-- NULL = no limit of the tenant's own.
ALTER TABLE tenants ADD COLUMN max_websockets INTEGER
    CHECK (max_websockets IS NULL OR (max_websockets > 0 AND max_websockets <= 1000000));
ALTER TABLE tenants ADD COLUMN websocket_idle_timeout_ms INTEGER
    CHECK (websocket_idle_timeout_ms IS NULL
        OR (websocket_idle_timeout_ms > 0 AND websocket_idle_timeout_ms <= 604800000));
ALTER TABLE tenants ADD COLUMN websocket_max_lifetime_ms INTEGER
    CHECK (websocket_max_lifetime_ms IS NULL
        OR (websocket_max_lifetime_ms > 0 AND websocket_max_lifetime_ms <= 604800000));
