use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::gcra::Gcra;
use crate::period::{Period, Quota};

/// 2023-11-14T22:13:20.400Z.
const NOW: Duration = Duration::from_millis(1_700_000_000_400);
const SEC: u64 = 1_000_000_000;

fn headers(policy: &Policy, decision: &Decision, unix_now: Duration) -> HeaderMap {
    let mut h = HeaderMap::new();
    write_headers(&mut h, policy, decision, unix_now);
    h
}

/// The `t` parameter of the `RateLimit` field, `None` when absent.
fn t(h: &HeaderMap) -> Option<u64> {
    let field = h[RATELIMIT].to_str().unwrap();
    field
        .split(';')
        .find_map(|p| p.strip_prefix("t="))
        .map(|t| t.parse().unwrap())
}

fn num(h: &HeaderMap, name: impl http::header::AsHeaderName) -> u64 {
    h[name].to_str().unwrap().parse().unwrap()
}

/// 1 token/s, burst 10, in nanosecond ticks, as the local backend builds it.
fn one_per_second_burst_ten() -> (Policy, Gcra) {
    let p = Policy::try_new("tenant", 1, Duration::from_secs(1), 10).unwrap();
    let g = Gcra::new(p.interval_nanos(), p.burst());
    (p, g)
}

#[test]
fn one_per_second_burst_ten_reports_the_next_token_not_a_full_bucket() {
    let (p, g) = one_per_second_burst_ten();
    let (mut tat, start) = (None, 5 * SEC);
    // One request from a full bucket: 9 left, the next token in 1 s, full again in 1 s.
    let e = g.evaluate(tat, start, 1);
    let h = headers(&p, &e.decision(true, false, NS), NOW);
    assert_eq!(h[RATELIMIT], "\"tenant\";r=9;t=1");
    assert_eq!(num(&h, X_RATELIMIT_RESET), 1_700_000_001);
    tat = Some(e.new_tat);
    // The rest of the burst, 1 ms apart: t stays at 1, never the 10 s to a full bucket.
    for i in 1..10 {
        let e = g.evaluate(tat, start + i * 1_000_000, 1);
        assert!(e.allowed, "request {i}");
        let h = headers(&p, &e.decision(true, false, NS), NOW);
        assert_eq!(t(&h), Some(1), "request {i}: {:?}", h[RATELIMIT]);
        tat = Some(e.new_tat);
    }
    // Empty: the 11th is refused; t is Retry-After, Reset still says "full in 10 s".
    let e = g.evaluate(tat, start + 10_000_000, 1);
    assert!(!e.allowed);
    let h = headers(&p, &e.decision(false, false, NS), NOW);
    assert_eq!(h[RETRY_AFTER], "1");
    assert_eq!(h[RATELIMIT], "\"tenant\";r=0;t=1");
    assert_eq!(num(&h, X_RATELIMIT_RESET), 1_700_000_010);
}

#[test]
fn admitted_headers() {
    let p = Policy::try_new("tenant", 100, Duration::from_secs(1), 200).unwrap();
    let d = Decision {
        allowed: true,
        shadow: false,
        limit: 200,
        remaining: 42,
        reset_after: Duration::from_millis(2_500),
        refill_after: Some(Duration::from_millis(7)),
        retry_after: Duration::ZERO,
    };
    let h = headers(&p, &d, NOW);
    assert_eq!(h[X_RATELIMIT_LIMIT], "200");
    assert_eq!(h[X_RATELIMIT_REMAINING], "42");
    // ⌊now⌋ + ⌈2.5 s⌉: the bucket is full at …002.9, within a second of the value.
    assert_eq!(h[X_RATELIMIT_RESET], "1700000003");
    assert_eq!(h[RATELIMIT_POLICY], "\"tenant\";q=100;w=1");
    // 7 ms to the next token: rounded up like Retry-After, never 0.
    assert_eq!(h[RATELIMIT], "\"tenant\";r=42;t=1");
    assert!(!h.contains_key(RETRY_AFTER));
}

