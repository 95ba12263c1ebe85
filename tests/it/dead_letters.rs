//! Dead letters too large for the dead-letter topic, with the real broker and fake-gcs-server
//! (`scripts/stack.sh up`): nothing is dropped and the flush does not stop. The value goes whole
//! to the blob store under `dlq/`, the topic gets a record pointing at it. Where that cannot be
//! done — no blob store, or a topic that refuses even the pointer — the service stops with nothing
//! committed, saying why.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use rdkafka::producer::FutureRecord;
use replay_ingest::health::Status;
use replay_ingest::pipeline::{self, flush::Sinks};
use replay_ingest::recording::{InvalidRecording, Reason};
use replay_ingest::sink::dlq::DlqSink;
use replay_ingest::sink::{Entry, InvalidMessage, ObjectStore, Outcome, Progress, Sink};

/// The dead-letter producer's own limit (librdkafka's `message.max.bytes`): below the topic's
/// configured limit, as when an operator sets the flag higher than the broker allows.
const PRODUCER_LIMIT: usize = 100_000;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn dead_letters_too_large_for_their_topic_keep_their_value_in_the_blob_store() {
    let _stack = uses_stack().await;
    let (topic, group, dlq, bucket) = (
        unique("rec"),
        unique("group"),
        unique("dlq"),
        unique("blobs"),
    );
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_bucket(&bucket);

    // Invalid messages (not a msgpack envelope): a small one, one over the configured limit with a long
    // key, and one under it that the producer refuses.
    let long_key = vec![b'k'; 2000];
    let messages: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"small".to_vec(), b"not a segment".to_vec()),
        (
            long_key.clone(),
            (0..2_000_000u32).map(|i| (i % 251) as u8).collect(),
        ),
        (b"medium".to_vec(), vec![b'x'; 150_000]),
    ];
    let producer = producer();
    let mut offsets = Vec::new();
    for (key, value) in &messages {
        let record = FutureRecord::to(&topic).key(key).payload(value);
        let delivery = producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        offsets.push(delivery.offset);
    }

    let gcs = Arc::new(gcs_store(&bucket, 2).await);
    let dlq_producer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("message.max.bytes", PRODUCER_LIMIT.to_string())
        .create()
        .unwrap();
    let overflow: Arc<dyn ObjectStore> = gcs.clone();
    let sinks = Sinks::new(vec![vec![
        Box::new(gcs),
        Box::new(DlqSink::new(dlq_producer, &dlq, 1_000_000, Some(overflow))),
    ]]);
    let args = consume_args(&topic, &group, &[]);
    let status = Arc::new(Status::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        pipeline::consume(args.pipeline_settings().unwrap(), sinks, status, shutdown).await
    });
    let end = [(0, offsets[2] + 1)].into_iter().collect();
    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&group, &topic, 1) == end
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    let dead = read_messages(&dlq, 3, Duration::from_secs(30));
    assert_eq!(dead.len(), 3, "one dead letter per message");
    for ((key, value), offset) in messages.iter().zip(&offsets) {
        let letter = dead
            .iter()
            .find(|m| m.headers["original_offset"] == offset.to_string())
            .unwrap();
        assert_eq!(letter.headers["reason"], "invalid_msgpack");
        assert_eq!(letter.headers["original_topic"], topic);
        if value.len() < PRODUCER_LIMIT {
            assert_eq!(
                (letter.key.as_ref(), &letter.value),
                (Some(key), value),
                "small enough: whole"
            );
            assert!(!letter.headers.contains_key("payload_location"));
            continue;
        }
        // Not a message of any replay's: kept under `unknown`.
        let object = format!("dlq/unknown/{topic}/0/{offset}");
        assert!(
            letter.value.is_empty(),
            "the record does not carry the value"
        );
        assert_eq!(
            letter.headers["payload_location"],
            format!("gs://{bucket}/{object}")
        );
        assert_eq!(letter.headers["payload_bytes"], value.len().to_string());
        assert_eq!(
            &read_object(&bucket, &object).await,
            value,
            "the value, byte for byte"
        );
        if key.len() > 1024 {
            assert_eq!(letter.key, None, "a long key travels with the value");
            assert_eq!(
                letter.headers["key_location"],
                format!("gs://{bucket}/{object}.key")
            );
            assert_eq!(&read_object(&bucket, &format!("{object}.key")).await, key);
        } else {
            assert_eq!(letter.key.as_ref(), Some(key));
        }
    }
}

/// An invalid message, as the pipeline hands it to the dead-letter sink.
fn invalid(offset: i64, value: Vec<u8>, topic: &str) -> Entry {
    Entry {
        partition: 0,
        offset,
        outcome: Outcome::Invalid(Box::new(InvalidMessage {
            error: InvalidRecording::new(Reason::InvalidMsgpack, "not a segment"),
            value,
            key: None,
            topic: topic.to_owned(),
            timestamp: None,
            rejected_by: None,
            original_lost: false,
            redriven_from: None,
        })),
    }
}

