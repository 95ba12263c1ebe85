//! The one typed configuration: CLI flags, each also a `REPLAY_INGEST_*` environment variable.
//! Every knob says its trade-off in `--help`; `validate` rejects combinations that cannot work.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};
use rdkafka::ClientConfig;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::BaseProducer;

use crate::kafka::consumer::STATISTICS_INTERVAL;
use crate::pipeline::buffer::BufferLimits;
use crate::pipeline::flush::RetryPolicy;
use crate::recording::{DEFAULT_MAX_DECOMPRESSED_BYTES, Limits, MAX_ROWS_PER_SEGMENT, RowLimits};
use crate::secret::Secret;
pub use crate::sink::clickhouse::ClickHouseArgs;
pub use crate::sink::events::EventsArgs;
pub use crate::sink::gcs::GcsArgs;
pub use crate::sink::trace_items::TraceItemsArgs;

/// The largest segment body decompressed: by `consume`, and by `delete` reading a replay's time
/// back from its blobs (the same variable, so a tool Job reads what its release wrote).
#[derive(Args, Debug, Clone, Copy)]
pub struct DecompressionArgs {
    /// Largest decompressed segment body, in bytes. `consume` rejects larger bodies as
    /// `too_large` (never truncated), which bounds the memory one message can take while it is
    /// processed; `delete` reads no replay time from a larger blob.
    #[arg(long, env = "REPLAY_INGEST_MAX_DECOMPRESSED_BYTES", value_parser = RangedU64ValueParser::<usize>::new().range(1..=17_179_869_184), default_value_t = DEFAULT_MAX_DECOMPRESSED_BYTES)]
    pub max_decompressed_bytes: usize,
}

/// Per-message processing limits.
#[derive(Args, Debug, Clone, Copy)]
pub struct LimitArgs {
    #[command(flatten)]
    pub decompression: DecompressionArgs,
    /// Most click rows written per segment (at most 100); further clicks are counted but not
    /// stored.
    #[arg(long, env = "REPLAY_INGEST_MAX_CLICKS_PER_SEGMENT", value_parser = RangedU64ValueParser::<usize>::new().range(0..=MAX_ROWS_PER_SEGMENT as u64), default_value_t = RowLimits::default().max_clicks)]
    pub max_clicks_per_segment: usize,
    /// Most tap rows written per segment (at most 100).
    #[arg(long, env = "REPLAY_INGEST_MAX_TAPS_PER_SEGMENT", value_parser = RangedU64ValueParser::<usize>::new().range(0..=MAX_ROWS_PER_SEGMENT as u64), default_value_t = RowLimits::default().max_taps)]
    pub max_taps_per_segment: usize,
}

impl LimitArgs {
    /// The per-message limits; `republish_replay_event` with `--rows-sink snuba`; no trace items
    /// (`TraceItemsArgs` sets their rollout).
    pub fn limits(&self, republish_replay_event: bool) -> Limits {
        Limits {
            max_decompressed_bytes: self.decompression.max_decompressed_bytes,
            rows: RowLimits {
                max_clicks: self.max_clicks_per_segment,
                max_taps: self.max_taps_per_segment,
            },
            republish_replay_event,
            trace_items: crate::recording::Rollout::OFF,
        }
    }
}

/// Kafka connection settings shared by the consumer and producers.
#[derive(Args, Debug, Clone)]
pub struct KafkaArgs {
    /// Bootstrap brokers, comma-separated `host:port`.
    #[arg(
        long,
        env = "REPLAY_INGEST_KAFKA_BROKERS",
        default_value = "127.0.0.1:9092"
    )]
    pub brokers: String,
    /// How clients talk to the brokers: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_SECURITY_PROTOCOL", value_enum, ignore_case = true, default_value_t = SecurityProtocol::Plaintext)]
    pub kafka_security_protocol: SecurityProtocol,
    /// SASL mechanism (with a SASL_* protocol): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(
        long,
        env = "REPLAY_INGEST_KAFKA_SASL_MECHANISM",
        value_enum,
        ignore_case = true
    )]
    pub kafka_sasl_mechanism: Option<SaslMechanism>,
    /// SASL user name.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,
    /// SASL password: from a Secret-backed variable; never on a command line or in a ConfigMap.
    #[arg(
        long,
        env = "REPLAY_INGEST_KAFKA_SASL_PASSWORD",
        hide_env_values = true
    )]
    pub kafka_sasl_password: Option<Secret>,
    /// File holding the SASL password (a mounted Kubernetes Secret); wins over the variable.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_SASL_PASSWORD_FILE")]
    pub kafka_sasl_password_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign the brokers' certificates; the system's trust store
    /// otherwise.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_SSL_CA_LOCATION")]
    pub kafka_ssl_ca_location: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that authenticate clients by TLS (mTLS).
    #[arg(
        long,
        env = "REPLAY_INGEST_KAFKA_SSL_CERTIFICATE_LOCATION",
        requires = "kafka_ssl_key_location"
    )]
    pub kafka_ssl_certificate_location: Option<PathBuf>,
    /// Private key (PEM) of the client certificate.
    #[arg(
        long,
        env = "REPLAY_INGEST_KAFKA_SSL_KEY_LOCATION",
        requires = "kafka_ssl_certificate_location"
    )]
    pub kafka_ssl_key_location: Option<PathBuf>,
    /// File holding the private key's passphrase, if it has one.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_SSL_KEY_PASSWORD_FILE")]
    pub kafka_ssl_key_password_file: Option<PathBuf>,
    /// Extra librdkafka properties `key=value`, applied last (override any default here). Repeat
    /// the flag, or put one per line in the environment variable; values may contain commas
    /// (`debug=cgrp,fetch`). Secrets are refused here: they have their own `*_FILE` settings.
    #[arg(
        long = "kafka-property",
        env = "REPLAY_INGEST_KAFKA_PROPERTIES",
        value_delimiter = '\n',
        hide_env_values = true
    )]
    pub properties: Vec<String>,
}

/// Why a client could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
    /// A mounted secret could not be read (the message names the file).
    #[error("{0}")]
    SecretFile(#[from] std::io::Error),
}

/// `security.protocol`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    #[value(name = "PLAINTEXT")]
    Plaintext,
    #[value(name = "SSL")]
    Ssl,
    #[value(name = "SASL_PLAINTEXT")]
    SaslPlaintext,
    #[value(name = "SASL_SSL")]
    SaslSsl,
}