#[test]
fn a_full_bucket_announces_no_t() {
    // A decision that consumed nothing from a full bucket (a peek, a shadow policy that
    // would have refused): no additional quota will ever come, so `t` is left out.
    let (p, g) = one_per_second_burst_ten();
    let d = g.evaluate(None, SEC, 1).decision(false, true, NS);
    assert_eq!(d.refill_after, None);
    let h = headers(&p, &d, NOW);
    assert_eq!(h[RATELIMIT], "\"tenant\";r=10");
    assert_eq!(num(&h, X_RATELIMIT_RESET), NOW.as_secs(), "full already");
}

#[test]
fn rejected_t_equals_retry_after() {
    let p = Policy::try_new("ip", 10, Duration::from_secs(1), 20).unwrap();
    let d = Decision {
        allowed: false,
        shadow: false,
        limit: 20,
        remaining: 0,
        reset_after: Duration::from_millis(2_000),
        refill_after: Some(Duration::from_millis(100)),
        retry_after: Duration::from_millis(1_100),
    };
    let h = headers(&p, &d, Duration::from_secs(10));
    assert_eq!(h[RETRY_AFTER], "2");
    assert_eq!(h[X_RATELIMIT_REMAINING], "0");
    assert_eq!(h[X_RATELIMIT_RESET], "12");
    assert_eq!(h[RATELIMIT], "\"ip\";r=0;t=2");
}

#[test]
fn cost_above_one_waits_for_enough_tokens_when_refused() {
    let (p, g) = one_per_second_burst_ten();
    // A cost-3 request from a full bucket: 7 left, the next token in 1 s.
    let e = g.evaluate(None, 0, 3);
    let h = headers(&p, &e.decision(true, false, NS), NOW);
    assert_eq!(h[RATELIMIT], "\"tenant\";r=7;t=1");
    assert_eq!(num(&h, X_RATELIMIT_RESET), NOW.as_secs() + 3);
    // A cost-9 request now needs 2 more tokens: refused with t = Retry-After = 2, though
    // the next single token comes in 1 s.
    let e = g.evaluate(Some(e.new_tat), 0, 9);
    assert!(!e.allowed);
    let d = e.decision(false, false, NS);
    assert_eq!(d.refill_after, Some(Duration::from_secs(1)));
    let h = headers(&p, &d, NOW);
    assert_eq!(h[RETRY_AFTER], "2");
    assert_eq!(h[RATELIMIT], "\"tenant\";r=7;t=2");
}

#[test]
fn fractional_intervals_round_up() {
    // 2 per 3 s: one token every 1.5 s.
    let p = Policy::try_new("slow", 2, Duration::from_secs(3), 4).unwrap();
    let g = Gcra::new(p.interval_nanos(), p.burst());
    let e = g.evaluate(None, 0, 1);
    let h = headers(&p, &e.decision(true, false, NS), NOW);
    assert_eq!(h[RATELIMIT], "\"slow\";r=3;t=2");
}

#[test]
fn calendar_quota_t_is_the_window_end() {
    // 2026-11-21T23:59:00.400Z: 59.6 s to midnight.
    let now = Duration::from_millis(1_795_305_540_400);
    let until_midnight = Period::Day.window(now.as_secs()).until_end(now);
    assert_eq!(until_midnight, Duration::from_millis(59_600));
    let p = Policy::calendar("daily_quota", 1000, Period::Day).unwrap();
    let quota = Quota::new(1000);

    // Admitted with units left: t still points at the reset, as does X-RateLimit-Reset.
    let d = quota.evaluate(10, 1, until_midnight).decision(true, false);
    let h = headers(&p, &d, now);
    assert_eq!(h[RATELIMIT], "\"daily_quota\";r=989;t=60");
    assert_eq!(h[X_RATELIMIT_RESET], "1795305600");
    assert!(!h.contains_key(RETRY_AFTER));

    // Exhausted: refused until midnight; t = Retry-After.
    let d = quota
        .evaluate(1000, 1, until_midnight)
        .decision(false, false);
    let h = headers(&p, &d, now);
    assert_eq!(h[RETRY_AFTER], "60");
    assert_eq!(h[X_RATELIMIT_LIMIT], "1000");
    assert_eq!(h[X_RATELIMIT_RESET], "1795305600");
    assert_eq!(h[RATELIMIT_POLICY], "\"daily_quota\";q=1000;w=86400");
    assert_eq!(h[RATELIMIT], "\"daily_quota\";r=0;t=60");

    let p = Policy::calendar("monthly_quota", 9, Period::Month).unwrap();
    let h = headers(&p, &d, now);
    assert_eq!(h[RATELIMIT_POLICY], "\"monthly_quota\";q=9;w=2592000");
}

