//! Bucket keys, and why they are hash-tagged the way they are.
//!
//! | key | bucket |
//! |---|---|
//! | `rl:{tenant:acme}:tenant` | tenant `acme`'s own quota |
//! | `rl:{ip:203.0.113.7}:ip` | an anonymous client IP |
//! | `rl:{tenant:acme}:route:/orders` | route `/orders` as spent by tenant `acme` |
//! | `rl:{ip:203.0.113.7}:route:/orders` | route `/orders` as spent by an anonymous IP |
//! | `rl:{route:/orders}:route` | route `/orders` in total, all callers together |
//! | `rl:{global}:global` | the global ceiling |
//! | `rl:{tenant:acme}:quota:day` | tenant `acme`'s daily quota (the limiter stores it as `…:quota:day:20261121`, one counter per window) |
//! | `rl:{tenant:acme}:quota:month` | its monthly quota (`…:quota:month:202611`) |
//! | `rl:{<tag>}:<name>` | anything else, through [`LimitKey::custom`] |
//!
//! # Hash tags and Redis Cluster
//!
//! Redis Cluster maps a key to a slot by the text between its first `{` and the next `}`,
//! and a Lua script may only touch keys of one slot. Each key is therefore tagged with the
//! **principal** it belongs to (`{tenant:acme}`, `{ip:…}`), so all of one caller's buckets
//! (its own, its per-route ones) live in one slot and one script decides them atomically,
//! while different tenants spread across the cluster instead of piling onto one node.
//!
//! The trade-off is the shared buckets: `{global}` (and `{route:…}` totals) cannot share a
//! slot with every principal. The choice made here:
//!
//! - **single-node / primary-replica Redis**: slots do not exist, one script checks the
//!   principal's keys *and* the global key, all-or-nothing, in one round trip;
//! - **Redis Cluster** ([`RedisLimiter::open_cluster`](crate::RedisLimiter::open_cluster)):
//!   one script per slot group (principal, global), all sent at once, all-or-nothing across
//!   them by refunding a group that admitted when another refused. The exact cases where a
//!   refused request may still consume are listed under "Redis Cluster" in the Redis
//!   limiter's module docs. We accept that for the global ceiling, a safety net set far
//!   above any tenant, rather than shard the global bucket per principal (which would stop
//!   it being global) or funnel every request through one slot (which would stop the
//!   cluster scaling).
//!
//! # Escaping
//!
//! Tenant ids and routes come from configuration and URLs. `{`, `}` and `%` in them are
//! percent-encoded, so an id can neither end the hash tag early nor make two different
//! (principal, name) pairs produce the same key.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::sync::Arc;

use crate::period::Period;

/// Who a request's buckets belong to: the hash tag of its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal<'a> {
    /// An authenticated tenant (API key owner).
    Tenant(&'a str),
    /// An anonymous client, by IP.
    Ip(IpAddr),
}

/// An encoded bucket key, cheap to clone (`Arc<str>`).
///
/// Build once where possible (a tenant's keys can live in the tenant record) and clone per
/// request, so the hot path does not format strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey(Arc<str>);

// === impl Principal ===

impl fmt::Display for Principal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Tenant(id) => {
                f.write_str("tenant:")?;
                escape(f, id)
            }
            Principal::Ip(ip) => write!(f, "ip:{ip}"),
        }
    }
}

// === impl LimitKey ===

impl LimitKey {
    /// The tenant's own bucket: `rl:{tenant:<id>}:tenant`.
    pub fn tenant(id: &str) -> Self {
        Self::build(Principal::Tenant(id), "tenant", None)
    }

    /// An anonymous client's bucket: `rl:{ip:<addr>}:ip`.
    pub fn ip(ip: IpAddr) -> Self {
        Self::build(Principal::Ip(ip), "ip", None)
    }

    /// A route's bucket as spent by one principal: `rl:{<principal>}:route:<route>`.
    pub fn route(principal: Principal<'_>, route: &str) -> Self {
        Self::build(principal, "route", Some(route))
    }

    /// A route's bucket shared by all callers: `rl:{route:<route>}:route`.
    pub fn route_total(route: &str) -> Self {
        let mut s = String::with_capacity(16 + route.len());
        s.push_str("rl:{route:");
        let _ = escape(&mut s, route);
        s.push_str("}:route");
        Self(s.into())
    }

