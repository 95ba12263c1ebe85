//! The bound on messages in transit from the polling thread to the pipeline: at most so many
//! messages and so many bytes of values (a message larger than the whole budget passes alone).
//!
//! The polling thread must never block on it — a thread that does not call `poll` serves no
//! rebalance and, past `max.poll.interval.ms`, is taken for stuck — so room is reserved with a
//! bounded wait ([`Handoff::reserve`]), and a message that finds none is held by the poller,
//! with its partitions paused, until it does.

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
}

/// Room for one message, given back when dropped (once the pipeline has taken the message).
pub struct Ticket {
    handoff: Arc<Handoff>,
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

    /// Room for a message of `size` bytes, waiting at most `wait` for it.
    pub fn reserve(self: &Arc<Self>, size: usize, wait: Duration) -> Reserved {
        let share = size.clamp(1, self.max_bytes);
        let deadline = Instant::now() + wait;
        let mut state = self.lock();
        loop {
            if state.closed {
                return Reserved::Closed;
            }
            if state.messages < self.max_messages && state.bytes + share <= self.max_bytes {
                state.messages += 1;
                state.bytes += share;
                return Reserved::Room(Ticket {
                    handoff: self.clone(),
                    bytes: share,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Reserved::Full;
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
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
        state.messages -= 1;
        state.bytes -= self.bytes;
        drop(state);
        self.handoff.freed.notify_all();
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
        let a = room(handoff.reserve(60, NO_WAIT));
        assert!(
            matches!(handoff.reserve(50, NO_WAIT), Reserved::Full),
            "bytes"
        );
        let b = room(handoff.reserve(40, NO_WAIT));
        assert!(
            matches!(handoff.reserve(0, NO_WAIT), Reserved::Full),
            "messages"
        );
        drop(a);
        let _c = room(handoff.reserve(60, NO_WAIT));
        drop(b);
        assert!(matches!(handoff.reserve(41, NO_WAIT), Reserved::Full));
    }

    #[test]
    fn a_message_larger_than_the_budget_passes_alone() {
        let handoff = Handoff::new(16, 100);
        let small = room(handoff.reserve(1, NO_WAIT));
        assert!(matches!(handoff.reserve(1_000, NO_WAIT), Reserved::Full));
        drop(small);
        let large = room(handoff.reserve(1_000, NO_WAIT));
        assert!(matches!(handoff.reserve(1, NO_WAIT), Reserved::Full));
        drop(large);
        room(handoff.reserve(1, NO_WAIT));
    }

    #[test]
    fn a_wait_ends_with_room_freed_or_when_closed() {
        let handoff = Handoff::new(1, 100);
        let held = room(handoff.reserve(1, NO_WAIT));
        let waiter = {
            let handoff = handoff.clone();
            std::thread::spawn(move || {
                matches!(
                    handoff.reserve(1, Duration::from_secs(60)),
                    Reserved::Room(_)
                )
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap(), "room freed wakes the waiter");

        let _held = room(handoff.reserve(1, NO_WAIT));
        let waiter = {
            let handoff = handoff.clone();
            std::thread::spawn(move || {
                matches!(
                    handoff.reserve(1, Duration::from_secs(60)),
                    Reserved::Closed
                )
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        handoff.close();
        assert!(waiter.join().unwrap(), "closing wakes the waiter");
        assert!(
            matches!(handoff.reserve(1, NO_WAIT), Reserved::Closed),
            "closed for good"
        );
    }
}
