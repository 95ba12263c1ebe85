//! Intake's pause and a partition that starts without a commit, on an Apache Kafka broker of the
//! test's own that the member reaches through a relay delaying the broker's answers to offset
//! lookups: the member's lookup of where such a partition begins is still in flight when intake
//! pauses (uploads hang) and when it resumes (they come back).
//!
//! librdkafka 2.12 looks that offset up with a ListOffsets request; a pause or resume of the
//! partition meanwhile makes the answer outdated, and the retry it arms for that outdated answer
//! still fires once the partition is being read: a second lookup then sets it back to where the
//! log begins (`kafka::pause`). Seen once in CI: a member read offset 0 again after 96, and its
//! guard stopped it. Here, before the fix, the first round failed every time: "offsets went back
//! with nothing of the partition pending … tracking starts over partition=0 offset=0 last=143",
//! the member about to process the partition a second time.

use std::time::Duration;

use crate::support::proxy;
use crate::support::relay::Relay;
use crate::support::secure_broker::SecureBroker;
use crate::support::*;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How late the broker's answer to an offset lookup reaches the member.
const LOOKUP: Duration = Duration::from_millis(1500);

/// How long each blob upload takes once uploads are back: intake keeps pausing and resuming
/// behind the tiny buffer, and the partitions are still being read when librdkafka's second
/// lookup answers.
const UPLOAD: Duration = Duration::from_millis(50);

/// Fresh groups started, one after the other.
const ROUNDS: usize = 2;

/// Commits `offset` for `partition` of `topic` in `group`, as a member that stopped there would
/// have.
fn commit_on(base: &ClientConfig, group: &str, topic: &str, partition: i32, offset: i64) {
    let consumer: BaseConsumer = base.clone().set("group.id", group).create().unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    consumer.commit(&list, CommitMode::Sync).unwrap();
}

/// A line saying that a partition's offsets went back (the member's guard, or a restart of its
/// tracking), if the logs have one.
fn went_back(logs: &str) -> Option<String> {
    logs.lines()
        .find(|l| {
            l.contains("in the same assignment (the log was cut back")
                || l.contains("offsets went back with nothing of the partition pending")
        })
        .map(str::to_owned)
}

/// Each round: partition 1 starts from a commit, partition 0 from where the log begins, looked up
/// while uploads hang — so intake pauses with the lookup in flight — and uploads come back while
/// it still is, so intake resumes. Before the fix, librdkafka then read partition 0 from its
/// start a second time, a few seconds in.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack and Apache Kafka's jars: scripts/test.sh starts them and runs every test"]
async fn a_partition_starting_without_a_commit_is_read_once_when_intake_pauses_during_its_lookup() {
    let _stack = uses_stack().await;
    let relay = Relay::start_delaying_offset_lookups(free_port(), LOOKUP).await;
    let broker = SecureBroker::start_behind(&relay);
    let direct = ClientConfig::new()
        .set("bootstrap.servers", broker.address("PLAINTEXT"))
        .clone();
    let (topic, dlq, bucket) = (unique("rec"), unique("dlq"), unique("blobs"));
    create_topic_on(&direct, &topic, 2).await;
    create_topic_on(&direct, &dlq, 1).await;
    create_bucket(&bucket);
    let copies = (0..400)
        .map(|i| (load::fixture_copy(&small_fixtures(true), i), test_key(i)))
        .collect();
    produce_values_with(&producer_on(&direct), &topic, copies).await;
    let ends = high_watermarks_on(&direct, &topic, 2);
    assert_eq!(ends.len(), 2, "both partitions hold messages: {ends:?}");
    let uploads_gate = proxy::Gate::default();
    let uploads = {
        let gate = uploads_gate.clone();
        proxy::Proxy::start(&gcs_endpoint(), move |seen| {
            if !blob_upload(seen.path) {
                proxy::Action::Forward
            } else if gate.is_open() {
                proxy::Action::Delay(UPLOAD)
            } else {
                proxy::Action::Hold(gate.clone())
            }
        })
        .await
    };

    for round in 0..ROUNDS {
        let group = unique("group");
        commit_on(&direct, &group, &topic, 1, 0);
        let dir = tempfile::tempdir().unwrap();
        let mut args = with_flag(
            service_args(&topic, &dlq, &group, dir.path(), free_port()),
            "--brokers",
            &relay.address(),
        );
        args = with_flag(args, "--blob-sink", "gcs");
        args.extend(
            [
                "--gcs-bucket",
                &bucket,
                "--gcs-endpoint",
                &uploads.endpoint,
                "--gcs-anonymous",
                "--buffer-max-messages",
                "4",
                "--max-flushes-in-flight",
                "1",
            ]
            .map(String::from),
        );
        args = with_flag(args, "--session-timeout-ms", "10000");
        args = with_flag(args, "--drain-deadline-ms", "9000");
        let (asked, _) = relay.offset_lookups();
        let held = uploads_gate.close();
        // The polling thread's pause is a DEBUG line.
        let service = Service::start_configured(&args, |command| {
            command.env("RUST_LOG", "info,replay_ingest::kafka::consumer=debug");
        });
        wait_for(
            &format!("round {round}: partition 0's start looked up, and intake paused"),
            JOIN_AND_FLUSH,
            || {
                relay.offset_lookups().0 > asked
                    && service
                        .log_text()
                        .is_some_and(|l| l.contains("no room in the hand-over: partitions paused"))
            },
        )
        .await;
        // Uploads come back, and intake resumes, while the lookup's answer is still on its way
        // (it comes `LOOKUP` after it was asked): else this round shows nothing.
        let (asked, answered) = relay.offset_lookups();
        assert!(
            answered < asked,
            "round {round}: the lookup was answered before intake paused"
        );
        drop(held);
        wait_for(
            &format!("round {round}: everything committed, or a partition read again"),
            Duration::from_secs(120),
            || {
                went_back(&service.log_text().unwrap_or_default()).is_some()
                    || committed_on(&direct, &group, &topic, 2) == ends
            },
        )
        .await;
        assert_eq!(
            went_back(&service.log_text().unwrap_or_default()),
            None,
            "round {round}: a partition's position went back"
        );
        assert_eq!(service.terminate(), Some(0), "round {round}");
    }
}
