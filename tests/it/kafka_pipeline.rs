//! The consumer pipeline against the real local broker (Apache Kafka), with the filesystem blob sink and
//! the real dead-letter producer (kill -9 mid-flush: every real sink). Run through
//! `scripts/test.sh`, which starts the broker.

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use crate::support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn every_fixture_lands_once_as_a_blob_or_on_the_dlq_and_offsets_commit_to_the_end() {
    let _stack = uses_stack().await;
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 3).await;
    create_topic(&dlq, 1).await;
    let fixtures = all_fixtures();
    let (report, sent) = produce_fixtures(&topic, &fixtures, fixtures.len() as u64 * 2).await;
    let (blobs, dead) = outcomes(&sent);

    let dir = tempfile::tempdir().unwrap();
    // A session a loaded machine does not miss: a rebalance would read messages again, and
    // each is counted once here.
    let args = with_flag(
        service_args(&topic, &dlq, &group, dir.path(), free_port()),
        "--session-timeout-ms",
        "10000",
    );
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("service.log");
    let service = Service::start_logging_to(&args, &log);
    let target = expected_commits(&report);
    wait_for(
        "every partition committed to its end",
        JOIN_AND_FLUSH,
        || service.committed() == target,
    )
    .await;
    assert_eq!(service.terminate(), Some(0), "a clean shutdown exits 0");
    // The close releases the partitions quietly: the revoke librdkafka makes as the consumer
    // closes was sent to the stopped pipeline, and every clean shutdown warned that its drain
    // had not answered (the line a sink outage leaves).
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("partitions released as the consumer closes"),
        "{said}"
    );
    assert!(
        !said
            .lines()
            .any(|line| line.contains("WARN") && line.contains("kafka::consumer")),
        "a clean shutdown warns of nothing:\n{said}"
    );

    assert_eq!(
        blobs_under(dir.path()),
        blobs,
        "exactly the valid segments' blobs, byte for byte"
    );
    let mut got = read_dlq(
        &dlq,
        &topic,
        &originals(&sent),
        dead.len(),
        Duration::from_secs(30),
    );
    got.sort();
    assert_eq!(
        got,
        dead.into_iter().collect::<Vec<_>>(),
        "each invalid message on the DLQ once, with its reason"
    );
    assert_eq!(
        committed(&group, &topic, 3),
        target,
        "the broker has the same commits"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_restarted_service_resumes_after_its_commits_without_skipping_or_repeating() {
    let _stack = uses_stack().await;
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let fixtures: Vec<Vec<u8>> = all_fixtures()
        .into_iter()
        .filter(|f| f.len() < 100_000)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    // A session a loaded machine does not miss: a rebalance would read messages again.
    let args = with_flag(
        service_args(&topic, &dlq, &group, dir.path(), free_port()),
        "--session-timeout-ms",
        "10000",
    );

    let (first, first_sent) = produce_fixtures(&topic, &fixtures, 30).await;
    let service = Service::start(&args);
    wait_for("first batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&first)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));

    let (second, second_sent) = produce_fixtures(&topic, &fixtures, 30).await;
    let service = Service::start(&args);
    wait_for("second batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&second)
    })
    .await;
    let consumed = service.status().unwrap()["consumed"].as_u64().unwrap();
    assert_eq!(service.terminate(), Some(0));

    assert_eq!(
        consumed, 30,
        "the restart reads exactly the new messages: a broker that skipped or replayed committed messages fails here"
    );
    let (mut blobs, _) = outcomes(&first_sent);
    blobs.extend(outcomes(&second_sent).0);
    assert_eq!(blobs_under(dir.path()), blobs);
}

/// The outage this guards against: one 6 KB message whose 5 MiB page URL was copied into 1 000
/// hydration errors took the process past 24 GB, and every member that took the partition over
/// died the same way. Now each crafted message is processed within its bound (or dead-lettered),
/// the regular segment behind them is processed, the offsets reach the end, and the service's
/// peak RSS stays far below what the old copies needed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn crafted_messages_cost_a_bounded_amount_and_the_next_message_follows() {
    let _stack = uses_stack().await;
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let crafted = [
        "href-x-hydration-errors",
        "href-x-clicks",
        "long-click-fields",
        "deep-nesting-events",
    ];
    // Each valid one under a replay id of its own, so that each blob is seen; the invalid ones
    // as crafted. Production order is offset order (one partition).
    let (mut values, mut expected_blobs, mut expected_dead) =
        (Vec::new(), BTreeSet::new(), Vec::new());
    for (offset, h) in crate::support::hostile::all()
        .into_iter()
        .filter(|h| crafted.contains(&h.name) || h.invalid_reason.is_some())
        .enumerate()
    {
        match h.invalid_reason {
            Some(reason) => {
                expected_dead.push((0, offset as i64, reason.to_owned()));
                // Over the dead-letter topic's default limit (1 MiB): the value is kept in
                // the bucket and the record points at it.
                if h.value.len() > 1 << 20 {
                    expected_blobs.insert(replay_ingest::sink::dlq::copy_key(
                        &h.value,
                        &topic,
                        0,
                        offset as i64,
                    ));
                }
                values.push(h.value);
            }
            None => {
                let id = format!("{:032x}", 0xc0de_0000 + offset);
                let value = load::with_replay_id(&h.value, &id).unwrap();
                let processed =
                    replay_ingest::recording::process(&value, &Default::default()).unwrap();
                expected_blobs.insert(processed.blob.key);
                values.push(value);
            }
        }
    }
    assert_eq!(
        expected_blobs
            .iter()
            .filter(|k| !k.starts_with("dlq/"))
            .count(),
        crafted.len(),
        "every crafted one valid"
    );
    let regular = std::fs::read(fixture_dir().join("segments/interactions-0.msgpack")).unwrap();
    values.push(regular.clone());
    let (report, sent) = produce_values(
        &topic,
        values
            .into_iter()
            .zip(0..)
            .map(|(v, i)| (v, test_key(i)))
            .collect(),
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let pid = service.child.id();
    wait_for("every message committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&report)
    })
    .await;
    let peak_rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")
                .map(|v| v.trim().trim_end_matches(" kB").parse::<u64>().unwrap())
        })
        .unwrap();
    assert_eq!(
        service.terminate(),
        Some(0),
        "the service is still running and stops cleanly"
    );

    // Each crafted segment stored, and the regular one behind them; each invalid message
    // dead-lettered at its offset with its reason (the large ones' values in the bucket), and
    // nothing else.
    expected_blobs.insert(
        replay_ingest::recording::process(&regular, &Default::default())
            .unwrap()
            .blob
            .key,
    );
    let written: BTreeSet<String> = files_under(dir.path()).into_iter().collect();
    assert_eq!(written, expected_blobs);
    let mut dead = read_dlq(
        &dlq,
        &topic,
        &originals(&sent),
        expected_dead.len(),
        Duration::from_secs(30),
    );
    dead.sort();
    assert_eq!(dead, expected_dead);
    assert!(peak_rss_kib < 512 * 1024, "peak RSS {peak_rss_kib} KiB");
}

