//! Dead letters too large for the dead-letter topic, with the real broker and fake-gcs-server
//! (`scripts/stack.sh up`): nothing is dropped and the flush does not stop. The value goes whole
//! to the blob store under `dlq/`, the topic gets a record pointing at it.

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
