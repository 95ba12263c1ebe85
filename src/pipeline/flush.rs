//! The flush: writes one batch through every sink, stage by stage, retrying each failed sink with
//! capped, jittered exponential backoff. Runs on a blocking thread of the pool, which drives each
//! stage with one `Handle::block_on`: the sinks' writes, their requests and their backoff are
//! futures on this thread (a sink backing off holds no thread of its own).
//!
//! Stages run in order (blobs before anything that points at them); the sinks of one stage run
//! concurrently. A sink that succeeded is not written again when a sibling retries. A retryable
//! failure (an outage) is retried without limit unless `--flush-max-attempts` sets one: the
//! service rides out an outage with intake paused instead of exiting into a restart loop. Every
//! attempt that ends is progress for the liveness watchdog; failures are reported as an outage
//! of that sink (`/status`, `sink.outage_ms`) until it succeeds again.
//!
//! Each sink's write keeps its [`Progress`] across retries: what a failed attempt stored is not
//! written again, and every request that ends is progress (a hung destination whose requests
//! time out one after another is retrying, not wedged).
//!
//! When a sink rejects data, the flush halves the batch (and halves again) until each rejected
//! message stands alone; those are dead-lettered with reason `rejected_by_sink`, the rest is
//! written, and the batch commits. A message a stage refuses is left out of the later stages
//! (no row or event for a blob that was not stored; a re-drive writes them once). Which stages
//! there are, and why in that order, is `service::sinks`'s. A sink that
//! refuses many messages in a row (`--misconfigured-at-refusals`, 10 by default), accepting none
//! in between, over one flush or several, is not refusing data but misconfigured: that stops the
//! flush like any fatal error. A few refused prove nothing (on a quiet topic a batch may hold only
//! two hostile messages): they are dead-lettered, and since the count starts again with the
//! process, a restart after a stop goes on past the messages of earlier flushes. A sink that
//! panics (a bug, which some value of a message triggers) is narrowed down the same way, and the
//! message that makes it panic is dead-lettered as `internal_error`.
//!
//! A partition the member loses while the flush runs (the group gave it to another member, which
//! reads it again from the last commit) is written no further: its messages are left out of the
//! stages still to run, and a write stops before its next attempt (a retry through an outage, a
//! half of a batch a sink refused) once everything it writes is of such partitions — or, within
//! [`GONE_RECHECK`], during an attempt: the request under way is cut, so that a flush of nothing
//! of its own does not hold its slot until a hung destination's timeout (a request that blocks
//! its thread — a filesystem write, a refused message read again from the topic — ends first). The flush reports them
//! as given up, and their offsets are not completed. What an attempt wrote before the loss stays
//! (blobs and rows are idempotent); billing outcomes and occurrences, in the last stage, go out
//! beside the new owner's only for a loss during an attempt of their own write (a delivery
//! already handed to librdkafka is sent even when its attempt is cut).

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::try_join_all;
use rand::RngExt;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tracing::{error, info, warn};

use crate::health::Status;
use crate::recording::panic_message;
use crate::sink::{
    Batch, DeadLetters, Entry, Progress, Rejected, Retry, Sink, SinkError, Writing, Written,
};

/// Sinks grouped into ordered stages, and where messages a sink rejects are dead-lettered.
pub struct Sinks {
    stages: Vec<Vec<Box<dyn Sink>>>,
    /// `None`: a rejection is fatal (nowhere to put the message).
    rejections: Option<Box<dyn DeadLetters>>,
    /// Per sink, the messages it refused since it last accepted one, over every flush so far.
    refused_in_a_row: Mutex<HashMap<&'static str, usize>>,
}

impl Sinks {
    /// The Kafka topics the sinks write.
    pub fn written_topics(&self) -> Vec<String> {
        self.stages
            .iter()
            .flatten()
            .flat_map(|s| s.topics())
            .collect()
    }

    /// Sinks whose rejections are fatal.
    pub fn new(stages: Vec<Vec<Box<dyn Sink>>>) -> Self {
        Sinks {
            stages,
            rejections: None,
            refused_in_a_row: Mutex::default(),
        }
    }

    /// Sinks whose rejected messages are dead-lettered through `dead_letters`.
    pub fn dead_lettering(
        stages: Vec<Vec<Box<dyn Sink>>>,
        dead_letters: Box<dyn DeadLetters>,
    ) -> Self {
        Sinks {
            rejections: Some(dead_letters),
            ..Sinks::new(stages)
        }
    }

    /// Counts what `sink` refused of `batch` (`refused` of the messages it writes for, the rest
    /// accepted, or dead-lettered for a panic); fatal once it refused `policy.misconfigured_at`
    /// in a row. Messages of partitions `lost` meanwhile count as neither: their write may have
    /// stopped unwritten.
    fn count_refusals(
        &self,
        sink: &dyn Sink,
        batch: &[Entry],
        rejected: &[Rejected],
        policy: &RetryPolicy,
        lost: Lost,
    ) -> Result<(), SinkError> {
        let refused = rejected
            .iter()
            .filter(|r| r.error.retry == Retry::Rejected)
            .count();
        let concerned = batch
            .iter()
            .filter(|e| sink.writes_for(e) && !lost(e.partition))
            .count();
        let mut counts = self
            .refused_in_a_row
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let in_a_row = counts.entry(sink.name()).or_default();
        if concerned > rejected.len() {
            *in_a_row = 0;
            return Ok(());
        }
        *in_a_row += refused;
        // Only a flush with refusals of its own stops (a concurrent one may have reached the
        // count first).
        let first = match rejected.iter().find(|r| r.error.retry == Retry::Rejected) {
            Some(first) if policy.misconfigured_at > 0 && *in_a_row >= policy.misconfigured_at => {
                &first.error
            }
            _ => return Ok(()),
        };
        let count = *in_a_row;
        Err(SinkError::new(
            sink.name(),
            Retry::Fatal,
            format_args!(
                "refused the last {count} messages it was given ({refused} of this batch) and accepted none, so the sink is taken for misconfigured (if the data is at fault, --misconfigured-at-refusals 0 dead-letters them instead): {}",
                first.message
            ),
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per sink per flush, the first included; 0: unlimited.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// A sink that refuses this many messages in a row, over one flush or several, accepting none
    /// in between, is taken for misconfigured: the flush stops (fatal). 0: never.
    pub misconfigured_at: usize,
}

impl RetryPolicy {
    /// Full-jitter backoff before retry number `retry` (1-based): uniform in
    /// `[0, min(max_backoff, initial_backoff × 2^(retry-1))]`.
    pub fn backoff(&self, retry: u32, unit_random: f64) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)));
        exp.min(self.max_backoff)
            .mul_f64(unit_random.clamp(0.0, 1.0))
    }
}

/// One sink's part in a successful flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkReport {
    pub sink: &'static str,
    /// Time spent, retries included.
    pub took: Duration,
    pub retries: u32,
    pub written: Written,
}

/// Per-sink reports of a successful flush, in stage order, the messages dead-lettered because a
/// sink rejected them, and those left to their next owner.
#[derive(Debug, Default)]
pub struct FlushReport {
    pub sinks: Vec<SinkReport>,
    pub rejected: Vec<Rejected>,
    /// `(partition, offset)` of the messages of partitions lost while the flush ran, which it
    /// wrote no further: not durable, and no longer this member's to commit. Sorted, once each.
    pub given_up: Vec<(i32, i64)>,
}

/// Whether a partition was lost since the flush began (asked between stages and between retries).
pub type Lost<'a> = &'a (dyn Fn(i32) -> bool + Sync);

/// What a flush asks, before each write attempt, of what the member owns.
#[derive(Clone, Copy)]
pub struct Owner<'a> {
    /// Whether a partition was lost since the flush's messages were polled.
    pub lost: Lost<'a>,
    /// Whether writes wait for now: the member cannot tell whether it still owns its partitions
    /// (`kafka::coordinator`).
    pub held: &'a (dyn Fn() -> bool + Sync),
}

impl Owner<'_> {
    /// Where a write stands before an attempt, from the partitions of the messages it holds.
    fn standing(&self, partitions: impl Iterator<Item = i32> + Clone) -> Standing {
        match self.losses(partitions.clone()) {
            Some(lost) => lost,
            None if (self.held)() => Standing::Held,
            // Released: the coordinator's answer that released the writes records the losses it
            // brought first (`Ownership::revoke`), so a second look sees them. Read before the
            // release, they were not there yet, and the write went on with partitions the
            // broker had given away.
            None => self.losses(partitions).unwrap_or(Standing::Owned),
        }
    }

    /// `Gone` or `Shrunk` when some of `partitions` were lost; `None` when none was.
    fn losses(&self, partitions: impl Iterator<Item = i32>) -> Option<Standing> {
        let (mut ours, mut lost) = (false, false);
        for partition in partitions {
            match (self.lost)(partition) {
                true => lost = true,
                false => ours = true,
            }
        }
        match (ours, lost) {
            (false, true) => Some(Standing::Gone),
            (true, true) => Some(Standing::Shrunk),
            _ => None,
        }
    }
}

