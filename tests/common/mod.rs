//! Shared helpers for tests against the real local broker that `scripts/stack.sh up` starts
//! (`REPLAY_INGEST_TEST_BROKERS`). Every test makes its own topics and consumer group.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use google_cloud_storage::client::Storage;
use load::Produced;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use replay_ingest::recording::{self, KafkaPosition, Limits, ReplayRow};
use replay_ingest::sink::{Batch, Entry, Outcome};

pub mod kafka;
pub mod load;
pub mod proxy;
pub mod snuba;
pub mod tls;
pub mod topics;

pub fn brokers() -> String {
    std::env::var("REPLAY_INGEST_TEST_BROKERS")
        .expect("REPLAY_INGEST_TEST_BROKERS is not set: start the local stack with `scripts/stack.sh up` and source its stack.env (scripts/test.sh does both)")
}

/// A name no other test (or earlier run against the same broker) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &load::random_replay_id()[..12])
}

/// A client configuration for the local stack's broker.
pub fn kafka() -> ClientConfig {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .clone()
}

pub async fn create_topic(name: &str, partitions: i32) {
    create_topic_on(&kafka(), name, partitions).await
}

/// The Sentry topic a test's topic stands for, by the prefix `unique` gave its name.
fn stands_for(name: &str) -> &'static str {
    match name.rsplit_once('-').map_or(name, |(prefix, _)| prefix) {
        "rec" => "ingest-replay-recordings",
        "replay-events" => "ingest-replay-events",
        "outcomes" => "outcomes-billing",
        "issues" => "ingest-occurrences",
        _ => "",
    }
}

/// `create_topic` on the cluster `base` points at, with the settings Sentry gives the topic it
/// stands for, so the broker enforces production's limits (`topics::sentry_topic_config`).
pub async fn create_topic_on(base: &ClientConfig, name: &str, partitions: i32) {
    topics::create_topic_as(base, name, partitions, stands_for(name))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

pub fn producer() -> FutureProducer {
    producer_on(&kafka())
}

pub fn producer_on(base: &ClientConfig) -> FutureProducer {
    base.clone()
        .set("acks", "all")
        .set("message.max.bytes", "16000000")
        .create()
        .expect("producer")
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every fixture (recorded and synthetic), sorted.
pub fn all_fixtures() -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = ["segments", "synthetic"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(fixture_dir().join(d))
                .unwrap()
                .map(|e| e.unwrap().path())
        })
        .filter(|p| p.extension().is_some_and(|e| e == "msgpack"))
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// The fixtures under 100 kB that the recording core accepts (`valid`) or rejects.
pub fn small_fixtures(valid: bool) -> Vec<Vec<u8>> {
    all_fixtures()
        .into_iter()
        .filter(|f| f.len() < 100_000 && recording::process(f, &Limits::default()).is_ok() == valid)
        .collect()
}

/// What the service must produce for one message: a blob (key and a digest of its bytes), or a
/// DLQ reason.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expected {
    Blob { key: String, digest: u64 },
    Dlq(&'static str),
}

/// A digest of `bytes`, to compare stored bytes with expected ones without keeping both.
pub fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// What `value` must become.
pub fn expected_for(value: &[u8]) -> Expected {
    match recording::process(value, &Limits::default()) {
        Ok(p) => Expected::Blob {
            key: p.blob.key,
            digest: digest(&p.blob.bytes),
        },
        Err(e) => Expected::Dlq(e.reason.as_str()),
    }
}

/// A produced message as the dead-letter copy must repeat it: its key, and its value's length
/// and digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Original {
    pub key: Option<Vec<u8>>,
    pub len: usize,
    pub digest: u64,
}

impl Original {
    pub fn new(key: Option<Vec<u8>>, value: &[u8]) -> Original {
        Original {
            key,
            len: value.len(),
            digest: digest(value),
        }
    }
}

