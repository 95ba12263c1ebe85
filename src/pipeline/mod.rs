//! The pipeline, in data-flow order:
//!
//! ```text
//! consume ──▶ process ──▶ buffer ──▶ flush ──▶ commit
//! (polling    (rayon pool, (bounded:   (blocking pool,   (per partition, up to the
//!  thread,     in parallel; messages,   sinks stage by    contiguous durable frontier)
//!  bounded     arrival order bytes,     stage, retried)
//!  channel)    restored)    age)
//! ```
//!
//! One task owns all state (buffer, frontier, in-flight work) and reacts to whatever happens
//! next — a rebalance, shutdown, a finished flush, a processed message, a polled one, the
//! buffer's age deadline — so there are no locks and every transition is in this file. While a
//! flush runs the next buffer fills; when the buffer is full and no flush slot is free the task
//! takes no more polled messages until a flush completes, and the polling thread, finding no
//! room to hand messages over, pauses the assigned partitions while it goes on polling
//! (`kafka::consumer`). Rebalances arrive on their own channel, read whatever the backpressure. Shutdown and partition revocation share one drain,
//! bounded by `--drain-deadline-ms`: process what was polled, flush everything, commit
//! synchronously. Rebalancing is cooperative: a revoke names only the partitions that move, and
//! the member goes on consuming the others. A revoke whose drain misses the deadline gives up
//! what is not durable in the revoked partitions (their next owner reads it again) and the
//! member carries on; so does one whose every flush left has been failing (retrying through an
//! outage) for a whole deadline already ([`Failing`]), without waiting for the deadline.
//! Per-partition revoke generations keep anything polled or flushed before the revoke from
//! being committed for those partitions (docs/reliability.md). A drain hears the
//! revokes that arrive meanwhile (the shutdown's: the polling thread polls on) and answers them
//! when it ends; lost partitions are given up at once, before anything more is flushed, as they
//! are outside a drain, and flushes under way write no more of them.

pub mod buffer;
pub mod flush;
pub mod frontier;
pub mod revocations;
pub mod window;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::health::Status;
use crate::kafka::consumer::{
    IngestConsumer, IngestContext, Polled, Revoke, Stop, close_within, commit_within, leave_group,
    sends_statistics, spawn_poller,
};
use crate::kafka::handoff::{Handoff, Ticket};
use crate::kafka::ownership::Ownership;
use crate::kafka::position::{Position, position_list};
use crate::kafka::record::Record;
use crate::kafka::topic_id::{self, Recreated};
use crate::metrics;
use crate::recording::{self, Limits, Reason};
use crate::sink::{Entries, Entry, InvalidMessage, Outcome, SinkError};
use buffer::{Buffer, BufferLimits, CloseReason, should_pause};
use flush::{Failing, FlushReport, RetryPolicy, Sinks};
use frontier::Frontier;
use revocations::Revocations;
use window::{Held, Progress, Window};

/// Messages in transit between the polling thread and the pipeline. Each may be up to 15 MB:
/// the bounds keep the hand-over small next to librdkafka's own (bounded) prefetch. While the
/// buffer is full the pipeline takes none, so it grows by at most the messages already being
/// processed.
const POLLED_IN_TRANSIT: usize = 64;

/// Bytes of message values in transit (a larger message passes alone).
pub const POLLED_IN_TRANSIT_BYTES: usize = 32 * 1024 * 1024;

/// Most consecutive messages processed as one task on the pool (one wake-up each way instead of
/// one per message)...
const PROCESS_GROUP_MESSAGES: usize = 8;

/// ...and a group takes no further message once its values reach this many bytes, so a large
/// segment is a task of its own and the threads share the work.
const PROCESS_GROUP_BYTES: usize = 256 * 1024;

/// Why the pipeline stopped other than by a clean shutdown. Nothing past the failure was
/// committed: a restart redelivers it.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("flush failed, nothing of it committed: {0}")]
    Flush(SinkError),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// What was left says what the next start reads again: everything after the last commit.
    #[error(
        "drain did not finish within {deadline:?}: {held_back} messages not committable yet (not durable, or behind one that is not){}; the next start reads again from the last commit",
        if *.uncommitted { ", and offsets of durable ones not committed (the broker did not answer)" } else { "" }
    )]
    DrainDeadline {
        deadline: Duration,
        held_back: usize,
        uncommitted: bool,
    },
    /// A shutdown's drain stopped waiting for flushes that had each been failing for longer than
    /// the drain deadline: nothing waiting would gain.
    #[error(
        "drain gave up: every flush left had been failing for longer than the drain deadline ({failing}); {held_back} messages not committable yet; the next start reads again from the last commit"
    )]
    DrainGaveUp { failing: String, held_back: usize },
    #[error("a processing or flush task died: {0}")]
    TaskDied(String),
    #[error("the Kafka polling thread stopped")]
    PollerGone,
    /// The group coordinator refuses the member's settings or the principal's rights, or
    /// librdkafka raised a fatal error (a fenced static member): no retry would ever consume.
    #[error("{0}")]
    Refused(String),
    /// Stopping is the way back to increasing offsets: the next start reads from the committed
    /// ones, which nothing past the cut has moved.
    #[error(
        "partition {}: offset {} read after {} in the same assignment (the log was cut back or the position reset): stopping, to start again from the committed offsets",
        .0.partition, .0.offset, .0.last
    )]
    OffsetWentBack(frontier::WentBack),
    /// Only new Kafka clients get past it (`kafka::topic_id`); when the consumed topic changed,
    /// nothing of the new one may be committed past its start: once the pipeline stopped, the
    /// start of every partition of it owned is committed.
    #[error(
        "topic {}: deleted and created again while this process used it (its id was {}, it is {}): librdkafka keeps the old topic's positions and leader epochs, which skips the new topic's first messages or stalls its reads and writes for good; stopping, to start again with new clients",
        .0.topic, .0.was, .0.now
    )]
    TopicRecreated(Recreated),
    #[error(
        "everything was flushed, but the last offset commit failed: what was flushed since the last commit is read again on the next start"
    )]
    DrainUncommitted,
}

/// A pause of intake at least this long is logged when it ends (shorter ones, the rhythm of
/// steady backpressure, at DEBUG).
const LONG_PAUSE: Duration = Duration::from_secs(10);

/// A drain's attempts at its last commit, and the wait between two when one failed (a
/// coordinator moving, a commit held through a rebalance's other round).
const DRAIN_COMMIT_ATTEMPTS: u32 = 4;
const DRAIN_COMMIT_RETRY: Duration = Duration::from_millis(250);

/// What a shutdown gives closing the consumer (leaving the group) and the sinks' Kafka clients
/// beyond what its drain left of the drain deadline: a drain that took the whole deadline left
/// nothing, and the member's partitions would wait a session timeout for their next owner. The
/// chart's grace period counts 2 s after the drain deadline and the last metrics interval: these
/// 1.5 s, and the process's exit.
const CLOSE_RESERVE: Duration = Duration::from_millis(1500);

/// How a drain ended.
enum Drained {
    /// Everything taken in for processing before it is durable and committed.
    Durable,
    /// The deadline passed first: what is not durable yet is not committed.
    MissedDeadline,
    /// Given up before the deadline as when it passes: every flush left has been failing for a
    /// whole deadline (see [`Pipeline::failing_long`]). Says on what, how long.
    FailingLong(String),
    /// Everything is durable, but the last commit failed every attempt: what was made durable
    /// since the last commit that succeeded is read again.
    Uncommitted,
    /// A flush failed for good (or a task died): nothing past it is committed.
    Failed(PipelineError),
}

/// What a group's results hold while they wait in the processing window.
impl Held for Vec<ProcessedEntry> {
    fn held_bytes(&self) -> usize {
        self.iter().map(|p| p.bytes).sum()
    }
}

/// A batch from the polling thread, not yet in the processing window: its messages enter as the
/// window makes room, and its room in the hand-over is given back once all have.
struct Intake {
    messages: VecDeque<(Record, u64)>,
    _room: Ticket,
}

