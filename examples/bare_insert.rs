//! Baseline for the rows sink's ceiling: COUNT rows — the recorded fixtures' own rows, cycled —
//! inserted into a fresh table (the service's migration) with the service's client, CHUNK rows
//! per INSERT, and nothing else. Prints one JSON line: rows, seconds, rows per second.
//!
//! Usage: bare_insert URL TABLE COUNT CHUNK FILE...

use std::time::{Duration, Instant};

use replay_ingest::recording::{self, KafkaPosition, Limits, ReplayRow};
use replay_ingest::secret::Secret;
use replay_ingest::sink::clickhouse::{self, ClickHouseConfig};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, table, count, chunk, files @ ..] = args.as_slice() else {
        eprintln!("usage: bare_insert URL TABLE COUNT CHUNK FILE...");
        std::process::exit(2);
    };
    let (count, chunk): (usize, usize) =
        (count.parse().expect("COUNT"), chunk.parse().expect("CHUNK"));
    let rows: Vec<ReplayRow> = files
        .iter()
        .filter_map(|f| recording::process(&std::fs::read(f).ok()?, &Limits::default()).ok())
        .flat_map(|p| p.rows(KafkaPosition::default()))
        .collect();
    assert!(!rows.is_empty(), "no rows among the files");
    let config = ClickHouseConfig {
        url: url.clone(),
        database: "default".into(),
        table: table.clone(),
        user: "default".into(),
        password: Secret::default(),
        password_file: None,
        chunk_rows: chunk,
        timeout: Duration::from_secs(600),
    };
    clickhouse::migrate(&config).await.expect("migrate");
    let client = clickhouse::client(&config);
    let started = Instant::now();
    let mut written = 0;
    while written < count {
        let mut insert = client.insert::<ReplayRow>(table).await.expect("insert");
        for i in written..(written + chunk).min(count) {
            insert.write(&rows[i % rows.len()]).await.expect("row");
        }
        insert.end().await.expect("end of insert");
        written = (written + chunk).min(count);
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"rows\":{count},\"chunk\":{chunk},\"seconds\":{seconds:.3},\"per_second\":{:.0}}}",
        count as f64 / seconds
    );
}
