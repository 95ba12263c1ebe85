//! The metrics catalogue: every metric the service emits, with its type, unit and tags, in one
//! place. Names are prefixed by the exporter (`--statsd-prefix`, default `replay_ingest`). Tags
//! come from small fixed sets — `sink`, `reason`, `close_reason`, `category`, `partition` (a number) — never
//! ids; every metric also carries `service`, `version` and the configured tags (`env`). Emitted
//! per message only for size/time distributions, otherwise per batch.
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
//! | `segment.unread` | counter | segments | | bodies that decompressed but are not a JSON array of events: stored and billed, nothing read from them (Sentry's "Failed to parse recording") |
//! | `segment.truncated` | counter | values | | values cut to a cap and list items left out (hostile or unusually large input; never fails a segment) |
//! | `process.duration_ms` | distribution | ms | | decode + decompress + extract, per message |
//! | `buffer.messages` | gauge | messages | | open buffer |
//! | `buffer.bytes` | gauge | bytes | | open buffer |
//! | `flush.duration_ms` | distribution | ms | `sink` | one sink's write of one batch, retries included |
//! | `flush.batch_messages` | distribution | messages | `close_reason` | batch size |
//! | `flush.items` | counter | rows/blobs/events | `sink` | what a sink wrote |
//! | `flush.bytes` | counter | bytes | `sink` | what a sink wrote |
//! | `flush.retries` | counter | attempts | `sink` | failed attempts that were retried, counted as each fails |
//! | `flush.errors` | counter | batches | `sink` | flushes that failed for good (the service stops) |
//! | `sink.outage_ms` | gauge | ms | `sink` | how long the sink has been failing, from its outage's first failed request (as `/status` `since_ms`), whichever flush it began in — or its startup check; set every second from `/status` `outages`, 0 once the outage ends (a write or the check succeeds) |
//! | `commits` | counter | commits | | offset commits |
//! | `commits.failed` | counter | commits | | offset commits the broker refused or did not answer (each is tried again a second later); while they fail, `consumer.lag` grows though the sinks keep up |
//! | `consumer.paused_ms` | counter | ms | | time intake was paused by backpressure, counted every second while it lasts |
//! | `consumer.rebalances` | counter | rebalances | | partition revocations: drained, or lost (given up at once) |
//! | `consumer.out_of_group_ms` | gauge | ms | | how long the member has been out of its consumer group (not joined with its assignment taken: a rebalance, a lost coordinator), from librdkafka's statistics; 0 while in it |
//! | `consumer.out_of_group_connected_ms` | gauge | ms | | the same, counted only while the member reaches a broker (what liveness's group stall counts): a member kept out of its group, not one cut off by a Kafka outage; 0 while in it, and from 0 again when no broker answers |
//! | `consumer.lag` | gauge | messages | `partition` | high watermark − committed offset, from librdkafka statistics (while intake is paused, which stops fetches and so their high watermarks, the brokers are asked for it every 5 s), for owned partitions; 0 once given away |
//! | `trace_items.built` | counter | items | `category` | EAP trace items built while processing (`--trace-items-rollout`); `flush.items{sink:trace_items}` counts them delivered |
//! | `trace_items.dropped` | counter | items | `reason` | sampled events left without an item: `invalid_field`, `invalid_trace_id`, `over_budget`, `too_large`, `too_many_values` (data with more values than are read, item or not) while processing; `over_topic_limit` when written (an item over the topic's `max.message.bytes`, counted once per write, whatever its attempts) |
//! | `sweep.removed` | counter | blobs | | blobs past their retention removed by the periodic sweep (`--sweep-interval-s`) |
//! | `sweep.bytes` | counter | bytes | | their bytes |
//! | `sweep.errors` | counter | errors | | what a periodic sweep could not read or remove (a blob kept past its retention, a retention directory that is a link, a `--blob-dir` above the store), or a sweep that did not finish; the WARN line names them |
//! | `sweep.duration_ms` | distribution | ms | | how long each periodic sweep took (removals paced to `--sweep-max-deletes-per-second`) |
//! | `trace_items.headers_cut` | counter | headers | | request/response headers left out of an item or cut, past `MAX_HEADERS` / `MAX_HEADER_BYTES` |
//!
//! Sentry's own ingest metrics, under the same names (and the service's prefix: with
//! `--statsd-prefix sentry`, Sentry's own, dashboards built for Sentry's consumer keep working):
//!
//! | name | type | unit | tags | meaning |
//! |---|---|---|---|---|
//! | `replays.usecases.ingest.size_compressed` | distribution | bytes | | body as received |
//! | `replays.usecases.ingest.size_uncompressed` | distribution | bytes | | rrweb JSON |
//! | `replays.usecases.ingest.request_body_size` | distribution | bytes | | per network request with a request size |
//! | `replays.usecases.ingest.response_body_size` | distribution | bytes | | per network request with a response size |
//! | `replays.recording_consumer.replay_video_count` | counter | segments | | segments with a video |
//! | `replays.recording_consumer.replay_video_size` | distribution | bytes | | the video |
//! | `replays.recording_consumer.replay_video_event_size` | distribution | bytes | | the stored blob of a video segment |
//! | `replays.should_publish_replay_event` | counter | segments | `value`: `True`/`False` | whether this service writes the segment row |
//! | `sentry.replays.consumer.recording.missing-replay-event` | counter | segments | | valid segments without a replay event |
//! | `replay.hydration_error_breadcrumb` | counter | breadcrumbs | | hydration-error breadcrumbs |
//! | `replay.rage_click_detected` | counter | clicks | | rage clicks published as issue occurrences |
//! | `replay.rage_click_issue_creation_with_replay_event` | counter | occurrences | | rage-click occurrences published |
//! | `replay.hydration_error_issue_creation_with_replay_event` | counter | occurrences | | hydration-error occurrences published |

