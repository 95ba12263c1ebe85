//! The consumer's polling thread.
//!
//! librdkafka wants `poll` called continuously (rebalance callbacks run inside it, and a member
//! that has not called it for `max.poll.interval.ms` is taken for stuck and leaves the group). A
//! dedicated thread polls and hands messages over to the pipeline within a bound of messages and
//! bytes in transit ([`Handoff`]). It never blocks on the pipeline: a message that finds no room
//! within one poll interval is held, the assigned partitions are paused (each once it has
//! delivered a message in its assignment: [`super::pause`] says why), and the thread goes on
//! polling — serving rebalances — until the pipeline takes the message; then they are resumed.
//! So backpressure, however long (a sink down for minutes), never keeps a rebalance waiting.
//!
//! Revocations travel a separate, unbounded channel that the pipeline reads whatever its
//! backpressure, so a revoke never waits behind data. Each
//! revocation starts a new *generation*; every forwarded message carries the generation it was
//! polled in, and the pipeline drops messages (and ignores flushes) of an earlier generation, so
//! nothing is committed for partitions this member no longer owns. On revoke the thread waits —
//! at most the drain deadline — for the pipeline to flush and commit, then lets librdkafka
//! release the partitions.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Offset;
use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::handoff::{Handoff, Reserved};
use super::ownership::Ownership;
use super::pause::IntakePause;
use super::position::{Check, Unchecked, position_list};
use super::record::Record;
use crate::health::Status;

/// How long `poll` waits for a message, and how long a message waits for room in the hand-over
/// before the partitions are paused: rebalance callbacks run at least this often.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// librdkafka's statistics interval: set by the group member's defaults (its statistics feed
/// `consumer.lag` and `/status` `group`), off for every other client.
pub const STATISTICS_INTERVAL: &str = "statistics.interval.ms";

/// Whether librdkafka sends a consumer made from `config` statistics (an interval other than 0).
pub fn sends_statistics(config: &ClientConfig) -> bool {
    config
        .get(STATISTICS_INTERVAL)
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        != Some(0)
}

/// What the rebalance callback waits beyond the drain deadline for the pipeline to answer.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(1);

/// Messages polled back to back, in order, each with the generation it was polled in, and their
/// room in the hand-over (given back when dropped). A batch is what librdkafka already held,
/// taken without waiting: it costs no latency and saves the pipeline a wake-up per message.
pub struct Polled {
    pub messages: Vec<(Record, u64)>,
    pub room: super::handoff::Ticket,
}

