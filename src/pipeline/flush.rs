//! The flush: writes one batch through every sink, stage by stage, retrying each failed sink with
//! capped, jittered exponential backoff. Runs on a blocking thread.
//!
//! Stages run in order (blobs before anything that points at them); the sinks of one stage run in
//! parallel. A sink that succeeded is not written again when a sibling retries. A retryable
//! failure (an outage) is retried without limit unless `--flush-max-attempts` sets one: the
//! service rides out an outage with intake paused instead of exiting into a restart loop. Every
//! attempt that ends is progress for the liveness watchdog; failures are reported as an outage
//! of that sink (`/status`, `sink.outage_ms`) until it succeeds again.

use std::time::{Duration, Instant};

use rand::RngExt;
use tracing::warn;

use crate::health::Status;
use crate::sink::{Batch, Retry, Sink, SinkError, Written};

/// Sinks grouped into ordered stages.
pub struct Sinks {
    pub stages: Vec<Vec<Box<dyn Sink>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per sink per flush, the first included; 0: unlimited.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// Full-jitter backoff before retry number `retry` (1-based): uniform in
    /// `[0, min(max_backoff, initial_backoff × 2^(retry-1))]`.
    pub fn backoff(&self, retry: u32, unit_random: f64) -> Duration {
        let exp = self.initial_backoff.saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)));
        exp.min(self.max_backoff).mul_f64(unit_random.clamp(0.0, 1.0))
    }
}

/// One sink's part in a successful flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkReport {
    pub sink: &'static str,
    /// Time spent, retries included.
    pub took: Duration,
    pub retries: u32,
    pub written: Written,
}

/// Per-sink reports of a successful flush, in stage order.
#[derive(Debug, Default)]
pub struct FlushReport {
    pub sinks: Vec<SinkReport>,
}

/// Writes `batch` through every stage. `Err` means a sink failed fatally or ran out of attempts:
/// nothing of this batch may be committed.
pub fn flush(batch: &Batch, sinks: &Sinks, policy: &RetryPolicy, status: &Status) -> Result<FlushReport, SinkError> {
    let mut report = FlushReport::default();
    for stage in &sinks.stages {
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = stage
                .iter()
                .map(|sink| scope.spawn(move || write_with_retries(sink.as_ref(), batch, policy, status)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(SinkError::new("flush", Retry::Fatal, "a sink panicked"))))
                .collect()
        });
        for result in results {
            report.sinks.push(result?);
        }
    }
    Ok(report)
}

