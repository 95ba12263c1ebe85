//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, and re-reading single
//! messages.

pub mod consumer;
pub mod refetch;
