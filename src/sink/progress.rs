//! What one write of a batch through one sink has achieved so far, kept across its retries.
//!
//! A sink that stores a batch piece by piece (an object per segment, a record per event or dead
//! letter) marks each piece stored as its request completes; a retry of the same write skips
//! what is marked, so a latency tail that fails one request in twenty costs one upload in twenty
//! again, not the whole batch. Each request that ends — stored, failed or timed out — is also
//! progress for the liveness watchdog, and a failed one opens the sink's outage in `/status` at
//! once, without waiting for the rest of the attempt.
//!
//! Pieces are named by the message they belong to (partition, offset) and a number within it, so
//! the halves of a batch the flush splits to find a rejected message share what is stored.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Entry, ObjectStore, Retry, SinkError};
use crate::health::Status;

/// One stored thing within a message's output: its blob, its n-th event, its dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    pub partition: i32,
    pub offset: i64,
    pub index: u32,
}

impl Piece {
    pub fn of(entry: &Entry, index: u32) -> Self {
        Piece {
            partition: entry.partition,
            offset: entry.offset,
            index,
        }
    }
}

pub struct Progress<'a> {
    sink: &'static str,
    status: &'a Status,
    stored: Mutex<HashSet<Piece>>,
    /// Requests of this attempt that failed since the last one that succeeded.
    failed_in_a_row: AtomicUsize,
}

impl<'a> Progress<'a> {
    pub fn new(sink: &'static str, status: &'a Status) -> Self {
        Progress {
            sink,
            status,
            stored: Mutex::new(HashSet::new()),
            failed_in_a_row: AtomicUsize::new(0),
        }
    }

    /// A new attempt starts: failures of the last one no longer count towards
    /// [`looks_down`](Self::looks_down) (what they stored still does).
    pub fn new_attempt(&self) {
        self.failed_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Whether an earlier attempt stored `piece`.
    pub fn is_stored(&self, piece: Piece) -> bool {
        self.lock().contains(&piece)
    }

    /// A request stored `piece`.
    pub fn stored(&self, piece: Piece) {
        self.lock().insert(piece);
        self.failed_in_a_row.store(0, Ordering::Relaxed);
        self.status.flush_progress();
    }

    /// A step of the write that stores nothing yet ended (a refused message read again from
    /// the topic, to be dead-lettered): the flush is making requests, as liveness counts them.
    /// Thousands read again one by one outlasted the flush stall, and the pod was restarted into
    /// the same batch.
    pub fn stepped(&self) {
        self.status.flush_progress();
    }

    /// A request ended without storing its piece. A retryable failure puts the sink in an outage
    /// from now on (a success of the whole write ends it).
    pub fn failed(&self, error: &SinkError) {
        self.failed_in_a_row.fetch_add(1, Ordering::Relaxed);
        self.status.flush_progress();
        if error.retry == Retry::Retryable {
            self.status.sink_request_failed(self.sink, &error.message);
        }
    }

    /// Stores `bytes` at `key` in `store`, as `piece`, unless an earlier attempt did.
    pub async fn put_once(
        &self,
        store: &dyn ObjectStore,
        key: &str,
        bytes: &[u8],
        piece: Piece,
    ) -> Result<(), SinkError> {
        if !self.is_stored(piece) {
            store
                .put(key, bytes)
                .await
                .inspect_err(|e| self.failed(e))?;
            self.stored(piece);
        }
        Ok(())
    }

    /// `requests` requests in a row failed and none succeeded since: the destination is down
    /// rather than slow, and an attempt may stop sending and back off.
    pub fn looks_down(&self, requests: usize) -> bool {
        self.failed_in_a_row.load(Ordering::Relaxed) >= requests.max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Piece>> {
        // A set of plain keys: a panic elsewhere cannot leave it inconsistent.
        self.stored
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Of the failed requests of one attempt, the error that says most — a refused piece or a
/// configuration error before a timeout — is the attempt's: kept in `kept`.
pub fn keep_telling(kept: &mut Option<SinkError>, error: SinkError) {
    if kept.as_ref().is_none_or(|k| k.retry == Retry::Retryable) {
        *kept = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_pieces_are_remembered_and_failures_open_an_outage_at_once() {
        let status = Status::default();
        let progress = Progress::new("gcs", &status);
        let piece = Piece {
            partition: 1,
            offset: 7,
            index: 0,
        };
        assert!(!progress.is_stored(piece));
        progress.failed(&SinkError::new("gcs", Retry::Retryable, "timed out"));
        progress.failed(&SinkError::new("gcs", Retry::Retryable, "timed out"));
        assert!(progress.looks_down(2) && !progress.looks_down(3));
        assert!(
            status.report()["outages"]["gcs"]["since_ms"]
                .as_u64()
                .is_some(),
            "outage from the first failed request"
        );
        progress.stored(piece);
        assert!(progress.is_stored(piece) && !progress.is_stored(Piece { index: 1, ..piece }));
        assert!(
            !progress.looks_down(1),
            "a success ends the run of failures"
        );
    }

    #[test]
    fn a_step_that_stores_nothing_yet_keeps_a_flush_from_looking_stalled() {
        // At times of the test's choosing: a loaded machine does not move them.
        let status = Status::default();
        status.beat();
        status.set_flush_stall(std::time::Duration::from_secs(10));
        status.record_flushes_in_flight(1);
        let progress = Progress::new("rejected", &status);
        let stalled = crate::health::now_ms() + 11_000;
        assert!(!status.live_at(stalled), "no step past the stall");
        let stepped = crate::health::now_ms();
        progress.stepped();
        assert!(status.live_at(stepped));
    }
}