use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_dogstatsd::DogStatsDBuilder;

use crate::recording::Processed;

/// Where and how metrics are sent.
pub struct Settings<'a> {
    /// DogStatsD `host:port` or `unixgram:///path`; empty sends nothing.
    pub address: &'a str,
    pub prefix: &'a str,
    /// `key:value` tags on every metric, after `service` and `version`.
    pub tags: &'a [String],
    pub flush_interval: Duration,
}

/// The installed exporter. Its forwarder sends what was aggregated once per flush interval and
/// has no flush call: [`Exporter::flush_before_exit`] waits for the next send instead, so the last
/// interval — a clean stop's final counts, or the `flush.errors` of a failed flush — is not lost.
pub struct Exporter {
    flush_interval: Option<Duration>,
}

impl Exporter {
    /// Blocks until the forwarder has sent everything recorded so far: one flush interval plus a
    /// margin (at most ~1.1 s with the default interval). No-op when metrics are off.
    pub async fn flush_before_exit(&self) {
        if let Some(interval) = self.flush_interval {
            tokio::time::sleep(interval + Duration::from_millis(100)).await;
        }
    }
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("--statsd-tag {0:?} is not key:value")]
    Tag(String),
    #[error("DogStatsD exporter: {0}")]
    Exporter(#[from] metrics_exporter_dogstatsd::BuildError),
    #[error(
        "--statsd-address {0}: only IPv6 addresses, and the DogStatsD exporter sends UDP from an IPv4 socket, so no metric would arrive; on an IPv6 single-stack cluster use the agent's Unix socket (the chart's dogstatsd.mode: socket)"
    )]
    Ipv6Only(String),
}

/// Datadog's unified service tags: `service` and `version` always, `env` when set. Each is taken
/// from Datadog's own variable (`DD_SERVICE`, `DD_VERSION`, `DD_ENV`), else `replay-ingest` and
/// the crate's version. With `dogstatsd.env` set, the chart sets the first two from the pod's
/// `tags.datadoghq.com/*` labels, which the agent also tags the pod's metrics with, so the two
/// agree; it tags `env` through `--statsd-tag` instead.
fn unified_tags(var: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let var = |name| var(name).filter(|value: &String| !value.is_empty());
    let mut tags = vec![
        (
            "service",
            var("DD_SERVICE").unwrap_or_else(|| "replay-ingest".to_owned()),
        ),
        (
            "version",
            var("DD_VERSION").unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
        ),
    ];
    tags.extend(var("DD_ENV").map(|env| ("env", env)));
    tags
}

