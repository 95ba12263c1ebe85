//! A consumed record, copied out of librdkafka once: what the pipeline and the dead-letter path
//! need of it. The value is `Bytes`, so that a blob made from it shares its buffer instead of
//! copying the body again (`recording::blob`), and nothing else is copied per message (rdkafka's
//! `OwnedMessage` also copies the topic's name and the headers into allocations of their own).

use bytes::Bytes;
use rdkafka::message::{BorrowedMessage, Headers, Message};

/// The header `redrive` puts on each message it re-produces, naming the letter
/// (`topic/partition/offset`).
pub const REDRIVEN_FROM: &str = "redriven_from";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// Empty for a record without a value.
    pub value: Bytes,
    pub key: Option<Vec<u8>>,
    /// The record's timestamp (creation or log-append time), in ms since the epoch.
    pub timestamp: Option<i64>,
    /// Its `redriven_from` header: the dead letter `redrive` put it back from. A message that
    /// fails again carries it on to its new dead letter.
    pub redriven_from: Option<Box<str>>,
}

impl Record {
    /// The bytes it holds: its value and its key (any size a producer gives it: a record of an
    /// empty value and a 10 MB key is 10 MB to hold).
    pub fn bytes(&self) -> usize {
        self.value.len() + self.key.as_ref().map_or(0, Vec::len)
    }

    pub fn copy_of(message: &BorrowedMessage<'_>) -> Self {
        Record {
            partition: message.partition(),
            offset: message.offset(),
            value: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
            key: message.key().map(<[u8]>::to_vec),
            timestamp: message.timestamp().to_millis(),
            redriven_from: message
                .headers()
                .and_then(|headers| headers.iter().find(|h| h.key == REDRIVEN_FROM))
                .and_then(|h| h.value)
                .map(|value| String::from_utf8_lossy(value).into()),
        }
    }
}
