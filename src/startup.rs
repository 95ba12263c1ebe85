//! Checks made before joining the group: every destination exists and takes writes, so that a
//! wrong bucket, table or topic stops the service at once with a message naming it, instead of
//! failing the first flush after messages were consumed.
//!
//! A destination that is down is not a configuration error: its check is retried (capped
//! backoff, shown in `/status` as an outage, liveness kept) until it answers, so a sink restarting
//! at the same time as the service does not become a restart loop.

use std::future::Future;
use std::time::Duration;

use tracing::{info, warn};

use crate::health::Status;
use crate::sink::{Retry, SinkError};

/// The longest wait between two tries; well under the liveness window.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Runs `check` until it passes. A transient failure is retried; any other is returned.
pub async fn until_ready<F, Fut>(what: &'static str, status: &Status, mut check: F) -> Result<(), SinkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), SinkError>>,
{
    let mut backoff = Duration::from_millis(500);
    loop {
        status.beat();
        match check().await {
            Ok(()) => {
                if let Some(waited) = status.sink_recovered(what) {
                    info!(check = what, waited_ms = waited.as_millis() as u64, "startup check passed after waiting");
                }
                return Ok(());
            }
            Err(error) if error.retry == Retry::Retryable => {
                status.sink_failed(what, &error.message);
                warn!(check = what, %error, retry_in_ms = backoff.as_millis() as u64, "startup check: not reachable yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_waited_out_and_shown_as_an_outage_meanwhile() {
        let status = Status::default();
        let tries = AtomicU32::new(0);
        let check = || async {
            let tried = tries.fetch_add(1, Ordering::SeqCst);
            if tried >= 2 {
                let outage = &status.report()["outages"]["gcs"];
                assert_eq!(outage["failed_attempts"], tried, "{outage}");
                assert_eq!(outage["last_error"], "connection refused");
            }
            if tried < 5 { Err(SinkError::new("gcs", Retry::Retryable, "connection refused")) } else { Ok(()) }
        };
        until_ready("gcs", &status, check).await.unwrap();
        assert_eq!(tries.load(Ordering::SeqCst), 6);
        assert_eq!(status.report()["outages"], serde_json::json!({}), "the outage cleared when the check passed");
        assert!(status.live(), "the wait keeps liveness");
    }

    #[tokio::test(start_paused = true)]
    async fn a_configuration_error_is_returned_at_once() {
        let status = Status::default();
        let tries = AtomicU32::new(0);
        let check = || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(SinkError::new("gcs", Retry::Fatal, "bucket not found"))
        };
        let error = until_ready("gcs", &status, check).await.unwrap_err();
        assert_eq!((error.retry, tries.load(Ordering::SeqCst)), (Retry::Fatal, 1));
    }
}
