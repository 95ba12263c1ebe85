//! The recording core: one Kafka message value in, everything the flush writes out. No I/O, no
//! clock, no globals — `process` is a plain function, trivially testable and benchmarkable.
//!
//! ```text
//! msgpack map ─ envelope ─▶ payload header/body ─ decompress (capped) ─▶ rrweb JSON ─ extract
//!                                                                          │
//!            blob (GCS) ◀─ blob ──────────────────────────────────────────┤
//!            rows (ClickHouse) ◀─ rows (clicks, taps, segment) ◀───────────┤
//!            analytics events (Kafka) ◀─ events ◀──────────────────────────┘
//! ```
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod archive;
pub mod blob;
pub mod envelope;
pub mod error;
pub mod events;
pub mod heap;
pub mod ids;
mod json;
mod libdeflate;
pub mod occurrence;
pub mod payload;
pub mod replay_event;
pub mod rows;
pub mod rrweb;
mod scan;
pub mod snuba;
pub mod trace_items;
mod verify;

use std::panic::{AssertUnwindSafe, catch_unwind};

pub use blob::Blob;
pub use envelope::Envelope;
pub use error::{InvalidRecording, Reason, shorten};
pub use events::{AnalyticsEvent, EventTopic};
pub use heap::HeapSize;
pub use ids::SegmentIds;
pub use json::RawJson;
pub use occurrence::{IssueGates, ProjectFilter};
pub use payload::{BodyEncoding, Inflater};
pub use replay_event::ReplayEvent;
pub use rows::{KafkaPosition, ReplayRow};
pub use rrweb::{Extracted, MAX_ROWS_PER_SEGMENT, RowLimits};
pub use trace_items::{Rollout, TraceItems};

/// Default cap on a decompressed segment body (docs/formats.md, "The payload").
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 100 * 1024 * 1024;

/// Stack for threads that run [`process`]: parsing recurses once per nesting level, at most
/// `scan::MAX_NESTING` levels (well under 100 KiB in release builds; unoptimised builds need a few
/// MiB). Generous, and only reserved address space until touched.
pub const PROCESSING_STACK_BYTES: usize = 16 * 1024 * 1024;

/// The constant part of the cost bound: what a segment may hold beyond twice its decoded input.
pub const COST_BOUND_SLACK: usize = 1024 * 1024;

/// Knobs of the per-message work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A body that decompresses to more than this is rejected as `too_large`.
    pub max_decompressed_bytes: usize,
    pub rows: RowLimits,
    /// Keep the replay event as sent for the segment row this service owns, to republish it on
    /// `ingest-replay-events` (`--rows-sink snuba`); otherwise it is kept only for occurrences.
    pub republish_replay_event: bool,
    /// The share of rrweb events whose breadcrumb becomes an EAP trace item (off by default).
    pub trace_items: Rollout,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES,
            rows: RowLimits::default(),
            republish_replay_event: false,
            trace_items: Rollout::OFF,
        }
    }
}

/// Everything one valid message produces and the flush needs. Rows and events are derived from
/// it when they are written ([`Processed::rows`], [`Processed::events`]), so a buffered segment
/// holds each extracted value once.
///
/// **Cost bound**: [`Processed::memory_bytes`] ≤ 2 × [`Processed::input_bytes`] + 1 MiB
/// ([`Processed::cost_bound`]), whatever the input — enforced by the extractor's caps and shared
/// URLs, tested on every fixture, on hostile inputs and by property tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    pub ids: SegmentIds,
    /// The Kafka message's value, in bytes: with the ids, what tells it apart from another
    /// message found at its offset when it is read again (the sink module's `Original`).
    pub message_bytes: usize,
    pub body_encoding: BodyEncoding,
    /// Body bytes as received.
    pub compressed_bytes: usize,
    /// Decompressed rrweb JSON bytes.
    pub uncompressed_bytes: usize,
    /// Decoded input: the rrweb JSON, the replay event and the video, in bytes.
    pub input_bytes: usize,
    /// The mobile SDK's video, in bytes (0 without one).
    pub video_bytes: usize,
    pub blob: Blob,
    pub extracted: Extracted,
    /// Why nothing was read from the body, when it decompressed but is not a JSON array of events
    /// (not UTF-8, not JSON, not an array): the blob, the billing outcome and the segment row are
    /// still written; `extracted` is empty and there are no trace items.
    pub unread_body: Option<String>,
    /// The replay event, when the message carried one.
    pub replay_event: Option<ReplayEvent>,
    /// The replay event as sent, kept only when an output passes it on: the republished segment
    /// row ([`Limits::republish_replay_event`]) and issue occurrences (`occurrence::possible`).
    pub replay_event_json: Option<RawJson>,
    /// The edge did not publish the replay event (`relay_snuba_publish_disabled`), so its segment
    /// row is this service's to write.
    pub writes_segment_row: bool,
    /// The breadcrumbs as EAP trace items; `None` with the rollout off (boxed: a buffered segment
    /// without them holds one pointer).
    pub trace_items: Option<Box<TraceItems>>,
}

