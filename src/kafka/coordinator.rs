//! Whether a member on the consumer group protocol of KIP-848 can still count on owning its
//! partitions while its group coordinator is out of reach.
//!
//! With the classic protocol librdkafka keeps a session timer of its own: cut off from the
//! coordinator for a session, the member finds its partitions lost, and a flush under way writes
//! nothing more of them (`kafka::ownership`). librdkafka 2.12 arms no such timer for the consumer
//! protocol (`rd_kafka_cgrp_session_timeout_check` serves the classic one only): the member stays
//! joined and learns that the broker fenced it only from the coordinator's first answer once it
//! is back. Meanwhile the broker may have given its partitions to another member, and a flush of
//! this one whose sinks answer would write what the new owner writes too (billing outcomes
//! twice). So once the coordinator has been out of reach for the session, writes wait: for the
//! coordinator's word (a rebalance callback: the loss, or any change of assignment), or for it
//! to have been back for [`CONFIRMATION`] without one. Nothing can be committed while the
//! coordinator is out of reach, so waiting costs no progress that would count.
//!
//! The coordinator's reach is read from librdkafka's statistics (every `statistics.interval.ms`):
//! the group state is `up` while the coordinator is connected.

use std::time::Duration;

use tracing::{info, warn};

/// How long a coordinator back after writes were held has to tell the member it was fenced
/// before they resume: librdkafka heartbeats as soon as it is connected again, and the broker's
/// heartbeat interval is 5 s by default.
pub const CONFIRMATION: Duration = Duration::from_secs(5);

/// What the statistics and the callbacks said of the coordinator, in Unix ms.
#[derive(Debug, Default)]
pub struct Coordinator {
    /// How long the coordinator may be out of reach before writes wait (ms); 0: never.
    hold_after_ms: u64,
    /// Since when the coordinator has been out of reach.
    out_since_ms: Option<u64>,
    /// Since when it has been back after an absence long enough to hold writes.
    back_since_ms: Option<u64>,
    /// Writes waited when last asked, so that each change is logged once.
    held: bool,
}

impl Coordinator {
    /// Writes wait once the coordinator has been out of reach for `hold_after`; `None`: never
    /// (the classic protocol, whose client gives the partitions up itself).
    pub fn new(hold_after: Option<Duration>) -> Self {
        Coordinator {
            hold_after_ms: hold_after.map_or(0, |d| d.as_millis().max(1) as u64),
            ..Coordinator::default()
        }
    }

    /// librdkafka's statistics at `now`: whether the group state is `up` (the coordinator
    /// connected), and how long it has been in its state.
    pub fn record(&mut self, up: bool, state_age_ms: u64, now: u64) {
        let since = now.saturating_sub(state_age_ms);
        if !up {
            self.out_since_ms.get_or_insert(since);
        } else if let Some(out) = self.out_since_ms.take()
            && self.hold_after_ms > 0
            && since.saturating_sub(out) >= self.hold_after_ms
        {
            self.back_since_ms = Some(since);
        }
    }

    /// A rebalance callback ran: the coordinator answered, and what the member owns is what the
    /// callbacks left.
    pub fn answered(&mut self) {
        self.out_since_ms = None;
        self.back_since_ms = None;
    }

    /// Whether writes wait at `now`.
    pub fn holds(&mut self, now: u64) -> bool {
        if self.hold_after_ms == 0 {
            return false;
        }
        let out_ms = self.out_since_ms.map(|out| now.saturating_sub(out));
        if self
            .back_since_ms
            .is_some_and(|back| now.saturating_sub(back) >= CONFIRMATION.as_millis() as u64)
        {
            self.back_since_ms = None;
        }
        let held =
            out_ms.is_some_and(|out| out >= self.hold_after_ms) || self.back_since_ms.is_some();
        if held != self.held {
            self.held = held;
            if held {
                warn!(
                    out_ms,
                    "the group coordinator has been out of reach for the session: the broker may have given this member's partitions to another, so flushes write nothing until the coordinator answers"
                );
            } else {
                info!(
                    "the group coordinator answered: flushes write again, or give up what it took away"
                );
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: u64 = 30_000;
    const CONFIRM: u64 = CONFIRMATION.as_millis() as u64;

    fn watch() -> Coordinator {
        Coordinator::new(Some(Duration::from_millis(SESSION)))
    }

    #[test]
    fn writes_wait_once_the_coordinator_has_been_out_of_reach_for_the_session() {
        let mut c = watch();
        c.record(true, 60_000, 100_000);
        assert!(!c.holds(100_000));
        // Seen out 4 s after it went (the statistics' interval): counted from when it went.
        c.record(false, 4_000, 104_000);
        assert!(!c.holds(100_000 + SESSION - 1));
        assert!(c.holds(100_000 + SESSION));
        assert!(c.holds(100_000 + 10 * SESSION), "for as long as it is out");
    }

    #[test]
    fn back_after_a_hold_writes_wait_for_its_word_or_a_while_without_one() {
        let mut c = watch();
        c.record(false, 0, 0);
        assert!(c.holds(SESSION + 1));
        // Back at 50 s, seen 2 s later.
        c.record(true, 2_000, 52_000);
        assert!(c.holds(52_000), "the coordinator has not said yet");
        assert!(c.holds(50_000 + CONFIRM - 1));
        assert!(
            !c.holds(50_000 + CONFIRM),
            "back long enough without a word"
        );
        // Its word (the loss, a new assignment) ends the wait at once.
        c.record(false, 0, 100_000);
        assert!(c.holds(100_000 + SESSION));
        c.record(true, 0, 100_000 + SESSION + 1);
        c.answered();
        assert!(!c.holds(100_000 + SESSION + 2));
    }

    #[test]
    fn a_shorter_absence_or_the_classic_protocol_never_holds() {
        let mut c = watch();
        c.record(false, 0, 0);
        c.record(true, 0, SESSION - 1);
        assert!(!c.holds(SESSION), "back within the session");
        assert!(!c.holds(SESSION + CONFIRM));
        let mut classic = Coordinator::new(None);
        classic.record(false, 0, 0);
        assert!(!classic.holds(10 * SESSION));
    }
}