/// A consumer error no retry gets past — the group coordinator refuses the member's settings or
/// the principal's rights — with what to fix. librdkafka keeps retrying these, every few
/// seconds, for ever: a member ready and consuming nothing, seen only as lag from outside.
fn refusal(error: &KafkaError) -> Option<String> {
    let fix = match error.rdkafka_error_code()? {
        RDKafkaErrorCode::InvalidSessionTimeout => {
            "`--session-timeout-ms` is outside what the brokers allow (group.min.session.timeout.ms to group.max.session.timeout.ms; 6 s to 30 min by default)"
        }
        RDKafkaErrorCode::GroupAuthorizationFailed => {
            "the principal may not join the consumer group `--group-id` (it needs READ on the group)"
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => {
            "the principal may not read `--topic` (it needs READ and DESCRIBE on the topic)"
        }
        RDKafkaErrorCode::InvalidGroupId => "`--group-id` is not a group id the brokers accept",
        _ => return None,
    };
    Some(format!("the brokers refuse this member: {error}: {fix}"))
}

/// librdkafka's fatal error, once it raised one: its consumer never consumes, heartbeats or
/// commits again, while the member looks ready and live (with the consumer group protocol its
/// join state even reads as in the group). Raised for a fenced static member — another one
/// joined with the same `group.instance.id` — and, with the consumer group protocol, for
/// heartbeats refused for good (group authorization, the group's size limit, an unknown
/// assignor).
fn fatal(consumer: &IngestConsumer) -> Option<String> {
    let (code, reason) = consumer.client().fatal_error()?;
    let fix = match code {
        RDKafkaErrorCode::FencedInstanceId => {
            ": another member joined the group with the same `group.instance.id` (static membership): give each member its own"
        }
        _ => "",
    };
    Some(format!(
        "librdkafka stopped consuming for good ({code:?}): {reason}{fix}"
    ))
}

/// Most messages in one [`Polled`] batch.
pub const POLL_BATCH_MESSAGES: usize = 16;

/// A batch takes no further message once its values reach this many bytes.
pub const POLL_BATCH_BYTES: usize = 1024 * 1024;

/// `partitions` are being revoked; messages of earlier generations are no longer ours. The
/// pipeline drains what can be made durable within the deadline, commits it, then sends on
/// `done`.
pub struct Revoke {
    pub partitions: Vec<i32>,
    pub generation: u64,
    /// The group already gave the partitions to another member (this one missed its session or
    /// poll interval): nothing of them may be written or committed any more.
    pub lost: bool,
    pub done: std_mpsc::SyncSender<()>,
}

pub struct IngestContext {
    revokes: mpsc::UnboundedSender<Revoke>,
    /// Changed by the callbacks below and nowhere else.
    ownership: Arc<Ownership>,
    drain_deadline: Duration,
    /// Where `/status` shows the partitions owned.
    status: Arc<Status>,
    /// Intake's pause, set by the polling thread; the revoke callback resumes the partitions
    /// that leave paused.
    intake: Mutex<IntakePause>,
    /// The consumer group protocol of KIP-848, where a member in its group may show the join
    /// state `init` (see [`in_group`]).
    consumer_protocol: bool,
    /// The client this context is the consumer's of ([`IngestContext::attach`]), for its member
    /// epoch; null until then.
    client: AtomicPtr<rdsys::rd_kafka_t>,
    /// The consumer is being closed: its member epoch is no longer read, and a revoke is not
    /// sent to the pipeline, which has stopped.
    closing: AtomicBool,
    /// Partition → its high watermark as the brokers gave it while intake was paused
    /// ([`Poller::ask_watermarks`]); emptied when intake resumes (fetches carry it again).
    asked_highs: Mutex<HashMap<i32, i64>>,
    /// The assigned partitions' committed positions, until each is checked against the log at
    /// its first message (`kafka::position`): set by the assign callback, read by the polling
    /// thread.
    unchecked: Mutex<Unchecked>,
}

impl IngestContext {
    /// `consumer_protocol`: the member uses the consumer group protocol of KIP-848; flushes
    /// write nothing once its coordinator has been out of reach for `hold_writes_after`
    /// (`kafka::coordinator`).
    pub fn new(
        revokes: mpsc::UnboundedSender<Revoke>,
        drain_deadline: Duration,
        status: Arc<Status>,
        consumer_protocol: bool,
        hold_writes_after: Option<Duration>,
    ) -> Self {
        IngestContext {
            revokes,
            ownership: Arc::new(Ownership::holding_writes_after(hold_writes_after)),
            drain_deadline,
            status,
            intake: Mutex::default(),
            consumer_protocol,
            client: AtomicPtr::new(std::ptr::null_mut()),
            closing: AtomicBool::new(false),
            asked_highs: Mutex::default(),
            unchecked: Mutex::default(),
        }
    }

    /// Tells the context the consumer it serves, once created: with the consumer group protocol
    /// its statistics read the member epoch from it.
    pub fn attach(consumer: &BaseConsumer<IngestContext>) {
        consumer
            .context()
            .client
            .store(consumer.client().native_ptr(), Ordering::Release);
    }

    /// The consumer is about to be closed, the pipeline stopped: from now on its member epoch is
    /// not read, and the revoke of its partitions on close drains nothing.
    pub fn closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// The member epoch the group coordinator last gave this member (the consumer group
    /// protocol's generation: 1 or more once a heartbeat was accepted, 0 while joining and again
    /// once fenced or rejoining, -1 before the first heartbeat), or `None` before
    /// [`IngestContext::attach`] and once [`IngestContext::closing`].
    fn member_epoch(&self) -> Option<i32> {
        let client = self.client.load(Ordering::Acquire);
        if client.is_null() || self.closing.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: the consumer's own client, which lives as long as this context (the client
        // owns it). The call waits for librdkafka's main thread to copy the group's metadata
        // into a new object (destroyed here): answered at once, with no broker involved, while
        // the group handler runs — not once it has terminated, which the close brings about and
        // `closing` keeps this from racing.
        unsafe {
            let metadata = rdsys::rd_kafka_consumer_group_metadata(client);
            if metadata.is_null() {
                return None;
            }
            let epoch = rdsys::rd_kafka_consumer_group_metadata_generation_id(metadata);
            rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
            Some(epoch)
        }
    }

    fn asked_highs(&self) -> MutexGuard<'_, HashMap<i32, i64>> {
        self.asked_highs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `(partition, lag)` from librdkafka's statistics, reported for owned partitions only;
    /// unknown lags are negative.
    fn report_lag(&self, lags: impl Iterator<Item = (i32, i64)>) {
        for (partition, lag) in lags {
            if lag >= 0 && self.ownership.owns(partition) {
                crate::metrics::lag(partition, lag);
            }
        }
    }

    fn gained(&self, partitions: &[i32]) {
        self.status
            .record_partitions(self.ownership.gain(partitions));
    }

    /// Starts the revoke's generation, and zeroes the lag gauge of each partition given away:
    /// the exporter keeps sending a gauge's last value, and the new owner reports the real one.
    fn given_up(&self, partitions: &[i32], lost: bool) -> u64 {
        let (generation, owned) = self.ownership.revoke(partitions, lost);
        self.status.record_partitions(owned);
        for &partition in partitions {
            crate::metrics::lag(partition, 0);
        }
        generation
    }

    /// What the member owns, shared with the polling thread.
    pub fn ownership(&self) -> Arc<Ownership> {
        self.ownership.clone()
    }

    fn intake(&self) -> MutexGuard<'_, IntakePause> {
        self.intake.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unchecked(&self) -> MutexGuard<'_, Unchecked> {
        self.unchecked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the committed positions of `partitions`, just assigned, to check each against the
    /// log at its first message (`kafka::position`).
    fn read_committed(&self, consumer: &BaseConsumer<Self>, partitions: &TopicPartitionList) {
        match super::position::committed(consumer, partitions) {
            Ok(positions) => self.unchecked().assigned(positions),
            Err(error) => warn!(
                %error,
                partitions = ?ids(partitions),
                "cannot read the committed positions of the partitions assigned: each is read from its committed offset unchecked (a log an unclean leader election cut back below it would have its new messages there skipped)"
            ),
        }
    }
}

impl ClientContext for IngestContext {
    /// librdkafka's own lines and errors ([`super::log_line`], [`super::client_error`]); the
    /// errors come back from the poll too, where a refusal of the group stops the pipeline.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
        super::log_line(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // A refusal of the member reaches the polling thread too, which stops the service on it
        // with an ERROR naming the fix: logged here as retried by the client, it contradicted
        // that line.
        if refusal(&error).is_some() {
            return;
        }
        super::client_error("the consumer", &error, reason);
    }

    /// librdkafka statistics (every `statistics.interval.ms`): consumer lag of each partition
    /// this member owns (a revoked partition's gauge was zeroed on revoke; statistics can still
    /// list it, and must not bring back a value its new owner now reports), and the member's
    /// place in its group.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let asked = self.asked_highs().clone();
        let lags = statistics.topics.values().flat_map(|t| {
            t.partitions
                .iter()
                .map(|(&p, s)| (p, lag(s, asked.get(&p).copied())))
        });
        self.report_lag(lags);
        if let Some(group) = &statistics.cgrp {
            let brokers_up = statistics
                .brokers
                .values()
                .filter(|b| b.state == "UP")
                .count();
            // Read only where it decides: a consumer-protocol member in `init`, its coordinator
            // connected.
            let member_epoch =
                (self.consumer_protocol && group.state == "up" && group.join_state == "init")
                    .then(|| self.member_epoch())
                    .flatten();
            let joined = in_group(&group.state, &group.join_state, member_epoch);
            self.status
                .record_group(&group.state, &group.join_state, joined, brokers_up);
            // Timed by the statistics' own clock (whole seconds), when they carry it: they wait in
            // librdkafka's queue while the polling thread runs a rebalance callback. That clock
            // is the wall clock: what they waited, by it, is taken from the process's.
            let now = crate::health::now_ms();
            let at = match statistics.time {
                secs if secs > 0 => now.saturating_sub(
                    crate::health::wall_ms().saturating_sub((secs as u64).saturating_mul(1000)),
                ),
                _ => now,
            };
            self.ownership.record_coordinator(
                group.state == "up",
                group.stateage.max(0) as u64,
                at,
            );
        }
    }
}

