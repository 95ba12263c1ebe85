//! `replay-ingest delete` against the real stack, on what the running service wrote: a replay's
//! blobs, its oversized dead-letter copy and its rows go — in ClickHouse deleted and archived, or
//! through snuba's topic archived as Sentry does — while another replay stays; a dry run removes
//! nothing; a second run is a no-op; a run killed half way is finished by the next.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use replay_ingest::recording::{self, Limits};

use crate::support::*;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture_dir().join("segments").join(name)).unwrap()
}

/// `value` with its payload replaced by a corrupt zlib body of `bytes` bytes: a dead letter of
/// the same replay, larger than the dead-letter topic takes.
fn corrupt(value: &[u8], bytes: usize) -> Vec<u8> {
    let mut decoded = rmpv::decode::read_value(&mut &value[..]).unwrap();
    let rmpv::Value::Map(fields) = &mut decoded else {
        panic!("a msgpack map");
    };
    for (key, field) in fields.iter_mut() {
        if key.as_str() == Some("payload") {
            let mut payload = b"{\"segment_id\":7}\n\x78\x9c".to_vec();
            payload.extend((0..bytes).map(|i| (i * 7919 % 251) as u8));
            *field = rmpv::Value::Binary(payload);
        }
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &decoded).unwrap();
    out
}

/// Runs `replay-ingest delete` with `args`; its exit status and output.
fn delete(args: &[String]) -> (bool, String) {
    run_tool("delete", args)
}

fn gcs_flags(names: &Names) -> Vec<String> {
    gcs_flags_at(&names.bucket, &gcs_endpoint())
}

