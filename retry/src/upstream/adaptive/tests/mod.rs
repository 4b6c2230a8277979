//! The controller against a synthetic backend, on explicit instants (the controller takes
//! `now`) and on tokio's paused clock (the throttle reads it).

use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use super::controller::{Cause, BETA};
use super::*;
use crate::error::FailureKind;
use portcullis_problem::grpc::GrpcCode;

mod backend;
use backend::{drive, drive_clients, Backend, Seconds};

pub(super) const MS: Duration = Duration::from_millis(1);
/// No deadline: only `max_wait` bounds the wait.
pub(super) const ANY: Duration = Duration::MAX;

/// `n` requests from `from`, one every `every`, each admitted at once (no limit yet) and
/// accepted by the backend after `latency`.
#[track_caller]
fn send_accepted(
    controller: &mut Controller,
    from: Instant,
    n: u32,
    every: Duration,
    latency: Duration,
) {
    for i in 0..n {
        let now = from + every * i;
        controller.admit(now, true, ANY).expect("no limit yet");
        controller.observe(Signal::Accepted(latency), now, now + latency);
    }
}

/// The goal through clients that honour `Retry-After`: after 5 s the backend sees
/// at most 1.1× its capacity every second, and at least 90 % of it is in use. Refused
/// clients stay away whole seconds: without the queue (`max_wait` 50 ms, the former
/// pacing) the gaps they leave cost a good part of the capacity.
#[test]
fn clients_honouring_retry_after_keep_the_backend_busy() {
    let run = |max_wait: Duration| {
        let start = Instant::now();
        let config = AdaptiveConfig::default()
            .with_max_wait(max_wait)
            .expect("valid");
        let mut controller = Controller::new(config, start);
        let mut backend = Backend::new(50.0, 5.0, start);
        drive_clients(&mut controller, &mut backend, start, 20, 30).0
    };
    let mean = |seconds: &Seconds| {
        let settled = &seconds[5..];
        f64::from(settled.iter().map(|s| s.1).sum::<u32>()) / settled.len() as f64
    };
    let seconds = run(DEFAULT_MAX_WAIT);
    for (i, (reached, _, _)) in seconds.iter().enumerate().skip(5) {
        assert!(
            *reached <= 55,
            "second {i}: {reached} reached the backend: {seconds:?}"
        );
    }
    assert!(
        mean(&seconds) >= 45.0,
        "mean accepted {}/s: {seconds:?}",
        mean(&seconds)
    );
    let paced_only = run(50 * MS);
    assert!(
        mean(&paced_only) < mean(&seconds),
        "the queue is what keeps it busy: {paced_only:?}"
    );
}

/// The goal on the bare controller, offered 200 req/s evenly (an open loop: every
/// refused request is simply lost): a backend taking 50 req/s keeps at least 90 % of it in
/// use after 5 s, and every second stays within 1.1× of it: after a decrease the requests
/// already waiting for their tokens are re-timed to leave at the new rate (with the
/// tokens they were promised at the old one, up to `max_wait` of them leave at the rate
/// the backend just refused: 57/s).
#[test]
fn converges_to_the_capacity_of_the_backend() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let mut backend = Backend::new(50.0, 5.0, start);
    let seconds = drive(&mut controller, &mut backend, start, 200, 30);
    let settled = &seconds[5..];
    for (i, (reached, accepted, _)) in settled.iter().enumerate() {
        assert!(
            *reached <= 55,
            "second {}: {reached} reached the backend: {seconds:?}",
            i + 5
        );
        assert!(
            *accepted >= 35,
            "second {}: only {accepted} accepted: {seconds:?}",
            i + 5
        );
    }
    let accepted: u32 = settled.iter().map(|s| s.1).sum();
    let mean = f64::from(accepted) / settled.len() as f64;
    assert!(mean >= 45.0, "mean accepted {mean}/s: {seconds:?}");
}

#[test]
fn nothing_is_refused_before_the_backend_throttles() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let mut backend = Backend::new(1000.0, 100.0, start);
    let seconds = drive(&mut controller, &mut backend, start, 200, 5);
    assert!(
        seconds.iter().all(|s| s.2 == 0 && s.0 == 200),
        "{seconds:?}"
    );
    assert_eq!(controller.rate(start + Duration::from_secs(5)), None);
}

