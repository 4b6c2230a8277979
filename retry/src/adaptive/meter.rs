//! What the controller measures: request rates (botocore's `RateClocker`) and the latency
//! gradient of accepted answers.

/// Weight of the newest 0.1 s bucket in the measured rate (botocore).
const SMOOTHING: f64 = 0.8;
/// Width of one rate-measurement bucket, in seconds.
const BUCKET_SECS: f64 = 0.1;
/// Weights of the newest latency sample in the short and the long average.
const LATENCY_SHORT_ALPHA: f64 = 0.25;
const LATENCY_LONG_ALPHA: f64 = 0.02;
/// Latency inflation below this is never congestion: loopback and scheduling jitter on a
/// backend that answers in a millisecond would otherwise read as a 3× gradient.
const LATENCY_FLOOR_SECS: f64 = 0.025;

/// botocore's `RateClocker`: requests per second, smoothed over 0.1 s buckets.
#[derive(Debug, Default)]
pub(super) struct RateMeter {
    started: bool,
    count: f64,
    /// Start of the open bucket, in seconds since the controller's origin.
    pub(super) bucket: f64,
    /// The smoothed rate of the closed buckets.
    pub(super) rate: f64,
}

/// Short and long exponential averages of accepted answers' latency, in seconds.
#[derive(Debug, Default)]
pub(super) struct Latency {
    short: Option<f64>,
    long: Option<f64>,
}

// === impl RateMeter ===

impl RateMeter {
    /// Counts one event at `t` seconds; closes the bucket when `t` is in a later one. An
    /// event earlier than the open bucket counts in it.
    pub(super) fn record(&mut self, t: f64) {
        let bucket = (t / BUCKET_SECS).floor() * BUCKET_SECS;
        if !self.started {
            // The first bucket opens with the first event, not when the gateway started:
            // an upstream first called after an hour must not measure 1 request per hour.
            self.started = true;
            self.bucket = bucket;
        }
        self.count += 1.0;
        if bucket > self.bucket {
            let current = self.count / (bucket - self.bucket);
            self.rate = current * SMOOTHING + self.rate * (1.0 - SMOOTHING);
            self.count = 0.0;
            self.bucket = bucket;
        }
    }

    /// The smoothed rate; before the first bucket closes, the rate so far (throttling can
    /// start within the first 0.1 s, and a rate of 0 would send the controller to its floor).
    pub(super) fn estimate(&self, t: f64) -> f64 {
        if self.rate > 0.0 {
            self.rate
        } else {
            self.count / (t - self.bucket).max(BUCKET_SECS)
        }
    }
}

// === impl Latency ===

impl Latency {
    /// Adds a sample; true when the short average is `tolerance` × the long one and
    /// [`LATENCY_FLOOR_SECS`] above it. The long average learns the inflated samples too,
    /// so a backend that became slower for good stops reading as congested.
    pub(super) fn inflated(&mut self, sample: f64, tolerance: f64) -> bool {
        let ewma =
            |avg: Option<f64>, alpha: f64| Some(avg.map_or(sample, |a| a + alpha * (sample - a)));
        self.short = ewma(self.short, LATENCY_SHORT_ALPHA);
        self.long = ewma(self.long, LATENCY_LONG_ALPHA);
        match (self.short, self.long) {
            (Some(short), Some(long)) if tolerance > 0.0 => {
                short > tolerance * long && short - long > LATENCY_FLOOR_SECS
            }
            _ => false,
        }
    }
}
