use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::OutlierSettings;

fn endpoint(port: u16, weight: u32) -> Arc<Endpoint> {
    let text = format!("127.0.0.1:{port}");
    Arc::new(Endpoint {
        address: Address {
            scheme: http::uri::Scheme::HTTP,
            authority: text.parse().unwrap(),
            host: http::HeaderValue::from_str(&text).unwrap(),
        },
        weight,
        state: Arc::new(EndpointState::new()),
    })
}

fn set(kind: LoadBalancer, weights: &[u32]) -> EndpointSet {
    let endpoints = weights
        .iter()
        .enumerate()
        .map(|(i, w)| endpoint(9000 + i as u16, *w))
        .collect();
    EndpointSet::new(endpoints, kind, 50, 42)
}

/// Picks `n` times, returning how often each endpoint index was chosen.
fn counts(set: &EndpointSet, clock: &Clock, n: usize, avoid: Option<usize>) -> Vec<usize> {
    let ids: HashMap<usize, usize> = set
        .endpoints()
        .iter()
        .enumerate()
        .map(|(i, e)| (e.state.id, i))
        .collect();
    let mut out = vec![0; set.endpoints().len()];
    for _ in 0..n {
        let mut now = Now::new(clock);
        let e = set.pick(avoid, &mut now).unwrap();
        out[ids[&e.state.id]] += 1;
    }
    out
}

fn outlier() -> OutlierSettings {
    OutlierSettings {
        consecutive_failures: 3,
        base_ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(25),
        max_ejected_percent: 50,
    }
}

#[test]
fn smooth_weighted_round_robin_is_nginx_sequence() {
    // nginx's documented example: weights 5, 1, 1 → a a b a c a a.
    assert_eq!(smooth_schedule(&[5, 1, 1]), vec![0, 0, 1, 0, 2, 0, 0]);
    // Equal weights: plain round robin, period n (gcd reduced).
    assert_eq!(smooth_schedule(&[3, 3, 3]), vec![0, 1, 2]);
    assert_eq!(smooth_schedule(&[2, 4]), vec![1, 0, 1]);
}

#[tokio::test(start_paused = true)]
async fn round_robin_follows_weights() {
    let clock = Clock::new();
    let set = set(LoadBalancer::RoundRobin, &[3, 1]);
    assert_eq!(counts(&set, &clock, 400, None), vec![300, 100]);
}