#[test]
fn backs_off_on_429_and_503_once_per_window() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    // 100 req/s for a second, all accepted: the measured rate is about 100.
    send_accepted(&mut controller, start, 100, 10 * MS, MS);
    let t = start + Duration::from_secs(1);
    controller.observe(
        Signal::of(AttemptOutcome::Status(StatusCode::TOO_MANY_REQUESTS), MS),
        t,
        t,
    );
    let first = controller.rate(t).expect("a limit after a 429");
    assert!(
        (BETA * 90.0..=BETA * 105.0).contains(&first),
        "β × ~100: {first}"
    );
    // Twenty more answers to attempts sent before the decrease: no further decrease.
    for _ in 0..20 {
        controller.observe(Signal::Throttled, t - MS, t + MS);
    }
    assert_eq!(controller.rate(t + MS), Some(first));
    // So do answers to the next few attempts (10 sends at the new rate: ~150 ms).
    controller.observe(Signal::Throttled, t + 50 * MS, t + 51 * MS);
    assert_eq!(controller.rate(t + 51 * MS), Some(first));
    // A 503 to an attempt sent after that window: decreases again.
    let later = t + 200 * MS;
    controller.observe(
        Signal::of(AttemptOutcome::Status(StatusCode::SERVICE_UNAVAILABLE), MS),
        later,
        later,
    );
    let second = controller.rate(later).expect("limit");
    assert!((second - first * BETA).abs() < 1.0, "{first} → {second}");
}

#[test]
fn timeouts_count_as_congestion_and_unrelated_failures_do_not() {
    let t = Duration::from_secs(1);
    assert_eq!(Signal::of(AttemptOutcome::Timeout, t), Signal::Timeout);
    assert_eq!(
        Signal::of(AttemptOutcome::Grpc(GrpcCode::ResourceExhausted), t),
        Signal::Throttled
    );
    for kind in [
        FailureKind::ConnectRefused,
        FailureKind::ConnectTimeout,
        FailureKind::ResetAfterSent,
        FailureKind::Dns,
    ] {
        assert_eq!(
            Signal::of(AttemptOutcome::Failure(kind), t),
            Signal::Unrelated
        );
    }
    // A 500 is an answer: the backend took the request at that rate.
    assert_eq!(
        Signal::of(AttemptOutcome::Status(StatusCode::INTERNAL_SERVER_ERROR), t),
        Signal::Accepted(t)
    );

    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    for i in 0..50 {
        let now = start + 10 * MS * i;
        controller.admit(now, true, ANY).expect("no limit");
        let failure = AttemptOutcome::Failure(FailureKind::ConnectRefused);
        controller.observe(Signal::of(failure, MS), now, now + MS);
    }
    assert_eq!(controller.rate(start + Duration::from_secs(1)), None);
}

#[test]
fn recovers_gradually_when_the_backend_does() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let mut backend = Backend::new(20.0, 2.0, start);
    drive(&mut controller, &mut backend, start, 100, 10);
    let throttled = controller
        .rate(start + Duration::from_secs(10))
        .expect("learned");
    assert!(throttled < 30.0, "{throttled}");
    // The backend now takes 200 req/s: the rate climbs back, not in one jump.
    let later = start + Duration::from_secs(10);
    let mut backend = Backend::new(200.0, 20.0, later);
    let seconds = drive(&mut controller, &mut backend, later, 100, 20);
    let reached: Vec<u32> = seconds.iter().map(|s| s.0).collect();
    assert!(reached[0] < 40, "no jump: {reached:?}");
    // Climbing until it carries the whole demand (it may send more for a while then: the
    // requests that queued at the lower rate leave too).
    let carried = reached
        .iter()
        .position(|r| *r >= 100)
        .unwrap_or(reached.len());
    assert!(
        reached[..carried].windows(2).all(|w| w[1] + 5 >= w[0]),
        "monotone climb: {reached:?}"
    );
    assert!(
        reached[19] >= 95,
        "all of the demand after 20 s: {reached:?}"
    );
}

