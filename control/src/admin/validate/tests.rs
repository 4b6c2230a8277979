use std::time::Duration;

use super::*;

fn fields(json: &str) -> Fields {
    Fields::parse(json.as_bytes()).expect("JSON object")
}

fn names(errors: &[FieldError]) -> Vec<&str> {
    errors.iter().map(|e| e.field.as_str()).collect()
}

#[test]
fn malformed_bodies_name_the_body() {
    for body in ["{", "[1]", "\"x\"", "{\"a\":1,}"] {
        let errors = Fields::parse(body.as_bytes()).unwrap_err();
        assert_eq!(names(&errors), ["body"], "{body}");
    }
    assert!(
        Fields::parse(b"").is_ok(),
        "an empty body is an empty object"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut f =
        fields(r#"{"rate": 0, "burst": -3, "per": "soon", "brust": 5, "daily_quota": "7"}"#);
    assert_eq!(f.u64("rate", 1, MAX_RATE, true), None);
    assert_eq!(f.u64("burst", 1, MAX_RATE, true), None);
    assert_eq!(f.duration("per", Duration::from_millis(1), MAX_PER), None);
    assert_eq!(f.patch_u64("daily_quota", 1, MAX_QUOTA), None);
    let errors = f.finish().unwrap_err();
    assert_eq!(
        names(&errors),
        ["rate", "burst", "per", "daily_quota", "brust"]
    );
    assert_eq!(errors[0].reason, "must be ≥ 1");
    assert_eq!(errors[1].reason, "must be ≥ 1");
    assert!(errors[2].reason.contains("invalid duration"), "{errors:?}");
    assert!(
        errors[3].reason.contains("integer"),
        "JSON numbers only: {errors:?}"
    );
    assert_eq!(errors[4].reason, "unknown field");
}

#[test]
fn required_and_nullable_fields() {
    let mut f = fields(r#"{"burst": null, "daily_quota": null}"#);
    assert_eq!(f.u64("rate", 1, MAX_RATE, true), None);
    assert_eq!(f.u64("burst", 1, MAX_RATE, false), None);
    assert_eq!(
        f.patch_u64("daily_quota", 1, MAX_QUOTA),
        Some(None),
        "null clears"
    );
    assert_eq!(
        f.patch_u64("monthly_quota", 1, MAX_QUOTA),
        None,
        "absent keeps"
    );
    let errors = f.finish().unwrap_err();
    assert_eq!(names(&errors), ["rate", "burst"]);
    assert_eq!(errors[0].reason, "is required");
    assert!(errors[1].reason.contains("not null"));
}

#[test]
fn ranges_and_types() {
    let mut f =
        fields(r#"{"rate": 4294967296, "per": "1500us", "name": 3, "disabled": "yes", "ok": 5}"#);
    assert_eq!(f.u64("rate", 1, MAX_RATE, true), None);
    assert_eq!(f.duration("per", Duration::from_millis(1), MAX_PER), None);
    assert_eq!(f.string("name"), None);
    assert_eq!(f.bool("disabled"), None);
    assert_eq!(f.u64("ok", 1, 10, true), Some(5));
    let errors = f.finish().unwrap_err();
    assert_eq!(names(&errors), ["rate", "per", "name", "disabled"]);
    assert_eq!(errors[0].reason, format!("must be ≤ {MAX_RATE}"));
    assert!(errors[1].reason.contains("whole number of milliseconds"));
}

#[test]
fn durations_are_humantime_strings() {
    let mut f = fields(r#"{"a": "1s", "b": "250ms", "c": "1m 30s", "d": 1000, "e": "0s"}"#);
    let (min, max) = (Duration::from_millis(1), MAX_PER);
    assert_eq!(f.duration("a", min, max), Some(Duration::from_secs(1)));
    assert_eq!(f.duration("b", min, max), Some(Duration::from_millis(250)));
    assert_eq!(f.duration("c", min, max), Some(Duration::from_secs(90)));
    assert_eq!(f.duration("d", min, max), None, "numbers are ambiguous");
    assert_eq!(f.duration("e", min, max), None, "below the minimum");
    assert_eq!(names(&f.finish().unwrap_err()), ["d", "e"]);
}

#[test]
fn query_strings_carry_numbers_as_text() {
    let mut f = Fields::from_query(vec![
        ("limit".into(), "20".into()),
        ("cursor".into(), "acme".into()),
        ("x".into(), "1".into()),
        ("x".into(), "2".into()),
    ]);
    assert_eq!(f.u64("limit", 1, 500, false), Some(20));
    assert_eq!(f.string("cursor").as_deref(), Some("acme"));
    let errors = f.finish().unwrap_err();
    assert_eq!(names(&errors), ["x", "x"]);
    assert_eq!(errors[0].reason, "must appear at most once");
}

#[test]
fn tenant_ids_and_names() {
    assert!(tenant_id("acme-1.eu_west").is_ok());
    for bad in ["", "a b", "a/b", "ä", &"x".repeat(65)] {
        assert!(tenant_id(bad).is_err(), "{bad:?}");
    }
    assert!(name("Acme Corp ✓").is_ok());
    assert!(name("line\nbreak").is_err());
    assert!(name(&"n".repeat(MAX_NAME_CHARS + 1)).is_err());
}

#[test]
fn buckets_are_checked_like_the_limiter_does() {
    let sec = Duration::from_secs(1);
    assert!(bucket(100, sec, 200, 1).is_empty());
    let errors = bucket(100, sec, 2, 5);
    assert_eq!(
        names(&errors),
        ["burst"],
        "burst below a route cost locks the route"
    );
    let errors = bucket(2_000_000_000, sec, 10, 1);
    assert_eq!(names(&errors), ["rate"], "more than one per nanosecond");
    let errors = bucket(1, Duration::from_secs(366 * 86_400), u32::MAX.into(), 1);
    assert_eq!(names(&errors), ["burst"], "refill too long");
}

#[test]
fn routes_must_be_configured() {
    let routes = [
        ConfiguredRoute {
            name: "/orders".into(),
            cost: 3,
        },
        ConfiguredRoute {
            name: "/".into(),
            cost: 1,
        },
    ];
    assert_eq!(route("/orders", &routes), Ok(3));
    assert!(route("/nope", &routes).unwrap_err().contains("/orders, /"));
    assert!(route("orders", &routes).is_err());
}

#[test]
fn actor_header_is_sanitised() {
    assert_eq!(
        actor_suffix(b"alice@example.com").as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(
        actor_suffix(b"bob\r\nInjected: x").as_deref(),
        Some("bobInjected:x")
    );
    assert_eq!(actor_suffix(b"   ").as_deref(), None);
    assert_eq!(actor_suffix("é".repeat(10).as_bytes()), None);
    assert_eq!(actor_suffix(&[b'a'; 100]).map(|s| s.len()), Some(64));
}
