//! The processing window: messages being processed on the pool, or processed and waiting for
//! an earlier one to finish (arrival order is kept), bounded by count and by what their results
//! may hold. Consecutive small messages enter together, as one task on the pool with one result
//! ([`Window::push`]); each is admitted as if it came alone ([`Window::room_for`]), so the bounds
//! are the same as one message at a time.
//!
//! A finished group does not wake the pipeline while more groups than there are processing
//! threads are still unfinished: the pool has work queued, so nothing is gained by taking the
//! result at once, and the pipeline collects every finished group at the next wake. Waking
//! once the unfinished ones are no more than the threads (the last one always wakes) keeps
//! every thread busy while the pipeline admits more, with a wake-up every few groups instead of
//! one per group.
//!
//! A message holds its [`reservation`] — what its result may hold at most — while it is
//! processed, and what its result does hold once it is done, waiting for an earlier one: a
//! finished small message behind a large one at the head gives most of its share back at once,
//! so the window takes the messages after it and every core keeps working.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use futures::task::AtomicWaker;

use crate::recording::{Limits, envelope, payload, trace_items};

/// Messages being processed or waiting for an earlier one to finish (arrival order is kept).
/// A wide window keeps every core busy behind one large segment at the head.
pub const PROCESSING_WINDOW_MESSAGES: usize = 64;

/// Bytes the window may hold: the reservations of the messages being processed, plus what the
/// results waiting for an earlier one hold. So outputs waiting behind a slow head are bounded
/// too, not only the inputs. Wide enough for [`PROCESSING_WINDOW_MESSAGES`] small segments (each
/// reserves a little over 2 MiB): at 64 MiB the bytes admitted about 30, so the pipeline and the
/// polling thread were woken every 16–18 messages, and each wake-up preempted a processing
/// thread when every core was busy; at 128 MiB they sleep half as often (docs/performance.md).
/// What small segments really hold is far less: peak RSS did not change.
pub const PROCESSING_WINDOW_BYTES: usize = 128 * 1024 * 1024;

/// What a message `value` reserves in the processing window, processed under `limits`: the
/// value, plus what processing it may hold — a blob and replay event no larger than about the
/// value, the extractor's capped clicks, taps, lists and counts (about 1.1 MiB at most, whatever
/// the input) — and what may grow with what its body decodes to, told from its first bytes: a
/// body stored re-encoded that may decode far past its size (zstd, gzip, any body with a video:
/// [`payload::stored_beyond_size`]), and, with trace items on, their budget for as much input as
/// the body may decode to ([`payload::decoded_bound`]). Reserved by size alone, a crafted
/// megabyte of zstd decoding to 90 MiB reserved 5 MiB and held 68 in the window, and a 1.6 MB
/// zlib message of interactions held 29 MB of trace items against 7 reserved, and a 0.6 MB gzip
/// body of far repeats held a 90 MiB blob against 4 reserved: a few dozen such messages in
/// flight held gigabytes against a bound of 725 MiB.
pub fn reservation(value: &[u8], limits: &Limits) -> usize {
    let cap = limits.max_decompressed_bytes;
    let grows = match envelope::payload(value) {
        envelope::Field::Read {
            payload,
            with_video,
        } => payload::stored_beyond_size(payload, with_video, cap)
            .saturating_add(items_budget(limits, payload::decoded_bound(payload, cap))),
        envelope::Field::Absent => 0,
        // Processing reads it (deeper, or past a key too many for a quick look): the worst case.
        envelope::Field::Unread => grows_at_most(limits),
    };
    sized(value.len()).saturating_add(grows)
}

/// The largest reservation a message of at most `max_message_bytes` can make under `limits`:
/// the window holds at most the larger of this and [`PROCESSING_WINDOW_BYTES`] (such a message
/// enters only an empty window).
pub fn largest_reservation(max_message_bytes: usize, limits: &Limits) -> usize {
    sized(max_message_bytes).saturating_add(grows_at_most(limits))
}

/// The most a result can grow with what its body decodes to: a blob of the whole cap, and the
/// trace items of as much input.
fn grows_at_most(limits: &Limits) -> usize {
    let cap = limits.max_decompressed_bytes;
    cap.saturating_add(items_budget(limits, cap))
}

/// The trace items' budget for `decoded` bytes of input, when they are on.
fn items_budget(limits: &Limits, decoded: usize) -> usize {
    match limits.trace_items.is_off() {
        true => 0,
        false => trace_items::budget(decoded),
    }
}

/// What a message of `len` bytes reserves whatever its body holds.
fn sized(len: usize) -> usize {
    len.saturating_mul(3).saturating_add(2 * 1024 * 1024)
}

/// A result's size in memory, which it holds in the window while it waits for an earlier one.
pub trait Held {
    fn held_bytes(&self) -> usize;
}

