//! The dead-letter topic: every invalid message's original bytes, with headers saying why —
//! `reason`, `detail`, `original_topic`, `original_partition`, `original_offset`,
//! `original_timestamp`, and `sink` for a valid message a sink rejected (`rejected_by_sink`;
//! `detail` then holds the sink's error; and `original_lost: true`, with no value, when the
//! message was gone from its topic by the time it was read again, or another message was at its
//! offset); and `redriven_from` for a message `redrive` put back, which failed again. Written as
//! part of the flush,
//! so it is durable before the offset commits.
//!
//! A dead letter larger than the topic accepts is not dropped and does not stop the flush: its
//! value is written whole to the blob store under `dlq/{project}/{replay}/{topic}/{partition}/
//! {offset}` ([`copy_key`]; `dlq/unknown/…` when the value does not say whose it is) and the
//! record on the topic carries no value, only the headers plus `payload_location` (where the
//! value is, e.g. `gs://bucket/dlq/…`) and `payload_bytes`; a key over 1 KiB goes alongside the
//! value (`….key`, header `key_location`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use tracing::{error, warn};

use super::progress::keep_telling;
use super::publish::{DELIVERY_WINDOW_BYTES, classify_producer_error};
use super::{
    Built, DeadLetters, Entries, Entry, InvalidMessage, ObjectStore, Outcome, Piece, Progress,
    Rejected, Retry, Sink, SinkError, Writing, Written,
};
use crate::kafka::producer::{DeliveryFuture, Producer, Undelivered};
use crate::kafka::record::{REDRIVEN_FROM, Record};
use crate::kafka::refetch::{RefetchError, Refetcher};
use crate::recording::InvalidRecording;

#[derive(Clone)]
pub struct DlqSink {
    producer: Producer,
    topic: String,
    /// The largest record the topic accepts (its `max.message.bytes`): a dead letter that would
    /// be larger, or that the broker refuses as too large, is kept whole in `overflow`.
    max_record_bytes: usize,
    overflow: Option<Arc<dyn ObjectStore>>,
}

/// Keys longer than this travel with the value to the object store when a dead letter overflows:
/// the record left on the topic stays small whatever the message.
const MAX_POINTER_KEY_BYTES: usize = 1024;

/// Bytes a record costs beyond its key, value and headers (record and batch framing), counted
/// generously when deciding whether a dead letter fits the topic.
const RECORD_OVERHEAD_BYTES: usize = 512;

impl DlqSink {
    pub fn new(
        producer: Producer,
        topic: impl Into<String>,
        max_record_bytes: usize,
        overflow: Option<Arc<dyn ObjectStore>>,
    ) -> Self {
        DlqSink {
            producer,
            topic: topic.into(),
            max_record_bytes,
            overflow,
        }
    }

