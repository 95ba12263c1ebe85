//! Publishing JSON records to Kafka for the sinks that write to topics (`events`, `snuba`):
//! records are sent as they are built and awaited in windows of [`DELIVERY_WINDOW_BYTES`], so a
//! large batch never holds all its values at once; the write returns once every delivery is
//! acknowledged, or after a window whose delivery failed for a reason a retry may get past (the
//! rest is not sent), and the failure that says most (a refused record or message before a
//! timeout) is its error. A record an earlier attempt delivered is
//! not sent again (each names its [`Piece`]). Also what every Kafka destination shares: how a
//! producer error is classified, the startup check that its topics exist, and the largest record
//! each topic takes ([`TopicLimits`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::admin::{AdminClient, AdminOptions, OwnedResourceSpecifier, ResourceSpecifier};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureRecord, Producer as _};
use tracing::warn;

use super::progress::keep_telling;
use super::{Piece, Progress, Retry, SinkError, Written};
use crate::kafka::Logged;
use crate::kafka::producer::Producer;
use crate::kafka::refusal::Refusal;

/// Bytes of values awaiting delivery at once within one write.
pub const DELIVERY_WINDOW_BYTES: usize = 8 * 1024 * 1024;

/// One message to publish.
pub struct Record<'a> {
    /// Which message of the batch it belongs to, and which of that message's records it is.
    pub piece: Piece,
    pub topic: &'a str,
    pub key: Option<String>,
    pub value: Vec<u8>,
}

pub struct Publisher {
    producer: Producer,
    sink: &'static str,
}

impl Publisher {
    /// `sink` names the sink in errors.
    pub fn new(producer: Producer, sink: &'static str) -> Self {
        Publisher { producer, sink }
    }

    /// Publishes every record `progress` does not have as delivered. An `Err` in `records` (a
    /// record that could not be built, or a message the sink refuses before sending any of its
    /// records) is the write's error once the rest is delivered. Counts every record, delivered
    /// before or now.
    pub async fn publish<'a>(
        &self,
        records: impl IntoIterator<Item = Result<Record<'a>, SinkError>>,
        progress: &Progress<'_>,
    ) -> Result<Written, SinkError> {
        let producer = &self.producer;
        in_windows(
            self.sink,
            records,
            progress,
            |topic, key, value| async move {
                let record = FutureRecord::<String, _>::to(topic).payload(&value);
                let record = match &key {
                    Some(key) => record.key(key),
                    None => record,
                };
                producer.send(record).await.map(drop)
            },
        )
        .await
    }
}

