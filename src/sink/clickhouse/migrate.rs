//! Creating the table (`replay-ingest migrate`, `--migrate-on-start`) and checking the one found.

use super::schema::{ServerFeatures, ServerVersion, create_table_sql, schema_problems};
use super::{ClickHouseConfig, client, setup_error};
use crate::sink::{Retry, SinkError};

/// Creates the database and table if missing, for what the server supports.
pub async fn migrate(
    config: &ClickHouseConfig,
) -> Result<ServerFeatures, clickhouse::error::Error> {
    // The database may not exist yet: connect to `default` for the probes and the DDL.
    let client = client(config).with_database("default");
    let version: String = client.query("SELECT version()").fetch_one().await?;
    let version = ServerVersion::parse(&version).unwrap_or(ServerVersion(0, 0));
    let hash_uuid = client
        .query("SELECT cityHash64(toUUID('00000000-0000-0000-0000-000000000000'))")
        .execute()
        .await
        .is_ok();
    let features = ServerFeatures { version, hash_uuid };
    client
        .query(&format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            config.database
        ))
        .execute()
        .await?;
    client
        .query(&create_table_sql(&config.database, &config.table, features))
        .execute()
        .await?;
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
        .map_err(|e| setup_error(&e, config))?;
    let table = format!("{}.{}", config.database, config.table);
    if found.is_empty() {
        let message = format!(
            "table {table} does not exist: create it with `replay-ingest migrate` or --migrate-on-start"
        );
        return Err(SinkError::new("clickhouse", Retry::Fatal, message));
    }
    schema_problems(&found).map_err(|problems| {
        SinkError::new(
            "clickhouse",
            Retry::Fatal,
            format_args!("table {table} does not match the rows: {problems}"),
        )
    })
}
