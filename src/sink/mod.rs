//! Flush sinks: where a buffered batch goes. Every sink looks the same — an async `write` of the
//! whole batch, and an error that says whether a retry can help.
//!
//! - [`gcs`]: blobs to Google Cloud Storage (production);
//! - [`filesystem`]: blobs as files under a directory (local runs and tests);
//! - [`clickhouse`]: click, tap and segment rows, inserted into snuba's `replays_local` table;
//! - [`snuba`]: the same rows as `ingest-replay-events` messages, for snuba to insert;
//! - [`events`]: outcomes, analytics events and issue occurrences to their Kafka topics;
//! - [`trace_items`]: breadcrumbs as EAP trace items to `snuba-items` (off by default);
//! - [`dlq`]: invalid messages, with their original bytes, to the dead-letter topic;
//! - [`null`]: accepts everything (benchmarks the pipeline alone).
//!
//! [`publish`] is what the sinks that write to Kafka topics share.
//!
//! The flush runs on a blocking thread and drives each stage's writes from there with one
//! `Handle::block_on` (`pipeline::flush`), the one bridge from the blocking pool into async: the
//! sinks of a stage, their requests and their retries' backoff are futures on that thread, not
//! threads of their own. A write's own CPU work (encoding rows, say) runs there too, off the
//! runtime's workers.
//!
//! Each sink module has one `build` that gives a [`Built`]: the sink and the health check of its
//! destination, in one shape for all ([`Check`]); `startup` runs the checks and holds each sink's
//! writes until its check passes. Adding a sink is its module and the line that picks it.

pub mod clickhouse;
pub mod dlq;
pub mod events;
pub mod filesystem;
pub mod gcs;
pub mod gcs_credentials;
pub mod gcs_json;
pub mod null;
pub mod progress;
pub mod publish;
pub mod snuba;
pub mod store;
pub mod trace_items;

use std::fmt;
use std::sync::Arc;

use futures::future::{BoxFuture, LocalBoxFuture};

pub use self::progress::{Piece, Progress};

/// What one sink wrote in one flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    pub items: u64,
    pub bytes: u64,
}

impl std::ops::AddAssign for Written {
    fn add_assign(&mut self, more: Written) {
        self.items += more.items;
        self.bytes += more.bytes;
    }
}

/// `url` starts with `http://` or `https://` and names a host: anything else (`ftp://`, a bare
/// host, a typo) would otherwise be waited on for ever as "not reachable yet". Credentials in it
/// (`user:password@`) are refused without being repeated: the URL goes into errors, logs,
/// `/status` and the chart's ConfigMap, and each destination has flags for its credentials. So
/// is a query or a fragment: the clients drop them (`?password=…` would fail to authenticate,
/// and then be logged in the error that names the URL).
pub fn http_url(flag: &str, url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    // Anywhere, not only before the first `/`: a password holding one (`user:ab/cd@host`, as
    // generated ones do) passed, and the URL, unparsable, was then printed whole in the error.
    if url.contains('@') {
        return Err(format!(
            "{flag} holds credentials (user:password@): give them with the flags for them, and only the server's address here"
        ));
    }
    if url.contains(['?', '#']) {
        return Err(format!(
            "{flag} holds a query or a fragment, which the client drops: give settings and credentials with the flags for them, and only the server's address here"
        ));
    }
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(format!(
            "{flag} {url:?} is not an http:// or https:// URL with a host"
        )),
    }
}

/// The authority of a URL's part after its scheme: up to its path, query or fragment.
fn authority(rest: &str) -> &str {
    rest.split(['/', '?', '#']).next().unwrap_or_default()
}

/// Whether a request to `url` crosses the network unencrypted: `http://` to a host other than
/// this one.
pub fn sent_in_clear(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = authority(rest);
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    !(host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback()))
}

/// A destination's health check: it exists and takes writes. A failure says whether a retry can
/// help (the destination does not answer) or not (configuration).
pub type Check = Box<dyn FnMut() -> BoxFuture<'static, Result<(), SinkError>> + Send>;

