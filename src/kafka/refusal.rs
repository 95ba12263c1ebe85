//! Refusals of this process's Kafka credentials: a SASL login or a certificate the brokers
//! refuse, or the brokers' certificate this side does not trust. The startup check names the flag
//! to fix (`sink::publish::check_topics`); afterwards every client reports them through
//! [`record`] into [`crate::health::KAFKA_REFUSALS`], where liveness watches them: each client
//! read the credentials' files when it was created, and librdkafka retries a refused connection
//! for good, so a password or certificate rotated under a running pod would leave it live and
//! ready while it consumes or writes nothing; once a file has changed, the restart reads it again.

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
/// it is a refusal of the credentials: a login the brokers refused, a certificate alert about
/// this client's certificate, or a broker's certificate that failed verification here. Not a
/// SASL handshake cut short (librdkafka reports it as an authentication error whose reason is a
/// local one, `Local: Broker transport failure`), nor any other TLS error (a handshake cut by a
/// broker restart). Whether it was one.
pub fn record(error: &KafkaError, reason: &str) -> bool {
    let refused = error
        .rdkafka_error_code()
        .and_then(|code| Refusal::of(code, reason))
        .is_some_and(|refusal| match refusal {
            Refusal::Login => !reason.contains("Local: "),
            Refusal::Certificate => true,
            Refusal::Tls => {
                reason.contains("certificate verify failed")
                    || reason.contains("could not be verified")
            }
        });
    if refused {
        crate::health::KAFKA_REFUSALS.record(reason, crate::health::now_ms());
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_brokers_refuse_is_recorded_not_a_handshake_cut_short() {
        let global = |code| KafkaError::Global(code);
        for (code, reason, refused) in [
            (
                RDKafkaErrorCode::Authentication,
                "SASL authentication error: Authentication failed: Invalid username or password (after 2ms in state AUTH_REQ)",
                true,
            ),
            (
                RDKafkaErrorCode::Authentication,
                "127.0.0.1:9094/1: SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker transport failure: broker's supported mechanisms: (after 3ms in state AUTH_HANDSHAKE)",
                false,
            ),
            (
                RDKafkaErrorCode::SSL,
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (after 5ms in state SSL_HANDSHAKE)",
                true,
            ),
            (
                RDKafkaErrorCode::SSL,
                "SSL handshake failed: unexpected eof while reading (after 2ms in state SSL_HANDSHAKE)",
                false,
            ),
            (
                RDKafkaErrorCode::BrokerTransportFailure,
                "Connect to ipv4#127.0.0.1:9093 failed: Connection refused (after 0ms in state CONNECT)",
                false,
            ),
        ] {
            assert_eq!(record(&global(code), reason), refused, "{reason}");
        }
    }

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
