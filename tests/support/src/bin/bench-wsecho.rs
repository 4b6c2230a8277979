//! `bench-wsecho`: a WebSocket echo upstream for `bench/websocket.sh`.
//!
//! ```text
//! bench-wsecho [--port P] [--stats-port S]
//! ```
//!
//! - Binds `127.0.0.1:P` (default 18090), one current-thread tokio runtime. Loopback only.
//! - Accepts any WebSocket handshake (any path) and sends every text or binary message back
//!   unchanged on the same connection; pings are answered by tungstenite; a close ends the
//!   connection.
//! - `--stats-port S` (default P + 1): any request there gets `200` with the counters as one
//!   JSON line, `{"handshakes":…,"messages":…,"bytes":…}` — what the upstream itself received
//!   and echoed, so the harness can check that every message a client counted went through
//!   the proxy to here. Counters only grow: the harness reads them before and after a run.
//!
//! Stops on SIGINT/SIGTERM (the harness kills it by PID).
#![allow(missing_docs)]

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

const USAGE: &str = "usage: bench-wsecho [--port P] [--stats-port S]";
/// A handshake must complete within this; a stats request is answered within it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Counters {
    handshakes: Cell<u64>,
    messages: Cell<u64>,
    bytes: Cell<u64>,
}

fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get().wrapping_add(by));
}

fn parse_args() -> Result<(u16, Option<u16>), String> {
    let (mut port, mut stats) = (18090u16, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--port" => port = val()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--stats-port" => {
                stats = Some(val()?.parse().map_err(|e| format!("--stats-port: {e}"))?)
            }
            _ => return Err(USAGE.into()),
        }
    }
    Ok((port, stats))
}

async fn echo(stream: TcpStream, counters: Rc<Counters>) {
    let _ = stream.set_nodelay(true);
    let handshake = tokio_tungstenite::accept_async(stream);
    let Ok(Ok(mut ws)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await else {
        return;
    };
    bump(&counters.handshakes, 1);
    // Bounded by the connection: ends when the peer closes or the connection fails.
    while let Some(Ok(msg)) = ws.next().await {
        match msg {
            Message::Binary(_) | Message::Text(_) => {
                bump(&counters.messages, 1);
                bump(&counters.bytes, msg.len() as u64);
                if ws.send(msg).await.is_err() {
                    return;
                }
            }
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
    // Answers the close (tungstenite queues the reply) and flushes it; bounded.
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, ws.close(None)).await;
}

async fn stats(mut stream: TcpStream, counters: Rc<Counters>) {
    let mut buf = [0u8; 1024];
    // Reads the request head (whatever fits); the answer does not depend on it.
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read(&mut buf)).await;
    let body = format!(
        "{{\"handshakes\":{},\"messages\":{},\"bytes\":{}}}\n",
        counters.handshakes.get(),
        counters.messages.get(),
        counters.bytes.get()
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.write_all(answer.as_bytes())).await;
    let _ = stream.shutdown().await;
}

async fn accept_loop<F, Fut>(listener: TcpListener, counters: Rc<Counters>, serve: F)
where
    F: Fn(TcpStream, Rc<Counters>) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::task::spawn_local(serve(stream, counters.clone()));
            }
            // EMFILE and friends: back off briefly instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn run(port: u16, stats_port: u16) -> std::io::Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stats_addr = SocketAddr::from(([127, 0, 0, 1], stats_port));
    let listener = TcpListener::bind(addr).await?;
    let stats_listener = TcpListener::bind(stats_addr).await?;
    let counters = Rc::new(Counters::default());
    eprintln!("bench-wsecho listening on ws://{addr} (stats on http://{stats_addr})");
    tokio::task::spawn_local(accept_loop(stats_listener, counters.clone(), stats));
    accept_loop(listener, counters, echo).await;
    Ok(())
}

fn main() {
    let (port, stats_port) = match parse_args() {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let stats_port = stats_port.unwrap_or(port.wrapping_add(1));
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench-wsecho: runtime: {e}");
            std::process::exit(1);
        }
    };
    let local = tokio::task::LocalSet::new();
    if let Err(e) = local.block_on(&runtime, run(port, stats_port)) {
        eprintln!("bench-wsecho: {e}");
        std::process::exit(1);
    }
}
