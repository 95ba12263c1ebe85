//! Startup checks with the real service and stack (`scripts/stack.sh up`): a missing bucket or
//! topic stops the service before it joins the group, with a message naming it.

use std::time::Duration;

use crate::support::*;

/// Starts the service with `args` and returns its exit code and log once it stops on its own.
async fn run_until_exit(args: &[String]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let exit = Service::start_logging_to(args, &log)
        .exit_within(Duration::from_secs(60))
        .await;
    (exit, std::fs::read_to_string(&log).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_missing_bucket_stops_the_service_naming_it_before_anything_is_consumed() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    produce_fixtures(&names.topic, &all_fixtures(), 3).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = unique("no-such-bucket");
    let (exit, log) = run_until_exit(&with_flag(
        names.args(free_port(), dir.path()),
        "--gcs-bucket",
        &missing,
    ))
    .await;
    assert_eq!(exit, Some(1), "{log}");
    assert!(
        log.contains("checking the GCS bucket") && log.contains(&missing),
        "{log}"
    );
    assert!(
        !log.contains("partitions assigned"),
        "stopped before joining the group:\n{log}"
    );
    assert!(committed(&names.group, &names.topic, 2).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_missing_topic_stops_the_service_naming_it() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--dlq-topic", "--outcomes-topic", "--topic"] {
        let missing = unique("no-such-topic");
        let (exit, log) = run_until_exit(&with_flag(
            names.args(free_port(), dir.path()),
            flag,
            &missing,
        ))
        .await;
        assert_eq!(exit, Some(1), "{flag}: {log}");
        assert!(
            log.contains(&format!("topics missing on the cluster: {missing}")),
            "{flag}: {log}"
        );
        assert!(
            !log.contains("partitions assigned"),
            "{flag}: stopped before joining the group:\n{log}"
        );
    }
}

/// A session timeout the group coordinator refuses (below the broker's
/// `group.min.session.timeout.ms`, 1 s on the local broker) stops the service, naming the flag.
/// Before, librdkafka retried the join every two seconds for ever and the service, ready, only
/// logged a warning each time: it consumed nothing, seen only as lag from outside.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_session_timeout_the_brokers_refuse_stops_the_service_naming_the_flag() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    produce_fixtures(&names.topic, &all_fixtures(), 3).await;
    let dir = tempfile::tempdir().unwrap();
    let args = with_flag(
        names.args(free_port(), dir.path()),
        "--session-timeout-ms",
        "500",
    );
    let (exit, log) = run_until_exit(&with_flag(args, "--drain-deadline-ms", "100")).await;
    assert_eq!(exit, Some(1), "{log}");
    assert!(
        log.contains("the brokers refuse this member")
            && log.contains("Invalid session timeout")
            && log.contains("`--session-timeout-ms`"),
        "{log}"
    );
    assert!(committed(&names.group, &names.topic, 2).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_every_destination_in_place_the_checks_pass_having_written_the_probe_object() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&names.args(free_port(), dir.path()));
    wait_for("ready", Duration::from_secs(60), || {
        service.status().is_some_and(|s| s["ready"] == true)
    })
    .await;
    assert_eq!(
        read_object(&names.bucket, replay_ingest::sink::gcs::PROBE_KEY).await,
        b"written by replay-ingest at startup to check write access\n"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// `--statsd-prefix ""` sends the metrics' names bare, as the chart's monitors then watch them
/// (the exporter, given the empty prefix, sent `.consumer.lag`, `.sink.outage_ms`, …).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_empty_metric_prefix_sends_bare_names() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    let mut args = names.args(statsd.port(), dir.path());
    args.extend(["--statsd-prefix".to_owned(), String::new()]);
    let service = Service::start(&args);
    wait_for("ready", Duration::from_secs(60), || {
        service.status().is_some_and(|s| s["ready"] == true)
    })
    .await;
    let mut seen = std::collections::BTreeSet::new();
    wait_for("the group's gauge sent", Duration::from_secs(30), || {
        seen.extend(statsd.read_now().seen);
        seen.contains("consumer.out_of_group_ms")
    })
    .await;
    assert!(
        seen.iter()
            .all(|name| !name.starts_with('.') && !name.starts_with("replay_ingest")),
        "{seen:?}"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// Refused ClickHouse credentials are a configuration error: the service exits at once with one
/// line that names the flags to fix and does not show the password (before: waited on for ever
/// as "not reachable yet"). The same for `migrate`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn refused_clickhouse_credentials_stop_the_service_naming_the_flags() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("clickhouse-password");
    std::fs::write(&secret, "not-the-password-7f3a").unwrap();
    let mut args = names.args(free_port(), dir.path());
    args.extend([
        "--clickhouse-password-file".to_owned(),
        secret.to_string_lossy().into_owned(),
    ]);
    let (exit, log) = run_until_exit(&args).await;
    assert_eq!(exit, Some(1), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("an error line: {log}"));
    assert!(
        line.contains("authentication as \"default\" failed")
            && line.contains("--clickhouse-password-file"),
        "{line}"
    );
    assert!(
        !log.contains("not reachable yet") && !log.contains("not-the-password-7f3a"),
        "{log}"
    );
    assert_eq!(
        line.matches("Code: 193").count() + line.matches("Code: 516").count(),
        1,
        "said once: {line}"
    );

    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args([
            "migrate",
            "--clickhouse-url",
            &clickhouse_url(),
            "--clickhouse-password-file",
        ])
        .arg(&secret)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&migrate.stderr);
    assert!(
        !migrate.status.success() && stderr.contains("--clickhouse-password-file"),
        "{stderr}"
    );
}

/// A bucket holding blobs under a retention prefix that no lifecycle rule expires (the emulator
/// keeps no lifecycle rules at all) is warned of at startup, once per prefix, and the service
/// starts as usual.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn blobs_no_lifecycle_rule_expires_are_warned_of_and_the_service_starts() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let gcs = gcs_store(&names.bucket, 1).await;
    for key in ["30/42/aaaa/0", "90/42/bbbb/0"] {
        gcs.put(key, b"x").await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&names.args(free_port(), dir.path()), &log);
    wait_for("ready and warned", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        service.status().is_some_and(|s| s["ready"] == true)
            && text.matches("no lifecycle rule").count() == 2
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("prefix=30/") && text.contains("prefix=90/"),
        "{text}"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// A stop asked for while the service is still starting (here: no broker answers) is a clean
/// exit. Before, the signal handlers were installed only once consuming began, and SIGTERM in
/// between killed the process by the default action (exit by signal, 143 from a shell).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_stop_during_startup_is_a_clean_exit() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = service_args("t", "t-dlq", "g", dir.path(), free_port());
    let brokers = args.iter().position(|a| a == "--brokers").unwrap() + 1;
    args[brokers] = closed.to_string();
    let service = Service::start(&args);
    wait_for("the health endpoint", Duration::from_secs(30), || {
        service.status().is_some()
    })
    .await;
    assert_eq!(
        service.status().unwrap()["initialised"],
        false,
        "still starting when the stop comes"
    );
    assert_eq!(service.terminate(), Some(0));
}

/// The brokers unreachable at start, so the topics' checks go on in the background, and a topic
/// missing once they answer: the service stops, naming it. No sink writes to the consumed topic,
/// so nothing waited on that check: the service stayed ready, in its group, consuming nothing,
/// for ever. The dead-letter topic is written only when a message is rejected: the service ran
/// on without it until then, hours later perhaps.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_topic_found_missing_once_the_brokers_answer_stops_the_service() {
    let _stack = uses_stack().await;
    for missing_one in ["--topic", "--dlq-topic"] {
        let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
        let (missing, describes) = match missing_one {
            "--topic" => (&topic, "checking the consumed topic"),
            _ => (&dlq, "checking the Kafka topics"),
        };
        for made in [&topic, &dlq].into_iter().filter(|t| *t != missing) {
            create_topic(made, 1).await;
        }
        let broker_port = brokers().rsplit(':').next().unwrap().parse().unwrap();
        let relay = relay::Relay::start(broker_port).await;
        relay.cut();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("service.log");
        let args = with_flag(
            service_args(&topic, &dlq, &group, dir.path(), free_port()),
            "--brokers",
            &relay.address(),
        );
        let service = Service::start_logging_to(&args, &log);
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        // Both topics' first tries (the consumed topic's, then the dead-letter sink's) given up:
        // each is checked again in the background.
        wait_for(
            "the topics' checks waiting for the brokers",
            Duration::from_secs(60),
            || {
                said()
                    .matches("not reachable yet; joining the group anyway")
                    .count()
                    >= 2
            },
        )
        .await;
        relay.restore();
        let exit = service.exit_within(Duration::from_secs(90)).await;
        let said = said();
        assert_eq!(exit, Some(1), "{missing_one}: {said}");
        assert!(
            said.contains(describes) && said.contains(missing.as_str()),
            "{missing_one}: {said}"
        );
    }
}

