//! TLS and SASL to the sinks: Kafka through the listeners of an Apache Kafka broker of the
//! test's own (its certificate signed by the test's CA), ClickHouse through a TLS-terminating
//! proxy in front of the local server.
//!
//! - SSL end to end: the service trusts that CA (`--kafka-ssl-ca-location`), consumes,
//!   dead-letters and commits, every client over TLS (the broker's only client listeners are
//!   SSL and SASL ones); and with client certificates required, presenting its own (key
//!   encrypted, the passphrase from a mounted file, never printed) — without one it is refused;
//! - SASL end to end, each way operators set it up: SCRAM-SHA-512, SCRAM-SHA-256
//!   and PLAIN inside TLS, SCRAM-SHA-512 and PLAIN in the clear — the password from a mounted file, never printed;
//! - a broker SIGKILLed and started again under a service consuming over SASL_SSL, and over
//!   mutual TLS: it connects and authenticates again by itself, and nothing is lost;
//! - a wrong password and an untrusted certificate: one error naming what to fix, exit 1;
//! - ClickHouse over `https://`: trusted through `SSL_CERT_FILE`, refused without it;
//! - secrets given in the environment never show in `--help` or in errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crate::support::secure_broker::SecureBroker;
use crate::support::tls::TestCa;
use crate::support::*;
use rdkafka::ClientConfig;

const USER: &str = "replay";
const PASSWORD: &str = "s3cr3t-sasl-password";

/// The test's own clients: SASL_SSL with SCRAM-SHA-512, trusting the broker's CA.
fn admin(broker: &SecureBroker) -> ClientConfig {
    broker.sasl_ssl_client(USER, PASSWORD)
}

/// Service flags for `listener` of `broker`: `security` flags, local sinks.
fn service_args(
    broker: &SecureBroker,
    listener: &str,
    topic: &str,
    dlq: &str,
    blob_dir: &Path,
    security: &[&str],
) -> Vec<String> {
    let args = crate::support::service_args(topic, dlq, &unique("group"), blob_dir, free_port());
    let mut args = with_flag(args, "--brokers", &broker.address(listener));
    args.extend(security.iter().map(|s| s.to_string()));
    args
}

/// Batch `n` of `files`: every fixture once, each under a replay id of its own.
fn batch_of(files: &[Vec<u8>], n: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let per_batch = files.len() as u64;
    (n * per_batch..(n + 1) * per_batch)
        .map(|i| (crate::support::load::fixture_copy(files, i), test_key(i)))
        .collect()
}

