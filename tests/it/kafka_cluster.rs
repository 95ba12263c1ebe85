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

/// A rolling restart of the whole cluster (each node stopped cleanly, started again, caught up
/// before the next), then the group coordinator's node and the billing outcomes' leader killed
/// with SIGKILL, one after the other, while two members consume valid and invalid segments at
/// about twenty a second and publish their events: every segment is stored, every invalid one
/// dead-lettered, every message billed once, the group commits to the end, both members stay
/// live and neither exits or logs an ERROR line.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars and the local stack: scripts/test.sh fetches them and runs every test"]
async fn a_rolling_restart_and_killed_leaders_lose_nothing() {
    let _stack = uses_stack().await;
    let mut cluster = Cluster::start();
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
    let [outcomes_topic, analytics, issues] = &events;
    let bootstrap = cluster.bootstrap();
    let member = |n: usize| {
        let mut args = with_flag(
            service_args(&topic, &dlq, &group, &blob_dir, free_port()),
            "--brokers",
            &bootstrap,
        );
        args = with_flag(args, "--events-sink", "kafka");
        // A session a coordinator moving does not outlast (the tests' 2 s did).
        args = with_flag(args, "--session-timeout-ms", "10000");
        args.extend(
            [
                "--outcomes-topic",
                outcomes_topic,
                "--analytics-topic",
                analytics,
                "--issues-topic",
                issues,
            ]
            .map(String::from),
        );
        Service::start_logging_to(&args, &dir.path().join(format!("member-{n}.log")))
    };
    let members = [member(1), member(2)];
    wait_for("both members owning partitions", JOIN_AND_FLUSH, || {
        members.iter().all(|m| m.owned() > 0)
    })
    .await;

    // Traffic throughout: a batch of the small fixtures, valid and invalid, every second.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (base, topic, stop) = (base.clone(), topic.clone(), stop.clone());
        tokio::spawn(async move {
            let files = [small_fixtures(true), small_fixtures(false)].concat();
            let producer = producer_on(&base);
            let mut sent = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let batch: Vec<_> = (i..i + files.len() as u64)
                    .map(|i| (load::fixture_copy(&files, i), test_key(i)))
                    .collect();
                i += files.len() as u64;
                let (_, batch) = produce_values_with(&producer, &topic, batch).await;
                sent.extend(batch);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            sent
        })
    };
    let mut probes = Probes::default();
    let mut watched = |seconds| {
        for _ in 0..seconds {
            for (n, member) in members.iter().enumerate() {
                member.probe_into(&mut probes, "/health/live", &format!("member {}", n + 1));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    let mut in_sync: Vec<&str> = vec![&topic, &dlq, "__consumer_offsets"];
    in_sync.extend(events.iter().map(String::as_str));
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
    let billing = cluster.leader_of(outcomes_topic, 0);
    cluster.kill(billing);
    watched(8);
    cluster.start_again(billing);
    cluster.wait_in_sync(&in_sync);
    watched(3);
    stop.store(true, Ordering::SeqCst);
    let sent = traffic.await.unwrap();
    assert!(sent.len() > 200, "{} messages sent", sent.len());

    everything_landed(&base, &sent, (&topic, 4), &dlq, &group, &blob_dir).await;
    let billed: usize = sent
        .iter()
        .filter(|s| matches!(s.expected, Expected::Blob { .. }))
        .map(|s| events_of(&s.value, "outcome").len())
        .sum();
    // The producers are idempotent and not transactional: each record is one offset.
    let published: i64 = high_watermarks_on(&base, outcomes_topic, 1).values().sum();
    assert_eq!(
        published as usize, billed,
        "every message billed exactly once"
    );
    probes.assert_healthy();
    println!(
        "cluster: {} messages through a rolling restart and two leaders killed, {billed} billed once, {} probes",
        sent.len(),
        probes.asked
    );
    for (n, member) in members.into_iter().enumerate() {
        assert_eq!(member.terminate(), Some(0), "member {} exits 0", n + 1);
        let log =
            std::fs::read_to_string(dir.path().join(format!("member-{}.log", n + 1))).unwrap();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| log_level(l) == Some("ERROR"))
            .collect();
        assert!(
            errors.is_empty(),
            "member {}: no ERROR line: {errors:#?}",
            n + 1
        );
    }
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
    const MAX_POLL_INTERVAL: Duration = Duration::from_secs(20);
    const DRAIN_DEADLINE: Duration = Duration::from_secs(14);
    // Longer than any flush's retries take to reach their cap, and than the poll interval.
    const OUTAGE: Duration = Duration::from_secs(150);
    let _stack = uses_stack().await;
    let mut cluster = Cluster::start();
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
    let [outcomes_topic, analytics, issues] = &events;
    set_topic_config_on(&base, outcomes_topic, "min.insync.replicas", "3").await;
    let dir = tempfile::tempdir().unwrap();
    let blob_dir = dir.path().join("blobs");
    let max_poll = format!("max.poll.interval.ms={}", MAX_POLL_INTERVAL.as_millis());
    let bootstrap = cluster.bootstrap();
    let member = |name: &str| {
        let mut args = with_flag(
            service_args(&topic, &dlq, &group, &blob_dir, free_port()),
            "--brokers",
            &bootstrap,
        );
        args = with_flag(args, "--events-sink", "kafka");
        args = with_flag(args, "--session-timeout-ms", "16000");
        args = with_flag(
            args,
            "--drain-deadline-ms",
            &DRAIN_DEADLINE.as_millis().to_string(),
        );
        args.extend(
            [
                "--outcomes-topic",
                outcomes_topic,
                "--analytics-topic",
                analytics,
                "--issues-topic",
                issues,
                "--buffer-max-messages",
                "4",
                "--max-flushes-in-flight",
                "1",
                "--kafka-property",
                &max_poll,
            ]
            .map(String::from),
        );
        let log = dir.path().join(format!("{name}.log"));
        (Service::start_logging_to(&args, &log), log)
    };
    let (a, a_log) = member("a");
    let files = small_fixtures(true);
    let producer = producer_on(&base);
    let copies = |from: u64, count: u64| -> Vec<(Vec<u8>, Vec<u8>)> {
        (from..from + count)
            .map(|i| (load::fixture_copy(&files, i), test_key(i)))
            .collect()
    };
    let (_, mut sent) = produce_values_with(&producer, &topic, copies(0, 8)).await;
    wait_for("the first batch committed", JOIN_AND_FLUSH, || {
        committed_on(&base, &group, &topic, 4).values().sum::<i64>() == 8
    })
    .await;

    // Any node: every partition has a replica on each, so the outcomes' in-sync replicas fall to
    // two, and every other topic keeps the two it needs.
    cluster.kill(NODES as i32);
    let outage = std::time::Instant::now();
    let producing = Arc::new(AtomicBool::new(true));
    let load = {
        let (base, topic, files, producing) = (
            base.clone(),
            topic.clone(),
            files.clone(),
            producing.clone(),
        );
        tokio::spawn(async move {
            let producer = producer_on(&base);
            let mut sent = Vec::new();
            let mut i = 8u64;
            while producing.load(Ordering::SeqCst) {
                let batch = (i..i + 2)
                    .map(|i| (load::fixture_copy(&files, i), test_key(i)))
                    .collect();
                i += 2;
                sent.extend(produce_values_with(&producer, &topic, batch).await.1);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            sent
        })
    };
    let mut probes = Probes::default();
    wait_for(
        "intake paused behind the flush the outcomes' topic refuses",
        JOIN_AND_FLUSH,
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

    let (b, b_log) = member("b");
    let joined = std::time::Instant::now();
    wait_for(
        "the joiner owns partitions during the outage",
        JOIN_AND_FLUSH,
        || b.owned() > 0,
    )
    .await;
    println!(
        "the joiner owned partitions {:?} after it started",
        joined.elapsed()
    );
    let a_said = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        a_said.contains("has been failing for longer than the drain deadline"),
        "the revoke says why it did not wait:\n{a_said}"
    );
    wait_for("the joiner flushes", JOIN_AND_FLUSH, || {
        b.status()
            .is_some_and(|s| s["flushes_in_flight"].as_u64() >= Some(1))
    })
    .await;
    b.signal_term();
    let exit = b.exit_within(DRAIN_DEADLINE + Duration::from_secs(3)).await;
    assert_eq!(
        exit,
        Some(1),
        "a SIGTERM during the outage exits within the drain deadline:\n{}",
        std::fs::read_to_string(&b_log).unwrap_or_default()
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
    let status = a.status().unwrap();
    assert!(
        status["outages"]["events"].is_object(),
        "still refused: {status}"
    );
    probes.assert_healthy();

    cluster.start_again(NODES as i32);
    producing.store(false, Ordering::SeqCst);
    sent.extend(load.await.unwrap());
    everything_landed(&base, &sent, (&topic, 4), &dlq, &group, &blob_dir).await;
    let billed: usize = sent
        .iter()
        .filter(|s| matches!(s.expected, Expected::Blob { .. }))
        .map(|s| events_of(&s.value, "outcome").len())
        .sum();
    let published: i64 = high_watermarks_on(&base, outcomes_topic, 1).values().sum();
    assert_eq!(
        published as usize, billed,
        "every message billed exactly once"
    );
    assert_eq!(a.terminate(), Some(0));
}
