//! The processing window: messages being processed on the pool, or processed and waiting for
//! an earlier one to finish (arrival order is kept), bounded by count and by what their results
//! may hold. Consecutive small messages enter together, as one task on the pool with one result
//! ([`Window::push`]); each is admitted as if it came alone ([`Window::room_for`]), so the bounds
//! are the same as one message at a time.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::sync::oneshot;

/// Messages being processed or waiting for an earlier one to finish (arrival order is kept).
/// A wide window keeps every core busy behind one large segment at the head. (Each message
/// reserves at least 2 MiB, so small messages meet the byte bound first, at 32.)
pub const PROCESSING_WINDOW_MESSAGES: usize = 64;

/// Bytes the window may hold. Each message reserves what its processed form may hold at most
/// ([`reservation`]) until it leaves the window, so outputs waiting behind a slow head are
/// bounded too, not only the inputs.
pub const PROCESSING_WINDOW_BYTES: usize = 64 * 1024 * 1024;

/// What a message of `value_len` bytes reserves in the processing window: its value, plus what
/// processing it may hold — a blob and replay event no larger than about the value, and the
/// extractor's capped clicks, taps, lists and counts (about 1.1 MiB at most, whatever the input).
pub fn reservation(value_len: usize) -> usize {
    value_len.saturating_mul(3).saturating_add(2 * 1024 * 1024)
}

/// The window, holding results of type `T` on their way (one per group of messages).
pub struct Window<T> {
    pending: FuturesOrdered<Reserved<T>>,
    /// Messages in `pending`.
    messages: usize,
    /// Sum of their reservations.
    bytes: usize,
}

impl<T> Default for Window<T> {
    fn default() -> Self {
        Window {
            pending: FuturesOrdered::new(),
            messages: 0,
            bytes: 0,
        }
    }
}

/// One result on its way, with the share of the window its messages hold.
struct Reserved<T> {
    result: oneshot::Receiver<T>,
    messages: usize,
    bytes: usize,
}

impl<T> Future for Reserved<T> {
    type Output = (usize, usize, Result<T, oneshot::error::RecvError>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (messages, bytes) = (self.messages, self.bytes);
        Pin::new(&mut self.result)
            .poll(cx)
            .map(|result| (messages, bytes, result))
    }
}

impl<T> Window<T> {
    /// Whether another message may enter.
    pub fn has_room(&self) -> bool {
        self.room_for(0, 0)
    }

    /// Whether another message may enter after `messages` more of `bytes` reserved (those of a
    /// group being put together).
    pub fn room_for(&self, messages: usize, bytes: usize) -> bool {
        self.messages + messages < PROCESSING_WINDOW_MESSAGES
            && self.bytes + bytes < PROCESSING_WINDOW_BYTES
    }

    /// `messages` enter together, holding `bytes` (the sum of their [`reservation`]s) until their
    /// one result leaves. Send the result on the returned sender.
    pub fn push(&mut self, messages: usize, bytes: usize) -> oneshot::Sender<T> {
        let (tx, rx) = oneshot::channel();
        self.messages += messages;
        self.bytes += bytes;
        self.pending.push_back(Reserved {
            result: rx,
            messages,
            bytes,
        });
        tx
    }

    /// The oldest group's result, once it and every earlier one are done (`Err`: its task
    /// died); `None` when the window is empty.
    pub async fn next(&mut self) -> Option<Result<T, oneshot::error::RecvError>> {
        let (messages, bytes, result) = self.pending.next().await?;
        self.messages -= messages;
        self.bytes -= bytes;
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn results_leave_in_arrival_order_and_give_their_share_back() {
        let mut window = Window::default();
        let (first, second) = (
            window.push(1, reservation(10)),
            window.push(1, reservation(20)),
        );
        second.send("second").unwrap();
        first.send("first").unwrap();
        assert_eq!(window.bytes, reservation(10) + reservation(20));
        assert_eq!(window.next().await.unwrap().unwrap(), "first");
        assert_eq!(window.bytes, reservation(20));
        assert_eq!(window.next().await.unwrap().unwrap(), "second");
        assert_eq!(window.bytes, 0);
        assert!(window.next().await.is_none());
    }

    #[tokio::test]
    async fn the_window_is_bounded_by_messages_and_by_bytes() {
        // Small messages: each reserves at least 2 MiB, so the bytes bound the window first.
        let mut small = Window::<()>::default();
        let mut senders = Vec::new();
        while small.has_room() {
            senders.push(small.push(1, reservation(0)));
        }
        let fits = PROCESSING_WINDOW_MESSAGES.min(PROCESSING_WINDOW_BYTES.div_ceil(reservation(0)));
        assert_eq!(senders.len(), fits);
        senders.remove(0);
        assert!(
            small.next().await.unwrap().is_err(),
            "a task that died is told"
        );
        assert!(small.has_room(), "its share is back");

        let mut large = Window::<()>::default();
        let _large = large.push(1, reservation(PROCESSING_WINDOW_BYTES / 3));
        assert!(!large.has_room(), "one large message fills it");
    }

    #[tokio::test]
    async fn a_group_counts_each_of_its_messages_and_leaves_as_one() {
        let mut window = Window::<&str>::default();
        let mut admitted = (0, 0);
        while window.room_for(admitted.0, admitted.1) {
            admitted = (admitted.0 + 1, admitted.1 + reservation(0));
        }
        let fits = PROCESSING_WINDOW_MESSAGES.min(PROCESSING_WINDOW_BYTES.div_ceil(reservation(0)));
        assert_eq!(
            admitted.0, fits,
            "a group is admitted as its messages one by one"
        );
        let group = window.push(admitted.0, admitted.1);
        assert!(!window.has_room());
        group.send("all of them").unwrap();
        assert_eq!(window.next().await.unwrap().unwrap(), "all of them");
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(window.has_room());
    }
}
