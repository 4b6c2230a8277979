use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// How the loopback upstream treats each connection.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Answers every request with its connection number (1, 2, …), keeping the connection.
    KeepAlive,
    /// Answers one request, then closes (while advertising keep-alive).
    CloseAfterAnswer,
    /// Sends the head and half the body of its answer, then waits for the peer to go.
    HalfBody,
    /// Reads the request, then closes without answering.
    NoAnswer,
}

/// A raw HTTP/1.1 upstream on loopback, counting accepted connections and requests read.
struct Upstream {
    target: Uri,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Upstream {
    async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (counter, seen) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let number = counter.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(serve(socket, number, mode, seen.clone()));
            }
        });
        Self {
            target: format!("http://{addr}/").parse().unwrap(),
            accepted,
            requests,
        }
    }

    fn pool(&self, max_idle: usize) -> Arc<EndpointPool> {
        Arc::new(EndpointPool::new(
            self.target.clone(),
            super::super::resolver::http_connector(),
            max_idle,
            Duration::from_secs(90),
            super::DEFAULT_READ_BUFFER,
        ))
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(mut socket: TcpStream, number: usize, mode: Mode, requests: Arc<AtomicUsize>) {
    let mut buf = [0u8; 4096];
    // Bounded: a test sends a handful of requests per connection.
    for _ in 0..100 {
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        if mode == Mode::NoAnswer {
            return;
        }
        let body = number.to_string();
        let reply = match mode {
            Mode::HalfBody => format!("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{body}"),
            _ => format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ),
        };
        if socket.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        match mode {
            Mode::KeepAlive => {}
            Mode::CloseAfterAnswer | Mode::NoAnswer => return,
            Mode::HalfBody => {
                // Until the gateway closes its side.
                let _ = socket.read(&mut buf).await;
                return;
            }
        }
    }
}

/// `GET /` as the proxy hands it over: absolute target, `Host` set.
fn get(target: &Uri) -> Request<Body> {
    let mut request = Request::new(Body::empty());
    *request.uri_mut() = target.clone();
    request
        .headers_mut()
        .insert(http::header::HOST, "upstream".parse().unwrap());
    request
}

/// The answer's body: the number of the upstream connection that carried it.
async fn read(response: Response<UpstreamBody>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn fetch(pool: &Arc<EndpointPool>) -> String {
    read(pool.clone().send(get(&pool.target)).await.unwrap()).await
}

/// Waits (bounded, no timing asserted) until `pool` holds `n` idle connections.
async fn idle_count(pool: &EndpointPool, n: usize) {
    for _ in 0..200 {
        if pool.lock().len() == n {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(pool.lock().len(), n);
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(8);
    for _ in 0..5 {
        assert_eq!(fetch(&pool).await, "1");
    }
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(pool.lock().len(), 1);
}

#[tokio::test]
async fn the_most_recently_returned_connection_goes_first() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(8);
    // Two exchanges at once: two connections.
    let first = pool.clone().send(get(&pool.target)).await.unwrap();
    let second = pool.clone().send(get(&pool.target)).await.unwrap();
    assert_eq!(read(first).await, "1");
    idle_count(&pool, 1).await;
    assert_eq!(read(second).await, "2");
    idle_count(&pool, 2).await;
    // Connection 2 came back last: it goes first, then 1 below it.
    let again = pool.clone().send(get(&pool.target)).await.unwrap();
    assert_eq!(fetch(&pool).await, "1");
    assert_eq!(read(again).await, "2");
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn at_most_max_idle_stay_and_the_oldest_goes() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(2);
    let mut responses = Vec::new();
    for _ in 0..3 {
        responses.push(pool.clone().send(get(&pool.target)).await.unwrap());
    }
    for (i, response) in responses.into_iter().enumerate() {
        assert_eq!(read(response).await, (i + 1).to_string());
        idle_count(&pool, (i + 1).min(2)).await;
    }
    // Connection 1 was pushed out: 3, then 2, then a new one.
    let a = pool.clone().send(get(&pool.target)).await.unwrap();
    let b = pool.clone().send(get(&pool.target)).await.unwrap();
    let c = pool.clone().send(get(&pool.target)).await.unwrap();
    assert_eq!(
        [read(a).await, read(b).await, read(c).await],
        ["3", "2", "4"]
    );
}

#[tokio::test]
async fn idle_connections_are_not_reused_after_the_idle_timeout() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(8);
    assert_eq!(fetch(&pool).await, "1");
    tokio::time::pause();
    tokio::time::advance(pool.idle_timeout - Duration::from_secs(1)).await;
    assert!(pool.checkout().is_some_and(|s| s.is_ready()), "still young");
    // That checkout took it: put a fresh idle one back, then let it age.
    tokio::time::resume();
    assert_eq!(fetch(&pool).await, "2");
    tokio::time::pause();
    tokio::time::advance(pool.idle_timeout).await;
    assert!(pool.checkout().is_none());
    assert!(pool.lock().is_empty(), "expired connections are dropped");
    tokio::time::resume();
    assert_eq!(fetch(&pool).await, "3");
}

#[tokio::test]
async fn idle_connections_are_closed_at_their_timeout_when_traffic_stops() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(8);
    assert_eq!(fetch(&pool).await, "1");
    idle_count(&pool, 1).await;
    tokio::time::pause();
    tokio::time::advance(pool.idle_timeout + Duration::from_secs(1)).await;
    // The reaper runs on its own, with no request to trigger it.
    idle_count(&pool, 0).await;
    assert!(
        !pool.reaping.load(Ordering::Relaxed),
        "the reaper stops when nothing is idle"
    );
    tokio::time::resume();
    assert_eq!(
        fetch(&pool).await,
        "2",
        "a new connection; the reaped one was closed"
    );
    idle_count(&pool, 1).await;
    assert!(
        pool.reaping.load(Ordering::Relaxed),
        "the next checkin starts a reaper"
    );
}

