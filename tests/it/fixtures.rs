//! The recorded real-SDK segments and the synthetic (hostile and unusual) messages, through the
//! whole recording core: an `insta` snapshot of `inspect` for every fixture, plus the facts each
//! recording scenario exists to cover.

use std::path::{Path, PathBuf};

use replay_ingest::inspect;
use replay_ingest::recording::{
    self, AnalyticsEvent, IssueGates, KafkaPosition, Limits, Processed, ProjectFilter, Reason,
};
use serde_json::Value;

fn fixture_dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(kind)
}

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir(kind))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "msgpack"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {kind}");
    files
}

fn process(kind: &str, name: &str) -> Result<Processed, recording::InvalidRecording> {
    let value = std::fs::read(fixture_dir(kind).join(format!("{name}.msgpack"))).unwrap();
    recording::process(&value, &Limits::default())
}

fn valid(name: &str) -> Processed {
    process("segments", name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Where the messages sit in Kafka, for the rows (`partition`, `offset` columns).
const AT: KafkaPosition = KafkaPosition {
    partition: 3,
    offset: 1234,
};
/// Issues for every project, as Sentry defaults.
const ALL: IssueGates = IssueGates {
    rage_clicks: ProjectFilter::All,
    hydration_errors: ProjectFilter::All,
};

#[test]
fn inspect_output_of_every_fixture_matches_its_snapshot() {
    for kind in ["segments", "synthetic"] {
        for path in fixtures(kind) {
            let name = format!("{kind}/{}", path.file_name().unwrap().to_string_lossy());
            let line = inspect::inspect(
                &name,
                std::fs::read(&path).unwrap().into(),
                &Limits::default(),
            );
            let value: Value = serde_json::from_str(&line).unwrap();
            insta::assert_json_snapshot!(name.replace(['/', '.'], "__"), value);
        }
    }
}

#[test]
fn every_recorded_segment_is_valid_and_fully_parsed() {
    for path in fixtures("segments") {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let p = valid(&name);
        assert_eq!(p.extracted.invalid_events, 0, "{name}");
        assert!(p.extracted.events > 0, "{name}");
        assert_eq!(
            p.blob.key,
            format!("90/42/{}/{}", p.ids.replay_id, p.ids.segment_id),
            "{name}"
        );
        assert_eq!(
            p.body_encoding.as_str(),
            "zlib",
            "{name}: the JS SDK sends zlib"
        );
        assert_eq!(
            p.rows(AT).iter().filter(|r| r.is_segment()).count(),
            1,
            "{name}"
        );
    }
}

#[test]
fn hostile_fixtures_are_rejected_with_their_reason() {
    let expected = [
        ("bad-msgpack", Reason::InvalidMsgpack),
        ("not-a-map", Reason::InvalidMsgpack),
        ("wrong-type", Reason::WrongType),
        ("bad-replay-id", Reason::InvalidReplayId),
        ("invalid-replay-event", Reason::InvalidReplayEvent),
        ("missing-header", Reason::MissingHeader),
        ("malformed-header", Reason::InvalidHeader),
        ("corrupt-zlib", Reason::InvalidBody),
        ("truncated-zlib", Reason::TruncatedBody),
        ("zlib-bomb", Reason::TooLarge),
    ];
    for (name, reason) in expected {
        let err = process("synthetic", name).expect_err(name);
        assert_eq!(err.reason, reason, "{name}: {}", err.detail);
        assert!(
            !err.detail.is_empty() && !err.detail.contains('\n'),
            "{name}"
        );
    }
}

/// A body that decompresses to something other than a JSON array of events is still the
/// segment's recording, as Sentry keeps it: stored as received, billed, its replay event's row
/// written; nothing read from it.
#[test]
fn a_body_that_is_not_an_array_of_events_is_stored_billed_and_left_unread() {
    let p = process("synthetic", "body-not-an-array").unwrap();
    assert_eq!(
        p.unread_body.as_deref(),
        Some("body is not a JSON array of events: expected '[' at byte 0")
    );
    assert_eq!(p.extracted.events, 0);
    assert_eq!(
        p.extracted.events_by_type,
        recording::Extracted::default().events_by_type
    );
    assert!(p.extracted.clicks.is_empty() && p.trace_items.is_none());
    let mut stored = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::ZlibDecoder::new(&p.blob.bytes[..]),
        &mut stored,
    )
    .unwrap();
    assert_eq!(stored, b"{\"type\":2}", "the body, as zlib");
    assert_eq!(p.ids.segment_id, 0);
    let kinds: Vec<&str> = p.events(&ALL).iter().map(AnalyticsEvent::kind).collect();
    assert!(kinds.contains(&"outcome"), "{kinds:?}");
    assert_eq!(p.has_segment_row(), p.writes_segment_row);
}

#[test]
fn the_zlib_bomb_is_rejected_without_inflating_past_the_cap() {
    let tight = Limits {
        max_decompressed_bytes: 1 << 20,
        ..Limits::default()
    };
    let value = std::fs::read(fixture_dir("synthetic").join("zlib-bomb.msgpack")).unwrap();
    let err = recording::process(&value, &tight).unwrap_err();
    assert_eq!(
        (err.reason, err.detail.as_str()),
        (
            Reason::TooLarge,
            "body decompresses to more than 1048576 bytes"
        )
    );
}

#[test]
fn raw_gzip_and_zstd_bodies_extract_like_the_zlib_original_and_store_zlib() {
    let original = valid("dead-click-0");
    for name in ["raw-json-body", "gzip-body", "zstd-body"] {
        let p = process("synthetic", name).unwrap();
        assert_eq!(p.extracted, original.extracted, "{name}");
        assert_eq!(p.uncompressed_bytes, original.uncompressed_bytes, "{name}");
        assert_eq!(p.blob.bytes[0], 0x78, "{name}: stored as zlib");
        let mut inflater = recording::Inflater::default();
        let stored = recording::payload::decompress(
            &recording::payload::Payload {
                segment_id: 0,
                encoding: recording::BodyEncoding::Zlib,
                body: &p.blob.bytes,
            },
            usize::MAX,
            &mut inflater,
        )
        .unwrap();
        assert_eq!(stored.len(), p.uncompressed_bytes, "{name}");
    }
}

#[test]
fn malformed_events_are_skipped_and_the_rest_of_the_segment_is_kept() {
    let original = valid("dead-click-0");
    let p = process("synthetic", "malformed-events").unwrap();
    assert_eq!(p.extracted.invalid_events, 6);
    // Everything else extracted is what the segment without the malformed events gives.
    let mut kept = p.extracted.clone();
    kept.invalid_events = original.extracted.invalid_events;
    assert_eq!(kept, original.extracted);
}

#[test]
fn the_mobile_segment_yields_tap_rows_and_a_video_pack_blob() {
    let p = process("synthetic", "mobile-taps-video").unwrap();
    let rows = p.rows(AT);
    let taps: Vec<_> = rows
        .iter()
        .filter(|r| !r.tap_view_id.is_empty())
        .map(|r| r.tap_view_id.as_str())
        .collect();
    assert_eq!(taps, ["checkout_button", "back"]);
    let mut inflater = recording::Inflater::default();
    let packed = recording::payload::decompress(
        &recording::payload::Payload {
            segment_id: 0,
            encoding: recording::BodyEncoding::Zlib,
            body: &p.blob.bytes,
        },
        usize::MAX,
        &mut inflater,
    )
    .unwrap();
    assert_eq!(packed[0], 0x01);
    assert_eq!(u32::from_be_bytes(packed[1..5].try_into().unwrap()), 4096);
    assert_eq!(packed.len(), 5 + 4096 + p.uncompressed_bytes);
    let segment = p.rows(AT).into_iter().find(|r| r.is_segment()).unwrap();
    assert_eq!(
        (segment.platform.as_str(), segment.device_model.as_deref()),
        ("android", Some("Pixel 9"))
    );
    assert_eq!(segment.tags_key, ["plan"]);
}

#[test]
fn the_interactions_recording_has_clicks_typing_and_a_multi_click() {
    let first = valid("interactions-0");
    let x = &first.extracted;
    assert!(
        x.breadcrumbs_by_category.get("ui.input") >= 2,
        "typing into two fields"
    );
    let cart = x
        .clicks
        .iter()
        .find(|c| c.id == "add-to-cart")
        .expect("click on add-to-cart");
    assert_eq!(
        (cart.testid.as_str(), cart.component_name.as_str()),
        ("add-to-cart", "AddToCartButton")
    );
    assert_eq!(cart.classes, ["btn", "btn-primary", "cta"]);
    assert!(x.clicks.iter().all(|c| !c.is_dead && !c.is_rage));
    assert!(
        x.incremental_by_source.get("Mutation") > 0,
        "clicks changed the DOM"
    );
    let multi = [valid("interactions-1"), valid("interactions-2")]
        .into_iter()
        .flat_map(|p| p.extracted.multi_clicks)
        .collect::<Vec<_>>();
    assert!(multi.iter().any(|m| m.click_count >= 3), "{multi:?}");
}

#[test]
fn the_dead_click_recording_reports_a_dead_but_not_rage_click() {
    let dead: Vec<_> = fixtures("segments")
        .iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("dead-click")
        })
        .flat_map(|p| {
            valid(&p.file_stem().unwrap().to_string_lossy())
                .extracted
                .clicks
        })
        .filter(|c| c.is_dead)
        .collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].tag.as_str(), dead[0].id.as_str(), dead[0].is_rage),
        ("button", "broken-save", false)
    );
}

