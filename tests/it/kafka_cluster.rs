//! The service on a cluster of three Apache Kafka brokers (`support::cluster`), every topic
//! replicated three times with `min.insync.replicas=2`, as production runs — where a broker
//! going away is a leader moving, not an outage: the partitions it led (the consumed topic's,
//! the dead-letter and event topics' the producers write, the group coordinator's
//! `__consumer_offsets`) are led by another node within seconds, while consumption, flushes and
//! commits go on. The stack's broker is one node, where every restart is an outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::cluster::{Cluster, NODES};
use crate::support::topics::create_replicated_topic_as;
use crate::support::*;

/// One cluster at a time: three JVMs of each beside the rest of the tests on two cores, nodes
/// starved for seconds are fenced.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A cluster of the test's own with the test's topics on it, each replicated on every node: the
/// consumed topic (four partitions), the dead letters' and the three event topics.
struct Replicated {
    cluster: Cluster,
    /// The test's own clients.
    base: rdkafka::ClientConfig,
    topic: String,
    dlq: String,
    group: String,
    /// Billing outcomes, analytics and issue occurrences.
    events: [String; 3],
    dir: tempfile::TempDir,
    blob_dir: std::path::PathBuf,
}

impl Replicated {
    async fn start() -> Replicated {
        let cluster = Cluster::start();
        let base = cluster.client();
        let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
        let events = ["outcomes", "analytics", "issues"].map(unique);
        for (name, partitions) in
            std::iter::once((&topic, 4)).chain(std::iter::once(&dlq).chain(&events).map(|t| (t, 1)))
        {
            create_replicated_topic_as(&base, name, (partitions, NODES as i32), stands_for(name))
                .await
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let blob_dir = dir.path().join("blobs");
        Replicated {
            cluster,
            base,
            topic,
            dlq,
            group,
            events,
            dir,
            blob_dir,
        }
    }

    /// A member on the cluster, blobs in the shared directory, events to the event topics, with
    /// a session a coordinator moving does not outlast (the tests' 2 s did) and `extra` flags;
    /// its log in `{name}.log`.
    fn member(&self, name: &str, extra: &[&str]) -> Service {
        let mut args = with_flag(
            service_args(
                &self.topic,
                &self.dlq,
                &self.group,
                &self.blob_dir,
                free_port(),
            ),
            "--brokers",
            &self.cluster.bootstrap(),
        );
        args = with_flag(args, "--events-sink", "kafka");
        args = with_flag(args, "--session-timeout-ms", "10000");
        let [outcomes, analytics, issues] = &self.events;
        for (flag, topic) in [
            ("--outcomes-topic", outcomes),
            ("--analytics-topic", analytics),
            ("--issues-topic", issues),
        ] {
            args.extend([flag.to_owned(), topic.clone()]);
        }
        // A flag given already takes the new value; `--kafka-property` is repeated.
        for pair in extra.chunks(2) {
            args = match args.contains(&pair[0].to_owned()) && pair[0] != "--kafka-property" {
                true => with_flag(args, pair[0], pair[1]),
                false => [args, pair.iter().map(|a| a.to_string()).collect()].concat(),
            };
        }
        Service::start_logging_to(&args, &self.log_of(name))
    }

    fn log_of(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// How many billing outcomes the valid messages of `sent` make, and how many records the
    /// outcomes' topic holds (its producers are idempotent and not transactional: each record
    /// is one offset).
    fn billed(&self, sent: &[Sent]) -> (usize, usize) {
        let billed = billed_outcomes(sent).len();
        let published: i64 = high_watermarks_on(&self.base, &self.events[0], 1)
            .values()
            .sum();
        (billed, published as usize)
    }
}

/// A rolling restart of the whole cluster (each node stopped cleanly, started again, caught up
/// before the next), then the group coordinator's node and the billing outcomes' leader killed
/// with SIGKILL, one after the other, while two members consume valid and invalid segments at
/// about twenty a second and publish their events: every segment is stored, every invalid one
/// dead-lettered, every message billed (twice only where a delivery of the events failed and was
/// sent again, or a partition moved with a flush under way: the documented at-least-once; in
/// four runs of five, none twice), the group commits to the end, both members stay
/// live and neither exits or logs an ERROR line.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn a_rolling_restart_and_killed_leaders_lose_nothing() {
    let _stack = uses_stack().await;
    rolling_restart_and_killed_leaders(&[]).await;
}

/// The same with the consumer group protocol of KIP-848, where the coordinator moving is the
/// broker's assignor moving with it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn with_the_consumer_group_protocol_a_rolling_restart_and_killed_leaders_lose_nothing() {
    let _stack = uses_stack().await;
    rolling_restart_and_killed_leaders(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// The rolling restart and the two kills, `protocol` the members' extra flags.
async fn rolling_restart_and_killed_leaders(protocol: &[&str]) {
    let _one = ONE_CLUSTER.lock().await;
    let mut replicated = Replicated::start().await;
    let members = [
        replicated.member("a", protocol),
        replicated.member("b", protocol),
    ];
    wait_for("both members owning partitions", JOIN_AND_FLUSH, || {
        members.iter().all(|m| m.owned() > 0)
    })
    .await;

    // Traffic throughout: a round of the small fixtures, valid and invalid, every second.
    let files = [small_fixtures(true), small_fixtures(false)].concat();
    let producing = Arc::new(AtomicBool::new(true));
    let round = (0, files.len() as u64, Duration::from_secs(1));
    let traffic = steady_load(
        &replicated.base,
        &replicated.topic,
        files,
        round,
        producing.clone(),
    );
    let mut probes = Probes::default();
    let mut watched = |seconds| {
        for _ in 0..seconds {
            for (n, member) in members.iter().enumerate() {
                member.probe_into(&mut probes, "/health/live", &format!("member {n}"));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    let mut in_sync: Vec<String> = vec![
        replicated.topic.clone(),
        replicated.dlq.clone(),
        "__consumer_offsets".into(),
    ];
    in_sync.extend(replicated.events.iter().cloned());
    let in_sync: Vec<&str> = in_sync.iter().map(String::as_str).collect();
    let cluster = &mut replicated.cluster;
    watched(5);
    cluster.wait_in_sync(&in_sync);
    for id in 1..=NODES as i32 {
        cluster.stop(id);
        watched(5);
        cluster.start_again(id);
        cluster.wait_in_sync(&in_sync);
        watched(2);
    }
    let coordinator = cluster.leader_of("__consumer_offsets", 0);
    cluster.kill(coordinator);
    watched(8);
    cluster.start_again(coordinator);
    cluster.wait_in_sync(&in_sync);
    let billing = cluster.leader_of(&replicated.events[0], 0);
    cluster.kill(billing);
    watched(8);
    cluster.start_again(billing);
    cluster.wait_in_sync(&in_sync);
    watched(3);
    producing.store(false, Ordering::SeqCst);
    let sent = traffic.await.unwrap();
    assert!(sent.len() > 200, "{} messages sent", sent.len());

    let r = &replicated;
    everything_landed(&r.base, &sent, (&r.topic, 4), &r.dlq, &r.group, &r.blob_dir).await;
    let (billed, published) = r.billed(&sent);
    assert!(
        published >= billed,
        "every message billed: {published} of {billed}"
    );
    if published > billed {
        // At least once, as documented: only where a delivery of the events failed and the
        // flush sent them again (one timed out may have been written), or a partition moved
        // with a flush of it under way. Anything else is a duplicate the service made.
        let why: Vec<String> = ["a", "b"]
            .iter()
            .flat_map(|name| {
                let log = std::fs::read_to_string(r.log_of(name)).unwrap();
                log.lines()
                    .filter(|l| {
                        (l.contains("sink write failed; retrying") && l.contains("sink=\"events\""))
                            || l.contains("partitions lost")
                    })
                    .map(|l| format!("{name}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            !why.is_empty(),
            "{} outcomes published twice with no failed delivery or lost partition to explain them",
            published - billed
        );
        println!(
            "cluster: {} outcomes published twice, after:\n{}",
            published - billed,
            why.join("\n")
        );
    }
    probes.assert_healthy();
    println!(
        "cluster: {} messages through a rolling restart and two leaders killed, {billed} billed, {published} outcomes published, {} probes",
        sent.len(),
        probes.asked
    );
    for (member, name) in members.into_iter().zip(["a", "b"]) {
        assert_eq!(member.terminate(), Some(0), "member {name} exits 0");
        assert_no_error_line(&r.log_of(name));
    }
}

/// The consumed topic and the billing outcomes' topic deleted and created again at once, with
/// the same layout, under a running member, after every node was restarted in turn (each
/// partition's leader moved: its leader epoch is past the new topic's 0). librdkafka keeps a
/// partition's leader epoch across a re-creation it did not see and ignores metadata of an
/// older epoch: before the topic-id watch, a member under KIP-848 asked for the new partitions'
/// start again and again and read nothing, live and in its group, and the outcomes' producer
/// timed out for ever. The member stops on the topics' new ids; started again, as Kubernetes
/// would, it stores every segment of the new topic, its outcomes land on the new outcomes topic,
/// and the group commits the new topic to its end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn topics_whose_leaders_moved_deleted_and_created_again_at_once_stop_the_member_once() {
    let _stack = uses_stack().await;
    topics_whose_leaders_moved_created_again(&[], true).await;
}

/// The same with the consumer group protocol of KIP-848, where the broker assigns the new
/// topic's partitions by its id.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn with_the_consumer_group_protocol_topics_whose_leaders_moved_created_again_stop_it_once() {
    let _stack = uses_stack().await;
    topics_whose_leaders_moved_created_again(
        &["--kafka-property", "group.protocol=consumer"],
        true,
    )
    .await;
}

/// The billing outcomes' topic alone created again at once after its leader moved: a topic the
/// service only writes stops it too (its producer timed out for ever before).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn an_output_topic_whose_leader_moved_created_again_at_once_stops_the_member_once() {
    let _stack = uses_stack().await;
    topics_whose_leaders_moved_created_again(&[], false).await;
}

/// The leaders moved, then the billing outcomes' topic and, `consumed_too`, the consumed topic
/// created again at once; `protocol` the member's flags.
async fn topics_whose_leaders_moved_created_again(protocol: &[&str], consumed_too: bool) {
    let _one = ONE_CLUSTER.lock().await;
    let mut replicated = Replicated::start().await;
    let (topic, billing) = (replicated.topic.clone(), replicated.events[0].clone());
    let base = replicated.base.clone();
    let files = small_fixtures(true);
    let batch = |from: u64, count: u64| keyed_copies(&files, from..from + count);
    let committed_count = || {
        committed_on(&base, &replicated.group, &topic, 4)
            .values()
            .sum::<i64>()
    };
    let published = || -> std::collections::BTreeSet<String> {
        read_all_on(&base, &billing, 1)
            .into_iter()
            .map(|m| String::from_utf8(m.value).unwrap())
            .collect()
    };
    let member = replicated.member("a", protocol);
    let (_, mut sent) = produce_values_with(&producer_on(&base), &topic, batch(0, 16)).await;
    wait_for("the first batch committed", JOIN_AND_FLUSH, || {
        committed_count() == 16
    })
    .await;

    let in_sync = [
        topic.as_str(),
        replicated.dlq.as_str(),
        billing.as_str(),
        "__consumer_offsets",
    ];
    let cluster = &mut replicated.cluster;
    cluster.wait_in_sync(&in_sync);
    for id in 1..=NODES as i32 {
        cluster.stop(id);
        cluster.start_again(id);
        cluster.wait_in_sync(&in_sync);
    }
    // Through the moved leaders: the member's clients learn their epochs.
    let (_, more) = produce_values_with(&producer_on(&base), &topic, batch(16, 16)).await;
    sent.extend(more);
    wait_for("the second batch committed", JOIN_AND_FLUSH, || {
        committed_count() == 32
    })
    .await;
    assert_eq!(
        published(),
        billed_outcomes(&sent),
        "every outcome on the old topic"
    );

    if consumed_too {
        delete_topic_on(&base, &topic).await;
    }
    delete_topic_on(&base, &billing).await;
    if consumed_too {
        create_topic_again_on(&base, &topic, (4, NODES as i32)).await;
    }
    create_topic_again_on(&base, &billing, (1, NODES as i32)).await;
    let (_, again) = produce_values_with(&producer_on(&base), &topic, batch(32, 48)).await;
    sent.extend(again.iter().cloned());
    let said = stops_on_a_new_topic_id(member, &replicated.log_of("a")).await;
    // Under the classic protocol nothing took the consumed topic's partitions from the member:
    // it owned them when it found out, and commits their start whichever topic it named.
    if consumed_too && protocol.is_empty() {
        let line = "committed the start of the partitions of the topic created again";
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    let member = replicated.member("a-restarted", protocol);
    let end = high_watermarks_on(&base, &topic, 4);
    let on_topic = if consumed_too { 48 } else { 80 };
    assert_eq!(end.values().sum::<i64>(), on_topic);
    let mut probes = Probes::default();
    wait_for("the topic committed to its end", JOIN_AND_FLUSH, || {
        member.probe_into(&mut probes, "/health/live", "the member");
        committed_on(&base, &replicated.group, &topic, 4) == end
    })
    .await;
    assert_eq!(
        blobs_under(&replicated.blob_dir),
        outcomes(&sent).0,
        "every segment stored"
    );
    // At least once: what the member read after the topics were created again is read again.
    assert!(
        published().is_superset(&billed_outcomes(&again)),
        "every outcome of the segments sent after the re-creation on the new outcomes topic"
    );
    probes.assert_healthy();
    assert_eq!(member.terminate(), Some(0));
    assert_no_error_line(&replicated.log_of("a-restarted"));
}

/// The billing outcomes' topic refusing every write for minutes (`min.insync.replicas` 3 with a
/// node down: `NOT_ENOUGH_REPLICAS`), while the consumed topic, on the same cluster, is read as
/// usual — a Kafka output down, its input not. The member pauses intake behind the failing flush
/// and stays in its group past the poll interval and live throughout; a member joining during
/// the outage owns partitions at once; a SIGTERM to it exits 1 within its drain deadline, and
/// the first takes every partition back; once the node is back, everything is stored, billed
/// once, and committed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn an_output_topic_refusing_writes_for_minutes_holds_up_no_join_or_shutdown() {
    let _stack = uses_stack().await;
    output_topic_refusing_writes(&[]).await;
}

/// The same with the consumer group protocol of KIP-848, where the joiner's partitions are
/// revoked from the first member one by one as the broker's assignor decides, each revoke a
/// callback in the member that cannot flush.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn with_the_consumer_group_protocol_an_output_topic_refusing_writes_holds_up_no_join_or_shutdown()
 {
    let _stack = uses_stack().await;
    output_topic_refusing_writes(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// The output outage, `protocol` the members' extra flags.
async fn output_topic_refusing_writes(protocol: &[&str]) {
    const MAX_POLL_INTERVAL: Duration = Duration::from_secs(20);
    const DRAIN_DEADLINE: Duration = Duration::from_secs(14);
    // Longer than any flush's retries take to reach their cap, and than the poll interval.
    const OUTAGE: Duration = Duration::from_secs(150);
    let _one = ONE_CLUSTER.lock().await;
    let mut replicated = Replicated::start().await;
    let r = &replicated;
    set_topic_config_on(&r.base, &r.events[0], "min.insync.replicas", "3").await;
    let max_poll = format!("max.poll.interval.ms={}", MAX_POLL_INTERVAL.as_millis());
    let drain = DRAIN_DEADLINE.as_millis().to_string();
    let flags = [
        protocol,
        &[
            "--session-timeout-ms",
            "16000",
            "--drain-deadline-ms",
            &drain,
            "--buffer-max-messages",
            "4",
            "--max-flushes-in-flight",
            "1",
            "--kafka-property",
            &max_poll,
        ],
    ]
    .concat();
    let a = r.member("a", &flags);
    let files = small_fixtures(true);
    let first = keyed_copies(&files, 0..8);
    let (_, mut sent) = produce_values_with(&producer_on(&r.base), &r.topic, first).await;
    wait_for("the first batch committed", JOIN_AND_FLUSH, || {
        committed_on(&r.base, &r.group, &r.topic, 4)
            .values()
            .sum::<i64>()
            == 8
    })
    .await;

    // Any node: every partition has a replica on each, so the outcomes' in-sync replicas fall to
    // two, and every other topic keeps the two it needs.
    replicated.cluster.kill(NODES as i32);
    let r = &replicated;
    let outage = std::time::Instant::now();
    let producing = Arc::new(AtomicBool::new(true));
    let round = (8, 2, Duration::from_millis(250));
    let load = steady_load(&r.base, &r.topic, files, round, producing.clone());
    let mut probes = Probes::default();
    // Each attempt waits out the deliveries' timeout (30 s) before it fails.
    wait_for(
        "intake paused behind the flush the outcomes' topic refuses",
        Duration::from_secs(240),
        || {
            a.probe_into(&mut probes, "/health/live", "the first member");
            a.status().is_some_and(|s| {
                s["paused"] == true && s["outages"]["events"]["failed_attempts"].as_u64() >= Some(3)
            })
        },
    )
    .await;
    // Paused for longer than the poll interval: a member that stopped polling would be out of
    // its group by now.
    while outage.elapsed() < MAX_POLL_INTERVAL + Duration::from_secs(5) {
        a.probe_into(&mut probes, "/health/live", "the first member");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        a.owned(),
        4,
        "the first member is still in its group, with every partition"
    );

    let b = r.member("b", &flags);
    let joined = std::time::Instant::now();
    wait_for(
        "the joiner owns partitions during the outage",
        JOIN_AND_FLUSH,
        || b.owned() > 0,
    )
    .await;
    println!(
        "cluster: the joiner owned partitions {:?} after it started",
        joined.elapsed()
    );
    let a_said = std::fs::read_to_string(r.log_of("a")).unwrap();
    assert!(
        a_said.contains("has been failing for longer than the drain deadline"),
        "the revoke says why it did not wait:\n{a_said}"
    );
    // Its drain waits the whole deadline (its own flush has not failed yet), then it closes: ten
    // seconds more on a loaded machine, far less than a delivery's timeout.
    let exit = b
        .stopped_mid_flush(DRAIN_DEADLINE + Duration::from_secs(10))
        .await;
    assert_eq!(
        exit,
        Some(1),
        "a SIGTERM during the outage exits within the drain deadline:\n{}",
        std::fs::read_to_string(r.log_of("b")).unwrap_or_default()
    );
    wait_for(
        "the first member takes every partition back",
        Duration::from_secs(30),
        || a.owned() == 4,
    )
    .await;
    while outage.elapsed() < OUTAGE {
        a.probe_into(&mut probes, "/health/live", "the first member");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Still refused. A write abandoned with the partitions the joiner took ends the outage it
    // showed, and the next write shows it again at its first failed attempt (a delivery timeout,
    // 30 s, later): seen between the two under KIP-848.
    wait_for(
        "the outcomes' topic still refusing the first member",
        Duration::from_secs(60),
        || {
            a.probe_into(&mut probes, "/health/live", "the first member");
            a.status()
                .is_some_and(|s| s["outages"]["events"].is_object())
        },
    )
    .await;
    probes.assert_healthy();

    replicated.cluster.start_again(NODES as i32);
    let r = &replicated;
    producing.store(false, Ordering::SeqCst);
    sent.extend(load.await.unwrap());
    everything_landed(&r.base, &sent, (&r.topic, 4), &r.dlq, &r.group, &r.blob_dir).await;
    let (billed, published) = r.billed(&sent);
    assert_eq!(published, billed, "every message billed exactly once");
    assert_eq!(a.terminate(), Some(0));
}

/// The consumed topic's only partition on two nodes, its leader the last in sync when it dies,
/// and the other, out of sync, made leader (`unclean.leader.election.enable`): the log is cut
/// back below what the member committed, and written again past it. A member started after
/// the election (a restart, or another member handed the partition) stores every segment
/// written after it: none skipped between where the log was cut and the committed offset
/// (before the committed position was checked against the log, 16 of 16 were).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn after_an_unclean_leader_election_a_member_started_skips_nothing_written_again() {
    let _stack = uses_stack().await;
    unclean_leader_election(false).await;
}

/// The same with the member running through the election: librdkafka finds the cut as the
/// leader's epoch changes, and the member reads the partition again from there.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn through_an_unclean_leader_election_a_running_member_skips_nothing_written_again() {
    let _stack = uses_stack().await;
    unclean_leader_election(true).await;
}

/// The unclean election, the member `running_through` it or started after it.
async fn unclean_leader_election(running_through: bool) {
    let _one = ONE_CLUSTER.lock().await;
    let mut replicated = Replicated::start().await;
    let base = replicated.base.clone();
    let topic = unique("unclean");
    create_on_two_nodes_unclean(&base, &topic).await;
    replicated.topic = topic.clone();
    let files = small_fixtures(true);
    let batch = |from: u64, count: u64| keyed_copies(&files, from..from + count);
    let committed = || {
        committed_on(&base, &replicated.group, &topic, 1)
            .get(&0)
            .copied()
            .unwrap_or(-1)
    };

    let first = replicated.member("a", &[]);
    let (_, mut sent) = produce_values_with(&producer_on(&base), &topic, batch(0, 16)).await;
    wait_for("the first batch committed", JOIN_AND_FLUSH, || {
        committed() == 16
    })
    .await;
    // The follower stops: the leader alone is in sync, and alone holds the second batch.
    replicated.cluster.stop(2);
    replicated.cluster.wait_replicas_in_sync(&[&topic], 1);
    let (_, more) = produce_values_with(&producer_on(&base), &topic, batch(16, 16)).await;
    sent.extend(more);
    wait_for("the second batch committed", JOIN_AND_FLUSH, || {
        committed() == 32
    })
    .await;
    let first = match running_through {
        true => Some(first),
        false => {
            assert_eq!(first.terminate(), Some(0));
            None
        }
    };

    // The leader dies; the follower comes back out of sync and is made leader on its 16.
    replicated.cluster.kill(1);
    replicated.cluster.start_again(2);
    wait_for(
        "the out-of-sync replica leading",
        Duration::from_secs(120),
        || replicated.cluster.leader_of(&topic, 0) == 2,
    )
    .await;
    let (_, again) = produce_values_with(&producer_on(&base), &topic, batch(32, 24)).await;
    sent.extend(again);
    let end = high_watermarks_on(&base, &topic, 1);
    assert_eq!(end[&0], 40, "the log cut back to 16, then 24 written");

    let (member, name) = match first {
        Some(member) => (member, "a"),
        None => (replicated.member("a-restarted", &[]), "a-restarted"),
    };
    let mut probes = Probes::default();
    wait_for("the topic committed to its end", JOIN_AND_FLUSH, || {
        member.probe_into(&mut probes, "/health/live", "the member");
        committed() == 40
    })
    .await;
    let stored = blobs_under(&replicated.blob_dir);
    let missing: Vec<String> = outcomes(&sent)
        .0
        .into_keys()
        .filter(|k| !stored.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{} segments never stored: {missing:?}",
        missing.len()
    );
    probes.assert_healthy();
    assert_eq!(member.terminate(), Some(0));
    let said = std::fs::read_to_string(replicated.log_of(name)).unwrap();
    // Started after the election, the member finds the cut by its own check of the committed
    // position. Running through it, the member may find it through librdkafka's check as the
    // leader's epoch changed (its offsets went back), or be assigned the partition again (its
    // coordinator's node was down with the others) and find it through its own, or, assigned
    // again before anything was written back, start over from the log's start (out of range).
    let own = "the partition's log no longer holds the offset the group committed";
    let librdkafka = "offsets went back with nothing of the partition pending";
    assert!(running_through || said.contains(own), "{own:?} in:\n{said}");
    let found = match (said.contains(own), said.contains(librdkafka)) {
        (true, _) => "the member's check of its committed position",
        (false, true) => "librdkafka as the leader's epoch changed",
        (false, false) => "neither: read again from the log's start",
    };
    println!("cluster: the cut found by {found}");
    assert_no_error_line(&replicated.log_of(name));
    replicated.cluster.start_again(1);
}

/// `name`, one partition on nodes 1 (its leader) and 2, whose writes need one replica in sync
/// and which may be led by a replica out of sync.
async fn create_on_two_nodes_unclean(base: &rdkafka::ClientConfig, name: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = base.create().unwrap();
    let replicas: &[&[i32]] = &[&[1, 2]];
    let topic = NewTopic::new(name, 1, TopicReplication::Variable(replicas))
        .set("min.insync.replicas", "1")
        .set("unclean.leader.election.enable", "true");
    for result in admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap()
    {
        result.unwrap();
    }
}