/// Whether librdkafka's group `state` and `join_state` say the member is in its group: its
/// coordinator connected (`up`) and the member joined, its assignment taken (`steady`, an empty
/// one too). With the consumer protocol of KIP-848 a member the broker gave no partition stays in
/// `init`, heartbeating as a member (measured on Apache Kafka 4: an idle member showed `init` for
/// as long as it ran) — and so does one whose heartbeats the coordinator refuses (a group id
/// held by a classic group it cannot take over, say), retried without end: there `init` counts
/// as in the group only with the `member_epoch` of an accepted heartbeat (`None` for the classic
/// protocol, where `init` is before the first join).
fn in_group(state: &str, join_state: &str, member_epoch: Option<i32>) -> bool {
    state == "up"
        && (join_state == "steady" || (join_state == "init" && member_epoch.is_some_and(|e| e > 0)))
}

/// What the group still has to read of a partition: the high watermark minus the committed
/// offset — or, before the group has committed anything there, minus the log start, where it
/// begins (`auto.offset.reset=earliest`); librdkafka's own `consumer_lag` is unknown (-1) then,
/// and a fresh group's backlog went unreported. Negative: unknown (no watermark yet). The high
/// watermark is the later of the statistics' (from the last fetch) and `asked`, the brokers'
/// answer while intake is paused and nothing is fetched.
fn lag(partition: &rdkafka::statistics::Partition, asked: Option<i64>) -> i64 {
    let high = partition.hi_offset.max(asked.unwrap_or(-1));
    if high < 0 {
        return -1;
    }
    let from = if partition.committed_offset >= 0 {
        partition.committed_offset
    } else {
        partition.lo_offset.max(0)
    };
    (high - from).max(0)
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let ids = ids(partitions);
            self.unchecked().revoked(&ids);
            let lost = consumer.assignment_lost();
            let generation = self.given_up(&ids, lost);
            if self.closing.load(Ordering::Acquire) {
                // librdkafka revokes what the member owns as the consumer closes. The pipeline
                // has stopped — its drain ended, or it stopped on an error and gave everything
                // up — so nothing answers a revoke: sent, it waited for nothing and warned on
                // every clean shutdown that the drain had not answered, which reads as a sink
                // outage. Given up here too, as for a drain that did not answer.
                info!(partitions = ?ids, generation, "partitions released as the consumer closes");
                self.ownership.abandon(&ids, generation);
                return;
            }
            if lost {
                warn!(partitions = ?ids, generation, "partitions lost (the session or poll interval expired): their buffered messages are left to the new owner, not flushed");
            } else {
                info!(partitions = ?ids, generation, "partitions revoked: draining");
            }
            let resumed = self
                .intake()
                .revoked(&ids, |paused| consumer.resume(&only(partitions, paused)));
            if let Err(error) = resumed {
                warn!(%error, "cannot resume the partitions given up");
            }
            let (done, drained) = std_mpsc::sync_channel(1);
            // The pipeline bounds its own drain by the deadline; the margin covers the hand-over.
            let wait = self.drain_deadline + DRAIN_MARGIN;
            let revoke = Revoke {
                partitions: ids.clone(),
                generation,
                lost,
                done,
            };
            let drained = match self.revokes.send(revoke) {
                Ok(()) => drained.recv_timeout(wait).is_ok(),
                // The pipeline stopped on an error: nothing drains these partitions, and its
                // `abandon_all` no longer sees them (given up above), so flushes still under way
                // would go on writing their events while the next owner reads them again.
                Err(_) => false,
            };
            if !drained {
                warn!(
                    deadline_ms = self.drain_deadline.as_millis() as u64,
                    partitions = ?ids,
                    generation,
                    "drain did not answer before the deadline (or the pipeline has stopped): the partitions are abandoned"
                );
                self.ownership.abandon(&ids, generation);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let ids = ids(partitions);
            // New partitions join intake's pause at their first message (`kafka::pause`).
            self.gained(&ids);
            // Called for an empty assignment too: the member is in its group.
            self.status.record_joined();
            let generation = self.ownership.generation();
            info!(partitions = ?ids, generation, "partitions assigned");
            if !ids.is_empty() {
                self.read_committed(consumer, partitions);
            }
        }
    }
}

