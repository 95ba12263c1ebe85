//! Intake's pause and a partition that starts without a commit, on an Apache Kafka broker of the
//! test's own that the member reaches through a relay delaying the broker's answers to offset
//! lookups, so that the member's lookup of where such a partition begins stays in flight while
//! uploads hang and intake pauses.
//!
//! librdkafka 2.12 looks that offset up with a ListOffsets request. A pause and resume of the
//! partition meanwhile make the answer outdated, and the resume starts a second lookup; the
//! retry the outdated answer arms still fires once the partition is being read, and a third
//! lookup sets it back to where the log begins (`kafka::pause`). Seen once in CI: a member read
//! offset 0 again after 96, and its guard stopped it. Here, before the fix, the first round
//! failed every time: "offsets went back with nothing of the partition pending … tracking starts
//! over partition=0 offset=0 last=143", the member about to process the partition a second time.
//! The fix pauses a partition only once it has a position; one whose first message comes while
//! intake is paused is paused there and set back to it (the second test).

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
/// behind the tiny buffer, and the partitions are still being read when librdkafka's third
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

/// A broker of the test's own behind a relay that holds its answers to offset lookups back, a
/// topic of two partitions with a backlog, and uploads to a fresh bucket through a proxy that
/// hangs them while its gate is closed (and takes `UPLOAD` each otherwise).
struct FarLookups {
    relay: Relay,
    _broker: SecureBroker,
    direct: ClientConfig,
    topic: String,
    dlq: String,
    bucket: String,
    /// What the backlog holds: where each partition ends, and every message.
    ends: std::collections::BTreeMap<i32, i64>,
    sent: Vec<Sent>,
    uploads_gate: proxy::Gate,
    uploads: proxy::Proxy,
}

impl FarLookups {
    async fn new() -> FarLookups {
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
        let (_, sent) = produce_values_with(&producer_on(&direct), &topic, copies).await;
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
        FarLookups {
            relay,
            _broker: broker,
            direct,
            topic,
            dlq,
            bucket,
            ends,
            sent,
            uploads_gate,
            uploads,
        }
    }

    /// Starts a member of a fresh group, which commits partition 1 at 0 first: partition 1
    /// starts from that commit and is read at once, partition 0 from where the log begins,
    /// looked up. A buffer of 4 messages and one flush at a time: intake pauses while a flush
    /// uploads. Its polling thread's DEBUG lines are in its logs. Returns it and its group.
    fn start(&self, blobs: &std::path::Path) -> (Service, String) {
        let group = unique("group");
        commit_on(&self.direct, &group, &self.topic, 1, 0);
        let mut args = with_flag(
            service_args(&self.topic, &self.dlq, &group, blobs, free_port()),
            "--brokers",
            &self.relay.address(),
        );
        args = with_flag(args, "--blob-sink", "gcs");
        args.extend(
            [
                "--gcs-bucket",
                &self.bucket,
                "--gcs-endpoint",
                &self.uploads.endpoint,
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
        let service = Service::start_configured(&args, |command| {
            command.env("RUST_LOG", "info,replay_ingest::kafka::consumer=debug");
        });
        (service, group)
    }

    /// Waits until `service` has committed every partition to its end, or read a partition's
    /// offset again; fails on the latter, and unless it then exits 0.
    async fn read_once_to_the_end(&self, service: Service, group: &str, what: &str) {
        wait_for(
            &format!("{what}: everything committed, or a partition read again"),
            Duration::from_secs(120),
            || {
                went_back(&service.log_text().unwrap_or_default()).is_some()
                    || committed_on(&self.direct, group, &self.topic, 2) == self.ends
            },
        )
        .await;
        assert_eq!(
            went_back(&service.log_text().unwrap_or_default()),
            None,
            "{what}: a partition's position went back"
        );
        assert_eq!(service.terminate(), Some(0), "{what}");
    }
}

/// Each round: partition 0's start is looked up while uploads hang — so intake pauses with the
/// lookup in flight — and uploads come back while it still is, so intake resumes. Before the
/// fix, librdkafka then read partition 0 from its start a second time, a few seconds in.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack and Apache Kafka's jars: scripts/test.sh starts them and runs every test"]
async fn a_partition_starting_without_a_commit_is_read_once_when_intake_pauses_during_its_lookup() {
    let _stack = uses_stack().await;
    let far = FarLookups::new().await;
    for round in 0..ROUNDS {
        let (asked, _) = far.relay.offset_lookups();
        let held = far.uploads_gate.close();
        let blobs = tempfile::tempdir().unwrap();
        let (service, group) = far.start(blobs.path());
        wait_for(
            &format!("round {round}: partition 0's start looked up, and intake paused"),
            JOIN_AND_FLUSH,
            || {
                far.relay.offset_lookups().0 > asked
                    && service
                        .log_text()
                        .is_some_and(|l| l.contains("no room in the hand-over: partitions paused"))
            },
        )
        .await;
        // Uploads come back, and intake resumes, while the lookup's answer is still on its way
        // (it comes `LOOKUP` after it was asked): else this round shows nothing.
        let (asked, answered) = far.relay.offset_lookups();
        assert!(
            answered < asked,
            "round {round}: the lookup was answered before intake paused"
        );
        drop(held);
        far.read_once_to_the_end(service, &group, &format!("round {round}"))
            .await;
    }
}

/// Partition 0's lookup is answered while intake is still paused (uploads hang): its first
/// message comes then, and the partition is paused there and set back to it. Once uploads come
/// back, every message is stored — the one set back too — and every offset read once.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack and Apache Kafka's jars: scripts/test.sh starts them and runs every test"]
async fn a_partition_whose_first_message_comes_while_intake_is_paused_is_set_back_to_it() {
    let _stack = uses_stack().await;
    let far = FarLookups::new().await;
    let held = far.uploads_gate.close();
    let blobs = tempfile::tempdir().unwrap();
    let (service, group) = far.start(blobs.path());
    wait_for(
        "partition 0's first message while intake is paused",
        JOIN_AND_FLUSH,
        || {
            service.log_text().is_some_and(|logs| {
                logs.lines().any(|l| {
                    l.contains("a partition's first message while intake is paused: paused there")
                        && l.contains("partition=0")
                })
            })
        },
    )
    .await;
    drop(held);
    far.read_once_to_the_end(service, &group, "partition 0 set back")
        .await;
    every_blob_in_gcs(&far.bucket, &far.sent).await;
}
