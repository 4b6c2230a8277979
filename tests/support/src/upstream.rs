//! A scripted upstream: a real HTTP/1.1 and HTTP/2 server on loopback (optionally behind
//! TLS) that answers from a script and records every hit, so tests can count executions,
//! connections and handshakes, and read attempt timing.
//!
//! Hits are stamped with real monotonic time (`std::time::Instant`): the gateway under test is
//! another process, so its waits can only be observed in real time, as the upstream sees them.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// Upper bound on any stall, so a forgotten upstream never keeps a test alive.
pub const MAX_STALL: Duration = Duration::from_secs(60);

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// Answer with this status, headers and body.
    Respond {
        /// Status code.
        status: u16,
        /// Extra response headers.
        headers: Vec<(String, String)>,
        /// Response body.
        body: Bytes,
    },
    /// Wait this long (capped at [`MAX_STALL`]), then perform the inner step.
    Stall(Duration, Box<Step>),
    /// Close the connection without answering (the client sees a reset / empty reply).
    Close,
    /// Answer 200 with the request body echoed back.
    Echo,
    /// One of these steps, picked at random by weight (for fault-injection runs).
    Random(Vec<(u32, Step)>),
    /// Hold the request until the gate is opened (at most [`MAX_STALL`]), then perform the
    /// inner step: requests stay in flight for as long as a test needs, without timing.
    Gated(Gate, Box<Step>),
    /// Answer 200 with a chunked body sent as these chunks, `interval` apart.
    Chunked {
        /// The chunks, in order.
        chunks: Vec<Bytes>,
        /// Pause between chunks.
        interval: Duration,
    },
}

// === impl Step ===

