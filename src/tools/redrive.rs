//! `replay-ingest redrive`: dead letters back onto the input topic once their cause is fixed (a
//! sink that refused data, a bug since fixed). It reads the dead-letter topic as a consumer group
//! of its own — from where that group last stopped, up to the end the topic had when the run
//! started — and re-produces each chosen letter's original value and key (from the record, or
//! from the blob store for one too large for its topic) to `--topic`, at a bounded rate, up to
//! [`IN_FLIGHT_LETTERS`] at once; a letter is handled once it and every letter read before it
//! are through. A letter over `--topic`'s `max.message.bytes` stops the run before it is sent.
//! Letters gone from the topic since the group's last commit (its retention) are named. The
//! letter's own headers (`reason`, `detail`, `original_*`, …) are left behind; the re-driven
//! message carries one header, `redriven_from`, naming the letter (`topic/partition/offset`).
//!
//! Every letter handled is committed for this group, chosen or not (another `--group-id` reads
//! the topic afresh): every second while the run goes, and when it ends, however it ends (an
//! error, a broker that stops answering), so that a second run goes on where it stopped. What it
//! sent since the last commit that went through is sent again by the next run: a second's worth,
//! or more if the broker stopped taking commits. A run whose brokers stop answering waits for a
//! delivery or a commit at most twice `--sink-timeout-ms` and 5 s more ([`answer_deadline`]),
//! and does not wait to leave its group ([`close_within`]). Letters that arrive after the run
//! started are left for the next one. A letter that cannot be re-driven (its stored value is
//! gone, its original bytes were lost before it was written, its headers are not a dead letter's)
//! is reported, with where it is, and the run exits non-zero. A blob store that cannot be read
//! (down, or not the store a letter points to) stops the run at that letter, uncommitted: the
//! next run starts with it.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io::Write;
use std::ops::Range;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use super::instant;
use crate::config::{BlobArgs, KafkaArgs, producer_properties};
use crate::kafka::consumer::{close_within, commit_within};
use crate::kafka::producer::Producer;
use crate::kafka::record::{REDRIVEN_FROM, REDRIVEN_FROM_HEADER};
use crate::kafka::refetch::about_a_broker;
use crate::kafka::{Logged, answer_deadline};
use crate::recording::Reason;
use crate::sink::publish::{DELIVERY_WINDOW_BYTES, RECORD_OVERHEAD_BYTES, TopicLimits};
use crate::sink::store::BlobStore;

/// The group of runs that choose every letter.
const DEFAULT_GROUP: &str = "replay-ingest-redrive";

/// Re-drive dead letters to the input topic.
#[derive(Args, Debug, Clone)]
pub struct RedriveArgs {
    /// The dead-letter topic to read.
    #[arg(
        long,
        env = "REPLAY_INGEST_DLQ_TOPIC",
        default_value = "ingest-replay-recordings-dlq"
    )]
    pub dlq_topic: String,
    /// Where the letters go back to: the service's input topic.
    #[arg(
        long,
        env = "REPLAY_INGEST_TOPIC",
        default_value = "ingest-replay-recordings"
    )]
    pub topic: String,
    /// The consumer group this run reads as: a second run of the same group goes on where the
    /// first stopped. Default: `replay-ingest-redrive`, for runs that choose every letter; a run
    /// that chooses (`--reason`, `--original-topic`, `--since`, `--until`, `--skip-redriven`)
    /// needs one named, as it commits the letters it passes over too.
    #[arg(long)]
    pub group_id: Option<String>,
    /// Only letters of this reason (e.g. `rejected_by_sink`); repeat for several. Default: all.
    #[arg(long = "reason")]
    pub reasons: Vec<String>,
    /// Only letters dead-lettered from this topic (their `original_topic`); default: all. Every
    /// letter chosen goes to `--topic`, whatever topic it came from.
    #[arg(long)]
    pub original_topic: Option<String>,
    /// Only letters dead-lettered at or after this instant (RFC 3339, e.g. 2026-12-01T10:00:00Z).
    #[arg(long, value_parser = instant)]
    pub since: Option<SystemTime>,
    /// Only letters dead-lettered before this instant (RFC 3339).
    #[arg(long, value_parser = instant)]
    pub until: Option<SystemTime>,
    /// Pass over the letters of messages that were re-driven already and failed again (they
    /// carry `redriven_from`), committing past them for the group (as any choice: a group of
    /// its own).
    #[arg(long)]
    pub skip_redriven: bool,
    /// Re-drive at most this many letters (the rest stay for the next run).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Most letters re-produced per second.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: u32,
    /// Count what would be re-driven, by reason; produce and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where the values of letters too large for their topic are kept.
    #[command(flatten)]
    pub blobs: BlobArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Longest one request (the broker, the blob store) may take, ms.
    #[arg(long, env = "REPLAY_INGEST_SINK_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(crate::config::SINK_TIMEOUT_MS), default_value_t = 30_000)]
    pub sink_timeout_ms: u64,
}

/// What became of the letters read, by reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub redriven: BTreeMap<String, u64>,
    pub passed_over: u64,
    pub failed: Failed,
    /// Letters of a message another letter of this run re-drove already.
    pub copies: u64,
}