/// Merges produce reports: the last offset per partition over all of them.
fn last_offsets(reports: &[crate::support::load::Produced]) -> BTreeMap<i32, i64> {
    let mut last = BTreeMap::new();
    for report in reports {
        for (&p, &o) in &report.last_offsets {
            let slot = last.entry(p).or_insert(o);
            *slot = (*slot).max(o + 1);
        }
    }
    last.into_iter().collect()
}

/// kill -9 while a flush is under way, four times, under steady production, with every real
/// sink: blobs to the GCS emulator behind a proxy that holds each upload 300 ms, so that a flush
/// lasts long enough to be seen in flight (`/status`) and killed there. After a clean restart
/// every segment's blob is in the bucket byte for byte and nothing else is, its rows are in
/// ClickHouse column for column and no others are, every billing outcome was published (some
/// twice: a kill between a flush and its commit) and no other, every invalid message reached the
/// dead-letter topic, and the group committed to the end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn killing_the_service_mid_flush_again_and_again_loses_nothing() {
    let _stack = uses_stack().await;
    killed_mid_flush_again_and_again(&[]).await;
}

/// The same with the consumer group protocol of KIP-848: each restart joins a group whose
/// killed member the broker still counts until its session ends.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_killing_the_service_mid_flush_loses_nothing() {
    let _stack = uses_stack().await;
    killed_mid_flush_again_and_again(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// Four kills mid-flush and a clean restart, `protocol` the extra flags of every start.
async fn killed_mid_flush_again_and_again(protocol: &[&str]) {
    let names = Names::with_partitions(3).await;
    let proxy = proxy::Proxy::start(&gcs_endpoint(), |seen| {
        if blob_upload(seen.path) {
            proxy::Action::Delay(Duration::from_millis(300))
        } else {
            proxy::Action::Forward
        }
    })
    .await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let mut args = with_flag(
        names.args(statsd.port(), dir.path()),
        "--gcs-endpoint",
        &proxy.endpoint,
    );
    args.extend(protocol.iter().map(|s| s.to_string()));

    // Producing goes on in the background until every kill round is over, so that each round
    // has messages to flush (a round that found nothing left would wait for a flush forever).
    let rounds_over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producing = {
        let (topic, rounds_over) = (names.topic.clone(), rounds_over.clone());
        tokio::spawn(async move {
            let fixtures = all_fixtures();
            let mut reports = Vec::new();
            let mut expected = Vec::new();
            while reports.len() < 8 || !rounds_over.load(std::sync::atomic::Ordering::SeqCst) {
                let (report, wave) = produce_fixtures(&topic, &fixtures, 40).await;
                reports.push(report);
                expected.extend(wave);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (reports, expected)
        })
    };
    for round in 0..4 {
        let service = Service::start(&args);
        wait_for(
            &format!("round {round}: a flush in flight after one has ended"),
            JOIN_AND_FLUSH,
            || {
                service.status().is_some_and(|s| {
                    s["flushed"].as_u64().unwrap_or(0) > 0
                        && s["flushes_in_flight"].as_u64().unwrap_or(0) > 0
                })
            },
        )
        .await;
        service.kill9();
    }
    rounds_over.store(true, std::sync::atomic::Ordering::SeqCst);
    let (reports, expected) = producing.await.unwrap();
    let target = last_offsets(&reports);

    let service = Service::start(&args);
    // The last killed member may have committed everything already: the service must be up (its
    // signal handlers installed) before the stop whose clean exit is checked.
    wait_for("the service up", JOIN_AND_FLUSH, || {
        service.status().is_some()
    })
    .await;
    wait_for(
        "everything committed after the last restart",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 3) == target,
    )
    .await;
    assert_eq!(service.terminate(), Some(0));

    let (blobs, dead) = outcomes(&expected);
    let valid: Vec<&Sent> = expected
        .iter()
        .filter(|s| matches!(s.expected, Expected::Blob { .. }))
        .collect();
    every_blob_in_gcs(&names.bucket, valid.iter().copied()).await;
    let unexpected: Vec<String> = names
        .blobs()
        .into_iter()
        .filter(|key| !key.starts_with("dlq/") && !blobs.contains_key(key))
        .collect();
    assert!(
        unexpected.is_empty(),
        "only produced segments: {unexpected:?}"
    );
    let stored = clickhouse_rows(&names.table).await;
    assert!(!stored.is_empty());
    assert_eq!(
        row_differences(&expected_rows(&expected), &stored),
        (0, 0, 0),
        "every segment's rows, column for column, and no others (missing, unexpected, differing)"
    );
    let billing: BTreeSet<String> = valid
        .iter()
        .flat_map(|s| events_of(&s.value, "outcome"))
        .collect();
    assert!(!billing.is_empty());
    let published: BTreeSet<String> =
        read_messages(&names.outcomes, billing.len(), Duration::from_secs(30))
            .into_iter()
            .map(|m| String::from_utf8(m.value).unwrap())
            .collect();
    assert_eq!(published, billing, "every billing outcome, and no other");
    let got: BTreeSet<_> = read_dlq(
        &names.dlq,
        &names.topic,
        &originals(&expected),
        dead.len(),
        Duration::from_secs(30),
    )
    .into_iter()
    .collect();
    let lost: Vec<_> = dead.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} of {} invalid messages never reached the DLQ (duplicates allowed, loss not): {:?}",
        lost.len(),
        dead.len(),
        lost.first()
    );
}

