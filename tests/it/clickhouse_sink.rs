//! The ClickHouse sink against the real local server (`scripts/stack.sh up`): migrate, insert the
//! rows of every fixture, read every column back, and show reinsertion stays idempotent.

use replay_ingest::recording::ReplayRow;
use replay_ingest::sink::clickhouse::{ClickHouseConfig, ClickHouseSink, check_table, migrate};
use replay_ingest::sink::{Batch, Retry, SinkError, Written};

use crate::support::uses_stack;

fn config(table: &str) -> ClickHouseConfig {
    ClickHouseConfig {
        database: "replay_ingest_test".into(),
        chunk_rows: 7,
        ..crate::support::clickhouse_config(table)
    }
}

/// What the table holds after merging: per deduplication key (project, day, replay, event
/// hash), the row inserted last — `ReplacingMergeTree` without a version, as snuba has it.
fn expected_rows(batch: &Batch) -> Vec<ReplayRow> {
    let mut merged = std::collections::BTreeMap::new();
    for row in crate::support::rows_of(batch) {
        merged.insert(
            (
                row.replay_id,
                row.event_hash,
                row.project_id,
                row.timestamp / 86_400,
            ),
            row,
        );
    }
    merged.into_values().collect()
}

/// The table after merging, in the same order as `expected_rows` (ClickHouse orders UUIDs
/// differently from Rust, so sort here).
async fn read_back(config: &ClickHouseConfig) -> Vec<ReplayRow> {
    let client = replay_ingest::sink::clickhouse::client(config);
    let mut rows = client
        .query(&format!("SELECT ?fields FROM {} FINAL", config.table))
        .fetch_all::<ReplayRow>()
        .await
        .unwrap();
    rows.sort_by_key(|r| {
        (
            r.replay_id,
            r.event_hash,
            r.project_id,
            r.timestamp / 86_400,
        )
    });
    rows
}

