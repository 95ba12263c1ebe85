//! What the service publishes, validated against Sentry's own message schemas (the
//! `sentry-kafka-schemas` crate, the schemas Sentry's and snuba's consumers are built against),
//! on every fixture; and the inner payloads those schemas leave open, checked against what their
//! readers require: snuba's replays processor (`crate::support::snuba`) and Sentry's occurrence consumer.

use replay_ingest::recording::{
    self, AnalyticsEvent, IssueGates, KafkaPosition, Limits, Processed, snuba,
};
use serde_json::Value;

/// Every fixture the recording core accepts, processed as with `--rows-sink snuba`, with the
/// Kafka position it is given here.
fn accepted() -> Vec<(KafkaPosition, Processed)> {
    let positions = (0..).map(|offset| KafkaPosition {
        partition: 3,
        offset,
    });
    let fixtures = crate::support::all_fixtures();
    let limits = Limits {
        republish_replay_event: true,
        ..Limits::default()
    };
    positions
        .zip(fixtures.iter())
        .filter_map(|(at, value)| Some((at, recording::process(value, &limits).ok()?)))
        .collect()
}

#[test]
fn every_billing_outcome_validates_against_sentrys_outcomes_billing_schema() {
    let schema = sentry_kafka_schemas::get_schema("outcomes-billing", None).unwrap();
    let mut checked = 0;
    for (at, p) in accepted() {
        for event in p
            .events(&IssueGates::default())
            .into_iter()
            .filter(|e| matches!(e, AnalyticsEvent::Outcome(_)))
        {
            let json = event.into_json().unwrap();
            schema
                .validate_json(&json)
                .unwrap_or_else(|e| panic!("{at:?}: {e}: {}", String::from_utf8_lossy(&json)));
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "the fixtures hold segment 0 of several replays ({checked})"
    );
}

#[test]
fn every_replay_events_message_validates_and_snuba_maps_it_to_the_rows_written_directly() {
    let schema = sentry_kafka_schemas::get_schema("ingest-replay-events", None).unwrap();
    let (mut messages, mut rows) = (0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    for (at, p) in accepted() {
        let mut mapped = Vec::new();
        for message in snuba::messages(&p).unwrap() {
            let text = String::from_utf8_lossy(&message).into_owned();
            schema
                .validate_json(&message)
                .unwrap_or_else(|e| panic!("{at:?}: {e}: {text}"));
            let inner: Value =
                serde_json::from_slice::<Value>(&message).unwrap()["payload"].clone();
            kinds.insert(inner["type"].as_str().unwrap_or("").to_owned());
            let offset = u64::try_from(at.offset).unwrap();
            mapped.extend(
                crate::support::snuba::rows(&message, 3, offset)
                    .unwrap_or_else(|e| panic!("{at:?}: snuba rejects it: {e}: {text}")),
            );
            messages += 1;
        }
        let direct: Vec<Value> = p
            .rows(at)
            .iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect();
        let mapped: Vec<Value> = mapped.into_iter().map(Value::Object).collect();
        assert_eq!(
            mapped, direct,
            "{at:?}: snuba's rows from the published messages are the rows written directly"
        );
        rows += direct.len();
    }
    assert_eq!(
        kinds,
        ["replay_actions", "replay_event", "replay_tap"]
            .map(String::from)
            .into()
    );
    assert!(
        messages >= 20 && rows >= 30,
        "{messages} messages, {rows} rows"
    );
}

#[test]
fn every_occurrence_validates_and_carries_what_sentrys_occurrence_consumer_requires() {
    let schema = sentry_kafka_schemas::get_schema("ingest-occurrences", None).unwrap();
    let mut kinds = Vec::new();
    for (at, p) in accepted() {
        for event in p.events(&IssueGates::default()) {
            let AnalyticsEvent::Occurrence(occurrence) = event else {
                continue;
            };
            let text = String::from_utf8_lossy(&occurrence.value).into_owned();
            schema
                .validate_json(&occurrence.value)
                .unwrap_or_else(|e| panic!("{at:?}: {e}: {text}"));
            let o: Value = serde_json::from_slice(&occurrence.value).unwrap();
            uuid::Uuid::try_parse(o["id"].as_str().unwrap()).unwrap();
            for key in [
                "project_id",
                "fingerprint",
                "issue_title",
                "subtitle",
                "type",
                "detection_time",
            ] {
                assert!(!o[key].is_null(), "{at:?}: no {key}: {text}");
            }
            assert_eq!(o["payload_type"], "occurrence");
            assert_eq!(o["event_id"], o["event"]["event_id"]);
            assert_eq!(
                o["project_id"], o["event"]["project_id"],
                "the consumer requires the same project"
            );
            for key in ["platform", "received", "timestamp"] {
                assert!(o["event"][key].is_string(), "{at:?}: event.{key}: {text}");
            }
            assert!(
                o["event"]["tags"].is_object()
                    && o["event"]["contexts"]["replay"]["replay_id"] == p.ids.replay_id
            );
            let fingerprint = o["fingerprint"][0].as_str().unwrap();
            assert_eq!(
                occurrence.key,
                format!("{fingerprint}-{}", p.ids.project_id)
            );
            kinds.push(o["type"].as_u64().unwrap());
        }
    }
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [5002, 5003],
        "the fixtures hold a rage click and a hydration error"
    );
}