/// With credentials from the metadata server (GKE Workload Identity), building the GCS client
/// asks it for the universe domain over a connection without a deadline. A metadata server that
/// accepts and never answers hung the start for good (the liveness probe restarting the pod into
/// the same hang), then, bounded, stopped it: a crash loop whose backoff outlasted the metadata
/// server's return. Now the pod starts, live and consuming, not ready, the metadata server named;
/// once it answers, the GCS check passes, the pod turns ready and everything commits.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_metadata_server_that_does_not_answer_at_start_is_waited_for_unready() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let metadata = metadata::MetadataServer::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let mut args = metadata::without_anonymous_gcs(names.args(free_port(), dir.path()));
    args.extend(["--sink-timeout-ms".into(), "2000".into()]);
    let service = Service::start_configured(&args, |command| {
        metadata.credentials_for(command);
        command.stderr(std::fs::File::create(&log).unwrap());
    });
    let (sent, _) = produce_fixtures(&names.topic, &small_fixtures(true), 3).await;
    wait_for(
        "consuming, waiting for the metadata server",
        Duration::from_secs(60),
        || {
            service
                .status()
                .is_some_and(|s| s["consumed"] == 3 && s["unchecked"] == serde_json::json!(["gcs"]))
        },
    )
    .await;
    let status = service.status().unwrap();
    assert_eq!(
        (&status["ready"], &status["live"]),
        (&false.into(), &true.into())
    );
    assert!(committed(&names.group, &names.topic, 2).is_empty());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("no universe domain from the metadata server")
            && said.contains("no access token within 1s (the metadata server does not answer?)"),
        "{said}"
    );

    metadata.hang(false);
    wait_for("ready once a token comes", Duration::from_secs(60), || {
        service.probe("/health/ready") == Some(200)
    })
    .await;
    wait_for("everything committed", Duration::from_secs(60), || {
        committed(&names.group, &names.topic, 2) == expected_commits(&sent)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
}

/// `check-config` says what `consume` warns of at its start: a password it would send in the
/// clear passed the pre-rollout check without a word.
#[test]
fn check_config_warns_of_a_password_sent_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret").unwrap();
    let (code, said) = run_tool_for_status(
        "check-config",
        [
            "--gcs-bucket",
            "replays",
            "--clickhouse-url",
            "http://clickhouse.example:8123",
            "--clickhouse-password-file",
            password.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("warning: the ClickHouse password crosses the network in clear text"),
        "{said}"
    );
    assert!(!said.contains("s3cret"), "{said}");
}