/// A processed message on its way to the buffer.
struct ProcessedEntry {
    entry: Entry,
    /// What the entry holds in memory.
    bytes: usize,
    /// The processing thread that made it, where it is freed ([`free_where_made`]).
    thread: usize,
    /// The generation its message was polled in.
    generation: u64,
    /// The leader epoch its message was written in, committed with the offset after it.
    leader_epoch: Option<i32>,
}

/// A finished flush, as the owning task learns of it.
struct Flushed {
    /// The assignment generation it was started in; an older one's offsets are not ours.
    generation: u64,
    /// What it was failing on, as drains read it while it ran.
    failing: Arc<Failing>,
    offsets: Vec<(i32, i64)>,
    reason: CloseReason,
    valid: u64,
    invalid_by_reason: BTreeMap<&'static str, u64>,
    result: Result<FlushReport, SinkError>,
}

/// A commit, run on the blocking pool so that the loop goes on while the broker answers (during
/// a rebalance it holds a commit until the group settles, seconds with cooperative-sticky).
struct Committed {
    /// The assignment generation it was started in; a revoked partition's result is not ours.
    generation: u64,
    positions: Vec<Position>,
    result: Result<(), KafkaError>,
}

/// How the pipeline runs; `config::ConsumeArgs::pipeline_settings` builds it from the flags.
pub struct Settings {
    /// The consumer's librdkafka configuration (group, commits, prefetch, security).
    pub consumer: ClientConfig,
    pub topic: String,
    /// Processing threads; 0 is one per CPU.
    pub processing_threads: usize,
    pub limits: Limits,
    pub buffer: BufferLimits,
    pub max_flushes: usize,
    /// Messages waiting for an earlier one to be durable (so not committable) past which intake
    /// pauses; [`max_uncommitted`] gives the service's.
    pub max_uncommitted: usize,
    pub retry: RetryPolicy,
    pub drain_deadline: Duration,
    pub flush_stall: Duration,
    /// How long the member may be out of its group, reaching a broker, before liveness fails;
    /// `None`: never.
    pub group_stall: Option<Duration>,
    /// How long the brokers may refuse the Kafka credentials before liveness fails; `None`:
    /// never.
    pub kafka_refused: Option<Duration>,
    /// The member uses the consumer group protocol of KIP-848.
    pub consumer_protocol: bool,
    /// With it, how long the group coordinator may be out of reach before flushes write
    /// nothing until it answers (`kafka::coordinator`); `None` with the classic protocol.
    pub hold_writes_after: Option<Duration>,
    /// Longest a commit's answer is waited for; past it the commit counts as failed and is
    /// tried again.
    pub commit_timeout: Duration,
}

/// Consumes `settings.topic` until `shutdown` resolves, then drains and returns. Needs a
/// multi-threaded Tokio runtime (commits block their worker for one broker round trip).
pub async fn consume(
    settings: Settings,
    sinks: Sinks,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let (polled_tx, polled_rx) = mpsc::unbounded_channel();
    let handoff = Handoff::new(POLLED_IN_TRANSIT, POLLED_IN_TRANSIT_BYTES);
    let (revokes_tx, revokes_rx) = mpsc::unbounded_channel();
    status.set_flush_stall(settings.flush_stall);
    status.set_group_stall(settings.group_stall);
    status.set_kafka_refused_timeout(settings.kafka_refused);
    let context = IngestContext::new(
        revokes_tx,
        settings.drain_deadline,
        status.clone(),
        settings.consumer_protocol,
        settings.hold_writes_after,
    );
    let consumer: Arc<IngestConsumer> = Arc::new(settings.consumer.create_with_context(context)?);
    IngestContext::attach(&consumer);
    consumer.subscribe(&[&settings.topic])?;
    let statistics = sends_statistics(&settings.consumer);
    if !statistics {
        warn!(
            "statistics.interval.ms=0: consumer.lag, consumer.out_of_group_ms and /status `group` are not reported, the group stall does not fail liveness, and with the consumer group protocol flushes go on writing while the group coordinator is out of reach and readiness does not wait for the member to join its group"
        );
    }
    status.record_initialised(statistics, settings.consumer_protocol);
    let stop = Arc::new(AtomicBool::new(false));
    let (refusals_tx, refusals_rx) = mpsc::unbounded_channel();
    let recreated = Arc::new(Mutex::new(None));
    // Stopped apart from the rest, before the pipeline's end is read: a detection while the
    // pipeline ends is not lost.
    let watch_stop = Arc::new(AtomicBool::new(false));
    let topic_watch = topic_id::watch(
        Arc::downgrade(&consumer),
        settings.topic.clone(),
        sinks.written_topics(),
        consumer.context().ownership(),
        watch_stop.clone(),
        {
            let (refusals_tx, recreated) = (refusals_tx.clone(), recreated.clone());
            move |found: Recreated| {
                warn!(topic = %found.topic, was = %found.was, now = %found.now, "a topic's id changed under this process: stopping");
                // Kept for a drain, which does not read the channel: a shutdown under way must
                // not end as if nothing happened.
                *recreated.lock().unwrap_or_else(PoisonError::into_inner) = Some(found.clone());
                let _ = refusals_tx.send(Stop::Recreated(found));
            }
        },
    );
    let poller = spawn_poller(
        consumer.clone(),
        polled_tx,
        refusals_tx,
        handoff.clone(),
        stop.clone(),
    );

    let threads = processing_threads(settings.processing_threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("process-{i}"))
        .stack_size(recording::PROCESSING_STACK_BYTES)
        // Processing catches its own panics; anything else that panics on the pool is logged
        // (its result never arrives, and the pipeline stops with `TaskDied`) instead of aborting.
        .panic_handler(|_| error!("a processing task panicked"))
        .build()
        .map_err(|e| PipelineError::TaskDied(e.to_string()))?;

    let pipeline = Pipeline {
        topic: settings.topic,
        consumer: consumer.clone(),
        polled: polled_rx,
        refusals: refusals_rx,
        revokes: revokes_rx,
        revocations: Revocations::default(),
        pool: Arc::new(pool),
        limits: settings.limits,
        intake: None,
        processing: Window::new(threads),
        waiting: VecDeque::new(),
        uncommitted_bound: settings.max_uncommitted,
        buffer: Buffer::new(settings.buffer),
        frontier: Frontier::default(),
        flushes: JoinSet::new(),
        failing: Vec::new(),
        failing_changed: Arc::default(),
        commits: JoinSet::new(),
        max_flushes: settings.max_flushes,
        sinks: Arc::new(sinks),
        retry: settings.retry,
        drain_deadline: settings.drain_deadline,
        commit_timeout: settings.commit_timeout,
        status,
        paused: None,
        revoked_while_draining: Vec::new(),
    };
    pipeline
        .status
        .watch_processing(pipeline.processing.running_since_ms());
    // A shutdown is bounded by the drain deadline and `CLOSE_RESERVE` as a whole (the chart's
    // grace period counts on it): leaving the group gets what the drain left of its deadline and
    // the reserve.
    let shutdown_at = std::sync::OnceLock::new();
    // Closed with the consumer, off the runtime and within the same budget: dropping the last
    // handle closes the sinks' Kafka clients (each up to a second or more).
    let sinks = pipeline.sinks.clone();
    let status = pipeline.status.clone();
    let result = pipeline
        .run(async {
            shutdown.await;
            let _ = shutdown_at.set(Instant::now());
        })
        .await;
    // Found while the pipeline drained, or with it stopping on something else: the start is
    // committed all the same, and the exit says why. The watch ends within a step of its stop
    // (it holds the consumer only while it asks).
    watch_stop.store(true, Ordering::Release);
    if let Some(watch) = topic_watch {
        let _ = tokio::task::spawn_blocking(move || watch.join()).await;
    }
    let found = recreated
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let result = match (result, found) {
        (Err(PipelineError::TopicRecreated(r)), _) | (Ok(()), Some(r)) => {
            Err(PipelineError::TopicRecreated(r))
        }
        (Err(other), Some(r)) => {
            // The exit names the topic; what stopped the pipeline first is said here.
            error!(error = %other, "the pipeline stopped on this too");
            Err(PipelineError::TopicRecreated(r))
        }
        (result, None) => result,
    };
    // However it ended, the process is on its way out: not ready while it closes (a member
    // stopping on an error — a flush failed for good, the brokers refused it — read as ready
    // until it exited: to a node drain, and to the disruption budget, one more member up).
    status.record_stopping();
    if result.is_err() {
        // Stopping without a drain that ended: flushes still under way write nothing more (a
        // sink's next attempt, a later stage), as for a revoke answered before its drain ended.
        // Else one retrying through an outage would go on writing blobs, rows and billing
        // outcomes while the consumer closes, none of them committed, all written again after
        // the restart.
        consumer.context().ownership().abandon_all();
    }
    if let Err(PipelineError::TopicRecreated(recreated)) = &result
        && let Some(owned) = &recreated.owned
    {
        commit_the_start(
            &consumer,
            &recreated.consumed,
            owned,
            settings.commit_timeout,
        )
        .await;
    }
    let close_budget = CLOSE_RESERVE
        + shutdown_at.get().map_or(settings.drain_deadline, |at| {
            settings.drain_deadline.saturating_sub(at.elapsed())
        });
    stop.store(true, Ordering::Release);
    // Wakes a poller waiting for room.
    handoff.close();
    // Closing the consumer runs the revoke callback, which blocks. Leaving the group needs the
    // broker; if it is unreachable, do not outlive the budget. Closed here whoever else holds
    // it: a commit still waiting for its answer holds the consumer too, and the last handle's
    // drop would close it on that commit's thread, after this returned and past the budget.
    // The statistics that come while it closes read no member epoch (a request to librdkafka's
    // group handler that one terminating meanwhile would never answer).
    consumer.context().closing();
    let closed = close_within(close_budget, move || {
        let _ = poller.join();
        // Alone, the drop closes it (a close before would make the drop's own fail, and
        // rust-rdkafka log that as an error).
        if let Err(shared) = Arc::try_unwrap(consumer) {
            leave_group(&shared);
        }
        drop(sinks);
    })
    .await;
    if !closed {
        warn!(
            budget_ms = close_budget.as_millis() as u64,
            "closing the Kafka consumer did not finish within what the drain deadline left and 1.5 s more; exiting anyway"
        );
    }
    result
}

