//! What a test sends and what it expects: the recorded fixtures, each copy's fate, the blobs,
//! rows and dead letters it must produce.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use replay_ingest::recording::replay_event::TextField;
use replay_ingest::recording::{self, KafkaPosition, Limits, ReplayRow};
use replay_ingest::sink::{Batch, Entry, Outcome};

use super::*;

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every fixture (recorded and synthetic), sorted.
pub fn all_fixtures() -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = ["segments", "synthetic"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(fixture_dir().join(d))
                .unwrap()
                .map(|e| e.unwrap().path())
        })
        .filter(|p| p.extension().is_some_and(|e| e == "msgpack"))
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// The fixtures under 100 kB that the recording core accepts (`valid`) or rejects.
pub fn small_fixtures(valid: bool) -> Vec<Vec<u8>> {
    all_fixtures()
        .into_iter()
        .filter(|f| f.len() < 100_000 && recording::process(f, &Limits::default()).is_ok() == valid)
        .collect()
}

/// What the service must produce for one message: a blob (key and a digest of its bytes), or a
/// DLQ reason.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expected {
    Blob { key: String, digest: u64 },
    Dlq(&'static str),
}

/// A digest of `bytes`, to compare stored bytes with expected ones without keeping both.
pub fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// What `value` must become.
pub fn expected_for(value: &[u8]) -> Expected {
    match recording::process(value, &Limits::default()) {
        Ok(p) => Expected::Blob {
            key: p.blob.key,
            digest: digest(&p.blob.bytes),
        },
        Err(e) => Expected::Dlq(e.reason.as_str()),
    }
}

/// A produced message as the dead-letter copy must repeat it: its key, and its value's length
/// and digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Original {
    pub key: Option<Vec<u8>>,
    pub len: usize,
    pub digest: u64,
}

impl Original {
    pub fn new(key: Option<Vec<u8>>, value: &[u8]) -> Original {
        Original {
            key,
            len: value.len(),
            digest: digest(value),
        }
    }
}

/// One produced message and what it must become.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sent {
    pub partition: i32,
    pub offset: i64,
    pub expected: Expected,
    pub original: Original,
    pub value: Vec<u8>,
}

/// Checks each dead letter against the message it copies (see `read_dlq`).
pub fn check_dead_letters(
    received: Vec<Received>,
    source_topic: &str,
    originals: &BTreeMap<(i32, i64), Original>,
) -> Vec<(i32, i64, String)> {
    received
        .into_iter()
        .map(
            |Received {
                 key,
                 value,
                 headers: h,
             }| {
                assert!(!h["detail"].is_empty(), "every DLQ message says why: {h:?}");
                assert_eq!(h["original_topic"], source_topic, "{h:?}");
                let at: (i32, i64) = (
                    h["original_partition"].parse().unwrap(),
                    h["original_offset"].parse().unwrap(),
                );
                let timestamp: i64 = h["original_timestamp"]
                    .parse()
                    .unwrap_or_else(|_| panic!("a timestamp: {h:?}"));
                assert!(
                    timestamp > 1_500_000_000_000,
                    "the original's timestamp in ms: {h:?}"
                );
                let original = originals
                    .get(&at)
                    .unwrap_or_else(|| panic!("a dead letter for a message never produced: {h:?}"));
                assert_eq!(
                    key, original.key,
                    "the dead letter keeps the original key ({at:?})"
                );
                match h.get("payload_location") {
                    None => assert_eq!(
                        (value.len(), digest(&value)),
                        (original.len, original.digest),
                        "the dead letter keeps the original bytes ({at:?})"
                    ),
                    Some(_) => {
                        assert!(value.is_empty(), "a pointer record carries no value");
                        assert_eq!(h["payload_bytes"], original.len.to_string(), "{h:?}");
                    }
                }
                (at.0, at.1, h["reason"].clone())
            },
        )
        .collect()
}

/// The originals of `sent`, by partition and offset, for `read_dlq`.
pub fn originals(sent: &[Sent]) -> BTreeMap<(i32, i64), Original> {
    sent.iter()
        .map(|s| ((s.partition, s.offset), s.original.clone()))
        .collect()
}

/// Blob key → digest of the blob's bytes.
pub type Blobs = BTreeMap<String, u64>;

/// `(original partition, original offset, reason)` of dead letters.
pub type DeadLetters = BTreeSet<(i32, i64, String)>;

/// The blobs the service must write, and the DLQ entries it must publish.
pub fn outcomes(sent: &[Sent]) -> (Blobs, DeadLetters) {
    let mut blobs = BTreeMap::new();
    let mut dead = BTreeSet::new();
    for s in sent {
        match &s.expected {
            Expected::Blob { key, digest } => {
                blobs.insert(key.clone(), *digest);
            }
            Expected::Dlq(reason) => {
                dead.insert((s.partition, s.offset, reason.to_string()));
            }
        }
    }
    (blobs, dead)
}

