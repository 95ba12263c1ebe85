//! The service under test, as its own process: its flags, start, probes, signals and exit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// Runs `replay-ingest SUBCOMMAND ARGS` to its end (`RUST_LOG` unset, so the output is the
/// tool's own): whether it exited 0, and its stdout followed by its stderr.
pub fn run_tool<S: AsRef<std::ffi::OsStr>>(
    subcommand: &str,
    args: impl IntoIterator<Item = S>,
) -> (bool, String) {
    let (code, said) = run_tool_for_status(subcommand, args);
    (code == Some(0), said)
}

/// A tool's run, as [`run_tool`]: its exit status and what it printed.
pub fn run_tool_for_status<S: AsRef<std::ffi::OsStr>>(
    subcommand: &str,
    args: impl IntoIterator<Item = S>,
) -> (Option<i32>, String) {
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_replay-ingest"))
            .arg(subcommand)
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    (out.status.code(), said(&out))
}

/// How long a tool a test runs may take before the test kills it: far past what a run that ends
/// takes on a loaded machine, so that one that hangs fails its test, saying what it printed,
/// instead of holding up every test after it until the CI run is stopped.
pub const TOOL_DEADLINE: Duration = Duration::from_secs(300);

/// What `child` (its stdout and stderr piped) printed once it exits. Not exited within
/// [`TOOL_DEADLINE`], it is killed and the test fails with its output.
pub fn output_within(mut child: Child) -> std::process::Output {
    fn read_all(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let (stdout, stderr) = (read_all(child.stdout.take()), read_all(child.stderr.take()));
    let deadline = Instant::now() + TOOL_DEADLINE;
    let mut hung = false;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            hung = true;
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::process::Output {
        status: child.wait().unwrap(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    assert!(
        !hung,
        "still running after {TOOL_DEADLINE:?}, killed; it said:\n{}",
        said(&out)
    );
    out
}

/// A process's stdout followed by its stderr.
pub fn said(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// How long a test waits for members to join a group and for what they consume to be flushed:
/// generous, for a loaded machine; a test that passes does not wait it out.
pub const JOIN_AND_FLUSH: Duration = Duration::from_secs(120);

/// Waits until two members of a group share a topic's 4 partitions, each owning some.
pub async fn both_own_partitions(a: &Service, b: &Service) {
    wait_for("both members owning partitions", JOIN_AND_FLUSH, || {
        let (a, b) = (a.owned(), b.owned());
        a > 0 && b > 0 && a + b == 4
    })
    .await;
}

/// Polls `condition` every 100 ms until it holds or `timeout` passes.
pub async fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on 127.0.0.1, never the same twice in this process, and below the kernel's
/// ephemeral range: a port in that range can also go to an outgoing connection between the pick
/// and the server's start (as `scripts/lib/isolated-stack.sh` explains). The chaos harness picks
/// from the upper half of the range, every other test binary from the lower: the two run side by
/// side, each knows only its own picks, and a port is bound seconds after it is picked (a broker's
/// listeners, a relay).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768u16);
    let middle = 10000 + low.saturating_sub(10000) / 2;
    let picks = match env!("CARGO_CRATE_NAME") {
        "chaos" => middle..low,
        _ => 10000..middle,
    };
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = rand::random_range(picks.clone());
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
}

/// The service as a child process, as operators run it.
pub struct Service {
    pub child: Child,
    pub port: u16,
    /// The file its logs go to, if they go to one: the tail is shown if the test fails.
    logs: Option<LogFile>,
}

/// A file a service's logs go to.
enum LogFile {
    /// One of its own, removed with the service.
    Own(tempfile::NamedTempFile),
    /// One the test named, which the test keeps.
    Named(PathBuf),
}

impl LogFile {
    fn path(&self) -> &Path {
        match self {
            LogFile::Own(file) => file.path(),
            LogFile::Named(path) => path,
        }
    }
}

/// Parsed `consume` flags for running the pipeline in-process (local sinks, fast joins), plus
/// `extra` flags; validated like the binary validates them.
pub fn consume_args(
    topic: &str,
    group: &str,
    extra: &[&str],
) -> replay_ingest::config::ConsumeArgs {
    let mut argv = service_args(
        topic,
        &unique("dlq"),
        group,
        &std::env::temp_dir(),
        free_port(),
    );
    argv.extend(extra.iter().map(|s| s.to_string()));
    parse_consume(argv)
}

/// `argv` (`consume` and its flags) parsed and validated as the binary does.
pub fn parse_consume(mut argv: Vec<String>) -> replay_ingest::config::ConsumeArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: replay_ingest::config::ConsumeArgs,
    }
    assert_eq!(argv[0], "consume");
    argv[0] = "test".into(); // in the program name's place
    let args = <Cli as clap::Parser>::try_parse_from(argv).unwrap().args;
    args.validate().unwrap();
    args
}

/// `args` with the value of `flag` replaced.
pub fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not among {args:?}"));
    args[at + 1] = value.into();
    args
}

