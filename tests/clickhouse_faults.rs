//! ClickHouse faults with the real service: the server stops mid-run and comes back once the
//! service has failed a flush five times (retried, nothing committed in between, every segment
//! stored); the server is down when the
//! service starts (waited for, live, shown in `/status`); and a column altered to another type
//! while the service runs (a configuration error: the service stops, non-zero, naming the
//! column, nothing committed past it). Its own test binary:
//! stopping a shared server must not disturb other tests.

mod common;

use std::time::Duration;

use common::*;

const JOIN_AND_FLUSH: Duration = Duration::from_secs(120);

/// The outage stops the shared server: these tests run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Stops ClickHouse; it is started again when the guard is dropped, so that a test failing
/// mid-outage does not leave the server down for the tests after it.
struct ClickHouseDown;

impl ClickHouseDown {
    fn begin() -> ClickHouseDown {
        stack(&["stop", "clickhouse"]);
        ClickHouseDown
    }
}

impl Drop for ClickHouseDown {
    fn drop(&mut self) {
        stack(&["start", "clickhouse"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clickhouse_outage_is_ridden_out_without_committing_past_it() {
    if !needs("REPLAY_INGEST_TEST_BROKERS") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let names = Names::create().await;
    let fixtures = small_fixtures(true);
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    // One flush at a time, four messages per buffer: the outage stalls a flush, the next buffer
    // fills, and intake pauses.
    let mut args = names.args(statsd.port(), dir.path());
    args.extend(["--buffer-max-messages", "4", "--max-flushes-in-flight", "1"].map(String::from));
    let service = Service::start(&args);
    let (first, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || service.committed() == expected_commits(&first)).await;

    let outage = ClickHouseDown::begin();
    let (second, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    // The second batch is consumed until intake pauses, and its flush keeps failing: retried
    // (without limit, the default), and the broker's commits stay where they were. Waiting on
    // what the service says, not on a clock, so that the check is made during a real outage with
    // messages in hand.
    wait_for("intake paused behind a flush failing again and again", JOIN_AND_FLUSH, || {
        service.status().is_some_and(|s| {
            s["paused"] == true
                && s["consumed"].as_u64() >= Some(18)
                && s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(5)
        })
    })
    .await;
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        expected_commits(&first),
        "nothing committed during the outage"
    );
    assert_eq!(service.status().unwrap()["flushed"], 10, "the failing flush is not counted as done");
    drop(outage);

    let mut target = expected_commits(&first);
    target.extend(expected_commits(&second));
    wait_for("everything committed after the outage", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let segments = clickhouse_rows(&names.table).await.iter().filter(|r| r.is_segment()).count();
    assert_eq!(segments, 20, "every segment row stored once");

    // What the outage looked like in the metrics.
    let metrics = statsd.read();
    let retries = metrics.counters.get("replay_ingest.flush.retries|sink:clickhouse").copied().unwrap_or(0.0);
    assert!(retries >= 5.0, "flush.retries counts the failed attempts: {retries}\n{}", metrics.text);
    let paused = metrics.counters.get("replay_ingest.consumer.paused_ms").copied().unwrap_or(0.0);
    assert!(paused > 0.0, "consumer.paused_ms counts the pause: {}", metrics.text);
    let outage_ms = metrics.values.get("replay_ingest.sink.outage_ms|sink:clickhouse").cloned().unwrap_or_default();
    assert!(outage_ms.iter().any(|&ms| ms > 0.0), "sink.outage_ms shows the outage: {outage_ms:?}");
    assert!(!metrics.counters.contains_key("replay_ingest.flush.errors|sink:clickhouse"), "no flush gave up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_column_altered_while_running_stops_the_service_naming_it_without_committing_past_it() {
    if !needs("REPLAY_INGEST_TEST_BROKERS") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let names = Names::create().await;
    let fixtures = small_fixtures(true);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("service.log");
    let statsd = Statsd::bind();
    // A long metrics interval: the error counted just before the exit must still be sent, because
    // the process waits for the exporter's next send before it exits.
    let args = with_flag(names.args(statsd.port(), dir.path()), "--statsd-flush-interval-ms", "3000");
    let service = Service::start_logging_to(&args, &log);
    let (first, _) = produce_fixtures(&names.topic, &fixtures, 5).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || service.committed() == expected_commits(&first)).await;

    let client = replay_ingest::sink::clickhouse::client(&clickhouse_config(&names.table));
    client.query(&format!("ALTER TABLE {} MODIFY COLUMN click_node_id Date", names.table)).execute().await.unwrap();
    produce_fixtures(&names.topic, &fixtures, 5).await;
    assert_eq!(
        service.exit_within(JOIN_AND_FLUSH).await,
        Some(1),
        "the service stops with a non-zero exit on a configuration error"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    // The exit comes from the flush (after consuming; not a startup check), with the cause, on
    // the first attempt: a configuration error is not retried.
    let last = log.lines().rfind(|l| l.contains("ERROR replay_ingest: ")).unwrap_or_default();
    assert!(
        last.contains("flush failed, nothing of it committed")
            && last.contains("column click_node_id is Date, expected UInt32"),
        "the service's exit error names the failed flush and the cause:\n{log}"
    );
    assert!(!log.contains("sink write failed; retrying"), "a configuration error is not retried:\n{log}");
    let metrics = statsd.read();
    assert_eq!(
        metrics.counters.get("replay_ingest.flush.errors|sink:clickhouse"),
        Some(&1.0),
        "flush.errors counts the flush that gave up, sent before the exit:\n{}",
        metrics.text
    );
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        expected_commits(&first),
        "nothing committed past the failed flush"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn clickhouse_down_at_startup_is_waited_for_live_and_shown_then_consumption_starts() {
    if !needs("REPLAY_INGEST_TEST_BROKERS") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let names = Names::create().await;
    let outage = ClickHouseDown::begin();
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&names.args(free_port(), dir.path()));
    wait_for("the wait shown in /status", Duration::from_secs(30), || {
        service.status().is_some_and(|s| s["outages"]["clickhouse"]["failed_attempts"].as_u64() >= Some(2))
    })
    .await;
    assert_eq!(service.status().unwrap()["live"], true, "waiting for a sink is not a wedged process");
    drop(outage);

    let fixtures = small_fixtures(true);
    let (sent, _) = produce_fixtures(&names.topic, &fixtures, 5).await;
    wait_for("everything committed once ClickHouse is up", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == expected_commits(&sent)
    })
    .await;
    assert_eq!(service.status().unwrap()["outages"], serde_json::json!({}));
    assert_eq!(service.terminate(), Some(0));
}