impl Step {
    /// A bare status with an empty body.
    pub fn status(status: u16) -> Self {
        Self::Respond {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// 200 with a text body.
    pub fn ok(body: &str) -> Self {
        Self::Respond {
            status: 200,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    /// A status with a body and extra headers.
    pub fn respond(status: u16, headers: &[(&str, &str)], body: &str) -> Self {
        Self::Respond {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    /// A status with `Retry-After: secs`.
    pub fn with_retry_after(status: u16, secs: u64) -> Self {
        Self::respond(status, &[("retry-after", &secs.to_string())], "")
    }

    /// Wait until `gate` opens, then answer `then`.
    pub fn gated(gate: &Gate, then: Step) -> Self {
        Self::Gated(gate.clone(), Box::new(then))
    }

    /// Stall for `delay`, then answer `then`.
    pub fn stall(delay: Duration, then: Step) -> Self {
        Self::Stall(delay, Box::new(then))
    }
}

/// Holds [`Step::Gated`] requests until [`Gate::open`]; clones share the gate.
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }

    /// Lets every held request (and every later one) through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        let mut open = self.0.subscribe();
        let _ = tokio::time::timeout(MAX_STALL, open.wait_for(|open| *open)).await;
    }
}

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Hit {
    /// When the request head arrived (real monotonic time: tests compare hits with each other).
    pub at: std::time::Instant,
    /// Request method.
    pub method: Method,
    /// HTTP version the request arrived with.
    pub version: http::Version,
    /// Request URI (path and query).
    pub uri: Uri,
    /// Request headers.
    pub headers: HeaderMap,
    /// Full request body.
    pub body: Bytes,
    /// The status the script answered with (`None`: the connection was closed instead).
    pub answered: Option<u16>,
}

#[derive(Debug)]
struct State {
    script: Mutex<VecDeque<Step>>,
    fallback: Mutex<Step>,
    hits: Mutex<Vec<Hit>>,
    connections: AtomicUsize,
    handshakes: AtomicUsize,
}

/// A running scripted upstream; stops when dropped.
#[derive(Debug)]
pub struct ScriptedUpstream {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
    scheme: &'static str,
}

// === impl ScriptedUpstream ===

impl ScriptedUpstream {
    /// Starts on a free loopback port; answers `script` in order, then `200 ok` forever.
    pub async fn start(script: Vec<Step>) -> Self {
        Self::start_with_fallback(script, Step::ok("ok")).await
    }

    /// Starts on a free loopback port; answers `script` in order, then `fallback` forever.
    pub async fn start_with_fallback(script: Vec<Step>, fallback: Step) -> Self {
        Self::spawn(script, fallback, None).await
    }

    /// Starts behind TLS with `config` (see [`crate::tls::server_config`]); answers `script`
    /// in order, then `200 ok`. HTTP/1.1 or HTTP/2, as ALPN or the client's preface says.
    pub async fn start_tls(script: Vec<Step>, config: Arc<rustls::ServerConfig>) -> Self {
        Self::spawn(script, Step::ok("ok"), Some(TlsAcceptor::from(config))).await
    }

    /// Starts on `addr` (a loopback address; port 0 for a free one); `None` when it cannot
    /// bind there. Answers `script` in order, then `200 ok`. For tests that need several
    /// upstreams on one port (host names with several address records: 127.0.0.2, .3 …).
    pub async fn start_at(addr: SocketAddr, script: Vec<Step>) -> Option<Self> {
        let listener = TcpListener::bind(addr).await.ok()?;
        Some(Self::serve(listener, script, Step::ok("ok"), None))
    }

    async fn spawn(script: Vec<Step>, fallback: Step, tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind scripted upstream");
        Self::serve(listener, script, fallback, tls)
    }

    fn serve(
        listener: TcpListener,
        script: Vec<Step>,
        fallback: Step,
        tls: Option<TlsAcceptor>,
    ) -> Self {
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            script: Mutex::new(script.into()),
            fallback: Mutex::new(fallback),
            hits: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            handshakes: AtomicUsize::new(0),
        });
        let scheme = if tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn(accept_loop(listener, state.clone(), tls));
        Self {
            addr,
            state,
            task,
            scheme,
        }
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed so far (0 without TLS).
    pub fn handshakes(&self) -> usize {
        self.state.handshakes.load(Ordering::SeqCst)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request seen so far, in arrival order.
    pub fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("hits lock").clone()
    }

    /// Number of requests seen so far.
    pub fn hit_count(&self) -> usize {
        self.state.hits.lock().expect("hits lock").len()
    }

    /// Appends steps to the script.
    pub fn push(&self, steps: impl IntoIterator<Item = Step>) {
        self.state.script.lock().expect("script lock").extend(steps);
    }

    /// Replaces the answer used once the script is exhausted.
    pub fn set_fallback(&self, step: Step) {
        *self.state.fallback.lock().expect("fallback lock") = step;
    }
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, tls: Option<TlsAcceptor>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        let state = state.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let service = {
                let state = state.clone();
                hyper::service::service_fn(move |req| handle(req, state.clone()))
            };
            match tls {
                None => {
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    state.handshakes.fetch_add(1, Ordering::SeqCst);
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
        // Reap finished connection tasks so the set stays small.
        while connections.try_join_next().is_some() {}
    }
}

#[derive(Debug)]
struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted close")
    }
}

impl std::error::Error for CloseConnection {}

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn now() -> std::time::Instant {
    std::time::Instant::now()
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<UpstreamBody>, CloseConnection> {
    let at = now();
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();

    let step = {
        let next = state.script.lock().expect("script lock").pop_front();
        next.unwrap_or_else(|| state.fallback.lock().expect("fallback lock").clone())
    };
    // Resolve random choices now, so the hit records what was really answered.
    let step = resolve_random(step);
    state.hits.lock().expect("hits lock").push(Hit {
        at,
        method: parts.method.clone(),
        version: parts.version,
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
        answered: answered_status(&step),
    });
    perform(step, body).await
}

async fn perform(
    mut step: Step,
    request_body: Bytes,
) -> Result<Response<UpstreamBody>, CloseConnection> {
    let step = loop {
        step = match step {
            Step::Stall(delay, then) => {
                tokio::time::sleep(delay.min(MAX_STALL)).await;
                *then
            }
            Step::Gated(gate, then) => {
                gate.passed().await;
                *then
            }
            Step::Random(choices) => pick(choices),
            other => break other,
        };
    };
    let response = match step {
        Step::Respond {
            status,
            headers,
            body,
        } => {
            let mut builder = Response::builder()
                .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            builder.body(Full::new(body).boxed())
        }
        Step::Echo => Response::builder()
            .status(200)
            .body(Full::new(request_body).boxed()),
        Step::Chunked { chunks, interval } => {
            let stream = futures_util::stream::unfold(
                (chunks.into_iter(), interval, true),
                |(mut it, interval, first)| async move {
                    let chunk = it.next()?;
                    if !first {
                        tokio::time::sleep(interval).await;
                    }
                    Some((
                        Ok::<_, Infallible>(Frame::data(chunk)),
                        (it, interval, false),
                    ))
                },
            );
            Response::builder()
                .status(200)
                .body(BodyExt::boxed(StreamBody::new(stream)))
        }
        Step::Close => return Err(CloseConnection),
        Step::Stall(..) | Step::Gated(..) | Step::Random(..) => unreachable_stall(),
    };
    response.map_err(|_| CloseConnection)
}

fn resolve_random(step: Step) -> Step {
    match step {
        Step::Random(choices) => resolve_random(pick(choices)),
        Step::Stall(delay, then) => Step::Stall(delay, Box::new(resolve_random(*then))),
        Step::Gated(gate, then) => Step::Gated(gate, Box::new(resolve_random(*then))),
        other => other,
    }
}

fn answered_status(step: &Step) -> Option<u16> {
    match step {
        Step::Respond { status, .. } => Some(*status),
        Step::Echo | Step::Chunked { .. } => Some(200),
        Step::Stall(_, then) | Step::Gated(_, then) => answered_status(then),
        Step::Close | Step::Random(_) => None,
    }
}

fn pick(choices: Vec<(u32, Step)>) -> Step {
    use rand::Rng;
    let total: u32 = choices.iter().map(|(w, _)| *w).sum();
    let mut roll = rand::thread_rng().gen_range(0..total.max(1));
    for (weight, step) in choices {
        if roll < weight {
            return step;
        }
        roll -= weight;
    }
    Step::status(500)
}

fn unreachable_stall() -> Result<Response<UpstreamBody>, http::Error> {
    // The loop above resolves every Stall and Random; keep the match total without panicking.
    Response::builder()
        .status(500)
        .body(Full::new(Bytes::new()).boxed())
}