/// A queue building up in the backend keeps every answer late: a run of inflated latency
/// that lasts a second (and 20 samples) decreases the rate once; half a second does not.
#[test]
fn sustained_inflated_latency_is_congestion() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let answer = |controller: &mut Controller, from: Instant, n: u32, latency| {
        let mut causes = Vec::new();
        for i in 0..n {
            let now = from + 10 * MS * i;
            let _ = controller.admit(now, true, ANY);
            causes.extend(controller.observe(Signal::Accepted(latency), now, now + latency));
        }
        causes
    };
    assert!(answer(&mut controller, start, 200, 5 * MS).is_empty());
    let t = start + Duration::from_secs(2);
    assert_eq!(controller.rate(t), None);
    // The backend queues: 100 ms answers. Half a second of them is not enough…
    assert!(answer(&mut controller, t, 50, 100 * MS).is_empty());
    assert_eq!(controller.rate(t + 500 * MS), None);
    // …a second of them is, once.
    let causes = answer(&mut controller, t + 500 * MS, 100, 100 * MS);
    assert_eq!(causes, [Cause::Latency]);
    assert!(controller.rate(t + Duration::from_millis(1500)).is_some());

    // With latency_tolerance = 0 it never is.
    let config = AdaptiveConfig::try_new(1.0, None, 0.0).expect("valid");
    let mut controller = Controller::new(config, start);
    answer(&mut controller, start, 100, 5 * MS);
    assert!(answer(
        &mut controller,
        start + Duration::from_secs(1),
        300,
        500 * MS
    )
    .is_empty());
    assert_eq!(controller.rate(start + Duration::from_secs(4)), None);
}

/// A backend that became slower for good is not congested: after the one decrease, a run
/// that goes on becomes the new baseline, and latency decreases the rate no more.
#[test]
fn a_backend_slower_for_good_is_learned_not_fought() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let mut causes = Vec::new();
    for i in 0..1000 {
        let now = start + 10 * MS * i;
        let latency = if i < 200 { 5 * MS } else { 150 * MS };
        let _ = controller.admit(now, true, ANY);
        causes.extend(controller.observe(Signal::Accepted(latency), now, now + latency));
    }
    assert_eq!(
        causes,
        [Cause::Latency],
        "one decrease in 8 s of slow answers"
    );
}

/// The upstream of `bench/adaptive.sh` on a loaded machine: it stalls 150 ms every 2.1 s
/// and then answers everything that came meanwhile at once, up to 150 ms late (and its
/// bucket refuses part of the burst). Latency never decreases the rate on that noise: the
/// run is the same as with latency ignored (only the backend's 429s decrease it), and
/// within 1.1× of the capacity after 5 s.
#[test]
fn a_stalling_backend_is_not_read_as_congested() {
    let run = |config: AdaptiveConfig| {
        let start = Instant::now();
        let mut controller = Controller::new(config, start);
        let mut backend =
            Backend::new(50.0, 5.0, start).stalling(Duration::from_millis(2100), 150 * MS);
        drive_clients(&mut controller, &mut backend, start, 20, 30)
    };
    let (seconds, causes) = run(AdaptiveConfig::default());
    assert!(
        !causes.contains(&Cause::Latency),
        "latency read as congestion: {causes:?} {seconds:?}"
    );
    let ignored = AdaptiveConfig::try_new(DEFAULT_MIN_RATE, None, 0.0).expect("valid");
    assert_eq!(seconds, run(ignored).0);
    assert!(seconds[5..].iter().all(|s| s.0 <= 55), "{seconds:?}");
}

#[test]
fn bounds_hold_and_refusals_say_when_the_next_token_comes() {
    let start = Instant::now();
    let config = AdaptiveConfig::try_new(2.0, Some(4.0), 2.0).expect("valid");
    let mut controller = Controller::new(config, start);
    // Each congestion signal (a window apart) takes β of the rate, down to the floor.
    let mut t = start;
    for _ in 0..10 {
        controller.observe(Signal::Throttled, t, t);
        t += Duration::from_secs(2);
    }
    assert_eq!(controller.rate(t), Some(2.0), "min_rate floor");
    // 2 req/s: a token every 500 ms. Three at once: the first goes, the next two wait for
    // theirs (within the default max_wait of 1 s); the fourth's would come after 1.5 s.
    let t = t + Duration::from_secs(1);
    assert_eq!(controller.admit(t, true, ANY), Ok(Duration::ZERO));
    assert_eq!(controller.admit(t, true, ANY), Ok(500 * MS));
    assert_eq!(controller.admit(t, true, ANY), Ok(1000 * MS));
    assert_eq!(controller.admit(t, true, ANY), Err(1500 * MS));
    // A request with 400 ms left is refused what it could not use.
    assert_eq!(controller.admit(t, true, 400 * MS), Err(1500 * MS));
    let mut backend = Backend::new(1000.0, 100.0, start);
    let later = start + Duration::from_secs(2);
    drive(&mut controller, &mut backend, later, 100, 30);
    assert_eq!(
        controller.rate(later + Duration::from_secs(30)),
        Some(4.0),
        "max_rate cap"
    );
}

