//! Kafka plumbing: the consumer's polling thread and rebalance callbacks,
//! producer error classification, and the `produce` load command.

pub mod consumer;
pub mod load;
pub mod refetch;

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};

use crate::sink::{Retry, SinkError};

/// Retry classification for producer errors: the message itself is unacceptable → rejected;
/// not allowed to write → fatal; anything about the broker, network or queues → retryable.
pub fn classify_producer_error(error: &KafkaError) -> Retry {
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord,
        ) => Retry::Rejected,
        Some(RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// The startup check for topics: every one of `topics` exists. Reads the metadata of all topics,
/// because asking for one by name creates it on brokers that auto-create topics. An unreachable
/// cluster is transient; a missing topic is configuration.
pub fn check_topics(producer: &FutureProducer, topics: &[String], timeout: Duration) -> Result<(), SinkError> {
    let metadata = producer.client().fetch_metadata(None, timeout).map_err(|e| {
        SinkError::new("kafka", classify_producer_error(&e), format_args!("reading topic metadata: {e}"))
    })?;
    let missing: Vec<&str> = topics
        .iter()
        .map(String::as_str)
        .filter(|name| !metadata.topics().iter().any(|t| t.name() == *name && t.error().is_none()))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(SinkError::new(
            "kafka",
            Retry::Fatal,
            format_args!("topics missing on the cluster: {}", missing.join(", ")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_messages_are_rejected_unauthorised_ones_fatal_and_broker_trouble_retried() {
        let oversized = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify_producer_error(&oversized), Retry::Rejected);
        let auth = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(classify_producer_error(&auth), Retry::Fatal);
        for code in
            [RDKafkaErrorCode::QueueFull, RDKafkaErrorCode::MessageTimedOut, RDKafkaErrorCode::BrokerTransportFailure]
        {
            assert_eq!(classify_producer_error(&KafkaError::MessageProduction(code)), Retry::Retryable, "{code:?}");
        }
    }
}