/// Runs the re-drive, writing what it does to `out`.
pub async fn run(args: &RedriveArgs, out: &mut impl Write) -> anyhow::Result<()> {
    args.kafka.validate()?;
    args.blobs.validate().map_err(anyhow::Error::msg)?;
    for reason in &args.reasons {
        if Reason::from_name(reason).is_none() {
            bail!(
                "--reason {reason:?} is not a dead-letter reason (one of: {})",
                Reason::names().join(", ")
            );
        }
    }
    if let (Some(since), Some(until)) = (args.since, args.until)
        && since >= until
    {
        bail!("--since must be before --until");
    }
    if args.topic == args.dlq_topic {
        bail!(
            "--topic and --dlq-topic are both {}: --topic is where the letters go back to, the service's input topic",
            args.topic
        );
    }
    let chooses = !args.reasons.is_empty()
        || args.original_topic.is_some()
        || args.since.is_some()
        || args.until.is_some()
        || args.skip_redriven;
    if chooses && args.group_id.is_none() && !args.dry_run {
        // A run commits the letters it passes over: one choosing `internal_error` on the default
        // group, then one choosing `rejected_by_sink`, found none of the latter's older letters
        // (committed by the first run), said "0 re-driven" and exited 0, while they waited on the
        // topic for its retention.
        bail!(
            "a run that chooses letters (--reason, --original-topic, --since, --until, --skip-redriven) commits those it passes over for its group: name a --group-id of its own for this choice (e.g. redrive-internal-error-2026-12-05), so that runs choosing other letters still find theirs"
        );
    }
    let timeout = Duration::from_millis(args.sink_timeout_ms);
    let store = super::blob_store(&args.blobs, timeout).await?;
    let consumer = reader(args, timeout)?;
    // A report that could not be written stopped the run there, with the letters delivered
    // after the last one recorded (up to a thousand) left uncommitted.
    let mut reports = super::Reports::new(out);
    let ran = redrive_with(args, &consumer, store.as_deref(), timeout, &mut reports).await;
    // A run cut off from the brokers ends (its error says so) instead of hanging in the close.
    if !close_within(timeout, move || drop(consumer)).await {
        writeln!(
            reports,
            "closing the Kafka consumer did not finish within {timeout:?}; exiting anyway (what was committed stands)"
        )?;
    }
    reports.ended(ran, "committed what it handled")
}

/// The run, once its consumer is made: checks `--topic`, re-drives and commits, and says what it
/// did; `timeout` is `--sink-timeout-ms`.
async fn redrive_with(
    args: &RedriveArgs,
    consumer: &BaseConsumer<Logged>,
    store: Option<&dyn BlobStore>,
    timeout: Duration,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut producing = args
        .kafka
        .client_config(&producer_properties(64 << 20, timeout))?;
    // A mistyped --topic would be created by brokers that create topics on first use, and take
    // every letter, committed as re-driven.
    crate::sink::publish::check_topics(&producing, std::slice::from_ref(&args.topic), timeout)
        .map_err(|e| anyhow::anyhow!("--topic {}: {}; nothing re-driven", args.topic, e.message))?;
    let limit = topic_limit(&producing, &args.topic, timeout).await;
    if limit.is_none() {
        writeln!(
            out,
            "the brokers did not give {}'s max.message.bytes (is DescribeConfigs allowed on it?): letters are sent unchecked, and one over it stops the run when the broker refuses it",
            args.topic
        )?;
    }
    if let Some(limit) = limit {
        // Letters in flight together are batched: a batch over the topic's limit would be refused
        // whole, every letter in it that fits alone with it.
        producing.set("batch.size", limit.min(PRODUCER_BATCH_BYTES).to_string());
    }
    let producer: Producer = producing.create().context("creating the Kafka producer")?;
    let (unread, expired) = start(consumer, &args.dlq_topic, timeout)?;
    let mut read = Read::default();
    for gone in expired {
        read.positions.insert(gone.partition, gone.to);
        read.name_gone(gone, out)?;
    }
    let result = redrive_letters(
        args,
        Clients {
            consumer,
            producer: &producer,
            store,
            limit,
            foreign: tokio::sync::OnceCell::new(),
        },
        &unread,
        &mut read,
        out,
    )
    .await;
    // However the run ends, what it handled is committed: a second run goes on where this one
    // stopped instead of re-driving it all again.
    let committed = read.commit(args, consumer);
    if let (Err(stopped), Err(uncommitted)) = (&result, &committed) {
        bail!(
            "{stopped:#}; committing what the run handled failed too ({uncommitted:#}): the next run re-drives it again"
        );
    }
    result?;
    committed?;
    let counts = read.counts;
    let total: u64 = counts.redriven.values().sum();
    let verb = if args.dry_run {
        "would be re-driven"
    } else {
        "re-driven"
    };
    writeln!(
        out,
        "{total} letter(s) {verb}, {} passed over, {} failed{}",
        counts.passed_over,
        counts.failed.count,
        match counts.copies {
            0 => String::new(),
            n => format!(", {n} copies of letters re-driven skipped"),
        }
    )?;
    for (reason, n) in &counts.redriven {
        writeln!(out, "  {reason:<22} {n}")?;
    }
    counts.failed.error().map_or(Ok(()), Err)
}

/// The letters that could not be re-driven: how many, and the first [`FAILED_KEPT`] of them,
/// each with where it is and why (a run pointed at a topic of something else finds a million).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Failed {
    pub count: u64,
    pub kept: Vec<String>,
    /// The letters the kept lines name (a range gone from the topic names many).
    pub named: u64,
}

/// How many letters that could not be re-driven a run names.
const FAILED_KEPT: usize = 100;

impl Failed {
    fn push(&mut self, letter: String) {
        self.push_letters(1, letter);
    }

    /// `letters` that failed together, named by one `line` (a range gone from the topic).
    fn push_letters(&mut self, letters: u64, line: String) {
        self.count += letters;
        if self.kept.len() < FAILED_KEPT {
            self.kept.push(line);
            self.named += letters;
        }
    }

    /// What the run ends with when any failed.
    fn error(&self) -> Option<anyhow::Error> {
        let more = match self.count - self.named {
            0 => String::new(),
            n => format!("\n  … and {n} more"),
        };
        (self.count > 0).then(|| {
            super::LeftForGood(format!(
                "{} letter(s) could not be re-driven:\n  {}{more}",
                self.count,
                self.kept.join("\n  ")
            ))
            .into()
        })
    }
}