/// Where a write stands before an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Owned,
    /// Nothing is written for now (see [`Owner::held`]).
    Held,
    /// Every message it holds is of partitions lost meanwhile.
    Gone,
    /// Some of the messages it holds, not all, are of partitions lost meanwhile: the write goes
    /// on with the others alone. Retried whole, it would write the lost ones beside their next
    /// owner — billing outcomes and dead letters twice — after a revoke had given them up.
    Shrunk,
}

/// How [`write_with_retries`] ended, short of failing.
enum Wrote {
    /// Written, or given up whole (every message of lost partitions).
    Done(SinkReport),
    /// Stopped before attempt `next`: some of its messages are of lost partitions
    /// ([`Standing::Shrunk`]). The caller goes on with the others, from that attempt, with the
    /// same [`Progress`] (what is stored is not written again); `retries` failed attempts were
    /// made.
    Shrunk { next: u32, retries: u32 },
}

/// How often a held write asks again.
const HELD_RECHECK: Duration = Duration::from_millis(250);

/// What one flush is failing on right now: each write from its first failed attempt until it
/// ends (written, given up or failed for good), with the instant it started failing. A revoke's
/// drain reads it to tell a flush that may still finish from one retrying through an outage
/// (`Pipeline::failing_long`); `changed` is told of every write that starts failing.
pub struct Failing {
    writes: Mutex<Vec<(&'static str, Instant)>>,
    changed: Arc<Notify>,
}

impl Failing {
    pub fn new(changed: Arc<Notify>) -> Self {
        Failing {
            writes: Mutex::default(),
            changed,
        }
    }

    /// The write failing longest (its sink, and since when); `None` while none is failing.
    pub fn oldest(&self) -> Option<(&'static str, Instant)> {
        self.lock().iter().copied().min_by_key(|&(_, since)| since)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Instant)>> {
        self.writes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One write's place in [`Failing`] (and among the writes [`Status`] counts as failing), from
/// its first failed attempt — or its start, during an outage of its sink — until it is dropped
/// (however the write ends).
struct FailingWrite<'a> {
    failing: &'a Failing,
    status: &'a Status,
    sink: &'static str,
    since: Option<Instant>,
}

impl FailingWrite<'_> {
    /// An attempt failed, the sink having been failing for `outage` (whichever flush it began
    /// in): the write is failing since the outage began, if it is not already. (A flush started
    /// during a long outage is failing as long as the outage, from its first failed attempt on.)
    fn failed(&mut self, outage: Duration) {
        if self.since.is_none() {
            let now = Instant::now();
            let since = now.checked_sub(outage).unwrap_or(now);
            self.since = Some(since);
            self.failing.lock().push((self.sink, since));
            self.status.write_failing(self.sink, true);
            self.failing.changed.notify_one();
        }
    }
}

impl Drop for FailingWrite<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            let mut writes = self.failing.lock();
            if let Some(at) = writes.iter().position(|&w| w == (self.sink, since)) {
                writes.swap_remove(at);
            }
            self.status.write_failing(self.sink, false);
        }
    }
}

/// Writes `batch` through every stage, from a thread of the blocking pool of `runtime` (never
/// one of its async workers). `Err` means a sink failed fatally or ran out of attempts: nothing
/// of this batch may be committed. The messages a stage rejects, and those of partitions the
/// `owner` lost meanwhile, are taken out of `batch` before the next stage (and dropped here);
/// while the `owner` holds writes, none is attempted.
pub fn flush(
    runtime: &Handle,
    batch: &mut Batch,
    sinks: &Sinks,
    policy: &RetryPolicy,
    status: &Status,
    owner: Owner,
    failing: &Failing,
) -> Result<FlushReport, SinkError> {
    runtime.block_on(flush_stages(batch, sinks, policy, status, owner, failing))
}

async fn flush_stages(
    batch: &mut Batch,
    sinks: &Sinks,
    policy: &RetryPolicy,
    status: &Status,
    owner: Owner<'_>,
    failing: &Failing,
) -> Result<FlushReport, SinkError> {
    let lost = owner.lost;
    let mut report = FlushReport::default();
    for stage in &sinks.stages {
        leave_out_lost(
            &mut batch.entries,
            |e| (e.partition, e.offset),
            lost,
            &mut report.given_up,
        );
        // Every message given up, its partition lost: a later stage would still make its
        // requests — the event sinks read their topics' limits from the brokers — for nothing.
        if batch.entries.is_empty() && !report.given_up.is_empty() {
            break;
        }
        let entries: &[Entry] = batch;
        // The first write of the stage to fail for good ends the others: the flush fails, and a
        // sibling retrying through an outage would hold that error (a configuration stop) back
        // for as long as the outage lasts.
        let writes = stage.iter().map(|sink| async move {
            let sink = sink.as_ref();
            let (written, rejected) =
                write_isolating(sink, entries, policy, status, owner, failing).await?;
            sinks.count_refusals(sink, entries, &rejected, policy, lost)?;
            Ok::<_, SinkError>((written, rejected))
        });
        let mut refused_here = Vec::new();
        for (written, rejected) in try_join_all(writes).await? {
            report.sinks.push(written);
            refused_here.extend(rejected);
        }
        if !refused_here.is_empty() {
            // Later stages point at what earlier ones wrote (rows and events at blobs), and a
            // re-drive writes it all again (`service::sinks` orders the stages for that): a
            // message refused here is dead-lettered whole and written by none of them.
            let out: HashSet<(i32, i64)> = refused_here
                .iter()
                .map(|r| (r.partition, r.offset))
                .collect();
            batch
                .entries
                .retain(|e| !out.contains(&(e.partition, e.offset)));
            // A lost partition's refused messages are its next owner's to dead-letter (two sinks
            // may refuse the same one: `dead_letter` and the end of the flush keep one of each).
            leave_out_lost(
                &mut refused_here,
                |r| (r.partition, r.offset),
                lost,
                &mut report.given_up,
            );
            if refused_here.is_empty() {
                continue;
            }
            // Dead-lettered before the next stage runs: a dead-letter path that fails stops the
            // flush before later stages wrote the batch's other messages — billing outcomes
            // among them, which the batch's next flush (after the restart) would send again.
            let given_up = &mut report.given_up;
            let dead_lettered = dead_letter(
                &mut refused_here,
                given_up,
                sinks,
                policy,
                status,
                owner,
                failing,
            );
            report.sinks.push(dead_lettered.await?);
            // The dead-letter write may have stopped because their partitions were lost.
            leave_out_lost(
                &mut refused_here,
                |r| (r.partition, r.offset),
                lost,
                &mut report.given_up,
            );
            report.rejected.extend(refused_here);
        }
    }
    // A write of the last stage may have stopped because its partitions were lost: what it
    // left unwritten must not be completed.
    leave_out_lost(
        &mut batch.entries,
        |e| (e.partition, e.offset),
        lost,
        &mut report.given_up,
    );
    report.given_up.sort_unstable();
    report.given_up.dedup();
    Ok(report)
}

/// Takes out of `items` those (at `(partition, offset)`) of partitions `lost` since the flush
/// began, into `given_up`.
fn leave_out_lost<T>(
    items: &mut Vec<T>,
    at: impl Fn(&T) -> (i32, i64),
    lost: Lost,
    given_up: &mut Vec<(i32, i64)>,
) {
    items.retain(|item| {
        let (partition, offset) = at(item);
        let ours = !lost(partition);
        if !ours {
            given_up.push((partition, offset));
        }
        ours
    });
}

