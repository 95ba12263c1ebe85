//! Breadcrumbs as EAP trace items on `snuba-items`: one message per item, no key, the
//! `TraceItem` protobuf as the value (built while processing, `recording::trace_items`). Off
//! unless `--trace-items-rollout` is above 0, as in Sentry. Written beside the rows, after the
//! blobs and before the events, and acknowledged before the batch commits; a redelivered segment
//! rewrites the same items (same `item_id`), which Snuba's table collapses. An item over the
//! topic's `max.message.bytes` (read from the brokers) is left out, counted
//! (`trace_items.dropped{reason:over_topic_limit}`): the broker would refuse it, and the segment —
//! its blob, rows and billing outcome — would be dead-lettered for an optional, sampled output.

use clap::Args;

use super::publish::{LIMITS_MAX_AGE, Publisher, Record, TopicLimits, over_limit};
use super::{Built, Entry, Outcome, Piece, Progress, Sink, SinkError, Writing};
use crate::recording::Rollout;

/// EAP trace items.
#[derive(Args, Debug, Clone)]
pub struct TraceItemsArgs {
    /// Share of rrweb events whose breadcrumb is also written as an EAP trace item (0.0 … 1.0).
    /// 0 writes none, Sentry's default (its option `replay.recording.ingest-trace-items.rollout`).
    /// Sampled per event from a hash of (replay, segment, event index): a redelivered segment
    /// samples the same events.
    #[arg(long, env = "REPLAY_INGEST_TRACE_ITEMS_ROLLOUT", value_parser = rollout, default_value = "0")]
    pub trace_items_rollout: Rollout,
    /// Topic of the trace items: Snuba's EAP items consumer reads `snuba-items`.
    #[arg(
        long,
        env = "REPLAY_INGEST_TRACE_ITEMS_TOPIC",
        default_value = "snuba-items"
    )]
    pub trace_items_topic: String,
}

fn rollout(text: &str) -> Result<Rollout, String> {
    text.parse::<f64>()
        .ok()
        .and_then(Rollout::new)
        .ok_or_else(|| format!("{text:?} is not a share from 0.0 to 1.0"))
}

/// Set in a [`Piece`]'s index, it marks the item of that index counted as left out (over the
/// topic's limit). A segment's items are numbered from 0, far below it.
const LEFT_OUT: u32 = 1 << 31;

pub struct TraceItemsSink {
    publisher: Publisher,
    topic: String,
    limits: TopicLimits,
}

impl Sink for TraceItemsSink {
    fn name(&self) -> &'static str {
        "trace_items"
    }

    fn topics(&self) -> Vec<String> {
        vec![self.topic.clone()]
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(&entry.outcome, Outcome::Valid(p) if p.trace_items.as_ref().is_some_and(|t| !t.is_empty()))
    }

    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            self.limits.refresh(LIMITS_MAX_AGE).await;
            // The read of the limits ended (it may take the sink's timeout): progress.
            progress.stepped();
            let limits = self.limits.current();
            let records = batch.iter().flat_map(move |entry| {
                let items = match &entry.outcome {
                    Outcome::Valid(processed) => processed.trace_items.as_ref(),
                    Outcome::Invalid(_) => None,
                };
                // Numbered before any is left out, so that a retry names each item the same.
                (0..)
                    .zip(items.into_iter().flat_map(|items| items.iter()))
                    .map(move |(n, (_, bytes))| Record {
                        piece: Piece::of(entry, n),
                        topic: &self.topic,
                        key: None,
                        value: bytes.to_vec(),
                    })
            });
            let fitting = records.filter(|record| match over_limit(&limits, record) {
                Some(_) => {
                    // Counted once: marked, the item is not counted again by a retry of the
                    // write, nor by the halves of a batch split to find a refused message (which
                    // share `progress`). It was, at every attempt through an outage. Marked apart
                    // from the item itself, which a retry after the topic's limit was raised
                    // still sends.
                    let counted = Piece {
                        index: record.piece.index | LEFT_OUT,
                        ..record.piece
                    };
                    if !progress.is_stored(counted) {
                        progress.stored(counted);
                        crate::metrics::trace_item_over_topic_limit();
                    }
                    false
                }
                None => true,
            });
            self.publisher.publish(fitting.map(Ok), progress).await
        })
    }
}

/// The trace-items sink, unless the rollout is off. Its health check: the topic exists.
pub fn build(
    args: &TraceItemsArgs,
    producer: &rdkafka::ClientConfig,
    timeout: std::time::Duration,
) -> Result<Option<Built>, SinkError> {
    if args.trace_items_rollout.is_off() {
        return Ok(None);
    }
    let sink = TraceItemsSink {
        publisher: Publisher::new(
            super::publish::producer(producer, "trace_items")?,
            "trace_items",
        ),
        topic: args.trace_items_topic.clone(),
        limits: TopicLimits::new(producer, vec![args.trace_items_topic.clone()], timeout),
    };
    let topics = vec![args.trace_items_topic.clone()];
    let check = super::publish::topics_check(producer, topics, timeout);
    Ok(Some(Built::checked(
        sink,
        "trace_items",
        "the Kafka topic",
        check,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollout_flag_takes_a_share_and_refuses_anything_else() {
        assert_eq!(rollout("0"), Ok(Rollout::OFF));
        assert_eq!(rollout("1.0"), Ok(Rollout::ALL));
        assert!(rollout("0.25").is_ok_and(|r| !r.is_off()));
        for bad in ["1.5", "-0.1", "NaN", "half"] {
            assert!(rollout(bad).is_err(), "{bad}");
        }
    }
}
