//! The GCS sink against fake-gcs-server (`scripts/stack.sh up`): upload every fixture's blob,
//! read each object back byte for byte, rewrite idempotently, and classify a missing bucket.

mod common;

use common::{create_bucket, gcs_endpoint, read_object};

use replay_ingest::recording::{self, Limits};
use replay_ingest::sink::gcs::{GcsConfig, GcsSink};
use replay_ingest::sink::{Batch, Entries, Entry, Outcome, Retry, Sink};

/// Every valid fixture, each with its own replay id (several synthetic ones share a real
/// segment's id, hence its key).
fn fixture_batch() -> Batch {
    let fixtures = common::all_fixtures();
    let entries = (0..fixtures.len() as u64)
        .map(|i| replay_ingest::kafka::load::fixture_copy(&fixtures, i))
        .filter_map(|value| recording::process(&value, &Limits::default()).ok())
        .enumerate()
        .map(|(i, p)| Entry { partition: 0, offset: i as i64, outcome: Outcome::Valid(Box::new(p)) })
        .collect();
    Batch { entries }
}

fn config(bucket: &str) -> GcsConfig {
    GcsConfig {
        bucket: bucket.into(),
        endpoint: Some(gcs_endpoint()),
        anonymous: true,
        concurrency: 4,
        timeout: std::time::Duration::from_secs(30),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_blob_reads_back_byte_for_byte_and_rewrites_are_idempotent() {
    let bucket = common::unique("blobs");
    create_bucket(&bucket);
    let sink = GcsSink::new(&config(&bucket)).await.unwrap();
    let batch = fixture_batch();
    let (written, sink, batch) = tokio::task::spawn_blocking(move || (sink.write(&batch), sink, batch)).await.unwrap();
    let written = written.unwrap();
    assert_eq!(written.items as usize, batch.valid().count());
    for p in batch.valid() {
        assert_eq!(read_object(&bucket, &p.blob.key).await, p.blob.bytes.as_ref(), "{}", p.blob.key);
    }
    // A redelivered batch rewrites the same keys with the same bytes.
    let (again, _, batch) = tokio::task::spawn_blocking(move || (sink.write(&batch), sink, batch)).await.unwrap();
    again.unwrap();
    let large = batch.valid().max_by_key(|p| p.blob.bytes.len()).unwrap();
    assert_eq!(read_object(&bucket, &large.blob.key).await, large.blob.bytes.as_ref());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_bucket_is_a_fatal_error() {
    let sink = GcsSink::new(&config(&common::unique("missing"))).await.unwrap();
    let error = tokio::task::spawn_blocking(move || sink.write(&fixture_batch())).await.unwrap().unwrap_err();
    assert_eq!(error.retry, Retry::Fatal, "{error}");
}
