//! Table-driven tests of classification and the safety ladder.

use super::*;
use AttemptOutcome::{Failure, Status, Timeout};

fn st(code: u16) -> AttemptOutcome {
    Status(StatusCode::from_u16(code).expect("status"))
}

/// Request shapes of the ladder.
#[derive(Debug, Clone, Copy)]
enum Req {
    /// GET (rung 2 by method).
    Get,
    /// POST on a route declared idempotent.
    PostIdempotentRoute,
    /// POST holding the lock, upstream does not dedupe.
    PostLocked,
    /// POST holding the lock, upstream dedupes on the key.
    PostLockedDedupes,
    /// POST without lock.
    Post,
    /// PATCH without lock.
    Patch,
}

fn safety(r: Req) -> RequestSafety {
    match r {
        Req::Get => RequestSafety::new(&Method::GET, false, false, false),
        Req::PostIdempotentRoute => RequestSafety::new(&Method::POST, true, false, false),
        Req::PostLocked => RequestSafety::new(&Method::POST, false, true, false),
        Req::PostLockedDedupes => RequestSafety::new(&Method::POST, false, true, true),
        Req::Post => RequestSafety::new(&Method::POST, false, false, true),
        Req::Patch => RequestSafety::new(&Method::PATCH, false, false, false),
    }
}

const ALL: [Req; 6] = [
    Req::Get,
    Req::PostIdempotentRoute,
    Req::PostLocked,
    Req::PostLockedDedupes,
    Req::Post,
    Req::Patch,
];

#[test]
fn retryable_statuses_are_exactly_the_seed_set() {
    for code in 100..=599u16 {
        let expected = matches!(code, 408 | 429 | 500 | 502 | 503 | 504);
        let transient = failure_class(st(code)) != FailureClass::Final;
        assert_eq!(transient, expected, "{code}");
    }
}

#[test]
fn final_outcomes_are_never_retried() {
    let finals = [
        st(200),
        st(201),
        st(204),
        st(301),
        st(304),
        st(400),
        st(401),
        st(403),
        st(404),
        st(405),
        st(409),
        st(410),
        st(413),
        st(422),
        st(501),
        st(505),
        Failure(FailureKind::TlsCertificate),
        Failure(FailureKind::Other),
    ];
    for outcome in finals {
        for req in ALL {
            assert_eq!(
                retry_rung(outcome, safety(req)),
                None,
                "{outcome:?} {req:?}"
            );
        }
    }
}

#[test]
fn provably_unprocessed_is_retryable_for_any_method() {
    let kinds = [
        FailureKind::ConnectRefused,
        FailureKind::ConnectTimeout,
        FailureKind::Dns,
        FailureKind::ResetBeforeSent,
        FailureKind::TlsHandshakeTimeout,
    ];
    for k in kinds {
        assert!(is_provably_unprocessed(k));
        for req in ALL {
            assert_eq!(retry_rung(Failure(k), safety(req)), Some(Rung::Unprocessed));
        }
    }
    assert!(!is_provably_unprocessed(FailureKind::ResetAfterSent));
    assert!(!is_provably_unprocessed(FailureKind::TlsCertificate));
}

#[test]
fn safety_ladder_table() {
    use Rung::{Idempotent as I, Protected as P};
    let reset_after = Failure(FailureKind::ResetAfterSent);
    // outcome, then expected rung for: Get, PostIdempotentRoute, PostLocked,
    // PostLockedDedupes, Post, Patch.
    let table: [(AttemptOutcome, [Option<Rung>; 6]); 8] = [
        (st(408), [Some(I), Some(I), Some(P), Some(P), None, None]),
        (st(429), [Some(I), Some(I), Some(P), Some(P), None, None]),
        (st(503), [Some(I), Some(I), Some(P), Some(P), None, None]),
        (st(500), [Some(I), Some(I), None, Some(P), None, None]),
        (st(502), [Some(I), Some(I), None, Some(P), None, None]),
        (st(504), [Some(I), Some(I), None, Some(P), None, None]),
        (reset_after, [Some(I), Some(I), None, Some(P), None, None]),
        (Timeout, [Some(I), Some(I), None, Some(P), None, None]),
    ];
    for (outcome, expected) in table {
        for (req, want) in ALL.into_iter().zip(expected) {
            assert_eq!(
                retry_rung(outcome, safety(req)),
                want,
                "{outcome:?} {req:?}"
            );
        }
    }
}

#[test]
fn idempotent_methods() {
    for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] {
        assert!(is_idempotent_method(&m.parse().expect("method")), "{m}");
    }
    for m in ["POST", "PATCH", "CONNECT", "TRACE", "PURGE"] {
        assert!(!is_idempotent_method(&m.parse().expect("method")), "{m}");
    }
}

#[test]
fn breaker_counts_only_gateway_failures() {
    use BreakerOutcome::*;
    let table = [
        (st(200), Success),
        (st(404), Success),
        (st(422), Success),
        (st(501), Success),
        (st(429), Neutral),
        (st(408), Neutral),
        (st(500), Neutral),
        (st(502), Failure),
        (st(503), Failure),
        (st(504), Failure),
        (Timeout, Failure),
        (
            AttemptOutcome::Failure(FailureKind::ConnectRefused),
            Failure,
        ),
        (
            AttemptOutcome::Failure(FailureKind::TlsCertificate),
            Failure,
        ),
        (AttemptOutcome::Failure(FailureKind::Other), Neutral),
    ];
    for (outcome, want) in table {
        assert_eq!(breaker_outcome(outcome), want, "{outcome:?}");
    }
}

#[test]
fn error_type_labels() {
    assert_eq!(error_type(st(503)), "status_503");
    assert_eq!(error_type(Timeout), "attempt_timeout");
    assert_eq!(
        error_type(Failure(FailureKind::ConnectRefused)),
        "connect_refused"
    );
}
