//! Re-reads single messages from the consumed topic by partition and offset. A processed segment
//! does not keep its original bytes (that would double what the buffer holds); when a sink
//! rejects a message at flush time, its bytes are read again from Kafka — it is not committed
//! yet, so it is still there — to be dead-lettered whole.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// A consumer that assigns itself the one partition it reads (librdkafka wants a group id for
/// that, but it never joins the group or commits), used one fetch at a time.
pub struct Refetcher {
    consumer: Mutex<BaseConsumer>,
    topic: String,
}

impl Refetcher {
    /// `config` carries the brokers and security settings; `group` names the (never joined)
    /// group librdkafka requires for an assignment.
    pub fn new(mut config: ClientConfig, topic: &str, group: &str) -> Result<Self, KafkaError> {
        config.set("group.id", group).set("enable.auto.commit", "false").set("enable.partition.eof", "false");
        Ok(Refetcher { consumer: Mutex::new(config.create()?), topic: topic.to_owned() })
    }

    /// The message at `offset` of `partition`, waiting at most `timeout` for it.
    pub fn fetch(&self, partition: i32, offset: i64, timeout: Duration) -> Result<OwnedMessage, String> {
        // One fetch at a time; a panic elsewhere cannot leave the consumer inconsistent.
        let consumer = self.consumer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut position = TopicPartitionList::new();
        position
            .add_partition_offset(&self.topic, partition, Offset::Offset(offset))
            .map_err(|e| format!("offset {offset}: {e}"))?;
        consumer.assign(&position).map_err(|e| format!("assigning {}/{partition}: {e}", self.topic))?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) if message.partition() == partition && message.offset() == offset => {
                    return Ok(message.detach());
                }
                Some(Ok(_)) | None => {}
                Some(Err(error)) => return Err(format!("reading {}/{partition}@{offset}: {error}", self.topic)),
            }
        }
        Err(format!("{}/{partition}@{offset} not read within {timeout:?}", self.topic))
    }
}
