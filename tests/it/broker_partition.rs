//! A member cut off from the broker (a network partition), on an Apache Kafka broker of the
//! test's own that this member reaches only through a relay the test cuts, while the other
//! member reaches it directly.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::proxy::{Action, Proxy};
use crate::support::relay::Relay;
use crate::support::secure_broker::SecureBroker;
use crate::support::*;
use rdkafka::ClientConfig;

/// The cut member's session; its drain deadline is a second shorter (it must be shorter).
const SESSION: Duration = Duration::from_secs(30);
/// From the cut to the shutdown request. The member finds its partitions lost a session after
/// its last heartbeat answered (one heartbeat, 3 s, at most before the cut): within the drain,
/// 9-13 s after the request and 16 s at least before the drain's deadline.
const CUT_TO_SHUTDOWN: Duration = Duration::from_secs(18);

/// A shutdown drain waiting on a blob store that answers 503, while the member is cut off from
/// the broker for longer than its session: the group gives its partitions to the other member,
/// which reads them from the last commit and stores everything. The draining member finds its
/// partitions lost in the middle of the drain. What it buffered of them and had not begun to
/// flush is given up — written once, by the new owner, not a second time by the drain (billing
/// outcomes are not idempotent) — the flush already under way ends once the store answers, and
/// none of the lost partitions' offsets is committed: the member exits 0 within its deadline,
/// where it used to flush its whole buffer, try to commit offsets no longer its own, and exit 1.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack and Apache Kafka's jars: scripts/test.sh starts them and runs every test"]
async fn partitions_lost_during_the_shutdown_drain_are_given_up_not_flushed() {
    let _stack = uses_stack().await;
    let relay = Relay::start(free_port()).await;
    let broker = SecureBroker::start_behind(&relay);
    let direct = ClientConfig::new()
        .set("bootstrap.servers", broker.address("PLAINTEXT"))
        .clone();
    let (topic, dlq, group, bucket) = (
        unique("rec"),
        unique("dlq"),
        unique("group"),
        unique("bucket"),
    );
    create_topic_on(&direct, &topic, 4).await;
    create_topic_on(&direct, &dlq, 1).await;
    create_bucket(&bucket);
    let held = Arc::new(AtomicBool::new(false));
    let store = {
        let held = held.clone();
        Proxy::start(&gcs_endpoint(), move |_| {
            match held.load(Ordering::SeqCst) {
                true => Action::Answer {
                    status: 503,
                    headers: vec![("content-type", "application/json".into())],
                    body: r#"{"error":{"code":503,"message":"held by the test"}}"#.into(),
                },
                false => Action::Forward,
            }
        })
        .await
    };
    let (dirs, logs) = (
        [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()],
        tempfile::tempdir().unwrap(),
    );

    // The member to cut: through the relay, blobs to its own bucket through the holding proxy,
    // three messages a flush, one flush at a time, nothing flushed on age.
    let mut args = with_flag(
        service_args(&topic, &dlq, &group, dirs[0].path(), free_port()),
        "--blob-sink",
        "gcs",
    );
    args.extend(
        [
            "--gcs-bucket",
            &bucket,
            "--gcs-endpoint",
            &store.endpoint,
            "--gcs-anonymous",
            "--buffer-max-messages",
            "3",
            "--flush-max-backoff-ms",
            "500",
        ]
        .map(String::from),
    );
    let args = with_flag(args, "--brokers", &relay.address());
    let args = with_flag(
        args,
        "--session-timeout-ms",
        &SESSION.as_millis().to_string(),
    );
    let args = with_flag(
        args,
        "--drain-deadline-ms",
        &(SESSION - Duration::from_secs(1)).as_millis().to_string(),
    );
    let cut_log = logs.path().join("cut.log");
    let cut =
        Service::start_logging_to(&with_flag(args, "--buffer-max-age-ms", "120000"), &cut_log);
    // The other member: directly, a session long enough not to be missed on a loaded machine
    // (a rejoin could take partitions from the member to cut, which would then drain a revoke).
    let args = with_flag(
        service_args(&topic, &dlq, &group, dirs[1].path(), free_port()),
        "--brokers",
        &broker.address("PLAINTEXT"),
    );
    let args = with_flag(args, "--session-timeout-ms", "10000");
    let other = Service::start_logging_to(
        &with_flag(args, "--drain-deadline-ms", "4000"),
        &logs.path().join("other.log"),
    );
    wait_for("both members owning partitions", JOIN_AND_FLUSH, || {
        let (a, b) = (cut.owned(), other.owned());
        a > 0 && b > 0 && a + b == 4
    })
    .await;

    // The store stops answering; the member fills a flush that cannot end (the first three
    // messages it takes in) and a buffer behind it.
    held.store(true, Ordering::SeqCst);
    let copies = (0..48)
        .map(|i| (load::fixture_copy(&small_fixtures(true), i), test_key(i)))
        .collect();
    let (report, sent) = produce_values_with(&producer_on(&direct), &topic, copies).await;
    let status = |s: &Service, field: &str| s.status().map_or(0, |s| s[field].as_u64().unwrap());
    wait_for(
        "a flush waiting on the store and a full buffer behind it",
        JOIN_AND_FLUSH,
        || status(&cut, "flushes_in_flight") == 1 && status(&cut, "buffer_messages") >= 3,
    )
    .await;

    let log = || std::fs::read_to_string(&cut_log).unwrap_or_default();
    relay.cut();
    tokio::time::sleep(CUT_TO_SHUTDOWN).await;
    cut.signal_term();
    wait_for("the drain finding its partitions lost", SESSION, || {
        log().contains("partitions lost")
    })
    .await;
    let at = |line: &str| log().find(line);
    assert!(
        matches!(
            (at("shutdown requested: draining"), at("partitions lost")),
            (Some(draining), Some(lost)) if draining < lost
        ),
        "the loss came during the drain:\n{}",
        log()
    );
    // The network and the store come back: the flush under way ends, and the drain with it.
    relay.restore();
    held.store(false, Ordering::SeqCst);
    assert_eq!(
        cut.exit_within(SESSION).await,
        Some(0),
        "the drain ended within its deadline:\n{}",
        log()
    );
    wait_for(
        "the other member owning every partition and committing to the end",
        JOIN_AND_FLUSH,
        || {
            other.owned() == 4
                && committed_on(&direct, &group, &topic, 4) == expected_commits(&report)
        },
    )
    .await;
    let (blobs, _) = outcomes(&sent);
    assert_eq!(
        blobs_under(dirs[1].path()),
        blobs,
        "the other member stored every segment"
    );

    // (Besides the object the startup check writes under `replay-ingest/`.)
    let written: BTreeSet<String> = object_names(&bucket)
        .into_iter()
        .filter(|name| !name.starts_with("replay-ingest/"))
        .collect();
    let expected: BTreeSet<String> = blobs.into_keys().collect();
    assert_eq!(
        written.len(),
        3,
        "the cut member wrote the flush under way and nothing of the buffer behind it: {written:?}\n{}",
        log()
    );
    assert!(written.is_subset(&expected), "{written:?}");
    assert_eq!(
        committed_on(&direct, &group, &topic, 4),
        expected_commits(&report),
        "the cut member committed nothing over the new owner's offsets"
    );
    assert_eq!(other.terminate(), Some(0));
}
