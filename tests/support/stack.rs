//! The shared local stack (`scripts/stack.sh`): who may use it when, and signals and restarts
//! of its services.
//!
//! The integration tests run in one process, several at a time. A test that stops or hangs a
//! shared server (ClickHouse stopped, the emulator or the broker under SIGSTOP) would fail every
//! test running beside it, so each stack test holds a guard for its whole run: most share the
//! stack (`uses_stack`), the ones that take a server away have it to themselves (`stops_stack`).
//! The lock is fair: once a stopping test waits, no test that comes after it starts on the
//! stack before it. (Each test has a runtime of its own; the lock is shared by all of them.)

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static STACK: RwLock<()> = RwLock::const_new(());

/// Held by a test that uses the shared stack and leaves its servers running; any number at once.
pub async fn uses_stack() -> RwLockReadGuard<'static, ()> {
    STACK.read().await
}

/// Held by a test that stops or hangs a shared server: no other stack test runs meanwhile.
pub async fn stops_stack() -> RwLockWriteGuard<'static, ()> {
    STACK.write().await
}

/// The stack's state directory (`scripts/stack.sh`): pid files, configuration, logs.
pub fn stack_dir() -> std::path::PathBuf {
    std::env::var("REPLAY_INGEST_STACK_DIR")
        .unwrap_or_else(|_| "/tmp/replay-ingest-stack".into())
        .into()
}

/// Sends `signal` to a stack service (`kafka`, `gcs`) by its pid file; whether it was delivered.
pub fn signal_stack(service: &str, signal: &str) -> bool {
    let Ok(pid) = std::fs::read_to_string(stack_dir().join(format!("{service}.pid"))) else {
        return false;
    };
    std::process::Command::new("kill")
        .args([signal, pid.trim()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `scripts/stack.sh` against the stack the test script started.
pub fn stack(args: &[&str]) {
    let status = run_stack(args).unwrap();
    assert!(status.success(), "scripts/stack.sh {args:?}");
}

fn run_stack(args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/stack.sh"))
        .args(args)
        .status()
}

/// Stops a stack service (`kafka`, `clickhouse`, `gcs`); it is started again when the guard is
/// dropped, so that a test failing mid-outage does not leave it down for the tests after it.
pub struct Down(&'static str);

impl Down {
    pub fn begin(service: &'static str) -> Down {
        stack(&["stop", service]);
        Down(service)
    }
}

impl Drop for Down {
    fn drop(&mut self) {
        // Not `stack`, which asserts: a panic while the test already panics aborts the binary,
        // and every other test's guards (services, brokers, proxies) would skip their drops.
        match run_stack(&["start", self.0]) {
            Ok(status) if status.success() => {}
            failed if std::thread::panicking() => {
                eprintln!("scripts/stack.sh start {}: {failed:?}", self.0)
            }
            failed => panic!("scripts/stack.sh start {}: {failed:?}", self.0),
        }
    }
}