/// A health check with what it checks: `what` names its outage (`/status`, logs), `describes`
/// the destination in an error (`the GCS bucket`).
pub struct Checked {
    pub what: &'static str,
    pub describes: &'static str,
    pub check: Check,
}

/// What a sink module builds: the sink, and the check its writes wait for.
pub struct Built {
    pub sink: Box<dyn Sink>,
    pub check: Option<Checked>,
}

impl Built {
    /// A sink with no destination to check (null, the filesystem store).
    pub fn unchecked(sink: impl Sink + 'static) -> Built {
        Built {
            sink: Box::new(sink),
            check: None,
        }
    }

    pub fn checked(
        sink: impl Sink + 'static,
        what: &'static str,
        describes: &'static str,
        check: Check,
    ) -> Built {
        Built {
            sink: Box::new(sink),
            check: Some(Checked {
                what,
                describes,
                check,
            }),
        }
    }
}
use crate::recording::{InvalidRecording, Processed, Reason};

/// One consumed message as the flush sees it.
#[derive(Debug)]
pub struct Entry {
    pub partition: i32,
    pub offset: i64,
    pub outcome: Outcome,
}

#[cfg(test)]
impl Entry {
    /// An invalid message at `partition`/`offset`, for the unit tests of what handles entries.
    pub fn invalid_for_test(partition: i32, offset: i64) -> Entry {
        Entry {
            partition,
            offset,
            outcome: Outcome::Invalid(Box::new(InvalidMessage {
                error: crate::recording::InvalidRecording::new(
                    crate::recording::Reason::WrongType,
                    "x",
                ),
                value: vec![],
                key: None,
                topic: "t".into(),
                timestamp: None,
                rejected_by: None,
                original_lost: false,
                redriven_from: None,
            })),
        }
    }
}

#[derive(Debug)]
pub enum Outcome {
    Valid(Box<Processed>),
    Invalid(Box<InvalidMessage>),
}

/// A message the recording core rejected, kept whole for the dead-letter topic.
#[derive(Debug)]
pub struct InvalidMessage {
    pub error: InvalidRecording,
    /// The original message value, byte for byte.
    pub value: Vec<u8>,
    pub key: Option<Vec<u8>>,
    pub topic: String,
    /// Kafka message timestamp, ms.
    pub timestamp: Option<i64>,
    /// The sink that rejected a valid message (`rejected_by_sink`), for the dead-letter headers.
    pub rejected_by: Option<&'static str>,
    /// A message a sink rejected was gone from its topic when read again to be dead-lettered,
    /// or its offset held another message by then: `value` is empty, not the original (header
    /// `original_lost: true`; `redrive` refuses such letters).
    pub original_lost: bool,
    /// The dead letter the message was re-driven from, if it was (its `redriven_from` header,
    /// carried on to the new letter).
    pub redriven_from: Option<Box<str>>,
}

impl InvalidMessage {
    /// What it holds of the original record, counted as the record counts it.
    pub fn bytes(&self) -> usize {
        crate::kafka::record::held_bytes(
            &self.value,
            self.key.as_deref(),
            self.redriven_from.as_deref(),
        )
    }
}

/// What one flush writes. Sinks write slices of it (`&[Entry]`): the flush hands a sink part of
/// a batch when it looks for the messages that sink rejects.
#[derive(Debug, Default)]
pub struct Batch {
    pub entries: Vec<Entry>,
}

impl std::ops::Deref for Batch {
    type Target = [Entry];

    fn deref(&self) -> &[Entry] {
        &self.entries
    }
}

/// The valid and invalid messages among entries.
pub trait Entries {
    fn valid(&self) -> impl Iterator<Item = &Processed>;
    fn invalid(&self) -> impl Iterator<Item = (&Entry, &InvalidMessage)>;
}

