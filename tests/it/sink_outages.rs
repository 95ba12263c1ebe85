//! Outages of the sinks other than ClickHouse (tests/it/clickhouse_faults.rs), with the real service
//! and stack: the blob store hangs (fake-gcs-server under SIGSTOP: it accepts connections and
//! never answers), the broker hangs while a flush delivers events or dead letters, and a
//! destination topic is deleted under the running service (once it is created again, the
//! service stops to start again with new clients: `kafka::topic_id`). Each is ridden out: the flush is retried, nothing is committed past it, and once the sink is back
//! everything lands: blobs exactly, Kafka deliveries at least once (one that timed out in the hang
//! may still be written when the broker resumes, beside its retry). That a first-replay event is
//! marked as sent only once delivered is a unit test in src/sink/events.rs (here the timed-out
//! delivery itself usually lands). Hanging the shared emulator or broker must not disturb other
//! tests: the tests that do hold `stops_stack()`, so no other stack test runs meanwhile.

use std::time::Duration;

use crate::support::*;
use replay_ingest::recording::{self, Limits};

/// Hangs a stack service (`gcs`, `kafka`) with SIGSTOP; resumed when dropped, so that a failing
/// test does not leave it hung for the tests after it.
struct Hung(&'static str);

impl Hung {
    fn begin(service: &'static str) -> Hung {
        assert!(signal_stack(service, "-STOP"), "SIGSTOP to {service}");
        Hung(service)
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        signal_stack(self.0, "-CONT");
    }
}

/// Service flags for `names` with every real sink, one-second sink requests and DogStatsD on
/// `statsd`.
fn args(names: &Names, statsd: &Statsd, dir: &std::path::Path) -> Vec<String> {
    with_flag(
        names.args(statsd.port(), dir),
        "--flush-max-backoff-ms",
        "200",
    )
    .into_iter()
    .chain(["--sink-timeout-ms", "1000"].map(String::from))
    .collect()
}

/// The service started with `args`, one blob upload at a time and a flush stall of `stall_ms`,
/// once its partitions are assigned.
async fn uploading_one_at_a_time(mut args: Vec<String>, stall_ms: &str) -> Service {
    args.extend(
        [
            "--flush-stall-timeout-ms",
            stall_ms,
            "--gcs-upload-concurrency",
            "1",
        ]
        .map(String::from),
    );
    assigned(Service::start(&args)).await
}

/// `service`, once its partitions are assigned.
async fn assigned(service: Service) -> Service {
    wait_assigned(&service).await;
    service
}

/// Until `service` has partitions assigned.
async fn wait_assigned(service: &Service) {
    wait_for("partitions assigned", JOIN_AND_FLUSH, || {
        service.status().is_some_and(|s| s["assigned"] == true)
    })
    .await;
}

/// `args` with each of `flags` set to its value ([`with_flag`]).
fn with_flags(args: Vec<String>, flags: &[(&str, &str)]) -> Vec<String> {
    flags
        .iter()
        .fold(args, |args, (flag, value)| with_flag(args, flag, value))
}

/// Waits until the service has consumed `consumed` messages and failed `sink`'s writes at least
/// `attempts` times, then checks that the broker's commits have not moved from `commits`.
async fn riding_out(
    service: &Service,
    names: &Names,
    sink: &str,
    consumed: u64,
    commits: &std::collections::BTreeMap<i32, i64>,
) {
    wait_for(
        &format!("{consumed} consumed and the {sink} sink failing"),
        JOIN_AND_FLUSH,
        || {
            service.status().is_some_and(|s| {
                s["consumed"].as_u64() >= Some(consumed)
                    && s["outages"][sink]["failed_attempts"].as_u64() >= Some(3)
            })
        },
    )
    .await;
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        *commits,
        "nothing committed during the {sink} outage"
    );
    assert!(
        service.status().unwrap()["live"] == true,
        "waiting out an outage is not a wedged process"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_hung_blob_store_is_ridden_out_and_every_blob_lands() {
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let service = Service::start(&args(&names, &statsd, dir.path()));
    let fixtures = small_fixtures(true);
    let (first, first_sent) = produce_fixtures(&names.topic, &fixtures, 10).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&first)
    })
    .await;

    let hung = Hung::begin("gcs");
    let (second, second_sent) = produce_fixtures(&names.topic, &fixtures, 10).await;
    riding_out(&service, &names, "gcs", 20, &expected_commits(&first)).await;
    drop(hung);

    let mut target = expected_commits(&first);
    target.extend(expected_commits(&second));
    wait_for(
        "everything committed once GCS answers",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == target,
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    every_blob_in_gcs(&names.bucket, first_sent.iter().chain(&second_sent)).await;
    let metrics = statsd.read();
    let retries = metrics
        .counters
        .get("replay_ingest.flush.retries|sink:gcs")
        .copied()
        .unwrap_or(0.0);
    assert!(
        retries >= 3.0,
        "flush.retries counts the timed-out attempts: {retries}"
    );
}

