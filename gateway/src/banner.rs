//! The start-up banner: what to `curl` once the gateway listens.
//!
//! Printed only after both listeners are bound (a gateway that fails to start prints its
//! error and nothing that looks like success), on stderr like every log line, and only with
//! human logs: with JSON logs every line of the stream must stay one JSON object, and the
//! `portcullis listening` line already carries the addresses.

use crate::config::{Config, LogFormat};

/// Prints the banner to stderr when the configuration asks for human logs.
pub(crate) fn print(config: &Config) {
    if config.server.log_format == LogFormat::Human {
        eprint!("{}", text(config));
    }
}

/// The banner's text: the listeners, and with the demo upstream the requests to try.
fn text(config: &Config) -> String {
    let base = format!("http://{}", config.server.listen);
    let admin = format!("http://{}", config.server.admin_listen);
    let mut out = format!("\nPortcullis is listening on {base} (admin and /metrics on {admin}).\n");
    if config.demo.enabled {
        let auth = config
            .tenants
            .first()
            .and_then(|t| t.api_keys.first())
            .map(|k| format!(" -H 'Authorization: Bearer {}'", k.expose()))
            .unwrap_or_default();
        out.push_str("Try the demo upstream through the gateway:\n");
        out.push_str(&format!("  curl -i {base}/demo/orders{auth}\n"));
        out.push_str(&format!(
            "  curl -i -X POST {base}/demo/orders{auth} -H 'Idempotency-Key: order-1' -H 'content-type: application/json' -d '{{\"item\":\"book\"}}'\n"
        ));
        out.push_str(&format!("  curl -s {base}/demo/stats{auth}\n"));
        out.push_str(&format!("  curl -s {admin}/metrics | head\n"));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProcessEnv;

    #[test]
    fn names_both_listeners_and_the_demo_requests() {
        let text = text(
            &Config::parse(
                "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:18081\"\n\
                 [demo]\nenabled = true\n\
                 [[tenants]]\nid = \"a\"\napi_keys = [\"a-demo-key-123\"]\nrate = 1\nper = \"1s\"\nburst = 1\n",
                &ProcessEnv,
            )
            .unwrap(),
        );
        assert!(
            text.contains("listening on http://127.0.0.1:18080"),
            "{text}"
        );
        assert!(text.contains("http://127.0.0.1:18081/metrics"), "{text}");
        assert!(
            text.contains("/demo/orders -H 'Authorization: Bearer a-demo-key-123'"),
            "{text}"
        );
    }

    #[test]
    fn without_the_demo_only_the_listeners() {
        let text = text(&Config::parse("", &ProcessEnv).unwrap());
        assert!(text.contains("listening on"), "{text}");
        assert!(!text.contains("curl"), "{text}");
    }
}
