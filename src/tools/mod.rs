//! Operator tools beside the service, for what Sentry's ingest leaves to hand work: removing one
//! replay everywhere (`delete`), expiring the filesystem store's blobs (`sweep`), putting dead
//! letters back on the input topic once their cause is fixed (`redrive`). Each is a subcommand
//! of `replay-ingest`; `delete` and `redrive` take the same store and sink flags as `consume`, and
//! `sweep` the filesystem store's directory, so each reaches what the service wrote
//! (`docs/operations.md`, "Operator tools").

pub mod delete;
pub mod redrive;
pub mod sweep;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{BlobArgs, BlobSinkKind};
use crate::sink::SinkError;
use crate::sink::filesystem::FilesystemBlobSink;
use crate::sink::gcs_json::GcsStore;
use crate::sink::store::BlobStore;

/// What a run ends with when it went through everything it was given and some of it can never
/// be done, a run again no more than this one (a dead letter whose original is gone): exit
/// status [`EXIT_LEFT_FOR_GOOD`], told apart from 1, a run stopped with work left that a run
/// again goes on with (a store or a broker down).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LeftForGood(pub String);

/// The exit status of a run that ends with [`LeftForGood`].
pub const EXIT_LEFT_FOR_GOOD: u8 = 3;

/// An instant given on the command line, in RFC 3339, in UTC: ending in `Z` or `+00:00`. The
/// parser reads every time as UTC — one without a zone, and one whose other offset follows a
/// fraction of a second (`…00.000+02:00`, Python's `isoformat()`), hours off without a word — so
/// any other is refused.
fn instant(text: &str) -> Result<std::time::SystemTime, String> {
    if !(text.ends_with('Z') || text.ends_with("+00:00")) {
        return Err(format!(
            "{text:?}: not an RFC 3339 time in UTC (give it ending in Z, e.g. 2026-12-01T10:00:00Z)"
        ));
    }
    humantime::parse_rfc3339_weak(text)
        .map_err(|e| format!("{text:?}: {e} (RFC 3339, e.g. 2026-12-01T10:00:00Z)"))
}

/// The blob store the flags name; `None` with `--blob-sink null`. A `--blob-dir` that is not a
/// directory is refused: the store would create it empty, and a tool would take every object it
/// looks for for gone (`delete` reporting a replay without blobs, `redrive` skipping every
/// letter stored there and committing past it).
pub async fn blob_store(
    blobs: &BlobArgs,
    timeout: Duration,
) -> anyhow::Result<Option<Arc<dyn BlobStore>>> {
    if blobs.blob_sink == BlobSinkKind::Filesystem && !blobs.blob_dir.is_dir() {
        anyhow::bail!(
            "--blob-dir {} is not a directory (a volume not mounted, a path mistyped?): nothing done",
            blobs.blob_dir.display()
        );
    }
    Ok(match blobs.blob_sink {
        BlobSinkKind::Gcs => Some(Arc::new(GcsStore::new(&blobs.gcs_config(timeout)?).await?)),
        BlobSinkKind::Filesystem => Some(Arc::new(FilesystemBlobSink::new(&blobs.blob_dir)?)),
        BlobSinkKind::Null => None,
    })
}

/// Where a tool reports, which an output gone does not stop: a `kubectl exec` session dropped
/// mid-run breaks stdout, and a report that could not be written stopped the run there, half
/// done. The first error is kept, nothing more is written, and the run's end says so.
struct Reports<W> {
    out: W,
    lost: Option<std::io::Error>,
}

impl<W: Write> Reports<W> {
    fn new(out: W) -> Self {
        Reports { out, lost: None }
    }

    /// What the run `ran` ends with: its own error, and that its output was lost, if it was
    /// (`went_on`: what the run did all the same).
    fn ended(self, ran: anyhow::Result<()>, went_on: &str) -> anyhow::Result<()> {
        match self.lost {
            None => ran,
            Some(lost) => {
                let lost = format!(
                    "the run's output could not be written ({lost}): it went on, and {went_on}"
                );
                // The run's own error keeps its kind (exit 3 for what it left for good).
                Err(match ran {
                    Ok(()) => anyhow::anyhow!(lost),
                    Err(e) => e.context(lost),
                })
            }
        }
    }
}

