//! Free loopback ports, chosen by the kernel.

use std::net::{SocketAddr, TcpListener};

/// Returns a currently free TCP port on 127.0.0.1.
///
/// The port is released before returning, so another process could grab it in between; that
/// race is rare enough for tests and far better than fixed ports.
pub fn free_port() -> u16 {
    free_addr().port()
}

/// Returns a currently free `127.0.0.1:port` address (see [`free_port`] for the caveat).
pub fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener
        .local_addr()
        .expect("local_addr of a bound listener")
}

/// An address on which nothing listens: bound once, then closed. Connecting to it is refused.
pub fn closed_addr() -> SocketAddr {
    free_addr()
}
