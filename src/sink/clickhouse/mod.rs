//! Rows to ClickHouse: one `replays` table (ReplacingMergeTree) holding click, tap and segment
//! rows, inserted with RowBinary over HTTP, one insert per batch — cut between messages, before
//! `chunk_rows` rows and before an insert would touch more than `MAX_PARTITIONS_PER_INSERT`
//! partitions (the server refuses a block spread over more than `max_partitions_per_insert_block`,
//! 100 by default; one segment with clicks over many weeks would otherwise be rejected forever).
//! A message's rows are never split between two inserts, so one the server refuses leaves none
//! of its rows behind. Each message's rows are sent within `--sink-timeout-ms`, an insert is
//! ended (between messages) once it has been open half of that, and its answer gets as long
//! again; the messages of an insert the server took are not inserted again by a retry. So a
//! batch cut into many inserts (segments with clicks over many weeks touch many partitions)
//! moves forward attempt by attempt, where one deadline for them all failed every attempt at the
//! same place, and rows a link cannot carry within one deadline (long environments repeated on
//! every click row, a slow link) go as inserts of what it carries in half of one, where a single
//! insert timed out on every attempt. Only one message whose own rows take longer than the
//! timeout cannot get through (rows are not counted in bytes; a message's are never split).
//! Rows with the same key collapse, the last inserted kept (the engine has no version column, as
//! snuba's table): a redelivered older segment can replace a later one's slow/dead/rage click of
//! the same node and second with its own, as in Sentry.
//!
//! Settings make errors visible: `wait_end_of_query=1` (an error after the first bytes of a 200
//! response would otherwise go unnoticed). The table is created by `migrate` for the server it
//! finds: TTL only where the server supports it (19.6+), so the same code runs against the local
//! 18.16 server and a current production one.

mod http;
mod migrate;
mod schema;

use std::path::PathBuf;

use clap::Args;
use clap::builder::RangedU64ValueParser;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::progress::Piece;
use super::{Built, Check, Entry, Outcome, Progress, Retry, Sink, SinkError, Writing, Written};
use crate::recording::{KafkaPosition, ReplayRow};
use crate::secret::Secret;
pub use migrate::{check_columns, check_table, migrate};
pub use schema::*;

/// ClickHouse.
#[derive(Args, Debug, Clone)]
pub struct ClickHouseArgs {
    /// HTTP interface URL, `http://` or `https://` (TLS; the server's certificate is checked
    /// against the system's trust store, or the PEM bundle `SSL_CERT_FILE` names).
    #[arg(
        long,
        env = "REPLAY_INGEST_CLICKHOUSE_URL",
        default_value = "http://127.0.0.1:8123"
    )]
    pub clickhouse_url: String,
    #[arg(
        long,
        env = "REPLAY_INGEST_CLICKHOUSE_DATABASE",
        default_value = "default"
    )]
    pub clickhouse_database: String,
    #[arg(
        long,
        env = "REPLAY_INGEST_CLICKHOUSE_TABLE",
        default_value = "replays_local"
    )]
    pub clickhouse_table: String,
    #[arg(long, env = "REPLAY_INGEST_CLICKHOUSE_USER", default_value = "default")]
    pub clickhouse_user: String,
    /// Password, from a Secret-backed variable: it never belongs on a command line.
    #[arg(
        long,
        env = "REPLAY_INGEST_CLICKHOUSE_PASSWORD",
        hide_env_values = true
    )]
    pub clickhouse_password: Option<Secret>,
    /// File holding the password (a mounted Kubernetes Secret); wins over the variable. Read
    /// again when the server refuses the password: a new one is used without a restart.
    #[arg(long, env = "REPLAY_INGEST_CLICKHOUSE_PASSWORD_FILE")]
    pub clickhouse_password_file: Option<PathBuf>,
    /// Rows per INSERT; larger batches are split, between messages. At most 1 000 000: the
    /// server cuts an INSERT into blocks of `max_insert_block_size` rows (1 048 449 by default)
    /// and stores each as it comes, so a larger one refused half way leaves its first blocks in
    /// the table, and its retry writes them again.
    #[arg(long, env = "REPLAY_INGEST_CLICKHOUSE_CHUNK_ROWS", value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000), default_value_t = 100_000)]
    pub clickhouse_chunk_rows: usize,
}

impl ClickHouseArgs {
    /// `--clickhouse-url` is an HTTP(S) URL.
    pub fn validate(&self) -> Result<(), String> {
        super::http_url("--clickhouse-url", &self.clickhouse_url)
    }

