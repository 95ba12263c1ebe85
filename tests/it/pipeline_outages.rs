//! Sink outages and hangs against the real broker, with the pipeline in-process and sinks that
//! fail, hang or reject on command: an outage is ridden out without exiting; a waiting buffer
//! behind a hung flush costs no CPU; a rebalance while a flush hangs completes within the drain
//! deadline, the member carries on, the other member gets every message, and the hung flush never
//! commits; messages a sink rejects go to the real dead-letter topic with their original bytes,
//! and the rest of the batch commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::*;
use replay_ingest::config::ConsumeArgs;
use replay_ingest::health::Status;
use replay_ingest::kafka::refetch::Refetcher;
use replay_ingest::pipeline::{self, flush::Sinks};
use replay_ingest::sink::dlq::{DlqSink, RejectedToDlq};
use replay_ingest::sink::{Entry, Outcome, Progress, Retry, Sink, SinkError, Writing, Written};

/// Fails (retryably) while `down` is set, hangs while `hung` is set (only the writes holding
/// `hangs_on`, a partition and offset, when it is given); counts what it wrote, and keeps the
/// partition and offset of each message written.
#[derive(Clone, Default)]
struct Switchable {
    down: Arc<AtomicBool>,
    hung: Arc<AtomicBool>,
    hangs_on: Option<(i32, i64)>,
    attempts: Arc<AtomicUsize>,
    messages: Arc<AtomicUsize>,
    written: Arc<std::sync::Mutex<Vec<(i32, i64)>>>,
}

impl Sink for Switchable {
    fn name(&self) -> &'static str {
        "switchable"
    }
    fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let holds = |(partition, offset)| {
                batch
                    .iter()
                    .any(|e| (e.partition, e.offset) == (partition, offset))
            };
            while self.hung.load(Ordering::SeqCst) && self.hangs_on.is_none_or(holds) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(SinkError::new(
                    "switchable",
                    Retry::Retryable,
                    "connection refused",
                ));
            }
            self.messages.fetch_add(batch.len(), Ordering::SeqCst);
            let mut written = self.written.lock().unwrap();
            written.extend(batch.iter().map(|e| (e.partition, e.offset)));
            Ok(Written::default())
        })
    }
}

impl Switchable {
    /// Hangs every write until the guard is dropped — also when the test fails half way, so
    /// that the runtime, which waits for its blocking threads when it shuts down, can.
    fn hang(&self) -> Release {
        self.hung.store(true, Ordering::SeqCst);
        Release(self.hung.clone())
    }
}

/// Lets a hung sink's writes return when dropped.
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Runs the pipeline in this process until `stop` is sent; the task's result is the pipeline's.
fn spawn(
    args: ConsumeArgs,
    sink: impl Sink + 'static,
    status: Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    spawn_with(args.pipeline_settings().unwrap(), sink, status)
}

/// [`spawn`] with the pipeline's settings as given.
fn spawn_with(
    settings: pipeline::Settings,
    sink: impl Sink + 'static,
    status: Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    spawn_sinks(settings, Sinks::new(vec![vec![Box::new(sink)]]), status)
}