/// The probes over HTTP through an outage and a shutdown behind it: live and ready while a flush
/// retries against a hung blob store (an outage is not a wedged process, and the member keeps its
/// partitions); on SIGTERM, not ready while draining, still live; the drain gives up once the
/// flush has failed for a whole drain deadline (it was failing before the SIGTERM, so that comes
/// before the deadline), and the service exits 1 saying so, without committing what it could not
/// write. (A shutdown's drain used to wait out its whole deadline behind an outage, and leave
/// nothing of it to leave the group in.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn probes_through_an_outage_and_a_shutdown_that_gives_up_on_it() {
    const DRAIN: Duration = Duration::from_secs(8);
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let args = with_flag(
        args(&names, &statsd, dir.path()),
        "--session-timeout-ms",
        "10000",
    );
    let args = with_flag(args, "--drain-deadline-ms", &DRAIN.as_millis().to_string());
    let log = dir.path().join("service.log");
    let service = assigned(Service::start_logging_to(&args, &log)).await;
    let probe = |path: &str| service.get(path).map(|(code, _)| code);
    assert_eq!(
        (probe("/health/live"), probe("/health/ready")),
        (Some(200), Some(200))
    );

    let hung = Hung::begin("gcs");
    produce_fixtures(&names.topic, &small_fixtures(true), 5).await;
    riding_out(&service, &names, "gcs", 5, &Default::default()).await;
    assert_eq!(
        (probe("/health/live"), probe("/health/ready")),
        (Some(200), Some(200)),
        "an outage ridden out is neither a restart nor a reason to leave the load balancer"
    );
    let failing_since = service.status().unwrap()["outages"]["gcs"]["since_ms"]
        .as_u64()
        .unwrap();

    service.signal_term();
    wait_for("not ready while draining", Duration::from_secs(3), || {
        probe("/health/ready") == Some(503)
    })
    .await;
    assert_eq!(probe("/health/live"), Some(200), "draining is not wedged");
    assert_eq!(
        service.exit_within(Duration::from_secs(30)).await,
        Some(1),
        "a drain that gives up exits 1"
    );
    let exited_ms = now_ms();
    drop(hung);
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("drain gave up: every flush left had been failing for longer than the drain deadline (gcs failing for"),
        "{logs}"
    );
    assert!(
        exited_ms - failing_since >= DRAIN.as_millis() as u64,
        "it gave up once the flush had failed for a whole drain deadline"
    );
    assert!(
        committed(&names.group, &names.topic, 2).is_empty(),
        "nothing committed of what was not written"
    );
}

