//! Who is the client? The peer address, or the `X-Forwarded-For` chain when the peer is a
//! trusted proxy — and the headers we send upstream about it.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

/// Fields that name the client's address besides `X-Forwarded-For`: the standard one
/// (RFC 7239), nginx's, the CDNs' (Akamai and Cloudflare, Cloudflare, Fastly) and other
/// proxies' conventions. Removed from requests of untrusted peers, passed from trusted ones.
pub(crate) const CLIENT_ADDRESS_FIELDS: &[&str] = &[
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "client-ip",
    "x-original-forwarded-for",
    "forwarded-for",
    "x-forwarded",
];

/// The TCP peer of the connection, inserted by the listener into every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The client as the gateway believes it: resolved once per request (see
/// [`TrustedProxies::resolve`]) and kept in the request context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client IP: the peer, or from `X-Forwarded-For` when the peer is trusted.
    pub ip: IpAddr,
    /// The TCP peer, IPv4-mapped addresses as IPv4.
    pub peer: IpAddr,
    /// The peer is a trusted proxy: its `X-Forwarded-*` fields are believed and extended.
    pub peer_trusted: bool,
}

/// Which peers may speak for clients through `X-Forwarded-For`.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

// === impl TrustedProxies ===

impl TrustedProxies {
    /// Trusts these networks.
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self(nets)
    }

    /// Whether `ip` is a trusted proxy (also whose W3C trace context is continued).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request from `peer`: the peer itself, unless the peer is trusted, in
    /// which case the right-most address of `X-Forwarded-For` that is not itself a trusted
    /// proxy. Walking from the right means a client cannot choose its own identity by
    /// prepending addresses. Whether the peer is trusted is decided here, once per request.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Client {
        let peer = canonical(peer);
        let peer_trusted = self.contains(peer);
        let ip = if peer_trusted {
            self.walk_forwarded_for(peer, headers)
        } else {
            peer
        };
        Client {
            ip,
            peer,
            peer_trusted,
        }
    }

    /// The right-most `X-Forwarded-For` address that is not a trusted proxy, from a trusted
    /// `peer`.
    fn walk_forwarded_for(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        for value in headers.get_all("x-forwarded-for").iter().rev() {
            let Ok(text) = value.to_str() else {
                return client;
            };
            for part in text.rsplit(',') {
                match part.trim().parse::<IpAddr>() {
                    Ok(ip) => {
                        client = canonical(ip);
                        if !self.contains(client) {
                            return client;
                        }
                    }
                    Err(_) => return client,
                }
            }
        }
        client
    }
}

// === impl Client ===

impl Client {
    /// The `X-Forwarded-For` to send upstream: the trusted chain plus the peer, or — from an
    /// untrusted peer — only the peer, so backends never see a spoofed chain.
    pub fn forwarded_for(&self, headers: &HeaderMap) -> String {
        let peer = self.peer;
        if self.peer_trusted {
            let existing: Vec<&str> = headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            if !existing.is_empty() {
                return format!("{}, {peer}", existing.join(", "));
            }
        }
        peer.to_string()
    }
}

/// An address as `Display` writes it, on the stack; IPv4 (the usual peer) without
/// `core::fmt`. Formatted per request for `X-Forwarded-For` and the access log.
pub(crate) struct IpText {
    bytes: [u8; 45], // the longest IPv6 text
    len: usize,
}

impl IpText {
    pub(crate) fn new(ip: IpAddr) -> Self {
        let mut text = Self {
            bytes: [0; 45],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                let mut digits = itoa::Buffer::new();
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b".");
                    }
                    text.push(digits.format(octet).as_bytes());
                }
            }
            IpAddr::V6(v6) => {
                use std::io::Write as _;
                let mut cursor = std::io::Cursor::new(&mut text.bytes[..]);
                // 45 bytes hold any IPv6 text, so the write cannot run out of room.
                let _ = write!(cursor, "{v6}");
                text.len = usize::try_from(cursor.position()).unwrap_or(0);
            }
        }
        text
    }

    fn push(&mut self, part: &[u8]) {
        // At most 15 bytes for IPv4: always in bounds.
        if let Some(slot) = self.bytes.get_mut(self.len..self.len + part.len()) {
            slot.copy_from_slice(part);
            self.len += part.len();
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// IPv4-mapped IPv6 addresses compare as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", xff.parse().unwrap());
        h
    }

    fn trusted() -> TrustedProxies {
        TrustedProxies::new(vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ])
    }

    #[test]
    fn untrusted_peer_cannot_spoof() {
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(trusted().resolve(peer, &headers("1.2.3.4")).ip, peer);
        assert_eq!(
            trusted()
                .resolve(peer, &headers("1.2.3.4"))
                .forwarded_for(&headers("1.2.3.4")),
            "203.0.113.9"
        );
    }

    #[test]
    fn trusted_peer_walks_from_the_right() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let h = headers("6.6.6.6, 198.51.100.7, 10.1.2.3");
        assert_eq!(
            trusted().resolve(peer, &h).ip,
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            trusted().resolve(peer, &h).forwarded_for(&h),
            "6.6.6.6, 198.51.100.7, 10.1.2.3, 127.0.0.1"
        );
    }

    #[test]
    fn garbage_stops_the_walk() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(trusted().resolve(peer, &headers("nonsense")).ip, peer);
        assert_eq!(trusted().resolve(peer, &HeaderMap::new()).ip, peer);
    }

    #[test]
    fn mapped_ipv6_is_ipv4() {
        let peer: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(trusted().contains(peer));
    }

    #[test]
    fn ip_text_is_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.200.7",
            "::1",
            "::ffff:1.2.3.4",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
            "2001:db8:85a3:1234:5678:8a2e:370:7334",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_bytes(), ip.to_string().as_bytes());
        }
    }

    proptest::proptest! {
        #[test]
        fn ip_text_matches_display(octets in proptest::array::uniform16(proptest::num::u8::ANY)) {
            let v6 = IpAddr::from(octets);
            let v4 = IpAddr::from([octets[0], octets[1], octets[2], octets[3]]);
            for ip in [v4, v6] {
                let (text, shown) = (IpText::new(ip), ip.to_string());
                proptest::prop_assert_eq!(text.as_bytes(), shown.as_bytes());
            }
        }

        #[test]
        fn forwarded_chains_never_panic(xff in proptest::collection::vec(proptest::num::u8::ANY, 0..120), trusted_peer in proptest::bool::ANY) {
            let mut headers = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(&xff) { headers.insert("x-forwarded-for", v); }
            let peer: IpAddr = if trusted_peer { "127.0.0.1" } else { "203.0.113.1" }.parse().unwrap();
            let ip = trusted().resolve(peer, &headers).ip;
            let chain = trusted().resolve(peer, &headers).forwarded_for(&headers);
            proptest::prop_assert!(chain.ends_with(&canonical(peer).to_string()));
            if !trusted_peer { proptest::prop_assert_eq!(ip, peer); }
        }
    }
}
