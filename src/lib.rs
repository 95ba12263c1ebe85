//! replay-ingest: consumes session-replay recording segments from Kafka, processes them on
//! arrival, buffers the results and flushes blobs, rows, events and metrics.
//!
//! Layout follows the data flow:
//! - [`kafka`]: consumer polling thread, rebalance callbacks, producers, the `produce` command;
//! - [`recording`]: the pure per-message core (decode, decompress, extract, build outputs);
//! - [`pipeline`]: consume → process → buffer → flush → commit;
//! - [`sink`]: where a flushed batch goes;
//! - [`startup`]: destinations checked before joining the group;
//! - [`config`], [`health`], [`inspect`]: configuration, probes and status, the `inspect` report.

pub mod config;
pub mod health;
pub mod inspect;
pub mod kafka;
pub mod metrics;
pub mod pipeline;
pub mod recording;
pub mod secret;
pub mod sink;
pub mod startup;