heap::heap_size!(Processed {
    ids,
    blob,
    extracted,
    unread_body,
    replay_event,
    replay_event_json,
    trace_items
});

impl Processed {
    /// Heap and inline bytes held while buffered, counted exactly (capacities, shared URLs
    /// once): what `--buffer-max-bytes` is measured in.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.heap_size()
    }

    /// The most [`Processed::memory_bytes`] may be for this input.
    pub fn cost_bound(&self) -> usize {
        self.input_bytes
            .saturating_mul(2)
            .saturating_add(COST_BOUND_SLACK)
    }

    /// The ClickHouse rows of this segment, built now; `at` is where its message sat in Kafka.
    pub fn rows(&self, at: KafkaPosition) -> Vec<ReplayRow> {
        rows::build(
            &self.ids,
            at,
            self.replay_event.as_ref(),
            self.writes_segment_row,
            &self.extracted,
        )
    }

    /// Whether [`Processed::rows`] includes a segment row.
    pub fn has_segment_row(&self) -> bool {
        self.writes_segment_row && self.replay_event.is_some()
    }

    /// Whether [`Processed::rows`] has any.
    pub fn has_rows(&self) -> bool {
        self.has_segment_row()
            || !self.extracted.clicks.is_empty()
            || !self.extracted.taps.is_empty()
    }

    /// The analytics events of this segment, built now; issue occurrences for the projects
    /// `issues` enables.
    pub fn events(&self, issues: &IssueGates) -> Vec<AnalyticsEvent> {
        events::build(self, issues)
    }

    /// Values cut and list items left out by the extraction caps.
    pub fn truncations(&self) -> u64 {
        let dropped = self.replay_event.as_ref().map_or(0, |e| e.dropped_items);
        self.extracted.truncated_values + self.extracted.dropped_items + dropped
    }
}

/// Decodes, decompresses and extracts one message value, with a decompressor of its own and a
/// copy of the value. A processing thread uses [`process_with`]: it keeps its [`Inflater`]
/// between messages, and the blob shares the message's buffer.
pub fn process(value: &[u8], limits: &Limits) -> Result<Processed, InvalidRecording> {
    process_with(
        &bytes::Bytes::copy_from_slice(value),
        limits,
        &mut Inflater::default(),
    )
}

/// [`process`] of the message's own buffer (which the blob may share: `blob::build`),
/// decompressing with (and into the reused buffer of) `inflater`.
pub fn process_with(
    value: &bytes::Bytes,
    limits: &Limits,
    inflater: &mut Inflater,
) -> Result<Processed, InvalidRecording> {
    let processed = process_into(value, limits, inflater);
    inflater.release();
    processed
}