/// The configured tags as labels; `Err` names one that is not `key:value`.
fn labels(tags: &[String]) -> Result<Vec<metrics::Label>, InstallError> {
    tags.iter()
        .map(|tag| match tag.split_once(':') {
            Some((key, value)) => Ok(metrics::Label::new(key.to_owned(), value.to_owned())),
            None => Err(InstallError::Tag(tag.clone())),
        })
        .collect()
}

/// What [`install`] would refuse in `settings` (a tag, the address), without installing.
pub fn check(settings: &Settings<'_>) -> Result<(), InstallError> {
    labels(settings.tags)?;
    if !settings.address.is_empty() {
        DogStatsDBuilder::default().with_remote_address(settings.address)?;
        udp_reachable(settings.address)?;
    }
    Ok(())
}

/// A UDP address (no scheme, or `udp://`) must resolve to an IPv4 address: the exporter binds
/// its socket to `0.0.0.0` and would fail every send to an IPv6 one, logging an error per flush
/// interval (the chart's `hostIP` mode on an IPv6 single-stack cluster). A name resolving to
/// both (`localhost`) is sent to over IPv4.
fn udp_reachable(address: &str) -> Result<(), InstallError> {
    use std::net::ToSocketAddrs;
    let udp = match address.split_once("://") {
        None => address,
        Some(("udp", udp)) => udp,
        Some(_) => return Ok(()),
    };
    let ipv6_only = udp.to_socket_addrs().is_ok_and(|resolved| {
        let resolved: Vec<_> = resolved.collect();
        !resolved.is_empty() && !resolved.iter().any(|a| a.is_ipv4())
    });
    match ipv6_only {
        true => Err(InstallError::Ipv6Only(address.to_owned())),
        false => Ok(()),
    }
}

/// Installs the DogStatsD exporter as the global recorder. Every metric carries the unified
/// service tags (an explicit tag of the same name wins) and the configured tags.
pub fn install(settings: &Settings<'_>) -> Result<Exporter, InstallError> {
    if settings.address.is_empty() {
        return Ok(Exporter {
            flush_interval: None,
        });
    }
    let mut labels = labels(settings.tags)?;
    for (key, value) in unified_tags(|name| std::env::var(name).ok()) {
        if !labels.iter().any(|l| l.key() == key) {
            labels.insert(0, metrics::Label::new(key, value));
        }
    }
    udp_reachable(settings.address)?;
    let mut builder = DogStatsDBuilder::default().with_remote_address(settings.address)?;
    // An empty prefix is none: given to the exporter, every name went out as `.name`.
    if !settings.prefix.is_empty() {
        builder = builder.set_global_prefix(settings.prefix);
    }
    builder
        .with_global_labels(labels)
        .with_flush_interval(settings.flush_interval)
        .with_telemetry(false)
        .send_histograms_as_distributions(true)
        // At most HISTOGRAM_RESERVOIR values of each histogram per flush, a uniform sample sent
        // with its rate (the agent scales it back): a segment records about ten values, and at
        // 25 000 small segments a second formatting and sending each one cost about 5 µs a
        // segment, a tenth of the service's CPU (docs/benchmarks.md).
        .with_histogram_sampling(true)
        .with_histogram_reservoir_size(HISTOGRAM_RESERVOIR)
        .install()?;
    Ok(Exporter {
        flush_interval: Some(settings.flush_interval),
    })
}

