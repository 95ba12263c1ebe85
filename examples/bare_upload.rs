//! Baseline for the sinks' ceiling: a bare uploader that writes COUNT blobs — the recorded
//! fixtures' own blobs, cycled, each under a fresh key — to a GCS endpoint with the service's
//! client and settings (the official crate, no client retries, `send_buffered`, the sink's
//! content type) and the same concurrency, and nothing else. What it reaches is what the endpoint
//! can take; the service's blob rate beside it says what the service leaves on the table.
//! Prints one JSON line: objects, bytes, seconds, and the seconds of each successive thousand
//! (does the endpoint slow down as it fills?).
//!
//! Usage: bare_upload ENDPOINT BUCKET COUNT CONCURRENCY FILE...

use std::time::Instant;

use futures::StreamExt;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_storage::client::Storage;
use replay_ingest::recording::{self, Limits};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, endpoint, bucket, count, concurrency, files @ ..] = args.as_slice() else {
        eprintln!("usage: bare_upload ENDPOINT BUCKET COUNT CONCURRENCY FILE...");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("COUNT is a number");
    let concurrency: usize = concurrency.parse().expect("CONCURRENCY is a number");
    let blobs: Vec<bytes::Bytes> = files
        .iter()
        .filter_map(|f| recording::process(&std::fs::read(f).ok()?, &Limits::default()).ok())
        .map(|p| p.blob.bytes)
        .collect();
    assert!(!blobs.is_empty(), "no valid fixture among the files");
    let client = Storage::builder()
        .with_endpoint(endpoint)
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .with_retry_policy(NeverRetry)
        .build()
        .await
        .expect("GCS client");
    let bucket = format!("projects/_/buckets/{bucket}");
    let started = Instant::now();
    let mut thousands = Vec::new();
    let mut last = Instant::now();
    let bytes: usize = (0..count).map(|i| blobs[i % blobs.len()].len()).sum();
    let uploads = futures::stream::iter(0..count)
        .map(|i| {
            let (client, bucket) = (&client, &bucket);
            let blob = blobs[i % blobs.len()].clone();
            async move {
                client
                    .write_object(bucket, format!("bare/{i}"), blob)
                    .set_content_type("application/octet-stream")
                    .send_buffered()
                    .await
                    .expect("upload")
            }
        })
        .buffer_unordered(concurrency);
    futures::pin_mut!(uploads);
    let mut done = 0;
    while uploads.next().await.is_some() {
        done += 1;
        if done % 1000 == 0 {
            thousands.push(format!("{:.2}", last.elapsed().as_secs_f64()));
            last = Instant::now();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"objects\":{count},\"bytes\":{bytes},\"seconds\":{seconds:.3},\"per_second\":{:.0},\"seconds_per_thousand\":[{}]}}",
        count as f64 / seconds,
        thousands.join(",")
    );
}
