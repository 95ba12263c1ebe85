//! Refusals of this process's Kafka credentials: a SASL login or a certificate the brokers
//! refuse, or the brokers' certificate this side does not trust. The startup check names the flag
//! to fix (`sink::publish::check_topics`); afterwards every client reports them through
//! [`record`] into [`crate::health::KAFKA_REFUSALS`], where liveness watches them: each client
//! read the credentials' files when it was created, and librdkafka retries a refused connection
//! for good, so a password or certificate rotated under a running pod would leave it live and
//! ready while it consumes or writes nothing; the restart reads the files again.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Why the brokers will not talk to this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The TLS handshake failed on this side: the brokers' certificate is not trusted.
    Tls,
    /// The brokers ended the handshake with an alert about this client's certificate: none was
    /// given where they require one, or they do not trust it.
    Certificate,
    /// The SASL login was refused.
    Login,
}

impl Refusal {
    pub fn of(code: RDKafkaErrorCode, reason: &str) -> Option<Refusal> {
        let certificate = CERTIFICATE_ALERTS
            .iter()
            .any(|alert| reason.contains(alert));
        match code {
            // The broker's alert arrives during the handshake (TLS 1.2: an SSL error), or as a
            // failed receive on a connection librdkafka retries (TLS 1.3).
            RDKafkaErrorCode::SSL | RDKafkaErrorCode::BrokerTransportFailure if certificate => {
                Some(Refusal::Certificate)
            }
            RDKafkaErrorCode::SSL => Some(Refusal::Tls),
            RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
                Some(Refusal::Login)
            }
            _ => None,
        }
    }
}

/// The TLS alerts a server sends about its client's certificate, as OpenSSL names them in the
/// error librdkafka reports: bad, unsupported, revoked, expired or unknown certificate, unknown
/// CA, certificate required (TLS 1.3).
const CERTIFICATE_ALERTS: [&str; 7] = [
    "SSL alert number 42",
    "SSL alert number 43",
    "SSL alert number 44",
    "SSL alert number 45",
    "SSL alert number 46",
    "SSL alert number 48",
    "SSL alert number 116",
];

/// Records `error` (reported by a client with `reason`) in [`crate::health::KAFKA_REFUSALS`] when
/// it is a refusal of the credentials: a login, a certificate alert about this client's
/// certificate, or a broker's certificate that failed verification here (any other TLS error —
/// a handshake cut by a broker restart — is not). Whether it was one.
pub fn record(error: &KafkaError, reason: &str) -> bool {
    let refused = error
        .rdkafka_error_code()
        .and_then(|code| Refusal::of(code, reason))
        .is_some_and(|refusal| refusal != Refusal::Tls || reason.contains("certificate"));
    if refused {
        crate::health::KAFKA_REFUSALS.record(reason, crate::health::now_ms());
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alert_about_this_clients_certificate_is_a_refusal_and_a_dropped_connection_is_not() {
        let alert = "ssl://127.0.0.1:25329/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42 (after 11ms in state APIVERSION_QUERY)";
        assert_eq!(
            Refusal::of(RDKafkaErrorCode::BrokerTransportFailure, alert),
            Some(Refusal::Certificate)
        );
        let required = "Receive failed: error:0A00045C:SSL routines::tlsv13 alert certificate required: SSL alert number 116";
        assert_eq!(
            Refusal::of(RDKafkaErrorCode::BrokerTransportFailure, required),
            Some(Refusal::Certificate)
        );
        for transient in [
            "ssl://127.0.0.1:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed: Connection refused (after 0ms in state CONNECT)",
            "Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration",
            // A handshake failure alert names no certificate (protocol versions, ciphers).
            "Receive failed: error:0A000410:SSL routines::sslv3 alert handshake failure: SSL alert number 40",
        ] {
            assert_eq!(
                Refusal::of(RDKafkaErrorCode::BrokerTransportFailure, transient),
                None
            );
        }
        assert_eq!(
            Refusal::of(RDKafkaErrorCode::SSL, "certificate verify failed"),
            Some(Refusal::Tls)
        );
        // TLS 1.2: the same alert during the handshake is an SSL error, still the certificate's.
        assert_eq!(
            Refusal::of(RDKafkaErrorCode::SSL, alert),
            Some(Refusal::Certificate)
        );
    }
}