/// Produces valid and invalid fixtures to a fresh topic of `broker`, runs the service through
/// `listener` with `security`, and checks that every blob is written, every dead letter reaches
/// the topic and everything commits. Returns the service's log.
async fn end_to_end(broker: &SecureBroker, listener: &str, security: &[&str]) -> String {
    let base = admin(broker);
    let (topic, dlq) = (unique("rec"), unique("dlq"));
    create_topic_on(&base, &topic, 1).await;
    create_topic_on(&base, &dlq, 1).await;
    let fixtures: Vec<Vec<u8>> = [small_fixtures(true), small_fixtures(false)].concat();
    let messages = fixtures
        .iter()
        .enumerate()
        .map(|(i, f)| (f.clone(), test_key(i as u64)))
        .collect();
    let (report, sent) = produce_values_with(&producer_on(&base), &topic, messages).await;
    let (blobs, dead) = outcomes(&sent);
    assert!(!blobs.is_empty() && !dead.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let blob_dir = dir.path().join("blobs");
    let args = service_args(broker, listener, &topic, &dlq, &blob_dir, security);
    let group = args[args.iter().position(|a| a == "--group-id").unwrap() + 1].clone();
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&args, &log);
    wait_for(
        &format!("every blob written through {listener}"),
        Duration::from_secs(60),
        || blobs_under(&blob_dir) == blobs,
    )
    .await;
    let letters = read_messages_on(&base, &dlq, dead.len(), Duration::from_secs(30));
    let letters = check_dead_letters(letters, &topic, &originals(&sent));
    assert_eq!(letters.into_iter().collect::<BTreeSet<_>>(), dead);
    wait_for("offsets committed", Duration::from_secs(30), || {
        committed_on(&base, &group, &topic, 1) == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    std::fs::read_to_string(&log).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_tls_the_service_consumes_dead_letters_and_commits() {
    let broker = SecureBroker::start(USER, PASSWORD);
    let ca = broker.ca.ca_file();
    end_to_end(
        &broker,
        "SSL",
        &[
            "--kafka-security-protocol",
            "SSL",
            "--kafka-ssl-ca-location",
            ca.to_str().unwrap(),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_mutual_tls_the_service_presents_its_certificate_and_without_one_is_refused() {
    let broker = SecureBroker::start(USER, PASSWORD);
    let passphrase = "key-passphrase-5b7e";
    let dir = tempfile::tempdir().unwrap();
    let (tls, identity) = mutual_tls_flags(&broker, dir.path(), passphrase);
    let flags: Vec<&str> = tls.iter().chain(&identity).map(String::as_str).collect();
    let logs = end_to_end(&broker, "MTLS", &flags).await;
    assert!(!logs.contains(passphrase), "{logs}");

    // No certificate: the broker ends every connection at the handshake with an alert, which
    // the service takes for what it is — configuration — and stops, naming the flags. (It took
    // it for brokers not reachable yet, and waited for ever, ready, consuming nothing.)
    let (topic, dlq) = (unique("rec"), unique("dlq"));
    let mut security: Vec<&str> = tls.iter().map(String::as_str).collect();
    security.extend(["--sink-timeout-ms", "3000"]);
    let args = service_args(
        &broker,
        "MTLS",
        &topic,
        &dlq,
        &dir.path().join("b"),
        &security,
    );
    let log = dir.path().join("anonymous.log");
    let exit = Service::start_logging_to(&args, &log)
        .exit_within(Duration::from_secs(60))
        .await;
    let logs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit, Some(1), "{logs}");
    let errors: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("ERROR replay_ingest:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line of the service's:\n{logs}");
    assert!(
        errors[0].contains("the brokers refused this client's certificate"),
        "{}",
        errors[0]
    );
    assert!(!logs.contains("partitions assigned"), "{logs}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_sasl_every_mechanism_authenticates_with_the_mounted_password_and_never_prints_it() {
    let broker = SecureBroker::start(USER, PASSWORD);
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let ca = broker.ca.ca_file();
    for (listener, mechanism) in [
        ("SASL_SSL", "SCRAM-SHA-512"),
        ("SASL_SSL", "SCRAM-SHA-256"),
        ("SASL_SSL", "PLAIN"),
        ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
        ("SASL_PLAINTEXT", "PLAIN"),
    ] {
        let mut security = vec![
            "--kafka-security-protocol",
            listener,
            "--kafka-sasl-mechanism",
            mechanism,
            "--kafka-sasl-username",
            USER,
            "--kafka-sasl-password-file",
            password_file.to_str().unwrap(),
        ];
        if listener == "SASL_SSL" {
            security.extend(["--kafka-ssl-ca-location", ca.to_str().unwrap()]);
        }
        let log = end_to_end(&broker, listener, &security).await;
        assert!(
            !log.contains(PASSWORD),
            "{listener} {mechanism}: the password is never logged:\n{log}"
        );
    }
}

/// The broker SIGKILLed right after a batch is produced (the service consuming, flushing or
/// committing it), kept down past the group session, and started again on its log directory,
/// while the service consumes over SASL_SSL with SCRAM-SHA-512 (the password from a mounted
/// file): the service connects and authenticates again by itself and never exits; every message
/// of the three batches (before, at and after the kill) is stored or dead-lettered, the group
/// commits to the end of both partitions, and no line holds the password.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_sasl_ssl_a_broker_killed_and_started_again_mid_stream_loses_nothing() {
    let broker = SecureBroker::start(USER, PASSWORD);
    broker_killed_mid_stream(broker, "SASL_SSL", |broker, dir| {
        let password_file = dir.join("kafka-password");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        (broker.sasl_ssl_flags(USER, &password_file), PASSWORD.into())
    })
    .await;
}

/// The same through the listener that requires a client certificate (mutual TLS), the key's
/// passphrase from a mounted file: the handshakes after the restart present the certificate
/// again, and no line holds the passphrase.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_mutual_tls_a_broker_killed_and_started_again_mid_stream_loses_nothing() {
    let broker = SecureBroker::start(USER, PASSWORD);
    broker_killed_mid_stream(broker, "MTLS", |broker, dir| {
        let passphrase = "key-passphrase-3c9d";
        let (tls, identity) = mutual_tls_flags(broker, dir, passphrase);
        ([tls, identity].concat(), passphrase.into())
    })
    .await;
}

/// The service's flags for `broker`'s TLS listeners: trusting its CA, and apart, presenting a
/// client certificate the CA signed, its key encrypted with `passphrase`, written to a file in
/// `dir` as a mounted Secret would be.
fn mutual_tls_flags(
    broker: &SecureBroker,
    dir: &Path,
    passphrase: &str,
) -> (Vec<String>, Vec<String>) {
    let (certificate, key) = broker.ca.client_certificate("replay-ingest", passphrase);
    let passphrase_file = dir.join("passphrase");
    std::fs::write(&passphrase_file, passphrase).unwrap();
    let text = |path: &Path| path.to_str().unwrap().to_owned();
    let tls = vec![
        "--kafka-security-protocol".into(),
        "SSL".into(),
        "--kafka-ssl-ca-location".into(),
        text(&broker.ca.ca_file()),
    ];
    let identity = vec![
        "--kafka-ssl-certificate-location".into(),
        text(&certificate),
        "--kafka-ssl-key-location".into(),
        text(&key),
        "--kafka-ssl-key-password-file".into(),
        text(&passphrase_file),
    ];
    (tls, identity)
}

/// The broker killed and started again under a service reaching it through `listener` with the
/// flags `security` gives (from the broker and a directory for mounted files), with the secret
/// they hold, which no line of the log may show.
async fn broker_killed_mid_stream(
    mut broker: SecureBroker,
    listener: &str,
    security: impl FnOnce(&SecureBroker, &Path) -> (Vec<String>, String),
) {
    let (base, topic, dlq) = (admin(&broker), unique("rec"), unique("dlq"));
    let (files, dir, _, blob_dir) = under_load(&base, &topic, 2, &dlq).await;
    let batch = |n| batch_of(&files, n);
    let (flags, secret) = security(&broker, dir.path());
    let args = service_args(
        &broker,
        listener,
        &topic,
        &dlq,
        &blob_dir,
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let group = args[args.iter().position(|a| a == "--group-id").unwrap() + 1].clone();
    let log = dir.path().join("service.log");
    let mut service = Service::start_logging_to(&args, &log);

    let (_, mut sent) = produce_values_with(&producer_on(&base), &topic, batch(0)).await;
    let first = outcomes(&sent).0;
    wait_for("the first batch's blobs", Duration::from_secs(60), || {
        blobs_under(&blob_dir) == first
    })
    .await;
    let (_, at_kill) = produce_values_with(&producer_on(&base), &topic, batch(1)).await;
    sent.extend(at_kill);
    broker.kill();
    // Past the 2 s session: the group the broker comes back with has to take the member back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        service.child.try_wait().unwrap().is_none(),
        "the service rides out the broker's absence"
    );
    broker.start_again();
    let (_, after) = produce_values_with(&producer_on(&base), &topic, batch(2)).await;
    sent.extend(after);

    everything_landed(&base, &sent, (&topic, 2), &dlq, &group, &blob_dir).await;
    // The restart's cut connections and handshakes are no refusal of the credentials.
    let status = service.status().unwrap();
    assert!(status["kafka_refused"].is_null(), "{status}");
    assert_eq!(service.terminate(), Some(0));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains(&secret), "the secret is never logged:\n{log}");
    // Retried by the clients themselves: WARN, librdkafka's own lines included (it logs a lost
    // connection at LOG_ERR, which came out as a burst of ERROR lines no one had to act on).
    // (Not the start's, which say the null sinks publish nothing.)
    let warned = log
        .lines()
        .filter(|l| {
            log_level(l) == Some("WARN") && l.split_whitespace().nth(2) != Some("replay_ingest:")
        })
        .count();
    assert!(warned > 0, "the restart is in the log:\n{log}");
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| log_level(l) == Some("ERROR"))
        .collect();
    assert!(errors.is_empty(), "no ERROR line: {errors:#?}");
    // Each kind of the clients' errors once in 30 s (librdkafka reported one every 100 ms from
    // each client while the brokers were down, and the polling thread logged the consumer's a
    // second time). The log's times are the wall clock's, the window the monotonic one's: a
    // second of room.
    let mut last: BTreeMap<&str, SystemTime> = BTreeMap::new();
    // (Not the lines saying how many were held back: at exit they come whenever.)
    for line in log
        .lines()
        .filter(|l| l.contains("): retried by the client"))
    {
        let Some(kind) = line
            .split_once(" kind=\"")
            .and_then(|(_, rest)| rest.split_once("\" held_back="))
            .map(|(kind, _)| kind)
        else {
            continue;
        };
        let time = humantime::parse_rfc3339(line.split_whitespace().next().unwrap()).unwrap();
        if let Some(before) = last.insert(kind, time) {
            assert!(
                time.duration_since(before).unwrap() >= Duration::from_secs(29),
                "logged again within 30 s:\n{line}\n{log}"
            );
        }
    }
    assert!(!last.is_empty(), "the clients' errors are logged:\n{log}");
}

/// Real rebalances over SASL_SSL with SCRAM-SHA-512 (the password from a mounted file), under
/// production: a second member joins (the first's revoke drains and commits through the secured
/// listener), then the first is killed with SIGKILL, and the second takes its partitions once its
/// session ends. Every message of the three batches (before the join, between, after the kill) is
/// stored or dead-lettered, the group commits to the end of every partition, the survivor's
/// SIGTERM drains and exits 0, and no line holds the password. (The rebalance and kill tests ran
/// on the plaintext listener only.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn over_sasl_ssl_a_member_joining_and_one_killed_under_load_lose_nothing() {
    let broker = SecureBroker::start(USER, PASSWORD);
    let (base, topic, dlq) = (admin(&broker), unique("rec"), unique("dlq"));
    let group = unique("group");
    let (files, dir, password_file, blob_dir) = under_load(&base, &topic, 4, &dlq).await;
    let batch = |n| batch_of(&files, n);
    let flags = broker.sasl_ssl_flags(USER, &password_file);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // Each member its own probe port, both in one group, with a session the kill outlasts soon.
    let member = |name: &str| {
        let args = service_args(&broker, "SASL_SSL", &topic, &dlq, &blob_dir, &flags);
        let args = with_flag(args, "--group-id", &group);
        let args = with_flag(args, "--session-timeout-ms", "6000");
        let log = dir.path().join(format!("{name}.log"));
        (Service::start_logging_to(&args, &log), log)
    };

    let (first, first_log) = member("first");
    let (_, mut sent) = produce_values_with(&producer_on(&base), &topic, batch(0)).await;
    let stored = |sent: &[Sent]| outcomes(sent).0;
    let now = stored(&sent);
    wait_for("the first batch's blobs", Duration::from_secs(60), || {
        blobs_under(&blob_dir) == now
    })
    .await;
    let (second, second_log) = member("second");
    both_own_partitions(&first, &second).await;
    let (_, between) = produce_values_with(&producer_on(&base), &topic, batch(1)).await;
    sent.extend(between);
    let now = stored(&sent);
    wait_for("the second batch's blobs", Duration::from_secs(60), || {
        blobs_under(&blob_dir) == now
    })
    .await;
    first.kill9();
    let (_, after) = produce_values_with(&producer_on(&base), &topic, batch(2)).await;
    sent.extend(after);
    wait_for(
        "the survivor owning every partition",
        Duration::from_secs(60),
        || second.owned() == 4,
    )
    .await;

    everything_landed(&base, &sent, (&topic, 4), &dlq, &group, &blob_dir).await;
    assert_eq!(second.terminate(), Some(0));
    for log in [first_log, second_log] {
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(
            !log.contains(PASSWORD),
            "the password is never logged:\n{log}"
        );
    }
}

/// What a test under load over SASL_SSL starts from: `topic` with so many partitions and `dlq`
/// made, the fixtures (valid and invalid) it produces, a directory holding the password's mounted
/// file and the blob directory.
async fn under_load(
    base: &ClientConfig,
    topic: &str,
    partitions: i32,
    dlq: &str,
) -> (
    Vec<Vec<u8>>,
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    create_topic_on(base, topic, partitions).await;
    create_topic_on(base, dlq, 1).await;
    let files = [small_fixtures(true), small_fixtures(false)].concat();
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let blob_dir = dir.path().join("blobs");
    (files, dir, password_file, blob_dir)
}

/// The SASL password rotated under a running service (the broker takes only the new one after a
/// restart): each client keeps the password it read at start, and every reconnect is refused.
/// While the mounted file is unchanged the pod stays live (a restart would be refused too);
/// once it holds the new password, liveness fails on refusals that have lasted
/// `--kafka-refused-timeout-ms` (before, it stayed green while nothing was consumed or written,
/// for good), `/status` says why, and the restart consumes what came meanwhile and commits it.
/// The password is in no line.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn a_password_rotated_under_the_service_fails_liveness_and_the_restart_takes_the_new_one() {
    const ROTATED: &str = "r0tated-sasl-password";
    let mut broker = SecureBroker::start(USER, PASSWORD);
    let base = admin(&broker);
    let (topic, dlq) = (unique("rec"), unique("dlq"));
    create_topic_on(&base, &topic, 1).await;
    create_topic_on(&base, &dlq, 1).await;
    let files = small_fixtures(true);
    let batch = |n| batch_of(&files, n);
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let blob_dir = dir.path().join("blobs");
    let args = service_args(
        &broker,
        "SASL_PLAINTEXT",
        &topic,
        &dlq,
        &blob_dir,
        &[
            "--kafka-security-protocol",
            "SASL_PLAINTEXT",
            "--kafka-sasl-mechanism",
            "PLAIN",
            "--kafka-sasl-username",
            USER,
            "--kafka-sasl-password-file",
            password_file.to_str().unwrap(),
            "--kafka-refused-timeout-ms",
            "4000",
        ],
    );
    let group = args[args.iter().position(|a| a == "--group-id").unwrap() + 1].clone();
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&args, &log);
    let (_, mut sent) = produce_values_with(&producer_on(&base), &topic, batch(0)).await;
    let first = outcomes(&sent).0;
    wait_for("the first batch's blobs", Duration::from_secs(60), || {
        blobs_under(&blob_dir) == first
    })
    .await;
    assert_eq!(service.probe("/health/live"), Some(200));

    broker.rotate_plain_password(USER, ROTATED);
    let (_, meanwhile) = produce_values_with(&producer_on(&base), &topic, batch(1)).await;
    sent.extend(meanwhile);
    // Refused past the timeout, the mounted file unchanged: a restart would be refused too (a
    // broker's own trouble, a password changed on the brokers alone), so the pod stays live.
    let refused_for = |status: &serde_json::Value| {
        let run = &status["kafka_refused"];
        run["last_ms"].as_u64().unwrap_or(0) - run["since_ms"].as_u64().unwrap_or(0)
    };
    wait_for(
        "refusals for longer than the timeout",
        Duration::from_secs(90),
        || service.status().is_some_and(|s| refused_for(&s) > 6_000),
    )
    .await;
    let status = service.status().unwrap();
    assert_eq!(status["kafka_credentials_changed"], false, "{status}");
    assert_eq!(service.probe("/health/live"), Some(200), "{status}");
    assert!(
        status["kafka_refused"]["last_reason"]
            .as_str()
            .is_some_and(|r| r.contains("Authentication")),
        "{status}"
    );

    // The kubelet updates the mounted file: liveness fails, and the restart reads it.
    std::fs::write(&password_file, format!("{ROTATED}\n")).unwrap();
    wait_for(
        "liveness to fail on the refused login",
        Duration::from_secs(30),
        || service.probe("/health/live") == Some(503),
    )
    .await;
    assert_eq!(blobs_under(&blob_dir), first, "nothing consumed meanwhile");
    service.terminate();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("liveness fails: the brokers have refused this process's Kafka credentials"),
        "{said}"
    );

    let restarted_log = dir.path().join("restarted.log");
    let restarted = Service::start_logging_to(&args, &restarted_log);
    let (blobs, _) = outcomes(&sent);
    wait_for(
        "every blob, those of the rotation's batch too",
        Duration::from_secs(60),
        || blobs_under(&blob_dir) == blobs,
    )
    .await;
    let end = high_watermarks_on(&base, &topic, 1);
    wait_for(
        "the group commits to the end",
        Duration::from_secs(60),
        || committed_on(&base, &group, &topic, 1) == end,
    )
    .await;
    assert_eq!(restarted.probe("/health/live"), Some(200));
    assert_eq!(restarted.terminate(), Some(0));
    for log in [&log, &restarted_log] {
        let said = std::fs::read_to_string(log).unwrap();
        assert!(
            !said.contains(PASSWORD) && !said.contains(ROTATED),
            "no password is logged:\n{said}"
        );
    }
}