    /// The sink's configuration; `timeout` bounds each INSERT's sending and its answer.
    pub fn config(&self, timeout: std::time::Duration) -> std::io::Result<ClickHouseConfig> {
        let password = Secret::from_file_or(
            self.clickhouse_password_file.as_deref(),
            self.clickhouse_password.as_ref(),
        )?
        .unwrap_or_default();
        Ok(ClickHouseConfig {
            url: self.clickhouse_url.clone(),
            database: self.clickhouse_database.clone(),
            table: self.clickhouse_table.clone(),
            user: self.clickhouse_user.clone(),
            password,
            password_file: self.clickhouse_password_file.clone(),
            chunk_rows: self.clickhouse_chunk_rows,
            timeout,
        })
    }
}

/// ClickHouse error codes about the data sent: the rows are refused (unless the table no longer
/// matches the rows, which `ClickHouseSink::write` checks before trusting these). 6 CANNOT_PARSE_TEXT, 26
/// CANNOT_PARSE_QUOTED_STRING, 27 CANNOT_PARSE_INPUT_ASSERTION_FAILED, 32
/// ATTEMPT_TO_READ_AFTER_EOF, 33 CANNOT_READ_ALL_DATA, 38 CANNOT_PARSE_DATE, 41
/// CANNOT_PARSE_DATETIME, 53 TYPE_MISMATCH, 69 ARGUMENT_OUT_OF_BOUND, 70 CANNOT_CONVERT_TYPE, 72
/// CANNOT_PARSE_NUMBER, 117 INCORRECT_DATA, 131 TOO_LARGE_STRING_SIZE, 246 CORRUPTED_DATA.
const REJECTED_CODES: [u32; 14] = [6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 131, 246];

/// ClickHouse error codes no data can fix: the configuration is wrong. 16
/// NO_SUCH_COLUMN_IN_TABLE, 36 BAD_ARGUMENTS, 43 ILLEGAL_TYPE_OF_ARGUMENT, 44 ILLEGAL_COLUMN (a
/// column written to that became MATERIALIZED or ALIAS: its type still matches, so the schema
/// check passes), 60 UNKNOWN_TABLE, 62 SYNTAX_ERROR, 81 UNKNOWN_DATABASE, 115 UNKNOWN_SETTING
/// and 452 SETTING_CONSTRAINT_VIOLATION (a setting the service sends, refused by the server or
/// the user's profile); a user that may not write: 164 READONLY, 291 DATABASE_ACCESS_DENIED, 497
/// ACCESS_DENIED (the startup check only reads, so a read-only user passes it and is refused at
/// the first INSERT); and the [`AUTHENTICATION_CODES`]. (44, 115 and 452 were retried without
/// end.)
const FATAL_CODES: [u32; 16] = [
    16, 36, 43, 44, 60, 62, 81, 115, 452, 164, 291, 497, 192, 193, 194, 516,
];

/// Partitions one INSERT may touch. Rows are partitioned by `(retention_days,
/// toMonday(timestamp))`; half the server's default limit leaves room for a server time zone
/// that moves week boundaries.
pub const MAX_PARTITIONS_PER_INSERT: usize = 50;

/// The partition a row lands in: its retention and the Monday of its UTC week (days since the
/// epoch; 1970-01-01 was a Thursday).
fn partition_of(row: &ReplayRow) -> (u16, u32) {
    let days = row.timestamp / 86_400;
    (row.retention_days, days.saturating_sub((days + 3) % 7))
}

/// The rows of the INSERT being written: how many, which partitions they touch, and whose they
/// are. An INSERT holds whole messages: a message whose rows the server refuses is dead-lettered
/// with none of its rows left in the table by an earlier INSERT of the same write.
#[derive(Default)]
struct Chunk {
    rows: usize,
    partitions: HashSet<(u16, u32)>,
    messages: Vec<Piece>,
    /// When its INSERT was opened.
    opened: Option<Instant>,
}

/// When an INSERT takes no more messages.
#[derive(Clone, Copy)]
struct ChunkLimits {
    rows: usize,
    /// How long it may have been open.
    open: Duration,
}

impl Chunk {
    /// Whether a message's `rows`, touching `partitions`, must start a new INSERT at `now`: with
    /// them this one would pass the row limit or [`MAX_PARTITIONS_PER_INSERT`], or it has been
    /// open as long as it may. A message alone past a limit goes alone (its rows are at most the
    /// click and tap limits and its segment row: far under the server's 100 partitions unless
    /// those limits are raised past it).
    fn is_full_for(
        &self,
        rows: usize,
        partitions: &HashSet<(u16, u32)>,
        limits: ChunkLimits,
        now: Instant,
    ) -> bool {
        self.rows > 0
            && (self.rows + rows > limits.rows
                || self.partitions.union(partitions).count() > MAX_PARTITIONS_PER_INSERT
                || self
                    .opened
                    .is_some_and(|opened| now.saturating_duration_since(opened) >= limits.open))
    }