/// Probes asked of a service over a while ([`Service::probe_into`]).
#[derive(Default)]
pub struct Probes {
    pub asked: usize,
    pub unanswered: usize,
    pub failed: Vec<String>,
}

impl Probes {
    /// No probe answered other than 200, and most were answered: a kubelet fails a pod only
    /// after several missed probes in a row, and one that stopped answering fails here.
    pub fn assert_healthy(&self) {
        assert!(self.failed.is_empty(), "{:?}", self.failed);
        assert!(
            self.unanswered * 2 < self.asked,
            "{} of {} probes unanswered within a second",
            self.unanswered,
            self.asked
        );
    }
}

/// A process the test started, killed when the test ends, passed or failed.
pub struct KilledWhenDropped(pub std::process::Child);

impl Drop for KilledWhenDropped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Flags for a test run with local sinks (filesystem blobs, no rows, events or metrics).
pub fn service_args(
    topic: &str,
    dlq: &str,
    group: &str,
    blob_dir: &Path,
    port: u16,
) -> Vec<String> {
    let mut args = base_args(topic, dlq, group, blob_dir, port);
    args.extend(
        [
            "--blob-sink",
            "filesystem",
            "--rows-sink",
            "null",
            "--events-sink",
            "null",
            "--statsd-address",
            "",
        ]
        .map(String::from),
    );
    args
}