#[tokio::test]
async fn a_connection_the_peer_closed_is_skipped() {
    let upstream = Upstream::start(Mode::CloseAfterAnswer).await;
    let pool = upstream.pool(8);
    assert_eq!(fetch(&pool).await, "1");
    // Bounded wait until the connection's task has read the close.
    for _ in 0..1000 {
        if pool.lock().back().is_none_or(|i| !i.sender.is_ready()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        pool.checkout().is_none(),
        "the closed connection is skipped"
    );
    assert_eq!(fetch(&pool).await, "2");
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn a_request_handed_back_unsent_goes_once_more_on_a_fresh_connection() {
    let upstream = Upstream::start(Mode::KeepAlive).await;
    let pool = upstream.pool(8);
    // An idle connection whose peer is already gone, which its task has not noticed yet
    // (it has not run since): it looks ready.
    let (ours, theirs) = tokio::io::duplex(4096);
    let (mut sender, connection) = http1::handshake(TokioIo::new(ours)).await.unwrap();
    tokio::spawn(connection);
    sender.ready().await.unwrap();
    pool.checkin(sender);
    drop(theirs);
    assert!(pool.lock().back().is_some_and(|i| i.sender.is_ready()));
    let response = pool.clone().send(get(&pool.target)).await.unwrap();
    assert_eq!(read(response).await, "1");
    assert_eq!(upstream.requests(), 1, "sent once, on the fresh connection");
    assert_eq!(pool.lock().len(), 1);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let upstream = Upstream::start(Mode::HalfBody).await;
    let pool = upstream.pool(8);
    let response = pool.clone().send(get(&pool.target)).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "1");
    drop(body);
    assert!(pool.lock().is_empty());
    let response = pool.clone().send(get(&pool.target)).await.unwrap();
    drop(response);
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn a_refused_connect_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let target: Uri = format!("http://{addr}/").parse().unwrap();
    let pool = Arc::new(EndpointPool::new(
        target.clone(),
        super::super::resolver::http_connector(),
        8,
        Duration::from_secs(90),
        super::DEFAULT_READ_BUFFER,
    ));
    let err = pool.send(get(&target)).await.unwrap_err();
    assert!(matches!(err, SendError::Connect(_)), "{err:?}");
    let kind = super::super::ProxyError::from_pool(err, 0).kind();
    assert_eq!(kind, super::super::ProxyErrorKind::ConnectRefused);
}

#[tokio::test]
async fn a_request_the_upstream_read_is_not_sent_again() {
    let upstream = Upstream::start(Mode::NoAnswer).await;
    let pool = upstream.pool(8);
    let err = pool.clone().send(get(&pool.target)).await.unwrap_err();
    assert!(matches!(err, SendError::Exchange(_)), "{err:?}");
    let kind = super::super::ProxyError::from_pool(err, 0).kind();
    assert_eq!(kind, super::super::ProxyErrorKind::ResetAfterSent);
    assert_eq!(upstream.requests(), 1);
    assert!(pool.lock().is_empty());
}