/// How often a run commits what it has handled (and once more when it ends, however it ends):
/// a run killed loses at most this much of its progress.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// How much a run fetches ahead of the letter it handles, KiB.
const READ_AHEAD_KIB: usize = 4 << 10;

/// Most letters a run has read and not yet recorded: sent and waiting for their acknowledgement,
/// or behind one that is (besides at most [`DELIVERY_WINDOW_BYTES`] of values sent). One at a
/// time, each send waited out `linger.ms` and the brokers' acknowledgement: about 150 letters a
/// second, whatever `--rate` said.
const IN_FLIGHT_LETTERS: usize = 1000;

/// librdkafka's default `batch.size`, lowered to the topic's `max.message.bytes` when that is less.
const PRODUCER_BATCH_BYTES: usize = 1_000_000;

/// Each partition's letters a run reads: from the group's position to the partition's end when
/// the run started.
type Unread = BTreeMap<i32, Range<i64>>;

/// Letters gone from a partition before this group read them: the group's committed offset is
/// below the partition's first, or the partition's first passed the letters a run was about to
/// read (the topic's retention, or a deletion of records, removed them).
#[derive(Debug)]
struct Expired {
    topic: String,
    partition: i32,
    from: i64,
    to: i64,
}

impl Expired {
    fn letters(&self) -> u64 {
        u64::try_from(self.to - self.from).unwrap_or(0)
    }
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Expired {
            topic,
            partition,
            from,
            to,
        } = self;
        write!(
            f,
            "{topic}/{partition}/{from}..{to}: {} letter(s) gone from the topic before this group read them (its retention, or records deleted): they cannot be re-driven",
            self.letters()
        )
    }
}

/// What a run has read: the counts, and each partition's next offset to commit.
#[derive(Default)]
struct Read {
    counts: Counts,
    positions: BTreeMap<i32, i64>,
    last_commit: Option<Instant>,
    /// The originals re-driven so far: topic (its index in `topics`), partition, offset and
    /// timestamp — 24 bytes each, so a million letters hold tens of MB.
    sent: std::collections::HashSet<(usize, i32, i64, i64)>,
    topics: Vec<String>,
}

impl Read {
    /// Records a letter whose turn has come (every letter read before it is recorded): its
    /// position, to be committed, and, for one sent, that it was re-driven — or the error its
    /// delivery failed with, which ends the run before it.
    fn record(
        &mut self,
        handled: Handled,
        args: &RedriveArgs,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        if let Some(sent) = handled.sent {
            // A delivery that timed out may yet reach the topic; the letter is not committed, so
            // the next run sends it again.
            sent.delivered
                .with_context(|| format!("re-producing {} to {}", sent.at, args.topic))?;
            // A run's output does not fail (`Reports`): an output gone stops nothing here.
            writeln!(
                out,
                "re-driven {} ({}, {} bytes)",
                sent.at, sent.reason, sent.bytes
            )?;
            *self.counts.redriven.entry(sent.reason).or_default() += 1;
        }
        self.positions.insert(handled.partition, handled.offset + 1);
        Ok(())
    }

    /// Names letters gone from the topic before the run read them, counted as failed.
    fn name_gone(&mut self, gone: Expired, out: &mut impl Write) -> anyhow::Result<()> {
        writeln!(out, "{gone}")?;
        self.counts
            .failed
            .push_letters(gone.letters(), gone.to_string());
        Ok(())
    }

    /// The letter's original message — its `original_topic`, `_partition`, `_offset` and
    /// `_timestamp` (the timestamp tells apart two messages at one offset of a topic recreated,
    /// or of a log cut back) — when it says all four.
    fn origin(&mut self, letter: &BorrowedMessage<'_>) -> Option<(usize, i32, i64, i64)> {
        let topic = header(letter, c"original_topic")?;
        let partition = header(letter, c"original_partition")?.parse().ok()?;
        let offset = header(letter, c"original_offset")?.parse().ok()?;
        // Empty for a message the broker gave no timestamp.
        let timestamp = match header(letter, c"original_timestamp")? {
            t if t.is_empty() => -1,
            t => t.parse().ok()?,
        };
        let index = match self.topics.iter().position(|t| *t == topic) {
            Some(index) => index,
            None => {
                self.topics.push(topic);
                self.topics.len() - 1
            }
        };
        Some((index, partition, offset, timestamp))
    }

    /// Commits the letters handled so far (nothing in a dry run), waiting for the answer at most
    /// [`answer_deadline`] with the run's request timeout.
    fn commit(
        &mut self,
        args: &RedriveArgs,
        consumer: &BaseConsumer<Logged>,
    ) -> anyhow::Result<()> {
        self.last_commit = Some(Instant::now());
        if args.dry_run || self.positions.is_empty() {
            return Ok(());
        }
        let mut positions = TopicPartitionList::new();
        for (&partition, &next) in &self.positions {
            positions.add_partition_offset(&args.dlq_topic, partition, Offset::Offset(next))?;
        }
        let wait = answer_deadline(Duration::from_millis(args.sink_timeout_ms));
        commit_within(consumer, &positions, wait).context("committing what was read")
    }
}

/// The clients a run reads and writes with, and the largest record `--topic` takes (its
/// `max.message.bytes`), when the brokers said.
struct Clients<'a> {
    consumer: &'a BaseConsumer<Logged>,
    producer: &'a Producer,
    store: Option<&'a dyn BlobStore>,
    limit: Option<usize>,
    /// Why the store is not the service's, if it is not: looked at once, at the first copy
    /// missing from it.
    foreign: tokio::sync::OnceCell<Option<String>>,
}