pub const MESSAGES_CONSUMED: &str = "messages.consumed";
pub const MESSAGES_PROCESSED: &str = "messages.processed";
pub const MESSAGES_INVALID: &str = "messages.invalid";
pub const EVENTS_INVALID: &str = "events.invalid";
pub const SEGMENT_COMPRESSED_BYTES: &str = "segment.compressed_bytes";
pub const SEGMENT_UNCOMPRESSED_BYTES: &str = "segment.uncompressed_bytes";
pub const SEGMENT_MEMORY_BYTES: &str = "segment.memory_bytes";
pub const SEGMENT_UNREAD: &str = "segment.unread";
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
pub const COMMITS_FAILED: &str = "commits.failed";
pub const CONSUMER_PAUSED_MS: &str = "consumer.paused_ms";
pub const CONSUMER_REBALANCES: &str = "consumer.rebalances";
pub const CONSUMER_OUT_OF_GROUP_MS: &str = "consumer.out_of_group_ms";
pub const CONSUMER_OUT_OF_GROUP_CONNECTED_MS: &str = "consumer.out_of_group_connected_ms";
pub const CONSUMER_LAG: &str = "consumer.lag";
pub const SWEEP_REMOVED: &str = "sweep.removed";
pub const SWEEP_BYTES: &str = "sweep.bytes";
pub const SWEEP_ERRORS: &str = "sweep.errors";
pub const SWEEP_DURATION_MS: &str = "sweep.duration_ms";
pub const TRACE_ITEMS_BUILT: &str = "trace_items.built";
pub const TRACE_ITEMS_DROPPED: &str = "trace_items.dropped";
pub const TRACE_ITEMS_HEADERS_CUT: &str = "trace_items.headers_cut";
pub const SENTRY_SIZE_COMPRESSED: &str = "replays.usecases.ingest.size_compressed";
pub const SENTRY_SIZE_UNCOMPRESSED: &str = "replays.usecases.ingest.size_uncompressed";
pub const SENTRY_REQUEST_BODY_SIZE: &str = "replays.usecases.ingest.request_body_size";
pub const SENTRY_RESPONSE_BODY_SIZE: &str = "replays.usecases.ingest.response_body_size";
pub const SENTRY_VIDEO_COUNT: &str = "replays.recording_consumer.replay_video_count";
pub const SENTRY_VIDEO_SIZE: &str = "replays.recording_consumer.replay_video_size";
pub const SENTRY_VIDEO_EVENT_SIZE: &str = "replays.recording_consumer.replay_video_event_size";
pub const SENTRY_SHOULD_PUBLISH: &str = "replays.should_publish_replay_event";
pub const SENTRY_MISSING_REPLAY_EVENT: &str =
    "sentry.replays.consumer.recording.missing-replay-event";
pub const SENTRY_HYDRATION_BREADCRUMBS: &str = "replay.hydration_error_breadcrumb";
pub const SENTRY_RAGE_CLICK_DETECTED: &str = "replay.rage_click_detected";
/// Values of one histogram sent per flush at most (a uniform sample beyond).
pub const HISTOGRAM_RESERVOIR: usize = 1024;

pub const SENTRY_RAGE_CLICK_ISSUES: &str = "replay.rage_click_issue_creation_with_replay_event";
pub const SENTRY_HYDRATION_ISSUES: &str = "replay.hydration_error_issue_creation_with_replay_event";

pub fn consumed(messages: usize) {
    counter!(MESSAGES_CONSUMED).increment(messages as u64);
}

/// Handles of what every valid segment records, registered on a processing thread's first
/// segment and kept for the thread's life (sixteen handles; a segment records about ten of
/// them). Looked up by name instead (the `histogram!` macros), each segment paid about ten
/// registry lookups (a hash and a map read each) and a labelled key built and dropped: with the
/// DogStatsD exporter installed, 3 % of a processing thread's time on small segments (perf),
/// 0.33 µs a segment against 0.06 µs with the handles (hot loop, one thread). The exporter is installed before any processing thread starts, so no thread keeps
/// the no-op handles of the time before it. A counter a thread never increments is sent once, as
/// 0, as the exporter sends one that went idle.
struct SegmentMetrics {
    compressed_bytes: Histogram,
    uncompressed_bytes: Histogram,
    memory_bytes: Histogram,
    duration_ms: Histogram,
    events_invalid: Counter,
    unread: Counter,
    truncated: Counter,
    sentry_size_compressed: Histogram,
    sentry_size_uncompressed: Histogram,
    request_body_size: Histogram,
    response_body_size: Histogram,
    video_count: Counter,
    video_size: Histogram,
    video_event_size: Histogram,
    /// `value:False`, `value:True`.
    should_publish: [Counter; 2],
    missing_replay_event: Counter,
    hydration_breadcrumbs: Counter,
}

