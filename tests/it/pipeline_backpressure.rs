//! The pipeline in-process against the real broker, with sinks that are slow or failing: the
//! buffer bounds intake (partitions pause, then resume), and a flush that cannot complete stops
//! the service without committing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::*;
use replay_ingest::health::Status;
use replay_ingest::pipeline::{self, PipelineError, flush::Sinks};
use replay_ingest::sink::{Entry, Progress, Retry, Sink, SinkError, Writing, Written};

/// Takes `delay` per write, and counts writes, the messages they carried and the largest batch
/// (every batch passes through here, so no peak is missed).
struct SlowSink {
    delay: Duration,
    writes: Arc<AtomicUsize>,
    messages: Arc<AtomicUsize>,
    largest: Arc<AtomicUsize>,
}

impl Sink for SlowSink {
    fn name(&self) -> &'static str {
        "slow"
    }
    fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.writes.fetch_add(1, Ordering::SeqCst);
            self.messages.fetch_add(batch.len(), Ordering::SeqCst);
            self.largest.fetch_max(batch.len(), Ordering::SeqCst);
            Ok(Written::default())
        })
    }
}

/// Always fails with `retry`, counting attempts.
struct FailingSink {
    retry: Retry,
    attempts: Arc<AtomicUsize>,
}

impl Sink for FailingSink {
    fn name(&self) -> &'static str {
        "failing"
    }
    fn write<'a>(&'a self, _: &'a [Entry], _: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            Err(SinkError::new("failing", self.retry, "the sink is down"))
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_slow_sink_fills_the_next_buffer_then_pauses_intake_until_the_flush_completes() {
    let _stack = uses_stack().await;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 2).await;
    let (report, _) = produce_fixtures(&topic, &small_fixtures(true), 300).await;

    let (writes, messages, largest) = (
        Arc::default(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let sink = SlowSink {
        delay: Duration::from_millis(1500),
        writes: Arc::clone(&writes),
        messages: messages.clone(),
        largest: largest.clone(),
    };
    let args = consume_args(
        &topic,
        &group,
        &["--buffer-max-messages", "8", "--max-flushes-in-flight", "1"],
    );
    let status = Arc::new(Status::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn({
        let status = status.clone();
        async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            pipeline::consume(
                args.pipeline_settings().unwrap(),
                Sinks::new(vec![vec![Box::new(sink)]]),
                status,
                shutdown,
            )
            .await
        }
    });

    // While the first flush sleeps, the next buffer fills to its limit, then intake pauses.
    wait_for(
        "intake paused behind the slow flush",
        Duration::from_secs(60),
        || status.snapshot().paused,
    )
    .await;
    assert_eq!(status.snapshot().flushes_in_flight, 1);
    assert!(
        status.snapshot().buffer_messages >= 8,
        "the next buffer filled while the flush ran"
    );
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "paused before the first slow write finished"
    );

    let target = expected_commits(&report);
    wait_for(
        "everything flushed and committed",
        Duration::from_secs(120),
        || committed(&group, &topic, 2) == target,
    )
    .await;
    // A buffer (each batch is one) never grows past its limit plus the messages that were in the
    // processing window when it filled: far below the backlog an unbounded buffer would take.
    let bound = 8 + pipeline::window::PROCESSING_WINDOW_MESSAGES;
    let largest = largest.load(Ordering::SeqCst);
    assert!(
        largest <= bound,
        "a batch of {largest} messages, over the bound of {bound}"
    );
    assert!(status.snapshot().pauses >= 1);
    assert!(!status.snapshot().paused, "resumed once flushes caught up");
    assert_eq!(
        messages.load(Ordering::SeqCst),
        300,
        "every message written once"
    );

    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_sink_that_keeps_failing_stops_the_service_without_committing() {
    let _stack = uses_stack().await;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 1).await;
    produce_fixtures(&topic, &small_fixtures(true), 5).await;

    let attempts = Arc::new(AtomicUsize::new(0));
    let sink = FailingSink {
        retry: Retry::Retryable,
        attempts: attempts.clone(),
    };
    let args = consume_args(
        &topic,
        &group,
        &["--flush-max-attempts", "3", "--flush-max-backoff-ms", "50"],
    );
    let never = std::future::pending::<()>();
    let result = pipeline::consume(
        args.pipeline_settings().unwrap(),
        Sinks::new(vec![vec![Box::new(sink)]]),
        Arc::new(Status::default()),
        never,
    )
    .await;

    assert!(
        matches!(result, Err(PipelineError::Flush(ref e)) if e.sink == "failing"),
        "{result:?}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "retried up to the configured attempts"
    );
    assert!(
        committed(&group, &topic, 1).is_empty(),
        "nothing committed past a failed flush"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_fatal_sink_error_is_not_retried() {
    let _stack = uses_stack().await;
    let (topic, group) = (unique("rec"), unique("group"));
    create_topic(&topic, 1).await;
    produce_fixtures(&topic, &small_fixtures(true), 2).await;

    let attempts = Arc::new(AtomicUsize::new(0));
    let sink = FailingSink {
        retry: Retry::Fatal,
        attempts: attempts.clone(),
    };
    let args = consume_args(&topic, &group, &[]);
    let result = pipeline::consume(
        args.pipeline_settings().unwrap(),
        Sinks::new(vec![vec![Box::new(sink)]]),
        Arc::new(Status::default()),
        std::future::pending(),
    )
    .await;

    assert!(matches!(result, Err(PipelineError::Flush(_))), "{result:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert!(committed(&group, &topic, 1).is_empty());
}
