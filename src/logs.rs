//! Log lines on stderr, as text or JSON, and panics as log lines: a panic — a bug — that the
//! service survives (a message processed or written is dead-lettered as `internal_error`) is
//! one ERROR line in the chosen format, not the standard library's plain-text lines, which a
//! JSON log pipeline would drop or choke on exactly where a bug shows.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::error;

/// Panics (target `panic`, [`log_panic`]) are logged whatever `RUST_LOG` says.
const PANIC_DIRECTIVE: &str = "panic=error";

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One object per line, for log pipelines: `timestamp`, `level`, `target`, `message` and
    /// the event's fields at the top level.
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), and panics through the log, whatever
/// `RUST_LOG` says (a panic must never go unseen).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info".into())
        .add_directive(PANIC_DIRECTIVE.parse().expect("a valid directive"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
    std::panic::set_hook(Box::new(log_panic));
}

/// A log line that can come once per message — a bug that panics on every one, a sink refusing
/// one message in a hundred — written for the first [`Throttle::BURST`] of each minute, then held
/// back: at ten thousand messages a second the log stays readable. The next line written says how
/// many like it were held back (`held_back`); when none comes, [`tell_held_back`] says so once
/// the minute has passed.
pub struct Throttle {
    /// The line's message, to say what was held back.
    what: &'static str,
    /// Lines written in each window, and the window's length.
    burst: u32,
    length: Duration,
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    written: u32,
    held_back: u64,
}

impl Throttle {
    pub const BURST: u32 = 10;
    const WINDOW: Duration = Duration::from_secs(60);

    pub const fn new(what: &'static str) -> Throttle {
        Throttle::with(what, Self::BURST, Self::WINDOW)
    }

    /// `burst` lines in each window of `length`.
    pub const fn with(what: &'static str, burst: u32, length: Duration) -> Throttle {
        Throttle {
            what,
            burst,
            length,
            window: Mutex::new(Window {
                started: None,
                written: 0,
                held_back: 0,
            }),
        }
    }

    /// `Some(held back since the last line written or told)` to write this one, `None` to hold
    /// it back.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut window = self.window();
        if window
            .started
            .is_none_or(|started| now.duration_since(started) >= self.length)
        {
            window.started = Some(now);
            window.written = 0;
        }
        if window.written >= self.burst {
            window.held_back += 1;
            return None;
        }
        window.written += 1;
        Some(std::mem::take(&mut window.held_back))
    }

    /// How many lines were held back, when there are any and their minute has passed (or
    /// `now` is `None`: the process is ending); they count as told.
    fn untold(&self, now: Option<Instant>) -> Option<u64> {
        let mut window = self.window();
        let over = match (now, window.started) {
            (Some(now), Some(started)) => now.duration_since(started) >= self.length,
            _ => true,
        };
        (over && window.held_back > 0).then(|| std::mem::take(&mut window.held_back))
    }

    /// Its window is over and it holds nothing back: forgetting it loses nothing.
    fn quiet(&self, now: Instant) -> bool {
        let window = self.window();
        window.held_back == 0
            && window
                .started
                .is_none_or(|started| now.duration_since(started) >= self.length)
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The throttled lines of the service, each with its own budget (one line's flood must not hold
/// back another's first lines).
pub static INTERNAL_ERRORS: Throttle =
    Throttle::new("processing failed: message dead-lettered as internal_error");
pub static SINK_PANICS: Throttle = Throttle::new(
    "a sink panicked on this message (a bug): to the dead-letter topic as internal_error",
);
pub static REJECTED: Throttle = Throttle::new("message rejected: to the dead-letter topic");
pub static KEPT_IN_STORE: Throttle =
    Throttle::new("dead letter too large for its topic: value kept in the blob store");
pub static PAUSE_FAILED: Throttle = Throttle::new("cannot pause or resume the assigned partitions");
pub static COMMIT_FAILED: Throttle = Throttle::new("offset commit failed: retried");
pub static ORIGINAL_LOST: Throttle = Throttle::new(
    "a message a sink rejected is gone from the topic: dead-lettered without its bytes",
);
pub static ORIGINAL_REPLACED: Throttle = Throttle::new(
    "a message a sink rejected is no longer at its offset, another message is: dead-lettered without its bytes",
);
pub static ACCEPT_FAILED: Throttle = Throttle::new("probe server: accept failed");

const THROTTLED: [&Throttle; 9] = [
    &INTERNAL_ERRORS,
    &SINK_PANICS,
    &REJECTED,
    &KEPT_IN_STORE,
    &PAUSE_FAILED,
    &COMMIT_FAILED,
    &ORIGINAL_LOST,
    &ORIGINAL_REPLACED,
    &ACCEPT_FAILED,
];

/// Lines of many kinds, each kind throttled on its own, its throttle made as its first line
/// comes: at most `most` kinds at once. A kind quiet for a window, with nothing held back, makes
/// room for a new one; past `most` kinds none of which is quiet, a line of a new kind is not
/// throttled.
pub struct Kinds {
    burst: u32,
    length: Duration,
    most: usize,
    kinds: Mutex<Vec<(String, Throttle)>>,
}

impl Kinds {
    pub const fn new(burst: u32, length: Duration, most: usize) -> Kinds {
        Kinds {
            burst,
            length,
            most,
            kinds: Mutex::new(Vec::new()),
        }
    }

    /// As [`Throttle::admit`], for a line of `kind`.
    pub fn admit(&self, kind: &str) -> Option<u64> {
        self.admit_at(kind, Instant::now())
    }

    fn admit_at(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, throttle)) = kinds.iter().find(|(known, _)| known == kind) {
            return throttle.admit_at(now);
        }
        if kinds.len() >= self.most {
            kinds.retain(|(_, throttle)| !throttle.quiet(now));
        }
        if kinds.len() >= self.most {
            return Some(0);
        }
        let throttle = Throttle::with("", self.burst, self.length);
        let admitted = throttle.admit_at(now);
        kinds.push((kind.to_owned(), throttle));
        admitted
    }

    /// Each kind's lines held back ([`Throttle::untold`]). Counted under the lock, for the caller
    /// to log after it: a write that fails and panics would come back to [`PANICS`].
    fn untold(&self, now: Option<Instant>) -> Vec<(String, u64)> {
        self.kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(kind, throttle)| Some((kind.clone(), throttle.untold(now)?)))
            .collect()
    }
}

