//! Re-reads single messages from the consumed topic by partition and offset. A processed segment
//! does not keep its original bytes (that would double what the buffer holds); when a sink
//! rejects a message at flush time, its bytes are read again from Kafka — it is not committed
//! yet, so it is normally still there — to be dead-lettered whole. Normally: a flush retried for
//! longer than the topic's retention (or records deleted by an operator) can find it gone, which
//! is told apart from a slow read ([`RefetchError::Gone`]) so that the flush does not retry a read
//! that can never succeed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::Logged;
use super::record::Record;

/// How much a read fetches ahead of the message it wants, KiB (librdkafka's default is 64 MiB).
const READ_AHEAD_KIB: usize = 1 << 10;

/// Events left from before a read that it throws away, at most: errors the client reported
/// between reads (a broker restarting), which are not this read's answer.
const STALE_EVENTS: usize = 10_000;

/// A consumer that assigns itself the one partition it reads (librdkafka wants a group id for
/// that, and looks up its coordinator, but it never joins the group, fetches committed offsets
/// or commits), used one fetch at a time. Between reads it
/// holds no partition: it fetches nothing, and keeps nothing fetched.
pub struct Refetcher {
    consumer: Mutex<BaseConsumer<Logged>>,
    topic: String,
}

impl Refetcher {
    /// `config` carries the brokers and security settings; `group` names the (never joined)
    /// group librdkafka requires for an assignment.
    pub fn new(mut config: ClientConfig, topic: &str, group: &str) -> Result<Self, KafkaError> {
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // An offset out of range is an error to report, not a jump to the log's end.
            .set("auto.offset.reset", "error")
            // One message is read at a time: what is fetched ahead of it is thrown away.
            .set("queued.max.messages.kbytes", READ_AHEAD_KIB.to_string());
        Ok(Refetcher {
            consumer: Mutex::new(config.create_with_context(Logged("the re-reading consumer"))?),
            topic: topic.to_owned(),
        })
    }

    /// The message at `offset` of `partition`, waiting at most `timeout` for it (the watermark
    /// query included).
    pub fn fetch(
        &self,
        partition: i32,
        offset: i64,
        timeout: Duration,
    ) -> Result<Record, RefetchError> {
        let at = || Position {
            topic: self.topic.clone(),
            partition,
            offset,
        };
        // One fetch at a time; a panic elsewhere cannot leave the consumer inconsistent.
        let consumer = self
            .consumer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // What the client reported since the last read (a broker that restarted meanwhile) is
        // not about this one: a broker down now fails it below.
        for _ in 0..STALE_EVENTS {
            if consumer.poll(Duration::ZERO).is_none() {
                break;
            }
        }
        let read = read(&consumer, &self.topic, partition, offset, timeout, at);
        // Whatever the outcome: nothing more is fetched until the next read.
        if let Err(error) = consumer.unassign() {
            tracing::warn!(%error, "the reader of rejected messages could not let go of its partition");
        }
        read
    }
}

/// The message at `offset` of `partition`, waiting at most `timeout` for it.
fn read(
    consumer: &BaseConsumer<Logged>,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
    at: impl Fn() -> Position,
) -> Result<Record, RefetchError> {
    let deadline = Instant::now() + timeout;
    // Outside the partition's offsets the message is gone: below the first, deleted
    // (retention, an operator); at or past the end, cut back by a leader that did not have it
    // (this service read it, so it was below the end once). Polling would only time out.
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|source| RefetchError::Kafka { at: at(), source })?;
    if offset < low || offset >= high {
        return Err(RefetchError::Gone {
            at: at(),
            next: if offset < low { low } else { high },
        });
    }
    let mut position = TopicPartitionList::new();
    position
        .add_partition_offset(topic, partition, Offset::Offset(offset))
        .and_then(|()| consumer.assign(&position))
        .map_err(|source| RefetchError::Kafka { at: at(), source })?;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) if message.partition() == partition && message.offset() == offset => {
                return Ok(Record::copy_of(&message));
            }
            // The log skips the offset (compacted away, or cut back by a leader that did
            // not have it): it will not come however long the read waits.
            Some(Ok(message)) if message.partition() == partition && message.offset() > offset => {
                return Err(RefetchError::Gone {
                    at: at(),
                    next: message.offset(),
                });
            }
            Some(Ok(_)) | None => {}
            // The client's trouble with some broker (one restarting, an address that does not
            // answer) is not this read's answer: it goes on until its deadline, and a broker
            // that is down makes it time out (retried like any sink request).
            Some(Err(source)) if about_a_broker(&source) => {
                tracing::debug!(error = %source, at = %at(), "reading a message again: the client reports");
            }
            Some(Err(source)) => return Err(RefetchError::Kafka { at: at(), source }),
        }
    }
    Err(RefetchError::Timeout { at: at(), timeout })
}

/// Whether `error` is the client's report about a connection to some broker, rather than about
/// the partition read.
pub(crate) fn about_a_broker(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{
        AllBrokersDown, BrokerTransportFailure, NetworkException, Resolve,
    };
    matches!(
        error.rdkafka_error_code(),
        Some(BrokerTransportFailure | AllBrokersDown | Resolve | NetworkException)
    )
}

/// Where a message is: `topic/partition@offset`.
#[derive(Debug, Clone)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// Why a message could not be read again.
#[derive(Debug, thiserror::Error)]
pub enum RefetchError {
    #[error("reading {at}: {source}")]
    Kafka { at: Position, source: KafkaError },
    #[error("{at} not read within {timeout:?}")]
    Timeout { at: Position, timeout: Duration },
    /// Not in the topic any more (retention, records deleted, compaction, a log cut back): the
    /// first message of the partition after it is at `next` (or will be, for a log cut back).
    #[error("{at} is no longer in the topic (the next message there is at offset {next})")]
    Gone { at: Position, next: i64 },
}
