//! The bounded in-memory buffer between processing and the flush.
//!
//! It closes (becomes a batch) when it holds `max_messages`, or `max_bytes` of processed data, or
//! its first message is `max_age` old — whichever comes first. Time is an argument: the buffer
//! never reads a clock, so tests drive every state directly.

use std::time::{Duration, Instant};

use crate::sink::{Batch, Entry};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub max_age: Duration,
}

/// Why a buffer was closed into a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    Messages,
    Bytes,
    Age,
    /// Shutdown or rebalance: everything buffered is flushed now.
    Drain,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Messages => "messages",
            CloseReason::Bytes => "bytes",
            CloseReason::Age => "age",
            CloseReason::Drain => "drain",
        }
    }
}

#[derive(Debug)]
pub struct Buffer {
    limits: BufferLimits,
    entries: Vec<Entry>,
    /// What each entry holds, in the same order.
    sizes: Vec<usize>,
    /// The processing thread that made each entry (whose heap its memory is in), in the same
    /// order.
    threads: Vec<usize>,
    bytes: usize,
    /// When the first entry of the open buffer arrived.
    opened: Option<Instant>,
}

impl Buffer {
    pub fn new(limits: BufferLimits) -> Self {
        Buffer {
            limits,
            entries: Vec::new(),
            sizes: Vec::new(),
            threads: Vec::new(),
            bytes: 0,
            opened: None,
        }
    }

    /// `entry`, holding `bytes`, made by processing thread `thread`, arrived `now`.
    pub fn push(&mut self, entry: Entry, bytes: usize, thread: usize, now: Instant) {
        self.opened.get_or_insert(now);
        self.entries.push(entry);
        self.sizes.push(bytes);
        self.threads.push(thread);
        self.bytes += bytes;
    }

    /// Keeps only the entries of partitions `keep` accepts (the others were revoked).
    pub fn retain(&mut self, keep: impl Fn(i32) -> bool) {
        let entries = std::mem::take(&mut self.entries);
        let sizes = std::mem::take(&mut self.sizes);
        let threads = std::mem::take(&mut self.threads);
        for ((entry, size), thread) in entries.into_iter().zip(sizes).zip(threads) {
            if keep(entry.partition) {
                self.entries.push(entry);
                self.sizes.push(size);
                self.threads.push(thread);
            }
        }
        self.bytes = self.sizes.iter().sum();
        if self.entries.is_empty() {
            self.opened = None;
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// At its message or byte limit: taking more would grow past the bound.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.limits.max_messages || self.bytes >= self.limits.max_bytes
    }

    /// Whether the buffer should be flushed now, and why.
    pub fn close_reason(&self, now: Instant) -> Option<CloseReason> {
        if self.entries.len() >= self.limits.max_messages {
            Some(CloseReason::Messages)
        } else if self.bytes >= self.limits.max_bytes {
            Some(CloseReason::Bytes)
        } else if self.deadline().is_some_and(|deadline| now >= deadline) {
            Some(CloseReason::Age)
        } else {
            None
        }
    }

    /// When age will close the open buffer.
    pub fn deadline(&self) -> Option<Instant> {
        self.opened.map(|opened| opened + self.limits.max_age)
    }

    /// Closes the buffer into a batch and opens an empty one; with the batch, the thread that
    /// made each of its entries.
    pub fn take(&mut self) -> (Batch, Vec<usize>) {
        self.bytes = 0;
        self.opened = None;
        self.sizes.clear();
        let batch = Batch {
            entries: std::mem::take(&mut self.entries),
        };
        (batch, std::mem::take(&mut self.threads))
    }
}

/// Whether consumption may continue: it pauses only when the buffer is full *and* no flush can
/// start to empty it.
pub fn should_pause(
    buffer_full: bool,
    flushes_in_flight: usize,
    max_flushes_in_flight: usize,
) -> bool {
    buffer_full && flushes_in_flight >= max_flushes_in_flight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: i64) -> Entry {
        Entry::invalid_for_test(0, offset)
    }

