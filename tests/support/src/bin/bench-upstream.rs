//! `bench-upstream`: a minimal, fast HTTP/1.1 backend for the benchmarks in `bench/`.
//!
//! ```text
//! bench-upstream [--port P] [--threads N] [--fail-503] [--http2] [--tls CA_FILE]
//! ```
//!
//! - Binds `127.0.0.1:P` (default 18080). Loopback only.
//! - `--threads N` (default 1): N OS threads, each a current-thread tokio runtime with its
//!   own `SO_REUSEPORT` listener, so there is no cross-thread hand-off per request.
//! - `GET` (any other non-POST method too) → `200 hello\n`; `POST` → the body is read, then
//!   `201 {"id":N,"ok":true}`. Keep-alive; HTTP/1.1 unless `--http2`.
//! - `--fail-503` starts in failing mode: every request gets `503` with an empty body and no
//!   `Retry-After` (the worst case for retry amplification).
//! - `--http2` speaks HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1, for gateways
//!   whose upstream sets `http2 = true`.
//! - `--tls CA_FILE` serves HTTPS: a fresh test CA (written to `CA_FILE`, for the gateway's
//!   `tls = { ca = … }`) issues the server certificate for `localhost` and `127.0.0.1`; ALPN
//!   offers `h2` and `http/1.1`, and the protocol spoken is the one `--http2` says.
//!
//! Control endpoints (answered directly, never counted, never failed):
//!
//! - `GET /__bench/fail` — switch to "503 for everything";
//! - `GET /__bench/ok` — switch back to normal answers;
//! - `GET /__bench/reset` — zero the counters;
//! - `GET /__bench/stats` — counters as one JSON line:
//!   `{"hits":…,"ok":…,"fail":…,"post":…,"failing":false,"attempts":[a1,…,a6,other]}` where
//!   `attempts[i]` counts hits whose `X-Retry-Attempt` header was `i+1` (the last slot counts
//!   hits without the header or with another value).
//!   `delivery_ids` counts the distinct `Portcullis-Delivery-Id` values received (a
//!   gateway's asynchronous deliveries, told apart by their last 32 hex digits) and
//!   `delivery_repeats` the hits that repeated one,
//!   so a backlog drain (`bench/queue.sh backlog`) can check each message arrived once.
//!
//! Stops on SIGINT/SIGTERM (the harness kills it by PID).

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use portcullis_testkit::tls;
use tokio::net::TcpSocket;

const USAGE: &str =
    "usage: bench-upstream [--port P] [--threads N] [--fail-503] [--http2] [--tls CA_FILE]";
const ATTEMPT_SLOTS: usize = 7;

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    ok: AtomicU64,
    fail: AtomicU64,
    post: AtomicU64,
    attempts: [AtomicU64; ATTEMPT_SLOTS],
    failing: AtomicBool,
    /// Distinct delivery ids (32 hex digits each, kept as their 128-bit value).
    delivery_ids: Mutex<HashSet<u128>>,
    delivery_repeats: AtomicU64,
}

impl Counters {
    fn reset(&self) {
        for c in [&self.hits, &self.ok, &self.fail, &self.post]
            .into_iter()
            .chain(self.attempts.iter())
        {
            c.store(0, Ordering::Relaxed);
        }
        self.delivery_repeats.store(0, Ordering::Relaxed);
        if let Ok(mut ids) = self.delivery_ids.lock() {
            ids.clear();
        }
    }

