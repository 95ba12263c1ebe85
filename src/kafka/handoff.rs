//! The bound on messages in transit from the polling thread to the pipeline: at most so many
//! messages and so many bytes of values (a message larger than the whole budget passes alone).
//!
//! The polling thread must never block on it — a thread that does not call `poll` serves no
//! rebalance and, past `max.poll.interval.ms`, is taken for stuck — so room is reserved with a
//! bounded wait ([`Handoff::reserve`]), and a message that finds none is held by the poller,
//! with its partitions paused, until it does. Room is reserved for a batch of messages at once
//! and given back at once: one lock, and a wake-up only when someone waits.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct Handoff {
    max_messages: usize,
    max_bytes: usize,
    state: Mutex<InTransit>,
    freed: Condvar,
}

#[derive(Default)]
struct InTransit {
    messages: usize,
    bytes: usize,
    closed: bool,
    /// Threads waiting in `reserve`: freeing room wakes them only if there are any.
    waiting: usize,
}

/// Room for a batch of messages, given back when dropped (once the pipeline has taken them).
pub struct Ticket {
    handoff: Arc<Handoff>,
    messages: usize,
    bytes: usize,
}

/// What [`Handoff::reserve`] found.
pub enum Reserved {
    Room(Ticket),
    /// No room within the wait.
    Full,
    /// The pipeline is gone.
    Closed,
}

impl Handoff {
    pub fn new(max_messages: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Handoff {
            max_messages: max_messages.max(1),
            max_bytes: max_bytes.max(1),
            state: Mutex::default(),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, InTransit> {
        // The counters stay consistent whatever panicked while holding the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Most messages one ticket may hold: a batch is cut to this.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// Room for `messages` messages (at most [`max_messages`](Self::max_messages)) of `size`
    /// bytes in all, waiting at most `wait` for it.
    pub fn reserve(self: &Arc<Self>, messages: usize, size: usize, wait: Duration) -> Reserved {
        let messages = messages.clamp(1, self.max_messages);
        let share = size.clamp(1, self.max_bytes);
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            if state.closed {
                return Reserved::Closed;
            }
            if state.messages + messages <= self.max_messages
                && state.bytes + share <= self.max_bytes
            {
                state.messages += messages;
                state.bytes += share;
                return Reserved::Room(Ticket {
                    handoff: self.clone(),
                    messages,
                    bytes: share,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Reserved::Full;
            }
            state.waiting += 1;
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
            state.waiting -= 1;
        }
    }

    /// No more messages are taken: a waiting [`reserve`](Self::reserve) returns `Closed`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.freed.notify_all();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.handoff.lock();
        state.messages -= self.messages;
        state.bytes -= self.bytes;
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.handoff.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_WAIT: Duration = Duration::ZERO;

    fn room(reserved: Reserved) -> Ticket {
        match reserved {
            Reserved::Room(ticket) => ticket,
            Reserved::Full => panic!("full"),
            Reserved::Closed => panic!("closed"),
        }
    }

    #[test]
    fn messages_and_bytes_are_both_bounded_and_given_back_on_drop() {
        let handoff = Handoff::new(2, 100);
        let a = room(handoff.reserve(1, 60, NO_WAIT));
        assert!(
            matches!(handoff.reserve(1, 50, NO_WAIT), Reserved::Full),
            "bytes"
        );
        let b = room(handoff.reserve(1, 40, NO_WAIT));
        assert!(
            matches!(handoff.reserve(1, 0, NO_WAIT), Reserved::Full),
            "messages"
        );
        drop(a);
        let _c = room(handoff.reserve(1, 60, NO_WAIT));
        drop(b);
        assert!(matches!(handoff.reserve(1, 41, NO_WAIT), Reserved::Full));
    }

    #[test]
    fn a_batch_takes_its_messages_and_bytes_and_gives_them_back_at_once() {
        let handoff = Handoff::new(4, 100);
        let batch = room(handoff.reserve(3, 90, NO_WAIT));
        assert!(matches!(handoff.reserve(2, 1, NO_WAIT), Reserved::Full));
        assert!(matches!(handoff.reserve(1, 20, NO_WAIT), Reserved::Full));
        let one = room(handoff.reserve(1, 10, NO_WAIT));
        drop(batch);
        let three = room(handoff.reserve(3, 90, NO_WAIT));
        // A batch larger than the bound is cut to it by the caller; asking for more takes it all.
        drop(three);
        drop(one);
        let all = room(handoff.reserve(10, 1, NO_WAIT));
        assert_eq!(all.messages, 4);
    }

    #[test]
    fn a_message_larger_than_the_budget_passes_alone() {
        let handoff = Handoff::new(16, 100);
        let small = room(handoff.reserve(1, 1, NO_WAIT));
        assert!(matches!(handoff.reserve(1, 1_000, NO_WAIT), Reserved::Full));
        drop(small);
        let large = room(handoff.reserve(1, 1_000, NO_WAIT));
        assert!(matches!(handoff.reserve(1, 1, NO_WAIT), Reserved::Full));
        drop(large);
        room(handoff.reserve(1, 1, NO_WAIT));
    }

    /// Returns once a thread waits in `reserve`, so that what follows is what wakes it.
    fn waiting_in_reserve(handoff: &Handoff) {
        while handoff.lock().waiting == 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_wait_ends_with_room_freed_or_when_closed() {
        // Woken, not timed out: a waiter nothing wakes gets its answer only at its deadline (the
        // loop checks room and closing once more then), so each is asked how long it waited.
        const DEADLINE: Duration = Duration::from_secs(60);
        let waiter = |handoff: &Arc<Handoff>, wanted: fn(&Reserved) -> bool| {
            let handoff = handoff.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let reserved = handoff.reserve(1, 1, DEADLINE);
                (wanted(&reserved), started.elapsed())
            })
        };
        let handoff = Handoff::new(1, 100);
        let held = room(handoff.reserve(1, 1, NO_WAIT));
        let waiting = waiter(&handoff, |r| matches!(r, Reserved::Room(_)));
        waiting_in_reserve(&handoff);
        drop(held);
        let (room_freed, waited) = waiting.join().unwrap();
        assert!(
            room_freed && waited < DEADLINE / 2,
            "room freed wakes the waiter: {waited:?}"
        );

        let _held = room(handoff.reserve(1, 1, NO_WAIT));
        let waiting = waiter(&handoff, |r| matches!(r, Reserved::Closed));
        waiting_in_reserve(&handoff);
        handoff.close();
        let (closed, waited) = waiting.join().unwrap();
        assert!(
            closed && waited < DEADLINE / 2,
            "closing wakes the waiter: {waited:?}"
        );
        assert!(
            matches!(handoff.reserve(1, 1, NO_WAIT), Reserved::Closed),
            "closed for good"
        );
    }
}
