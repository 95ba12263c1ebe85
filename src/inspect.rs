//! `replay-ingest inspect FILE...`: what the recording core makes of raw Kafka message values.
//!
//! One JSON object per file and line: `{"file", "ok": true, …extracted fields}` for a valid
//! message, `{"file", "ok": false, "reason", "detail"}` for invalid input.

use serde::Serialize;

use crate::recording::{self, BodyEncoding, Extracted, InvalidRecording, Limits, Processed};

#[derive(Serialize)]
struct Valid<'a> {
    file: &'a str,
    ok: bool,
    replay_id: &'a str,
    org_id: u64,
    project_id: u64,
    key_id: Option<u64>,
    received: u64,
    segment_id: u32,
    retention_days: u16,
    blob_key: &'a str,
    blob_bytes: usize,
    body_encoding: BodyEncoding,
    compressed_bytes: usize,
    uncompressed_bytes: usize,
    /// Why nothing was read from the body (`Processed::unread_body`); absent when it was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    unread_body: Option<&'a str>,
    #[serde(flatten)]
    extracted: &'a Extracted,
    rows: RowCounts,
    /// What the segment holds while buffered (`Processed::memory_bytes`).
    memory_bytes: usize,
    analytics_events: Vec<String>,
}

#[derive(Serialize)]
struct RowCounts {
    segment: usize,
    click: usize,
    tap: usize,
}

#[derive(Serialize)]
struct Invalid<'a> {
    file: &'a str,
    ok: bool,
    reason: &'static str,
    detail: &'a str,
}

/// The report line for one file's processing result.
pub fn report_line(file: &str, result: &Result<Processed, InvalidRecording>) -> String {
    let line = match result {
        Ok(p) => {
            let rows = RowCounts {
                segment: usize::from(p.has_segment_row()),
                click: p.extracted.clicks.len(),
                tap: p.extracted.taps.len(),
            };
            serde_json::to_string(&Valid {
                file,
                ok: true,
                replay_id: &p.ids.replay_id,
                org_id: p.ids.org_id,
                project_id: p.ids.project_id,
                key_id: p.ids.key_id,
                received: p.ids.received,
                segment_id: p.ids.segment_id,
                retention_days: p.ids.retention_days,
                blob_key: &p.blob.key,
                blob_bytes: p.blob.bytes.len(),
                body_encoding: p.body_encoding,
                compressed_bytes: p.compressed_bytes,
                uncompressed_bytes: p.uncompressed_bytes,
                unread_body: p.unread_body.as_deref(),
                extracted: &p.extracted,
                rows,
                memory_bytes: p.memory_bytes(),
                analytics_events: p
                    .events(&Default::default())
                    .iter()
                    .map(|e| format!("{}:{}", e.topic().as_str(), e.kind()))
                    .collect(),
            })
        }
        Err(e) => serde_json::to_string(&Invalid {
            file,
            ok: false,
            reason: e.reason.as_str(),
            detail: &e.detail,
        }),
    };
    // Only strings, numbers, maps and sequences: serialisation cannot fail; if it ever did, the
    // line still says so rather than being empty.
    line.unwrap_or_else(|e| {
        let detail = format!("rendering the report failed: {e}");
        let invalid = Invalid {
            file,
            ok: false,
            reason: recording::Reason::InternalError.as_str(),
            detail: &detail,
        };
        serde_json::to_string(&invalid)
            .unwrap_or_else(|_| format!("{{\"ok\":false,\"detail\":{detail:?}}}"))
    })
}

/// Processes one message value and renders its report line.
pub fn inspect(file: &str, value: bytes::Bytes, limits: &Limits) -> String {
    report_line(
        file,
        &recording::process_guarded(&value, limits, &mut recording::Inflater::default()),
    )
}
