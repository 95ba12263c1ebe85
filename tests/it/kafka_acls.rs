//! Kafka ACLs, on an Apache Kafka broker of the test's own that enforces them (Kafka's
//! `StandardAuthorizer`, as a production cluster with SASL runs), the service connecting over
//! SASL_SSL with SCRAM-SHA-512:
//!
//! - with exactly the ACLs `docs/operations.md` lists (Permissions), the service consumes,
//!   publishes events, dead-letters (reading the rejected message again) and commits, and warns
//!   of nothing it was refused;
//! - without one of them, it stops with exit 1, the log naming what is missing.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::support::acl::{self, Operation, Resource};
use crate::support::secure_broker::SecureBroker;
use crate::support::*;
use rdkafka::ClientConfig;

const ADMIN: (&str, &str) = ("admin", "admin-password");
const PASSWORD: &str = "s3cr3t-acl-password";

/// The topics of one run, on the broker.
struct Topics {
    records: String,
    dlq: String,
    outcomes: String,
    analytics: String,
    issues: String,
    /// `--rows-sink snuba` and the EAP trace items.
    replay_events: String,
    items: String,
}

impl Topics {
    async fn create(admin: &ClientConfig) -> Topics {
        let topics = Topics {
            records: unique("rec"),
            dlq: unique("dlq"),
            outcomes: unique("outcomes"),
            analytics: unique("analytics"),
            issues: unique("issues"),
            replay_events: unique("replay-events"),
            items: unique("items"),
        };
        create_topic_on(admin, &topics.records, 2).await;
        for topic in [
            &topics.dlq,
            &topics.outcomes,
            &topics.analytics,
            &topics.issues,
            &topics.replay_events,
            &topics.items,
        ] {
            create_topic_on(admin, topic, 1).await;
        }
        topics
    }

    fn events(&self) -> [&str; 3] {
        [&self.outcomes, &self.analytics, &self.issues]
    }
}

/// The ACLs `docs/operations.md` lists for the service's principal, every Kafka destination
/// on (the event topics, rows through snuba, EAP trace items): read on the consumed topic and
/// group (READ implies DESCRIBE); write on every topic published to; DescribeConfigs on the
/// event topics and the trace items' topic.
fn documented<'a>(topics: &'a Topics, group: &'a str) -> Vec<(Resource<'a>, Operation)> {
    let mut grants = vec![
        (Resource::Topic(&topics.records), Operation::Read),
        (Resource::Group(group), Operation::Read),
        (Resource::Topic(&topics.dlq), Operation::Write),
        (Resource::Topic(&topics.replay_events), Operation::Write),
        (Resource::Topic(&topics.items), Operation::Write),
        (Resource::Topic(&topics.items), Operation::DescribeConfigs),
    ];
    for topic in topics.events() {
        grants.push((Resource::Topic(topic), Operation::Write));
        grants.push((Resource::Topic(topic), Operation::DescribeConfigs));
    }
    grants
}

/// The service as `user`: SASL_SSL, SCRAM-SHA-512, the password from a file under `dir`; blobs
/// under `dir`; events, rows (for snuba) and every breadcrumb as an EAP item to the Kafka topics;
/// the consumer group protocol `protocol`.
fn args(
    broker: &SecureBroker,
    user: &str,
    topics: &Topics,
    group: &str,
    dir: &Path,
    protocol: Protocol,
) -> Vec<String> {
    let password_file = dir.join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let args = service_args(
        &topics.records,
        &topics.dlq,
        group,
        &dir.join("blobs"),
        free_port(),
    );
    let args = with_flag(args, "--brokers", &broker.address("SASL_SSL"));
    let args = with_flag(args, "--events-sink", "kafka");
    let mut args = with_flag(args, "--rows-sink", "snuba");
    args.extend(broker.sasl_ssl_flags(user, &password_file));
    args.extend(
        [
            "--outcomes-topic",
            &topics.outcomes,
            "--analytics-topic",
            &topics.analytics,
            "--issues-topic",
            &topics.issues,
            "--replay-events-topic",
            &topics.replay_events,
            "--trace-items-rollout",
            "1.0",
            "--trace-items-topic",
            &topics.items,
        ]
        .map(str::to_owned),
    );
    if protocol == Protocol::Consumer {
        args.extend(["--kafka-property", "group.protocol=consumer"].map(str::to_owned));
    }
    args
}

