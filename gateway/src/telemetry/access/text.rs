//! The access line in the human log format, written without `tracing`'s formatting: the
//! same bytes as `tracing-subscriber`'s formatter with [`PlainFields`] writes for the event
//! in [`AccessLine::emit`](super::AccessLine), formatted straight into a reused buffer and
//! written to stderr in one call, as the subscriber does.
//!
//! Through `tracing`, one access line cost ~15.5k instructions (callgrind, `bench/callgrind.sh
//! pass` with `ACCESS_LOG=true`): 18 fields each formatted by `core::fmt` behind two `dyn`
//! calls, and the timestamp. Here the numbers are `itoa`, the strings are copies, and the
//! timestamp's date and time of day are formatted once per second. Only human text without
//! colour takes this path (`main.rs` calls [`write_access_lines_directly`]); JSON and
//! coloured output keep going through `tracing`. The level filter is still `tracing`'s: the
//! caller writes a line only when `portcullis::access` is enabled at `info`.
//!
//! [`PlainFields`]: crate::telemetry::fields::PlainFields

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Datelike, Timelike, Utc};

use super::AccessLine;
use crate::plumbing::client::IpText;
use crate::telemetry::traceparent::put_hex;

/// Set once at start-up when logs are human text without colour on stderr.
static DIRECT: AtomicBool = AtomicBool::new(false);

/// Access lines are from now on written by this module rather than through `tracing`: only
/// for a process whose subscriber writes human text without colour to stderr (see `main.rs`).
pub fn write_access_lines_directly() {
    DIRECT.store(true, Ordering::Relaxed);
}

/// Whether [`write_access_lines_directly`] was called.
pub(super) fn direct() -> bool {
    DIRECT.load(Ordering::Relaxed)
}

/// A second since the epoch and its `YYYY-MM-DDTHH:MM:SS`.
type Second = Option<(u64, [u8; 19])>;

thread_local! {
    /// The line being formatted (kept between lines, so a line allocates nothing) and the
    /// second it last formatted.
    static LINE: RefCell<(Vec<u8>, Second)> = const { RefCell::new((Vec::new(), None)) };
}

/// Writes `line`, stamped `now`, to stderr.
pub(super) fn write(line: &AccessLine, duration: Duration, now: SystemTime) {
    LINE.with(|cell| {
        let Ok(mut state) = cell.try_borrow_mut() else {
            return; // re-entered from stderr's own write: impossible, and never worth a panic
        };
        let (buf, second) = &mut *state;
        buf.clear();
        timestamp(buf, second, now);
        buf.extend_from_slice(b"  INFO portcullis::access: ");
        fields(buf, line, duration);
        buf.push(b'\n');
        // As the subscriber: one write of the whole line; a failed write loses the line.
        let _ = std::io::stderr().lock().write_all(buf);
    });
}

/// `2026-11-24T04:24:35.585961Z`, as `tracing-subscriber`'s default timer writes it.
fn timestamp(buf: &mut Vec<u8>, second: &mut Second, now: SystemTime) {
    let since = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let text = match second {
        Some((cached, text)) if *cached == secs => *text,
        _ => {
            let text = date_time(now);
            *second = Some((secs, text));
            text
        }
    };
    buf.extend_from_slice(&text);
    buf.push(b'.');
    let mut micros = *b"000000";
    put_digits(&mut micros, since.subsec_micros());
    buf.extend_from_slice(&micros);
    buf.push(b'Z');
}

/// `YYYY-MM-DDTHH:MM:SS` of `at` in UTC.
fn date_time(at: SystemTime) -> [u8; 19] {
    let t = DateTime::<Utc>::from(at);
    let mut text = *b"0000-00-00T00:00:00";
    let year = u32::try_from(t.year()).unwrap_or(0).min(9999);
    for (slot, value) in [
        (0..4, year),
        (5..7, t.month()),
        (8..10, t.day()),
        (11..13, t.hour()),
        (14..16, t.minute()),
        (17..19, t.second().min(59)),
    ] {
        put_digits(&mut text[slot], value);
    }
    text
}

