//! End to end with every real component the local stack runs: fixtures → broker → service →
//! GCS (fake-gcs-server) + ClickHouse + analytics topics + DogStatsD datagrams, all checked by
//! reading back; and a ClickHouse outage the service rides out without committing past it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use replay_ingest::recording::{self, AnalyticsEvent, IssueGates, Limits};

/// How many events of `kind` the segments produce, issues on for every project.
fn expected_events_of(segments: &[recording::Processed], kind: &str) -> usize {
    segments
        .iter()
        .flat_map(|p| p.events(&IssueGates::default()))
        .filter(|e| e.kind() == kind)
        .count()
}

/// A Kafka message's key and value.
type KeyedMessage = (Option<Vec<u8>>, Vec<u8>);

/// Values of every message on `topic` (JSON events), reading until `count` arrived.
fn read_json(topic: &str, count: usize) -> Vec<serde_json::Value> {
    read_messages(topic, count, Duration::from_secs(30))
        .iter()
        .map(|m| serde_json::from_slice(&m.value).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn fixtures_flow_to_gcs_clickhouse_event_topics_and_dogstatsd() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let statsd = Statsd::bind();
    let fixtures = all_fixtures();
    let (report, sent) = produce_fixtures(&names.topic, &fixtures, fixtures.len() as u64).await;

    let dir = tempfile::tempdir().unwrap();
    // A session a loaded machine does not miss: a rebalance would read messages again, and the
    // counts below are of each message once.
    let service = Service::start(&with_flag(
        names.args(statsd.port(), dir.path()),
        "--session-timeout-ms",
        "10000",
    ));
    let target = expected_commits(&report);
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        service.committed() == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));

    // What each produced message must have become, from the recording core itself.
    let valid: Vec<_> = sent
        .iter()
        .filter_map(|s| recording::process(&s.value, &Limits::default()).ok())
        .collect();
    assert!(valid.len() > 10);

    assert_eq!(
        committed(&names.group, &names.topic, 2),
        target,
        "the broker holds the commits"
    );

    // Blobs: every valid segment, byte for byte. (Their content type is checked on the upload
    // request itself, in tests/it/gcs_sink.rs: the emulator does not keep it.)
    for p in &valid {
        assert_eq!(
            read_object(&names.bucket, &p.blob.key).await,
            p.blob.bytes.as_ref(),
            "{}",
            p.blob.key
        );
    }

    // Rows: one per deduplication key after merging (project, day, replay, event hash).
    let rows = clickhouse_rows(&names.table).await;
    let key = |r: &recording::ReplayRow| {
        (
            r.project_id,
            r.timestamp / 86_400,
            r.replay_id,
            r.event_hash,
        )
    };
    // Each row whole, as the recording core builds it at the message's Kafka position (every
    // copy has a replay id of its own, so no two messages share a key).
    let mut expected_rows: Vec<recording::ReplayRow> = sent
        .iter()
        .filter_map(|s| {
            let processed = recording::process(&s.value, &Limits::default()).ok()?;
            Some(processed.rows(recording::KafkaPosition {
                partition: s.partition,
                offset: s.offset,
            }))
        })
        .flatten()
        .collect();
    // Rows sharing a key (two clicks on one node in one second) are one after ClickHouse's
    // merge, the last inserted: reversed, the stable sort puts it first, and dedup keeps it.
    expected_rows.reverse();
    expected_rows.sort_by_key(key);
    expected_rows.dedup_by_key(|r| key(r));
    let mut stored = rows.clone();
    stored.sort_by_key(key);
    assert_eq!(stored.len(), expected_rows.len());
    assert_eq!(stored, expected_rows);
    assert!(
        rows.iter().any(|r| r.click_is_rage == 1) && rows.iter().any(|r| !r.tap_view_id.is_empty())
    );

    // Events: every message on each topic, key and value, is one the recording core built, once:
    // outcomes (no key) for every segment 0, every occurrence under its fingerprint key, and one
    // first-replay event (keyed by project) for the one project, the first of its segment 0s.
    let expected_events: Vec<AnalyticsEvent> = valid
        .iter()
        .flat_map(|p| p.events(&IssueGates::default()))
        .collect();
    let count = |kind: &str| expected_events.iter().filter(|e| e.kind() == kind).count();
    assert!(count("outcome") >= 1 && count("rage_click") >= 1 && count("hydration_error") >= 1);
    let as_message = |e: AnalyticsEvent| (e.key().map(String::into_bytes), e.into_json().unwrap());
    let mut expected_by_topic: BTreeMap<&str, Vec<KeyedMessage>> = BTreeMap::new();
    for event in expected_events {
        expected_by_topic
            .entry(event.topic().as_str())
            .or_default()
            .push(as_message(event));
    }
    for (topic, name) in [
        ("outcomes", &names.outcomes),
        ("issues", &names.issues),
        ("analytics", &names.analytics),
    ] {
        let mut expected = expected_by_topic.remove(topic).unwrap_or_default();
        let mut got: Vec<_> = read_messages(name, expected.len(), Duration::from_secs(30))
            .into_iter()
            .map(|m| (m.key, m.value))
            .collect();
        if topic == "analytics" {
            assert_eq!(
                got.len(),
                1,
                "one first-replay event per project per process"
            );
            assert!(
                expected.contains(&got[0]),
                "the first-replay event is one built for a segment 0"
            );
            continue;
        }
        got.sort();
        expected.sort();
        assert!(
            got == expected,
            "{topic}: the messages published are the ones built, once each, with their keys"
        );
    }
    let outcome = &read_json(&names.outcomes, 1)[0];
    assert_eq!(
        (
            &outcome["category"],
            &outcome["outcome"],
            &outcome["quantity"]
        ),
        (&7.into(), &0.into(), &1.into())
    );

    // Metrics: DogStatsD datagrams.
    let Metrics {
        text: datagrams,
        counters,
        values,
        seen,
    } = statsd.read();
    let all_values = |prefix: &str| -> Vec<f64> {
        values
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .flat_map(|(_, v)| v.iter().copied())
            .collect()
    };
    // Every message went through exactly one flush; every valid segment's compressed size was
    // recorded once; the buffer was seen holding messages, and empty again at the end.
    let batches = all_values("replay_ingest.flush.batch_messages|close_reason:");
    assert_eq!(
        batches.iter().sum::<f64>(),
        sent.len() as f64,
        "flush.batch_messages: {batches:?}"
    );
    let mut compressed = all_values("replay_ingest.segment.compressed_bytes");
    let mut expected_compressed: Vec<f64> =
        valid.iter().map(|p| p.compressed_bytes as f64).collect();
    compressed.sort_by(f64::total_cmp);
    expected_compressed.sort_by(f64::total_cmp);
    assert_eq!(compressed, expected_compressed, "segment.compressed_bytes");
    let buffered = all_values("replay_ingest.buffer.messages");
    assert!(
        buffered.iter().any(|&m| m >= 1.0),
        "buffer.messages never showed a message: {buffered:?}"
    );
    assert_eq!(
        buffered.last(),
        Some(&0.0),
        "buffer.messages ends at 0 once everything is flushed"
    );
    let invalid_events: u64 = valid.iter().map(|p| p.extracted.invalid_events).sum();
    assert!(invalid_events > 0, "the fixtures include malformed events");
    assert_eq!(
        counters["replay_ingest.events.invalid"],
        invalid_events as f64
    );
    let invalid = sent.len() - valid.len();
    assert_eq!(
        counters["replay_ingest.messages.processed"],
        valid.len() as f64,
        "{datagrams}"
    );
    let invalid_counted: f64 = counters
        .iter()
        .filter(|(k, _)| k.starts_with("replay_ingest.messages.invalid|reason:"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(invalid_counted, invalid as f64);
    assert_eq!(
        counters["replay_ingest.messages.invalid|reason:too_large"],
        1.0
    );
    assert_eq!(
        counters["replay_ingest.messages.consumed"],
        sent.len() as f64
    );
    assert_eq!(
        counters["replay_ingest.flush.items|sink:gcs"],
        valid.len() as f64
    );
    assert_eq!(
        counters["replay_ingest.flush.items|sink:dlq"],
        invalid as f64
    );
    assert_eq!(
        counters["replay_ingest.flush.items|sink:clickhouse"],
        valid
            .iter()
            .map(|p| p.rows(Default::default()).len())
            .sum::<usize>() as f64
    );
    assert!(counters["replay_ingest.commits"] >= 1.0);
    for distribution in [
        "replay_ingest.flush.duration_ms|sink:gcs",
        "replay_ingest.flush.duration_ms|sink:clickhouse",
        "replay_ingest.flush.duration_ms|sink:events",
        "replay_ingest.segment.uncompressed_bytes",
        "replay_ingest.process.duration_ms",
        "replay_ingest.buffer.bytes",
        // Sentry's own ingest metrics, beside the catalogue.
        "replay_ingest.replays.usecases.ingest.size_compressed",
        "replay_ingest.replays.usecases.ingest.size_uncompressed",
        "replay_ingest.replays.usecases.ingest.request_body_size",
        "replay_ingest.replays.usecases.ingest.response_body_size",
        "replay_ingest.replays.recording_consumer.replay_video_size",
    ] {
        assert!(
            seen.contains(distribution),
            "no {distribution} in the datagrams:\n{datagrams}"
        );
    }
    let publish: f64 = counters
        .iter()
        .filter(|(k, _)| k.starts_with("replay_ingest.replays.should_publish_replay_event|"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        publish,
        valid.len() as f64,
        "one should_publish_replay_event per valid segment"
    );
    let videos = valid.iter().filter(|p| p.video_bytes > 0).count() as f64;
    assert_eq!(
        counters["replay_ingest.replays.recording_consumer.replay_video_count"],
        videos
    );
    let hydration: u64 = valid
        .iter()
        .map(|p| {
            p.extracted
                .breadcrumbs_by_category
                .get("replay.hydrate-error")
        })
        .sum();
    assert_eq!(
        counters["replay_ingest.replay.hydration_error_breadcrumb"],
        hydration as f64
    );
    let occurrences = |kind: &str| expected_events_of(&valid, kind) as f64;
    assert_eq!(
        counters["replay_ingest.replay.rage_click_issue_creation_with_replay_event"],
        occurrences("rage_click")
    );
    assert_eq!(
        counters["replay_ingest.replay.rage_click_detected"],
        occurrences("rage_click")
    );
    assert_eq!(
        counters["replay_ingest.replay.hydration_error_issue_creation_with_replay_event"],
        occurrences("hydration_error")
    );
}

/// `--rows-sink snuba`: the rows go out as `ingest-replay-events` messages, and what snuba's
/// processor makes of them is the rows the direct path writes (`partition` and `offset` aside:
/// snuba takes them from the message it reads).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn rows_published_for_snuba_are_the_rows_written_directly() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    let fixtures = all_fixtures();
    let (report, sent) = produce_fixtures(&names.topic, &fixtures, fixtures.len() as u64).await;

    let dir = tempfile::tempdir().unwrap();
    let mut args = with_flag(names.args(free_port(), dir.path()), "--rows-sink", "snuba");
    args.extend(["--replay-events-topic".to_owned(), replay_events.clone()]);
    let service = Service::start(&args);
    let target = expected_commits(&report);
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        service.committed() == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        target,
        "the broker holds the commits"
    );

    let limits = Limits {
        republish_replay_event: true,
        ..Limits::default()
    };
    let valid: Vec<_> = sent
        .iter()
        .filter_map(|s| recording::process(&s.value, &limits).ok())
        .collect();
    let expected_messages: usize = valid
        .iter()
        .map(|p| recording::snuba::messages(p).unwrap().len())
        .sum();
    let without_position = |mut row: serde_json::Map<String, serde_json::Value>| {
        row.remove("partition");
        row.remove("offset");
        serde_json::Value::Object(row).to_string()
    };
    let mut expected: Vec<String> = valid
        .iter()
        .flat_map(|p| p.rows(Default::default()))
        .map(|r| match serde_json::to_value(r).unwrap() {
            serde_json::Value::Object(row) => without_position(row),
            _ => unreachable!(),
        })
        .collect();
    let messages = read_messages(&replay_events, expected_messages, Duration::from_secs(30));
    assert_eq!(messages.len(), expected_messages);
    assert!(
        messages.iter().all(|m| m.key.is_none()),
        "no key, as Sentry publishes them"
    );
    let mut published: Vec<String> = messages
        .iter()
        .flat_map(|m| {
            snuba::rows(&m.value, 0, 0).unwrap_or_else(|e| panic!("snuba rejects it: {e}"))
        })
        .map(without_position)
        .collect();
    expected.sort();
    published.sort();
    assert!(expected.len() > 30);
    assert!(
        published == expected,
        "snuba's rows from the topic are the direct rows"
    );
}

