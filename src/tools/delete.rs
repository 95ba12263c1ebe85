//! `replay-ingest delete`: one replay gone — every blob of it, any oversized dead-letter copy of
//! one of its messages, and its rows — on demand (a privacy request). Sentry's ingest offers no
//! such tool; its own delete task does the same steps, and this one follows them.
//!
//! Step by step over all the replays named, each in an order that is safe to stop anywhere and
//! run again:
//! 1. **Find** every object under its prefix in each retention prefix of the store
//!    (`{retention}/{project}/{replay}/…`: the segment blobs, and whatever else a writer put there,
//!    such as Sentry's `{segment}.video`), the dead-letter copies of its messages
//!    (`dlq/{project}/{replay}/…`, by listing that prefix; older ones, `dlq/{topic}/…`, read
//!    once for all the replays to see whose they are — one that cannot be read is left, named)
//!    and, with ClickHouse, its
//!    rows. Nothing found: nothing to do, and nothing is written (a second run is a no-op) — but
//!    through snuba the rows cannot be seen, so the archive is published whatever was found (a
//!    second archive changes nothing: an archived replay stays archived).
//! 2. **Rows.** With `--rows-sink snuba`: publish the archive Sentry publishes
//!    (`recording::archive`) on `--replay-events-topic` and wait for the broker. With
//!    `--rows-sink clickhouse`: delete the replay's rows (`ALTER TABLE … DELETE`, a mutation every
//!    ClickHouse since 18.x supports on MergeTree tables, waited for; one for up to
//!    100 replays: `REPLAYS_PER_MUTATION`), and its rows in the aggregation snuba's materialized
//!    view feeds (`replays_aggregated_local`, which holds the user's data too) when it exists,
//!    then insert the archive row.
//!    The archive carries the replay's own time (a query over the replay's days would not see an
//!    archive of another day), read from its earliest segment blob, else from its earliest row
//!    (ClickHouse), else `--replay-timestamp`. Through snuba with none of these, nothing is
//!    published: the run says so and exits 1.
//! 3. **Blobs** last, so that a run stopped half way still finds what is left, and finishes it.
//!
//! It prints what it found and what it removed, one line each; it exits non-zero naming what is
//! left when anything could not be removed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::producer::FutureRecord;

use crate::config::{
    BlobArgs, BlobSinkKind, DecompressionArgs, KafkaArgs, RowsArgs, RowsSinkKind,
    producer_properties,
};
use crate::kafka::producer::Producer;
use crate::recording::archive::Archive;
use crate::recording::{blob, envelope, rrweb};
use crate::sink::SinkError;
use crate::sink::clickhouse::{self, ClickHouseConfig};
use crate::sink::dlq;
use crate::sink::store::{self, BlobStore};

/// Delete replays: their blobs, dead-letter copies and rows.
#[derive(Args, Debug, Clone)]
pub struct DeleteArgs {
    /// The project of the replays given with `--replay`.
    #[arg(long, requires = "replays")]
    pub project: Option<u64>,
    /// A replay id (32 hex characters or a UUID); repeat for several.
    #[arg(long = "replay", requires = "project")]
    pub replays: Vec<String>,
    /// A file of `PROJECT REPLAY [TIME]` lines (blank lines and `#` comments ignored); `TIME`
    /// as for `--replay-timestamp`, for that replay alone.
    #[arg(long, conflicts_with_all = ["project", "replays"])]
    pub from_file: Option<PathBuf>,
    /// The time of the replays named with `--replay` (seconds since the epoch, or RFC 3339 such as
    /// 2026-11-30T12:00:00Z: the replay's start, from Sentry), for their archive when no segment
    /// blob or row is left to read it from (through snuba, where rows cannot be read). With
    /// `--from-file`, a third word on a replay's line.
    #[arg(long, requires = "replays", value_parser = seconds_since_epoch)]
    pub replay_timestamp: Option<f64>,
    /// Say what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub blobs: BlobArgs,
    #[command(flatten)]
    pub rows: RowsArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    // For reading a replay's time back from its blobs.
    #[command(flatten)]
    pub decompression: DecompressionArgs,
    /// With `--rows-sink clickhouse`: the table snuba's materialized view `replays_aggregation_mv`
    /// feeds from the rows table (one row per replay and hour, holding the replay's user, email
    /// and IP address), in the same database. Its rows of the replay are deleted too, when the
    /// table exists; empty: none.
    #[arg(
        long,
        env = "REPLAY_INGEST_CLICKHOUSE_AGGREGATED_TABLE",
        default_value = "replays_aggregated_local"
    )]
    pub clickhouse_aggregated_table: String,
    /// Longest one request (to the store, ClickHouse or the broker) may take, ms.
    #[arg(long, env = "REPLAY_INGEST_SINK_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(crate::config::SINK_TIMEOUT_MS), default_value_t = 30_000)]
    pub sink_timeout_ms: u64,
}

/// The latest time taken as seconds: 10^11 s is the year 5138, and a time in milliseconds (the
/// replay's start as some tools print it) is above it.
const MAX_SECONDS: f64 = 1e11;

/// `value` as seconds since the epoch: a number, or an RFC 3339 time.
fn seconds_since_epoch(value: &str) -> Result<f64, String> {
    if let Ok(seconds) = value.parse::<f64>() {
        return match seconds {
            s if !s.is_finite() || s < 0.0 => Err(format!("{value:?} is not a time")),
            s if s >= MAX_SECONDS => Err(format!(
                "{value:?} is past the year 5000 in seconds: milliseconds? (give seconds)"
            )),
            s => Ok(s),
        };
    }
    super::instant(value)?
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .map_err(|_| "before 1970".to_owned())
}

/// One replay to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub project: u64,
    /// 32 lowercase hex characters (the form the blob keys use).
    pub replay: String,
    /// Its time as given (`--replay-timestamp`, or its line's third word), seconds since the
    /// epoch: for its archive when none can be read.
    pub timestamp: Option<f64>,
}

/// The replay `replay` (32 hex characters or a UUID) of `project`, as named.
fn target(project: &str, replay: &str, timestamp: Option<f64>) -> anyhow::Result<Target> {
    let project = project
        .parse()
        .with_context(|| format!("project {project:?} is not a number"))?;
    let replay = uuid::Uuid::try_parse(replay)
        .with_context(|| {
            format!("replay {replay:?} is not a replay id (32 hex characters or a UUID)")
        })?
        .simple()
        .to_string();
    Ok(Target {
        project,
        replay,
        timestamp,
    })
}

/// The replays named on the command line or in `--from-file`, each once (with the last time
/// given for it).
pub fn targets(args: &DeleteArgs) -> anyhow::Result<Vec<Target>> {
    let named: Vec<Target> = match (&args.from_file, args.project) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --from-file {}", path.display()))?;
            // A file saved by an editor that marks UTF-8 at its start.
            let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
            let mut named = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let at = || format!("{}:{}", path.display(), n + 1);
                let mut words = line.split_whitespace();
                let (project, replay, time) =
                    match (words.next(), words.next(), words.next(), words.next()) {
                        (Some(project), Some(replay), time, None) => (project, replay, time),
                        _ => bail!("{}: expected `PROJECT REPLAY [TIME]`, found {line:?}", at()),
                    };
                let time = time
                    .map(seconds_since_epoch)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("{}: the replay's time: {e}", at()))?;
                named.push(target(project, replay, time).with_context(at)?);
            }
            named
        }
        (None, Some(project)) => args
            .replays
            .iter()
            .map(|r| target(&project.to_string(), r, args.replay_timestamp))
            .collect::<anyhow::Result<_>>()?,
        (None, None) => {
            bail!("name the replays: --project P --replay R [--replay R …], or --from-file")
        }
    };
    // Last line first: of a replay named twice, the last time given counts (below).
    let mut targets: Vec<Target> = named.into_iter().rev().collect();
    // Stable: of a replay named twice, the last line with a time is kept, and a line without
    // one never over it (a request's file and the lines a run printed to finish it, run
    // together: the printed line has the time the first archive was stamped with, which may be
    // the one read from a blob rather than the file's).
    targets.sort_by(|a, b| {
        (a.project, &a.replay, a.timestamp.is_none()).cmp(&(
            b.project,
            &b.replay,
            b.timestamp.is_none(),
        ))
    });
    targets.dedup_by(|b, a| (a.project, &a.replay) == (b.project, &b.replay));
    Ok(targets)
}

/// Where rows are removed.
enum Rows {
    Snuba {
        producer: Producer,
        topic: String,
    },
    /// The rows table, and the aggregation fed from it when there is one.
    ClickHouse {
        config: Box<ClickHouseConfig>,
        aggregated: Aggregated,
    },
    None,
}