/// [`spawn_with`] with every sink given.
fn spawn_sinks(
    settings: pipeline::Settings,
    sinks: Sinks,
    status: Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
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

/// Two partitions holding 30 small segments, a dead-letter topic, and a sink that hangs every
/// write until `release` is dropped: what a member started on them meets in the rebalance tests.
/// The segments are produced before the member starts, so that its first flush (closed by age)
/// holds both partitions' messages whichever it is asked to give up: polled as they are produced,
/// a partition's messages can arrive in a batch of their own, after that flush closed.
struct Backlog {
    topic: String,
    group: String,
    dlq: String,
    hung: Switchable,
    release: Release,
    status: Arc<Status>,
    report: load::Produced,
    sent: Vec<Sent>,
}

impl Backlog {
    async fn behind_a_hung_sink() -> Backlog {
        let (topic, group, dlq) = topics(2).await;
        let hung = Switchable::default();
        let release = hung.hang();
        let (report, sent) = produce_fixtures(&topic, &small_fixtures(true), 30).await;
        Backlog {
            topic,
            group,
            dlq,
            hung,
            release,
            status: Arc::new(Status::default()),
            report,
            sent,
        }
    }
}

/// CPU time (user + system) this process has used, in clock ticks (1/100 s).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_outage_is_retried_without_limit_then_everything_commits_and_the_service_never_exits() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 1).await;
    let sink = Switchable::default();
    sink.down.store(true, Ordering::SeqCst);
    let status = Arc::new(Status::default());
    let args = consume_args(&topic, &group, &["--flush-max-backoff-ms", "50"]);
    let (stop, task) = spawn(args, sink.clone(), status.clone());
    let (report, _) = produce_fixtures(&topic, &small_fixtures(true), 20).await;

    // Far more attempts than the old limit of 10, and the service is still running.
    wait_for("40 failed attempts", Duration::from_secs(60), || {
        sink.attempts.load(Ordering::SeqCst) >= 40
    })
    .await;
    assert!(!task.is_finished(), "an outage never stops the service");
    assert!(
        committed(&group, &topic, 1).is_empty(),
        "nothing committed during the outage"
    );
    assert!(status.live(), "retrying is not wedged");
    let outage = &status.report()["outages"]["switchable"];
    assert_eq!(outage["last_error"], "connection refused", "{outage}");
    assert!(
        outage["failed_attempts"].as_u64().unwrap() >= 40
            && outage["since_ms"].as_u64().unwrap() > 0
    );

    sink.down.store(false, Ordering::SeqCst);
    let target = expected_commits(&report);
    wait_for(
        "everything committed after the outage",
        Duration::from_secs(60),
        || committed(&group, &topic, 1) == target,
    )
    .await;
    assert_eq!(sink.messages.load(Ordering::SeqCst), 20);
    assert!(
        status.report()["outages"].as_object().unwrap().is_empty(),
        "the outage is over"
    );
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_buffer_waiting_behind_a_hung_flush_costs_no_cpu() {
    let _stack = uses_stack().await;
    let _cpu = measures_cpu().await;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 1).await;
    let sink = Switchable::default();
    let hung = sink.hang();
    let status = Arc::new(Status::default());
    let args = consume_args(&topic, &group, &["--max-flushes-in-flight", "1"]);
    let (stop, task) = spawn(args, sink.clone(), status.clone());
    produce_fixtures(&topic, &small_fixtures(true), 10).await;
    wait_for("a flush hung", Duration::from_secs(60), || {
        sink.attempts.load(Ordering::SeqCst) == 1
    })
    .await;
    produce_fixtures(&topic, &small_fixtures(true), 10).await;
    // The next buffer fills and passes its 200 ms age while the flush hangs.
    wait_for("a waiting buffer", Duration::from_secs(30), || {
        status.snapshot().buffer_messages > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The tests share this process, so a test running beside this one adds its CPU to what is
    // measured: the least of three windows is the pipeline's (a loop that spins does so in every
    // window).
    let mut used = f64::MAX;
    for _ in 0..3 {
        let (start, ticks) = (Instant::now(), cpu_ticks());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let window = (cpu_ticks() - ticks) as f64 / 100.0 / start.elapsed().as_secs_f64();
        used = used.min(window);
    }
    assert!(used < 0.05, "{:.1} % of a core while waiting", used * 100.0);

    drop(hung);
    wait_for("both batches written", Duration::from_secs(30), || {
        sink.messages.load(Ordering::SeqCst) == 20
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_rebalance_while_a_flush_hangs_finishes_on_time_and_the_member_carries_on() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    let Backlog {
        topic,
        group,
        dlq,
        hung,
        release,
        status,
        report,
        sent,
    } = Backlog::behind_a_hung_sink().await;
    // A second stage after the hung one, as events come after blobs and rows.
    let after = Switchable::default();
    let (stop, task) = spawn_sinks(
        consume_args(&topic, &group, &[])
            .pipeline_settings()
            .unwrap(),
        Sinks::new(vec![
            vec![Box::new(hung.clone())],
            vec![Box::new(after.clone())],
        ]),
        status.clone(),
    );
    wait_for(
        "the first member's flush hung",
        Duration::from_secs(60),
        || hung.attempts.load(Ordering::SeqCst) >= 1,
    )
    .await;

    // A second member joins: the first must give up a partition within the drain deadline
    // (1.5 s), without exiting, though its flush never returns; it keeps the other partition.
    let dir = tempfile::tempdir().unwrap();
    let other = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    wait_for("the first member revoked", Duration::from_secs(60), || {
        status.snapshot().rebalances >= 1
    })
    .await;
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
    assert_eq!(
        hung.messages.load(Ordering::SeqCst),
        0,
        "the first member's flush is still hung"
    );

    // The sink comes back: the stale flush finishes; the offsets of the partition given away are
    // not committed (its new owner's), those of the partition kept are; the group commits every
    // message exactly to the end.
    drop(release);
    let target = expected_commits(&report);
    wait_for(
        "everything committed by the group",
        Duration::from_secs(120),
        || committed(&group, &topic, 2) == target,
    )
    .await;
    wait_for("the stale flush finished", Duration::from_secs(30), || {
        hung.messages.load(Ordering::SeqCst) > 0
    })
    .await;
    // What the first member committed, as the broker confirmed it: the partition it kept, and
    // not the one given away (the group's end offsets alone cannot tell: all was produced before).
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
    let counted = status.snapshot().flushed as usize;
    assert!(
        counted < hung.messages.load(Ordering::SeqCst),
        "the revoked partition's messages in that flush ({} written) are not counted as flushed ({counted})",
        hung.messages.load(Ordering::SeqCst)
    );
    // The stage under way when the drain gave up wrote the revoked partition's messages (blobs
    // and rows are idempotent); the stage after it, as the events with their billing outcomes,
    // wrote none of them: their new owner does (it used to write them too).
    let given_away: Vec<i32> = (0..2)
        .filter(|p| !snapshot.partitions.contains(p))
        .collect();
    let written = after.written.lock().unwrap().clone();
    assert!(!written.is_empty(), "the partition kept went on");
    assert!(
        written.iter().all(|(p, _)| !given_away.contains(p)),
        "written after the drain gave up on {given_away:?}: {written:?}"
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
    let _cpu = shares_cpu().await;
    let Backlog {
        topic,
        group,
        dlq,
        hung,
        release,
        status,
        ..
    } = Backlog::behind_a_hung_sink().await;
    let mut args = consume_args(&topic, &group, &[]);
    (args.session_timeout_ms, args.drain_deadline_ms) = (45_000, 36_000);
    let (stop, task) = spawn(args, hung.clone(), status.clone());
    wait_for(
        "the first member's flush hung",
        Duration::from_secs(60),
        || hung.attempts.load(Ordering::SeqCst) >= 1,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let joined = Instant::now();
    let other = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    while status.snapshot().rebalances == 0 {
        assert!(
            status.live(),
            "live {:?} after the second member started",
            joined.elapsed()
        );
        assert!(
            joined.elapsed() < Duration::from_secs(120),
            "the revoke ends"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        joined.elapsed() > replay_ingest::health::LIVENESS_STALE_AFTER,
        "the drain outlasted the liveness window ({:?})",
        joined.elapsed()
    );
    assert!(!task.is_finished(), "the member carries on");
    drop(release);
    assert_eq!(other.terminate(), Some(0));
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A shutdown requested while a revoke drains behind a hung flush does not wait behind it:
/// readiness goes off while the revoke still runs, and the member stops within one drain
/// deadline of the request. (It used to hear the request only once the revoke's drain had ended,
/// then drain for a whole deadline of its own: twice the deadline, readiness on all along.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_shutdown_during_a_revoke_is_heard_at_once_and_bounded_by_one_drain_deadline() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    const DRAIN: Duration = Duration::from_secs(4);
    let backlog = Backlog::behind_a_hung_sink().await;
    let (topic, group, dlq) = (&backlog.topic, &backlog.group, &backlog.dlq);
    let (hung, status) = (&backlog.hung, &backlog.status);
    let mut args = consume_args(topic, group, &[]);
    args.drain_deadline_ms = DRAIN.as_millis() as u64;
    args.session_timeout_ms = 10_000;
    let (stop, task) = spawn(args, hung.clone(), status.clone());
    wait_for("the member's flush hung", Duration::from_secs(60), || {
        hung.attempts.load(Ordering::SeqCst) >= 1
    })
    .await;

    // A second member joins: the first revokes a partition, and its drain waits on the hung
    // flush until the deadline.
    let dir = tempfile::tempdir().unwrap();
    let other = Service::start(&service_args(topic, dlq, group, dir.path(), free_port()));
    wait_for(
        "the revoke draining behind the hung flush",
        Duration::from_secs(60),
        || {
            let s = status.snapshot();
            s.draining && s.rebalances == 0
        },
    )
    .await;
    let requested = Instant::now();
    stop.send(()).unwrap();
    wait_for("readiness off", DRAIN, || status.snapshot().stopping).await;
    assert_eq!(
        status.snapshot().rebalances,
        0,
        "the shutdown is heard while the revoke still drains"
    );
    let ended = tokio::time::timeout(DRAIN + Duration::from_secs(2), task)
        .await
        .expect("stopped within one drain deadline of the request (and a margin)")
        .unwrap();
    assert!(
        matches!(ended, Err(pipeline::PipelineError::DrainDeadline { .. })),
        "the hung flush is left undone: {ended:?}"
    );
    assert!(requested.elapsed() < DRAIN + Duration::from_secs(2));
    drop(backlog.release);
    assert_eq!(other.terminate(), Some(0));
}

/// One batch's flush stuck while later batches flush: nothing after it can be committed, and
/// intake goes on only up to the bound on messages waiting to be committable, then pauses until
/// the stuck flush is durable; then everything commits to the end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn one_stuck_flush_bounds_what_waits_behind_it_to_be_committed() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    const BOUND: usize = 40;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 1).await;
    let sink = Switchable {
        hangs_on: Some((0, 0)),
        ..Switchable::default()
    };
    let release = sink.hang();
    let (report, _) = produce_fixtures(&topic, &small_fixtures(true), 1000).await;
    let args = consume_args(
        &topic,
        &group,
        &["--buffer-max-messages", "4", "--max-flushes-in-flight", "2"],
    );
    let mut settings = args.pipeline_settings().unwrap();
    settings.max_uncommitted = BOUND;
    let status = Arc::new(Status::default());
    let (stop, task) = spawn_with(settings, sink.clone(), status.clone());
    // Later batches are written meanwhile (the stuck one holds offset 0 and a few after it; the
    // open buffer and the other flush slot hold at most four each, and a full buffer with both
    // slots busy pauses intake for a moment too), until the bound pauses intake for good.
    wait_for(
        "later flushes written, then intake paused behind the stuck flush",
        Duration::from_secs(60),
        || status.snapshot().paused && sink.messages.load(Ordering::SeqCst) >= BOUND - 12,
    )
    .await;
    // Paused, it stays so: what is written stays near the bound (plus what the processing
    // window held when intake paused, 64 small segments at most), far short of the 1000
    // produced.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snapshot = status.snapshot();
    assert!(snapshot.paused, "still paused");
    assert!(
        sink.messages.load(Ordering::SeqCst) < 200,
        "intake stopped near the bound: {} written",
        sink.messages.load(Ordering::SeqCst)
    );
    assert!(
        committed(&group, &topic, 1).is_empty(),
        "nothing committed past the stuck flush"
    );

    drop(release);
    wait_for(
        "everything committed once the stuck flush is durable",
        Duration::from_secs(60),
        || committed(&group, &topic, 1) == expected_commits(&report),
    )
    .await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// Rejects any write holding one of `bad` (partition, offset); counts the messages it accepted.
struct Picky {
    bad: Vec<(i32, i64)>,
    accepted: Arc<AtomicUsize>,
    /// Every write waits while this is set.
    held: Arc<AtomicBool>,
}

impl Sink for Picky {
    fn name(&self) -> &'static str {
        "picky"
    }
    fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            while self.held.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if batch
                .iter()
                .any(|e| self.bad.contains(&(e.partition, e.offset)))
            {
                return Err(SinkError::new(
                    "picky",
                    Retry::Rejected,
                    "Code: 27. Cannot parse input: row 3",
                ));
            }
            self.accepted.fetch_add(
                batch
                    .iter()
                    .filter(|e| matches!(e.outcome, Outcome::Valid(_)))
                    .count(),
                Ordering::SeqCst,
            );
            Ok(Written::default())
        })
    }
}

/// Runs the pipeline on `topic` with `picky`, and the dead-letter sink on `dlq` beside it, which
/// also takes what `picky` rejects (read again from `topic`), as the service's sinks are arranged.
fn spawn_rejecting(
    topic: &str,
    group: &str,
    dlq: &str,
    picky: Picky,
    status: &Arc<Status>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
) {
    let dlq_sink = DlqSink::new(producer_on(&kafka()), dlq, 1_000_000, None);
    let source = Refetcher::new(kafka(), topic, &format!("{group}-refetch")).unwrap();
    let rejections = RejectedToDlq {
        dlq: dlq_sink.clone(),
        source,
        source_topic: topic.to_owned(),
        timeout: Duration::from_secs(10),
    };
    let sinks = Sinks::dead_lettering(
        vec![vec![Box::new(picky), Box::new(dlq_sink)]],
        Box::new(rejections),
    );
    let settings = consume_args(topic, group, &[]).pipeline_settings().unwrap();
    spawn_sinks(settings, sinks, status.clone())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn messages_a_sink_rejects_are_dead_lettered_whole_and_the_rest_commits() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    let (topic, group, dlq) = topics(2).await;
    let (report, sent) = produce_fixtures(&topic, &small_fixtures(true), 30).await;
    let bad: Vec<(i32, i64)> = [&sent[4], &sent[17]]
        .iter()
        .map(|s| (s.partition, s.offset))
        .collect();

    let accepted = Arc::new(AtomicUsize::new(0));
    let picky = Picky {
        bad: bad.clone(),
        accepted: accepted.clone(),
        held: Default::default(),
    };
    let status = Arc::new(Status::default());
    let (stop, task) = spawn_rejecting(&topic, &group, &dlq, picky, &status);

    let target = expected_commits(&report);
    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&group, &topic, 2) == target
    })
    .await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        28,
        "every other message written"
    );
    assert_eq!(status.report()["invalid_by_reason"]["rejected_by_sink"], 2);

    let dead = read_messages(&dlq, 2, Duration::from_secs(30));
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
            ("rejected_by_sink", "picky")
        );
        assert!(
            headers["detail"].starts_with("picky: Code: 27"),
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
/// without end before, holding every commit of the partition back.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_rejected_message_gone_from_the_topic_is_dead_lettered_without_its_bytes() {
    let _stack = uses_stack().await;
    let _cpu = shares_cpu().await;
    let (topic, group, dlq) = topics(1).await;
    let (report, _) = produce_fixtures(&topic, &small_fixtures(true), 30).await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicBool::new(true));
    let picky = Picky {
        bad: vec![(0, 4)],
        accepted: accepted.clone(),
        held: held.clone(),
    };
    let status = Arc::new(Status::default());
    let (stop, task) = spawn_rejecting(&topic, &group, &dlq, picky, &status);
    wait_for("every message polled", Duration::from_secs(60), || {
        status.snapshot().consumed >= 30
    })
    .await;
    delete_records_before(&topic, 0, 10).await;
    held.store(false, Ordering::SeqCst);

    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&group, &topic, 1) == expected_commits(&report)
    })
    .await;
    assert_eq!(accepted.load(Ordering::SeqCst), 29, "the others written");
    let dead = read_messages(&dlq, 1, Duration::from_secs(30));
    assert_eq!(dead.len(), 1);
    let Received { value, headers, .. } = &dead[0];
    assert_eq!(
        (
            headers["original_offset"].as_str(),
            headers["reason"].as_str()
        ),
        ("4", "rejected_by_sink")
    );
    assert!(value.is_empty(), "no bytes to keep");
    assert_eq!(
        headers["original_lost"], "true",
        "told apart from an empty message"
    );
    assert!(
        headers["detail"].starts_with("picky: Code: 27")
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
