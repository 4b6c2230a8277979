//! The built-in demo upstream, so the embedded default has something to proxy to:
//!
//! - `GET /demo/orders` lists orders, `POST /demo/orders` creates one (201, JSON echo);
//! - `GET /demo/stats` says how often it was called and how many orders it created — send the
//!   same keyed POST twice through the gateway and see `creates` move once;
//! - `GET /demo/slow?ms=N` answers after N ms (at most 10 s);
//! - `GET /demo/flaky` answers 503 + `Retry-After: 1` on every other call, to watch retries;
//! - `GET /demo/stream` streams five chunks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest wait `/demo/slow` accepts.
const MAX_SLOW: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct DemoState {
    calls: AtomicU64,
    creates: AtomicU64,
    flaky: AtomicU64,
    orders: Mutex<Vec<Value>>,
}

/// The demo upstream's router (served on its own listener).
pub fn router() -> Router {
    Router::new()
        .route("/demo/orders", get(list_orders).post(create_order))
        .route("/demo/stats", get(stats))
        .route("/demo/slow", get(slow))
        .route("/demo/flaky", get(flaky))
        .route("/demo/stream", get(stream))
        .with_state(Arc::new(DemoState::default()))
}

/// Serves the demo on `listener` until `shutdown` resolves.
pub fn serve(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "demo upstream listening");
    }
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router())
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!(%err, "demo upstream stopped");
        }
    });
}

async fn list_orders(State(state): State<Arc<DemoState>>) -> Json<Value> {
    state.calls.fetch_add(1, Ordering::Relaxed);
    let orders = state.orders.lock().map(|o| o.clone()).unwrap_or_default();
    Json(json!({ "orders": orders }))
}

async fn create_order(State(state): State<Arc<DemoState>>, body: Bytes) -> Response {
    state.calls.fetch_add(1, Ordering::Relaxed);
    let item: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let id = state.creates.fetch_add(1, Ordering::Relaxed) + 1;
    let order = json!({ "id": id, "item": item });
    if let Ok(mut orders) = state.orders.lock() {
        // Keep the demo's memory bounded.
        if orders.len() >= 1000 {
            orders.remove(0);
        }
        orders.push(order.clone());
    }
    (StatusCode::CREATED, Json(order)).into_response()
}

async fn stats(State(state): State<Arc<DemoState>>) -> Json<Value> {
    Json(json!({
        "calls": state.calls.load(Ordering::Relaxed),
        "creates": state.creates.load(Ordering::Relaxed),
    }))
}

#[derive(Deserialize)]
struct SlowQuery {
    ms: Option<u64>,
}

async fn slow(State(state): State<Arc<DemoState>>, Query(q): Query<SlowQuery>) -> &'static str {
    state.calls.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(q.ms.unwrap_or(1000)).min(MAX_SLOW)).await;
    "slow hello\n"
}

async fn flaky(State(state): State<Arc<DemoState>>) -> Response {
    state.calls.fetch_add(1, Ordering::Relaxed);
    if state.flaky.fetch_add(1, Ordering::Relaxed) % 2 == 0 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            "try again\n",
        )
            .into_response()
    } else {
        "flaky hello\n".into_response()
    }
}

async fn stream(State(state): State<Arc<DemoState>>) -> Response {
    state.calls.fetch_add(1, Ordering::Relaxed);
    let chunks = futures_util::stream::iter(
        (1..=5).map(|i| Ok::<_, std::convert::Infallible>(Bytes::from(format!("chunk {i}\n")))),
    );
    Body::from_stream(chunks).into_response()
}