impl SegmentMetrics {
    fn register() -> Self {
        SegmentMetrics {
            compressed_bytes: histogram!(SEGMENT_COMPRESSED_BYTES),
            uncompressed_bytes: histogram!(SEGMENT_UNCOMPRESSED_BYTES),
            memory_bytes: histogram!(SEGMENT_MEMORY_BYTES),
            duration_ms: histogram!(PROCESS_DURATION_MS),
            events_invalid: counter!(EVENTS_INVALID),
            unread: counter!(SEGMENT_UNREAD),
            truncated: counter!(SEGMENT_TRUNCATED),
            sentry_size_compressed: histogram!(SENTRY_SIZE_COMPRESSED),
            sentry_size_uncompressed: histogram!(SENTRY_SIZE_UNCOMPRESSED),
            request_body_size: histogram!(SENTRY_REQUEST_BODY_SIZE),
            response_body_size: histogram!(SENTRY_RESPONSE_BODY_SIZE),
            video_count: counter!(SENTRY_VIDEO_COUNT),
            video_size: histogram!(SENTRY_VIDEO_SIZE),
            video_event_size: histogram!(SENTRY_VIDEO_EVENT_SIZE),
            should_publish: ["False", "True"]
                .map(|value| counter!(SENTRY_SHOULD_PUBLISH, "value" => value)),
            missing_replay_event: counter!(SENTRY_MISSING_REPLAY_EVENT),
            hydration_breadcrumbs: counter!(SENTRY_HYDRATION_BREADCRUMBS),
        }
    }
}

thread_local! {
    static SEGMENT_METRICS: SegmentMetrics = SegmentMetrics::register();
}

/// What processing one valid segment cost (`memory`: what it holds while buffered) and found.
pub fn processed_segment(p: &Processed, memory: usize, took: Duration) {
    SEGMENT_METRICS.with(|m| {
        m.compressed_bytes.record(p.compressed_bytes as f64);
        m.uncompressed_bytes.record(p.uncompressed_bytes as f64);
        m.memory_bytes.record(memory as f64);
        m.duration_ms.record(took.as_secs_f64() * 1000.0);
        if p.extracted.invalid_events > 0 {
            m.events_invalid.increment(p.extracted.invalid_events);
        }
        if p.unread_body.is_some() {
            m.unread.increment(1);
        }
        let truncated = p.truncations();
        if truncated > 0 {
            m.truncated.increment(truncated);
        }
        m.sentry_size_compressed.record(p.compressed_bytes as f64);
        m.sentry_size_uncompressed
            .record(p.uncompressed_bytes as f64);
        for request in &p.extracted.requests {
            if let Some(size) = request.request_size {
                m.request_body_size.record(size as f64);
            }
            if let Some(size) = request.response_size {
                m.response_body_size.record(size as f64);
            }
        }
        if p.video_bytes > 0 {
            m.video_count.increment(1);
            m.video_size.record(p.video_bytes as f64);
            m.video_event_size.record(p.blob.bytes.len() as f64);
        }
        m.should_publish[usize::from(p.writes_segment_row)].increment(1);
        if p.replay_event.is_none() {
            m.missing_replay_event.increment(1);
        }
        m.hydration_breadcrumbs.increment(
            p.extracted
                .breadcrumbs_by_category
                .get("replay.hydrate-error"),
        );
    });
    if let Some(items) = &p.trace_items {
        trace_items(items);
    }
}

/// A trace item left out of a write: over its topic's `max.message.bytes`.
pub fn trace_item_over_topic_limit() {
    counter!(TRACE_ITEMS_DROPPED, "reason" => "over_topic_limit").increment(1);
}

fn trace_items(items: &crate::recording::TraceItems) {
    for (category, n) in items.by_category() {
        counter!(TRACE_ITEMS_BUILT, "category" => category.as_str()).increment(n);
    }
    for (reason, n) in items.counts.dropped() {
        counter!(TRACE_ITEMS_DROPPED, "reason" => reason.as_str()).increment(n);
    }
    if items.counts.headers_cut > 0 {
        counter!(TRACE_ITEMS_HEADERS_CUT).increment(items.counts.headers_cut);
    }
}

