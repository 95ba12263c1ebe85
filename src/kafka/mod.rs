//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns
//! (and, with the consumer group protocol, whether it can count on it while its coordinator is
//! out of reach),
//! the bound on messages in transit to the pipeline, the records it hands over, re-reading single
//! messages, the producer every sink and tool publishes with, and refusals of the credentials.

pub mod consumer;
pub mod coordinator;
pub mod handoff;
pub mod ownership;
pub mod pause;
pub mod producer;
pub mod record;
pub mod refetch;
pub mod refusal;

/// How long to wait for what librdkafka should answer within `timeout` (the request and delivery
/// timeout it was given) before taking the brokers for gone: twice that, and 5 s more, as
/// librdkafka looks for timed-out records once a second and reports them on the next poll.
/// librdkafka bounds neither of two waits: a delivery whose request was in flight when the broker
/// stopped answering (the idempotent producer keeps it, past `message.timeout.ms`, to send again
/// once it answers), and a commit's answer. Either held its caller for good.
pub fn answer_deadline(timeout: std::time::Duration) -> std::time::Duration {
    timeout * 2 + std::time::Duration::from_secs(5)
}
