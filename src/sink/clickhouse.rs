//! Rows to ClickHouse: one `replays` table (ReplacingMergeTree) holding click, tap and segment
//! rows, inserted with RowBinary over HTTP, one insert per batch — cut at `chunk_rows` rows and
//! before an insert would touch more than `MAX_PARTITIONS_PER_INSERT` partitions (the server
//! refuses a block spread over more than `max_partitions_per_insert_block`, 100 by default; one
//! segment with clicks over many weeks would otherwise be rejected forever).
//! Rows with the same key collapse; `segment_id` is the version, so a slow/dead/rage click
//! reported in a later segment replaces the plain click of the same node and second.
//!
//! Settings make errors visible: `wait_end_of_query=1` (an error after the first bytes of a 200
//! response would otherwise go unnoticed). The table is created by `migrate` for the server it
//! finds: TTL only where the server supports it (19.6+), so the same code runs against the local
//! 18.16 server and a current production one.

use std::collections::HashSet;

use tokio::runtime::Handle;

use super::{Entries, Entry, Outcome, Retry, Sink, SinkError, Written};
use crate::recording::ReplayRow;

/// ClickHouse error codes about the data sent: the rows are refused (unless the table no longer
/// matches the rows, which `ClickHouseSink::write` checks before trusting these). 6 CANNOT_PARSE_TEXT, 26
/// CANNOT_PARSE_QUOTED_STRING, 27 CANNOT_PARSE_INPUT_ASSERTION_FAILED, 32
/// ATTEMPT_TO_READ_AFTER_EOF, 33 CANNOT_READ_ALL_DATA, 38 CANNOT_PARSE_DATE, 41
/// CANNOT_PARSE_DATETIME, 53 TYPE_MISMATCH, 69 ARGUMENT_OUT_OF_BOUND, 70 CANNOT_CONVERT_TYPE, 72
/// CANNOT_PARSE_NUMBER, 117 INCORRECT_DATA, 131 TOO_LARGE_STRING_SIZE, 246 CORRUPTED_DATA.
const REJECTED_CODES: [u32; 14] = [6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 131, 246];

/// ClickHouse error codes no data can fix: the configuration is wrong. 16
/// NO_SUCH_COLUMN_IN_TABLE, 36 BAD_ARGUMENTS, 43 ILLEGAL_TYPE_OF_ARGUMENT, 60 UNKNOWN_TABLE,
/// 62 SYNTAX_ERROR, 81 UNKNOWN_DATABASE, 192 UNKNOWN_USER, 516 AUTHENTICATION_FAILED.
const FATAL_CODES: [u32; 8] = [16, 36, 43, 60, 62, 81, 192, 516];

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

/// The rows of the INSERT being written: how many, and which partitions they touch.
#[derive(Default)]
struct Chunk {
    rows: usize,
    partitions: HashSet<(u16, u32)>,
}

impl Chunk {
    /// Whether a row in `partition` must start a new INSERT.
    fn is_full_for(&self, partition: (u16, u32), max_rows: usize) -> bool {
        self.rows >= max_rows
            || (self.partitions.len() >= MAX_PARTITIONS_PER_INSERT && !self.partitions.contains(&partition))
    }

    fn add(&mut self, partition: (u16, u32)) {
        self.rows += 1;
        self.partitions.insert(partition);
    }
}