/// The name a flag value is given on the command line — librdkafka's name for it.
fn value_name(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

impl SecurityProtocol {
    fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// `sasl.mechanism`: those librdkafka implements itself (GSSAPI needs Cyrus SASL, not built in).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    #[value(name = "PLAIN")]
    Plain,
    #[value(name = "SCRAM-SHA-256")]
    ScramSha256,
    #[value(name = "SCRAM-SHA-512")]
    ScramSha512,
}

/// Property keys that hold secrets: refused in `--kafka-property`, whose variable lives in a
/// ConfigMap and whose flag shows in `ps`.
fn is_secret_property(key: &str) -> bool {
    [
        "password",
        "secret",
        "passphrase",
        "private.key",
        "ssl.key.pem",
        "sasl.oauthbearer.config",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// The context of the clients [`KafkaArgs::check_properties`] makes: they reach no broker, and
/// their logs (no broker configured, …) would only mislead.
pub struct Unheard;

impl rdkafka::ClientContext for Unheard {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, _: &str, _: &str) {}
}

impl rdkafka::consumer::ConsumerContext for Unheard {}

impl rdkafka::producer::ProducerContext for Unheard {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Property keys a flag sets (librdkafka's aliases included): given in `--kafka-property`, the
/// value would reach librdkafka past the flag's own checks (the drain deadline below the session
/// timeout, the prefetch in the memory bound, TLS and SASL settings that fit together).
const FLAG_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "--brokers"),
    ("metadata.broker.list", "--brokers"),
    ("group.id", "--group-id"),
    ("security.protocol", "--kafka-security-protocol"),
    ("sasl.mechanism", "--kafka-sasl-mechanism"),
    ("sasl.mechanisms", "--kafka-sasl-mechanism"),
    ("sasl.username", "--kafka-sasl-username"),
    ("ssl.ca.location", "--kafka-ssl-ca-location"),
    (
        "ssl.certificate.location",
        "--kafka-ssl-certificate-location",
    ),
    ("ssl.key.location", "--kafka-ssl-key-location"),
    ("session.timeout.ms", "--session-timeout-ms"),
    ("queued.max.messages.kbytes", "--prefetch-kbytes"),
    ("fetch.max.bytes", "--fetch-max-bytes"),
    ("message.max.bytes", "--max-message-bytes"),
];

/// Property keys whose value the service's delivery guarantee rests on, with what it would lose.
const PINNED_PROPERTIES: &[(&str, &str)] = &[
    ("enable.auto.commit", AUTO_COMMIT),
    ("auto.commit.enable", AUTO_COMMIT),
    ("enable.auto.offset.store", AUTO_COMMIT),
    (
        "auto.offset.reset",
        "a partition without a committed offset, or whose offset is past the topic's retention, is read from its earliest message, so that nothing still on the topic is skipped",
    ),
    ("acks", IDEMPOTENT),
    ("request.required.acks", IDEMPOTENT),
    ("enable.idempotence", IDEMPOTENT),
    (
        "transactional.id",
        "the producers are idempotent, not transactional: a transactional producer sends nothing before transactions are begun, which the service never does",
    ),
    (
        "allow.auto.create.topics",
        "a destination topic that is missing (deleted, being recreated) is an outage the flush waits out; created by the producer's request on a broker that auto-creates topics, it would get the broker's defaults — one replica, where an acknowledged billing outcome or dead letter is lost with that broker",
    ),
];
const AUTO_COMMIT: &str = "offsets are committed by the service once a message's outputs are durable; librdkafka's own commits would commit messages still in the buffer, lost if the process dies";
const IDEMPOTENT: &str = "records are acknowledged by every in-sync replica and written idempotently (acks=all, enable.idempotence=true): otherwise a leader's failover can lose a dead letter or billing outcome, or a retry count one twice";

impl KafkaArgs {
    /// The files the clients read their credentials from (password, key passphrase, CA,
    /// certificate, key), those given.
    pub fn credential_files(&self) -> Vec<PathBuf> {
        [
            &self.kafka_sasl_password_file,
            &self.kafka_ssl_key_password_file,
            &self.kafka_ssl_ca_location,
            &self.kafka_ssl_certificate_location,
            &self.kafka_ssl_key_location,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }

    /// The pass-through properties as pairs. Messages name the offending key, never a value.
    /// Whether `--kafka-property group.protocol=consumer` asks for the consumer group protocol
    /// of KIP-848, where the broker owns the session, the heartbeats and the assignment.
    pub fn consumer_group_protocol(&self) -> bool {
        self.properties().is_ok_and(|p| {
            p.iter()
                .any(|(k, v)| k == "group.protocol" && v.eq_ignore_ascii_case("consumer"))
        })
    }

    /// The value of `key`, a property in milliseconds, when `--kafka-property` sets it.
    pub fn property_ms(&self, key: &str) -> Result<Option<u64>, String> {
        // The last one given: librdkafka applies them in order.
        self.properties()?
            .into_iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| {
                v.parse()
                    .map_err(|_| format!("Kafka property {key:?} is not a number of milliseconds"))
            })
            .transpose()
    }

    pub fn properties(&self) -> Result<Vec<(String, String)>, String> {
        self.properties
            .iter()
            .filter(|line| !line.trim().is_empty())
            .enumerate()
            .map(|(i, line)| {
                let (key, value) = line.split_once('=').ok_or_else(|| {
                    format!("Kafka property {} is not key=value (its text is not shown: it may hold a secret)", i + 1)
                })?;
                let key = key.trim();
                if is_secret_property(key) {
                    return Err(format!(
                        "Kafka property {key:?} holds a secret: use --kafka-sasl-password-file or --kafka-ssl-key-password-file (a mounted Secret) instead"
                    ));
                }
                // `group.id` set here would also move the member to another group than the
                // consumer that re-reads rejected messages, whose group the principal's ACLs cover.
                if let Some((_, flag)) = FLAG_PROPERTIES.iter().find(|(k, _)| *k == key) {
                    return Err(format!("Kafka property {key:?}: use {flag} instead"));
                }
                if let Some((_, why)) = PINNED_PROPERTIES.iter().find(|(k, _)| *k == key) {
                    return Err(format!(
                        "Kafka property {key:?} cannot be changed: {why}"
                    ));
                }
                if key == "delivery.timeout.ms" {
                    // An alias: set beside the default `message.timeout.ms`, which of the two
                    // librdkafka applies last is unspecified, and deliveries are awaited after the
                    // latter.
                    return Err(
                        "Kafka property \"delivery.timeout.ms\": set message.timeout.ms (or --sink-timeout-ms) instead".to_owned(),
                    );
                }
                let value = value.trim();
                if key == "message.timeout.ms" && value.parse() == Ok(0_u64) {
                    return Err("Kafka property \"message.timeout.ms\" is 0, no delivery timeout: a write to a broker that stops answering would wait for good".to_owned());
                }
                Ok((key.to_owned(), value.to_owned()))
            })
            .collect()
    }

    /// Rejects security settings that cannot work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.problems().map_err(ConfigError::Invalid)
    }

    fn problems(&self) -> Result<(), String> {
        let protocol = self.kafka_security_protocol;
        let has_password =
            self.kafka_sasl_password.is_some() || self.kafka_sasl_password_file.is_some();
        if protocol.sasl() {
            if self.kafka_sasl_mechanism.is_none()
                || self.kafka_sasl_username.is_none()
                || !has_password
            {
                return Err(format!(
                    "--kafka-security-protocol {} needs --kafka-sasl-mechanism, --kafka-sasl-username and a password (--kafka-sasl-password-file or REPLAY_INGEST_KAFKA_SASL_PASSWORD)",
                    value_name(protocol)
                ));
            }
        } else if self.kafka_sasl_mechanism.is_some()
            || self.kafka_sasl_username.is_some()
            || has_password
        {
            return Err(format!(
                "SASL settings are given but --kafka-security-protocol is {}: use SASL_SSL (or SASL_PLAINTEXT)",
                value_name(protocol)
            ));
        }
        let has_tls_files = self.kafka_ssl_ca_location.is_some()
            || self.kafka_ssl_certificate_location.is_some()
            || self.kafka_ssl_key_password_file.is_some();
        if has_tls_files && !protocol.tls() {
            return Err(format!(
                "TLS files are given but --kafka-security-protocol is {}: use SSL or SASL_SSL",
                value_name(protocol)
            ));
        }
        self.properties().map(drop)
    }

    /// A librdkafka configuration: brokers, security, `defaults`, then the pass-through
    /// properties, applied last so an operator can override any default (none sets a secret:
    /// [`KafkaArgs::properties`] refuses those). Secret files are read here, when a client is
    /// created.
    pub fn client_config(&self, defaults: &[(&str, String)]) -> Result<ClientConfig, ConfigError> {
        let mut config = self.settings(defaults)?;
        let password = Secret::from_file_or(
            self.kafka_sasl_password_file.as_deref(),
            self.kafka_sasl_password.as_ref(),
        )?;
        if let Some(password) = password {
            config.set("sasl.password", password.expose());
        }
        if let Some(passphrase) =
            Secret::from_file_or(self.kafka_ssl_key_password_file.as_deref(), None)?
        {
            config.set("ssl.key.password", passphrase.expose());
        }
        Ok(config)
    }

    /// Whether librdkafka takes every property a client of kind `C` with these `defaults` is
    /// given — names it knows, values of their form, and the rules across properties it checks
    /// when a client is created (`max.poll.interval.ms` at least `session.timeout.ms`,
    /// `fetch.max.bytes` at least `message.max.bytes`, …) — as it does when `consume` creates the
    /// client, but without reaching a broker or reading a file (secrets and certificates may not
    /// be mounted where the configuration is checked): the client made here has no brokers, no
    /// group, no TLS or SASL. The message names the property, never its value (librdkafka's own
    /// message quotes some values).
    pub fn check_properties<C>(&self, defaults: &[(&str, String)]) -> Result<(), ConfigError>
    where
        C: FromClientConfigAndContext<Unheard>,
    {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaConfRes;
        let mut config = self.settings(defaults)?;
        let refusal = match config.create_native_config() {
            Ok(_) => {
                for key in [
                    "bootstrap.servers",
                    "group.id",
                    "ssl.ca.location",
                    "ssl.certificate.location",
                    "ssl.key.location",
                    "sasl.mechanism",
                    "sasl.username",
                ] {
                    config.remove(key);
                }
                config.set("security.protocol", "plaintext");
                match config.create_with_context::<_, C>(Unheard) {
                    Ok(_) => return Ok(()),
                    // librdkafka's text names properties (between backquotes), never values.
                    Err(e) => format!("librdkafka refuses the Kafka properties together: {e}"),
                }
            }
            Err(KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, _, key, _)) => {
                format!("Kafka property {key:?} is not one librdkafka knows")
            }
            Err(KafkaError::ClientConfig(_, _, key, _)) => format!(
                "librdkafka refuses the value of Kafka property {key:?} (its text is not shown: it may hold a secret; librdkafka's CONFIGURATION.md gives each property's form and range)"
            ),
            Err(e) => format!("librdkafka refuses the Kafka properties: {e}"),
        };
        Err(ConfigError::Invalid(refusal))
    }

    /// [`KafkaArgs::client_config`] without the secrets.
    fn settings(&self, defaults: &[(&str, String)]) -> Result<ClientConfig, ConfigError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        config.set(
            "security.protocol",
            value_name(self.kafka_security_protocol),
        );
        if let Some(mechanism) = self.kafka_sasl_mechanism {
            config.set("sasl.mechanism", value_name(mechanism));
        }
        if let Some(username) = &self.kafka_sasl_username {
            config.set("sasl.username", username);
        }
        let files = [
            ("ssl.ca.location", &self.kafka_ssl_ca_location),
            (
                "ssl.certificate.location",
                &self.kafka_ssl_certificate_location,
            ),
            ("ssl.key.location", &self.kafka_ssl_key_location),
        ];
        for (key, file) in files {
            if let Some(file) = file {
                config.set(key, file.to_string_lossy());
            }
        }
        // A client that once found no broker up starts again from `bootstrap.servers` at most
        // this long after it last got metadata (librdkafka's default: 5 min). Seen once in 41
        // runs of a broker hung past its fencing on a loaded machine: the dead-letter producer
        // dropped the fenced broker, logged every broker down and sent nothing for the 2 min the
        // test waited, while the consumer beside it re-bootstrapped at once (librdkafka 2.12:
        // metadata answers already queued cancel the re-bootstrap it had scheduled, and further
        // requests wait for this timer).
        config.set("metadata.recovery.rebootstrap.trigger.ms", "30000");
        for (key, value) in defaults {
            config.set(*key, value);
        }
        for (key, value) in self.properties().map_err(ConfigError::Invalid)? {
            config.set(key, value);
        }
        // Statistics are read by the group member only (`consumer.lag`, `/status` `group`), the
        // one client whose defaults ask for them. Any other client given a
        // `--kafka-property statistics.interval.ms` would hand each to rust-rdkafka's default
        // context, which logs the whole object at INFO: kilobytes per client at every interval.
        if !defaults.iter().any(|(key, _)| *key == STATISTICS_INTERVAL) {
            config.set(STATISTICS_INTERVAL, "0");
        }
        Ok(config)
    }
}

