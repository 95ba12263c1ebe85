//! The GCS sink against fake-gcs-server (`scripts/stack.sh up`): upload every fixture's blob,
//! read each object back byte for byte, rewrite idempotently, and classify a missing bucket. And,
//! through a proxy in front of the emulator: the upload request itself, as the official client
//! sends it (its content type, which the emulator does not keep, see docs/local-stack.md); the
//! retry class of each status GCS answers with, answered in the emulator's place; and a latency
//! tail, a flush's retries uploading only what is not stored.

use replay_ingest::recording::{self, Limits};
use replay_ingest::sink::gcs::{GcsConfig, GcsSink};
use replay_ingest::sink::{Batch, Entries, Entry, Outcome, Retry};

use crate::support::{create_bucket, gcs_endpoint, read_object, uses_stack};

/// Every valid fixture, each with its own replay id (several synthetic ones share a real
/// segment's id, hence its key).
fn fixture_batch() -> Batch {
    let fixtures = crate::support::all_fixtures();
    batch_of(&fixtures, fixtures.len() as u64)
}

/// `count` copies of `fixtures` in turn, each with its own replay id.
fn batch_of(fixtures: &[Vec<u8>], count: u64) -> Batch {
    let entries = (0..count)
        .map(|i| crate::support::load::fixture_copy(fixtures, i))
        .filter_map(|value| recording::process(&value, &Limits::default()).ok())
        .enumerate()
        .map(|(i, p)| Entry {
            partition: 0,
            offset: i as i64,
            outcome: Outcome::Valid(Box::new(p)),
        })
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
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn every_blob_reads_back_byte_for_byte_and_rewrites_are_idempotent() {
    let _stack = uses_stack().await;
    let bucket = crate::support::unique("blobs");
    create_bucket(&bucket);
    let sink = GcsSink::new(&config(&bucket)).await.unwrap();
    let batch = fixture_batch();
    let written = crate::support::write_once(&sink, &batch).await.unwrap();
    assert_eq!(written.items as usize, batch.valid().count());
    for p in batch.valid() {
        assert_eq!(
            read_object(&bucket, &p.blob.key).await,
            p.blob.bytes.as_ref(),
            "{}",
            p.blob.key
        );
    }
    // A redelivered batch rewrites the same keys with the same bytes.
    crate::support::write_once(&sink, &batch).await.unwrap();
    let large = batch.valid().max_by_key(|p| p.blob.bytes.len()).unwrap();
    assert_eq!(
        read_object(&bucket, &large.blob.key).await,
        large.blob.bytes.as_ref()
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_missing_bucket_is_a_fatal_error() {
    let _stack = uses_stack().await;
    let sink = GcsSink::new(&config(&crate::support::unique("missing")))
        .await
        .unwrap();
    let error = crate::support::write_once(&sink, &fixture_batch())
        .await
        .unwrap_err();
    assert_eq!(error.retry, Retry::Fatal, "{error}");
}

/// A sink on a new bucket of the emulator, reached through a proxy that answers uploads as
/// `upload` decides (their bodies are kept) and forwards the rest; the bucket and the bodies.
async fn behind_a_proxy(
    upload: impl Fn() -> crate::support::proxy::Action + Send + Sync + 'static,
) -> (
    GcsSink,
    String,
    std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    crate::support::proxy::Proxy,
) {
    let bucket = crate::support::unique("blobs");
    create_bucket(&bucket);
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let proxy = crate::support::proxy::Proxy::start(&gcs_endpoint(), move |seen| {
        if seen.path.contains("uploadType=multipart") {
            kept.lock().unwrap().push(seen.body.to_vec());
            upload()
        } else {
            crate::support::proxy::Action::Forward
        }
    })
    .await;
    let config = GcsConfig {
        endpoint: Some(proxy.endpoint.clone()),
        ..config(&bucket)
    };
    (GcsSink::new(&config).await.unwrap(), bucket, bodies, proxy)
}

/// The upload request as the official client sends it: an octet stream (the emulator does not
/// keep the content type, docs/local-stack.md, so it is read on the way).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn blobs_are_uploaded_as_octet_streams() {
    let _stack = uses_stack().await;
    let (sink, _bucket, bodies, _proxy) =
        behind_a_proxy(|| crate::support::proxy::Action::Forward).await;
    sink.check().await.unwrap();
    let bodies = bodies.lock().unwrap();
    let upload = String::from_utf8_lossy(bodies.first().expect("an upload request"));
    let metadata = upload
        .split("name=\"metadata\"")
        .nth(1)
        .expect("a metadata part");
    assert!(
        metadata.contains(r#""contentType":"application/octet-stream""#),
        "{upload}"
    );
}

/// Each status GCS answers an upload with, in the emulator's place, and the retry class the sink
/// gives it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn each_status_gcs_answers_with_is_retried_rejected_or_fatal() {
    let _stack = uses_stack().await;
    for (status, class) in [
        (408, Retry::Retryable),
        (429, Retry::Retryable),
        (500, Retry::Retryable),
        (502, Retry::Retryable),
        (503, Retry::Retryable),
        (400, Retry::Rejected),
        (413, Retry::Rejected),
        (401, Retry::Fatal),
        (403, Retry::Fatal),
        (404, Retry::Fatal),
    ] {
        let (sink, bucket, _, _proxy) =
            behind_a_proxy(move || crate::support::proxy::Action::Answer {
                status,
                headers: vec![("content-type", "application/json".into())],
                body: format!(
                    r#"{{"error":{{"code":{status},"message":"answered by the test"}}}}"#
                ),
            })
            .await;
        let error = sink
            .check()
            .await
            .expect_err("an error status fails the upload");
        assert_eq!(error.retry, class, "HTTP {status}: {error}");
        assert!(
            error.message.contains(&format!("gs://{bucket}/")),
            "the error names the object: {error}"
        );
    }
}

/// A `200` whose object is not the one sent (an endpoint that is not GCS, a proxy's own answer)
/// stores nothing this can tell of: the upload fails, to be retried, rather than count as stored
/// and let the offsets commit.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_answer_that_does_not_describe_the_object_sent_is_not_taken_as_stored() {
    let _stack = uses_stack().await;
    let (sink, _bucket, bodies, _proxy) = behind_a_proxy(|| crate::support::proxy::Action::Answer {
        status: 200,
        headers: vec![("content-type", "application/json".into())],
        body: r#"{"bucket":"projects/_/buckets/elsewhere","name":"replay-ingest/startup-check","size":"3"}"#
            .into(),
    })
    .await;
    let error = sink.check().await.expect_err("no such object was stored");
    assert_eq!(error.retry, Retry::Retryable, "{error}");
    assert!(
        error.message.contains("names an object of 3 bytes"),
        "{error}"
    );
    assert_eq!(bodies.lock().unwrap().len(), 1, "the upload was sent");
}

/// An object larger than the client's resumable threshold (16 MiB) goes up in one request, as
/// the small ones do: no resumable session, whose URL would name a capability in an error's
/// text and stay open for a week after an upload cut short.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn an_object_over_the_resumable_threshold_goes_up_in_one_request() {
    use replay_ingest::sink::ObjectStore;
    let _stack = uses_stack().await;
    let (sink, bucket, bodies, _proxy) =
        behind_a_proxy(|| crate::support::proxy::Action::Forward).await;
    let large: Vec<u8> = (0..17 << 20).map(|i: u32| (i % 251) as u8).collect();
    sink.put("large/object", &large).await.unwrap();
    assert_eq!(bodies.lock().unwrap().len(), 1, "one single-shot upload");
    assert!(read_object(&bucket, "large/object").await == large);
}