impl Entries for [Entry] {
    fn valid(&self) -> impl Iterator<Item = &Processed> {
        self.iter().filter_map(|e| match &e.outcome {
            Outcome::Valid(p) => Some(p.as_ref()),
            Outcome::Invalid(_) => None,
        })
    }

    fn invalid(&self) -> impl Iterator<Item = (&Entry, &InvalidMessage)> {
        self.iter().filter_map(|e| match &e.outcome {
            Outcome::Invalid(m) => Some((e, m.as_ref())),
            Outcome::Valid(_) => None,
        })
    }
}

/// Whether retrying the same write can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Transient: network, timeouts, overload, 5xx.
    Retryable,
    /// The sink refuses these bytes (a parse error for one row, a message over the topic's size
    /// limit): the flush finds the messages it refuses, dead-letters them and writes the rest.
    Rejected,
    /// Configuration: retrying the same write fails the same way, for any data.
    Fatal,
    /// A bug: the sink panicked building or writing these entries. Handled like a rejection —
    /// the flush narrows it down to the message that causes it — but that message is
    /// dead-lettered as `internal_error`, and the sink is not taken for misconfigured.
    Panicked,
}

impl Retry {
    /// Whether the flush narrows the failure down to single messages and dead-letters them.
    pub fn pins_messages(self) -> bool {
        matches!(self, Retry::Rejected | Retry::Panicked)
    }
}

/// A failed sink write: which sink, whether a retry can help, what happened — and the client's
/// own error when there is one (`source()`), for whoever needs more than the message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{sink}: {message}")]
pub struct SinkError {
    pub sink: &'static str,
    pub retry: Retry,
    pub message: String,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Longest message a sink error keeps (in bytes, before the sink's own prefix): a server's
/// answer quoted whole (a proxy's HTML error page, an exception quoting the data) would go into
/// every attempt's log line and `/status`.
const MAX_MESSAGE_BYTES: usize = 2048;

fn capped(mut message: String) -> String {
    crate::recording::shorten(&mut message, MAX_MESSAGE_BYTES);
    message
}

impl SinkError {
    /// A failure described by `message` alone.
    pub fn new(sink: &'static str, retry: Retry, message: impl fmt::Display) -> Self {
        SinkError {
            sink,
            retry,
            message: capped(message.to_string()),
            source: None,
        }
    }

    /// A failure the client reported as `error`, kept as the source.
    pub fn from_error(
        sink: &'static str,
        retry: Retry,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SinkError {
            sink,
            retry,
            message: capped(error.to_string()),
            source: Some(Arc::new(error)),
        }
    }
}

/// `error` and its causes, each said once: clients wrap the cause that matters (a refused
/// certificate, a reset connection) in errors that say only "client error (Connect)".
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    capped(text)
}

/// Two errors are the same failure when sink, class and message are (the source is detail).
impl PartialEq for SinkError {
    fn eq(&self, other: &Self) -> bool {
        (self.sink, self.retry, &self.message) == (other.sink, other.retry, &other.message)
    }
}

impl Eq for SinkError {}

/// A message a sink refused on its own, or panicked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub partition: i32,
    pub offset: i64,
    pub error: SinkError,
    /// What it is known by when read again.
    pub original: Original,
}

/// What a message a sink rejected is known by when it is read again to be dead-lettered. By then
/// its offset may hold another message — a log cut back by an unclean leader election and
/// written again, a topic deleted and created again under its name — whose bytes must not go to
/// the dead-letter topic in its name: `redrive` would send that one a second time, and the
/// rejected one would be missing without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    /// The value's length.
    pub bytes: usize,
    /// Its project, replay and segment; `None` for a value that does not say them (an invalid
    /// message a sink refused as a dead letter: only its length tells it apart).
    pub segment: Option<(u64, String, u32)>,
}

impl Original {
    pub fn of(entry: &Entry) -> Original {
        match &entry.outcome {
            Outcome::Valid(processed) => Original {
                bytes: processed.message_bytes,
                segment: Some((
                    processed.ids.project_id,
                    processed.ids.replay_id.clone(),
                    processed.ids.segment_id,
                )),
            },
            Outcome::Invalid(message) => Original::of_value(&message.value),
        }
    }