    /// Sends one dead letter: whole when it fits the topic, otherwise its value (and a long key)
    /// to the object store and a pointer record to the topic. A record librdkafka refuses as too
    /// large takes the second path too.
    async fn send(
        &self,
        entry: &Entry,
        message: &InvalidMessage,
        progress: &Progress<'_>,
    ) -> Result<DeliveryFuture, SinkError> {
        let letter_headers = headers(entry, message);
        let key = message.key.as_deref();
        let size = message.value.len()
            + key.map_or(0, <[u8]>::len)
            + headers_len(&letter_headers)
            + RECORD_OVERHEAD_BYTES;
        if size > self.max_record_bytes {
            return self
                .send_pointer(entry, message, letter_headers, progress)
                .await;
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
            .payload(&message.value)
            .headers(letter_headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        match self.producer.enqueue(record) {
            Ok(delivery) => Ok(delivery),
            // Rare: the headers are built again rather than cloned for every dead letter.
            Err(e) if classify_producer_error(&e) == Retry::Rejected => {
                self.send_pointer(entry, message, headers(entry, message), progress)
                    .await
            }
            Err(e) => Err(SinkError::from_error(
                self.name(),
                classify_producer_error(&e),
                e,
            )),
        }
    }

    /// Keeps the value whole in the object store, at a key derived from where the message was
    /// consumed (a retry rewrites the same object), and sends a record without it: the same
    /// headers plus `payload_location`, `payload_bytes` and, for a long key, `key_location`.
    async fn send_pointer(
        &self,
        entry: &Entry,
        message: &InvalidMessage,
        headers: OwnedHeaders,
        progress: &Progress<'_>,
    ) -> Result<DeliveryFuture, SinkError> {
        let Some(store) = &self.overflow else {
            return Err(SinkError::new(
                self.name(),
                Retry::Fatal,
                format_args!(
                    "a dead letter of {} bytes does not fit the dead-letter topic and no blob store is configured to keep it",
                    message.value.len()
                ),
            ));
        };
        let object = copy_key(
            &message.value,
            &message.topic,
            entry.partition,
            entry.offset,
        );
        progress
            .put_once(
                store.as_ref(),
                &object,
                &message.value,
                Piece::of(entry, VALUE_COPY),
            )
            .await?;
        let location = store.location(&object);
        let bytes = message.value.len().to_string();
        let mut headers = headers
            .insert(Header {
                key: "payload_location",
                value: Some(location.as_str()),
            })
            .insert(Header {
                key: "payload_bytes",
                value: Some(bytes.as_str()),
            });
        let mut key = message.key.as_deref();
        let key_location;
        if let Some(long) = key.filter(|k| k.len() > MAX_POINTER_KEY_BYTES) {
            let object = format!("{object}.key");
            progress
                .put_once(store.as_ref(), &object, long, Piece::of(entry, KEY_COPY))
                .await?;
            key_location = store.location(&object);
            headers = headers.insert(Header {
                key: "key_location",
                value: Some(key_location.as_str()),
            });
            key = None;
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
            .payload(&[])
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        // One per letter: throttled, as a burst of large hostile bodies would flood the log.
        if let Some(held_back) = crate::logs::KEPT_IN_STORE.admit() {
            warn!(partition = entry.partition, offset = entry.offset, bytes = message.value.len(), %location, held_back, "dead letter too large for its topic: value kept in the blob store");
        }
        self.producer
            .enqueue(record)
            .map_err(|e| SinkError::from_error(self.name(), pointer_retry(&e), e))
    }
}

/// Where the value of the dead letter of `value`, consumed at `partition`/`offset` of `topic`, is
/// kept: under its replay, [`copies_prefix`] (so that `delete` finds a replay's copies by their
/// names, reading none), or `dlq/unknown/` when the value does not say whose it is; then where it
/// was consumed, so that a retry writes the same object.
pub fn copy_key(value: &[u8], topic: &str, partition: i32, offset: i64) -> String {
    match crate::recording::envelope::owner(value) {
        Some((project, replay)) => format!(
            "{}{topic}/{partition}/{offset}",
            copies_prefix(project, &replay.simple().to_string())
        ),
        None => format!("dlq/{UNKNOWN_OWNER}/{topic}/{partition}/{offset}"),
    }
}

/// The prefix of every dead-letter copy of a message of `replay` (32 hex characters) of
/// `project`, and of the objects beside each (its long key, a crashed write's temporary file).
pub fn copies_prefix(project: u64, replay: &str) -> String {
    format!("dlq/{project}/{replay}/")
}

const UNKNOWN_OWNER: &str = "unknown";

/// Whether `key` is where [`copy_key`] puts copies (and their long keys): under `dlq/`, with no
/// `..` that would lead out of it.
pub fn is_copy_key(key: &str) -> bool {
    key.starts_with("dlq/") && !key.split('/').any(|part| part == "..")
}

/// Whether `directory`, right under `dlq/` (`dlq/{name}/`), holds copies written before keys
/// named their owner (by versions before 2026-12-04: `dlq/{topic}/{partition}/{offset}`), whose
/// values say whose they are: a topic's directory, not a project's ([`copies_prefix`]) nor
/// `dlq/unknown/`. (A topic named by digits alone, or `unknown`, is taken for the newer layout.)
pub fn holds_unnamed_copies(directory: &str) -> bool {
    let name = directory
        .strip_prefix("dlq/")
        .unwrap_or(directory)
        .trim_end_matches('/');
    !name.is_empty() && name != UNKNOWN_OWNER && name.parse::<u64>().is_err()
}

/// A pointer record is small: the topic refusing it is configuration, not data.
fn pointer_retry(error: &KafkaError) -> Retry {
    match classify_producer_error(error) {
        Retry::Rejected => Retry::Fatal,
        other => other,
    }
}

/// The headers every dead letter carries.
fn headers(entry: &Entry, message: &InvalidMessage) -> OwnedHeaders {
    let partition = entry.partition.to_string();
    let offset = entry.offset.to_string();
    let timestamp = message.timestamp.map(|t| t.to_string()).unwrap_or_default();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "reason",
            value: Some(message.error.reason.as_str()),
        })
        .insert(Header {
            key: "detail",
            value: Some(message.error.detail.as_str()),
        })
        .insert(Header {
            key: "original_topic",
            value: Some(message.topic.as_str()),
        })
        .insert(Header {
            key: "original_partition",
            value: Some(partition.as_str()),
        })
        .insert(Header {
            key: "original_offset",
            value: Some(offset.as_str()),
        })
        .insert(Header {
            key: "original_timestamp",
            value: Some(timestamp.as_str()),
        });
    let headers = match message.rejected_by {
        Some(sink) => headers.insert(Header {
            key: "sink",
            value: Some(sink),
        }),
        None => headers,
    };
    let headers = match &message.redriven_from {
        Some(letter) => headers.insert(Header {
            key: REDRIVEN_FROM,
            value: Some(&**letter),
        }),
        None => headers,
    };
    if message.original_lost {
        headers.insert(Header {
            key: "original_lost",
            value: Some("true"),
        })
    } else {
        headers
    }
}

fn headers_len(headers: &OwnedHeaders) -> usize {
    headers
        .iter()
        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
        .sum()
}

/// Dead-letters messages a sink rejected: their original bytes are read again from the consumed
/// topic, then written to the dead-letter topic like any invalid message.
pub struct RejectedToDlq {
    pub dlq: DlqSink,
    pub source: Refetcher,
    pub source_topic: String,
    /// How long one original message may take to read again.
    pub timeout: Duration,
}

impl DeadLetters for RejectedToDlq {
    /// Reads each original message again (a blocking fetch, on the flush's thread) and sends it
    /// as a dead letter.
    fn dead_letter<'a>(&'a self, rejected: &'a [Rejected], progress: &'a Progress) -> Writing<'a> {
        Box::pin(self.dead_letter_now(rejected, progress))
    }
}

