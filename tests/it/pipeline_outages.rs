//! Sink outages and hangs against the real broker, with the pipeline in-process and the service's
//! own sinks, built as it builds them (`service_sinks`): blobs to the GCS emulator, rows to
//! ClickHouse, each test on a topic, bucket and table of its own. Outages, hangs and refusals are
//! the servers' answers, or their silence, made by a proxy in front of them
//! (`tests/support/proxy.rs`): it answers 503 for an outage, holds requests for a hang (each
//! meets the sink's timeout and is retried, as against a hung server), and answers as the server
//! does data it refuses. An outage is ridden out without exiting; a buffer waiting behind a hung
//! flush is not flushed beside it, and the hung flush retries at its timeout's pace; a rebalance
//! while a flush hangs completes within the drain deadline, the member carries on, the other
//! member gets every message, and the hung flush never commits; messages a sink rejects go to the
//! real dead-letter topic with their original bytes, and the rest of the batch commits; a flush
//! failing for good stops the pipeline and the flushes still under way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::proxy::{Action, Gate, Opens, Proxy, Seen};
use crate::support::*;
use replay_ingest::config::ConsumeArgs;
use replay_ingest::health::Status;
use replay_ingest::kafka::refetch::Refetcher;
use replay_ingest::pipeline;
use replay_ingest::pipeline::window::PROCESSING_WINDOW_MESSAGES;

/// Flags for a hung blob store: a request is given up after [`SINK_TIMEOUT`], and the write
/// tried again after at most 200 ms (with the defaults, 30 s and 10 s, a test would wait them out
/// once the store answers again).
const HANGING: [&str; 4] = ["--sink-timeout-ms", "1000", "--flush-max-backoff-ms", "200"];
const SINK_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs the pipeline in this process, with the sinks the service builds from `args`, until
/// `stop` is sent; the task's result is the pipeline's.
async fn spawn(
    args: &ConsumeArgs,
    status: &Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    spawn_with(args, args.pipeline_settings().unwrap(), status).await
}

/// [`spawn`] with the pipeline's settings as given.
async fn spawn_with(
    args: &ConsumeArgs,
    settings: pipeline::Settings,
    status: &Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    let sinks = service_sinks(args, status).await;
    let status = status.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        pipeline::consume(settings, sinks, status, shutdown).await
    });
    (stop, task)
}

/// A consumed topic of `partitions` partitions, a group and a dead-letter topic, all new.
async fn topics(partitions: i32) -> (String, String, String) {
    let (topic, group, dlq) = (unique("rec"), unique("group"), unique("dlq"));
    create_topic(&topic, partitions).await;
    create_topic(&dlq, 1).await;
    (topic, group, dlq)
}

/// A proxy in front of the GCS emulator that holds, behind `gate`, the blob uploads `holds`
/// picks; everything else goes through.
async fn holding_uploads(
    gate: Gate,
    holds: impl Fn(&Seen) -> bool + Send + Sync + 'static,
) -> Proxy {
    Proxy::start(&gcs_endpoint(), move |seen| {
        if blob_upload(seen.path) && holds(seen) {
            Action::Hold(gate.clone())
        } else {
            Action::Forward
        }
    })
    .await
}

/// GCS's answer for an upload it refuses with `status` (`message` saying why).
fn gcs_error(status: u16, message: &str) -> Action {
    Action::Answer {
        status,
        headers: vec![("content-type", "application/json".into())],
        body: serde_json::json!({"error": {"code": status, "message": message}}).to_string(),
    }
}

/// The key of the blob `sent` (a valid message) is stored at.
fn blob_key(sent: &Sent) -> &str {
    match &sent.expected {
        Expected::Blob { key, .. } => key,
        Expected::Dlq(_) => unreachable!("valid fixtures only"),
    }
}

/// The uploads of `sent`'s blob a proxy saw, by the paths it kept (they name the object, whose
/// key holds the replay id).
fn uploads_of(proxy: &Proxy, sent: &Sent) -> usize {
    let replay = replay_of(&sent.value);
    let paths = proxy.paths.lock().unwrap();
    paths
        .iter()
        .filter(|path| blob_upload(path) && path.contains(&replay))
        .count()
}

/// GCS's outage as `/status` shows it (`null` when there is none).
fn gcs_outage(status: &Status) -> serde_json::Value {
    status.report()["outages"]["gcs"].clone()
}

/// Two partitions holding 30 small segments, a dead-letter topic, and the blob store behind a
/// proxy that holds every blob upload until `release` is dropped — a hung server: each upload
/// meets the sink's timeout and is tried again, and none is stored: what a member started on them
/// meets in the rebalance tests. The segments are produced before the member starts, so that its
/// first flush (closed by age) holds both partitions' messages whichever it is asked to give up:
/// polled as they are produced, a partition's messages can arrive in a batch of their own, after
/// that flush closed.
struct Backlog {
    names: Names,
    proxy: Proxy,
    release: Opens,
    status: Arc<Status>,
    report: load::Produced,
    sent: Vec<Sent>,
}