/// A group's task ended without sending its result (it panicked).
#[derive(Debug, PartialEq, Eq)]
pub struct Died;

/// What [`Window::next`] brings.
pub enum Progress<T> {
    /// The oldest group's result (`Err`: its task died).
    Ready(Result<T, Died>),
    /// Later groups finished first: they wait, having given back what they no longer hold.
    Freed,
}

/// What the groups' tasks share with the window.
struct Shared<T> {
    /// Finished, not yet collected by the window: arrival number and result.
    finished: Mutex<Vec<(u64, Result<T, Died>)>>,
    /// Groups pushed whose task has not finished.
    unfinished: AtomicUsize,
    /// A finished group wakes the window only once this many or fewer are left unfinished.
    wake_at: usize,
    waker: AtomicWaker,
    /// When a group last finished, or the first began with none running, in ms since the Unix
    /// epoch; 0 while none runs. Liveness reads it: groups running and none finishing for long is
    /// a processing task that hangs (`health`). Results done and waiting to be collected are not
    /// running: the pipeline leaves them in the window while the buffer cannot take them.
    running_since_ms: Arc<AtomicU64>,
}

/// Where a group's task sends its one result ([`Window::push`]). Dropped unsent (its task
/// panicked), it tells the window the group died.
pub struct Completion<T> {
    shared: Arc<Shared<T>>,
    seq: u64,
    sent: bool,
}

impl<T> Completion<T> {
    pub fn send(mut self, result: T) {
        self.sent = true;
        self.finish(Ok(result));
    }

    fn finish(&self, result: Result<T, Died>) {
        let shared = &self.shared;
        let mut finished = shared
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        finished.push((self.seq, result));
        // Under the lock, as `push` counts: a group that begins meanwhile is never left unseen.
        let left = shared.unfinished.fetch_sub(1, Ordering::AcqRel) - 1;
        let at = if left == 0 {
            0
        } else {
            crate::health::now_ms()
        };
        shared.running_since_ms.store(at, Ordering::Relaxed);
        drop(finished);
        if left <= shared.wake_at {
            shared.waker.wake();
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        if !self.sent {
            self.finish(Err(Died));
        }
    }
}

/// One group in the window, in arrival order: its messages, what it holds (its reservation
/// while it runs, its result's size once done) and its result once done.
struct Group<T> {
    messages: usize,
    bytes: usize,
    result: Option<Result<T, Died>>,
}

/// The window, holding results of type `T` on their way (one per group of messages).
pub struct Window<T> {
    shared: Arc<Shared<T>>,
    /// The groups in the window; the first one's arrival number is `head`.
    groups: VecDeque<Group<T>>,
    head: u64,
    /// Groups done whose result the window has not collected yet.
    uncollected: usize,
    /// Messages in the window.
    messages: usize,
    /// Reservations of the running groups plus what the finished ones hold.
    bytes: usize,
}

impl<T: Held> Window<T> {
    /// A window whose groups run on `threads` processing threads.
    pub fn new(threads: usize) -> Self {
        Window {
            shared: Arc::new(Shared {
                finished: Mutex::default(),
                unfinished: AtomicUsize::new(0),
                wake_at: threads.max(1),
                waker: AtomicWaker::new(),
                running_since_ms: Arc::default(),
            }),
            groups: VecDeque::new(),
            head: 0,
            uncollected: 0,
            messages: 0,
            bytes: 0,
        }
    }

    /// When a group last finished, or the first began with none running (ms since the Unix
    /// epoch; 0: none runs), kept up to date by the groups' tasks.
    pub fn running_since_ms(&self) -> Arc<AtomicU64> {
        self.shared.running_since_ms.clone()
    }

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

    /// Whether `messages` more, reserving `bytes`, stay within the window's bounds.
    pub fn fits(&self, messages: usize, bytes: usize) -> bool {
        self.messages + messages <= PROCESSING_WINDOW_MESSAGES
            && self.bytes + bytes <= PROCESSING_WINDOW_BYTES
    }

    /// Whether no message is in the window.
    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// `messages` enter together, holding `bytes` (the sum of their [`reservation`]s) until their
    /// one result is done. Send the result on the returned completion.
    pub fn push(&mut self, messages: usize, bytes: usize) -> Completion<T> {
        self.messages += messages;
        self.bytes += bytes;
        self.groups.push_back(Group {
            messages,
            bytes,
            result: None,
        });
        self.uncollected += 1;
        {
            let _finishing = self
                .shared
                .finished
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if self.shared.unfinished.fetch_add(1, Ordering::AcqRel) == 0 {
                self.shared
                    .running_since_ms
                    .store(crate::health::now_ms(), Ordering::Relaxed);
            }
        }
        Completion {
            shared: self.shared.clone(),
            seq: self.head + self.groups.len() as u64 - 1,
            sent: false,
        }
    }

