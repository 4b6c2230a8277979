-- A tenant's WebSocket limits (docs/websockets.md): at most max_websockets open tunnels on one
-- gateway replica, and its own idle timeout and maximum lifetime for a tunnel, in
-- milliseconds (the stricter of the route's and the tenant's applies); NULL = no limit of
-- the tenant's own. The bounds match the admin API's and the configuration file's
-- validation (1..=1000000 tunnels; 1 ms..=7 days).
ALTER TABLE tenants ADD COLUMN max_websockets BIGINT
    CHECK (max_websockets IS NULL OR (max_websockets > 0 AND max_websockets <= 1000000));
ALTER TABLE tenants ADD COLUMN websocket_idle_timeout_ms BIGINT
    CHECK (websocket_idle_timeout_ms IS NULL
        OR (websocket_idle_timeout_ms > 0 AND websocket_idle_timeout_ms <= 604800000));
ALTER TABLE tenants ADD COLUMN websocket_max_lifetime_ms BIGINT
    CHECK (websocket_max_lifetime_ms IS NULL
        OR (websocket_max_lifetime_ms > 0 AND websocket_max_lifetime_ms <= 604800000));