fn ids(partitions: &TopicPartitionList) -> Vec<i32> {
    partitions
        .elements()
        .iter()
        .map(|p| p.partition())
        .collect()
}

/// The entries of `list` for `partitions`.
fn only(list: &TopicPartitionList, partitions: &[i32]) -> TopicPartitionList {
    let mut only = TopicPartitionList::new();
    for entry in list.elements() {
        if partitions.contains(&entry.partition()) {
            only.add_partition(entry.topic(), entry.partition());
        }
    }
    only
}

pub type IngestConsumer = BaseConsumer<IngestContext>;

/// Why the member must stop consuming, whatever intake is doing.
#[derive(Debug)]
pub enum Stop {
    /// The brokers or librdkafka will never let it consume (see `refusal`).
    Refused(String),
    /// Its topic was deleted and created again under it (`topic_id`).
    Recreated(super::topic_id::Recreated),
}

/// Polls until `stop` is set or the pipeline is gone, handing messages over tagged with the
/// generation they were polled in. Returns the thread handle.
pub fn spawn_poller(
    consumer: Arc<IngestConsumer>,
    events: mpsc::UnboundedSender<Polled>,
    refusals: mpsc::UnboundedSender<Stop>,
    handoff: Arc<Handoff>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let ownership = consumer.context().ownership();
    let poller = Poller {
        consumer,
        events,
        refusals,
        handoff,
        ownership,
        held: VecDeque::new(),
        paused_since: None,
        watermarks: Watermarks::default(),
    };
    thread::Builder::new()
        .name("kafka-poll".into())
        .spawn(move || poller.run(&stop))
        .unwrap_or_else(|e| panic!("cannot spawn the Kafka polling thread: {e}"))
}

struct Poller {
    consumer: Arc<IngestConsumer>,
    events: mpsc::UnboundedSender<Polled>,
    /// Why the brokers or librdkafka will never let this member consume: a channel of its own,
    /// which the pipeline reads whether or not it takes messages (intake paused behind a sink
    /// outage leaves messages waiting, not this).
    refusals: mpsc::UnboundedSender<Stop>,
    handoff: Arc<Handoff>,
    ownership: Arc<Ownership>,
    /// Polled, not yet handed over (in order), with their generations. While anything is held
    /// past a hand-over the assigned partitions are paused, so this holds a batch at most (a
    /// partition paused at its first message is set back to it: [`Poller::pause_at_first`]).
    held: VecDeque<(Record, u64)>,
    /// When intake was paused, while it is.
    paused_since: Option<Instant>,
    watermarks: Watermarks,
}