    /// The oldest group's result once it and every earlier one are done, or word that later
    /// ones finished first; `None` when the window is empty. Cancel-safe: nothing changes until
    /// it returns.
    pub async fn next(&mut self) -> Option<Progress<T>> {
        if let Some(result) = self.leave() {
            return Some(Progress::Ready(result));
        }
        if self.uncollected == 0 {
            return None;
        }
        poll_fn(|cx| {
            if self.collect() {
                return Poll::Ready(());
            }
            self.shared.waker.register(cx.waker());
            // A group that finished before the waker was in place did not see it.
            match self.collect() {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await;
        Some(match self.leave() {
            Some(result) => Progress::Ready(result),
            None => Progress::Freed,
        })
    }

    /// Takes the results of the groups that finished since the last call, each giving back its
    /// reservation and holding its result's size instead; whether there were any.
    fn collect(&mut self) -> bool {
        let mut finished = self
            .shared
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let any = !finished.is_empty();
        for (seq, result) in finished.drain(..) {
            let group = &mut self.groups[(seq - self.head) as usize];
            let held = result.as_ref().map_or(0, Held::held_bytes);
            self.bytes = self.bytes - group.bytes + held;
            group.bytes = held;
            group.result = Some(result);
            self.uncollected -= 1;
        }
        drop(finished);
        any
    }

    /// The head's result, if it is done.
    fn leave(&mut self) -> Option<Result<T, Died>> {
        self.groups.front()?.result.as_ref()?;
        let group = self.groups.pop_front()?;
        self.head += 1;
        self.messages -= group.messages;
        self.bytes -= group.bytes;
        group.result
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

    async fn ready<T: Held>(window: &mut Window<T>) -> Result<T, Died> {
        loop {
            match window.next().await.expect("a group in the window") {
                Progress::Ready(result) => return result,
                Progress::Freed => {}
            }
        }
    }

    #[tokio::test]
    async fn results_leave_in_arrival_order_and_a_later_one_done_first_holds_only_its_size() {
        let mut window = Window::new(1);
        let (first, second) = (window.push(1, sized(10)), window.push(1, sized(20)));
        assert_eq!(window.bytes, sized(10) + sized(20));
        second.send("second");
        assert!(matches!(window.next().await, Some(Progress::Freed)));
        assert_eq!(window.bytes, sized(10) + "second".len());
        assert_eq!(window.messages, 2, "it still counts until it leaves");
        first.send("first");
        assert_eq!(ready(&mut window).await.unwrap(), "first");
        assert_eq!(window.bytes, "second".len());
        assert_eq!(ready(&mut window).await.unwrap(), "second");
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(window.next().await.is_none());
    }

    #[tokio::test]
    async fn the_clock_moves_when_a_group_finishes_and_not_while_a_head_hangs() {
        let mut window = Window::<&str>::new(1);
        let moved_at = window.running_since_ms();
        assert_eq!(moved_at.load(Ordering::Relaxed), 0, "empty");
        let head = window.push(1, sized(10));
        let entered = moved_at.load(Ordering::Relaxed);
        assert!(entered > 0, "the first message entered");
        // Behind a head that does not finish, the later groups finish and are collected once:
        // the window moved then. Then nothing more finishes: it stays put, as liveness reads it.
        let behind = window.push(1, sized(10));
        moved_at.store(1, Ordering::Relaxed);
        behind.send("done");
        assert!(matches!(window.next().await, Some(Progress::Freed)));
        let collected = moved_at.load(Ordering::Relaxed);
        assert!(collected >= entered, "moved when the later group finished");
        moved_at.store(1, Ordering::Relaxed);
        let more = window.push(1, sized(10));
        assert_eq!(
            moved_at.load(Ordering::Relaxed),
            1,
            "entering a busy window is no move"
        );
        head.send("done");
        assert!(moved_at.load(Ordering::Relaxed) > 1, "the head finished");
        assert!(matches!(
            window.next().await,
            Some(Progress::Ready(Ok("done")))
        ));
        // Every group done, none collected (the buffer cannot take them): nothing runs, nothing
        // can hang. (It counted as in processing, and a long sink outage failed liveness.)
        more.send("done");
        assert_eq!(moved_at.load(Ordering::Relaxed), 0, "none running");
        assert_eq!(window.messages, 2, "still in the window");
    }

    #[tokio::test]
    async fn behind_a_slow_head_finished_messages_make_room_for_more() {
        let mut window = Window::<&str>::new(1);
        let _head = window.push(1, sized(1_000_000));
        let mut later = Vec::new();
        while window.has_room() {
            later.push(window.push(1, sized(0)));
        }
        let admitted = later.len();
        for tx in later {
            tx.send("done");
            assert!(matches!(window.next().await, Some(Progress::Freed)));
        }
        assert!(window.has_room(), "their reservations are back");
        assert!(
            admitted + 1 < PROCESSING_WINDOW_MESSAGES,
            "the bytes bounded the window first"
        );
        while window.has_room() {
            window.push(1, sized(0)).send("done");
            assert!(matches!(window.next().await, Some(Progress::Freed)));
        }
        assert_eq!(
            window.messages, PROCESSING_WINDOW_MESSAGES,
            "the message bound still holds the waiting ones"
        );
    }

    #[tokio::test]
    async fn the_window_is_bounded_by_messages_and_by_bytes() {
        // Empty messages: the count bounds the window first.
        let mut empty = Window::<()>::new(1);
        while empty.has_room() {
            let _ = empty.push(1, sized(0));
        }
        assert_eq!(empty.messages, PROCESSING_WINDOW_MESSAGES);
        // Messages of 256 KiB reserve 2.75 MiB each: the bytes bound the window first.
        let each = sized(256 << 10);
        let mut small = Window::<()>::new(1);
        let mut senders = Vec::new();
        while small.has_room() {
            senders.push(small.push(1, each));
        }
        let fits = PROCESSING_WINDOW_BYTES.div_ceil(each);
        assert!(fits < PROCESSING_WINDOW_MESSAGES);
        assert_eq!(senders.len(), fits);
        senders.remove(0);
        assert!(ready(&mut small).await.is_err(), "a task that died is told");
        assert!(small.has_room(), "its share is back");

        let mut large = Window::<()>::new(1);
        let _large = large.push(1, sized(PROCESSING_WINDOW_BYTES / 3));
        assert!(!large.has_room(), "one large message fills it");
    }

    #[tokio::test]
    async fn a_group_counts_each_of_its_messages_and_leaves_as_one() {
        let mut window = Window::<&str>::new(1);
        let mut admitted = (0, 0);
        while window.room_for(admitted.0, admitted.1) {
            admitted = (admitted.0 + 1, admitted.1 + sized(0));
        }
        let fits = PROCESSING_WINDOW_MESSAGES.min(PROCESSING_WINDOW_BYTES.div_ceil(sized(0)));
        assert_eq!(
            admitted.0, fits,
            "a group is admitted as its messages one by one"
        );
        let group = window.push(admitted.0, admitted.1);
        assert!(!window.has_room());
        group.send("all of them");
        assert_eq!(ready(&mut window).await.unwrap(), "all of them");
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(window.has_room());
    }

    /// Counts the wake-ups it is given.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls the window's `next` once (it is cancel-safe: dropping it pending loses nothing).
    fn poll_next<'a>(
        window: &mut Window<&'a str>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Progress<&'a str>>> {
        std::future::Future::poll(std::pin::pin!(window.next()), cx)
    }

    #[test]
    fn a_finished_group_wakes_the_pipeline_only_once_no_more_than_the_threads_are_left() {
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = futures::task::waker(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let woken = || wakes.0.load(Ordering::SeqCst);
        let ready = |poll| match poll {
            Poll::Ready(Some(Progress::Ready(result))) => result,
            _ => panic!("the head's result"),
        };

        let mut window = Window::<&str>::new(2);
        let mut groups = (0..4)
            .map(|_| window.push(1, sized(0)))
            .collect::<Vec<_>>()
            .into_iter();
        assert!(poll_next(&mut window, &mut cx).is_pending());
        groups.next().unwrap().send("first");
        assert_eq!(woken(), 0, "three left on two threads: the pool is busy");
        groups.next().unwrap().send("second");
        assert_eq!(woken(), 1, "two left: time to admit more");
        assert_eq!(ready(poll_next(&mut window, &mut cx)), Ok("first"));
        assert_eq!(
            window.bytes,
            "second".len() + 2 * sized(0),
            "both collected at the one wake: what the second holds, and the two running"
        );
        assert_eq!(ready(poll_next(&mut window, &mut cx)), Ok("second"));
        assert!(poll_next(&mut window, &mut cx).is_pending());
        drop(groups.next());
        assert_eq!(woken(), 2, "one left: a task that died wakes too");
        assert_eq!(ready(poll_next(&mut window, &mut cx)), Err(Died));
        assert!(poll_next(&mut window, &mut cx).is_pending());
        groups.next().unwrap().send("last");
        assert_eq!(woken(), 3, "the last one always wakes");
        assert_eq!(ready(poll_next(&mut window, &mut cx)), Ok("last"));
        assert_eq!((window.messages, window.bytes), (0, 0));
        assert!(matches!(poll_next(&mut window, &mut cx), Poll::Ready(None)));
    }
}