/// One produced message and what it must become.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sent {
    pub partition: i32,
    pub offset: i64,
    pub expected: Expected,
    pub original: Original,
    pub value: Vec<u8>,
}

/// The key test runs give copy `i`: every message has a distinct one, so the dead-letter copy's
/// key can be checked.
pub fn test_key(i: u64) -> Vec<u8> {
    format!("key-{i}-{}", &load::random_replay_id()[..8]).into_bytes()
}

/// Produces `count` fixture copies, each with its own key; returns the delivery report and every
/// message's fate.
pub async fn produce_fixtures(
    topic: &str,
    fixtures: &[Vec<u8>],
    count: u64,
) -> (Produced, Vec<Sent>) {
    let copies: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
        .map(|i| (load::fixture_copy(fixtures, i), test_key(i)))
        .collect();
    produce_values(topic, copies).await
}

/// Produces `(value, key)` pairs in order; returns the delivery report and every message's fate.
pub async fn produce_values(
    topic: &str,
    messages: Vec<(Vec<u8>, Vec<u8>)>,
) -> (Produced, Vec<Sent>) {
    produce_values_with(&producer(), topic, messages).await
}

/// `produce_values` through `producer`.
pub async fn produce_values_with(
    producer: &FutureProducer,
    topic: &str,
    messages: Vec<(Vec<u8>, Vec<u8>)>,
) -> (Produced, Vec<Sent>) {
    let report = load::produce(producer, topic, messages.len() as u64, None, |i| {
        let (value, key) = &messages[i as usize];
        (value.clone(), Some(key.clone()))
    })
    .await
    .expect("produce");
    // Deliveries come back in production order.
    let sent = report
        .deliveries
        .iter()
        .zip(messages)
        .map(|(&(partition, offset), (value, key))| Sent {
            partition,
            offset,
            expected: expected_for(&value),
            original: Original::new(Some(key), &value),
            value,
        })
        .collect();
    (report, sent)
}

/// Offsets the group has committed, per partition.
pub fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    committed_on(&kafka(), group, topic, partitions)
}

/// `committed` on the cluster `base` points at.
pub fn committed_on(
    base: &ClientConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .expect("committed offsets");
    committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// `last delivered offset + 1` per partition: where the committed offsets must end up.
pub fn expected_commits(report: &Produced) -> BTreeMap<i32, i64> {
    report
        .last_offsets
        .iter()
        .map(|(&p, &o)| (p, o + 1))
        .collect()
}

/// One message read back from a topic.
pub struct Received {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// Messages on `topic`, read from the start until at least `count` arrived and then nothing more
/// for a second (so duplicates are seen too).
pub fn read_messages(topic: &str, count: usize, timeout: Duration) -> Vec<Received> {
    read_messages_on(&kafka(), topic, count, timeout)
}

/// `read_messages` from the cluster `base` points at.
pub fn read_messages_on(
    base: &ClientConfig,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Vec<Received> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut last_seen = Instant::now();
    while Instant::now() < deadline
        && (out.len() < count || last_seen.elapsed() < Duration::from_secs(1))
    {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            last_seen = Instant::now();
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Received {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().unwrap_or_default().to_vec(),
                headers,
            });
        }
    }
    out
}

/// Dead-lettered messages as `(original partition, original offset, reason)`, in the order the
/// DLQ holds them (duplicates included). Checks each against the message it copies (`originals`,
/// by partition and offset of `source_topic`): the same key and value bytes (or, for a value too
/// large for the DLQ, a pointer with its length), the `original_*` headers and a detail.
pub fn read_dlq(
    topic: &str,
    source_topic: &str,
    originals: &BTreeMap<(i32, i64), Original>,
    count: usize,
    timeout: Duration,
) -> Vec<(i32, i64, String)> {
    check_dead_letters(
        read_messages(topic, count, timeout),
        source_topic,
        originals,
    )
}