/// Issue occurrences delivered by one write.
pub fn occurrences_published(rage_clicks: u64, hydration_errors: u64) {
    if rage_clicks > 0 {
        counter!(SENTRY_RAGE_CLICK_DETECTED).increment(rage_clicks);
        counter!(SENTRY_RAGE_CLICK_ISSUES).increment(rage_clicks);
    }
    if hydration_errors > 0 {
        counter!(SENTRY_HYDRATION_ISSUES).increment(hydration_errors);
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
    // Each sink: its name, how long its write took, the items and bytes it wrote.
    sinks: impl Iterator<Item = (&'static str, Duration, u64, u64)>,
) {
    counter!(MESSAGES_PROCESSED).increment(valid);
    let mut batch = valid;
    for (reason, n) in invalid_by_reason {
        counter!(MESSAGES_INVALID, "reason" => reason).increment(n);
        batch += n;
    }
    histogram!(FLUSH_BATCH_MESSAGES, "close_reason" => close_reason).record(batch as f64);
    for (sink, took, items, bytes) in sinks {
        histogram!(FLUSH_DURATION_MS, "sink" => sink).record(took.as_secs_f64() * 1000.0);
        counter!(FLUSH_ITEMS, "sink" => sink).increment(items);
        counter!(FLUSH_BYTES, "sink" => sink).increment(bytes);
    }
}

/// An attempt of a sink's write failed and is retried. Counted as it happens, so that a rate alert
/// fires during an outage.
pub fn retrying(sink: &'static str) {
    counter!(FLUSH_RETRIES, "sink" => sink).increment(1);
}

/// The sink has been failing for `failing_for` (0: it is not), as `/status` shows it
/// (`health::Status::measure_outages`): a write's, or its
/// startup check's (an idle member whose destination is down at start makes no write).
pub fn sink_outage(sink: &'static str, failing_for: Duration) {
    gauge!(SINK_OUTAGE_MS, "sink" => sink).set(failing_for.as_millis() as f64);
}

pub fn flush_failed(sink: &'static str) {
    counter!(FLUSH_ERRORS, "sink" => sink).increment(1);
}

pub fn committed() {
    counter!(COMMITS).increment(1);
}

pub fn commit_failed() {
    counter!(COMMITS_FAILED).increment(1);
}

pub fn paused_for(duration: Duration) {
    counter!(CONSUMER_PAUSED_MS).increment(duration.as_millis() as u64);
}

pub fn rebalanced() {
    counter!(CONSUMER_REBALANCES).increment(1);
}

/// The periodic sweep removed `blobs` blobs of `bytes` bytes, met `errors` errors and took
/// `took`.
pub fn swept(blobs: u64, bytes: u64, errors: u64, took: Duration) {
    counter!(SWEEP_REMOVED).increment(blobs);
    counter!(SWEEP_BYTES).increment(bytes);
    counter!(SWEEP_ERRORS).increment(errors);
    histogram!(SWEEP_DURATION_MS).record(took.as_millis() as f64);
}

/// A periodic sweep that did not finish (its task panicked): one error.
pub fn sweep_failed() {
    counter!(SWEEP_ERRORS).increment(1);
}

/// How long the member has been out of its group (`ms`), and how long of that while it reached a
/// broker (`connected_ms`).
pub fn out_of_group(ms: u64, connected_ms: u64) {
    gauge!(CONSUMER_OUT_OF_GROUP_MS).set(ms as f64);
    gauge!(CONSUMER_OUT_OF_GROUP_CONNECTED_MS).set(connected_ms as f64);
}

pub fn lag(partition: i32, lag: i64) {
    gauge!(CONSUMER_LAG, "partition" => partition.to_string()).set(lag as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::collections::BTreeMap;

    #[test]
    fn a_udp_address_with_only_ipv6_addresses_is_refused_naming_the_socket_mode() {
        let settings = |address| Settings {
            address,
            prefix: "replay_ingest",
            tags: &[],
            flush_interval: Duration::from_secs(1),
        };
        for address in ["[::1]:8125", "udp://[fd00::1]:8125", "fd00::1:8125"] {
            let refused = check(&settings(address)).unwrap_err().to_string();
            assert!(
                refused.contains("dogstatsd.mode: socket"),
                "{address}: {refused}"
            );
        }
        for address in [
            "127.0.0.1:8125",
            "udp://127.0.0.1:8125",
            "localhost:8125",
            "unixgram:///var/run/datadog/dsd.socket",
            "",
        ] {
            check(&settings(address)).unwrap_or_else(|e| panic!("{address}: {e}"));
        }
    }

    /// Each metric of a snapshot by name and labels (`name|key:value`): a counter's value, or
    /// a histogram's values.
    fn recorded(recorder: &DebuggingRecorder) -> BTreeMap<String, Vec<f64>> {
        let mut out = BTreeMap::new();
        for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
            let key = key.key();
            let name = std::iter::once(key.name().to_owned())
                .chain(key.labels().map(|l| format!("{}:{}", l.key(), l.value())))
                .collect::<Vec<_>>()
                .join("|");
            let values = match value {
                DebugValue::Counter(n) => vec![n as f64],
                DebugValue::Histogram(values) => {
                    values.into_iter().map(|v| v.into_inner()).collect()
                }
                DebugValue::Gauge(v) => vec![v.into_inner()],
            };
            out.insert(name, values);
        }
        out
    }

    #[test]
    fn a_segment_records_through_the_handles_its_thread_registered() {
        let value = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/segments/network-0.msgpack"
        ))
        .unwrap();
        let mut processed = crate::recording::process(&value, &Default::default()).unwrap();
        let sizes = |f: fn(&crate::recording::rrweb::Request) -> Option<u64>| {
            let requests = &processed.extracted.requests;
            requests
                .iter()
                .filter_map(f)
                .map(|s| s as f64)
                .collect::<Vec<_>>()
        };
        let (request_sizes, response_sizes) =
            (sizes(|r| r.request_size), sizes(|r| r.response_size));
        assert!(!request_sizes.is_empty() && !response_sizes.is_empty());
        let compressed = processed.compressed_bytes as f64;
        // A thread of its own: the handles are the thread's, registered with its first segment.
        let recorder = std::thread::spawn(move || {
            let recorder = DebuggingRecorder::new();
            metrics::with_local_recorder(&recorder, || {
                processed.writes_segment_row = true;
                processed_segment(&processed, 4096, Duration::from_millis(2));
                processed_segment(&processed, 4096, Duration::from_millis(2));
                processed.writes_segment_row = false;
                processed_segment(&processed, 8192, Duration::from_millis(3));
            });
            recorder
        })
        .join()
        .unwrap();
        let recorded = recorded(&recorder);
        let thrice = |v: &[f64]| [v, v, v].concat();
        assert_eq!(recorded[SEGMENT_COMPRESSED_BYTES], [compressed; 3]);
        assert_eq!(recorded[SENTRY_SIZE_COMPRESSED], [compressed; 3]);
        assert_eq!(recorded[SEGMENT_MEMORY_BYTES], [4096.0, 4096.0, 8192.0]);
        assert_eq!(recorded[PROCESS_DURATION_MS], [2.0, 2.0, 3.0]);
        assert_eq!(recorded[SENTRY_REQUEST_BODY_SIZE], thrice(&request_sizes));
        assert_eq!(recorded[SENTRY_RESPONSE_BODY_SIZE], thrice(&response_sizes));
        let publish =
            |value: &str| recorded[&format!("{SENTRY_SHOULD_PUBLISH}|value:{value}")].clone();
        assert_eq!((publish("True"), publish("False")), (vec![2.0], vec![1.0]));
        // Registered with the rest, never incremented.
        assert_eq!(recorded[SENTRY_VIDEO_COUNT], [0.0]);
    }

    #[test]
    fn unified_tags_follow_datadogs_variables_and_default_to_the_build() {
        let none = unified_tags(|_| None);
        assert_eq!(
            none,
            [
                ("service", "replay-ingest".to_owned()),
                ("version", env!("CARGO_PKG_VERSION").to_owned())
            ]
        );
        // An empty variable (a label the chart left unset) is not a value.
        assert_eq!(unified_tags(|_| Some(String::new())), none);
        let set = unified_tags(|name| {
            Some(match name {
                "DD_SERVICE" => "replays".to_owned(),
                "DD_VERSION" => "1.2.3".to_owned(),
                _ => "prod".to_owned(),
            })
        });
        assert_eq!(
            set,
            [
                ("service", "replays".to_owned()),
                ("version", "1.2.3".to_owned()),
                ("env", "prod".to_owned())
            ]
        );
    }
}