/// The flags of the filesystem store in `dir`.
fn filesystem_flags(dir: &std::path::Path) -> Vec<String> {
    [
        "--blob-sink",
        "filesystem",
        "--blob-dir",
        dir.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// `store` flags, and the flags that delete only the blobs of `project`'s `replay`.
fn blobs_of(store: Vec<String>, project: u64, replay: &str) -> Vec<String> {
    deleting(store, &["--rows-sink", "null"], project, replay)
}

/// `store` flags, `rows` flags, and those of `project`'s `replay`.
fn deleting(store: Vec<String>, rows: &[&str], project: u64, replay: &str) -> Vec<String> {
    let project = project.to_string();
    let named = ["--project", &project, "--replay", replay];
    store
        .into_iter()
        .chain(rows.iter().chain(&named).map(|flag| flag.to_string()))
        .collect()
}

/// The flags of the emulator's `bucket`, reached at `endpoint`.
fn gcs_flags_at(bucket: &str, endpoint: &str) -> Vec<String> {
    [
        "--blob-sink",
        "gcs",
        "--gcs-bucket",
        bucket,
        "--gcs-endpoint",
        endpoint,
        "--gcs-anonymous",
        "--brokers",
        &brokers(),
    ]
    .map(String::from)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_replay_is_deleted_everywhere_with_clickhouse_and_a_second_run_is_a_no_op() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let aggregated = format!("{}_aggregated", names.table);
    aggregation_of(&names.table, &aggregated).await;
    let (first, second, other) = (
        fixture("network-0.msgpack"),
        fixture("network-1.msgpack"),
        fixture("console-0.msgpack"),
    );
    let oversized = corrupt(&first, 5000);
    let (report, sent) = produce_values(
        &names.topic,
        vec![
            (first.clone(), test_key(0)),
            (second, test_key(1)),
            (other.clone(), test_key(2)),
            (oversized, test_key(3)),
        ],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let statsd = Statsd::bind();
    let args: Vec<String> = names
        .args(statsd.port(), dir.path())
        .into_iter()
        .chain(["--dlq-max-message-bytes", "2000"].map(String::from))
        .collect();
    let service = Service::start(&args);
    wait_for("everything committed", JOIN_AND_FLUSH, || {
        service.committed() == expected_commits(&report)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));

    let ids = recording::process(&first, &Limits::default()).unwrap().ids;
    let kept = recording::process(&other, &Limits::default()).unwrap().ids;
    let key =
        |segment| recording::blob::key(ids.retention_days, ids.project_id, &ids.replay_id, segment);
    // Kept under its replay: the delete finds it by name.
    let copy = {
        let dead = &sent[3];
        format!(
            "dlq/{}/{}/{}/{}/{}",
            ids.project_id, ids.replay_id, names.topic, dead.partition, dead.offset
        )
    };
    let gcs = gcs_client().await;
    for object in [key(0), key(1), copy.clone()] {
        assert!(
            try_read_object(&gcs, &names.bucket, &object).await.is_ok(),
            "{object} written"
        );
    }
    let rows_of = |rows: &[recording::ReplayRow], replay: uuid::Uuid| {
        rows.iter()
            .filter(|r| r.replay_id == replay)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(!rows_of(&clickhouse_rows(&names.table).await, ids.replay_uuid).is_empty());

    let aggregated_of = |replay| aggregated_rows(&names.table, &aggregated, replay);
    let (with_segments, archived) = aggregated_of(ids.replay_uuid).await;
    assert!(
        with_segments > 0 && archived == 0,
        "the view fed the aggregation"
    );
    let flags = [
        gcs_flags(&names),
        clickhouse_flags(&names, &ids),
        vec!["--clickhouse-aggregated-table".into(), aggregated.clone()],
    ]
    .concat();
    let (ok, dry) = delete(&[flags.clone(), vec!["--dry-run".into()]].concat());
    assert!(ok, "{dry}");
    assert!(
        dry.contains("found 2 segment blob(s), 1 dead-letter copy object(s)"),
        "{dry}"
    );
    assert!(dry.contains("would remove gs://"), "{dry}");
    assert!(
        try_read_object(&gcs, &names.bucket, &key(0)).await.is_ok(),
        "a dry run removes nothing"
    );

    let started = Instant::now();
    let (ok, said) = delete(&flags);
    let took = started.elapsed();
    assert!(ok, "{said}");
    assert!(
        said.contains("rows deleted and the archive row written"),
        "{said}"
    );
    assert!(
        said.contains("1 replay(s) deleted, 3 object(s) removed"),
        "{said}"
    );
    for object in [key(0), key(1), copy] {
        assert!(
            try_read_object(&gcs, &names.bucket, &object).await.is_err(),
            "{object} gone"
        );
    }
    let other_key = recording::blob::key(kept.retention_days, kept.project_id, &kept.replay_id, 0);
    assert!(
        try_read_object(&gcs, &names.bucket, &other_key)
            .await
            .is_ok(),
        "the other replay stays"
    );
    let rows = clickhouse_rows(&names.table).await;
    let left = rows_of(&rows, ids.replay_uuid);
    assert_eq!(left.len(), 1, "only the archive row: {left:?}");
    assert_eq!(left[0].is_archived, Some(1));
    assert_eq!(left[0].segment_id, None);
    // Stamped with the replay's own time (its first event), not the time of the delete.
    let first_event = recording::process(&first, &Limits::default())
        .unwrap()
        .extracted
        .first_timestamp_ms
        .unwrap();
    assert_eq!(u64::from(left[0].timestamp), first_event / 1000);
    assert!(
        !rows_of(&rows, kept.replay_uuid).is_empty(),
        "the other replay's rows stay"
    );
    // Its aggregated rows (its user's data) are gone; what is left there is the archive the
    // archive row fed in, which hides the replay. The other replay's stay.
    assert_eq!(aggregated_of(ids.replay_uuid).await, (0, 1), "{said}");
    assert!(aggregated_of(kept.replay_uuid).await.0 > 0);
    println!("deleted a replay of 2 segments, a dead-letter copy and its rows in {took:?}");

    let (ok, again) = delete(&flags);
    assert!(ok, "{again}");
    assert!(again.contains("nothing to delete"), "{again}");
    assert!(
        again.contains("0 replay(s) deleted, 0 object(s) removed"),
        "{again}"
    );
    assert_eq!(
        rows_of(&clickhouse_rows(&names.table).await, ids.replay_uuid).len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_snuba_a_run_killed_half_way_is_finished_by_the_next_and_the_archive_is_sentrys() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    // A long replay, written by the service's own blob writer: 400 segments.
    let store = gcs_store(&names.bucket, 16).await;
    let value = fixture("console-1.msgpack");
    let ids = recording::process(&value, &Limits::default()).unwrap().ids;
    let segment = recording::process(&value, &Limits::default())
        .unwrap()
        .blob
        .bytes;
    let keys: Vec<String> = (0..400)
        .map(|n| recording::blob::key(ids.retention_days, ids.project_id, &ids.replay_id, n))
        .collect();
    futures::future::join_all(keys.iter().map(|k| store.put(k, &segment)))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());

    let through_snuba = [
        "--rows-sink",
        "snuba",
        "--replay-events-topic",
        &replay_events,
    ];
    let flags = deleting(
        gcs_flags(&names),
        &through_snuba,
        ids.project_id,
        &ids.replay_id,
    );
    // Killed once it has removed 50 objects (or when the test fails before: it is not left
    // running).
    let mut run = KilledWhenDropped(
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .arg("delete")
            .args(&flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let lines = BufReader::new(run.0.stdout.take().unwrap()).lines();
    let mut removed = 0;
    for line in lines {
        if line.unwrap().starts_with("removed ") {
            removed += 1;
            if removed == 50 {
                break;
            }
        }
    }
    drop(run);
    let gcs = gcs_client().await;
    let mut remaining = 0;
    for key in &keys {
        remaining += usize::from(try_read_object(&gcs, &names.bucket, key).await.is_ok());
    }
    assert!(
        (1..=350).contains(&remaining),
        "killed half way: {remaining} left"
    );
    // The earliest segment goes last: the next run reads the replay's time from it (it went
    // first, and the next run stamped its archive with a later segment's time).
    assert!(
        try_read_object(&gcs, &names.bucket, &keys[0]).await.is_ok(),
        "segment 0 is left for the next run"
    );

    let started = Instant::now();
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!("found {remaining} segment blob(s)")),
        "{said}"
    );
    println!(
        "the second run removed {remaining} segments in {:?}",
        started.elapsed()
    );
    for key in &keys {
        assert!(
            try_read_object(&gcs, &names.bucket, key).await.is_err(),
            "{key}"
        );
    }
    // The archive, once per run that found something, the same message both times but for its
    // `start_time` (when it was written), stamped with the time both runs read from segment 0;
    // valid for Sentry's topic schema and archived in snuba's mapping.
    let archives = read_messages(&replay_events, 2, Duration::from_secs(20));
    assert_eq!(archives.len(), 2);
    let schema = sentry_kafka_schemas::get_schema("ingest-replay-events", None).unwrap();
    for archive in &archives {
        let message = schema.validate_json(&archive.value).unwrap();
        assert_eq!(message["replay_id"], ids.replay_id.as_str());
        assert_eq!(message["payload"]["is_archived"], true);
        let rows = crate::support::snuba::rows(&archive.value, 0, 0).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["is_archived"], 1);
    }
    let hash = |m: &Received| {
        let message: serde_json::Value = serde_json::from_slice(&m.value).unwrap();
        message["payload"]["event_hash"].clone()
    };
    assert_eq!(hash(&archives[0]), hash(&archives[1]));
    let stamp = |m: &Received| {
        let message: serde_json::Value = serde_json::from_slice(&m.value).unwrap();
        let payload: serde_json::Value = match &message["payload"] {
            serde_json::Value::String(text) => serde_json::from_str(text).unwrap(),
            object => object.clone(),
        };
        payload["timestamp"].clone()
    };
    assert!(stamp(&archives[0]).is_number());
    assert_eq!(stamp(&archives[0]), stamp(&archives[1]));
}

#[test]
fn without_replays_or_with_a_bad_id_delete_says_what_is_wrong() {
    let (ok, said) = delete(&["--blob-sink".into(), "null".into()]);
    assert!(!ok);
    assert!(said.contains("name the replays"), "{said}");
    let (ok, said) = delete(&[
        "--project".into(),
        "1".into(),
        "--replay".into(),
        "x".into(),
        "--blob-sink".into(),
        "null".into(),
        "--rows-sink".into(),
        "null".into(),
    ]);
    assert!(!ok);
    assert!(said.contains("\"x\" is not a replay id"), "{said}");
}

/// Everything under the replay's prefix goes, whatever its name and under every retention prefix:
/// the same segment under two retentions (the retention changed mid-replay) and a screen
/// recording Sentry stored beside a segment (`{segment}.video`) included.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn every_object_under_the_replays_prefixes_goes() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let store = gcs_store(&names.bucket, 4).await;
    let value = fixture("console-1.msgpack");
    let processed = recording::process(&value, &Limits::default()).unwrap();
    let (project, replay) = (processed.ids.project_id, processed.ids.replay_id.clone());
    let ours = [
        format!("30/{project}/{replay}/0"),
        format!("90/{project}/{replay}/0"),
        format!("90/{project}/{replay}/0.video"),
    ];
    let another = format!("90/{project}/{}/0", "f".repeat(32));
    for key in ours.iter().chain([&another]) {
        store.put(key, &processed.blob.bytes).await.unwrap();
    }
    let flags = blobs_of(gcs_flags(&names), project, &replay);
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(said.contains("found 3 segment blob(s)"), "{said}");
    let gcs = gcs_client().await;
    for key in &ours {
        assert!(
            try_read_object(&gcs, &names.bucket, key).await.is_err(),
            "{key}: {said}"
        );
    }
    assert!(
        try_read_object(&gcs, &names.bucket, &another).await.is_ok(),
        "another replay's blob stays"
    );
}

/// A store that answers 503 (or 429) now and then, as GCS does over thousands of requests: each
/// call is tried again, and the run removes everything and exits 0 (each such answer failed the
/// replay's lookup or removal, and three in a row stopped the run).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_store_that_answers_503_now_and_then_is_asked_again() {
    use crate::support::proxy::{Action, Proxy};
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let store = gcs_store(&names.bucket, 4).await;
    let (project, replay) = (42, "b".repeat(32));
    let ours: Vec<String> = (0..3)
        .map(|s| format!("30/{project}/{replay}/{s}"))
        .collect();
    for key in &ours {
        store.put(key, b"segment bytes").await.unwrap();
    }
    // The first request of every path, and every other one after it, answered 503.
    let seen = std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new());
    let proxy = Proxy::start(&gcs_endpoint(), move |request| {
        let mut seen = seen.lock().unwrap();
        let count = seen.entry(request.path.to_owned()).or_default();
        *count += 1;
        match *count % 2 {
            1 => Action::Answer {
                status: 503,
                headers: Vec::new(),
                body: "Service Unavailable".into(),
            },
            _ => Action::Forward,
        }
    })
    .await;
    let flags = blobs_of(
        gcs_flags_at(&names.bucket, &proxy.endpoint),
        project,
        &replay,
    );
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(said.contains("found 3 segment blob(s)"), "{said}");
    assert!(
        said.contains("1 replay(s) deleted, 3 object(s) removed"),
        "{said}"
    );
    assert!(object_names(&names.bucket).is_empty(), "{said}");
}