fn process_into(
    value: &bytes::Bytes,
    limits: &Limits,
    inflater: &mut Inflater,
) -> Result<Processed, InvalidRecording> {
    let env = envelope::decode(value)?;
    let payload = payload::split(env.payload)?;
    let body = payload::decode(&payload, limits.max_decompressed_bytes, inflater)?;
    let json = body.bytes();
    let mut items = trace_items::Collector::new(
        limits.trace_items,
        env.replay_id,
        payload.segment_id,
        json.len(),
    );
    // A body that decompressed but is not a JSON array of events is still the segment's
    // recording: stored, billed and its replay event's row written, with nothing read from it,
    // as Sentry does (its parse failure only skips the events).
    let read = body.text().and_then(|text| {
        rrweb::extract_with(text, limits.rows, items.as_mut())
            .map_err(|e| format!("body is not a JSON array of events: {e}"))
    });
    let (mut extracted, unread_body) = match read {
        Ok(extracted) => (extracted, None),
        Err(why) => {
            items = None;
            (Extracted::default(), Some(why))
        }
    };
    let replay_event = env.replay_event.map(replay_event::parse).transpose()?;
    if let Some(event) = &replay_event {
        extracted.add_urls(&event.urls);
    }
    let replay_event_json = env
        .replay_event
        .filter(|_| {
            (limits.republish_replay_event && env.relay_snuba_publish_disabled)
                || occurrence::possible(&extracted)
        })
        .and_then(RawJson::parse);
    let ids = SegmentIds {
        replay_id: env.replay_id.to_owned(),
        replay_uuid: env.replay_uuid,
        org_id: env.org_id,
        project_id: env.project_id,
        key_id: env.key_id,
        received: env.received,
        retention_days: env.retention_days,
        segment_id: payload.segment_id,
    };
    let blob = blob::build(
        blob::key(
            ids.retention_days,
            ids.project_id,
            &ids.replay_id,
            ids.segment_id,
        ),
        &payload,
        json,
        env.replay_video,
        value,
    )
    .map_err(|e| {
        InvalidRecording::new(
            Reason::InternalError,
            format_args!("building the blob failed: {e}"),
        )
    })?;
    let trace_items = items.map(|items| {
        let user = user_attributes(replay_event.as_ref());
        let trace_id = trace_id(&ids.replay_id, replay_event.as_ref());
        Box::new(items.finish(&trace_items::Context {
            organization_id: ids.org_id,
            project_id: ids.project_id,
            trace_id: trace_id.as_deref(),
            retention_days: u32::from(ids.retention_days),
            received_seconds: ids.received as i64,
            user: &user,
        }))
    });
    Ok(Processed {
        ids,
        message_bytes: value.len(),
        body_encoding: payload.encoding,
        compressed_bytes: payload.body.len(),
        uncompressed_bytes: json.len(),
        input_bytes: json.len()
            + env.replay_event.map_or(0, <[u8]>::len)
            + env.replay_video.map_or(0, <[u8]>::len),
        video_bytes: env.replay_video.map_or(0, <[u8]>::len),
        blob,
        extracted,
        unread_body,
        replay_event,
        replay_event_json,
        writes_segment_row: env.relay_snuba_publish_disabled,
        trace_items,
    })
}

/// The trace id Sentry gives a replay's items: the replay event's one trace id when it has exactly
/// one, else the replay id. `None` when that one is not a UUID (Snuba would refuse the items).
fn trace_id(replay_id: &str, event: Option<&ReplayEvent>) -> Option<String> {
    match event {
        Some(event) if event.trace_ids_sent == 1 => {
            event.trace_ids.first().map(|id| id.simple().to_string())
        }
        _ => Some(replay_id.to_owned()),
    }
}

/// The user attributes of every item, from the replay event's `user`: those present and not
/// empty, as Sentry sets them (`if user.get("id")`: an empty text is left out).
fn user_attributes(event: Option<&ReplayEvent>) -> Vec<(&'static str, &str)> {
    let Some(event) = event else {
        return Vec::new();
    };
    [
        ("user_id", event.user_id()),
        ("user_email", event.user_email()),
        ("user_name", event.user_name()),
        ("user_ip", event.ip_address()),
        ("user_geo_city", Some(event.geo_city())),
        ("user_geo_country_code", Some(event.geo_country_code())),
        ("user_geo_region", Some(event.geo_region())),
        ("user_geo_subdivision", Some(event.geo_subdivision())),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key, value.filter(|v| !v.is_empty())?)))
    .collect()
}