#[tokio::test(start_paused = true)]
async fn least_request_avoids_the_loaded_endpoint() {
    let clock = Clock::new();
    let set = set(LoadBalancer::LeastRequest, &[1, 1, 1]);
    let _busy: Vec<_> = (0..5).map(|_| set.endpoints()[0].state.start()).collect();
    let c = counts(&set, &clock, 300, None);
    // Two distinct choices: the loaded one always loses to the other.
    assert_eq!(c[0], 0, "{c:?}");
    assert!(c[1] > 100 && c[2] > 100, "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn least_request_weights_scale_the_load() {
    let clock = Clock::new();
    let set = set(LoadBalancer::LeastRequest, &[4, 1]);
    // 3 in flight on a weight-4 endpoint cost (3+1)/4 = 1 = (0+1)/1: ties go to the first
    // choice, so both are picked; with 4 in flight the heavy one loses.
    let _busy: Vec<_> = (0..4).map(|_| set.endpoints()[0].state.start()).collect();
    assert_eq!(counts(&set, &clock, 50, None), vec![0, 50]);
}

#[tokio::test(start_paused = true)]
async fn peak_ewma_prefers_the_fast_endpoint_and_forgives_with_time() {
    let clock = Clock::new();
    let set = set(LoadBalancer::PeakEwma, &[1, 1, 1]);
    let now = clock.now();
    set.endpoints()[0]
        .state
        .observe_latency(Duration::from_millis(500), now);
    for e in &set.endpoints()[1..] {
        e.state.observe_latency(Duration::from_millis(5), now);
    }
    let c = counts(&set, &clock, 300, None);
    assert_eq!(c[0], 0, "{c:?}");
    // Peak sensitivity: one slow sample replaces the estimate at once.
    set.endpoints()[1]
        .state
        .observe_latency(Duration::from_millis(900), now);
    assert!(set.endpoints()[1].state.ewma(now) >= 900e6);
    // Idle estimates decay toward 0 (1/e per EWMA_DECAY), so a slow endpoint gets tried again.
    tokio::time::advance(endpoint::EWMA_DECAY * 3).await;
    let later = clock.now();
    let decayed = set.endpoints()[0].state.ewma(later);
    assert!(
        decayed < 500e6 * 0.06 && decayed > 500e6 * 0.04,
        "{decayed}"
    );
}

#[tokio::test(start_paused = true)]
async fn avoided_endpoint_is_skipped_when_another_exists() {
    let clock = Clock::new();
    for kind in [
        LoadBalancer::RoundRobin,
        LoadBalancer::LeastRequest,
        LoadBalancer::PeakEwma,
    ] {
        let set = set(kind, &[1, 1, 1]);
        let avoid = set.endpoints()[1].state.id;
        let c = counts(&set, &clock, 90, Some(avoid));
        assert_eq!(c[1], 0, "{kind:?}: {c:?}");
        assert_eq!(c[0] + c[2], 90);
    }
    // A single endpoint is returned even when avoided: nothing else to try.
    let single = set(LoadBalancer::RoundRobin, &[1]);
    let avoid = single.endpoints()[0].state.id;
    assert_eq!(counts(&single, &clock, 3, Some(avoid)), vec![3]);
}

#[tokio::test(start_paused = true)]
async fn ejection_grows_with_repeats_is_capped_and_expires() {
    let clock = Clock::new();
    let set = set(LoadBalancer::RoundRobin, &[1, 1, 1]);
    let o = outlier();
    let target = set.endpoints()[0].clone();
    let fail = |n| {
        let mut ejected = None;
        for _ in 0..n {
            ejected = ejected.or(set.record(&target, Outcome::Failure, &o, &clock));
        }
        ejected
    };
    // Two failures and a success: the count starts again.
    assert!(fail(2).is_none());
    assert!(set.record(&target, Outcome::Success, &o, &clock).is_none());
    assert!(fail(2).is_none());
    let first = fail(1).expect("third failure in a row ejects");
    assert_eq!(clock.until(first), Duration::from_secs(10));
    assert_eq!(counts(&set, &clock, 30, None)[0], 0);

    tokio::time::advance(Duration::from_secs(10)).await;
    let c = counts(&set, &clock, 30, None);
    assert!(c[0] > 0, "back after base_ejection: {c:?}");
    let second = fail(3).expect("ejected again");
    assert_eq!(clock.until(second), Duration::from_secs(20), "2 × base");
    tokio::time::advance(Duration::from_secs(20)).await;
    let third = fail(3).expect("ejected again");
    assert_eq!(
        clock.until(third),
        Duration::from_secs(25),
        "capped at max_ejection"
    );
    assert_eq!(target.state.ejections(), 3);

    // Quiet for longer than max_ejection after the last one ended: back to 1 × base.
    tokio::time::advance(Duration::from_secs(25 + 26)).await;
    let fourth = fail(3).expect("ejected again");
    assert_eq!(clock.until(fourth), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn max_ejected_percent_keeps_the_last_endpoints() {
    let clock = Clock::new();
    let o = outlier();
    let set = set(LoadBalancer::RoundRobin, &[1, 1, 1]);
    let eject = |i: usize| {
        (0..3).fold(None, |acc, _| {
            acc.or(set.record(&set.endpoints()[i], Outcome::Failure, &o, &clock))
        })
    };
    assert!(eject(0).is_some(), "1 of 3 = 33 % ≤ 50 %");
    assert!(eject(1).is_none(), "2 of 3 = 66 % > 50 %");
    // A single-endpoint upstream is never ejected.
    let single = set_single();
    for _ in 0..10 {
        assert!(single
            .record(&single.endpoints()[0], Outcome::Failure, &o, &clock)
            .is_none());
    }
}

fn set_single() -> EndpointSet {
    set(LoadBalancer::RoundRobin, &[1])
}

#[tokio::test(start_paused = true)]
async fn active_checks_have_hysteresis_and_panic_mode_uses_all() {
    let clock = Clock::new();
    let set = set(LoadBalancer::RoundRobin, &[1, 1, 1]);
    let state = &set.endpoints()[0].state;
    assert_eq!(state.record_check(false, 2, 3), None);
    assert_eq!(state.record_check(false, 2, 3), None);
    assert_eq!(state.record_check(false, 2, 3), Some(false));
    assert_eq!(counts(&set, &clock, 30, None)[0], 0, "unhealthy is skipped");
    assert_eq!(state.record_check(true, 2, 3), None);
    assert_eq!(state.record_check(true, 2, 3), Some(true));
    assert_eq!(counts(&set, &clock, 30, None)[0], 10);

    // Two of three down: 33 % usable < 50 % panic threshold → balance over all.
    for i in 0..2 {
        for _ in 0..3 {
            set.endpoints()[i].state.record_check(false, 2, 3);
        }
    }
    assert!(set.in_panic(1));
    let c = counts(&set, &clock, 30, None);
    assert!(c.iter().all(|&n| n > 0), "panic mode spreads: {c:?}");
    assert!(set.any_usable(&clock));
    set.endpoints()[2].state.record_check(false, 2, 1);
    assert!(!set.any_usable(&clock));
}

#[test]
fn hosts_file_lookup_and_endpoints_file_parsing() {
    let hosts = "# comment\n127.0.0.2 orders.internal other\n127.0.0.3\torders.internal\n::1 v6\nbogus orders.internal\n";
    let ips = discovery::hosts_lookup(hosts, "ORDERS.internal");
    assert_eq!(ips.len(), 2);
    assert_eq!(discovery::hosts_lookup(hosts, "v6").len(), 1);
    assert!(discovery::hosts_lookup(hosts, "missing").is_empty());

    let parsed = crate::config::parse_endpoints_file(
        "# deploy 7\nhttp://127.0.0.1:1\n\nhttp://h:2 weight=3\n",
    )
    .unwrap();
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[1].1, 3);
    for bad in [
        "",
        "ftp://x:1",
        "http://h:1 0",
        "http://h:1 2 3",
        "http://h:1/path",
    ] {
        assert!(crate::config::parse_endpoints_file(bad).is_err(), "{bad:?}");
    }
}
