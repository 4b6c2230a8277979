//! A small OTLP/HTTP trace collector: `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest`, decoded with `opentelemetry-proto` (prost), the spans kept
//! for assertions. Loopback only; stops when dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::task::JoinHandle;

/// One received span, flattened for assertions.
#[derive(Debug, Clone)]
pub struct CollectedSpan {
    /// Span name.
    pub name: String,
    /// Trace id, 32 lower-case hex digits.
    pub trace_id: String,
    /// Span id, 16 hex digits.
    pub span_id: String,
    /// Parent span id, 16 hex digits; empty for a root span.
    pub parent_span_id: String,
    /// OTLP span kind (2 = server, 3 = client).
    pub kind: i32,
    /// Attributes, values rendered as strings (integers in decimal).
    pub attributes: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service_name: String,
}

impl CollectedSpan {
    /// The attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A running collector.
#[derive(Debug)]
pub struct OtlpCollector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    task: JoinHandle<()>,
}

impl OtlpCollector {
    /// Starts on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let addr = listener.local_addr().expect("collector address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, spans, task }
    }

    /// `http://ADDR`, the value of `telemetry.otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().expect("spans lock").clone()
    }

    /// Waits (bounded: 200 polls of 50 ms) until `done` holds for the received spans.
    pub async fn wait_for(&self, done: impl Fn(&[CollectedSpan]) -> bool) -> Vec<CollectedSpan> {
        for _ in 0..200 {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.spans()
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<CollectedSpan>>>>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
            .map(render)
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(CollectedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| {
                            let value = kv
                                .value
                                .and_then(|v| v.value)
                                .as_ref()
                                .map(render)
                                .unwrap_or_default();
                            (kv.key, value)
                        })
                        .collect(),
                    service_name: service_name.clone(),
                });
            }
        }
    }
    spans.lock().expect("spans lock").extend(received);
    StatusCode::OK
}

fn render(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