/// The high watermarks asked for while intake is paused: when last, whether the asking thread
/// still runs, and whether the polling thread has ended (the asking thread then asks no more).
#[derive(Default)]
struct Watermarks {
    asked_at: Option<Instant>,
    asking: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
}

impl Drop for Watermarks {
    /// The polling thread ends: the asking thread stops before its next question, and this waits
    /// for it (one question's timeout at most). It holds the consumer only while it asks: the
    /// pipeline closes the consumer as its last holder once the polling thread has ended (a
    /// drop elsewhere, after it was closed, logs an error).
    fn drop(&mut self) {
        self.ended.store(true, Ordering::Release);
        let until = Instant::now() + WATERMARK_TIMEOUT + POLL_INTERVAL;
        while self.asking.load(Ordering::Acquire) && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How often, while intake is paused, the brokers are asked for the assigned partitions' high
/// watermarks.
const ASK_WATERMARKS_EVERY: Duration = Duration::from_secs(5);

/// How long one partition's answer is waited for; the first that does not come ends the round.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(1);

impl Poller {
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            if !self.hand_over() {
                return;
            }
            self.ask_watermarks();
            // While a message is held, `poll` only serves callbacks (the partitions are paused)
            // and must not wait: the hand-over does. A message that arrives brings with it what
            // librdkafka already holds, up to a batch.
            let timeout = if self.held.is_empty() {
                POLL_INTERVAL
            } else {
                Duration::ZERO
            };
            if self.poll(timeout) {
                let mut bytes = self.held.back().map_or(0, |(r, _)| r.bytes());
                while self.held.len() < POLL_BATCH_MESSAGES
                    && bytes < POLL_BATCH_BYTES
                    && self.poll(Duration::ZERO)
                {
                    bytes += self.held.back().map_or(0, |(r, _)| r.bytes());
                }
            }
        }
    }

