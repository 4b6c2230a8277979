//! `GET /openapi.json`: the hand-written OpenAPI 3.1 description of the admin API.
//!
//! Hand-written rather than derived so the document stays a reviewed contract; a unit test
//! (`admin/tests.rs`) calls every documented operation against the router, so a route cannot
//! be documented without existing.

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Json;
use http::Response;
use serde_json::{json, Value};

/// Serves the document.
pub(super) async fn serve() -> Response<Body> {
    Json(document()).into_response()
}

fn problem(description: &str) -> Value {
    json!({ "description": description, "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } })
}

fn ok(description: &str, schema: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } })
}

fn body(schema: &str) -> Value {
    json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } })
}

/// An operation: summary, parameters (by component name), optional body, success responses;
/// 401/404/422/503 are added to every operation.
fn op(summary: &str, params: &[&str], request: Option<&str>, success: Value) -> Value {
    let mut responses = success;
    if let Value::Object(map) = &mut responses {
        map.insert(
            "401".into(),
            json!({ "$ref": "#/components/responses/Unauthorized" }),
        );
        map.insert(
            "404".into(),
            json!({ "$ref": "#/components/responses/NotFound" }),
        );
        map.insert(
            "422".into(),
            json!({ "$ref": "#/components/responses/Invalid" }),
        );
        map.insert(
            "503".into(),
            json!({ "$ref": "#/components/responses/Unavailable" }),
        );
    }
    let parameters: Vec<Value> = params
        .iter()
        .map(|p| json!({ "$ref": format!("#/components/parameters/{p}") }))
        .collect();
    let mut operation =
        json!({ "summary": summary, "parameters": parameters, "responses": responses });
    if let (Some(schema), Value::Object(map)) = (request, &mut operation) {
        map.insert("requestBody".into(), body(schema));
    }
    operation
}

fn no_content(description: &str) -> Value {
    json!({ "204": { "description": description } })
}

