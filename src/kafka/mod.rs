//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns
//! (and, with the consumer group protocol, whether it can count on it while its coordinator is
//! out of reach),
//! the bound on messages in transit to the pipeline, the records it hands over, re-reading single
//! messages, and the producer every sink and tool publishes with.

pub mod consumer;
pub mod coordinator;
pub mod handoff;
pub mod ownership;
pub mod pause;
pub mod producer;
pub mod record;
pub mod refetch;