impl RejectedToDlq {
    async fn dead_letter_now(
        &self,
        rejected: &[Rejected],
        progress: &Progress<'_>,
    ) -> Result<Written, SinkError> {
        // Sent a window at a time: the originals read again are held only until their window
        // is sent (a flush whose every message a sink refused held them all, up to the whole
        // batch's bytes a second time).
        let (mut entries, mut held, mut written) = (Vec::new(), 0, Written::default());
        for r in rejected {
            if progress.is_stored(Piece {
                partition: r.partition,
                offset: r.offset,
                index: RECORD,
            }) {
                continue;
            }
            let detail = format!("{}: {}", r.error.sink, r.error.message);
            // A message gone from the topic cannot be read however long the flush retries, and
            // one whose offset holds another message now is not that one's to give: its dead
            // letter says where it was and why it was refused, without its bytes. Each is logged
            // once per message, and again at each retry of the dead-letter write (a retention
            // cut takes a run of them): throttled.
            let lost_because = match self.source.fetch(r.partition, r.offset, self.timeout) {
                Ok(read) => match r.original.replaced_by(&read.value) {
                    None => Ok(read),
                    Some(other) => {
                        if let Some(held_back) = crate::logs::ORIGINAL_REPLACED.admit() {
                            error!(partition = r.partition, offset = r.offset, found = %other, held_back, "a message a sink rejected is no longer at its offset, another message is: dead-lettered without its bytes");
                        }
                        Err(format!("another message is at its offset now: {other}"))
                    }
                },
                Err(gone @ RefetchError::Gone { .. }) => {
                    if let Some(held_back) = crate::logs::ORIGINAL_LOST.admit() {
                        error!(partition = r.partition, offset = r.offset, %gone, held_back, "a message a sink rejected is gone from the topic: dead-lettered without its bytes");
                    }
                    Err(gone.to_string())
                }
                Err(e) => return Err(SinkError::from_error("rejected", Retry::Retryable, e)),
            };
            let (original, detail, lost) = match lost_because {
                Ok(read) => (read, detail, false),
                Err(why) => {
                    let missing = Record {
                        partition: r.partition,
                        offset: r.offset,
                        value: Default::default(),
                        key: None,
                        timestamp: None,
                        redriven_from: None,
                        leader_epoch: None,
                    };
                    let detail = format!("{detail} (original bytes lost: {why})");
                    (missing, detail, true)
                }
            };
            progress.stepped();
            let message = InvalidMessage {
                error: InvalidRecording::new(r.reason(), detail),
                value: Vec::from(original.value),
                key: original.key,
                topic: self.source_topic.clone(),
                timestamp: original.timestamp,
                rejected_by: Some(r.error.sink),
                original_lost: lost,
                redriven_from: original.redriven_from,
            };
            held += message.bytes();
            entries.push(Entry {
                partition: r.partition,
                offset: r.offset,
                outcome: Outcome::Invalid(Box::new(message)),
            });
            if held >= DELIVERY_WINDOW_BYTES {
                written += self.dlq.write(&entries, progress).await?;
                (entries, held) = (Vec::new(), 0);
            }
        }
        written += self.dlq.write(&entries, progress).await?;
        Ok(written)
    }
}

