//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns,
//! the bound on messages in transit to the pipeline, the records it hands over, re-reading single
//! messages, and the producer every sink and tool publishes with.

pub mod consumer;
pub mod handoff;
pub mod ownership;
pub mod producer;
pub mod record;
pub mod refetch;
