//! Blobs as files: `{root}/{blob key}`, written to a temporary name, fsynced and renamed, so a
//! crash never leaves a partial blob under its final name and a rewrite replaces it atomically.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::{BoxFuture, LocalBoxFuture};

use super::store::{BlobStore, Listing, StoredObject};
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

    /// A write that fails (a full disk, an I/O error) removes its temporary file: each retry
    /// makes one of its own, and on a full disk they piled up where only the sweep, past the
    /// retention, would find them.
    fn write_one(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.root.join(key);
        let dir = path.parent().unwrap_or(&self.root);
        let tmp = temp_name(&path);
        let written =
            create_in(&tmp, || create_dirs_durably(&self.root, dir)).and_then(|mut file| {
                file.write_all(bytes)?;
                file.sync_all()?;
                fs::rename(&tmp, &path)
            });
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        fs::File::open(dir)?.sync_all()
    }
}

/// A blob's permissions (before the umask): recordings and dead-letter copies hold user data,
/// readable by the service's user and group, not by every user of a shared volume (the umask
/// alone left them 0644, and directories 0755).
const BLOB_MODE: u32 = 0o640;
const DIRECTORY_MODE: u32 = 0o750;

/// How many times a write makes its directory: once if it is new, again if a sweep removed it
/// meanwhile.
const DIRECTORY_TRIES: usize = 3;

/// Creates the file `tmp`, making its directory (`make_dir`) if it is not there — again if it
/// went missing meanwhile, or its parent did while it was being made: a sweep beside the service
/// removes an empty directory it has emptied, and a new replay's directory (or a new project's)
/// is empty from its creation to its first file.
fn create_in(tmp: &Path, mut make_dir: impl FnMut() -> io::Result<()>) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut made = 0;
    loop {
        let created = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(BLOB_MODE)
            .open(tmp);
        match created {
            Err(e) if e.kind() == io::ErrorKind::NotFound && made < DIRECTORY_TRIES => {
                made += 1;
                match make_dir() {
                    Err(e) if e.kind() == io::ErrorKind::NotFound && made < DIRECTORY_TRIES => {}
                    made_or_failed => made_or_failed?,
                }
            }
            created => return created,
        }
    }
}

