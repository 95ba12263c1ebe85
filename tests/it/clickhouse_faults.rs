//! ClickHouse faults with the real service: the server stops mid-run and comes back once the
//! service has failed a flush five times (retried, nothing committed in between, every segment
//! stored); the server is down when the
//! service starts (shown in `/status`, live, the member joins and consumes, its writes wait for
//! the server, the table's migration first); and a column altered to another type
//! while the service runs (a configuration error: the service stops, non-zero, naming the
//! column, nothing committed past it); and a member joining during a long outage (it gets
//! partitions at once, the first member stays in the group, nothing is lost); and a server that
//! takes the INSERT and does not answer (timed out, retried, nothing committed meanwhile). The tests that stop
//! the shared server hold `stops_stack()`: no other stack test runs meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_clickhouse_outage_is_ridden_out_without_committing_past_it() {
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let fixtures = small_fixtures(true);
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    // One flush at a time, four messages per buffer: the outage stalls a flush, the next buffer
    // fills, and intake pauses.
    let mut args = names.args(statsd.port(), dir.path());
    args.extend(["--buffer-max-messages", "4", "--max-flushes-in-flight", "1"].map(String::from));
    let service = Service::start(&args);
    let (first, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&first)
    })
    .await;
    // What the first batch's pauses counted (they ended with its flushes), apart from what the
    // outage's pause counts while it lasts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut read = vec![statsd.read_now()];

    let outage = Down::begin("clickhouse");
    let (second, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    // The second batch is consumed until intake pauses, and its flush keeps failing: retried
    // (without limit, the default), and the broker's commits stay where they were. Waiting on
    // what the service says, not on a clock, so that the check is made during a real outage with
    // messages in hand.
    wait_for(
        "intake paused behind a flush failing again and again",
        JOIN_AND_FLUSH,
        || {
            service.status().is_some_and(|s| {
                s["paused"] == true
                    && s["consumed"].as_u64() >= Some(18)
                    && s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(5)
            })
        },
    )
    .await;
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        expected_commits(&first),
        "nothing committed during the outage"
    );
    assert_eq!(
        service.status().unwrap()["flushed"],
        10,
        "the failing flush is not counted as done"
    );
    // The pause is counted while it lasts (an alert on its rate fires during the outage), not
    // only once intake resumes.
    let paused_ms = |m: &Metrics| m.counters.get("replay_ingest.consumer.paused_ms").copied();
    wait_for(
        "consumer.paused_ms sent during the pause",
        Duration::from_secs(10),
        || {
            read.push(statsd.read_now());
            read.last().and_then(paused_ms).is_some_and(|ms| ms > 0.0)
        },
    )
    .await;
    // Failed attempts are counted as they fail (an alert on their rate fires during the
    // outage), not once the flush is durable.
    let retries = |m: &Metrics| {
        m.counters
            .get("replay_ingest.flush.retries|sink:clickhouse")
            .copied()
    };
    wait_for(
        "flush.retries sent during the outage",
        Duration::from_secs(10),
        || {
            read.push(statsd.read_now());
            read.last().and_then(retries).is_some_and(|n| n > 0.0)
        },
    )
    .await;
    // The outage's length is sent while it lasts, from /status, once a second.
    let outage_ms = |m: &Metrics| {
        m.values
            .get("replay_ingest.sink.outage_ms|sink:clickhouse")
            .is_some_and(|values| values.iter().any(|&ms| ms > 0.0))
    };
    wait_for(
        "sink.outage_ms sent during the outage",
        Duration::from_secs(10),
        || {
            read.push(statsd.read_now());
            read.last().is_some_and(outage_ms)
        },
    )
    .await;
    assert_eq!(service.status().unwrap()["paused"], true, "still paused");
    drop(outage);

    let mut target = expected_commits(&first);
    target.extend(expected_commits(&second));
    wait_for(
        "everything committed after the outage",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == target,
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    let segments = clickhouse_rows(&names.table)
        .await
        .iter()
        .filter(|r| r.is_segment())
        .count();
    assert_eq!(segments, 20, "every segment row stored once");

    // What the outage looked like in the metrics.
    read.push(statsd.read());
    let metrics = Metrics::sum(read);
    let retries = metrics
        .counters
        .get("replay_ingest.flush.retries|sink:clickhouse")
        .copied()
        .unwrap_or(0.0);
    assert!(
        retries >= 5.0,
        "flush.retries counts the failed attempts: {retries}\n{}",
        metrics.text
    );
    let paused = metrics
        .counters
        .get("replay_ingest.consumer.paused_ms")
        .copied()
        .unwrap_or(0.0);
    assert!(
        paused > 0.0,
        "consumer.paused_ms counts the pause: {}",
        metrics.text
    );
    assert!(
        !metrics
            .counters
            .contains_key("replay_ingest.flush.errors|sink:clickhouse"),
        "no flush gave up"
    );
}

