//! The processing window: messages being processed on the pool, or processed and waiting for
//! an earlier one to finish (arrival order is kept), bounded by count and by what their results
//! may hold. Consecutive small messages enter together, as one task on the pool with one result
//! ([`Window::push`]); each is admitted as if it came alone ([`Window::room_for`]), so the bounds
//! are the same as one message at a time.
//!
//! A message holds its [`reservation`] — what its result may hold at most — while it is
//! processed, and what its result does hold once it is done, waiting for an earlier one: a
//! finished small message behind a large one at the head gives most of its share back at once,
//! so the window takes the messages after it and every core keeps working.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::oneshot;

/// Messages being processed or waiting for an earlier one to finish (arrival order is kept).
/// A wide window keeps every core busy behind one large segment at the head.
pub const PROCESSING_WINDOW_MESSAGES: usize = 64;

/// Bytes the window may hold: the reservations of the messages being processed, plus what the
/// results waiting for an earlier one hold. So outputs waiting behind a slow head are bounded
/// too, not only the inputs.
pub const PROCESSING_WINDOW_BYTES: usize = 64 * 1024 * 1024;

/// What a message of `value_len` bytes reserves in the processing window: its value, plus what
/// processing it may hold — a blob and replay event no larger than about the value, and the
/// extractor's capped clicks, taps, lists and counts (about 1.1 MiB at most, whatever the input).
pub fn reservation(value_len: usize) -> usize {
    value_len.saturating_mul(3).saturating_add(2 * 1024 * 1024)
}

/// A result's size in memory, which it holds in the window while it waits for an earlier one.
pub trait Held {
    fn held_bytes(&self) -> usize;
}

/// What [`Window::next`] brings.
pub enum Progress<T> {
    /// The oldest group's result (`Err`: its task died).
    Ready(Result<T, oneshot::error::RecvError>),
    /// A later group finished first: it waits, having given back what it no longer holds.
    Freed,
}

/// The window, holding results of type `T` on their way (one per group of messages).
pub struct Window<T> {
    running: FuturesUnordered<Reserved<T>>,
    /// Finished before an earlier group, by arrival number: messages, bytes held, result.
    waiting: BTreeMap<u64, (usize, usize, Result<T, oneshot::error::RecvError>)>,
    /// Arrival number of the next group pushed, and of the next to leave.
    pushed: u64,
    head: u64,
    /// Messages in the window.
    messages: usize,
    /// Reservations of the running groups plus what the waiting ones hold.
    bytes: usize,
}

impl<T> Default for Window<T> {
    fn default() -> Self {
        Window {
            running: FuturesUnordered::new(),
            waiting: BTreeMap::new(),
            pushed: 0,
            head: 0,
            messages: 0,
            bytes: 0,
        }
    }
}

/// One group being processed, with its arrival number and the share of the window it holds.
struct Reserved<T> {
    result: oneshot::Receiver<T>,
    seq: u64,
    messages: usize,
    bytes: usize,
}

impl<T> Future for Reserved<T> {
    type Output = (u64, usize, usize, Result<T, oneshot::error::RecvError>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (seq, messages, bytes) = (self.seq, self.messages, self.bytes);
        Pin::new(&mut self.result)
            .poll(cx)
            .map(|result| (seq, messages, bytes, result))
    }
}

impl<T: Held> Window<T> {
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
    /// one result is done. Send the result on the returned sender.
    pub fn push(&mut self, messages: usize, bytes: usize) -> oneshot::Sender<T> {
        let (tx, rx) = oneshot::channel();
        self.messages += messages;
        self.bytes += bytes;
        self.running.push(Reserved {
            result: rx,
            seq: self.pushed,
            messages,
            bytes,
        });
        self.pushed += 1;
        tx
    }

    /// The oldest group's result once it and every earlier one are done, or word that a later
    /// one finished first; `None` when the window is empty. Cancel-safe: nothing changes until
    /// it returns.
    pub async fn next(&mut self) -> Option<Progress<T>> {
        if let Some(result) = self.leave() {
            return Some(Progress::Ready(result));
        }
        let (seq, messages, reserved, result) = self.running.next().await?;
        let held = result.as_ref().map_or(0, Held::held_bytes);
        self.bytes = self.bytes - reserved + held;
        self.waiting.insert(seq, (messages, held, result));
        Some(match self.leave() {
            Some(result) => Progress::Ready(result),
            None => Progress::Freed,
        })
    }

    /// The head's result, if it is done.
    fn leave(&mut self) -> Option<Result<T, oneshot::error::RecvError>> {
        let (messages, held, result) = self.waiting.remove(&self.head)?;
        self.head += 1;
        self.messages -= messages;
        self.bytes -= held;
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result that holds as many bytes as its text is long.
    impl Held for &str {
        fn held_bytes(&self) -> usize {
            self.len()
        }
    }

    impl Held for () {
        fn held_bytes(&self) -> usize {
            0
        }
    }

    async fn ready<T: Held>(window: &mut Window<T>) -> Result<T, oneshot::error::RecvError> {
        loop {
            match window.next().await.expect("a group in the window") {
                Progress::Ready(result) => return result,
                Progress::Freed => {}
            }
        }
    }

    #[tokio::test]
    async fn results_leave_in_arrival_order_and_a_later_one_done_first_holds_only_its_size() {
        let mut window = Window::default();
        let (first, second) = (
            window.push(1, reservation(10)),
            window.push(1, reservation(20)),
        );
        assert_eq!(window.bytes, reservation(10) + reservation(20));
        second.send("second").unwrap();
        assert!(matches!(window.next().await, Some(Progress::Freed)));
        assert_eq!(window.bytes, reservation(10) + "second".len());
        assert_eq!(window.messages, 2, "it still counts until it leaves");
        first.send("first").unwrap();
        assert_eq!(ready(&mut window).await.unwrap(), "first");
        assert_eq!(window.bytes, "second".len());
        assert_eq!(ready(&mut window).await.unwrap(), "second");
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(window.next().await.is_none());
    }

    #[tokio::test]
    async fn behind_a_slow_head_finished_messages_make_room_for_more() {
        let mut window = Window::<&str>::default();
        let _head = window.push(1, reservation(1_000_000));
        let mut later = Vec::new();
        while window.has_room() {
            later.push(window.push(1, reservation(0)));
        }
        let admitted = later.len();
        for tx in later {
            tx.send("done").unwrap();
            assert!(matches!(window.next().await, Some(Progress::Freed)));
        }
        assert!(window.has_room(), "their reservations are back");
        assert!(
            admitted + 1 < PROCESSING_WINDOW_MESSAGES,
            "the bytes bounded the window first"
        );
        while window.has_room() {
            window.push(1, reservation(0)).send("done").unwrap();
            assert!(matches!(window.next().await, Some(Progress::Freed)));
        }
        assert_eq!(
            window.messages, PROCESSING_WINDOW_MESSAGES,
            "the message bound still holds the waiting ones"
        );
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
        assert!(ready(&mut small).await.is_err(), "a task that died is told");
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
        assert_eq!(ready(&mut window).await.unwrap(), "all of them");
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(window.has_room());
    }
}