    fn add(&mut self, rows: usize, partitions: HashSet<(u16, u32)>, message: Piece) {
        self.rows += rows;
        self.partitions.extend(partitions);
        self.messages.push(message);
    }
}

/// Retry classification: deterministic data or schema errors are fatal; network trouble,
/// timeouts, overload and other server errors are retried.
pub fn classify(error: &clickhouse::error::Error) -> Retry {
    use clickhouse::error::Error;
    match error {
        // Code 252 is also "too many parts" (merges behind: transient); this one is the data.
        Error::BadResponse(message)
            if message.contains("Too many partitions for single INSERT block") =>
        {
            Retry::Rejected
        }
        Error::BadResponse(message) => by_code(message),
        // A `200` whose body is an exception (`http`): the exception decides.
        Error::Network(cause) if let Some(exception) = http::exception_in_200(cause.as_ref()) => {
            by_code(&exception.0)
        }
        // An error a proxy in front of ClickHouse answered itself: its status decides.
        Error::Network(cause) if let Some(answer) = http::proxy_answer(cause.as_ref()) => {
            by_status(answer.status)
        }
        // Configuration: no retry loads a trust store.
        Error::Network(cause) if http::no_trust_roots(cause.as_ref()).is_some() => Retry::Fatal,
        Error::Network(_) | Error::TimedOut | Error::Compression(_) | Error::Decompression(_) => {
            Retry::Retryable
        }
        Error::SchemaMismatch(_) | Error::InvalidParams(_) | Error::Unsupported(_) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// ClickHouse error codes for credentials it refuses: 192 UNKNOWN_USER, 193 WRONG_PASSWORD, 194
/// REQUIRED_PASSWORD, 516 AUTHENTICATION_FAILED.
const AUTHENTICATION_CODES: [u32; 4] = [192, 193, 194, 516];

/// Whether `error` is the server refusing the credentials (in an error status, or in a `200`).
fn refused_credentials(error: &clickhouse::error::Error) -> bool {
    let message = match error {
        clickhouse::error::Error::BadResponse(message) => message.as_str(),
        clickhouse::error::Error::Network(cause) => match http::exception_in_200(cause.as_ref()) {
            Some(exception) => exception.0.as_str(),
            None => return false,
        },
        _ => return false,
    };
    error_code(message).is_some_and(|code| AUTHENTICATION_CODES.contains(&code))
}

/// A failed request before any data was written (the startup check, a migration), as an operator
/// must read it: refused credentials and an untrusted certificate are configuration errors that
/// name what to fix; a TLS handshake that fails otherwise says so; the rest is classified as
/// [`classify`] does, with every cause in the message.
pub fn setup_error(error: &clickhouse::error::Error, config: &ClickHouseConfig) -> SinkError {
    let detail = super::describe(error);
    let at = &config.url;
    let (retry, message) = match error {
        clickhouse::error::Error::BadResponse(m)
            if error_code(m).is_some_and(|c| AUTHENTICATION_CODES.contains(&c)) =>
        {
            let user = &config.user;
            (
                Retry::Fatal,
                format!(
                    "authentication as {user:?} failed at {at} (check --clickhouse-user and --clickhouse-password-file): {detail}"
                ),
            )
        }
        clickhouse::error::Error::Network(cause)
            if let Some(no_roots) = http::no_trust_roots(cause.as_ref()) =>
        {
            (Retry::Fatal, format!("TLS to {at}: {no_roots}"))
        }
        _ if detail.contains("invalid peer certificate") => (
            Retry::Fatal,
            format!(
                "TLS: the certificate of {at} is not trusted (a private CA's bundle goes in SSL_CERT_FILE): {detail}"
            ),
        ),
        _ if detail.contains("tls") || detail.contains("TLS") || detail.contains("handshake") => (
            classify(error),
            format!("TLS handshake with {at} failed: {detail}"),
        ),
        _ => (classify(error), format!("at {at}: {detail}")),
    };
    SinkError::new("clickhouse", retry, message)
}

/// The class of an error status a proxy answered, as GCS's are classified: timeouts, throttling
/// and server errors are retried; a body over its limit (413) is refused data, found by halving
/// (the rows of a smaller INSERT fit, a message whose rows alone do not is dead-lettered); any
/// other (401, 403, 404 …) is configuration.
fn by_status(status: u16) -> Retry {
    match status {
        408 | 429 | 500..=599 => Retry::Retryable,
        413 => Retry::Rejected,
        _ => Retry::Fatal,
    }
}

/// The class of a server error, from its code.
fn by_code(message: &str) -> Retry {
    match error_code(message) {
        // The data ended early, but on a connection between servers — an INSERT into a
        // Distributed table forwarding rows to a shard that went away — not in the rows sent:
        // dead-lettering them would pin a restart's error on healthy messages.
        Some(32 | 33)
            if ["while receiving packet from", "while reading from socket"]
                .iter()
                .any(|said| message.contains(said)) =>
        {
            Retry::Retryable
        }
        Some(code) if REJECTED_CODES.contains(&code) => Retry::Rejected,
        Some(code) if FATAL_CODES.contains(&code) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// The `Code: N` ClickHouse puts in its error messages.
fn error_code(message: &str) -> Option<u32> {
    let rest = &message[message.find("Code: ")? + 6..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Connection settings. `url` may be `https://`: TLS (rustls) checks the server against the
/// system's trust store, or the CA bundle `SSL_CERT_FILE` names.
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub table: String,
    pub user: String,
    pub password: Secret,
    /// Where `password` was read (a mounted Secret): read again when the server refuses it, so
    /// that a rotation needs no restart.
    pub password_file: Option<PathBuf>,
    /// Rows per INSERT; a batch with more rows is split, between messages.
    pub chunk_rows: usize,
    /// Each message's rows get this to be sent, an INSERT is ended once open half of it, and
    /// its answer gets as long; past either deadline the INSERT is aborted and retried: a
    /// half-open connection must not wedge the flush.
    pub timeout: std::time::Duration,
}

pub fn client(config: &ClickHouseConfig) -> clickhouse::Client {
    http::clickhouse_client()
        .with_url(&config.url)
        .with_user(&config.user)
        .with_password(config.password.expose())
        .with_database(&config.database)
        .with_validation(false)
        .with_setting("wait_end_of_query", "1")
        // Into a Distributed table (`replays_dist`), as snuba inserts: answered once every shard
        // has the rows, not once they are queued on the node that took them (whose later
        // forwarding errors the service would never see, its offsets committed). No effect on a
        // local table. (`distributed_foreground_insert` since ClickHouse 23.x; the old name stays.)
        .with_setting("insert_distributed_sync", "1")
}

pub struct ClickHouseSink {
    /// The configuration and its client; both take a new password once the password file holds
    /// one and the server refused the old ([`ClickHouseSink::rotated`]).
    connection: std::sync::RwLock<Connection>,
    table: String,
    chunk_rows: usize,
    timeout: std::time::Duration,
}

struct Connection {
    config: ClickHouseConfig,
    client: clickhouse::Client,
}

impl ClickHouseSink {
    pub fn new(config: &ClickHouseConfig) -> Self {
        ClickHouseSink {
            connection: std::sync::RwLock::new(Connection {
                config: config.clone(),
                client: client(config),
            }),
            table: config.table.clone(),
            chunk_rows: config.chunk_rows.max(1),
            timeout: config.timeout,
        }
    }

    /// The configuration and client to write with now.
    fn connection(&self) -> (ClickHouseConfig, clickhouse::Client) {
        let current = self
            .connection
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (current.config.clone(), current.client.clone())
    }

    /// After the server refused the password `refused`: whether the password file now holds
    /// another one, which the sink then writes with (`Ok(true)`), or why it could not be read
    /// again. So rotating the password — the Secret first, then the server — goes through
    /// without a restart: each pod's next write is refused, and goes on with the new password.
    fn rotated(&self, refused: &Secret) -> Result<bool, String> {
        let mut current = self
            .connection
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.config.password.expose() != refused.expose() {
            // Another write met the refusal first and took the new password already.
            return Ok(true);
        }
        let Some(file) = current.config.password_file.clone() else {
            return Ok(false);
        };
        match Secret::from_file_or(Some(&file), None) {
            Ok(Some(password)) if password.expose() != refused.expose() => {
                current.config.password = password;
                current.client = client(&current.config);
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Inserts the batch's rows, `chunk_rows` per INSERT (fewer once an INSERT has been open
    /// half the sink's timeout), each message's rows sent within the timeout and each INSERT
    /// answered within another (see [`Self::end`]), the
    /// messages of each INSERT the server took marked in `progress` (and skipped: a retry goes on
    /// from the first INSERT not taken). Rows are built one segment at a time as they are
    /// written, so the batch never holds them all. Returns the number of rows.
    async fn insert(
        &self,
        client: &clickhouse::Client,
        batch: &[Entry],
        progress: &Progress<'_>,
    ) -> Result<u64, clickhouse::error::Error> {
        let mut written = 0u64;
        let mut open: Option<Open> = None;
        let mut chunk = Chunk::default();
        // An INSERT open half the timeout ends before the next message, so that none outlasts
        // what one message is allowed by more than that.
        let limits = ChunkLimits {
            rows: self.chunk_rows,
            open: self.timeout / 2,
        };
        for entry in batch {
            let Outcome::Valid(processed) = &entry.outcome else {
                continue;
            };
            let message = Piece::of(entry, 0);
            let rows = processed.rows(KafkaPosition {
                partition: entry.partition,
                offset: entry.offset,
            });
            if progress.is_stored(message) {
                // Inserted by an earlier attempt: counted, as the other sinks count what they
                // stored before.
                written += rows.len() as u64;
                continue;
            }
            if rows.is_empty() {
                continue;
            }
            let partitions: HashSet<(u16, u32)> = rows.iter().map(partition_of).collect();
            let mut now = Instant::now();
            if chunk.is_full_for(rows.len(), &partitions, limits, now) {
                if let Some(full) = open.take() {
                    self.end(full, &chunk, progress).await?;
                    // The next INSERT opens after the answer, however long it took: opened and
                    // timed from before it, each INSERT of a server answering in over half the
                    // timeout was ended after one message, and that message sent its rows in
                    // what was left of its timeout.
                    now = Instant::now();
                }
                chunk = Chunk::default();
            }
            let deadline = now + self.timeout;
            let Open { insert, query_id } = match &mut open {
                Some(open) => open,
                None => {
                    chunk.opened = Some(now);
                    let query_id = http::query_id();
                    let insert = within(deadline, client.insert::<ReplayRow>(&self.table))
                        .await?
                        // Every send (those of `end` too: it sends the last rows before waiting)
                        // and the answer; past either the request is aborted, not left running.
                        .with_timeouts(Some(self.timeout), Some(self.timeout))
                        .with_setting("query_id", query_id.clone());
                    open.insert(Open { insert, query_id })
                }
            };
            for row in &rows {
                within(deadline, insert.write(row))
                    .await
                    .map_err(|e| answered(e, query_id))?;
            }
            chunk.add(rows.len(), partitions, message);
            written += rows.len() as u64;
        }
        if let Some(last) = open {
            self.end(last, &chunk, progress).await?;
        }
        Ok(written)
    }

    /// Ends `insert` and marks `chunk`'s messages stored. The server's answer gets the sink's
    /// timeout from here (the client's own: past it the request is aborted, not left running
    /// in the background), its rows having been sent within theirs. The wait runs in a task of
    /// its own, which that timeout ends: a write cut while it waits (its partitions lost,
    /// `pipeline::flush`) drops only the task's handle. Dropped itself, the ended INSERT keeps
    /// its request running with no timeout, until a hung server answers.
    async fn end(
        &self,
        Open { insert, query_id }: Open,
        chunk: &Chunk,
        progress: &Progress<'_>,
    ) -> Result<(), clickhouse::error::Error> {
        progress.stepped();
        tokio::spawn(insert.end())
            .await
            .map_err(|e| clickhouse::error::Error::Custom(format!("ending the INSERT: {e}")))?
            .map_err(|e| answered(e, &query_id))?;
        chunk.messages.iter().for_each(|&m| progress.stored(m));
        Ok(())
    }
}

/// An INSERT open for more rows, and its `query_id`.
struct Open {
    insert: clickhouse::insert::Insert<ReplayRow>,
    query_id: String,
}

/// `error`, or, for a network error, the answer the connection's watch found to the INSERT
/// `query_id` if it found one: an answer that came while the rows were being sent (a proxy's 413
/// past its body limit) reaches the crate as the body's channel closing, with the answer
/// dropped ([`http::heard`]).
fn answered(error: clickhouse::error::Error, query_id: &str) -> clickhouse::error::Error {
    match error {
        clickhouse::error::Error::Network(_) => http::heard(query_id).map_or(error, |heard| {
            clickhouse::error::Error::Network(Box::new(heard))
        }),
        other => other,
    }
}

/// `request` unless `deadline` passes first.
async fn within<T>(
    deadline: Instant,
    request: impl std::future::Future<Output = Result<T, clickhouse::error::Error>>,
) -> Result<T, clickhouse::error::Error> {
    tokio::time::timeout_at(deadline.into(), request)
        .await
        .unwrap_or(Err(clickhouse::error::Error::TimedOut))
}

impl Sink for ClickHouseSink {
    fn name(&self) -> &'static str {
        "clickhouse"
    }

    /// Only segments with rows: a rejection is pinned on the one whose rows were refused.
    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(&entry.outcome, Outcome::Valid(p) if p.has_rows())
    }

    /// One INSERT per chunk, each all or nothing: a retry inserts again what the server did not
    /// take (an INSERT that timed out may have been taken after all: the table's
    /// `ReplacingMergeTree` collapses rows written twice).
    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            let rows = self
                .insert_classified(batch, progress)
                .await
                .inspect_err(|e| progress.failed(e))?;
            Ok(Written {
                items: rows,
                bytes: 0,
            })
        })
    }
}

impl ClickHouseSink {
    async fn insert_classified(
        &self,
        batch: &[Entry],
        progress: &Progress<'_>,
    ) -> Result<u64, SinkError> {
        let (mut config, mut client) = self.connection();
        // A refused password is read again from its file once per write: the same write goes
        // on with a new one (taking no flush attempt: `--flush-max-attempts 1` rides out a
        // rotation too), and one refused as well is the configuration error it looks like.
        let mut password_read_again = false;
        let error = loop {
            let error = match self.insert(&client, batch, progress).await {
                Ok(rows) => return Ok(rows),
                Err(clickhouse::error::Error::TimedOut) => {
                    let message = format!("an INSERT timed out after {:?}", self.timeout);
                    return Err(SinkError::new(self.name(), Retry::Retryable, message));
                }
                Err(error) => error,
            };
            if password_read_again || !refused_credentials(&error) {
                break error;
            }
            password_read_again = true;
            match self.rotated(&config.password) {
                Ok(false) => break error,
                Ok(true) => {
                    tracing::warn!(user = %config.user, "ClickHouse refused the password, and its file holds a new one: writing with that from now on");
                    (config, client) = self.connection();
                }
                Err(unread) => {
                    let message = format!(
                        "the password was refused, and its file could not be read again ({unread}): {}",
                        super::describe(&error)
                    );
                    return Err(SinkError::new(self.name(), Retry::Fatal, message));
                }
            }
        };
        // The server refused the data: a table altered since startup explains it for
        // every batch, and no retry or dead letter would help.
        if let clickhouse::error::Error::BadResponse(_) = error {
            let check = tokio::time::timeout(self.timeout, check_table(&config)).await;
            if let Ok(Err(mismatch)) = check
                && mismatch.retry == Retry::Fatal
            {
                return Err(mismatch);
            }
        }
        let message = super::describe(&error);
        Err(SinkError {
            message,
            ..SinkError::from_error(self.name(), classify(&error), error)
        })
    }
}

/// Rows into ClickHouse. Its health check: the table exists and matches the rows — after
/// creating or migrating it, with `migrate`.
pub fn build(config: ClickHouseConfig, migrate: bool) -> Built {
    let sink = ClickHouseSink::new(&config);
    let check: Check = Box::new(move || {
        let config = config.clone();
        Box::pin(async move {
            if migrate {
                let features = self::migrate(&config)
                    .await
                    .map_err(|e| setup_error(&e, &config))?;
                tracing::info!(?features, table = %config.table, "ClickHouse table ready");
            }
            check_table(&config).await
        })
    });
    Built::checked(sink, "clickhouse", "the ClickHouse table", check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse::error::Error;

    #[test]
    fn data_errors_are_rejections_schema_errors_fatal_and_the_rest_retried() {
        let cases = [
            (
                "Code: 53, e.displayText() = DB::Exception: Type mismatch",
                Retry::Rejected,
            ),
            (
                "Code: 27. DB::Exception: Cannot parse input",
                Retry::Rejected,
            ),
            (
                "Code: 32, e.displayText() = DB::Exception: Attempt to read after eof",
                Retry::Rejected,
            ),
            (
                "Code: 32. DB::Exception: Attempt to read after eof: while receiving packet from shard-2:9000",
                Retry::Retryable,
            ),
            (
                "Code: 33. DB::Exception: Cannot read all data. Bytes read: 0. Bytes expected: 8.: while receiving packet from shard-2:9000",
                Retry::Retryable,
            ),
            (
                "Code: 33. DB::Exception: Cannot read all data. Bytes read: 3. Bytes expected: 8.",
                Retry::Rejected,
            ),
            (
                "Code: 117, e.displayText() = DB::Exception: Incorrect data",
                Retry::Rejected,
            ),
            (
                "Code: 60. DB::Exception: Table default.x doesn't exist",
                Retry::Fatal,
            ),
            (
                "Code: 44. DB::Exception: Cannot insert column platform, because it is MATERIALIZED column. (ILLEGAL_COLUMN)",
                Retry::Fatal,
            ),
            (
                "Code: 115. DB::Exception: Unknown setting insert_distributed_sync. (UNKNOWN_SETTING)",
                Retry::Fatal,
            ),
            (
                "Code: 452. DB::Exception: Setting insert_distributed_sync should not be changed. (SETTING_CONSTRAINT_VIOLATION)",
                Retry::Fatal,
            ),
            (
                "Code: 241. DB::Exception: Memory limit exceeded",
                Retry::Retryable,
            ),
            (
                "Code: 164, e.displayText() = DB::Exception: Cannot execute query in readonly mode",
                Retry::Fatal,
            ),
            (
                "Code: 497. DB::Exception: ingest: Not enough privileges. To execute this query, it's necessary to have the grant INSERT ON default.replays_local",
                Retry::Fatal,
            ),
            (
                "Code: 291. DB::Exception: Database default is not allowed for user ingest",
                Retry::Fatal,
            ),
            ("Code: 252. DB::Exception: Too many parts", Retry::Retryable),
            (
                "Code: 252. DB::Exception: Too many partitions for single INSERT block (more than 100)",
                Retry::Rejected,
            ),
            ("503 Service Unavailable", Retry::Retryable),
        ];
        for (message, expected) in cases {
            assert_eq!(
                classify(&Error::BadResponse(message.into())),
                expected,
                "{message}"
            );
        }
        assert_eq!(classify(&Error::TimedOut), Retry::Retryable);
        assert_eq!(classify(&Error::SchemaMismatch("x".into())), Retry::Fatal);
        // A proxy's own answer, by its status.
        for (status, expected) in [
            (413, Retry::Rejected),
            (401, Retry::Fatal),
            (403, Retry::Fatal),
            (404, Retry::Fatal),
            (408, Retry::Retryable),
            (429, Retry::Retryable),
            (502, Retry::Retryable),
            (503, Retry::Retryable),
        ] {
            let answer = http::ProxyAnswer {
                status,
                reason: String::new(),
            };
            let error = Error::Network(Box::new(std::io::Error::other(answer)));
            assert_eq!(classify(&error), expected, "{status}");
        }
    }

    #[test]
    fn refused_credentials_and_untrusted_certificates_are_configuration_errors_naming_the_fix() {
        let config = ClickHouseConfig {
            url: "https://ch:8443".into(),
            database: "d".into(),
            table: "t".into(),
            user: "ingest".into(),
            password: Default::default(),
            password_file: None,
            chunk_rows: 1,
            timeout: std::time::Duration::from_secs(1),
        };
        for code in [193, 516] {
            let error = setup_error(
                &Error::BadResponse(format!("Code: {code}. DB::Exception: wrong password")),
                &config,
            );
            assert_eq!(error.retry, Retry::Fatal);
            assert!(
                error.message.contains("--clickhouse-password-file")
                    && error.message.contains("\"ingest\"")
            );
        }
        let untrusted = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let error = setup_error(&Error::Network(Box::new(untrusted)), &config);
        assert_eq!(error.retry, Retry::Fatal);
        assert!(
            error
                .message
                .starts_with("TLS: the certificate of https://ch:8443 is not trusted"),
            "{}",
            error.message
        );
        let refused = setup_error(
            &Error::Network(Box::new(std::io::Error::other("connection refused"))),
            &config,
        );
        assert_eq!(refused.retry, Retry::Retryable, "down is not misconfigured");
    }

    #[test]
    fn an_insert_is_cut_between_messages_before_too_many_partitions_or_rows_or_once_open_too_long()
    {
        let at = Instant::now();
        let limits = |rows| ChunkLimits {
            rows,
            open: Duration::from_secs(15),
        };
        let weeks = |range: std::ops::Range<u32>| -> HashSet<(u16, u32)> {
            range.map(|week| (30, week * 7)).collect()
        };
        let mut chunk = Chunk {
            opened: Some(at),
            ..Chunk::default()
        };
        let limit = MAX_PARTITIONS_PER_INSERT as u32;
        for message in 0..limit / 2 {
            let touched = weeks(message * 2..message * 2 + 2);
            assert!(!chunk.is_full_for(2, &touched, limits(1000), at));
            let piece = Piece {
                partition: 0,
                offset: i64::from(message),
                index: 0,
            };
            chunk.add(2, touched, piece);
        }
        assert!(
            !chunk.is_full_for(3, &weeks(0..3), limits(1000), at),
            "partitions it already touches"
        );
        assert!(
            chunk.is_full_for(2, &weeks(limit - 1..limit + 1), limits(1000), at),
            "a message whose rows would pass the partition limit starts the next INSERT"
        );
        assert!(
            chunk.is_full_for(3, &weeks(0..1), limits(chunk.rows + 2), at),
            "or the row limit: a message's rows are not split"
        );
        assert!(
            !chunk.is_full_for(
                1,
                &weeks(0..1),
                limits(1000),
                at + Duration::from_millis(14_999)
            ),
            "open for less than its limit"
        );
        assert!(
            chunk.is_full_for(1, &weeks(0..1), limits(1000), at + Duration::from_secs(15)),
            "or open as long as it may: a slow link's INSERTs end before they outlast the timeout"
        );
        let empty = Chunk::default();
        assert!(
            !empty.is_full_for(5, &weeks(0..200), limits(2), at + Duration::from_secs(60)),
            "a message alone past a limit goes alone, whole"
        );
    }

    #[test]
    fn rows_are_partitioned_by_retention_and_utc_week_starting_monday() {
        let ids = crate::recording::SegmentIds::for_tests(0);
        let row = |seconds: f64| {
            let tap = crate::recording::rrweb::Tap {
                timestamp: seconds,
                message: Default::default(),
                view_class: Default::default(),
                view_id: Default::default(),
            };
            crate::recording::rows::tap_row(&ids, Default::default(), &"".into(), &tap)
        };
        // 2026-11-30T00:00:00Z is a Monday; the next Monday starts the next partition.
        let monday = partition_of(&row(1_795_996_800.0));
        assert_eq!(
            monday,
            partition_of(&row(1_795_996_800.0 + 7.0 * 86_400.0 - 1.0))
        );
        assert_ne!(monday, partition_of(&row(1_795_996_800.0 - 1.0)));
        assert_ne!(monday, partition_of(&row(1_795_996_800.0 + 7.0 * 86_400.0)));
        assert_eq!(
            monday.1 % 7,
            4,
            "days since the epoch of a Monday are 4 mod 7"
        );
    }

    const OLD: ServerFeatures = ServerFeatures {
        version: ServerVersion(18, 16),
        hash_uuid: false,
    };

    #[test]
    fn snubas_schema_where_the_server_supports_it_and_the_same_wire_types_where_it_does_not() {
        assert_eq!(ServerVersion::parse("18.16.1"), Some(ServerVersion(18, 16)));
        let old = create_table_sql("db", "t", OLD);
        assert!(!old.contains("TTL") && old.contains("cityHash64(toString(replay_id))"));
        assert!(!old.contains("LowCardinality") && !old.contains("IPv") && !old.contains("INDEX"));
        assert!(old.contains("`ip_address_v6` Nullable(FixedString(16))"));
        assert!(old.contains("arrayMap(t -> cityHash64(toString(t)), trace_ids)"));
        let new = ServerFeatures {
            version: ServerVersion::parse("25.8.16.10001").unwrap(),
            hash_uuid: true,
        };
        let new = create_table_sql("db", "t", new);
        assert!(
            new.contains("TTL timestamp + toIntervalDay(retention_days)")
                && new.contains("cityHash64(replay_id)")
        );
        assert!(new.contains("`environment` LowCardinality(Nullable(String)),\n"));
        assert!(
            new.contains(
                "INDEX bf_tags_hash_map _tags_hash_map TYPE bloom_filter GRANULARITY 1\n)"
            )
        );
        assert!(new.contains(
            "ENGINE = ReplacingMergeTree()\nPARTITION BY (retention_days, toMonday(timestamp))"
        ));
    }

    #[test]
    fn the_rows_write_a_subsequence_of_the_table_in_order() {
        let mut table = TABLE.iter().map(|c| c.name);
        for name in <ReplayRow as clickhouse::Row>::COLUMN_NAMES {
            assert!(
                table.any(|c| c == *name),
                "{name} is not in the table, or out of order"
            );
        }
        let sql = create_table_sql("db", "t", OLD);
        assert!(sql.starts_with(
            "CREATE TABLE IF NOT EXISTS db.t\n(\n    `replay_id` UUID,\n    `debug_id` UUID,\n"
        ));
        assert!(sql.contains("    `offset` UInt64\n)\nENGINE"));
    }

    #[test]
    fn wire_types_drop_low_cardinality_and_ip_domains() {
        assert_eq!(
            wire_type("LowCardinality(Nullable(String))"),
            "Nullable(String)"
        );
        assert_eq!(wire_type("Array(LowCardinality(String))"), "Array(String)");
        assert_eq!(wire_type("Nullable(IPv4)"), "Nullable(UInt32)");
        assert_eq!(wire_type("Nullable(IPv6)"), "Nullable(FixedString(16))");
        assert_eq!(wire_type("UInt64"), "UInt64");
    }

    #[test]
    fn schema_problems_name_missing_columns_and_differently_encoded_types() {
        let mut found: Vec<(String, String)> = TABLE
            .iter()
            .map(|c| (c.name.to_owned(), c.kind.to_owned()))
            .collect();
        assert_eq!(schema_problems(&found), Ok(()));
        let legacy: Vec<(String, String)> = found
            .iter()
            .map(|(n, k)| (n.clone(), wire_type(k)))
            .collect();
        assert_eq!(
            schema_problems(&legacy),
            Ok(()),
            "an 18.16 table made by migrate"
        );
        found.retain(|(n, _)| n != "offset");
        found.iter_mut().find(|(n, _)| n == "segment_id").unwrap().1 = "UInt32".into();
        assert_eq!(
            schema_problems(&found),
            Err(
                "column segment_id is UInt32, expected Nullable(UInt16); column offset is missing"
                    .into()
            )
        );
    }
}
