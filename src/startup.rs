//! Checks of every destination at start — it exists and takes writes — so that a wrong bucket,
//! table or topic stops the service at once with a message naming it, instead of failing the
//! first flush after messages were consumed.
//!
//! A destination that does not answer is not a configuration error, and must not keep the
//! service out of its group: scaling out during an outage is when new members are needed most.
//! So each check is tried once before joining; a configuration error stops the service there.
//! A destination that does not answer yet is checked again in the background (capped backoff,
//! shown in `/status` as an outage) while the service joins and consumes, and the sinks that
//! write there wait behind a [`Gate`]: their writes fail as retryable (the flush retries, as in
//! any outage; nothing is committed) until the check passes — after the table's migration, for
//! ClickHouse. A configuration error found by a later check stops the service ([`Gates`]): it
//! drains, and a flush that writes there fails with the error, nothing of it committed. (Waiting
//! for the next write there instead kept a service whose dead-letter topic was missing running
//! until the next rejected message, hours later perhaps.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{error, info, warn};

use crate::health::Status;
use crate::sink::progress::Progress;
use crate::sink::{Built, Check, Checked, Entry, Retry, Sink, SinkError, Writing};

/// The first wait between two tries, and the longest (well under the liveness window).
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long the try before joining the group may take: a destination that accepts connections
/// and never answers (hung, overloaded, a black-holed address) must not keep the service out of
/// its group past the liveness window — the pod would be restarted into the same wait, again
/// and again. Past it the destination counts as not answering yet.
const FIRST_TRY_DEADLINE: Duration = Duration::from_secs(10);

/// How long a try in the background may take (a table's migration included), so that a hung
/// try is given up and tried again.
const TRY_DEADLINE: Duration = Duration::from_secs(60);

/// One try of `what`'s check, a try past `deadline` failing as retryable.
async fn try_check(
    what: &'static str,
    check: &mut Check,
    deadline: Duration,
) -> Result<(), SinkError> {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;
    // A check that panics (a bug) is a configuration error, which stops the service: in the
    // background its task ended without a word, and the destination's writes waited for a gate
    // that would never open, the pod live and ready.
    let panicked = |panic: Box<dyn std::any::Any + Send>| {
        SinkError::new(
            what,
            Retry::Fatal,
            format_args!(
                "the check panicked (a bug): {}",
                crate::recording::panic_message(&*panic)
            ),
        )
    };
    let tried = match std::panic::catch_unwind(AssertUnwindSafe(&mut *check)) {
        Ok(tried) => AssertUnwindSafe(tried).catch_unwind(),
        Err(panic) => return Err(panicked(panic)),
    };
    match tokio::time::timeout(deadline, tried).await {
        Ok(Ok(checked)) => checked,
        Ok(Err(panic)) => Err(panicked(panic)),
        Err(_) => Err(SinkError::new(
            what,
            Retry::Retryable,
            format_args!("no answer within {deadline:?}"),
        )),
    }
}

/// Whether a destination's startup check has passed.
pub struct Gate {
    state: Mutex<State>,
    /// Told of every change of `state`.
    changed: tokio::sync::Notify,
}

enum State {
    /// Not yet: the last try's error.
    Waiting(String),
    Passed,
    Failed(SinkError),
}

impl Gate {
    fn new(state: State) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new(state),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn set(&self, state: State) {
        *self.state() = state;
        self.changed.notify_waiters();
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The configuration error a check in the background found, when it finds one; never if the
    /// check passes. For a destination no sink writes to (the consumed topic), whose error would
    /// otherwise stop nothing.
    pub async fn failure(&self) -> SinkError {
        loop {
            // Registered before the state is read: a change in between still wakes it.
            let changed = self.changed.notified();
            let passed = match &*self.state() {
                State::Failed(error) => return error.clone(),
                State::Passed => true,
                State::Waiting(_) => false,
            };
            if passed {
                std::future::pending::<()>().await;
            }
            changed.await;
        }
    }

    /// `Ok` once the check passed; an error for `sink` to fail its write with otherwise.
    fn open(&self, sink: &'static str) -> Result<(), SinkError> {
        match &*self.state() {
            State::Passed => Ok(()),
            State::Waiting(error) => Err(SinkError::new(
                sink,
                Retry::Retryable,
                format!("startup check not passed yet: {error}"),
            )),
            State::Failed(error) => Err(error.clone()),
        }
    }
}

/// `step`, beating `status` every second while it runs: a startup step bounded by its own
/// deadline may take longer than the liveness window (building the GCS client asks the metadata
/// server, within `--sink-timeout-ms`), and the kubelet would restart the pod before the step's
/// own clear error.
pub async fn beating<T>(status: &Status, step: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(step);
    let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            out = &mut step => return out,
            _ = every.tick() => status.beat(),
        }
    }
}

