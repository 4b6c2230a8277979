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
/// Samples the long average must have learned before the gradient says anything.
const LATENCY_MIN_SAMPLES: u32 = 50;
/// A run of inflated samples is congestion only once it held this long and this many
/// samples: a loaded machine (or a backend's garbage collector) stalls for a few hundred
/// milliseconds and then answers everything at once, which inflates the short average for
/// a moment, while a queue building up in the backend keeps every answer late.
const LATENCY_SUSTAIN_SECS: f64 = 1.0;
const LATENCY_SUSTAIN_SAMPLES: u32 = 20;

/// botocore's `RateClocker`: requests per second, smoothed over 0.1 s buckets.
#[derive(Debug, Default)]
pub(super) struct RateMeter {
    started: bool,
    /// The first event: the buckets are 0.1 s from it.
    anchor: f64,
    count: f64,
    /// Start of the open bucket, in seconds since the controller's origin.
    pub(super) bucket: f64,
    /// The smoothed rate of the closed buckets.
    pub(super) rate: f64,
}

/// Short and long exponential averages of accepted answers' latency, in seconds, and the
/// current run of inflated samples.
#[derive(Debug, Default)]
pub(super) struct Latency {
    short: Option<f64>,
    /// The baseline: learns only samples outside a run, so a run is judged against what
    /// latency was before it.
    long: Option<f64>,
    samples: u32,
    /// When the current run of inflated samples started (seconds), and its length.
    run_since: Option<f64>,
    run: u32,
    /// The run was read as congestion once already: once per run.
    judged: bool,
}

// === impl RateMeter ===

impl RateMeter {
    /// Counts one event at `t` seconds; closes the bucket when `t` is in a later one. An
    /// event earlier than the open bucket counts in it.
    pub(super) fn record(&mut self, t: f64) {
        if !self.started {
            // The buckets start with the first event, not when the gateway started (an
            // upstream first called after an hour must not measure 1 request per hour)
            // nor on a 0.1 s grid: a first bucket on the grid that the first event opened
            // near its end would count a burst of many requests over the whole 0.1 s, and
            // the first decrease (often within that bucket) would start from a rate a
            // fraction of the real one, then regrow for seconds.
            self.started = true;
            self.anchor = t;
            self.bucket = t;
        }
        let bucket = self.anchor + ((t - self.anchor) / BUCKET_SECS).floor() * BUCKET_SECS;
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
    /// Adds a sample taken at `t` seconds; true once per run of samples whose short
    /// average is `tolerance` × the long one and [`LATENCY_FLOOR_SECS`] above it, when the
    /// run has lasted [`LATENCY_SUSTAIN_SECS`] and [`LATENCY_SUSTAIN_SAMPLES`]. A run that
    /// goes on as long again after that is the backend's new normal (it became slower for
    /// good, the decrease did not help): the long average takes the short one's value.
    pub(super) fn inflated(&mut self, sample: f64, tolerance: f64, t: f64) -> bool {
        let ewma = |avg: Option<f64>, alpha: f64| avg.map_or(sample, |a| a + alpha * (sample - a));
        let short = ewma(self.short, LATENCY_SHORT_ALPHA);
        self.short = Some(short);
        let long = self.long.unwrap_or(sample);
        let inflated = tolerance > 0.0
            && self.samples >= LATENCY_MIN_SAMPLES
            && short > tolerance * long
            && short - long > LATENCY_FLOOR_SECS;
        if !inflated {
            self.long = Some(ewma(self.long, LATENCY_LONG_ALPHA));
            self.samples = self.samples.saturating_add(1);
            (self.run_since, self.run, self.judged) = (None, 0, false);
            return false;
        }
        let since = *self.run_since.get_or_insert(t);
        self.run += 1;
        let lasted = t - since;
        if self.judged && lasted >= 2.0 * LATENCY_SUSTAIN_SECS {
            self.long = Some(short);
            (self.run_since, self.run, self.judged) = (None, 0, false);
            return false;
        }
        let verdict =
            !self.judged && lasted >= LATENCY_SUSTAIN_SECS && self.run >= LATENCY_SUSTAIN_SAMPLES;
        self.judged |= verdict;
        verdict
    }
}