/// A flush started while another retries through an outage fails with it from the outage's
/// start: a shutdown right after it gives up on both at once. (Its first attempt against the
/// hung store had to end — a whole `--sink-timeout-ms` — before the drain knew it was failing,
/// so the drain waited out its deadline behind an outage it already knew of; so did a revoke's,
/// behind the rest of a write a revoke had shrunk.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_flush_started_during_an_outage_does_not_hold_a_shutdown_until_its_first_attempt_ends() {
    const DRAIN_MS: u64 = 4000;
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let mut args = with_flags(
        args(&names, &statsd, dir.path()),
        &[
            ("--sink-timeout-ms", "10000"),
            ("--session-timeout-ms", "10000"),
            ("--drain-deadline-ms", &DRAIN_MS.to_string()),
        ],
    );
    args.extend(["--max-flushes-in-flight", "2"].map(String::from));
    let log = dir.path().join("service.log");
    let service = assigned(Service::start_logging_to(&args, &log)).await;

    let hung = Hung::begin("gcs");
    produce_fixtures(&names.topic, &small_fixtures(true), 5).await;
    wait_for("the first flush failing", JOIN_AND_FLUSH, || {
        service
            .status()
            .is_some_and(|s| s["outages"]["gcs"]["failed_attempts"].as_u64() >= Some(1))
    })
    .await;
    produce_fixtures(&names.topic, &small_fixtures(true), 5).await;
    wait_for("a second flush started", JOIN_AND_FLUSH, || {
        service
            .status()
            .is_some_and(|s| s["flushes_in_flight"].as_u64() == Some(2))
    })
    .await;
    // The outage has lasted a drain deadline; the second flush's first attempt, started in it,
    // still waits on the hung store.
    let since = service.status().unwrap()["outages"]["gcs"]["since_ms"]
        .as_u64()
        .unwrap();
    wait_for("the outage a drain deadline long", JOIN_AND_FLUSH, || {
        now_ms() >= since + DRAIN_MS + 500
    })
    .await;
    service.signal_term();
    assert_eq!(service.exit_within(Duration::from_secs(30)).await, Some(1));
    drop(hung);
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("drain gave up: every flush left had been failing for longer than the drain deadline (gcs failing for"),
        "{logs}"
    );
    assert!(!logs.contains("drain did not finish within"), "{logs}");
    assert!(committed(&names.group, &names.topic, 2).is_empty());
}

/// A second SIGTERM (or Ctrl-C) while the first one's drain waits on an outage exits at once,
/// saying so, with nothing more committed. (It was ignored: the drain, the close and the last
/// metrics interval took their whole time.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_second_stop_signal_during_the_drain_exits_at_once() {
    const DRAIN: Duration = Duration::from_secs(20);
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let args = with_flags(
        args(&names, &statsd, dir.path()),
        &[
            ("--session-timeout-ms", "30000"),
            ("--drain-deadline-ms", &DRAIN.as_millis().to_string()),
        ],
    );
    let log = dir.path().join("service.log");
    let service = assigned(Service::start_logging_to(&args, &log)).await;
    let hung = Hung::begin("gcs");
    produce_fixtures(&names.topic, &small_fixtures(true), 5).await;
    riding_out(&service, &names, "gcs", 5, &Default::default()).await;
    service.signal_term();
    wait_for("draining", Duration::from_secs(5), || {
        service.status().is_some_and(|s| s["stopping"] == true)
    })
    .await;
    service.signal_term();
    // Far less than what the drain had left.
    assert_eq!(service.exit_within(DRAIN / 2).await, Some(1));
    drop(hung);
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("a second stop signal: exiting at once"),
        "{logs}"
    );
    assert!(committed(&names.group, &names.topic, 2).is_empty());
}

/// Now, in ms since the Unix epoch (as `/status` gives its instants).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Produces `messages`, waits until the service has consumed them, then hangs the broker before
/// their flush (buffers close after 3 s here) until `sink` has failed twice: the flush's Kafka
/// deliveries time out and are retried. The session (10 s) outlives the hang, so the member keeps
/// its partitions. Returns the produce report and what was sent.
async fn broker_hung_around_the_flush(
    service: &Service,
    names: &Names,
    messages: &[Vec<u8>],
    sink: &str,
) -> (crate::support::load::Produced, Vec<Sent>) {
    wait_assigned(service).await;
    let (report, sent) = produce_fixtures(&names.topic, messages, messages.len() as u64).await;
    wait_for("the messages consumed", JOIN_AND_FLUSH, || {
        service
            .status()
            .is_some_and(|s| s["consumed"].as_u64() >= Some(messages.len() as u64))
    })
    .await;
    let hung = Hung::begin("kafka");
    wait_for(
        &format!("the {sink} sink failing while the broker hangs"),
        Duration::from_secs(30),
        || {
            service
                .status()
                .is_some_and(|s| s["outages"][sink]["failed_attempts"].as_u64() >= Some(2))
        },
    )
    .await;
    drop(hung);
    wait_for(
        "everything committed once the broker answers",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == expected_commits(&report),
    )
    .await;
    (report, sent)
}