#[test]
fn config_names_the_field() {
    let err = AdaptiveConfig::try_new(0.0, None, 2.0).expect_err("min_rate");
    assert_eq!(err.field, "min_rate");
    let err = AdaptiveConfig::try_new(5.0, Some(1.0), 2.0).expect_err("max_rate");
    assert_eq!(err.field, "max_rate");
    let err = AdaptiveConfig::try_new(1.0, None, 1.0).expect_err("tolerance");
    assert_eq!(err.field, "latency_tolerance");
    assert!(AdaptiveConfig::try_new(1.0, None, 0.0).is_ok());
}

#[test]
fn the_fleet_splits_what_it_learned_by_demand() {
    let report = |learned: Option<f64>, demand| FleetReport {
        learned_rate: learned,
        demand,
    };
    let a = report(Some(40.0), 100.0);
    let b = report(None, 0.0);
    assert_eq!(fleet_share(&b, &[a, b]), Some(40.0 / 101.0));
    assert_eq!(fleet_share(&a, &[a]), Some(40.0));
    let c = report(Some(20.0), 100.0);
    assert_eq!(fleet_share(&a, &[a, c]), Some(30.0));
    assert_eq!(fleet_share(&b, &[b, report(None, 5.0)]), None);
}

#[tokio::test(start_paused = true)]
async fn a_fleet_share_caps_a_replica_until_it_lapses() {
    let name: std::sync::Arc<str> = "orders".into();
    let throttle = AdaptiveThrottle::new(&name, AdaptiveConfig::default());
    assert_eq!(throttle.rate(), None);
    throttle.set_fleet_share(Some(10.0), Duration::from_secs(2));
    assert_eq!(throttle.rate(), Some(10.0));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(throttle.admit(true, ANY), Ok(Duration::ZERO));
    assert_eq!(
        throttle.admit(true, ANY),
        Ok(100 * MS),
        "one token per 100 ms at 10 req/s"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(throttle.rate(), None, "lapsed: on its own again");
    assert!(throttle.admit(true, ANY).is_ok());
    assert!(throttle.admit(true, ANY).is_ok());
}

#[test]
fn the_rate_is_measured_from_the_first_request_not_from_start_up() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    // First called an hour after start-up, at 100 req/s.
    let first = start + Duration::from_secs(3600);
    send_accepted(&mut controller, first, 50, 10 * MS, MS);
    let t = first + Duration::from_millis(500);
    controller.observe(Signal::Throttled, t, t);
    let rate = controller.rate(t).expect("learned");
    assert!(rate > 50.0, "0.7 × ~100, not the floor: {rate}");
}

#[test]
fn a_token_due_soon_is_waited_for_and_later_requests_queue_behind_it() {
    let start = Instant::now();
    let config = AdaptiveConfig::try_new(50.0, Some(50.0), 0.0)
        .and_then(|c| c.with_max_wait(50 * MS))
        .expect("valid");
    let mut controller = Controller::new(config, start);
    controller.observe(Signal::Throttled, start, start);
    assert_eq!(controller.rate(start), Some(50.0));
    // 50 req/s: a token every 20 ms; three arrive at once: they leave 20 ms apart.
    let t = start + Duration::from_millis(20);
    assert_eq!(controller.admit(t, true, ANY), Ok(Duration::ZERO));
    let pace = controller.admit(t, true, ANY).expect("paced");
    assert!((19 * MS..=21 * MS).contains(&pace), "{pace:?}");
    let pace = controller.admit(t, true, ANY).expect("paced");
    assert!((39 * MS..=41 * MS).contains(&pace), "{pace:?}");
    // With max_wait = 50 ms, the next one (60 ms) is refused.
    assert!(controller.admit(t, true, ANY).is_err());
}