/// Where the blobs are: the service writes them there, the operator tools delete and sweep them.
#[derive(Args, Debug, Clone)]
pub struct BlobArgs {
    /// Where blobs go.
    #[arg(long, env = "REPLAY_INGEST_BLOB_SINK", value_enum, default_value_t = BlobSinkKind::Gcs)]
    pub blob_sink: BlobSinkKind,
    /// Directory for the filesystem blob sink.
    #[arg(long, env = "REPLAY_INGEST_BLOB_DIR", default_value = "blobs")]
    pub blob_dir: PathBuf,
    #[command(flatten)]
    pub gcs: GcsArgs,
}

impl BlobArgs {
    pub fn validate(&self) -> Result<(), String> {
        match self.blob_sink {
            BlobSinkKind::Gcs => self.gcs.validate(),
            _ => Ok(()),
        }
    }

    /// The GCS sink's settings, each request bounded by `timeout`.
    pub fn gcs_config(
        &self,
        timeout: Duration,
    ) -> Result<crate::sink::gcs::GcsConfig, ConfigError> {
        self.gcs.config(timeout).map_err(ConfigError::Invalid)
    }
}

/// How fast a sweep of the filesystem store (`replay-ingest sweep`, `--sweep-interval-s`) may
/// remove files.
#[derive(Args, Debug, Clone, Copy)]
pub struct SweepPace {
    /// Most files a sweep removes per second (its I/O beside the running service).
    #[arg(long, env = "REPLAY_INGEST_SWEEP_MAX_DELETES_PER_SECOND", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub sweep_max_deletes_per_second: u32,
}

/// Where the rows are: ClickHouse directly, or snuba's topic.
#[derive(Args, Debug, Clone)]
pub struct RowsArgs {
    /// Where rows go.
    #[arg(long, env = "REPLAY_INGEST_ROWS_SINK", value_enum, default_value_t = RowsSinkKind::Clickhouse)]
    pub rows_sink: RowsSinkKind,
    /// Topic of `--rows-sink snuba`: snuba's replays consumer reads it.
    #[arg(
        long,
        env = "REPLAY_INGEST_REPLAY_EVENTS_TOPIC",
        default_value = "ingest-replay-events"
    )]
    pub replay_events_topic: String,
    #[command(flatten)]
    pub clickhouse: ClickHouseArgs,
}

impl RowsArgs {
    pub fn validate(&self) -> Result<(), String> {
        match self.rows_sink {
            RowsSinkKind::Clickhouse => self.clickhouse.validate(),
            _ => Ok(()),
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobSinkKind {
    /// Google Cloud Storage, `--gcs-bucket`.
    Gcs,
    /// Files under `--blob-dir` (local runs and tests).
    Filesystem,
    /// Store nothing (benchmark the pipeline alone).
    Null,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsSinkKind {
    /// Insert into snuba's `replays_local` table directly.
    Clickhouse,
    /// Publish the rows as `ingest-replay-events` messages (`--replay-events-topic`) for snuba's
    /// replays consumer to insert, as Sentry does.
    Snuba,
    /// Write no rows.
    Null,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsSinkKind {
    /// Kafka topics `--outcomes-topic`, `--analytics-topic`, `--issues-topic`.
    Kafka,
    /// Publish nothing on those topics: no billing outcomes (replays go unbilled), first-replay
    /// events or issue occurrences. For local runs, not production.
    Null,
}

/// DogStatsD metrics.
#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// DogStatsD address: `host:port` (UDP) or `unixgram:///path`; empty disables metrics. In
    /// Kubernetes point it at the node's agent (host IP or the agent's socket).
    #[arg(
        long,
        env = "REPLAY_INGEST_STATSD_ADDRESS",
        default_value = "127.0.0.1:8125"
    )]
    pub statsd_address: String,
    /// Prefix of every metric name.
    #[arg(
        long,
        env = "REPLAY_INGEST_STATSD_PREFIX",
        default_value = "replay_ingest"
    )]
    pub statsd_prefix: String,
    /// Tags on every metric, `key:value` (e.g. `env:prod`); keep them low-cardinality.
    #[arg(
        long = "statsd-tag",
        env = "REPLAY_INGEST_STATSD_TAGS",
        value_delimiter = ','
    )]
    pub statsd_tags: Vec<String>,
    /// How often aggregated metrics are sent, ms. The process waits one interval before it exits,
    /// so that the last one is not lost.
    #[arg(long, env = "REPLAY_INGEST_STATSD_FLUSH_INTERVAL_MS", value_parser = clap::value_parser!(u64).range(1..=60_000), default_value_t = 1_000)]
    pub statsd_flush_interval_ms: u64,
}

impl MetricsArgs {
    pub fn settings(&self) -> crate::metrics::Settings<'_> {
        crate::metrics::Settings {
            address: &self.statsd_address,
            prefix: &self.statsd_prefix,
            tags: &self.statsd_tags,
            flush_interval: Duration::from_millis(self.statsd_flush_interval_ms),
        }
    }
}