/// In a bucket with Object Versioning every version of the replay's blobs goes — the copy a
/// rewrite left (a segment delivered twice), and a blob whose live version an earlier delete
/// removed, which is found too — not only the live one: a privacy delete left the recording in
/// noncurrent copies. Each version is deleted by its generation, as the JSON API deletes one for
/// good; the emulator answers those deletes 404 and keeps the copies, so the requests are what
/// is checked (through a proxy), and the live listing.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn in_a_versioned_bucket_every_version_of_the_replays_blobs_goes() {
    use crate::support::proxy::{Action, Proxy};
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let bucket = unique("versioned");
    create_versioned_bucket(&bucket);
    let store = gcs_store(&bucket, 4).await;
    let (project, replay) = (42, "d".repeat(32));
    let (rewritten, noncurrent) = (
        format!("30/{project}/{replay}/0"),
        format!("30/{project}/{replay}/1"),
    );
    let another = format!("30/{project}/{}/0", "e".repeat(32));
    for key in [&rewritten, &rewritten, &noncurrent, &another] {
        store.put(key, b"segment bytes").await.unwrap();
    }
    delete_live_object(&bucket, &noncurrent);
    assert_eq!(
        object_versions(&bucket).len(),
        4,
        "precondition: the copies are kept"
    );
    let proxy = Proxy::start(&gcs_endpoint(), |_| Action::Forward).await;
    let flags = blobs_of(gcs_flags_at(&bucket, &proxy.endpoint), project, &replay);
    let (_, said) = delete(&flags);
    assert!(said.contains("found 2 segment blob(s)"), "{said}");
    let by_generation: Vec<String> = proxy
        .paths
        .lock()
        .unwrap()
        .iter()
        .filter(|path| path.contains("?generation="))
        .cloned()
        .collect();
    let ours = |key: &str| format!("/o/{}?generation=", key.replace('/', "%2F"));
    assert_eq!(by_generation.len(), 3, "{by_generation:?}");
    assert_eq!(
        by_generation
            .iter()
            .filter(|p| p.contains(&ours(&rewritten)))
            .count(),
        2,
        "{by_generation:?}"
    );
    assert!(
        by_generation.iter().any(|p| p.contains(&ours(&noncurrent))),
        "{by_generation:?}"
    );
    assert_eq!(object_names(&bucket), [another].into(), "{said}");
}