impl<W: Write> Write for Reports<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.lost.is_none()
            && let Err(e) = self.out.write_all(buf)
        {
            self.lost = Some(e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.lost.is_none()
            && let Err(e) = self.out.flush()
        {
            self.lost = Some(e);
        }
        Ok(())
    }
}

/// An output a dropped `kubectl exec` session broke: every write fails.
#[cfg(test)]
struct BrokenPipe;

#[cfg(test)]
impl Write for BrokenPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the top of a blob store holds of what the service writes there: its retention prefixes
/// (`90/`), each with its retention, and whether dead-letter copies (`dlq/`) are there; and how
/// many other entries.
pub struct Top {
    pub retentions: Vec<(String, u16)>,
    pub copies: bool,
    others: usize,
}

impl Top {
    pub async fn of(store: &dyn BlobStore) -> Result<Top, SinkError> {
        let listing = store.list("").await?;
        let mut top = Top {
            retentions: Vec::new(),
            copies: false,
            others: listing.objects.len(),
        };
        for prefix in listing.prefixes {
            let name = prefix.trim_end_matches('/');
            if let Ok(retention) = name.parse::<u16>() {
                top.retentions.push((prefix, retention));
            } else if crate::sink::dlq::is_copy_key(&prefix) {
                top.copies = true;
            } else if name != "lost+found" {
                // (What a fresh ext4 volume holds.)
                top.others += 1;
            }
        }
        Ok(top)
    }

    /// Why a store with nothing of the service's at its top is not taken for the service's: a
    /// volume not mounted in its place (an empty directory, a pod's own emptyDir), the store's
    /// parent directory or another bucket. A tool would take everything it looks for there for
    /// gone: `delete` reporting a replay deleted with its blobs left, `redrive` skipping the
    /// letters kept there and committing past them. (An empty store may be the service's, every
    /// blob of it deleted or expired: the error says what to do then.)
    pub fn foreign(&self, store: &dyn BlobStore) -> Option<String> {
        if !self.retentions.is_empty() || self.copies {
            return None;
        }
        let location = store.location("");
        Some(match self.others {
            0 => format!(
                "{location} is empty: is it the store the service writes to (not an empty volume mounted in its place, a new bucket), every blob of it deleted or expired?"
            ),
            n => format!(
                "{location} holds {n} entr{} at its top but neither retention prefixes (90/, …) nor dead-letter copies (dlq/): is it the store the service writes to (not its parent directory, another bucket)?",
                if n == 1 { "y" } else { "ies" }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tool's store: a `--blob-dir` that is not there is refused, not created empty (a
    /// `redrive` run took each letter stored there for gone and committed past it).
    #[tokio::test]
    async fn a_blob_dir_that_is_not_there_is_refused_not_created() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            blobs: BlobArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-mounted");
        let blobs = Cli::parse_from([
            "tool",
            "--blob-sink",
            "filesystem",
            "--blob-dir",
            missing.to_str().unwrap(),
        ])
        .blobs;
        let error = blob_store(&blobs, Duration::from_secs(1))
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("is not a directory"), "{error}");
        assert!(!missing.exists(), "not created");
        let there = Cli::parse_from([
            "tool",
            "--blob-sink",
            "filesystem",
            "--blob-dir",
            dir.path().to_str().unwrap(),
        ])
        .blobs;
        assert!(
            blob_store(&there, Duration::from_secs(1))
                .await
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn instants_are_rfc3339_in_utc_and_nothing_is_taken_for_utc() {
        let at = |text| instant(text).map(|t| humantime::format_rfc3339(t).to_string());
        assert_eq!(at("2026-12-01T10:00:00Z").unwrap(), "2026-12-01T10:00:00Z");
        assert_eq!(
            at("2026-12-01T10:00:00.250+00:00").unwrap(),
            "2026-12-01T10:00:00.250000000Z"
        );
        for refused in [
            "2026-12-01T10:00:00.000000+02:00",
            "2026-12-01T10:00:00+02:00",
            "2026-12-01T10:00:00",
            "2026-12-01 10:00:00",
            "yesterday",
        ] {
            let error = at(refused).unwrap_err();
            assert!(
                error.contains("RFC 3339") && error.contains(refused),
                "{error}"
            );
        }
    }
}