/// The number a service logged as consumed when it stopped cleanly.
fn consumed_at_exit(log: &std::path::Path) -> u64 {
    let log = std::fs::read_to_string(log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("stopped cleanly"))
        .unwrap_or_else(|| panic!("no clean stop in:\n{log}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("consumed="))
        .unwrap()
        .parse()
        .unwrap()
}

/// A second member joins while messages keep coming, then the first leaves, still under load.
/// Rebalancing is cooperative: each revoke moves only some partitions, and the member giving them
/// up drains and commits synchronously before they are released — while the partitions it keeps
/// go on being consumed — so no message is read twice: the members' consumed counts add up
/// to exactly what was produced. (Blobs cannot show this: a redelivered segment overwrites its
/// blob with the same bytes.) The drain deadline is generous here, so that only a broken drain,
/// not a slow machine, can cause a redelivery.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn members_joining_and_leaving_under_load_lose_nothing_and_hand_over_without_redelivery() {
    let _stack = uses_stack().await;
    members_join_and_leave_under_load(&[]).await;
}

/// The same with the consumer group protocol of KIP-848 (the broker assigns; revocations and
/// assignments arrive through the same callbacks, incrementally).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_members_joining_and_leaving_under_load_lose_nothing() {
    let _stack = uses_stack().await;
    members_join_and_leave_under_load(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// A member consumes under continuous load; a second joins; the first leaves. The members'
/// consumed counts add up to exactly what was produced, every blob and dead letter once, and the
/// member that only gained partitions never drained. `protocol`: extra flags for both members.
async fn members_join_and_leave_under_load(protocol: &[&str]) {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 4).await;
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let fixtures: Vec<Vec<u8>> = all_fixtures()
        .into_iter()
        .filter(|f| f.len() < 100_000)
        .collect();
    let args = || {
        let args = with_flag(
            service_args(&topic, &dlq, &group, dir.path(), free_port()),
            "--session-timeout-ms",
            "10000",
        );
        let mut args = with_flag(
            with_flag(args, "--drain-deadline-ms", "8000"),
            "--buffer-max-age-ms",
            "2000",
        );
        args.extend(protocol.iter().map(|s| s.to_string()));
        args
    };

    // Each member reports metrics to a port of its own (every 100 ms, lag every 500 ms).
    let with_metrics = |args: Vec<String>, statsd: &Statsd| {
        let mut args = with_flag(
            args,
            "--statsd-address",
            &format!("127.0.0.1:{}", statsd.port()),
        );
        args.extend(
            [
                "--statsd-flush-interval-ms",
                "100",
                "--kafka-property",
                "statistics.interval.ms=500",
            ]
            .map(String::from),
        );
        args
    };
    let first_log = logs.path().join("first.log");
    let first_statsd = Statsd::bind();
    let first = Service::start_logging_to(&with_metrics(args(), &first_statsd), &first_log);
    // Production runs from before the join until a while after the leave, so that every revoke
    // finds messages buffered (a buffer is flushed after 2 s here).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producing = {
        let (topic, stop) = (topic.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut reports, mut expected) = (Vec::new(), Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (report, wave) = produce_fixtures(&topic, &fixtures, 20).await;
                reports.push(report);
                expected.extend(wave);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (reports, expected)
        })
    };
    let consuming = |s: &Service| {
        s.status()
            .is_some_and(|s| s["assigned"] == true && s["flushed"].as_u64() > Some(0))
    };
    wait_for("the first member consuming", JOIN_AND_FLUSH, || {
        consuming(&first)
    })
    .await;

    // Under load: a second member joins.
    let statsd = Statsd::bind();
    let second = Service::start(&with_metrics(args(), &statsd));
    wait_for("both members consuming", JOIN_AND_FLUSH, || {
        consuming(&first) && consuming(&second)
    })
    .await;

    // Under load: one member leaves while messages keep coming.
    assert_eq!(
        tokio::task::spawn_blocking(move || first.terminate())
            .await
            .unwrap(),
        Some(0),
        "the leaving member drains and exits cleanly"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (reports, expected) = producing.await.unwrap();
    let target = last_offsets(&reports);
    wait_for(
        "the remaining member commits everything",
        JOIN_AND_FLUSH,
        || committed(&group, &topic, 4) == target,
    )
    .await;
    let status = second.status().unwrap();
    assert_eq!(second.terminate(), Some(0));

    // Cooperative rebalancing: partitions only moved to the remaining member, so nothing was
    // ever revoked from it (it never stopped to drain); it ends with all four.
    assert_eq!(
        status["rebalances"], 0,
        "no revoke for the member that only gained partitions"
    );
    assert_eq!(status["partitions"], json!([0, 1, 2, 3]));
    let (blobs, dead) = outcomes(&expected);
    assert_eq!(
        blobs_under(dir.path()),
        blobs,
        "every segment stored, whichever member consumed it"
    );
    let consumed = (
        consumed_at_exit(&first_log),
        status["consumed"].as_u64().unwrap(),
    );
    assert_eq!(
        consumed.0 + consumed.1,
        expected.len() as u64,
        "every message consumed exactly once (leaving member, remaining member: {consumed:?})"
    );
    let mut got = read_dlq(
        &dlq,
        &topic,
        &originals(&expected),
        dead.len(),
        Duration::from_secs(30),
    );
    got.sort();
    assert_eq!(
        got,
        dead.into_iter().collect::<Vec<_>>(),
        "each invalid message dead-lettered once"
    );

    // The leaving member drained for the partitions it gave away when the second joined (when it
    // left, its shutdown had drained already), and its lag gauges read 0 last: it owns nothing
    // any more, the other member reports them.
    let first_metrics = first_statsd.read();
    let revokes = first_metrics
        .counters
        .get("replay_ingest.consumer.rebalances")
        .copied()
        .unwrap_or(0.0);
    assert!(
        revokes >= 1.0,
        "consumer.rebalances counts each revoke drained: {revokes}\n{}",
        first_metrics.text
    );
    let last_lags: BTreeMap<&str, f64> = first_metrics
        .values
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix("replay_ingest.consumer.lag|partition:")?,
                *v.last()?,
            ))
        })
        .collect();
    assert!(
        !last_lags.is_empty(),
        "consumer.lag reported per partition:\n{}",
        first_metrics.text
    );
    assert!(
        last_lags.values().all(|&lag| lag == 0.0),
        "given-away partitions read 0: {last_lags:?}"
    );
    // The remaining member reports the lag of the partitions it holds.
    let metrics = statsd.read();
    let lagged: BTreeSet<&str> = metrics
        .values
        .keys()
        .filter_map(|k| k.strip_prefix("replay_ingest.consumer.lag|partition:"))
        .collect();
    assert_eq!(
        lagged,
        BTreeSet::from(["0", "1", "2", "3"]),
        "consumer.lag reported for each partition it holds:\n{}",
        metrics.text
    );
}

