//! The dead-letter topic: every invalid message's original bytes, with headers saying why —
//! `reason`, `detail`, `original_topic`, `original_partition`, `original_offset`,
//! `original_timestamp`, and `sink` for a valid message a sink rejected (`rejected_by_sink`;
//! `detail` then holds the sink's error). Written as part of the flush, so it is durable before
//! the offset commits.

use std::time::Duration;

use futures::future::join_all;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{DeadLetters, Entries, Entry, InvalidMessage, Outcome, Rejected, Retry, Sink, SinkError, Written};
use crate::kafka::classify_producer_error;
use crate::kafka::consumer::key_and_timestamp;
use crate::kafka::refetch::Refetcher;
use crate::recording::{InvalidRecording, Reason};

#[derive(Clone)]
pub struct DlqSink {
    producer: FutureProducer,
    topic: String,
}

impl DlqSink {
    pub fn new(producer: FutureProducer, topic: impl Into<String>) -> Self {
        DlqSink { producer, topic: topic.into() }
    }
}

/// Dead-letters messages a sink rejected: their original bytes are read again from the consumed
/// topic, then written to the dead-letter topic like any invalid message.
pub struct RejectedToDlq {
    pub dlq: DlqSink,
    pub source: Refetcher,
    pub source_topic: String,
    /// How long one original message may take to read again.
    pub timeout: Duration,
}

impl DeadLetters for RejectedToDlq {
    fn dead_letter(&self, rejected: &[Rejected]) -> Result<Written, SinkError> {
        let mut entries = Vec::with_capacity(rejected.len());
        for r in rejected {
            let original = self
                .source
                .fetch(r.partition, r.offset, self.timeout)
                .map_err(|e| SinkError::new("rejected", Retry::Retryable, e))?;
            let (key, timestamp) = key_and_timestamp(&original);
            let error =
                InvalidRecording::new(Reason::RejectedBySink, format_args!("{}: {}", r.error.sink, r.error.message));
            let value = original.payload().unwrap_or_default().to_vec();
            let message = InvalidMessage {
                error,
                value,
                key,
                topic: self.source_topic.clone(),
                timestamp,
                rejected_by: Some(r.error.sink),
            };
            entries.push(Entry {
                partition: r.partition,
                offset: r.offset,
                outcome: Outcome::Invalid(Box::new(message)),
            });
        }
        self.dlq.write(&entries)
    }
}

impl Sink for DlqSink {
    fn name(&self) -> &'static str {
        "dlq"
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(entry.outcome, Outcome::Invalid(_))
    }

    fn write(&self, batch: &[Entry]) -> Result<Written, SinkError> {
        let mut deliveries = Vec::new();
        let mut written = Written::default();
        for (entry, message) in batch.invalid() {
            let partition = entry.partition.to_string();
            let offset = entry.offset.to_string();
            let timestamp = message.timestamp.map(|t| t.to_string()).unwrap_or_default();
            let headers = OwnedHeaders::new()
                .insert(Header { key: "reason", value: Some(message.error.reason.as_str()) })
                .insert(Header { key: "detail", value: Some(message.error.detail.as_str()) })
                .insert(Header { key: "original_topic", value: Some(message.topic.as_str()) })
                .insert(Header { key: "original_partition", value: Some(partition.as_str()) })
                .insert(Header { key: "original_offset", value: Some(offset.as_str()) })
                .insert(Header { key: "original_timestamp", value: Some(timestamp.as_str()) });
            let headers = match message.rejected_by {
                Some(sink) => headers.insert(Header { key: "sink", value: Some(sink) }),
                None => headers,
            };
            let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).payload(&message.value).headers(headers);
            if let Some(key) = &message.key {
                record = record.key(key.as_slice());
            }
            let delivery = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| SinkError::new(self.name(), classify_producer_error(&e), e))?;
            deliveries.push(delivery);
            written.items += 1;
            written.bytes += message.value.len() as u64;
        }
        if deliveries.is_empty() {
            return Ok(written);
        }
        self.producer.poll(Duration::ZERO);
        for delivery in futures::executor::block_on(join_all(deliveries)) {
            match delivery {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(SinkError::new(self.name(), classify_producer_error(&e), e)),
                Err(_cancelled) => {
                    return Err(SinkError::new(self.name(), Retry::Retryable, "producer dropped the delivery"));
                }
            }
        }
        Ok(written)
    }
}
