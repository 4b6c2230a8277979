//! [`RateLimitOutcome`]: what the layer decided, left on the response for the layers
//! outside (the gateway's access log, spans and per-tenant metrics). A response without it
//! was not rate-limited at all (no policy applied).

/// The layer's decision about one request, in the **response** extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateLimitOutcome {
    /// Every enforced policy admitted the request.
    Allowed,
    /// Admitted, but a shadow policy would have refused it (counted, never enforced).
    ShadowLimited,
    /// Refused with 429 by an enforced policy.
    Limited,
    /// No decision could be made (store unreachable, fail-closed): 503.
    Unavailable,
}

impl RateLimitOutcome {
    /// A stable lower-case name for logs and span attributes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::ShadowLimited => "shadow_limited",
            Self::Limited => "limited",
            Self::Unavailable => "unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable() {
        let names: Vec<_> = [
            RateLimitOutcome::Allowed,
            RateLimitOutcome::ShadowLimited,
            RateLimitOutcome::Limited,
            RateLimitOutcome::Unavailable,
        ]
        .into_iter()
        .map(RateLimitOutcome::as_str)
        .collect();
        assert_eq!(
            names,
            ["allowed", "shadow_limited", "limited", "unavailable"]
        );
    }
}