fn paths() -> Value {
    json!({
        "/admin/v1/tenants": {
            "get": op("List tenants by id, optionally searched", &["Search", "Limit", "Cursor"], None, json!({ "200": ok("A page of tenants", "TenantPage") })),
            "post": op("Create a tenant", &[], Some("TenantCreate"), json!({ "201": ok("Created", "Tenant"), "409": problem("A tenant with this id exists") })),
        },
        "/admin/v1/tenants/{id}": {
            "get": op("Get a tenant", &["TenantId"], None, json!({ "200": ok("The tenant", "Tenant") })),
            "patch": op("Update a tenant (merge: absent fields are kept, null clears a period quota)", &["TenantId"], Some("TenantPatch"), json!({ "200": ok("Updated", "Tenant") })),
            "delete": op("Delete a tenant with its keys and overrides", &["TenantId"], None, no_content("Deleted")),
        },
        "/admin/v1/tenants/{id}/disable": {
            "post": op("Disable a tenant: its keys get 401", &["TenantId"], None, json!({ "200": ok("Disabled", "Tenant") })),
        },
        "/admin/v1/tenants/{id}/enable": {
            "post": op("Enable a tenant", &["TenantId"], None, json!({ "200": ok("Enabled", "Tenant") })),
        },
        "/admin/v1/tenants/{id}/keys": {
            "get": op("List a tenant's API keys (prefixes only)", &["TenantId"], None, json!({ "200": ok("Keys", "KeyList") })),
            "post": op("Issue an API key; the plaintext is in this response only", &["TenantId"], None, json!({ "201": ok("Issued", "IssuedKey") })),
        },
        "/admin/v1/tenants/{id}/keys/{key_id}/revoke": {
            "post": op("Revoke an API key (idempotent)", &["TenantId", "KeyId"], None, json!({ "200": ok("Revoked", "Key") })),
        },
        "/admin/v1/tenants/{id}/quota": {
            "get": op("A tenant's bucket, period quotas and route overrides", &["TenantId"], None, json!({ "200": ok("Quota", "Quota") })),
            "patch": op("Change the bucket or period quotas (null clears a period quota)", &["TenantId"], Some("QuotaPatch"), json!({ "200": ok("Updated", "Quota") })),
        },
        "/admin/v1/tenants/{id}/route-quotas": {
            "get": op("Per-route overrides", &["TenantId"], None, json!({ "200": ok("Overrides", "RouteQuotaList") })),
            "put": op("Set the override of one configured route", &["TenantId"], Some("RouteQuota"), json!({ "200": ok("Set", "RouteQuota") })),
            "delete": op("Remove the override of a route", &["TenantId", "Route"], None, no_content("Removed")),
        },
        "/admin/v1/tenants/{id}/periods/{period}/reset": {
            "post": op("Reset the current day's or month's count to 0", &["TenantId", "Period"], None, json!({ "200": ok("Period usage after the reset", "PeriodUsage"), "409": problem("The tenant has no quota for this period") })),
        },
        "/admin/v1/tenants/{id}/periods/{period}/top-up": {
            "post": op("Give back requests in the current period", &["TenantId", "Period"], Some("TopUp"), json!({ "200": ok("Period usage after the top-up", "PeriodUsage"), "409": problem("The tenant has no quota for this period") })),
        },
        "/admin/v1/tenants/{id}/usage": {
            "get": op("Current buckets, period usage and 429 count, read without consuming", &["TenantId"], None, json!({ "200": ok("Usage", "Usage") })),
        },
        "/admin/v1/tenants/{id}/usage/history": {
            "get": op("The tenant's 429s per 10 s over the last 10 minutes, as the answering replica counted them (the last point is the current bucket)", &["TenantId"], None, json!({ "200": ok("History", "UsageHistory") })),
        },
        "/admin/v1/usage/throttled": {
            "get": op("Tenants with the most 429s in the last 10 minutes: every replica's sum with Redis state, else the answering replica's", &["TopLimit"], None, json!({ "200": ok("Top throttled tenants", "ThrottledList") })),
        },
        "/admin/v1/tenants/{id}/idempotency": {
            "get": op("Look up an Idempotency-Key record", &["TenantId", "Route", "IdempotencyKey"], None, json!({ "200": ok("The record", "IdempotencyRecord") })),
            "delete": op("Delete an Idempotency-Key record so the key may be used again", &["TenantId", "Route", "IdempotencyKey"], None, no_content("Deleted")),
        },
        "/admin/v1/audit": {
            "get": op("The audit log, newest first", &["TenantFilter", "ActionFilter", "ActorFilter", "Limit", "AuditCursor"], None, json!({ "200": ok("A page of entries", "AuditPage") })),
        },
        "/admin/v1/upstreams": {
            "get": op("Every upstream's endpoints and their health as the answering replica sees them", &[], None, json!({ "200": ok("Upstreams", "UpstreamList") })),
        },
        "/admin/v1/openapi.json": {
            "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1", "content": { "application/json": {} } }, "401": { "$ref": "#/components/responses/Unauthorized" } } },
        },
    })
}