/// Checks `what` once; a configuration error is returned. A destination that does not answer
/// is checked again in the background until it passes: the returned gate opens then.
pub async fn check(
    what: &'static str,
    status: &Arc<Status>,
    mut check: Check,
) -> Result<Arc<Gate>, SinkError> {
    status.beat();
    match try_check(what, &mut check, FIRST_TRY_DEADLINE).await {
        Ok(()) => Ok(Gate::new(State::Passed)),
        Err(error) if error.retry == Retry::Retryable => {
            status.sink_failed(what, &error.message);
            status.record_startup_check(what, false);
            warn!(check = what, %error, "startup check: not reachable yet; joining the group anyway (not ready), writes there wait for it");
            let gate = Gate::new(State::Waiting(error.message));
            tokio::spawn(keep_checking(what, status.clone(), check, gate.clone()));
            Ok(gate)
        }
        Err(error) => Err(error),
    }
}

async fn keep_checking(what: &'static str, status: Arc<Status>, mut check: Check, gate: Arc<Gate>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        tokio::time::sleep(backoff).await;
        match try_check(what, &mut check, TRY_DEADLINE).await {
            Ok(()) => {
                let waited = status.sink_recovered(what).unwrap_or_default();
                status.record_startup_check(what, true);
                info!(
                    check = what,
                    waited_ms = waited.as_millis() as u64,
                    "startup check passed after waiting"
                );
                gate.set(State::Passed);
                return;
            }
            Err(error) if error.retry == Retry::Retryable => {
                status.sink_failed(what, &error.message);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                warn!(check = what, %error, retry_in_ms = backoff.as_millis() as u64, "startup check: not reachable yet");
                gate.set(State::Waiting(error.message));
            }
            Err(error) => {
                status.sink_failed(what, &error.message);
                error!(check = what, %error, "startup check failed: the service stops");
                gate.set(State::Failed(error));
                return;
            }
        }
    }
}

/// A startup check that found a configuration error.
#[derive(Debug, thiserror::Error)]
#[error("checking {describes}")]
pub struct CheckFailed {
    pub describes: &'static str,
    #[source]
    pub error: SinkError,
}