/// Panics, throttled per place in the code: a bug that panics on every message is held back
/// after its first lines, while a panic elsewhere — the one that stops the service — is still
/// written.
static PANICS: Kinds = Kinds::new(Throttle::BURST, Throttle::WINDOW, 32);

/// librdkafka's errors, one line per kind (a client, an error, a reason) in 30 s: it reports one
/// on every reconnect that fails — every 100 ms from each client at first while the brokers are
/// down, 250 lines in a 5 s restart — which buried the lines an operator needs (the kafka
/// module's `client_error` admits them).
pub static CLIENT_ERRORS: Kinds = Kinds::new(1, Duration::from_secs(30), 256);

/// Says, one line each, how many lines of each throttled kind were held back in a minute that
/// has passed without another like them; with `ending`, all held back so far (the process is
/// about to exit, and they would never be told). The pipeline calls it every second.
pub fn tell_held_back(ending: bool) {
    let now = (!ending).then(Instant::now);
    for throttle in THROTTLED {
        if let Some(held_back) = throttle.untold(now) {
            tracing::warn!(
                held_back,
                "{held_back} more lines like \"{}\" were held back",
                throttle.what
            );
        }
    }
    for (location, held_back) in PANICS.untold(now) {
        error!(target: "panic", location, held_back, "{held_back} more panics here were held back");
    }
    for (kind, held_back) in CLIENT_ERRORS.untold(now) {
        tracing::warn!(
            kind,
            held_back,
            "{held_back} more librdkafka errors like this were held back"
        );
    }
}

/// One ERROR line per panic: its message, where, on which thread, and a backtrace when
/// `RUST_BACKTRACE` asks for one.
fn log_panic(info: &std::panic::PanicHookInfo) {
    let location = info.location().map_or_else(String::new, |l| {
        format!("{}:{}:{}", l.file(), l.line(), l.column())
    });
    let Some(held_back) = PANICS.admit(&location) else {
        return;
    };
    let message = crate::recording::panic_message(info.payload());
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    let backtrace = std::backtrace::Backtrace::capture();
    match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => {
            error!(target: "panic", thread, location, held_back, %backtrace, "panicked: {message}")
        }
        _ => error!(target: "panic", thread, location, held_back, "panicked: {message}"),
    }
}