struct Pipeline {
    topic: String,
    consumer: Arc<IngestConsumer>,
    polled: mpsc::UnboundedReceiver<Polled>,
    /// Why the member must stop consuming (`kafka::consumer::Stop`): read whether or not intake
    /// takes messages, so never behind data.
    refusals: mpsc::UnboundedReceiver<Stop>,
    revokes: mpsc::UnboundedReceiver<Revoke>,
    /// What this member may still commit, per partition.
    revocations: Revocations,
    pool: Arc<rayon::ThreadPool>,
    limits: Limits,
    /// Polled, waiting for room in the processing window.
    intake: Option<Intake>,
    /// Messages being processed, in arrival order, with their window reservations.
    processing: Window<Vec<ProcessedEntry>>,
    /// The rest of a group's results, out of the window, when the buffer filled part-way through
    /// them and no flush could start: taken before anything else, and nothing enters the window
    /// meanwhile (it holds what they held in it).
    waiting: VecDeque<ProcessedEntry>,
    buffer: Buffer,
    frontier: Frontier,
    flushes: JoinSet<Flushed>,
    /// What each flush in `flushes` is failing on, and the notice of a write that starts failing.
    failing: Vec<Arc<Failing>>,
    failing_changed: Arc<Notify>,
    /// The commit in flight, if any (one at a time, so they land in order).
    commits: JoinSet<Committed>,
    max_flushes: usize,
    /// Messages not yet committable past which intake pauses ([`Settings::max_uncommitted`]).
    uncommitted_bound: usize,
    sinks: Arc<Sinks>,
    retry: RetryPolicy,
    drain_deadline: Duration,
    commit_timeout: Duration,
    status: Arc<Status>,
    /// While intake is paused behind a full buffer.
    paused: Option<Pause>,
    /// Revokes that arrived during a drain, answered when it ends.
    revoked_while_draining: Vec<Revoke>,
}

/// A pause of intake: since when, and up to when it is counted in `consumer.paused_ms`.
struct Pause {
    since: Instant,
    counted_to: Instant,
}

