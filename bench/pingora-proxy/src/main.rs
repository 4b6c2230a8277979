//! `bench-pingora-proxy`: the smallest useful reverse proxy on Cloudflare's `pingora`
//! framework, a peer in bench/run.sh's pass-through comparison.
//!
//! One worker thread, HTTP/1.1 to one upstream with pingora's connection pool (upstream
//! keep-alive), no logging per request — the same shape as the nginx, HAProxy and Caddy peers
//! in bench/peers/.
//!
//! Usage: `bench-pingora-proxy --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT`

use std::net::SocketAddr;
use std::process::ExitCode;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

struct Forward {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(upstream)) = (arg(&args, "--listen"), arg(&args, "--upstream")) else {
        eprintln!("usage: bench-pingora-proxy --listen ADDR:PORT --upstream ADDR:PORT");
        return ExitCode::from(2);
    };
    let upstream: SocketAddr = match upstream.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("--upstream {upstream}: {e}");
            return ExitCode::from(2);
        }
    };

    let conf = ServerConf {
        threads: 1,                         // one worker thread, like every other peer
        work_stealing: false,               // nothing to steal from with one thread
        upstream_keepalive_pool_size: 1024, // idle upstream connections kept for reuse
        grace_period_seconds: Some(0),      // the harness stops it with SIGTERM
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, Forward { upstream });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
