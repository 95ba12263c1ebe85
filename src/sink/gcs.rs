//! Blobs to Google Cloud Storage with the official client: one object per segment at its
//! deterministic key (rewrites are idempotent), uploaded with bounded parallelism, buffered with
//! checksums (`send_buffered`), content type `application/octet-stream`.
//!
//! Production: default endpoint and application-default credentials. Local: an explicit endpoint
//! (fake-gcs-server) and anonymous credentials. The client's own retries are off — the flush
//! retries with its policy and classification, so attempts do not multiply.

use clap::Args;
use clap::builder::RangedU64ValueParser;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::LocalBoxFuture;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_storage::client::Storage;

use super::progress::keep_telling;
use super::{
    Built, Check, Entries, Entry, ObjectStore, Outcome, Piece, Progress, Retry, Sink, SinkError,
    Writing, Written,
};

/// Google Cloud Storage.
#[derive(Args, Debug, Clone)]
pub struct GcsArgs {
    /// Bucket for segment blobs (required with `--blob-sink gcs`).
    #[arg(long, env = "REPLAY_INGEST_GCS_BUCKET")]
    pub gcs_bucket: Option<String>,
    /// Storage endpoint, for emulators (e.g. `http://127.0.0.1:4443`); production uses the default.
    #[arg(long, env = "REPLAY_INGEST_GCS_ENDPOINT")]
    pub gcs_endpoint: Option<String>,
    /// Anonymous credentials (emulators). Otherwise application-default credentials: Workload
    /// Identity, or the key file named by `GOOGLE_APPLICATION_CREDENTIALS`.
    #[arg(long, env = "REPLAY_INGEST_GCS_ANONYMOUS")]
    pub gcs_anonymous: bool,
    /// Uploads in flight per flush. More hides latency; each holds a connection.
    #[arg(long, env = "REPLAY_INGEST_GCS_UPLOAD_CONCURRENCY", value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024), default_value_t = 32)]
    pub gcs_upload_concurrency: usize,
}

impl GcsArgs {
    /// Rejects settings that cannot work: no bucket, an endpoint that is not an HTTP(S) URL —
    /// and a plain `http://` endpoint off this host with real credentials, which would carry
    /// the Google access token in the clear (emulators run with `--gcs-anonymous`).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(endpoint) = &self.gcs_endpoint {
            super::http_url("--gcs-endpoint", endpoint)?;
            if !self.gcs_anonymous && cleartext_off_host(endpoint) {
                return Err(format!(
                    "--gcs-endpoint {endpoint:?} is plain http:// to another host: the credentials' access token would cross the network in the clear; use https://, or --gcs-anonymous for an emulator"
                ));
            }
        }
        match self.gcs_bucket {
            Some(_) => Ok(()),
            None => Err("--blob-sink gcs needs --gcs-bucket (or REPLAY_INGEST_GCS_BUCKET)".into()),
        }
    }

    /// The sink's settings; `timeout` bounds each upload.
    pub fn config(&self, timeout: std::time::Duration) -> Result<GcsConfig, String> {
        self.validate()?;
        Ok(GcsConfig {
            bucket: self.gcs_bucket.clone().unwrap_or_default(),
            endpoint: self.gcs_endpoint.clone(),
            anonymous: self.gcs_anonymous,
            concurrency: self.gcs_upload_concurrency,
            timeout,
        })
    }
}