fn write_with_retries(
    sink: &dyn Sink,
    batch: &Batch,
    policy: &RetryPolicy,
    status: &Status,
) -> Result<SinkReport, SinkError> {
    let start = Instant::now();
    let mut attempt = 1;
    loop {
        let result = sink.write(batch);
        status.flush_progress();
        match result {
            Ok(written) => {
                if let Some(lasted) = status.sink_recovered(sink.name()) {
                    warn!(sink = sink.name(), outage_ms = lasted.as_millis() as u64, "sink recovered");
                    crate::metrics::outage(sink.name(), Duration::ZERO);
                }
                return Ok(SinkReport { sink: sink.name(), took: start.elapsed(), retries: attempt - 1, written });
            }
            Err(error)
                if error.retry == Retry::Retryable && (policy.max_attempts == 0 || attempt < policy.max_attempts) =>
            {
                status.sink_failed(sink.name(), &error.message);
                crate::metrics::outage(sink.name(), start.elapsed());
                let pause = policy.backoff(attempt, rand::rng().random::<f64>());
                warn!(sink = sink.name(), attempt, backoff_ms = pause.as_millis() as u64, %error, "sink write failed; retrying");
                std::thread::sleep(pause);
                attempt = attempt.saturating_add(1);
            }
            Err(error) => {
                status.sink_failed(sink.name(), &error.message);
                crate::metrics::flush_failed(sink.name());
                return Err(error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    const FAST: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
    };

    /// Fails with `retry` for its first `failures` writes, and logs every write.
    struct Flaky {
        name: &'static str,
        failures: u32,
        retry: Retry,
        calls: AtomicU32,
        log: &'static Mutex<Vec<&'static str>>,
    }

    impl Sink for Flaky {
        fn name(&self) -> &'static str {
            self.name
        }
        fn write(&self, _: &Batch) -> Result<Written, SinkError> {
            self.log.lock().unwrap().push(self.name);
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
                Err(SinkError::new(self.name, self.retry, "boom"))
            } else {
                Ok(Written { items: 1, bytes: 2 })
            }
        }
    }

    fn flaky(name: &'static str, failures: u32, retry: Retry, log: &'static Mutex<Vec<&'static str>>) -> Box<dyn Sink> {
        Box::new(Flaky { name, failures, retry, calls: AtomicU32::new(0), log })
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_is_jittered() {
        let p = RetryPolicy {
            max_attempts: 9,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(1, 1.0), Duration::from_millis(100));
        assert_eq!(p.backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(p.backoff(10, 1.0), Duration::from_secs(1));
        assert_eq!(p.backoff(3, 0.5), Duration::from_millis(200));
        assert_eq!(p.backoff(3, 0.0), Duration::ZERO);
    }

    #[test]
    fn only_the_failing_sink_is_retried_and_later_stages_wait_for_earlier_ones() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks {
            stages: vec![
                vec![flaky("blobs", 2, Retry::Retryable, &LOG), flaky("dlq", 0, Retry::Retryable, &LOG)],
                vec![flaky("rows", 0, Retry::Retryable, &LOG)],
            ],
        };
        let report = flush(&Batch::default(), &sinks, &FAST, &Status::default()).unwrap();
        let log = LOG.lock().unwrap().clone();
        assert_eq!(log.iter().filter(|s| **s == "blobs").count(), 3);
        assert_eq!(log.iter().filter(|s| **s == "dlq").count(), 1);
        assert_eq!(log.last(), Some(&"rows"), "rows only after blobs succeeded: {log:?}");
        assert_eq!(
            report.sinks.iter().map(|s| (s.sink, s.retries)).collect::<Vec<_>>(),
            [("blobs", 2), ("dlq", 0), ("rows", 0)]
        );
        assert!(report.sinks.iter().all(|s| s.written == Written { items: 1, bytes: 2 }));
    }

    #[test]
    fn a_fatal_error_is_not_retried_and_stops_the_flush() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks {
            stages: vec![vec![flaky("blobs", 1, Retry::Fatal, &LOG)], vec![flaky("rows", 0, Retry::Retryable, &LOG)]],
        };
        let error = flush(&Batch::default(), &sinks, &FAST, &Status::default()).unwrap_err();
        assert_eq!((error.sink, error.retry), ("blobs", Retry::Fatal));
        assert_eq!(*LOG.lock().unwrap(), ["blobs"]);
    }

    #[test]
    fn retryable_failures_are_retried_without_limit_by_default_and_reported_as_an_outage() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks { stages: vec![vec![flaky("blobs", 50, Retry::Retryable, &LOG)]] };
        let unlimited = RetryPolicy { max_attempts: 0, ..FAST };
        let status = Status::default();
        let report = flush(&Batch::default(), &sinks, &unlimited, &status).unwrap();
        assert_eq!(report.sinks[0].retries, 50);
        assert!(status.sink_recovered("blobs").is_none(), "the outage ended with the success");
    }

    #[test]
    fn retries_stop_after_the_configured_attempts() {
        static LOG: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        let sinks = Sinks { stages: vec![vec![flaky("blobs", 100, Retry::Retryable, &LOG)]] };
        assert!(flush(&Batch::default(), &sinks, &FAST, &Status::default()).is_err());
        assert_eq!(LOG.lock().unwrap().len(), 4);
    }
}