#[test]
fn the_rage_click_recording_reports_a_rage_click_and_an_issue_occurrence() {
    let p = valid("rage-click-1");
    let rage: Vec<_> = p.extracted.rage_clicks().collect();
    assert_eq!(rage.len(), 1);
    assert_eq!(
        (rage[0].tag.as_str(), rage[0].id.as_str()),
        ("a", "download")
    );
    let occurrence = p.events(&ALL).into_iter().find_map(|e| match e {
        AnalyticsEvent::Occurrence(o) => Some(o),
        _ => None,
    });
    assert_eq!(
        occurrence.unwrap().key,
        format!("{}-42", rage[0].selector),
        "fingerprinted by the selector"
    );
    let row = p
        .rows(AT)
        .into_iter()
        .find(|r| r.click_node_id != 0)
        .unwrap();
    assert_eq!((row.click_is_dead, row.click_is_rage), (1, 1));
}

#[test]
fn the_network_recording_has_requests_with_known_sizes_and_navigations() {
    // Sizes are the byte lengths the recorder serves: request 1012, responses 1153, 323 and 9.
    let first = valid("network-0");
    let requests: Vec<_> = first
        .extracted
        .requests
        .iter()
        .map(|r| {
            (
                r.op.as_str(),
                &*r.url,
                r.method.as_deref(),
                r.status_code,
                r.request_size,
                r.response_size,
            )
        })
        .collect();
    assert_eq!(
        requests,
        [
            (
                "resource.fetch",
                "/api/search",
                Some("POST"),
                Some(200),
                Some(1012),
                Some(1153)
            ),
            (
                "resource.xhr",
                "/api/profile",
                Some("GET"),
                Some(200),
                None,
                Some(323)
            ),
            (
                "resource.fetch",
                "/api/missing",
                Some("GET"),
                Some(404),
                None,
                Some(9)
            ),
        ]
    );
    let second = valid("network-1");
    let ops: Vec<_> = second
        .extracted
        .navigations
        .iter()
        .map(|n| n.op.as_str())
        .collect();
    assert!(
        ops.contains(&"navigation.push")
            && ops.contains(&"navigation")
            && ops.contains(&"navigation.navigate"),
        "{ops:?}"
    );
    assert!(
        second
            .extracted
            .urls
            .iter()
            .any(|u| u.ends_with("/network-2.html?tab=settings"))
    );
}

