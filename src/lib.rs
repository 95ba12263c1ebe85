//! replay-ingest: consumes session-replay recording segments from Kafka, processes them on
//! arrival, buffers the results and flushes blobs, rows, events and metrics.
//!
//! Layout follows the data flow:
//! - [`recording`]: the pure per-message core (decode, decompress, extract, build outputs);
//! - [`inspect`]: the `inspect` command's report of what the core makes of a message.

pub mod inspect;
pub mod recording;