/// The low `slot.len()` decimal digits of `value`, zero-padded.
fn put_digits(slot: &mut [u8], mut value: u32) {
    for byte in slot.iter_mut().rev() {
        // `value % 10` is a digit, so the cast cannot truncate.
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// `request name=value ...`: the message and the fields of `AccessLine::emit`, in its order.
fn fields(buf: &mut Vec<u8>, line: &AccessLine, duration: Duration) {
    let exchange = &line.exchange;
    let mut numbers = itoa::Buffer::new();
    buf.extend_from_slice(b"request request_id=");
    dash(buf, line.request_id.as_ref().and_then(|v| v.to_str().ok()));
    buf.extend_from_slice(b" trace_id=");
    let mut trace_id = [0; 32];
    put_hex(&mut trace_id, &exchange.trace_id().to_be_bytes());
    buf.extend_from_slice(&trace_id);
    buf.extend_from_slice(b" tenant=");
    dash(buf, line.tenant.as_deref());
    buf.extend_from_slice(b" client_ip=");
    match line.client_ip {
        Some(ip) => buf.extend_from_slice(IpText::new(ip).as_bytes()),
        None => buf.push(b'-'),
    }
    buf.extend_from_slice(b" method=");
    buf.extend_from_slice(line.method.as_str().as_bytes());
    buf.extend_from_slice(b" path=");
    buf.extend_from_slice(line.path.as_bytes());
    buf.extend_from_slice(b" route=");
    buf.extend_from_slice(line.route.as_bytes());
    buf.extend_from_slice(b" upstream=");
    dash(buf, line.upstream.as_deref());
    buf.extend_from_slice(b" endpoint=");
    dash(buf, exchange.endpoint().as_ref().map(|a| a.as_str()));
    for (name, value) in [
        (&b" attempts="[..], u64::from(exchange.attempts())),
        (b" status=", u64::from(line.status)),
        (b" bytes_in=", exchange.bytes_in()),
        (b" bytes_out=", line.bytes_out),
    ] {
        buf.extend_from_slice(name);
        buf.extend_from_slice(numbers.format(value).as_bytes());
    }
    buf.extend_from_slice(b" duration_ms=");
    millis(buf, duration);
    buf.extend_from_slice(b" upstream_duration_ms=");
    millis(buf, exchange.upstream_time());
    buf.extend_from_slice(b" rate_limit=");
    quoted(buf, line.rate_limit);
    buf.extend_from_slice(b" idempotency=");
    quoted(buf, line.idempotency);
    buf.extend_from_slice(b" idempotency_key=");
    dash(
        buf,
        line.idempotency_key.as_ref().and_then(|v| v.to_str().ok()),
    );
}

/// The value, or `-` (the `Dash` of the `tracing` path).
fn dash(buf: &mut Vec<u8>, value: Option<&str>) {
    buf.extend_from_slice(value.unwrap_or("-").as_bytes());
}

/// A `&str` field as `tracing` writes it: `Debug`, i.e. quoted, escaped when it needs to be.
fn quoted(buf: &mut Vec<u8>, value: &str) {
    let plain = |b: u8| b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ';
    if value.bytes().all(plain) {
        buf.push(b'"');
        buf.extend_from_slice(value.as_bytes());
        buf.push(b'"');
    } else {
        let _ = write!(buf, "{value:?}");
    }
}

/// Milliseconds at microsecond resolution, as `Debug` writes the `f64` the `tracing` path
/// logs (`(micros as f64) / 1000.0`): `0.434`, `12.5`, `3.0`.
fn millis(buf: &mut Vec<u8>, duration: Duration) {
    let micros = duration.as_micros();
    let mut digits = itoa::Buffer::new();
    buf.extend_from_slice(digits.format(micros / 1000).as_bytes());
    buf.push(b'.');
    let fraction = micros % 1000;
    if fraction == 0 {
        buf.push(b'0');
        return;
    }
    let mut text = *b"000";
    put_digits(&mut text, u32::try_from(fraction).unwrap_or(0));
    let len = text.iter().rposition(|&b| b != b'0').map_or(1, |i| i + 1);
    buf.extend_from_slice(&text[..len]);
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use axum::body::Body;
    use http::{HeaderValue, Method, Request};

    use super::*;
    use crate::config::{Config, ProcessEnv};
    use crate::plumbing::client::TrustedProxies;
    use crate::plumbing::held::Held;
    use crate::telemetry::fields::{Captured, PlainFields};
    use crate::telemetry::{Exchange, Telemetry};

    fn exchange() -> Arc<Exchange> {
        let config = Config::parse(
            "[[upstreams]]\nname = \"orders\"\nendpoints = [\"http://127.0.0.1:9\"]\n\
             [[routes]]\nprefix = \"/\"\nupstream = \"orders\"\n",
            &ProcessEnv,
        )
        .unwrap();
        let telemetry = Arc::new(Telemetry::with_tracer(
            &config,
            Arc::new(TrustedProxies::default()),
            None,
        ));
        let mut request = Request::new(Body::empty());
        Arc::new(Exchange::open(&telemetry, &mut request, None))
    }

    /// What the `tracing` path writes for `line`, from the message on.
    fn traced(line: &AccessLine, duration: Duration) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .fmt_fields(PlainFields)
            .finish();
        tracing::subscriber::with_default(subscriber, || line.trace(duration));
        let text = out.text();
        let prefix = " INFO portcullis::access: ";
        text.strip_prefix(prefix).unwrap_or(&text).to_owned()
    }

    fn direct(line: &AccessLine, duration: Duration) -> String {
        let mut buf = Vec::new();
        fields(&mut buf, line, duration);
        buf.push(b'\n');
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn fields_are_the_bytes_tracing_writes() {
        let exchange = exchange();
        let started = tokio::time::Instant::now();
        let bare = AccessLine::new(started, exchange.clone(), Method::GET, "/x".into(), 404);
        let mut full = AccessLine::new(
            started,
            exchange.clone(),
            Method::from_bytes(b"PURGE").unwrap(),
            "/orders/7?q=caf%C3%A9".into(),
            201,
        );
        full.request_id = Some(HeaderValue::from_static("r\"q\\1"));
        full.tenant = Some(Arc::from("acme"));
        full.client_ip = Some(IpAddr::from([10, 0, 200, 7]));
        full.route = Arc::from("/orders");
        full.upstream = Some(Arc::from("orders"));
        full.rate_limit = "allowed";
        full.idempotency = "first \"execution\"";
        full.idempotency_key = Some(HeaderValue::from_static("k-1"));
        full.sent(1234);
        let mut v6 = AccessLine::new(started, exchange, Method::POST, "/".into(), 503);
        v6.client_ip = Some("2001:db8::1".parse().unwrap());
        v6.request_id = Some(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()); // not visible ASCII: `-`
        for line in [&bare, &full, &v6] {
            for micros in [0, 1, 434, 1000, 1_500, 12_340, 98_765_432] {
                let duration = Duration::from_micros(micros);
                assert_eq!(direct(line, duration), traced(line, duration));
            }
        }
        assert!(direct(&full, Duration::ZERO).contains(" client_ip=10.0.200.7 "));
    }

    #[test]
    fn milliseconds_read_as_the_f64_debug_of_the_tracing_path() {
        // Every value below 10 ms, then a sparse sweep up to ~28 hours (bounded: ~13k values).
        let sweep = (0..10_000_u64).chain((0..3_000).map(|i| i * 33_333_337));
        for micros in sweep {
            let mut buf = Vec::new();
            millis(&mut buf, Duration::from_micros(micros));
            let expected = format!("{:?}", (micros as f64) / 1000.0);
            assert_eq!(String::from_utf8(buf).unwrap(), expected, "{micros}");
        }
    }

    #[test]
    fn timestamps_read_as_the_default_timer_writes_them_across_seconds() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let mut second = None;
        for offset in [0, 999_999, 1_000_000, 1_000_007, 86_400_000_000, 1] {
            let at = base + Duration::from_micros(offset);
            let mut buf = Vec::new();
            timestamp(&mut buf, &mut second, at);
            let expected = DateTime::<Utc>::from(at)
                .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string();
            assert_eq!(String::from_utf8(buf).unwrap(), expected, "{offset}");
        }
    }
}