    const LIMITS: BufferLimits = BufferLimits {
        max_messages: 3,
        max_bytes: 100,
        max_age: Duration::from_secs(5),
    };

    #[test]
    fn an_empty_buffer_never_closes() {
        let buffer = Buffer::new(LIMITS);
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(
            (buffer.close_reason(later), buffer.deadline()),
            (None, None)
        );
        assert!(!buffer.is_full());
    }

    #[test]
    fn closes_at_the_message_limit() {
        let (mut buffer, now) = (Buffer::new(LIMITS), Instant::now());
        buffer.push(entry(1), 1, 0, now);
        buffer.push(entry(2), 1, 0, now);
        assert_eq!(buffer.close_reason(now), None);
        buffer.push(entry(3), 1, 0, now);
        assert_eq!(buffer.close_reason(now), Some(CloseReason::Messages));
        assert!(buffer.is_full());
    }

    #[test]
    fn closes_at_the_byte_limit() {
        let (mut buffer, now) = (Buffer::new(LIMITS), Instant::now());
        buffer.push(entry(1), 99, 0, now);
        assert_eq!(buffer.close_reason(now), None);
        buffer.push(entry(2), 1, 0, now);
        assert_eq!(buffer.close_reason(now), Some(CloseReason::Bytes));
    }

    #[test]
    fn closes_when_its_first_message_is_max_age_old() {
        let (mut buffer, start) = (Buffer::new(LIMITS), Instant::now());
        buffer.push(entry(1), 1, 0, start);
        buffer.push(entry(2), 1, 0, start + Duration::from_secs(4));
        assert_eq!(
            buffer.close_reason(start + Duration::from_millis(4999)),
            None
        );
        assert_eq!(buffer.deadline(), Some(start + Duration::from_secs(5)));
        assert_eq!(
            buffer.close_reason(start + Duration::from_secs(5)),
            Some(CloseReason::Age)
        );
    }

    #[test]
    fn taking_a_batch_reopens_an_empty_buffer_with_a_fresh_age() {
        let (mut buffer, start) = (Buffer::new(LIMITS), Instant::now());
        buffer.push(entry(1), 10, 0, start);
        buffer.push(entry(2), 10, 1, start);
        let (batch, threads) = buffer.take();
        assert_eq!(
            batch.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(threads, [0, 1]);
        assert_eq!(
            (buffer.len(), buffer.bytes(), buffer.deadline()),
            (0, 0, None)
        );
        let later = start + Duration::from_secs(60);
        buffer.push(entry(3), 1, 0, later);
        assert_eq!(buffer.deadline(), Some(later + Duration::from_secs(5)));
    }

    #[test]
    fn retaining_drops_the_entries_of_revoked_partitions_and_their_bytes() {
        let (mut buffer, now) = (Buffer::new(LIMITS), Instant::now());
        buffer.push(
            Entry {
                partition: 1,
                ..entry(1)
            },
            10,
            0,
            now,
        );
        buffer.push(
            Entry {
                partition: 2,
                ..entry(2)
            },
            20,
            1,
            now,
        );
        buffer.retain(|partition| partition != 1);
        assert_eq!(
            (buffer.len(), buffer.bytes(), buffer.deadline().is_some()),
            (1, 20, true)
        );
        assert_eq!(buffer.threads, [1], "and their threads");
        buffer.retain(|_| false);
        assert_eq!(
            (buffer.len(), buffer.bytes(), buffer.deadline()),
            (0, 0, None)
        );
        assert_eq!(buffer.take().0.entries.len(), 0);
    }

    #[test]
    fn consumption_pauses_only_when_full_and_no_flush_slot_is_free() {
        assert!(!should_pause(false, 1, 1), "room left");
        assert!(!should_pause(true, 0, 1), "a flush can start");
        assert!(should_pause(true, 1, 1));
        assert!(!should_pause(true, 1, 2), "a second flush may run");
        assert!(should_pause(true, 2, 2));
    }
}
