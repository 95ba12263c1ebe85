//! The consumer's polling thread.
//!
//! librdkafka wants `poll` called continuously (heartbeat of `max.poll.interval.ms`, rebalance
//! callbacks). A dedicated thread polls and forwards owned messages over a bounded channel to the
//! pipeline; the pipeline pauses partitions (not the thread) for backpressure. Rebalance callbacks
//! run on this thread: on revoke it hands the pipeline a drain request *behind* every message
//! already forwarded and waits — up to the drain deadline — until the pipeline has flushed and
//! committed, then lets librdkafka release the partitions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{info, warn};

/// What the polling thread hands the pipeline, in order.
pub enum Polled {
    /// A message, with its share of the channel's byte budget (released when dropped).
    Message(OwnedMessage, OwnedSemaphorePermit),
    /// Partitions newly assigned to this member.
    Assigned(Vec<i32>),
    /// The assignment is being revoked: drain, commit, then send on `done`.
    Revoke { done: std_mpsc::SyncSender<()> },
}

pub struct IngestContext {
    events: mpsc::Sender<Polled>,
    drain_deadline: Duration,
}

impl IngestContext {
    pub fn new(events: mpsc::Sender<Polled>, drain_deadline: Duration) -> Self {
        IngestContext { events, drain_deadline }
    }
}

impl ClientContext for IngestContext {
    /// librdkafka statistics (every `statistics.interval.ms`): consumer lag per partition.
    fn stats(&self, statistics: rdkafka::Statistics) {
        for topic in statistics.topics.values() {
            for (&partition, stats) in &topic.partitions {
                if partition >= 0 && stats.consumer_lag >= 0 {
                    crate::metrics::lag(partition, stats.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            info!(partitions = partitions.count(), "partitions revoked: draining");
            let (done, drained) = std_mpsc::sync_channel(1);
            if self.events.blocking_send(Polled::Revoke { done }).is_ok()
                && drained.recv_timeout(self.drain_deadline).is_err()
            {
                warn!(deadline_ms = self.drain_deadline.as_millis() as u64, "drain did not finish before the deadline");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let ids: Vec<i32> = partitions.elements().iter().map(|p| p.partition()).collect();
            info!(partitions = ?ids, "partitions assigned");
            let _ = self.events.blocking_send(Polled::Assigned(ids));
        }
    }
}

pub type IngestConsumer = BaseConsumer<IngestContext>;

/// Polls until `stop` is set, forwarding messages; each first takes its size from `bytes` (all
/// of it for a message larger than the whole budget), so the channel holds a bounded number of
/// bytes. Closing `bytes` stops the thread. Returns the thread handle.
pub fn spawn_poller(
    consumer: Arc<IngestConsumer>,
    events: mpsc::Sender<Polled>,
    bytes: Arc<Semaphore>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
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
                        if events.blocking_send(Polled::Message(message.detach(), permit)).is_err() {
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