impl Pipeline {
    async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), PipelineError> {
        tokio::pin!(shutdown);
        let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
        loop {
            self.status.beat();
            // The age deadline only matters when a flush could start: with every slot busy it
            // would fire again at once, spinning a core until a flush ends.
            let slot_free = self.flushes.len() < self.max_flushes;
            let age_deadline = self
                .buffer
                .deadline()
                .filter(|_| slot_free)
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    info!("shutdown requested: draining");
                    self.status.record_stopping();
                    return self.shut_down(self.drain_deadline, &mut heartbeat).await;
                }
                Some(Revoke { partitions, generation, lost, done }) = self.revokes.recv() => {
                    // A shutdown requested during the revoke's drain is not kept waiting behind
                    // it: readiness goes off at once, and the drain that follows gets what is
                    // left of the deadline, counted from the request. The drain is bounded by
                    // its deadline, so the loop is alive while it waits: it beats, or a drain
                    // longer than the liveness window would get the pod restarted mid-rebalance.
                    let status = self.status.clone();
                    let mut requested = None;
                    {
                        let revoke = self.revoke(&partitions, generation, lost);
                        tokio::pin!(revoke);
                        loop {
                            tokio::select! {
                                biased;
                                revoked = &mut revoke => break revoked,
                                () = &mut shutdown, if requested.is_none() => {
                                    info!("shutdown requested during a revoke: draining once it ends");
                                    status.record_stopping();
                                    requested = Some(Instant::now());
                                }
                                _ = heartbeat.tick() => status.beat(),
                            }
                        }
                    }?;
                    let _ = done.send(());
                    if let Some(at) = requested {
                        let deadline = self.drain_deadline.saturating_sub(at.elapsed());
                        return self.shut_down(deadline, &mut heartbeat).await;
                    }
                }
                Some(flushed) = self.flushes.join_next() => {
                    let flushed = flushed.map_err(|e| PipelineError::TaskDied(e.to_string()))?;
                    self.flushed(flushed)?;
                }
                Some(committed) = self.commits.join_next() => {
                    self.committed(committed.map_err(|e| PipelineError::TaskDied(e.to_string()))?);
                }
                // Results wait in the window while the buffer is full and no flush can start:
                // taken in, a whole window of them went into the buffer past its share, and into
                // the batch it became (each flush in flight held a window more than the bound
                // counts).
                Some(progress) = self.processing.next(), if self.waiting.is_empty() && !self.holds_results() => {
                    // A later group done first only gave room back: admitted below.
                    if let Progress::Ready(processed) = progress {
                        self.waiting.extend(processed.map_err(|_| PipelineError::TaskDied("processing".into()))?);
                    }
                }
                // Read whether or not intake is paused: the polling thread gone (a panic in a
                // callback it runs) drops its sender, and unnoticed while a sink outage pauses
                // intake, no one would poll, serve a rebalance or heartbeat the group.
                stop = self.refusals.recv() => return Err(match stop {
                    Some(Stop::Refused(refused)) => PipelineError::Refused(refused),
                    Some(Stop::Recreated(recreated)) => PipelineError::TopicRecreated(recreated),
                    None => PipelineError::PollerGone,
                }),
                polled = self.polled.recv(), if self.takes_messages() => match polled {
                    Some(Polled { messages, room }) => {
                        self.intake = Some(Intake { messages: messages.into(), _room: room });
                    }
                    None => return Err(PipelineError::PollerGone),
                },
                () = tokio::time::sleep_until(age_deadline.unwrap_or_else(tokio::time::Instant::now)), if age_deadline.is_some() => {}
                _ = heartbeat.tick() => {
                    self.commit();
                    self.count_pause();
                    crate::logs::tell_held_back(false);
                }
            }
            // Starts a flush too, when the buffer is ready for one.
            self.take_waiting()?;
            self.backpressure();
            self.admit();
        }
    }

    /// Moves waiting results into the buffer, one by one, while it can take them: a buffer
    /// closes at its limit, and a flush starts; once it is full with no flush able to start, the
    /// rest wait (a group's results taken in whole went into the buffer past its share: 8
    /// results of zstd bodies each decoding to 15 MiB, 120 MiB past it).
    fn take_waiting(&mut self) -> Result<(), PipelineError> {
        // A buffer left full when the last flush ended closes first.
        self.start_flushes(Instant::now());
        while !self.holds_results() {
            let Some(processed) = self.waiting.pop_front() else {
                return Ok(());
            };
            self.buffered(processed)?;
            self.start_flushes(Instant::now());
        }
        Ok(())
    }

    /// The last drain, within `deadline` (given up at once behind flushes all failing for a whole
    /// drain deadline, as a revoke's), and how the pipeline ends. The loop beats on
    /// `heartbeat` meanwhile, as through a revoke's drain: the deadline may be longer than the
    /// liveness window, and the kubelet would kill the pod mid-drain.
    async fn shut_down(
        &mut self,
        deadline: Duration,
        heartbeat: &mut tokio::time::Interval,
    ) -> Result<(), PipelineError> {
        let status = self.status.clone();
        let drained = {
            let drain = self.drain(deadline, self.drain_deadline);
            tokio::pin!(drain);
            loop {
                tokio::select! {
                    biased;
                    drained = &mut drain => break drained,
                    _ = heartbeat.tick() => status.beat(),
                }
            }
        };
        match drained {
            Drained::Durable => Ok(()),
            Drained::MissedDeadline => Err(PipelineError::DrainDeadline {
                deadline,
                held_back: self.frontier.pending(),
                uncommitted: self.frontier.has_advanced() || !self.commits.is_empty(),
            }),
            Drained::FailingLong(failing) => Err(PipelineError::DrainGaveUp {
                failing,
                held_back: self.frontier.pending(),
            }),
            Drained::Uncommitted => Err(PipelineError::DrainUncommitted),
            Drained::Failed(error) => Err(error),
        }
    }

    /// Whether the loop takes another polled batch: the last one is all in the processing
    /// window, the window has room, and intake is not paused. (When it does not, the polling
    /// thread soon finds no room to hand messages over, and pauses the partitions.)
    fn takes_messages(&self) -> bool {
        self.intake.is_none() && self.admits()
    }

    fn admits(&self) -> bool {
        self.paused.is_none() && self.waiting.is_empty() && self.processing.has_room()
    }

    /// Moves polled messages into the processing window while it has room, consecutive small
    /// ones in groups (each admitted as if alone). A message polled before its partition was
    /// revoked is dropped here: its next owner reads it.
    fn admit(&mut self) {
        while self.admits() {
            let Some(intake) = &mut self.intake else {
                return;
            };
            let (mut group, mut reserved, mut values) = (Vec::new(), 0, 0);
            while group.len() < PROCESS_GROUP_MESSAGES && values < PROCESS_GROUP_BYTES {
                let Some((record, generation)) = intake.messages.front() else {
                    break;
                };
                if self.revocations.is_stale(record.partition, *generation) {
                    intake.messages.pop_front();
                    continue;
                }
                // A message enters only if its reservation fits, or alone into an empty window
                // (one reservation can exceed the window's bytes: a zstd body's, up to the cap).
                let reservation = window::reservation(&record.value, &self.limits)
                    .saturating_add(record.bytes() - record.value.len());
                let alone = group.is_empty() && self.processing.is_empty();
                if !alone
                    && !self
                        .processing
                        .fits(group.len() + 1, reserved + reservation)
                {
                    break;
                }
                values += record.bytes();
                reserved += reservation;
                group.extend(intake.messages.pop_front());
            }
            if intake.messages.is_empty() {
                self.intake = None;
            }
            if group.is_empty() {
                // Nothing more fits until the window gives room back.
                return;
            }
            self.process(group, reserved);
        }
    }

    /// Whether finished results stay in the processing window: the buffer is full and no flush
    /// can start to empty it (the window's own bound holds them meanwhile).
    fn holds_results(&self) -> bool {
        should_pause(self.buffer.is_full(), self.flushes.len(), self.max_flushes)
    }

    /// Pauses intake when the buffer is full and no flush can start; resumes when one can.
    fn backpressure(&mut self) {
        let full = self.holds_results();
        let uncommitted = self.frontier.pending();
        let pause = full || uncommitted > self.uncommitted_bound;
        if pause == self.paused.is_some() {
            return;
        }
        if pause {
            let now = Instant::now();
            self.paused = Some(Pause {
                since: now,
                counted_to: now,
            });
            self.status.record_paused();
            if full {
                // Under steady backpressure this comes with every flush: DEBUG (the pause is in
                // `consumer.paused_ms` and `/status`; a long one is logged when it ends).
                debug!(
                    buffer_messages = self.buffer.len(),
                    buffer_bytes = self.buffer.bytes(),
                    "buffer full: intake paused"
                );
            } else {
                warn!(
                    uncommitted,
                    bound = self.uncommitted_bound,
                    flushes_in_flight = self.flushes.len(),
                    "an earlier flush holds the commits back: intake paused until it is durable"
                );
            }
        } else if let Some(since) = self.paused.as_ref().map(|p| p.since) {
            self.count_pause();
            self.paused = None;
            self.status.record_resumed();
            let paused_ms = since.elapsed().as_millis() as u64;
            if since.elapsed() >= LONG_PAUSE {
                info!(paused_ms, "flush done: intake resumed");
            } else {
                debug!(paused_ms, "flush done: intake resumed");
            }
        }
    }

    /// Counts the pause so far in `consumer.paused_ms`: every second while it lasts (a pause
    /// behind a long outage shows in the rate while it lasts), the rest when it ends.
    fn count_pause(&mut self) {
        if let Some(pause) = &mut self.paused {
            let now = Instant::now();
            metrics::paused_for(now.saturating_duration_since(pause.counted_to));
            pause.counted_to = now;
        }
    }

    /// Whether something of `partition` from `generation` predates the partition's last revoke.
    fn stale(&self, partition: i32, generation: u64) -> bool {
        self.revocations.is_stale(partition, generation)
    }

    /// consume → process: decompress and parse on the pool, a group of messages holding
    /// `reserved` of the window as one task.
    fn process(&mut self, group: Vec<(Record, u64)>, reserved: usize) {
        self.status.record_consumed(group.len());
        let tx = self.processing.push(group.len(), reserved);
        let (limits, topic) = (self.limits, self.topic.clone());
        self.pool.spawn(move || {
            let thread = rayon::current_thread_index().unwrap_or_default();
            let processed = group
                .into_iter()
                .map(|(record, generation)| {
                    let leader_epoch = record.leader_epoch;
                    let (entry, bytes) = to_entry(record, &limits, &topic);
                    ProcessedEntry {
                        entry,
                        bytes,
                        thread,
                        generation,
                        leader_epoch,
                    }
                })
                .collect();
            tx.send(processed);
        });
    }

    /// process → buffer.
    fn buffered(
        &mut self,
        ProcessedEntry {
            entry,
            bytes,
            thread,
            generation,
            leader_epoch,
        }: ProcessedEntry,
    ) -> Result<(), PipelineError> {
        if self.stale(entry.partition, generation) {
            // Processed across a revoke whose drain gave up on it.
            return Ok(());
        }
        let restarted = self
            .frontier
            .track(entry.partition, entry.offset, leader_epoch)
            .map_err(PipelineError::OffsetWentBack)?;
        if let Some(last) = restarted {
            warn!(
                partition = entry.partition,
                offset = entry.offset,
                last,
                "offsets went back with nothing of the partition pending (the log was cut back or the position reset): tracking starts over"
            );
        }
        if let Outcome::Invalid(invalid) = &entry.outcome {
            self.status.record_invalid(invalid.error.reason.as_str());
        }
        self.buffer.push(entry, bytes, thread, Instant::now());
        self.publish_buffer();
        Ok(())
    }

    /// buffer → flush, while a flush slot is free and the buffer wants closing.
    fn start_flushes(&mut self, now: Instant) {
        if self.flushes.len() < self.max_flushes
            && let Some(reason) = self.buffer.close_reason(now)
        {
            self.start_flush(reason);
        }
    }

    fn start_flush(&mut self, reason: CloseReason) {
        let (mut batch, threads) = self.buffer.take();
        self.publish_buffer();
        let offsets: Vec<(i32, i64)> = batch
            .entries
            .iter()
            .map(|e| (e.partition, e.offset))
            .collect();
        debug!(
            messages = offsets.len(),
            reason = reason.as_str(),
            "flush started"
        );
        let (sinks, retry, status, generation, pool, ownership) = (
            self.sinks.clone(),
            self.retry,
            self.status.clone(),
            self.revocations.current(),
            self.pool.clone(),
            self.consumer.context().ownership(),
        );
        self.status.flush_progress();
        let runtime = tokio::runtime::Handle::current();
        let failing = Arc::new(Failing::new(self.failing_changed.clone()));
        self.failing.push(failing.clone());
        self.flushes.spawn_blocking(move || {
            // A partition lost since (the callback records it at once, before this task hears
            // of it) is written no further.
            let lost = |partition| ownership.lost_since(partition, generation);
            let held = || ownership.writes_held();
            let owner = flush::Owner {
                lost: &lost,
                held: &held,
            };
            let result = flush::flush(
                &runtime, &mut batch, &sinks, &retry, &status, owner, &failing,
            );
            // Counted from what the flush left in the batch (it takes out what a sink rejected,
            // and what it gave up of lost partitions), and what it dead-lettered.
            let valid = batch.valid().count() as u64;
            let mut invalid_by_reason = BTreeMap::new();
            let rejected = result.iter().flat_map(|report| &report.rejected);
            for reason in (batch.invalid().map(|(_, invalid)| invalid.error.reason))
                .chain(rejected.map(|rejected| rejected.reason()))
            {
                *invalid_by_reason.entry(reason.as_str()).or_default() += 1;
            }
            let threads = threads_left(&offsets, threads, &batch.entries);
            free_where_made(&pool, batch.entries, threads);
            Flushed {
                generation,
                failing,
                offsets,
                reason,
                valid,
                invalid_by_reason,
                result,
            }
        });
        self.status.record_flushes_in_flight(self.flushes.len());
    }

    /// flush → commit.
    fn flushed(&mut self, flushed: Flushed) -> Result<(), PipelineError> {
        self.status.record_flushes_in_flight(self.flushes.len());
        self.failing.retain(|f| !Arc::ptr_eq(f, &flushed.failing));
        // Started before a revoke whose drain gave up on it: the revoked partitions' offsets are
        // someone else's now and are not committed (the flush wrote no more of them once the
        // drain gave up, `Ownership::abandon`; what it wrote before is written again by their
        // next owner); those of partitions this member kept are.
        let generation = flushed.generation;
        // A flush leaves out the messages of partitions lost while it ran (or whose revoke was
        // answered before its drain ended), whether or not this task has heard of it yet: none
        // of their offsets is completed.
        let given_up = flushed.result.as_ref().map_or(&[][..], |r| &r.given_up[..]);
        if !given_up.is_empty() {
            info!(
                messages = given_up.len(),
                "flush left out the messages of partitions lost while it ran: their next owner writes them"
            );
        }
        let (offsets, given_away): (Vec<_>, Vec<_>) = flushed
            .offsets
            .iter()
            .filter(|at| given_up.binary_search(at).is_err())
            .partition(|(partition, _)| !self.stale(*partition, generation));
        if !given_away.is_empty() {
            info!(
                messages = given_away.len(),
                ok = flushed.result.is_ok(),
                "flush of revoked partitions finished; their offsets are not committed"
            );
            if offsets.is_empty() {
                return Ok(());
            }
        }
        // Counted and shown in `/status` here, where it stops the service: a flush of partitions
        // given away meanwhile fails for good without (above), and counted in the flush it paged
        // for an exit that did not come, its outage shown (and `sink.outage_ms` sent) until the
        // sink next wrote.
        let report = flushed
            .result
            .inspect_err(|error| {
                self.status.sink_failed(error.sink, &error.message);
                crate::metrics::flush_failed(error.sink);
            })
            .map_err(PipelineError::Flush)?;
        debug!(messages = flushed.offsets.len(), reason = flushed.reason.as_str(), sinks = ?report.sinks, "flush done");
        self.status.record_flushed(
            offsets.len() as u64,
            flushed.reason.as_str(),
            flushed.valid,
            flushed.invalid_by_reason.into_iter(),
            report
                .sinks
                .iter()
                .map(|s| (s.sink, s.took, s.written.items, s.written.bytes)),
        );
        for rejected in &report.rejected {
            self.status.record_invalid(rejected.reason().as_str());
        }
        for sink in &report.sinks {
            self.status
                .record_sink(sink.sink, sink.took, sink.written.items, sink.written.bytes);
        }
        for (partition, offset) in offsets {
            self.frontier.complete(partition, offset);
        }
        self.commit();
        Ok(())
    }

    /// Commits what became durable since the last commit, unless a commit is in flight (what
    /// advances meanwhile goes when it returns).
    fn commit(&mut self) {
        if !self.commits.is_empty() {
            return;
        }
        let positions = self.frontier.take_advanced();
        if positions.is_empty() {
            return;
        }
        let (consumer, topic, generation, wait) = (
            self.consumer.clone(),
            self.topic.clone(),
            self.revocations.current(),
            self.commit_timeout,
        );
        self.commits.spawn_blocking(move || {
            let positions = not_lost_since(positions, &consumer.context().ownership(), generation);
            // Waited for, so that a commit is counted only once the broker has confirmed it.
            let result = if positions.is_empty() {
                Ok(())
            } else {
                commit_within(&consumer, &position_list(&topic, &positions), wait)
            };
            Committed {
                generation,
                positions,
                result,
            }
        });
    }

    /// A commit returned. Partitions revoked since it started are left out: their next owner
    /// commits them.
    fn committed(
        &mut self,
        Committed {
            generation,
            positions,
            result,
        }: Committed,
    ) {
        let positions: Vec<_> = positions
            .into_iter()
            .filter(|p| !self.stale(p.partition, generation))
            .collect();
        match result {
            // Nothing sent: every position was of a partition lost meanwhile.
            Ok(()) if positions.is_empty() => self.commit(),
            Ok(()) => {
                self.status
                    .record_commit(positions.iter().map(|p| (p.partition, p.offset)));
                self.commit();
            }
            // Not fatal: retried at the next heartbeat (or covered by the next flush's commit),
            // so an idle member does not leave its last offsets uncommitted; at worst they are
            // redelivered.
            Err(error) => {
                metrics::commit_failed();
                // Tried again every second while it fails: throttled.
                if let Some(held_back) = crate::logs::COMMIT_FAILED.admit() {
                    warn!(%error, ?positions, held_back, "offset commit failed: retried");
                }
                self.frontier.uncommitted(&positions);
            }
        }
    }

    /// `partitions` are revoked — all of them with eager assignment, some with cooperative
    /// (incremental) rebalancing: drain within the deadline, so that everything taken in for
    /// processing so far, whatever its partition, is durable and committed. What the drain could
    /// not finish in time is given up for the revoked partitions only (their next owner reads it
    /// again) and kept for the others, which this member goes on consuming. Messages polled but
    /// not yet taken in (the hand-over, the polled batch waiting for the window) are left alone:
    /// the revoked partitions' are dropped unprocessed (stale) and read by their next owner, the
    /// others' are processed after the revoke, so a rebalance does not wait on them.
    async fn revoke(
        &mut self,
        partitions: &[i32],
        generation: u64,
        lost: bool,
    ) -> Result<(), PipelineError> {
        // Lost partitions are another member's already, read from their last commit: flushing
        // what is buffered of them would write it twice (billing outcomes and occurrences are
        // not idempotent) and delay the rejoin. They are given up at once; flushes in flight
        // write no more of them (`flush`: they heard of the loss from the callback already),
        // and commit only what this member still owns.
        let drained = if lost {
            Drained::Durable
        } else {
            self.drain(self.drain_deadline, self.drain_deadline).await
        };
        match drained {
            Drained::Durable => {}
            Drained::MissedDeadline => {
                warn!(
                    deadline_ms = self.drain_deadline.as_millis() as u64,
                    ?partitions,
                    flushes_in_flight = self.flushes.len(),
                    buffered = self.buffer.len(),
                    "revoke: drain missed its deadline; what is not durable is left to the next owner"
                );
                self.abandon(partitions, generation);
            }
            Drained::FailingLong(failing) => {
                warn!(
                    %failing,
                    ?partitions,
                    flushes_in_flight = self.flushes.len(),
                    buffered = self.buffer.len(),
                    "revoke: every flush left has been failing for longer than the drain deadline; what is not durable is left to the next owner"
                );
                self.abandon(partitions, generation);
            }
            Drained::Uncommitted => warn!(
                "revoke: everything is durable but the offset commit failed; the next owner reads again what was flushed since the last commit"
            ),
            Drained::Failed(error) => return Err(error),
        }
        self.give_up(partitions, generation);
        Ok(())
    }

    /// `partitions`, revoked in `generation`, are answered with some of what was polled of them
    /// not durable. Called before the callback is answered, so before the next owner starts:
    /// flushes under way write no more of them.
    fn abandon(&self, partitions: &[i32], generation: u64) {
        self.consumer
            .context()
            .ownership()
            .abandon(partitions, generation);
    }

    /// What is left of `partitions` here is their next owner's: nothing buffered of them is
    /// flushed, and none of their offsets committed.
    fn give_up(&mut self, partitions: &[i32], generation: u64) {
        self.revocations.revoked(partitions, generation);
        self.buffer
            .retain(|partition| !partitions.contains(&partition));
        self.publish_buffer();
        self.frontier.forget(partitions);
        self.status.record_rebalance();
    }

    /// A revoke that arrives during a drain: in practice the shutdown's (the polling thread goes
    /// on polling while it runs; during a revoke's drain it waits in the callback). The drain
    /// makes durable and commits what it can of every partition, so the revoke is answered when
    /// it ends (the callback, and so the polling thread, waits until then, bounded by the drain
    /// deadline). Lost partitions are given up at once: the group gave them to another member,
    /// which reads them from their last commit, so what is buffered of them is not written a
    /// second time (billing outcomes are not idempotent) and their offsets, which this member may
    /// no longer commit, do not fail the drain's last commit.
    fn revoked_during_drain(&mut self, revoke: Revoke) {
        if revoke.lost {
            self.give_up(&revoke.partitions, revoke.generation);
        }
        self.revoked_while_draining.push(revoke);
    }

    /// The drain is over: the revokes that arrived meanwhile are answered, the partitions not lost
    /// given up now — and, when the drain left flushes under way (it missed its deadline, gave up
    /// on failing ones, or failed), abandoned as the drain's own revoke's are: those flushes write
    /// no more of them.
    fn answer_revokes(&mut self, left_flushes: bool) {
        for revoke in std::mem::take(&mut self.revoked_while_draining) {
            if !revoke.lost {
                if left_flushes {
                    self.abandon(&revoke.partitions, revoke.generation);
                }
                self.give_up(&revoke.partitions, revoke.generation);
            }
            let _ = revoke.done.send(());
        }
    }

    /// Shutdown and revocation: everything taken in for processing so far is processed, flushed
    /// and committed, within `deadline`; says how it ended. It stops waiting for flushes that
    /// have all been failing for `patience` ([`Pipeline::failing_long`]).
    async fn drain(&mut self, deadline: Duration, patience: Duration) -> Drained {
        self.status.record_draining(true);
        let drained = match tokio::time::timeout(deadline, self.drain_inner(patience)).await {
            Ok(Ok(drained)) => drained,
            Ok(Err(error)) => Drained::Failed(error),
            Err(_) => Drained::MissedDeadline,
        };
        self.status.record_draining(false);
        self.answer_revokes(!matches!(drained, Drained::Durable | Drained::Uncommitted));
        drained
    }

    /// Whether what a drain waits for is flushes that have each been failing (retrying one of
    /// their writes) for at least `patience`, no commit pending: `Ok` with what they fail on
    /// (`"clickhouse failing for 25.1 s"`). The drain gives up on them at once, as when its
    /// deadline passes: a flush failing that long waits on an outage, and a rebalance or a
    /// shutdown is no reason to wait for its end. While a revoke's drain waits, the rebalance —
    /// this member's polling and the partitions' next owner — waits with it; while a shutdown's
    /// does, the pod's exit, and the revokes of members joining meanwhile. A flush that fails for less (a blip, perhaps) gets
    /// the rest of its `patience`: `Err` with when the drain could give up, if every flush is
    /// failing (`None`: one is not, or a commit is pending; a change wakes the drain).
    fn failing_long(&self, patience: Duration) -> Result<String, Option<Instant>> {
        if self.failing.is_empty() || !self.commits.is_empty() || self.frontier.has_advanced() {
            return Err(None);
        }
        let mut oldest = Vec::with_capacity(self.failing.len());
        for flush in &self.failing {
            oldest.push(flush.oldest().ok_or(None)?);
        }
        all_failing_for(&oldest, patience, Instant::now()).map_err(Some)
    }

    /// Everything taken in before the drain is processed, flushed and committed (`Durable`), or
    /// durable but not committed (`Uncommitted`), or what is left has been failing for `patience`
    /// (`FailingLong`).
    async fn drain_inner(&mut self, patience: Duration) -> Result<Drained, PipelineError> {
        while let Some(processed) = self.waiting.pop_front() {
            self.buffered(processed)?;
        }
        while let Some(progress) = self.processing.next().await {
            if let Progress::Ready(processed) = progress {
                for processed in
                    processed.map_err(|_| PipelineError::TaskDied("processing".into()))?
                {
                    self.buffered(processed)?;
                }
            }
        }
        // Commits go on while flushes end: what one flush made durable is committed while a
        // later one still waits on a slow sink, so a drain that then misses its deadline leaves
        // the next owner only what was not durable (a commit in flight when the drain began
        // would otherwise hold every later one back until the last flush ended).
        loop {
            // Revokes sent meanwhile are heard before anything more is flushed: nothing buffered
            // of a lost partition may be.
            self.take_revokes();
            if !self.buffer.is_empty() && self.flushes.len() < self.max_flushes {
                self.start_flush(CloseReason::Drain);
            }
            if self.flushes.is_empty() && self.buffer.is_empty() {
                break;
            }
            // Nothing left of this member's: the flushes under way hold only messages of
            // partitions lost meanwhile, their next owner's. Each stops before its next attempt,
            // or cuts its request under way, but a backoff or a recheck is still a wait, and
            // waiting for it — or giving up on it as failing — ended the drain in an error with
            // nothing held.
            if self.buffer.is_empty() && self.frontier.pending() == 0 {
                break;
            }
            let give_up_at = match self.failing_long(patience) {
                Ok(failing) => return Ok(Drained::FailingLong(failing)),
                Err(at) => at,
            };
            tokio::select! {
                biased;
                Some(revoke) = self.revokes.recv() => self.revoked_during_drain(revoke),
                Some(flushed) = self.flushes.join_next() => {
                    let flushed = flushed.map_err(|e| PipelineError::TaskDied(e.to_string()))?;
                    self.flushed(flushed)?;
                }
                Some(committed) = self.commits.join_next() => {
                    self.committed(committed.map_err(|e| PipelineError::TaskDied(e.to_string()))?);
                }
                // A write of a flush under way started failing, or every flush left has been
                // failing for the drain's patience.
                () = self.failing_changed.notified() => {}
                () = tokio::time::sleep_until(give_up_at.unwrap_or_else(Instant::now).into()), if give_up_at.is_some() => {}
                // A commit that failed is tried again while a flush still runs.
                () = tokio::time::sleep(DRAIN_COMMIT_RETRY), if self.frontier.has_advanced() => {
                    self.commit();
                }
            }
        }
        // Every flush is done: the commit in flight, then what is left. A failed commit is
        // tried again a few times (within the drain's deadline); if it still fails, the drain
        // says so: the offsets are read again by the next owner or the next start.
        // Revokes are heard meanwhile too: a commit the broker refused because the group had
        // dropped the member is followed by the loss, whose partitions the next attempt leaves out.
        for attempt in 1..=DRAIN_COMMIT_ATTEMPTS {
            self.take_revokes();
            self.commit();
            loop {
                tokio::select! {
                    biased;
                    Some(revoke) = self.revokes.recv() => self.revoked_during_drain(revoke),
                    committed = self.commits.join_next() => match committed {
                        Some(committed) => self.committed(
                            committed.map_err(|e| PipelineError::TaskDied(e.to_string()))?,
                        ),
                        None => break,
                    },
                }
            }
            if !self.frontier.has_advanced() {
                info!(pending = self.frontier.pending(), "drained");
                return Ok(Drained::Durable);
            }
            if attempt < DRAIN_COMMIT_ATTEMPTS {
                tokio::select! {
                    Some(revoke) = self.revokes.recv() => self.revoked_during_drain(revoke),
                    () = tokio::time::sleep(DRAIN_COMMIT_RETRY) => {}
                }
            }
        }
        Ok(Drained::Uncommitted)
    }

    /// The revokes already sent, heard now.
    fn take_revokes(&mut self) {
        while let Ok(revoke) = self.revokes.try_recv() {
            self.revoked_during_drain(revoke);
        }
    }

    fn publish_buffer(&self) {
        self.status
            .record_buffer(self.buffer.len(), self.buffer.bytes());
    }
}