/// Creates `dir` and whatever is missing of it below `root` (which exists), each new directory
/// synced into its parent: a blob's own directory is synced after its rename, but a directory
/// made for it (a new replay's) could be lost in a crash with the blob whose offset was
/// committed, on a file system that does not order a directory's creation before what follows.
fn create_dirs_durably(root: &Path, dir: &Path) -> io::Result<()> {
    if dir == root || dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().unwrap_or(root);
    create_dirs_durably(root, parent)?;
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new().mode(DIRECTORY_MODE).create(dir) {
        Ok(()) => fs::File::open(parent)?.sync_all(),
        // Made meanwhile by another write of the same replay.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// `{name}.tmp-{pid}-{n}`: a name of this write's own. Two flushes in flight may write the same
/// key at once (a segment delivered twice); with one temporary name per process, the second's
/// create truncated the file the first was renaming, and a crash then left a partial blob under
/// its final name.
fn temp_name(path: &Path) -> PathBuf {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
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

impl BlobStore for FilesystemBlobSink {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, SinkError>> {
        Box::pin(std::future::ready(self.list_now(prefix)))
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, SinkError>> {
        let result = match fs::read(self.root.join(key)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error(key, &e)),
        };
        Box::pin(std::future::ready(result))
    }

    /// Removes the file, and the directories that leaves empty, as an object store's prefixes
    /// go with their last object: a deleted replay leaves no directory named after it. (A
    /// writer that loses a directory this way between making it and writing into it fails that
    /// attempt, and its retry makes it again.)
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, SinkError>> {
        let path = self.root.join(key);
        let result = match fs::remove_file(&path) {
            Ok(()) => {
                let mut dir = path.parent();
                while let Some(emptied) =
                    dir.filter(|d| *d != self.root && d.starts_with(&self.root))
                {
                    if fs::remove_dir(emptied).is_err() {
                        break;
                    }
                    dir = emptied.parent();
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.error(key, &e)),
        };
        Box::pin(std::future::ready(result))
    }

    fn location(&self, key: &str) -> String {
        ObjectStore::location(self, key)
    }
}

/// What a directory entry is: what a symbolic link points to, or the link when it points
/// nowhere; `None` when the entry is gone since the directory was read (a writer renamed its
/// temporary file into place, a sweep or a `delete` removed it) — a listing beside the running
/// service failed on it, and `delete` gave up on the replay.
fn listed_metadata(path: &Path) -> io::Result<Option<fs::Metadata>> {
    match fs::metadata(path).or_else(|_| fs::symlink_metadata(path)) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl FilesystemBlobSink {
    fn error(&self, key: &str, e: &io::Error) -> SinkError {
        SinkError::new(
            self.name(),
            Retry::Retryable,
            format_args!("{}: {e}", self.root.join(key).display()),
        )
    }

    /// The directory `prefix` names (its last `/` and all), sorted: files are objects —
    /// a writer's temporary file too: one a failed write or a crash left holds a replay's bytes,
    /// which `delete` must find — and directories are prefixes. A symbolic link is taken for
    /// what it points to, as the writer takes it (a retention directory linked to another
    /// volume holds that retention's blobs); a link that points nowhere is an object, the link.
    /// A missing directory is empty.
    fn list_now(&self, prefix: &str) -> Result<Listing, SinkError> {
        let dir = self.root.join(prefix);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Listing::default()),
            Err(e) => return Err(self.error(prefix, &e)),
        };
        let mut listing = Listing::default();
        for entry in entries {
            let entry = entry.map_err(|e| self.error(prefix, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(meta) = listed_metadata(&entry.path()).map_err(|e| self.error(prefix, &e))?
            else {
                continue;
            };
            if meta.is_dir() {
                listing.prefixes.push(format!("{prefix}{name}/"));
            } else {
                let updated = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs() as i64);
                listing.objects.push(StoredObject {
                    key: format!("{prefix}{name}"),
                    size: meta.len(),
                    updated,
                });
            }
        }
        listing.objects.sort_by(|a, b| a.key.cmp(&b.key));
        listing.prefixes.sort();
        Ok(listing)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry gone between the directory's read and its own (a temporary file renamed into
    /// place, a blob swept) is left out of the listing, not an error; a link to nothing is the
    /// link, and a link to a directory is a prefix.
    #[test]
    fn an_entry_gone_since_the_directory_was_read_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        assert!(listed_metadata(&dir.path().join("gone")).unwrap().is_none());
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let meta = listed_metadata(&dangling).unwrap().unwrap();
        assert!(meta.file_type().is_symlink());
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(dir.path(), &linked).unwrap();
        assert!(listed_metadata(&linked).unwrap().unwrap().is_dir());
    }

    /// The two ways a sweep beside the service takes a write's directory from under it: the
    /// project's directory removed while the replay's is being made in it (the making fails),
    /// and the replay's removed after it is made, before the write's first file. Both are made
    /// again and the file is created.
    #[test]
    fn a_directory_a_sweep_removes_while_the_write_makes_it_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let replay = dir.path().join("30/1/r");
        let tmp = replay.join("0.tmp-1-1");
        let mut calls = 0;
        let created = create_in(&tmp, || {
            calls += 1;
            match calls {
                1 => Err(io::ErrorKind::NotFound.into()),
                2 => fs::create_dir_all(&replay).and_then(|()| fs::remove_dir(&replay)),
                _ => fs::create_dir_all(&replay),
            }
        });
        assert!(created.is_ok(), "{created:?}");
        assert_eq!(calls, 3);
        assert!(tmp.is_file());
        // A directory that cannot be made is an error, not a loop.
        let failed = create_in(&dir.path().join("gone/0"), || {
            Err(io::ErrorKind::NotFound.into())
        });
        assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    /// The same through the writer, the sweep a thread that removes each new replay's directory
    /// once, the moment it can: every blob is stored (the writes used to fail: 200 of 200 on this
    /// machine's disk, whose fsync of the parent leaves the new directory empty a while).
    #[test]
    fn a_directory_removed_between_its_creation_and_the_first_file_is_made_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const WRITES: usize = 200;
        let dir = tempfile::tempdir().unwrap();
        let sink = FilesystemBlobSink::new(dir.path()).unwrap();
        let replay = |i: usize| format!("30/1/{i:032x}");
        let written = AtomicUsize::new(0);
        let removed = std::thread::scope(|threads| {
            let sweep = threads.spawn(|| {
                let mut removed = 0;
                for i in 0..WRITES {
                    let path = dir.path().join(replay(i));
                    while written.load(Ordering::SeqCst) <= i {
                        if fs::remove_dir(&path).is_ok() {
                            removed += 1;
                            break;
                        }
                    }
                }
                removed
            });
            let mut failed = Vec::new();
            for i in 0..WRITES {
                if let Err(e) = sink.write_one(&format!("{}/0", replay(i)), b"zlib") {
                    failed.push(e.to_string());
                }
                written.store(i + 1, Ordering::SeqCst);
            }
            assert!(
                failed.is_empty(),
                "{} writes failed: {failed:?}",
                failed.len()
            );
            sweep.join().unwrap()
        });
        for i in 0..WRITES {
            assert_eq!(
                fs::read(dir.path().join(replay(i)).join("0")).unwrap(),
                b"zlib"
            );
        }
        // (None on a file system whose fsync returns at once: the test above stands alone then.)
        eprintln!("{removed} directories removed before their first file");
    }

    /// Two writes of one key at once (a segment delivered twice, in two flushes) each have a
    /// temporary file of their own, and both end with the whole blob in place.
    #[test]
    fn writes_of_one_key_at_once_do_not_share_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("30/1/a/0");
        assert_ne!(temp_name(&path), temp_name(&path));
        let sink = FilesystemBlobSink::new(dir.path()).unwrap();
        let blob = vec![7u8; 1 << 20];
        std::thread::scope(|threads| {
            for _ in 0..4 {
                threads.spawn(|| {
                    for _ in 0..20 {
                        sink.write_one("30/1/a/0", &blob).unwrap();
                    }
                });
            }
        });
        assert_eq!(std::fs::read(&path).unwrap(), blob);
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    /// A write that fails leaves no temporary file behind (here its rename: a directory stands
    /// at the blob's name), and one that succeeds makes the directories it needs.
    #[test]
    fn a_failed_write_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FilesystemBlobSink::new(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("30/1/a/0/taken")).unwrap();
        for _ in 0..3 {
            sink.write_one("30/1/a/0", b"blob").unwrap_err();
        }
        let left: Vec<_> = std::fs::read_dir(dir.path().join("30/1/a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["0"], "no temporary file left");
        sink.write_one("90/2/b/0", b"blob").unwrap();
        assert_eq!(std::fs::read(dir.path().join("90/2/b/0")).unwrap(), b"blob");
    }

    /// Blobs and the directories made for them are not readable by others (the umask alone,
    /// 022 here as on most systems, left them 0644 and 0755).
    #[test]
    fn blobs_and_their_directories_are_closed_to_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sink = FilesystemBlobSink::new(dir.path()).unwrap();
        sink.write_one("30/1/a/0", b"blob").unwrap();
        for path in ["30", "30/1", "30/1/a", "30/1/a/0"] {
            let mode = std::fs::metadata(dir.path().join(path))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o007, 0, "{path}: {mode:o}");
        }
    }

    #[tokio::test]
    async fn a_delete_takes_the_directories_it_empties_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let store = FilesystemBlobSink::new(dir.path()).unwrap();
        for key in ["30/42/aaaa/0", "30/42/bbbb/0", "dlq/42/aaaa/t/0/5"] {
            store.put(key, b"x").await.unwrap();
        }
        assert!(store.delete("30/42/aaaa/0").await.unwrap());
        assert!(store.delete("dlq/42/aaaa/t/0/5").await.unwrap());
        assert!(!dir.path().join("30/42/aaaa").exists(), "emptied");
        assert!(dir.path().join("30/42/bbbb/0").exists());
        assert!(!dir.path().join("dlq").exists(), "emptied to the root");
        assert!(dir.path().exists(), "the root stays");
        assert!(!store.delete("30/42/aaaa/0").await.unwrap(), "already gone");
    }
}