impl Backlog {
    async fn behind_a_hung_blob_store() -> Backlog {
        let names = Names::with_partitions(2).await;
        let gate = Gate::default();
        let release = gate.close();
        let proxy = holding_uploads(gate, |_| true).await;
        let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 30).await;
        Backlog {
            names,
            proxy,
            release,
            status: Arc::new(Status::default()),
            report,
            sent,
        }
    }

    /// Flags for the member in this process: blobs through the proxy, rows through `clickhouse`
    /// (none: no rows), the hung store's requests given up after a second.
    fn args(&self, clickhouse: Option<&str>) -> ConsumeArgs {
        self.names
            .pipeline_args(&self.proxy.endpoint, clickhouse, &HANGING)
    }
}

/// A second member of `names`' group, a service of its own whose blob store is `dir`.
fn second_member(names: &Names, dir: &std::path::Path) -> Service {
    Service::start(&service_args(
        &names.topic,
        &names.dlq,
        &names.group,
        dir,
        free_port(),
    ))
}

/// Whether `proxy` holds a blob upload: a flush hangs.
fn hung(proxy: &Proxy) -> bool {
    proxy.held.load(Ordering::SeqCst) >= 1
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_outage_is_retried_without_limit_then_everything_commits_and_the_service_never_exits() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    // The blob store answers every upload with a 503 while `down` is set.
    let down = Arc::new(AtomicBool::new(true));
    let proxy = {
        let down = down.clone();
        Proxy::start(&gcs_endpoint(), move |seen| {
            if blob_upload(seen.path) && down.load(Ordering::SeqCst) {
                gcs_error(503, "Service Unavailable")
            } else {
                Action::Forward
            }
        })
        .await
    };
    let status = Arc::new(Status::default());
    let args = names.pipeline_args(&proxy.endpoint, None, &["--flush-max-backoff-ms", "50"]);
    let (stop, task) = spawn(&args, &status).await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 20).await;

    // Far more attempts than the old limit of 10, and the service is still running.
    wait_for("40 failed attempts", Duration::from_secs(60), || {
        gcs_outage(&status)["failed_attempts"].as_u64() >= Some(40)
    })
    .await;
    assert!(!task.is_finished(), "an outage never stops the service");
    assert!(
        committed(&names.group, &names.topic, 1).is_empty(),
        "nothing committed during the outage"
    );
    assert!(status.live(), "retrying is not wedged");
    let outage = gcs_outage(&status);
    assert!(
        outage["last_error"]
            .as_str()
            .unwrap()
            .contains("Service Unavailable")
            && outage["failed_attempts"].as_u64().unwrap() >= 40
            && outage["since_ms"].as_u64().unwrap() > 0,
        "{outage}"
    );
    assert!(
        proxy.answered.load(Ordering::SeqCst) >= 40,
        "every failed attempt's uploads were refused by the store: {} refused",
        proxy.answered.load(Ordering::SeqCst)
    );

    down.store(false, Ordering::SeqCst);
    let target = expected_commits(&report);
    wait_for(
        "everything committed after the outage",
        Duration::from_secs(60),
        || committed(&names.group, &names.topic, 1) == target,
    )
    .await;
    let (blobs, _) = outcomes(&sent);
    assert_eq!(
        names.blobs(),
        blobs.keys().cloned().collect(),
        "every message's blob, and nothing else"
    );
    every_blob_in_gcs(&names.bucket, &sent).await;
    assert!(
        status.report()["outages"].as_object().unwrap().is_empty(),
        "the outage is over"
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A buffer waiting behind a hung flush waits for its slot: while the blob store hangs (every
/// upload held; each meets the sink's timeout and is tried again), the next buffer fills and
/// passes its age, and is not flushed beside the hung flush (`--max-flushes-in-flight 1`); the
/// hung flush tries again at the pace of its timeout, not in a loop. Once the store answers, both
/// batches are stored and committed. (Whether the pipeline's own loop idles meanwhile — it once
/// spun a core on the waiting buffer's passed age — shows only in CPU time, which tests do not
/// measure.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_buffer_behind_a_hung_flush_waits_for_its_slot_and_the_flush_retries_at_its_pace() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    let gate = Gate::default();
    let release = gate.close();
    let proxy = holding_uploads(gate, |_| true).await;
    let status = Arc::new(Status::default());
    let mut flags = HANGING.to_vec();
    flags.extend(["--max-flushes-in-flight", "1"]);
    let args = names.pipeline_args(&proxy.endpoint, None, &flags);
    let (stop, task) = spawn(&args, &status).await;
    // No upload can start before its message is produced.
    let producing = Instant::now();
    let (_, first) = produce_fixtures(&names.topic, &small_fixtures(true), 10).await;
    wait_for("a flush hung", Duration::from_secs(60), || hung(&proxy)).await;
    let (report, waiting) = produce_fixtures(&names.topic, &small_fixtures(true), 10).await;
    // The next buffer fills and passes its 200 ms age while the flush hangs, a few of its
    // uploads' timeouts long.
    wait_for("a waiting buffer", Duration::from_secs(30), || {
        status.snapshot().buffer_messages > 0
    })
    .await;
    tokio::time::sleep(3 * SINK_TIMEOUT).await;

    let tries: Vec<usize> = first.iter().map(|sent| uploads_of(&proxy, sent)).collect();
    let since = producing.elapsed();
    let snapshot = status.snapshot();
    assert!(
        snapshot.flushes_in_flight == 1 && snapshot.buffer_messages > 0,
        "the hung flush, and a buffer waiting for its slot: {snapshot:?}"
    );
    assert!(
        waiting.iter().all(|sent| uploads_of(&proxy, sent) == 0),
        "nothing produced while the flush hung is uploaded: the waiting buffer is not flushed beside it"
    );
    // Each try of a held upload lasts the sink's timeout (a retry starts once the last try's
    // timeout and its backoff passed): one try per timeout at most since the first could start,
    // once its message was produced.
    let most = tries.iter().max().copied().unwrap_or_default();
    let allowed = 1 + (since.as_millis() / SINK_TIMEOUT.as_millis()) as usize;
    assert!(
        (2..=allowed).contains(&most),
        "the hung uploads tried again after each timeout, and only then: {tries:?} in {since:?}"
    );
    let outage = gcs_outage(&status);
    assert!(
        outage["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("timed out"),
        "{outage}"
    );

    drop(release);
    names
        .all_committed(1, &report, "both batches committed once the store answers")
        .await;
    every_blob_in_gcs(&names.bucket, first.iter().chain(&waiting)).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_rebalance_while_a_flush_hangs_finishes_on_time_and_the_member_carries_on() {
    let _stack = uses_stack().await;
    let backlog = Backlog::behind_a_hung_blob_store().await;
    // Rows after the blobs, as the service's stages go: a stage after the hung one, as events
    // come after blobs and rows.
    let mut args = backlog.args(Some(&clickhouse_url()));
    // The held upload does not time out within the test: a revoke does not wait at all for a
    // flush that has been failing for a whole drain deadline (1.5 s) already, and this one is
    // about a drain waiting out its deadline.
    args.sink_timeout_ms = 120_000;
    let Backlog {
        names,
        proxy,
        release,
        status,
        report,
        sent,
    } = backlog;
    let (stop, task) = spawn(&args, &status).await;
    wait_for(
        "the first member's flush hung",
        Duration::from_secs(60),
        || hung(&proxy),
    )
    .await;

    // A second member joins: the first must give up a partition within the drain deadline
    // (1.5 s), without exiting, though its flush never returns; it keeps the other partition.
    let dir = tempfile::tempdir().unwrap();
    let other = second_member(&names, dir.path());
    wait_for(
        "the first member draining for the revoke",
        Duration::from_secs(60),
        || status.snapshot().draining,
    )
    .await;
    let draining = Instant::now();
    wait_for("the first member revoked", Duration::from_secs(60), || {
        status.snapshot().rebalances >= 1
    })
    .await;
    // The drain deadline, then the partition given up at once; waiting on the hung flush, it
    // would last until the store answers (120 s): the bound leaves a loaded machine (the chaos
    // run beside) all the slack it may need and still tells the two apart.
    assert!(
        draining.elapsed() < Duration::from_secs(30),
        "the revoke took {:?}",
        draining.elapsed()
    );
    assert!(
        !task.is_finished(),
        "a revoke that misses its drain deadline does not stop the member"
    );
    wait_for(
        "the second member wrote blobs",
        Duration::from_secs(60),
        || !files_under(dir.path()).is_empty(),
    )
    .await;
    assert!(
        names.blobs().is_empty(),
        "precondition: the store still holds every upload"
    );

    // What the member had started uploading while the store hung: its stale flush, and whatever
    // of the partition kept came after.
    let started: Vec<&Sent> = sent.iter().filter(|s| uploads_of(&proxy, s) > 0).collect();
    assert!(!started.is_empty());

    // The store comes back: the stale flush finishes; the offsets of the partition given away
    // are not committed (its new owner's), those of the partition kept are; the group commits
    // every message exactly to the end.
    drop(release);
    let target = expected_commits(&report);
    wait_for(
        "everything committed by the group",
        Duration::from_secs(120),
        || committed(&names.group, &names.topic, 2) == target,
    )
    .await;
    // What the first member committed, as the broker confirmed it: the partition it kept, and
    // not the one given away (the group's end offsets alone cannot tell: all was produced before).
    // It commits once its stale flush is durable.
    wait_for(
        "the first member committing the partition it kept",
        Duration::from_secs(30),
        || !status.snapshot().committed.is_empty(),
    )
    .await;
    let snapshot = status.snapshot();
    assert!(
        !snapshot.partitions.is_empty()
            && snapshot
                .committed
                .keys()
                .all(|p| snapshot.partitions.contains(p)),
        "committed {:?}, owns {:?}",
        snapshot.committed,
        snapshot.partitions
    );
    let (blobs, _) = outcomes(&sent);
    for (key, digest) in blobs_under(dir.path()) {
        assert_eq!(
            blobs.get(&key),
            Some(&digest),
            "{key}: only produced segments, byte for byte"
        );
    }
    // The stage under way when the drain gave up is not cut short: every upload it had started
    // completes once the store answers, those of the partition given away too (blobs are
    // idempotent; whether the stale flush held any of that partition's messages depends on how
    // the fetches fell), but they are not counted as flushed.
    let given_away: Vec<i32> = (0..2)
        .filter(|p| !snapshot.partitions.contains(p))
        .collect();
    let stored = names.blobs();
    let written: Vec<&Sent> = sent
        .iter()
        .filter(|s| stored.contains(blob_key(s)))
        .collect();
    assert_eq!(written.len(), stored.len(), "only produced segments");
    every_blob_in_gcs(&names.bucket, written.iter().copied()).await;
    for s in &started {
        assert!(
            stored.contains(blob_key(s)),
            "{} (partition {}, {given_away:?} given away): its upload was started, then left unfinished",
            blob_key(s),
            s.partition
        );
    }
    let kept = written
        .iter()
        .filter(|s| !given_away.contains(&s.partition))
        .count();
    let counted = status.snapshot().flushed as usize;
    assert!(
        counted <= kept,
        "the revoked partition's messages in that flush ({} written) are not counted as flushed ({counted}, {kept} of the partition kept written)",
        written.len() - kept
    );
    // The stage after it, as the events with their billing outcomes, wrote none of them: their
    // new owner does (it used to write them too). Rows carry the partition and offset of their
    // message.
    let rows = names.rows_at().await;
    assert!(!rows.is_empty(), "the partition kept went on");
    assert!(
        rows.iter().all(|(p, _)| !given_away.contains(p)),
        "rows written after the drain gave up on {given_away:?}: {rows:?}"
    );
    assert!(!task.is_finished(), "the first member carried on");
    assert_eq!(other.terminate(), Some(0));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A revoke's drain is bounded by its deadline, so the member is alive while it waits: with a
/// deadline past the liveness window (30 s), behind a hung flush, `/health/live` stays green
/// throughout (it used to go red 30 s into the drain, and the kubelet restarted the pod in the
/// middle of the rebalance).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_revoke_that_drains_past_the_liveness_window_stays_live() {
    let _stack = uses_stack().await;
    let backlog = Backlog::behind_a_hung_blob_store().await;
    let (stop, task) = hung_with_a_long_drain(&backlog).await;
    let (names, status) = (&backlog.names, &backlog.status);
    let dir = tempfile::tempdir().unwrap();
    let joined = Instant::now();
    let other = second_member(names, dir.path());
    live_until(status, joined, "the revoke's drain", || {
        status.snapshot().rebalances > 0
    })
    .await;
    assert!(
        names.blobs().is_empty(),
        "precondition: the store held every upload throughout"
    );
    assert!(!task.is_finished(), "the member carries on");
    drop(backlog.release);
    assert_eq!(other.terminate(), Some(0));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A shutdown's drain is bounded by its deadline too: with one past the liveness window, behind
/// a hung flush, `/health/live` stays green until the drain gives up (it went red 30 s into the
/// drain, and the kubelet could kill the terminating pod before the deadline its grace period
/// allows for).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_shutdown_that_drains_past_the_liveness_window_stays_live() {
    let _stack = uses_stack().await;
    let backlog = Backlog::behind_a_hung_blob_store().await;
    let (stop, task) = hung_with_a_long_drain(&backlog).await;
    let requested = Instant::now();
    stop.send(()).unwrap();
    live_until(&backlog.status, requested, "the shutdown's drain", || {
        task.is_finished()
    })
    .await;
    let ended = task.await.unwrap();
    assert!(
        matches!(ended, Err(pipeline::PipelineError::DrainDeadline { .. })),
        "the drain gave up at its deadline: {ended:?}"
    );
}

/// A member of `backlog`'s group whose drain deadline (36 s) is past the liveness window, once
/// its flush hung on the blob store. The held upload does not time out within the drain: a
/// flush that had failed for a whole drain deadline would be given up at once
/// (`clickhouse_faults`, `a_member_joining…`).
async fn hung_with_a_long_drain(
    backlog: &Backlog,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    let mut args = backlog.args(None);
    (args.session_timeout_ms, args.drain_deadline_ms) = (45_000, 36_000);
    args.sink_timeout_ms = 120_000;
    let spawned = spawn(&args, &backlog.status).await;
    wait_for("the member's flush hung", Duration::from_secs(60), || {
        hung(&backlog.proxy)
    })
    .await;
    spawned
}

/// `/health/live` is green every half second from `since` until `done`, which comes within two
/// minutes and after the liveness window: `what` outlasted it, live throughout.
async fn live_until(status: &Status, since: Instant, what: &str, done: impl Fn() -> bool) {
    while !done() {
        assert!(status.live(), "live {:?} into {what}", since.elapsed());
        assert!(since.elapsed() < Duration::from_secs(120), "{what} ends");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        since.elapsed() > replay_ingest::health::LIVENESS_STALE_AFTER,
        "{what} outlasted the liveness window ({:?})",
        since.elapsed()
    );
}

/// A shutdown requested while a revoke drains behind a hung flush does not wait behind it:
/// readiness goes off while the revoke still runs, and the member stops within one drain
/// deadline of the request. (It used to hear the request only once the revoke's drain had ended,
/// then drain for a whole deadline of its own: twice the deadline, readiness on all along.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_shutdown_during_a_revoke_is_heard_at_once_and_bounded_by_one_drain_deadline() {
    let _stack = uses_stack().await;
    // The flush fails (its uploads time out after a second) from a second after the hang; the
    // revoke's drain gives it up once it has failed for a whole deadline, so the deadline leaves
    // the second member's start and join (4–5 s) and the test's request time, while the revoke
    // still drains, on a loaded machine too.
    const DRAIN: Duration = Duration::from_secs(20);
    let backlog = Backlog::behind_a_hung_blob_store().await;
    let mut args = backlog.args(None);
    args.drain_deadline_ms = DRAIN.as_millis() as u64;
    args.session_timeout_ms = 25_000;
    let Backlog {
        names,
        proxy,
        release,
        status,
        ..
    } = backlog;
    let (stop, task) = spawn(&args, &status).await;
    wait_for("the member's flush hung", Duration::from_secs(60), || {
        hung(&proxy)
    })
    .await;

    // A second member joins: the first revokes a partition, and its drain waits on the hung
    // flush until the deadline.
    let dir = tempfile::tempdir().unwrap();
    let other = second_member(&names, dir.path());
    wait_for(
        "the revoke draining behind the hung flush",
        Duration::from_secs(60),
        || {
            let s = status.snapshot();
            s.draining && s.rebalances == 0
        },
    )
    .await;
    assert!(!gcs_outage(&status).is_null(), "its uploads timed out");
    stop.send(()).unwrap();
    wait_for("readiness off", DRAIN, || status.snapshot().stopping).await;
    assert_eq!(
        status.snapshot().rebalances,
        0,
        "the shutdown is heard while the revoke still drains"
    );
    // Twice the deadline, as before, would be 40 s: a margin of 10 s tells the two apart on a
    // loaded machine.
    let ended = tokio::time::timeout(DRAIN + Duration::from_secs(10), task)
        .await
        .expect("stopped within one drain deadline of the request (and a margin)")
        .unwrap();
    assert!(
        matches!(
            ended,
            Err(pipeline::PipelineError::DrainDeadline { .. }
                | pipeline::PipelineError::DrainGaveUp { .. })
        ),
        "the hung flush is left undone: {ended:?}"
    );
    assert!(
        names.blobs().is_empty(),
        "precondition: the store still holds every upload"
    );
    // The flush left undone writes no more (the stop abandoned its partitions): it ends at its
    // next attempt, and its outage with it — or, had the store answered first, by succeeding —
    // before this test's runtime does.
    drop(release);
    wait_for(
        "the flush left undone ends",
        Duration::from_secs(30),
        || gcs_outage(&status).is_null(),
    )
    .await;
    assert_eq!(other.terminate(), Some(0));
}

/// One batch's flush stuck while later batches flush: nothing after it can be committed, and
/// intake goes on only up to the bound on messages waiting to be committable, then pauses until
/// the stuck flush is durable; then everything commits to the end. The stuck flush is the one
/// holding offset 0: the store hangs on that message's blob alone (its upload held, and tried
/// again after each timeout; the batch's other blobs are stored), and answers every other upload.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn one_stuck_flush_bounds_what_waits_behind_it_to_be_committed() {
    let _stack = uses_stack().await;
    const BOUND: usize = 40;
    let names = Names::with_partitions(1).await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 1000).await;
    let stuck = sent.iter().find(|s| s.offset == 0).unwrap();
    let gate = Gate::default();
    let release = gate.close();
    let proxy = {
        let replay = replay_of(&stuck.value);
        holding_uploads(gate, move |seen| seen.path.contains(&replay)).await
    };
    let mut flags = HANGING.to_vec();
    flags.extend(["--buffer-max-messages", "4", "--max-flushes-in-flight", "2"]);
    let args = names.pipeline_args(&proxy.endpoint, None, &flags);
    let mut settings = args.pipeline_settings().unwrap();
    settings.max_uncommitted = BOUND;
    let status = Arc::new(Status::default());
    let (stop, task) = spawn_with(&args, settings, &status).await;
    // Later batches are written meanwhile (the stuck one holds offset 0 and a few after it; the
    // open buffer and the other flush slot hold at most four each, and a full buffer with both
    // slots busy pauses intake for a moment too), until the bound pauses intake for good.
    wait_for(
        "later flushes written, then intake paused behind the stuck flush",
        Duration::from_secs(60),
        || status.snapshot().paused && names.blobs().len() >= BOUND - 12,
    )
    .await;
    // Paused, it stays so: nothing more is taken in, and what was is the bound plus what the
    // processing window held when intake paused (64 small segments at most), far short of the
    // 1000 produced. (Ignoring the bound, the free flush slot would go on taking in four at a
    // time: a pause seen at one moment alone could be a full buffer's.)
    let taken_in = status.snapshot().consumed;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snapshot = status.snapshot();
    assert!(snapshot.paused, "still paused");
    assert_eq!(snapshot.consumed, taken_in, "nothing taken in while paused");
    assert!(
        snapshot.consumed <= (BOUND + PROCESSING_WINDOW_MESSAGES + 4) as u64,
        "intake stopped at the bound: {} taken in",
        snapshot.consumed
    );
    let stored = names.blobs();
    assert!(
        !stored.contains(blob_key(stuck)) && hung(&proxy),
        "the stuck flush's blob is held, not stored"
    );
    assert!(
        committed(&names.group, &names.topic, 1).is_empty(),
        "nothing committed past the stuck flush"
    );

    drop(release);
    names
        .all_committed(
            1,
            &report,
            "everything committed once the stuck flush is durable",
        )
        .await;
    every_blob_in_gcs(&names.bucket, [stuck]).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A flush that fails for good (GCS refusing the service's rights: 403) stops the pipeline, and a
/// flush still under way — one whose upload hangs — writes nothing more once the store answers:
/// its messages are read again after the restart. It went on retrying, a blocking task that
/// outlives the pipeline, and stored its blob once the store answered (and would have written
/// its rows and billing outcomes), none of it committed, while the consumer closed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_flush_failing_for_good_stops_the_flushes_still_under_way() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    let (_, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 8).await;
    let at = |offset| sent.iter().find(|s| s.offset == offset).unwrap();
    let (hanging, refused) = (at(0), at(4));
    let gate = Gate::default();
    let release = gate.close();
    let proxy = {
        let (hanging, refused) = (replay_of(&hanging.value), replay_of(&refused.value));
        Proxy::start(&gcs_endpoint(), move |seen| match seen.path {
            path if blob_upload(path) && path.contains(&hanging) => Action::Hold(gate.clone()),
            path if blob_upload(path) && path.contains(&refused) => gcs_error(
                403,
                "the caller does not have storage.objects.create access",
            ),
            _ => Action::Forward,
        })
        .await
    };
    // Two flushes of four: offsets 0–3 (0 hangs), then 4–7 (4 refused for good).
    let mut flags = HANGING.to_vec();
    flags.extend(["--buffer-max-messages", "4", "--max-flushes-in-flight", "2"]);
    let args = names.pipeline_args(&proxy.endpoint, None, &flags);
    let status = Arc::new(Status::default());
    let (_stop, task) = spawn(&args, &status).await;
    let stopped = tokio::time::timeout(JOIN_AND_FLUSH, task)
        .await
        .expect("the pipeline stops")
        .unwrap();
    let error = stopped.expect_err("a flush failed for good").to_string();
    assert!(
        error.contains("flush failed") && error.contains("403"),
        "{error}"
    );
    assert!(hung(&proxy), "the first flush's upload was held");
    // The request in flight when the pipeline stopped (or one begun as it stopped) meets its
    // timeout. A flush still retrying would then try again every timeout plus backoff (1.2 s at
    // most): three timeouts later, the proxy would have seen more uploads of its blob.
    tokio::time::sleep(SINK_TIMEOUT * 2).await;
    let tried = uploads_of(&proxy, hanging);
    tokio::time::sleep(SINK_TIMEOUT * 3).await;
    assert_eq!(
        uploads_of(&proxy, hanging),
        tried,
        "no attempt after the pipeline stopped"
    );
    // Then the store answers: nothing held is written either.
    drop(release);
    tokio::time::sleep(SINK_TIMEOUT * 2).await;
    let stored = names.blobs();
    assert!(
        !stored.contains(blob_key(hanging)),
        "the flush under way stored nothing more: {stored:?}"
    );
    assert_eq!(uploads_of(&proxy, hanging), tried);
    assert!(
        committed(&names.group, &names.topic, 1).is_empty(),
        "nothing committed"
    );
}

/// ClickHouse refuses the rows of two messages (a proxy answers their INSERTs as ClickHouse
/// answers rows it cannot parse): those two are dead-lettered with their original bytes, saying
/// which sink refused them and why, and the rest is written and committed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn messages_a_sink_rejects_are_dead_lettered_whole_and_the_rest_commits() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(2).await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 30).await;
    let bad: Vec<(i32, i64)> = [&sent[4], &sent[17]]
        .iter()
        .map(|s| (s.partition, s.offset))
        .collect();
    let refused = [&sent[4], &sent[17]].map(|s| replay_of(&s.value)).to_vec();
    let proxy = clickhouse_refusing(refused, Arc::new(AtomicBool::new(true))).await;
    let args = names.pipeline_args(&gcs_endpoint(), Some(&proxy.endpoint), &[]);
    let status = Arc::new(Status::default());
    let (stop, task) = spawn(&args, &status).await;

    let target = expected_commits(&report);
    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&names.group, &names.topic, 2) == target
    })
    .await;
    let others: std::collections::BTreeSet<(i32, i64)> = sent
        .iter()
        .map(|s| (s.partition, s.offset))
        .filter(|at| !bad.contains(at))
        .collect();
    assert_eq!(
        names.rows_at().await,
        others,
        "every other message's rows written, none of the refused ones"
    );
    assert_eq!(status.report()["invalid_by_reason"]["rejected_by_sink"], 2);

    let dead = read_messages(&names.dlq, 2, Duration::from_secs(30));
    assert_eq!(dead.len(), 2, "each rejected message dead-lettered once");
    for Received { value, headers, .. } in &dead {
        let at = (
            headers["original_partition"].parse().unwrap(),
            headers["original_offset"].parse().unwrap(),
        );
        assert!(bad.contains(&at), "{at:?}");
        let original = sent.iter().find(|s| (s.partition, s.offset) == at).unwrap();
        assert_eq!(value, &original.value, "the original bytes");
        assert_eq!(
            (headers["reason"].as_str(), headers["sink"].as_str()),
            ("rejected_by_sink", "clickhouse")
        );
        assert!(
            headers["detail"].starts_with("clickhouse: ") && headers["detail"].contains("Code: 27"),
            "{}",
            headers["detail"]
        );
    }
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A message a sink rejects that is gone from the topic by the time it is read again (its flush
/// held past what retention keeps; here its records are deleted): dead-lettered without its
/// bytes, the dead letter saying so, and the partition commits to the end. (The read was retried
/// without end before, holding every commit of the partition back.) The blob store hangs (every
/// upload held) until the records are deleted, then refuses the message's blob, as GCS answers an
/// object it will not take.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_rejected_message_gone_from_the_topic_is_dead_lettered_without_its_bytes() {
    let _stack = uses_stack().await;
    let names = Names::with_partitions(1).await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 30).await;
    let rejected = sent.iter().find(|s| s.offset == 4).unwrap();
    let gate = Gate::default();
    let release = gate.close();
    let proxy = {
        let replay = replay_of(&rejected.value);
        Proxy::start(&gcs_endpoint(), move |seen| {
            if !blob_upload(seen.path) {
                Action::Forward
            } else if !gate.is_open() {
                Action::Hold(gate.clone())
            } else if seen.path.contains(&replay) {
                gcs_error(400, "Invalid object")
            } else {
                Action::Forward
            }
        })
        .await
    };
    let args = names.pipeline_args(&proxy.endpoint, None, &HANGING);
    let status = Arc::new(Status::default());
    let (stop, task) = spawn(&args, &status).await;
    wait_for(
        "every message polled, and a flush waiting on the store",
        Duration::from_secs(60),
        || status.snapshot().consumed >= 30 && hung(&proxy),
    )
    .await;
    delete_records_before(&names.topic, 0, 10).await;
    drop(release);

    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&names.group, &names.topic, 1) == expected_commits(&report)
    })
    .await;
    let others: std::collections::BTreeSet<String> = sent
        .iter()
        .filter(|s| s.offset != 4)
        .map(|s| blob_key(s).to_owned())
        .collect();
    assert_eq!(names.blobs(), others, "the others written");
    let dead = read_messages(&names.dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    let Received { value, headers, .. } = &dead[0];
    assert_eq!(
        (
            headers["original_offset"].as_str(),
            headers["reason"].as_str(),
            headers["sink"].as_str()
        ),
        ("4", "rejected_by_sink", "gcs")
    );
    assert!(value.is_empty(), "no bytes to keep");
    assert_eq!(
        headers["original_lost"], "true",
        "told apart from an empty message"
    );
    assert!(
        headers["detail"].starts_with("gcs: ")
            && headers["detail"].contains("Invalid object")
            && headers["detail"].contains("original bytes lost"),
        "{}",
        headers["detail"]
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// An offset the log skips (here a transaction's commit marker, which no consumer is given; in
/// production, compaction or a log cut back by a new leader) is known gone as soon as the next
/// message arrives, not after the read's timeout, retried without end by the flush.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn reading_again_an_offset_the_log_skips_finds_it_gone() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use replay_ingest::kafka::refetch::RefetchError;
    let _stack = uses_stack().await;
    let (topic, group, _) = topics(1).await;
    let producer: BaseProducer = kafka()
        .set("transactional.id", unique("tx"))
        .create()
        .unwrap();
    let timeout = Duration::from_secs(20);
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    for value in ["a", "b"] {
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .unwrap();
    }
    // Offsets 0 and 1, and the commit marker at 2. The coordinator writes the marker after it
    // answers the commit, so a record sent at once could take offset 2 before it: wait for it.
    producer.commit_transaction(timeout).unwrap();
    wait_for("the commit marker at offset 2", timeout, || {
        high_watermarks(&topic, 1).get(&0) == Some(&3)
    })
    .await;
    let plain: BaseProducer = kafka().create().unwrap();
    plain
        .send(BaseRecord::<(), _>::to(&topic).partition(0).payload("c"))
        .unwrap();
    plain.flush(timeout).unwrap();

    let source = Refetcher::new(kafka(), &topic, &group).unwrap();
    assert_eq!(&source.fetch(0, 1, timeout).unwrap().value[..], b"b");
    match source.fetch(0, 2, timeout) {
        Err(RefetchError::Gone { next: 3, .. }) => {}
        other => panic!("offset 2 holds no message: {other:?}"),
    }
    assert_eq!(&source.fetch(0, 3, timeout).unwrap().value[..], b"c");
    // Back to an earlier offset after a later one was read (and more prefetched): not taken for
    // gone, whatever the earlier reads left in the consumer.
    assert_eq!(&source.fetch(0, 0, timeout).unwrap().value[..], b"a");
    // At or past the end — a log cut back below an offset this service read — gone at once.
    match source.fetch(0, 6, timeout) {
        Err(RefetchError::Gone { next: 4, .. }) => {}
        other => panic!("offset 6 is past the end: {other:?}"),
    }
}

/// A rejected message whose offset holds another message when it is read again — here its topic
/// deleted and created again under the same name; in production also a log an unclean leader
/// election cut back and wrote again — is dead-lettered without bytes, saying which message was
/// found, not with that message's bytes in its name (`redrive` would have sent that one a second
/// time, and the rejected one would be missing without a word).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_rejected_message_replaced_at_its_offset_is_not_dead_lettered_as_the_one_found() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use replay_ingest::sink::dlq::{DlqSink, RejectedToDlq};
    use replay_ingest::sink::{DeadLetters, Entry, Outcome, Progress, Rejected, Retry, SinkError};
    let _stack = uses_stack().await;
    let (topic, group, dlq) = topics(1).await;
    let fixtures = small_fixtures(true);
    let (rejected, other) = (&fixtures[0], &fixtures[1]);
    let produce = |value: &[u8]| {
        let producer: BaseProducer = kafka().create().unwrap();
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    };
    produce(rejected);
    let timeout = Duration::from_secs(20);
    let source = Refetcher::new(kafka(), &topic, &group).unwrap();
    assert_eq!(source.fetch(0, 0, timeout).unwrap().value, rejected[..]);
    let entry = Entry {
        partition: 0,
        offset: 0,
        outcome: Outcome::Valid(Box::new(
            replay_ingest::recording::process(rejected, &Default::default()).unwrap(),
        )),
    };
    let refusal = Rejected {
        partition: 0,
        offset: 0,
        error: SinkError::new("gcs", Retry::Rejected, "Invalid object"),
        original: replay_ingest::sink::Original::of(&entry),
    };

    // The topic deleted (once the deletion is done, its name is free) and made again, another
    // message at offset 0.
    delete_topic(&topic).await;
    create_topic_again(&topic, 1).await;
    produce(other);

    let letters = RejectedToDlq {
        dlq: DlqSink::new(kafka().create().unwrap(), &dlq, 1_000_000, None),
        source,
        source_topic: topic.clone(),
        timeout,
    };
    let status = Status::default();
    let progress = Progress::new("dlq", &status);
    // As the flush would: a read the client fails while it learns of the new topic is retried.
    let start = Instant::now();
    while let Err(e) = letters
        .dead_letter(std::slice::from_ref(&refusal), &progress)
        .await
    {
        assert!(start.elapsed() < Duration::from_secs(60), "{e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        progress.new_attempt();
    }
    let dead = read_messages(&dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    let Received { value, headers, .. } = &dead[0];
    assert!(value.is_empty(), "not the bytes of the message found");
    assert_eq!(headers["original_lost"], "true");
    let detail = &headers["detail"];
    assert!(
        detail.starts_with("gcs: Invalid object (original bytes lost: another message is at its offset now: project ")
            && detail.contains("where the rejected message was project "),
        "{detail}"
    );
}

/// Reading a rejected message again is not failed by the client's trouble with some other
/// broker — here a bootstrap address that refuses connections, reported during the reads and
/// between them (a broker of the cluster restarting, in production). Each read lets go of its
/// partition when it ends, and reads again at earlier and later offsets.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_read_again_is_not_failed_by_trouble_with_another_broker() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let _stack = uses_stack().await;
    let (topic, group, _) = topics(1).await;
    let plain: BaseProducer = kafka().create().unwrap();
    for value in ["a", "b", "c"] {
        plain
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .unwrap();
    }
    plain.flush(Duration::from_secs(10)).unwrap();
    // A first address that refuses connections: the client reports it as an error, between
    // the reads too.
    let mut config = kafka();
    config.set("bootstrap.servers", format!("127.0.0.1:1,{}", brokers()));
    let source = Refetcher::new(config, &topic, &group).unwrap();
    let timeout = Duration::from_secs(10);
    assert_eq!(&source.fetch(0, 0, timeout).unwrap().value[..], b"a");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(&source.fetch(0, 2, timeout).unwrap().value[..], b"c");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(&source.fetch(0, 1, timeout).unwrap().value[..], b"b");
}