fn assert_same_rows(got: &[ReplayRow], expected: &[ReplayRow]) {
    assert_eq!(got.len(), expected.len(), "row count");
    for (got, expected) in got.iter().zip(expected) {
        assert_eq!(got, expected, "every column, field by field");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn every_column_of_every_row_reads_back_and_a_second_insert_collapses() {
    let _stack = uses_stack().await;
    let config = config(&crate::support::unique("replays").replace('-', "_"));
    migrate(&config).await.unwrap();
    let batch = crate::support::fixture_batch();
    let expected = expected_rows(&batch);
    assert!(
        expected.iter().any(|r| r.click_is_rage == 1),
        "fixtures include a rage click"
    );
    assert!(
        expected.iter().any(|r| !r.tap_view_id.is_empty()),
        "and taps"
    );
    assert!(
        expected
            .iter()
            .any(|r| r.is_segment() && !r.error_ids.is_empty()),
        "and segment rows"
    );
    assert!(
        expected.iter().any(|r| r.ip_address_v4.is_some()),
        "and an IPv4 address"
    );
    assert!(
        expected.iter().any(|r| r.ip_address_v6.is_some()),
        "and an IPv6 address"
    );

    let sink = ClickHouseSink::new(&config);
    let batch = crate::support::fixture_batch();
    crate::support::write_once(&sink, &batch).await.unwrap();
    assert_same_rows(&read_back(&config).await, &expected);

    // The same batch again (a redelivery): after merging, still one row per event_hash.
    crate::support::write_once(&sink, &batch).await.unwrap();
    let client = replay_ingest::sink::clickhouse::client(&config);
    let count_final: u64 = client
        .query(&format!("SELECT count() FROM {} FINAL", config.table))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(
        count_final as usize,
        expected.len(),
        "collapsed at read time"
    );
    // OPTIMIZE is a no-op while a background merge runs: repeat it until the parts are merged.
    let mut count = 0;
    for _ in 0..40 {
        client
            .query(&format!("OPTIMIZE TABLE {} FINAL", config.table))
            .execute()
            .await
            .unwrap();
        count = client
            .query(&format!("SELECT count() FROM {}", config.table))
            .fetch_one::<u64>()
            .await
            .unwrap();
        if count as usize == expected.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(
        count as usize,
        expected.len(),
        "collapsed on disk after OPTIMIZE … FINAL"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_column_altered_after_startup_makes_writes_fatal_naming_the_column() {
    let _stack = uses_stack().await;
    let config = config(&crate::support::unique("wrong").replace('-', "_"));
    migrate(&config).await.unwrap();
    let client = replay_ingest::sink::clickhouse::client(&config);
    client
        .query(&format!(
            "ALTER TABLE {} MODIFY COLUMN click_node_id Date",
            config.table
        ))
        .execute()
        .await
        .unwrap();
    client
        .query(&format!(
            "ALTER TABLE {} MODIFY COLUMN replay_type UInt64",
            config.table
        ))
        .execute()
        .await
        .unwrap();
    let sink = ClickHouseSink::new(&config);
    // RowBinary carries no types: the server misreads the rows and answers with a data error or
    // an absurd allocation, depending on the bytes. Either way the sink names the cause.
    let error = crate::support::write_once(&sink, &crate::support::fixture_batch())
        .await
        .unwrap_err();
    assert_eq!(error.retry, Retry::Fatal, "{error}");
    assert!(
        error
            .message
            .contains("column replay_type is UInt64, expected Nullable(String)"),
        "{error}"
    );
    assert!(
        error
            .message
            .contains("column click_node_id is Date, expected UInt32"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_startup_check_names_a_missing_table_missing_columns_and_wrong_types_and_passes_a_migrated_one()
 {
    let _stack = uses_stack().await;
    let config = config(&crate::support::unique("check").replace('-', "_"));
    let missing = check_table(&config).await.unwrap_err();
    assert_eq!(missing.retry, Retry::Fatal);
    assert!(
        missing.message.contains("does not exist") && missing.message.contains("migrate"),
        "{missing}"
    );

    migrate(&config).await.unwrap();
    check_table(&config).await.unwrap();

    let client = replay_ingest::sink::clickhouse::client(&config);
    client
        .query(&format!(
            "ALTER TABLE {} DROP COLUMN tap_view_id",
            config.table
        ))
        .execute()
        .await
        .unwrap();
    client
        .query(&format!(
            "ALTER TABLE {} MODIFY COLUMN urls String",
            config.table
        ))
        .execute()
        .await
        .unwrap();
    let lacking = check_table(&config).await.unwrap_err();
    assert_eq!(lacking.retry, Retry::Fatal);
    let differs = "does not match the rows: column urls is String, expected Array(String); column tap_view_id is missing";
    assert!(lacking.message.ends_with(differs), "{lacking}");
    // `migrate` leaves an existing table as it is, and says how it differs (it said "ready").
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args(["migrate", "--clickhouse-url", &config.url])
        .args(["--clickhouse-database", &config.database])
        .args(["--clickhouse-table", &config.table])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&migrated.stderr);
    assert!(
        migrated.status.code() == Some(1) && said.contains(differs) && !said.contains("ready"),
        "{:?}: {said}",
        migrated.status
    );

    // Nothing listening: the server is down, which is waited out, not a configuration error.
    let down = ClickHouseConfig {
        url: format!("http://127.0.0.1:{}", crate::support::free_port()),
        ..config
    };
    assert_eq!(
        check_table(&down).await.unwrap_err().retry,
        Retry::Retryable
    );
}

/// An INSERT answered `200` with a ClickHouse exception — what a proxy or load balancer in
/// between can send — is an error classified by its code like any other: with the exception
/// code in `X-ClickHouse-Exception-Code` (how ClickHouse marks one), with the exception in the
/// body ending as ClickHouse ends it (its version), and with the exception alone in the body,
/// in today's format and in 18.16's (before: counted as written, so committed messages had blobs
/// and no rows).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_insert_answered_200_with_an_exception_is_an_error_of_its_code() {
    let _stack = uses_stack().await;
    let config = config(&crate::support::unique("replays").replace('-', "_"));
    migrate(&config).await.unwrap();
    let memory = "Code: 241. DB::Exception: Memory limit (total) exceeded: would use 9.31 GiB. (MEMORY_LIMIT_EXCEEDED)";
    let parse =
        "Code: 27. DB::Exception: Cannot parse input: expected '\\t' before: 'x': (at row 3)";
    let auth = "Code: 516. DB::Exception: default: Authentication failed. (AUTHENTICATION_FAILED)";
    let version = " (version 25.8.16.10001 (official build))\n";
    let cases = [
        (Some("241"), memory.to_owned(), Retry::Retryable),
        (Some("27"), parse.to_owned(), Retry::Rejected),
        (Some("516"), auth.to_owned(), Retry::Fatal),
        (None, format!("{memory}{version}"), Retry::Retryable),
        (None, format!("{parse}{version}"), Retry::Rejected),
        (None, format!("{parse}\n"), Retry::Rejected),
        (None, memory.to_owned(), Retry::Retryable),
        (
            None,
            "Code: 193, e.displayText() = DB::Exception: Wrong password for user default, e.what() = DB::Exception\n"
                .to_owned(),
            Retry::Fatal,
        ),
    ];
    for (code, body, expected) in cases {
        let headers = code
            .map(|c| ("X-ClickHouse-Exception-Code", c.to_owned()))
            .into_iter()
            .collect();
        let (result, answered) = insert_answered(&config, 200, headers, body.clone()).await;
        let error = result.expect_err(&format!("200 with {code:?} and {body:?} is not success"));
        assert_eq!(error.retry, expected, "{code:?} {body:?}: {error}");
        let said = format!("Code: {}", code.unwrap_or(&body[6..9]));
        assert!(
            error.message.contains(said.trim_end_matches([',', '.'])),
            "the exception in the error: {error}"
        );
        assert!(answered >= 1);
    }
    assert!(
        read_back(&config).await.is_empty(),
        "precondition: the proxy answered every INSERT itself"
    );
}

/// One write of the fixture batch to `config`'s table through a proxy that answers every INSERT
/// itself, with `status`, `headers` and `body`, and forwards the rest; how many it answered.
async fn insert_answered(
    config: &ClickHouseConfig,
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
) -> (Result<Written, SinkError>, usize) {
    use crate::support::proxy::{Action, Proxy};
    let proxy = Proxy::start(&crate::support::clickhouse_url(), move |seen| {
        match seen.path.contains("INSERT") {
            true => Action::Answer {
                status,
                headers: headers.clone(),
                body: body.clone(),
            },
            false => Action::Forward,
        }
    })
    .await;
    let sink = ClickHouseSink::new(&ClickHouseConfig {
        url: proxy.endpoint.clone(),
        ..config.clone()
    });
    let result = crate::support::write_once(&sink, &crate::support::fixture_batch()).await;
    (
        result,
        proxy.answered.load(std::sync::atomic::Ordering::SeqCst),
    )
}

/// An error status a proxy in front of ClickHouse answers itself (no `X-ClickHouse-…` header, an
/// HTML body without a ClickHouse code) is classified by its status: nginx's 413 past its body
/// limit is refused data, which halving shrinks (before: retried whole without end, the
/// partition stalled for good); an auth proxy's 401 is configuration (before: an endless
/// outage); a 502 is retried. ClickHouse's own errors keep their codes (every other test here).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_error_a_proxy_answers_itself_is_classified_by_its_status() {
    let _stack = uses_stack().await;
    let config = config(&crate::support::unique("replays").replace('-', "_"));
    migrate(&config).await.unwrap();
    for (status, reason, expected) in [
        (413, "Request Entity Too Large", Retry::Rejected),
        (401, "Unauthorized", Retry::Fatal),
        (502, "Bad Gateway", Retry::Retryable),
    ] {
        let headers = vec![("Content-Type", "text/html".to_owned())];
        let body =
            format!("<html><head><title>{status} {reason}</title></head><body>nginx</body></html>");
        let (result, _) = insert_answered(&config, status, headers, body).await;
        let error = result.expect_err(&format!("{status} is not success"));
        assert_eq!(error.retry, expected, "{status}: {error}");
        assert!(
            error.message.contains(&format!("answered {status} "))
                && error.message.contains("by a proxy in front of ClickHouse"),
            "{error}"
        );
    }
}

/// A proxy that refuses an INSERT's body past its limit while the sink is still sending it
/// (nginx's `client_max_body_size` on a chunked body: it answers 413 once the limit is passed and
/// reads no more) is heard: the write is refused data, which the flush halves until each part
/// fits (one message's rows go through). The answer came while the body was being sent, which the
/// clickhouse crate reports as a closed channel, not as the answer: the write was taken for a
/// network outage and retried whole, without end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_body_a_proxy_refuses_while_it_is_sent_is_refused_data_not_an_outage() {
    let _stack = uses_stack().await;
    use crate::support::proxy::Proxy;
    use replay_ingest::sink::{Entry, Outcome};
    let config = config(&crate::support::unique("replays").replace('-', "_"));
    migrate(&config).await.unwrap();
    // Bodies are LZ4-compressed, and these repeat themselves: a low limit.
    const LIMIT: usize = 1024;
    let proxy = Proxy::start_with_body_limit(&crate::support::clickhouse_url(), LIMIT, 413).await;
    let sink = ClickHouseSink::new(&ClickHouseConfig {
        url: proxy.endpoint.clone(),
        chunk_rows: 1_000_000,
        ..config.clone()
    });
    // The fixtures' messages many times over: an INSERT of several of the crate's 256 KiB
    // chunks (before compression), the first sent before the proxy answers and the next meeting
    // the closed channel.
    let fixtures = crate::support::fixture_batch();
    let entries: Vec<Entry> = (0..100)
        .flat_map(|round| {
            fixtures.iter().map(move |entry| Entry {
                partition: entry.partition,
                offset: round * 1_000 + entry.offset,
                outcome: match &entry.outcome {
                    Outcome::Valid(p) => Outcome::Valid(p.clone()),
                    other => panic!("a valid fixture: {other:?}"),
                },
            })
        })
        .collect();
    let batch = Batch { entries };
    let bytes: usize = crate::support::rows_of(&batch)
        .iter()
        .map(|row| serde_json::to_vec(row).unwrap().len())
        .sum();
    assert!(bytes > 4 * 256 * 1024, "{bytes} bytes of rows, as JSON");
    let error = crate::support::write_once(&sink, &batch).await.unwrap_err();
    assert_eq!(error.retry, Retry::Rejected, "{error}");
    assert!(
        error.message.contains("answered 413 ") && error.message.contains("by a proxy"),
        "{error}"
    );
    assert!(proxy.answered.load(std::sync::atomic::Ordering::SeqCst) > 0);
    crate::support::write_once(&sink, &batch[..1])
        .await
        .unwrap();
}

/// A write cut into many INSERTs (one per message here: `chunk_rows` 1) whose fifth INSERT fails:
/// the retry sends the INSERTs the server did not take — the fifth and those after it — not the
/// whole batch again. With one deadline for all of a write's INSERTs and nothing kept between
/// attempts, a batch cut into many (segments with clicks over many weeks touch many partitions)
/// failed every attempt at the same place, and its partition never committed again.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_retry_sends_only_the_inserts_the_server_did_not_take() {
    let _stack = uses_stack().await;
    use crate::support::proxy::{Action, Proxy};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let config = ClickHouseConfig {
        chunk_rows: 1,
        ..config(&crate::support::unique("replays").replace('-', "_"))
    };
    migrate(&config).await.unwrap();
    let inserts = Arc::new(AtomicUsize::new(0));
    let counted = inserts.clone();
    let proxy = Proxy::start(&crate::support::clickhouse_url(), move |seen| {
        if !seen.path.contains("INSERT") {
            return Action::Forward;
        }
        match counted.fetch_add(1, Ordering::SeqCst) + 1 {
            5 => Action::Answer {
                status: 500,
                headers: vec![("X-ClickHouse-Exception-Code", "241".to_owned())],
                body: "Code: 241. DB::Exception: Memory limit (total) exceeded. (MEMORY_LIMIT_EXCEEDED)"
                    .to_owned(),
            },
            _ => Action::Forward,
        }
    })
    .await;
    let sink = ClickHouseSink::new(&ClickHouseConfig {
        url: proxy.endpoint.clone(),
        ..config.clone()
    });
    let batch = crate::support::fixture_batch();
    let messages = batch
        .iter()
        .filter(|e| replay_ingest::sink::Sink::writes_for(&sink, e))
        .count();
    assert!(messages > 5, "{messages} messages with rows");
    let status = replay_ingest::health::Status::default();
    let progress = replay_ingest::sink::Progress::new("clickhouse", &status);
    let sink: &dyn replay_ingest::sink::Sink = &sink;
    let failed = sink.write(&batch, &progress).await.unwrap_err();
    assert_eq!(failed.retry, Retry::Retryable, "{failed}");
    assert_eq!(inserts.load(Ordering::SeqCst), 5);
    sink.write(&batch, &progress).await.unwrap();
    assert_eq!(
        inserts.load(Ordering::SeqCst),
        5 + (messages - 4),
        "the retry sent the fifth INSERT and those after it"
    );
    assert_same_rows(&read_back(&config).await, &expected_rows(&batch));
}

/// A server that takes over half the timeout to answer each INSERT (under load, throttling
/// parts) gets the write in as many INSERTs as one that answers at once. Each INSERT was opened
/// and timed from before the answer to the one it followed, so it was "open half the timeout"
/// at its second message and ended: one INSERT per message, each waiting the slow answer, more
/// parts for a server already slow with them.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_server_slow_to_answer_gets_inserts_as_large_as_a_fast_one() {
    let _stack = uses_stack().await;
    use crate::support::proxy::{Action, Proxy};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;
    let batch = crate::support::fixture_batch();
    let total_rows = crate::support::rows_of(&batch).len();
    let config = ClickHouseConfig {
        // Two or three INSERTs for the batch.
        chunk_rows: total_rows / 2,
        // Half of it is what the answer below takes past; the rest is room for a loaded server.
        timeout: Duration::from_secs(8),
        ..config(&crate::support::unique("replays").replace('-', "_"))
    };
    migrate(&config).await.unwrap();
    let inserts = Arc::new(AtomicUsize::new(0));
    let slow = Arc::new(AtomicBool::new(false));
    let (counted, slowed) = (inserts.clone(), slow.clone());
    let proxy = Proxy::start(&crate::support::clickhouse_url(), move |seen| {
        if !seen.path.contains("INSERT") {
            return Action::Forward;
        }
        counted.fetch_add(1, Ordering::SeqCst);
        if slowed.load(Ordering::SeqCst) {
            Action::Delay(Duration::from_millis(4400))
        } else {
            Action::Forward
        }
    })
    .await;
    let sink = ClickHouseSink::new(&ClickHouseConfig {
        url: proxy.endpoint.clone(),
        ..config.clone()
    });
    let sink: &dyn replay_ingest::sink::Sink = &sink;
    let status = replay_ingest::health::Status::default();
    let write = || async {
        let progress = replay_ingest::sink::Progress::new("clickhouse", &status);
        let before = inserts.load(Ordering::SeqCst);
        sink.write(&batch, &progress).await.unwrap();
        inserts.load(Ordering::SeqCst) - before
    };
    let fast = write().await;
    assert!(fast >= 2, "{fast} INSERTs: the batch should need several");
    slow.store(true, Ordering::SeqCst);
    assert_eq!(write().await, fast, "INSERTs of a server slow to answer");
    assert_same_rows(&read_back(&config).await, &expected_rows(&batch));
}

/// Rows a write cannot send within one timeout — here a long environment, repeated on every
/// click and tap row of its segment (a producer that bypasses Relay; a slow link does the same
/// to ordinary rows) — go as several INSERTs, each ended once it has been open half the timeout,
/// and the write gets through (attempt by attempt, should an INSERT still time out). With the
/// whole batch in one INSERT (its rows far under `chunk_rows`) and one deadline to send it,
/// every attempt timed out at the same place: a partition stalled for good on valid messages,
/// its flush "progressing" by timing out.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn rows_one_deadline_cannot_carry_go_as_several_inserts_that_each_fit() {
    let _stack = uses_stack().await;
    use replay_ingest::recording::replay_event::TextField;
    use replay_ingest::sink::{Entry, Outcome};
    let config = ClickHouseConfig {
        chunk_rows: 100_000,
        timeout: std::time::Duration::from_millis(400),
        ..config(&crate::support::unique("replays").replace('-', "_"))
    };
    migrate(&config).await.unwrap();
    let environment = "e".repeat(1 << 20);
    let with_environment: Vec<Entry> = crate::support::fixture_batch()
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Valid(p) if p.replay_event.is_some() => {
                let mut p = p.clone();
                if let Some(event) = p.replay_event.as_mut() {
                    event.set_text(TextField::environment, Some(&environment));
                }
                Some(p)
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .into_iter()
        .cycle()
        .take(80)
        .enumerate()
        .map(|(i, p)| Entry {
            partition: 1,
            offset: i as i64,
            outcome: Outcome::Valid(p),
        })
        .collect();
    let batch = Batch {
        entries: with_environment,
    };
    let rows = crate::support::rows_of(&batch);
    let sent: usize = rows
        .iter()
        .map(|r| r.environment.as_deref().map_or(0, str::len))
        .sum();
    assert!(
        rows.len() < config.chunk_rows && sent > 128 << 20,
        "{} rows, {sent} bytes of environment: one INSERT, too large for one deadline",
        rows.len()
    );
    let status = replay_ingest::health::Status::default();
    let progress = replay_ingest::sink::Progress::new("clickhouse", &status);
    let sink = ClickHouseSink::new(&config);
    let sink: &dyn replay_ingest::sink::Sink = &sink;
    // The flush's retries, without their backoff: each attempt goes on from the first INSERT
    // the server did not take.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match sink.write(&batch, &progress).await {
            Ok(_) => break,
            Err(e) if e.retry == Retry::Retryable && attempts < 100 => {}
            Err(e) => panic!("attempt {attempts}: {e}"),
        }
    }
    assert_same_rows(&read_back(&config).await, &expected_rows(&batch));
}

