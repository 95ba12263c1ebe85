//! The production schema on a current ClickHouse: chDB (PyPI `chdb`, ClickHouse 26.9 in-process,
//! `REPLAY_INGEST_CHDB_PYTHON` names its interpreter; `scripts/test.sh` installs it) runs the DDL
//! `migrate` issues on a current server, then inserts the exact bytes the ClickHouse sink sends —
//! captured from its HTTP request — and every row reads back as the sink built it, the
//! materialized columns computed.

use std::sync::{Arc, Mutex};

use crate::support::*;
use replay_ingest::recording::ReplayRow;
use replay_ingest::sink::clickhouse::{
    ClickHouseConfig, ClickHouseSink, ServerFeatures, ServerVersion, TABLE, create_table_sql,
};
use serde_json::Value;

/// Runs chDB (arguments: the DDL, the structure and column list of the rows, the RowBinary
/// rows): creates the table, inserts the rows, prints the
/// table as JSONEachRow (timestamps as Unix seconds), then one line of materialized-column checks.
const CHDB_SCRIPT: &str = r#"
import sys
from chdb import session
ddl, structure, columns = (open(p).read() for p in sys.argv[1:4])
rows = sys.argv[4]
s = session.Session()
s.query("CREATE DATABASE db")
s.query(ddl)
# The fixtures are dated: the retention TTL would drop them at insert once they are old.
s.query("ALTER TABLE db.replays_local REMOVE TTL")
# Every row as inserted (duplicates would otherwise collapse within the block).
s.query(f"INSERT INTO db.replays_local ({columns}) SELECT * FROM file('{rows}', 'RowBinary', '{structure}') SETTINGS optimize_on_insert = 0")
print(s.query(f"SELECT {columns} FROM db.replays_local SETTINGS date_time_output_format='unix_timestamp'", "JSONEachRow"))
print(s.query("SELECT countIf(count_urls != length(urls)) + countIf(count_errors != length(error_ids)) + countIf(length(_trace_ids_hashed) != length(trace_ids)) + countIf(length(_tags_hash_map) != length(`tags.key`)) AS wrong FROM db.replays_local", "JSONEachRow"))
"#;

/// The requests the sink sends (query string and body), captured by a stand-in server that
/// answers 200.
type Captured = Arc<Mutex<Vec<(String, bytes::Bytes)>>>;

async fn capture_inserts() -> (String, Captured) {
    let bodies = Captured::default();
    let app = axum::Router::new().fallback({
        let bodies = bodies.clone();
        move |uri: axum::http::Uri, body: bytes::Bytes| async move {
            let query = uri.query().unwrap_or_default().to_owned();
            bodies.lock().unwrap().push((query, body));
            ""
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, bodies)
}

/// Every number as a float, so `-1` from ClickHouse and `-1.0` from serde compare equal.
fn normalized(value: Value) -> Value {
    match value {
        Value::Number(n) => serde_json::json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(normalized).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalized(v))).collect())
        }
        other => other,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs chDB: scripts/test.sh installs it and runs every test"]
async fn snubas_ddl_runs_on_clickhouse_26_and_the_sinks_bytes_insert_and_read_back() {
    let python = std::env::var("REPLAY_INGEST_CHDB_PYTHON")
        .expect("REPLAY_INGEST_CHDB_PYTHON: a python with chdb (scripts/test.sh installs one)");
    let (url, bodies) = capture_inserts().await;
    let config = ClickHouseConfig {
        url,
        table: "replays_local".into(),
        chunk_rows: 100_000,
        ..clickhouse_config("x")
    };
    let sink = ClickHouseSink::new(&config);
    let batch = fixture_batch();
    let written = crate::support::write_once(&sink, &batch).await.unwrap();
    let expected = rows_of(&batch);
    assert_eq!(written.items as usize, expected.len());
    // Every INSERT waits for the server to finish it and, into a Distributed table, for the
    // shards to have it.
    for (query, _) in bodies.lock().unwrap().iter() {
        let settings: Vec<&str> = query.split('&').collect();
        for setting in ["wait_end_of_query=1", "insert_distributed_sync=1"] {
            assert!(settings.contains(&setting), "{setting} in {query}");
        }
    }
    let body: Vec<u8> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, b)| clickhouse_decompress(b))
        .collect();

    let columns = <ReplayRow as clickhouse::Row>::COLUMN_NAMES;
    let structure: Vec<String> = columns
        .iter()
        .map(|name| {
            format!(
                "`{name}` {}",
                TABLE.iter().find(|c| c.name == *name).unwrap().kind
            )
        })
        .collect();
    let current = ServerFeatures {
        version: ServerVersion(26, 9),
        hash_uuid: true,
    };
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "ddl.sql",
            create_table_sql("db", "replays_local", current).into_bytes(),
        ),
        ("rows.bin", body),
        ("structure.txt", structure.join(", ").into_bytes()),
        (
            "columns.txt",
            columns
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
                .into_bytes(),
        ),
        ("check.py", CHDB_SCRIPT.as_bytes().to_vec()),
    ];
    for (name, contents) in &files {
        std::fs::write(dir.path().join(name), contents).unwrap();
    }
    let output = std::process::Command::new(python)
        .arg(dir.path().join("check.py"))
        .args(["ddl.sql", "structure.txt", "columns.txt", "rows.bin"].map(|f| dir.path().join(f)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "chdb: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );

    let mut lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    let checks: Value = serde_json::from_str(lines.pop().unwrap()).unwrap();
    assert_eq!(
        checks["wrong"], 0,
        "materialized counts and hashes computed for every row"
    );
    let sorted = |rows: Vec<Value>| {
        let mut rows: Vec<Value> = rows.into_iter().map(normalized).collect();
        rows.sort_by_key(|r| r.to_string());
        rows
    };
    // DateTime columns come back as quoted Unix seconds.
    let unquote_datetimes = |mut row: Value| {
        for column in ["timestamp", "replay_start_timestamp"] {
            if let Some(seconds) = row[column].as_str().map(|s| s.parse::<u64>().unwrap()) {
                row[column] = seconds.into();
            }
        }
        row
    };
    let read: Vec<Value> = lines
        .iter()
        .map(|l| unquote_datetimes(serde_json::from_str(l).unwrap()))
        .collect();
    let built: Vec<Value> = expected
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect();
    assert!(
        built.iter().any(|r| r["ip_address_v6"] == "2001:db8::1")
            && built.iter().any(|r| r["click_is_rage"] == 1)
    );
    let (read, built) = (sorted(read), sorted(built));
    assert_eq!(read.len(), built.len(), "row count");
    for (got, want) in read.iter().zip(&built) {
        let differing: Vec<String> = columns
            .iter()
            .filter(|c| got[**c] != want[**c])
            .map(|c| format!("{c}: read {} built {}", got[*c], want[*c]))
            .collect();
        assert!(
            differing.is_empty(),
            "a row reads back differently: {differing:?}"
        );
    }
}