/// A mutation of the table that fails for ever (ClickHouse retries it until it is killed, and
/// later mutations wait behind it) holds the replay's delete: the run gives up after its wait with
/// exit 1, saying the mutation still runs, the replay archived already (its archive row was
/// written only after the wait: a run again once the mutation had ended found nothing of a replay
/// without blobs, and it was never archived); a run again waits for the same delete instead of
/// queuing a second one behind it (each run queued one more before).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_delete_held_by_a_failing_mutation_fails_and_a_run_again_queues_no_second_one() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (ids, _, flags) = rows_of_one_replay(&names, "console-0.msgpack", |_| {}).await;
    let client = replay_ingest::sink::clickhouse::client(&clickhouse_config(&names.table));
    let uuid = ids.replay_uuid.hyphenated().to_string();
    let _dropped = DroppedAtEnd(names.table.clone());
    client
        .query(&format!(
            "ALTER TABLE {} DELETE WHERE replay_id = toUUID('{uuid}') AND throwIf(project_id > 0)",
            names.table
        ))
        .execute()
        .await
        .unwrap();
    let mutations = || async {
        client
            .query(
                "SELECT count() FROM system.mutations WHERE table = ? AND position(command, ?) > 0",
            )
            .bind(&names.table)
            .bind(&uuid)
            .fetch_one::<u64>()
            .await
            .unwrap()
    };
    for run in 1..=2 {
        let (ok, said) = delete(&flags);
        assert!(!ok, "run {run}: {said}");
        assert!(said.contains("is still running"), "run {run}: {said}");
        assert_eq!(
            mutations().await,
            2,
            "run {run}: the failing one and one delete"
        );
        // Counted as written (a merge may fold two runs' archive rows into one).
        let archives = client
            .query(&format!(
                "SELECT count() FROM {} WHERE is_archived = 1 AND replay_id = toUUID('{uuid}')",
                names.table
            ))
            .fetch_one::<u64>()
            .await
            .unwrap();
        assert!(archives >= 1, "run {run}: archived already: {said}");
    }
}

/// A tool run, killed (and waited for) when dropped.
/// Drops a table when the test ends, passed or failed: a failing mutation on it is retried for as
/// long as it exists (18.16 has no KILL MUTATION).
struct DroppedAtEnd(String);

impl Drop for DroppedAtEnd {
    fn drop(&mut self) {
        let table = self.0.clone();
        // A runtime of its own: the test's may be unwinding.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                replay_ingest::sink::clickhouse::client(&clickhouse_config(&table))
                    .query(&format!("DROP TABLE {table}"))
                    .execute()
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop {}: {dropped:?}", self.0);
        }
    }
}

/// A privacy request's file of several replays: their rows go in one delete mutation (one per
/// replay queued as many rewrites of the table's parts, each waited for in turn), and each gets
/// its archive row.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_rows_of_the_replays_of_a_file_go_in_one_mutation() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (mut lines, mut flags) = (String::new(), Vec::new());
    for fixture_name in [
        "console-0.msgpack",
        "dead-click-0.msgpack",
        "network-1.msgpack",
    ] {
        let (ids, _, one) = rows_of_one_replay(&names, fixture_name, |_| {}).await;
        lines += &format!("{} {}\n", ids.project_id, ids.replay_id);
        flags = one;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replays.txt");
    std::fs::write(&file, lines).unwrap();
    let by_file: Vec<String> = flags
        .into_iter()
        .take_while(|flag| flag != "--project")
        .chain(["--from-file".to_owned(), file.display().to_string()])
        .collect();
    let (ok, said) = delete(&by_file);
    assert!(ok, "{said}");
    assert!(said.contains("3 replay(s) deleted"), "{said}");
    let mutations = replay_ingest::sink::clickhouse::client(&clickhouse_config(&names.table))
        .query("SELECT count() FROM system.mutations WHERE table = ?")
        .bind(&names.table)
        .fetch_one::<u64>()
        .await
        .unwrap();
    assert_eq!(mutations, 1, "{said}");
    let left = clickhouse_rows(&names.table).await;
    assert_eq!(left.len(), 3, "an archive row each: {left:?}");
    assert!(left.iter().all(|row| row.is_archived == Some(1)));
}

