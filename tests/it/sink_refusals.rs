//! A sink refusing messages, through the service on the real stack (GCS refusing some replays'
//! uploads through a proxy answering 400): a few refused in a batch that holds nothing else — a
//! quiet topic's flush — are dead-lettered, written by no later stage, and the service goes on; a
//! whole batch of many refused is the sink's configuration, and the service stops with nothing
//! committed. ClickHouse refusing some messages' rows (through a proxy answering as ClickHouse
//! does a row it cannot parse): no event of theirs is published before they are dead-lettered, so
//! a re-drive publishes them once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use replay_ingest::recording::{self, Limits};

use crate::support::load::Produced;
use crate::support::*;

/// Produces `count` messages on a fresh topic and starts the service with every real sink, GCS
/// refusing the first `refused` of them; the names, what was sent, the proxy and the metrics
/// listener (held for the run) and the service, its logs in `dir`.
async fn refusing_run(
    count: u64,
    refused: usize,
    dir: &std::path::Path,
) -> (Names, Produced, Vec<Sent>, (proxy::Proxy, Statsd), Service) {
    let names = Names::create().await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), count).await;
    let replays = sent[..refused]
        .iter()
        .map(|s| replay_of(&s.value))
        .collect();
    let proxy = gcs_refusing(replays, Arc::new(AtomicBool::new(true))).await;
    let statsd = Statsd::bind();
    let destination = ("--gcs-endpoint", proxy.endpoint.as_str());
    let service = one_batch_service(&names, &statsd, count, dir, destination);
    (names, report, sent, (proxy, statsd), service)
}

/// The service with every real sink, `destination` (a flag and its value) pointing one of them
/// elsewhere, flushing the first `count` messages as one batch however slowly they arrive; its
/// logs in `dir`, its metrics to `statsd` (kept for the run, so no other test is given its port).
fn one_batch_service(
    names: &Names,
    statsd: &Statsd,
    count: u64,
    dir: &std::path::Path,
    destination: (&str, &str),
) -> Service {
    let mut args = with_flag(names.args(statsd.port(), dir), destination.0, destination.1);
    args = with_flag(args, "--buffer-max-age-ms", "30000");
    args.extend(["--buffer-max-messages".to_owned(), count.to_string()]);
    Service::start_logging_to(&args, &dir.join("service.log"))
}

