//! `deploy/prometheus/portcullis-alerts.yml` is a valid Prometheus rule file (`promtool check
//! rules`) and alerts on the metrics the gateway exports under those names.

use std::process::Command;

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/prometheus/portcullis-alerts.yml"
);

#[test]
fn the_alert_rules_pass_promtool() {
    let output = match Command::new("promtool")
        .args(["check", "rules", RULES])
        .output()
    {
        Ok(output) => output,
        Err(err) => panic!(
            "promtool is not installed ({err}): install Debian's `prometheus` package \
             (scripts/test.sh does) to check {RULES}"
        ),
    };
    assert!(
        output.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(RULES).unwrap();
    assert!(
        text.contains("increase(dlq_messages_total["),
        "no dead-letter alert"
    );
    assert!(
        text.contains("delivery_queue_oldest_age_seconds"),
        "no age alert"
    );
}