fn parameters() -> Value {
    let path = |name: &str, description: &str| json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" } });
    let query = |name: &str, required: bool, description: &str, schema: Value| json!({ "name": name, "in": "query", "required": required, "description": description, "schema": schema });
    json!({
        "TenantId": path("id", "Tenant id: 1-64 characters of [A-Za-z0-9._-]"),
        "KeyId": path("key_id", "Key id from the key listing"),
        "Period": { "name": "period", "in": "path", "required": true, "schema": { "enum": ["day", "month"] } },
        "Limit": query("limit", false, "Items per page (default 50)", json!({ "type": "integer", "minimum": 1, "maximum": 500 })),
        "Cursor": query("cursor", false, "next_cursor of the previous page", json!({ "type": "string" })),
        "AuditCursor": query("cursor", false, "next_cursor of the previous page", json!({ "type": "integer" })),
        "TenantFilter": query("tenant", false, "Only entries for this tenant", json!({ "type": "string" })),
        "ActionFilter": query("action", false, "Only entries of this action, e.g. key.revoke", json!({ "type": "string" })),
        "ActorFilter": query("actor", false, "Only entries by this actor, e.g. admin-token:alice", json!({ "type": "string" })),
        "Search": query("q", false, "Only tenants whose id or name contains this (ASCII case ignored)", json!({ "type": "string", "maxLength": 200 })),
        "TopLimit": query("limit", false, "Tenants to list (default 10)", json!({ "type": "integer", "minimum": 1, "maximum": 100 })),
        "Route": query("route", true, "A configured route name (its prefix unless named), e.g. /orders", json!({ "type": "string" })),
        "IdempotencyKey": query("key", true, "The client's Idempotency-Key value", json!({ "type": "string" })),
    })
}

