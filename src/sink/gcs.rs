//! Blobs to Google Cloud Storage with the official client: one object per segment at its
//! deterministic key (rewrites are idempotent), uploaded with bounded parallelism, buffered with
//! checksums (`send_buffered`), content type `application/octet-stream`.
//!
//! Production: default endpoint and application-default credentials. Local: an explicit endpoint
//! (fake-gcs-server) and anonymous credentials. The client's own retries are off — the flush
//! retries with its policy and classification, so attempts do not multiply.

use futures::StreamExt;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_storage::client::Storage;

use super::{Entries, Entry, ObjectStore, Retry, Sink, SinkError, Written};

/// Retry classification: 408, 429 and 5xx, timeouts and transport trouble are retried; 400 and
/// 413 (this object refused) are rejections; other 4xx (permissions, missing bucket) are fatal.
pub fn classify(error: &google_cloud_storage::Error) -> Retry {
    match error.http_status_code() {
        Some(408 | 429) | Some(500..=599) => Retry::Retryable,
        Some(400 | 413) => Retry::Rejected,
        Some(400..=499) => Retry::Fatal,
        _ if error.is_serialization() => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

#[derive(Debug, Clone)]
pub struct GcsConfig {
    pub bucket: String,
    /// `None`: the production endpoint.
    pub endpoint: Option<String>,
    /// Anonymous credentials, for emulators; otherwise application-default credentials.
    pub anonymous: bool,
    /// Uploads in flight per flush.
    pub concurrency: usize,
    /// One upload past this is abandoned (and the write retried): a hung server must not wedge
    /// the flush.
    pub timeout: std::time::Duration,
}

pub struct GcsSink {
    client: Storage,
    /// `projects/_/buckets/{name}`, as the API names it.
    bucket: String,
    name: String,
    concurrency: usize,
    timeout: std::time::Duration,
}

impl GcsSink {
    /// Builds the client: credentials from the environment, or anonymous for emulators.
    pub async fn new(config: &GcsConfig) -> Result<Self, google_cloud_gax::client_builder::Error> {
        let mut builder = Storage::builder().with_retry_policy(NeverRetry);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if config.anonymous {
            builder = builder.with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build());
        }
        Ok(GcsSink {
            client: builder.build().await?,
            bucket: format!("projects/_/buckets/{}", config.bucket),
            name: config.bucket.clone(),
            concurrency: config.concurrency.max(1),
            timeout: config.timeout,
        })
    }

    async fn upload(&self, key: &str, bytes: bytes::Bytes) -> Result<(), SinkError> {
        let upload = self
            .client
            .write_object(&self.bucket, key, bytes)
            .set_content_type("application/octet-stream")
            .send_buffered();
        let error = match tokio::time::timeout(self.timeout, upload).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => SinkError::from_error("gcs", classify(&e), e),
            Err(_) => SinkError::new("gcs", Retry::Retryable, format_args!("timed out after {:?}", self.timeout)),
        };
        Err(SinkError { message: format!("{}: {}", self.location(key), error.message), ..error })
    }
}

impl Sink for GcsSink {
    fn name(&self) -> &'static str {
        "gcs"
    }

    fn write(&self, batch: &[Entry]) -> Result<Written, SinkError> {
        let uploads = batch.valid().map(|p| self.upload(&p.blob.key, p.blob.bytes.clone()));
        let results: Vec<Result<(), SinkError>> =
            super::block_on(futures::stream::iter(uploads).buffer_unordered(self.concurrency).collect());
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok(Written {
            items: batch.valid().count() as u64,
            bytes: batch.valid().map(|p| p.blob.bytes.len() as u64).sum(),
        })
    }
}

impl GcsSink {
    /// The startup check: writes a small object at [`PROBE_KEY`], which proves the bucket exists
    /// and the credentials may write to it (the same call the flush makes, classified the same).
    pub async fn check(&self) -> Result<(), SinkError> {
        let probe = bytes::Bytes::from_static(b"written by replay-ingest at startup to check write access\n");
        self.upload(PROBE_KEY, probe).await
    }
}

/// Where the startup check writes; rewritten at every start.
pub const PROBE_KEY: &str = "replay-ingest/startup-check";

impl ObjectStore for GcsSink {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), SinkError> {
        super::block_on(self.upload(key, bytes::Bytes::copy_from_slice(bytes)))
    }

    fn location(&self, key: &str) -> String {
        format!("gs://{}/{key}", self.name)
    }
}