/// Dead-letters what one stage refused, each message once (two sinks of a stage may refuse the
/// same one); fails fatally when there is no dead-letter path. Stops, as a sink's write does,
/// once every message it holds is of partitions lost, and leaves those lost meanwhile out of
/// its retries (into `given_up`).
async fn dead_letter(
    refused: &mut Vec<Rejected>,
    given_up: &mut Vec<(i32, i64)>,
    sinks: &Sinks,
    policy: &RetryPolicy,
    status: &Status,
    owner: Owner<'_>,
    failing: &Failing,
) -> Result<SinkReport, SinkError> {
    let Some(dead_letters) = &sinks.rejections else {
        let first = &refused[0].error;
        return Err(SinkError::new(
            first.sink,
            Retry::Fatal,
            format_args!("rejected, and no dead-letter path: {}", first.message),
        ));
    };
    refused.sort_by_key(|r| (r.partition, r.offset));
    refused.dedup_by_key(|r| (r.partition, r.offset));
    let start = Instant::now();
    let progress = Progress::new(REJECTED_SINK, status);
    let (mut attempt, mut retries) = (1, 0);
    loop {
        let wrote = {
            let sink = RejectionSink {
                dead_letters: dead_letters.as_ref(),
                rejected: refused,
            };
            let standing = || owner.standing(sink.rejected.iter().map(|r| r.partition));
            write_with_retries(
                &sink,
                &[],
                &progress,
                policy,
                status,
                &standing,
                failing,
                attempt,
            )
            .await
            .map_err(nowhere_to_keep)?
        };
        match wrote {
            Wrote::Done(report) => {
                return Ok(SinkReport {
                    took: start.elapsed(),
                    retries: retries + report.retries,
                    ..report
                });
            }
            Wrote::Shrunk {
                next,
                retries: made,
            } => {
                (attempt, retries) = (next, retries + made);
                leave_out_lost(refused, |r| (r.partition, r.offset), owner.lost, given_up);
            }
        }
    }
}

/// A dead letter the dead-letter path itself refused (GCS refusing the copy of one too large for
/// the topic) or panicked on has nowhere else to go: the flush stops, saying so, as on a
/// dead-letter path it may not write to. (Halving is for a sink's refusals, which the
/// dead-letter path takes; it has no path of its own.)
fn nowhere_to_keep(mut error: SinkError) -> SinkError {
    if matches!(error.retry, Retry::Rejected | Retry::Panicked) {
        error.retry = Retry::Fatal;
        error.message = format!(
            "the dead-letter path refused a dead letter, and there is nowhere else to keep it: {}",
            error.message
        );
    }
    error
}

/// The dead-letter path's name as a sink (`/status`, metrics, logs).
const REJECTED_SINK: &str = "rejected";

/// The dead-letter path for rejected messages, as a sink the retry loop can drive.
struct RejectionSink<'a> {
    dead_letters: &'a dyn DeadLetters,
    rejected: &'a [Rejected],
}

impl Sink for RejectionSink<'_> {
    fn name(&self) -> &'static str {
        REJECTED_SINK
    }
    fn write<'a>(&'a self, _: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        self.dead_letters.dead_letter(self.rejected, progress)
    }
}

/// Writes `batch` through `sink`; when the sink rejects data, halves the batch until each
/// rejected message stands alone. Returns the report and the rejected messages.
async fn write_isolating(
    sink: &dyn Sink,
    batch: &[Entry],
    policy: &RetryPolicy,
    status: &Status,
    owner: Owner<'_>,
    failing: &Failing,
) -> Result<(SinkReport, Vec<Rejected>), SinkError> {
    let start = Instant::now();
    let (mut retries, mut written, mut rejected) = (0, Written::default(), Vec::new());
    let progress = Progress::new(sink.name(), status);
    // Each part with the attempt it starts from (a part split off a shrunk write goes on
    // counting its attempts; a half split off to find a rejected message starts again).
    let mut parts = vec![(batch, 1)];
    while let Some((part, attempt)) = parts.pop() {
        let standing = || {
            owner.standing(
                part.iter()
                    .filter(|e| sink.writes_for(e))
                    .map(|e| e.partition),
            )
        };
        let wrote = write_with_retries(
            sink, part, &progress, policy, status, &standing, failing, attempt,
        );
        match wrote.await {
            Ok(Wrote::Done(report)) => {
                retries += report.retries;
                written += report.written;
            }
            Ok(Wrote::Shrunk {
                next,
                retries: made,
            }) => {
                retries += made;
                // The runs of messages still this member's, in order; the flush leaves the
                // others out after the stage.
                let runs = part.split(|e| (owner.lost)(e.partition));
                parts.extend(
                    runs.filter(|run| !run.is_empty())
                        .rev()
                        .map(|run| (run, next)),
                );
            }
            Err(error) if error.retry.pins_messages() => {
                let mut concerned = part.iter().filter(|e| sink.writes_for(e));
                match (concerned.next(), concerned.next()) {
                    (Some(entry), None) => {
                        let (partition, offset) = (entry.partition, entry.offset);
                        // One per message refused: a sink refusing one in a hundred would
                        // write a line for each (`messages.invalid` counts them all).
                        if error.retry == Retry::Panicked {
                            if let Some(held_back) = crate::logs::SINK_PANICS.admit() {
                                error!(sink = sink.name(), partition, offset, %error, held_back, "a sink panicked on this message (a bug): to the dead-letter topic as internal_error");
                            }
                        } else if let Some(held_back) = crate::logs::REJECTED.admit() {
                            warn!(sink = sink.name(), partition, offset, %error, held_back, "message rejected: to the dead-letter topic");
                        }
                        rejected.push(Rejected {
                            partition,
                            offset,
                            error,
                            original: crate::sink::Original::of(entry),
                        });
                    }
                    // Nothing in this part is the sink's to write, so no message can be blamed
                    // (and halving it again would never end): the sink's own fault.
                    (None, _) => {
                        return Err(SinkError::new(
                            sink.name(),
                            Retry::Fatal,
                            format_args!(
                                "failed a write that holds none of its messages, so no message is to blame: {}",
                                error.message
                            ),
                        ));
                    }
                    (Some(_), Some(_)) => {
                        let (first, second) = part.split_at(part.len() / 2);
                        parts.push((second, 1));
                        parts.push((first, 1));
                    }
                }
            }
            Err(error) => return Err(error),
        }
    }
    Ok((
        SinkReport {
            sink: sink.name(),
            took: start.elapsed(),
            retries,
            written,
        },
        rejected,
    ))
}

/// How often a write under way asks whether every message it holds was lost meanwhile.
const GONE_RECHECK: Duration = Duration::from_millis(250);

/// Ends once `standing` says every message the write holds is of partitions lost meanwhile.
async fn until_gone(standing: &dyn Fn() -> Standing) {
    loop {
        tokio::time::sleep(GONE_RECHECK).await;
        if standing() == Standing::Gone {
            return;
        }
    }
}