/// The gates of every destination checked at start, each with what it checks.
#[derive(Default)]
pub struct Gates(Vec<(&'static str, Arc<Gate>)>);

impl Gates {
    pub fn push(&mut self, describes: &'static str, gate: Arc<Gate>) {
        self.0.push((describes, gate));
    }

    /// The first configuration error a check in the background finds; never, if none does.
    pub async fn failure(&self) -> CheckFailed {
        if self.0.is_empty() {
            // `select_all` of nothing panics.
            return std::future::pending().await;
        }
        let waits = self.0.iter().map(|(describes, gate)| {
            Box::pin(async move {
                CheckFailed {
                    describes,
                    error: gate.failure().await,
                }
            })
        });
        let (failed, ..) = futures::future::select_all(waits).await;
        failed
    }
}

/// `built`'s sink, its writes waiting for its destination's check (tried once here), whose gate
/// joins `gates`.
pub async fn gated(
    built: Built,
    status: &Arc<Status>,
    gates: &mut Gates,
) -> Result<Box<dyn Sink>, CheckFailed> {
    let Some(Checked {
        what,
        describes,
        check: run,
    }) = built.check
    else {
        return Ok(built.sink);
    };
    let gate = check(what, status, run)
        .await
        .map_err(|error| CheckFailed { describes, error })?;
    gates.push(describes, gate.clone());
    Ok(Box::new(Gated {
        gate,
        sink: built.sink,
    }))
}

/// A sink whose writes wait for its destination's startup check.
struct Gated {
    gate: Arc<Gate>,
    sink: Box<dyn Sink>,
}

impl Sink for Gated {
    fn name(&self) -> &'static str {
        self.sink.name()
    }

    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        match self.gate.open(self.sink.name()) {
            Ok(()) => self.sink.write(batch, progress),
            Err(closed) => Box::pin(std::future::ready(Err(closed))),
        }
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        self.sink.writes_for(entry)
    }

    fn topics(&self) -> Vec<String> {
        self.sink.topics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A long startup step beats the loop's heartbeat while it runs (a fresh status has none).
    #[tokio::test(start_paused = true)]
    async fn a_long_startup_step_keeps_the_heartbeat() {
        let status = Status::default();
        assert!(!status.live(), "no heartbeat yet");
        let out = beating(&status, async {
            tokio::time::sleep(Duration::from_secs(45)).await;
            7
        })
        .await;
        assert_eq!(out, 7);
        assert!(status.live(), "beaten while the step ran");
    }

    /// A check failing `failures` times (as `retry`), then passing; and how often it ran.
    fn flaky(failures: u32, retry: Retry) -> (Arc<AtomicU32>, Check) {
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        let check: Check = Box::new(move || {
            let tried = counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(if tried < failures {
                Err(SinkError::new("gcs", retry, "connection refused"))
            } else {
                Ok(())
            }))
        });
        (tries, check)
    }

    /// A check that panics in the background (a bug) stops the service as a configuration
    /// error does: the gate stayed closed for good, the pod live and ready, its writes waiting.
    #[tokio::test(start_paused = true)]
    async fn a_check_that_panics_in_the_background_fails_its_gate() {
        let status = Arc::new(Status::default());
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        let check: Check = Box::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                return Box::pin(std::future::ready(Err(SinkError::new(
                    "gcs",
                    Retry::Retryable,
                    "connection refused",
                ))));
            }
            Box::pin(async { panic!("a bug in the check") })
        });
        let gate = super::check("gcs", &status, check).await.unwrap();
        let mut gates = Gates::default();
        gates.push("the blob store", gate);
        let failed = tokio::time::timeout(Duration::from_secs(60), gates.failure())
            .await
            .expect("the gate failed");
        assert_eq!(failed.error.retry, Retry::Fatal);
        assert!(
            failed
                .error
                .message
                .contains("the check panicked (a bug): a bug in the check"),
            "{}",
            failed.error
        );
        assert_eq!(tries.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_destination_that_answers_opens_its_gate_at_once() {
        let status = Arc::new(Status::default());
        let (tries, check) = flaky(0, Retry::Retryable);
        let gate = super::check("gcs", &status, check).await.unwrap();
        assert!(gate.open("gcs").is_ok());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_configuration_error_is_returned_at_once() {
        let status = Arc::new(Status::default());
        let (tries, check) = flaky(u32::MAX, Retry::Fatal);
        let error = super::check("gcs", &status, check).await.err().unwrap();
        assert_eq!(
            (error.retry, tries.load(Ordering::SeqCst)),
            (Retry::Fatal, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_destination_that_does_not_answer_is_waited_for_in_the_background_and_shown_as_an_outage()
     {
        let status = Arc::new(Status::default());
        let (tries, check) = flaky(5, Retry::Retryable);
        let gate = super::check("gcs", &status, check).await.unwrap();
        let closed = gate.open("gcs").unwrap_err();
        assert_eq!(closed.retry, Retry::Retryable, "{closed}");
        assert!(closed.message.contains("connection refused"), "{closed}");
        assert_eq!(status.report()["outages"]["gcs"]["failed_attempts"], 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            status.report()["outages"]["gcs"]["failed_attempts"],
            3,
            "retried meanwhile, with backoff"
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(tries.load(Ordering::SeqCst), 6);
        assert!(gate.open("gcs").is_ok());
        assert_eq!(
            status.report()["outages"],
            serde_json::json!({}),
            "the outage cleared when the check passed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_configuration_error_found_in_the_background_is_told_to_whoever_waits_for_it() {
        let status = Arc::new(Status::default());
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        let check: Check = Box::new(move || {
            let retry = match counted.fetch_add(1, Ordering::SeqCst) {
                0..3 => Retry::Retryable,
                _ => Retry::Fatal,
            };
            Box::pin(std::future::ready(Err(SinkError::new(
                "kafka",
                retry,
                "topic missing",
            ))))
        });
        let gate = super::check("kafka", &status, check).await.unwrap();
        let failed = tokio::time::timeout(Duration::from_secs(60), gate.failure()).await;
        assert_eq!(failed.map(|e| e.retry), Ok(Retry::Fatal));
        assert_eq!(tries.load(Ordering::SeqCst), 4);
        let (_, passing) = flaky(1, Retry::Retryable);
        let passed = super::check("kafka", &status, passing).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(600), passed.failure()).await;
        assert!(waited.is_err(), "a check that passes never fails");
    }

    #[tokio::test(start_paused = true)]
    async fn a_destination_that_never_answers_does_not_hold_the_service_out_of_its_group() {
        let status = Arc::new(Status::default());
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        // Hangs on its first two tries (accepts, never answers), then passes.
        let check: Check = Box::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                Box::pin(std::future::pending())
            } else {
                Box::pin(std::future::ready(Ok(())))
            }
        });
        let started = tokio::time::Instant::now();
        let gate = super::check("clickhouse", &status, check).await.unwrap();
        assert_eq!(
            started.elapsed(),
            FIRST_TRY_DEADLINE,
            "given up at its deadline"
        );
        assert!(
            started.elapsed() < crate::health::LIVENESS_STALE_AFTER,
            "within the liveness window"
        );
        let closed = gate.open("clickhouse").unwrap_err();
        assert_eq!(closed.retry, Retry::Retryable, "{closed}");
        assert!(closed.message.contains("no answer within 10s"), "{closed}");
        // The hung background try is given up too, and the next one passes.
        tokio::time::sleep(FIRST_BACKOFF + TRY_DEADLINE).await;
        assert_eq!(
            tries.load(Ordering::SeqCst),
            2,
            "the second try still hangs"
        );
        assert!(gate.open("clickhouse").is_err());
        tokio::time::sleep(MAX_BACKOFF).await;
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert!(gate.open("clickhouse").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_configuration_error_found_later_stops_the_service_and_fails_the_next_write_with_it()
    {
        let status = Arc::new(Status::default());
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        let check: Check = Box::new(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            let (retry, message) = if first {
                (Retry::Retryable, "connection refused")
            } else {
                (Retry::Fatal, "bucket not found")
            };
            Box::pin(std::future::ready(Err(SinkError::new(
                "gcs", retry, message,
            ))))
        });
        let built = Built::checked(crate::sink::null::NullSink, "gcs", "the GCS bucket", check);
        // Beside it, a destination that answers at once, and one that is found later to answer.
        let mut gates = Gates::default();
        let answering = Built::checked(
            crate::sink::null::NullSink,
            "clickhouse",
            "the ClickHouse table",
            flaky(0, Retry::Retryable).1,
        );
        gated(answering, &status, &mut gates).await.unwrap();
        let gated = gated(built, &status, &mut gates).await.unwrap();
        gates.push(
            "the consumed topic",
            super::check("kafka", &status, flaky(3, Retry::Retryable).1)
                .await
                .unwrap(),
        );
        let failed = tokio::time::timeout(Duration::from_secs(60), gates.failure())
            .await
            .expect("the service is told to stop");
        assert_eq!(failed.describes, "the GCS bucket");
        assert_eq!(failed.error.message, "bucket not found");
        assert_eq!(
            status.report()["outages"]["gcs"]["last_error"],
            "bucket not found",
            "/status says why"
        );
        let progress = Progress::new("gcs", &status);
        let error = gated.write(&[], &progress).await.unwrap_err();
        assert_eq!(
            (error.retry, error.message.as_str()),
            (Retry::Fatal, "bucket not found")
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(tries.load(Ordering::SeqCst), 2, "not checked again");
    }
}
