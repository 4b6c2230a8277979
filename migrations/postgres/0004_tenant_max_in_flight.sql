-- A tenant's concurrency limit (Stripe's concurrent-requests limiter): at most this many of
-- its requests in flight at once on one gateway replica; NULL = unlimited. The upper bound
-- matches the admin API's and the configuration file's validation.
ALTER TABLE tenants ADD COLUMN max_in_flight BIGINT
    CHECK (max_in_flight IS NULL OR (max_in_flight > 0 AND max_in_flight <= 100000));
