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
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]

pub mod blob;
pub mod envelope;
pub mod error;
pub mod events;
mod json;
pub mod payload;
pub mod replay_event;
pub mod rows;
pub mod rrweb;
mod scan;

pub use blob::Blob;
pub use envelope::Envelope;
pub use error::{InvalidRecording, Reason};
pub use events::{AnalyticsEvent, EventTopic};
pub use payload::BodyEncoding;
pub use rows::{ReplayRow, RowKind};
pub use rrweb::{Extracted, RowLimits};

/// Default cap on a decompressed segment body (SPEC §3).
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 100 * 1024 * 1024;

/// Knobs of the per-message work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A body that decompresses to more than this is rejected as `too_large`.
    pub max_decompressed_bytes: usize,
    pub rows: RowLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES, rows: RowLimits::default() }
    }
}

/// Everything one valid message produces.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    pub replay_id: String,
    pub org_id: u64,
    pub project_id: u64,
    pub key_id: Option<u64>,
    /// Unix seconds the edge received the segment.
    pub received: u64,
    pub retention_days: u16,
    pub segment_id: u64,
    pub body_encoding: BodyEncoding,
    /// Body bytes as received.
    pub compressed_bytes: usize,
    /// Decompressed rrweb JSON bytes.
    pub uncompressed_bytes: usize,
    pub blob: Blob,
    pub extracted: Extracted,
    pub rows: Vec<ReplayRow>,
    pub events: Vec<AnalyticsEvent>,
}

impl Processed {
    /// Approximate heap bytes held, for buffer accounting: dominated by the blob.
    pub fn memory_bytes(&self) -> usize {
        let strings: usize = self.extracted.urls.iter().map(String::len).sum();
        std::mem::size_of::<Self>()
            + self.blob.bytes.len()
            + self.blob.key.len()
            + strings
            + self.rows.len() * (std::mem::size_of::<ReplayRow>() + 256)
            + self.events.len() * 512
            + self.extracted.clicks.len() * 512
            + (self.extracted.requests.len() + self.extracted.navigations.len()) * 160
    }
}

/// Decodes, decompresses and extracts one message value.
pub fn process(value: &[u8], limits: &Limits) -> Result<Processed, InvalidRecording> {
    let env = envelope::decode(value)?;
    let payload = payload::split(env.payload)?;
    let json = payload::decompress(&payload, limits.max_decompressed_bytes)?;
    let mut extracted = rrweb::extract(&json, limits.rows).map_err(|e| {
        InvalidRecording::new(Reason::InvalidBody, format_args!("body is not a JSON array of events: {e}"))
    })?;
    let replay_event = env.replay_event.map(replay_event::parse).transpose()?;
    if let Some(event) = &replay_event {
        for url in &event.urls {
            extracted.add_url(url);
        }
    }

    let segment_id = payload.segment_id;
    let mut rows: Vec<ReplayRow> = Vec::with_capacity(extracted.clicks.len() + extracted.taps.len() + 1);
    if let Some(event) = replay_event.as_ref().filter(|_| env.relay_snuba_publish_disabled) {
        rows.push(rows::segment_row(&env, segment_id, event));
    }
    rows.extend(extracted.clicks.iter().map(|c| rows::click_row(&env, segment_id, c)));
    rows.extend(extracted.taps.iter().map(|t| rows::tap_row(&env, segment_id, t)));
    let events = events::build(&env, segment_id, &extracted);

    Ok(Processed {
        replay_id: env.replay_id.to_owned(),
        org_id: env.org_id,
        project_id: env.project_id,
        key_id: env.key_id,
        received: env.received,
        retention_days: env.retention_days,
        segment_id,
        body_encoding: payload.encoding,
        compressed_bytes: payload.body.len(),
        uncompressed_bytes: json.len(),
        blob: Blob {
            key: blob::key(env.retention_days, env.project_id, env.replay_id, segment_id),
            bytes: blob::bytes(&payload, &json, env.replay_video).into(),
        },
        extracted,
        rows,
        events,
    })
}
