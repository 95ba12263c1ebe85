//! Blobs as files: `{root}/{blob key}`, written to a temporary name, fsynced and renamed, so a
//! crash never leaves a partial blob under its final name and a rewrite replaces it atomically.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::LocalBoxFuture;

use super::{
    Built, Entry, ObjectStore, Outcome, Piece, Progress, Retry, Sink, SinkError, Writing, Written,
};

pub struct FilesystemBlobSink {
    root: PathBuf,
}

impl FilesystemBlobSink {
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root)?;
        Ok(FilesystemBlobSink { root })
    }

    fn write_one(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.root.join(key);
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir)?;
        let tmp = temp_name(&path);
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, &path)?;
        fs::File::open(dir)?.sync_all()
    }
}

fn temp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

impl Sink for FilesystemBlobSink {
    fn name(&self) -> &'static str {
        "blobs"
    }

    /// Files are written with blocking calls, on the flush's thread (the blocking pool): they
    /// hold up only the sinks of the same stage, for as long as the disk takes.
    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(async move {
            let mut written = Written::default();
            for entry in batch {
                let Outcome::Valid(processed) = &entry.outcome else {
                    continue;
                };
                progress
                    .put_once(
                        self,
                        &processed.blob.key,
                        &processed.blob.bytes,
                        Piece::of(entry, 0),
                    )
                    .await?;
                written.items += 1;
                written.bytes += processed.blob.bytes.len() as u64;
            }
            Ok(written)
        })
    }
}

impl ObjectStore for FilesystemBlobSink {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: &'a [u8],
    ) -> LocalBoxFuture<'a, Result<(), SinkError>> {
        let result = self.write_one(key, bytes).map_err(|e| {
            // A full disk or a permission problem may clear up; keep retrying within the policy.
            SinkError::new(self.name(), Retry::Retryable, format_args!("{key}: {e}"))
        });
        Box::pin(std::future::ready(result))
    }

    fn location(&self, key: &str) -> String {
        format!("file://{}", self.root.join(key).display())
    }
}

/// The blob sink under `dir`, and the same directory as the store for oversized dead letters.
pub fn build(dir: &Path) -> Result<(Built, Arc<dyn ObjectStore>), SinkError> {
    let files = FilesystemBlobSink::new(dir).map_err(|e| {
        SinkError::new(
            "filesystem",
            Retry::Fatal,
            format_args!("blob directory {}: {e}", dir.display()),
        )
    })?;
    let files = Arc::new(files);
    Ok((Built::unchecked(files.clone()), files))
}