/// A member frozen past its session (SIGSTOP: a stalled node, a CPU-throttled pod) with messages
/// buffered: the group gives its partitions to the other member, which reads them again from the
/// last commit and stores them. Resumed, the frozen member finds its partitions lost and gives
/// them up without flushing what it buffered of them — the new owner has written it already, and
/// billing outcomes are not idempotent — then rejoins and carries on. Its blob directory stays
/// empty (a drain on the loss would have written its buffer there), the other's holds every
/// segment, the group commits to the end and neither member exits.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_member_frozen_past_its_session_gives_up_its_lost_partitions_without_flushing_them() {
    let _stack = uses_stack().await;
    frozen_past_its_session(&[]).await;
}

/// The same with the consumer group protocol of KIP-848: the broker's session (10 s here, not
/// the member's `--session-timeout-ms`) fences the frozen member, which learns of it at its first
/// heartbeat once resumed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_a_member_frozen_past_its_session_gives_up_its_partitions()
{
    let _stack = uses_stack().await;
    frozen_past_its_session(&["--kafka-property", "group.protocol=consumer"]).await;
}

/// A member frozen past its session and resumed, `protocol` the extra flags of both members.
async fn frozen_past_its_session(protocol: &[&str]) {
    let (topic, dlq, group) = (unique("frozen"), unique("dlq"), unique("group"));
    create_topic(&topic, 4).await;
    create_topic(&dlq, 1).await;
    let (dirs, logs) = (
        [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()],
        tempfile::tempdir().unwrap(),
    );
    // Nothing is flushed on age while the test runs: what a member holds stays buffered until a
    // revoke drains it (or, lost, drops it).
    let member = |dir: &std::path::Path, log: &std::path::Path| {
        let args = with_flag(
            service_args(&topic, &dlq, &group, dir, free_port()),
            "--session-timeout-ms",
            "6000",
        );
        let mut args = with_flag(args, "--drain-deadline-ms", "4000");
        args.extend(protocol.iter().map(|s| s.to_string()));
        Service::start_logging_to(&with_flag(args, "--buffer-max-age-ms", "120000"), log)
    };
    let frozen_log = logs.path().join("frozen.log");
    let frozen = member(dirs[0].path(), &frozen_log);
    let other = member(dirs[1].path(), &logs.path().join("other.log"));
    both_own_partitions(&frozen, &other).await;
    let (report, sent) = produce_fixtures(&topic, &small_fixtures(true), 24).await;
    wait_for(
        "every message consumed and buffered",
        JOIN_AND_FLUSH,
        // At least: a rebalance on a loaded machine reads some again.
        || frozen.count("consumed") + other.count("consumed") >= 24,
    )
    .await;
    let held = frozen.status().unwrap()["buffer_messages"]
        .as_u64()
        .unwrap();
    assert!(held > 0, "the member to freeze buffers messages");

    let log = || std::fs::read_to_string(&frozen_log).unwrap_or_default();
    // What the member logs from the freeze on (before it, the join may have revoked some).
    let logged_before = log().len();
    let since_freeze = || log().get(logged_before..).unwrap_or_default().to_owned();
    frozen.signal("-STOP");
    wait_for(
        "the other member owning every partition and holding every message",
        JOIN_AND_FLUSH,
        || other.owned() == 4 && other.count("consumed") >= 24,
    )
    .await;
    frozen.signal("-CONT");
    wait_for(
        "the resumed member finding its partitions lost",
        JOIN_AND_FLUSH,
        || since_freeze().contains("partitions lost"),
    )
    .await;
    wait_for("the group committing to the end", JOIN_AND_FLUSH, || {
        committed(&group, &topic, 4) == expected_commits(&report)
    })
    .await;
    wait_for(
        "the resumed member owning partitions again",
        JOIN_AND_FLUSH,
        || frozen.owned() > 0,
    )
    .await;
    // (Its log is read: it logged its join. The real proof of no drain is its empty blob
    // directory, below.)
    assert!(log().contains("partitions assigned"), "{}", log());
    assert!(
        !since_freeze().contains("partitions revoked: draining"),
        "the loss was not drained:\n{}",
        since_freeze()
    );
    assert_eq!(
        files_under(dirs[0].path()),
        Vec::<String>::new(),
        "the frozen member wrote nothing of the {held} messages it held"
    );
    let (blobs, _) = outcomes(&sent);
    assert_eq!(
        blobs_under(dirs[1].path()),
        blobs,
        "the other member stored every segment"
    );
    assert_eq!(frozen.terminate(), Some(0), "the resumed member carried on");
    assert_eq!(other.terminate(), Some(0));
}

