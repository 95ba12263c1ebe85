//! `--log-format json`: one JSON object per line, with the fields an operator filters on at the
//! top level (`timestamp`, `level`, `target`, `message`, and the event's own fields).

use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn lines(stderr: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}"))
        })
        .collect()
}

#[test]
fn a_refused_configuration_is_one_json_error_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args([
            "consume",
            "--blob-sink",
            "null",
            "--drain-deadline-ms",
            "40000",
            "--statsd-address",
            "",
        ])
        .env("REPLAY_INGEST_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let lines = lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert!(
        lines[0]["message"]
            .as_str()
            .unwrap()
            .contains("--drain-deadline-ms"),
        "{lines:?}"
    );
    assert!(lines[0]["timestamp"].as_str().unwrap().ends_with('Z'));
}

/// A value clap refuses, from a variable (as the chart sets every `config` key): one JSON line
/// too, naming the flag, the variable and the chart's key (it was clap's plain text, naming the
/// flag only, in a stream of JSON lines).
#[test]
fn a_value_refused_by_the_parser_is_one_json_error_line_naming_its_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .arg("consume")
        .env("REPLAY_INGEST_LOG_FORMAT", "json")
        .env("REPLAY_INGEST_BUFFER_MAX_AGE_MS", "5s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let lines = lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
    let message = lines[0]["message"].as_str().unwrap();
    for named in [
        "invalid value '5s' for '--buffer-max-age-ms",
        "REPLAY_INGEST_BUFFER_MAX_AGE_MS",
        "config.BUFFER_MAX_AGE_MS",
    ] {
        assert!(message.contains(named), "{named}: {message}");
    }
    // Given as a flag, the variable is not named.
    let out = Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
        .args(["consume", "--buffer-max-age-ms", "5s"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stderr).unwrap();
    assert!(text.starts_with("error: invalid value '5s'"), "{text}");
    assert!(!text.contains("REPLAY_INGEST_"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn a_running_service_logs_json_with_its_fields_at_the_top_level() {
    let _stack = uses_stack().await;
    let topic = unique("json-logs");
    create_topic(&topic, 1).await;
    let dlq = unique("json-logs-dlq");
    create_topic(&dlq, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let group = unique("json-logs");
    let mut args = service_args(&topic, &dlq, &group, &dir.path().join("blobs"), free_port());
    args.extend(["--log-format", "json"].map(String::from));
    let log = dir.path().join("service.log");
    let service = Service::start_logging_to(&args, &log);
    wait_for("partitions assigned", Duration::from_secs(30), || {
        service
            .get("/health/ready")
            .is_some_and(|(code, _)| code == 200)
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let lines = lines(&std::fs::read(&log).unwrap());
    let starting = lines
        .iter()
        .find(|l| l["message"] == "starting")
        .expect("the starting line");
    assert_eq!(starting["level"], "INFO");
    assert_eq!(starting["target"], "replay_ingest");
    assert_eq!(starting["topic"], topic.as_str());
    assert_eq!(starting["group"], group.as_str());
    let stopped = lines
        .iter()
        .find(|l| l["message"] == "stopped cleanly")
        .expect("the stop line");
    assert_eq!(stopped["consumed"], 0);
}