/// The JSON log lines written on this thread while `f` runs, with what it returned: for tests
/// of what the service logs.
#[cfg(test)]
pub(crate) fn captured<R>(f: impl FnOnce() -> R) -> (R, Vec<serde_json::Value>) {
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (result, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_writes_a_burst_a_minute_and_then_says_how_many_it_held_back() {
        let throttle = Throttle::new("x");
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        for _ in 0..Throttle::BURST {
            assert_eq!(throttle.admit_at(at(0)), Some(0));
        }
        for _ in 0..5_000 {
            assert_eq!(throttle.admit_at(at(30)), None);
        }
        assert_eq!(throttle.untold(Some(at(59))), None, "within the minute");
        assert_eq!(throttle.admit_at(at(60)), Some(5_000), "a new minute");
        assert_eq!(throttle.admit_at(at(61)), Some(0));
        // Held back, and no line like it comes again: told once the minute is over, or at exit.
        for _ in 0..Throttle::BURST + 3 {
            throttle.admit_at(at(130));
        }
        assert_eq!(throttle.untold(Some(at(189))), None, "within its minute");
        assert_eq!(throttle.untold(Some(at(190))), Some(3));
        assert_eq!(throttle.untold(Some(at(191))), None, "told once");
        for _ in 0..Throttle::BURST + 2 {
            throttle.admit_at(at(200));
        }
        assert_eq!(throttle.untold(None), Some(2), "at exit, whenever");
    }

    /// Each kind is throttled on its own; past `most` kinds, a new one is not throttled at all;
    /// what was held back is told, by kind.
    #[test]
    fn kinds_are_throttled_each_on_its_own_and_bounded() {
        let kinds = Kinds::new(1, Duration::from_secs(30), 2);
        assert_eq!(kinds.admit("a"), Some(0));
        assert_eq!(kinds.admit("a"), None);
        assert_eq!(kinds.admit("a"), None);
        assert_eq!(kinds.admit("b"), Some(0));
        assert_eq!(kinds.admit("c"), Some(0));
        assert_eq!(kinds.admit("c"), Some(0), "past the bound: not throttled");
        assert_eq!(kinds.untold(None), vec![("a".to_owned(), 2)]);
        assert_eq!(kinds.untold(None), vec![], "told once");
    }

    /// A kind quiet for a window, nothing held back, makes room: however many kinds come over
    /// the process's life (a reason naming a new address after each broker restart), new ones
    /// are throttled. One with lines held back keeps its place until they are told.
    #[test]
    fn quiet_kinds_make_room_for_new_ones() {
        let kinds = Kinds::new(1, Duration::from_secs(30), 2);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(kinds.admit_at("a", at(0)), Some(0));
        assert_eq!(kinds.admit_at("b", at(0)), Some(0));
        assert_eq!(kinds.admit_at("b", at(1)), None, "b holds one back");
        assert_eq!(kinds.admit_at("c", at(10)), Some(0));
        assert_eq!(kinds.admit_at("c", at(10)), Some(0), "none quiet yet");
        assert_eq!(kinds.admit_at("c", at(30)), Some(0), "a makes room");
        assert_eq!(kinds.admit_at("c", at(31)), None, "c is throttled");
        assert_eq!(kinds.untold(Some(at(31))), vec![("b".to_owned(), 1)]);
    }

    /// A bug panicking on every message is held back after its first lines; a panic elsewhere
    /// (the one that stops the service) is still written.
    #[test]
    fn panics_are_throttled_per_place() {
        let (flood, other) = ("src/a.rs:1:1", "src/b.rs:2:2");
        for _ in 0..Throttle::BURST {
            assert_eq!(PANICS.admit(flood), Some(0));
        }
        assert_eq!(PANICS.admit(flood), None);
        assert_eq!(PANICS.admit(other), Some(0));
    }

    #[test]
    fn a_panic_is_one_json_log_line_with_its_message_and_location() {
        // The hook runs on the panicking thread, whose own subscriber is the test's.
        let lines = std::thread::Builder::new()
            .name("processing-7".into())
            .spawn(|| {
                captured(|| {
                    let hook = std::panic::take_hook();
                    std::panic::set_hook(Box::new(log_panic));
                    let panicked = std::panic::catch_unwind(|| panic!("index {} of {}", 3, 2));
                    std::panic::set_hook(hook);
                    assert!(panicked.is_err());
                })
                .1
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let panic = &lines[0];
        assert_eq!(panic["level"], "ERROR");
        assert_eq!(panic["target"], "panic");
        assert_eq!(panic["message"], "panicked: index 3 of 2");
        assert_eq!(panic["thread"], "processing-7");
        assert!(
            panic["location"]
                .as_str()
                .unwrap()
                .starts_with("src/logs.rs:"),
            "{panic}"
        );
    }
}