fn schemas() -> Value {
    let int = |min: u64| json!({ "type": "integer", "minimum": min });
    let nullable_int = json!({ "type": ["integer", "null"], "minimum": 1 });
    let duration = json!({ "type": "string", "description": "Duration such as \"1s\", \"250ms\", \"1m\" (whole milliseconds)", "examples": ["1s"] });
    let time = json!({ "type": "string", "format": "date-time" });
    let nullable_time = json!({ "type": ["string", "null"], "format": "date-time" });
    let route_quota = json!({ "type": "object", "required": ["route", "rate", "burst"], "additionalProperties": false, "properties": { "route": { "type": "string" }, "rate": int(1), "per": duration, "burst": int(1) } });
    let key = json!({ "type": "object", "properties": { "id": { "type": "integer" }, "tenant": { "type": "string" }, "prefix": { "type": "string", "description": "First characters of the key" }, "created_at": time, "revoked_at": nullable_time } });
    let max_in_flight = json!({ "type": ["integer", "null"], "minimum": 1, "maximum": crate::MAX_TENANT_IN_FLIGHT, "description": "Requests of the tenant in flight at once on one replica (over it: 429 concurrency-limited); null = unlimited" });
    let max_websockets = json!({ "type": ["integer", "null"], "minimum": 1, "maximum": crate::MAX_TENANT_WEBSOCKETS, "description": "Open WebSocket tunnels of the tenant on one replica (a handshake over it: 429 websocket-limited); null = no cap of its own" });
    let websocket_bound = |what: &str| json!({ "type": ["string", "null"], "description": format!("The tenant's WebSocket {what} (\"30s\", 1 ms to 7 days); the stricter of the route's and the tenant's applies; null = the route's alone") });
    let limits = json!({ "rate": int(1), "per": duration, "burst": int(1), "daily_quota": nullable_int, "monthly_quota": nullable_int, "max_in_flight": max_in_flight, "max_websockets": max_websockets, "websocket_idle_timeout": websocket_bound("idle timeout"), "websocket_max_lifetime": websocket_bound("maximum lifetime") });
    let mut tenant_create = json!({ "type": "object", "required": ["id", "rate", "burst"], "additionalProperties": false, "properties": limits.clone() });
    tenant_create["properties"]["id"] =
        json!({ "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" });
    tenant_create["properties"]["name"] = json!({ "type": "string", "maxLength": 200 });
    let mut tenant_patch =
        json!({ "type": "object", "additionalProperties": false, "properties": limits.clone() });
    tenant_patch["properties"]["name"] = json!({ "type": "string", "maxLength": 200 });
    tenant_patch["properties"]["disabled"] = json!({ "type": "boolean" });
    let mut tenant = json!({ "type": "object", "properties": limits.clone() });
    for (name, schema) in [
        ("id", json!({ "type": "string" })),
        ("name", json!({ "type": "string" })),
        ("disabled", json!({ "type": "boolean" })),
        (
            "route_quotas",
            json!({ "type": "array", "items": { "$ref": "#/components/schemas/RouteQuota" } }),
        ),
        ("created_at", time.clone()),
        ("updated_at", time.clone()),
    ] {
        tenant["properties"][name] = schema;
    }
    let mut quota = json!({ "type": "object", "properties": limits.clone() });
    quota["properties"]["tenant"] = json!({ "type": "string" });
    quota["properties"]["route_quotas"] = tenant["properties"]["route_quotas"].clone();
    let mut issued = key.clone();
    issued["properties"]["api_key"] =
        json!({ "type": "string", "description": "The plaintext key; never shown again" });
    let page = |item: &str, cursor: Value| json!({ "type": "object", "properties": { "items": { "type": "array", "items": { "$ref": format!("#/components/schemas/{item}") } }, "next_cursor": cursor } });
    let endpoint_schema = json!({ "type": "object", "properties": { "url": { "type": "string" }, "host": { "type": "string" }, "weight": int(1), "state": { "enum": ["healthy", "unhealthy", "ejected"] }, "ejected_for_ms": { "type": ["integer", "null"] }, "ejections": int(0), "consecutive_failures": int(0), "in_flight": int(0) } });
    let upstream_schema = json!({ "type": "object", "properties": { "name": { "type": "string" }, "load_balancer": { "enum": ["round_robin", "least_request", "peak_ewma"] }, "circuit_breaker": { "enum": ["closed", "half_open", "open"] }, "healthy_endpoints": int(0), "panic": { "type": "boolean" }, "endpoints": { "type": "array", "items": { "$ref": "#/components/schemas/Endpoint" } }, "attempt_timeout_ms": int(1), "latency": { "oneOf": [{ "type": "null" }, { "$ref": "#/components/schemas/Latency" }] }, "routes": { "type": "array", "items": { "$ref": "#/components/schemas/RouteLatency" } }, "retry_amplification": { "type": ["number", "null"], "description": "Attempts per original request over the retry budget's window on the answering replica (1.0 = no retries)" } } });
    let latency_schema = json!({ "type": "object", "description": "Attempt latency over the last one to two minutes (at least 100 attempts)", "properties": { "samples": int(100), "p50_ms": { "type": "number" }, "p99_ms": { "type": "number" }, "p999_ms": { "type": "number" }, "recommended_attempt_timeout_ms": int(1) } });
    let top_up_schema = json!({ "type": "object", "required": ["amount"], "additionalProperties": false, "properties": { "amount": int(1) } });
    let bucket_usage_schema = json!({ "type": "object", "properties": { "policy": { "type": "string" }, "route": { "type": ["string", "null"] }, "limit": int(0), "remaining": int(0), "reset_after_secs": int(0) } });
    let period_usage_schema = json!({ "type": "object", "properties": { "period": { "enum": ["day", "month"] }, "limit": int(0), "used": int(0), "resets_in_secs": int(0) } });
    let usage_schema = json!({ "type": "object", "properties": { "tenant": { "type": "string" }, "buckets": { "type": "array", "items": { "$ref": "#/components/schemas/BucketUsage" } }, "periods": { "type": "array", "items": { "$ref": "#/components/schemas/PeriodUsage" } }, "rejected_total": { "type": "integer", "description": "429s given to this tenant by the answering replica since it started (rate and concurrency limits; an upstream's own 429s are not counted)" } } });
    let audit_entry_schema = json!({ "type": "object", "properties": { "id": { "type": "integer" }, "at": time, "actor": { "type": "string" }, "action": { "type": "string", "examples": ["tenant.create", "quota.update", "key.revoke"] }, "tenant": { "type": ["string", "null"] }, "before": {}, "after": {} } });
    let idempotency_record_schema = json!({ "type": "object", "properties": { "tenant": { "type": "string" }, "route": { "type": "string" }, "key": { "type": "string" }, "state": { "enum": ["in_flight", "completed", "too_large"] }, "fingerprint": { "type": "string" }, "fencing_token": { "type": "integer" }, "status": { "type": ["integer", "null"] }, "created_at": time, "expires_at": time } });
    let upstream_list_schema = json!({ "type": "object", "properties": { "upstreams": { "type": "array", "items": { "$ref": "#/components/schemas/Upstream" } } } });
    let problem_schema = json!({ "type": "object", "required": ["type", "title", "status", "detail"], "properties": { "type": { "type": "string", "format": "uri" }, "title": { "type": "string" }, "status": { "type": "integer" }, "detail": { "type": "string" }, "errors": { "type": "array", "description": "422 only: every invalid field", "items": { "type": "object", "properties": { "field": { "type": "string" }, "reason": { "type": "string" } } } }, "retry_after": { "type": "integer" } } });
    let route_latency = json!({ "type": "object", "properties": { "route": { "type": "string" }, "latency": { "oneOf": [{ "type": "null" }, { "$ref": "#/components/schemas/Latency" }] } } });
    json!({
        "TenantCreate": tenant_create,
        "TenantPatch": tenant_patch,
        "QuotaPatch": { "type": "object", "additionalProperties": false, "properties": limits },
        "Tenant": tenant,
        "Quota": quota,
        "RouteQuota": route_quota,
        "RouteQuotaList": page("RouteQuota", json!({ "type": "null" })),
        "TenantPage": page("Tenant", json!({ "type": ["string", "null"] })),
        "Key": key,
        "IssuedKey": issued,
        "KeyList": page("Key", json!({ "type": "null" })),
        "TopUp": top_up_schema,
        "BucketUsage": bucket_usage_schema,
        "PeriodUsage": period_usage_schema,
        "Usage": usage_schema,
        "AuditEntry": audit_entry_schema,
        "AuditPage": page("AuditEntry", json!({ "type": ["string", "null"] })),
        "IdempotencyRecord": idempotency_record_schema,
        "Endpoint": endpoint_schema,
        "Upstream": upstream_schema,
        "RouteLatency": route_latency,
        "Latency": latency_schema,
        "UsageHistory": { "type": "object", "properties": { "tenant": { "type": "string" }, "interval_secs": int(1), "points": { "type": "array", "description": "60 points, oldest first; the last is the current, still open bucket", "items": { "type": "object", "properties": { "start": { "type": "integer", "description": "Bucket start, seconds since the Unix epoch" }, "rejected": int(0) } } }, "rejected_total": { "type": "integer", "description": "As in Usage" } } },
        "ThrottledList": { "type": "object", "properties": { "window_secs": int(1), "scope": { "enum": ["fleet", "replica"], "description": "fleet: every live replica's counts summed (Redis state); replica: the answering replica's" }, "replicas": int(1), "fleet_error": { "type": "string", "description": "Present when the shared board could not be read (then scope is replica)" }, "items": { "type": "array", "items": { "type": "object", "properties": { "tenant": { "type": "string" }, "rejected": int(1) } } } } },
        "UpstreamList": upstream_list_schema,
        "Problem": problem_schema,
    })
}

/// The OpenAPI document.
pub(super) fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Portcullis admin API",
            "version": "1",
            "description": "Tenants, API keys, quotas, usage, audit log and idempotency records. Every change is one transaction, audited, and reaches every replica sharing the database within a second. Errors are RFC 9457 problem+json; 422 lists every invalid field in `errors`.",
        },
        "security": [{ "adminToken": [] }],
        "paths": paths(),
        "components": {
            "securitySchemes": { "adminToken": { "type": "http", "scheme": "bearer", "description": "The PORTCULLIS_ADMIN_TOKEN value" } },
            "parameters": parameters(),
            "schemas": schemas(),
            "responses": {
                "Unauthorized": problem("Missing or wrong admin token"),
                "NotFound": problem("No such tenant, key, override or record"),
                "Invalid": problem("Invalid input; `errors` names every field"),
                "Unavailable": problem("A backing store did not answer; retry after Retry-After"),
            },
        },
    })
}