/// A letter that cannot be sent (its blob-store copy fails) must not make the retry send again the
/// letters enqueued before it: they are still delivered, and the retry sends only the rest.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_letter_that_cannot_be_sent_does_not_make_the_retry_send_the_others_again() {
    let _stack = uses_stack().await;
    let (dlq, bucket) = (unique("dlq"), unique("blobs"));
    create_topic(&dlq, 1).await;
    // The bucket does not exist yet: the oversized letter's copy fails on the first attempt.
    let overflow: Arc<dyn ObjectStore> = Arc::new(gcs_store(&bucket, 2).await);
    let producer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let sink = DlqSink::new(producer, &dlq, 1_000_000, Some(overflow));
    let batch = [
        invalid(0, b"small".to_vec(), "rec"),
        invalid(1, vec![b'x'; 1_500_000], "rec"),
        invalid(2, b"after".to_vec(), "rec"),
    ];
    let status = Status::default();
    let progress = Progress::new(sink.name(), &status);
    let first = sink.write(&batch, &progress).await;
    assert!(first.is_err(), "the copy into a missing bucket fails");
    create_bucket(&bucket);
    progress.new_attempt();
    sink.write(&batch, &progress)
        .await
        .expect("the retry succeeds");

    let letters = read_messages(&dlq, 3, Duration::from_secs(15));
    let mut offsets: Vec<&str> = letters
        .iter()
        .map(|m| m.headers["original_offset"].as_str())
        .collect();
    offsets.sort();
    assert_eq!(offsets, ["0", "1", "2"], "each letter once");
    let pointer = letters
        .iter()
        .find(|m| m.headers["original_offset"] == "1")
        .unwrap();
    assert_eq!(
        pointer.headers["payload_location"],
        format!("gs://{bucket}/dlq/unknown/rec/0/1")
    );
}

/// Produces one invalid message of `bytes` bytes on a fresh topic, starts the service on it with
/// `flags` and the dead-letter topic's limit at `dlq_limit` (when given), and waits for it to
/// stop; what it said, and the names.
async fn stops_on_a_dead_letter(
    bytes: usize,
    flags: &[&str],
    dlq_limit: Option<usize>,
) -> (Names, String) {
    let names = Names::create().await;
    if let Some(limit) = dlq_limit {
        set_topic_limit(&names.dlq, limit).await;
    }
    let producer = producer();
    let value = vec![b'x'; bytes];
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(&names.topic)
                .partition(0)
                .payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let mut args = names.args(statsd.port(), dir.path());
    for pair in flags.chunks(2) {
        if args.iter().any(|a| a == pair[0]) {
            args = with_flag(args, pair[0], pair[1]);
        } else {
            args.extend([pair[0].to_owned(), pair[1].to_owned()]);
        }
    }
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&args, &log);
    let code = service.exit_within(JOIN_AND_FLUSH).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "stopped: {said}");
    assert!(
        committed(&names.group, &names.topic, 2).is_empty(),
        "nothing committed past a dead letter not sent"
    );
    (names, said)
}

/// A dead letter over the topic's limit with no blob store to keep its value (`--blob-sink
/// null`) has nowhere to go: the flush fails for good, the service stops naming why, and the
/// message is read again after the fix. It is not sent cut, or dropped.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_dead_letter_too_large_with_no_blob_store_stops_the_service_with_nothing_committed() {
    let _stack = uses_stack().await;
    let flags = ["--blob-sink", "null", "--dlq-max-message-bytes", "2000"];
    let (names, said) = stops_on_a_dead_letter(10_000, &flags, None).await;
    assert!(
        said.contains("a dead letter of 10000 bytes does not fit the dead-letter topic and no blob store is configured to keep it"),
        "{said}"
    );
    assert!(high_watermarks(&names.dlq, 1).is_empty(), "nothing sent");
}

/// The record pointing at a value kept in the blob store is small: a dead-letter topic that
/// refuses even that is misconfigured, and the service stops saying so rather than retrying for
/// ever. The value's copy is in the bucket, rewritten under the same key after the fix.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_dead_letter_topic_refusing_the_pointer_record_stops_the_service() {
    let _stack = uses_stack().await;
    let (names, said) = stops_on_a_dead_letter(10_000, &[], Some(200)).await;
    assert!(
        said.contains("flush failed, nothing of it committed: dlq"),
        "{said}"
    );
    assert!(said.contains("MessageSizeTooLarge"), "{said}");
    assert!(high_watermarks(&names.dlq, 1).is_empty(), "nothing sent");
    let copy = format!("dlq/unknown/{}/0/0", names.topic);
    assert_eq!(read_object(&names.bucket, &copy).await.len(), 10_000);
}