/// Migrates `names.table` and writes into it the rows of `fixture`, as `edit` leaves them; returns
/// the replay's ids, the rows, and the flags that delete the replay from ClickHouse alone.
async fn rows_of_one_replay(
    names: &Names,
    fixture_name: &str,
    edit: impl FnOnce(&mut [recording::ReplayRow]),
) -> (
    recording::SegmentIds,
    Vec<recording::ReplayRow>,
    Vec<String>,
) {
    let config = clickhouse_config(&names.table);
    replay_ingest::sink::clickhouse::migrate(&config)
        .await
        .unwrap();
    let processed = recording::process(&fixture(fixture_name), &Limits::default()).unwrap();
    let mut rows = processed.rows(Default::default());
    edit(&mut rows);
    let client = replay_ingest::sink::clickhouse::client(&config);
    let mut insert = client
        .insert::<recording::ReplayRow>(&names.table)
        .await
        .unwrap();
    for row in &rows {
        insert.write(row).await.unwrap();
    }
    insert.end().await.unwrap();
    let flags = [
        vec!["--blob-sink".to_owned(), "null".to_owned()],
        clickhouse_flags(names, &processed.ids),
    ]
    .concat();
    (processed.ids, rows, flags)
}

/// A stand-in for snuba's aggregation of `table` (migration 0019: `replays_aggregation_mv` into
/// `replays_aggregated_local`), named `aggregated`: the columns the delete reads, in the state
/// types ClickHouse 18.16 gives them (snuba's own are typed over `Nullable`, which 18.16 cannot
/// feed).
async fn aggregation_of(table: &str, aggregated: &str) {
    let config = clickhouse_config(table);
    // Created before the service's own migration, which finds it there.
    replay_ingest::sink::clickhouse::migrate(&config)
        .await
        .unwrap();
    let client = replay_ingest::sink::clickhouse::client(&config);
    let columns = "project_id UInt64, to_hour_timestamp DateTime, replay_id UUID, retention_days UInt16, \
        count_segments AggregateFunction(count, UInt64), is_archived AggregateFunction(sum, UInt64), \
        user_email AggregateFunction(anyIf, String, UInt8)";
    for ddl in [
        format!(
            "CREATE TABLE {aggregated} ({columns}) ENGINE = AggregatingMergeTree() \
             ORDER BY (project_id, to_hour_timestamp, replay_id, retention_days)"
        ),
        format!(
            "CREATE MATERIALIZED VIEW {aggregated}_mv TO {aggregated} ({columns}) AS \
             SELECT project_id, toStartOfHour(timestamp) AS to_hour_timestamp, replay_id, retention_days, \
             countState(toUInt64(segment_id)) AS count_segments, sumState(toUInt64(is_archived)) AS is_archived, \
             anyIfState(user_email, user_email != '') AS user_email \
             FROM {table} GROUP BY project_id, to_hour_timestamp, replay_id, retention_days"
        ),
    ] {
        client.query(&ddl).execute().await.unwrap();
    }
}

/// `replay`'s rows in the aggregation of `table`: how many count segments, and how many
/// archives they sum.
async fn aggregated_rows(table: &str, aggregated: &str, replay: uuid::Uuid) -> (u64, u64) {
    replay_ingest::sink::clickhouse::client(&clickhouse_config(table))
        .query(&format!(
            "SELECT countIf(finalizeAggregation(count_segments) > 0), toUInt64(sum(finalizeAggregation(is_archived))) \
             FROM {aggregated} WHERE replay_id = toUUID(?)"
        ))
        .bind(replay.hyphenated().to_string())
        .fetch_one::<(u64, u64)>()
        .await
        .unwrap()
}

/// The flags that delete the replay of `ids` from `names.table`.
fn clickhouse_flags(names: &Names, ids: &recording::SegmentIds) -> Vec<String> {
    [
        "--rows-sink",
        "clickhouse",
        "--clickhouse-url",
        &clickhouse_url(),
        "--clickhouse-database",
        &clickhouse_config(&names.table).database,
        "--clickhouse-table",
        &names.table,
        "--project",
        &ids.project_id.to_string(),
        "--replay",
        &ids.replay_id,
    ]
    .map(String::from)
    .to_vec()
}

/// In the filesystem store, a writer's temporary file that a failed write or a crash left in the
/// replay's directory holds the replay's bytes: it goes with the blobs (it was not listed, and the
/// run said "nothing to delete" over it).
#[test]
fn a_temporary_file_a_crashed_write_left_goes_with_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (project, replay) = (42, "a".repeat(32));
    let ours = [
        format!("90/{project}/{replay}/0"),
        format!("90/{project}/{replay}/1.tmp-4242"),
    ];
    let another = format!("90/{project}/{}/0.tmp-4242", "b".repeat(32));
    for key in ours.iter().chain([&another]) {
        let path = dir.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"segment bytes").unwrap();
    }
    let flags = blobs_of(filesystem_flags(dir.path()), project, &replay);
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(said.contains("found 2 segment blob(s)"), "{said}");
    for key in &ours {
        assert!(!dir.path().join(key).exists(), "{key}: {said}");
    }
    assert!(dir.path().join(&another).exists(), "another replay's stays");
}

