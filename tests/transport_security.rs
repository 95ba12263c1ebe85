//! TLS and SASL to the sinks, through a TLS-terminating proxy whose certificate only the test's
//! CA signs, in front of a broker of the test's own (tansu) and the local ClickHouse.
//!
//! - SSL end to end: the service trusts that CA (`--kafka-ssl-ca-location`), consumes,
//!   dead-letters and commits, every connection through TLS;
//! - SASL_SSL: the service completes TLS and starts the SASL handshake with the configured
//!   mechanism and the password from a mounted file, never printing it. The local broker cannot
//!   complete SASL (docs/local-stack.md, "tansu and SASL"), so authentication itself is not
//!   exercised here: the broker's refusal is what the service must report, staying unready;
//! - an untrusted broker certificate: refused, reported, unready;
//! - ClickHouse over `https://`: trusted through `SSL_CERT_FILE`, refused without it;
//! - secrets given in the environment never show in `--help` or in errors.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::tls::TestCa;
use common::*;
use rdkafka::ClientConfig;

const PASSWORD: &str = "s3cr3t-sasl-password";

/// A tansu broker on its own port, advertising a TLS proxy in front of it; stopped on drop.
struct Broker {
    child: Child,
    ca: TestCa,
    tls_port: u16,
    handshakes: Arc<AtomicUsize>,
}

