//! replay-ingest: consumes session-replay recording segments from Kafka, processes them on
//! arrival, buffers the results and flushes blobs, rows, events and metrics.
//!
//! Layout follows the data flow:
//! - [`kafka`]: the consumer's polling thread and rebalance callbacks, re-reading a message;
//! - [`recording`]: the pure per-message core (decode, decompress, extract, build outputs);
//! - [`pipeline`]: consume → process → buffer → flush → commit;
//! - [`sink`]: where a flushed batch goes (and what Kafka destinations share);
//! - [`startup`]: destinations checked before joining the group;
//! - [`service`]: the sinks and their checks assembled from the flags (what the binary runs);
//! - [`metrics`]: the catalogue and the DogStatsD exporter;
//! - [`config`]: the flags, which build every other module's settings (only [`service`] and
//!   [`tools`], which start from flags, import it);
//! - [`secret`], [`health`], [`inspect`], [`logs`]: credentials that never print, probes and
//!   status, the `inspect` report, log lines (panics among them).
//!
//! Formats and rules the code cites are in `docs/formats.md` (input) and `docs/outputs.md`.

pub mod config;
pub mod health;
pub mod inspect;
pub mod kafka;
pub mod logs;
pub mod metrics;
pub mod pipeline;
pub mod recording;
pub mod secret;
pub mod service;
pub mod sink;
pub mod startup;
pub mod tools;
