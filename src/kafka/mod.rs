//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, re-reading single
//! messages, and the `produce` load command.

pub mod consumer;
pub mod load;
pub mod refetch;
