//! The retry metrics' names and labels (docs/operations.md), captured with a local recorder.

use std::sync::Mutex;

use ::metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use super::*;

/// One recorded event: name, sorted labels, value.
type Event = (String, Vec<(String, String)>, f64);

#[derive(Default)]
struct Capture {
    events: Arc<Mutex<Vec<Event>>>,
}

struct Handle {
    key: Key,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Handle {
    fn push(&self, value: f64) {
        let mut labels: Vec<(String, String)> = self
            .key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let name = self.key.name().to_owned();
        self.events
            .lock()
            .expect("lock")
            .push((name, labels, value));
    }
}

impl ::metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.push(value as f64);
    }
    fn absolute(&self, value: u64) {
        self.push(value as f64);
    }
}

impl ::metrics::GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.push(value);
    }
    fn decrement(&self, value: f64) {
        self.push(-value);
    }
    fn set(&self, value: f64) {
        self.push(value);
    }
}

impl ::metrics::HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.push(value);
    }
}

impl Capture {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        Arc::new(Handle {
            key: key.clone(),
            events: self.events.clone(),
        })
    }

    /// Sum of the values recorded under `name` with exactly `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        self.events
            .lock()
            .expect("lock")
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| v)
            .sum()
    }

    fn count(&self, name: &str) -> usize {
        let events = self.events.lock().expect("lock");
        events.iter().filter(|(n, _, _)| n == name).count()
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

const DEP: (&str, &str) = ("dependency", "orders");

#[tokio::test(start_paused = true)]
async fn retries_are_counted_with_seed_002_names() {
    let _trace = trace_init();
    let capture = Capture::default();
    let _metrics = ::metrics::set_default_local_recorder(&capture);
    let f = fixture([st(503), st(503), st(200)]);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );

    assert_eq!(capture.sum("upstream_requests_total", &[DEP]), 1.0);
    assert_eq!(capture.sum("upstream_attempts_total", &[DEP]), 3.0);
    for n in ["2", "3"] {
        let labels = [DEP, ("attempt_number", n)];
        assert_eq!(
            capture.sum("retry_attempts_total", &labels),
            1.0,
            "attempt {n}"
        );
    }
    assert_eq!(capture.count("retry_backoff_duration_seconds"), 2);
    assert!(capture.count("retry_budget_utilization_ratio") > 0);
    assert_eq!(capture.sum("retry_exhausted_total", &[DEP]), 0.0);
}

#[tokio::test(start_paused = true)]
async fn exhaustion_budget_and_breaker_are_counted() {
    let _trace = trace_init();
    let capture = Capture::default();
    let _metrics = ::metrics::set_default_local_recorder(&capture);

    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        503
    );
    assert_eq!(capture.sum("retry_exhausted_total", &[DEP]), 1.0);

    let budget = BudgetConfig::try_new(0, Duration::from_secs(30), 0).expect("valid");
    let dep = Arc::new(UpstreamState::new(
        "orders",
        1,
        false,
        budget,
        BreakerConfig::default(),
    ));
    let f = fixture_with([st(503)], RetryParams::default(), dep);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        503
    );
    assert_eq!(capture.sum("retry_budget_exhausted_total", &[DEP]), 1.0);
    let suppressed = [DEP, ("reason", "budget_exhausted")];
    assert_eq!(capture.sum("retry_suppressed_total", &suppressed), 1.0);

    let breaker = BreakerConfig::try_new(
        0.5,
        1,
        Duration::from_secs(30),
        Duration::from_secs(10),
        1,
        1,
    )
    .expect("valid");
    let dep = Arc::new(UpstreamState::new(
        "orders",
        1,
        false,
        BudgetConfig::default(),
        breaker,
    ));
    // One attempt per request: the breaker counts requests, at their end.
    let once = RetryParams {
        max_retries: 0,
        ..RetryParams::default()
    };
    let f = fixture_with([st(503)], once, dep);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        503
    );
    assert_eq!(
        f.upstream.hits(),
        1,
        "the breaker opened after the first failure"
    );
    let states: Vec<f64> = capture
        .events
        .lock()
        .expect("lock")
        .iter()
        .filter(|(n, _, _)| n == "circuit_breaker_state")
        .map(|(_, _, v)| *v)
        .collect();
    assert_eq!(
        states.last(),
        Some(&2.0),
        "open after one failure: {states:?}"
    );
    assert!(f.send(f.request(Method::GET, Body::empty())).await.is_err());
    assert_eq!(capture.sum("circuit_breaker_rejected_total", &[DEP]), 1.0);
}
