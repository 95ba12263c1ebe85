//! What the service publishes, validated against Sentry's own message schemas (the
//! `sentry-kafka-schemas` crate, the schemas Sentry's and snuba's consumers are built against).

mod common;

use replay_ingest::recording::{self, AnalyticsEvent, Limits};

#[test]
fn every_billing_outcome_validates_against_sentrys_outcomes_billing_schema() {
    let schema = sentry_kafka_schemas::get_schema("outcomes-billing", None).unwrap();
    let mut checked = 0;
    for (i, value) in common::all_fixtures().iter().enumerate() {
        let Ok(p) = recording::process(value, &Limits::default()) else { continue };
        for event in p.events().iter().filter(|e| matches!(e, AnalyticsEvent::Outcome(_))) {
            let json = event.to_json().unwrap();
            schema
                .validate_json(&json)
                .unwrap_or_else(|e| panic!("fixture {i}: {e}: {}", String::from_utf8_lossy(&json)));
            checked += 1;
        }
    }
    assert!(checked >= 5, "the fixtures hold segment 0 of several replays ({checked})");
}
