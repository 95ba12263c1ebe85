//! The dead-letter topic: every invalid message's original bytes, with headers saying why —
//! `reason`, `detail`, `original_topic`, `original_partition`, `original_offset`,
//! `original_timestamp`. Written as part of the flush, so it is durable before the offset commits.

use std::time::Duration;

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{Batch, Retry, Sink, SinkError, Written};
use crate::kafka::classify_producer_error;

pub struct DlqSink {
    producer: FutureProducer,
    topic: String,
}

impl DlqSink {
    pub fn new(producer: FutureProducer, topic: impl Into<String>) -> Self {
        DlqSink { producer, topic: topic.into() }
    }
}

impl Sink for DlqSink {
    fn name(&self) -> &'static str {
        "dlq"
    }

    fn write(&self, batch: &Batch) -> Result<Written, SinkError> {
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
