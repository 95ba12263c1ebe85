//! The `inspect` command as a user runs it.

use std::process::Command;

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .arg("inspect")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

#[test]
fn prints_one_json_line_per_file_in_argument_order_and_exits_zero_with_invalid_files() {
    let out = inspect(&[
        "fixtures/synthetic/wrong-type.msgpack",
        "fixtures/segments/console-0.msgpack",
        "fixtures/synthetic/zlib-bomb.msgpack",
    ]);
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        (lines[0]["ok"].as_bool(), lines[0]["reason"].as_str()),
        (Some(false), Some("wrong_type"))
    );
    assert_eq!(
        (lines[1]["ok"].as_bool(), lines[1]["segment_id"].as_u64()),
        (Some(true), Some(0))
    );
    assert_eq!(lines[2]["reason"].as_str(), Some("too_large"));
}

#[test]
fn an_unreadable_file_is_reported_and_fails_the_command_after_the_others_print() {
    let out = inspect(&[
        "fixtures/does-not-exist.msgpack",
        "fixtures/segments/console-1.msgpack",
    ]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 1);
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("does-not-exist.msgpack")
    );
}

#[test]
fn a_file_larger_than_any_message_is_not_read_and_fails_the_command() {
    let out = inspect(&[
        "--max-message-bytes",
        "2000",
        "fixtures/segments/media-0.msgpack",
        "fixtures/segments/console-1.msgpack",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("console-1.msgpack"), "{stdout}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("media-0.msgpack: 20007 bytes, larger than --max-message-bytes (2000)"),
        "{stderr}"
    );
}

/// A pipe says it holds nothing: what is read from it is bounded all the same (it was read to
/// its end, however much came).
#[test]
fn a_pipe_carrying_more_than_any_message_is_read_no_further_and_fails_the_command() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args(["inspect", "--max-message-bytes", "2000", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A writer that never ends: the command must stop reading on its own.
    let writer = std::thread::spawn(move || {
        let chunk = [0u8; 65536];
        let mut sent = 0u64;
        while stdin.write_all(&chunk).is_ok() && sent < 64 << 20 {
            sent += chunk.len() as u64;
        }
        sent
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("/dev/stdin: more than 2000 bytes, larger than --max-message-bytes (2000)"),
        "{stderr}"
    );
    assert!(
        writer.join().unwrap() < 64 << 20,
        "the command stopped reading"
    );
}

#[test]
fn many_files_print_in_argument_order_across_windows() {
    let files: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/segments"))
            .unwrap()
            .map(|e| e.unwrap().path().display().to_string())
            .collect();
    // Several windows' worth, each file a few times, in an order no window keeps by chance.
    let args: Vec<String> = (0..5)
        .flat_map(|round| {
            let mut round_files = files.clone();
            round_files.rotate_left(round * 3 % files.len());
            round_files
        })
        .collect();
    let out = inspect(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    let printed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["file"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(printed, args);
}

#[test]
fn no_files_is_a_usage_error() {
    let out = inspect(&[]);
    assert_eq!(out.status.code(), Some(2));
}

/// Its threads are the deployment's: `REPLAY_INGEST_PROCESSING_THREADS`, which a pod's `kubectl
/// exec` inherits, is read (and checked as `consume` checks it). Without it, `inspect` in a pod
/// ran a thread per core of the node, each decoding a file, in the service's memory limit.
#[test]
fn processing_threads_are_read_from_the_environment_as_consumes_are() {
    let run = |threads: &str| {
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .args(["inspect", "fixtures/segments/large-dom-0.msgpack"])
            .env("REPLAY_INGEST_PROCESSING_THREADS", threads)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let one = run("1");
    assert!(one.status.success(), "{one:?}");
    let refused = run("5000");
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--processing-threads"),
        "{refused:?}"
    );
}

#[test]
fn limits_can_be_set_from_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args(["inspect", "fixtures/segments/large-dom-0.msgpack"])
        .env("REPLAY_INGEST_MAX_DECOMPRESSED_BYTES", "1000000")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["reason"].as_str(), Some("too_large"));
}