/// A shutdown while the broker is down (stopped cleanly; its log directory kept): the drain
/// flushes what the service buffered, but no commit can reach the group coordinator, so the
/// service exits 1 within its drain deadline and says why, instead of hanging or claiming a clean
/// stop. With the broker back, the next start reads again from the last commit: every segment
/// stored by both runs, the group committed to the end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_shutdown_while_the_broker_is_down_exits_1_on_time_and_the_next_start_loses_nothing() {
    let _stack = stops_stack().await;
    let (topic, dlq, group) = (unique("brokerdown"), unique("dlq"), unique("group"));
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let (dirs, logs) = (
        [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()],
        tempfile::tempdir().unwrap(),
    );
    let args = |dir: &std::path::Path| service_args(&topic, &dlq, &group, dir, free_port());
    let log = logs.path().join("first.log");
    // What it consumes is held in the buffer until the shutdown drains it. Its session outlasts
    // the broker's stop (up to 10 s): lost first, its partitions would be given up, nothing left
    // to drain (a clean exit, rightly). Its drain has 8 s: twenty blobs written and synced
    // one by one on a disk the chaos runs share, in a debug build, took over the tests' 1.5 s.
    let first = Service::start_logging_to(
        &with_flag(
            with_flag(
                with_flag(args(dirs[0].path()), "--buffer-max-age-ms", "120000"),
                "--session-timeout-ms",
                "30000",
            ),
            "--drain-deadline-ms",
            "8000",
        ),
        &log,
    );
    wait_for("the member owning both partitions", JOIN_AND_FLUSH, || {
        first.owned() == 2
    })
    .await;
    let (report, sent) = produce_fixtures(&topic, &small_fixtures(true), 20).await;
    wait_for("every message consumed", JOIN_AND_FLUSH, || {
        first.status().is_some_and(|s| s["consumed"] == 20)
    })
    .await;

    let broker = Down::begin("kafka");
    let asked = std::time::Instant::now();
    first.signal_term();
    let code = first.exit_within(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "an unclean stop exits 1:\n{logged}");
    assert!(
        took < Duration::from_secs(20),
        "the exit waited {took:?} (drain deadline 8 s)"
    );
    assert!(
        logged.contains("the last offset commit failed")
            || logged.contains("drain did not finish within 8s: 0 messages not committable yet (not durable, or behind one that is not), and offsets of durable ones not committed"),
        "the log says what was not committed:\n{logged}"
    );
    let (blobs, _) = outcomes(&sent);
    assert_eq!(
        blobs_under(dirs[0].path()),
        blobs,
        "the drain flushed everything before its commit failed"
    );
    drop(broker);

    let second = Service::start(&args(dirs[1].path()));
    wait_for(
        "the next start committing to the end",
        JOIN_AND_FLUSH,
        || committed(&group, &topic, 2) == expected_commits(&report),
    )
    .await;
    assert_eq!(
        blobs_under(dirs[1].path()),
        blobs,
        "the next start read everything again from the last commit"
    );
    assert_eq!(second.terminate(), Some(0));
}