/// The blobs under `dir` (temporary files of interrupted writes left out), with the digest of
/// their bytes.
pub fn blobs_under(dir: &Path) -> Blobs {
    files_under(dir)
        .into_iter()
        .filter(|f| !f.contains(".tmp-"))
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            (f, digest(&bytes))
        })
        .collect()
}

/// Every file under `dir`, as paths relative to it.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Every valid fixture, processed, as one batch. The fixtures' replay events carry no user
/// address: the first two segment rows get one of each family, to round-trip both columns.
pub fn fixture_batch() -> Batch {
    let mut addresses = ["192.0.2.7", "2001:db8::1"].into_iter();
    let entries = all_fixtures()
        .iter()
        .filter_map(|value| recording::process(value, &Limits::default()).ok())
        .map(|mut p| {
            if let Some(event) = p.replay_event.as_mut().filter(|_| p.writes_segment_row)
                && let Some(address) = addresses.next()
            {
                event.set_text(TextField::ip_address, Some(address));
            }
            p
        })
        .enumerate()
        .map(|(i, p)| Entry {
            partition: 1,
            offset: i as i64,
            outcome: Outcome::Valid(Box::new(p)),
        })
        .collect();
    Batch { entries }
}

/// Every row of the batch, in the order they are inserted.
pub fn rows_of(batch: &Batch) -> Vec<ReplayRow> {
    batch
        .iter()
        .flat_map(|e| match &e.outcome {
            Outcome::Valid(p) => p.rows(KafkaPosition {
                partition: e.partition,
                offset: e.offset,
            }),
            Outcome::Invalid(_) => Vec::new(),
        })
        .collect()
}

/// One write of `batch` through `sink`, as a flush's first attempt makes it.
pub async fn write_once(
    sink: &dyn replay_ingest::sink::Sink,
    batch: &[Entry],
) -> Result<replay_ingest::sink::Written, replay_ingest::sink::SinkError> {
    let status = replay_ingest::health::Status::default();
    let progress = replay_ingest::sink::Progress::new(sink.name(), &status);
    sink.write(batch, &progress).await
}

/// The JSON of each event of `kind` (`outcome`, `hydration_error`, …) the message `value` makes,
/// every issue kind on.
pub fn events_of(value: &[u8], kind: &str) -> Vec<String> {
    let processed = recording::process(value, &Limits::default()).unwrap();
    (processed
        .events(&recording::IssueGates::default())
        .into_iter())
    .filter(|e| e.kind() == kind)
    .map(|e| String::from_utf8(e.into_json().unwrap()).unwrap())
    .collect()
}

/// The billing outcomes the valid messages of `sent` make, as the service publishes them.
pub fn billed_outcomes(sent: &[Sent]) -> BTreeSet<String> {
    sent.iter()
        .filter(|s| matches!(s.expected, Expected::Blob { .. }))
        .flat_map(|s| events_of(&s.value, "outcome"))
        .collect()
}

/// A row as ClickHouse deduplicates it: project, day, replay id, event hash.
pub type RowKey = (u64, u32, uuid::Uuid, uuid::Uuid);

pub fn row_key(row: &ReplayRow) -> RowKey {
    (
        row.project_id,
        row.timestamp / 86_400,
        row.replay_id,
        row.event_hash,
    )
}

/// Every row the valid messages of `sent` make at their positions, by key (ClickHouse keeps one
/// of the rows sharing a key: two clicks on one node in one second, a message produced twice).
pub fn expected_rows(sent: &[Sent]) -> BTreeMap<RowKey, Vec<ReplayRow>> {
    let mut expected: BTreeMap<RowKey, Vec<ReplayRow>> = BTreeMap::new();
    for s in sent {
        let Ok(processed) = recording::process(&s.value, &Limits::default()) else {
            continue;
        };
        let at = KafkaPosition {
            partition: s.partition,
            offset: s.offset,
        };
        for row in processed.rows(at) {
            expected.entry(row_key(&row)).or_default().push(row);
        }
    }
    expected
}

/// Of `expected` rows by key, against those `stored`: how many keys have no row, how many stored
/// keys were not expected, and how many stored rows are none of those expected for their key
/// (column for column).
pub fn row_differences(
    expected: &BTreeMap<RowKey, Vec<ReplayRow>>,
    stored: &[ReplayRow],
) -> (usize, usize, usize) {
    let stored_keys: BTreeSet<RowKey> = stored.iter().map(row_key).collect();
    let missing = expected
        .keys()
        .filter(|key| !stored_keys.contains(key))
        .count();
    let extra = stored_keys
        .iter()
        .filter(|key| !expected.contains_key(key))
        .count();
    let differing = stored
        .iter()
        .filter(|row| {
            expected
                .get(&row_key(row))
                .is_some_and(|e| !e.contains(row))
        })
        .count();
    (missing, extra, differing)
}