/// A letter read, in the order read.
struct Handled {
    partition: i32,
    offset: i64,
    sent: Option<Sent>,
}

/// A letter sent: where it is, why it was dead-lettered, its value's size, and how its delivery
/// ended.
struct Sent {
    at: String,
    reason: String,
    bytes: usize,
    delivered: Result<(), rdkafka::error::KafkaError>,
}

/// The letters read and not yet recorded, in the order read: sends under way (each a task of
/// its own, so that the record reaches the producer's queue at once and its acknowledgement is
/// taken while the run reads on), and letters handled already behind them, whose positions wait
/// for theirs.
#[derive(Default)]
struct InFlight {
    letters: std::collections::VecDeque<Pending>,
    /// The values sent among them.
    bytes: usize,
}

enum Pending {
    Handled(Handled),
    Sending(tokio::task::JoinHandle<Handled>),
}

impl InFlight {
    /// A letter handled without a send (passed over, a copy, one that cannot be re-driven).
    fn handled(&mut self, partition: i32, offset: i64) {
        self.letters.push_back(Pending::Handled(Handled {
            partition,
            offset,
            sent: None,
        }));
    }

    /// Sends a letter's original to `topic`.
    fn send(
        &mut self,
        producer: &Producer,
        topic: &str,
        (partition, offset): (i32, i64),
        (at, reason): (String, String),
        (value, key): (Vec<u8>, Option<Vec<u8>>),
    ) {
        let (producer, topic) = (producer.clone(), topic.to_owned());
        self.bytes += value.len();
        self.letters
            .push_back(Pending::Sending(tokio::spawn(async move {
                let headers = OwnedHeaders::new().insert(Header {
                    key: REDRIVEN_FROM,
                    value: Some(at.as_str()),
                });
                let mut record = FutureRecord::to(&topic).payload(&value).headers(headers);
                if let Some(key) = &key {
                    record = record.key(key);
                }
                let delivered = producer.send(record).await.map(drop);
                Handled {
                    partition,
                    offset,
                    sent: Some(Sent {
                        at,
                        reason,
                        bytes: value.len(),
                        delivered,
                    }),
                }
            })));
    }

    /// The oldest letter, once its turn has come: at once when it is done, else waited for
    /// when `wait`; `None` when nothing is in flight, or the oldest is under way and not waited
    /// for.
    async fn oldest(&mut self, wait: bool) -> anyhow::Result<Option<Handled>> {
        let handled = match self.letters.front_mut() {
            None => return Ok(None),
            Some(Pending::Handled(_)) => match self.letters.pop_front() {
                Some(Pending::Handled(handled)) => handled,
                _ => unreachable!("the front was a handled letter"),
            },
            Some(Pending::Sending(task)) => {
                if !wait && !task.is_finished() {
                    return Ok(None);
                }
                let handled = task.await.context("a send's task failed")?;
                self.letters.pop_front();
                handled
            }
        };
        self.bytes -= handled.sent.as_ref().map_or(0, |s| s.bytes);
        Ok(Some(handled))
    }

    /// Records, in the order read, every letter whose turn has come; while more than `keep`
    /// letters (or [`DELIVERY_WINDOW_BYTES`] of values) are in flight, waits for the oldest. A
    /// failed delivery ends the run there, once the letters sent after it are through (the error
    /// says how many of them reached the topic: uncommitted, the next run sends them again).
    async fn settle(
        &mut self,
        keep: usize,
        read: &mut Read,
        args: &RedriveArgs,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        loop {
            let wait = self.letters.len() > keep || self.bytes > DELIVERY_WINDOW_BYTES;
            let Some(handled) = self.oldest(wait).await? else {
                return Ok(());
            };
            if let Err(error) = read.record(handled, args, out) {
                let mut delivered = 0;
                while let Some(later) = self.oldest(true).await? {
                    delivered += u64::from(later.sent.is_some_and(|s| s.delivered.is_ok()));
                }
                return Err(match delivered {
                    0 => error,
                    n => error.context(format!(
                        "{n} letter(s) read after it reached {} before the run stopped, uncommitted: the next run re-drives them again",
                        args.topic
                    )),
                });
            }
        }
    }
}

/// `topic`'s `max.message.bytes`, unless the brokers do not say (no `DescribeConfigs` on it):
/// its letters are then sent unchecked, and the broker decides.
async fn topic_limit(
    config: &rdkafka::ClientConfig,
    topic: &str,
    timeout: Duration,
) -> Option<usize> {
    let limits = TopicLimits::new(config, vec![topic.to_owned()], timeout);
    limits.read().await.ok()?.get(topic).copied()
}

/// A record's size on the broker, as its topic's `max.message.bytes` counts it: key, value,
/// the `redriven_from` header (with its two lengths, 5 bytes at most each) and the framing.
fn record_bytes(value: &[u8], key: Option<&[u8]>, at: &str) -> usize {
    key.map_or(0, <[u8]>::len)
        + value.len()
        + REDRIVEN_FROM.len()
        + at.len()
        + 2 * 5
        + RECORD_OVERHEAD_BYTES
}

/// Reads the `unread` letters (each partition's, from the group's position up to the end it had
/// when the run started) and re-drives the chosen ones. A letter counts as handled — its position is recorded in `read` — once it
/// is re-driven (delivered to `--topic`), passed over, or reported as one that cannot be, and
/// every letter read before it is handled too; an error (the broker, a send) ends the run before
/// the letter it happened on, once the sends under way are through.
async fn redrive_letters(
    args: &RedriveArgs,
    clients: Clients<'_>,
    unread: &Unread,
    read: &mut Read,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut in_flight = InFlight::default();
    let result = read_letters(args, &clients, unread, read, &mut in_flight, out).await;
    // What was sent before the run stopped is recorded, to be committed, once it is through.
    let settled = in_flight.settle(0, read, args, out).await;
    result.and(settled)
}

