//! The consumer's polling thread.
//!
//! librdkafka wants `poll` called continuously (heartbeat of `max.poll.interval.ms`, rebalance
//! callbacks). A dedicated thread polls and forwards owned messages over a bounded data channel
//! to the pipeline; the pipeline pauses partitions (not the thread) for backpressure.
//!
//! Control — assignments and revocations — travels a separate, unbounded channel that the
//! pipeline reads whatever its backpressure, so a revoke never waits behind data. Each
//! revocation starts a new *generation*; every forwarded message carries the generation it was
//! polled in, and the pipeline drops messages (and ignores flushes) of an earlier generation, so
//! nothing is committed for partitions this member no longer owns. On revoke the thread waits —
//! at most the drain deadline — for the pipeline to flush and commit, then lets librdkafka
//! release the partitions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{info, warn};

use crate::health::Status;

/// A polled message, with its share of the data channel's byte budget (released when dropped)
/// and the generation it was polled in.
pub struct Polled {
    pub message: OwnedMessage,
    pub bytes: OwnedSemaphorePermit,
    pub generation: u64,
}

/// Rebalance events, on the control channel.
pub enum Control {
    /// Partitions newly assigned to this member.
    Assigned { partitions: Vec<i32>, generation: u64 },
    /// `partitions` are being revoked; messages of earlier generations are no longer ours.
    /// Drain what can be made durable within the deadline, commit it, then send on `done`.
    Revoke { partitions: Vec<i32>, generation: u64, done: std_mpsc::SyncSender<()> },
}

pub struct IngestContext {
    control: mpsc::UnboundedSender<Control>,
    generation: Arc<AtomicU64>,
    drain_deadline: Duration,
    /// Where the partitions this member owns are kept (and shown in `/status`): the callbacks
    /// below are the one place that changes them.
    status: Arc<Status>,
}

impl IngestContext {
    pub fn new(control: mpsc::UnboundedSender<Control>, drain_deadline: Duration, status: Arc<Status>) -> Self {
        IngestContext { control, generation: Arc::new(AtomicU64::new(0)), drain_deadline, status }
    }

    /// `(partition, lag)` from librdkafka's statistics, reported for owned partitions only;
    /// unknown lags are negative.
    fn report_lag(&self, lags: impl Iterator<Item = (i32, i64)>) {
        let owned = self.status.partitions();
        for (partition, lag) in lags {
            if owned.contains(&partition) && lag >= 0 {
                crate::metrics::lag(partition, lag);
            }
        }
    }

    fn gained(&self, partitions: &[i32]) {
        self.status.assign(partitions);
    }

    /// Zeroes the lag gauge of each partition given away: the exporter keeps sending a gauge's
    /// last value, and the new owner reports the real one.
    fn lost(&self, partitions: &[i32]) {
        self.status.revoke(partitions);
        for &partition in partitions {
            crate::metrics::lag(partition, 0);
        }
    }

    /// The generation counter, shared with the polling thread.
    pub fn generation(&self) -> Arc<AtomicU64> {
        self.generation.clone()
    }
}

impl ClientContext for IngestContext {
    /// librdkafka statistics (every `statistics.interval.ms`): consumer lag of each partition
    /// this member owns. (A revoked partition's gauge was zeroed on revoke; statistics can still
    /// list it, and must not bring back a value its new owner now reports.)
    fn stats(&self, statistics: rdkafka::Statistics) {
        let lags = statistics.topics.values().flat_map(|t| t.partitions.iter().map(|(&p, s)| (p, lag(s))));
        self.report_lag(lags);
    }
}

