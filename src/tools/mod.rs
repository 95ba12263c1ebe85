//! Operator tools beside the service, for what Sentry's ingest leaves to hand work: removing one
//! replay everywhere (`delete`), expiring the filesystem store's blobs (`sweep`), putting dead
//! letters back on the input topic once their cause is fixed (`redrive`). Each is a subcommand
//! of `replay-ingest`; `delete` and `redrive` take the same store and sink flags as `consume`, and
//! `sweep` the filesystem store's directory, so each reaches what the service wrote
//! (`docs/operations.md`, "Operator tools").

pub mod delete;
pub mod redrive;
pub mod sweep;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{BlobArgs, BlobSinkKind};
use crate::sink::filesystem::FilesystemBlobSink;
use crate::sink::gcs_json::GcsStore;
use crate::sink::store::BlobStore;

/// An instant given on the command line, in RFC 3339.
fn instant(text: &str) -> Result<std::time::SystemTime, String> {
    humantime::parse_rfc3339_weak(text)
        .map_err(|e| format!("{text:?}: {e} (RFC 3339, e.g. 2026-12-01T10:00:00Z)"))
}

/// The blob store the flags name; `None` with `--blob-sink null`.
pub async fn blob_store(
    blobs: &BlobArgs,
    timeout: Duration,
) -> anyhow::Result<Option<Arc<dyn BlobStore>>> {
    Ok(match blobs.blob_sink {
        BlobSinkKind::Gcs => Some(Arc::new(GcsStore::new(&blobs.gcs_config(timeout)?).await?)),
        BlobSinkKind::Filesystem => Some(Arc::new(FilesystemBlobSink::new(&blobs.blob_dir)?)),
        BlobSinkKind::Null => None,
    })
}