/// `endpoint` is `http://` to a host other than this one's loopback.
fn cleartext_off_host(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    // `[::1]:4443`, `127.0.0.1:4443`, `localhost`.
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

/// Retry classification: 408, 429 and 5xx, timeouts and transport trouble are retried; 400 and
/// 413 (this object refused) are rejections; other 4xx (permissions, missing bucket) are fatal,
/// and so are credentials that give no access token for good (`credentials_refused`). An object
/// stored with other checksums than the bytes sent (corrupted on the way) is written again.
pub fn classify(error: &google_cloud_storage::Error) -> Retry {
    match error.http_status_code() {
        Some(408 | 429) | Some(500..=599) => Retry::Retryable,
        Some(400 | 413) => Retry::Rejected,
        Some(400..=499) => Retry::Fatal,
        _ if corrupted(error) => Retry::Retryable,
        _ if error.is_serialization() || credentials_refused(error) => Retry::Fatal,
        _ => Retry::Retryable,
    }
}

/// The upload's answer names checksums other than those of the bytes sent: the object was
/// corrupted on the way. The crate reports it as an error reading the answer, which is fatal
/// otherwise (an answer that is not GCS's); a rewrite stores the right bytes, as the commit
/// waits for.
fn corrupted(error: &google_cloud_storage::Error) -> bool {
    use google_cloud_storage::error::WriteError;
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<WriteError>())
        .is_some_and(|write| matches!(write, WriteError::ChecksumMismatch { .. }))
}

/// No request was sent: the credentials could not give an access token, and google-cloud-auth
/// says trying again will not help (the token endpoint refused them: a revoked key, a removed
/// Workload Identity binding). Such an error has no HTTP status, and retrying it retried for
/// ever while the backlog grew; the service stops instead, as on a 401 or 403. A token endpoint
/// or metadata server that does not answer is transient, and retried.
fn credentials_refused(error: &google_cloud_storage::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<google_cloud_gax::error::CredentialsError>())
        .is_some_and(|credentials| !credentials.is_transient())
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
    /// Builds the client: credentials from the environment, or anonymous for emulators. With
    /// credentials from the metadata server (GKE Workload Identity), building asks it for the
    /// universe domain, over a connection without a deadline: a metadata server that accepts and
    /// never answers would hang the start (or a tool) for good, so it gets `config.timeout`.
    pub async fn new(config: &GcsConfig) -> Result<Self, SinkError> {
        // Every object goes up in one request, whatever its size. Past the crate's threshold
        // (16 MiB) it would open a resumable session instead: an upload cut by the deadline
        // leaves the session open for a week, and its URL — a bearer capability, anyone holding
        // it may finish the upload with other bytes — appears in the transport error's text,
        // so in the logs and `/status`. A retry here sends the object again anyway.
        let mut builder = Storage::builder()
            .with_retry_policy(NeverRetry)
            .with_resumable_upload_threshold(usize::MAX);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        builder = builder.with_credentials(if config.anonymous {
            google_cloud_auth::credentials::anonymous::Builder::new().build()
        } else {
            super::gcs_credentials::application_default(config.timeout / 2)?
        });
        let client = match tokio::time::timeout(config.timeout, builder.build()).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(SinkError::new(
                    "gcs",
                    Retry::Fatal,
                    format_args!("creating the GCS client: {e}"),
                ));
            }
            Err(_) => {
                return Err(SinkError::new(
                    "gcs",
                    Retry::Fatal,
                    format_args!(
                        "creating the GCS client: not done within {:?}",
                        config.timeout
                    ),
                ));
            }
        };
        Ok(GcsSink {
            client,
            bucket: format!("projects/_/buckets/{}", config.bucket),
            name: config.bucket.clone(),
            concurrency: config.concurrency.max(1),
            timeout: config.timeout,
        })
    }

    /// The object's bytes, `None` when there is none (for the operator tools).
    pub async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, SinkError> {
        let failed = |e: google_cloud_storage::Error| {
            if e.http_status_code() == Some(404) {
                return None;
            }
            Some(SinkError {
                message: format!("{}: {}", self.location(key), super::describe(&e)),
                ..SinkError::from_error("gcs", classify(&e), e)
            })
        };
        let read = async {
            let mut response = match self.client.read_object(&self.bucket, key).send().await {
                Ok(response) => response,
                Err(e) => return failed(e).map_or(Ok(None), Err),
            };
            let mut contents = Vec::new();
            while let Some(chunk) = response.next().await {
                match chunk {
                    Ok(chunk) => contents.extend_from_slice(&chunk),
                    Err(e) => return failed(e).map_or(Ok(None), Err),
                }
            }
            Ok(Some(contents))
        };
        tokio::time::timeout(self.timeout, read)
            .await
            .map_err(|_| {
                SinkError::new(
                    "gcs",
                    Retry::Retryable,
                    format_args!("{}: timed out after {:?}", self.location(key), self.timeout),
                )
            })?
    }

    async fn upload(&self, key: &str, bytes: bytes::Bytes) -> Result<(), SinkError> {
        let (sent, deadline) = (bytes.len(), upload_deadline(self.timeout, bytes.len()));
        let upload = self
            .client
            .write_object(&self.bucket, key, bytes)
            .set_content_type("application/octet-stream")
            .send_buffered();
        let error = match tokio::time::timeout(deadline, upload).await {
            // The answer describes the object stored: the crate compares its checksums when it
            // carries them, and its size is compared here. A server that answers `200` with
            // something else (an endpoint that is not GCS, a proxy's own page) stored nothing
            // this can tell of, and the offsets would have been committed.
            Ok(Ok(object)) if u64::try_from(object.size).is_ok_and(|size| size == sent as u64) => {
                return Ok(());
            }
            Ok(Ok(object)) => SinkError::new(
                "gcs",
                Retry::Retryable,
                format_args!(
                    "the upload's answer names an object of {} bytes ({:?}), not the {sent} bytes sent: is --gcs-endpoint a GCS server?",
                    object.size, object.name
                ),
            ),
            Ok(Err(e)) if matches!(e.http_status_code(), Some(401 | 403)) => {
                let message = format!(
                    "permission denied ({}): the credentials (Workload Identity, GOOGLE_APPLICATION_CREDENTIALS, --gcs-anonymous) may not write to --gcs-bucket {} (overwriting an object, as every rewrite does, needs storage.objects.delete too: roles/storage.objectUser; a service-account key disabled since the start is refused too, and the restart reads its file again): {}",
                    e.http_status_code().unwrap_or_default(),
                    self.name,
                    super::describe(&e)
                );
                SinkError {
                    message,
                    ..SinkError::from_error("gcs", Retry::Fatal, e)
                }
            }
            Ok(Err(e)) => SinkError {
                message: super::describe(&e),
                ..SinkError::from_error("gcs", classify(&e), e)
            },
            Err(_) => SinkError::new(
                "gcs",
                Retry::Retryable,
                format_args!("timed out after {deadline:?} ({sent} bytes)"),
            ),
        };
        Err(SinkError {
            message: format!("{}: {}", self.location(key), error.message),
            ..error
        })
    }
}