/// Through snuba the rows cannot be counted: a replay with no blob left (each of its segments
/// dead-lettered whole on the topic, or a run stopped after removing them) is still archived,
/// not taken for "nothing to delete" — at the time `--replay-timestamp` or its line in
/// `--from-file` gives. Without it there
/// is no time to archive it at (an archive stamped now would not hide it from a query over its
/// own days): nothing is published, and the run says so and exits 1 (it used to publish an
/// archive as of now and report the replay deleted).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_snuba_a_replay_without_blobs_is_archived_at_the_time_given() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    let replay = "0123456789abcdef0123456789abcdef";
    // The store holds nothing of this replay; without anything of the service's at its top it
    // would be refused as not the service's store (below).
    let other = "90/7/ffffffffffffffffffffffffffffffff/0";
    let store = gcs_store(&names.bucket, 4).await;
    store.put(other, b"another replay's").await.unwrap();
    let through_snuba = [
        "--rows-sink",
        "snuba",
        "--replay-events-topic",
        &replay_events,
    ];
    let flags = deleting(gcs_flags(&names), &through_snuba, 42, replay);
    let (code, said) = run_tool_for_status("delete", &flags);
    assert_eq!(code, Some(3), "only a time given finishes it: {said}");
    assert!(said.contains("no time given"), "{said}");
    assert!(said.contains("0 replay(s) deleted"), "{said}");
    assert!(
        said.contains(&format!("left to read it from):\n42 {replay}\n")),
        "what to run again: {said}"
    );
    assert!(
        high_watermarks(&replay_events, 1).is_empty(),
        "nothing published"
    );

    let at = [
        "--replay-timestamp".to_owned(),
        "2023-12-17T21:30:58Z".to_owned(),
    ];
    let (ok, said) = delete(&[flags.clone(), at.to_vec()].concat());
    assert!(ok, "{said}");
    assert!(said.contains("archive published"), "{said}");
    // A privacy request's record says what an archive leaves.
    assert!(
        said.contains("note: through snuba the rows are archived, not erased"),
        "{said}"
    );
    assert!(said.contains("stamped 1702848658"), "{said}");
    assert!(!said.contains("to finish"), "{said}");
    let archives = read_messages(&replay_events, 1, Duration::from_secs(20));
    assert_eq!(archives.len(), 1, "{said}");
    let schema = sentry_kafka_schemas::get_schema("ingest-replay-events", None).unwrap();
    let message = schema.validate_json(&archives[0].value).unwrap();
    assert_eq!(message["replay_id"], replay);
    assert_eq!(message["project_id"], 42);
    assert_eq!(message["payload"]["is_archived"], true);
    assert_eq!(message["payload"]["timestamp"], 1_702_848_658.0);

    // A privacy request's file gives each replay's time on its line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replays.txt");
    std::fs::write(&file, format!("42 {replay} 1702848000\n")).unwrap();
    let by_file: Vec<String> = flags
        .iter()
        .take_while(|flag| *flag != "--project")
        .cloned()
        .chain(["--from-file".to_owned(), file.display().to_string()])
        .collect();
    let (ok, said) = delete(&by_file);
    assert!(ok, "{said}");
    let archives = read_messages(&replay_events, 2, Duration::from_secs(20));
    assert_eq!(archives.len(), 2, "{said}");
    let message = schema.validate_json(&archives[1].value).unwrap();
    assert_eq!(message["payload"]["timestamp"], 1_702_848_000.0);

    // A store with nothing of the service's at its top — another bucket, a volume not mounted —
    // is refused before anything is done: every replay would be archived, its blobs left.
    // A run again does no better (exit 3).
    let elsewhere = Names::create().await;
    let flags = [
        deleting(gcs_flags(&elsewhere), &through_snuba, 42, replay),
        at.to_vec(),
    ]
    .concat();
    let (code, said) = run_tool_for_status("delete", &flags);
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains(&format!(
            "gs://{}/ is empty: is it the store the service writes to",
            elsewhere.bucket
        )) && said.contains("Nothing done"),
        "{said}"
    );
    gcs_store(&elsewhere.bucket, 4)
        .await
        .put("backups/2026-12-01.tar", b"something else's")
        .await
        .unwrap();
    let (code, said) = run_tool_for_status("delete", &flags);
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains(&format!(
            "gs://{}/ holds 1 entry at its top but neither retention prefixes (90/, …) nor dead-letter copies (dlq/)",
            elsewhere.bucket
        )),
        "{said}"
    );
    assert_eq!(
        high_watermarks(&replay_events, 1),
        [(0, 2)].into_iter().collect()
    );
}

/// Through snuba, a dry run of a replay with no blob to read its time from and none given
/// fails as the run would (it printed what it would remove and exited 0, while the run exits
/// 1 asking for the time); given a time, it says what it would publish, and removes nothing.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_dry_run_fails_where_the_run_would_and_says_what_it_would_publish() {
    let _stack = uses_stack().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let replay = "834f314caae54030a1b0dc52b202f24a";
    let blob = dir.path().join(format!("dlq/42/{replay}/t/0/3"));
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, b"a dead letter's copy").unwrap();
    let brokers = brokers();
    let through_snuba = [
        "--rows-sink",
        "snuba",
        "--replay-events-topic",
        &replay_events,
        "--brokers",
        &brokers,
        "--dry-run",
    ];
    let flags = deleting(filesystem_flags(dir.path()), &through_snuba, 42, replay);
    let (ok, said) = delete(&flags);
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!(
            "replay {replay} (project 42): no segment blob left to read its time from"
        )),
        "{said}"
    );
    assert!(!said.contains("would remove"), "{said}");
    let at = ["--replay-timestamp", "2026-11-30T12:00:00Z"].map(String::from);
    let (ok, said) = delete(&[flags, at.to_vec()].concat());
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!(
            "replay {replay} (project 42): would publish the archive on {replay_events}"
        )),
        "{said}"
    );
    assert!(said.contains("would remove file://"), "{said}");
    assert!(blob.exists(), "a dry run removes nothing");
    assert!(
        high_watermarks(&replay_events, 1).is_empty(),
        "nothing published"
    );
}