/// What the group still has to read of a partition: the high watermark minus the committed
/// offset — or, before the group has committed anything there, minus the log start, where it
/// begins (`auto.offset.reset=earliest`); librdkafka's own `consumer_lag` is unknown (-1) then,
/// and a fresh group's backlog went unreported. Negative: unknown (no watermark yet).
fn lag(partition: &rdkafka::statistics::Partition) -> i64 {
    if partition.hi_offset < 0 {
        return -1;
    }
    let from = if partition.committed_offset >= 0 { partition.committed_offset } else { partition.lo_offset.max(0) };
    (partition.hi_offset - from).max(0)
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            let ids = ids(partitions);
            info!(partitions = ?ids, generation, "partitions revoked: draining");
            self.lost(&ids);
            let (done, drained) = std_mpsc::sync_channel(1);
            // The pipeline bounds its own drain by the deadline; the margin covers the hand-over.
            let wait = self.drain_deadline + Duration::from_secs(1);
            let revoke = Control::Revoke { partitions: ids, generation, done };
            if self.control.send(revoke).is_ok() && drained.recv_timeout(wait).is_err() {
                warn!(deadline_ms = self.drain_deadline.as_millis() as u64, "drain did not answer before the deadline");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let ids = ids(partitions);
            self.gained(&ids);
            let generation = self.generation.load(Ordering::Acquire);
            info!(partitions = ?ids, generation, "partitions assigned");
            let _ = self.control.send(Control::Assigned { partitions: ids, generation });
        }
    }
}

fn ids(partitions: &TopicPartitionList) -> Vec<i32> {
    partitions.elements().iter().map(|p| p.partition()).collect()
}

pub type IngestConsumer = BaseConsumer<IngestContext>;

/// Polls until `stop` is set, forwarding messages tagged with the current generation; each first
/// takes its size from `bytes` (all of it for a message larger than the whole budget), so the
/// channel holds a bounded number of bytes. Closing `bytes` stops the thread. Returns the thread
/// handle.
pub fn spawn_poller(
    consumer: Arc<IngestConsumer>,
    events: mpsc::Sender<Polled>,
    bytes: Arc<Semaphore>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let generation = consumer.context().generation();
    let budget = u32::try_from(bytes.available_permits()).unwrap_or(u32::MAX);
    thread::Builder::new()
        .name("kafka-poll".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(message)) => {
                        let size = message.payload().map_or(0, <[u8]>::len);
                        let share = u32::try_from(size).unwrap_or(u32::MAX).clamp(1, budget.max(1));
                        let Ok(permit) = futures::executor::block_on(bytes.clone().acquire_many_owned(share)) else {
                            break;
                        };
                        let polled = Polled {
                            message: message.detach(),
                            bytes: permit,
                            generation: generation.load(Ordering::Acquire),
                        };
                        if events.blocking_send(polled).is_err() {
                            break;
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                    Some(Err(error)) => warn!(%error, "consumer error"),
                }
            }
        })
        .unwrap_or_else(|e| panic!("cannot spawn the Kafka polling thread: {e}"))
}

/// `partitions` of `topic` as a list (for pause and resume).
pub fn partition_list(topic: &str, partitions: &[i32]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for &partition in partitions {
        list.add_partition(topic, partition);
    }
    list
}

/// `(partition, next offset)` pairs as a commit list for `topic`.
pub fn commit_list(topic: &str, positions: &[(i32, i64)]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for &(partition, offset) in positions {
        // Only fails for an invalid offset, and these are real message offsets + 1.
        let _ = list.add_partition_offset(topic, partition, Offset::Offset(offset));
    }
    list
}

/// The message's key and timestamp, for the dead-letter copy.
pub fn key_and_timestamp(message: &OwnedMessage) -> (Option<Vec<u8>>, Option<i64>) {
    (message.key().map(<[u8]>::to_vec), message.timestamp().to_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    fn lag_gauges(snapshotter: &metrics_util::debugging::Snapshotter) -> std::collections::BTreeMap<String, f64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Gauge(v) => {
                    let partition = key.key().labels().find(|l| l.key() == "partition")?.value().to_owned();
                    Some((partition, v.into_inner()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn lag_is_reported_for_owned_partitions_only_and_zeroed_when_one_is_given_away() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let status = Arc::new(Status::default());
            let context = IngestContext::new(mpsc::unbounded_channel().0, Duration::from_secs(1), status.clone());
            context.gained(&[0, 1]);
            context.report_lag([(0, 5), (1, 7), (2, 9), (1, -1)].into_iter());
            assert_eq!(lag_gauges(&snapshotter), [("0".into(), 5.0), ("1".into(), 7.0)].into());
            context.lost(&[1]);
            // Statistics may still list the partition given away, with its last lag.
            context.report_lag([(0, 4), (1, 7)].into_iter());
            assert_eq!(lag_gauges(&snapshotter), [("0".into(), 4.0), ("1".into(), 0.0)].into());
            assert_eq!(status.partitions(), [0].into(), "what /status shows");
        });
    }
}