/// Before, two or more messages refused with nothing accepted stopped the service, and its
/// restart met them again: a quiet topic stopped for good on two hostile messages.
/// The replays `table` holds rows of.
async fn replays_with_rows(table: &str) -> BTreeSet<String> {
    (clickhouse_rows(table).await.iter())
        .map(|r| r.replay_id.simple().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_few_refused_messages_alone_in_their_batch_are_dead_lettered_and_the_service_goes_on() {
    let _stack = uses_stack().await;
    let dir = tempfile::tempdir().unwrap();
    let (names, report, sent, _held, service) = refusing_run(3, 3, dir.path()).await;
    wait_for("the refused messages committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&report)
    })
    .await;
    let letters = read_messages(&names.dlq, 3, Duration::from_secs(20));
    assert_eq!(letters.len(), 3);
    for letter in &letters {
        assert_eq!(letter.headers["reason"], "rejected_by_sink");
        assert_eq!(letter.headers["sink"], "gcs");
        assert!(sent.iter().any(|s| s.value == letter.value), "the original");
    }
    // Each of the three once (the same one three times passed the checks above).
    let at = |partition: &str, offset: &str| (partition.parse().unwrap(), offset.parse().unwrap());
    let letters: BTreeSet<(i32, i64)> = letters
        .iter()
        .map(|l| {
            at(
                &l.headers["original_partition"],
                &l.headers["original_offset"],
            )
        })
        .collect();
    let produced: BTreeSet<(i32, i64)> = sent.iter().map(|s| (s.partition, s.offset)).collect();
    assert_eq!(letters, produced);
    // Still consuming: a message GCS takes is written and committed (one with rows).
    let with_rows = small_fixtures(true)
        .into_iter()
        .filter(|f| {
            recording::process(f, &Limits::default())
                .unwrap()
                .has_rows()
        })
        .take(1)
        .collect::<Vec<_>>();
    let (more, more_sent) = produce_fixtures(&names.topic, &with_rows, 1).await;
    let mut target = expected_commits(&report);
    target.extend(expected_commits(&more));
    wait_for("a later message committed", JOIN_AND_FLUSH, || {
        service.committed() == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    // Nothing of theirs in the later stages: no row points at a blob that was not stored.
    let refused: Vec<&Sent> = sent.iter().collect();
    assert!(
        refused.iter().any(|s| {
            recording::process(&s.value, &Limits::default())
                .unwrap()
                .has_rows()
        }),
        "some refused message has rows to leave out"
    );
    // The later message's rows are written, and no row of a refused one.
    let stored = replays_with_rows(&names.table).await;
    let later: BTreeSet<String> = more_sent.iter().map(|s| replay_of(&s.value)).collect();
    assert_eq!(stored, later, "rows of the later message only");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_sink_refusing_a_whole_batch_of_many_stops_the_service_with_nothing_committed() {
    let _stack = uses_stack().await;
    let dir = tempfile::tempdir().unwrap();
    let (names, _, _, _held, service) = refusing_run(30, 30, dir.path()).await;
    let code = service.exit_within(JOIN_AND_FLUSH).await;
    assert!(
        code.is_some_and(|c| c != 0),
        "stopped, and said so: {code:?}"
    );
    let log = std::fs::read_to_string(dir.path().join("service.log")).unwrap();
    assert!(
        log.contains("and accepted none, so the sink is taken for misconfigured"),
        "{log}"
    );
    assert!(committed(&names.group, &names.topic, 2).is_empty());
    assert_eq!(
        high_watermarks(&names.dlq, 1),
        BTreeMap::new(),
        "nothing dead-lettered"
    );
}

/// Rows are written before events: a message ClickHouse refuses has had its blob written (the same
/// key again on a re-drive) and nothing published. With rows and events in one stage, its billing
/// outcome went out before the dead letter, and again with the re-drive.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn messages_clickhouse_refuses_have_no_event_published_before_their_dead_letter() {
    let _stack = uses_stack().await;
    let dir = tempfile::tempdir().unwrap();
    let count = 12;
    let names = Names::create().await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), count).await;
    // Each message with whether it has rows and its billing outcomes.
    let made: Vec<(&Sent, bool, Vec<String>)> = (sent.iter())
        .map(|s| {
            let processed = recording::process(&s.value, &Limits::default()).unwrap();
            (s, processed.has_rows(), events_of(&s.value, "outcome"))
        })
        .collect();
    // Two messages with rows and a billing outcome are refused; the rest are written.
    let (refused, accepted): (Vec<_>, Vec<_>) = {
        let mut refused = 0;
        made.iter().partition(|(_, has_rows, outcomes)| {
            let refuse = refused < 2 && *has_rows && !outcomes.is_empty();
            refused += usize::from(refuse);
            refuse
        })
    };
    assert_eq!(
        refused.len(),
        2,
        "the mix has messages with rows and an outcome"
    );
    let mut expected: Vec<String> = (accepted.iter())
        .flat_map(|(_, _, outcomes)| outcomes.clone())
        .collect();
    assert!(!expected.is_empty(), "some accepted message has an outcome");
    let ids: Vec<String> = refused.iter().map(|(s, ..)| replay_of(&s.value)).collect();
    let proxy = clickhouse_refusing(ids.clone(), Arc::new(AtomicBool::new(true))).await;
    let destination = ("--clickhouse-url", proxy.endpoint.as_str());
    let statsd = Statsd::bind();
    let service = one_batch_service(&names, &statsd, count, dir.path(), destination);
    wait_for("the batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));

    let letters = read_all(&names.dlq, 1);
    assert_eq!(letters.len(), 2, "each refused message dead-lettered once");
    for letter in &letters {
        assert_eq!(letter.headers["sink"], "clickhouse");
        assert!(
            refused.iter().any(|(s, ..)| s.value == letter.value),
            "the original"
        );
    }
    // The accepted messages' rows, all of them (a refused one's never reach the server: the
    // proxy answers them itself).
    let stored = replays_with_rows(&names.table).await;
    let with_rows: BTreeSet<String> = (accepted.iter())
        .filter(|(_, has_rows, _)| *has_rows)
        .map(|(s, ..)| replay_of(&s.value))
        .collect();
    assert!(!with_rows.is_empty(), "some accepted message has rows");
    assert_eq!(stored, with_rows, "rows of the accepted messages only");
    // Exactly the accepted messages' outcomes: none of the refused ones went out.
    let published = all_values(&names.outcomes, 1);
    expected.sort();
    assert_eq!(published, expected);
}