/// More members than partitions: the one left without a partition is ready all the same, and the
/// other stays ready through the rebalance its arrival causes (readiness is "initialised, joined
/// once and not shutting down", so idle members and rebalances do not hold up a rollout under the
/// PodDisruptionBudget). `/status` lists the partitions each member owns.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_member_without_partitions_is_ready_and_a_rebalance_does_not_make_the_other_unready() {
    let _stack = uses_stack().await;
    let (topic, dlq, group) = (unique("idle"), unique("dlq"), unique("group"));
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let first = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let owns = |s: &Service| s.status().map(|s| s["partitions"].clone());
    wait_for(
        "the first member owning the partition",
        JOIN_AND_FLUSH,
        || owns(&first) == Some(json!([0])),
    )
    .await;

    let second = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let ready = |s: &Service| s.get("/health/ready").map(|(code, _)| code);
    let (mut first_unready, mut unanswered, mut asked) = (0, 0, 0);
    let deadline = std::time::Instant::now() + JOIN_AND_FLUSH;
    // Until the group has settled with the second member in it (it has joined once it took an
    // assignment, an empty one here: being initialised is only subscribing, before the
    // rebalance) and for 3 s more, the first member never reads unready.
    let mut settled_at = None;
    while std::time::Instant::now() < deadline {
        // A probe not answered within its timeout (the machine loaded) is counted apart.
        asked += 1;
        match ready(&first) {
            Some(200) => {}
            Some(_) => first_unready += 1,
            None => unanswered += 1,
        }
        let joined = second
            .log_text()
            .is_some_and(|log| log.contains("partitions assigned"));
        let owners = (owns(&first), owns(&second));
        let one_owner = matches!(&owners, (Some(a), Some(b)) if a.as_array().unwrap().len() + b.as_array().unwrap().len() == 1);
        if joined && one_owner && settled_at.is_none() {
            settled_at = Some(std::time::Instant::now());
        }
        if settled_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        settled_at.is_some(),
        "the group never settled with one owner"
    );
    assert_eq!(
        first_unready, 0,
        "the first member read unready during the rebalance"
    );
    assert!(
        unanswered * 2 < asked,
        "the first member answered most probes: {unanswered} of {asked} unanswered"
    );
    let (a, b) = (first.status().unwrap(), second.status().unwrap());
    let idle = if a["assigned"] == true { &b } else { &a };
    assert_eq!(
        (idle["assigned"].clone(), idle["partitions"].clone()),
        (json!(false), json!([]))
    );
    assert_eq!(
        (ready(&first), ready(&second)),
        (Some(200), Some(200)),
        "both ready, idle or not"
    );
    assert_eq!(first.terminate(), Some(0));
    assert_eq!(second.terminate(), Some(0));
}

/// Segments 0 received in year 10000 and at the largest u64 among valid messages, on a group of
/// two members with every real sink: each such message is dead-lettered as `invalid_received`,
/// everything else is written (an outcome for every valid segment 0), the group commits to the
/// end and neither member exits. (Before: the billing outcome's timestamp panicked the flush, and
/// every member that took the partition over died the same way.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_far_future_received_among_valid_messages_is_dead_lettered_and_no_member_exits() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (first_statsd, second_statsd) = (Statsd::bind(), Statsd::bind());
    let mut first = Service::start(&names.args(first_statsd.port(), dir.path()));
    let mut second = Service::start(&names.args(second_statsd.port(), dir.path()));
    let far: Vec<Vec<u8>> = crate::support::hostile::all()
        .into_iter()
        .filter(|h| h.invalid_reason == Some("invalid_received"))
        .map(|h| h.value)
        .collect();
    assert_eq!(far.len(), 2);
    let mut values: Vec<Vec<u8>> = (0..40)
        .map(|i| crate::support::load::fixture_copy(&small_fixtures(true), i))
        .collect();
    values.insert(10, far[0].clone());
    values.insert(30, far[1].clone());
    let (report, sent) = produce_values(
        &names.topic,
        values
            .into_iter()
            .zip(0..)
            .map(|(v, i)| (v, test_key(i)))
            .collect(),
    )
    .await;
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == expected_commits(&report)
    })
    .await;
    for member in [&mut first, &mut second] {
        assert!(
            member.child.try_wait().unwrap().is_none(),
            "no member exited"
        );
    }
    let (_, dead) = outcomes(&sent);
    let got = read_dlq(
        &names.dlq,
        &names.topic,
        &originals(&sent),
        dead.len(),
        Duration::from_secs(30),
    );
    // Dead letters and outcomes are at least once: a rebalance drain that misses its deadline on
    // a loaded machine (the two members start together) lets the next owner send some again.
    let got: std::collections::BTreeSet<_> = got.into_iter().collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.iter().all(|letter| letter.2 == "invalid_received"),
        "{got:?}"
    );
    let segment_0s = sent
        .iter()
        .filter_map(|s| replay_ingest::recording::process(&s.value, &Default::default()).ok())
        .filter(|p| p.ids.segment_id == 0)
        .count();
    let billed: std::collections::BTreeSet<_> =
        read_messages(&names.outcomes, segment_0s, Duration::from_secs(30))
            .into_iter()
            .map(|m| m.value)
            .collect();
    assert_eq!(
        billed.len(),
        segment_0s,
        "an outcome for every valid segment 0"
    );
    assert_eq!((first.terminate(), second.terminate()), (Some(0), Some(0)));
}

