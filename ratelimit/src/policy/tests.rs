use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn validates_fields() {
    assert_eq!(
        Policy::try_new("t", 0, secs(1), 1),
        Err(PolicyError::ZeroRate)
    );
    assert_eq!(
        Policy::try_new("t", 1, secs(1), 0),
        Err(PolicyError::ZeroBurst)
    );
    assert_eq!(
        Policy::try_new("t", 1, Duration::ZERO, 1),
        Err(PolicyError::ZeroPeriod)
    );
    assert!(matches!(
        Policy::try_new("", 1, secs(1), 1),
        Err(PolicyError::InvalidName(_))
    ));
    assert!(matches!(
        Policy::try_new("a\"b", 1, secs(1), 1),
        Err(PolicyError::InvalidName(_))
    ));
    assert!(matches!(
        Policy::try_new("t", 2_000_000_000, secs(1), 1),
        Err(PolicyError::RateTooHigh { .. })
    ));
    // Above one per µs, the refill must fit the script's nanosecond range (2^52 ns).
    assert!(matches!(
        Policy::try_new("t", 2_000_000, secs(1), 1 << 52),
        Err(PolicyError::RefillTooLong { .. })
    ));
    assert!(matches!(
        Policy::try_new("t", 1, secs(86_400), u64::MAX / 2),
        Err(PolicyError::RefillTooLong { .. })
    ));
    assert!(Policy::try_new("route:/orders", 1_000_000, secs(1), 1).is_ok());
    assert!(Policy::try_new("global", 1_000_000_000, secs(1), 1).is_ok());
}

#[test]
fn fleet_scale_rates_use_nanosecond_ticks() {
    let p = Policy::try_new("global", 100_000_000, secs(1), 100_000_000).unwrap();
    assert_eq!(p.store_tick(), Duration::from_nanos(1));
    assert_eq!(p.store_interval(), 10);
    // 1 per day with a burst of 1000: 1000 days to refill, beyond 2^52 ns: microseconds.
    let p = Policy::try_new("slow", 1, secs(86_400), 1000).unwrap();
    assert_eq!(p.store_tick(), Duration::from_micros(1));
    assert_eq!(p.store_interval(), 86_400_000_000);
}

#[test]
fn interval_rounds_up() {
    let p = Policy::try_new("t", 3, secs(1), 1).unwrap();
    assert_eq!(p.interval_nanos(), 333_333_334);
    assert_eq!(p.interval_micros(), 333_334);
    let p = Policy::try_new("t", 50_000, secs(1), 1).unwrap();
    assert_eq!(p.interval_micros(), 20);
}

#[test]
fn header_value_matches_the_draft() {
    let p = Policy::try_new("tenant", 100, secs(1), 200).unwrap();
    assert_eq!(p.header_value(), "\"tenant\";q=100;w=1");
    let p = Policy::try_new("ip", 10, Duration::from_millis(100), 20).unwrap();
    assert_eq!(p.header_value(), "\"ip\";q=100;w=1");
    let p = Policy::try_new("day", 1000, secs(86_400), 1000).unwrap();
    assert_eq!(p.header_value(), "\"day\";q=1000;w=86400");
    let p = Policy::try_new("odd", 3, Duration::from_millis(1500), 3).unwrap();
    assert_eq!(p.header_value(), "\"odd\";q=4;w=2");
}

#[test]
fn calendar_policies() {
    assert_eq!(
        Policy::calendar("daily_quota", 0, Period::Day),
        Err(PolicyError::ZeroQuota)
    );
    assert_eq!(
        Policy::calendar("q", MAX_QUOTA + 1, Period::Month),
        Err(PolicyError::QuotaTooLarge(MAX_QUOTA + 1))
    );
    assert!(matches!(
        Policy::calendar("a b", 1, Period::Day),
        Err(PolicyError::InvalidName(_))
    ));
    let daily = Policy::calendar("daily_quota", 1000, Period::Day).unwrap();
    assert_eq!(daily.period(), Some(Period::Day));
    assert_eq!((daily.burst(), daily.rate()), (1000, 1000));
    assert_eq!(daily.per(), secs(86_400));
    assert_eq!(daily.interval_nanos(), 0);
    assert_eq!(daily.header_value(), "\"daily_quota\";q=1000;w=86400");
    assert_eq!(
        daily.header_value_at(secs(1_795_305_540)),
        "\"daily_quota\";q=1000;w=86400"
    );
    assert_ne!(
        daily,
        Policy::calendar("daily_quota", 1000, Period::Month).unwrap()
    );
    assert_eq!(Policy::try_new("t", 1, secs(1), 1).unwrap().period(), None);
}

#[test]
fn monthly_header_uses_the_current_month_length() {
    let p = Policy::calendar("monthly_quota", 50_000, Period::Month).unwrap();
    let at = |unix: u64| p.header_value_at(secs(unix)).to_str().unwrap().to_owned();
    // 2026-11-21 (30 days), 2026-12-31 (31), 2026-02-01 (28), 2028-02-28 (29).
    assert_eq!(at(1_795_305_540), "\"monthly_quota\";q=50000;w=2592000");
    assert_eq!(at(1_798_718_400), "\"monthly_quota\";q=50000;w=2678400");
    assert_eq!(at(1_769_904_000), "\"monthly_quota\";q=50000;w=2419200");
    assert_eq!(at(1_835_308_800), "\"monthly_quota\";q=50000;w=2505600");
}