/// The local server's `users.d` (read again by the server within seconds).
fn users_d() -> std::path::PathBuf {
    crate::support::stack_dir().join("clickhouse/users.d")
}

/// A user of the local server, made by [`user_with_password`]: its files are removed when
/// dropped, the test passing or not.
struct User(String);

impl Drop for User {
    fn drop(&mut self) {
        for entry in std::fs::read_dir(users_d()).into_iter().flatten().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{}-", self.0))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Makes `user` a user of the local server whose password is `password`, or changes its
/// password; returns once the server takes it. Each password is a file of its own, the one
/// before removed: a changed list of files is always read again, where a file rewritten within
/// the second of the server's last reading (it compares times in whole seconds) may not be.
async fn user_with_password(user: &User, password: &str, table_config: &ClickHouseConfig) {
    std::fs::create_dir_all(users_d()).unwrap();
    drop(User(user.0.clone()));
    let user = &user.0;
    std::fs::write(
        users_d().join(format!("{user}-{password}.xml")),
        format!(
            "<yandex><users><{user}><password>{password}</password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></{user}></users></yandex>"
        ),
    )
    .unwrap();
    let config = ClickHouseConfig {
        user: user.to_owned(),
        password: replay_ingest::secret::Secret::new(password),
        ..table_config.clone()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while check_table(&config).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not take {user}'s new password within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Rotating the password the documented way — the Secret (the password file) first, then the
/// server — needs no restart: the write the server refuses with the old password reads the file
/// again and goes on with the new one, within the same attempt. While the file still holds the
/// refused password (or one the server refuses too), the refusal stays a configuration error, as
/// at startup (before: every refusal was
/// fatal, so each pod exited on its next write and restarted to read the file).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_password_rotated_secret_first_is_read_again_from_its_file_without_a_restart() {
    let _stack = uses_stack().await;
    let base = config(&crate::support::unique("replays").replace('-', "_"));
    migrate(&base).await.unwrap();
    let user = User(crate::support::unique("rotating").replace('-', "_"));
    let (old, new) = (format!("old_{}", user.0), format!("new_{}", user.0));
    user_with_password(&user, &old, &base).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clickhouse-password");
    std::fs::write(&file, format!("{old}\n")).unwrap();
    let sink = ClickHouseSink::new(&ClickHouseConfig {
        user: user.0.clone(),
        password: replay_ingest::secret::Secret::new(&old),
        password_file: Some(file.clone()),
        ..base.clone()
    });
    let batch = crate::support::fixture_batch();
    crate::support::write_once(&sink, &batch).await.unwrap();

    // The server first, the file not yet: refused, as a configuration error.
    user_with_password(&user, &new, &base).await;
    let refused = crate::support::write_once(&sink, &batch).await.unwrap_err();
    assert_eq!(refused.retry, Retry::Fatal, "{refused}");

    // A file holding a password the server refuses too: read once, then the configuration
    // error again (not a retry without end).
    let wrong = format!("wrong_{}", user.0);
    std::fs::write(&file, format!("{wrong}\n")).unwrap();
    let refused = crate::support::write_once(&sink, &batch).await.unwrap_err();
    assert_eq!(refused.retry, Retry::Fatal, "{refused}");
    assert!(!refused.message.contains(&wrong), "{refused}");

    // Then the right one: the refusal reads it, and the same write goes on with it (one
    // attempt: `--flush-max-attempts 1` rides out a rotation too).
    std::fs::write(&file, format!("{new}\n")).unwrap();
    let written = crate::support::write_once(&sink, &batch).await.unwrap();
    assert!(written.items > 0);
    assert_eq!(read_back(&base).await, expected_rows(&batch));
}