    /// Records a delivery id by its last 32 hex digits (the random part; an engine may put a
    /// prefix before it); a value without them counts as a repeat.
    fn delivery(&self, id: &[u8]) {
        let value = id
            .len()
            .checked_sub(32)
            .and_then(|start| std::str::from_utf8(&id[start..]).ok())
            .and_then(|hex| u128::from_str_radix(hex, 16).ok());
        let fresh = match (value, self.delivery_ids.lock()) {
            (Some(value), Ok(mut ids)) => ids.insert(value),
            _ => false,
        };
        if !fresh {
            self.delivery_repeats.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn json(&self) -> String {
        let attempts: Vec<String> = self
            .attempts
            .iter()
            .map(|a| a.load(Ordering::Relaxed).to_string())
            .collect();
        let ids = self.delivery_ids.lock().map_or(0, |ids| ids.len());
        format!(
            "{{\"hits\":{},\"ok\":{},\"fail\":{},\"post\":{},\"failing\":{},\"attempts\":[{}],\"delivery_ids\":{},\"delivery_repeats\":{}}}\n",
            self.hits.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.fail.load(Ordering::Relaxed),
            self.post.load(Ordering::Relaxed),
            self.failing.load(Ordering::Relaxed),
            attempts.join(","),
            ids,
            self.delivery_repeats.load(Ordering::Relaxed)
        )
    }
}

struct Options {
    port: u16,
    threads: usize,
    fail: bool,
    http2: bool,
    tls: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        port: 18080,
        threads: 1,
        fail: false,
        http2: false,
        tls: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                let v = args.next().ok_or("--port needs a value")?;
                options.port = v.parse().map_err(|_| format!("bad --port {v}"))?;
            }
            "--threads" => {
                let v = args.next().ok_or("--threads needs a value")?;
                options.threads = v.parse().map_err(|_| format!("bad --threads {v}"))?;
                if options.threads == 0 || options.threads > 64 {
                    return Err("--threads must be 1..=64".to_owned());
                }
            }
            "--fail-503" => options.fail = true,
            "--http2" => options.http2 = true,
            "--tls" => options.tls = Some(args.next().ok_or("--tls needs a file")?.into()),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(options)
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

async fn handle(
    request: Request<Incoming>,
    counters: Arc<Counters>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    if let Some(command) = path.strip_prefix("/__bench/") {
        let body = match command {
            "fail" => {
                counters.failing.store(true, Ordering::SeqCst);
                counters.json()
            }
            "ok" => {
                counters.failing.store(false, Ordering::SeqCst);
                counters.json()
            }
            "reset" => {
                counters.reset();
                counters.json()
            }
            "stats" => counters.json(),
            _ => {
                return Ok(text(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    "unknown control\n",
                ))
            }
        };
        return Ok(text(StatusCode::OK, "application/json", body));
    }

    counters.hits.fetch_add(1, Ordering::Relaxed);
    let slot = request
        .headers()
        .get("x-retry-attempt")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..ATTEMPT_SLOTS).contains(n))
        .map_or(ATTEMPT_SLOTS - 1, |n| n - 1);
    counters.attempts[slot].fetch_add(1, Ordering::Relaxed);
    if let Some(id) = request.headers().get("portcullis-delivery-id") {
        counters.delivery(id.as_bytes());
    }

    let is_post = request.method() == Method::POST;
    // Read the body in every mode so the connection stays reusable.
    let _ = request.into_body().collect().await;

    if counters.failing.load(Ordering::Relaxed) {
        counters.fail.fetch_add(1, Ordering::Relaxed);
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    }
    counters.ok.fetch_add(1, Ordering::Relaxed);
    if is_post {
        let id = counters.post.fetch_add(1, Ordering::Relaxed) + 1;
        return Ok(text(
            StatusCode::CREATED,
            "application/json",
            format!("{{\"id\":{id},\"ok\":true}}\n"),
        ));
    }
    Ok(text(
        StatusCode::OK,
        "text/plain",
        Bytes::from_static(b"hello\n"),
    ))
}

async fn serve(
    addr: SocketAddr,
    counters: Arc<Counters>,
    http2: bool,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(4096)?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true);
    let h2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let counters = counters.clone();
        let (http, h2, tls) = (http.clone(), h2.clone(), tls.clone());
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| handle(req, counters.clone()));
            let _ = match tls {
                None if http2 => h2.serve_connection(TokioIo::new(stream), service).await,
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(tls) => {
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    if http2 {
                        h2.serve_connection(TokioIo::new(stream), service).await
                    } else {
                        http.serve_connection(TokioIo::new(stream), service).await
                    }
                }
            };
        });
    }
}

fn run_thread(
    addr: SocketAddr,
    counters: Arc<Counters>,
    http2: bool,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(addr, counters, http2, tls))
}

fn main() {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], options.port));
    let counters = Arc::new(Counters::default());
    counters.failing.store(options.fail, Ordering::SeqCst);
    // A fresh CA per run: the gateway trusts exactly the file written here.
    let tls = options.tls.as_deref().map(|ca_file| {
        let ca = tls::TestCa::new("bench-upstream CA");
        let dir = ca_file.parent().unwrap_or(std::path::Path::new("."));
        let name = ca_file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("ca.pem");
        ca.write(dir, name);
        tokio_rustls::TlsAcceptor::from(tls::server_config(&ca.server(), None))
    });
    let mut threads = Vec::new();
    for n in 0..options.threads {
        let counters = counters.clone();
        let (http2, tls) = (options.http2, tls.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("bench-upstream-{n}"))
            .spawn(move || run_thread(addr, counters, http2, tls));
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                eprintln!("bench-upstream: cannot start thread: {e}");
                std::process::exit(1);
            }
        }
    }
    eprintln!(
        "bench-upstream listening on {}://{addr} ({} thread(s), failing={}, http2={})",
        if tls.is_some() { "https" } else { "http" },
        options.threads,
        options.fail,
        options.http2
    );
    for handle in threads {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("bench-upstream: {e}");
                std::process::exit(1);
            }
            Err(_) => std::process::exit(1),
        }
    }
}
