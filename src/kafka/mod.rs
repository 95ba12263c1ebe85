//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns,
//! the bound on messages in transit to the pipeline, and re-reading single messages.

pub mod consumer;
pub mod handoff;
pub mod ownership;
pub mod refetch;
