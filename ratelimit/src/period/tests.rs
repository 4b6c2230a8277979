use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// 2026-11-21T23:59:00Z.
const NOV_21_2359: u64 = 1_795_305_540;

fn w(id: u64, start_unix: u64, end_unix: u64) -> Window {
    Window {
        id,
        start_unix,
        end_unix,
    }
}

#[test]
fn day_windows() {
    let day = Period::Day.window(NOV_21_2359);
    assert_eq!(day, w(20_261_121, 1_795_219_200, 1_795_305_600));
    assert_eq!(day.len_secs(), 86_400);
    assert_eq!(
        day.until_end(Duration::from_secs(NOV_21_2359)),
        Duration::from_secs(60)
    );
    // Boundaries: the first second belongs to the window, the end to the next one.
    assert_eq!(Period::Day.window(1_795_219_200), day);
    assert_eq!(Period::Day.window(1_795_305_599), day);
    assert_eq!(Period::Day.window(1_795_305_600).id, 20_261_122);
    assert_eq!(Period::Day.window(0), w(19_700_101, 0, 86_400));
}

#[test]
fn month_windows() {
    let month = Period::Month.window(NOV_21_2359);
    assert_eq!(month, w(202_611, 1_793_491_200, 1_796_083_200));
    assert_eq!(month.len_secs(), 30 * 86_400);
    assert_eq!(Period::Month.window(1_796_083_199), month);
    assert_eq!(Period::Month.window(1_796_083_200).id, 202_612);
}

#[test]
fn december_rolls_into_january() {
    let t = 1_798_718_400; // 2026-12-31T12:00:00Z
    assert_eq!(
        Period::Month.window(t),
        w(202_612, 1_796_083_200, 1_798_761_600)
    );
    assert_eq!(
        Period::Day.window(t),
        w(20_261_231, 1_798_675_200, 1_798_761_600)
    );
    assert_eq!(Period::Month.window(1_798_761_600).id, 202_701);
    assert_eq!(Period::Day.window(1_798_761_600).id, 20_270_101);
}

#[test]
fn leap_years() {
    // 2028 is a leap year: February has 29 days and the 29th is a day of its own.
    let feb_2028 = Period::Month.window(1_835_308_800);
    assert_eq!(feb_2028, w(202_802, 1_832_976_000, 1_835_481_600));
    assert_eq!(feb_2028.len_secs(), 29 * 86_400);
    assert_eq!(Period::Day.window(1_835_308_800).id, 20_280_228);
    assert_eq!(
        Period::Day.window(1_835_395_200),
        w(20_280_229, 1_835_395_200, 1_835_481_600)
    );
    assert_eq!(Period::Day.window(1_835_481_600).id, 20_280_301);
    // 2026: 28 days. 2000 (divisible by 400): 29. 2100 (by 100, not 400): 28.
    assert_eq!(
        Period::Month.window(1_769_904_000),
        w(202_602, 1_769_904_000, 1_772_323_200)
    );
    assert_eq!(
        Period::Month.window(949_363_200),
        w(200_002, 949_363_200, 951_868_800)
    );
    assert_eq!(
        Period::Month.window(4_105_123_200),
        w(210_002, 4_105_123_200, 4_107_542_400)
    );
}

#[test]
fn absurd_clocks_do_not_overflow() {
    let last = Period::Month.window(u64::MAX);
    assert_eq!(last.id, 999_912);
    assert!(last.end_unix > last.start_unix);
    assert_eq!(Period::Day.window(u64::MAX).id, 99_991_231);
}

#[test]
fn period_names() {
    assert_eq!(Period::Day.to_string(), "day");
    assert_eq!(serde_json::to_string(&Period::Month).unwrap(), "\"month\"");
    let p: Period = serde_json::from_str("\"day\"").unwrap();
    assert_eq!(p, Period::Day);
}

#[test]
fn rfc3339_formats_utc() {
    assert_eq!(rfc3339(NOV_21_2359), "2026-11-21T23:59:00Z");
    assert_eq!(rfc3339(1_795_305_600), "2026-11-22T00:00:00Z");
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
}

#[test]
fn quota_counts_to_the_limit() {
    let q = Quota::new(3);
    let left = Duration::from_secs(60);
    let mut used = 0;
    for expected in [2, 1, 0] {
        let e = q.evaluate(used, 1, left);
        assert!(e.allowed);
        let d = e.decision(true, false);
        assert_eq!((d.limit, d.remaining), (3, expected));
        assert_eq!(d.reset_after, left);
        assert_eq!(d.retry_after, Duration::ZERO);
        used = e.new_used;
    }
    let d = q.evaluate(used, 1, left).decision(false, false);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, left);
    assert_eq!(d.retry_after_secs(), 60);
    assert!(
        !q.evaluate(0, 4, left).allowed,
        "cost above the limit never fits"
    );
}

proptest! {
    /// Any window instant lies in its window; windows of one period tile time without gaps;
    /// ids increase with time; the day and month ids agree with each other.
    #[test]
    fn windows_tile_time(t in 0u64..MAX_UNIX_SECS) {
        for period in [Period::Day, Period::Month] {
            let win = period.window(t);
            prop_assert!(win.start_unix <= t && t < win.end_unix);
            prop_assert_eq!(period.window(win.start_unix), win);
            prop_assert_eq!(period.window(win.end_unix - 1), win);
            if win.end_unix <= MAX_UNIX_SECS {
                let next = period.window(win.end_unix);
                prop_assert_eq!(next.start_unix, win.end_unix);
                prop_assert!(next.id > win.id);
            }
            prop_assert_eq!(win.start_unix % DAY_SECS, 0);
        }
        let (day, month) = (Period::Day.window(t), Period::Month.window(t));
        prop_assert_eq!(day.id / 100, month.id);
        prop_assert_eq!(day.len_secs(), DAY_SECS);
        prop_assert!((28..=31).contains(&(month.len_secs() / DAY_SECS)));
        prop_assert_eq!(Period::Day.window(month.start_unix).id % 100, 1);
    }

    /// Within one window the admitted cost never exceeds the limit, remaining never exceeds
    /// the limit, a request is allowed iff it fits in what remains, and a rejection always
    /// asks for a wait of at least one second.
    #[test]
    fn quota_never_overspends(
        limit in 1u64..50,
        costs in prop::collection::vec(0u64..8, 1..100),
        left_ms in 1u64..(31 * 86_400_000),
    ) {
        let q = Quota::new(limit);
        let left = Duration::from_millis(left_ms);
        let mut used = 0;
        for cost in costs {
            let e = q.evaluate(used, cost, left);
            let before = e.decision(false, false);
            prop_assert!(before.remaining <= limit);
            prop_assert_eq!(e.allowed, cost <= before.remaining);
            if e.allowed {
                used = e.new_used;
                prop_assert!(e.decision(true, false).remaining <= limit);
            } else {
                prop_assert!(before.retry_after_secs() >= 1);
                prop_assert_eq!(before.retry_after, left);
            }
            prop_assert!(used <= limit);
        }
    }
}
