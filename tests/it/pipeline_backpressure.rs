//! The pipeline in-process against the real broker, with the service's own sinks, built as it
//! builds them (`service_sinks`: blobs to the GCS emulator, rows to ClickHouse, each test on a
//! topic, bucket and table of its own), made slow or failing by a proxy in front of them
//! (`tests/support/proxy.rs`): the buffer bounds intake (partitions pause, then resume) behind a
//! slow write, and a flush that cannot complete stops the service without committing — after
//! the configured attempts for an outage, at once for a fatal error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::proxy::{Action, Proxy, Seen};
use crate::support::*;
use replay_ingest::health::Status;
use replay_ingest::pipeline::{self, PipelineError};
use replay_ingest::sink::Retry;

/// Whether a request to ClickHouse (as a proxy sees it) is an INSERT of rows.
fn inserting(seen: &Seen) -> bool {
    seen.path.contains("INSERT") && seen.path.contains("decompress=1")
}

/// The replay id of each message of `sent` as RowBinary writes it in the rows (a UUID: two
/// little-endian halves), with the message's index.
fn replay_ids(sent: &[Sent]) -> BTreeMap<[u8; 16], usize> {
    sent.iter()
        .enumerate()
        .map(|(i, s)| {
            let replay = uuid::Uuid::parse_str(&replay_of(&s.value)).unwrap();
            let (high, low) = replay.as_u64_pair();
            let mut bytes = [0; 16];
            bytes[..8].copy_from_slice(&high.to_le_bytes());
            bytes[8..].copy_from_slice(&low.to_le_bytes());
            (bytes, i)
        })
        .collect()
}

/// ClickHouse slow to answer (a proxy holds each INSERT's answer back 1.5 s) with one flush at
/// a time: the next buffer fills, intake pauses until the flush completes, then resumes; no batch
/// outgrows the buffer's bound, and every message is written once. The buffer's 5 messages are
/// not a multiple of the 8 processed together, so a buffer fills part-way through a group.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_slow_sink_fills_the_next_buffer_then_pauses_intake_until_the_flush_completes() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(2).await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 200).await;

    // ClickHouse answers every INSERT 1.5 s late (the rows are inserted at once), and the proxy
    // notes which messages each one holds (a flush inserts its batch's rows in one INSERT):
    // every batch passes through it, so no peak is missed.
    let ids = replay_ids(&sent);
    let inserts: Arc<Mutex<Vec<Vec<usize>>>> = Arc::default();
    let proxy = {
        let inserts = inserts.clone();
        Proxy::start(&clickhouse_url(), move |seen| {
            if !inserting(seen) {
                return Action::Forward;
            }
            let rows = clickhouse_decompress(seen.body);
            let held: BTreeSet<usize> = rows
                .windows(16)
                .filter_map(|w| ids.get(<&[u8; 16]>::try_from(w).unwrap()).copied())
                .collect();
            inserts.lock().unwrap().push(held.into_iter().collect());
            Action::Delay(Duration::from_millis(1500))
        })
        .await
    };
    let args = names.pipeline_args(
        &gcs_endpoint(),
        Some(&proxy.endpoint),
        &["--buffer-max-messages", "5", "--max-flushes-in-flight", "1"],
    );
    let status = Arc::new(Status::default());
    let sinks = service_sinks(&args, &status).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn({
        let status = status.clone();
        async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            pipeline::consume(args.pipeline_settings().unwrap(), sinks, status, shutdown).await
        }
    });

    // While the first flush waits for ClickHouse, the next buffer fills to its limit, then
    // intake pauses.
    wait_for(
        "intake paused behind the slow flush",
        Duration::from_secs(60),
        || status.snapshot().paused,
    )
    .await;
    let snapshot = status.snapshot();
    assert_eq!(snapshot.flushes_in_flight, 1);
    assert!(
        snapshot.buffer_messages >= 5,
        "the next buffer filled while the flush ran"
    );
    assert!(
        !snapshot.sinks.contains_key("clickhouse") && snapshot.flushed == 0,
        "paused before the first slow write finished: {:?}",
        snapshot.sinks
    );

    let target = expected_commits(&report);
    wait_for(
        "everything flushed and committed",
        Duration::from_secs(120),
        || committed(&names.group, &names.topic, 2) == target,
    )
    .await;
    // A buffer (each batch is one) never grows past its limit: results wait while the buffer
    // cannot flush, the rest of the group that filled it among them (they went into it, a whole
    // window of them, up to 5 + 64 messages a batch; then the rest of the group, up to 5 + 7).
    let bound = 5;
    let inserts = inserts.lock().unwrap().clone();
    let largest = inserts.iter().map(Vec::len).max().unwrap_or_default();
    assert!(
        largest <= bound,
        "a batch of {largest} messages, over the bound of {bound}"
    );
    assert!(status.snapshot().pauses >= 1);
    assert!(!status.snapshot().paused, "resumed once flushes caught up");
    let mut times = vec![0; sent.len()];
    for held in &inserts {
        for &i in held {
            times[i] += 1;
        }
    }
    assert!(
        times.iter().all(|&n| n == 1),
        "every message written once: {times:?}"
    );
    let every: BTreeSet<(i32, i64)> = sent.iter().map(|s| (s.partition, s.offset)).collect();
    assert_eq!(names.rows_at().await, every, "every message's rows stored");

    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
}

