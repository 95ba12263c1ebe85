//! rrweb event extraction (docs/formats.md, "rrweb events"): one streaming pass over the decompressed JSON array.
//!
//! ```text
//! [{"type":2,"data":{…full snapshot, MBs…},"timestamp":1700000000000},
//!  {"type":3,"data":{"source":0,…},"timestamp":…},
//!  {"type":5,"timestamp":…,"data":{"tag":"breadcrumb","payload":{"category":"ui.click",…}}}, …]
//! ```
//! Each event's `data` is captured as an unparsed slice (the structural scanner skips it); only the
//! small parts that matter — incremental `source`, Meta `href`, custom events — are parsed further.
//! Snapshots and mutations are never materialised. An event that is not an object, lacks a numeric
//! `type`/`timestamp`, nests deeper than the scanner's `MAX_NESTING`, or whose custom payload has the
//! wrong shape is counted in `invalid_events` and skipped; only a JSON syntax error (or a
//! non-array body) fails the segment.
//!
//! **Cost bound.** Whatever the input, what this extracts is small next to it: every kept string
//! is cut to a cap (`MAX_URL_BYTES`, `MAX_TEXT_BYTES`, `MAX_KEY_BYTES`, and Sentry's own column
//! limits for click fields), lists hold at most `MAX_LIST_ITEMS` items and `MAX_LIST_BYTES` bytes
//! together, and the page URL that clicks and hydration errors refer to is one shared allocation,
//! never a copy per reference. A cap never fails the segment: cuts are counted in
//! `truncated_values`, items left out in `dropped_items`.
//!
//! Three parts: `wire.rs` — the shapes of the event data read; `model.rs` — what a segment yields
//! ([`Extracted`]); `extract.rs` — the pass that turns the one into the other.

mod extract;
mod model;
mod wire;

pub use extract::{extract, extract_with, slow_click};
pub use model::*;

/// Longest list kept per segment for navigations, requests, multi-clicks, hydration errors,
/// web vitals and URLs. Bounds memory on hostile input; real segments (5 s of activity) hold far
/// fewer.
pub const MAX_LIST_ITEMS: usize = 1000;

/// Bytes all those lists may hold together (items and their text); past it, items are dropped.
pub const MAX_LIST_BYTES: usize = 512 * 1024;

/// Most distinct keys kept in an input-keyed count map; further keys are counted under `other`.
pub const MAX_DISTINCT_KEYS: usize = 64;

/// Longest URL kept (page URLs, navigation targets, request URLs). Browsers accept far longer
/// ones, but nothing reading these keeps more (Sentry's culprit keeps 200 characters).
pub const MAX_URL_BYTES: usize = 8 * 1024;

/// Longest free-text value kept where Sentry sets no limit: selectors, tap fields, span ops,
/// methods, class names, web-vital names.
pub const MAX_TEXT_BYTES: usize = 1024;

/// Longest key kept in an input-keyed count map (breadcrumb categories, span ops, tags, levels).
pub const MAX_KEY_BYTES: usize = 128;

/// Appended to a value cut by one of this module's caps (Sentry's own column limits cut silently).
pub const TRUNCATION_MARKER: &str = "…";

/// The largest `RowLimits` accepted (`--max-clicks-per-segment`, `--max-taps-per-segment`): what
/// the processing window's fixed part of a message's reservation (2 MiB) was measured to cover,
/// every field of every row at its cap (`tests/it/memory_bound.rs`). Unbounded, 100 000 clicks
/// held tens of MiB for a message that reserved 4.
pub const MAX_ROWS_PER_SEGMENT: usize = 100;

/// Per-segment caps on the rows produced (docs/formats.md, "What a segment yields").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLimits {
    pub max_clicks: usize,
    pub max_taps: usize,
}

impl Default for RowLimits {
    fn default() -> Self {
        RowLimits {
            max_clicks: 20,
            max_taps: 20,
        }
    }
}
