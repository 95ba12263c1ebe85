//! What the service publishes, validated against Sentry's own message schemas (the
//! `sentry-kafka-schemas` crate, the schemas Sentry's and snuba's consumers are built against),
//! on every fixture, and what it reads, against the schema Relay produces to; and the inner payloads those schemas leave open, checked against what their
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

/// A message value (msgpack) as JSON, for the topic's schema: byte strings as text, lossily (the
/// schema gives them no type).
fn msgpack_as_json(value: &[u8]) -> Vec<u8> {
    fn convert(value: rmpv::Value) -> Value {
        match value {
            rmpv::Value::Binary(bytes) => Value::String(String::from_utf8_lossy(&bytes).into()),
            rmpv::Value::Map(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (k.as_str().unwrap().to_owned(), convert(v)))
                    .collect(),
            ),
            rmpv::Value::Array(items) => Value::Array(items.into_iter().map(convert).collect()),
            rmpv::Value::Nil => Value::Null,
            rmpv::Value::Boolean(b) => Value::Bool(b),
            rmpv::Value::Integer(n) => n
                .as_u64()
                .map(Value::from)
                .or(n.as_i64().map(Value::from))
                .unwrap(),
            rmpv::Value::F32(n) => Value::from(n),
            rmpv::Value::F64(n) => Value::from(n),
            rmpv::Value::String(text) => Value::String(text.into_str().unwrap()),
            rmpv::Value::Ext(..) => unreachable!("no message holds an extension value"),
        }
    }
    let decoded = rmpv::decode::read_value(&mut &value[..]).unwrap();
    serde_json::to_vec(&convert(decoded)).unwrap()
}

/// What the service reads, against Sentry's schema of the topic (what Relay produces and Sentry's
/// consumer is built for): every recorded message is shaped as the schema says, and the schema's
/// own example is read field by field.
#[test]
fn the_recorded_messages_and_sentrys_own_example_are_what_the_topic_schema_says() {
    let topic = sentry_kafka_schemas::get_schema("ingest-replay-recordings", None).unwrap();
    let raw: Value = serde_json::from_str(topic.raw_schema()).unwrap();
    let schema = jsonschema::JSONSchema::compile(&raw).unwrap();
    let validate = |value: &[u8]| -> Result<(), String> {
        let json: Value = serde_json::from_slice(&msgpack_as_json(value)).unwrap();
        schema
            .validate(&json)
            .map_err(|errors| errors.map(|e| e.to_string()).collect::<Vec<_>>().join(". "))
    };
    let dir = crate::support::fixture_dir().join("segments");
    let mut recorded = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let value = std::fs::read(&path).unwrap();
        validate(&value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        recorded += 1;
    }
    assert!(recorded >= 15, "{recorded} recorded messages");
    // A value against the schema as it should not be, so that the check is seen to refuse.
    let no_org = crate::support::hostile::with_field(
        &std::fs::read(crate::support::fixture_dir().join("segments/console-0.msgpack")).unwrap(),
        "org_id",
        rmpv::Value::from(-1),
    );
    assert!(validate(&no_org).is_err());
    // The topic's example shows the shape only: received in year 5871 and a payload of
    // `hello`. Each field is read as it holds; the value is dead-lettered, as Sentry's consumer
    // fails on it too (its `split(b"\n", 1)` finds no header).
    let examples = topic.examples();
    assert!(!examples.is_empty());
    for example in examples {
        let name = example.name();
        let value = example.payload();
        validate(value).unwrap_or_else(|e| panic!("{name}: {e}"));
        let error = recording::process(value, &Limits::default()).unwrap_err();
        assert_eq!(error.reason.as_str(), "invalid_received", "{name}");
        let value = crate::support::hostile::with_field(value, "received", 1_796_012_448.into());
        let e = recording::envelope::decode(&value).unwrap();
        assert_eq!(
            (
                e.replay_id,
                e.org_id,
                e.project_id,
                e.key_id,
                e.retention_days
            ),
            ("9a3a4e2d78e54d328e7e40709ede27ef", 123, 123, Some(123), 30),
            "{name}"
        );
        assert_eq!(e.payload, b"hello");
        let error = recording::process(&value, &Limits::default()).unwrap_err();
        assert_eq!(error.reason.as_str(), "missing_header", "{name}");
    }
}
