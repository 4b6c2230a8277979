use std::time::Duration;

use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{client, gateway_for};

#[tokio::test]
async fn sigterm_finishes_the_in_flight_request_then_exits() {
    let upstream = ScriptedUpstream::start(vec![Step::stall(
        Duration::from_millis(1500),
        Step::ok("finished"),
    )])
    .await;
    let mut gateway = gateway_for(&upstream).await;
    let url = gateway.url() + "/slow";
    let in_flight = tokio::spawn(async move { client().get(url).send().await });

    // Wait (bounded) until the upstream has the request, then ask the gateway to stop.
    for _ in 0..100 {
        if upstream.hit_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(upstream.hit_count(), 1);
    gateway.guard().signal("TERM");

    let response = in_flight
        .await
        .unwrap()
        .expect("in-flight request completes");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "finished");
    let status = gateway
        .guard()
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("gateway exits");
    assert!(status.success(), "clean exit: {status:?}");
    assert!(gateway.logs().contains("draining"), "{}", gateway.logs());
}