/// The start of every partition of the consumed `topic`, created again, that the member `owned`
/// when it found out or owns now, committed: the next start (this member's or the partition's
/// next owner's) reads the new topic from there, not from the old topic's positions, which the
/// pipeline may have committed on it meanwhile. Offset 0: a new topic's partitions start there,
/// and a partition that no longer does is read from its earliest message
/// (`auto.offset.reset`). Three tries at most (a rebalance under way refuses a commit), waiting
/// `wait` in all.
async fn commit_the_start(
    consumer: &Arc<IngestConsumer>,
    topic: &str,
    owned: &[i32],
    wait: Duration,
) {
    const TRIES: u32 = 3;
    const RETRY_PAUSE: Duration = Duration::from_secs(1);
    let consumer = consumer.clone();
    let (name, mut partitions) = (topic.to_owned(), owned.to_vec());
    let committed = tokio::task::spawn_blocking(move || {
        let topic = name;
        if let Ok(assigned) = consumer.assignment() {
            partitions.extend(
                assigned
                    .elements_for_topic(&topic)
                    .iter()
                    .map(|p| p.partition()),
            );
        }
        partitions.sort_unstable();
        partitions.dedup();
        if partitions.is_empty() {
            return Ok(partitions);
        }
        let start = position_list(
            &topic,
            &partitions
                .iter()
                .map(|&p| Position::at(p, 0))
                .collect::<Vec<_>>(),
        );
        // The tries share `wait`: the exit must not outlast the pod's grace period.
        let deadline = Instant::now() + wait;
        let mut last = commit_within(&consumer, &start, wait);
        for _ in 1..TRIES {
            let Err(error) = &last else { break };
            let left = deadline.saturating_duration_since(Instant::now());
            if left < RETRY_PAUSE * 2 {
                break;
            }
            warn!(%error, "committing the start of the topic created again failed: trying again");
            std::thread::sleep(RETRY_PAUSE);
            last = commit_within(&consumer, &start, left - RETRY_PAUSE);
        }
        last.map(|()| partitions)
    })
    .await;
    match committed {
        Ok(Ok(partitions)) if partitions.is_empty() => {
            info!(%topic, "the member owned none of the partitions of the topic created again: nothing to commit")
        }
        Ok(Ok(partitions)) => warn!(
            %topic,
            ?partitions,
            "committed the start of the partitions of the topic created again: the next start reads them from there (what was read of them since is read again)"
        ),
        Ok(Err(error)) => error!(
            %topic,
            %error,
            "the start of the partitions of the topic created again could not be committed: the next start reads them from where the old topic's positions left them, skipping what lies before; reset the group's offsets on the topic to its earliest (kafka-consumer-groups --reset-offsets --to-earliest) with the group stopped"
        ),
        Err(error) => {
            error!(%error, "committing the start of the topic created again did not finish")
        }
    }
}