/// What was found of one replay.
#[derive(Debug, Default)]
struct Found {
    /// Every object under the replay's prefix in each retention prefix.
    blobs: Vec<String>,
    /// Its segment blobs by segment id, lowest first: the replay's time is read from the first
    /// that holds one.
    segments: Vec<(u32, String)>,
    /// The segment blob its time was read from, once read.
    timed_by: Option<String>,
    /// The longest retention prefix its blobs are under: the archive that hides the rows (through
    /// snuba) must outlive every one of them.
    retention: Option<u16>,
    /// Dead-letter copies (values and long keys).
    dead_letters: Vec<String>,
    /// Rows in ClickHouse (not the archive's).
    rows: u64,
    /// Rows of the aggregated table that hold the replay's segments (the user's data; not an
    /// archive's alone).
    aggregated: u64,
}

impl Found {
    /// The objects to remove, in the order they go: the dead-letter copies first and the
    /// segment blob the replay's time was read from (else its earliest) last, so that a run
    /// stopped half way leaves that blob for the next to read the same time from (with snuba, a
    /// replay without one and without a time given is left alone, its copies — whole messages,
    /// user data included — with it).
    fn removal_order(&self) -> impl Iterator<Item = &String> {
        let first = self
            .timed_by
            .as_ref()
            .or(self.segments.first().map(|(_, key)| key))
            .filter(|key| self.blobs.contains(key));
        self.dead_letters
            .iter()
            .chain(self.blobs.iter().filter(move |key| Some(*key) != first))
            .chain(first)
    }

    fn is_empty(&self) -> bool {
        self.blobs.is_empty()
            && self.dead_letters.is_empty()
            && self.rows == 0
            && self.aggregated == 0
    }
}

/// A replay found, with the time its archive carries: its rows go next, then its blobs.
struct Ready<'t> {
    /// How the output names it.
    name: String,
    target: &'t Target,
    found: Found,
    /// The replay's time, read or given; `None`: neither, and the archive is stamped now.
    time: Option<f64>,
    timestamp: f64,
    /// The archive's retention: the longest its blobs are under, else [`archive_retention`].
    retention: u16,
}

/// A replay's line in `--from-file` (`PROJECT REPLAY [TIME]`), for a run again: with the time its
/// archive was stamped with, read or given, when there was one.
fn from_file_line(target: &Target, time: Option<f64>) -> String {
    match time {
        Some(time) => format!("{} {} {time}", target.project, target.replay),
        None => format!("{} {}", target.project, target.replay),
    }
}

impl Ready<'_> {
    fn archive(&self) -> Archive<'_> {
        Archive {
            project_id: self.target.project,
            replay_id: &self.target.replay,
            retention_days: self.retention,
            timestamp: self.timestamp,
            now: now_seconds() as u64,
        }
    }
}

/// Replays whose rows one ClickHouse delete mutation removes: each mutation rewrites every part
/// holding rows it deletes, so one per replay would queue as many rewrites as replays in a
/// privacy request's file.
const REPLAYS_PER_MUTATION: usize = 100;

/// Requests of one kind (lookups, reads of a replay's time, archives, removals) failed in a
/// row past which their destination is taken for down and no more of them are sent; the replays
/// left are printed to run again. Each request to a destination that hangs waits out its
/// timeout: over a privacy request's thousands of replays, hours with nothing said.
const STORE_DOWN_AFTER: usize = 3;

/// Failures in a row of one kind of request ([`STORE_DOWN_AFTER`]).
#[derive(Default)]
struct Streak(usize);

impl Streak {
    /// Counts how a request ended.
    fn count<T, E>(&mut self, result: &Result<T, E>) {
        self.0 = match result {
            Ok(_) => 0,
            Err(_) => self.0 + 1,
        };
    }

    /// Why no more are sent, once [`STORE_DOWN_AFTER`] failed in a row.
    fn down(&self, what: &str) -> Option<String> {
        (self.0 >= STORE_DOWN_AFTER).then(|| {
            format!(
                "{what} was not tried: the last {} failed in a row, and no more were sent",
                self.0
            )
        })
    }
}

/// Runs the deletes, writing what it does to `out`.
pub async fn run(args: &DeleteArgs, out: &mut impl Write) -> anyhow::Result<()> {
    args.blobs.validate().map_err(anyhow::Error::msg)?;
    args.rows.validate().map_err(anyhow::Error::msg)?;
    args.kafka.validate()?;
    let targets = targets(args)?;
    let timeout = Duration::from_millis(args.sink_timeout_ms);
    let store = super::blob_store(&args.blobs, timeout).await?;
    let rows = match args.rows.rows_sink {
        RowsSinkKind::Snuba => {
            let config = args
                .kafka
                .client_config(&producer_properties(1 << 20, timeout))?;
            // A mistyped --replay-events-topic would be created by brokers that create topics on
            // first use, and take the archive no one reads: the replay still listed, its blobs
            // gone and the run reporting it deleted. Checked before anything is found or removed
            // (a dry run too).
            let topic = &args.rows.replay_events_topic;
            crate::sink::publish::check_topics(&config, std::slice::from_ref(topic), timeout)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "--replay-events-topic {topic}: {}; nothing deleted",
                        e.message
                    )
                })?;
            Rows::Snuba {
                producer: crate::sink::publish::producer(&config, "snuba")?,
                topic: args.rows.replay_events_topic.clone(),
            }
        }
        RowsSinkKind::Clickhouse => {
            let config = args
                .rows
                .clickhouse
                .config(timeout)
                .context("reading --clickhouse-password-file")?;
            let aggregated = Aggregated {
                name: args.clickhouse_aggregated_table.clone(),
                exists: tokio::sync::OnceCell::new(),
            };
            Rows::ClickHouse {
                config: Box::new(config),
                aggregated,
            }
        }
        RowsSinkKind::Null => Rows::None,
    };
    if args.blobs.blob_sink == BlobSinkKind::Null && matches!(rows, Rows::None) {
        bail!("nothing to delete from: --blob-sink null and --rows-sink null");
    }
    let mut reports = super::Reports::new(out);
    let ran = delete(
        &targets,
        store.as_deref(),
        &rows,
        args.dry_run,
        timeout,
        args.decompression.max_decompressed_bytes,
        &mut reports,
    )
    .await;
    reports.ended(ran, "went through every replay")
}

