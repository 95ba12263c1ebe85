//! `replay-ingest sweep`: expiry for the filesystem blob store. A blob's key starts with the
//! retention its replay was written with (`{retention_days}/{project}/{replay}/{segment}`); a
//! blob older than that many days (by its modification time) is removed, and so is a replay's
//! or project's directory the sweep empties (one already empty only once unchanged for
//! [`EMPTY_DIRECTORY_GRACE`]: a new replay's is empty until its first blob). A blob is read again
//! right before its removal: one rewritten while the pace held the removal back is kept. Rows expire in ClickHouse by their TTL; without this, blobs
//! on a filesystem store never do (one instance held 234 GiB, 3.96 million files past 90 days).
//! On GCS, bucket lifecycle rules do the same (`docs/operations.md`).
//!
//! Bounded I/O: one directory is read at a time, entry by entry (nothing lists the whole store,
//! or a project's replays, in memory), at most [`ERRORS_KEPT`] errors are kept word for word
//! (the rest counted: a store the process may not write to yields one per file), and removals
//! are paced to `--sweep-max-deletes-per-second`, so that a sweep beside the running service does
//! not flood the disk with deletes (reading directories and files' metadata is not paced).
//!
//! Only what is named as the store names it is touched: a numeric retention directory, a numeric
//! project, a replay id (32 lowercase hex characters), a numeric segment or a writer's temporary
//! file of one (`{segment}.tmp-{pid}-{n}`). Anything else — dead-letter copies under `dlq/`, a
//! file an operator left, a symbolic link — is counted as left alone, not followed. A symbolic link
//! in place of a retention directory is an error (its blobs would never expire), and so is a
//! `--blob-dir` holding directories but no retention directory (the store's parent, say;
//! `dlq/` and a volume root's `lost+found/` do not count). A
//! writer's temporary file expires like the blobs beside it: one being written is as young as
//! its write. A file whose modification time cannot be read is kept, with an error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::recording::envelope::is_replay_id;

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
    /// With `--dry-run`, print only the summary, not every path (millions, on a large store).
    #[arg(long, requires = "dry_run")]
    pub summary_only: bool,
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
    /// Entries not named as the store names them, or symbolic links: left alone.
    pub left_alone: u64,
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

    /// Errors, kept or counted.
    pub fn error_count(&self) -> u64 {
        self.errors.len() as u64 + self.more_errors
    }

    /// Whether `entry` is a directory (`dir`) or a regular file (not) named as `named` says:
    /// otherwise it is counted as left alone.
    fn picked(&mut self, entry: Entry, dir: bool, named: fn(&str) -> bool) -> Option<fs::DirEntry> {
        let wanted = if dir {
            entry.1.is_dir()
        } else {
            entry.1.is_file()
        };
        if wanted && entry.0.file_name().to_str().is_some_and(named) {
            Some(entry.0)
        } else {
            self.left_alone += 1;
            None
        }
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
            "{} blob(s) scanned, {} past their retention ({} bytes), {} removed ({} bytes), {} empty directories removed, {} other entries left alone, {} error(s)",
            self.scanned,
            self.expired,
            self.expired_bytes,
            self.removed,
            self.bytes,
            self.directories,
            self.left_alone,
            self.error_count()
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
        for project in entries(&retention_dir) {
            let Some(project) = summary.noted(project) else {
                continue;
            };
            let Some(project) = summary.picked(project, true, is_number::<u64>) else {
                continue;
            };
            let project = project.path();
            let mut project_emptied = false;
            for replay in entries(&project) {
                let Some(replay) = summary.noted(replay) else {
                    continue;
                };
                let Some(replay) = summary.picked(replay, true, is_replay_id) else {
                    continue;
                };
                let replay = replay.path();
                let mut emptied = false;
                for file in entries(&replay) {
                    let Some(file) = summary.noted(file) else {
                        continue;
                    };
                    let Some(file) = summary.picked(file, false, is_segment_file) else {
                        continue;
                    };
                    // Read through the directory's handle: no path built, nothing followed.
                    let meta = match file.metadata() {
                        Ok(meta) => meta,
                        // Gone since the listing: a `delete`, or another sweep.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => {
                            summary.error(format!("{}: {e}", file.path().display()));
                            continue;
                        }
                    };
                    let file = file.path();
                    summary.scanned += 1;
                    match meta.modified() {
                        Ok(modified) if modified >= cutoff => continue,
                        Ok(_) => {}
                        Err(e) => {
                            summary
                                .error(format!("{}: modification time: {e}; kept", file.display()));
                            continue;
                        }
                    }
                    if !dry_run {
                        pacer.wait();
                        // Rewritten while the pace held the removal back (a segment delivered
                        // again, a re-driven dead letter): the blob in place now is young. (One
                        // rewritten in the microseconds between this read and the removal is
                        // not caught: only a segment written again past its own retention is.)
                        if !still_expired(&file, cutoff) {
                            continue;
                        }
                    }
                    summary.expired += 1;
                    summary.expired_bytes += meta.len();
                    removed(&file);
                    if dry_run {
                        continue;
                    }
                    match fs::remove_file(&file) {
                        Ok(()) => {
                            summary.removed += 1;
                            summary.bytes += meta.len();
                            emptied = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => summary.error(format!("{}: {e}", file.display())),
                    }
                }
                if !dry_run && remove_if_empty(&replay, emptied, now, &mut summary) {
                    project_emptied = true;
                }
            }
            if !dry_run {
                remove_if_empty(&project, project_emptied, now, &mut summary);
            }
        }
    }
    summary
}