impl Sink for GcsSink {
    fn name(&self) -> &'static str {
        "gcs"
    }

    /// Uploads the objects not stored by an earlier attempt of this write, `concurrency` at a
    /// time. Each upload that ends is reported; after `concurrency` failures in a row (the
    /// server is down or hung, not slow) no new upload starts and the attempt ends with the
    /// first error, to be retried after a backoff — rather than waiting out one timeout per
    /// remaining object.
    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(self.write_pending(batch, progress))
    }
}

impl GcsSink {
    async fn write_pending<'a>(
        &'a self,
        batch: &'a [Entry],
        progress: &'a Progress<'_>,
    ) -> Result<Written, SinkError> {
        let pending = batch.iter().filter_map(|entry| match &entry.outcome {
            Outcome::Valid(p) if !progress.is_stored(Piece::of(entry, 0)) => {
                Some((Piece::of(entry, 0), &p.blob))
            }
            _ => None,
        });
        let uploads = pending.map(|(piece, blob)| async move {
            if progress.looks_down(self.concurrency) {
                return Err(None);
            }
            match self.upload(&blob.key, blob.bytes.clone()).await {
                Ok(()) => {
                    progress.stored(piece);
                    Ok(())
                }
                Err(error) => {
                    progress.failed(&error);
                    Err(Some(error))
                }
            }
        });
        let results: Vec<Result<(), Option<SinkError>>> = futures::stream::iter(uploads)
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        if let Some(error) = first_error(results) {
            return Err(error);
        }
        Ok(Written {
            items: batch.valid().count() as u64,
            bytes: batch.valid().map(|p| p.blob.bytes.len() as u64).sum(),
        })
    }
}

