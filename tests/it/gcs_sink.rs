//! The GCS sink against fake-gcs-server (`scripts/stack.sh up`): upload every fixture's blob,
//! read each object back byte for byte, rewrite idempotently, and classify a missing bucket. And
//! the upload request itself, as the official client sends it, against an HTTP endpoint that
//! answers with a chosen status: its content type (which the emulator does not keep, see
//! docs/local-stack.md) and the retry class of each status GCS answers with. And a latency tail
//! through a proxy in front of the emulator: a flush's retries upload only what is not stored.

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
    scripted_config(bucket, gcs_endpoint())
}

fn scripted_config(bucket: &str, endpoint: String) -> GcsConfig {
    GcsConfig {
        bucket: bucket.into(),
        endpoint: Some(endpoint),
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

/// An HTTP endpoint on 127.0.0.1 that reads each request whole and answers it with `status`;
/// the requests it read are kept.
struct Scripted {
    endpoint: String,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Scripted {
    fn answering(status: u16) -> Scripted {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = requests.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                // The request ends with the multipart closing boundary (or, for anything else,
                // a pause in the stream).
                stream
                    .set_read_timeout(Some(std::time::Duration::from_millis(500)))
                    .unwrap();
                let mut request = Vec::new();
                let mut chunk = [0u8; 65536];
                while let Ok(n @ 1..) = stream.read(&mut chunk) {
                    request.extend_from_slice(&chunk[..n]);
                    if String::from_utf8_lossy(&request)
                        .trim_end()
                        .ends_with("--\r\n0")
                    {
                        break;
                    }
                }
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&request).into_owned());
                let body = format!(r#"{{"error":{{"code":{status},"message":"scripted"}}}}"#);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Scripted { endpoint, requests }
    }

    async fn sink(&self) -> GcsSink {
        GcsSink::new(&scripted_config("scripted", self.endpoint.clone()))
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn blobs_are_uploaded_as_octet_streams() {
    let scripted = Scripted::answering(200);
    let _ = scripted.sink().await.check().await;
    let requests = scripted.requests.lock().unwrap();
    let upload = requests
        .iter()
        .find(|r| r.contains("uploadType=multipart"))
        .expect("an upload request");
    let metadata = upload
        .split("name=\"metadata\"")
        .nth(1)
        .expect("a metadata part");
    assert!(
        metadata.contains(r#""contentType":"application/octet-stream""#),
        "{upload}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_status_gcs_answers_with_is_retried_rejected_or_fatal() {
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
        let scripted = Scripted::answering(status);
        let error = scripted
            .sink()
            .await
            .check()
            .await
            .expect_err("an error status fails the upload");
        assert_eq!(error.retry, class, "HTTP {status}: {error}");
        assert!(
            error.message.contains("gs://scripted/"),
            "the error names the object: {error}"
        );
    }
}

/// A latency tail: the emulator behind a proxy that holds back every 20th upload's answer past
/// the sink's one-second deadline (5 % of requests; the object is stored all the same). A flush
/// of 600 blobs retries only the uploads that timed out, so it costs at most 1.2× the uploads and
/// every object reads back byte for byte. (Retrying the whole batch, as before, failed every
/// attempt on some slow upload: 3.8× and commits stalled.)
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_latency_tail_costs_its_share_of_uploads_again_not_the_batch() {
    let _stack = uses_stack().await;
    use crate::support::proxy::{Action, Proxy};
    use replay_ingest::pipeline::flush::{RetryPolicy, Sinks, flush};
    let bucket = crate::support::unique("blobs");
    create_bucket(&bucket);
    let proxy = Proxy::start(&gcs_endpoint(), |seen| {
        match seen.path.contains("uploadType=") && seen.nth % 20 == 19 {
            true => Action::Delay(std::time::Duration::from_millis(1500)),
            false => Action::Forward,
        }
    })
    .await;
    let config = GcsConfig {
        endpoint: Some(proxy.endpoint.clone()),
        concurrency: 32,
        timeout: std::time::Duration::from_secs(1),
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
        let lost = |_| false;
        (
            flush(&runtime, &mut batch, &sinks, &policy, &status, &lost),
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
    assert!(amplification <= 1.2, "{uploads} uploads for 600 blobs");
    for processed in batch.valid() {
        assert_eq!(
            read_object(&bucket, &processed.blob.key).await,
            processed.blob.bytes,
            "{}",
            processed.blob.key
        );
    }
}
