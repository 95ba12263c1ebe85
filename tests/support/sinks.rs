//! The real sinks beside the broker: the GCS emulator and ClickHouse, and the names (topics,
//! bucket, table) each test gets of its own.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use google_cloud_storage::client::Storage;

use super::*;

pub fn gcs_endpoint() -> String {
    std::env::var("REPLAY_INGEST_TEST_GCS_ENDPOINT")
        .expect("REPLAY_INGEST_TEST_GCS_ENDPOINT (scripts/stack.sh up)")
}

pub fn clickhouse_url() -> String {
    std::env::var("REPLAY_INGEST_TEST_CLICKHOUSE_URL")
        .expect("REPLAY_INGEST_TEST_CLICKHOUSE_URL (scripts/stack.sh up)")
}

/// One request to the emulator's JSON API; its whole answer (HTTP/1.0: not chunked).
fn emulator_request(method: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let host = gcs_endpoint().trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&host).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.contains(" 200 "), "{method} {path}: {response}");
    response
}

pub fn create_bucket(name: &str) {
    emulator_request(
        "POST",
        "/storage/v1/b?project=test",
        &format!("{{\"name\":\"{name}\"}}"),
    );
}

/// A bucket with Object Versioning: a delete or a rewrite keeps the object's noncurrent copy.
pub fn create_versioned_bucket(name: &str) {
    emulator_request(
        "POST",
        "/storage/v1/b?project=test",
        &format!("{{\"name\":\"{name}\",\"versioning\":{{\"enabled\":true}}}}"),
    );
}

/// Deletes the live version of `key` in `bucket` (a versioned bucket keeps a noncurrent copy).
pub fn delete_live_object(bucket: &str, key: &str) {
    let key = key.replace('/', "%2F");
    emulator_request("DELETE", &format!("/storage/v1/b/{bucket}/o/{key}"), "");
}

/// The names of the objects in `bucket`.
pub fn object_names(bucket: &str) -> std::collections::BTreeSet<String> {
    listed_names(&format!("/storage/v1/b/{bucket}/o")).collect()
}

/// The name of every version of every object in `bucket`, noncurrent ones included, once per
/// version.
pub fn object_versions(bucket: &str) -> Vec<String> {
    listed_names(&format!("/storage/v1/b/{bucket}/o?versions=true")).collect()
}