/// Through snuba, `--replay-events-topic` must exist before anything is found or removed, dry
/// run included: brokers that create topics on first use would take the archive on a mistyped
/// topic no one reads, and the run would remove the blobs and report the replay deleted.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_snuba_a_replay_events_topic_that_does_not_exist_deletes_nothing() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let missing = unique("replay-events-mistyped");
    let through_snuba = [
        "--rows-sink",
        "snuba",
        "--replay-events-topic",
        &missing,
        "--replay-timestamp",
        "2023-12-17T21:30:58Z",
    ];
    let replay = "0123456789abcdef0123456789abcdef";
    let flags = deleting(gcs_flags(&names), &through_snuba, 42, replay);
    for dry_run in [true, false] {
        let args = [
            flags.clone(),
            dry_run
                .then(|| "--dry-run".to_owned())
                .into_iter()
                .collect(),
        ]
        .concat();
        let (ok, said) = delete(&args);
        assert!(!ok, "{said}");
        assert!(
            said.contains(&format!("--replay-events-topic {missing}: "))
                && said.contains("nothing deleted"),
            "{said}"
        );
    }
}

/// Rows snuba's older processor wrote have `is_archived` NULL, not 0: they are the replay's live
/// rows all the same, counted and deleted (a delete used to find "nothing to delete" and leave
/// them). With no blob left, the archive row takes the time of the earliest of them.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn rows_with_a_null_is_archived_are_deleted_and_the_archive_takes_their_time() {
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let (_, rows, flags) = rows_of_one_replay(&names, "network-1.msgpack", |rows| {
        for row in rows {
            row.is_archived = None;
        }
    })
    .await;
    assert!(rows.len() > 1);
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(said.contains(&format!("{} row(s)", rows.len())), "{said}");
    assert!(said.contains("1 replay(s) deleted"), "{said}");
    let left = clickhouse_rows(&names.table).await;
    assert_eq!(left.len(), 1, "only the archive row: {left:?}");
    assert_eq!(left[0].is_archived, Some(1));
    let first = rows.iter().map(|r| r.timestamp).min().unwrap();
    assert_eq!(left[0].timestamp, first, "the earliest row's time");
}

/// A ClickHouse that accepts connections and never answers (hung, or a proxy holding them): the
/// run gives up within the request timeout, saying so, instead of waiting for ever (it did: no
/// ClickHouse request of the tool had a deadline).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_clickhouse_that_never_answers_fails_the_run_within_the_timeout() {
    let _stack = uses_stack().await;
    // The server behind a proxy that holds every answer for an hour.
    let proxy = proxy::Proxy::start(&clickhouse_url(), |_| {
        proxy::Action::Delay(Duration::from_secs(3600))
    })
    .await;
    let url = proxy.endpoint.clone();
    // A privacy request's file: past three lookups failed in a row, the rest are not tried
    // (each waited out its timeouts: a file of thousands ran for hours, saying nothing).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replays.txt");
    let lines: String = (0..20).map(|i| format!("1 {i:032x}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .arg("delete")
        .args([
            "--blob-sink",
            "null",
            "--rows-sink",
            "clickhouse",
            "--clickhouse-url",
            &url,
            "--sink-timeout-ms",
            "1000",
            "--from-file",
            file.to_str().unwrap(),
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Generous for a loaded machine: the run needs about one timeout per request it makes.
    let out = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while run.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let waiting = run.try_wait().unwrap().is_none();
        let _ = run.kill();
        (waiting, run.wait_with_output().unwrap())
    })
    .await
    .unwrap();
    let (waiting, out) = out;
    let said = String::from_utf8_lossy(&out.stderr);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(!waiting, "still waiting for ClickHouse after 60 s: {said}");
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("did not answer within 1s"), "{said}");
    assert_eq!(
        said.matches("its lookup was not tried: the last 3 failed in a row")
            .count(),
        17,
        "{said}"
    );
    assert_eq!(
        printed.matches("finding what it has (").count(),
        3,
        "each failed lookup is said as it happens: {printed}"
    );
    let asked = proxy.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked < 20, "{asked} requests");
}

/// A retention directory of the filesystem store that is a symbolic link (to a volume of its
/// own) holds that retention's blobs: the writer follows it, and so does `delete` (it listed the
/// link as a file, found none of the replay's blobs under it and reported the replay deleted).
#[test]
fn a_retention_directory_linked_elsewhere_is_followed_as_the_writer_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, volume) = (dir.path().join("store"), dir.path().join("volume-90"));
    let (project, replay) = (42, "c".repeat(32));
    let blob = volume.join(format!("{project}/{replay}/0"));
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, b"segment bytes").unwrap();
    std::fs::create_dir_all(&store).unwrap();
    std::os::unix::fs::symlink(&volume, store.join("90")).unwrap();
    let flags = blobs_of(filesystem_flags(&store), project, &replay);
    let (ok, said) = delete(&flags);
    assert!(ok, "{said}");
    assert!(said.contains("found 1 segment blob(s)"), "{said}");
    assert!(!blob.exists(), "{said}");
}