/// One broker-hang run: the service with every real sink, a session that outlives the hang and
/// buffers that close after 3 s (so the hang begins before the flush); `messages` produced and
/// flushed around the hang; the service stopped cleanly. Returns the names and what was sent.
async fn broker_hang_run(messages: &[Vec<u8>], sink: &str) -> (Names, Vec<Sent>) {
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let args = with_flag(
        args(&names, &statsd, dir.path()),
        "--session-timeout-ms",
        "10000",
    );
    let args = with_flag(
        with_flag(args, "--drain-deadline-ms", "8000"),
        "--buffer-max-age-ms",
        "3000",
    );
    let service = Service::start(&args);
    let (_, sent) = broker_hung_around_the_flush(&service, &names, messages, sink).await;
    assert_eq!(service.terminate(), Some(0));
    (names, sent)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_events_outage_is_ridden_out_and_every_event_lands() {
    let _stack = stops_stack().await;
    // Valid segments only, so that nothing goes to the dead-letter topic: the events write is the
    // one that fails.
    let (names, sent) = broker_hang_run(&small_fixtures(true), "events").await;

    // At least once: a delivery that timed out in the hang may still reach the topic when the
    // broker resumes, beside its retry (docs/architecture.md, "Guarantees").
    let announced = read_messages(&names.analytics, 1, Duration::from_secs(30));
    assert!(
        !announced.is_empty(),
        "the first-replay event is sent after the outage"
    );
    assert!(
        announced
            .iter()
            .all(|m| m.key.as_deref() == Some(&b"42"[..])),
        "keyed by its project"
    );
    let segment_0s = sent
        .iter()
        .filter_map(|s| recording::process(&s.value, &Limits::default()).ok())
        .filter(|p| p.ids.segment_id == 0)
        .count();
    assert!(segment_0s > 0);
    let outcomes: std::collections::BTreeSet<Vec<u8>> =
        read_messages(&names.outcomes, segment_0s, Duration::from_secs(30))
            .into_iter()
            .map(|m| m.value)
            .collect();
    assert_eq!(outcomes.len(), segment_0s, "an outcome for every segment 0");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_dead_letter_outage_is_ridden_out_and_every_dead_letter_lands() {
    let _stack = stops_stack().await;
    let (names, sent) = broker_hang_run(&small_fixtures(false), "dlq").await;

    // At least once: the deliveries that timed out in the hang reach the topic when the broker
    // resumes, beside their retries (docs/architecture.md, "Guarantees"); none is lost.
    let (_, dead) = outcomes(&sent);
    let got = read_dlq(
        &names.dlq,
        &names.topic,
        &originals(&sent),
        dead.len(),
        Duration::from_secs(30),
    );
    assert_eq!(
        got.into_iter().collect::<std::collections::BTreeSet<_>>(),
        dead,
        "every dead letter, after the outage"
    );
}

/// A container's soft limit of open file descriptors is often far below its hard one: the service
/// raises it to the hard one at start, so that the sinks' pools, the Kafka clients and the probe
/// server do not run out early.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_soft_limit_of_open_files_is_raised_to_the_hard_one() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let service = Service::start_with_fd_limits(&args(&names, &statsd, dir.path()), 256, 4096);
    wait_for("ready", JOIN_AND_FLUSH, || {
        service.probe("/health/ready") == Some(200)
    })
    .await;
    assert_eq!(service.fd_limits(), (4096, 4096));
    assert_eq!(service.terminate(), Some(0));
}

/// A flood of idle and half-sent connections against the probe port of a service whose file
/// descriptors are limited to 1 024, soft and hard (it cannot raise them): 10 000 connections
/// opened as fast as loopback allows and held open, half of them idle, half stopping mid-header.
/// With the flood held open the probes answer within a second, and ingestion goes on throughout:
/// every message's blob reaches GCS and everything commits. (With no connection cap or header
/// timeout — `axum::serve` — the descriptors run out: caught, the probes time out.) Probes sent
/// while the flood is still connecting are counted, not asserted: a listen queue that a tight
/// loop fills drops SYNs for any server.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_connection_flood_on_the_probe_port_takes_no_descriptor_the_sinks_need() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let service = assigned(Service::start_with_fd_limits(
        &args(&names, &statsd, dir.path()),
        1024,
        1024,
    ))
    .await;

    let port = service.port;
    let flood = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut held = Vec::new();
        for i in 0..10_000 {
            let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            if i % 2 == 1 {
                let _ = stream.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            }
            held.push(stream);
        }
        held
    });
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 200).await;
    let (mut probes, mut unanswered) = (0, 0);
    while !flood.is_finished() {
        probes += 1;
        unanswered += usize::from(service.probe("/health/live") != Some(200));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = flood.await.unwrap();
    assert!(
        held.len() >= 9_000,
        "the flood opened {} connections",
        held.len()
    );
    let mut held_open = Probes::default();
    for _ in 0..20 {
        service.probe_into(&mut held_open, "/health/live", "the flood held open");
        service.probe_into(&mut held_open, "/health/ready", "the flood held open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held_open.assert_healthy();
    wait_for(
        "everything committed with the flood held open",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == expected_commits(&report),
    )
    .await;
    drop(held);
    assert_eq!(service.terminate(), Some(0));
    every_blob_in_gcs(&names.bucket, &sent).await;
    println!("probes while the flood connected: {probes}, unanswered within 1 s: {unanswered}");
}

/// A blob store hung for longer than the stall timeout (here 20 s against 9 s, the least a
/// one-second sink timeout allows; in production a 30-minute hang against 300 s): each attempt ends once as many uploads as run at a time have
/// timed out, and is retried after a backoff, so the service stays live the whole time, shows the
/// outage from the first failed request, commits nothing, and lands every blob when the store
/// answers again. That an attempt outlasting the stall keeps it live is the next test's.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_blob_store_hung_past_the_stall_timeout_leaves_the_service_live() {
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let args = with_flag(
        args(&names, &statsd, dir.path()),
        "--buffer-max-age-ms",
        "3000",
    );
    let service = uploading_one_at_a_time(args, "9000").await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 40).await;
    wait_for("the messages consumed", JOIN_AND_FLUSH, || {
        service
            .status()
            .is_some_and(|s| s["consumed"].as_u64() >= Some(40))
    })
    .await;
    let hung = Hung::begin("gcs");
    let started = std::time::Instant::now();
    let (mut outage_seen, mut probes) = (None, Probes::default());
    while started.elapsed() < Duration::from_secs(20) {
        let into = format!("{:?} into the hang", started.elapsed());
        service.probe_into(&mut probes, "/health/live", &into);
        if outage_seen.is_none()
            && service
                .status()
                .is_some_and(|s| s["outages"]["gcs"]["since_ms"].is_u64())
        {
            outage_seen = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    probes.assert_healthy();
    let outage_seen = outage_seen.expect("the outage shows in /status");
    assert!(
        committed(&names.group, &names.topic, 2).is_empty(),
        "nothing committed during the hang"
    );
    drop(hung);
    wait_for(
        "everything committed once GCS answers",
        JOIN_AND_FLUSH,
        || committed(&names.group, &names.topic, 2) == expected_commits(&report),
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    every_blob_in_gcs(&names.bucket, &sent).await;
    println!("outage in /status {outage_seen:?} after the hang began");
}

/// A blob store that answers, slowly: each upload is held 0.7 s by a proxy, one at a time, so one
/// attempt over a batch of 24 lasts 17 s, past the 12 s flush stall (above the least a two-second
/// sink timeout allows: the timeout leaves each upload 1.3 s beside its 0.7, for a loaded
/// machine, where a one-second one left 0.3). Every upload that ends is
/// progress, so the service stays live throughout and the batch lands in that one attempt.
/// (Progress counted per attempt: liveness failed 3 s into it, and the pod was restarted into the
/// same batch, again and again.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_slow_blob_store_outlasting_the_stall_timeout_in_one_attempt_leaves_the_service_live() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let proxy = proxy::Proxy::start(&gcs_endpoint(), |seen| {
        if seen.path.starts_with("/upload/") {
            proxy::Action::Delay(Duration::from_millis(700))
        } else {
            proxy::Action::Forward
        }
    })
    .await;
    let mut args = with_flag(
        args(&names, &statsd, dir.path()),
        "--gcs-endpoint",
        &proxy.endpoint,
    );
    args = with_flag(args, "--buffer-max-age-ms", "3000");
    args = with_flag(args, "--sink-timeout-ms", "2000");
    let service = uploading_one_at_a_time(args, "12000").await;
    let (report, sent) = produce_fixtures(&names.topic, &small_fixtures(true), 24).await;
    let target = expected_commits(&report);
    let (started, mut probes) = (std::time::Instant::now(), Probes::default());
    while committed(&names.group, &names.topic, 2) != target {
        assert!(started.elapsed() < JOIN_AND_FLUSH, "the batch never landed");
        let uploads = proxy.delayed.load(std::sync::atomic::Ordering::SeqCst);
        let held = format!("{uploads} uploads held");
        service.probe_into(&mut probes, "/health/live", &held);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    probes.assert_healthy();
    assert_eq!(service.terminate(), Some(0));
    every_blob_in_gcs(&names.bucket, &sent).await;
    // Besides the batch's, the startup check's upload.
    let uploads = proxy.delayed.load(std::sync::atomic::Ordering::SeqCst);
    assert!(uploads >= 24, "{uploads} uploads held");
    let counters = statsd.read().counters;
    assert!(
        !counters.keys().any(|k| k.contains("flush.retries")),
        "no attempt failed, so the batch landed in one: {counters:?}"
    );
}

/// `consumer.lag` tells the truth: per partition it equals the broker's high watermark minus the
/// group's committed offset, during a backlog (GCS hung, so nothing commits while 250 messages
/// wait), as it grows while the partitions are paused (60 more), and after it drains (0
/// everywhere).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn consumer_lag_is_the_high_watermark_minus_the_committed_offset() {
    let _stack = stops_stack().await;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let mut args = args(&names, &statsd, dir.path());
    // A small buffer and one flush at a time, so that the backlog pauses intake.
    args.extend(
        [
            "--kafka-property",
            "statistics.interval.ms=200",
            "--buffer-max-messages",
            "4",
            "--max-flushes-in-flight",
            "1",
        ]
        .map(String::from),
    );
    let service = assigned(Service::start(&args)).await;
    let watermarks: BaseConsumer = kafka().create().unwrap();
    // Per partition: the last lag the service reported, and what the broker says.
    let compare = || {
        std::thread::sleep(Duration::from_millis(300));
        let reported = statsd.read_now();
        (0..2)
            .map(|partition| {
                let key = format!("replay_ingest.consumer.lag|partition:{partition}");
                let lag = reported.values.get(&key).and_then(|v| v.last().copied());
                let (_, high) = watermarks
                    .fetch_watermarks(&names.topic, partition, Duration::from_secs(5))
                    .unwrap();
                let committed = committed(&names.group, &names.topic, 2)
                    .get(&partition)
                    .copied()
                    .unwrap_or(0);
                (lag, (high - committed) as f64)
            })
            .collect::<Vec<_>>()
    };
    let hung = Hung::begin("gcs");
    // More than the buffer, the flush, the processing window and the hand-over hold (4 + 4 + 64
    // + 64): the polling thread holds the rest and pauses the partitions.
    produce_fixtures(&names.topic, &small_fixtures(true), 250).await;
    wait_for("the backlog reported as it stands", JOIN_AND_FLUSH, || {
        compare().iter().all(|(lag, truth)| *lag == Some(*truth))
    })
    .await;
    let backlog = compare();
    assert!(
        backlog.iter().map(|(_, truth)| truth).sum::<f64>() > 0.0,
        "a backlog: {backlog:?}"
    );
    // The partitions paused, nothing is fetched: what arrives now is in the lag all the same
    // (the brokers are asked for the high watermarks; the fetches' stayed where the pause found
    // them, and the gauge went flat while the backlog grew).
    wait_for("intake paused", JOIN_AND_FLUSH, || {
        service.status().is_some_and(|s| s["paused"] == true)
    })
    .await;
    produce_fixtures(&names.topic, &small_fixtures(true), 60).await;
    wait_for("the backlog grown while paused", JOIN_AND_FLUSH, || {
        let now = compare();
        now.iter().all(|(lag, truth)| *lag == Some(*truth))
            && now.iter().map(|(_, truth)| truth).sum::<f64>()
                >= backlog.iter().map(|(_, truth)| truth).sum::<f64>() + 60.0
    })
    .await;
    drop(hung);
    wait_for(
        "the backlog drained and reported as 0",
        JOIN_AND_FLUSH,
        || {
            compare()
                .iter()
                .all(|(lag, truth)| *lag == Some(0.0) && *truth == 0.0)
        },
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    println!("lag during the backlog (reported, broker): {backlog:?}");
}

/// The blob store hung when the service starts, and nothing to write: the outage is measured all
/// the same (`sink.outage_ms`, at each try of the startup check; an idle member made no write,
/// and the gauge stayed unset, so an alert on it never fired), and reads 0 once the store answers.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_blob_store_down_at_start_is_measured_as_an_outage_before_any_write() {
    let _stack = stops_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let hung = Hung::begin("gcs");
    let service = Service::start(&args(&names, &statsd, dir.path()));
    let outage = || {
        statsd
            .read_now()
            .values
            .get("replay_ingest.sink.outage_ms|sink:gcs")
            .and_then(|v| v.last().copied())
    };
    wait_for("the outage measured", JOIN_AND_FLUSH, || {
        outage().is_some_and(|ms| ms > 0.0)
    })
    .await;
    assert!(
        service.status().unwrap()["outages"]["gcs"].is_object(),
        "and in /status"
    );
    drop(hung);
    wait_for("the outage over", JOIN_AND_FLUSH, || outage() == Some(0.0)).await;
    assert_eq!(service.terminate(), Some(0));
}