/// [`Publisher::publish`] with `send` for the producer: records sent as they come, awaited a
/// window of [`DELIVERY_WINDOW_BYTES`] at a time. A window with a delivery that failed for a
/// reason a retry may get past (a timeout, the broker gone) ends the sending, as
/// [`DlqSink`](super::dlq::DlqSink)'s does: the next window would wait as long for the same
/// answer, and a batch of trace items many windows long kept one attempt going for that many
/// delivery timeouts, the outage unreported until it ended. A refused record does not: the others
/// go on.
async fn in_windows<'a, S, F>(
    sink: &'static str,
    records: impl IntoIterator<Item = Result<Record<'a>, SinkError>>,
    progress: &Progress<'_>,
    send: S,
) -> Result<Written, SinkError>
where
    S: Fn(&'a str, Option<String>, Vec<u8>) -> F,
    F: std::future::Future<Output = Result<(), KafkaError>>,
{
    let mut written = Written::default();
    let mut window = Vec::new();
    let mut window_bytes = 0;
    let mut failure = None;
    for record in records {
        let Record {
            piece,
            topic,
            key,
            value,
        } = match record {
            Ok(record) => record,
            Err(refused) => {
                keep_telling(&mut failure, refused);
                continue;
            }
        };
        written.items += 1;
        written.bytes += value.len() as u64;
        if progress.is_stored(piece) {
            continue;
        }
        window_bytes += value.len();
        let delivery = send(topic, key, value);
        window.push(async move { (piece, delivery.await) });
        if window_bytes >= DELIVERY_WINDOW_BYTES {
            window_bytes = 0;
            if !deliver(sink, std::mem::take(&mut window), progress, &mut failure).await {
                return Err(failure.expect("a failed delivery is kept"));
            }
        }
    }
    deliver(sink, window, progress, &mut failure).await;
    match failure {
        Some(error) => Err(error),
        None => Ok(written),
    }
}

/// Waits for every delivery, marking each one acknowledged; keeps the failure that says most
/// (a refused record before a timeout) in `failure`. Whether none failed for a reason a retry
/// may get past.
async fn deliver<F>(
    sink: &'static str,
    deliveries: Vec<F>,
    progress: &Progress<'_>,
    failure: &mut Option<SinkError>,
) -> bool
where
    F: std::future::Future<Output = (Piece, Result<(), KafkaError>)>,
{
    let mut go_on = true;
    for (piece, delivery) in join_all(deliveries).await {
        match delivery {
            Ok(()) => progress.stored(piece),
            Err(e) => {
                let error = SinkError::from_error(sink, classify_producer_error(&e), e);
                progress.failed(&error);
                go_on &= error.retry != Retry::Retryable;
                keep_telling(failure, error);
            }
        }
    }
    go_on
}

/// What a record alone in its batch adds to its key and value on the broker, at most: the batch's
/// header (61 bytes, with the offset and length the broker counts) and the record's framing —
/// its length, key length and value length (varints, 5 bytes at most each), its attributes, its
/// offset and timestamp deltas (0 alone in a batch) and its header count (none), a byte each. The
/// broker compares a topic's `max.message.bytes` with the whole batch as the producer sent it
/// (uncompressed here: the producers set no compression).
pub const RECORD_OVERHEAD_BYTES: usize = 61 + 3 * 5 + 4;

/// librdkafka's `batch.size`, which the producers keep: records of one partition are sent in
/// batches up to this, and the broker refuses a batch over the topic's limit whole.
const PRODUCER_BATCH_BYTES: usize = 1_000_000;

/// How old the topics' limits may be when a write starts: a limit changed at run time is taken up
/// within this.
pub const LIMITS_MAX_AGE: Duration = Duration::from_secs(300);

/// How soon a read of the limits that failed is tried again.
const FAILED_READ_RETRY: Duration = Duration::from_secs(15);

/// The largest record each of some topics takes (`max.message.bytes`, as the brokers report it:
/// the topic's own setting or the broker's default), so that a sink can refuse a message whose
/// record would be refused before sending any of that message's records. Read on demand with an
/// admin client made for the read and dropped after it (no client, thread or connection held
/// between reads). A topic whose limit was never read (no `DescribeConfigs` permission on it,
/// say) has none: its records are sent and the broker decides.
pub struct TopicLimits {
    config: rdkafka::ClientConfig,
    topics: Vec<String>,
    timeout: Duration,
    /// Held across a read, so that a caller arriving during one waits for its result.
    reading: tokio::sync::Mutex<()>,
    read: Mutex<LimitsRead>,
}

struct LimitsRead {
    limits: Arc<HashMap<String, usize>>,
    /// When a read was last tried, and whether it failed.
    tried: Option<(Instant, bool)>,
}

impl TopicLimits {
    /// Limits of `topics`, read through a client made from `config`, each read within `timeout`.
    pub fn new(config: &rdkafka::ClientConfig, topics: Vec<String>, timeout: Duration) -> Self {
        TopicLimits {
            config: config.clone(),
            topics,
            timeout,
            reading: tokio::sync::Mutex::new(()),
            read: Mutex::new(LimitsRead {
                limits: Arc::default(),
                tried: None,
            }),
        }
    }

    /// The limits as last read.
    pub fn current(&self) -> Arc<HashMap<String, usize>> {
        self.lock().limits.clone()
    }

    /// Reads the limits again unless a read was tried less than `age` ago (a failed one: less
    /// than `FAILED_READ_RETRY` (15 s) or `age`, whichever is shorter). A topic the brokers do not
    /// describe keeps the limit last read for it.
    pub async fn refresh(&self, age: Duration) {
        let _reading = self.reading.lock().await;
        let due = match self.lock().tried {
            None => true,
            Some((at, failed)) => {
                at.elapsed()
                    >= if failed {
                        age.min(FAILED_READ_RETRY)
                    } else {
                        age
                    }
            }
        };
        if !due || self.topics.is_empty() {
            return;
        }
        let read = self.read().await;
        let mut known = self.lock();
        known.tried = Some((Instant::now(), read.is_err()));
        match read {
            Ok(read) => {
                let mut limits = (*known.limits).clone();
                limits.extend(read);
                known.limits = Arc::new(limits);
                let unread: Vec<&str> = self
                    .topics
                    .iter()
                    .filter(|t| !known.limits.contains_key(*t))
                    .map(String::as_str)
                    .collect();
                if !unread.is_empty() {
                    warn!(topics = ?unread, "the brokers did not give these topics' max.message.bytes (is DescribeConfigs allowed on them?): their records are sent unchecked");
                }
                let batched: Vec<(&String, &usize)> = known
                    .limits
                    .iter()
                    .filter(|(_, limit)| **limit < PRODUCER_BATCH_BYTES)
                    .collect();
                if !batched.is_empty() {
                    warn!(limits = ?batched, "max.message.bytes under the producer's batch.size ({PRODUCER_BATCH_BYTES}): records that each fit may be batched over it and refused together");
                }
            }
            Err(error) => {
                warn!(%error, topics = ?self.topics, retry_in_s = FAILED_READ_RETRY.as_secs(), "could not read the topics' max.message.bytes; the limits known before are kept (none at first: records are sent unchecked)");
            }
        }
    }

    /// Reads the limits once, saying nothing (what [`TopicLimits::refresh`] keeps and logs).
    pub async fn read(&self) -> Result<HashMap<String, usize>, KafkaError> {
        let admin: AdminClient<Logged> =
            self.config.create_with_context(Logged("an admin client"))?;
        let topics: Vec<ResourceSpecifier> = self
            .topics
            .iter()
            .map(|t| ResourceSpecifier::Topic(t))
            .collect();
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let described = admin.describe_configs(&topics, &options).await;
        // Dropping the client joins its polling thread, which wakes every 100 ms: 100 ms of the
        // write's time, unless dropped on another thread (2.5–4 ms a read on the local stack).
        tokio::task::spawn_blocking(move || drop(admin));
        // A topic the principal may not describe comes back without entries (rust-rdkafka does
        // not report per-topic errors): it is left out.
        Ok(described?
            .into_iter()
            .filter_map(|topic| {
                let topic = topic.ok()?;
                let limit = topic
                    .get("max.message.bytes")?
                    .value
                    .as_deref()?
                    .parse()
                    .ok()?;
                match topic.specifier {
                    OwnedResourceSpecifier::Topic(name) => Some((name, limit)),
                    _ => None,
                }
            })
            .collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LimitsRead> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why `record` would be refused by its topic under `limits`, if it would: its size with the
/// broker's framing, and the limit.
pub fn over_limit(limits: &HashMap<String, usize>, record: &Record<'_>) -> Option<(usize, usize)> {
    let limit = *limits.get(record.topic)?;
    let size =
        record.key.as_ref().map_or(0, String::len) + record.value.len() + RECORD_OVERHEAD_BYTES;
    (size > limit).then_some((size, limit))
}

/// Retry classification for producer errors: the message itself is unacceptable → rejected;
/// not allowed to write, or a producer in librdkafka's fatal state (an idempotence guarantee it
/// could not keep: no retry with it can succeed, a restart makes a new one) → fatal; anything
/// about the broker, network or queues → retryable.
pub fn classify_producer_error(error: &KafkaError) -> Retry {
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord,
        ) => Retry::Rejected,
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::Fatal,
        ) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// What librdkafka reports beside a request that a login or a certificate was refused (it
/// retries such connections, so the request itself only times out).
#[derive(Default)]
struct Refusals(std::sync::Mutex<Option<(Refusal, String)>>);

impl rdkafka::ClientContext for Refusals {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
        crate::kafka::log_line(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(refusal) = error
            .rdkafka_error_code()
            .and_then(|code| Refusal::of(code, reason))
        {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((refusal, reason.to_owned()));
        }
    }
}

impl rdkafka::producer::ProducerContext for Refusals {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// A producer for a sink named `sink`, from the producers' `config`.
pub fn producer(config: &rdkafka::ClientConfig, sink: &'static str) -> Result<Producer, SinkError> {
    config.create().map_err(|e| {
        SinkError::new(
            sink,
            Retry::Fatal,
            format_args!("creating the Kafka producer: {e}"),
        )
    })
}

/// [`check_topics`] as a sink's health check.
pub fn topics_check(
    config: &rdkafka::ClientConfig,
    topics: Vec<String>,
    timeout: Duration,
) -> super::Check {
    let config = config.clone();
    Box::new(move || {
        let (config, topics) = (config.clone(), topics.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || check_topics(&config, &topics, timeout))
                .await
                .unwrap_or_else(|e| Err(SinkError::new("kafka", Retry::Fatal, e)))
        })
    })
}

/// The startup check for topics, with a client of its own made from the producers' `config`:
/// every one of `topics` exists and the principal may see it. Reads the metadata of all topics
/// first. A topic the principal has no ACL for is left out of that answer, as a missing one is,
/// so each one left out is asked for by name, with auto-creation off (asked by name, brokers
/// that auto-create topics would otherwise create it): the brokers then say which it is. An
/// unreachable cluster is transient; a missing or refused topic is configuration, and so are
/// credentials or a certificate the brokers refuse — named with the flags that set them.
pub fn check_topics(
    config: &rdkafka::ClientConfig,
    topics: &[String],
    timeout: Duration,
) -> Result<(), SinkError> {
    let client: rdkafka::producer::BaseProducer<Refusals> = config
        .clone()
        .set("allow.auto.create.topics", "false")
        .create_with_context(Refusals::default())
        .map_err(|e| {
            SinkError::new(
                "kafka",
                Retry::Fatal,
                format_args!("creating a Kafka client: {e}"),
            )
        })?;
    // One deadline for the whole check, however many topics are asked for by name.
    let deadline = Instant::now() + timeout;
    let metadata = match client.client().fetch_metadata(None, timeout) {
        Ok(metadata) => metadata,
        Err(e) => {
            // Serve the error callbacks the failed connections queued.
            client.poll(Duration::from_millis(100));
            let refused = client
                .context()
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            return Err(match refused {
                Some((Refusal::Tls, reason)) => SinkError::new(
                    "kafka",
                    Retry::Fatal,
                    format_args!(
                        "TLS with the brokers failed (is their CA --kafka-ssl-ca-location?): {reason}"
                    ),
                ),
                Some((Refusal::Certificate, reason)) => SinkError::new(
                    "kafka",
                    Retry::Fatal,
                    format_args!(
                        "the brokers refused this client's certificate (they require one their CA signed: --kafka-ssl-certificate-location and --kafka-ssl-key-location): {reason}"
                    ),
                ),
                Some((Refusal::Login, reason)) => SinkError::new(
                    "kafka",
                    Retry::Fatal,
                    format_args!(
                        "the brokers refused the login (check --kafka-sasl-mechanism, --kafka-sasl-username and the password in --kafka-sasl-password-file or REPLAY_INGEST_KAFKA_SASL_PASSWORD): {reason}"
                    ),
                ),
                None => SinkError::new(
                    "kafka",
                    classify_producer_error(&e),
                    format_args!("reading topic metadata: {e}"),
                ),
            });
        }
    };
    let missing: Vec<&str> = topics
        .iter()
        .map(String::as_str)
        .filter(|name| {
            !metadata
                .topics()
                .iter()
                .any(|t| t.name() == *name && t.error().is_none())
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // Asked by name, within what is left of the check's time: the brokers refuse a topic the
    // principal has no ACL for, and say a missing one is unknown.
    let (mut refused, mut unknown, mut unanswered) = (Vec::new(), Vec::new(), Vec::new());
    for name in missing {
        match client.client().fetch_metadata(
            Some(name),
            deadline.saturating_duration_since(Instant::now()),
        ) {
            Ok(metadata)
                if metadata.topics().iter().any(|t| {
                    t.error().map(RDKafkaErrorCode::from)
                        == Some(RDKafkaErrorCode::TopicAuthorizationFailed)
                }) =>
            {
                refused.push(name)
            }
            Ok(_) => unknown.push(name),
            Err(e) => unanswered.push(format!("{name} ({e})")),
        }
    }
    let mut problems = Vec::new();
    if !refused.is_empty() {
        problems.push(format!(
            "the brokers do not let this principal see topics {} (an ACL is missing: READ on the consumed topic, WRITE on the ones published to; a topic that does not exist looks the same to a principal without one)",
            refused.join(", ")
        ));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "topics missing on the cluster: {}",
            unknown.join(", ")
        ));
    }
    if !unanswered.is_empty() {
        problems.push(format!(
            "topics missing on the cluster, or not visible to this principal (asked by name, the brokers did not say which): {}",
            unanswered.join(", ")
        ));
    }
    Err(SinkError::new("kafka", Retry::Fatal, problems.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Six records of half a window each, the fourth refused before sending when `refused`, and
    /// every delivery failing with `code`: how many were sent, and the write's error.
    async fn sent_with(code: Option<RDKafkaErrorCode>, refused: bool) -> (usize, Option<Retry>) {
        let status = crate::health::Status::default();
        let progress = Progress::new("events", &status);
        let records = (0..6).map(|offset| {
            if refused && offset == 3 {
                return Err(SinkError::new("events", Retry::Rejected, "not built"));
            }
            Ok(Record {
                piece: Piece {
                    partition: 0,
                    offset,
                    index: 0,
                },
                topic: "t",
                key: None,
                value: vec![0; DELIVERY_WINDOW_BYTES / 2],
            })
        });
        let sent = AtomicUsize::new(0);
        let written = in_windows("events", records, &progress, |_, _, _| {
            sent.fetch_add(1, Ordering::SeqCst);
            async move {
                match code {
                    Some(code) => Err(KafkaError::MessageProduction(code)),
                    None => Ok(()),
                }
            }
        })
        .await;
        (sent.into_inner(), written.err().map(|e| e.retry))
    }

    #[tokio::test]
    async fn a_window_that_timed_out_ends_the_sending_and_a_refused_record_does_not() {
        assert_eq!(sent_with(None, false).await, (6, None));
        assert_eq!(
            sent_with(Some(RDKafkaErrorCode::MessageTimedOut), false).await,
            (2, Some(Retry::Retryable)),
            "the first window timed out: the others are not sent"
        );
        assert_eq!(
            sent_with(Some(RDKafkaErrorCode::MessageSizeTooLarge), false).await,
            (6, Some(Retry::Rejected)),
            "records refused on delivery: the others are still sent"
        );
        assert_eq!(
            sent_with(None, true).await,
            (5, Some(Retry::Rejected)),
            "a record refused before sending: the others are sent"
        );
    }

    #[test]
    fn a_record_is_over_its_topics_limit_with_the_brokers_framing_and_unchecked_without_a_limit() {
        let limits = HashMap::from([("o".to_owned(), 1000)]);
        let record = |topic, key: Option<&str>, value: usize| Record {
            piece: Piece {
                partition: 0,
                offset: 0,
                index: 0,
            },
            topic,
            key: key.map(str::to_owned),
            value: vec![b'x'; value],
        };
        let fits = 1000 - RECORD_OVERHEAD_BYTES;
        assert_eq!(over_limit(&limits, &record("o", None, fits)), None);
        assert_eq!(
            over_limit(&limits, &record("o", None, fits + 1)),
            Some((1001, 1000))
        );
        assert_eq!(
            over_limit(&limits, &record("o", Some("ab"), fits - 1)),
            Some((1001, 1000)),
            "the key counts"
        );
        assert_eq!(
            over_limit(&limits, &record("unread", None, 1 << 20)),
            None,
            "a topic whose limit is not known is left to the broker"
        );
    }

    #[test]
    fn oversized_messages_are_rejected_unauthorised_ones_fatal_and_broker_trouble_retried() {
        let oversized = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify_producer_error(&oversized), Retry::Rejected);
        let auth = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(classify_producer_error(&auth), Retry::Fatal);
        let fatal = KafkaError::MessageProduction(RDKafkaErrorCode::Fatal);
        assert_eq!(classify_producer_error(&fatal), Retry::Fatal);
        for code in [
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
        ] {
            assert_eq!(
                classify_producer_error(&KafkaError::MessageProduction(code)),
                Retry::Retryable,
                "{code:?}"
            );
        }
    }
}