/// Flags for a test run, sinks not chosen: fast group joins, short buffers.
pub fn base_args(topic: &str, dlq: &str, group: &str, blob_dir: &Path, port: u16) -> Vec<String> {
    [
        "consume",
        "--brokers",
        &brokers(),
        "--topic",
        topic,
        "--dlq-topic",
        dlq,
        "--group-id",
        group,
        "--blob-dir",
        &blob_dir.to_string_lossy(),
        "--http-listen",
        &format!("127.0.0.1:{port}"),
        "--session-timeout-ms",
        "2000",
        "--drain-deadline-ms",
        "1500",
        "--buffer-max-age-ms",
        "200",
        "--buffer-max-bytes",
        "64000000",
        "--max-message-bytes",
        "16000000",
        "--flush-initial-backoff-ms",
        "20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Service {
    pub fn start(args: &[String]) -> Service {
        Self::spawn_logging(args, None, |_| {})
    }

    /// Starts the service with its command adjusted first by `configure` (its environment).
    pub fn start_configured(args: &[String], configure: impl FnOnce(&mut Command)) -> Service {
        Self::spawn_logging(args, None, configure)
    }

    /// Starts the service with its logs written to `log`; their tail is shown if the test fails.
    pub fn start_logging_to(args: &[String], log: &Path) -> Service {
        let mut service = Self::start_with_logs(args, std::fs::File::create(log).unwrap().into());
        service.logs = Some(LogFile::Named(log.to_owned()));
        service
    }

    /// Starts the service with its logs (stderr) going to `logs`.
    pub fn start_with_logs(args: &[String], logs: Stdio) -> Service {
        Self::spawn(args, logs, None)
    }

    /// Starts the service with a `soft` and a `hard` limit of open file descriptors (a
    /// container's).
    pub fn start_with_fd_limits(args: &[String], soft: u64, hard: u64) -> Service {
        Self::spawn_logging(args, Some((soft, hard)), |_| {})
    }

    /// Its limits of open file descriptors, soft and hard, as the kernel has them.
    pub fn fd_limits(&self) -> (u64, u64) {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let numbers: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (numbers[0], numbers[1])
    }

    /// Starts the service with its logs kept in a file, whose last lines are shown if the test
    /// fails, and which tests read; with REPLAY_INGEST_TEST_LOGS=1 also shown as they come.
    fn spawn_logging(
        args: &[String],
        fd_limits: Option<(u64, u64)>,
        configure: impl FnOnce(&mut Command),
    ) -> Service {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut service = if std::env::var_os("REPLAY_INGEST_TEST_LOGS").is_some() {
            use std::io::{Read, Write};
            let mut service = Self::spawn_with(args, Stdio::piped(), fd_limits, configure);
            let mut logs = service.child.stderr.take().unwrap();
            let mut kept = file.reopen().unwrap();
            std::thread::spawn(move || {
                let mut chunk = [0; 8192];
                while let Ok(n @ 1..) = logs.read(&mut chunk) {
                    let _ = kept.write_all(&chunk[..n]);
                    let _ = std::io::stderr().write_all(&chunk[..n]);
                }
            });
            service
        } else {
            Self::spawn_with(args, file.reopen().unwrap().into(), fd_limits, configure)
        };
        service.logs = Some(LogFile::Own(file));
        service
    }

    /// Starts the service with its logs going to `logs` and, if given, soft and hard limits of
    /// open file descriptors.
    pub fn spawn(args: &[String], logs: Stdio, fd_limits: Option<(u64, u64)>) -> Service {
        Self::spawn_with(args, logs, fd_limits, |_| {})
    }

    fn spawn_with(
        args: &[String],
        logs: Stdio,
        fd_limits: Option<(u64, u64)>,
        configure: impl FnOnce(&mut Command),
    ) -> Service {
        use std::os::unix::process::CommandExt;
        let port = args
            .iter()
            .position(|a| a == "--http-listen")
            .and_then(|i| args.get(i + 1))
            .unwrap();
        let port = port.rsplit(':').next().unwrap().parse().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_replay-ingest"));
        command
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(logs);
        configure(&mut command);
        if let Some((soft, hard)) = fd_limits {
            // SAFETY: only setrlimit, async-signal-safe, runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let rlimit = libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    };
                    match libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
        }
        Service {
            child: command.spawn().expect("start the service"),
            port,
            logs: None,
        }
    }

    /// Probes `path` ([`Service::probe`]) into `probes`: an answer other than 200 is a failure;
    /// none within the second is counted apart (the machine loaded by the chaos run beside).
    pub fn probe_into(&self, probes: &mut Probes, path: &str, what: &str) {
        probes.asked += 1;
        match self.probe(path) {
            Some(200) => {}
            None => probes.unanswered += 1,
            Some(code) => probes.failed.push(format!("{path} {code}: {what}")),
        }
    }

    /// `GET path` the way the kubelet probes: a new connection, one second to answer.
    pub fn probe(&self, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let t = Instant::now();
        let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))
            .map_err(|e| eprintln!("connect {e} {:?}", t.elapsed()))
            .ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| eprintln!("write {e}"))
        .ok()?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| eprintln!("read {e} {:?}", t.elapsed()))
            .ok()?;
        response.split_whitespace().nth(1)?.parse().ok()
    }

    /// `/status` as JSON, or `None` while the endpoint is not up.
    pub fn status(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.get("/status")?.1).ok()
    }

    /// `GET path` on the health endpoint: the status code and body, or `None` while it is not up.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, response.split("\r\n\r\n").nth(1)?.to_owned()))
    }

    /// Once a flush of its is under way, SIGTERM: its exit status, given `within` to exit
    /// (`None`: killed when it had not).
    pub async fn stopped_mid_flush(self, within: Duration) -> Option<i32> {
        wait_for("a flush under way", JOIN_AND_FLUSH, || {
            self.status()
                .is_some_and(|s| s["flushes_in_flight"].as_u64() >= Some(1))
        })
        .await;
        self.signal_term();
        self.exit_within(within).await
    }

    /// Sends SIGTERM without waiting for the exit.
    pub fn signal_term(&self) {
        self.signal("-TERM");
    }

    /// Sends `signal` (`-STOP`, `-CONT`, …) to the process.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }

    /// A counter of `/status` (`consumed`, `flushed`, `buffer_messages`, …): 0 while it is not
    /// up.
    pub fn count(&self, field: &str) -> u64 {
        self.status().map_or(0, |s| s[field].as_u64().unwrap())
    }

    /// How many partitions it holds (`/status`'s `partitions`): 0 while it is not up.
    pub fn owned(&self) -> usize {
        self.status()
            .map_or(0, |s| s["partitions"].as_array().map_or(0, Vec::len))
    }

    pub fn committed(&self) -> BTreeMap<i32, i64> {
        self.status()
            .and_then(|s| {
                serde_json::from_value::<BTreeMap<String, i64>>(s["committed"].clone()).ok()
            })
            .map(|m| {
                m.into_iter()
                    .map(|(k, v)| (k.parse().unwrap(), v))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        self.signal_term();
        // Far past any drain deadline a test sets: a service that hangs on SIGTERM fails its
        // test, saying what it logged, instead of holding up every test after it.
        let deadline = Instant::now() + TOOL_DEADLINE;
        let code = loop {
            match self.child.try_wait().ok()? {
                Some(status) => break status.code(),
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                None => {
                    self.tell_logs();
                    panic!("the service did not exit within {TOOL_DEADLINE:?} of SIGTERM");
                }
            }
        };
        self.tell_if_not_clean(code);
        code
    }

    /// The tail of its logs, on the test's output (shown if the test fails), when it did not
    /// exit 0: the test may be about to fail on it, and the logs go with `self`.
    fn tell_if_not_clean(&self, code: Option<i32>) {
        if code != Some(0) {
            eprintln!("the service exited {code:?}");
            self.tell_logs();
        }
    }

    /// Its logs so far, when they go to a file.
    pub fn log_text(&self) -> Option<String> {
        let bytes = std::fs::read(self.logs.as_ref()?.path()).unwrap_or_default();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The last [`LOG_TAIL_LINES`] lines of its logs, when they go to a file, on stderr.
    fn tell_logs(&self) {
        let Some(text) = self.log_text() else {
            return;
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        eprintln!(
            "--- the last {} lines of the service's logs (port {}) ---\n{}",
            tail.len(),
            self.port,
            tail.join("\n")
        );
    }

    /// Waits up to `timeout` for the service to exit on its own; its exit code, or `None` while
    /// it still runs (it is killed when dropped).
    pub async fn exit_within(mut self, timeout: Duration) -> Option<i32> {
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                if let Some(status) = self.child.try_wait().unwrap() {
                    self.tell_if_not_clean(status.code());
                    return status.code();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            self.tell_if_not_clean(None);
            None
        })
        .await
        .unwrap()
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of a failed test's service logs shown.
const LOG_TAIL_LINES: usize = 80;

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            self.tell_logs();
        }
    }
}

/// Waits for `service` to stop on a topic found deleted and created again (`kafka::topic_id`:
/// asked every 10 s, a new id taken from two answers in a row): exit 1, the reason in the log at
/// `path`, which it returns.
pub async fn stops_on_a_new_topic_id(service: Service, path: &Path) -> String {
    let code = service.exit_within(Duration::from_secs(90)).await;
    let said = std::fs::read_to_string(path).unwrap();
    assert_eq!(code, Some(1), "the service stops on a new id:\n{said}");
    assert!(
        said.contains("deleted and created again while this process used it"),
        "{said}"
    );
    said
}

/// Asserts that the log at `path` holds no ERROR line.
pub fn assert_no_error_line(path: &Path) {
    let said = std::fs::read_to_string(path).unwrap();
    let errors: Vec<&str> = said
        .lines()
        .filter(|l| log_level(l) == Some("ERROR"))
        .collect();
    assert!(
        errors.is_empty(),
        "no ERROR line in {}: {errors:#?}",
        path.display()
    );
}

/// The level of a line of the service's text log (`<time> <LEVEL> <target>: …`).
pub fn log_level(line: &str) -> Option<&str> {
    line.split_whitespace().nth(1)
}