/// With credentials from the metadata server (GKE Workload Identity), a token refresh the
/// metadata server holds without an answer is given up and the credentials built again: once it
/// answers, uploads go on. google-cloud-auth's refresh has no deadline of its own, so a hung one
/// kept every later upload waiting for good — each timing out, counted as progress, so liveness
/// never restarted the pod — and nothing was committed again.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_token_refresh_the_metadata_server_never_answers_is_given_up_and_uploads_go_on() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let metadata = metadata::MetadataServer::start(false).await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let args = metadata::without_anonymous_gcs(with_flag(
        args(&names, &statsd, dir.path()),
        "--sink-timeout-ms",
        "2000",
    ));
    let service = Service::start_configured(&args, |command| metadata.credentials_for(command));
    let fixtures = small_fixtures(true);
    let (first, first_sent) = produce_fixtures(&names.topic, &fixtures, 4).await;
    wait_for("the first batch committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&first)
    })
    .await;

    // Its token expires, and the metadata server holds every request from now on.
    metadata.hang(true);
    tokio::time::sleep(Duration::from_secs(metadata::TOKEN_SECONDS + 1)).await;
    let (second, second_sent) = produce_fixtures(&names.topic, &fixtures, 4).await;
    // A refresh held (google-cloud-auth's task asks every 10 s for a token this short), and
    // uploads failing for want of a token.
    wait_for(
        "a token refresh held, uploads failing",
        JOIN_AND_FLUSH,
        || {
            metadata.held() >= 1
                && service
                    .status()
                    .is_some_and(|s| s["outages"]["gcs"]["failed_attempts"].as_u64() >= Some(2))
        },
    )
    .await;
    assert_eq!(service.committed(), expected_commits(&first));

    metadata.hang(false);
    let mut target = expected_commits(&first);
    target.extend(expected_commits(&second));
    wait_for(
        "everything committed once the metadata server answers",
        JOIN_AND_FLUSH,
        || service.committed() == target,
    )
    .await;
    assert_eq!(service.terminate(), Some(0));
    every_blob_in_gcs(&names.bucket, first_sent.iter().chain(&second_sent)).await;
}

