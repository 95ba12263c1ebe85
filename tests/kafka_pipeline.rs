//! The consumer pipeline against the real local broker (tansu), with the filesystem blob sink and
//! the real dead-letter producer. Run through `scripts/test.sh`, which starts the broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use common::*;

const JOIN_AND_FLUSH: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn every_fixture_lands_once_as_a_blob_or_on_the_dlq_and_offsets_commit_to_the_end() {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 3).await;
    create_topic(&dlq, 1).await;
    let fixtures = all_fixtures();
    let (report, sent) = produce_fixtures(&topic, &fixtures, fixtures.len() as u64 * 2).await;
    let (blobs, dead) = outcomes(&sent);

    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let target = expected_commits(&report);
    wait_for("every partition committed to its end", JOIN_AND_FLUSH, || service.committed() == target).await;
    assert_eq!(service.terminate(), Some(0), "a clean shutdown exits 0");

    let written: BTreeSet<String> = files_under(dir.path()).into_iter().collect();
    assert_eq!(written, blobs, "exactly the valid segments' blob keys, once each");
    for key in &blobs {
        let stored = std::fs::read(dir.path().join(key)).unwrap();
        assert_eq!(stored.first(), Some(&0x78), "{key} is a zlib stream");
    }
    let got: BTreeSet<_> = read_dlq(&dlq, dead.len(), Duration::from_secs(30)).into_iter().collect();
    assert_eq!(got, dead, "each invalid message on the DLQ, with its reason");
    assert_eq!(committed(&group, &topic, 3), target, "the broker has the same commits");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_service_resumes_after_its_commits_without_skipping_or_repeating() {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let fixtures: Vec<Vec<u8>> = all_fixtures().into_iter().filter(|f| f.len() < 100_000).collect();
    let dir = tempfile::tempdir().unwrap();
    let args = service_args(&topic, &dlq, &group, dir.path(), free_port());

    let (first, first_sent) = produce_fixtures(&topic, &fixtures, 30).await;
    let service = Service::start(&args);
    wait_for("first batch committed", JOIN_AND_FLUSH, || service.committed() == expected_commits(&first)).await;
    assert_eq!(service.terminate(), Some(0));

    let (second, second_sent) = produce_fixtures(&topic, &fixtures, 30).await;
    let service = Service::start(&args);
    wait_for("second batch committed", JOIN_AND_FLUSH, || service.committed() == expected_commits(&second)).await;
    let consumed = service.status().unwrap()["consumed"].as_u64().unwrap();
    assert_eq!(service.terminate(), Some(0));

    assert_eq!(
        consumed, 30,
        "the restart reads exactly the new messages: a broker that skipped or replayed committed messages fails here"
    );
    let (mut blobs, _) = outcomes(&first_sent);
    blobs.extend(outcomes(&second_sent).0);
    assert_eq!(files_under(dir.path()).into_iter().collect::<BTreeSet<_>>(), blobs);
}

/// Merges produce reports: the last offset per partition over all of them.
fn last_offsets(reports: &[replay_ingest::kafka::load::Produced]) -> BTreeMap<i32, i64> {
    let mut last = BTreeMap::new();
    for report in reports {
        for (&p, &o) in &report.last_offsets {
            let slot = last.entry(p).or_insert(o);
            *slot = (*slot).max(o + 1);
        }
    }
    last.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_service_mid_flush_again_and_again_loses_nothing() {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 3).await;
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let args = service_args(&topic, &dlq, &group, dir.path(), free_port());

    // Producing goes on in the background while the service is killed and restarted.
    let producing = {
        let topic = topic.clone();
        tokio::spawn(async move {
            let fixtures = all_fixtures();
            let mut reports = Vec::new();
            let mut expected = Vec::new();
            for _ in 0..8 {
                let (report, wave) = produce_fixtures(&topic, &fixtures, 40).await;
                reports.push(report);
                expected.extend(wave);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (reports, expected)
        })
    };
    for round in 0..4u64 {
        let service = Service::start(&args);
        wait_for("the service flushing", JOIN_AND_FLUSH, || {
            service.status().is_some_and(|s| s["flushed"].as_u64().unwrap_or(0) > 0)
        })
        .await;
        // Flushes run every ~200 ms: a kill at an uneven delay lands mid-flush or mid-commit.
        tokio::time::sleep(Duration::from_millis(150 + 170 * round)).await;
        service.kill9();
    }
    let (reports, expected) = producing.await.unwrap();
    let target = last_offsets(&reports);

    let service = Service::start(&args);
    wait_for("everything committed after the last restart", JOIN_AND_FLUSH, || committed(&group, &topic, 3) == target)
        .await;
    assert_eq!(service.terminate(), Some(0));

    let (blobs, dead) = outcomes(&expected);
    let written: BTreeSet<String> = files_under(dir.path()).into_iter().filter(|f| !f.contains(".tmp-")).collect();
    let missing: Vec<_> = blobs.difference(&written).collect();
    assert!(
        missing.is_empty(),
        "{} of {} segments missing after kill -9, e.g. {:?}",
        missing.len(),
        blobs.len(),
        missing.first()
    );
    assert!(written.is_subset(&blobs), "nothing but the produced segments");
    let got: BTreeSet<_> = read_dlq(&dlq, dead.len(), Duration::from_secs(30)).into_iter().collect();
    let lost: Vec<_> = dead.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} of {} invalid messages never reached the DLQ (duplicates allowed, loss not): {:?}",
        lost.len(),
        dead.len(),
        lost.first()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_leaving_the_group_under_load_loses_nothing() {
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 4).await;
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let fixtures: Vec<Vec<u8>> = all_fixtures().into_iter().filter(|f| f.len() < 100_000).collect();

    let first = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let second = Service::start(&service_args(&topic, &dlq, &group, dir.path(), free_port()));
    let (mut reports, mut expected) = (Vec::new(), Vec::new());
    let (report, wave) = produce_fixtures(&topic, &fixtures, 60).await;
    reports.push(report);
    expected.extend(wave);
    let both_consuming =
        |s: &Service| s.status().is_some_and(|s| s["assigned"] == true && s["flushed"].as_u64() > Some(0));
    wait_for("both members consuming", JOIN_AND_FLUSH, || both_consuming(&first) && both_consuming(&second)).await;

    // Under load: one member leaves while messages keep coming.
    let leaving = tokio::task::spawn_blocking(move || first.terminate());
    for _ in 0..5 {
        let (report, wave) = produce_fixtures(&topic, &fixtures, 40).await;
        reports.push(report);
        expected.extend(wave);
    }
    assert_eq!(leaving.await.unwrap(), Some(0), "the leaving member drains and exits cleanly");
    let target = last_offsets(&reports);
    wait_for("the remaining member commits everything", JOIN_AND_FLUSH, || committed(&group, &topic, 4) == target)
        .await;
    let rebalances = second.status().unwrap()["rebalances"].as_u64().unwrap();
    assert_eq!(second.terminate(), Some(0));

    assert!(rebalances >= 1, "the remaining member saw the rebalance");
    let (blobs, _) = outcomes(&expected);
    let written: BTreeSet<String> = files_under(dir.path()).into_iter().collect();
    assert_eq!(written, blobs, "every segment stored, whichever member consumed it");
}