impl Broker {
    fn start() -> Broker {
        let ca = TestCa::new();
        let tls_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tls_port = tls_listener.local_addr().unwrap().port();
        let port = free_port();
        let child = Command::new(std::env::var("REPLAY_INGEST_TANSU").unwrap())
            .args(["broker", "--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{tls_port}")])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let handshakes = ca.proxy(tls_listener, port);
        let broker = Broker { child, ca, tls_port, handshakes };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return broker;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tansu did not open 127.0.0.1:{port}");
    }

    /// A client configuration over TLS, trusting the broker's CA (the test's own clients).
    fn tls_client(&self) -> ClientConfig {
        ClientConfig::new()
            .set("bootstrap.servers", format!("127.0.0.1:{}", self.tls_port))
            .set("security.protocol", "SSL")
            .set("ssl.ca.location", self.ca.ca_file().to_str().unwrap())
            .clone()
    }

    /// Service flags for this broker: `security` flags, local sinks.
    fn service_args(&self, topic: &str, dlq: &str, blob_dir: &Path, security: &[&str]) -> Vec<String> {
        let args = service_args(topic, dlq, &unique("group"), blob_dir, free_port());
        let mut args = with_flag(args, "--brokers", &format!("127.0.0.1:{}", self.tls_port));
        args.extend(security.iter().map(|s| s.to_string()));
        args
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the service's log holds `needle`; returns the log (or fails showing its end).
async fn log_shows(log: &Path, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let logs = std::fs::read_to_string(log).unwrap_or_default();
        if logs.contains(needle) {
            return logs;
        }
        if std::time::Instant::now() > deadline {
            let tail: Vec<&str> = logs.lines().rev().take(15).collect();
            panic!(
                "the log never showed {needle:?}; its end:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn over_tls_the_service_consumes_dead_letters_and_commits() {
    if !needs("REPLAY_INGEST_TANSU") {
        return;
    }
    let broker = Broker::start();
    let base = broker.tls_client();
    let (topic, dlq) = (unique("tls"), unique("tls-dlq"));
    create_topic_on(&base, &topic, 1).await;
    create_topic_on(&base, &dlq, 1).await;
    let fixtures: Vec<Vec<u8>> = [small_fixtures(true), small_fixtures(false)].concat();
    let messages = fixtures.iter().enumerate().map(|(i, f)| (f.clone(), test_key(i as u64))).collect();
    let (report, sent) = produce_values_with(&producer_on(&base), &topic, messages).await;
    let (blobs, dead) = outcomes(&sent);
    assert!(!blobs.is_empty() && !dead.is_empty());
    let before = broker.handshakes.load(Ordering::Relaxed);

    let dir = tempfile::tempdir().unwrap();
    let blob_dir = dir.path().join("blobs");
    let ca = broker.ca.ca_file();
    let security = ["--kafka-security-protocol", "SSL", "--kafka-ssl-ca-location", ca.to_str().unwrap()];
    let args = broker.service_args(&topic, &dlq, &blob_dir, &security);
    let group = args[args.iter().position(|a| a == "--group-id").unwrap() + 1].clone();
    let service = Service::start(&args);
    wait_for("every blob written", Duration::from_secs(60), || blobs_under(&blob_dir) == blobs).await;
    let letters = read_messages_on(&base, &dlq, dead.len(), Duration::from_secs(30));
    let letters = check_dead_letters(letters, &topic, &originals(&sent));
    assert_eq!(letters.into_iter().collect::<BTreeSet<_>>(), dead);
    wait_for("offsets committed", Duration::from_secs(30), || {
        committed_on(&base, &group, &topic, 1) == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    assert!(broker.handshakes.load(Ordering::Relaxed) > before, "the service's clients went through TLS");
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_authenticates_after_tls_with_the_mounted_password_and_never_prints_it() {
    if !needs("REPLAY_INGEST_TANSU") {
        return;
    }
    let broker = Broker::start();
    let (topic, dlq) = (unique("sasl"), unique("sasl-dlq"));
    create_topic_on(&broker.tls_client(), &topic, 1).await;
    create_topic_on(&broker.tls_client(), &dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let ca = broker.ca.ca_file();
    let security = [
        "--kafka-security-protocol",
        "SASL_SSL",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "replay",
        "--kafka-sasl-password-file",
        password_file.to_str().unwrap(),
        "--kafka-ssl-ca-location",
        ca.to_str().unwrap(),
        "--sink-timeout-ms",
        "2000",
    ];
    let log = dir.path().join("service.log");
    let before = broker.handshakes.load(Ordering::Relaxed);
    let service = Service::start_logging_to(&broker.service_args(&topic, &dlq, &dir.path().join("b"), &security), &log);
    // TLS completed (the proxy counts it), then the SASL handshake began with SCRAM-SHA-512 on a
    // sasl_ssl connection; the broker refuses it and the startup check says so.
    let logs = log_shows(&log, "SASL SCRAM-SHA-512 mechanism handshake failed").await;
    assert!(logs.contains("sasl_ssl://127.0.0.1"), "{logs}");
    assert!(broker.handshakes.load(Ordering::Relaxed) > before, "SASL ran inside TLS");
    let logs = log_shows(&log, "not reachable yet check=\"kafka\"").await;
    let (code, _) = service.get("/health/ready").expect("the probe answers");
    assert_eq!(code, 503, "not ready while the cluster refuses the credentials");
    service.kill9();
    assert!(!logs.contains(PASSWORD), "the password is never logged:\n{logs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_certificate_the_ca_did_not_sign_is_refused_and_reported() {
    if !needs("REPLAY_INGEST_TANSU") {
        return;
    }
    let broker = Broker::start();
    let (topic, dlq) = (unique("tls"), unique("tls-dlq"));
    create_topic_on(&broker.tls_client(), &topic, 1).await;
    create_topic_on(&broker.tls_client(), &dlq, 1).await;
    let other = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca = other.ca_file();
    let security = [
        "--kafka-security-protocol",
        "SSL",
        "--kafka-ssl-ca-location",
        ca.to_str().unwrap(),
        "--sink-timeout-ms",
        "2000",
    ];
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&broker.service_args(&topic, &dlq, &dir.path().join("b"), &security), &log);
    log_shows(&log, "certificate verify failed").await;
    log_shows(&log, "not reachable yet check=\"kafka\"").await;
    let (code, _) = service.get("/health/ready").expect("the probe answers");
    assert_eq!(code, 503);
    service.kill9();
}

#[test]
fn help_and_errors_never_show_secrets_from_the_environment() {
    let run = |args: &[&str], properties: &str| {
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .args(args)
            .env("REPLAY_INGEST_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
            .env("REPLAY_INGEST_KAFKA_SASL_MECHANISM", "PLAIN")
            .env("REPLAY_INGEST_KAFKA_SASL_USERNAME", "replay")
            .env("REPLAY_INGEST_KAFKA_SASL_PASSWORD", "hunter2-sasl")
            .env("REPLAY_INGEST_CLICKHOUSE_PASSWORD", "hunter2-clickhouse")
            .env("REPLAY_INGEST_KAFKA_PROPERTIES", properties)
            .env("REPLAY_INGEST_STATSD_ADDRESS", "")
            .output()
            .unwrap()
    };
    let help = run(&["consume", "--help"], "client.id=hunter2-property");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("REPLAY_INGEST_KAFKA_SASL_PASSWORD") && text.contains("REPLAY_INGEST_KAFKA_PROPERTIES"));
    assert!(!text.contains("hunter2"), "{text}");

    for properties in ["sasl.password=hunter2-property", "hunter2-property"] {
        let refused = run(&["consume", "--blob-sink", "null"], properties);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(stderr.contains("Kafka property"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn clickhouse_over_https_trusts_the_ca_ssl_cert_file_names_and_refuses_any_other() {
    if !needs("REPLAY_INGEST_TEST_CLICKHOUSE_URL") {
        return;
    }
    let ca = TestCa::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let https_port = listener.local_addr().unwrap().port();
    let clickhouse_port: u16 = clickhouse_url().rsplit(':').next().unwrap().parse().unwrap();
    let handshakes = ca.proxy(listener, clickhouse_port);
    let table = unique("https").replace('-', "_");
    // The local server's `default` user has no password: one is given only where the attempt
    // fails first, to check that the failure does not show it.
    let migrate = |trust: &Path, password: &str| {
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .args(["migrate", "--clickhouse-url", &format!("https://127.0.0.1:{https_port}")])
            .args(["--clickhouse-database", "replay_ingest_e2e", "--clickhouse-table", &table])
            .env("SSL_CERT_FILE", trust)
            .env("REPLAY_INGEST_CLICKHOUSE_PASSWORD", password)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let other = TestCa::new();
    let refused = migrate(&other.ca_file(), "hunter2-clickhouse");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("certificate"), "the error names the certificate: {stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");

    let trusted = migrate(&ca.ca_file(), "");
    assert!(trusted.status.success(), "{}", String::from_utf8_lossy(&trusted.stderr));
    assert!(handshakes.load(Ordering::Relaxed) >= 1, "the trusted attempt went through TLS");
    // The table the HTTPS connection created is there, seen over plain HTTP.
    assert!(clickhouse_rows(&table).await.is_empty());
}