/// [`redrive_letters`]' reading: each letter read is sent or handled, and recorded in its turn
/// while at most [`IN_FLIGHT_LETTERS`] are in flight. Letters the topic's retention removes
/// while the run reads (librdkafka then goes on from the partition's new start, saying nothing to
/// the reader) are named and counted as failed, as those gone before the run started are.
async fn read_letters(
    args: &RedriveArgs,
    clients: &Clients<'_>,
    unread: &Unread,
    read: &mut Read,
    in_flight: &mut InFlight,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut pacer = (Instant::now(), 0u32);
    // Each partition's next letter, while it has letters left to read.
    let mut remaining: BTreeMap<i32, i64> = unread.iter().map(|(&p, r)| (p, r.start)).collect();
    let timeout = Duration::from_millis(args.sink_timeout_ms);
    let idle_deadline = Duration::from_secs(30).max(timeout);
    let mut last_message = Instant::now();
    // Letters re-driven or under way (in a dry run: that would be).
    let mut started = 0u64;
    while !remaining.is_empty() {
        in_flight.settle(IN_FLIGHT_LETTERS, read, args, out).await?;
        if args.limit.is_some_and(|limit| started >= limit) {
            break;
        }
        if read
            .last_commit
            .is_none_or(|at| at.elapsed() >= COMMIT_EVERY)
            && let Err(e) = read.commit(args, clients.consumer)
        {
            // Tried again in a second, and when the run ends; until one goes through, a run
            // stopped re-drives again what it sent since the last that did.
            writeln!(out, "could not commit yet: {e:#}")?;
        }
        // The sends under way run on the runtime's other threads, and on this one meanwhile.
        tokio::task::yield_now().await;
        let Some(polled) = clients.consumer.poll(Duration::from_millis(200)) else {
            if last_message.elapsed() > idle_deadline {
                // Retention may have taken every letter a partition had left: its first offset
                // is at its end. (Below it, the letters from there are still to come, and the
                // gap before them is named when the first arrives.)
                in_flight.settle(0, read, args, out).await?;
                for (partition, next) in remaining.clone() {
                    let end = unread[&partition].end;
                    if let Some(gone) =
                        gone_from_topic(clients, args, partition, next..end, timeout)?
                            .filter(|gone| gone.to == end)
                    {
                        read.name_gone(gone, out)?;
                        read.positions.insert(partition, end);
                        finish(&mut remaining, partition, clients.consumer, &args.dlq_topic)?;
                    }
                }
                if !remaining.is_empty() {
                    bail!(
                        "no message from {} for {idle_deadline:?} before its end",
                        args.dlq_topic
                    );
                }
            }
            continue;
        };
        let letter = match polled {
            Ok(letter) => letter,
            // A broker restarting, or not answering: the client connects again, and the idle
            // deadline above bounds a broker that does not come back.
            Err(e) if about_a_broker(&e) => {
                writeln!(out, "waiting for the broker: {e}")?;
                continue;
            }
            Err(e) => return Err(e).context("reading the dead-letter topic"),
        };
        last_message = Instant::now();
        let (partition, offset) = (letter.partition(), letter.offset());
        let Some(&next) = remaining.get(&partition) else {
            continue;
        };
        let end = unread[&partition].end;
        // Offsets the partition skipped: letters retention removed before they were read, or
        // none (a compacted topic, a transaction's markers).
        let gone = match offset > next {
            true => gone_from_topic(clients, args, partition, next..offset.min(end), timeout)?,
            false => None,
        };
        if let Some(gone) = gone {
            read.name_gone(gone, out)?;
        }
        remaining.insert(partition, offset + 1);
        if offset >= end {
            // Past the end the partition had when the run started (the letters of what this
            // run re-drives, if they fail again, among them): the next run's. Reached without
            // its last letters (retention removed them meanwhile, named above), the partition
            // is done too, and committed to its end once what is in flight is through.
            if offset > next {
                in_flight.settle(0, read, args, out).await?;
                read.positions.insert(partition, end);
            }
            finish(&mut remaining, partition, clients.consumer, &args.dlq_topic)?;
            continue;
        }
        let at = format!("{}/{partition}/{offset}", args.dlq_topic);
        let reason = header(&letter, c"reason").unwrap_or_default();
        // A message is dead-lettered again when its batch is flushed again (the flush failed
        // later, the process was killed before the commit): its letters name the same original,
        // and only the first is re-driven.
        let origin = read.origin(&letter);
        if !chosen(args, &reason, &letter) {
            read.counts.passed_over += 1;
            in_flight.handled(partition, offset);
        } else if origin.as_ref().is_some_and(|o| read.sent.contains(o)) {
            writeln!(out, "skipped {at}: a copy of a letter re-driven already")?;
            read.counts.copies += 1;
            in_flight.handled(partition, offset);
        } else if args.dry_run {
            // What the letter says of itself; the blob store is not read.
            match unsendable(&letter) {
                Some(why) => {
                    writeln!(out, "cannot re-drive {at}: {why}")?;
                    read.counts.failed.push(format!("{at}: {why}"));
                }
                None => {
                    *read.counts.redriven.entry(reason).or_default() += 1;
                    read.sent.extend(origin);
                    started += 1;
                }
            }
            in_flight.handled(partition, offset);
        } else {
            // A read of the blob store that fails (an outage, a store not configured as the
            // letter's) stops the run here, before the letter is counted as handled: the next
            // run reads it again. Only what is wrong with the letter itself passes it.
            let original = original(clients, &letter).await.with_context(|| {
                format!("reading the original of {at}: stopping here; the next run starts with it")
            })?;
            match original {
                Ok((value, key)) => {
                    let size = record_bytes(&value, key.as_deref(), &at);
                    if let Some(limit) = clients.limit.filter(|&limit| size > limit) {
                        bail!(
                            "{at}: {size} bytes with the broker's framing, over the max.message.bytes of {} ({limit}): stopping here, before sending it; raise the topic's limit and run again",
                            args.topic
                        );
                    }
                    pace(&mut pacer, args.rate).await;
                    in_flight.send(
                        clients.producer,
                        &args.topic,
                        (partition, offset),
                        (at, reason),
                        (value, key),
                    );
                    read.sent.extend(origin);
                    started += 1;
                }
                Err(why) => {
                    writeln!(out, "cannot re-drive {at}: {why}")?;
                    read.counts.failed.push(format!("{at}: {why}"));
                    in_flight.handled(partition, offset);
                }
            }
        }
        if offset + 1 >= end {
            finish(&mut remaining, partition, clients.consumer, &args.dlq_topic)?;
        }
    }
    Ok(())
}

