//! The metrics catalogue: every metric the service emits, with its type, unit and tags, in one
//! place. Names are prefixed by the exporter (`--statsd-prefix`, default `replay_ingest`). Tags
//! come from small fixed sets — `sink`, `reason`, `close_reason`, `partition` (a number) — never
//! ids. Emitted per message only for size/time distributions, otherwise per batch.
//!
//! | name | type | unit | tags | meaning |
//! |---|---|---|---|---|
//! | `messages.consumed` | counter | messages | | polled from Kafka |
//! | `messages.processed` | counter | messages | | valid, flushed |
//! | `messages.invalid` | counter | messages | `reason` | dead-lettered, flushed |
//! | `events.invalid` | counter | events | | malformed rrweb events skipped inside valid segments |
//! | `segment.compressed_bytes` | distribution | bytes | | body as received |
//! | `segment.uncompressed_bytes` | distribution | bytes | | rrweb JSON |
//! | `segment.memory_bytes` | distribution | bytes | | what a processed segment holds while buffered |
//! | `segment.truncated` | counter | values | | values cut to a cap and list items left out (hostile or unusually large input; never fails a segment) |
//! | `process.duration_ms` | distribution | ms | | decode + decompress + extract, per message |
//! | `buffer.messages` | gauge | messages | | open buffer |
//! | `buffer.bytes` | gauge | bytes | | open buffer |
//! | `flush.duration_ms` | distribution | ms | `sink` | one sink's write of one batch, retries included |
//! | `flush.batch_messages` | distribution | messages | `close_reason` | batch size |
//! | `flush.items` | counter | rows/blobs/events | `sink` | what a sink wrote |
//! | `flush.bytes` | counter | bytes | `sink` | what a sink wrote |
//! | `flush.retries` | counter | attempts | `sink` | failed attempts that were retried |
//! | `flush.errors` | counter | batches | `sink` | flushes that failed for good (the service stops) |
//! | `sink.outage_ms` | gauge | ms | `sink` | how long the sink's current write has been failing (0 once it succeeds) |
//! | `commits` | counter | commits | | offset commits |
//! | `consumer.paused_ms` | counter | ms | | time intake was paused by backpressure |
//! | `consumer.rebalances` | counter | rebalances | | partition revocations drained |
//! | `consumer.lag` | gauge | messages | `partition` | from librdkafka statistics |

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_dogstatsd::DogStatsDBuilder;

use crate::config::MetricsArgs;