/// After a decrease the requests already waiting leave at the new rate: what was left of
/// each one's wait is stretched by old rate / new rate, and a new request queues behind
/// the stretched queue.
#[test]
fn a_decrease_re_times_the_queue_at_the_new_rate() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    send_accepted(&mut controller, start, 100, 10 * MS, MS);
    let t = start + Duration::from_secs(1);
    controller.observe(Signal::Throttled, t, t);
    let old = controller.rate(t).expect("learned");
    // Forty at once, 200 ms later: the queue spaces them at the old rate.
    let t = t + 200 * MS;
    let dues: Vec<Instant> = (0..40)
        .map(|_| t + controller.admit(t, true, ANY).expect("queued"))
        .collect();
    let last = *dues.last().expect("forty");
    assert!(last > t + 400 * MS, "{:?}", last - t);
    // 100 ms later, a 429 for the first of them: the rate is cut to β of it.
    let cut = t + 100 * MS;
    assert_eq!(
        controller.observe(Signal::Throttled, t, cut),
        Some(Cause::Throttled)
    );
    let new = controller.rate(cut).expect("limit");
    assert!((new - old * BETA).abs() < 1e-9, "{old} → {new}");
    // Those due before the cut leave as promised; the others are re-spaced at the new rate.
    for due in &dues {
        let retimed = controller.retime(t, *due);
        if *due <= cut {
            assert_eq!(retimed, *due);
        } else {
            let expected = (*due - cut).as_secs_f64() / BETA;
            assert!(((retimed - cut).as_secs_f64() - expected).abs() < 1e-6);
        }
    }
    // Re-timed from the cut on, nothing more to stretch.
    let retimed = controller.retime(t, last);
    assert_eq!(controller.retime(last, retimed), retimed);
    // A new request queues behind the stretched queue, one token later.
    let wait = controller.admit(cut, true, ANY).expect("within max_wait");
    assert!(
        cut + wait >= retimed && cut + wait <= retimed + 2 * Duration::from_secs_f64(1.0 / new),
        "{:?} vs {:?}",
        cut + wait - t,
        retimed - t
    );
}

/// The throttle waits out a pace re-timed by a decrease that happens while it waits (on
/// tokio's paused clock).
#[tokio::test(start_paused = true)]
async fn a_waiting_request_is_re_timed_by_a_decrease_meanwhile() {
    let name: std::sync::Arc<str> = "orders".into();
    let throttle = std::sync::Arc::new(AdaptiveThrottle::new(&name, AdaptiveConfig::default()));
    let ok = AttemptOutcome::Status(StatusCode::OK);
    let slow_down = AttemptOutcome::Status(StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..100 {
        throttle.admit(true, ANY).expect("no limit yet");
        throttle.observe(ok, Instant::now());
        tokio::time::advance(10 * MS).await;
    }
    throttle.observe(slow_down, Instant::now());
    let old = throttle.rate().expect("learned");
    tokio::time::advance(200 * MS).await;
    let sent = Instant::now();
    let pace = (0..40)
        .map(|_| throttle.admit(true, ANY).expect("queued"))
        .max()
        .expect("forty");
    let waiter = {
        let throttle = throttle.clone();
        tokio::spawn(async move {
            throttle.wait_turn(pace).await;
            Instant::now()
        })
    };
    // The waiter starts waiting (as it would right after its admission) before the cut.
    tokio::task::yield_now().await;
    tokio::time::advance(100 * MS).await;
    throttle.observe(slow_down, sent);
    let new = throttle.rate().expect("limit");
    assert!(new < old, "{old} → {new}");
    let left = waiter.await.expect("waiter") - sent;
    let expected = 0.1 + (pace.as_secs_f64() - 0.1) * old / new;
    assert!(
        (left.as_secs_f64() - expected).abs() < 0.002,
        "left after {left:?}, expected {expected} s (pace {pace:?})"
    );
}

/// The first decrease often comes within the first 0.1 s of traffic (a backend's bucket of
/// 5 is empty after 25 ms at 200 req/s): it starts from the rate really sent, even when the
/// first request came at the end of a 0.1 s tick since start-up (a grid bucket would count
/// those few milliseconds of sends over the whole 0.1 s: a fifth of the rate, or less).
#[test]
fn the_first_decrease_starts_from_the_rate_really_sent() {
    let start = Instant::now();
    let mut controller = Controller::new(AdaptiveConfig::default(), start);
    let first = start + 95 * MS;
    send_accepted(&mut controller, first, 7, 5 * MS, 2 * MS);
    let t = first + 35 * MS;
    controller.observe(Signal::Throttled, t, t);
    let rate = controller.rate(t).expect("learned");
    assert!(
        rate >= 40.0,
        "β × 70 (7 in the first 0.1 s), not a fifth of it: {rate}"
    );
}
