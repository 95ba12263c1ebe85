//! A consumed record, copied out of librdkafka once: what the pipeline and the dead-letter path
//! need of it. The value is `Bytes`, so that a blob made from it shares its buffer instead of
//! copying the body again (`recording::blob`), and nothing else is copied per message (rdkafka's
//! `OwnedMessage` also copies the topic's name and the headers into allocations of their own).

use std::ffi::CStr;

use bytes::Bytes;
use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedMessage, Message};

/// The header `redrive` puts on each message it re-produces, naming the letter
/// (`topic/partition/offset`), as [`header`] looks it up.
pub const REDRIVEN_FROM_HEADER: &CStr = c"redriven_from";

/// [`REDRIVEN_FROM_HEADER`], as a header is written.
pub const REDRIVEN_FROM: &str = match REDRIVEN_FROM_HEADER.to_str() {
    Ok(name) => name,
    Err(_) => panic!("a header name this crate writes is UTF-8"),
};

/// The longest `redriven_from` kept: a topic's name (249 bytes at most) and two numbers. One
/// longer, or not UTF-8, is not redrive's (a producer writing straight to the topic): carried
/// on to a dead letter, a header of megabytes made the letter too large for its topic, a fatal
/// refusal at every start.
const REDRIVEN_FROM_MAX_BYTES: usize = 300;

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
    /// The leader epoch it was written in (unknown from a broker that does not say), committed
    /// with the offset after it: the next owner checks the log was not cut back below it
    /// ([`super::position`]).
    pub leader_epoch: Option<i32>,
}

impl Record {
    /// The bytes it holds: its value, its key (any size a producer gives it: a record of an
    /// empty value and a 10 MB key is 10 MB to hold) and the letter it was re-driven from.
    pub fn bytes(&self) -> usize {
        held_bytes(
            &self.value,
            self.key.as_deref(),
            self.redriven_from.as_deref(),
        )
    }

    pub fn copy_of(message: &BorrowedMessage<'_>) -> Self {
        Record {
            partition: message.partition(),
            offset: message.offset(),
            value: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
            key: message.key().map(<[u8]>::to_vec),
            timestamp: message.timestamp().to_millis(),
            redriven_from: redriven_from(header(message, REDRIVEN_FROM_HEADER)),
            leader_epoch: leader_epoch(message),
        }
    }
}

/// The leader epoch `message` was written in, if the broker said.
fn leader_epoch(message: &BorrowedMessage<'_>) -> Option<i32> {
    // SAFETY: the message is librdkafka's, alive while borrowed; the call reads a field of it.
    let epoch = unsafe { rd::rd_kafka_message_leader_epoch(message.ptr()) };
    (epoch >= 0).then_some(epoch)
}

/// The value of `message`'s first header named `name` (`None` for a header without a value).
/// Looked up by librdkafka, by name: rust-rdkafka's `Headers::iter` and `get` panic on a name
/// that is not UTF-8, which any producer may write (a header's name is bytes on the wire, kept
/// as such by the brokers) — the polling thread died on the message, and every member that took
/// its partition after it.
pub fn header<'m>(message: &'m BorrowedMessage<'_>, name: &CStr) -> Option<&'m [u8]> {
    let mut headers = std::ptr::null_mut();
    let (mut value, mut size) = (std::ptr::null(), 0);
    // SAFETY: the message is librdkafka's and lives for 'm; its headers, and the value librdkafka
    // points to in them, are the message's own and live as long (the message is borrowed, so
    // nothing detaches them meanwhile). `name` is a C string.
    unsafe {
        if rd::rd_kafka_message_headers(message.ptr(), &mut headers)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            || rd::rd_kafka_header_get(headers, 0, name.as_ptr(), &mut value, &mut size)
                != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            || value.is_null()
        {
            return None;
        }
        Some(std::slice::from_raw_parts(value.cast::<u8>(), size))
    }
}

/// What a record's parts hold, wherever they are kept (a record, a dead letter made of it).
pub fn held_bytes(value: &[u8], key: Option<&[u8]>, redriven_from: Option<&str>) -> usize {
    value.len() + key.map_or(0, <[u8]>::len) + redriven_from.map_or(0, str::len)
}

/// The letter a record's `redriven_from` header names, if it is one redrive wrote: at most
/// [`REDRIVEN_FROM_MAX_BYTES`] of UTF-8.
fn redriven_from(header: Option<&[u8]>) -> Option<Box<str>> {
    header
        .filter(|value| value.len() <= REDRIVEN_FROM_MAX_BYTES)
        .and_then(|value| std::str::from_utf8(value).ok())
        .map(Box::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_redriven_from_redrive_could_have_written_is_kept() {
        assert_eq!(
            redriven_from(Some(b"dlq/3/1234")).as_deref(),
            Some("dlq/3/1234")
        );
        assert_eq!(redriven_from(None), None);
        assert_eq!(redriven_from(Some(&[b'x'; 2 << 20])), None, "2 MiB");
        assert_eq!(redriven_from(Some(b"\xff\xfe")), None, "not UTF-8");
    }
}