/// The consumer group protocol: the classic one (librdkafka's default), or KIP-848's, where the
/// broker assigns and the member's heartbeat is a ConsumerGroupHeartbeat the ACLs also govern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Classic,
    Consumer,
}

/// One copy of each of `files`, each under a replay id of its own (some fixtures share one; on
/// two partitions, which of them a blob holds would depend on the order they are flushed in).
fn copies(files: &[Vec<u8>]) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..files.len() as u64)
        .map(|i| (crate::support::load::fixture_copy(files, i), test_key(i)))
        .collect()
}

/// Starts the service as `user` (its log in `service.log` of the directory returned) and waits
/// until it has written `blobs` and the group has committed to the end of the topic.
async fn consume_everything(
    broker: &SecureBroker,
    admin: &ClientConfig,
    (user, protocol): (&str, Protocol),
    topics: &Topics,
    group: &str,
    blobs: &Blobs,
) -> (Service, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start_logging_to(
        &args(broker, user, topics, group, dir.path(), protocol),
        &dir.path().join("service.log"),
    );
    let blob_dir = dir.path().join("blobs");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while blobs_under(&blob_dir) != *blobs {
        assert!(
            std::time::Instant::now() < deadline,
            "{user}: not every blob within 60 s; its status: {:?}\nthe service's log:\n{}",
            service.status(),
            std::fs::read_to_string(dir.path().join("service.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let end = high_watermarks_on(admin, &topics.records, 2);
    wait_for(
        "the group commits to the end",
        Duration::from_secs(60),
        || committed_on(admin, group, &topics.records, 2) == end,
    )
    .await;
    (service, dir)
}

/// With exactly the documented ACLs the service consumes, publishes rows for snuba, EAP items
/// and billing outcomes,
/// dead-letters invalid messages and two its events sink refuses (over the issue topic's
/// limit: read again from the consumed topic), commits to the end, and logs no authorization
/// error (before, the consumer that reads a message again had a group of its own, and librdkafka
/// logged `GroupAuthorizationFailed` looking up its coordinator).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn with_the_documented_acls_the_service_consumes_publishes_dead_letters_and_commits() {
    consumes_with_the_documented_acls(Protocol::Classic).await;
}

/// The same with the consumer group protocol of KIP-848: its ConsumerGroupHeartbeat needs no ACL
/// beyond the documented ones.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn with_the_documented_acls_the_consumer_group_protocol_consumes_and_commits_too() {
    consumes_with_the_documented_acls(Protocol::Consumer).await;
}

async fn consumes_with_the_documented_acls(protocol: Protocol) {
    let broker = SecureBroker::start_enforcing_acls(&[ADMIN, ("replay", PASSWORD)]);
    let admin = broker.sasl_ssl_client(ADMIN.0, ADMIN.1);
    let topics = Topics::create(&admin).await;
    let group = unique("group");
    acl::allow(&admin, "User:replay", &documented(&topics, &group));

    let messages = copies(&[small_fixtures(true), small_fixtures(false)].concat());
    let (_, sent) = produce_values_with(&producer_on(&admin), &topics.records, messages).await;
    let (blobs, mut dead) = outcomes(&sent);
    // The issue topic's limit below every occurrence the fixtures make (a rage click, a
    // hydration error: 1 348 bytes and more): the events sink refuses those messages, which are
    // read again from the consumed topic to be dead-lettered with their bytes.
    set_topic_limit_on(&admin, &topics.issues, 1000).await;
    let refused: Vec<&Sent> = (sent.iter())
        .filter(|s| {
            matches!(s.expected, Expected::Blob { .. })
                && ["rage_click", "hydration_error"]
                    .iter()
                    .any(|kind| !events_of(&s.value, kind).is_empty())
        })
        .collect();
    assert_eq!(refused.len(), 2, "a rage click and a hydration error");
    dead.extend(
        refused
            .iter()
            .map(|s| (s.partition, s.offset, "rejected_by_sink".to_owned())),
    );

    let (service, dir) = consume_everything(
        &broker,
        &admin,
        ("replay", protocol),
        &topics,
        &group,
        &blobs,
    )
    .await;
    let letters = read_messages_on(&admin, &topics.dlq, dead.len(), Duration::from_secs(30));
    let letters = check_dead_letters(letters, &topics.records, &originals(&sent));
    assert_eq!(letters.into_iter().collect::<BTreeSet<_>>(), dead);
    // Each accepted segment 0 is billed once; a refused message publishes none of its events.
    let outcomes: usize = (sent.iter())
        .filter(|s| matches!(s.expected, Expected::Blob { .. }))
        .filter(|s| {
            !refused
                .iter()
                .any(|r| r.offset == s.offset && r.partition == s.partition)
        })
        .map(|s| events_of(&s.value, "outcome").len())
        .sum();
    assert!(outcomes > 0);
    let billed = read_messages_on(&admin, &topics.outcomes, outcomes, Duration::from_secs(30));
    assert_eq!(billed.len(), outcomes, "billing outcomes published");
    for topic in [&topics.replay_events, &topics.items] {
        let published = read_messages_on(&admin, topic, 1, Duration::from_secs(30));
        assert!(!published.is_empty(), "{topic}: published to");
    }
    assert_eq!(service.terminate(), Some(0));
    let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap();
    for refused in ["uthoriz", "did not give these topics"] {
        assert!(
            !log.contains(refused),
            "nothing refused with the documented ACLs ({refused}):\n{log}"
        );
    }
}

/// Each principal lacks one of the documented ACLs. READ on the group (with either group
/// protocol), READ on the consumed topic or WRITE on the dead-letter topic: the service stops
/// with exit 1 naming it (a topic it may not see was reported as missing from the cluster
/// before). DescribeConfigs on the event topics: it warns that it publishes their records
/// unchecked, and consumes on.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn without_one_of_the_documented_acls_the_service_names_it() {
    let users = [
        "no-group",
        "no-group-kip-848",
        "no-topic",
        "no-dlq",
        "no-describe-configs",
    ];
    let mut all = vec![ADMIN];
    all.extend(users.map(|user| (user, PASSWORD)));
    let broker = SecureBroker::start_enforcing_acls(&all);
    let admin = broker.sasl_ssl_client(ADMIN.0, ADMIN.1);
    let topics = Topics::create(&admin).await;
    let messages = copies(&small_fixtures(true));
    let (_, sent) = produce_values_with(&producer_on(&admin), &topics.records, messages).await;
    let blobs = outcomes(&sent).0;

    let refused_topic = |topic: &str| {
        format!("the brokers do not let this principal see topics {topic} (an ACL is missing")
    };
    let no_group =
        "the principal may not join the consumer group `--group-id` (it needs READ on the group)";
    for (user, protocol, expected) in [
        ("no-group", Protocol::Classic, no_group.to_owned()),
        ("no-group-kip-848", Protocol::Consumer, no_group.to_owned()),
        (
            "no-topic",
            Protocol::Classic,
            refused_topic(&topics.records),
        ),
        ("no-dlq", Protocol::Classic, refused_topic(&topics.dlq)),
    ] {
        let group = unique("group");
        let grants: Vec<_> = documented(&topics, &group)
            .into_iter()
            .filter(|&(resource, operation)| {
                let withheld = match user {
                    "no-group" | "no-group-kip-848" => matches!(resource, Resource::Group(_)),
                    "no-topic" => matches!(
                        (resource, operation),
                        (Resource::Topic(t), Operation::Read) if t == topics.records
                    ),
                    _ => matches!(resource, Resource::Topic(t) if t == topics.dlq),
                };
                !withheld
            })
            .collect();
        assert_eq!(grants.len(), documented(&topics, &group).len() - 1);
        acl::allow(&admin, &format!("User:{user}"), &grants);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("service.log");
        let service = Service::start_logging_to(
            &args(&broker, user, &topics, &group, dir.path(), protocol),
            &log,
        );
        let code = service.exit_within(Duration::from_secs(60)).await;
        let log = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(1), "{user}: stops\n{log}");
        assert!(
            log.contains(&expected),
            "{user}: names what is missing\n{log}"
        );
        assert!(!log.contains("missing on the cluster"), "{user}\n{log}");
        assert!(
            !log.lines()
                .any(|line| line.contains("retried by the client")
                    && line.to_lowercase().contains("authorization")),
            "{user}: the refusal it stops on is not said to be retried\n{log}"
        );
    }

    let user = "no-describe-configs";
    let group = unique("group");
    let grants: Vec<_> = documented(&topics, &group)
        .into_iter()
        .filter(|&(_, operation)| !matches!(operation, Operation::DescribeConfigs))
        .collect();
    acl::allow(&admin, &format!("User:{user}"), &grants);
    let (service, dir) = consume_everything(
        &broker,
        &admin,
        (user, Protocol::Classic),
        &topics,
        &group,
        &blobs,
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap();
    assert!(
        log.contains("the brokers did not give these topics' max.message.bytes"),
        "{log}"
    );
}