/// The letters of `skipped` gone from `partition` before the run read them: those below the
/// partition's first offset now (its retention, or records deleted).
fn gone_from_topic(
    clients: &Clients<'_>,
    args: &RedriveArgs,
    partition: i32,
    skipped: Range<i64>,
    timeout: Duration,
) -> anyhow::Result<Option<Expired>> {
    let (first, _) = clients
        .consumer
        .fetch_watermarks(&args.dlq_topic, partition, timeout)
        .with_context(|| format!("reading where {}/{partition} starts now", args.dlq_topic))?;
    let to = first.min(skipped.end);
    Ok((to > skipped.start).then(|| Expired {
        topic: args.dlq_topic.clone(),
        partition,
        from: skipped.start,
        to,
    }))
}

/// Done with `partition`: nothing more is fetched from it.
fn finish(
    remaining: &mut BTreeMap<i32, i64>,
    partition: i32,
    consumer: &BaseConsumer<Logged>,
    topic: &str,
) -> anyhow::Result<()> {
    if remaining.remove(&partition).is_some() {
        let mut done = TopicPartitionList::new();
        done.add_partition(topic, partition);
        consumer.pause(&done)?;
    }
    Ok(())
}

fn reader(args: &RedriveArgs, timeout: Duration) -> anyhow::Result<BaseConsumer<Logged>> {
    let mut config = args
        .kafka
        .client_config(&session_within_poll_interval(&args.kafka))?;
    config
        .set(
            "group.id",
            args.group_id.as_deref().unwrap_or(DEFAULT_GROUP),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        // A paced run needs little ahead of it: librdkafka's default fetches up to 64 MiB ahead,
        // which letters of up to a megabyte each fill, for a run that re-drives 100 a second.
        .set("queued.max.messages.kbytes", READ_AHEAD_KIB.to_string())
        .set("socket.timeout.ms", timeout.as_millis().to_string());
    config
        .create_with_context(Logged("the dead-letter reader"))
        .context("creating the Kafka consumer")
}

/// librdkafka refuses a classic-protocol consumer whose `max.poll.interval.ms` is below its
/// session timeout (45 s by default). A deployment that shortens the poll interval through
/// `--kafka-property` (the service pairs it with `--session-timeout-ms`) would make the tool
/// fail to start: the session is shortened to match (the tool assigns, it joins no group).
fn session_within_poll_interval(kafka: &crate::config::KafkaArgs) -> Vec<(&'static str, String)> {
    const LIBRDKAFKA_SESSION_MS: u64 = 45_000;
    let poll_interval = kafka.properties().ok().and_then(|properties| {
        properties
            .iter()
            .find(|(key, _)| key == "max.poll.interval.ms")
            .and_then(|(_, value)| value.parse::<u64>().ok())
    });
    match poll_interval {
        Some(ms) if ms < LIBRDKAFKA_SESSION_MS && !kafka.consumer_group_protocol() => vec![
            ("session.timeout.ms", ms.to_string()),
            (
                "heartbeat.interval.ms",
                (ms / 3).clamp(100, 3000).to_string(),
            ),
        ],
        _ => Vec::new(),
    }
}

/// How long a run waits before asking a moving group coordinator again.
const COORDINATOR_RETRY: Duration = Duration::from_millis(200);

/// The group's committed offsets of `wanted`, within `timeout`. A coordinator that is loading
/// the group's offsets or has just moved (a broker started or restarted, the offsets topic's
/// leader changing) answers with an error librdkafka gives back at once, not retried: asked
/// again until the timeout. The run failed on it (seen right after a broker started).
fn committed_within(
    consumer: &BaseConsumer<Logged>,
    wanted: &TopicPartitionList,
    timeout: Duration,
) -> rdkafka::error::KafkaResult<TopicPartitionList> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.committed_offsets(wanted.clone(), left) {
            Err(e) if coordinator_moving(&e) && Instant::now() + COORDINATOR_RETRY < deadline => {
                std::thread::sleep(COORDINATOR_RETRY);
            }
            answered => return answered,
        }
    }
}

/// Whether `error` says the group's coordinator is elsewhere or not ready yet: passing.
fn coordinator_moving(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::{
        CoordinatorLoadInProgress, CoordinatorNotAvailable, NotCoordinator,
    };
    matches!(
        error.rdkafka_error_code(),
        Some(NotCoordinator | CoordinatorLoadInProgress | CoordinatorNotAvailable)
    )
}