/// Checks each dead letter against the message it copies (see `read_dlq`).
pub fn check_dead_letters(
    received: Vec<Received>,
    source_topic: &str,
    originals: &BTreeMap<(i32, i64), Original>,
) -> Vec<(i32, i64, String)> {
    received
        .into_iter()
        .map(
            |Received {
                 key,
                 value,
                 headers: h,
             }| {
                assert!(!h["detail"].is_empty(), "every DLQ message says why: {h:?}");
                assert_eq!(h["original_topic"], source_topic, "{h:?}");
                let at: (i32, i64) = (
                    h["original_partition"].parse().unwrap(),
                    h["original_offset"].parse().unwrap(),
                );
                let timestamp: i64 = h["original_timestamp"]
                    .parse()
                    .unwrap_or_else(|_| panic!("a timestamp: {h:?}"));
                assert!(
                    timestamp > 1_500_000_000_000,
                    "the original's timestamp in ms: {h:?}"
                );
                let original = originals
                    .get(&at)
                    .unwrap_or_else(|| panic!("a dead letter for a message never produced: {h:?}"));
                assert_eq!(
                    key, original.key,
                    "the dead letter keeps the original key ({at:?})"
                );
                match h.get("payload_location") {
                    None => assert_eq!(
                        (value.len(), digest(&value)),
                        (original.len, original.digest),
                        "the dead letter keeps the original bytes ({at:?})"
                    ),
                    Some(_) => {
                        assert!(value.is_empty(), "a pointer record carries no value");
                        assert_eq!(h["payload_bytes"], original.len.to_string(), "{h:?}");
                    }
                }
                (at.0, at.1, h["reason"].clone())
            },
        )
        .collect()
}

/// The originals of `sent`, by partition and offset, for `read_dlq`.
pub fn originals(sent: &[Sent]) -> BTreeMap<(i32, i64), Original> {
    sent.iter()
        .map(|s| ((s.partition, s.offset), s.original.clone()))
        .collect()
}

/// Blob key → digest of the blob's bytes.
pub type Blobs = BTreeMap<String, u64>;

/// `(original partition, original offset, reason)` of dead letters.
pub type DeadLetters = BTreeSet<(i32, i64, String)>;

/// The blobs the service must write, and the DLQ entries it must publish.
pub fn outcomes(sent: &[Sent]) -> (Blobs, DeadLetters) {
    let mut blobs = BTreeMap::new();
    let mut dead = BTreeSet::new();
    for s in sent {
        match &s.expected {
            Expected::Blob { key, digest } => {
                blobs.insert(key.clone(), *digest);
            }
            Expected::Dlq(reason) => {
                dead.insert((s.partition, s.offset, reason.to_string()));
            }
        }
    }
    (blobs, dead)
}

/// The blobs under `dir` (temporary files of interrupted writes left out), with the digest of
/// their bytes.
pub fn blobs_under(dir: &Path) -> Blobs {
    files_under(dir)
        .into_iter()
        .filter(|f| !f.contains(".tmp-"))
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            (f, digest(&bytes))
        })
        .collect()
}

/// Every file under `dir`, as paths relative to it.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Polls `condition` every 100 ms until it holds or `timeout` passes.
pub async fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The service as a child process, as operators run it.
pub struct Service {
    pub child: Child,
    pub port: u16,
}

/// Parsed `consume` flags for running the pipeline in-process (local sinks, fast joins), plus
/// `extra` flags; validated like the binary validates them.
pub fn consume_args(
    topic: &str,
    group: &str,
    extra: &[&str],
) -> replay_ingest::config::ConsumeArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: replay_ingest::config::ConsumeArgs,
    }
    let mut argv = service_args(
        topic,
        &unique("dlq"),
        group,
        &std::env::temp_dir(),
        free_port(),
    );
    argv.remove(0); // "consume"
    argv.extend(extra.iter().map(|s| s.to_string()));
    let args =
        <Cli as clap::Parser>::try_parse_from(std::iter::once("test".to_string()).chain(argv))
            .unwrap()
            .args;
    args.validate().unwrap();
    args
}

