//! Creating the table (`replay-ingest migrate`, `--migrate-on-start`) and checking the one found.

use super::schema::{ServerFeatures, ServerVersion, create_table_sql, schema_problems};
use super::{ClickHouseConfig, client, setup_error};
use crate::sink::{Retry, SinkError};

/// Creates the database and table if missing, for what the server supports, within
/// `config.timeout` as a whole: the crate bounds no query, and a server (or a proxy before it) that
/// takes the connection and never answers held `replay-ingest migrate`, and the rollout waiting
/// on it, for good.
pub async fn migrate(
    config: &ClickHouseConfig,
) -> Result<ServerFeatures, clickhouse::error::Error> {
    tokio::time::timeout(config.timeout, create(config))
        .await
        .unwrap_or(Err(clickhouse::error::Error::TimedOut))
}

async fn create(config: &ClickHouseConfig) -> Result<ServerFeatures, clickhouse::error::Error> {
    // The database may not exist yet: connect to `default` for the probes and the DDL.
    let client = client(config).with_database("default");
    let version: String = client.query("SELECT version()").fetch_one().await?;
    let version = ServerVersion::parse(&version).unwrap_or(ServerVersion(0, 0));
    // A server that cannot hash a UUID refuses the type (43); any other error (a connection
    // reset, a timeout) is not an answer, and taken for one it made the table for good with
    // `cityHash64(toString(replay_id))`, which is not snuba's schema.
    let hash_uuid = match client
        .query("SELECT cityHash64(toUUID('00000000-0000-0000-0000-000000000000'))")
        .execute()
        .await
    {
        Ok(()) => true,
        Err(error) if super::error_code(&error.to_string()) == Some(43) => false,
        Err(error) => return Err(error),
    };
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
/// A server that cannot be reached is a transient error; a missing or mismatched table is fatal,
/// and so are settings of the user that acknowledge INSERTs before their rows are stored.
pub async fn check_table(config: &ClickHouseConfig) -> Result<(), SinkError> {
    check_columns(config).await?;
    // Servers before 21.11 have neither setting: no rows.
    let settings: Vec<(String, String)> = client(config)
        .query("SELECT name, value FROM system.settings WHERE name IN ('async_insert', 'wait_for_async_insert')")
        .fetch_all()
        .await
        .map_err(|e| setup_error(&e, config))?;
    if acknowledged_before_stored(&settings) {
        let message = format!(
            "user {:?} has async_insert=1 and wait_for_async_insert=0: ClickHouse would answer each INSERT before storing its rows, and offsets would be committed past rows it may still lose; set wait_for_async_insert=1 (or async_insert=0) in the user's profile",
            config.user
        );
        return Err(SinkError::new("clickhouse", Retry::Fatal, message));
    }
    Ok(())
}

/// The table's part of [`check_table`]: it exists, and every column the rows carry has their
/// type. All `migrate` checks after creating it: it runs as a user of its own (DDL), whose
/// profile is not the service's.
pub async fn check_columns(config: &ClickHouseConfig) -> Result<(), SinkError> {
    let found: Vec<(String, String)> = client(config)
        .query("SELECT name, type FROM system.columns WHERE database = ? AND table = ?")
        .bind(&config.database)
        .bind(&config.table)
        .fetch_all()
        .await
        .map_err(|e| match &e {
            // The client names the database in every request: one missing is refused before the
            // query runs, as UNKNOWN_DATABASE, which said nothing of how to make it.
            clickhouse::error::Error::BadResponse(m) if super::error_code(m) == Some(81) => {
                let message = format!(
                    "database {} does not exist: create it and the table with `replay-ingest migrate` or --migrate-on-start",
                    config.database
                );
                SinkError::new("clickhouse", Retry::Fatal, message)
            }
            _ => setup_error(&e, config),
        })?;
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

/// Whether the user's `settings` (`async_insert` and `wait_for_async_insert`, as
/// `system.settings` gives them) make the server answer an INSERT once its rows are queued for a
/// later asynchronous insert, not once they are stored.
fn acknowledged_before_stored(settings: &[(String, String)]) -> bool {
    let on = |name: &str| {
        settings
            .iter()
            .any(|(n, value)| n == name && matches!(value.as_str(), "1" | "true"))
    };
    on("async_insert") && !on("wait_for_async_insert")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_that_takes_the_connection_and_never_answers_times_the_migration_out() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = ClickHouseConfig {
            url: format!("http://{}", silent.local_addr().unwrap()),
            database: "d".into(),
            table: "t".into(),
            user: "default".into(),
            password: Default::default(),
            password_file: None,
            chunk_rows: 1,
            timeout: std::time::Duration::from_millis(300),
        };
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                connections.push(connection);
            }
        });
        assert!(matches!(
            migrate(&config).await,
            Err(clickhouse::error::Error::TimedOut)
        ));
        held.abort();
    }

    #[test]
    fn asynchronous_inserts_without_waiting_are_taken_for_acknowledged_before_stored() {
        let settings = |async_insert: &str, wait: &str| {
            acknowledged_before_stored(&[
                ("async_insert".into(), async_insert.into()),
                ("wait_for_async_insert".into(), wait.into()),
            ])
        };
        assert!(settings("1", "0"));
        assert!(
            !settings("1", "1"),
            "asynchronous, but answered once stored"
        );
        assert!(!settings("0", "0"), "synchronous");
        assert!(settings("true", "false"), "as a server may spell them");
        assert!(
            !acknowledged_before_stored(&[]),
            "a server without them (18.16)"
        );
    }
}