    /// One poll: `true` when it brought a message (now held, with its generation).
    fn poll(&mut self, timeout: Duration) -> bool {
        let before = self.ownership.generation();
        let polled = match self.consumer.poll(timeout) {
            Some(Ok(message)) if self.seek_to_check(&message) => false,
            Some(Ok(message)) if self.paused_since.is_some() && self.pause_at_first(&message) => {
                false
            }
            Some(Ok(message)) => {
                self.held
                    .push_back((Record::copy_of(&message), self.ownership.generation()));
                true
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => false,
            // Logged already: librdkafka's event reaches the context's error callback before it
            // comes back from the poll.
            Some(Err(error)) => {
                // The pipeline stops on a refusal; this thread is stopped with it.
                if let Some(refused) = refusal(&error).or_else(|| fatal(&self.consumer)) {
                    let _ = self.refusals.send(Stop::Refused(refused));
                }
                false
            }
        };
        if self.ownership.generation() != before && !self.held.is_empty() {
            // A revoke ran in that poll: what is held of the partitions given up is their
            // next owner's, and must not keep the others paused.
            self.held
                .retain(|(record, _)| self.ownership.owns(record.partition));
        }
        polled
    }

    /// Hands over what is held, oldest first and in batches, waiting at most one poll interval
    /// for room; pauses intake while something is left and resumes it once nothing is. `false`:
    /// the pipeline is gone.
    fn hand_over(&mut self) -> bool {
        let deadline = Instant::now() + POLL_INTERVAL;
        while !self.held.is_empty() {
            // The next batch: the oldest message, and those after it within the batch bounds.
            let (mut count, mut bytes) = (0, 0);
            for (record, _) in &self.held {
                if count == POLL_BATCH_MESSAGES.min(self.handoff.max_messages())
                    || (count > 0 && bytes >= POLL_BATCH_BYTES)
                {
                    break;
                }
                count += 1;
                bytes += record.bytes();
            }
            match self.handoff.reserve(
                count,
                bytes,
                deadline.saturating_duration_since(Instant::now()),
            ) {
                Reserved::Room(room) => {
                    let messages = self.held.drain(..count).collect();
                    if self.events.send(Polled { messages, room }).is_err() {
                        return false;
                    }
                }
                Reserved::Full => break,
                Reserved::Closed => return false,
            }
        }
        self.pause(!self.held.is_empty());
        true
    }

    /// While intake is paused nothing is fetched, and the high watermark in librdkafka's
    /// statistics, which its fetches bring, stays where the pause found it: `consumer.lag` went
    /// flat through a sink outage while the backlog grew behind it (operators read it to size
    /// the outage). Every [`ASK_WATERMARKS_EVERY`] while paused, a thread of its own asks the
    /// brokers for the assigned partitions' high watermarks (this thread must not wait on them),
    /// which the next statistics use.
    fn ask_watermarks(&mut self) {
        let Some(since) = self.paused_since else {
            return;
        };
        let last = self.watermarks.asked_at.unwrap_or(since);
        if last.elapsed() < ASK_WATERMARKS_EVERY
            || self.watermarks.asking.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.watermarks.asked_at = Some(Instant::now());
        let (consumer, asking, ended) = (
            Arc::downgrade(&self.consumer),
            self.watermarks.asking.clone(),
            self.watermarks.ended.clone(),
        );
        let ask = move || {
            let assigned: Vec<(String, i32)> = consumer
                .upgrade()
                .and_then(|consumer| consumer.assignment().ok())
                .map(|assignment| {
                    let elements = assignment.elements();
                    elements
                        .iter()
                        .map(|a| (a.topic().to_owned(), a.partition()))
                        .collect()
                })
                .unwrap_or_default();
            for (topic, partition) in assigned {
                let Some(consumer) = consumer
                    .upgrade()
                    .filter(|_| !ended.load(Ordering::Acquire))
                else {
                    break;
                };
                match consumer.fetch_watermarks(&topic, partition, WATERMARK_TIMEOUT) {
                    Ok((_, high)) => {
                        consumer.context().asked_highs().insert(partition, high);
                    }
                    Err(error) => {
                        debug!(%error, partition, "high watermark not known");
                        break;
                    }
                }
            }
            asking.store(false, Ordering::Release);
        };
        if let Err(error) = thread::Builder::new().name("kafka-lag".into()).spawn(ask) {
            debug!(%error, "cannot ask for the high watermarks");
            self.watermarks.asking.store(false, Ordering::Release);
        }
    }

    /// Checks the committed position of `message`'s partition against the log, if this is its
    /// first message of the assignment, at that position (`kafka::position`): seeks the
    /// partition there with the position's leader epoch, and librdkafka asks the leader where
    /// the epoch ends: `true`, the message is dropped (it comes again, or those from where the
    /// log was cut back do). A seek that fails leaves the partition unchecked. The first message
    /// after the check, below the committed offset, says the log was cut back.
    fn seek_to_check(&self, message: &BorrowedMessage<'_>) -> bool {
        let (partition, offset) = (message.partition(), message.offset());
        let position = match self.consumer.context().unchecked().check(partition, offset) {
            Check::Read => return false,
            Check::CutBack { committed } => {
                warn!(
                    partition,
                    offset,
                    committed,
                    "the partition's log no longer holds the offset the group committed (an unclean leader election cut it back, or its leader did not know the commit's epoch): reading it again from offset"
                );
                return false;
            }
            Check::Elsewhere { committed } => {
                debug!(
                    partition,
                    offset,
                    committed,
                    "the partition's first message is not at the committed position read as it was assigned (a later commit, or a position reset): not checked"
                );
                return false;
            }
            Check::Seek(position) => position,
        };
        let list = position_list(message.topic(), &[position]);
        let sought = self
            .consumer
            .seek_partitions(list, rdkafka::util::Timeout::Never)
            .and_then(|list| {
                list.elements()
                    .first()
                    .map_or(Ok(()), |element| element.error())
            });
        match sought {
            Ok(()) => {
                self.consumer.context().unchecked().sought(position);
                debug!(
                    partition,
                    offset,
                    leader_epoch = position.leader_epoch,
                    "checking the committed position against the log"
                );
                true
            }
            Err(error) => {
                warn!(%error, partition, offset, "cannot check the committed position against the log: read from it unchecked");
                false
            }
        }
    }

    /// While intake is paused, pauses the partition of `message` if this is its first message
    /// since intake paused (it was looking up where to begin then, or had not been assigned), and
    /// sets it back to the message, which it delivers again once intake resumes: `true`, the
    /// message is not to be held. A seek to an offset the partition has (it just delivered it)
    /// starts no lookup. It waits for librdkafka's answer as the pause does (a seek that stopped
    /// waiting would still be applied, and the message then held would come twice); one that
    /// fails leaves the message held (the pause keeps the position after it).
    fn pause_at_first(&self, message: &BorrowedMessage<'_>) -> bool {
        let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
        let paused = self.consumer.context().intake().delivered(partition, |_| {
            let mut list = TopicPartitionList::new();
            list.add_partition(topic, partition);
            self.consumer.pause(&list)
        });
        let error = match paused {
            Ok(false) => return false,
            Ok(true) => match self.consumer.seek(
                topic,
                partition,
                Offset::Offset(offset),
                rdkafka::util::Timeout::Never,
            ) {
                Ok(()) => {
                    debug!(
                        partition,
                        offset, "a partition's first message while intake is paused: paused there"
                    );
                    return true;
                }
                Err(error) => error,
            },
            Err(error) => error,
        };
        if let Some(held_back) = crate::logs::PAUSE_FAILED.admit() {
            error!(%error, partition, held_back, "cannot pause a partition at its first message");
        }
        false
    }

    /// Pauses or resumes the assigned partitions, when intake's state changes: pausing, those
    /// that have delivered a message in their assignment (librdkafka has their position);
    /// resuming, those paused. (A failure is logged and tried again at the next poll.)
    fn pause(&mut self, pause: bool) {
        if pause == self.paused_since.is_some() {
            return;
        }
        let consumer = &self.consumer;
        let mut intake = consumer.context().intake();
        let result = if pause {
            consumer.position().and_then(|positions| {
                let placed: Vec<i32> = positions
                    .elements()
                    .iter()
                    .filter(|p| matches!(p.offset(), Offset::Offset(_)))
                    .map(|p| p.partition())
                    .collect();
                intake.pause(placed, |placed| consumer.pause(&only(&positions, placed)))
            })
        } else {
            consumer.assignment().and_then(|assignment| {
                intake.resume(|paused| consumer.resume(&only(&assignment, paused)))
            })
        };
        drop(intake);
        if let Err(error) = result {
            // Tried again at every poll (ten a second) while it fails: throttled.
            if let Some(held_back) = crate::logs::PAUSE_FAILED.admit() {
                error!(%error, pause, held_back, "cannot pause or resume the assigned partitions");
            }
            return;
        }
        // The pipeline reports its own backpressure (`/status` `paused`, `consumer.paused_ms`).
        if pause {
            self.paused_since = Some(Instant::now());
            debug!(
                held = self.held.len(),
                "no room in the hand-over: partitions paused"
            );
        } else if let Some(since) = self.paused_since.take() {
            // Fetches bring the high watermarks again.
            self.consumer.context().asked_highs().clear();
            self.watermarks.asked_at = None;
            debug!(
                paused_ms = since.elapsed().as_millis() as u64,
                "partitions resumed"
            );
        }
    }
}

/// Commits `positions` for `consumer`'s group and waits for the answer at most `wait`; past it
/// the commit counts as failed (timed out) and its answer, should one come, is dropped.
/// librdkafka's own synchronous commit (`CommitMode::Sync`) waits without end: a commit no broker
/// answered (one that stopped mid-request) held its caller for good — a tool's run, or the
/// pipeline's commits and every drain waiting on them. A commit that timed out may still land
/// later, behind those after it: at worst it moves the group's position back, and what lies past
/// it is read again.
pub fn commit_within<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    positions: &TopicPartitionList,
    wait: Duration,
) -> Result<(), KafkaError> {
    let client = consumer.client().native_ptr();
    // SAFETY: a queue of this call's own on a live client, destroyed below. Given a queue,
    // librdkafka posts the commit's answer there as an event (no callback is called); the list is
    // copied.
    unsafe {
        let queue = rdsys::rd_kafka_queue_new(client);
        let asked = rdsys::rd_kafka_commit_queue(
            client,
            positions.ptr(),
            queue,
            None,
            std::ptr::null_mut(),
        );
        let answer = if asked == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
            let event = rdsys::rd_kafka_queue_poll(queue, wait_ms);
            if event.is_null() {
                rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT
            } else {
                let error = rdsys::rd_kafka_event_error(event);
                rdsys::rd_kafka_event_destroy(event);
                error
            }
        } else {
            asked
        };
        rdsys::rd_kafka_queue_destroy(queue);
        match answer {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
            error => Err(KafkaError::ConsumerCommit(error.into())),
        }
    }
}