/// `args` with the value of `flag` replaced.
pub fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not among {args:?}"));
    args[at + 1] = value.into();
    args
}

/// Flags for a test run with local sinks (filesystem blobs, no rows, events or metrics).
pub fn service_args(
    topic: &str,
    dlq: &str,
    group: &str,
    blob_dir: &Path,
    port: u16,
) -> Vec<String> {
    let mut args = base_args(topic, dlq, group, blob_dir, port);
    args.extend(
        [
            "--blob-sink",
            "filesystem",
            "--rows-sink",
            "null",
            "--events-sink",
            "null",
            "--statsd-address",
            "",
        ]
        .map(String::from),
    );
    args
}

/// Flags for a test run, sinks not chosen: fast group joins, short buffers.
pub fn base_args(topic: &str, dlq: &str, group: &str, blob_dir: &Path, port: u16) -> Vec<String> {
    [
        "consume",
        "--brokers",
        &brokers(),
        "--topic",
        topic,
        "--dlq-topic",
        dlq,
        "--group-id",
        group,
        "--blob-dir",
        &blob_dir.to_string_lossy(),
        "--http-listen",
        &format!("127.0.0.1:{port}"),
        "--session-timeout-ms",
        "2000",
        "--drain-deadline-ms",
        "1500",
        "--buffer-max-age-ms",
        "200",
        "--buffer-max-bytes",
        "64000000",
        "--max-message-bytes",
        "16000000",
        "--flush-initial-backoff-ms",
        "20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Service {
    pub fn start(args: &[String]) -> Service {
        // REPLAY_INGEST_TEST_LOGS=1 shows the service's logs.
        let logs = if std::env::var_os("REPLAY_INGEST_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        Self::start_with_logs(args, logs)
    }

    /// Starts the service with its logs written to `log`.
    pub fn start_logging_to(args: &[String], log: &Path) -> Service {
        Self::start_with_logs(args, std::fs::File::create(log).unwrap().into())
    }

    /// Starts the service with its logs (stderr) going to `logs`.
    pub fn start_with_logs(args: &[String], logs: Stdio) -> Service {
        Self::spawn(args, logs, None)
    }

    /// Starts the service with soft and hard limits of `limit` open file descriptors (as a
    /// container whose hard limit is low), so that it cannot raise its own.
    pub fn start_with_fd_limit(args: &[String], limit: u64) -> Service {
        let logs = if std::env::var_os("REPLAY_INGEST_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        Self::spawn(args, logs, Some(limit))
    }

    /// Starts the service with its logs going to `logs` and, if given, a file descriptor limit.
    pub fn spawn(args: &[String], logs: Stdio, fd_limit: Option<u64>) -> Service {
        use std::os::unix::process::CommandExt;
        let port = args
            .iter()
            .position(|a| a == "--http-listen")
            .and_then(|i| args.get(i + 1))
            .unwrap();
        let port = port.rsplit(':').next().unwrap().parse().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_replay-ingest"));
        command
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(logs);
        if let Some(limit) = fd_limit {
            // SAFETY: only setrlimit, async-signal-safe, runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let rlimit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    match libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
        }
        Service {
            child: command.spawn().expect("start the service"),
            port,
        }
    }

    /// `GET path` the way the kubelet probes: a new connection, one second to answer.
    pub fn probe(&self, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let t = Instant::now();
        let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))
            .map_err(|e| eprintln!("connect {e} {:?}", t.elapsed()))
            .ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| eprintln!("write {e}"))
        .ok()?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| eprintln!("read {e} {:?}", t.elapsed()))
            .ok()?;
        response.split_whitespace().nth(1)?.parse().ok()
    }

    /// `/status` as JSON, or `None` while the endpoint is not up.
    pub fn status(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.get("/status")?.1).ok()
    }

    /// `GET path` on the health endpoint: the status code and body, or `None` while it is not up.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, response.split("\r\n\r\n").nth(1)?.to_owned()))
    }

    /// Sends SIGTERM without waiting for the exit.
    pub fn signal_term(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    pub fn committed(&self) -> BTreeMap<i32, i64> {
        self.status()
            .and_then(|s| {
                serde_json::from_value::<BTreeMap<String, i64>>(s["committed"].clone()).ok()
            })
            .map(|m| {
                m.into_iter()
                    .map(|(k, v)| (k.parse().unwrap(), v))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        self.signal_term();
        self.child.wait().ok()?.code()
    }

    /// Waits up to `timeout` for the service to exit on its own; its exit code, or `None` while
    /// it still runs (it is killed when dropped).
    pub async fn exit_within(mut self, timeout: Duration) -> Option<i32> {
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if let Some(status) = self.child.try_wait().unwrap() {
                    return status.code();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
        .await
        .unwrap()
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Real sinks: GCS emulator, ClickHouse, analytics topics
// ---------------------------------------------------------------------------------------------

pub fn gcs_endpoint() -> String {
    std::env::var("REPLAY_INGEST_TEST_GCS_ENDPOINT")
        .expect("REPLAY_INGEST_TEST_GCS_ENDPOINT (scripts/stack.sh up)")
}

pub fn clickhouse_url() -> String {
    std::env::var("REPLAY_INGEST_TEST_CLICKHOUSE_URL")
        .expect("REPLAY_INGEST_TEST_CLICKHOUSE_URL (scripts/stack.sh up)")
}

pub fn create_bucket(name: &str) {
    use std::io::{Read, Write};
    let host = gcs_endpoint().trim_start_matches("http://").to_owned();
    let body = format!("{{\"name\":\"{name}\"}}");
    let mut stream = std::net::TcpStream::connect(&host).unwrap();
    write!(
        stream,
        "POST /storage/v1/b?project=test HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.contains(" 200 "), "{response}");
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

/// A DogStatsD listener on 127.0.0.1 for the service's metrics. A thread drains the socket as
/// datagrams arrive, so a long run cannot overflow the socket's buffer and lose early ones.
pub struct Statsd {
    port: u16,
    received: std::sync::Arc<std::sync::Mutex<(String, Instant)>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a test's DogStatsD port received. Reading fails on a metric without the unified service
/// tags (`service:replay-ingest`, `version:<crate version>`); keys leave them out.
pub struct Metrics {
    /// Every datagram, a line each.
    pub text: String,
    /// Counters, summed (they arrive as deltas per flush interval).
    pub counters: BTreeMap<String, f64>,
    /// Every value sent for the other kinds: a distribution's samples, a gauge's successive values.
    pub values: BTreeMap<String, Vec<f64>>,
    pub seen: BTreeSet<String>,
}

impl Drop for Statsd {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Statsd {
    pub fn bind() -> Statsd {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let port = socket.local_addr().unwrap().port();
        let received = std::sync::Arc::new(std::sync::Mutex::new((String::new(), Instant::now())));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sink, done) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = socket.recv(&mut buf) {
                    let mut received = sink.lock().unwrap();
                    received.0.push_str(&String::from_utf8_lossy(&buf[..n]));
                    received.0.push('\n');
                    received.1 = Instant::now();
                }
            }
        });
        Statsd {
            port,
            received,
            stop,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything received since the last read, once 200 ms pass without a datagram.
    pub fn read(&self) -> Metrics {
        while self.received.lock().unwrap().1.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.read_now()
    }

    /// Everything received since the last read, at once (while the service keeps sending).
    pub fn read_now(&self) -> Metrics {
        let text = std::mem::take(&mut self.received.lock().unwrap().0);
        let (mut counters, mut values, mut seen) = (
            BTreeMap::new(),
            BTreeMap::<String, Vec<f64>>::new(),
            BTreeSet::new(),
        );
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (name, rest) = line.split_once(':').unwrap();
            let mut parts = rest.split('|');
            let (value, kind) = (parts.next().unwrap(), parts.next().unwrap());
            // Every metric carries the unified service tags; keys keep only the metric's own.
            let all_tags: Vec<&str> = parts
                .find_map(|p| p.strip_prefix('#'))
                .unwrap_or("")
                .split(',')
                .collect();
            let global = [
                concat!("version:", env!("CARGO_PKG_VERSION")),
                "service:replay-ingest",
            ];
            assert!(
                global.iter().all(|g| all_tags.contains(g)),
                "{line}: without the global tags {global:?}"
            );
            let tags: Vec<&str> = all_tags
                .into_iter()
                .filter(|t| !global.contains(t))
                .collect();
            let key = if tags.is_empty() {
                name.to_owned()
            } else {
                format!("{name}|{}", tags.join(","))
            };
            let samples = value.split(':').map(|v| v.parse::<f64>().unwrap());
            if kind == "c" {
                *counters.entry(key.clone()).or_default() += samples.sum::<f64>();
            } else {
                values.entry(key.clone()).or_default().extend(samples);
            }
            seen.insert(key);
        }
        Metrics {
            text,
            counters,
            values,
            seen,
        }
    }
}

/// Sends `signal` to a stack service (`kafka`, `gcs`) by its pid file; whether it was delivered.
pub fn signal_stack(service: &str, signal: &str) -> bool {
    let dir = std::env::var("REPLAY_INGEST_STACK_DIR")
        .unwrap_or_else(|_| "/tmp/replay-ingest-stack".into());
    let Ok(pid) = std::fs::read_to_string(format!("{dir}/{service}.pid")) else {
        return false;
    };
    std::process::Command::new("kill")
        .args([signal, pid.trim()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `scripts/stack.sh` against the stack the test script started.
pub fn stack(args: &[&str]) {
    let status = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/stack.sh"))
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/stack.sh {args:?}");
}

// ---------------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------------

/// Every valid fixture, processed, as one batch. The fixtures' replay events carry no user
/// address: the first two segment rows get one of each family, to round-trip both columns.
pub fn fixture_batch() -> Batch {
    let mut addresses = ["192.0.2.7", "2001:db8::1"].into_iter();
    let entries = all_fixtures()
        .iter()
        .filter_map(|value| recording::process(value, &Limits::default()).ok())
        .map(|mut p| {
            if let Some(event) = p.replay_event.as_mut().filter(|_| p.writes_segment_row) {
                event.ip_address = addresses
                    .next()
                    .map(String::from)
                    .or(event.ip_address.take());
            }
            p
        })
        .enumerate()
        .map(|(i, p)| Entry {
            partition: 1,
            offset: i as i64,
            outcome: Outcome::Valid(Box::new(p)),
        })
        .collect();
    Batch { entries }
}

/// Every row of the batch, in the order they are inserted.
pub fn rows_of(batch: &Batch) -> Vec<ReplayRow> {
    batch
        .iter()
        .flat_map(|e| match &e.outcome {
            Outcome::Valid(p) => p.rows(KafkaPosition {
                partition: e.partition,
                offset: e.offset,
            }),
            Outcome::Invalid(_) => Vec::new(),
        })
        .collect()
}

/// One write of `batch` through `sink`, as a flush's first attempt makes it.
pub fn write_once(
    sink: &dyn replay_ingest::sink::Sink,
    batch: &[Entry],
) -> Result<replay_ingest::sink::Written, replay_ingest::sink::SinkError> {
    let status = replay_ingest::health::Status::default();
    sink.write(
        batch,
        &replay_ingest::sink::Progress::new(sink.name(), &status),
    )
}
