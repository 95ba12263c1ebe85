//! Property tests over the decode entry point: whatever the bytes, `process` returns — it never
//! panics, and rejects with a classified reason — and whatever it accepts, every sink's builder
//! (rows, snuba messages, events and occurrences, EAP trace items, blob keys) turns into output
//! without panicking.

use proptest::prelude::*;
use prost::Message;
use replay_ingest::recording::trace_items::Rollout;
use replay_ingest::recording::{self, IssueGates, KafkaPosition, Limits, Processed};
use sentry_protos::snuba::v1::TraceItem;

/// Every breadcrumb an EAP item, so that its builder meets every value too.
fn limits() -> Limits {
    Limits {
        max_decompressed_bytes: 1 << 20,
        trace_items: Rollout::ALL,
        ..Limits::default()
    }
}

fn seed_fixtures() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    [
        "segments/interactions-0",
        "segments/rage-click-1",
        "segments/network-0",
        "synthetic/mobile-taps-video",
        "synthetic/raw-json-body",
    ]
    .iter()
    .map(|name| std::fs::read(dir.join(format!("{name}.msgpack"))).unwrap())
    .collect()
}

/// Everything the flush's sinks build from a processed segment, built and serialized.
fn build_every_output(processed: &Processed) {
    let at = KafkaPosition {
        partition: i32::MAX,
        offset: i64::MAX,
    };
    for row in processed.rows(at) {
        serde_json::to_vec(&row).unwrap();
    }
    recording::snuba::messages(processed).unwrap();
    for event in processed.events(&IssueGates::default()) {
        let _ = (event.kind(), event.topic(), event.key());
        event.into_json().unwrap();
    }
    // The rollout is at one: every read body has its items.
    match &processed.trace_items {
        Some(items) => {
            for (_, item) in items.iter() {
                TraceItem::decode(item).unwrap();
            }
        }
        None => assert!(processed.unread_body.is_some(), "items of a read body"),
    }
    assert!(!processed.blob.key.is_empty());
}

/// A recorded message with the envelope's fields set as given (`None`: the field left out) and
/// the payload's `segment_id` replaced.
#[allow(clippy::too_many_arguments)]
fn with_fields(
    fixture: &[u8],
    key_id: Option<u64>,
    org_id: u64,
    project_id: u64,
    received: u64,
    retention_days: Option<u16>,
    segment_id: u32,
    publish_disabled: bool,
) -> Vec<u8> {
    let rmpv::Value::Map(mut map) = rmpv::decode::read_value(&mut &fixture[..]).unwrap() else {
        unreachable!()
    };
    map.retain(|(k, _)| !matches!(k.as_str(), Some("key_id" | "retention_days")));
    for (k, v) in map.iter_mut() {
        match k.as_str() {
            Some("org_id") => *v = org_id.into(),
            Some("project_id") => *v = project_id.into(),
            Some("received") => *v = received.into(),
            Some("relay_snuba_publish_disabled") => *v = publish_disabled.into(),
            Some("payload") => {
                let payload = v.as_slice().unwrap();
                let body = &payload[payload.iter().position(|b| *b == b'\n').unwrap()..];
                let mut edited = format!("{{\"segment_id\":{segment_id}}}").into_bytes();
                edited.extend_from_slice(body);
                *v = rmpv::Value::Binary(edited);
            }
            _ => {}
        }
    }
    if let Some(key_id) = key_id {
        map.push(("key_id".into(), key_id.into()));
    }
    if let Some(days) = retention_days {
        map.push(("retention_days".into(), days.into()));
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(map)).unwrap();
    out
}

/// A field's extreme values, and an ordinary one.
fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(253_402_300_800),
        any::<u64>()
    ]
}

/// JSON-ish text built from rrweb-like fragments, to reach deep into the extractor.
fn rrweb_like() -> impl Strategy<Value = String> {
    let fragment = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"type\"",
        "\"data\"",
        "\"timestamp\"",
        "\"tag\"",
        "\"breadcrumb\"",
        "\"payload\"",
        "\"category\"",
        "\"ui.click\"",
        "\"ui.slowClickDetected\"",
        "\"node\"",
        "\"id\"",
        "5",
        "3",
        "-1",
        "1.5e3",
        "1796012448690",
        "1e300",
        "-1e300",
        "18446744073709551615",
        "253402300800000",
        "null",
        "true",
        "\"performanceSpan\"",
        "\"op\"",
        "\"resource.fetch\"",
        "\"source\"",
        "\"\\u00e9\\\"\"",
        "\"attributes\"",
        "\"tagName\"",
        "\"a\"",
        "\"clickCount\"",
    ]);
    prop::collection::vec(fragment, 0..80).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        // Rejected for what is wrong with the input: `internal_error` is a bug's reason.
        if let Err(e) = recording::process(&bytes, &limits()) {
            prop_assert_ne!(e.reason, recording::Reason::InternalError, "{}", e.detail);
        }
    }

    #[test]
    fn arbitrary_payloads_in_a_valid_envelope_never_panic(payload in prop::collection::vec(any::<u8>(), 0..2048)) {
        let result = recording::process(&crate::support::hostile::value(&payload, None), &limits());
        if let Err(e) = result {
            prop_assert!(!e.detail.is_empty());
            prop_assert_ne!(e.reason, recording::Reason::InternalError, "{}", e.detail);
        }
    }

    #[test]
    fn rrweb_like_bodies_never_panic(body in rrweb_like()) {
        let payload = format!("{{\"segment_id\":0}}\n[{body}]");
        if let Ok(processed) = recording::process(&crate::support::hostile::value(payload.as_bytes(), None), &limits()) {
            build_every_output(&processed);
        }
    }

    #[test]
    fn extreme_envelope_values_never_panic_any_sinks_builder(
        which in 0usize..5,
        key_id in prop::option::of(extreme_u64()),
        org_id in extreme_u64(),
        project_id in extreme_u64(),
        received in extreme_u64(),
        retention_days in prop::option::of(prop_oneof![Just(0u16), Just(u16::MAX), any::<u16>()]),
        segment_id in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
        publish_disabled in any::<bool>(),
    ) {
        let fixture = seed_fixtures().swap_remove(which);
        let value = with_fields(&fixture, key_id, org_id, project_id, received, retention_days, segment_id, publish_disabled);
        match recording::process(&value, &limits()) {
            Ok(processed) => {
                prop_assert!(received <= u64::from(u32::MAX));
                build_every_output(&processed);
            }
            Err(error) => prop_assert_eq!(error.reason.as_str(), "invalid_received", "{}", error.detail),
        }
    }

    #[test]
    fn corrupted_real_messages_never_panic(
        which in 0usize..5,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut value = seed_fixtures().swap_remove(which);
        for (at, byte) in flips {
            let i = at.index(value.len());
            value[i] ^= byte | 1;
        }
        let _ = recording::process(&value, &limits());
        let _ = recording::process(&value[..cut.index(value.len())], &limits());
    }
}