/// Deletes `targets` from `store` and `rows`, writing what it does to `out`.
async fn delete(
    targets: &[Target],
    store: Option<&dyn BlobStore>,
    rows: &Rows,
    dry_run: bool,
    timeout: Duration,
    max_decompressed_bytes: usize,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    // A privacy request's record says whether the deleted blobs are gone at once, and, through
    // snuba, that the rows are hidden, not erased.
    if let Rows::Snuba { .. } = rows {
        writeln!(
            out,
            "note: through snuba the rows are archived, not erased: the replay is hidden from queries, and its rows (user, email and IP address among them, in replays_local and replays_aggregated_local) stay until their TTL; to erase them, run delete with --rows-sink clickhouse --clickhouse-table replays_local against each shard of snuba's ClickHouse"
        )?;
    }
    if let Some(store) = store {
        match store.kept_after_delete().await {
            Ok(Some(kept)) => writeln!(out, "note: {kept}")?,
            Ok(None) => {}
            Err(e) => writeln!(
                out,
                "note: whether the store keeps deleted objects restorable could not be read ({}): a bucket's soft-delete policy keeps them for its retention",
                e.message
            )?,
        }
    }
    let mut left = Vec::new();
    // Of `left`, the replays left because no time was given for their archive.
    let mut untimed = 0;
    // Copies from before keys named their owner, read once for all the replays. One that cannot
    // be read may be any replay's: named among what is left (the run exits 1), the rest go on,
    // and every replay is printed to run again (below), those finished with their time: through
    // snuba a replay finished has nothing left to read it from, and the run again, once the
    // copies can be read, needs it for each replay that owns one.
    let unnamed = match store {
        Some(store) => unnamed_copies(store).await.unwrap_or_else(|e| {
            left.push(format!(
                "dead-letter copies of the older layout (dlq/{{topic}}/…): listing them failed ({}); not searched",
                e.message
            ));
            Unnamed::default()
        }),
        None => Unnamed::default(),
    };
    for (key, e) in &unnamed.unreadable {
        let location = store.map_or_else(|| key.clone(), |s| s.location(key));
        left.push(format!(
            "{location}: a dead-letter copy of the older layout could not be read ({e}): whose it is is unknown"
        ));
    }
    let unnamed_searched = left.is_empty();
    // The replays finished, as `--from-file` lines, for a run again when the older layout was
    // not wholly searched.
    let mut finished = Vec::new();
    // Listed once for all the replays (a file of a thousand listed the store's top a thousand
    // times); failing, it fails each replay's lookup.
    let retentions = match store {
        Some(store) => match super::Top::of(store).await {
            Ok(top) => match top.foreign(store) {
                // A run again does no better: left for someone to look (exit 3).
                Some(why) => {
                    return Err(super::LeftForGood(format!(
                        "{why} Nothing done; if it is the service's store and holds nothing of the replays, --blob-sink null deletes the rest"
                    ))
                    .into());
                }
                None => Ok(top.retentions),
            },
            Err(e) => Err(e.message),
        },
        None => Ok(Vec::new()),
    };
    // The replays not wholly deleted, as `--from-file` lines: a run again through snuba finds
    // nothing of a replay an earlier run deleted (so no time for an archive), and with this list
    // it takes up only the unfinished ones, each with the time its archive was stamped with.
    let mut again = Vec::new();
    let mut ready = Vec::new();
    let (mut lookups, mut times) = (Streak::default(), Streak::default());
    // The archive's retention for a replay with no blob left to say it.
    let no_blob_retention = archive_retention(retentions.as_deref().unwrap_or_default());
    for target in targets {
        let name = format!("replay {} (project {})", target.replay, target.project);
        if let Some(why) = lookups
            .down("its lookup")
            .or_else(|| times.down("reading its time"))
        {
            left.push(format!("{name}: {why}; nothing of it removed"));
            again.push(from_file_line(target, target.timestamp));
            continue;
        }
        // One replay's lookup failing (the store's listing, ClickHouse's count) stops none of the
        // others: it is named among what is left, and a run again takes it up.
        let found = match &retentions {
            Ok(retentions) => find(store, retentions, rows, &unnamed.owners, target).await,
            Err(e) => Err(anyhow::anyhow!("listing the store: {e}")),
        };
        lookups.count(&found);
        let mut found = match found {
            Ok(found) => found,
            Err(e) => {
                // Said at once too: the summary comes only at the end of the run.
                let line = format!("{name}: finding what it has ({e:#}); nothing of it removed");
                writeln!(out, "{line}")?;
                left.push(line);
                again.push(from_file_line(target, target.timestamp));
                continue;
            }
        };
        writeln!(
            out,
            "{name}: found {} segment blob(s), {} dead-letter copy object(s), {}",
            found.blobs.len(),
            found.dead_letters.len(),
            match rows {
                Rows::ClickHouse { .. } => format!(
                    "{} row(s), {} aggregated row(s)",
                    found.rows, found.aggregated
                ),
                Rows::Snuba { .. } => "rows through snuba".to_owned(),
                Rows::None => "no rows sink".to_owned(),
            }
        )?;
        // Through snuba the rows cannot be counted: they may be there with no blob left (every
        // segment dead-lettered, or a run stopped after the blobs), so the archive goes anyway.
        if found.is_empty() && !matches!(rows, Rows::Snuba { .. }) {
            writeln!(out, "{name}: nothing to delete")?;
            finished.push(from_file_line(target, target.timestamp));
            continue;
        }
        // A dry run goes as far as a run would before removing anything: it reads the time, and
        // fails where a run would. Without a rows sink there is no archive to stamp.
        let time = replay_time(store, rows, &mut found, target, max_decompressed_bytes).await;
        times.count(&time);
        let time = match time {
            Ok(time) => time.or(target.timestamp),
            Err(e) => {
                let line = format!("{name}: reading its time ({e:#}); nothing of it removed");
                writeln!(out, "{line}")?;
                left.push(line);
                again.push(from_file_line(target, target.timestamp));
                continue;
            }
        };
        if time.is_none() && matches!(rows, Rows::Snuba { .. }) {
            untimed += 1;
            left.push(format!(
                "{name}: {}, and no time given: its rows were not archived (an archive stamped now would not hide it from a query over its own days); run again with its start, from Sentry: --replay-timestamp, or a third word on its --from-file line (a run that removed its blobs published its archive first, and printed that time)",
                no_blob_time(&found)
            ));
            again.push(from_file_line(target, None));
            continue;
        }
        let would = if dry_run { "would be " } else { "" };
        if time.is_none() && !matches!(rows, Rows::None) {
            writeln!(
                out,
                "{name}: no time could be read from its segment blobs or rows (none, or none readable): {would}archived as of now"
            )?;
        }
        if dry_run {
            match rows {
                Rows::Snuba { topic, .. } => {
                    writeln!(out, "{name}: would publish the archive on {topic}")?
                }
                Rows::ClickHouse { .. } => writeln!(
                    out,
                    "{name}: would delete {} row(s) and {} aggregated row(s) and write the archive row",
                    found.rows, found.aggregated
                )?,
                Rows::None => {}
            }
            for key in found.removal_order() {
                let location = store.map_or_else(|| key.clone(), |s| s.location(key));
                writeln!(out, "would remove {location}")?;
            }
            continue;
        }
        let retention = found.retention.unwrap_or(no_blob_retention);
        ready.push(Ready {
            name,
            target,
            found,
            time,
            timestamp: time.unwrap_or_else(now_seconds),
            retention,
        });
    }
    let (mut replays, mut removed, mut removals) = (0, 0, Streak::default());
    for (replay, rows_done) in ready.iter().zip(archive_rows(rows, &ready, timeout).await) {
        let (name, found) = (&replay.name, &replay.found);
        match rows_done {
            Ok(Some(said)) => writeln!(out, "{name}: {said}")?,
            Ok(None) => {}
            Err(e) => {
                // Blobs stay until the rows are done: a run again finds them and finishes.
                left.push(format!(
                    "{name}: rows ({e:#}); its blobs were kept for the next run"
                ));
                again.push(from_file_line(replay.target, replay.time));
                continue;
            }
        }
        let mut whole = true;
        if let Some(store) = store {
            for key in found.removal_order() {
                if let Some(why) = removals.down("removing the rest of its blobs") {
                    left.push(format!("{name}: its blobs were not all removed: {why}"));
                    whole = false;
                    break;
                }
                let removal = store.delete(key).await;
                removals.count(&removal);
                match removal {
                    Ok(true) => {
                        removed += 1;
                        writeln!(out, "removed {}", store.location(key))?;
                    }
                    Ok(false) => writeln!(out, "already gone {}", store.location(key))?,
                    Err(e) => {
                        whole = false;
                        writeln!(
                            out,
                            "could not remove {}: {}",
                            store.location(key),
                            e.message
                        )?;
                        left.push(format!("{}: {}", store.location(key), e.message));
                    }
                }
            }
        }
        if whole {
            replays += 1;
            finished.push(from_file_line(replay.target, replay.time));
        } else {
            again.push(from_file_line(replay.target, replay.time));
        }
    }
    if !unnamed_searched {
        again.extend(finished);
    }
    writeln!(
        out,
        "{} replay(s) deleted, {removed} object(s) removed{}",
        replays,
        if dry_run {
            " (dry run: nothing removed)"
        } else {
            ""
        }
    )?;
    if !again.is_empty() {
        writeln!(
            out,
            "to finish, run again with a --from-file holding these {} line(s) (a line without a time needs the replay's start, from Sentry, unless a blob or row of it is left to read it from):",
            again.len()
        )?;
        for line in &again {
            writeln!(out, "{line}")?;
        }
    }
    if !left.is_empty() {
        let message = format!(
            "not everything could be removed; left:\n  {}",
            left.join("\n  ")
        );
        // Only their time, given, finishes these: a script that runs again on exit 1 would
        // run for ever.
        if untimed == left.len() {
            return Err(super::LeftForGood(message).into());
        }
        bail!(message);
    }
    Ok(())
}

/// The replay's segment blobs (under each of the store's `retentions`), its dead-letter copies
/// (under its own prefix, and among the `unnamed` ones of the older layout) and its rows.
async fn find(
    store: Option<&dyn BlobStore>,
    retentions: &[(String, u16)],
    rows: &Rows,
    unnamed: &BTreeMap<(u64, String), Vec<String>>,
    target: &Target,
) -> anyhow::Result<Found> {
    let mut found = Found::default();
    if let Some(store) = store {
        for (prefix, retention) in retentions {
            let replay = format!("{prefix}{}/{}/", target.project, target.replay);
            for object in store::walk(store, &replay).await? {
                found.retention = found.retention.max(Some(*retention));
                let segment = object.key.rsplit('/').next().and_then(|s| s.parse().ok());
                if let Some(segment) = segment {
                    found.segments.push((segment, object.key.clone()));
                }
                found.blobs.push(object.key);
            }
        }
        found.segments.sort();
        let named = dlq::copies_prefix(target.project, &target.replay);
        found.dead_letters = store::walk(store, &named)
            .await?
            .into_iter()
            .map(|object| object.key)
            .chain(
                unnamed
                    .get(&(target.project, target.replay.clone()))
                    .into_iter()
                    .flatten()
                    .cloned(),
            )
            .collect();
        found.dead_letters.sort();
        found.dead_letters.dedup();
    }
    if let Rows::ClickHouse { config, aggregated } = rows {
        let (client, replay) = (clickhouse::client(config), hyphenated(&target.replay));
        let table = Table::Rows(&config.table);
        found.rows = rows_left(&client, config, table, target.project, &replay).await?;
        if let Some(table) = aggregated.table(config).await? {
            found.aggregated = rows_left(
                &client,
                config,
                Table::Aggregated(table),
                target.project,
                &replay,
            )
            .await?;
        }
    }
    Ok(found)
}