/// Whether flushes failing since `oldest` (each one's write failing longest: its sink, since
/// when) have all been failing for `patience` at `now`: `Ok` with what they fail on, each sink
/// with its longest (`"clickhouse failing for 25.1 s"`), or `Err` with when they all will have.
fn all_failing_for(
    oldest: &[(&'static str, Instant)],
    patience: Duration,
    now: Instant,
) -> Result<String, Instant> {
    let youngest = oldest.iter().map(|&(_, since)| since).max().unwrap_or(now);
    if now < youngest + patience {
        return Err(youngest + patience);
    }
    let mut failing: BTreeMap<&str, Duration> = BTreeMap::new();
    for &(sink, since) in oldest {
        let longest = failing.entry(sink).or_default();
        *longest = (*longest).max(now - since);
    }
    Ok(failing
        .into_iter()
        .map(|(sink, lasted)| format!("{sink} failing for {:.1} s", lasted.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", "))
}

/// `positions` less those of partitions lost (or abandoned) after `generation`, the last revoke
/// the pipeline handled. The loss callback records a loss at once, before the pipeline hears of
/// it: a commit started meanwhile would still carry the lost partitions' offsets. librdkafka
/// stamps a commit with the member's generation when it sends it, so one sent once the member
/// has rejoined carries the new generation, which the broker accepts whoever owns the partition
/// now. Landing after the next owner's own commit, it would move the group's offset back (what
/// lies between is read again: duplicates, never loss). Asked just before the commit is handed
/// to librdkafka, so what is left is the moment between the two.
fn not_lost_since(
    mut positions: Vec<Position>,
    ownership: &Ownership,
    generation: u64,
) -> Vec<Position> {
    positions.retain(|p| !ownership.lost_since(p.partition, generation));
    positions
}

/// The processing threads `configured` (`--processing-threads`) makes: 0 is one per CPU.
pub fn processing_threads(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    }
}

/// How many messages may wait for an earlier one to be durable before intake pauses: twice what
/// the open buffer and every flush slot hold at most, and never under a million. Flushes end in
/// any order, and the frontier commits only up to the oldest message not yet durable. When one
/// batch's flush is stuck (a failure only that batch meets, retried without end) while later ones
/// complete, intake would otherwise go on: the frontier would grow by 16 bytes a message without
/// bound (1.1 GB an hour at 20 000 messages a second), and so would what a restart reads again. A
/// flush that is only slow meets the bound if it lasts as long as a million messages take to
/// arrive.
pub fn max_uncommitted(buffer_messages: usize, max_flushes: usize) -> usize {
    buffer_messages
        .saturating_mul(max_flushes.saturating_add(1))
        .saturating_mul(2)
        .max(1_000_000)
}

/// The threads that made `left`, the entries a flush left in its batch: `threads` are those of
/// the entries at `offsets`, the batch before the flush took out the messages a stage refused
/// (the rest in order).
fn threads_left(offsets: &[(i32, i64)], threads: Vec<usize>, left: &[Entry]) -> Vec<usize> {
    if left.len() == threads.len() {
        return threads;
    }
    let mut left = left.iter().map(|e| (e.partition, e.offset)).peekable();
    offsets
        .iter()
        .zip(threads)
        .filter(|(at, _)| left.next_if_eq(at).is_some())
        .map(|(_, thread)| thread)
        .collect()
}

/// Frees a flushed batch on the processing threads that made its entries, each thread its own.
/// mimalloc frees a block of another thread's heap by pushing it onto a list that the owner
/// walks later, a cache miss on each side; freeing it in its own heap is a plain push. Freed on
/// the flush's thread instead, small segments cost 1.5 µs more per message, a fifth of all that
/// is not their processing (`docs/performance.md`). A thread takes its share after the task in
/// hand and before further messages (rayon runs broadcasts before injected work).
fn free_where_made<T: Send + 'static>(pool: &rayon::ThreadPool, made: Vec<T>, threads: Vec<usize>) {
    let count = pool.current_num_threads();
    let mut shares: Vec<Vec<T>> = (0..count).map(|_| Vec::new()).collect();
    for (item, thread) in made.into_iter().zip(threads) {
        shares[thread.min(count - 1)].push(item);
    }
    let shares: Arc<[Mutex<Vec<T>>]> = shares.into_iter().map(Mutex::new).collect();
    pool.spawn_broadcast(move |thread| {
        let mut share = shares[thread.index()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(std::mem::take(&mut *share));
    });
}

thread_local! {
    /// Each processing thread decompresses into a buffer it keeps between messages.
    static INFLATER: RefCell<recording::Inflater> = RefCell::default();
}

/// Runs the recording core on one message; an invalid one keeps its bytes for the dead-letter
/// topic. Returns the entry and the bytes it holds.
fn to_entry(record: Record, limits: &Limits, topic: &str) -> (Entry, usize) {
    let (partition, offset) = (record.partition, record.offset);
    let start = Instant::now();
    let result = INFLATER
        .with_borrow_mut(|inflater| recording::process_guarded(&record.value, limits, inflater));
    match result {
        Ok(processed) => {
            if let Some(why) = &processed.unread_body {
                // Stored as received, nothing read from it, as Sentry does; DEBUG like the dead
                // letters, so that a burst cannot flood the logs (`segment.unread` counts them).
                debug!(partition, offset, replay_id = %processed.ids.replay_id, segment_id = processed.ids.segment_id, detail = %why, "body stored unread: not a JSON array of events");
            }
            let bytes = processed.memory_bytes();
            metrics::processed_segment(&processed, bytes, start.elapsed());
            (
                Entry {
                    partition,
                    offset,
                    outcome: Outcome::Valid(Box::new(processed)),
                },
                bytes,
            )
        }
        Err(error) => {
            if error.reason == Reason::InternalError {
                // A bug, not bad input: someone must look. The message is kept on the DLQ.
                // Throttled: a bug that fails every message would write a line for each.
                if let Some(held_back) = crate::logs::INTERNAL_ERRORS.admit() {
                    // Read leniently, outside the guard the panic was caught by: not the decoder
                    // that may have panicked.
                    let replay_id = recording::envelope::owner(&record.value).map_or_else(
                        || "unknown".to_owned(),
                        |(_, replay)| replay.simple().to_string(),
                    );
                    error!(partition, offset, replay_id, detail = %error.detail, held_back, "processing failed: message dead-lettered as internal_error");
                }
            } else {
                // Expected bad input: counted and dead-lettered; DEBUG so a burst cannot flood the logs.
                debug!(partition, offset, reason = error.reason.as_str(), detail = %error.detail, "invalid message: to the dead-letter topic");
            }
            let bytes = record.bytes();
            let invalid = InvalidMessage {
                error,
                value: Vec::from(record.value),
                key: record.key,
                topic: topic.to_owned(),
                timestamp: record.timestamp,
                rejected_by: None,
                original_lost: false,
                redriven_from: record.redriven_from,
            };
            (
                Entry {
                    partition,
                    offset,
                    outcome: Outcome::Invalid(Box::new(invalid)),
                },
                bytes,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_leaves_out_partitions_lost_since_the_last_revoke_the_pipeline_handled() {
        let ownership = Ownership::default();
        ownership.gain(&[0, 1, 2]);
        let handled = ownership.generation();
        let at = |pairs: &[(i32, i64)]| -> Vec<Position> {
            pairs
                .iter()
                .map(|&(p, offset)| Position::at(p, offset))
                .collect()
        };
        let positions = at(&[(0, 10), (1, 20), (2, 30)]);
        assert_eq!(
            not_lost_since(positions.clone(), &ownership, handled),
            positions
        );
        // Partition 1 lost: recorded by the callback, not yet handled by the pipeline.
        ownership.revoke(&[1], true);
        assert_eq!(
            not_lost_since(positions.clone(), &ownership, handled),
            at(&[(0, 10), (2, 30)])
        );
        // A revoke (not a loss) whose drain ended in time leaves the offsets to the pipeline.
        ownership.revoke(&[2], false);
        assert_eq!(
            not_lost_since(positions.clone(), &ownership, handled),
            at(&[(0, 10), (2, 30)])
        );
        // Once handled, and assigned again, the partition's later offsets are this member's.
        ownership.gain(&[1]);
        let after = ownership.generation();
        assert_eq!(
            not_lost_since(positions.clone(), &ownership, after),
            positions
        );
    }

    #[test]
    fn a_drain_gives_up_once_every_flush_has_been_failing_for_its_patience() {
        let now = Instant::now();
        let ago = |secs: u64| now - Duration::from_secs(secs);
        let patience = Duration::from_secs(20);
        assert_eq!(
            all_failing_for(&[("clickhouse", ago(25)), ("gcs", ago(5))], patience, now),
            Err(ago(5) + patience),
            "a flush failing for 5 s (a blip, perhaps) gets the rest of the drain's patience"
        );
        assert_eq!(
            all_failing_for(
                &[
                    ("clickhouse", ago(25)),
                    ("gcs", ago(21)),
                    ("clickhouse", ago(30))
                ],
                patience,
                now
            ),
            Ok("clickhouse failing for 30.0 s, gcs failing for 21.0 s".to_owned()),
            "every flush failing for longer: each sink with its longest"
        );
        assert_eq!(
            all_failing_for(&[("rows", ago(20))], patience, now),
            Ok("rows failing for 20.0 s".to_owned()),
            "exactly the patience is enough"
        );
    }

    /// Tells, when dropped, the thread it was made on and the one it is dropped on.
    struct Made {
        thread: usize,
        dropped: std::sync::mpsc::Sender<(usize, Option<usize>)>,
    }

    impl Drop for Made {
        fn drop(&mut self) {
            let _ = self
                .dropped
                .send((self.thread, rayon::current_thread_index()));
        }
    }

    #[test]
    fn what_may_wait_to_be_committable_is_twice_what_buffer_and_flushes_hold_and_at_least_a_million()
     {
        assert_eq!(
            max_uncommitted(1000, 2),
            1_000_000,
            "the defaults: the floor"
        );
        assert_eq!(max_uncommitted(200_000, 4), 2_000_000);
        assert_eq!(max_uncommitted(usize::MAX, 4), usize::MAX, "no overflow");
    }

    /// A record's key is held with it, dead-lettered: counted (a producer writing straight to
    /// the topic can send an empty value under a key of megabytes, counted as nothing).
    #[test]
    fn an_invalid_message_counts_its_key() {
        let record = Record {
            partition: 0,
            offset: 1,
            value: bytes::Bytes::new(),
            key: Some(vec![b'k'; 1 << 20]),
            timestamp: None,
            redriven_from: None,
            leader_epoch: None,
        };
        assert_eq!(record.bytes(), 1 << 20);
        let (entry, bytes) = to_entry(record, &Limits::default(), "topic");
        assert!(matches!(entry.outcome, Outcome::Invalid(_)));
        assert!(bytes >= 1 << 20, "{bytes} bytes counted");
    }

    #[test]
    fn the_entries_a_flush_left_keep_the_threads_that_made_them() {
        let offsets = [(0, 1), (0, 2), (1, 7), (1, 8), (0, 3)];
        let left: Vec<Entry> = [(0, 2), (1, 8)]
            .into_iter()
            .map(|(partition, offset)| Entry::invalid_for_test(partition, offset))
            .collect();
        assert_eq!(
            threads_left(&offsets, vec![0, 1, 0, 1, 1], &left),
            [1, 1],
            "the threads of (0, 2) and (1, 8)"
        );
    }

    #[test]
    fn a_flushed_batch_is_freed_on_the_threads_that_made_it() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let (dropped, drops) = std::sync::mpsc::channel();
        let made: Vec<Made> = (0..300)
            .map(|i| Made {
                thread: i % 3,
                dropped: dropped.clone(),
            })
            .collect();
        let threads = made.iter().map(|m| m.thread).collect();
        drop(dropped);
        free_where_made(&pool, made, threads);
        let drops: Vec<_> = drops.iter().collect();
        assert_eq!(drops.len(), 300);
        for (made_on, dropped_on) in drops {
            assert_eq!(Some(made_on), dropped_on);
        }
    }
}