/// A ClickHouse that takes the INSERT and does not answer (a proxy holds every answer 30 s while
/// the hang lasts; the server itself runs on): each request ends at `--sink-timeout-ms` and is
/// retried, every timeout is progress (live past the 9 s flush stall, the least a one-second sink
/// timeout allows: ten attempts fail first), nothing is committed, and
/// once it answers again everything commits, each segment's row stored once (a retried INSERT
/// replaces what the timed-out one wrote).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_clickhouse_that_stops_answering_mid_flush_is_timed_out_and_retried_without_committing() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let hung = Arc::new(AtomicBool::new(true));
    let holding = hung.clone();
    let proxy = proxy::Proxy::start(&clickhouse_url(), move |seen| {
        if holding.load(Ordering::SeqCst) && seen.path.contains("INSERT") {
            proxy::Action::Delay(Duration::from_secs(30))
        } else {
            proxy::Action::Forward
        }
    })
    .await;
    let mut args = with_flag(
        names.args(statsd.port(), dir.path()),
        "--clickhouse-url",
        &proxy.endpoint,
    );
    args.extend(
        [
            "--sink-timeout-ms",
            "1000",
            "--flush-stall-timeout-ms",
            "9000",
        ]
        .map(String::from),
    );
    let service = Service::start(&args);
    let (report, _) = produce_fixtures(&names.topic, &small_fixtures(true), 10).await;
    wait_for(
        "the INSERT timed out ten times with everything consumed",
        JOIN_AND_FLUSH,
        || {
            service.status().is_some_and(|s| {
                s["consumed"].as_u64() >= Some(10)
                    && s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(10)
            })
        },
    )
    .await;
    let status = service.status().unwrap();
    let error = status["outages"]["clickhouse"]["last_error"]
        .as_str()
        .unwrap();
    assert!(
        error.contains("timed out") || error.contains("timeout"),
        "{error}"
    );
    assert_eq!(
        service.probe("/health/live"),
        Some(200),
        "timeouts are progress"
    );
    assert!(
        committed(&names.group, &names.topic, 2).is_empty(),
        "nothing committed during the hang"
    );
    hung.store(false, Ordering::SeqCst);
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let rows = clickhouse_rows(&names.table).await;
    assert_eq!(rows.iter().filter(|r| r.is_segment()).count(), 10);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_column_altered_while_running_stops_the_service_naming_it_without_committing_past_it() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let fixtures = small_fixtures(true);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let statsd = Statsd::bind();
    // A long metrics interval: the error counted just before the exit must still be sent, because
    // the process waits for the exporter's next send before it exits.
    let args = with_flag(
        names.args(statsd.port(), dir.path()),
        "--statsd-flush-interval-ms",
        "3000",
    );
    let mut service = Service::start_logging_to(&args, &log);
    let (first, _) = produce_fixtures(&names.topic, &fixtures, 5).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&first)
    })
    .await;

    let client = replay_ingest::sink::clickhouse::client(&clickhouse_config(&names.table));
    client
        .query(&format!(
            "ALTER TABLE {} MODIFY COLUMN click_node_id Date",
            names.table
        ))
        .execute()
        .await
        .unwrap();
    produce_fixtures(&names.topic, &fixtures, 5).await;
    // Not ready from the failed flush until the exit, which waits for the exporter's next send
    // (seconds here). It read as ready until it exited.
    let (started, mut readiness) = (std::time::Instant::now(), Vec::new());
    while service.child.try_wait().unwrap().is_none() && started.elapsed() < JOIN_AND_FLUSH {
        readiness.push(service.probe("/health/ready"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unready = readiness.iter().position(|r| *r == Some(503));
    assert!(
        unready.is_some_and(|at| !readiness[at..].contains(&Some(200))),
        "not ready once it stops: {readiness:?}"
    );
    assert_eq!(
        service.exit_within(JOIN_AND_FLUSH).await,
        Some(1),
        "the service stops with a non-zero exit on a configuration error"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    // The exit comes from the flush (after consuming; not a startup check), with the cause, on
    // the first attempt: a configuration error is not retried.
    let last = log
        .lines()
        .rfind(|l| l.contains("ERROR replay_ingest: "))
        .unwrap_or_default();
    assert!(
        last.contains("flush failed, nothing of it committed")
            && last.contains("column click_node_id is Date, expected UInt32"),
        "the service's exit error names the failed flush and the cause:\n{log}"
    );
    assert!(
        !log.contains("sink write failed; retrying"),
        "a configuration error is not retried:\n{log}"
    );
    let metrics = statsd.read();
    assert_eq!(
        metrics
            .counters
            .get("replay_ingest.flush.errors|sink:clickhouse"),
        Some(&1.0),
        "flush.errors counts the flush that gave up, sent before the exit:\n{}",
        metrics.text
    );
    assert_eq!(
        metrics
            .counters
            .get("replay_ingest.flush.retries|sink:clickhouse"),
        None,
        "no attempt retried:\n{}",
        metrics.text
    );
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        expected_commits(&first),
        "nothing committed past the failed flush"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn clickhouse_down_at_startup_is_shown_and_waited_for_while_the_member_joins_and_consumes() {
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let outage = Down::begin("clickhouse");
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    let service = Service::start(&names.args(statsd.port(), dir.path()));
    wait_for("the wait shown in /status", Duration::from_secs(30), || {
        service
            .status()
            .is_some_and(|s| s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(2))
    })
    .await;
    assert_eq!(
        service.status().unwrap()["live"],
        true,
        "waiting for a sink is not a wedged process"
    );
    // A sink that does not answer keeps no member out of its group (scaling out during an
    // outage): it joins and consumes; the writes there wait for the check, nothing commits.
    // It is not ready until the check passes: a rollout stops at the first pod that cannot
    // reach a destination (a mistyped address) instead of taking the whole fleet there.
    let fixtures = small_fixtures(true);
    let (sent, _) = produce_fixtures(&names.topic, &fixtures, 5).await;
    wait_for(
        "joined and consuming during the outage",
        JOIN_AND_FLUSH,
        || {
            service
                .status()
                .is_some_and(|s| s["joined"] == true && s["consumed"] == 5)
        },
    )
    .await;
    let status = service.status().unwrap();
    assert_eq!(
        (&status["ready"], &status["unchecked"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(["clickhouse"])
        ),
        "{status}"
    );
    assert_eq!(service.probe("/health/ready"), Some(503));
    assert!(
        committed(&names.group, &names.topic, 2).is_empty(),
        "nothing committed before ClickHouse answers"
    );
    drop(outage);

    wait_for(
        "everything committed once ClickHouse is up",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == expected_commits(&sent),
    )
    .await;
    assert_eq!(service.status().unwrap()["outages"], serde_json::json!({}));
    assert_eq!(
        service.probe("/health/ready"),
        Some(200),
        "ready once checked"
    );
    // The gauge showed the wait and is back at 0: the startup check that passed cleared the
    // outage in /status before the first write succeeded, and the gauge, which the exporter
    // keeps sending, held the wait's length for good.
    let outage_ms = || {
        statsd
            .read_now()
            .values
            .remove("replay_ingest.sink.outage_ms|sink:clickhouse")
            .unwrap_or_default()
    };
    let mut seen = outage_ms();
    wait_for("sink.outage_ms back at 0", Duration::from_secs(10), || {
        seen.extend(outage_ms());
        seen.last() == Some(&0.0)
    })
    .await;
    assert!(
        seen.iter().any(|&ms| ms > 0.0),
        "sink.outage_ms showed the wait: {seen:?}"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// Scale-out during an outage, as an operator meets it: one member under steady load with
/// ClickHouse answering 503 (a proxy in front of the shared server), intake paused behind the
/// failing flush for longer than `max.poll.interval.ms`, then a second member joins. The
/// polling thread never blocks on the pipeline, so the first member stays in the group (it would
/// be taken for stuck otherwise) and the rebalance is served at once: its revoke's drain does not
/// wait out its deadline for a flush failing for longer than that already, so the joiner owns
/// partitions within seconds while ClickHouse is still down. A SIGTERM to the joiner during the
/// outage exits 1 within its drain deadline; the first member takes the partitions back, still
/// during the outage; once ClickHouse answers, everything commits and nothing is lost.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_member_joining_during_a_long_outage_gets_partitions_at_once_and_nothing_is_lost() {
    let _stack = uses_stack().await;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const MAX_POLL_INTERVAL: Duration = Duration::from_secs(20);
    // Longer than a join takes on a loaded machine, so that a revoke that waited it out is told
    // from one that did not (the session outlasts it, as the service requires).
    const DRAIN_DEADLINE: Duration = Duration::from_secs(14);
    let names = Names::with_partitions(4).await;
    let down = Arc::new(AtomicBool::new(false));
    let proxy = {
        let down = down.clone();
        proxy::Proxy::start(&clickhouse_url(), move |_| {
            if down.load(Ordering::SeqCst) {
                proxy::Action::Answer {
                    status: 503,
                    headers: vec![],
                    body: "down for the test".into(),
                }
            } else {
                proxy::Action::Forward
            }
        })
        .await
    };
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    let mut args = with_flag(
        names.args(statsd.port(), dir.path()),
        "--clickhouse-url",
        &proxy.endpoint,
    );
    args = with_flag(args, "--session-timeout-ms", "16000");
    args = with_flag(
        args,
        "--drain-deadline-ms",
        &DRAIN_DEADLINE.as_millis().to_string(),
    );
    let max_poll = format!("max.poll.interval.ms={}", MAX_POLL_INTERVAL.as_millis());
    args.extend(
        [
            "--buffer-max-messages",
            "4",
            "--max-flushes-in-flight",
            "1",
            "--kafka-property",
            &max_poll,
        ]
        .map(String::from),
    );
    let member = |name: &str| {
        let args = with_flag(
            args.clone(),
            "--http-listen",
            &format!("127.0.0.1:{}", free_port()),
        );
        let log = dir.path().join(format!("{name}.log"));
        (Service::start_logging_to(&args, &log), log)
    };

    let (a, a_log) = member("a");
    let fixtures = small_fixtures(true);
    let (first, mut sent) = produce_fixtures(&names.topic, &fixtures, 8).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || {
        a.committed() == expected_commits(&first)
    })
    .await;

    // Steady load through the whole outage: two messages every 250 ms.
    down.store(true, Ordering::SeqCst);
    let producing = Arc::new(AtomicBool::new(true));
    let round = (8, 2, Duration::from_millis(250));
    let load = steady_load(
        &kafka(),
        &names.topic,
        fixtures.clone(),
        round,
        producing.clone(),
    );
    let outage = std::time::Instant::now();
    wait_for(
        "intake paused behind the failing flush",
        JOIN_AND_FLUSH,
        || {
            a.status().is_some_and(|s| {
                s["paused"] == true
                    && s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(3)
            })
        },
    )
    .await;
    // Paused for longer than the poll interval: a member that stopped polling would be out of the
    // group by now.
    tokio::time::sleep(
        (MAX_POLL_INTERVAL + Duration::from_secs(5)).saturating_sub(outage.elapsed()),
    )
    .await;
    assert_eq!(
        a.owned(),
        4,
        "the first member is still in the group, with every partition"
    );

    // The first member's revoke does not wait out its drain deadline for a flush that has been
    // failing for longer than that already (the old code waited it out: 14 s and the join). Its
    // log says which way the drain ended; the joiner's own start (its checks, the rebalance) is
    // not timed here: on a loaded machine it alone can take ten seconds.
    let (b, b_log) = member("b");
    let joined = std::time::Instant::now();
    wait_for(
        "the joiner owns partitions while ClickHouse is down",
        JOIN_AND_FLUSH,
        || b.owned() > 0,
    )
    .await;
    let took = joined.elapsed();
    let a_said = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        a_said.contains("has been failing for longer than the drain deadline")
            && a_said.contains("clickhouse failing for"),
        "the revoke says why it did not wait:\n{a_said}"
    );
    wait_for(
        "the first member gave some up",
        Duration::from_secs(10),
        || a.owned() < 4,
    )
    .await;
    assert!(
        down.load(Ordering::SeqCst) && a.status().unwrap()["outages"]["clickhouse"].is_object(),
        "still down"
    );

    // Once it has a flush under way (a member stopped before it took anything in has nothing
    // to drain, and exits 0 at once; its outage alone, opened by its startup check, says nothing
    // of that)...
    // ...its drain cannot finish (ClickHouse is down): a shutdown's drain waits at most its
    // deadline (an outage that ends within it leaves nothing to read again; a flush that has
    // failed for a whole deadline is given up at once), then leaves the group, and exits 1;
    // three seconds more for leaving the group and ending the process on a loaded machine.
    let exit = b
        .stopped_mid_flush(DRAIN_DEADLINE + Duration::from_secs(3))
        .await;
    let b_said = std::fs::read_to_string(&b_log).unwrap_or_default();
    assert_eq!(
        exit,
        Some(1),
        "a SIGTERM during the outage exits within the drain deadline:\n{b_said}"
    );
    wait_for(
        "the first member takes every partition back",
        Duration::from_secs(30),
        || a.owned() == 4,
    )
    .await;

    down.store(false, Ordering::SeqCst);
    producing.store(false, Ordering::SeqCst);
    sent.extend(load.await.unwrap());
    let last: std::collections::BTreeMap<i32, i64> =
        sent.iter().fold(Default::default(), |mut last, s| {
            let next = last.entry(s.partition).or_insert(0);
            *next = (*next).max(s.offset + 1);
            last
        });
    wait_for(
        "everything committed once ClickHouse answers",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 4) == last,
    )
    .await;
    assert_eq!(a.terminate(), Some(0));

    let log = std::fs::read_to_string(&a_log).unwrap();
    assert!(
        !log.contains("poll interval"),
        "librdkafka never took the member for stuck:\n{log}"
    );
    let rows = clickhouse_rows(&names.table).await;
    let segments: std::collections::BTreeSet<_> = rows
        .iter()
        .filter(|r| r.is_segment())
        .map(|r| (r.replay_id, r.segment_id))
        .collect();
    assert_eq!(segments.len(), sent.len(), "a row for every segment");
    every_blob_in_gcs(&names.bucket, &sent).await;
    eprintln!(
        "the joiner owned partitions {took:?} after it started; {} messages",
        sent.len()
    );
}
