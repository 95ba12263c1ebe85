//! `replay-ingest sweep` and the service's periodic sweep (`--sweep-interval-s`) on a real
//! filesystem store: exactly the blobs older than their key's retention go, with the directories
//! they leave empty; fresh blobs, dead-letter copies and other files stay.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::support::*;

const DAY: Duration = Duration::from_secs(86_400);

/// Replay ids, as keys name them.
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccc";

/// A blob at `key`, written `age` ago (its modification time set back).
fn aged(root: &Path, key: &str, age: Duration) {
    let path = root.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"\x78\x9c blob").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
}

fn sweep(root: &Path, extra: &[&str]) -> (bool, String) {
    run_tool(
        "sweep",
        ["--blob-dir", root.to_str().unwrap()].iter().chain(extra),
    )
}

#[test]
fn the_sweep_removes_exactly_the_expired_blobs_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    aged(root, &format!("30/42/{A}/0"), 31 * DAY);
    aged(root, &format!("30/42/{A}/1"), 2 * DAY);
    aged(root, &format!("90/42/{B}/0"), 91 * DAY);
    aged(root, &format!("90/42/{C}/0"), 89 * DAY);
    aged(root, "dlq/rec/0/12", 365 * DAY);
    let (ok, dry) = sweep(root, &["--dry-run"]);
    assert!(ok, "{dry}");
    assert!(dry.contains("would remove"), "{dry}");
    assert!(
        dry.contains("4 blob(s) scanned, 2 past their retention (14 bytes), 0 removed"),
        "{dry}"
    );
    assert!(root.join(format!("30/42/{A}/0")).exists());
    let (ok, said) = sweep(root, &[]);
    assert!(ok, "{said}");
    assert!(
        said.contains("2 past their retention (14 bytes), 2 removed (14 bytes)"),
        "{said}"
    );
    assert!(
        !root.join(format!("30/42/{A}/0")).exists() && !root.join(format!("90/42/{B}")).exists()
    );
    for kept in [
        format!("30/42/{A}/1"),
        format!("90/42/{C}/0"),
        "dlq/rec/0/12".to_owned(),
    ] {
        assert!(root.join(&kept).exists(), "{kept}");
    }
    let (ok, again) = sweep(root, &[]);
    assert!(ok && again.contains("0 removed"), "{again}");
}

/// On a store of millions of files, a dry run's summary alone; and a listing cut short by its
/// reader (`| head`) ends as any Unix tool's does, by the closed pipe, not with a panic.
#[test]
fn a_dry_run_says_only_its_summary_when_asked_and_stops_quietly_on_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    for n in 0..2000 {
        aged(dir.path(), &format!("30/42/{A}/{n}"), 31 * DAY);
    }
    let (ok, said) = sweep(dir.path(), &["--dry-run", "--summary-only"]);
    assert!(ok, "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("2000 past their retention"), "{said}");
    let (ok, said) = sweep(dir.path(), &["--summary-only"]);
    assert!(
        !ok && said.contains("--dry-run"),
        "only with a dry run: {said}"
    );

    let mut listing = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args([
            "sweep",
            "--dry-run",
            "--blob-dir",
            dir.path().to_str().unwrap(),
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(listing.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with("would remove"), "{first}");
    // The reader is gone (its end of the pipe dropped with the BufReader).
    let out = listing.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
    assert!(
        dir.path().join(format!("30/42/{A}/0")).exists(),
        "a dry run"
    );
}

/// A retention directory that is a link (the writer follows it, the sweep does not) fails the
/// run, naming it, where it swept nothing there and exited 0; the rest of the store is swept.
#[test]
fn a_linked_retention_directory_fails_the_sweep_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (root, volume) = (dir.path().join("store"), dir.path().join("volume"));
    aged(&root, &format!("30/42/{A}/0"), 31 * DAY);
    aged(&volume, &format!("42/{B}/0"), 200 * DAY);
    std::os::unix::fs::symlink(&volume, root.join("90")).unwrap();
    let (ok, said) = sweep(&root, &[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("1 removed") && said.contains("90: a symbolic link"),
        "{said}"
    );
    assert!(volume.join(format!("42/{B}/0")).exists());
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn the_service_sweeps_its_filesystem_store_while_it_runs() {
    let _stack = uses_stack().await;
    let (topic, dlq, group) = (unique("rec"), unique("dlq"), unique("group"));
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    aged(dir.path(), &format!("30/42/{A}/0"), 40 * DAY);
    aged(dir.path(), &format!("90/42/{B}/0"), 100 * DAY);
    let fixtures = small_fixtures(true);
    let (report, _) = produce_fixtures(&topic, &fixtures, 5).await;
    let statsd = Statsd::bind();
    let args = with_flag(
        service_args(&topic, &dlq, &group, dir.path(), free_port()),
        "--statsd-address",
        &format!("127.0.0.1:{}", statsd.port()),
    );
    let args: Vec<String> = args
        .into_iter()
        .chain(
            [
                "--sweep-interval-s",
                "1",
                "--statsd-flush-interval-ms",
                "100",
            ]
            .map(String::from),
        )
        .collect();
    let service = Service::start(&args);
    wait_for("everything committed", Duration::from_secs(120), || {
        service.committed() == expected_commits(&report)
    })
    .await;
    wait_for("the aged blobs swept", Duration::from_secs(30), || {
        !dir.path().join(format!("30/42/{A}")).exists()
            && !dir.path().join(format!("90/42/{B}")).exists()
    })
    .await;
    let written = blobs_under(dir.path());
    assert_eq!(written.len(), 5, "the fresh blobs stay: {written:?}");
    assert_eq!(service.terminate(), Some(0));
    let counters = statsd.read().counters;
    assert_eq!(
        counters.get("replay_ingest.sweep.removed"),
        Some(&2.0),
        "{counters:?}"
    );
}

#[test]
fn a_periodic_sweep_on_gcs_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args([
            "consume",
            "--blob-sink",
            "gcs",
            "--gcs-bucket",
            "b",
            "--sweep-interval-s",
            "60",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--sweep-interval-s sweeps the filesystem blob store"),
        "{said}"
    );
}