/// Partitions added to the consumed topic while two members consume it (an operator scaling
/// out): the members take them in (the classic protocol's leader once its metadata shows them:
/// the service refreshes it every 30 s, librdkafka every 5 min), read them from their start — nothing produced to them before
/// they were assigned is skipped (`auto.offset.reset=earliest`) — store every segment once and
/// commit every partition to its end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn partitions_added_while_running_are_read_from_their_start() {
    let _stack = uses_stack().await;
    partitions_added_while_running(&[]).await;
}

/// The same with the consumer group protocol of KIP-848, where the broker assigns them.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_partitions_added_while_running_are_read() {
    let _stack = uses_stack().await;
    partitions_added_while_running(&["--kafka-property", "group.protocol=consumer"]).await;
}

async fn partitions_added_while_running(protocol: &[&str]) {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let files = small_fixtures(true);
    let copies = |from: u64| keyed_copies(&files, from..from + 16);
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let member = |name: &str| {
        let mut args = with_flag(
            service_args(&topic, &dlq, &group, dir.path(), free_port()),
            "--session-timeout-ms",
            "10000",
        );
        args.extend(protocol.iter().map(|a| a.to_string()));
        Service::start_logging_to(&args, &logs.path().join(format!("{name}.log")))
    };
    let members = [member("a"), member("b")];
    let (_, mut sent) = produce_values(&topic, copies(0)).await;
    wait_for("the first messages committed", JOIN_AND_FLUSH, || {
        committed(&group, &topic, 2).values().sum::<i64>() == 16
    })
    .await;

    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        kafka().create().unwrap();
    let added = admin
        .create_partitions(
            &[rdkafka::admin::NewPartitions::new(&topic, 4)],
            &rdkafka::admin::AdminOptions::new(),
        )
        .await
        .unwrap();
    for result in added {
        result.unwrap();
    }
    // The brokers take the new count in a moment after the answer.
    let reader: rdkafka::consumer::BaseConsumer = kafka().create().unwrap();
    wait_for(
        "the brokers to know four partitions",
        Duration::from_secs(30),
        || {
            rdkafka::consumer::Consumer::fetch_metadata(
                &reader,
                Some(&topic),
                Duration::from_secs(5),
            )
            .is_ok_and(|m| {
                m.topics()
                    .first()
                    .is_some_and(|t| t.partitions().len() == 4)
            })
        },
    )
    .await;
    // A producer made now knows four partitions: the keys spread over them.
    let (_, more) = produce_values_with(&producer(), &topic, copies(16)).await;
    assert!(
        more.iter().any(|s| s.partition >= 2),
        "some of them on the new partitions: {:?}",
        more.iter().map(|s| s.partition).collect::<Vec<_>>()
    );
    sent.extend(more);
    let end = high_watermarks(&topic, 4);
    wait_for(
        "every partition, the new ones too, committed to its end",
        JOIN_AND_FLUSH,
        || committed(&group, &topic, 4) == end,
    )
    .await;
    assert_eq!(
        blobs_under(dir.path()),
        outcomes(&sent).0,
        "every segment stored"
    );
    for (member, name) in members.into_iter().zip(["a", "b"]) {
        assert_eq!(member.terminate(), Some(0), "member {name}");
        let log = std::fs::read_to_string(logs.path().join(format!("{name}.log"))).unwrap();
        assert!(!log.contains("offsets went back"), "member {name}:\n{log}");
    }
}

/// The consumed topic deleted under a running member and, once the member saw it go, created
/// again under its name with more partitions (an operator recreating it to change its layout):
/// the member gives the old partitions up and stays live; once the topic's new id is answered
/// twice it stops (exit 1: its clients may keep what they knew of the old topic), and started
/// again, as Kubernetes would, it reads the new partitions from their start — nothing of the
/// new topic is skipped for an offset of the old one (Kafka drops a deleted topic's commits; the
/// member must not commit one again) — stores every segment, commits the new partitions to their
/// end, logs no ERROR line and exits 0.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_consumed_topic_deleted_and_created_again_is_read_from_its_start() {
    let _stack = uses_stack().await;
    consumed_topic_deleted_and_created_again(&[], false).await;
}