/// [`process`], with a panic — a bug, never bad input — turned into an `internal_error` rejection
/// so that one message cannot take the process down. The panic itself is logged by the panic
/// hook (`logs`: message and location, one line in the log's format).
pub fn process_guarded(
    value: &bytes::Bytes,
    limits: &Limits,
    inflater: &mut Inflater,
) -> Result<Processed, InvalidRecording> {
    guarded(|| process_with(value, limits, inflater))
}

fn guarded<T>(work: impl FnOnce() -> Result<T, InvalidRecording>) -> Result<T, InvalidRecording> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let message = panic_message(&*panic);
        Err(InvalidRecording::new(
            Reason::InternalError,
            format_args!("processing panicked: {message}"),
        ))
    })
}

/// The text a caught panic carries (`panic!`'s formatted message), for a dead letter's detail.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::envelope::tests::TestMessage;
    use super::payload::tests::zlib;
    use super::*;

    #[test]
    fn a_body_that_decompresses_but_is_not_events_is_kept_unread() {
        let replay_event = br#"{"type":"replay_event","replay_id":"6aa0d45db9b94b989501ce3be4daf802","segment_id":0,"timestamp":1796012448.5,"urls":["https://example.com/a"]}"#;
        let cases: [(&[u8], bool, &str); 6] = [
            (b"{\"type\":2}", true, "expected '[' at byte 0"),
            (
                b"[{\"type\":4,\"timestamp\":1,\"data\":{}}",
                true,
                "expected ',' or ']' at byte 35",
            ),
            (b"[]x", true, "at byte 2"),
            (b"[NaN]", true, "at byte 1"),
            (b"[\"caf\xe9\"]", true, "not valid UTF-8 (byte 5)"),
            // Raw JSON (first byte `[`): stored as zlib of it, as Sentry does.
            (b"[{\"type\":4,", false, "at byte 11"),
        ];
        for (body, compressed, why) in cases {
            let sent = if compressed {
                zlib(body)
            } else {
                body.to_vec()
            };
            let message = TestMessage {
                replay_event: Some(replay_event.to_vec()),
                relay_snuba_publish_disabled: true,
                ..TestMessage::new([b"{\"segment_id\":0}\n".as_slice(), &sent].concat())
            };
            let name = String::from_utf8_lossy(body);
            let p = process(&message.encode(), &Limits::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let unread = p.unread_body.as_deref().unwrap_or_default();
            assert!(unread.ends_with(why), "{name}: {unread}");
            assert_eq!(p.extracted.events, 0, "{name}");
            assert!(p.extracted.clicks.is_empty(), "{name}");
            let mut inflated = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::ZlibDecoder::new(&p.blob.bytes[..]),
                &mut inflated,
            )
            .unwrap();
            assert_eq!(inflated, body, "{name}: the blob holds the body");
            let kinds: Vec<&str> = p
                .events(&IssueGates::default())
                .iter()
                .map(|e| e.kind())
                .collect();
            assert_eq!(kinds, ["outcome", "first_replay"], "{name}");
            let rows = p.rows(KafkaPosition {
                partition: 0,
                offset: 1,
            });
            assert_eq!(rows.len(), 1, "{name}: the segment row");
            assert!(rows[0].is_segment(), "{name}");
        }
        // What was read before the body turned out broken is not used: no items either.
        let broken = br#"[{"type":5,"timestamp":1000,"data":{"tag":"breadcrumb","payload":{"category":"ui.tap","message":"m","timestamp":1.5,"data":{"view.id":"a","view.class":"b"}}}},"#;
        let limits = Limits {
            trace_items: Rollout::ALL,
            ..Limits::default()
        };
        let message =
            TestMessage::new([b"{\"segment_id\":0}\n".as_slice(), &zlib(broken)].concat());
        let p = process(&message.encode(), &limits).unwrap();
        assert!(p.unread_body.is_some());
        assert!(p.trace_items.is_none());
        assert_eq!(
            p.extracted.breadcrumbs_by_category,
            Extracted::default().breadcrumbs_by_category
        );
        let whole = [&broken[..broken.len() - 1], b"]"].concat();
        let message =
            TestMessage::new([b"{\"segment_id\":0}\n".as_slice(), &zlib(&whole)].concat());
        let read = process(&message.encode(), &limits).unwrap();
        assert_eq!(read.trace_items.map(|items| items.len()), Some(1));
        // A body that is read has no reason.
        let read = TestMessage::new(b"{\"segment_id\":0}\n[]".to_vec());
        assert_eq!(
            process(&read.encode(), &Limits::default())
                .unwrap()
                .unread_body,
            None
        );
    }

    /// A slow click's kind as Sentry reads it (`which()`), the same in the rows, the
    /// occurrences and the trace items: the camel-case field falls through to the lower-case one
    /// when it is not truthy (0), and a value Python cannot compare with a number makes no click
    /// at all. The rows took the camel-case value whenever it was there (a 0/0 row and no
    /// rage-click issue for the first click below) and a string as absent (a 0/0 row for the
    /// second and third), while the trace items read them as Sentry does.
    #[test]
    fn a_slow_clicks_kind_is_sentrys_in_rows_occurrences_and_trace_items_alike() {
        let slow = |data: &str| {
            format!(
                r#"{{"type":5,"timestamp":1796012448000,"data":{{"tag":"breadcrumb","payload":{{"timestamp":1796012448.5,"type":"default","category":"ui.slowClickDetected","message":"body > button","data":{{"node":{{"id":7,"tagName":"button","textContent":"Pay","attributes":{{}}}},"url":"https://shop/","endReason":"timeout",{data}}}}}}}}}"#
            )
        };
        let events = [
            slow(r#""timeAfterClickMs":0,"timeafterclickms":8000,"clickCount":6"#),
            slow(r#""timeAfterClickMs":"9000","clickCount":6"#),
            slow(r#""timeAfterClickMs":9000,"clickCount":"6""#),
            slow(r#""timeAfterClickMs":9000,"clickCount":false,"clickcount":2"#),
        ];
        let body = format!("[{}]", events.join(","));
        let message = TestMessage {
            replay_event: Some(br#"{"type":"replay_event","replay_id":"6aa0d45db9b94b989501ce3be4daf802","segment_id":0,"timestamp":1796012448.5,"platform":"javascript"}"#.to_vec()),
            ..TestMessage::new(
                [b"{\"segment_id\":0}\n".as_slice(), &zlib(body.as_bytes())].concat(),
            )
        };
        let limits = Limits {
            trace_items: Rollout::ALL,
            ..Limits::default()
        };
        let p = process(&message.encode(), &limits).unwrap();
        let kinds: Vec<(bool, bool)> = p
            .extracted
            .clicks
            .iter()
            .map(|c| (c.is_dead, c.is_rage))
            .collect();
        assert_eq!(kinds, [(true, true), (true, false)], "rows");
        let gates = IssueGates {
            rage_clicks: occurrence::ProjectFilter::All,
            hydration_errors: occurrence::ProjectFilter::All,
        };
        let issues = p
            .events(&gates)
            .iter()
            .filter(|e| e.kind() == "rage_click")
            .count();
        assert_eq!(issues, 1, "one rage-click occurrence");
        assert_eq!(
            p.trace_items.map(|items| items.len()),
            Some(2),
            "an item for each click there is"
        );
    }

    #[test]
    fn a_panic_while_processing_becomes_an_internal_error_rejection() {
        let result: Result<(), _> = guarded(|| panic!("index out of bounds"));
        let error = result.unwrap_err();
        assert_eq!(error.reason, Reason::InternalError);
        assert_eq!(error.detail, "processing panicked: index out of bounds");
        let formatted: Result<(), _> = guarded(|| panic!("{} items", 3));
        assert_eq!(
            formatted.unwrap_err().detail,
            "processing panicked: 3 items"
        );
    }
}