/// A latency tail: the emulator behind a proxy that holds back every 20th upload's answer past
/// the sink's five-second deadline (5 % of requests; the object is stored all the same). A flush
/// of 600 blobs retries only the uploads that timed out, so it costs about 1.05× the uploads (at
/// most 1.5× here, room for uploads a loaded machine slows past the deadline too: with a
/// one-second deadline, 32 uploads at a time on a machine busy with other tests came close) and
/// every object reads back byte for byte. (Retrying the whole batch, as before, failed every attempt on some
/// slow upload: 3.8× and commits stalled.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_latency_tail_costs_its_share_of_uploads_again_not_the_batch() {
    let _stack = uses_stack().await;
    use crate::support::proxy::{Action, Proxy};
    use replay_ingest::pipeline::flush::{Failing, Owner, RetryPolicy, Sinks, flush};
    let bucket = crate::support::unique("blobs");
    create_bucket(&bucket);
    let proxy = Proxy::start(&gcs_endpoint(), |seen| {
        match seen.path.contains("uploadType=") && seen.nth % 20 == 19 {
            true => Action::Delay(std::time::Duration::from_secs(6)),
            false => Action::Forward,
        }
    })
    .await;
    let config = GcsConfig {
        endpoint: Some(proxy.endpoint.clone()),
        concurrency: 32,
        timeout: std::time::Duration::from_secs(5),
        ..config(&bucket)
    };
    let sinks = Sinks::new(vec![vec![Box::new(GcsSink::new(&config).await.unwrap())]]);
    let batch = batch_of(&crate::support::small_fixtures(true), 600);
    let policy = RetryPolicy {
        max_attempts: 0,
        initial_backoff: std::time::Duration::from_millis(10),
        max_backoff: std::time::Duration::from_millis(100),
        misconfigured_at: 10,
    };
    let runtime = tokio::runtime::Handle::current();
    let (report, batch) = tokio::task::spawn_blocking(move || {
        let status = replay_ingest::health::Status::default();
        let mut batch = batch;
        let failing = Failing::new(Default::default());
        let owner = Owner {
            lost: &|_| false,
            held: &|| false,
        };
        (
            flush(
                &runtime, &mut batch, &sinks, &policy, &status, owner, &failing,
            ),
            batch,
        )
    })
    .await
    .unwrap();
    let report = report.expect("the flush succeeds through the tail");
    let uploads = proxy
        .paths
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.contains("uploadType="))
        .count();
    let amplification = uploads as f64 / 600.0;
    println!(
        "latency tail: {uploads} uploads for 600 blobs ({amplification:.3}×), {} held back, {} attempts",
        proxy.delayed.load(std::sync::atomic::Ordering::SeqCst),
        report.sinks[0].retries + 1
    );
    // The tail was there (answers held back, an attempt retried), and cost only its share.
    assert!(
        uploads >= 600
            && proxy.delayed.load(std::sync::atomic::Ordering::SeqCst) >= 20
            && report.sinks[0].retries >= 1,
        "the proxy held answers back and the sink retried"
    );
    assert!(amplification <= 1.5, "{uploads} uploads for 600 blobs");
    for processed in batch.valid() {
        assert_eq!(
            read_object(&bucket, &processed.blob.key).await,
            processed.blob.bytes,
            "{}",
            processed.blob.key
        );
    }
}
