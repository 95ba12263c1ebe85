//! `replay-ingest sweep`: expiry for the filesystem blob store. A blob's key starts with the
//! retention its replay was written with (`{retention_days}/{project}/{replay}/{segment}`); a
//! blob older than that many days (by its modification time) is removed, and so is a replay's
//! or project's directory once empty. Rows expire in ClickHouse by their TTL; without this, blobs
//! on a filesystem store never do (one instance held 234 GiB, 3.96 million files past 90 days).
//! On GCS, bucket lifecycle rules do the same (`docs/operations.md`).
//!
//! Bounded I/O: one directory is read at a time, entry by entry (nothing lists the whole store,
//! or a project's replays, in memory), at most [`ERRORS_KEPT`] errors are kept word for word
//! (the rest counted: a store the process may not write to yields one per file), and removals
//! are paced to `--sweep-max-deletes-per-second`, so a sweep beside the running service never starves
//! its writes. Anything not under a numeric retention directory (dead-letter copies under
//! `dlq/`, the startup probe) is left alone. A writer's temporary file expires like the blobs
//! beside it: one being written is as young as its write.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use clap::Args;

pub use crate::config::SweepPace;

/// Remove the filesystem store's blobs that have outlived their retention.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// The filesystem blob store (`--blob-dir` of `consume`).
    #[arg(long, env = "REPLAY_INGEST_BLOB_DIR", default_value = "blobs")]
    pub blob_dir: PathBuf,
    /// Say what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub pace: SweepPace,
}

/// Errors a summary keeps word for word; past them it counts.
pub const ERRORS_KEPT: usize = 100;

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Blobs looked at, under retention directories.
    pub scanned: u64,
    /// Of those, past their retention, and their bytes (what a dry run says a sweep frees).
    pub expired: u64,
    pub expired_bytes: u64,
    /// Removed (0 on a dry run), and their bytes.
    pub removed: u64,
    pub bytes: u64,
    /// Emptied directories removed.
    pub directories: u64,
    /// What could not be read or removed: the first [`ERRORS_KEPT`]...
    pub errors: Vec<String>,
    /// ...and how many more.
    pub more_errors: u64,
}

impl Summary {
    fn error(&mut self, error: String) {
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(error);
        } else {
            self.more_errors += 1;
        }
    }

    /// Keeps the item, or notes its error.
    fn noted<T>(&mut self, item: Result<T, String>) -> Option<T> {
        item.map_err(|error| self.error(error)).ok()
    }

    /// The errors kept, and a line saying how many more there were.
    pub fn errors_said(&self) -> Vec<String> {
        let mut said = self.errors.clone();
        if self.more_errors > 0 {
            said.push(format!("… and {} more", self.more_errors));
        }
        said
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} blob(s) scanned, {} past their retention ({} bytes), {} removed ({} bytes), {} empty directories removed, {} error(s)",
            self.scanned,
            self.expired,
            self.expired_bytes,
            self.removed,
            self.bytes,
            self.directories,
            self.errors.len() as u64 + self.more_errors
        )
    }
}