/// A destination topic missing (deleted, or not yet recreated) on a broker that creates the
/// topics clients ask for, as Apache Kafka does by default: the service's producers do not have
/// it created. The delivery fails, and the flush rides it out as an outage until the topic is
/// back as it was made. (librdkafka's producers ask for it by default: it came back with the
/// broker's defaults — one replica, where an acknowledged billing outcome or dead letter is lost
/// with that broker — and raced the operator recreating it properly.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka's jars: scripts/test.sh fetches them and runs every test"]
async fn the_producers_do_not_have_a_missing_destination_topic_created() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use replay_ingest::kafka::producer::Producer;
    let broker = secure_broker::SecureBroker::start_auto_creating_topics("admin", "admin-pw");
    let base = broker.sasl_ssl_client("admin", "admin-pw");
    let mut config = base.clone();
    for (key, value) in
        replay_ingest::config::producer_properties(1_000_000, Duration::from_secs(5))
    {
        config.set(key, value);
    }
    let producer: Producer = config.create().unwrap();
    let topic = unique("outcomes");
    let sent = producer
        .send(rdkafka::producer::FutureRecord::<(), _>::to(&topic).payload(b"outcome"))
        .await;
    assert!(sent.is_err(), "delivered to a topic made for it: {sent:?}");
    let metadata: BaseConsumer = base.create().unwrap();
    let topics = metadata
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    assert!(
        !topics.topics().iter().any(|t| t.name() == topic),
        "the broker created {topic}"
    );
}