impl Sink for DlqSink {
    fn name(&self) -> &'static str {
        "dlq"
    }

    fn topics(&self) -> Vec<String> {
        vec![self.topic.clone()]
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(entry.outcome, Outcome::Invalid(_))
    }

    /// Sends the dead letters an earlier attempt did not deliver; what a failed attempt stored
    /// (records, blob-store copies) is not sent again.
    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(self.send_all(batch, progress))
    }
}

impl DlqSink {
    /// Sends the letters in windows of [`DELIVERY_WINDOW_BYTES`], each delivered before the next
    /// is sent: librdkafka keeps a copy of every record until its delivery, and a batch of dead
    /// letters is as large as the buffer's share of a flush (the other producers' writes hold
    /// 8 MiB at most too). A window with a failure ends the sending, not the attempt: what it
    /// enqueued is still awaited and marked stored, so the retry sends only the rest.
    async fn send_all(
        &self,
        batch: &[Entry],
        progress: &Progress<'_>,
    ) -> Result<Written, SinkError> {
        let letters: Vec<(&Entry, &InvalidMessage)> = batch.invalid().collect();
        let written = Written {
            items: letters.len() as u64,
            bytes: letters
                .iter()
                .map(|(_, message)| message.value.len() as u64)
                .sum(),
        };
        let mut unsent = letters
            .into_iter()
            .filter(|(entry, _)| !progress.is_stored(Piece::of(entry, RECORD)));
        let mut failure = None;
        while failure.is_none() {
            // A letter that cannot be enqueued (its blob-store copy failed, the queue is full)
            // ends the window.
            let (mut sent, mut deliveries, mut bytes) = (Vec::new(), Vec::new(), 0);
            for (entry, message) in unsent.by_ref() {
                match self.send(entry, message, progress).await {
                    Ok(delivery) => {
                        deliveries.push(delivery);
                        sent.push((entry, message));
                        bytes += message.bytes();
                    }
                    Err(e) => {
                        keep_telling(&mut failure, e);
                        break;
                    }
                }
                if bytes >= DELIVERY_WINDOW_BYTES {
                    break;
                }
            }
            if sent.is_empty() {
                break;
            }
            self.deliver(sent, deliveries, progress, &mut failure).await;
        }
        failure.map_or(Ok(written), Err)
    }

    /// Waits for the deliveries of the letters `sent`, marking each delivered one stored. A
    /// broker whose topic limit is below `max_record_bytes` refuses the record on delivery: that
    /// dead letter goes the pointer's way. Keeps the failure that says most in `failure`.
    async fn deliver(
        &self,
        sent: Vec<(&Entry, &InvalidMessage)>,
        deliveries: Vec<DeliveryFuture>,
        progress: &Progress<'_>,
        failure: &mut Option<SinkError>,
    ) {
        let (mut pointed, mut pointers) = (Vec::new(), Vec::new());
        for ((entry, message), delivery) in sent.into_iter().zip(join_all(deliveries).await) {
            match delivered(delivery, classify_producer_error) {
                Ok(()) => progress.stored(Piece::of(entry, RECORD)),
                Err(e) if e.retry == Retry::Rejected => match self
                    .send_pointer(entry, message, headers(entry, message), progress)
                    .await
                {
                    Ok(pointer) => {
                        pointers.push(pointer);
                        pointed.push(entry);
                    }
                    // The blob store's failure was counted by its request.
                    Err(e) => keep_telling(failure, e),
                },
                Err(e) => {
                    progress.failed(&e);
                    keep_telling(failure, e);
                }
            }
        }
        for (entry, delivery) in pointed.into_iter().zip(join_all(pointers).await) {
            match delivered(delivery, pointer_retry) {
                Ok(()) => progress.stored(Piece::of(entry, RECORD)),
                Err(e) => {
                    progress.failed(&e);
                    keep_telling(failure, e);
                }
            }
        }
    }
}