/// The attempt's error: the one that says most among the uploads that failed, with the count of
/// those not started (`Err(None)`: the attempt gave up once the server looked down, which only
/// failed uploads make it do). Those finish last: kept as the error, they hid the failures' cause
/// (a timeout, a 503, no token from the metadata server) from the log line and `/status` on
/// every attempt of a batch larger than `--gcs-upload-concurrency`.
fn first_error(results: Vec<Result<(), Option<SinkError>>>) -> Option<SinkError> {
    let mut kept = None;
    let mut not_started = 0usize;
    for result in results {
        match result {
            Ok(()) => {}
            Err(Some(error)) => keep_telling(&mut kept, error),
            Err(None) => not_started += 1,
        }
    }
    if not_started == 0 {
        return kept;
    }
    let gave_up = format!("{not_started} uploads not started: the server looks down");
    Some(match kept {
        Some(mut error) => {
            error.message = format!("{}; {gave_up}", error.message);
            error
        }
        // Not without a failure in the same attempt today; never `Ok` with blobs unwritten.
        None => SinkError::new("gcs", Retry::Retryable, gave_up),
    })
}

impl GcsSink {
    /// The startup check: writes a small object at [`PROBE_KEY`], which proves the bucket exists
    /// and the credentials may write to it (the same call the flush makes, classified the same).
    pub async fn check(&self) -> Result<(), SinkError> {
        let probe = bytes::Bytes::from_static(
            b"written by replay-ingest at startup to check write access\n",
        );
        self.upload(PROBE_KEY, probe).await
    }
}

/// The slowest an upload may go before its deadline: each has `--sink-timeout-ms` plus the time
/// its bytes take at this rate, three timeouts at most. With one deadline whatever the size, a
/// batch of large objects on a link that carries them slower than that (32 uploads share it)
/// timed out whole on every attempt and was retried for good, looking like an outage; a hung
/// server is still given up on within the timeout for small objects, and within 87 s for the
/// largest message by default (15 MB, a 30 s timeout).
const SLOWEST_UPLOAD_BYTES_PER_SECOND: f64 = 256.0 * 1024.0;

/// The longest an upload may take, in timeouts: the flush stall timeout must exceed it (`config`:
/// the longest a write may go without a request ending), or a large upload to a hung server
/// would fail liveness before its own deadline.
pub const LONGEST_UPLOAD_TIMEOUTS: u32 = 3;

/// How long one upload of `bytes` may take: [`LONGEST_UPLOAD_TIMEOUTS`] at most.
fn upload_deadline(timeout: std::time::Duration, bytes: usize) -> std::time::Duration {
    let sized = timeout
        + std::time::Duration::from_secs_f64(bytes as f64 / SLOWEST_UPLOAD_BYTES_PER_SECOND);
    sized.min(timeout * LONGEST_UPLOAD_TIMEOUTS)
}

/// Where the startup check writes; rewritten at every start.
pub const PROBE_KEY: &str = "replay-ingest/startup-check";

impl ObjectStore for GcsSink {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: &'a [u8],
    ) -> LocalBoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.upload(key, bytes::Bytes::copy_from_slice(bytes)))
    }

    fn location(&self, key: &str) -> String {
        format!("gs://{}/{key}", self.name)
    }
}