/// Top-level directories named by a retention in days. Few (one per retention in use): listed,
/// in order of the retention. A symbolic link named as one is an error: the writer follows it, the
/// sweep does not, so its blobs would never expire. Directories but no retention directory is an
/// error too: a `--blob-dir` one level too high would otherwise sweep nothing and succeed.
fn retention_dirs(root: &Path, summary: &mut Summary) -> Vec<(PathBuf, u16)> {
    let (mut dirs, mut others) = (Vec::new(), Vec::new());
    for entry in entries(root) {
        let Some((entry, kind)) = summary.noted(entry) else {
            continue;
        };
        let name = entry.file_name();
        let days = name.to_str().and_then(|n| n.parse::<u16>().ok());
        match days {
            Some(days) if kind.is_dir() => dirs.push((entry.path(), days)),
            Some(_) if kind.is_symlink() => summary.error(format!(
                "{}: a symbolic link; the sweep does not follow links, so its blobs never expire: point --blob-dir at a store holding the directory itself",
                entry.path().display()
            )),
            _ => {
                summary.left_alone += 1;
                // `lost+found`: a volume's root (a PVC mounted as the store).
                if kind.is_dir() && name != DEAD_LETTERS && name != "lost+found" {
                    others.push(name);
                }
            }
        }
    }
    if dirs.is_empty() && !others.is_empty() {
        summary.error(format!(
            "{}: no retention directory (named by days, e.g. 90/), but {} other director{} ({}): is --blob-dir the store's own directory?",
            root.display(),
            others.len(),
            if others.len() == 1 { "y" } else { "ies" },
            others
                .iter()
                .take(3)
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    dirs.sort_by_key(|(_, days)| *days);
    dirs
}

/// The store's directory of dead-letter copies, beside the retention directories.
const DEAD_LETTERS: &str = "dlq";

fn is_number<T: std::str::FromStr>(name: &str) -> bool {
    name.bytes().all(|b| b.is_ascii_digit()) && name.parse::<T>().is_ok()
}

/// A segment's blob, or a writer's temporary file of one (`{segment}.tmp-{pid}-{n}`, or
/// `{segment}.tmp-{pid}` as writers named them before).
fn is_segment_file(name: &str) -> bool {
    match name.split_once(".tmp-") {
        Some((segment, write)) => {
            is_number::<u32>(segment) && write.splitn(2, '-').all(is_number::<u64>)
        }
        None => is_number::<u32>(name),
    }
}

/// A directory entry and its type (symbolic links not followed).
type Entry = (fs::DirEntry, fs::FileType);

/// A directory's entries, one at a time; unreadable ones are errors, a directory already gone
/// is empty. The type comes with the entry: no call per entry.
fn entries(dir: &Path) -> impl Iterator<Item = Result<Entry, String>> {
    let (read, failed) = match fs::read_dir(dir) {
        Ok(read) => (Some(read), None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (None, None),
        Err(e) => (None, Some(Err(format!("{}: {e}", dir.display())))),
    };
    let typed = move |entry: io::Result<fs::DirEntry>| {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        match entry.file_type() {
            Ok(kind) => Ok((entry, kind)),
            Err(e) => Err(format!("{}: {e}", entry.path().display())),
        }
    };
    failed
        .into_iter()
        .chain(read.into_iter().flatten().map(typed))
}

/// How long an empty directory the sweep did not empty is left: a new replay's directory is
/// empty from its creation to its first file.
const EMPTY_DIRECTORY_GRACE: Duration = Duration::from_secs(3600);

/// Removes `dir` if it is empty and this sweep `emptied` it, or it has been left unchanged for
/// [`EMPTY_DIRECTORY_GRACE`] (one a sweep killed half-way emptied); whether it did.
fn remove_if_empty(dir: &Path, emptied: bool, now: SystemTime, summary: &mut Summary) -> bool {
    let empty = fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
    let left = || {
        fs::symlink_metadata(dir)
            .and_then(|meta| meta.modified())
            .is_ok_and(|modified| modified + EMPTY_DIRECTORY_GRACE <= now)
    };
    let removed = empty && (emptied || left()) && fs::remove_dir(dir).is_ok();
    if removed {
        summary.directories += 1;
    }
    removed
}

/// Whether `file` is still there and older than `cutoff`, read again by its path.
fn still_expired(file: &Path, cutoff: SystemTime) -> bool {
    fs::symlink_metadata(file)
        .and_then(|meta| meta.modified())
        .is_ok_and(|modified| modified < cutoff)
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
        blob(root, "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/0", 31 * DAY);
        blob(root, "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/1", 29 * DAY);
        blob(root, "30/1/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb/0", 45 * DAY);
        blob(root, "90/1/cccccccccccccccccccccccccccccccc/0", 45 * DAY);
        blob(root, "90/2/dddddddddddddddddddddddddddddddd/0", 91 * DAY);
        blob(root, "dlq/t/0/17", 400 * DAY);
        blob(
            root,
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/2.tmp-1",
            400 * DAY,
        );
        blob(
            root,
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/3.tmp-1-7",
            Duration::ZERO,
        );
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
            root.join("30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/0")
                .exists(),
            "a dry run removes nothing"
        );
        let summary = sweep(root, SystemTime::now(), false, PACE, |_| {});
        assert_eq!(
            (summary.expired, summary.removed, summary.bytes),
            (4, 4, 16)
        );
        // A writer's temporary file a crash left expires with the blobs beside it.
        for gone in [
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/0",
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/2.tmp-1",
            "30/1/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            "90/2",
        ] {
            assert!(!root.join(gone).exists(), "{gone}");
        }
        for kept in [
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/1",
            "90/1/cccccccccccccccccccccccccccccccc/0",
            "dlq/t/0/17",
            "30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/3.tmp-1-7",
        ] {
            assert!(root.join(kept).exists(), "{kept}");
        }
        assert_eq!(summary.directories, 3, "bbbb…, 90/2/dddd… and 90/2");
        assert_eq!(summary.left_alone, 1, "dlq/");
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(
            sweep(root, SystemTime::now(), false, PACE, |_| {}).removed,
            0
        );
    }

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn only_what_is_named_as_the_store_names_it_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let (root, elsewhere) = (dir.path().join("store"), dir.path().join("elsewhere"));
        blob(&root, &format!("30/1/{A}/0"), 40 * DAY);
        let left = [
            format!("30/1/{A}/notes.txt"),
            format!("30/1/{A}/0.bak"),
            format!("30/x/{A}/0"),
            "30/1/not-a-replay/0".to_owned(),
            format!("30/1/{}/0", A.to_uppercase()),
        ];
        for key in &left {
            blob(&root, key, 400 * DAY);
        }
        // A link where a replay's directory would be is not followed.
        blob(&elsewhere, "0", 400 * DAY);
        std::os::unix::fs::symlink(&elsewhere, root.join(format!("30/1/{B}"))).unwrap();
        let summary = sweep(&root, SystemTime::now(), false, PACE, |_| {});
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!((summary.scanned, summary.removed), (1, 1));
        // notes.txt, 0.bak, x, not-a-replay, the upper-case id and the link.
        assert_eq!(summary.left_alone, 6, "{summary}");
        for key in &left {
            assert!(root.join(key).exists(), "{key}");
        }
        assert!(elsewhere.join("0").exists());
    }

    #[test]
    fn a_retention_directory_that_is_a_link_is_an_error_and_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, volume) = (dir.path().join("store"), dir.path().join("volume"));
        blob(&root, &format!("30/1/{A}/0"), 40 * DAY);
        blob(&volume, &format!("1/{A}/0"), 400 * DAY);
        std::os::unix::fs::symlink(&volume, root.join("90")).unwrap();
        let summary = sweep(&root, SystemTime::now(), false, PACE, |_| {});
        assert_eq!(summary.removed, 1, "the rest of the store is swept");
        assert_eq!(summary.errors.len(), 1, "{:?}", summary.errors);
        assert!(
            summary.errors[0].contains("90: a symbolic link"),
            "{:?}",
            summary.errors
        );
        assert!(volume.join(format!("1/{A}/0")).exists());
    }

    #[test]
    fn a_blob_dir_above_the_store_is_an_error_not_an_empty_sweep() {
        let dir = tempfile::tempdir().unwrap();
        blob(dir.path(), &format!("blobs/30/1/{A}/0"), 40 * DAY);
        let summary = sweep(dir.path(), SystemTime::now(), false, PACE, |_| {});
        assert_eq!(summary.errors.len(), 1, "{:?}", summary.errors);
        assert!(
            summary.errors[0].contains("no retention directory")
                && summary.errors[0].contains("blobs"),
            "{:?}",
            summary.errors
        );
        assert!(dir.path().join(format!("blobs/30/1/{A}/0")).exists());
        // A store that has only dead letters so far is a store, not a mistake.
        let store = tempfile::tempdir().unwrap();
        blob(store.path(), "dlq/rec/0/12", 400 * DAY);
        let summary = sweep(store.path(), SystemTime::now(), false, PACE, |_| {});
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(summary.left_alone, 1, "dlq/");
        // Nor is a volume's root with its lost+found, before the first blob is written.
        std::fs::create_dir(store.path().join("lost+found")).unwrap();
        let summary = sweep(store.path(), SystemTime::now(), false, PACE, |_| {});
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
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

    /// A new replay's directory, empty until its first blob, is not the sweep's to remove; one
    /// left empty (by a sweep killed half-way) goes once it has been unchanged for an hour.
    #[test]
    fn an_empty_directory_the_sweep_did_not_empty_goes_only_after_an_hour() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (new, left) = (
            root.join(format!("30/1/{A}")),
            root.join(format!("30/2/{B}")),
        );
        fs::create_dir_all(&new).unwrap();
        fs::create_dir_all(&left).unwrap();
        let two_hours_ago = SystemTime::now() - 2 * EMPTY_DIRECTORY_GRACE;
        fs::File::open(&left)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
        let summary = sweep(root, SystemTime::now(), false, PACE, |_| {});
        assert!(new.is_dir(), "the new replay's directory is kept");
        assert!(
            !root.join("30/2").exists(),
            "the one left empty, and its project's"
        );
        assert_eq!(summary.directories, 2, "{summary}");
    }

    /// A blob rewritten while its removal waits for the pace (a segment delivered again, a
    /// re-driven dead letter) is kept: the sweep reads it again before removing it. It used to
    /// remove the new blob, whose offset was committed.
    #[test]
    fn a_blob_rewritten_while_its_removal_waits_for_the_pace_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let keys = [format!("30/1/{A}/0"), format!("30/1/{A}/1")];
        for key in &keys {
            blob(root, key, 40 * DAY);
        }
        let pace = SweepPace {
            sweep_max_deletes_per_second: 1,
        };
        let (first, removed) = std::sync::mpsc::channel();
        let summary = std::thread::scope(|threads| {
            // The second removal waits out the rest of the second the first began; the other
            // blob is rewritten in the middle of that wait.
            let keys = &keys;
            threads.spawn(move || {
                let first: PathBuf = removed.recv().unwrap();
                std::thread::sleep(Duration::from_millis(100));
                let other = keys.iter().map(|k| root.join(k)).find(|p| *p != first);
                fs::write(other.unwrap(), b"rewritten").unwrap();
            });
            let mut told = false;
            sweep(root, SystemTime::now(), false, pace, |path| {
                if !std::mem::replace(&mut told, true) {
                    first.send(path.to_owned()).unwrap();
                }
            })
        });
        assert_eq!((summary.expired, summary.removed), (1, 1), "{summary}");
        let kept: Vec<_> = keys.iter().filter(|k| root.join(k).exists()).collect();
        assert_eq!(kept.len(), 1, "the rewritten blob is kept: {kept:?}");
        assert_eq!(fs::read(root.join(kept[0])).unwrap(), b"rewritten");
    }

    #[test]
    fn removals_are_paced() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..25 {
            blob(
                dir.path(),
                &format!("30/1/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/{n}"),
                40 * DAY,
            );
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
