//! Flush sinks: where a buffered batch goes. Every sink looks the same — a blocking `write` of
//! the whole batch, called on the flush's blocking thread, and an error that says whether a retry
//! can help.
//!
//! - [`filesystem`]: blobs as files under a directory (local runs and tests);
//! - [`null`]: accepts everything (benchmarks the pipeline alone);
//! - [`dlq`]: invalid messages, with their original bytes, to the dead-letter topic.

pub mod clickhouse;
pub mod dlq;
pub mod events;
pub mod filesystem;
pub mod gcs;
pub mod null;

use std::fmt;

pub use crate::metrics::Written;
use crate::recording::{InvalidRecording, Processed};

/// One consumed message as the flush sees it.
#[derive(Debug)]
pub struct Entry {
    pub partition: i32,
    pub offset: i64,
    pub outcome: Outcome,
}

#[derive(Debug)]
pub enum Outcome {
    Valid(Box<Processed>),
    Invalid(Box<InvalidMessage>),
}

/// A message the recording core rejected, kept whole for the dead-letter topic.
#[derive(Debug)]
pub struct InvalidMessage {
    pub error: InvalidRecording,
    /// The original message value, byte for byte.
    pub value: Vec<u8>,
    pub key: Option<Vec<u8>>,
    pub topic: String,
    /// Kafka message timestamp, ms.
    pub timestamp: Option<i64>,
}

/// What one flush writes.
#[derive(Debug, Default)]
pub struct Batch {
    pub entries: Vec<Entry>,
}

impl Batch {
    pub fn valid(&self) -> impl Iterator<Item = &Processed> {
        self.entries.iter().filter_map(|e| match &e.outcome {
            Outcome::Valid(p) => Some(p.as_ref()),
            Outcome::Invalid(_) => None,
        })
    }

    pub fn invalid(&self) -> impl Iterator<Item = (&Entry, &InvalidMessage)> {
        self.entries.iter().filter_map(|e| match &e.outcome {
            Outcome::Invalid(m) => Some((e, m.as_ref())),
            Outcome::Valid(_) => None,
        })
    }
}

/// Whether retrying the same write can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Transient: network, timeouts, overload, 5xx.
    Retryable,
    /// Deterministic: retrying the same data fails the same way.
    Fatal,
}

/// A failed sink write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{sink}: {message}")]
pub struct SinkError {
    pub sink: &'static str,
    pub retry: Retry,
    pub message: String,
}

impl SinkError {
    pub fn new(sink: &'static str, retry: Retry, message: impl fmt::Display) -> Self {
        SinkError { sink, retry, message: message.to_string() }
    }
}

/// A flush destination.
pub trait Sink: Send + Sync {
    /// Short fixed name, used as a metric tag and in logs.
    fn name(&self) -> &'static str;

    /// Writes what this sink stores from `batch`, durably, before returning, and says how much.
    /// Idempotent: a retry or a redelivered batch writes the same keys.
    fn write(&self, batch: &Batch) -> Result<Written, SinkError>;
}