#[test]
fn the_console_recording_counts_levels_and_reports_the_hydration_error() {
    let p = valid("console-0");
    for level in ["log", "info", "warning", "error", "debug"] {
        assert_eq!(p.extracted.console.get(level), 1, "{level}");
    }
    assert_eq!(p.extracted.hydration_errors.len(), 1);
    assert!(p.events(&ALL).iter().any(|e| e.kind() == "hydration_error"));
    let segment = p.rows(AT).into_iter().find(|r| r.is_segment()).unwrap();
    assert_eq!(
        segment.error_ids.len(),
        2,
        "the captured hydration error and the uncaught TypeError"
    );
}

#[test]
fn the_large_dom_recording_is_a_multi_megabyte_full_snapshot() {
    let p = valid("large-dom-0");
    assert!(p.uncompressed_bytes > 5 << 20, "{}", p.uncompressed_bytes);
    assert_eq!(p.extracted.events_by_type.get("FullSnapshot"), 1);
    assert_eq!(
        p.blob.bytes.len(),
        p.compressed_bytes,
        "zlib stored as received"
    );
}

#[test]
fn segment_zero_bills_one_replay_and_proposes_a_first_replay() {
    let p = valid("console-0");
    let outcome = p.events(&ALL).into_iter().find_map(|e| match e {
        AnalyticsEvent::Outcome(o) => Some(o),
        _ => None,
    });
    let outcome = outcome.expect("segment 0 has an outcome");
    assert_eq!(
        (outcome.outcome, outcome.category, outcome.quantity),
        (0, 7, 1)
    );
    assert_eq!(
        (outcome.org_id, outcome.project_id, outcome.key_id),
        (1, 42, Some(7))
    );
    assert_eq!(outcome.event_id, p.ids.replay_id);
    assert!(
        p.events(&ALL)
            .iter()
            .any(|e| matches!(e, AnalyticsEvent::FirstReplay(_)))
    );
    assert!(valid("console-1").events(&ALL).iter().all(|e| !matches!(
        e,
        AnalyticsEvent::Outcome(_) | AnalyticsEvent::FirstReplay(_)
    )));
}

#[test]
fn reprocessing_a_message_produces_identical_rows_and_events() {
    for name in ["interactions-0", "rage-click-1", "console-0"] {
        let (a, b) = (valid(name), valid(name));
        assert_eq!(a.rows(AT), b.rows(AT), "{name}");
        assert_eq!(a.events(&ALL), b.events(&ALL), "{name}");
        assert_eq!(a.blob, b.blob, "{name}");
    }
}