/// Closes `consumer` now, leaving its group: what dropping its last handle does, done by whoever
/// holds one (another handle, held elsewhere, would close it wherever that one is dropped). The
/// revoke callback runs here, on the caller's thread. Waits until the close ends, as the drop
/// does: run it within [`close_within`].
pub fn leave_group<C: ConsumerContext>(consumer: &BaseConsumer<C>) {
    // Refused when the consumer is closed already (or has no group): nothing to wait for.
    if consumer.close_queue().is_ok() {
        while !consumer.closed() {
            consumer.poll(Duration::from_millis(100));
        }
    }
}

/// Runs `close` — what drops a consumer with a group id, and any client beside it — off the async
/// runtime, waiting for it at most `budget`; whether it finished. Dropping such a consumer leaves
/// its group, and librdkafka may wait for an unreachable coordinator without end there: a commit
/// tried while no broker answers leaves the close querying for the coordinator for ever
/// (librdkafka issue 3740, open in 2.12). Past the budget the close is left to the process's exit:
/// what was committed stands, and a session the group no longer hears from expires on its own.
pub async fn close_within(budget: Duration, close: impl FnOnce() + Send + 'static) -> bool {
    tokio::time::timeout(budget, tokio::task::spawn_blocking(close))
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::position::Position;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    fn lag_gauges(
        snapshotter: &metrics_util::debugging::Snapshotter,
    ) -> std::collections::BTreeMap<String, f64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Gauge(v) => {
                    let partition = key
                        .key()
                        .labels()
                        .find(|l| l.key() == "partition")?
                        .value()
                        .to_owned();
                    Some((partition, v.into_inner()))
                }
                _ => None,
            })
            .collect()
    }

    /// A revoke that comes after the pipeline stopped on an error (it runs on the polling thread
    /// until that stops too): its partitions are abandoned, so that flushes still under way write
    /// nothing more of them. The failed hand-over skipped that, and the pipeline's own
    /// `abandon_all` no longer saw them.
    #[test]
    fn a_revoke_the_stopped_pipeline_cannot_drain_abandons_its_partitions() {
        let (revokes, pipeline) = mpsc::unbounded_channel();
        drop(pipeline);
        let context =
            IngestContext::new(revokes, Duration::from_secs(5), Arc::default(), false, None);
        let ownership = context.ownership();
        context.gained(&[0, 1]);
        let before = ownership.generation();
        let consumer: BaseConsumer<IngestContext> = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .create_with_context(context)
            .unwrap();
        let mut revoked = rdkafka::TopicPartitionList::new();
        revoked.add_partition("t", 0);
        consumer
            .context()
            .pre_rebalance(&consumer, &Rebalance::Revoke(&revoked));
        assert!(ownership.lost_since(0, before), "abandoned");
        assert!(!ownership.lost_since(1, before), "still owned");
    }

    #[test]
    fn in_the_group_once_joined_with_the_coordinator_connected() {
        for member_epoch in [None, Some(3)] {
            assert!(in_group("up", "steady", member_epoch));
            for join_state in ["wait-join", "wait-sync", "wait-unassign-to-complete"] {
                assert!(!in_group("up", join_state, member_epoch));
            }
            assert!(!in_group("wait-coord", "steady", member_epoch));
            assert!(!in_group("query-coord", "init", member_epoch));
        }
        // A classic member is in `init` before its first join; with the consumer protocol an
        // idle member stays there, with an epoch the coordinator gave it — and one whose
        // heartbeats are refused, without.
        assert!(!in_group("up", "init", None));
        assert!(in_group("up", "init", Some(1)));
        assert!(!in_group("up", "init", Some(0)));
        assert!(!in_group("up", "init", Some(-1)));
    }

    #[test]
    fn lag_is_reported_for_owned_partitions_only_and_zeroed_when_one_is_given_away() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let status = Arc::new(Status::default());
            let context = IngestContext::new(
                mpsc::unbounded_channel().0,
                Duration::from_secs(1),
                status.clone(),
                false,
                None,
            );
            context.gained(&[0, 1]);
            context.report_lag([(0, 5), (1, 7), (2, 9), (1, -1)].into_iter());
            assert_eq!(
                lag_gauges(&snapshotter),
                [("0".into(), 5.0), ("1".into(), 7.0)].into()
            );
            context.given_up(&[1], false);
            // Statistics may still list the partition given away, with its last lag.
            context.report_lag([(0, 4), (1, 7)].into_iter());
            assert_eq!(
                lag_gauges(&snapshotter),
                [("0".into(), 4.0), ("1".into(), 0.0)].into()
            );
            assert_eq!(
                status.snapshot().partitions,
                [0].into(),
                "what /status shows"
            );
        });
    }

    #[test]
    fn only_errors_no_retry_gets_past_stop_the_member() {
        let refused = |code| refusal(&KafkaError::MessageConsumption(code));
        let session = refused(RDKafkaErrorCode::InvalidSessionTimeout).unwrap();
        assert!(session.contains("`--session-timeout-ms`"), "{session}");
        assert!(
            refused(RDKafkaErrorCode::GroupAuthorizationFailed)
                .unwrap()
                .contains("READ on the group")
        );
        for passing in [
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::RebalanceInProgress,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ] {
            assert_eq!(refused(passing), None, "{passing:?}");
        }
        assert_eq!(refusal(&KafkaError::PartitionEOF(0)), None);
    }

    #[test]
    fn a_commit_no_broker_answers_fails_as_timed_out_at_its_deadline() {
        // No broker to find the group's coordinator on: librdkafka itself would hold the commit
        // for the session timeout (45 s) and then fail it as waiting for the coordinator, and
        // a commit in flight to a broker that stopped answering for good.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "commit-within")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let positions = position_list("t", &[Position::at(0, 7)]);
        assert_eq!(
            commit_within(&consumer, &positions, Duration::from_millis(300)),
            Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::OperationTimedOut
            ))
        );
        // Closing waits for the commit librdkafka still holds: not this test's business.
        thread::spawn(move || drop(consumer));
    }
}
