//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns
//! (and, with the consumer group protocol, whether it can count on it while its coordinator is
//! out of reach),
//! the bound on messages in transit to the pipeline, the records it hands over, re-reading single
//! messages, the producer every sink and tool publishes with, refusals of the credentials, and
//! the levels librdkafka's own lines are logged at, and how often its errors are.

pub mod consumer;
pub mod coordinator;
pub mod handoff;
pub mod ownership;
pub mod pause;
pub mod producer;
pub mod record;
pub mod refetch;
pub mod refusal;
pub mod repeats;

/// How long to wait for what librdkafka should answer within `timeout` (the request and delivery
/// timeout it was given) before taking the brokers for gone: twice that, and 5 s more, as
/// librdkafka looks for timed-out records once a second and reports them on the next poll.
/// librdkafka bounds neither of two waits: a delivery whose request was in flight when the broker
/// stopped answering (the idempotent producer keeps it, past `message.timeout.ms`, to send again
/// once it answers), and a commit's answer. Either held its caller for good.
pub fn answer_deadline(timeout: std::time::Duration) -> std::time::Duration {
    timeout * 2 + std::time::Duration::from_secs(5)
}

/// librdkafka's own log lines, as events of target `librdkafka` (as rdkafka's default logs them,
/// but for one kind). librdkafka logs a connection it lost or could not make at `LOG_ERR`, with
/// the facility `FAIL`: a broker restart or a rolling upgrade wrote a burst of ERROR lines no one
/// had to act on, as it reconnects by itself. Those come at WARN. What retrying does not get past
/// (credentials or a certificate refused, a fatal error) reaches the clients' error callbacks
/// too, which log it at ERROR ([`client_error`]); librdkafka's other `LOG_ERR` lines (an assignor
/// that fails, no usable produce request version) stay ERROR.
pub fn log_line(level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
    use rdkafka::config::RDKafkaLogLevel as Level;
    match level {
        Level::Error if facility == "FAIL" => {
            tracing::warn!(target: "librdkafka", "librdkafka: {facility} {line}")
        }
        Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {facility} {line}")
        }
        Level::Warning => {
            tracing::warn!(target: "librdkafka", "librdkafka: {facility} {line}")
        }
        Level::Notice | Level::Info => {
            tracing::info!(target: "librdkafka", "librdkafka: {facility} {line}")
        }
        Level::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {facility} {line}"),
    }
}

/// An error librdkafka reports to a client's error callback, from `client` (`the consumer`, `a
/// producer`, …). A broker restarting, moving or unreachable: it retries by itself, WARN. A
/// refusal of the credentials, recorded for liveness ([`refusal`]), an ACL the brokers refuse
/// (the member stops on a group's or its topic's; a re-reading consumer, sharing the group,
/// meets it too), or the client's fatal error (it does nothing more): ERROR. The same error of
/// the same client is logged once in [`repeats::REPEAT_WINDOW`]; the line after says how many
/// came meanwhile (`repeated`).
pub fn client_error(client: &str, error: &rdkafka::error::KafkaError, reason: &str) {
    use rdkafka::types::RDKafkaErrorCode::{
        ClusterAuthorizationFailed, Fatal, GroupAuthorizationFailed, TopicAuthorizationFailed,
    };
    let refused = refusal::record(error, reason)
        || matches!(
            error.rdkafka_error_code(),
            Some(
                Fatal
                    | GroupAuthorizationFailed
                    | TopicAuthorizationFailed
                    | ClusterAuthorizationFailed
            )
        );
    let code = error
        .rdkafka_error_code()
        .map_or_else(|| error.to_string(), |code| format!("{code:?}"));
    let Some(repeated) = repeats::admit(repeats::kind(client, &code, reason)) else {
        return;
    };
    if refused {
        tracing::error!(%error, reason, repeated, "librdkafka ({client}): retrying does not get past this");
    } else {
        tracing::warn!(%error, reason, repeated, "librdkafka ({client}): retried by the client");
    }
}

/// The context of a client that needs nothing but librdkafka's lines and errors logged at the
/// levels above: the consumer that re-reads single messages, the admin client.
#[derive(Default)]
pub struct Logged(pub &'static str);

impl rdkafka::ClientContext for Logged {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
        log_line(level, facility, line);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(self.0, &error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for Logged {}