/// Dead-letter copies written before keys named their owner, by the (project, replay) of the
/// message each holds, as its value says; and those whose value could not be read.
#[derive(Default)]
struct Unnamed {
    owners: BTreeMap<(u64, String), Vec<String>>,
    /// Key and error of each copy that could not be read.
    unreadable: Vec<(String, String)>,
}

/// The copies of the older layout ([`dlq::holds_unnamed_copies`]), each read to see whose message
/// it holds: a copy of a value that is not a recording message belongs to no replay. The newer
/// copies, under their replay's own prefix, are neither listed nor read here: a run lists
/// `dlq/` one level deep, then only the older layout's directories, which no version writes to
/// any more.
async fn unnamed_copies(store: &dyn BlobStore) -> Result<Unnamed, SinkError> {
    let mut unnamed = Unnamed::default();
    for directory in store.list("dlq/").await?.prefixes {
        if !dlq::holds_unnamed_copies(&directory) {
            continue;
        }
        let objects = store::walk(store, &directory).await?;
        let stored: std::collections::BTreeSet<&str> =
            objects.iter().map(|o| o.key.as_str()).collect();
        // A copy's long key is `{copy}.key`; a write a crash cut short left `{copy}.tmp-PID` or
        // `{copy}.key.tmp-PID` (filesystem store). Values are read, the copy's own temporary one
        // too (it may be whole); keys go with their value.
        let values = objects
            .iter()
            .filter(|o| !o.key.ends_with(".key") && !o.key.contains(".key.tmp-"));
        for object in values {
            let value = match store.read(&object.key).await {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(e) => {
                    unnamed.unreadable.push((object.key.clone(), e.message));
                    continue;
                }
            };
            let Some((project, replay)) = envelope::owner(&value) else {
                continue;
            };
            let keys = unnamed
                .owners
                .entry((project, replay.simple().to_string()))
                .or_default();
            keys.push(object.key.clone());
            let siblings = format!("{}.", object.key);
            keys.extend(
                stored
                    .range(siblings.as_str()..)
                    .take_while(|k| k.starts_with(&siblings))
                    .map(|k| k.to_string()),
            );
        }
    }
    Ok(unnamed)
}

/// The replay's time, in seconds: the first event of its earliest segment blob that holds one
/// (noted in `found`), else (with ClickHouse) its earliest live row; `None` when neither is
/// there.
async fn replay_time(
    store: Option<&dyn BlobStore>,
    rows: &Rows,
    found: &mut Found,
    target: &Target,
    max_decompressed_bytes: usize,
) -> anyhow::Result<Option<f64>> {
    if matches!(rows, Rows::None) {
        return Ok(None);
    }
    match blob_time(store, found, max_decompressed_bytes).await {
        Ok(Some((time, key))) => {
            found.timed_by = Some(key);
            return Ok(Some(time));
        }
        Ok(None) => {}
        // A blob that cannot be read is the next run's to read, unless a time was given.
        Err(e) if target.timestamp.is_none() => return Err(e),
        Err(_) => return Ok(target.timestamp),
    }
    match rows {
        Rows::ClickHouse { config, .. } if found.rows > 0 => {
            let first = clickhouse::client(config)
                .query(&format!(
                    "SELECT toUInt32(min(timestamp)) FROM {} WHERE project_id = ? AND replay_id = toUUID(?) AND {LIVE}",
                    config.table
                ))
                .bind(target.project)
                .bind(hyphenated(&target.replay))
                .fetch_one::<u32>();
            let first = answered(config, "the replay's earliest row", first).await?;
            Ok(Some(f64::from(first)))
        }
        _ => Ok(None),
    }
}

/// Segment blobs read for the replay's time before it is taken for having none: the earliest
/// may hold none (gone since it was listed, not a recording, a body over the limit), and a later
/// one of the same replay is minutes from its start, on the same day but at midnight.
const TIME_READS: usize = 8;

/// The time of the replay's first event and the blob it was read from: the earliest of its first
/// [`TIME_READS`] segment blobs that holds one; `None` when none does. A store that fails a read
/// is an error: the time must not fall back to a later blob or another source (now, at worst)
/// while the next run may read the earlier one.
async fn blob_time(
    store: Option<&dyn BlobStore>,
    found: &Found,
    max_decompressed_bytes: usize,
) -> anyhow::Result<Option<(f64, String)>> {
    let Some(store) = store else {
        return Ok(None);
    };
    for (_, key) in found.segments.iter().take(TIME_READS) {
        let Some(stored) = store
            .read(key)
            .await
            .map_err(|e| anyhow::anyhow!("reading {}: {}", store.location(key), e.message))?
        else {
            continue;
        };
        let first = blob::rrweb_json(&stored, max_decompressed_bytes)
            .ok()
            .and_then(|json| rrweb::extract(&json, rrweb::RowLimits::default()).ok())
            .and_then(|extracted| extracted.first_timestamp_ms);
        if let Some(ms) = first {
            return Ok(Some((ms as f64 / 1000.0, key.clone())));
        }
    }
    Ok(None)
}

/// Why no time was read from the replay's segment blobs, for the line that asks for one.
fn no_blob_time(found: &Found) -> String {
    match found.segments.len() {
        0 => "no segment blob left to read its time from".to_owned(),
        n => format!(
            "none of its first {} segment blob(s) of {n} holds a recording with a time",
            n.min(TIME_READS)
        ),
    }
}

/// The retention of an archive when none of the replay's blobs is left to say it: the longest
/// of the store's retention prefixes, and at least Sentry's own (90, whatever the replay's), so
/// that the archive outlives rows of any retention the deployment writes.
fn archive_retention(retentions: &[(String, u16)]) -> u16 {
    retentions
        .iter()
        .map(|(_, retention)| *retention)
        .max()
        .unwrap_or(0)
        .max(SENTRY_ARCHIVE_RETENTION)
}

/// The retention Sentry's delete gives every archive.
const SENTRY_ARCHIVE_RETENTION: u16 = 90;

/// A row not archived: what a delete removes. Snuba's older processor wrote NULL, not 0, for
/// such rows; `= 0` alone would leave them.
const LIVE: &str = "ifNull(is_archived, 0) = 0";