/// The blob sink on GCS, and the same bucket as the store for dead letters too large for their
/// topic. Its health check writes a probe object ([`GcsSink::check`]).
pub async fn build(config: &GcsConfig) -> Result<(Built, Arc<dyn ObjectStore>), SinkError> {
    let gcs = Arc::new(GcsSink::new(config).await?);
    let checked = gcs.clone();
    let check: Check = Box::new(move || {
        let gcs = checked.clone();
        Box::pin(async move { gcs.check().await })
    });
    Ok((
        Built::checked(gcs.clone(), "gcs", "the GCS bucket", check),
        gcs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_gax::error::CredentialsError;

    /// A checksum mismatch is retried (it stopped the service); an answer the crate cannot read
    /// otherwise stays fatal.
    #[test]
    fn an_object_stored_with_other_checksums_is_written_again() {
        use google_cloud_storage::error::{ChecksumMismatch, WriteError};
        let mismatch = google_cloud_storage::Error::ser(WriteError::ChecksumMismatch {
            mismatch: ChecksumMismatch::Crc32c { got: 1, want: 2 },
            object: Box::default(),
        });
        assert_eq!(classify(&mismatch), Retry::Retryable);
        let unreadable = google_cloud_storage::Error::ser(std::io::Error::other("not json"));
        assert_eq!(classify(&unreadable), Retry::Fatal);
    }

    #[test]
    fn real_credentials_go_to_another_host_over_https_only() {
        let args = |endpoint: &str, anonymous: bool| GcsArgs {
            gcs_bucket: Some("b".into()),
            gcs_endpoint: Some(endpoint.into()),
            gcs_anonymous: anonymous,
            gcs_upload_concurrency: 1,
        };
        let refused = args("http://gcs-proxy:8080", false).validate().unwrap_err();
        assert!(refused.contains("in the clear"), "{refused}");
        for endpoint in [
            "http://127.0.0.1:4443",
            "http://localhost:4443/",
            "http://[::1]:4443",
            "https://storage.googleapis.com",
        ] {
            args(endpoint, false).validate().unwrap();
        }
        args("http://fake-gcs:4443", true).validate().unwrap();
    }

    #[test]
    fn an_upload_has_the_timeout_and_the_time_its_bytes_take_at_the_slowest_rate() {
        let timeout = std::time::Duration::from_secs(30);
        assert_eq!(upload_deadline(timeout, 0), timeout);
        assert_eq!(
            upload_deadline(timeout, 256 * 1024 * 60),
            std::time::Duration::from_secs(90)
        );
        assert!(upload_deadline(timeout, 15_000_000) < std::time::Duration::from_secs(90));
        assert_eq!(
            upload_deadline(timeout, 1 << 30),
            timeout * 3,
            "within the flush stall's bound"
        );
    }

    #[test]
    fn an_attempt_that_gave_up_tells_why_its_uploads_failed_and_how_many_it_did_not_start() {
        let failed = |retry, message: &str| Err(Some(SinkError::new("gcs", retry, message)));
        let error = first_error(vec![
            Ok(()),
            failed(Retry::Retryable, "timed out after 30s"),
            Err(None),
            failed(Retry::Retryable, "answered 503"),
            Err(None),
        ])
        .unwrap();
        assert_eq!(error.retry, Retry::Retryable);
        assert!(
            error.message.contains("answered 503")
                && error
                    .message
                    .ends_with("; 2 uploads not started: the server looks down"),
            "{error}"
        );
        let refused = first_error(vec![
            failed(Retry::Fatal, "403 Forbidden"),
            failed(Retry::Retryable, "timed out after 30s"),
            Err(None),
        ])
        .unwrap();
        assert_eq!(refused.retry, Retry::Fatal, "{refused}");
        assert!(refused.message.contains("403 Forbidden"), "{refused}");
        assert!(first_error(vec![Ok(()), Ok(())]).is_none());
        let none_started = first_error(vec![Ok(()), Err(None)]).unwrap();
        assert_eq!(none_started.retry, Retry::Retryable, "{none_started}");
    }

    #[test]
    fn credentials_refused_for_good_are_fatal_and_a_token_endpoint_down_is_retried() {
        let refused = CredentialsError::from_msg(false, "invalid_grant: the key was revoked");
        let down = CredentialsError::from_msg(true, "metadata server: connection refused");
        assert_eq!(
            classify(&google_cloud_storage::Error::authentication(refused)),
            Retry::Fatal
        );
        assert_eq!(
            classify(&google_cloud_storage::Error::authentication(down)),
            Retry::Retryable
        );
        assert_eq!(
            classify(&google_cloud_storage::Error::io("connection reset")),
            Retry::Retryable
        );
    }
}