/// `replay-ingest consume`.
#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Topic of recording segments.
    #[arg(
        long,
        env = "REPLAY_INGEST_TOPIC",
        default_value = "ingest-replay-recordings"
    )]
    pub topic: String,
    /// Consumer group. Scale out by running more members than 1, up to the partition count.
    #[arg(long, env = "REPLAY_INGEST_GROUP_ID", default_value = "replay-ingest")]
    pub group_id: String,
    /// Dead-letter topic for invalid messages (original bytes plus `reason`/`detail` headers).
    #[arg(
        long,
        env = "REPLAY_INGEST_DLQ_TOPIC",
        default_value = "ingest-replay-recordings-dlq"
    )]
    pub dlq_topic: String,
    /// Largest record the dead-letter topic accepts, bytes (its `max.message.bytes`; Kafka's
    /// default is 1 MiB). A larger dead letter keeps its value in the blob store under `dlq/` and
    /// leaves a pointer record on the topic; so does one the broker refuses as too large.
    #[arg(long, env = "REPLAY_INGEST_DLQ_MAX_MESSAGE_BYTES", value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000_000), default_value_t = 1_000_000)]
    pub dlq_max_message_bytes: usize,
    /// Group session timeout. Lower detects dead members sooner; too low causes spurious
    /// rebalances under load. Must exceed `--drain-deadline-ms`. With `group.protocol=consumer`
    /// the broker's `group.consumer.session.timeout.ms` applies instead and this is not sent:
    /// there, set it about 15 s below the broker's (the default 30 s against its 45 s). Flushes
    /// write nothing once the group coordinator has been out of reach this long, until it
    /// answers (the broker may have given the partitions to another member, and librdkafka does
    /// not tell before it answers).
    #[arg(long, env = "REPLAY_INGEST_SESSION_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), default_value_t = 30_000)]
    pub session_timeout_ms: u64,
    /// librdkafka prefetch per consumer, KiB (`queued.max.messages.kbytes`). Higher smooths
    /// throughput; it adds directly to peak memory.
    #[arg(long, env = "REPLAY_INGEST_PREFETCH_KBYTES", value_parser = clap::value_parser!(u64).range(1..=2_097_151), default_value_t = 64 * 1024)]
    pub prefetch_kbytes: u64,
    /// Largest fetch response, bytes (`fetch.max.bytes`). Must hold the largest message (15 MB
    /// upstream).
    #[arg(long, env = "REPLAY_INGEST_FETCH_MAX_BYTES", value_parser = clap::value_parser!(u64).range(1..=2_147_483_135), default_value_t = 32 * 1024 * 1024)]
    pub fetch_max_bytes: u64,
    /// Largest message accepted upstream, bytes; the buffer must hold at least one. At most
    /// librdkafka's limit (1 000 000 000) less the producers' headroom (1 MiB), so a dead letter
    /// of the largest message can still be produced.
    #[arg(long, env = "REPLAY_INGEST_MAX_MESSAGE_BYTES", value_parser = RangedU64ValueParser::<usize>::new().range(1..=LARGEST_MESSAGE_BYTES as u64), default_value_t = 15_000_000)]
    pub max_message_bytes: usize,

    /// Flush when the buffer holds this many messages. Larger batches mean fewer, bigger writes.
    #[arg(long, env = "REPLAY_INGEST_BUFFER_MAX_MESSAGES", value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000), default_value_t = 1000)]
    pub buffer_max_messages: usize,
    /// Memory budget for buffered data (mostly blobs), bytes: the open buffer plus the batches
    /// being flushed. The open buffer closes at budget ÷ (max-flushes-in-flight + 1); with a
    /// backlog, RSS stays near this plus librdkafka's prefetch.
    #[arg(long, env = "REPLAY_INGEST_BUFFER_MAX_BYTES", value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_099_511_627_776), default_value_t = 256 * 1024 * 1024)]
    pub buffer_max_bytes: usize,
    /// Flush a buffer whose first message is this old, ms. Bounds end-to-end latency (and how
    /// much is redelivered after a crash).
    #[arg(long, env = "REPLAY_INGEST_BUFFER_MAX_AGE_MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), default_value_t = 5_000)]
    pub buffer_max_age_ms: u64,
    /// Flushes that may run at once while the next buffer fills. More overlaps slow sinks; each
    /// holds a full buffer in memory.
    #[arg(long, env = "REPLAY_INGEST_MAX_FLUSHES_IN_FLIGHT", value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), default_value_t = 1)]
    pub max_flushes_in_flight: usize,
    /// Threads that decompress and parse messages (0 = one per CPU).
    #[arg(long, env = "REPLAY_INGEST_PROCESSING_THREADS", value_parser = RangedU64ValueParser::<usize>::new().range(0..=1024), default_value_t = 0)]
    pub processing_threads: usize,

    /// Attempts per sink per flush before the service stops (non-zero exit, nothing committed);
    /// 0 retries an outage without limit, intake paused, which is what a consumer should do: an
    /// exit only turns an outage into a restart loop.
    #[arg(long, env = "REPLAY_INGEST_FLUSH_MAX_ATTEMPTS", default_value_t = 0)]
    pub flush_max_attempts: u32,
    /// A sink that refuses this many messages in a row, over one flush or several, accepting none
    /// in between, is taken for misconfigured (a table whose columns changed): the service stops.
    /// Fewer are dead-lettered: a quiet topic's few hostile messages must not stop it (the count
    /// starts again with the process, so a restart goes on past earlier flushes' refusals). 0:
    /// never stop; every refused message is dead-lettered (to be re-driven once the sink is
    /// fixed). 1 is refused.
    #[arg(
        long,
        env = "REPLAY_INGEST_MISCONFIGURED_AT_REFUSALS",
        default_value_t = 10
    )]
    pub misconfigured_at_refusals: usize,
    /// Deadline of one sink request, ms: a GCS upload, a ClickHouse INSERT's sending (and as
    /// long for its answer), a Kafka delivery. Past it the attempt fails and is retried. An offset
    /// commit's answer is waited for twice as long and 5 s more, and so is a delivery's report.
    #[arg(long, env = "REPLAY_INGEST_SINK_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(SINK_TIMEOUT_MS), default_value_t = 30_000)]
    pub sink_timeout_ms: u64,
    /// Liveness fails when a flush goes this long without any sink attempt ending (a wedged
    /// flush: the pod is restarted); a flush that keeps retrying is not wedged. Above three times
    /// the sink timeout and 5 s (the longest a Kafka delivery may take).
    #[arg(long, env = "REPLAY_INGEST_FLUSH_STALL_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..=86_400_000), default_value_t = 300_000)]
    pub flush_stall_timeout_ms: u64,
    /// Liveness fails when the member has been out of its consumer group this long, ms, while it
    /// is connected to a broker (librdkafka's statistics; a member that stopped joining is
    /// restarted). A Kafka outage or a network cut never fails it. 0: never. Above
    /// `max.poll.interval.ms` (300 000 unless set), the longest a rebalance may hold a member
    /// out, plus `--drain-deadline-ms`, plus `reconnect.backoff.max.ms` (10 000 unless set: after
    /// an outage the coordinator's connection may wait that long while another broker is up).
    #[arg(long, env = "REPLAY_INGEST_GROUP_STALL_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(0..=86_400_000), default_value_t = 600_000)]
    pub group_stall_timeout_ms: u64,
    /// Liveness fails when the brokers have refused this process's Kafka credentials — its SASL
    /// login, its certificate, or their certificate against its CA — this long, ms, refusal after
    /// refusal (each within a minute of the one before), and a credential file holds something
    /// else than the clients read when they started: a password or certificate rotated under a
    /// running pod, read again by the restart. 0: never.
    #[arg(long, env = "REPLAY_INGEST_KAFKA_REFUSED_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(0..=86_400_000), default_value_t = 120_000)]
    pub kafka_refused_timeout_ms: u64,
    /// First retry backoff, ms; doubles per attempt, full jitter. At least 1: a backoff that
    /// starts at 0 stays 0 (retries in a hot loop against a sink that is down).
    #[arg(long, env = "REPLAY_INGEST_FLUSH_INITIAL_BACKOFF_MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), default_value_t = 200)]
    pub flush_initial_backoff_ms: u64,
    /// Longest retry backoff, ms.
    #[arg(long, env = "REPLAY_INGEST_FLUSH_MAX_BACKOFF_MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), default_value_t = 10_000)]
    pub flush_max_backoff_ms: u64,
    /// Time allowed to flush and commit on shutdown or partition revoke, ms (a revoke does not
    /// wait for flushes failing that long already). Must be below the session timeout and the
    /// pod's termination grace period.
    #[arg(long, env = "REPLAY_INGEST_DRAIN_DEADLINE_MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), default_value_t = 20_000)]
    pub drain_deadline_ms: u64,

    #[command(flatten)]
    pub blobs: BlobArgs,
    /// With `--blob-sink filesystem`: every this many seconds, remove the blobs past their
    /// retention (what `replay-ingest sweep` does). 0: never (run the sweep yourself, or on GCS
    /// let the bucket's lifecycle rules expire them).
    #[arg(long, env = "REPLAY_INGEST_SWEEP_INTERVAL_S", default_value_t = 0)]
    pub sweep_interval_s: u64,
    #[command(flatten)]
    pub sweep_pace: SweepPace,
    #[command(flatten)]
    pub rows: RowsArgs,
    /// Create or migrate the ClickHouse table at start (otherwise run `replay-ingest migrate`).
    #[arg(long, env = "REPLAY_INGEST_MIGRATE_ON_START")]
    pub migrate_on_start: bool,
    /// Where the events go: billing outcomes, first-replay events, issue occurrences.
    #[arg(long, env = "REPLAY_INGEST_EVENTS_SINK", value_enum, default_value_t = EventsSinkKind::Kafka)]
    pub events_sink: EventsSinkKind,
    #[command(flatten)]
    pub events: EventsArgs,
    #[command(flatten)]
    pub trace_items: TraceItemsArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,

    /// Address of the health and status endpoint (`/health/live`, `/health/ready`, `/status`).
    #[arg(
        long,
        env = "REPLAY_INGEST_HTTP_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub http_listen: SocketAddr,

    #[command(flatten)]
    pub limits: LimitArgs,
}

/// `--sink-timeout-ms`'s range, for every command that has it: 0 would be librdkafka's "never"
/// for a delivery.
pub const SINK_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1..=3_600_000;

/// librdkafka's `max.poll.interval.ms` when none is given.
const LIBRDKAFKA_MAX_POLL_INTERVAL_MS: u64 = 300_000;
/// How long librdkafka keeps quiet about an error identical to the last one a broker had.
const LIBRDKAFKA_ERROR_SUPPRESSION_MS: u64 = 30_000;
/// librdkafka's `reconnect.backoff.max.ms` when none is given.
const LIBRDKAFKA_RECONNECT_BACKOFF_MAX_MS: u64 = 10_000;