/// ClickHouse down (a proxy answers every INSERT with a 503) with `--flush-max-attempts 3`: the
/// flush tries three times, then the pipeline stops, nothing committed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_sink_that_keeps_failing_stops_the_service_without_committing() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    produce_fixtures(&names.topic, &small_fixtures(true), 5).await;

    let proxy = Proxy::start(&clickhouse_url(), |seen| match inserting(seen) {
        true => Action::Answer {
            status: 503,
            headers: vec![],
            body: "the sink is down".into(),
        },
        false => Action::Forward,
    })
    .await;
    let args = names.pipeline_args(
        &gcs_endpoint(),
        Some(&proxy.endpoint),
        &["--flush-max-attempts", "3", "--flush-max-backoff-ms", "50"],
    );
    let status = Arc::new(Status::default());
    let sinks = service_sinks(&args, &status).await;
    let never = std::future::pending::<()>();
    let result = pipeline::consume(args.pipeline_settings().unwrap(), sinks, status, never).await;

    assert!(
        matches!(result, Err(PipelineError::Flush(ref e)) if e.sink == "clickhouse"),
        "{result:?}"
    );
    assert_eq!(
        proxy.answered.load(Ordering::SeqCst),
        3,
        "retried up to the configured attempts (an INSERT each)"
    );
    assert!(
        committed(&names.group, &names.topic, 1).is_empty(),
        "nothing committed past a failed flush"
    );
}

/// The blob store refuses the credentials (a proxy answers every upload as GCS answers a caller
/// without `storage.objects.create`): fatal, so no upload is tried again, and the pipeline stops
/// with nothing committed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_fatal_sink_error_is_not_retried() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    let (_, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 2).await;

    let proxy = Proxy::start(&gcs_endpoint(), |seen| match blob_upload(seen.path) {
        true => Action::Answer {
            status: 403,
            headers: vec![("content-type", "application/json".into())],
            body: r#"{"error":{"code":403,"message":"anonymous caller does not have storage.objects.create access"}}"#.into(),
        },
        false => Action::Forward,
    })
    .await;
    let args = names.pipeline_args(&proxy.endpoint, None, &[]);
    let status = Arc::new(Status::default());
    let sinks = service_sinks(&args, &status).await;
    let result = pipeline::consume(
        args.pipeline_settings().unwrap(),
        sinks,
        status,
        std::future::pending(),
    )
    .await;

    assert!(
        matches!(result, Err(PipelineError::Flush(ref e)) if e.sink == "gcs" && e.retry == Retry::Fatal),
        "{result:?}"
    );
    // One attempt: each blob of the flush asked for once.
    let uploads: Vec<usize> = sent
        .iter()
        .map(|s| {
            let replay = replay_of(&s.value);
            let paths = proxy.paths.lock().unwrap();
            paths
                .iter()
                .filter(|p| blob_upload(p) && p.contains(&replay))
                .count()
        })
        .collect();
    assert!(
        uploads.iter().sum::<usize>() >= 1 && uploads.iter().all(|&n| n <= 1),
        "{uploads:?}"
    );
    assert!(committed(&names.group, &names.topic, 1).is_empty());
}