const NS: Duration = Duration::from_nanos(1);

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..5_000_000_000).prop_map(Duration::from_nanos),
        (0u64..40 * 86_400_000).prop_map(Duration::from_millis),
    ]
}

fn any_decision() -> impl Strategy<Value = Decision> {
    (
        any::<(bool, bool)>(),
        1u64..1_000,
        any_duration(),
        prop::option::of(any_duration()),
        any_duration(),
    )
        .prop_flat_map(|((allowed, shadow), limit, reset, refill, retry)| {
            (0..=limit).prop_map(move |remaining| Decision {
                allowed,
                shadow,
                limit,
                remaining,
                reset_after: reset,
                refill_after: refill,
                retry_after: if allowed { Duration::ZERO } else { retry },
            })
        })
}

proptest! {
    /// Whatever the decision: a rejection's Retry-After ≥ t ≥ 0 and Retry-After ≥ 1 (here
    /// t == Retry-After, which the draft's "not earlier than t" only needs as ≤).
    #[test]
    fn rejection_retry_after_is_never_before_t(d in any_decision(), now_ms in 0u64..4_000_000_000_000) {
        let p = Policy::try_new("p", 3, Duration::from_secs(1), d.limit).unwrap();
        let h = headers(&p, &d, Duration::from_millis(now_ms));
        if d.blocks() {
            let retry_after = num(&h, RETRY_AFTER);
            let t = t(&h);
            prop_assert!(retry_after >= 1);
            prop_assert!(t.is_some_and(|t| retry_after >= t), "{:?} vs {retry_after}", t);
            prop_assert_eq!(t, Some(retry_after));
        } else {
            prop_assert!(!h.contains_key(RETRY_AFTER));
            prop_assert!(t(&h).is_none_or(|t| t >= 1), "t is never 0: {:?}", h[RATELIMIT]);
        }
    }

    /// Over real bucket arithmetic: an admitted request's t never exceeds one token's
    /// interval (rounded up), whatever the burst; a refused one's t is its Retry-After.
    #[test]
    fn bucket_t_is_at_most_one_interval_unless_refused(
        rate in 1u64..100,
        per_ms in 1u64..60_000,
        burst in 1u64..50,
        cost in 1u64..5,
        used_ms in 0u64..3_600_000,
        committed in any::<bool>(),
    ) {
        let p = Policy::try_new("p", rate, Duration::from_millis(per_ms), burst).unwrap();
        let g = Gcra::new(p.interval_nanos(), p.burst());
        let now = 10 * 3_600 * SEC;
        let tat = (now + used_ms * 1_000_000).min(now + g.tolerance());
        let e = g.evaluate(Some(tat), now, cost);
        let d = e.decision(committed && e.allowed, false, NS);
        let h = headers(&p, &d, NOW);
        let t = t(&h);
        if e.allowed {
            let interval = crate::decision::ceil_secs(Duration::from_nanos(g.interval()));
            prop_assert!(t.is_none_or(|t| (1..=interval.max(1)).contains(&t)), "{t:?} > {interval}");
            prop_assert_eq!(t.is_none(), d.remaining == burst, "only a full bucket omits t");
        } else {
            prop_assert_eq!(t, Some(num(&h, RETRY_AFTER)));
        }
    }
}

#[test]
fn field_formatters_follow_the_draft_with_and_without_a_window() {
    assert_eq!(
        super::policy_field("concurrency", 2, None).unwrap(),
        "\"concurrency\";q=2"
    );
    assert_eq!(
        super::policy_field("tenant", 100, Some(1)).unwrap(),
        "\"tenant\";q=100;w=1"
    );
    assert_eq!(
        super::ratelimit_field("concurrency", 0, Some(1)).unwrap(),
        "\"concurrency\";r=0;t=1"
    );
    assert_eq!(super::ratelimit_field("ip", 4, None).unwrap(), "\"ip\";r=4");
    assert!(super::ratelimit_field("bad\nname", 0, None).is_none());
}