/// A destination topic deleted under the running service and created again as it was (an
/// operator recreating `outcomes-billing` to change its layout, say; the brokers do not create
/// topics on demand, nor does the service ask them to): while it is gone the flush's outcome
/// deliveries fail, and the service rides that out as an events outage — live, its partitions
/// kept, nothing committed past what was written. Once the topic is back with a new id, the
/// service stops (exit 1: its producer may keep what it knew of the old topic, which on a
/// cluster whose leaders had moved timed it out for ever, `kafka_cluster.rs`), and started
/// again, as Kubernetes would, it lands every outcome of what it consumed meanwhile on the new
/// topic and commits everything.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_destination_topic_deleted_and_created_again_is_an_outage_then_a_restart() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("service.log");
    let args = with_flag(
        args(&names, &statsd, dir.path()),
        "--session-timeout-ms",
        "10000",
    );
    let service = assigned(Service::start_logging_to(&args, &log)).await;
    let files = small_fixtures(true);
    let published = |read: Vec<Received>| -> std::collections::BTreeSet<String> {
        read.into_iter()
            .map(|m| String::from_utf8(m.value).unwrap())
            .collect()
    };
    let (before, sent) = produce_fixtures(&names.topic, &files, files.len() as u64).await;
    wait_for("the first messages committed", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == expected_commits(&before)
    })
    .await;
    let first = billed_outcomes(&sent);
    assert!(!first.is_empty());
    assert_eq!(
        published(read_all(&names.outcomes, 1)),
        first,
        "every outcome before the deletion"
    );

    delete_topic(&names.outcomes).await;
    let (during, sent) = produce_fixtures(&names.topic, &files, files.len() as u64).await;
    riding_out(
        &service,
        &names,
        "events",
        2 * files.len() as u64,
        &expected_commits(&before),
    )
    .await;
    create_topic_again(&names.outcomes, 1).await;
    stops_on_a_new_topic_id(service, &log).await;
    let log = logs.path().join("restarted.log");
    let service = assigned(Service::start_logging_to(&args, &log)).await;
    let mut probes = Probes::default();
    wait_for(
        "everything committed after the restart",
        JOIN_AND_FLUSH,
        || {
            service.probe_into(&mut probes, "/health/live", "the service");
            committed(&names.group, &names.topic, 2) == expected_commits(&during)
        },
    )
    .await;
    // At least once: what was delivered before the stop is delivered again after it.
    assert_eq!(
        published(read_all(&names.outcomes, 1)),
        billed_outcomes(&sent),
        "every outcome of what was consumed while the topic was gone, on the new topic"
    );
    probes.assert_healthy();
    assert_eq!(service.terminate(), Some(0));
    assert_no_error_line(&log);
}