impl ConsumeArgs {
    /// Rejects settings that cannot work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.kafka.validate()?;
        self.problems().map_err(ConfigError::Invalid)?;
        // The clients `consume` creates: the group member (the consumer that re-reads rejected
        // messages has a subset of its properties) and the producers.
        self.kafka
            .check_properties::<BaseConsumer<Unheard>>(&self.consumer_properties())?;
        self.kafka
            .check_properties::<BaseProducer<Unheard>>(&producer_properties(
                self.max_message_bytes,
                self.sink_timeout(),
            ))
    }

    /// Settings that work but lose or expose something (a local run's copied into production,
    /// a password sent in clear text) or that nothing reads: each is said at start.
    pub fn risks(&self) -> Vec<&'static str> {
        let mut risks = Vec::new();
        let mut risk = |at: bool, what| {
            if at {
                risks.push(what)
            }
        };
        risk(
            self.blobs.blob_sink == BlobSinkKind::Null,
            "--blob-sink null: recordings are thrown away, their offsets committed",
        );
        risk(
            self.rows.rows_sink == RowsSinkKind::Null,
            "--rows-sink null: no replay rows are written: replays are not listed",
        );
        risk(
            self.events_sink == EventsSinkKind::Null,
            "--events-sink null: no billing outcomes, first-replay events or issue occurrences are published: replays go unbilled",
        );
        let clickhouse = &self.rows.clickhouse;
        risk(
            self.rows.rows_sink == RowsSinkKind::Clickhouse
                && (clickhouse.clickhouse_password.is_some()
                    || clickhouse.clickhouse_password_file.is_some())
                && crate::sink::sent_in_clear(&clickhouse.clickhouse_url),
            "the ClickHouse password crosses the network in clear text (--clickhouse-url is http:// to another host): use https://",
        );
        risk(
            self.rows.rows_sink != RowsSinkKind::Clickhouse && self.migrate_on_start,
            "--migrate-on-start is ignored: rows do not go to ClickHouse",
        );
        let kafka = &self.kafka;
        risk(
            kafka.kafka_security_protocol == SecurityProtocol::SaslPlaintext
                && kafka.kafka_sasl_mechanism == Some(SaslMechanism::Plain),
            "the Kafka password crosses the network in clear text (SASL_PLAINTEXT with PLAIN): use SASL_SSL",
        );
        risk(
            kafka.kafka_ssl_key_password_file.is_some() && kafka.kafka_ssl_key_location.is_none(),
            "--kafka-ssl-key-password-file is ignored: no --kafka-ssl-key-location",
        );
        let properties = kafka.properties().unwrap_or_default();
        // The last one given, as librdkafka reads it (a boolean's false: false, f or 0).
        let set = |key: &str, values: &[&str]| {
            properties
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .is_some_and(|(_, v)| values.iter().any(|value| v.eq_ignore_ascii_case(value)))
        };
        risk(
            set("enable.ssl.certificate.verification", &["false", "f", "0"]),
            "the brokers' certificates are not verified (enable.ssl.certificate.verification=false)",
        );
        risk(
            set("ssl.endpoint.identification.algorithm", &["none"]),
            "the brokers' certificates are not checked against their host names (ssl.endpoint.identification.algorithm=none)",
        );
        risks
    }

    /// The most memory this configuration lets the service hold (docs/operations.md, "Memory"):
    /// the buffer's budget, librdkafka's prefetch, the processing window, the polled hand-over,
    /// what a processing thread holds decoding a body (its output, and for zstd the thread's kept
    /// buffer and libzstd's decoder beside it), and the messages a sink refused, read again
    /// to be dead-lettered (a window of them and the last one past it, twice: librdkafka holds a
    /// copy until delivery; and the read-ahead of the next); the process's own baseline (code,
    /// clients) comes on top.
    pub fn memory_bound(&self) -> u64 {
        const READ_AHEAD: u64 = 1 << 20;
        let dead_letters = 2
            * (crate::sink::publish::DELIVERY_WINDOW_BYTES as u64 + self.max_message_bytes as u64)
            + READ_AHEAD;
        let threads = crate::pipeline::processing_threads(self.processing_threads) as u64;
        // A message whose reservation exceeds the window's bytes enters only an empty window.
        let window = crate::pipeline::window::largest_reservation(
            self.max_message_bytes,
            &self.processing_limits(),
        )
        .max(crate::pipeline::window::PROCESSING_WINDOW_BYTES);
        [
            self.buffer_max_bytes as u64,
            window as u64,
            crate::pipeline::POLLED_IN_TRANSIT_BYTES as u64,
            threads.saturating_mul(crate::recording::payload::decoding_bytes(
                self.limits.decompression.max_decompressed_bytes,
            ) as u64),
            dead_letters,
            self.prefetch_kbytes.saturating_mul(1024),
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    fn problems(&self) -> Result<(), String> {
        // A revoke's drain runs inside the rebalance callback, so the polling thread does not
        // poll meanwhile (plus the hand-over's margin).
        let margin = crate::kafka::consumer::DRAIN_MARGIN.as_millis() as u64;
        // Unset, librdkafka's default applies (with the consumer protocol too, where nothing
        // else bounds the drain deadline: the session timeout is the broker's).
        let max_poll_interval = self
            .kafka
            .property_ms("max.poll.interval.ms")?
            .unwrap_or(LIBRDKAFKA_MAX_POLL_INTERVAL_MS);
        if self.drain_deadline_ms + margin >= max_poll_interval {
            return Err(format!(
                "--drain-deadline-ms ({}) plus {margin} ms must be below max.poll.interval.ms ({max_poll_interval}): the polling thread waits that long for a revoke's drain",
                self.drain_deadline_ms
            ));
        }
        // A classic rebalance waits up to max.poll.interval.ms (and a revoke's drain) for the
        // members to rejoin. Before it, once the brokers are back from an outage, the member may
        // be connected to one broker while its connection to the coordinator still waits out
        // librdkafka's reconnect backoff (it grows to this during the outage; measured on Kafka
        // 4: 4–9 s in `wait-broker-transport` with another broker up, after a restart).
        let reconnect_backoff = self
            .kafka
            .property_ms("reconnect.backoff.max.ms")?
            .unwrap_or(LIBRDKAFKA_RECONNECT_BACKOFF_MAX_MS);
        let rejoin_bound = max_poll_interval + self.drain_deadline_ms + reconnect_backoff;
        if self.group_stall_timeout_ms != 0 && self.group_stall_timeout_ms <= rejoin_bound {
            return Err(format!(
                "--group-stall-timeout-ms ({}) must exceed max.poll.interval.ms plus --drain-deadline-ms plus reconnect.backoff.max.ms ({rejoin_bound}): a rejoin may hold a member out of its group that long while it reaches a broker (0 turns the check off)",
                self.group_stall_timeout_ms
            ));
        }
        // librdkafka tries a refused connection again after at most this backoff, and reports
        // the same error about the same broker at most every 30 s: refusals further apart than
        // the gap count as two runs, and rotated credentials would never fail liveness.
        let refusal_gap = crate::health::REFUSAL_GAP.as_millis() as u64;
        let widest = LIBRDKAFKA_ERROR_SUPPRESSION_MS + 5_000;
        if self.kafka_refused_timeout_ms != 0 && reconnect_backoff + widest >= refusal_gap {
            return Err(format!(
                "reconnect.backoff.max.ms ({reconnect_backoff}) must stay under {} ms while --kafka-refused-timeout-ms is on: librdkafka reports a refusal again up to 30 s after the last plus that backoff, and refusals more than {} ms apart are not taken for one run (0 turns the check off)",
                refusal_gap - widest,
                refusal_gap
            ));
        }
        if self.misconfigured_at_refusals == 1 {
            return Err("--misconfigured-at-refusals must be 0 (never) or at least 2: at 1 a single refused message would stop the service, and its restart would meet it again".to_owned());
        }
        // With the consumer protocol the flag stands for the broker's session (it is not sent):
        // a revoke's drain blocks the statistics that would hold its writes once the coordinator
        // is out of reach (`kafka::coordinator`), so it must end before the broker could fence a
        // member cut off as it began.
        if self.drain_deadline_ms >= self.session_timeout_ms {
            return Err(format!(
                "--drain-deadline-ms ({}) must be below --session-timeout-ms ({}): a drain that outlives the session loses the partitions mid-commit",
                self.drain_deadline_ms, self.session_timeout_ms
            ));
        }
        // The longest a write goes without an attempt ending: a Kafka record waits for room in
        // the producer's queue up to `message.timeout.ms` (the sink timeout unless set), then for
        // its report up to twice that and 5 s more (a broker that stopped answering mid-request);
        // a large upload to GCS (blobs, and dead letters too large for their topic) up to three
        // sink timeouts, whatever `message.timeout.ms` is (a
        // lower one set beside a longer sink timeout let liveness restart pods mid-upload). A
        // ClickHouse write waits less: for the answer and then the table's check, twice the sink
        // timeout.
        let message_timeout = self
            .kafka
            .property_ms("message.timeout.ms")?
            .map_or(self.sink_timeout(), Duration::from_millis);
        let delivery = message_timeout + crate::kafka::answer_deadline(message_timeout);
        let upload = match self.blobs.blob_sink {
            BlobSinkKind::Gcs => self.sink_timeout() * crate::sink::gcs::LONGEST_UPLOAD_TIMEOUTS,
            BlobSinkKind::Filesystem | BlobSinkKind::Null => Duration::ZERO,
        };
        if Duration::from_millis(self.flush_stall_timeout_ms) <= delivery.max(upload) {
            return Err(format!(
                "--flush-stall-timeout-ms ({}) must exceed {} ms: three times message.timeout.ms ({} ms; --sink-timeout-ms unless set) and 5 s more, the longest a Kafka delivery may wait, for room in the producer's queue and for a broker that stopped answering mid-request; and, with blobs on GCS, three times --sink-timeout-ms ({}), the longest a large upload may take. A flush waiting on either is not stalled",
                self.flush_stall_timeout_ms,
                delivery.max(upload).as_millis(),
                message_timeout.as_millis(),
                self.sink_timeout_ms
            ));
        }
        if self.flush_initial_backoff_ms > self.flush_max_backoff_ms {
            return Err(format!(
                "--flush-initial-backoff-ms ({}) must not exceed --flush-max-backoff-ms ({})",
                self.flush_initial_backoff_ms, self.flush_max_backoff_ms
            ));
        }
        if self.flush_max_backoff_ms >= self.flush_stall_timeout_ms {
            return Err(format!(
                "--flush-max-backoff-ms ({}) must be below --flush-stall-timeout-ms ({}): a flush waiting out its backoff makes no request, and would be taken for a stalled one",
                self.flush_max_backoff_ms, self.flush_stall_timeout_ms
            ));
        }
        if self.buffer_limits().max_bytes < self.max_message_bytes {
            return Err(format!(
                "--buffer-max-bytes ({}) ÷ (--max-flushes-in-flight + 1) must hold one message of --max-message-bytes ({})",
                self.buffer_max_bytes, self.max_message_bytes
            ));
        }
        self.rows.validate()?;
        self.blobs.validate()?;
        if self.sweep_interval_s > 0 && self.blobs.blob_sink != BlobSinkKind::Filesystem {
            return Err("--sweep-interval-s sweeps the filesystem blob store (--blob-sink filesystem); on GCS, bucket lifecycle rules expire blobs".to_owned());
        }
        if (self.fetch_max_bytes as usize) < self.max_message_bytes {
            return Err(format!(
                "--fetch-max-bytes ({}) must hold a message of --max-message-bytes",
                self.fetch_max_bytes
            ));
        }
        Ok(())
    }

    pub fn buffer_limits(&self) -> BufferLimits {
        BufferLimits {
            max_messages: self.buffer_max_messages,
            max_bytes: self.buffer_max_bytes / (self.max_flushes_in_flight + 1),
            max_age: Duration::from_millis(self.buffer_max_age_ms),
        }
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.flush_max_attempts,
            initial_backoff: Duration::from_millis(self.flush_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.flush_max_backoff_ms),
            misconfigured_at: self.misconfigured_at_refusals,
        }
    }

    pub fn sink_timeout(&self) -> Duration {
        Duration::from_millis(self.sink_timeout_ms)
    }

    pub fn flush_stall(&self) -> Duration {
        Duration::from_millis(self.flush_stall_timeout_ms)
    }

    pub fn drain_deadline(&self) -> Duration {
        Duration::from_millis(self.drain_deadline_ms)
    }

    /// The limits messages are processed under.
    fn processing_limits(&self) -> Limits {
        Limits {
            trace_items: self.trace_items.trace_items_rollout,
            ..self
                .limits
                .limits(self.rows.rows_sink == RowsSinkKind::Snuba)
        }
    }

    /// What the pipeline needs, from these flags (secret files are read here).
    pub fn pipeline_settings(&self) -> Result<crate::pipeline::Settings, ConfigError> {
        Ok(crate::pipeline::Settings {
            consumer: self.kafka.client_config(&self.consumer_properties())?,
            topic: self.topic.clone(),
            processing_threads: self.processing_threads,
            limits: self.processing_limits(),
            buffer: self.buffer_limits(),
            max_flushes: self.max_flushes_in_flight,
            max_uncommitted: crate::pipeline::max_uncommitted(
                self.buffer_max_messages,
                self.max_flushes_in_flight,
            ),
            retry: self.retry_policy(),
            drain_deadline: self.drain_deadline(),
            flush_stall: self.flush_stall(),
            group_stall: (self.group_stall_timeout_ms != 0)
                .then(|| Duration::from_millis(self.group_stall_timeout_ms)),
            kafka_refused: (self.kafka_refused_timeout_ms != 0)
                .then(|| Duration::from_millis(self.kafka_refused_timeout_ms)),
            consumer_protocol: self.kafka.consumer_group_protocol(),
            hold_writes_after: self
                .kafka
                .consumer_group_protocol()
                .then(|| Duration::from_millis(self.session_timeout_ms)),
            commit_timeout: crate::kafka::answer_deadline(Duration::from_millis(
                self.sink_timeout_ms,
            )),
        })
    }

    /// What every consumer of the service shares — the group member and the one that re-reads
    /// rejected messages — besides the brokers, security and `--kafka-property` entries
    /// (`KafkaArgs::client_config`), so that a property valid for one is valid for the other
    /// (librdkafka checks `max.poll.interval.ms` against the session timeout, for example).
    pub fn shared_consumer_properties(&self) -> Vec<(&'static str, String)> {
        // With the consumer protocol (KIP-848) the broker sets the session and the heartbeats
        // (librdkafka refuses these).
        if self.kafka.consumer_group_protocol() {
            return Vec::new();
        }
        vec![
            ("session.timeout.ms", self.session_timeout_ms.to_string()),
            // At least three heartbeats per session (librdkafka's 3 s default outlives short sessions).
            (
                "heartbeat.interval.ms",
                (self.session_timeout_ms / 3).clamp(100, 3000).to_string(),
            ),
        ]
    }

    /// The group member's properties: the shared ones, manual commits only, bounded prefetch,
    /// cooperative (incremental) rebalancing — a rebalance revokes only the partitions that move,
    /// so members keep consuming the rest (`--kafka-property partition.assignment.strategy=range`
    /// restores eager).
    pub fn consumer_properties(&self) -> Vec<(&'static str, String)> {
        let mut properties = self.shared_consumer_properties();
        properties.extend([
            ("group.id", self.group_id.clone()),
            ("enable.auto.commit", "false".into()),
            ("enable.auto.offset.store", "false".into()),
            ("auto.offset.reset", "earliest".into()),
            (
                "queued.max.messages.kbytes",
                self.prefetch_kbytes.to_string(),
            ),
            ("fetch.max.bytes", self.fetch_max_bytes.to_string()),
            // librdkafka waits this long to fetch again once its queue is over the prefetch
            // bound. Its default (1 s) idled a backlog's consumer every second: the service read
            // about 90 MB/s whatever its threads could process (1 900 messages/s of the recorded
            // mix on two threads; 3 800 with 10 ms).
            ("fetch.queue.backoff.ms", "10".into()),
            // Per partition, librdkafka's own default, 1 MiB. A larger record batch still comes
            // whole: the broker returns a fetch's first batch whatever its size (the 2 MB message
            // in tests/it/dead_letters.rs). At 16 MiB, with a backlog, each response landed in
            // fresh pages: librdkafka's fetch thread took 0.43 page faults per small segment
            // (0.12 at 1 MiB), 1.6 µs of CPU (0.9), and peak RSS was 100 MiB higher, for no more
            // throughput (docs/performance.md).
            (
                "max.partition.fetch.bytes",
                self.fetch_max_bytes.min(1024 * 1024).to_string(),
            ),
            // Consumer lag per partition for the `consumer.lag` gauge.
            (STATISTICS_INTERVAL, "10000".into()),
            // Partitions added to the topic (an operator scaling out) are seen within 30 s: with
            // the classic protocol the group's leader rebalances them onto the members only once
            // its metadata shows them, and at librdkafka's default (5 min) they waited past the
            // test's two minutes (`partitions_added_while_running…`; in another run something
            // else refreshed it within seconds). One metadata request per 30 s.
            ("topic.metadata.refresh.interval.ms", "30000".into()),
        ]);
        // With the consumer protocol the broker assigns (librdkafka refuses an assignor); its
        // rebalances are incremental, as cooperative-sticky's are, through the same callbacks.
        if !self.kafka.consumer_group_protocol() {
            properties.push(("partition.assignment.strategy", "cooperative-sticky".into()));
        }
        properties
    }
}