/// Removes the rows of the `ready` replays the way the rows sink implies: for each, in order,
/// what was done (to say), or why its rows are not gone.
async fn archive_rows(
    rows: &Rows,
    ready: &[Ready<'_>],
    timeout: Duration,
) -> Vec<anyhow::Result<Option<String>>> {
    let mut done = Vec::with_capacity(ready.len());
    let mut failing = Streak::default();
    match rows {
        Rows::None => done.extend(ready.iter().map(|_| Ok(None))),
        Rows::Snuba { producer, topic } => {
            for replay in ready {
                if let Some(why) = failing.down("publishing its archive") {
                    done.push(Err(anyhow::anyhow!(why)));
                    continue;
                }
                let message = replay.archive().message();
                let sent = producer
                    .send(FutureRecord::<(), _>::to(topic).payload(&message))
                    .await
                    .with_context(|| format!("publishing the archive on {topic}"));
                failing.count(&sent);
                done.push(sent.map(|_| {
                    Some(format!(
                        "archive published on {topic}, stamped {}",
                        replay.timestamp
                    ))
                }));
            }
        }
        Rows::ClickHouse { config, aggregated } => {
            for batch in ready.chunks(REPLAYS_PER_MUTATION) {
                if let Some(why) = failing.down("deleting its rows") {
                    done.extend(batch.iter().map(|_| Err(anyhow::anyhow!("{why}"))));
                    continue;
                }
                let deleted = delete_rows(config, aggregated.found(), batch, timeout).await;
                failing.count(&deleted);
                match deleted {
                    Ok(each) => done.extend(each),
                    Err(e) => {
                        let e = format!("{e:#}");
                        done.extend(batch.iter().map(|_| Err(anyhow::anyhow!("{e}"))));
                    }
                }
            }
        }
    }
    done
}

/// Deletes the rows of `batch` in one mutation per table (the rows table, and the `aggregated`
/// one when there is one) and inserts their archive rows; `Err` when nothing of it could be
/// done, else what became of each replay.
async fn delete_rows(
    config: &ClickHouseConfig,
    aggregated: Option<&str>,
    batch: &[Ready<'_>],
    timeout: Duration,
) -> anyhow::Result<Vec<anyhow::Result<Option<String>>>> {
    let client = clickhouse::client(config);
    let replays: Vec<String> = batch.iter().map(|r| hyphenated(&r.target.replay)).collect();
    // The rows table's archive rows stay (they hide the replay); the aggregated table's rows go
    // whole, archived or not: a merge may have folded the replay's user data into a row that
    // also counts an earlier archive. The archive row inserted once the delete is queued gives
    // it an archive again.
    // The aggregation first: a delete refused there (no `ALTER DELETE` on it) leaves both
    // tables as they were, for a run again once granted.
    let tables = aggregated
        .map(Table::Aggregated)
        .into_iter()
        .chain([Table::Rows(&config.table)])
        .collect::<Vec<_>>();
    for table in &tables {
        // A run again after one that gave up waiting finds that run's delete still queued: it
        // waits for it instead of queuing another behind it. A replay found without rows there
        // needs none (rows written since are found after).
        let mut which = Vec::new();
        for (ready, replay) in batch.iter().zip(&replays) {
            if table.found(&ready.found) > 0
                && unfinished_mutations(&client, config, *table, replay).await? == 0
            {
                which.push(format!(
                    "(project_id = {} AND replay_id = toUUID('{replay}'))",
                    ready.target.project
                ));
            }
        }
        if !which.is_empty() {
            let delete = format!(
                "ALTER TABLE {} DELETE WHERE ({}){}",
                table.name(),
                which.join(" OR "),
                table.filter()
            );
            let what = format!("deleting the rows of {}", table.name());
            answered(config, &what, client.query(&delete).execute()).await?;
        }
    }
    // The archive rows now, before the wait: a mutation rewrites only the parts that were there
    // when it was queued (and the rows table's skips archive rows), so they stay; and a run that
    // gives up waiting (a slow or failing mutation), or is stopped during the wait, leaves the
    // replay archived. Written after the wait, they were missing then, and a run again found
    // nothing of a replay without blobs once the mutation had ended: "nothing to delete".
    let mut archives = Vec::new();
    let mut each: Vec<anyhow::Result<Option<String>>> = batch
        .iter()
        .map(|ready| match ready.archive().row() {
            Ok(row) => {
                archives.push(row);
                Ok(Some(format!(
                    "rows deleted and the archive row written in {}, stamped {}",
                    config.table, ready.timestamp
                )))
            }
            Err(e) => Err(anyhow::anyhow!("the archive row: {e}")),
        })
        .collect();
    if !archives.is_empty() {
        let insert = async {
            let mut insert = client
                .insert::<crate::recording::ReplayRow>(&config.table)
                .await?;
            for row in &archives {
                insert.write(row).await?;
            }
            insert.end().await
        };
        answered(config, "inserting the archive rows", insert).await?;
    }
    for table in &tables {
        for replay in &replays {
            wait_for_mutation(&client, config, *table, replay, timeout).await?;
        }
    }
    // A mutation killed by an operator ends without deleting; rows the running service wrote
    // since the delete began are not in it either.
    for ((ready, replay), done) in batch.iter().zip(&replays).zip(&mut each) {
        let project = ready.target.project;
        let left = rows_left(&client, config, Table::Rows(&config.table), project, replay).await?;
        let left_aggregated = match aggregated {
            Some(table) => {
                rows_left(&client, config, Table::Aggregated(table), project, replay).await?
            }
            None => 0,
        };
        if left + left_aggregated > 0 {
            *done = Err(anyhow::anyhow!(
                "{left} row(s) and {left_aggregated} aggregated row(s) of the replay remain after its delete mutations ended (killed, or written since the delete began): run the delete again"
            ));
        }
    }
    Ok(each)
}

/// A table a delete removes the replay's rows from.
#[derive(Debug, Clone, Copy)]
enum Table<'a> {
    /// Snuba's rows table: its rows not archived.
    Rows(&'a str),
    /// The aggregation snuba's materialized view feeds from it: every row of the replay.
    Aggregated(&'a str),
}

impl Table<'_> {
    fn name(&self) -> &str {
        match self {
            Table::Rows(name) | Table::Aggregated(name) => name,
        }
    }

    /// What the delete's `WHERE` adds to the replay's id.
    fn filter(&self) -> String {
        match self {
            Table::Rows(_) => format!(" AND {LIVE}"),
            Table::Aggregated(_) => String::new(),
        }
    }

    /// Which of the replay's rows there are still to delete: in the rows table, those not
    /// archived; in the aggregation, those holding its segments, and so its user's data (an
    /// archive's own row counts none).
    fn left(&self) -> &'static str {
        match self {
            Table::Rows(_) => LIVE,
            Table::Aggregated(_) => "finalizeAggregation(count_segments) > 0",
        }
    }

    /// What a delete found there.
    fn found(&self, found: &Found) -> u64 {
        match self {
            Table::Rows(_) => found.rows,
            Table::Aggregated(_) => found.aggregated,
        }
    }
}

/// Waits until the delete submitted for `replay` (see [`unfinished_mutations`]) is done; the
/// table's other mutations (Sentry's own) are not waited for, beyond what ClickHouse makes this
/// one wait (mutations apply to a part in order).
async fn wait_for_mutation(
    client: &::clickhouse::Client,
    config: &ClickHouseConfig,
    table: Table<'_>,
    replay: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout.max(Duration::from_secs(60));
    while unfinished_mutations(client, config, table, replay).await? > 0 {
        if tokio::time::Instant::now() > deadline {
            // Why it has not finished, where the server says (ClickHouse 19.x and later): a
            // mutation that fails is retried until it is killed, and later ones wait behind it.
            let reason = client
                .query("SELECT any(latest_fail_reason) FROM system.mutations WHERE database = ? AND table = ? AND is_done = 0 AND latest_fail_reason != ''")
                .bind(&config.database)
                .bind(table.name())
                .fetch_one::<String>();
            let reason = answered(config, "why the mutation fails", reason)
                .await
                .ok()
                .filter(|r| !r.is_empty())
                .map_or_else(String::new, |r| {
                    format!("; a mutation of the table fails: {r}")
                });
            bail!(
                "the delete mutation of {} is still running{reason} (see system.mutations; a run again waits for it, and queues no other)",
                table.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The replay's rows in `table` that a delete removes ([`Table::left`]). `replay` hyphenated.
async fn rows_left(
    client: &::clickhouse::Client,
    config: &ClickHouseConfig,
    table: Table<'_>,
    project: u64,
    replay: &str,
) -> anyhow::Result<u64> {
    let count = client
        .query(&format!(
            "SELECT count() FROM {} WHERE project_id = ? AND replay_id = toUUID(?) AND {}",
            table.name(),
            table.left()
        ))
        .bind(project)
        .bind(replay)
        .fetch_one::<u64>();
    let what = format!("counting the replay's rows in {}", table.name());
    answered(config, &what, count).await
}

/// The table's unfinished deletes of `replay` (hyphenated) this tool submitted: their command
/// names the replay (and, in the rows table, `is_archived`).
async fn unfinished_mutations(
    client: &::clickhouse::Client,
    config: &ClickHouseConfig,
    table: Table<'_>,
    replay: &str,
) -> anyhow::Result<u64> {
    let ours = match table {
        Table::Rows(_) => " AND position(command, 'is_archived') > 0",
        Table::Aggregated(_) => "",
    };
    let count = client
        .query(&format!("SELECT count() FROM system.mutations WHERE database = ? AND table = ? AND is_done = 0 AND position(command, ?) > 0{ours}"))
        .bind(&config.database)
        .bind(table.name())
        .bind(replay)
        .fetch_one::<u64>();
    answered(config, "reading the table's mutations", count).await
}

/// The aggregation snuba's materialized view feeds from the rows table
/// (`--clickhouse-aggregated-table`), looked for in the rows table's database when the first
/// replay's rows are (a ClickHouse that does not answer then fails that replay's lookup, and
/// the next replay's looks again).
struct Aggregated {
    /// Empty: none.
    name: String,
    exists: tokio::sync::OnceCell<bool>,
}

impl Aggregated {
    /// Its name, when it exists.
    async fn table(&self, config: &ClickHouseConfig) -> anyhow::Result<Option<&str>> {
        if self.name.is_empty() {
            return Ok(None);
        }
        let exists = self
            .exists
            .get_or_try_init(|| async {
                let count = clickhouse::client(config)
                    .query("SELECT count() FROM system.tables WHERE database = ? AND name = ?")
                    .bind(&config.database)
                    .bind(&self.name)
                    .fetch_one::<u64>();
                let count = answered(config, "looking for the aggregated table", count).await?;
                anyhow::Ok(count > 0)
            })
            .await?;
        Ok(exists.then_some(self.name.as_str()))
    }

    /// Its name, when a replay's lookup found it.
    fn found(&self) -> Option<&str> {
        (self.exists.get() == Some(&true)).then_some(self.name.as_str())
    }
}

/// What ClickHouse answers to `request` (saying `what` it was when it fails), within the
/// request timeout (`--sink-timeout-ms`): a server that accepts connections and never answers
/// (hung, or a proxy holding the connection) would hold the run for ever. A delete given up
/// here may still be queued on the server: a run again waits for it and queues no other.
async fn answered<T>(
    config: &ClickHouseConfig,
    what: &str,
    request: impl std::future::Future<Output = Result<T, ::clickhouse::error::Error>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(config.timeout, request).await {
        Ok(answer) => answer
            .map_err(|e| clickhouse::setup_error(&e, config))
            .with_context(|| what.to_owned()),
        Err(_) => bail!(
            "{what}: ClickHouse did not answer within {:?} (--sink-timeout-ms)",
            config.timeout
        ),
    }
}

/// The replay id as ClickHouse parses a UUID (every version takes the hyphenated form).
fn hyphenated(replay: &str) -> String {
    uuid::Uuid::try_parse(replay)
        .map_or_else(|_| replay.to_owned(), |id| id.hyphenated().to_string())
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DeleteArgs,
    }

    fn parse(argv: &[&str]) -> Result<DeleteArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("delete").chain(argv.iter().copied())).map(|c| c.args)
    }

    /// Through snuba the rows are only hidden by the archive, which expires at its retention:
    /// it takes the longest retention the replay's blobs are under ("30" sorts before "90", and
    /// "100" before both).
    #[tokio::test]
    async fn the_archive_outlives_every_retention_the_replay_is_under() {
        use crate::sink::ObjectStore;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::sink::filesystem::FilesystemBlobSink::new(dir.path()).unwrap();
        let replay = "834f314caae54030a1b0dc52b202f24a";
        for key in [
            format!("30/42/{replay}/0"),
            format!("90/42/{replay}/1"),
            format!("7/42/{replay}/2"),
        ] {
            store
                .put(&key, &bytes::Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let target = Target {
            project: 42,
            replay: replay.into(),
            timestamp: None,
        };
        let retentions = crate::tools::Top::of(&store).await.unwrap().retentions;
        let found = find(
            Some(&store),
            &retentions,
            &Rows::None,
            &BTreeMap::new(),
            &target,
        )
        .await
        .unwrap();
        assert_eq!(found.retention, Some(90));
        assert_eq!(found.blobs.len(), 3);
    }

    /// With no blob of the replay left to say its retention, its archive takes the longest of the
    /// store's, and never less than Sentry's 90 days.
    #[test]
    fn an_archive_without_blobs_outlives_every_retention_stored() {
        let prefixes = |retentions: &[u16]| -> Vec<(String, u16)> {
            retentions.iter().map(|r| (format!("{r}/"), *r)).collect()
        };
        assert_eq!(archive_retention(&prefixes(&[])), 90);
        assert_eq!(archive_retention(&prefixes(&[30])), 90);
        assert_eq!(archive_retention(&prefixes(&[30, 365, 90])), 365);
    }

    /// ClickHouse unreachable: each replay's lookup fails, each is named among what is left, and
    /// the run goes on to the next and prints its summary (the first failure ended the run).
    #[test]
    fn a_replay_whose_lookup_fails_is_named_and_the_others_go_on() {
        let dir = tempfile::tempdir().unwrap();
        // Another replay's blob: the service's store.
        let other = dir.path().join("90/42/ffffffffffffffffffffffffffffffff");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("0"), b"another replay's").unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let args = parse(&[
            "--blob-sink",
            "filesystem",
            "--blob-dir",
            dir.path().to_str().unwrap(),
            "--rows-sink",
            "clickhouse",
            "--clickhouse-url",
            &url,
            "--sink-timeout-ms",
            "2000",
            "--project",
            "42",
            "--replay",
            "834f314caae54030a1b0dc52b202f24a",
            "--replay",
            "0123456789abcdef0123456789abcdef",
        ])
        .unwrap();
        let mut out = Vec::new();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let error = format!("{:#}", runtime.block_on(run(&args, &mut out)).unwrap_err());
        for replay in [
            "834f314caae54030a1b0dc52b202f24a",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert!(
                error.contains(&format!(
                    "replay {replay} (project 42): finding what it has"
                )),
                "{error}"
            );
        }
        let said = String::from_utf8(out).unwrap();
        assert!(said.contains("0 replay(s) deleted"), "{said}");
    }

    #[test]
    fn a_missing_blob_dir_is_refused_before_anything_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("typo");
        let args = parse(&[
            "--blob-sink",
            "filesystem",
            "--blob-dir",
            missing.to_str().unwrap(),
            "--rows-sink",
            "null",
            "--project",
            "42",
            "--replay",
            "834f314caae54030a1b0dc52b202f24a",
        ])
        .unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let error = runtime
            .block_on(run(&args, &mut Vec::new()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a directory"), "{error}");
        assert!(!missing.exists(), "not created");
    }

    /// A `kubectl exec` session dropped mid-run breaks the run's output: the run goes through
    /// every replay all the same (it stopped at its next line, half done), and ends saying the
    /// output was lost.
    #[test]
    fn an_output_gone_mid_run_stops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let replays = [
            "834f314caae54030a1b0dc52b202f24a",
            "0123456789abcdef0123456789abcdef",
        ];
        for replay in replays {
            let blobs = dir.path().join(format!("90/42/{replay}"));
            std::fs::create_dir_all(&blobs).unwrap();
            std::fs::write(blobs.join("0"), b"a segment").unwrap();
        }
        let args = parse(&[
            "--blob-sink",
            "filesystem",
            "--blob-dir",
            dir.path().to_str().unwrap(),
            "--rows-sink",
            "null",
            "--project",
            "42",
            "--replay",
            replays[0],
            "--replay",
            replays[1],
        ])
        .unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let error = runtime
            .block_on(run(&args, &mut crate::tools::BrokenPipe))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the run's output could not be written"),
            "{error:#}"
        );
        for replay in replays {
            assert!(
                !dir.path().join(format!("90/42/{replay}")).exists(),
                "{replay} deleted"
            );
        }
    }

    #[test]
    fn replays_are_named_by_project_and_id_in_either_form() {
        let args = parse(&[
            "--project",
            "42",
            "--replay",
            "834F314C-AAE5-4030-A1B0-DC52B202F24A",
            "--replay",
            "834f314caae54030a1b0dc52b202f24a",
        ])
        .unwrap();
        assert_eq!(
            targets(&args).unwrap(),
            [Target {
                project: 42,
                replay: "834f314caae54030a1b0dc52b202f24a".into(),
                timestamp: None,
            }],
            "one replay, named twice"
        );
    }

    #[test]
    fn a_replays_time_comes_with_it_on_the_command_line_or_on_its_line() {
        let args = parse(&[
            "--project",
            "42",
            "--replay",
            "834f314caae54030a1b0dc52b202f24a",
            "--replay-timestamp",
            "2026-11-30T12:00:00Z",
        ])
        .unwrap();
        assert_eq!(targets(&args).unwrap()[0].timestamp, Some(1_796_040_000.0));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("replays.txt");
        std::fs::write(
            &file,
            "42 834f314caae54030a1b0dc52b202f24a 2026-11-30T12:00:00Z\n\
             7 9b9fa3d5-07ff-4d74-a2b0-a9ba0a7ab1b2 1796040000.5 # a note\n\
             7 9b9fa3d507ff4d74a2b0a9ba0a7ab1b2 1\n\
             8 c5d8bb1a6f8e4cd5a6a4f0a55c9e05f3\n\
             9 d5d8bb1a6f8e4cd5a6a4f0a55c9e05f3\n\
             9 d5d8bb1a6f8e4cd5a6a4f0a55c9e05f3 1702848000\n",
        )
        .unwrap();
        let from_file = parse(&["--from-file", file.to_str().unwrap()]).unwrap();
        let times: Vec<(u64, Option<f64>)> = targets(&from_file)
            .unwrap()
            .iter()
            .map(|t| (t.project, t.timestamp))
            .collect();
        assert_eq!(
            times,
            [
                (7, Some(1.0)),
                (8, None),
                (9, Some(1_702_848_000.0)),
                (42, Some(1_796_040_000.0))
            ],
            "each line's own time; the last for a replay named twice, a line with one over a \
             line without (a request's file and the lines a run printed to finish it)"
        );
        for (time, said) in [
            ("yesterday", "\"yesterday\": not an RFC 3339 time in UTC"),
            (
                "2026-12-01T10:00:00.000+02:00",
                "\"2026-12-01T10:00:00.000+02:00\": not an RFC 3339 time in UTC",
            ),
            ("NaN", "\"NaN\" is not a time"),
            ("-5", "\"-5\" is not a time"),
            (
                "1796040000000",
                "\"1796040000000\" is past the year 5000 in seconds: milliseconds?",
            ),
        ] {
            std::fs::write(
                &file,
                format!("42 834f314caae54030a1b0dc52b202f24a {time}\n"),
            )
            .unwrap();
            let error = targets(&from_file).unwrap_err().to_string();
            assert!(
                error.contains(&format!(":1: the replay's time: {said}")),
                "{error}"
            );
        }
        // A file whose editor marked UTF-8 at its start reads as any other; a bad line of a
        // long file is named by its number.
        std::fs::write(
            &file,
            "\u{feff}42 834f314caae54030a1b0dc52b202f24a\n7 9b9fa3d507ff4d74a2b0a9ba0a7ab1b2\n",
        )
        .unwrap();
        assert_eq!(targets(&from_file).unwrap().len(), 2);
        for (line, said) in [
            (
                "42x 834f314caae54030a1b0dc52b202f24a",
                "project \"42x\" is not a number",
            ),
            (
                "42 834f314caae5",
                "replay \"834f314caae5\" is not a replay id",
            ),
        ] {
            std::fs::write(
                &file,
                format!("7 9b9fa3d507ff4d74a2b0a9ba0a7ab1b2\n{line}\n"),
            )
            .unwrap();
            let error = format!("{:#}", targets(&from_file).unwrap_err());
            assert!(error.contains(&format!("replays.txt:2: {said}")), "{error}");
        }
    }

    #[test]
    fn bad_arguments_are_refused_with_a_clear_error() {
        assert!(
            parse(&["--replay", "834f314caae54030a1b0dc52b202f24a"]).is_err(),
            "no project"
        );
        assert!(parse(&["--project", "42"]).is_err(), "no replay");
        let bad = parse(&["--project", "42", "--replay", "nope"]).unwrap();
        let error = targets(&bad).unwrap_err().to_string();
        assert!(error.contains("\"nope\" is not a replay id"), "{error}");
        let none = parse(&[]).unwrap();
        assert!(
            targets(&none)
                .unwrap_err()
                .to_string()
                .contains("name the replays")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("replays.txt");
        std::fs::write(
            &file,
            "# privacy request 17\n42 834f314caae54030a1b0dc52b202f24a\n\n7 x y z\n",
        )
        .unwrap();
        let from_file = parse(&["--from-file", file.to_str().unwrap()]).unwrap();
        let error = targets(&from_file).unwrap_err().to_string();
        assert!(
            error.ends_with(":4: expected `PROJECT REPLAY [TIME]`, found \"7 x y z\""),
            "{error}"
        );
    }

    /// A recording message's msgpack header, naming its owner.
    fn owned_by(replay: &str) -> Vec<u8> {
        rmp_serde::to_vec_named(&serde_json::json!({"project_id": 42, "replay_id": replay}))
            .unwrap()
    }

    fn write_files(dir: &std::path::Path, files: &[(&str, Vec<u8>)]) {
        for (key, bytes) in files {
            let path = dir.join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }

    fn target(replay: &str) -> Target {
        Target {
            project: 42,
            replay: replay.into(),
            timestamp: None,
        }
    }

    #[tokio::test]
    async fn a_copys_long_key_and_the_temporary_files_a_crash_left_go_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = ("a".repeat(32), "b".repeat(32));
        write_files(
            dir.path(),
            &[
                ("dlq/t/0/17", owned_by(&ours)),
                ("dlq/t/0/17.key", b"k".to_vec()),
                ("dlq/t/0/17.key.tmp-1", b"k".to_vec()),
                ("dlq/t/0/17.tmp-2", b"cut sh".to_vec()),
                ("dlq/t/0/18.tmp-3", owned_by(&ours)),
                ("dlq/t/0/170", owned_by(&theirs)),
                // Keys that name their owner: the value is not read (it need not even be one).
                (
                    &format!("dlq/42/{ours}/t/0/20"),
                    b"\xc1 never read".to_vec(),
                ),
                (&format!("dlq/42/{ours}/t/0/20.key"), b"k".to_vec()),
                (&format!("dlq/42/{ours}/t/0/22.tmp-4"), b"cut".to_vec()),
                ("dlq/unknown/t/0/21", owned_by(&ours)),
            ],
        );
        let store = crate::sink::filesystem::FilesystemBlobSink::new(dir.path()).unwrap();
        let unnamed = unnamed_copies(&store).await.unwrap();
        assert!(unnamed.unreadable.is_empty());
        let retentions = crate::tools::Top::of(&store).await.unwrap().retentions;
        let copies = |replay: &str| {
            let (store, retentions, owners) = (&store, &retentions, &unnamed.owners);
            let target = target(replay);
            async move {
                find(Some(store), retentions, &Rows::None, owners, &target)
                    .await
                    .unwrap()
                    .dead_letters
            }
        };
        assert_eq!(
            copies(&ours).await,
            [
                &format!("dlq/42/{ours}/t/0/20"),
                &format!("dlq/42/{ours}/t/0/20.key"),
                &format!("dlq/42/{ours}/t/0/22.tmp-4"),
                "dlq/t/0/17",
                "dlq/t/0/17.key",
                "dlq/t/0/17.key.tmp-1",
                "dlq/t/0/17.tmp-2",
                "dlq/t/0/18.tmp-3",
            ],
            "not dlq/unknown/…, whatever its value says"
        );
        assert_eq!(copies(&theirs).await, ["dlq/t/0/170"]);
    }

    /// A store that counts what it is asked, and fails reads of the keys in `broken` and
    /// deletes of those in `undeletable`.
    struct Counting {
        store: crate::sink::filesystem::FilesystemBlobSink,
        lists: std::sync::atomic::AtomicUsize,
        reads: std::sync::Mutex<Vec<String>>,
        broken: Vec<String>,
        undeletable: Vec<String>,
    }

    fn unavailable() -> SinkError {
        SinkError::new("gcs", crate::sink::Retry::Retryable, "503 backend error")
    }

    impl BlobStore for Counting {
        fn list<'a>(
            &'a self,
            prefix: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<store::Listing, SinkError>> {
            self.lists
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.store.list(prefix)
        }

        fn read<'a>(
            &'a self,
            key: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Option<Vec<u8>>, SinkError>> {
            self.reads.lock().unwrap().push(key.to_owned());
            if self.broken.iter().any(|k| k == key) {
                return Box::pin(async move { Err(unavailable()) });
            }
            self.store.read(key)
        }

        fn delete<'a>(
            &'a self,
            key: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<bool, SinkError>> {
            if self.undeletable.iter().any(|k| k == key) {
                return Box::pin(async move { Err(unavailable()) });
            }
            self.store.delete(key)
        }

        fn location(&self, key: &str) -> String {
            self.store.location(key)
        }
    }

    impl Counting {
        /// The filesystem store in `dir`, failing reads of `broken` and deletes of `undeletable`.
        fn over(dir: &std::path::Path, broken: Vec<String>, undeletable: Vec<String>) -> Counting {
            Counting {
                store: crate::sink::filesystem::FilesystemBlobSink::new(dir).unwrap(),
                lists: Default::default(),
                reads: Default::default(),
                broken,
                undeletable,
            }
        }
    }

    /// A run over `targets` that fails: what it said, and its error.
    async fn failing(targets: &[Target], store: &Counting, rows: &Rows) -> (String, String) {
        let mut out = Vec::new();
        let error = delete(
            targets,
            Some(store),
            rows,
            false,
            Duration::from_secs(5),
            crate::recording::DEFAULT_MAX_DECOMPRESSED_BYTES,
            &mut out,
        )
        .await
        .unwrap_err();
        (String::from_utf8(out).unwrap(), format!("{error:#}"))
    }

    /// A store holding the copies of many other replays: one replay's delete lists its own
    /// prefixes and the older layout's directory, reads only the older layout's copies, and
    /// one of those it cannot read is named among what is left while the replay's own copies
    /// still go (it listed and read every copy of every replay, and one failed read ended the
    /// run before anything was deleted).
    #[tokio::test]
    async fn a_replays_copies_are_found_by_its_prefix_without_reading_anyone_elses() {
        let dir = tempfile::tempdir().unwrap();
        let ours = "a".repeat(32);
        let mut files: Vec<(String, Vec<u8>)> = (0..300)
            .map(|n| (format!("dlq/42/{n:032x}/t/0/{n}"), b"theirs".to_vec()))
            .collect();
        files.extend([
            (format!("dlq/42/{ours}/t/0/500"), b"ours".to_vec()),
            ("dlq/t/0/17".to_owned(), owned_by(&ours)),
            ("dlq/t/0/18".to_owned(), owned_by(&"b".repeat(32))),
            ("dlq/unknown/t/0/21".to_owned(), b"no one's".to_vec()),
            (format!("90/42/{ours}/0"), b"segment".to_vec()),
        ]);
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        write_files(dir.path(), &refs);
        let store = Counting::over(dir.path(), vec!["dlq/t/0/18".to_owned()], Vec::new());
        let (said, error) = failing(&[target(&ours)], &store, &Rows::None).await;
        assert!(
            said.contains("found 1 segment blob(s), 2 dead-letter copy object(s)"),
            "{said}"
        );
        assert!(
            said.contains("1 replay(s) deleted, 3 object(s) removed"),
            "{said}"
        );
        assert!(
            error.contains("dlq/t/0/18: a dead-letter copy of the older layout could not be read (503 backend error): whose it is is unknown"),
            "{error}"
        );
        let reads = store.reads.lock().unwrap().clone();
        assert_eq!(
            reads,
            ["dlq/t/0/17", "dlq/t/0/18"],
            "of the copies, only the older layout's are read (and without rows, no segment for the time)"
        );
        let lists = store.lists.load(std::sync::atomic::Ordering::Relaxed);
        assert!(lists < 20, "{lists} listings for one replay among 300");
        assert!(
            dir.path()
                .join("dlq/42/000000000000000000000000000000ff/t/0/255")
                .exists()
        );
        assert!(!dir.path().join(format!("dlq/42/{ours}/t/0/500")).exists());
        assert!(!dir.path().join("dlq/t/0/17").exists());
        assert_eq!(
            to_finish(&said),
            [format!("42 {ours}")],
            "the copy not read may be the replay's: it is printed to run again, finished or not"
        );
    }

    /// A zlib-packed recording whose first event is at 1702848658.25 s.
    fn segment_at_1702848658_25() -> Vec<u8> {
        use std::io::Write as _;
        let mut segment = flate2::write::ZlibEncoder::new(Vec::new(), Default::default());
        segment
            .write_all(br#"[{"type":3,"timestamp":1702848658250,"data":{"source":2}}]"#)
            .unwrap();
        segment.finish().unwrap()
    }

    /// The `--from-file` lines a run printed for what it left unfinished.
    fn to_finish(said: &str) -> Vec<&str> {
        said.split_once("to finish, run again with a --from-file holding these ")
            .unwrap_or_else(|| panic!("{said}"))
            .1
            .lines()
            .skip(1)
            .collect()
    }

    /// A run that leaves replays unfinished prints them as `--from-file` lines to run again on
    /// those alone (here, without a rows sink, nothing needs their time). A run again through
    /// snuba finds nothing of a replay an earlier run deleted, and without its time exits 1 for
    /// it whatever was done.
    #[tokio::test]
    async fn unfinished_replays_are_printed_as_from_file_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (kept, done) = ("a".repeat(32), "c".repeat(32));
        write_files(
            dir.path(),
            &[
                (&format!("90/42/{kept}/0"), segment_at_1702848658_25()),
                (&format!("90/42/{done}/0"), segment_at_1702848658_25()),
            ],
        );
        let store = Counting::over(dir.path(), Vec::new(), vec![format!("90/42/{kept}/0")]);
        let (said, error) = failing(&[target(&kept), target(&done)], &store, &Rows::None).await;
        assert!(said.contains("1 replay(s) deleted"), "{said}");
        assert!(
            !said.contains("archived as of now"),
            "no archive without rows: {said}"
        );
        assert_eq!(to_finish(&said), [format!("42 {kept}")], "{said}");
        assert!(error.contains("503 backend error"), "{error}");
        assert!(
            store.reads.lock().unwrap().is_empty(),
            "no time read: {said}"
        );
    }

    /// A store that fails every removal (down, or hanging until each request's timeout): after
    /// three failures in a row no more are sent, each failure is said when it happens, and every
    /// replay not wholly removed is printed to run again (the run went through every object,
    /// each waiting its timeout, and said nothing until its end).
    #[tokio::test]
    async fn a_store_that_fails_removals_in_a_row_is_sent_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let replays: Vec<String> = ["a", "b", "c"].iter().map(|c| c.repeat(32)).collect();
        let mut files = Vec::new();
        for replay in &replays {
            for segment in 0..4 {
                files.push((format!("90/42/{replay}/{segment}"), b"segment".to_vec()));
            }
        }
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        write_files(dir.path(), &refs);
        let undeletable = files.iter().map(|(k, _)| k.clone()).collect();
        let store = Counting::over(dir.path(), Vec::new(), undeletable);
        let targets: Vec<Target> = replays.iter().map(|r| target(r)).collect();
        let (said, error) = failing(&targets, &store, &Rows::None).await;
        assert_eq!(
            said.matches("could not remove").count(),
            STORE_DOWN_AFTER,
            "{said}"
        );
        assert!(said.contains("0 replay(s) deleted"), "{said}");
        let expected: Vec<String> = replays.iter().map(|r| format!("42 {r}")).collect();
        assert_eq!(to_finish(&said), expected, "{said}");
        assert!(
            error.contains("removing the rest of its blobs was not tried: the last 3 failed in a row, and no more were sent"),
            "{error}"
        );
    }

    /// Through snuba, the lines carry the time each archive was stamped with, read or given,
    /// and none where there was none; a blob whose read fails leaves its replay for the next run
    /// (its time is not taken from elsewhere, nor the archive stamped now); one whose earliest
    /// segment is no recording has its time read from the next (it was taken for having none).
    /// The archives are not published here: the broker is unreachable.
    #[tokio::test]
    async fn through_snuba_the_lines_carry_the_archives_times() {
        let dir = tempfile::tempdir().unwrap();
        let (timed, untimed, unread) = ("a".repeat(32), "b".repeat(32), "d".repeat(32));
        // Unreadable too, but its time is given.
        let given = "e".repeat(32);
        let later = "f".repeat(32);
        write_files(
            dir.path(),
            &[
                (&format!("90/42/{timed}/0"), segment_at_1702848658_25()),
                (&format!("90/42/{untimed}/0"), b"not a recording".to_vec()),
                (&format!("90/42/{later}/0"), b"not a recording".to_vec()),
                (&format!("90/42/{later}/1"), segment_at_1702848658_25()),
                (&format!("90/42/{unread}/0"), segment_at_1702848658_25()),
                (&format!("90/42/{given}/0"), segment_at_1702848658_25()),
            ],
        );
        let broken = vec![format!("90/42/{unread}/0"), format!("90/42/{given}/0")];
        let store = Counting::over(dir.path(), broken, Vec::new());
        let producer = crate::kafka::producer::unreachable(300).create().unwrap();
        let rows = Rows::Snuba {
            producer,
            topic: "replay-events".into(),
        };
        let timed_by_hand = Target {
            timestamp: Some(1_702_848_000.0),
            ..target(&given)
        };
        let named = [
            target(&timed),
            target(&untimed),
            target(&unread),
            timed_by_hand,
            target(&later),
        ];
        let (said, error) = failing(&named, &store, &rows).await;
        assert!(
            said.contains("0 replay(s) deleted, 0 object(s) removed"),
            "{said}"
        );
        assert_eq!(
            to_finish(&said),
            [
                format!("42 {untimed}"),
                format!("42 {unread}"),
                format!("42 {timed} 1702848658.25"),
                format!("42 {given} 1702848000"),
                format!("42 {later} 1702848658.25"),
            ],
            "{said}"
        );
        assert!(
            error.contains(&format!(
                "replay {untimed} (project 42): none of its first 1 segment blob(s) of 1 holds a recording with a time, and no time given"
            )),
            "{error}"
        );
        assert!(
            error.contains(&format!(
                "replay {unread} (project 42): reading its time (reading file://"
            )),
            "{error}"
        );
        assert!(error.contains("publishing the archive"), "{error}");
        let again = parse(&["--blob-sink", "null", "--from-file", "/dev/null"]).unwrap();
        let file = dir.path().join("again.txt");
        std::fs::write(&file, to_finish(&said).join("\n")).unwrap();
        let again = DeleteArgs {
            from_file: Some(file),
            ..again
        };
        let named = targets(&again).unwrap();
        assert_eq!(named[0].timestamp, Some(1_702_848_658.25));
        assert_eq!(named[1].timestamp, None);
    }
}
