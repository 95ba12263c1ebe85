//! Kafka plumbing: the consumer's polling thread and rebalance callbacks, what the member owns
//! (and, with the consumer group protocol, whether it can count on it while its coordinator is
//! out of reach),
//! the bound on messages in transit to the pipeline, the records it hands over, the positions it
//! commits and checks against a log cut back, re-reading single messages, the producer every sink and tool publishes with, refusals of the credentials, and
//! the levels librdkafka's own lines are logged at, and how often its errors are.

pub mod consumer;
pub mod coordinator;
pub mod handoff;
pub mod ownership;
pub mod pause;
pub mod position;
pub mod producer;
pub mod record;
pub mod refetch;
pub mod refusal;
pub mod topic_id;

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
/// meets it too), or the client's fatal error (it does nothing more): ERROR. Each kind (its
/// `kind` field) is logged once in 30 s ([`crate::logs::CLIENT_ERRORS`]); the next line of it,
/// or one of its own once the 30 s are over, says how many were held back.
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
    let kind = error_kind(client, error, reason);
    let Some(held_back) = crate::logs::CLIENT_ERRORS.admit(&kind) else {
        return;
    };
    if refused {
        tracing::error!(%error, reason, kind, held_back, "librdkafka ({client}): retrying does not get past this");
    } else {
        tracing::warn!(%error, reason, kind, held_back, "librdkafka ({client}): retried by the client");
    }
}

/// The kind of an error `client` reports: the client, the error's code and its reason without
/// what changes from one report of the same trouble to the next — librdkafka's asides in
/// brackets ("(after 0ms in state CONNECT, 3 identical error(s) suppressed)", "(average rtt
/// 501.231ms)") and every number after the broker the reason starts with (the count in "2/2
/// brokers are down" or "3 request(s) timed out", the address a broker's name resolved to). The
/// broker stays: a second broker failing is a kind of its own.
fn error_kind(client: &str, error: &rdkafka::error::KafkaError, reason: &str) -> String {
    let code = error
        .rdkafka_error_code()
        .map_or_else(|| error.to_string(), |code| format!("{code:?}"));
    let reason = reason.split(" (").next().unwrap_or(reason);
    // "b-1.kafka:9092/1: …", "GroupCoordinator: …"; none in "2/2 brokers are down".
    let (broker, rest) = match reason.split_once(": ") {
        Some((broker, rest)) if !broker.contains(' ') => (format!("{broker}: "), rest),
        _ => (String::new(), reason),
    };
    let rest: String = rest.chars().filter(|c| !c.is_ascii_digit()).collect();
    format!("librdkafka ({client}): {code}: {broker}{rest}")
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    /// Reports of one trouble are one kind, whatever librdkafka counts in them; another broker,
    /// client or error is another kind.
    #[test]
    fn an_errors_kind_leaves_out_what_changes_between_reports_of_one_trouble() {
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(
            error_kind("the consumer", &down, "0/2 brokers are down"),
            error_kind("the consumer", &down, "2/2 brokers are down")
        );
        let refused = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        let kind = |reason| error_kind("a producer", &refused, reason);
        assert_eq!(
            kind(
                "b1:9092/1: 3 request(s) timed out: disconnect (average rtt 501.231ms) (after 30001ms in state UP)"
            ),
            kind(
                "b1:9092/1: 17 request(s) timed out: disconnect (average rtt 12.5ms) (after 30004ms in state UP)"
            )
        );
        assert_eq!(
            kind("b1:9092/1: Connect to ipv4#10.0.0.1:9092 failed: Connection refused"),
            kind("b1:9092/1: Connect to ipv4#10.0.7.9:9092 failed: Connection refused"),
            "the address the broker's name resolved to"
        );
        assert_eq!(
            kind(
                "b1:9092/1: Connect to ipv4#10.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)"
            ),
            kind(
                "b1:9092/1: Connect to ipv4#10.0.0.1:9092 failed: Connection refused (after 12ms in state CONNECT, 3 identical error(s) suppressed)"
            )
        );
        assert_ne!(
            kind("b1:9092/1: Connect to ipv4#10.0.0.1:9092 failed: Connection refused"),
            kind("b2:9092/2: Connect to ipv4#10.0.0.2:9092 failed: Connection refused"),
            "another broker"
        );
        assert_ne!(
            error_kind("the consumer", &refused, "x"),
            error_kind("a producer", &refused, "x")
        );
        assert_ne!(
            error_kind("a producer", &down, "x"),
            error_kind("a producer", &refused, "x")
        );
    }
}