/// `value` as it may stand in a URL's query: bytes other than letters, digits, `-._~` and `/`
/// percent-encoded.
fn query_escaped(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every name the listing at `path` gives, page after page (a page is at most 1 000: a bucket
/// past it was checked in part).
fn listed_names(path: &str) -> impl Iterator<Item = String> {
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let separator = if path.contains('?') { '&' } else { '?' };
        let page = match &token {
            Some(token) => format!("{path}{separator}pageToken={}", query_escaped(token)),
            None => path.to_owned(),
        };
        let response = emulator_request("GET", &page, "");
        let (_, body) = response.split_once("\r\n\r\n").unwrap();
        let listed: serde_json::Value = serde_json::from_str(body).unwrap();
        let items = listed["items"].as_array().cloned().unwrap_or_default();
        names.extend(
            items
                .into_iter()
                .map(|item| item["name"].as_str().unwrap().to_owned()),
        );
        match listed["nextPageToken"].as_str() {
            Some(next) if !next.is_empty() => token = Some(next.to_owned()),
            _ => return names.into_iter(),
        }
    }
}

pub async fn read_object(bucket: &str, key: &str) -> Vec<u8> {
    try_read_object(&gcs_client().await, bucket, key)
        .await
        .unwrap()
}

/// A GCS client for the emulator.
pub async fn gcs_client() -> Storage {
    Storage::builder()
        .with_endpoint(gcs_endpoint())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap()
}

/// The service's GCS sink (its store) on the emulator's `bucket`, `concurrency` uploads at a time.
pub async fn gcs_store(bucket: &str, concurrency: usize) -> replay_ingest::sink::gcs::GcsSink {
    replay_ingest::sink::gcs::GcsSink::new(&replay_ingest::sink::gcs::GcsConfig {
        bucket: bucket.to_owned(),
        endpoint: Some(gcs_endpoint()),
        anonymous: true,
        concurrency,
        timeout: std::time::Duration::from_secs(30),
    })
    .await
    .unwrap()
}

/// Every sent (valid) message's blob is in `bucket`, byte for byte.
pub async fn every_blob_in_gcs(bucket: &str, sent: impl IntoIterator<Item = &Sent>) {
    let gcs = gcs_client().await;
    for sent in sent {
        let Expected::Blob {
            key,
            digest: expected,
        } = &sent.expected
        else {
            unreachable!("valid fixtures only")
        };
        let stored = try_read_object(&gcs, bucket, key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(digest(&stored), *expected, "{key} byte for byte");
    }
}

/// An object's bytes, or why they could not be read (e.g. it does not exist).
pub async fn try_read_object(client: &Storage, bucket: &str, key: &str) -> Result<Vec<u8>, String> {
    let mut response = client
        .read_object(format!("projects/_/buckets/{bucket}"), key)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let mut contents = Vec::new();
    while let Some(chunk) = response
        .next()
        .await
        .transpose()
        .map_err(|e| e.to_string())?
    {
        contents.extend_from_slice(&chunk);
    }
    Ok(contents)
}

/// Topics, group, bucket and table of one end-to-end run, all fresh.
pub struct Names {
    pub topic: String,
    pub dlq: String,
    pub group: String,
    pub bucket: String,
    pub table: String,
    pub outcomes: String,
    pub analytics: String,
    pub issues: String,
}

impl Names {
    pub async fn create() -> Names {
        Self::with_partitions(2).await
    }

    /// Fresh names, the consumed topic with `partitions` partitions.
    pub async fn with_partitions(partitions: i32) -> Names {
        let names = Names {
            topic: unique("rec"),
            dlq: unique("dlq"),
            group: unique("group"),
            bucket: unique("blobs"),
            table: unique("replays").replace('-', "_"),
            outcomes: unique("outcomes"),
            analytics: unique("analytics"),
            issues: unique("issues"),
        };
        create_topic(&names.topic, partitions).await;
        for topic in [&names.dlq, &names.outcomes, &names.analytics, &names.issues] {
            create_topic(topic, 1).await;
        }
        create_bucket(&names.bucket);
        names
    }

    /// Service flags with every real sink.
    pub fn args(&self, statsd_port: u16, dir: &Path) -> Vec<String> {
        let mut args = base_args(&self.topic, &self.dlq, &self.group, dir, free_port());
        let real: Vec<String> = [
            "--blob-sink",
            "gcs",
            "--gcs-bucket",
            &self.bucket,
            "--gcs-endpoint",
            &gcs_endpoint(),
            "--gcs-anonymous",
            "--rows-sink",
            "clickhouse",
            "--clickhouse-url",
            &clickhouse_url(),
            "--clickhouse-database",
            "replay_ingest_e2e",
            "--clickhouse-table",
            &self.table,
            "--migrate-on-start",
            "--events-sink",
            "kafka",
            "--outcomes-topic",
            &self.outcomes,
            "--analytics-topic",
            &self.analytics,
            "--issues-topic",
            &self.issues,
            "--statsd-address",
            &format!("127.0.0.1:{statsd_port}"),
            "--statsd-flush-interval-ms",
            "100",
            // Retries are unlimited (the default): an outage is ridden out, however long.
            "--flush-max-backoff-ms",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(real);
        args
    }
}

/// The settings `Names::args` gives the service for `table`.
pub fn clickhouse_config(table: &str) -> replay_ingest::sink::clickhouse::ClickHouseConfig {
    replay_ingest::sink::clickhouse::ClickHouseConfig {
        url: clickhouse_url(),
        database: "replay_ingest_e2e".into(),
        table: table.into(),
        user: "default".into(),
        password: Default::default(),
        password_file: None,
        chunk_rows: 1000,
        timeout: std::time::Duration::from_secs(30),
    }
}

pub async fn clickhouse_rows(table: &str) -> Vec<replay_ingest::recording::ReplayRow> {
    let client = replay_ingest::sink::clickhouse::client(&clickhouse_config(table));
    client
        .query(&format!("OPTIMIZE TABLE {table} FINAL"))
        .execute()
        .await
        .unwrap();
    client
        .query(&format!("SELECT ?fields FROM {table} FINAL"))
        .fetch_all()
        .await
        .unwrap()
}

/// A proxy in front of the GCS emulator that refuses, while `refusing` is set, every upload of a
/// blob of one of `replays` with GCS's 400 for an object it will not take; the rest goes through.
pub async fn gcs_refusing(replays: Vec<String>, refusing: Arc<AtomicBool>) -> proxy::Proxy {
    proxy::Proxy::start(&gcs_endpoint(), move |seen| {
        let body = String::from_utf8_lossy(seen.body);
        let named = |r: &String| seen.path.contains(r.as_str()) || body.contains(r.as_str());
        if refusing.load(Ordering::SeqCst) && replays.iter().any(named) {
            proxy::Action::Answer {
                status: 400,
                headers: vec![("content-type", "application/json".into())],
                body: r#"{"error":{"code":400,"message":"Invalid object"}}"#.into(),
            }
        } else {
            proxy::Action::Forward
        }
    })
    .await
}

/// ClickHouse's compressed block stream (16-byte checksum, method 0x82 = LZ4, compressed size
/// with the 9-byte header, decompressed size, data) back to the bytes it carries.
pub fn clickhouse_decompress(mut stream: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while !stream.is_empty() {
        let header = &stream[16..25];
        assert_eq!(header[0], 0x82, "LZ4 block");
        let compressed = u32::from_le_bytes(header[1..5].try_into().unwrap()) as usize;
        let size = u32::from_le_bytes(header[5..9].try_into().unwrap()) as usize;
        out.extend(lz4_flex::block::decompress(&stream[25..16 + compressed], size).unwrap());
        stream = &stream[16 + compressed..];
    }
    out
}

/// A proxy in front of ClickHouse that refuses, while `refusing` is set, every INSERT holding a
/// row of one of `replays` (its `replay_id` as RowBinary writes a UUID: two little-endian
/// halves), answering as ClickHouse does a row it cannot parse; the rest goes through.
pub async fn clickhouse_refusing(replays: Vec<String>, refusing: Arc<AtomicBool>) -> proxy::Proxy {
    let ids: Vec<[u8; 16]> = replays
        .iter()
        .map(|replay| {
            let (high, low) = uuid::Uuid::parse_str(replay).unwrap().as_u64_pair();
            let mut bytes = [0; 16];
            bytes[..8].copy_from_slice(&high.to_le_bytes());
            bytes[8..].copy_from_slice(&low.to_le_bytes());
            bytes
        })
        .collect();
    proxy::Proxy::start(&clickhouse_url(), move |seen| {
        let inserting = seen.path.contains("INSERT") && seen.path.contains("decompress=1");
        let holds = |rows: &[u8]| ids.iter().any(|id| rows.windows(16).any(|w| w == id));
        if inserting && refusing.load(Ordering::SeqCst) && holds(&clickhouse_decompress(seen.body)) {
            proxy::Action::Answer {
                status: 500,
                headers: vec![("x-clickhouse-exception-code", "27".into())],
                body: "Code: 27. DB::Exception: Cannot parse input: expected '\\t' (version 18.16.1)\n"
                    .into(),
            }
        } else {
            proxy::Action::Forward
        }
    })
    .await
}

/// The replay id of a message `recording::process` accepts.
pub fn replay_of(value: &[u8]) -> String {
    replay_ingest::recording::process(value, &replay_ingest::recording::Limits::default())
        .expect("a valid message")
        .ids
        .replay_id
}

impl Names {
    /// `consume` flags for running the pipeline in this process (`pipeline::consume`, with
    /// [`service_sinks`]) on these names (fast joins, short buffers: `base_args`) with the real
    /// sinks: blobs in the bucket through `gcs` (the emulator's endpoint, or a proxy's in front
    /// of it), rows in the table through `clickhouse` (ClickHouse's URL or a proxy's; `None`: no
    /// rows), no events; then `extra` flags. Parsed and validated as the binary does.
    pub fn pipeline_args(
        &self,
        gcs: &str,
        clickhouse: Option<&str>,
        extra: &[&str],
    ) -> replay_ingest::config::ConsumeArgs {
        let dir = std::env::temp_dir();
        let mut argv = base_args(&self.topic, &self.dlq, &self.group, &dir, free_port());
        let blobs = [
            "--blob-sink",
            "gcs",
            "--gcs-bucket",
            &self.bucket,
            "--gcs-endpoint",
            gcs,
            "--gcs-anonymous",
        ];
        let rows = match clickhouse {
            Some(url) => vec![
                "--rows-sink",
                "clickhouse",
                "--clickhouse-url",
                url,
                "--clickhouse-database",
                "replay_ingest_e2e",
                "--clickhouse-table",
                &self.table,
                "--migrate-on-start",
            ],
            None => vec!["--rows-sink", "null"],
        };
        let rest = ["--events-sink", "null", "--statsd-address", ""];
        let flags = blobs.iter().chain(&rows).chain(&rest).chain(extra);
        argv.extend(flags.map(|s| s.to_string()));
        parse_consume(argv)
    }

    /// Waits until the group has committed, on the topic's `partitions` partitions, every message
    /// `report` says was produced (`what` names the wait).
    pub async fn all_committed(&self, partitions: i32, report: &load::Produced, what: &str) {
        wait_for(what, JOIN_AND_FLUSH, || {
            committed(&self.group, &self.topic, partitions) == expected_commits(report)
        })
        .await;
    }

    /// The blobs in the bucket: its objects but the startup check's probe.
    pub fn blobs(&self) -> std::collections::BTreeSet<String> {
        let mut names = object_names(&self.bucket);
        names.remove(replay_ingest::sink::gcs::PROBE_KEY);
        names
    }

    /// `(partition, offset)` of the messages with rows in the table.
    pub async fn rows_at(&self) -> std::collections::BTreeSet<(i32, i64)> {
        clickhouse_rows(&self.table)
            .await
            .iter()
            .map(|row| (i32::from(row.partition), row.offset as i64))
            .collect()
    }
}

/// The sinks the service builds from `args` (`replay_ingest::service::sinks`, what the binary
/// runs), each behind its destination's startup check, tried with `status`.
pub async fn service_sinks(
    args: &replay_ingest::config::ConsumeArgs,
    status: &Arc<replay_ingest::health::Status>,
) -> replay_ingest::pipeline::flush::Sinks {
    replay_ingest::service::sinks(args, status).await.unwrap().0
}

/// Whether a request the GCS client sends (its path and query, as a proxy sees it) uploads a
/// blob: an upload (`uploadType=`), other than the startup check's probe.
pub fn blob_upload(path: &str) -> bool {
    path.contains("uploadType=") && !path.contains("startup-check")
}