/// `Done` also when, before an attempt, while one is under way (it is cut) or once attempts run
/// out, `standing` says every message the write holds is of partitions lost since the flush began: nothing of it is this member's to
/// write any more (the report says nothing written, and the flush gives those messages up).
/// `Shrunk` when, before an attempt, it says some of them are. While it says writes are held,
/// no attempt is made. Attempts are counted from `attempt` (a write going on after it shrank).
#[allow(clippy::too_many_arguments)]
async fn write_with_retries(
    sink: &dyn Sink,
    batch: &[Entry],
    progress: &Progress<'_>,
    policy: &RetryPolicy,
    status: &Status,
    standing: &dyn Fn() -> Standing,
    failing: &Failing,
    mut attempt: u32,
) -> Result<Wrote, SinkError> {
    let start = Instant::now();
    let first = attempt;
    let mut failing = FailingWrite {
        failing,
        status,
        sink: sink.name(),
        since: None,
    };
    // A write that starts while its sink is in an outage (a flush started while others retry,
    // the rest of a write a revoke shrank) fails with them, from the outage's start: a drain
    // waited out its first attempt — a whole request timeout, against a hung destination —
    // before it could give up on an outage it already knew of.
    if let Some(outage) = status.sink_outage(sink.name()) {
        failing.failed(outage);
    }
    // `attempts`: made in all, this call's and those before it.
    let abandoned = |attempts: u32, failing: FailingWrite<'_>| {
        drop(failing);
        warn!(
            sink = sink.name(),
            attempts,
            "every message this write holds is of partitions lost meanwhile: left to their next owner, not retried"
        );
        // The outage its failed attempts (or the failed requests of the attempt cut) showed is
        // no longer measured, unless another write to the sink is failing: left standing, it
        // would read as one (`/status`, `sink.outage_ms`, which pages past a minute) until the
        // sink next writes — for the dead-letter path of refused messages, perhaps days. Ended
        // while other writes fail, it read as over (and as begun anew at their next failure)
        // while the sink was still down.
        if !status.writes_failing(sink.name()) {
            status.sink_recovered(sink.name());
        }
        Ok(Wrote::Done(SinkReport {
            sink: sink.name(),
            took: start.elapsed(),
            retries: attempts + 1 - first,
            written: Written::default(),
        }))
    };
    loop {
        match standing() {
            Standing::Gone => return abandoned(attempt - 1, failing),
            Standing::Held => {
                tokio::time::sleep(HELD_RECHECK).await;
                // Waiting by design, not a stall.
                status.flush_progress();
                continue;
            }
            Standing::Shrunk => {
                return Ok(Wrote::Shrunk {
                    next: attempt,
                    retries: attempt - first,
                });
            }
            Standing::Owned => {}
        }
        // A panic while the sink builds or writes is caught here, so that it can be pinned on
        // one message like a rejection (the panic hook has logged where). Only this sink's
        // write unwinds: its siblings in the stage are futures of their own.
        progress.new_attempt();
        let write = std::panic::catch_unwind(AssertUnwindSafe(|| sink.write(batch, progress)));
        let result = match write {
            // A request under way once every message it holds is lost is cut (the future
            // dropped: the upload or INSERT aborted, a delivery left to librdkafka): the flush
            // holds its slot until it ends, and a request to a hung destination lasts up to its
            // timeout — a revoke's or a shutdown's drain waited that long behind it, the next
            // owner's messages buffered and no slot free to flush them.
            Ok(write) => tokio::select! {
                biased;
                result = AssertUnwindSafe(write).catch_unwind() => result,
                // The attempt cut is not counted as failed: a first one ends no outage its
                // requests opened while another write still waits on the sink.
                () = until_gone(standing) => return abandoned(attempt - 1, failing),
            },
            Err(panic) => Err(panic),
        }
        .unwrap_or_else(|panic| {
            Err(SinkError::new(
                sink.name(),
                Retry::Panicked,
                format_args!("panicked: {}", panic_message(&*panic)),
            ))
        });
        status.flush_progress();
        match result {
            Ok(written) => {
                if let Some(lasted) = status.sink_recovered(sink.name()) {
                    // Good news: INFO, closing the WARNs of the attempts that failed.
                    info!(
                        sink = sink.name(),
                        outage_ms = lasted.as_millis() as u64,
                        "sink recovered"
                    );
                }
                return Ok(Wrote::Done(SinkReport {
                    sink: sink.name(),
                    took: start.elapsed(),
                    retries: attempt - first,
                    written,
                }));
            }
            Err(error)
                if error.retry == Retry::Retryable
                    && (policy.max_attempts == 0 || attempt < policy.max_attempts) =>
            {
                let failing_for = status.sink_failed(sink.name(), &error.message);
                failing.failed(failing_for);
                crate::metrics::retrying(sink.name());
                let pause = policy.backoff(attempt, rand::rng().random::<f64>());
                warn!(sink = sink.name(), attempt, backoff_ms = pause.as_millis() as u64, %error, "sink write failed; retrying");
                tokio::time::sleep(pause).await;
                // The backoff is waiting by design, not a stall.
                status.flush_progress();
                attempt = attempt.saturating_add(1);
            }
            // Out of attempts, but none of it is this member's to write any more.
            Err(error) if error.retry == Retry::Retryable && standing() == Standing::Gone => {
                return abandoned(attempt, failing);
            }
            // Recorded as the flush's failure where the flush ends.
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Flushes from this thread on a runtime of its own, as the pipeline does from the blocking
    /// pool (the multi-threaded runtime drives the timers that backoff waits on).
    fn run(
        entries: Vec<Entry>,
        sinks: &Sinks,
        policy: &RetryPolicy,
        status: &Status,
    ) -> Result<FlushReport, SinkError> {
        run_losing(entries, sinks, policy, status, &|_| false)
    }

    /// Never held.
    fn owner(lost: Lost) -> Owner {
        Owner {
            lost,
            held: &|| false,
        }
    }

    /// [`run`], with partitions lost as `lost` says.
    fn run_losing(
        entries: Vec<Entry>,
        sinks: &Sinks,
        policy: &RetryPolicy,
        status: &Status,
        lost: Lost,
    ) -> Result<FlushReport, SinkError> {
        let failing = Failing::new(Arc::default());
        run_failing(entries, sinks, policy, status, owner(lost), &failing)
    }

    /// [`run_losing`], telling `failing` of the writes that fail.
    fn run_failing(
        entries: Vec<Entry>,
        sinks: &Sinks,
        policy: &RetryPolicy,
        status: &Status,
        owner: Owner,
        failing: &Failing,
    ) -> Result<FlushReport, SinkError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        flush(
            runtime.handle(),
            &mut Batch { entries },
            sinks,
            policy,
            status,
            owner,
            failing,
        )
    }

    const FAST: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
        misconfigured_at: 4,
    };

    /// Fails with `retry` for its first `failures` writes, and logs every write.
    struct Flaky {
        name: &'static str,
        failures: u32,
        retry: Retry,
        calls: AtomicU32,
        log: &'static Mutex<Vec<&'static str>>,
    }

    impl Sink for Flaky {
        fn name(&self) -> &'static str {
            self.name
        }
        fn write<'a>(&'a self, _: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                self.log.lock().unwrap().push(self.name);
                if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
                    Err(SinkError::new(self.name, self.retry, "boom"))
                } else {
                    Ok(Written { items: 1, bytes: 2 })
                }
            })
        }
    }

    fn flaky(
        name: &'static str,
        failures: u32,
        retry: Retry,
        log: &'static Mutex<Vec<&'static str>>,
    ) -> Box<dyn Sink> {
        Box::new(Flaky {
            name,
            failures,
            retry,
            calls: AtomicU32::new(0),
            log,
        })
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_is_jittered() {
        let p = RetryPolicy {
            max_attempts: 9,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            misconfigured_at: 10,
        };
        assert_eq!(p.backoff(1, 1.0), Duration::from_millis(100));
        assert_eq!(p.backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(p.backoff(10, 1.0), Duration::from_secs(1));
        assert_eq!(p.backoff(3, 0.5), Duration::from_millis(200));
        assert_eq!(p.backoff(3, 0.0), Duration::ZERO);
    }

    #[test]
    fn only_the_failing_sink_is_retried_and_later_stages_wait_for_earlier_ones() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks::new(vec![
            vec![
                flaky("blobs", 2, Retry::Retryable, &LOG),
                flaky("dlq", 0, Retry::Retryable, &LOG),
            ],
            vec![flaky("rows", 0, Retry::Retryable, &LOG)],
        ]);
        let report = run(Vec::new(), &sinks, &FAST, &Status::default()).unwrap();
        let log = LOG.lock().unwrap().clone();
        assert_eq!(log.iter().filter(|s| **s == "blobs").count(), 3);
        assert_eq!(log.iter().filter(|s| **s == "dlq").count(), 1);
        assert_eq!(
            log.last(),
            Some(&"rows"),
            "rows only after blobs succeeded: {log:?}"
        );
        assert_eq!(
            report
                .sinks
                .iter()
                .map(|s| (s.sink, s.retries))
                .collect::<Vec<_>>(),
            [("blobs", 2), ("dlq", 0), ("rows", 0)]
        );
        assert!(
            report
                .sinks
                .iter()
                .all(|s| s.written == Written { items: 1, bytes: 2 })
        );
    }

    #[test]
    fn a_fatal_error_is_not_retried_and_stops_the_flush() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks::new(vec![
            vec![flaky("blobs", 1, Retry::Fatal, &LOG)],
            vec![flaky("rows", 0, Retry::Retryable, &LOG)],
        ]);
        let error = run(Vec::new(), &sinks, &FAST, &Status::default()).unwrap_err();
        assert_eq!((error.sink, error.retry), ("blobs", Retry::Fatal));
        assert_eq!(*LOG.lock().unwrap(), ["blobs"]);
    }

    /// A sink failing for good ends its stage at once, though a sibling is retrying through an
    /// outage with no limit on attempts: it used to wait for the sibling's write to end, which an
    /// outage could put off for as long as it lasted, the configuration stop held back meanwhile.
    #[test]
    fn a_fatal_error_ends_its_stage_without_waiting_for_a_sibling_in_an_outage() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks::new(vec![vec![
            flaky("rows", 1, Retry::Fatal, &LOG),
            flaky("items", 200, Retry::Retryable, &LOG),
        ]]);
        let unlimited = RetryPolicy {
            max_attempts: 0,
            ..FAST
        };
        let error = run(Vec::new(), &sinks, &unlimited, &Status::default()).unwrap_err();
        assert_eq!((error.sink, error.retry), ("rows", Retry::Fatal));
        let items = LOG
            .lock()
            .unwrap()
            .iter()
            .filter(|s| **s == "items")
            .count();
        assert!(items <= 2, "items written {items} times");
    }

    #[test]
    fn retryable_failures_are_retried_without_limit_by_default_and_reported_as_an_outage() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks::new(vec![vec![flaky("blobs", 50, Retry::Retryable, &LOG)]]);
        let unlimited = RetryPolicy {
            max_attempts: 0,
            ..FAST
        };
        let status = Status::default();
        let report = run(Vec::new(), &sinks, &unlimited, &status).unwrap();
        assert_eq!(report.sinks[0].retries, 50);
        assert!(
            status.sink_recovered("blobs").is_none(),
            "the outage ended with the success"
        );
    }

    /// Fails its first two writes, noting in `seen` at each what [`Failing`] says.
    struct Watching {
        failing: Arc<Failing>,
        seen: &'static Mutex<Vec<Option<(&'static str, Instant)>>>,
    }

    impl Sink for Watching {
        fn name(&self) -> &'static str {
            "rows"
        }
        fn write<'a>(&'a self, _: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                let mut seen = self.seen.lock().unwrap();
                seen.push(self.failing.oldest());
                if seen.len() <= 2 {
                    Err(SinkError::new("rows", Retry::Retryable, "down"))
                } else {
                    Ok(Written::default())
                }
            })
        }
    }

    /// One message flushed through `Watching` (noting in `seen`) beside a sink that writes at
    /// once (logging in `log`); what the flush was failing on, and the drain's notice.
    fn flush_watched(
        seen: &'static Mutex<Vec<Option<(&'static str, Instant)>>>,
        log: &'static Mutex<Vec<&'static str>>,
        status: &Status,
    ) -> (Arc<Failing>, Arc<Notify>) {
        let changed = Arc::new(Notify::new());
        let failing = Arc::new(Failing::new(changed.clone()));
        let watching = Watching {
            failing: failing.clone(),
            seen,
        };
        let sinks = Sinks::new(vec![vec![
            Box::new(watching),
            flaky("blobs", 0, Retry::Retryable, log),
        ]]);
        run_failing(
            entries(1),
            &sinks,
            &FAST,
            status,
            owner(&|_| false),
            &failing,
        )
        .unwrap();
        (failing, changed)
    }

    #[test]
    fn a_write_is_failing_from_its_first_failed_attempt_until_it_ends() {
        static SEEN: Mutex<Vec<Option<(&str, Instant)>>> = Mutex::new(Vec::new());
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let (status, started) = (Status::default(), Instant::now());
        let (failing, _) = flush_watched(&SEEN, &LOG, &status);
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen[0], None, "not failing before an attempt failed");
        let (sink, since) = seen[1].expect("failing after the first failed attempt");
        assert!(sink == "rows" && since >= started, "{seen:?}");
        assert_eq!(
            seen[2],
            Some(("rows", since)),
            "since the first failure, not the last; the sibling that wrote at once never"
        );
        assert_eq!(failing.oldest(), None, "no longer once written");
        assert!(!status.writes_failing("rows"));
    }

    /// A write that starts during its sink's outage (a flush started while another retries, the
    /// rest of a write a revoke shrank) is failing from its start, since the outage began: a
    /// drain waited out its first attempt — a request timeout against a hung destination —
    /// before it could give up.
    #[test]
    fn a_write_started_during_an_outage_is_failing_since_the_outage_began() {
        static SEEN: Mutex<Vec<Option<(&str, Instant)>>> = Mutex::new(Vec::new());
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        // The sink has been failing for a while (in an earlier flush) when this one starts.
        let status = Status::default();
        status.sink_failed("rows", "down before");
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        let (failing, changed) = flush_watched(&SEEN, &LOG, &status);
        let seen = SEEN.lock().unwrap().clone();
        let (sink, since) = seen[0].expect("failing before its first attempt");
        assert!(
            sink == "rows" && since + Duration::from_millis(40) <= started,
            "failing since the sink's outage began, before this flush: {seen:?}"
        );
        assert_eq!(seen[1..], [Some(("rows", since)), Some(("rows", since))]);
        assert_eq!(failing.oldest(), None, "no longer once written");
        assert!(!status.writes_failing("rows"), "counted out once written");
        assert!(
            changed.notified().now_or_never().is_some(),
            "the drain was told"
        );
    }

    /// Rejects any write that holds one of `bad` (by offset); counts what it accepted.
    struct Picky {
        bad: Vec<i64>,
        accepted: Mutex<Vec<i64>>,
    }

    impl Sink for Picky {
        fn name(&self) -> &'static str {
            "picky"
        }
        fn writes_for(&self, _: &Entry) -> bool {
            true
        }
        fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                if batch.iter().any(|e| self.bad.contains(&e.offset)) {
                    return Err(SinkError::new(
                        "picky",
                        Retry::Rejected,
                        "Code: 27. Cannot parse input",
                    ));
                }
                self.accepted
                    .lock()
                    .unwrap()
                    .extend(batch.iter().map(|e| e.offset));
                Ok(Written {
                    items: batch.len() as u64,
                    bytes: 0,
                })
            })
        }
    }

    /// Loses partition 1 (sets `lost`) on its `lose_at`-th write; fails its first `failures`
    /// writes retryably (an outage), then succeeds; records the offsets each write held.
    struct Losing {
        lose_at: u32,
        failures: u32,
        calls: AtomicU32,
        lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
        writes: Mutex<Vec<Vec<i64>>>,
    }

    impl Sink for Losing {
        fn name(&self) -> &'static str {
            "blobs"
        }
        fn writes_for(&self, _: &Entry) -> bool {
            true
        }
        fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                if call == self.lose_at {
                    self.lost.store(true, Ordering::SeqCst);
                }
                let offsets = batch.iter().map(|e| e.offset).collect();
                self.writes.lock().unwrap().push(offsets);
                match call <= self.failures {
                    true => Err(SinkError::new("blobs", Retry::Retryable, "503")),
                    false => Ok(Written { items: 1, bytes: 2 }),
                }
            })
        }
    }

    /// `entries` through `Losing` and, in a second stage, a sink recording the offsets it is
    /// given, retries unlimited or up to `max_attempts`; partition 1 lost once `Losing` says so.
    /// The report, the offsets of each of `Losing`'s writes, and those the second stage took.
    fn flush_losing_partition_1(
        lose_at: u32,
        failures: u32,
        entries: Vec<Entry>,
        max_attempts: u32,
    ) -> (Result<FlushReport, SinkError>, Vec<Vec<i64>>, Vec<i64>) {
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let losing = std::sync::Arc::new(Losing {
            lose_at,
            failures,
            calls: AtomicU32::new(0),
            lost: lost.clone(),
            writes: Mutex::default(),
        });
        let later = std::sync::Arc::new(Picky {
            bad: vec![],
            accepted: Mutex::new(Vec::new()),
        });
        let sinks = Sinks::new(vec![
            vec![Box::new(losing.clone())],
            vec![Box::new(later.clone())],
        ]);
        let policy = RetryPolicy {
            max_attempts,
            ..FAST
        };
        let report = run_losing(entries, &sinks, &policy, &Status::default(), &|p| {
            p == 1 && lost.load(Ordering::SeqCst)
        });
        let accepted = later.accepted.lock().unwrap().clone();
        let writes = losing.writes.lock().unwrap().clone();
        (report, writes, accepted)
    }

    /// While the owner holds writes no attempt is made; once released the write goes through;
    /// held until its partitions are lost, it stops unwritten.
    #[test]
    fn a_held_write_waits_without_an_attempt_until_released_or_lost() {
        let blobs = || Losing {
            lose_at: 0,
            failures: 0,
            calls: AtomicU32::new(0),
            lost: Arc::default(),
            writes: Mutex::default(),
        };
        let (sink, failing) = (Arc::new(blobs()), Failing::new(Arc::default()));
        let sinks = Sinks::new(vec![vec![Box::new(sink.clone())]]);
        let asks = AtomicU32::new(0);
        // Held for the first three asks (three rechecks, 750 ms), then released.
        let held = || {
            assert_eq!(
                sink.calls.load(Ordering::SeqCst),
                0,
                "no attempt while held"
            );
            asks.fetch_add(1, Ordering::SeqCst) < 3
        };
        let owner = Owner {
            lost: &|_| false,
            held: &held,
        };
        let status = Status::default();
        let flush = |sinks: &Sinks, owner: Owner| {
            run_failing(
                on_partitions_0_and_1(),
                sinks,
                &FAST,
                &status,
                owner,
                &failing,
            )
        };
        let report = flush(&sinks, owner);
        assert_eq!(
            sink.calls.load(Ordering::SeqCst),
            1,
            "written once released"
        );
        assert!(report.unwrap().given_up.is_empty());
        assert!(asks.load(Ordering::SeqCst) >= 4);

        // Held for good, its partitions lost after three rechecks: given up, never written.
        let sink = Arc::new(blobs());
        let sinks = Sinks::new(vec![vec![Box::new(sink.clone())]]);
        let holds = AtomicU32::new(0);
        let lost = |_| holds.load(Ordering::SeqCst) >= 3;
        let held = || {
            holds.fetch_add(1, Ordering::SeqCst);
            true
        };
        let owner = Owner {
            lost: &lost,
            held: &held,
        };
        let report = flush(&sinks, owner);
        assert_eq!(sink.calls.load(Ordering::SeqCst), 0, "never written");
        assert_eq!(report.unwrap().given_up.len(), 8);
        assert_eq!(holds.load(Ordering::SeqCst), 3, "held until the loss");
    }

    /// The coordinator's answer that releases held writes may also take the partitions away
    /// (KIP-848: the member was fenced meanwhile). Between a write's look at its partitions and
    /// its look at the hold, the answer records the loss and releases the hold: the write is
    /// given up, not made (it went on with the partitions the broker had given away).
    #[test]
    fn a_write_released_by_the_answer_that_took_its_partitions_is_not_made() {
        let sink = Arc::new(Losing {
            lose_at: 0,
            failures: 0,
            calls: AtomicU32::new(0),
            lost: Arc::default(),
            writes: Mutex::default(),
        });
        let sinks = Sinks::new(vec![vec![Box::new(sink.clone())]]);
        let answered = std::sync::atomic::AtomicBool::new(false);
        let lost = |_| answered.load(Ordering::SeqCst);
        // Asked after the partitions were read: the answer comes in between, loss first.
        let held = || {
            answered.store(true, Ordering::SeqCst);
            false
        };
        let owner = Owner {
            lost: &lost,
            held: &held,
        };
        let failing = Failing::new(Arc::default());
        let report = run_failing(
            on_partitions_0_and_1(),
            &sinks,
            &FAST,
            &Status::default(),
            owner,
            &failing,
        );
        assert_eq!(sink.calls.load(Ordering::SeqCst), 0, "never written");
        assert_eq!(report.unwrap().given_up.len(), 8);
    }

    /// Never answers, as a destination that hangs until the request's timeout.
    struct Hung {
        started: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Sink for Hung {
        fn name(&self) -> &'static str {
            "blobs"
        }
        fn writes_for(&self, _: &Entry) -> bool {
            true
        }
        fn write<'a>(&'a self, _: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            self.started.store(true, Ordering::SeqCst);
            Box::pin(std::future::pending())
        }
    }

    /// A request under way when every message the write holds is lost is cut, and the flush
    /// ends, its messages given up: it held its slot until the request's timeout (up to 90 s for
    /// a large upload), and a drain waited behind it with the next owner's messages buffered.
    /// Here the request never ends: without the cut the flush never would (the test's guard
    /// fails it after a minute).
    #[test]
    fn a_request_under_way_is_cut_once_every_message_it_holds_is_lost() {
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sinks = Sinks::new(vec![vec![Box::new(Hung {
            started: started.clone(),
        })]]);
        let (done, ended) = std::sync::mpsc::channel();
        // A request of the attempt cut failed (its sink's outage opened, as a failed upload
        // opens it): the outage ends with the write, no other write failing. Left open by a cut
        // first attempt, `sink.outage_ms` paged "sink down" until the sink next wrote.
        let status = Arc::new(Status::default());
        status.sink_request_failed("blobs", "timed out");
        let flushed = status.clone();
        std::thread::spawn(move || {
            let lost = |_| started.load(Ordering::SeqCst);
            let report = run_losing(on_partitions_0_and_1(), &sinks, &FAST, &flushed, &lost);
            let _ = done.send(report.map(|r| r.given_up.len()));
        });
        let given_up = ended
            .recv_timeout(Duration::from_secs(60))
            .expect("the flush ended");
        assert_eq!(given_up.unwrap(), 8);
        assert_eq!(
            status.sink_outage("blobs"),
            None,
            "the outage ended with it"
        );
    }

    /// Offsets 0..4 of partition 0 and 10..14 of partition 1.
    fn on_partitions_0_and_1() -> Vec<Entry> {
        (0..4)
            .map(|o| Entry::invalid_for_test(0, o))
            .chain((10..14).map(|o| Entry::invalid_for_test(1, o)))
            .collect()
    }

    #[test]
    fn a_partition_lost_while_a_stage_writes_is_left_out_of_the_stages_after_it() {
        let (report, writes, later) = flush_losing_partition_1(1, 0, on_partitions_0_and_1(), 0);
        let report = report.unwrap();
        assert_eq!(writes.len(), 1, "the stage under way wrote everything once");
        assert_eq!(later, [0, 1, 2, 3], "the next stage: partition 0 only");
        assert_eq!(report.given_up, [(1, 10), (1, 11), (1, 12), (1, 13)]);
    }

    #[test]
    fn a_write_retried_through_an_outage_stops_once_every_message_is_of_a_lost_partition() {
        let only_1 = on_partitions_0_and_1().split_off(4);
        // (An attempt limit, so that the test fails rather than hangs when retries go on.)
        let (report, writes, later) = flush_losing_partition_1(3, u32::MAX, only_1, 50);
        let report = report.unwrap();
        assert_eq!(writes.len(), 3, "no attempt after the loss");
        assert!(later.is_empty(), "nothing for the next stage: {later:?}");
        assert_eq!(report.given_up.len(), 4);
        assert_eq!(report.sinks[0].written, Written::default());
        assert_eq!(report.sinks.len(), 1, "the next stage is not run at all");
    }

    /// A write left because every message it holds is of a lost partition ends its sink's
    /// outage only when no other write to the sink is failing: `/status` and `sink.outage_ms`
    /// read the outage as over while another flush still retried through it, and the writes
    /// started after it as failing only since its next failure.
    #[test]
    fn a_write_left_to_lost_partitions_ends_the_outage_only_when_no_other_write_fails() {
        for other_failing in [false, true] {
            let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let losing = Losing {
                lose_at: 3,
                failures: u32::MAX,
                calls: AtomicU32::new(0),
                lost: lost.clone(),
                writes: Mutex::default(),
            };
            let sinks = Sinks::new(vec![vec![Box::new(losing)]]);
            let status = Status::default();
            // Another flush's write to the same sink, retrying.
            status.write_failing("blobs", other_failing);
            let policy = RetryPolicy {
                max_attempts: 50,
                ..FAST
            };
            let report = run_losing(
                on_partitions_0_and_1().split_off(4),
                &sinks,
                &policy,
                &status,
                &|p| p == 1 && lost.load(Ordering::SeqCst),
            );
            assert_eq!(report.unwrap().given_up.len(), 4);
            assert_eq!(
                status.sink_outage("blobs").is_some(),
                other_failing,
                "another write failing: {other_failing}"
            );
            assert_eq!(status.writes_failing("blobs"), other_failing);
        }
    }

    #[test]
    fn a_last_stage_write_whose_partitions_are_lost_on_its_last_attempt_leaves_them_given_up() {
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let losing = Losing {
            lose_at: FAST.max_attempts,
            failures: u32::MAX,
            calls: AtomicU32::new(0),
            lost: lost.clone(),
            writes: Mutex::default(),
        };
        let sinks = Sinks::new(vec![vec![Box::new(losing)]]);
        let report = run_losing(
            on_partitions_0_and_1().split_off(4),
            &sinks,
            &FAST,
            &Status::default(),
            &|p| p == 1 && lost.load(Ordering::SeqCst),
        )
        .expect("out of attempts, but nothing of it is this member's any more");
        assert_eq!(
            report.given_up,
            [(1, 10), (1, 11), (1, 12), (1, 13)],
            "not written, so not to be completed"
        );
    }

    #[test]
    fn a_write_with_messages_still_owned_goes_on_retrying_after_a_loss() {
        let (report, writes, later) =
            flush_losing_partition_1(1, u32::MAX, on_partitions_0_and_1(), 4);
        assert_eq!(
            writes.len(),
            4,
            "retried after the loss, up to its attempt limit"
        );
        assert_eq!(
            writes[1..],
            [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]],
            "with the messages still owned alone"
        );
        assert_eq!(report.unwrap_err().retry, Retry::Retryable);
        assert!(later.is_empty());
    }

    /// A revoke gave partition 1 up while a write of both partitions retried through an outage:
    /// retried whole, it would write partition 1's events and dead letters beside its next owner.
    #[test]
    fn a_write_retried_after_a_loss_writes_only_what_is_still_owned() {
        // Interleaved, as a batch polled from two partitions is.
        let entries: Vec<Entry> = [(0, 0), (1, 10), (0, 1), (0, 2), (1, 11), (0, 3)]
            .into_iter()
            .map(|(partition, offset)| Entry::invalid_for_test(partition, offset))
            .collect();
        let (report, writes, later) = flush_losing_partition_1(2, 3, entries, 50);
        let report = report.unwrap();
        assert_eq!(
            writes,
            [
                vec![0, 10, 1, 2, 11, 3],
                vec![0, 10, 1, 2, 11, 3],
                vec![0],
                vec![0],
                vec![1, 2],
                vec![3]
            ],
            "after the loss, the runs of partition 0 alone, in order (the first failing once more)"
        );
        assert_eq!(later, [0, 1, 2, 3]);
        assert_eq!(report.given_up, [(1, 10), (1, 11)]);
        assert_eq!(report.sinks[0].retries, 3);
    }

    /// Records what it is asked to dead-letter.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<i64>>);

    impl DeadLetters for std::sync::Arc<Recorder> {
        fn dead_letter<'a>(&'a self, rejected: &'a [Rejected], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                self.0
                    .lock()
                    .unwrap()
                    .extend(rejected.iter().map(|r| r.offset));
                Ok(Written {
                    items: rejected.len() as u64,
                    bytes: 0,
                })
            })
        }
    }

    fn entries(count: i64) -> Vec<Entry> {
        entries_at(0..count)
    }

    fn entries_at(offsets: std::ops::Range<i64>) -> Vec<Entry> {
        offsets
            .map(|offset| Entry::invalid_for_test(0, offset))
            .collect()
    }

    #[test]
    fn messages_a_sink_rejects_are_found_alone_dead_lettered_and_the_rest_written() {
        let batch = entries(10);
        let recorder = std::sync::Arc::new(Recorder::default());
        let picky = Picky {
            bad: vec![3, 7],
            accepted: Mutex::new(Vec::new()),
        };
        let sinks = Sinks::dead_lettering(vec![vec![Box::new(picky)]], Box::new(recorder.clone()));
        let report = run(batch, &sinks, &FAST, &Status::default()).unwrap();
        assert_eq!(
            report.rejected.iter().map(|r| r.offset).collect::<Vec<_>>(),
            [3, 7]
        );
        assert_eq!(report.rejected[0].error.sink, "picky");
        assert_eq!(
            *recorder.0.lock().unwrap(),
            [3, 7],
            "dead-lettered once each"
        );
        assert_eq!(
            report.sinks[0].written.items, 8,
            "every other message written"
        );
    }

    /// Sinks of one stage, `picky` refusing its `bad` offsets, what it refuses dead-lettered into
    /// the recorder.
    fn dead_lettering(bad: Vec<i64>) -> (Sinks, std::sync::Arc<Recorder>) {
        let recorder = std::sync::Arc::new(Recorder::default());
        let picky = Picky {
            bad,
            accepted: Mutex::new(Vec::new()),
        };
        let sinks = Sinks::dead_lettering(vec![vec![Box::new(picky)]], Box::new(recorder.clone()));
        (sinks, recorder)
    }

    #[test]
    fn a_sink_that_refuses_many_messages_and_accepts_none_is_misconfigured_and_stops_the_flush() {
        let (sinks, recorder) = dead_lettering(vec![0, 1, 2, 3]);
        let error = run(entries(4), &sinks, &FAST, &Status::default()).unwrap_err();
        assert_eq!(error.retry, Retry::Fatal);
        assert!(
            error.message.starts_with(
                "refused the last 4 messages it was given (4 of this batch) and accepted none, so the sink is taken for misconfigured"
            ),
            "{}",
            error.message
        );
        assert!(
            recorder.0.lock().unwrap().is_empty(),
            "nothing dead-lettered"
        );
    }

    #[test]
    fn fewer_refusals_than_the_threshold_are_dead_lettered_even_with_nothing_accepted() {
        // A quiet topic's batch of three hostile messages: stopping would restart into them.
        let (sinks, recorder) = dead_lettering(vec![0, 1, 2]);
        run(entries(3), &sinks, &FAST, &Status::default()).unwrap();
        assert_eq!(*recorder.0.lock().unwrap(), [0, 1, 2]);
        let never = RetryPolicy {
            misconfigured_at: 0,
            ..FAST
        };
        let (sinks, recorder) = dead_lettering((0..40).collect());
        run(entries(40), &sinks, &never, &Status::default()).unwrap();
        assert_eq!(
            *recorder.0.lock().unwrap(),
            (0..40).collect::<Vec<_>>(),
            "0: every refusal dead-lettered, however many"
        );
    }

    #[test]
    fn refusals_count_in_a_row_over_flushes_and_one_accepted_message_starts_the_count_again() {
        let (sinks, recorder) = dead_lettering(vec![0, 1, 3, 10, 11, 12, 20]);
        let flush = |offsets: std::ops::Range<i64>| {
            run(entries_at(offsets), &sinks, &FAST, &Status::default())
        };
        flush(0..2).unwrap();
        // 2 accepted: the 3 refused beside it say nothing about the sink.
        flush(2..4).unwrap();
        flush(10..13).unwrap();
        let error = flush(20..21).unwrap_err();
        assert!(
            error.message.starts_with(
                "refused the last 4 messages it was given (1 of this batch) and accepted none"
            ),
            "{}",
            error.message
        );
        assert_eq!(*recorder.0.lock().unwrap(), [0, 1, 3, 10, 11, 12]);
    }

    #[test]
    fn a_message_a_stage_refuses_is_written_by_no_later_stage() {
        let recorder = std::sync::Arc::new(Recorder::default());
        let later = std::sync::Arc::new(Picky {
            bad: vec![],
            accepted: Mutex::new(Vec::new()),
        });
        let blobs = Picky {
            bad: vec![1],
            accepted: Mutex::new(Vec::new()),
        };
        let sinks = Sinks::dead_lettering(
            vec![vec![Box::new(blobs)], vec![Box::new(later.clone())]],
            Box::new(recorder.clone()),
        );
        run(entries(3), &sinks, &FAST, &Status::default()).unwrap();
        assert_eq!(*recorder.0.lock().unwrap(), [1]);
        assert_eq!(*later.accepted.lock().unwrap(), [0, 2]);
    }

    /// Fails every dead letter, fatally (a dead-letter topic the service may not write to) or
    /// as it says.
    struct Unwritable(Retry);

    impl DeadLetters for Unwritable {
        fn dead_letter<'a>(&'a self, _: &'a [Rejected], _: &'a Progress) -> Writing<'a> {
            Box::pin(async { Err(SinkError::new("dlq", self.0, "not authorized")) })
        }
    }

    /// A dead-letter topic in an outage for its first `failures` attempts: each fails
    /// retryably; partition 1 is lost (sets `lost`) on the `lose_at`-th attempt. Records the
    /// offsets each attempt was given.
    struct DeadLettersDown {
        lose_at: u32,
        failures: u32,
        calls: AtomicU32,
        lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
        attempts: Mutex<Vec<Vec<i64>>>,
    }

    impl DeadLettersDown {
        fn new(lose_at: u32, failures: u32) -> std::sync::Arc<Self> {
            std::sync::Arc::new(DeadLettersDown {
                lose_at,
                failures,
                calls: AtomicU32::new(0),
                lost: std::sync::Arc::default(),
                attempts: Mutex::default(),
            })
        }
    }

    impl DeadLetters for std::sync::Arc<DeadLettersDown> {
        fn dead_letter<'a>(&'a self, rejected: &'a [Rejected], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                if call == self.lose_at {
                    self.lost.store(true, Ordering::SeqCst);
                }
                let offsets = rejected.iter().map(|r| r.offset).collect();
                self.attempts.lock().unwrap().push(offsets);
                if call <= self.failures {
                    return Err(SinkError::new("dlq", Retry::Retryable, "broker down"));
                }
                Ok(Written {
                    items: rejected.len() as u64,
                    bytes: 0,
                })
            })
        }
    }

    #[test]
    fn dead_letters_retried_after_a_loss_are_only_those_still_owned() {
        let down = DeadLettersDown::new(2, 2);
        let blobs = Picky {
            bad: vec![1, 10, 3, 12],
            accepted: Mutex::new(Vec::new()),
        };
        let sinks = Sinks::dead_lettering(vec![vec![Box::new(blobs)]], Box::new(down.clone()));
        let lost = down.lost.clone();
        let report = run_losing(
            on_partitions_0_and_1(),
            &sinks,
            &FAST,
            &Status::default(),
            &|p| p == 1 && lost.load(Ordering::SeqCst),
        )
        .unwrap();
        assert_eq!(
            *down.attempts.lock().unwrap(),
            [vec![1, 3, 10, 12], vec![1, 3, 10, 12], vec![1, 3]],
            "partition 1's refused messages are their next owner's to dead-letter"
        );
        let rejected: Vec<i64> = report.rejected.iter().map(|r| r.offset).collect();
        assert_eq!(rejected, [1, 3]);
        assert!(report.given_up.contains(&(1, 10)) && report.given_up.contains(&(1, 12)));
        let dead_lettered = report.sinks.last().unwrap();
        assert_eq!((dead_lettered.sink, dead_lettered.retries), ("rejected", 2));
    }

    #[test]
    fn dead_lettering_through_an_outage_stops_once_every_refused_message_is_of_a_lost_partition() {
        let down = DeadLettersDown::new(3, u32::MAX);
        let lost = down.lost.clone();
        let later = std::sync::Arc::new(Picky {
            bad: vec![],
            accepted: Mutex::new(Vec::new()),
        });
        let blobs = Picky {
            bad: vec![10, 12],
            accepted: Mutex::new(Vec::new()),
        };
        let sinks = Sinks::dead_lettering(
            vec![vec![Box::new(blobs)], vec![Box::new(later.clone())]],
            Box::new(down.clone()),
        );
        // (An attempt limit, so that the test fails rather than hangs when retries go on.)
        let policy = RetryPolicy {
            max_attempts: 50,
            ..FAST
        };
        let status = Status::default();
        let report = run_losing(on_partitions_0_and_1(), &sinks, &policy, &status, &|p| {
            p == 1 && lost.load(Ordering::SeqCst)
        })
        .expect("nothing left to dead-letter is this member's");
        assert!(
            status.sink_recovered("rejected").is_none(),
            "no outage left standing: the path may not write again for days"
        );
        assert_eq!(
            down.calls.load(Ordering::SeqCst),
            3,
            "no attempt after the loss"
        );
        assert!(
            report.rejected.is_empty(),
            "none dead-lettered by this member"
        );
        assert_eq!(
            report.given_up,
            [(1, 10), (1, 11), (1, 12), (1, 13)],
            "the refused messages too: their next owner dead-letters them"
        );
        assert_eq!(*later.accepted.lock().unwrap(), [0, 1, 2, 3]);
    }

    #[test]
    fn a_refusal_that_cannot_be_dead_lettered_stops_the_flush_before_later_stages_write() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let stages = || {
            let blobs = Picky {
                bad: vec![1],
                accepted: Mutex::new(Vec::new()),
            };
            vec![
                vec![Box::new(blobs) as Box<dyn Sink>],
                vec![flaky("events", 0, Retry::Retryable, &LOG)],
            ]
        };
        let sinks = Sinks::dead_lettering(stages(), Box::new(Unwritable(Retry::Fatal)));
        let error = run(entries(3), &sinks, &FAST, &Status::default()).unwrap_err();
        assert_eq!((error.sink, error.retry), ("dlq", Retry::Fatal));
        // A dead letter the path refuses or panics on: fatal too, saying there is nowhere else
        // (a refusal reached the pipeline as a sink's, with the sink's message alone).
        for retry in [Retry::Rejected, Retry::Panicked] {
            let sinks = Sinks::dead_lettering(stages(), Box::new(Unwritable(retry)));
            let error = run(entries(3), &sinks, &FAST, &Status::default()).unwrap_err();
            assert_eq!(
                (error.sink, error.retry),
                ("dlq", Retry::Fatal),
                "{retry:?}"
            );
            assert!(error.message.contains("nowhere else to keep it"), "{error}");
        }
        let error = run(entries(3), &Sinks::new(stages()), &FAST, &Status::default()).unwrap_err();
        assert_eq!(error.retry, Retry::Fatal);
        assert!(
            LOG.lock().unwrap().is_empty(),
            "the events stage sent nothing (the batch's next flush sends it all)"
        );
    }

    /// Writes for no message, and fails every write as `retry`.
    struct Blameless(Retry);

    impl Sink for Blameless {
        fn name(&self) -> &'static str {
            "blameless"
        }
        fn write<'a>(&'a self, _: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move { Err(SinkError::new("blameless", self.0, "refused")) })
        }
        fn writes_for(&self, _: &Entry) -> bool {
            false
        }
    }

    #[test]
    fn a_failure_no_message_can_be_blamed_for_stops_the_flush_instead_of_halving_forever() {
        for retry in [Retry::Rejected, Retry::Panicked] {
            let recorder = std::sync::Arc::new(Recorder::default());
            let sinks = Sinks::dead_lettering(
                vec![vec![Box::new(Blameless(retry))]],
                Box::new(recorder.clone()),
            );
            for batch in [entries(1), entries(4)] {
                let error = run(batch, &sinks, &FAST, &Status::default()).unwrap_err();
                assert_eq!(error.retry, Retry::Fatal, "{retry:?}");
                assert!(
                    error.message.contains("no message is to blame"),
                    "{}",
                    error.message
                );
            }
            assert!(
                recorder.0.lock().unwrap().is_empty(),
                "nothing dead-lettered"
            );
        }
    }

    #[test]
    fn a_rejection_with_nowhere_to_dead_letter_it_stops_the_flush() {
        let picky = Picky {
            bad: vec![1],
            accepted: Mutex::new(Vec::new()),
        };
        let error = run(
            entries(3),
            &Sinks::new(vec![vec![Box::new(picky)]]),
            &FAST,
            &Status::default(),
        )
        .unwrap_err();
        assert_eq!(error.retry, Retry::Fatal);
    }

    /// Panics on any write that holds one of `bad` (a bug some value triggers).
    struct Panicky {
        bad: Vec<i64>,
        accepted: Mutex<Vec<i64>>,
    }

    impl Sink for Panicky {
        fn name(&self) -> &'static str {
            "panicky"
        }
        fn writes_for(&self, _: &Entry) -> bool {
            true
        }
        fn write<'a>(&'a self, batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                if batch.iter().any(|e| self.bad.contains(&e.offset)) {
                    panic!("overflow when adding duration to instant");
                }
                self.accepted
                    .lock()
                    .unwrap()
                    .extend(batch.iter().map(|e| e.offset));
                Ok(Written {
                    items: batch.len() as u64,
                    bytes: 0,
                })
            })
        }
    }

    #[test]
    fn a_sink_that_panics_is_narrowed_down_to_the_messages_that_cause_it_which_are_internal_errors()
    {
        let recorder = std::sync::Arc::new(Recorder::default());
        // Every message of the batch panics but one: still not taken for misconfiguration.
        let panicky = std::sync::Arc::new(Panicky {
            bad: vec![0, 2, 3],
            accepted: Mutex::new(Vec::new()),
        });
        let sinks = Sinks::dead_lettering(
            vec![vec![Box::new(panicky.clone())]],
            Box::new(recorder.clone()),
        );
        let report = run(entries(4), &sinks, &FAST, &Status::default()).unwrap();
        assert_eq!(
            report.rejected.iter().map(|r| r.offset).collect::<Vec<_>>(),
            [0, 2, 3]
        );
        assert!(
            report
                .rejected
                .iter()
                .all(|r| r.reason() == crate::recording::Reason::InternalError)
        );
        assert!(
            report.rejected[0]
                .error
                .message
                .contains("panicked: overflow when adding duration")
        );
        assert_eq!(*recorder.0.lock().unwrap(), [0, 2, 3]);
        assert_eq!(*panicky.accepted.lock().unwrap(), [1]);
        let all_bad = Panicky {
            bad: vec![0, 1],
            accepted: Mutex::new(Vec::new()),
        };
        let sinks =
            Sinks::dead_lettering(vec![vec![Box::new(all_bad)]], Box::new(recorder.clone()));
        assert_eq!(
            run(entries(2), &sinks, &FAST, &Status::default())
                .unwrap()
                .rejected
                .len(),
            2
        );
    }

    /// Stores entries one by one; the first attempt fails on every `nth` entry.
    struct Tail {
        nth: i64,
        uploads: Mutex<Vec<i64>>,
    }

    impl Sink for Tail {
        fn name(&self) -> &'static str {
            "tail"
        }
        fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
            Box::pin(async move {
                let first_attempt = self.uploads.lock().unwrap().is_empty();
                let mut failure = None;
                for entry in batch
                    .iter()
                    .filter(|e| !progress.is_stored(crate::sink::Piece::of(e, 0)))
                {
                    self.uploads.lock().unwrap().push(entry.offset);
                    if first_attempt && entry.offset % self.nth == 0 {
                        let error = SinkError::new("tail", Retry::Retryable, "timed out");
                        progress.failed(&error);
                        failure = Some(error);
                    } else {
                        progress.stored(crate::sink::Piece::of(entry, 0));
                    }
                }
                failure.map_or(Ok(Written::default()), Err)
            })
        }
    }

    #[test]
    fn a_retry_writes_only_what_the_failed_attempt_did_not_store() {
        let tail = std::sync::Arc::new(Tail {
            nth: 20,
            uploads: Mutex::new(Vec::new()),
        });
        let sinks = Sinks::new(vec![vec![Box::new(tail.clone())]]);
        let report = run(entries(100), &sinks, &FAST, &Status::default()).unwrap();
        assert_eq!(report.sinks[0].retries, 1);
        assert_eq!(
            tail.uploads.lock().unwrap().len(),
            105,
            "100 uploads, then the 5 that failed"
        );
    }

    #[test]
    fn retries_stop_after_the_configured_attempts() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks::new(vec![vec![flaky("blobs", 100, Retry::Retryable, &LOG)]]);
        assert!(run(Vec::new(), &sinks, &FAST, &Status::default()).is_err());
        assert_eq!(LOG.lock().unwrap().len(), 4);
    }
}