    /// A principal's calendar quota counter: `rl:{<principal>}:quota:day` or `…:quota:month`.
    ///
    /// Use it with a [`Policy::calendar`](crate::Policy::calendar) of the same period. The
    /// limiter appends the current window's id (`:20261121`, `:202611`) when it stores the
    /// counter, so each window starts from zero and old windows expire; this key names the
    /// quota, not one window of it. Same hash tag as the principal's buckets, so one script
    /// decides them together.
    pub fn period(principal: Principal<'_>, period: Period) -> Self {
        Self::build(principal, "quota", Some(period.as_str()))
    }

    /// The global ceiling: `rl:{global}:global`.
    pub fn global() -> Self {
        Self(Arc::from("rl:{global}:global"))
    }

    /// Any other bucket: `rl:{<tag>}:<name>`, both escaped.
    pub fn custom(tag: &str, name: &str) -> Self {
        let mut s = String::with_capacity(8 + tag.len() + name.len());
        s.push_str("rl:{");
        let _ = escape(&mut s, tag);
        s.push_str("}:");
        let _ = escape(&mut s, name);
        Self(s.into())
    }

    /// The encoded key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hash tag (the text between the first `{` and the next `}`), which decides the
    /// Redis Cluster slot.
    pub fn hash_tag(&self) -> &str {
        let s = self.as_str();
        s.find('{')
            .and_then(|open| {
                let rest = &s[open + 1..];
                rest.find('}').map(|close| &rest[..close])
            })
            .unwrap_or(s)
    }

    fn build(principal: Principal<'_>, name: &str, arg: Option<&str>) -> Self {
        let mut s = String::with_capacity(40);
        // Writing into a String cannot fail.
        let _ = write!(s, "rl:{{{principal}}}:{name}");
        if let Some(arg) = arg {
            s.push(':');
            let _ = escape(&mut s, arg);
        }
        Self(s.into())
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LimitKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn escape(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    if !s.contains(['{', '}', '%']) {
        return out.write_str(s);
    }
    for c in s.chars() {
        match c {
            '{' => out.write_str("%7B")?,
            '}' => out.write_str("%7D")?,
            '%' => out.write_str("%25")?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(LimitKey::tenant("acme").as_str(), "rl:{tenant:acme}:tenant");
        assert_eq!(
            LimitKey::ip([1, 2, 3, 4].into()).as_str(),
            "rl:{ip:1.2.3.4}:ip"
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(LimitKey::ip(v6).as_str(), "rl:{ip:2001:db8::1}:ip");
        assert_eq!(
            LimitKey::route(Principal::Tenant("acme"), "/orders").as_str(),
            "rl:{tenant:acme}:route:/orders"
        );
        assert_eq!(
            LimitKey::route_total("/orders").as_str(),
            "rl:{route:/orders}:route"
        );
        assert_eq!(LimitKey::global().as_str(), "rl:{global}:global");
        assert_eq!(LimitKey::custom("k", "day").as_str(), "rl:{k}:day");
        assert_eq!(
            LimitKey::period(Principal::Tenant("acme"), Period::Day).as_str(),
            "rl:{tenant:acme}:quota:day"
        );
        assert_eq!(
            LimitKey::period(Principal::Ip([1, 2, 3, 4].into()), Period::Month).as_str(),
            "rl:{ip:1.2.3.4}:quota:month"
        );
    }

    #[test]
    fn principal_keys_share_a_hash_tag() {
        let p = Principal::Tenant("acme");
        assert_eq!(LimitKey::tenant("acme").hash_tag(), "tenant:acme");
        assert_eq!(LimitKey::route(p, "/orders").hash_tag(), "tenant:acme");
        assert_eq!(LimitKey::period(p, Period::Month).hash_tag(), "tenant:acme");
        assert_eq!(LimitKey::global().hash_tag(), "global");
    }

    #[test]
    fn braces_cannot_break_the_tag_or_collide() {
        let evil = LimitKey::tenant("x}:route:/y");
        assert_eq!(evil.hash_tag(), "tenant:x%7D:route:/y");
        let a = LimitKey::route(Principal::Tenant("a}b"), "/c");
        let b = LimitKey::route(Principal::Tenant("a"), "b}/c");
        assert_ne!(a, b);
        assert_eq!(
            LimitKey::tenant("100%").as_str(),
            "rl:{tenant:100%25}:tenant"
        );
    }
}