/// Sweeps `root` as of `now`, calling `removed` with each path removed (or, on a dry run, that
/// would be).
pub fn sweep(
    root: &Path,
    now: SystemTime,
    dry_run: bool,
    pace: SweepPace,
    mut removed: impl FnMut(&Path),
) -> Summary {
    let mut summary = Summary::default();
    // A mistyped or relative --blob-dir would otherwise sweep nothing and report success.
    if !root.is_dir() {
        summary.error(format!("{}: not a directory (--blob-dir)", root.display()));
        return summary;
    }
    let mut pacer = Pacer::new(pace.sweep_max_deletes_per_second);
    for (retention_dir, days) in retention_dirs(root, &mut summary) {
        let cutoff = now
            .checked_sub(Duration::from_secs(u64::from(days) * 86_400))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        for project in subdirectories(&retention_dir) {
            let Some(project) = summary.noted(project) else {
                continue;
            };
            for replay in subdirectories(&project) {
                let Some(replay) = summary.noted(replay) else {
                    continue;
                };
                for file in files(&replay) {
                    let Some((file, meta)) = summary.noted(file) else {
                        continue;
                    };
                    summary.scanned += 1;
                    if meta.modified().is_ok_and(|m| m >= cutoff) {
                        continue;
                    }
                    summary.expired += 1;
                    summary.expired_bytes += meta.len();
                    removed(&file);
                    if dry_run {
                        continue;
                    }
                    pacer.wait();
                    match fs::remove_file(&file) {
                        Ok(()) => {
                            summary.removed += 1;
                            summary.bytes += meta.len();
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => summary.error(format!("{}: {e}", file.display())),
                    }
                }
                if !dry_run {
                    remove_if_empty(&replay, &mut summary);
                }
            }
            if !dry_run {
                remove_if_empty(&project, &mut summary);
            }
        }
    }
    summary
}

/// Top-level directories named by a retention in days.
/// Few (one per retention in use): listed, in order of the retention.
fn retention_dirs(root: &Path, summary: &mut Summary) -> Vec<(PathBuf, u16)> {
    let mut dirs: Vec<(PathBuf, u16)> = subdirectories(root)
        .filter_map(|dir| {
            let dir = summary.noted(dir)?;
            let days = dir.file_name()?.to_str()?.parse().ok()?;
            Some((dir, days))
        })
        .collect();
    dirs.sort_by_key(|(_, days)| *days);
    dirs
}

/// The subdirectories of `dir`, one at a time.
fn subdirectories(dir: &Path) -> impl Iterator<Item = Result<PathBuf, String>> {
    entries(dir, fs::FileType::is_dir).map(|entry| entry.map(|entry| entry.path()))
}

/// The files of `dir` with their metadata, one at a time, a writer's temporary ones among them:
/// one being written is as young as its write, and one a failed write or a crash left expires
/// with the blobs beside it.
fn files(dir: &Path) -> impl Iterator<Item = Result<(PathBuf, fs::Metadata), String>> {
    entries(dir, fs::FileType::is_file).map(|entry| {
        let entry = entry?;
        // Read through the directory's handle: no path built, nothing followed.
        let meta = entry
            .metadata()
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        Ok((entry.path(), meta))
    })
}

/// A directory's entries of the type `kind` picks (symbolic links not followed), one at a time;
/// unreadable ones are errors, a directory already gone is empty. The type comes with the
/// entry: no call per entry of another type.
fn entries(
    dir: &Path,
    kind: fn(&fs::FileType) -> bool,
) -> impl Iterator<Item = Result<fs::DirEntry, String>> {
    let (read, failed) = match fs::read_dir(dir) {
        Ok(read) => (Some(read), None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (None, None),
        Err(e) => (None, Some(Err(format!("{}: {e}", dir.display())))),
    };
    let picked = move |entry: io::Result<fs::DirEntry>| {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => return Some(Err(format!("{}: {e}", dir.display()))),
        };
        match entry.file_type() {
            Ok(found) => kind(&found).then_some(Ok(entry)),
            Err(e) => Some(Err(format!("{}: {e}", entry.path().display()))),
        }
    };
    failed
        .into_iter()
        .chain(read.into_iter().flatten().filter_map(picked))
}

fn remove_if_empty(dir: &Path, summary: &mut Summary) {
    let empty = fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
    if empty && fs::remove_dir(dir).is_ok() {
        summary.directories += 1;
    }
}

/// At most `per_second` removals in any second.
struct Pacer {
    per_second: u32,
    window: Instant,
    used: u32,
}

impl Pacer {
    fn new(per_second: u32) -> Pacer {
        Pacer {
            per_second: per_second.max(1),
            window: Instant::now(),
            used: 0,
        }
    }

    fn wait(&mut self) {
        if self.window.elapsed() >= Duration::from_secs(1) {
            (self.window, self.used) = (Instant::now(), 0);
        }
        if self.used == self.per_second {
            std::thread::sleep(Duration::from_secs(1).saturating_sub(self.window.elapsed()));
            (self.window, self.used) = (Instant::now(), 0);
        }
        self.used += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn blob(root: &Path, key: &str, age: Duration) {
        let path = root.join(key);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"zlib").unwrap();
        let file = fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    const PACE: SweepPace = SweepPace {
        sweep_max_deletes_per_second: 1_000_000,
    };

    #[test]
    fn exactly_the_blobs_past_their_keys_retention_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        blob(root, "30/1/aaaa/0", 31 * DAY);
        blob(root, "30/1/aaaa/1", 29 * DAY);
        blob(root, "30/1/bbbb/0", 45 * DAY);
        blob(root, "90/1/cccc/0", 45 * DAY);
        blob(root, "90/2/dddd/0", 91 * DAY);
        blob(root, "dlq/t/0/17", 400 * DAY);
        blob(root, "30/1/aaaa/2.tmp-1", 400 * DAY);
        blob(root, "30/1/aaaa/3.tmp-1", Duration::ZERO);
        let mut seen = Vec::new();
        let dry = sweep(root, SystemTime::now(), true, PACE, |p| {
            seen.push(p.to_owned())
        });
        assert_eq!(
            (dry.scanned, dry.expired, dry.expired_bytes, dry.removed),
            (7, 4, 16, 0),
            "a dry run says how much a sweep frees"
        );
        assert!(
            root.join("30/1/aaaa/0").exists(),
            "a dry run removes nothing"
        );
        let summary = sweep(root, SystemTime::now(), false, PACE, |_| {});
        assert_eq!(
            (summary.expired, summary.removed, summary.bytes),
            (4, 4, 16)
        );
        // A writer's temporary file a crash left expires with the blobs beside it.
        for gone in ["30/1/aaaa/0", "30/1/aaaa/2.tmp-1", "30/1/bbbb", "90/2"] {
            assert!(!root.join(gone).exists(), "{gone}");
        }
        for kept in [
            "30/1/aaaa/1",
            "90/1/cccc/0",
            "dlq/t/0/17",
            "30/1/aaaa/3.tmp-1",
        ] {
            assert!(root.join(kept).exists(), "{kept}");
        }
        assert_eq!(summary.directories, 3, "bbbb, 90/2/dddd and 90/2");
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(
            sweep(root, SystemTime::now(), false, PACE, |_| {}).removed,
            0
        );
    }

    #[test]
    fn errors_past_the_first_hundred_are_counted_not_kept() {
        let mut summary = Summary::default();
        for n in 0..250 {
            summary.error(format!("blob {n}: Permission denied"));
        }
        assert_eq!(summary.errors.len(), ERRORS_KEPT);
        assert_eq!(summary.more_errors, 150);
        assert!(summary.to_string().ends_with("250 error(s)"), "{summary}");
        assert_eq!(summary.errors_said().last().unwrap(), "… and 150 more");
    }

    #[test]
    fn a_blob_dir_that_is_not_a_directory_is_an_error_not_an_empty_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("typo");
        let summary = sweep(&missing, SystemTime::now(), false, PACE, |_| {});
        assert_eq!(summary.errors.len(), 1, "{:?}", summary.errors);
        assert!(summary.errors[0].contains("not a directory"));
        assert!(!missing.exists(), "nothing created");
    }

    #[test]
    fn removals_are_paced() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..25 {
            blob(dir.path(), &format!("30/1/aaaa/{n}"), 40 * DAY);
        }
        let started = Instant::now();
        let pace = SweepPace {
            sweep_max_deletes_per_second: 10,
        };
        assert_eq!(
            sweep(dir.path(), SystemTime::now(), false, pace, |_| {}).removed,
            25
        );
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