/// What a produced record may hold beyond the largest consumed message: a dead letter is that
/// message with its headers.
const PRODUCER_HEADROOM_BYTES: usize = 1024 * 1024;

/// The largest `--max-message-bytes`: librdkafka's largest `message.max.bytes` less the headroom.
const LARGEST_MESSAGE_BYTES: usize = 1_000_000_000 - PRODUCER_HEADROOM_BYTES;

/// Producer properties for the dead-letter and event topics: fully acknowledged, idempotent
/// writes, each delivery failing (and retried by the flush) past `timeout`. Idempotent: librdkafka
/// retries a produce request whose answer was lost (a connection reset, a leader moving during a
/// rolling restart) on its own, and without idempotence the broker would append that batch twice
/// — a billing outcome counted twice.
pub fn producer_properties(
    max_message_bytes: usize,
    timeout: Duration,
) -> Vec<(&'static str, String)> {
    vec![
        ("acks", "all".into()),
        ("enable.idempotence", "true".into()),
        (
            "message.max.bytes",
            (max_message_bytes + PRODUCER_HEADROOM_BYTES).to_string(),
        ),
        ("message.timeout.ms", timeout.as_millis().to_string()),
        ("linger.ms", "5".into()),
        // librdkafka's producers ask the broker to create a topic they do not find.
        ("allow.auto.create.topics", "false".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ConsumeArgs,
    }

    fn parse(extra: &[&str]) -> ConsumeArgs {
        Cli::try_parse_from(std::iter::once("x").chain(extra.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_defaults_are_valid_once_a_bucket_is_named() {
        assert!(
            parse(&[])
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--gcs-bucket")
        );
        assert!(parse(&["--gcs-bucket", "replays"]).validate().is_ok());
    }

    #[test]
    fn settings_that_lose_or_expose_something_are_said() {
        let bucket = ["--gcs-bucket", "replays"];
        assert!(parse(&bucket).risks().is_empty(), "the defaults");
        let said = |extra: &[&str]| {
            let args: Vec<&str> = bucket.iter().chain(extra).copied().collect();
            parse(&args).risks().join("\n")
        };
        assert!(said(&["--events-sink", "null"]).contains("replays go unbilled"));
        assert!(said(&["--blob-sink", "null"]).contains("recordings are thrown away"));
        let password = ["--clickhouse-password-file", "/run/pw"];
        for (url, clear) in [
            ("http://clickhouse:8123", true),
            ("http://10.0.0.7:8123/", true),
            ("https://clickhouse:8443", false),
            ("http://localhost:8123", false),
            ("http://127.0.0.1:8123", false),
            ("http://[::1]:8123", false),
            ("http://[::ffff:127.0.0.1]:8123", false),
            ("http://[fd00::7]:8123", true),
        ] {
            let args = [&password[..], &["--clickhouse-url", url]].concat();
            assert_eq!(
                said(&args).contains("ClickHouse password crosses the network"),
                clear,
                "{url}"
            );
        }
        assert!(
            said(&["--clickhouse-url", "http://clickhouse:8123"]).is_empty(),
            "no password"
        );
        let sasl = [
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password-file",
            "/run/kafka",
            "--kafka-sasl-mechanism",
        ];
        let plain = [
            &sasl[..],
            &["PLAIN", "--kafka-security-protocol", "SASL_PLAINTEXT"],
        ]
        .concat();
        assert!(said(&plain).contains("Kafka password crosses the network"));
        let scram = [
            &sasl[..],
            &[
                "SCRAM-SHA-512",
                "--kafka-security-protocol",
                "SASL_PLAINTEXT",
            ],
        ]
        .concat();
        assert!(said(&scram).is_empty(), "SCRAM never sends the password");
        for off in ["false", "0", "F"] {
            let property = format!("enable.ssl.certificate.verification={off}");
            assert!(
                said(&["--kafka-property", &property]).contains("not verified"),
                "{off}"
            );
        }
        assert!(
            said(&[
                "--kafka-property",
                "enable.ssl.certificate.verification=true"
            ])
            .is_empty()
        );
        assert!(
            said(&[
                "--kafka-property",
                "ssl.endpoint.identification.algorithm=none"
            ])
            .contains("host names")
        );
        assert!(said(&["--rows-sink", "snuba", "--migrate-on-start"]).contains("ignored"));
    }

    #[test]
    fn a_refusal_threshold_of_one_is_rejected() {
        let with =
            |n: &str| parse(&["--blob-sink", "null", "--misconfigured-at-refusals", n]).validate();
        assert!(with("0").is_ok() && with("2").is_ok());
        let err = with("1").unwrap_err().to_string();
        assert!(err.contains("--misconfigured-at-refusals"), "{err}");
    }

    /// docs/operations.md's "Memory", from the flags: at the defaults with two processing
    /// threads, 256 MiB of buffer + 64 MiB of prefetch + 128 MiB window + 32 MiB hand-over + two
    /// 100 MiB decompression buffers, each with 8 MiB kept and 1 MiB of libzstd beside it + dead letters: an
    /// 8 MiB window and a 15 MB message past it, twice (librdkafka's copy), and 1 MiB read-ahead.
    #[test]
    fn the_memory_bound_counts_every_budget_and_a_buffer_per_thread() {
        let bound = |threads: &str| {
            parse(&["--blob-sink", "null", "--processing-threads", threads]).memory_bound() >> 20
        };
        // The window's part is the largest reservation one message can make (a 15 MB message
        // whose zstd body may decode to the 100 MiB cap: 145 MiB), not its 128 MiB.
        assert_eq!(bound("2"), 760);
        assert_eq!(bound("6"), 760 + 4 * 109);
        let items = parse(&[
            "--blob-sink",
            "null",
            "--processing-threads",
            "2",
            "--trace-items-rollout",
            "0.5",
        ]);
        assert_eq!(
            items.memory_bound() >> 20,
            760 + 25,
            "and their trace items' budget"
        );
    }

    #[test]
    fn a_drain_deadline_beyond_the_session_timeout_is_rejected_with_either_protocol() {
        let with = |protocol: &[&str]| {
            let mut args = vec![
                "--blob-sink",
                "null",
                "--drain-deadline-ms",
                "30000",
                "--session-timeout-ms",
                "30000",
            ];
            args.extend(protocol);
            parse(&args).validate()
        };
        let err = with(&[]).unwrap_err().to_string();
        assert!(err.contains("--drain-deadline-ms"), "{err}");
        // The consumer protocol sends no session timeout, but the flag stands for the broker's
        // there: a drain outlasting it could write on after the broker fenced a member cut off.
        let err = with(&["--kafka-property", "group.protocol=consumer"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--drain-deadline-ms"), "{err}");
    }

    #[test]
    fn a_poll_interval_the_drain_can_outlast_is_rejected() {
        let with = |interval: &str| {
            parse(&[
                "--blob-sink",
                "null",
                // librdkafka refuses a poll interval below the session timeout.
                "--session-timeout-ms",
                "21000",
                "--kafka-property",
                &format!("max.poll.interval.ms={interval}"),
            ])
            .validate()
        };
        let err = with("20500").unwrap_err().to_string();
        assert!(
            err.contains("max.poll.interval.ms (20500)")
                && err.contains("--drain-deadline-ms (20000)"),
            "{err}"
        );
        assert!(
            with("ten")
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
        assert!(with("21001").is_ok());
        // Unset, librdkafka's default bounds the drain: with the consumer protocol nothing else
        // does (the session timeout is the broker's), and it used to pass.
        let err = parse(&[
            "--blob-sink",
            "null",
            "--kafka-property",
            "group.protocol=consumer",
            "--session-timeout-ms",
            "600000",
            "--drain-deadline-ms",
            "400000",
            "--group-stall-timeout-ms",
            "0",
        ])
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("max.poll.interval.ms (300000)"), "{err}");
    }

    #[test]
    fn a_group_stall_a_rejoin_can_outlast_is_rejected_and_0_turns_it_off() {
        let with = |stall: &str, extra: &[&str]| {
            let mut args = vec!["--blob-sink", "null", "--group-stall-timeout-ms", stall];
            args.extend(extra);
            parse(&args).validate()
        };
        // librdkafka's poll interval (300 s), the drain deadline (20 s) and librdkafka's longest
        // reconnect backoff (10 s).
        let err = with("330000", &[]).unwrap_err().to_string();
        assert!(err.contains("(330000)"), "{err}");
        assert!(with("330001", &[]).is_ok());
        assert!(with("0", &[]).is_ok());
        let short_poll = ["--kafka-property", "max.poll.interval.ms=60000"];
        assert!(with("90000", &short_poll).is_err());
        assert!(with("90001", &short_poll).is_ok());
        let short_backoff = [
            "--kafka-property",
            "max.poll.interval.ms=60000",
            "--kafka-property",
            "reconnect.backoff.max.ms=1000",
        ];
        assert!(with("81000", &short_backoff).is_err());
        assert!(with("81001", &short_backoff).is_ok());
        let parsed = parse(&["--blob-sink", "null", "--group-stall-timeout-ms", "0"]);
        assert_eq!(parsed.pipeline_settings().unwrap().group_stall, None);
    }

    #[test]
    fn both_consumers_take_every_property_the_group_member_takes() {
        // The re-fetch consumer once kept librdkafka's 45 s session timeout, and refused a poll
        // interval below it that the group member took.
        let args = parse(&[
            "--blob-sink",
            "null",
            "--session-timeout-ms",
            "6000",
            "--drain-deadline-ms",
            "5000",
            "--kafka-property",
            "max.poll.interval.ms=20000",
        ]);
        args.validate().unwrap();
        for properties in [
            args.consumer_properties(),
            args.shared_consumer_properties(),
        ] {
            let mut config = args.kafka.client_config(&properties).unwrap();
            assert_eq!(
                config.get("metadata.recovery.rebootstrap.trigger.ms"),
                Some("30000")
            );
            config.set("group.id", "g");
            config
                .create::<rdkafka::consumer::BaseConsumer>()
                .unwrap_or_else(|e| panic!("{properties:?}: {e}"));
        }
    }

    #[test]
    fn statistics_go_to_the_group_member_only() {
        let args = parse(&[
            "--blob-sink",
            "null",
            "--kafka-property",
            "statistics.interval.ms=500",
        ]);
        let statistics = |properties: &[(&str, String)]| {
            let config = args.kafka.client_config(properties).unwrap();
            config.get(STATISTICS_INTERVAL).map(str::to_owned)
        };
        assert_eq!(
            statistics(&args.consumer_properties()).as_deref(),
            Some("500")
        );
        for other in [
            args.shared_consumer_properties(),
            producer_properties(1 << 20, Duration::from_secs(1)),
            Vec::new(),
        ] {
            assert_eq!(statistics(&other).as_deref(), Some("0"), "{other:?}");
        }
        let default = parse(&["--blob-sink", "null"]);
        let config = default.kafka.client_config(&default.consumer_properties());
        assert_eq!(config.unwrap().get(STATISTICS_INTERVAL), Some("10000"));
    }

    #[test]
    fn numeric_flags_out_of_range_are_refused_naming_the_flag() {
        for (flag, value) in [
            ("--processing-threads", "100000"),
            ("--max-decompressed-bytes", "0"),
            ("--max-message-bytes", "0"),
            ("--prefetch-kbytes", "99999999999"),
            ("--gcs-upload-concurrency", "0"),
            ("--buffer-max-messages", "0"),
            ("--sink-timeout-ms", "0"),
            ("--max-flushes-in-flight", "0"),
            ("--flush-initial-backoff-ms", "0"),
            ("--flush-max-backoff-ms", "0"),
            ("--max-clicks-per-segment", "101"),
            ("--max-taps-per-segment", "100000"),
        ] {
            let error = Cli::try_parse_from(["x", flag, value])
                .err()
                .unwrap_or_else(|| panic!("{flag} {value}"));
            assert!(error.to_string().contains(flag), "{flag}: {error}");
        }
        assert_eq!(
            parse(&["--processing-threads", "0"]).processing_threads,
            0,
            "0: one per CPU"
        );
    }

    #[test]
    fn producers_write_idempotently_with_every_replica() {
        let properties = producer_properties(1 << 20, Duration::from_secs(30));
        for expected in [("acks", "all"), ("enable.idempotence", "true")] {
            assert!(
                properties.iter().any(|(k, v)| (*k, v.as_str()) == expected),
                "{expected:?}"
            );
        }
    }

    #[test]
    fn backoffs_must_be_ordered_and_below_the_stall_timeout() {
        let base = ["--blob-sink", "null"];
        let err = parse(&[&base[..], &["--flush-initial-backoff-ms", "20000"]].concat())
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("--flush-initial-backoff-ms"),
            "{err}"
        );
        let err = parse(&[&base[..], &["--flush-max-backoff-ms", "300000"]].concat())
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("--flush-stall-timeout-ms"),
            "{err}"
        );
    }

    #[test]
    fn urls_other_than_http_and_https_are_refused() {
        for url in [
            "ftp://clickhouse:8123",
            "clickhouse:8123",
            "http://",
            "https:///x",
        ] {
            let err = parse(&["--blob-sink", "null", "--clickhouse-url", url])
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("--clickhouse-url"), "{url}: {err}");
        }
        assert!(
            parse(&[
                "--blob-sink",
                "null",
                "--clickhouse-url",
                "https://ch.internal:8443"
            ])
            .validate()
            .is_ok()
        );
        let err = parse(&["--gcs-bucket", "b", "--gcs-endpoint", "ftp://x"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("--gcs-endpoint"), "{err}");
    }

    #[test]
    fn a_buffer_smaller_than_one_message_is_rejected() {
        let err = parse(&["--blob-sink", "null", "--buffer-max-bytes", "20000000"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--buffer-max-bytes"), "{err}");
    }

    #[test]
    fn kafka_properties_pass_through_as_key_value_pairs_commas_included() {
        let args = parse(&[
            "--kafka-property",
            "client.id=a",
            "--kafka-property",
            "debug = cgrp,fetch",
        ]);
        let expected = [
            ("client.id".into(), "a".into()),
            ("debug".into(), "cgrp,fetch".into()),
        ];
        assert_eq!(args.kafka.properties().unwrap(), expected);
        // The environment variable holds one property per line.
        let args = parse(&["--kafka-property", "client.id=a\ndebug=cgrp,fetch\n"]);
        assert_eq!(args.kafka.properties().unwrap(), expected);
    }

    #[test]
    fn a_property_librdkafka_refuses_is_refused_before_anything_starts() {
        let with = |property: &str| {
            parse(&["--blob-sink", "null", "--kafka-property", property])
                .validate()
                .map_err(|e| e.to_string())
        };
        let err = with("fetch.max.wait.ms=100").unwrap_err();
        assert!(
            err.contains("\"fetch.max.wait.ms\" is not one librdkafka knows"),
            "{err}"
        );
        // Values of the wrong form, out of range, outside an enumeration: named, never shown.
        for (key, value) in [
            ("fetch.wait.max.ms", "ten"),
            ("fetch.wait.max.ms", "999999999"),
            ("isolation.level", "sideways"),
            ("linger.ms", "soon"),
        ] {
            let err = with(&format!("{key}={value}")).unwrap_err();
            assert!(
                err.contains(&format!("value of Kafka property {key:?}")) && !err.contains(value),
                "{err}"
            );
        }
        assert_eq!(with("fetch.wait.max.ms=100"), Ok(()));
    }

    #[test]
    fn properties_librdkafka_refuses_together_are_refused_before_anything_starts() {
        let with = |flags: &[&str]| {
            let mut argv = vec!["--blob-sink", "null"];
            argv.extend(flags);
            parse(&argv).validate().map_err(|e| e.to_string())
        };
        // Each property is valid alone; librdkafka refuses them together only when it creates
        // the client, which `check-config` did not do: the pod crash-looped on rollout.
        let err = with(&["--session-timeout-ms", "400000"]).unwrap_err();
        assert!(
            err.contains("`max.poll.interval.ms`must be >= `session.timeout.ms`"),
            "{err}"
        );
        let err = with(&["--kafka-property", "reconnect.backoff.ms=20000"]).unwrap_err();
        assert!(
            err.contains("`reconnect.backoff.max.ms` must be >="),
            "{err}"
        );
        // The producers' rules too.
        let err = with(&["--kafka-property", "linger.ms=40000"]).unwrap_err();
        assert!(err.contains("greater than `linger.ms`"), "{err}");
        // Nothing is reached or read: a TLS setup whose files are not mounted here passes.
        let tls = [
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "replay",
            "--kafka-sasl-password-file",
            "/nonexistent/password",
            "--kafka-ssl-ca-location",
            "/nonexistent/ca.pem",
        ];
        assert_eq!(with(&tls), Ok(()));
        assert_eq!(
            with(&[
                "--kafka-property",
                "max.poll.interval.ms=400000",
                "--session-timeout-ms",
                "400000"
            ]),
            Ok(())
        );
    }

    #[test]
    fn a_reconnect_backoff_the_refusal_gap_cannot_span_is_refused_unless_the_check_is_off() {
        let with = |backoff: &str, timeout: &str| {
            parse(&[
                "--blob-sink",
                "null",
                "--kafka-property",
                &format!("reconnect.backoff.max.ms={backoff}"),
                "--kafka-refused-timeout-ms",
                timeout,
            ])
            .validate()
            .map_err(|e| e.to_string())
        };
        assert_eq!(with("24999", "120000"), Ok(()));
        let err = with("25000", "120000").unwrap_err();
        assert!(err.contains("--kafka-refused-timeout-ms"), "{err}");
        assert_eq!(with("25000", "0"), Ok(()));
    }

    #[test]
    fn properties_a_flag_sets_or_the_guarantees_rest_on_are_refused() {
        let refused = |property: &str| {
            parse(&["--blob-sink", "null", "--kafka-property", property])
                .validate()
                .unwrap_err()
                .to_string()
        };
        for (property, flag) in [
            ("session.timeout.ms=10000", "--session-timeout-ms"),
            ("metadata.broker.list=elsewhere:9092", "--brokers"),
            ("fetch.max.bytes=1000000", "--fetch-max-bytes"),
            ("security.protocol=plaintext", "--kafka-security-protocol"),
            ("group.id=other", "--group-id"),
        ] {
            let err = refused(property);
            assert!(err.contains(&format!("use {flag} instead")), "{err}");
            assert!(!err.contains(property.split_once('=').unwrap().1), "{err}");
        }
        for (property, why) in [
            (
                "enable.auto.commit=true",
                "once a message's outputs are durable",
            ),
            (
                "enable.auto.offset.store=true",
                "once a message's outputs are durable",
            ),
            ("auto.offset.reset=latest", "earliest message"),
            ("acks=1", "acks=all"),
            ("request.required.acks=1", "acks=all"),
            ("enable.idempotence=false", "enable.idempotence=true"),
            ("transactional.id=t", "not transactional"),
        ] {
            let err = refused(property);
            assert!(
                err.contains("cannot be changed") && err.contains(why),
                "{err}"
            );
        }
        for secret in [
            "sasl.oauthbearer.config=principal=me",
            "sasl.oauthbearer.assertion.private.key.passphrase=p",
            "sasl.oauthbearer.assertion.private.key.pem=k",
        ] {
            assert!(refused(secret).contains("holds a secret"), "{secret}");
        }
    }

    #[test]
    fn the_largest_message_the_flag_accepts_can_be_dead_lettered() {
        let largest = LARGEST_MESSAGE_BYTES.to_string();
        let args = [
            "--blob-sink",
            "null",
            "--max-message-bytes",
            &largest,
            "--buffer-max-bytes",
            "4000000000",
            "--fetch-max-bytes",
            "1000000000",
        ];
        assert_eq!(parse(&args).validate().map_err(|e| e.to_string()), Ok(()));
        let past = (LARGEST_MESSAGE_BYTES + 1).to_string();
        let error = Cli::try_parse_from(["x", "--max-message-bytes", &past])
            .err()
            .expect("one byte more is refused");
        assert!(error.to_string().contains("--max-message-bytes"), "{error}");
    }

    #[test]
    fn kafka_property_errors_never_echo_a_value_and_secrets_are_refused() {
        let err = parse(&["--kafka-property", "hunter2"])
            .kafka
            .properties()
            .unwrap_err();
        assert!(
            err.contains("property 1 is not key=value") && !err.contains("hunter2"),
            "{err}"
        );
        for key in [
            "sasl.password",
            "ssl.key.password",
            "sasl.oauthbearer.client.secret",
        ] {
            let args = parse(&[
                "--blob-sink",
                "null",
                "--kafka-property",
                &format!("{key}=hunter2"),
            ]);
            let err = args.validate().unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("-file"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let err = parse(&["--kafka-property", "group.id=other"])
            .kafka
            .properties()
            .unwrap_err();
        assert!(err.contains("--group-id"), "{err}");
    }

    #[test]
    fn the_flush_stall_outlasts_the_longest_kafka_delivery() {
        let with = |flags: &[&str]| {
            let mut argv = vec!["--blob-sink", "null", "--sink-timeout-ms", "1000"];
            argv.extend(flags);
            parse(&argv).validate()
        };
        let stall = |ms: &str| {
            with(&[
                "--flush-stall-timeout-ms",
                ms,
                "--flush-max-backoff-ms",
                "200",
            ])
        };
        let err = stall("8000").unwrap_err().to_string();
        assert!(err.contains("must exceed 8000 ms"), "{err}");
        assert!(stall("8001").is_ok());
        // A lower message.timeout.ms does not shorten the longest upload: three sink timeouts
        // (with uploads: blobs to GCS).
        let upload = |blobs: &str, stall: &str| {
            parse(&[
                "--blob-sink",
                blobs,
                "--gcs-bucket",
                "b",
                "--sink-timeout-ms",
                "4000",
                "--flush-stall-timeout-ms",
                stall,
                "--flush-max-backoff-ms",
                "200",
                "--kafka-property",
                "message.timeout.ms=100",
            ])
            .validate()
        };
        let err = upload("gcs", "6000").unwrap_err().to_string();
        assert!(err.contains("must exceed 12000 ms"), "{err}");
        assert!(upload("gcs", "12001").is_ok());
        assert!(upload("null", "6000").is_ok(), "no upload to outlast");
        let longer = [
            "--flush-stall-timeout-ms",
            "8001",
            "--flush-max-backoff-ms",
            "200",
            "--kafka-property",
            "message.timeout.ms=2000",
        ];
        assert!(with(&longer).is_err(), "message.timeout.ms counts when set");
        let twice = [
            &longer[..],
            &["--kafka-property", "message.timeout.ms=1000"],
        ]
        .concat();
        assert!(
            with(&twice).is_ok(),
            "the last one given counts, as in librdkafka"
        );
    }

    #[test]
    fn deliveries_without_a_deadline_are_refused() {
        let properties = |line: &str| parse(&["--kafka-property", line]).kafka.properties();
        let err = properties("message.timeout.ms=0").unwrap_err();
        assert!(
            err.contains("message.timeout.ms") && err.contains("0"),
            "{err}"
        );
        let err = properties("delivery.timeout.ms=60000").unwrap_err();
        assert!(err.contains("message.timeout.ms"), "{err}");
        assert_eq!(
            properties("message.timeout.ms = 60000").unwrap(),
            [("message.timeout.ms".to_owned(), "60000".to_owned())]
        );
    }

    #[test]
    fn sasl_and_tls_settings_must_match_the_security_protocol() {
        let sasl = [
            "--blob-sink",
            "null",
            "--kafka-security-protocol",
            "SASL_SSL",
        ];
        assert!(
            parse(&sasl)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--kafka-sasl-mechanism")
        );
        let complete = [
            &sasl[..],
            &[
                "--kafka-sasl-mechanism",
                "scram-sha-512",
                "--kafka-sasl-username",
                "u",
            ],
        ]
        .concat();
        assert!(parse(&complete).validate().is_err(), "no password");
        let with_password = [&complete[..], &["--kafka-sasl-password", "p"]].concat();
        assert!(parse(&with_password).validate().is_ok());
        let stray = ["--blob-sink", "null", "--kafka-sasl-username", "u"];
        assert!(
            parse(&stray)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("SASL settings")
        );
        let stray_tls = ["--blob-sink", "null", "--kafka-ssl-ca-location", "/ca.pem"];
        assert!(
            parse(&stray_tls)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("TLS files")
        );
    }

    #[test]
    fn a_sasl_ssl_configuration_creates_a_client_and_never_prints_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "from-the-secret\n").unwrap();
        let args = parse(&[
            "--blob-sink",
            "null",
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "replay",
            "--kafka-sasl-password",
            "from-the-variable",
            "--kafka-sasl-password-file",
            file.to_str().unwrap(),
        ]);
        args.validate().unwrap();
        let config = args
            .kafka
            .client_config(&args.consumer_properties())
            .unwrap();
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(
            config.get("sasl.password"),
            Some("from-the-secret"),
            "the file wins"
        );
        // librdkafka built without TLS or SASL refuses these properties at creation.
        let consumer: rdkafka::consumer::BaseConsumer = config.create().expect("a SASL_SSL client");
        drop(consumer);
        let shown = format!("{args:?}");
        assert!(
            !shown.contains("from-the-variable") && !shown.contains("from-the-secret"),
            "{shown}"
        );
    }

    #[test]
    fn the_clickhouse_password_never_shows_in_debug_output() {
        let args = parse(&["--gcs-bucket", "b", "--clickhouse-password", "hunter2"]);
        let config = args.rows.clickhouse.config(Duration::from_secs(1)).unwrap();
        assert_eq!(config.password.expose(), "hunter2");
        for shown in [format!("{args:?}"), format!("{config:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }
}
