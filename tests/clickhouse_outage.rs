//! Fault injection: ClickHouse stops in the middle of a run and comes back 15 s later. The
//! service retries, commits nothing in between, and ends with every segment stored. (Its own
//! test binary: stopping a shared server must not disturb other tests.)

mod common;

use std::time::Duration;

use common::*;
use replay_ingest::recording::{self, Limits, RowKind};

const JOIN_AND_FLUSH: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn a_clickhouse_outage_is_ridden_out_without_committing_past_it() {
    let names = Names::create().await;
    let fixtures: Vec<Vec<u8>> = all_fixtures()
        .into_iter()
        .filter(|f| f.len() < 100_000 && recording::process(f, &Limits::default()).is_ok())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&names.args(free_port(), dir.path()));
    let (first, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    wait_for("first batch committed", JOIN_AND_FLUSH, || service.committed() == expected_commits(&first)).await;

    stack(&["stop", "clickhouse"]);
    let (second, _) = produce_fixtures(&names.topic, &fixtures, 10).await;
    // Down for 15 s: the flush retries, and the broker's commits stay where they were.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        committed(&names.group, &names.topic, 2),
        expected_commits(&first),
        "nothing committed during the outage"
    );
    stack(&["start", "clickhouse"]);

    let mut target = expected_commits(&first);
    target.extend(expected_commits(&second));
    wait_for("everything committed after the outage", JOIN_AND_FLUSH, || {
        committed(&names.group, &names.topic, 2) == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let segments = clickhouse_rows(&names.table).await.iter().filter(|r| r.kind == RowKind::Segment).count();
    assert_eq!(segments, 20, "every segment row stored once");
}