/// A distribution recorded more often in one interval than the exporter keeps of it
/// (`HISTOGRAM_RESERVOIR`) is sent as a uniform sample with its rate (`|@rate`): scaled back by
/// that rate, as the agent does, its count is what was recorded — one value per segment.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_distribution_past_its_reservoir_is_sampled_with_a_rate_that_keeps_its_count() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let count = 3 * replay_ingest::metrics::HISTOGRAM_RESERVOIR as u64;
    let (report, _) = produce_fixtures(&names.topic, &small_fixtures(true), count).await;
    let (dir, statsd) = (tempfile::tempdir().unwrap(), Statsd::bind());
    // Every segment within one or two intervals. Not longer: one interval's datagrams come in
    // one burst, and at 10 s a burst overflowed the test's receive buffer on a loaded machine
    // (a distribution's lines went missing).
    let args = with_flag(
        names.args(statsd.port(), dir.path()),
        "--statsd-flush-interval-ms",
        "5000",
    );
    let service = Service::start(&args);
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let metrics = statsd.read();
    let (mut scaled, mut sent, mut sampled) = (0.0, 0, false);
    let name = "replay_ingest.segment.compressed_bytes:";
    for line in metrics.text.lines().filter(|l| l.starts_with(name)) {
        let mut parts = line[name.len()..].split('|');
        let values = parts.next().unwrap().split(':').count();
        let rate = parts
            .find_map(|p| p.strip_prefix('@'))
            .map_or(1.0, |r| r.parse::<f64>().unwrap());
        sampled |= rate < 1.0;
        sent += values;
        scaled += values as f64 / rate;
    }
    assert!(sampled, "sent with a rate:\n{}", metrics.text);
    assert!(sent < count as usize, "a sample: {sent} values");
    assert!(
        (scaled - count as f64).abs() < 1.0,
        "{scaled} scaled back, {count} recorded"
    );
}