/// The same with the consumer group protocol of KIP-848, where the broker takes the deleted
/// topic's partitions out of the member's assignment (a revoke, not a loss).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_the_consumed_topic_deleted_and_created_again_is_read() {
    let _stack = uses_stack().await;
    consumed_topic_deleted_and_created_again(
        &["--kafka-property", "group.protocol=consumer"],
        false,
    )
    .await;
}

/// The consumed topic deleted and created again at once, with the same partitions, before the
/// member saw it go (its metadata is refreshed every 30 s): under the classic protocol no
/// rebalance tells the member, and librdkafka goes on fetching the new topic from the old one's
/// positions, so its first messages would be skipped without a word (seen: 16 of 48 segments
/// never stored, the group committed to the end). The member finds the topic's id changed,
/// commits the start of its partitions, and stops to start again from there: every segment of
/// the new topic is stored (some twice).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_consumed_topic_created_again_before_the_member_saw_it_go_is_read_from_its_start() {
    let _stack = uses_stack().await;
    consumed_topic_deleted_and_created_again(&[], true).await;
}

/// The same with the consumer group protocol of KIP-848, where the broker revokes the deleted
/// topic's partitions and assigns the new topic's by id; the member stops on the new id all the
/// same (on a cluster whose leaders had moved, its client kept the old partitions' leader epochs
/// and read nothing: `kafka_cluster.rs`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_consumer_group_protocol_the_consumed_topic_created_again_at_once_is_read() {
    let _stack = uses_stack().await;
    consumed_topic_deleted_and_created_again(
        &["--kafka-property", "group.protocol=consumer"],
        true,
    )
    .await;
}

/// The consumed topic deleted under a member and created again: `at_once`, before the member saw
/// it go; else once it gave the old partitions up, with three partitions instead of two.
async fn consumed_topic_deleted_and_created_again(protocol: &[&str], at_once: bool) {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let files = small_fixtures(true);
    // The new topic gets more messages per partition than the old one had: an old offset
    // committed on it would skip some.
    let copies = |from: u64, count: u64| keyed_copies(&files, from..from + count);
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("member.log");
    let mut args = with_flag(
        service_args(&topic, &dlq, &group, dir.path(), free_port()),
        "--session-timeout-ms",
        "10000",
    );
    args.extend(protocol.iter().map(|a| a.to_string()));
    if at_once {
        // The member's own metadata refresh (every 30 s) falling between the deletion and the
        // creation would find the partitions lost (and rightly read the new topic from its
        // start, no stop needed): kept out of the test's way.
        args.extend(
            [
                "--kafka-property",
                "topic.metadata.refresh.interval.ms=600000",
            ]
            .map(String::from),
        );
    }
    let member = Service::start_logging_to(&args, &log);
    let (_, mut sent) = produce_values(&topic, copies(0, 16)).await;
    wait_for("the first messages committed", JOIN_AND_FLUSH, || {
        committed(&group, &topic, 2).values().sum::<i64>() == 16
    })
    .await;

    // A member that has run a while: its watch knows the topic's id (an id first learnt after
    // the topic was created again would be the new one's).
    wait_for(
        "the member's watch knowing the topic's id",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&log).is_ok_and(|said| {
                said.lines()
                    .any(|l| l.contains("a topic's id, watched") && l.contains(&topic))
            })
        },
    )
    .await;
    delete_topic(&topic).await;
    let mut probes = Probes::default();
    let partitions = if at_once {
        // The same layout, so that nothing tells the classic protocol's member the topic changed.
        2
    } else {
        wait_for(
            "the member gives the deleted topic's partitions up",
            Duration::from_secs(90),
            || {
                member.probe_into(&mut probes, "/health/live", "the member");
                member.owned() == 0
            },
        )
        .await;
        3
    };
    create_topic_again(&topic, partitions).await;
    let (_, more) = produce_values_with(&producer(), &topic, copies(16, 48)).await;
    sent.extend(more);
    let end = high_watermarks(&topic, partitions);
    assert_eq!(
        end.values().sum::<i64>(),
        48,
        "the new topic holds the new messages only"
    );
    let said = stops_on_a_new_topic_id(member, &log).await;
    // Under the classic protocol nothing took the partitions from the member: it owned them
    // when it found out (else it may have owned none).
    if at_once && protocol.is_empty() {
        let line = "committed the start of the partitions of the topic created again";
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    // As Kubernetes would.
    let log = logs.path().join("restarted.log");
    let member = Service::start_logging_to(&args, &log);
    wait_for(
        "the new topic's partitions committed to their end",
        JOIN_AND_FLUSH,
        || {
            member.probe_into(&mut probes, "/health/live", "the member");
            committed(&group, &topic, partitions) == end
        },
    )
    .await;
    assert_eq!(
        blobs_under(dir.path()),
        outcomes(&sent).0,
        "every segment of both topics stored"
    );
    probes.assert_healthy();
    assert_eq!(member.terminate(), Some(0));
    assert_no_error_line(&log);
}