    fn of_value(value: &[u8]) -> Original {
        let envelope = crate::recording::envelope::decode(value).ok();
        Original {
            bytes: value.len(),
            segment: envelope.and_then(|envelope| {
                let payload = crate::recording::payload::split(envelope.payload).ok()?;
                Some((
                    envelope.project_id,
                    envelope.replay_id.to_owned(),
                    payload.segment_id,
                ))
            }),
        }
    }

    /// Why `value`, read at the rejected message's offset, is another message; `None` when it
    /// is the same (its length, project, replay and segment: a segment sent again by the edge
    /// would be the same recording).
    pub fn replaced_by(&self, value: &[u8]) -> Option<String> {
        let found = Original::of_value(value);
        (found != *self).then(|| format!("{found}, where the rejected message was {self}"))
    }
}

impl fmt::Display for Original {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.segment {
            Some((project, replay, segment)) => write!(
                f,
                "project {project}, replay {replay}, segment {segment}, {} bytes",
                self.bytes
            ),
            None => write!(f, "{} bytes, not a recording message", self.bytes),
        }
    }
}

impl Rejected {
    /// The dead letter's reason: `internal_error` for a panic, `rejected_by_sink` otherwise.
    pub fn reason(&self) -> Reason {
        match self.error.retry {
            Retry::Panicked => Reason::InternalError,
            _ => Reason::RejectedBySink,
        }
    }
}

/// Dead-letters messages a sink rejected, with their original bytes.
pub trait DeadLetters: Send + Sync {
    fn dead_letter<'a>(&'a self, rejected: &'a [Rejected], progress: &'a Progress) -> Writing<'a>;
}

/// A write in progress: what [`Sink::write`] and [`DeadLetters::dead_letter`] return. Driven on
/// the flush's own thread, so it need not be `Send`.
pub type Writing<'a> = LocalBoxFuture<'a, Result<Written, SinkError>>;

/// A flush destination.
pub trait Sink: Send + Sync {
    /// Short fixed name, used as a metric tag and in logs.
    fn name(&self) -> &'static str;

    /// Writes what this sink stores from `batch`, durably, before returning, and says how much
    /// (the whole batch's, pieces stored by earlier attempts included). Idempotent: a retry or a
    /// redelivered batch writes the same keys. `progress` is this write's across its retries: a
    /// sink that stores piece by piece skips what it marks stored, and reports each request.
    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a>;

    /// Whether this sink writes anything for `entry` (valid messages by default): a rejection
    /// is pinned on a part of the batch holding one such entry.
    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(entry.outcome, Outcome::Valid(_))
    }

    /// The Kafka topics this sink writes (none by default): the service watches their ids
    /// (`kafka::topic_id`).
    fn topics(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A sink shared with another user (the blob store also keeps oversized dead letters).
impl<T: Sink + ?Sized> Sink for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        (**self).write(batch, progress)
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        (**self).writes_for(entry)
    }

    fn topics(&self) -> Vec<String> {
        (**self).topics()
    }
}