/// Retry classification: deterministic data or schema errors are fatal; network trouble,
/// timeouts, overload and other server errors are retried.
pub fn classify(error: &clickhouse::error::Error) -> Retry {
    use clickhouse::error::Error;
    match error {
        // Code 252 is also "too many parts" (merges behind: transient); this one is the data.
        Error::BadResponse(message) if message.contains("Too many partitions for single INSERT block") => {
            Retry::Rejected
        }
        Error::BadResponse(message) => match error_code(message) {
            Some(code) if REJECTED_CODES.contains(&code) => Retry::Rejected,
            Some(code) if FATAL_CODES.contains(&code) => Retry::Fatal,
            _ => Retry::Retryable,
        },
        Error::Network(_) | Error::TimedOut | Error::Compression(_) | Error::Decompression(_) => Retry::Retryable,
        Error::SchemaMismatch(_) | Error::InvalidParams(_) | Error::Unsupported(_) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// The `Code: N` ClickHouse puts in its error messages.
fn error_code(message: &str) -> Option<u32> {
    let rest = &message[message.find("Code: ")? + 6..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A server version, e.g. `18.16.1` → (18, 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion(pub u32, pub u32);

impl ServerVersion {
    pub fn parse(version: &str) -> Option<Self> {
        let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
        Some(ServerVersion(parts.next()??, parts.next()??))
    }
}

/// What the server can do, probed at migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFeatures {
    pub version: ServerVersion,
    /// `cityHash64` accepts a `UUID` (18.16 does not: it hashes `toString(replay_id)` there).
    pub hash_uuid: bool,
}

impl ServerFeatures {
    /// Table TTL arrived in 19.6.
    pub fn supports_ttl(self) -> bool {
        self.version >= ServerVersion(19, 6)
    }
}

/// The replays table's columns, in `ReplayRow` order: name and type as `system.columns` shows
/// them. The DDL and the startup check both read this list.
pub const COLUMNS: [(&str, &str); 52] = [
    ("kind", "Enum8('segment' = 0, 'click' = 1, 'tap' = 2)"),
    ("project_id", "UInt64"),
    ("replay_id", "UUID"),
    ("event_hash", "UUID"),
    ("timestamp", "DateTime"),
    ("retention_days", "UInt16"),
    ("segment_id", "UInt32"),
    ("replay_start_timestamp", "Nullable(DateTime)"),
    ("replay_type", "String"),
    ("platform", "String"),
    ("environment", "String"),
    ("release", "String"),
    ("dist", "String"),
    ("urls", "Array(String)"),
    ("error_ids", "Array(UUID)"),
    ("trace_ids", "Array(UUID)"),
    ("user_id", "String"),
    ("user_name", "String"),
    ("user_email", "String"),
    ("ip_address", "String"),
    ("os_name", "String"),
    ("os_version", "String"),
    ("browser_name", "String"),
    ("browser_version", "String"),
    ("device_name", "String"),
    ("device_brand", "String"),
    ("device_family", "String"),
    ("device_model", "String"),
    ("sdk_name", "String"),
    ("sdk_version", "String"),
    ("error_sample_rate", "Nullable(Float64)"),
    ("session_sample_rate", "Nullable(Float64)"),
    ("tags_key", "Array(String)"),
    ("tags_value", "Array(String)"),
    ("click_node_id", "UInt64"),
    ("click_tag", "String"),
    ("click_id", "String"),
    ("click_class", "Array(String)"),
    ("click_text", "String"),
    ("click_role", "String"),
    ("click_alt", "String"),
    ("click_testid", "String"),
    ("click_aria_label", "String"),
    ("click_title", "String"),
    ("click_component_name", "String"),
    ("click_selector", "String"),
    ("click_url", "String"),
    ("click_is_dead", "UInt8"),
    ("click_is_rage", "UInt8"),
    ("tap_message", "String"),
    ("tap_view_class", "String"),
    ("tap_view_id", "String"),
];

/// `CREATE TABLE` for the replays table on a server with `features`. Columns are in `ReplayRow`
/// order.
pub fn create_table_sql(database: &str, table: &str, features: ServerFeatures) -> String {
    let ttl = if features.supports_ttl() { "\nTTL timestamp + toIntervalDay(retention_days)" } else { "" };
    let replay_hash = if features.hash_uuid { "cityHash64(replay_id)" } else { "cityHash64(toString(replay_id))" };
    let columns = COLUMNS.map(|(name, kind)| format!("    {name} {kind}")).join(",\n");
    format!(
        "CREATE TABLE IF NOT EXISTS {database}.{table} (
{columns}
)
ENGINE = ReplacingMergeTree(segment_id)
PARTITION BY (retention_days, toMonday(timestamp))
ORDER BY (project_id, toStartOfDay(timestamp), {replay_hash}, event_hash){ttl}
SETTINGS index_granularity = 8192"
    )
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub table: String,
    pub user: String,
    pub password: String,
    /// Rows per INSERT; a batch with more rows is split.
    pub chunk_rows: usize,
    /// One write attempt (the batch's INSERTs) past this is abandoned and retried: a half-open
    /// connection must not wedge the flush.
    pub timeout: std::time::Duration,
}

pub fn client(config: &ClickHouseConfig) -> clickhouse::Client {
    clickhouse::Client::default()
        .with_url(&config.url)
        .with_user(&config.user)
        .with_password(&config.password)
        .with_database(&config.database)
        .with_validation(false)
        .with_setting("wait_end_of_query", "1")
}

/// Creates the database and table if missing, for what the server supports.
pub async fn migrate(config: &ClickHouseConfig) -> Result<ServerFeatures, clickhouse::error::Error> {
    // The database may not exist yet: connect to `default` for the probes and the DDL.
    let client = client(config).with_database("default");
    let version: String = client.query("SELECT version()").fetch_one().await?;
    let version = ServerVersion::parse(&version).unwrap_or(ServerVersion(0, 0));
    let hash_uuid =
        client.query("SELECT cityHash64(toUUID('00000000-0000-0000-0000-000000000000'))").execute().await.is_ok();
    let features = ServerFeatures { version, hash_uuid };
    client.query(&format!("CREATE DATABASE IF NOT EXISTS {}", config.database)).execute().await?;
    client.query(&create_table_sql(&config.database, &config.table, features)).execute().await?;
    Ok(features)
}

/// The configuration check made at startup, before joining the group, and again whenever the
/// server answers a write with an error: the table exists and every column the rows carry has
/// the type the rows are encoded for. RowBinary carries no types, so a column of another type
/// misreads the stream: the server then answers with errors that look like bad data or like
/// overload (a misread length asks for terabytes) and would be dead-lettered or retried forever.
/// A server that cannot be reached is a transient error; a missing or mismatched table is fatal.
pub async fn check_table(config: &ClickHouseConfig) -> Result<(), SinkError> {
    let found: Vec<(String, String)> = client(config)
        .query("SELECT name, type FROM system.columns WHERE database = ? AND table = ?")
        .bind(&config.database)
        .bind(&config.table)
        .fetch_all()
        .await
        .map_err(|e| SinkError::new("clickhouse", classify(&e), format_args!("at {}: {e}", config.url)))?;
    let table = format!("{}.{}", config.database, config.table);
    if found.is_empty() {
        let message =
            format!("table {table} does not exist: create it with `replay-ingest migrate` or --migrate-on-start");
        return Err(SinkError::new("clickhouse", Retry::Fatal, message));
    }
    schema_problems(&found).map_err(|problems| {
        SinkError::new("clickhouse", Retry::Fatal, format_args!("table {table} does not match the rows: {problems}"))
    })
}

/// Each expected column missing from `found` (name, type) or of another type, one phrase each.
fn schema_problems(found: &[(String, String)]) -> Result<(), String> {
    let problems: Vec<String> = COLUMNS
        .iter()
        .filter_map(|&(name, expected)| match found.iter().find(|(n, _)| n == name) {
            None => Some(format!("column {name} is missing")),
            Some((_, actual)) if actual != expected => Some(format!("column {name} is {actual}, expected {expected}")),
            Some(_) => None,
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

pub struct ClickHouseSink {
    client: clickhouse::Client,
    config: ClickHouseConfig,
    chunk_rows: usize,
    timeout: std::time::Duration,
    runtime: Handle,
}

impl ClickHouseSink {
    /// Must be created inside the async runtime the writes will use.
    pub fn new(config: &ClickHouseConfig) -> Self {
        ClickHouseSink {
            client: client(config),
            config: config.clone(),
            chunk_rows: config.chunk_rows.max(1),
            timeout: config.timeout,
            runtime: Handle::current(),
        }
    }

    /// Inserts the batch's rows, `chunk_rows` per INSERT. Rows are built one segment at a time
    /// as they are written, so the batch never holds them all. Returns the number of rows.
    async fn insert(&self, batch: &[Entry]) -> Result<u64, clickhouse::error::Error> {
        let mut written = 0u64;
        let mut insert: Option<clickhouse::insert::Insert<ReplayRow>> = None;
        let mut chunk = Chunk::default();
        for processed in batch.valid() {
            for row in processed.rows() {
                let partition = partition_of(&row);
                if chunk.is_full_for(partition, self.chunk_rows) {
                    if let Some(full) = insert.take() {
                        full.end().await?;
                    }
                    chunk = Chunk::default();
                }
                if insert.is_none() {
                    insert = Some(self.client.insert::<ReplayRow>(&self.config.table).await?);
                }
                if let Some(open) = insert.as_mut() {
                    open.write(&row).await?;
                }
                chunk.add(partition);
                written += 1;
            }
        }
        if let Some(last) = insert {
            last.end().await?;
        }
        Ok(written)
    }
}

impl Sink for ClickHouseSink {
    fn name(&self) -> &'static str {
        "clickhouse"
    }

    /// Only segments with rows: a rejection is pinned on the one whose rows were refused.
    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(&entry.outcome, Outcome::Valid(p) if !p.rows().is_empty())
    }

    fn write(&self, batch: &[Entry]) -> Result<Written, SinkError> {
        let rows = self
            .runtime
            // The timer must be made inside the runtime: this thread is not one of its workers.
            .block_on(async {
                let error = match tokio::time::timeout(self.timeout, self.insert(batch)).await {
                    Err(_) => {
                        let message = format!("timed out after {:?}", self.timeout);
                        return Err(SinkError::new(self.name(), Retry::Retryable, message));
                    }
                    Ok(Ok(rows)) => return Ok(rows),
                    Ok(Err(error)) => error,
                };
                // The server refused the data: a table altered since startup explains it for
                // every batch, and no retry or dead letter would help.
                if let clickhouse::error::Error::BadResponse(_) = error {
                    let check = tokio::time::timeout(self.timeout, check_table(&self.config)).await;
                    if let Ok(Err(mismatch)) = check
                        && mismatch.retry == Retry::Fatal
                    {
                        return Err(mismatch);
                    }
                }
                Err(SinkError::new(self.name(), classify(&error), error))
            })?;
        Ok(Written { items: rows, bytes: 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse::error::Error;

    #[test]
    fn data_errors_are_rejections_schema_errors_fatal_and_the_rest_retried() {
        let cases = [
            ("Code: 53, e.displayText() = DB::Exception: Type mismatch", Retry::Rejected),
            ("Code: 27. DB::Exception: Cannot parse input", Retry::Rejected),
            ("Code: 32, e.displayText() = DB::Exception: Attempt to read after eof", Retry::Rejected),
            ("Code: 117, e.displayText() = DB::Exception: Incorrect data", Retry::Rejected),
            ("Code: 60. DB::Exception: Table default.x doesn't exist", Retry::Fatal),
            ("Code: 241. DB::Exception: Memory limit exceeded", Retry::Retryable),
            ("Code: 252. DB::Exception: Too many parts", Retry::Retryable),
            ("Code: 252. DB::Exception: Too many partitions for single INSERT block (more than 100)", Retry::Rejected),
            ("503 Service Unavailable", Retry::Retryable),
        ];
        for (message, expected) in cases {
            assert_eq!(classify(&Error::BadResponse(message.into())), expected, "{message}");
        }
        assert_eq!(classify(&Error::TimedOut), Retry::Retryable);
        assert_eq!(classify(&Error::SchemaMismatch("x".into())), Retry::Fatal);
    }

    #[test]
    fn an_insert_is_cut_before_it_touches_too_many_partitions_or_rows() {
        let mut chunk = Chunk::default();
        for week in 0..MAX_PARTITIONS_PER_INSERT as u32 {
            assert!(!chunk.is_full_for((30, week * 7), 1000));
            chunk.add((30, week * 7));
        }
        assert!(!chunk.is_full_for((30, 0), 1000), "a partition it already touches");
        assert!(chunk.is_full_for((90, 0), 1000), "a new partition past the limit");
        assert!(chunk.is_full_for((30, 0), chunk.rows), "the row limit");
    }

    #[test]
    fn rows_are_partitioned_by_retention_and_utc_week_starting_monday() {
        let ids = crate::recording::SegmentIds::for_tests(0);
        let row = |seconds: f64| {
            let tap = crate::recording::rrweb::Tap {
                timestamp: seconds,
                message: String::new(),
                view_class: String::new(),
                view_id: String::new(),
            };
            crate::recording::rows::tap_row(&ids, &tap)
        };
        // 2026-11-30T00:00:00Z is a Monday; the next Monday starts the next partition.
        let monday = partition_of(&row(1_795_996_800.0));
        assert_eq!(monday, partition_of(&row(1_795_996_800.0 + 7.0 * 86_400.0 - 1.0)));
        assert_ne!(monday, partition_of(&row(1_795_996_800.0 - 1.0)));
        assert_ne!(monday, partition_of(&row(1_795_996_800.0 + 7.0 * 86_400.0)));
        assert_eq!(monday.1 % 7, 4, "days since the epoch of a Monday are 4 mod 7");
    }

    const OLD: ServerFeatures = ServerFeatures { version: ServerVersion(18, 16), hash_uuid: false };

    #[test]
    fn ttl_and_uuid_hashing_are_used_only_where_the_server_supports_them() {
        assert_eq!(ServerVersion::parse("18.16.1"), Some(ServerVersion(18, 16)));
        let old = create_table_sql("db", "t", OLD);
        assert!(!old.contains("TTL") && old.contains("cityHash64(toString(replay_id))"));
        let new = ServerFeatures { version: ServerVersion::parse("24.8.4.13").unwrap(), hash_uuid: true };
        let new = create_table_sql("db", "t", new);
        assert!(new.contains("TTL timestamp") && new.contains("cityHash64(replay_id)"));
    }

    #[test]
    fn the_table_lists_every_row_field_in_order() {
        assert_eq!(COLUMNS.map(|(name, _)| name), <ReplayRow as clickhouse::Row>::COLUMN_NAMES);
        let sql = create_table_sql("db", "t", OLD);
        assert!(sql.contains("(\n    kind Enum8('segment' = 0, 'click' = 1, 'tap' = 2),\n    project_id UInt64,\n"));
        assert!(sql.contains("    tap_view_id String\n)\nENGINE"));
    }
}