/// The pieces of one dead letter: its record on the topic, and the blob-store copies of an
/// oversized one (value, long key).
const RECORD: u32 = 0;
const VALUE_COPY: u32 = 1;
const KEY_COPY: u32 = 2;

/// The outcome of one delivery, its error classified by `classify`.
fn delivered(
    delivery: Result<OwnedDeliveryResult, Undelivered>,
    classify: fn(&KafkaError) -> Retry,
) -> Result<(), SinkError> {
    match delivery {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(SinkError::new("dlq", classify(&e), e)),
        Err(undelivered) => Err(SinkError::new("dlq", Retry::Retryable, undelivered)),
    }
}

/// The dead-letter sink on `topic` (oversized dead letters whole in `overflow`), and a handle on
/// it for the messages other sinks reject. Its health check: the topic exists.
pub fn build(
    producer: &rdkafka::ClientConfig,
    topic: &str,
    max_record_bytes: usize,
    overflow: Option<Arc<dyn ObjectStore>>,
    timeout: Duration,
) -> Result<(Built, DlqSink), SinkError> {
    let dlq = DlqSink::new(
        super::publish::producer(producer, "dlq")?,
        topic,
        max_record_bytes,
        overflow,
    );
    let check = super::publish::topics_check(producer, vec![topic.to_owned()], timeout);
    Ok((
        Built::checked(dlq.clone(), dlq.name(), "the Kafka topics", check),
        dlq,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::Reason;

    /// A batch of dead letters several delivery windows large, no broker listening (each
    /// delivery times out after 200 ms, never sent): the attempt enqueues one window — ten
    /// letters of 900 kB make the first 8 MiB — and stops there, the rest left to the retry. It
    /// used to hand all of them to librdkafka at once, which copies each until its delivery: a
    /// flood of corrupt segments held a second copy of the flush's whole share of the buffer.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_attempt_holds_one_window_of_letters_in_the_producer_at_a_time() {
        let producer = crate::kafka::producer::unreachable(200).create().unwrap();
        let sink = DlqSink::new(producer, "dlq", 2_000_000, None);
        let entries = (0..40)
            .map(|offset| Entry {
                partition: 0,
                offset,
                outcome: Outcome::Invalid(Box::new(InvalidMessage {
                    error: InvalidRecording::new(Reason::InvalidMsgpack, "not a segment"),
                    value: vec![b'x'; 900_000],
                    key: None,
                    topic: "rec".to_owned(),
                    timestamp: None,
                    rejected_by: None,
                    original_lost: false,
                    redriven_from: None,
                })),
            })
            .collect::<Vec<_>>();
        let status = crate::health::Status::default();
        let progress = Progress::new(sink.name(), &status);
        sink.write(&entries, &progress).await.unwrap_err();
        assert!(
            progress.looks_down(10) && !progress.looks_down(11),
            "ten deliveries failed, and no more were made"
        );
    }

    #[test]
    fn a_copy_is_kept_under_its_replay_and_its_key_says_whose_it_is() {
        let value = rmp_serde::to_vec_named(&serde_json::json!({"project_id": 42,
            "replay_id": "834f314caae54030a1b0dc52b202f24a", "payload": "corrupt"}))
        .unwrap();
        let key = copy_key(&value, "ingest-replay-recordings", 3, 1234);
        assert_eq!(
            key,
            "dlq/42/834f314caae54030a1b0dc52b202f24a/ingest-replay-recordings/3/1234"
        );
        assert!(key.starts_with(&copies_prefix(42, "834f314caae54030a1b0dc52b202f24a")));
        let unknown = copy_key(b"not msgpack", "rec", 0, 7);
        assert_eq!(unknown, "dlq/unknown/rec/0/7");
        assert!(is_copy_key(&key) && is_copy_key(&format!("{key}.key")));
        for outside in [
            "90/42/834f314caae54030a1b0dc52b202f24a/0",
            "dlq/../etc/passwd",
            "dlq/a/../../x",
        ] {
            assert!(!is_copy_key(outside), "{outside}");
        }
        for (directory, unnamed) in [
            ("dlq/ingest-replay-recordings/", true),
            ("dlq/rec/", true),
            ("dlq/42/", false),
            ("dlq/unknown/", false),
        ] {
            assert_eq!(holds_unnamed_copies(directory), unnamed, "{directory}");
        }
    }
}