/// A wrong password, and a broker certificate another CA signed: the startup check stops the
/// service with one error line naming what to fix (before: waited on for ever as "not
/// reachable yet"), before it joins the group, the password in no line.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn a_wrong_password_or_an_untrusted_certificate_stops_the_service_naming_the_fix() {
    let broker = SecureBroker::start(USER, PASSWORD);
    let (topic, dlq) = (unique("rec"), unique("dlq"));
    create_topic_on(&admin(&broker), &topic, 1).await;
    create_topic_on(&admin(&broker), &dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password-9c1e").unwrap();
    let other_ca = TestCa::new();
    let (ca, other) = (broker.ca.ca_file(), other_ca.ca_file());
    let cases: [(&str, Vec<&str>, &str); 3] = [
        (
            "SASL_SSL",
            vec![
                "--kafka-sasl-mechanism",
                "SCRAM-SHA-512",
                "--kafka-sasl-username",
                USER,
                "--kafka-ssl-ca-location",
                ca.to_str().unwrap(),
            ],
            "the brokers refused the login",
        ),
        (
            "SASL_PLAINTEXT",
            vec![
                "--kafka-sasl-mechanism",
                "PLAIN",
                "--kafka-sasl-username",
                USER,
            ],
            "the brokers refused the login",
        ),
        (
            "SSL",
            vec!["--kafka-ssl-ca-location", other.to_str().unwrap()],
            "TLS with the brokers failed",
        ),
    ];
    for (listener, flags, says) in cases {
        let mut security = vec![
            "--kafka-security-protocol",
            listener,
            "--sink-timeout-ms",
            "3000",
        ];
        security.extend(flags);
        if listener != "SSL" {
            security.extend(["--kafka-sasl-password-file", wrong.to_str().unwrap()]);
        }
        let log = dir.path().join(format!("{listener}.log"));
        let args = service_args(
            &broker,
            listener,
            &topic,
            &dlq,
            &dir.path().join("b"),
            &security,
        );
        let exit = Service::start_logging_to(&args, &log)
            .exit_within(Duration::from_secs(60))
            .await;
        let logs = std::fs::read_to_string(&log).unwrap();
        assert_eq!(exit, Some(1), "{listener}: {logs}");
        // The service's own verdict (librdkafka logs each refused connection beside it).
        let errors: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("ERROR replay_ingest:"))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{listener}: one error line of the service's:\n{logs}"
        );
        assert!(errors[0].contains(says), "{listener}: {}", errors[0]);
        assert!(
            !logs.contains("not-the-password-9c1e") && !logs.contains("partitions assigned"),
            "{logs}"
        );
    }
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
    assert!(
        text.contains("REPLAY_INGEST_KAFKA_SASL_PASSWORD")
            && text.contains("REPLAY_INGEST_KAFKA_PROPERTIES")
    );
    assert!(!text.contains("hunter2"), "{text}");

    // A secret flag on the command line is refused (it shows in `ps`), naming the variable; the
    // same value from the environment is taken (above, and in every test with a password).
    for (command, flag) in [
        ("consume", "--kafka-sasl-password"),
        ("check-config", "--kafka-sasl-password"),
        ("consume", "--clickhouse-password"),
        ("migrate", "--clickhouse-password"),
    ] {
        let joined = format!("{flag}=hunter2-flag");
        for args in [&[command, flag, "hunter2-flag"][..], &[command, &joined]] {
            let refused = run(args, "");
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert_eq!(refused.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("on the command line shows in `ps`"),
                "{stderr}"
            );
            assert!(!stderr.contains("hunter2"), "{stderr}");
        }
    }

    for properties in ["sasl.password=hunter2-property", "hunter2-property"] {
        let refused = run(&["consume", "--blob-sink", "null"], properties);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(stderr.contains("Kafka property"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn clickhouse_over_https_trusts_the_ca_ssl_cert_file_names_and_refuses_any_other() {
    let _stack = uses_stack().await;
    let ca = TestCa::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let https_port = listener.local_addr().unwrap().port();
    let clickhouse_port: u16 = clickhouse_url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let handshakes = ca.proxy(listener, clickhouse_port);
    let table = unique("https").replace('-', "_");
    // The local server's `default` user has no password: one is given only where the attempt
    // fails first, to check that the failure does not show it.
    let migrate = |trust: &Path, password: &str| {
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .args([
                "migrate",
                "--clickhouse-url",
                &format!("https://127.0.0.1:{https_port}"),
            ])
            .args([
                "--clickhouse-database",
                "replay_ingest_e2e",
                "--clickhouse-table",
                &table,
            ])
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
    assert!(
        stderr.contains("certificate"),
        "the error names the certificate: {stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");

    let trusted = migrate(&ca.ca_file(), "");
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    assert!(
        handshakes.load(Ordering::Relaxed) >= 1,
        "the trusted attempt went through TLS"
    );
    // The table the HTTPS connection created is there, seen over plain HTTP.
    assert!(clickhouse_rows(&table).await.is_empty());
}