/// Installs the DogStatsD exporter as the global recorder; no-op with an empty address.
pub fn install(args: &MetricsArgs) -> Result<(), String> {
    if args.statsd_address.is_empty() {
        return Ok(());
    }
    let labels = args
        .statsd_tags
        .iter()
        .map(|tag| match tag.split_once(':') {
            Some((key, value)) => Ok(metrics::Label::new(key.to_owned(), value.to_owned())),
            None => Err(format!("--statsd-tag {tag:?} is not key:value")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    DogStatsDBuilder::default()
        .with_remote_address(&args.statsd_address)
        .map_err(|e| e.to_string())?
        .set_global_prefix(&args.statsd_prefix)
        .with_global_labels(labels)
        .with_flush_interval(Duration::from_millis(args.statsd_flush_interval_ms))
        .with_telemetry(false)
        .send_histograms_as_distributions(true)
        .install()
        .map_err(|e| e.to_string())
}

pub const MESSAGES_CONSUMED: &str = "messages.consumed";
pub const MESSAGES_PROCESSED: &str = "messages.processed";
pub const MESSAGES_INVALID: &str = "messages.invalid";
pub const EVENTS_INVALID: &str = "events.invalid";
pub const SEGMENT_COMPRESSED_BYTES: &str = "segment.compressed_bytes";
pub const SEGMENT_UNCOMPRESSED_BYTES: &str = "segment.uncompressed_bytes";
pub const SEGMENT_MEMORY_BYTES: &str = "segment.memory_bytes";
pub const SEGMENT_TRUNCATED: &str = "segment.truncated";
pub const PROCESS_DURATION_MS: &str = "process.duration_ms";
pub const BUFFER_MESSAGES: &str = "buffer.messages";
pub const BUFFER_BYTES: &str = "buffer.bytes";
pub const FLUSH_DURATION_MS: &str = "flush.duration_ms";
pub const FLUSH_BATCH_MESSAGES: &str = "flush.batch_messages";
pub const FLUSH_ITEMS: &str = "flush.items";
pub const FLUSH_BYTES: &str = "flush.bytes";
pub const FLUSH_RETRIES: &str = "flush.retries";
pub const FLUSH_ERRORS: &str = "flush.errors";
pub const SINK_OUTAGE_MS: &str = "sink.outage_ms";
pub const COMMITS: &str = "commits";
pub const CONSUMER_PAUSED_MS: &str = "consumer.paused_ms";
pub const CONSUMER_REBALANCES: &str = "consumer.rebalances";
pub const CONSUMER_LAG: &str = "consumer.lag";

/// What one sink wrote in one flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    pub items: u64,
    pub bytes: u64,
}

pub fn consumed() {
    counter!(MESSAGES_CONSUMED).increment(1);
}

/// What processing one valid segment cost and found.
pub struct SegmentStats {
    pub compressed: usize,
    pub uncompressed: usize,
    pub memory: usize,
    pub invalid_events: u64,
    pub truncated: u64,
    pub took: Duration,
}

pub fn processed_segment(stats: &SegmentStats) {
    histogram!(SEGMENT_COMPRESSED_BYTES).record(stats.compressed as f64);
    histogram!(SEGMENT_UNCOMPRESSED_BYTES).record(stats.uncompressed as f64);
    histogram!(SEGMENT_MEMORY_BYTES).record(stats.memory as f64);
    histogram!(PROCESS_DURATION_MS).record(stats.took.as_secs_f64() * 1000.0);
    if stats.invalid_events > 0 {
        counter!(EVENTS_INVALID).increment(stats.invalid_events);
    }
    if stats.truncated > 0 {
        counter!(SEGMENT_TRUNCATED).increment(stats.truncated);
    }
}

pub fn buffer(messages: usize, bytes: usize) {
    gauge!(BUFFER_MESSAGES).set(messages as f64);
    gauge!(BUFFER_BYTES).set(bytes as f64);
}

/// A batch is durable: its message counts, per-sink timings and volumes.
pub fn flushed(
    close_reason: &'static str,
    valid: u64,
    invalid_by_reason: impl Iterator<Item = (&'static str, u64)>,
    sinks: impl Iterator<Item = (&'static str, Duration, u32, Written)>,
) {
    counter!(MESSAGES_PROCESSED).increment(valid);
    let mut batch = valid;
    for (reason, n) in invalid_by_reason {
        counter!(MESSAGES_INVALID, "reason" => reason).increment(n);
        batch += n;
    }
    histogram!(FLUSH_BATCH_MESSAGES, "close_reason" => close_reason).record(batch as f64);
    for (sink, took, retries, written) in sinks {
        histogram!(FLUSH_DURATION_MS, "sink" => sink).record(took.as_secs_f64() * 1000.0);
        counter!(FLUSH_ITEMS, "sink" => sink).increment(written.items);
        counter!(FLUSH_BYTES, "sink" => sink).increment(written.bytes);
        if retries > 0 {
            counter!(FLUSH_RETRIES, "sink" => sink).increment(u64::from(retries));
        }
    }
}

/// A sink's write has been failing for `failing_for` (zero: it recovered).
pub fn outage(sink: &'static str, failing_for: Duration) {
    gauge!(SINK_OUTAGE_MS, "sink" => sink).set(failing_for.as_millis() as f64);
}

pub fn flush_failed(sink: &'static str) {
    counter!(FLUSH_ERRORS, "sink" => sink).increment(1);
}

pub fn committed() {
    counter!(COMMITS).increment(1);
}

pub fn paused_for(duration: Duration) {
    counter!(CONSUMER_PAUSED_MS).increment(duration.as_millis() as u64);
}

pub fn rebalanced() {
    counter!(CONSUMER_REBALANCES).increment(1);
}

pub fn lag(partition: i32, lag: i64) {
    gauge!(CONSUMER_LAG, "partition" => partition.to_string()).set(lag as f64);
}