/// Through snuba, the runbook's second run finishes a replay whose older-layout dead-letter copy
/// (`dlq/{topic}/…`, whose owner only its value says) could not be read the first time: the
/// first run removes the replay's blobs, archives it at the time read from the earliest segment
/// blob that holds one (segment 0 here is not a recording) and prints it among the lines to run
/// again, with that time; the second run, on the request's file and those lines together, finds
/// only the copy, removes it and archives the replay at the same time. Before, a finished
/// replay was in no line, and the file's own line, without a time, was kept over a printed one:
/// the second run stopped for want of a time and the copy — a whole message of the user's —
/// stayed. And a time is read from a later segment when the earliest holds none (the replay was
/// taken for having no blob).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_snuba_an_unreadable_older_copy_is_removed_by_the_run_again_with_the_printed_times() {
    use crate::support::proxy::{Action, Proxy};
    use replay_ingest::sink::ObjectStore;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    let store = gcs_store(&names.bucket, 4).await;
    let value = fixture("console-1.msgpack");
    let processed = recording::process(&value, &Limits::default()).unwrap();
    let ids = processed.ids;
    let segment = |n| recording::blob::key(ids.retention_days, ids.project_id, &ids.replay_id, n);
    let (first, second) = (segment(0), segment(1));
    store.put(&first, b"not a recording").await.unwrap();
    store.put(&second, &processed.blob.bytes).await.unwrap();
    let copy = "dlq/ingest-replay-recordings/0/5";
    store.put(copy, &value).await.unwrap();

    // Reads of the copy answered 500 until the store is mended.
    let broken = Arc::new(AtomicBool::new(true));
    let proxy = {
        let broken = broken.clone();
        Proxy::start(&gcs_endpoint(), move |request| {
            if broken.load(Ordering::SeqCst)
                && request.path.contains("alt=media")
                && request.path.contains("ingest-replay-recordings")
            {
                Action::Answer {
                    status: 500,
                    headers: Vec::new(),
                    body: "Internal Error".into(),
                }
            } else {
                Action::Forward
            }
        })
        .await
    };
    let dir = tempfile::tempdir().unwrap();
    let request = format!("{} {}\n", ids.project_id, ids.replay_id);
    let from_file = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let mut flags = gcs_flags_at(&names.bucket, &proxy.endpoint);
        flags.extend(
            [
                "--rows-sink",
                "snuba",
                "--replay-events-topic",
                &replay_events,
                "--from-file",
                file.to_str().unwrap(),
            ]
            .map(String::from),
        );
        flags
    };

    let (ok, said) = delete(&from_file("request.txt", &request));
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!(
            "{copy}: a dead-letter copy of the older layout could not be read"
        )),
        "{said}"
    );
    let stamped: String = said
        .lines()
        .find_map(|line| {
            line.split_once("archive published on ")?
                .1
                .split_once("stamped ")
        })
        .unwrap_or_else(|| panic!("the archive is published: {said}"))
        .1
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let time: f64 = stamped.parse().unwrap();
    assert!(
        (1.6e9..1.8e9).contains(&time),
        "the time is the recording's (2023), read from segment 1, not now: {said}"
    );
    let again: Vec<&str> = said
        .lines()
        .filter(|line| line.starts_with(&format!("{} {}", ids.project_id, ids.replay_id)))
        .collect();
    assert_eq!(
        again,
        [format!("{} {} {stamped}", ids.project_id, ids.replay_id)],
        "the finished replay is printed to run again, with its time: {said}"
    );
    let gcs = gcs_client().await;
    for key in [&first, &second] {
        assert!(
            try_read_object(&gcs, &names.bucket, key).await.is_err(),
            "{key}"
        );
    }
    assert!(try_read_object(&gcs, &names.bucket, copy).await.is_ok());

    broken.store(false, Ordering::SeqCst);
    // The request's file and the printed lines, run together (`cat F F2`).
    let (ok, said) = delete(&from_file("again.txt", &format!("{request}{}\n", again[0])));
    assert!(ok, "{said}");
    assert!(
        said.contains("found 0 segment blob(s), 1 dead-letter copy object(s)"),
        "{said}"
    );
    assert!(said.contains(&format!("stamped {stamped}")), "{said}");
    assert!(
        said.contains("1 replay(s) deleted, 1 object(s) removed"),
        "{said}"
    );
    assert!(try_read_object(&gcs, &names.bucket, copy).await.is_err());
    assert_eq!(
        read_messages(&replay_events, 2, Duration::from_secs(20)).len(),
        2
    );
}

/// Through snuba, a replay with no blob left is archived for the longest retention the store
/// holds (here 365 days, another replay's), not Sentry's fixed 90: its rows, kept for the
/// project's retention, would be listed again once a shorter-lived archive expired.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_snuba_a_replay_without_blobs_is_archived_for_the_longest_retention_stored() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let names = Names::create().await;
    let replay_events = unique("replay-events");
    create_topic(&replay_events, 1).await;
    let store = gcs_store(&names.bucket, 4).await;
    store
        .put(
            "365/7/ffffffffffffffffffffffffffffffff/0",
            b"another replay's",
        )
        .await
        .unwrap();
    store
        .put(
            "30/7/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee/0",
            b"another replay's",
        )
        .await
        .unwrap();
    let through_snuba = [
        "--rows-sink",
        "snuba",
        "--replay-events-topic",
        &replay_events,
        "--replay-timestamp",
        "1702848000",
    ];
    let replay = "0123456789abcdef0123456789abcdef";
    let (ok, said) = delete(&deleting(gcs_flags(&names), &through_snuba, 42, replay));
    assert!(ok, "{said}");
    let archives = read_messages(&replay_events, 1, Duration::from_secs(20));
    assert_eq!(archives.len(), 1, "{said}");
    let schema = sentry_kafka_schemas::get_schema("ingest-replay-events", None).unwrap();
    let message = schema.validate_json(&archives[0].value).unwrap();
    assert_eq!(message["retention_days"], 365);
    assert_eq!(
        object_names(&names.bucket).len(),
        2,
        "the other replays stay"
    );
}