/// Assigns every partition from the group's committed offset (the start without one); returns
/// the letters to read of each partition that has any left (from there to its end now), and the
/// letters gone from a partition since the group's commit.
fn start(
    consumer: &BaseConsumer<Logged>,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<(Unread, Vec<Expired>)> {
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("reading the partitions of {topic}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut wanted = TopicPartitionList::new();
    for &p in &partitions {
        wanted.add_partition(topic, p);
    }
    let committed = committed_within(consumer, &wanted, timeout)
        .context("reading the group's committed offsets")?;
    let mut assignment = TopicPartitionList::new();
    let (mut unread, mut expired) = (BTreeMap::new(), Vec::new());
    for &p in &partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        let from = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) if o < low => {
                expired.push(Expired {
                    topic: topic.to_owned(),
                    partition: p,
                    from: o,
                    to: low,
                });
                low
            }
            Some(Offset::Offset(o)) => o,
            _ => low,
        };
        if from < high {
            assignment.add_partition_offset(topic, p, Offset::Offset(from))?;
            unread.insert(p, from..high);
        }
    }
    consumer.assign(&assignment)?;
    Ok((unread, expired))
}

fn header(letter: &BorrowedMessage<'_>, name: &CStr) -> Option<String> {
    crate::kafka::record::header(letter, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Whether the filters take the letter.
fn chosen(args: &RedriveArgs, reason: &str, letter: &BorrowedMessage<'_>) -> bool {
    if !args.reasons.is_empty() && !args.reasons.iter().any(|r| r == reason) {
        return false;
    }
    if args.skip_redriven && header(letter, REDRIVEN_FROM_HEADER).is_some() {
        return false;
    }
    if let Some(topic) = &args.original_topic
        && header(letter, c"original_topic").as_ref() != Some(topic)
    {
        return false;
    }
    let at = letter
        .timestamp()
        .to_millis()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
    let after_since = args
        .since
        .is_none_or(|since| at.is_some_and(|t| t >= since));
    let before_until = args.until.is_none_or(|until| at.is_some_and(|t| t < until));
    after_since && before_until
}

/// Why `letter` cannot be re-driven whatever the store holds, if it cannot.
fn unsendable(letter: &BorrowedMessage<'_>) -> Option<&'static str> {
    if header(letter, c"reason").is_none() {
        return Some("not a dead letter (no reason header)");
    }
    header(letter, c"original_lost").map(|_| {
        "its original bytes were gone from the topic, or another message was at its offset, when it was dead-lettered (see its detail)"
    })
}

/// The letter's original value and key: from the record, or from the blob store where the
/// record points (`payload_location`, `key_location`). `Ok(Err(why))`: the letter cannot be
/// re-driven, ever (its stored value is gone or was never where copies are kept, it is not a
/// dead letter, its original was lost);
/// `Err`: the store could not be read (down, or not the one the letter points to), which a later
/// run may get past.
async fn original(
    clients: &Clients<'_>,
    letter: &BorrowedMessage<'_>,
) -> anyhow::Result<Result<(Vec<u8>, Option<Vec<u8>>), String>> {
    let store = clients.store;
    if let Some(why) = unsendable(letter) {
        return Ok(Err(why.into()));
    }
    let stored = |location: String| async move {
        let store = store.context("the value is in the blob store, and --blob-sink is null")?;
        let key = stored_key(store, &location)
            .with_context(|| format!("{location} is not in the configured blob store"))?;
        // A header naming `file:///root/../etc/…` would have the tool read a file outside the
        // store and produce it onto the input topic.
        if !crate::sink::dlq::is_copy_key(key) {
            if key.contains("/dlq/") && !key.split('/').any(|part| part == "..") {
                // The service's `dlq/` below the store's top: the store configured is a
                // directory above the service's, and every copy would be taken for gone.
                bail!(
                    "{location}: its dlq/ is in {}, not at the top of {}: give the store the service writes to",
                    store.location(key.split("/dlq/").next().unwrap_or(key)),
                    store.location("")
                );
            }
            return Ok(Err(format!(
                "{location} is not where dead-letter copies are kept (dlq/)"
            )));
        }
        let found = store
            .read(key)
            .await
            .with_context(|| format!("reading {location}"))?;
        let foreign = match found {
            Some(_) => &None,
            None => {
                clients
                    .foreign
                    .get_or_try_init(|| async {
                        let top = super::Top::of(store).await.with_context(|| {
                            format!("{location} is not there; listing the store")
                        })?;
                        anyhow::Ok(top.foreign(store))
                    })
                    .await?
            }
        };
        if let Some(why) = foreign {
            bail!(
                "{location} is not there: {why} (if it is the service's and every copy it held has expired, the letters kept there cannot be re-driven: --since with a --group-id of its own passes over them, and over every older letter)"
            );
        }
        anyhow::Ok(found.ok_or_else(|| format!("{location} is gone from the blob store")))
    };
    let value = match header(letter, c"payload_location") {
        Some(location) => match stored(location).await? {
            Ok(value) => value,
            Err(gone) => return Ok(Err(gone)),
        },
        None => letter.payload().unwrap_or_default().to_vec(),
    };
    let key = match header(letter, c"key_location") {
        Some(location) => match stored(location).await? {
            Ok(key) => Some(key),
            Err(gone) => return Ok(Err(gone)),
        },
        None => letter.key().map(<[u8]>::to_vec),
    };
    Ok(Ok((value, key)))
}

/// The store's key for a location it gave (`gs://bucket/key`, `file:///root/key`).
fn stored_key<'l>(store: &dyn BlobStore, location: &'l str) -> Option<&'l str> {
    location.strip_prefix(&store.location(""))
}

/// At most `rate` sends per second.
async fn pace(window: &mut (Instant, u32), rate: u32) {
    if window.0.elapsed() >= Duration::from_secs(1) {
        *window = (Instant::now(), 0);
    }
    if window.1 >= rate {
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(window.0.elapsed())).await;
        *window = (Instant::now(), 0);
    }
    window.1 += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RedriveArgs,
    }

    /// A letter at `offset` of partition 0 whose send is under way, to end `delivered` or not.
    fn sent(offset: i64, delivered: bool) -> Pending {
        Pending::Sending(tokio::spawn(async move {
            Handled {
                partition: 0,
                offset,
                sent: Some(Sent {
                    at: format!("dlq/0/{offset}"),
                    reason: "rejected_by_sink".into(),
                    bytes: 10,
                    delivered: match delivered {
                        true => Ok(()),
                        false => Err(rdkafka::error::KafkaError::Canceled),
                    },
                }),
            }
        }))
    }

    /// An output that breaks mid-run (a `kubectl exec` session dropped) stops nothing: every
    /// letter delivered is recorded, to be committed (the first report that failed stopped the
    /// run there, the thousand delivered after it uncommitted), and the error is kept for the end.
    #[tokio::test]
    async fn an_output_gone_mid_run_still_records_every_letter_delivered() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["x", "--topic", "recordings"]).unwrap();
        let mut in_flight = InFlight {
            letters: (0..5).map(|offset| sent(offset, true)).collect(),
            bytes: 50,
        };
        let mut read = Read::default();
        let mut out = crate::tools::Reports::new(crate::tools::BrokenPipe);
        in_flight
            .settle(0, &mut read, &cli.args, &mut out)
            .await
            .unwrap();
        assert_eq!(read.positions, [(0, 5)].into_iter().collect());
        assert_eq!(read.counts.redriven["rejected_by_sink"], 5);
        assert_eq!(
            out.lost.map(|e| e.kind()),
            Some(std::io::ErrorKind::BrokenPipe)
        );
    }

    /// Letters are recorded in the order read, whatever order their sends end in: a failed
    /// delivery ends the run at that letter, with the letters read after it neither recorded nor
    /// counted, and the error says how many of them reached the topic anyway.
    #[tokio::test]
    async fn a_failed_delivery_stops_the_record_at_its_letter() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["x", "--topic", "recordings"]).unwrap();
        let handled = |offset| {
            Pending::Handled(Handled {
                partition: 0,
                offset,
                sent: None,
            })
        };
        let mut in_flight = InFlight {
            letters: [
                sent(0, true),
                handled(1),
                sent(2, false),
                sent(3, true),
                handled(4),
                sent(5, true),
            ]
            .into(),
            bytes: 40,
        };
        let (mut read, mut out) = (Read::default(), Vec::new());
        let error = in_flight
            .settle(0, &mut read, &cli.args, &mut out)
            .await
            .unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            "2 letter(s) read after it reached recordings before the run stopped, uncommitted: the next run re-drives them again: re-producing dlq/0/2 to recordings: KafkaError (Client dropped)"
        );
        assert_eq!(read.positions, [(0, 2)].into_iter().collect());
        assert_eq!(read.counts.redriven["rejected_by_sink"], 1);
        assert!(in_flight.letters.is_empty() && in_flight.bytes == 0);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "re-driven dlq/0/0 (rejected_by_sink, 10 bytes)\n"
        );
    }

    /// librdkafka checks the poll interval against the session when the client is created: no
    /// broker needed to see the tool refused.
    #[test]
    fn a_short_poll_interval_from_the_deployment_does_not_stop_the_reader() {
        use clap::Parser;
        for properties in [
            "max.poll.interval.ms=20000",
            "max.poll.interval.ms=20000\nclient.id=x",
        ] {
            let cli = Cli::try_parse_from(["x", "--kafka-property", properties]).unwrap();
            let reader = reader(&cli.args, Duration::from_secs(5));
            assert!(reader.is_ok(), "{properties}: {:?}", reader.err());
        }
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(session_within_poll_interval(&cli.args.kafka).is_empty());
    }

    /// A run pointed at a topic of something else finds a letter it cannot re-drive in every
    /// record: it names the first hundred and counts the rest (it kept and printed them all, in
    /// one line).
    #[test]
    fn a_run_names_a_hundred_letters_it_cannot_re_drive_and_counts_the_rest() {
        let mut failed = Failed::default();
        assert!(failed.error().is_none());
        for offset in 0..10_000 {
            failed.push(format!(
                "dlq/0/{offset}: not a dead letter (no reason header)"
            ));
        }
        let error = failed.error().unwrap().to_string();
        assert!(
            error.starts_with(
                "10000 letter(s) could not be re-driven:\n  dlq/0/0: not a dead letter"
            ),
            "{error}"
        );
        assert!(
            error.ends_with("dlq/0/99: not a dead letter (no reason header)\n  … and 9900 more"),
            "{error}"
        );
        assert!(error.len() < 8 << 10, "{} bytes", error.len());
    }

    /// A coordinator loading the group's offsets or just moved is asked again; a refusal is not.
    #[test]
    fn only_a_moving_coordinator_is_asked_again() {
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode;
        for moving in [
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            RDKafkaErrorCode::CoordinatorNotAvailable,
        ] {
            assert!(
                coordinator_moving(&KafkaError::MetadataFetch(moving)),
                "{moving:?}"
            );
        }
        for settled in [
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::OperationTimedOut,
        ] {
            assert!(!coordinator_moving(&KafkaError::MetadataFetch(settled)));
        }
    }

    /// A range of letters gone from the topic is one line and counts each letter: the error
    /// names no more letters than there are.
    #[test]
    fn a_range_of_letters_gone_counts_each_and_is_named_once() {
        let mut failed = Failed::default();
        failed.push_letters(2, "dlq/0/1..3: 2 letter(s) gone".into());
        failed.push("dlq/0/5: not a dead letter".into());
        let error = failed.error().unwrap().to_string();
        assert_eq!(
            error,
            "3 letter(s) could not be re-driven:\n  dlq/0/1..3: 2 letter(s) gone\n  dlq/0/5: not a dead letter"
        );
    }
}