/// Where a dead letter too large for its topic is kept whole: the blob store.
pub trait ObjectStore: Send + Sync {
    /// Stores `bytes` at `key`, durably, replacing what is there.
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: &'a [u8],
    ) -> LocalBoxFuture<'a, Result<(), SinkError>>;

    /// Where `key` can be fetched from, as an operator would write it (`gs://bucket/key`).
    fn location(&self, key: &str) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_read_again_is_told_apart_from_another_at_its_offset() {
        use crate::recording::envelope::tests::TestMessage;
        let message = |segment: u32, body: &str| {
            TestMessage::new(format!("{{\"segment_id\":{segment}}}\n{body}").into_bytes())
        };
        let rejected = message(3, "[]").encode();
        let processed = crate::recording::process(&rejected, &Default::default()).unwrap();
        let entry = Entry {
            partition: 0,
            offset: 7,
            outcome: Outcome::Valid(Box::new(processed)),
        };
        let original = Original::of(&entry);
        assert_eq!(original.replaced_by(&rejected), None, "the same message");
        let was = format!(
            "where the rejected message was project 42, replay 6aa0d45db9b94b989501ce3be4daf802, segment 3, {} bytes",
            rejected.len()
        );
        let other_replay = TestMessage {
            replay_id: "0b2b4f7e0e8a4d4c9c3f0f6a1d2e3f40".into(),
            ..message(3, "[]")
        };
        let other_project = TestMessage {
            project_id: 43,
            ..message(3, "[]")
        };
        let longer = message(3, "[ ]").encode();
        for (other, found) in [
            (
                other_replay.encode(),
                "replay 0b2b4f7e0e8a4d4c9c3f0f6a1d2e3f40,",
            ),
            (other_project.encode(), "project 43,"),
            (message(4, "[]").encode(), "segment 4,"),
            (
                longer.clone(),
                &format!("segment 3, {} bytes, where", longer.len()),
            ),
            (
                b"\x93\x01\x02\x03".to_vec(),
                "4 bytes, not a recording message, where",
            ),
        ] {
            let why = original.replaced_by(&other).expect(found);
            assert!(why.contains(found) && why.ends_with(&was), "{why}");
        }
        // A dead letter a sink refused: told apart by its length alone.
        let letter = Entry::invalid_for_test(0, 7);
        let Outcome::Invalid(message) = &letter.outcome else {
            unreachable!()
        };
        let original = Original::of(&letter);
        assert_eq!(original.replaced_by(&message.value), None);
        let mut longer = message.value.clone();
        longer.push(0);
        assert!(original.replaced_by(&longer).is_some());
    }

    #[test]
    fn a_url_with_credentials_or_a_query_is_refused_without_repeating_them() {
        for url in [
            "http://default:s3cret@clickhouse:8123",
            "https://user@ch.example:8443/",
            "default:s3cret@clickhouse:8123",
            "http://clickhouse:8123/?user=x@y&password=s3cret",
            "http://default:s3cret/x@clickhouse:8123",
            "http:///default:s3cret@clickhouse",
        ] {
            let refused = http_url("--clickhouse-url", url).unwrap_err();
            assert!(
                refused.contains("credentials") && !refused.contains("s3cret"),
                "{refused}"
            );
        }
        for url in [
            "http://clickhouse:8123/?password=s3cret",
            "http://clickhouse:8123#s3cret",
        ] {
            let refused = http_url("--clickhouse-url", url).unwrap_err();
            assert!(
                refused.contains("query or a fragment") && !refused.contains("s3cret"),
                "{refused}"
            );
        }
        http_url("--clickhouse-url", "http://clickhouse:8123/").unwrap();
        http_url("--gcs-endpoint", "https://storage.googleapis.com").unwrap();
        assert!(http_url("--gcs-endpoint", "ftp://x").is_err());
    }

    #[test]
    fn a_servers_answer_quoted_whole_is_cut_in_the_message_whatever_its_characters() {
        let page = format!("<html>{}</html>", "é".repeat(100_000));
        for error in [
            SinkError::new("gcs", Retry::Retryable, &page),
            SinkError::from_error("gcs", Retry::Retryable, std::io::Error::other(page.clone())),
        ] {
            assert!(error.message.len() <= MAX_MESSAGE_BYTES + '…'.len_utf8());
            assert!(error.message.starts_with("<html>é") && error.message.ends_with('…'));
        }
        let chained = std::io::Error::other(std::io::Error::other(page));
        assert!(describe(&chained).len() <= MAX_MESSAGE_BYTES + '…'.len_utf8());
        let short = SinkError::new("gcs", Retry::Retryable, "503 Service Unavailable");
        assert_eq!(short.message, "503 Service Unavailable");
    }
}
