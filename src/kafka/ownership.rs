//! What this member owns, as the rebalance callbacks leave it: its partitions, the revoke
//! generation, which every revocation moves on and every polled message is tagged with, and the
//! generation each partition was last lost in. The callbacks are the one place that changes it;
//! the polling thread reads it (to drop what it holds of a partition given up, and to tag what it
//! polls), and so do flushes under way (to write nothing more of a partition lost while they
//! run). `/status` shows a copy, recorded on each change. With the consumer group protocol it
//! also says whether flushes may write at all while the group coordinator is out of reach
//! (`kafka::coordinator`).
//!
//! The pipeline keeps its own record of revocations (`pipeline::revocations`): which generation
//! each partition was last revoked in, updated when the pipeline has handled that revoke, in its
//! own task and without a lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::coordinator::Coordinator;

#[derive(Debug, Default)]
pub struct Ownership {
    owned: Mutex<Owned>,
    generation: AtomicU64,
    /// The generation of the last loss (0: none): a flush asks for each message, and before any
    /// loss the answer needs no lock.
    last_loss: AtomicU64,
    /// The group coordinator's reach, as the statistics and the callbacks tell it.
    coordinator: Mutex<Coordinator>,
}

#[derive(Debug, Default)]
struct Owned {
    partitions: BTreeSet<i32>,
    /// Partition → the generation it was last lost in (the group gave it to another member
    /// before this one gave it up). One entry per partition ever lost: as many as the topic has.
    lost_in: HashMap<i32, u64>,
}

impl Ownership {
    /// Writes wait once the group coordinator has been out of reach for `hold_after`; `None`:
    /// never (see `kafka::coordinator`).
    pub fn holding_writes_after(hold_after: Option<Duration>) -> Self {
        Ownership {
            coordinator: Mutex::new(Coordinator::new(hold_after)),
            ..Ownership::default()
        }
    }

    /// `partitions` were assigned (a rebalance may add to the ones owned); returns what is owned
    /// now.
    pub fn gain(&self, partitions: &[i32]) -> BTreeSet<i32> {
        self.coordinator_mut().answered();
        let mut owned = self.owned_mut();
        owned.partitions.extend(partitions);
        owned.partitions.clone()
    }

    /// `partitions` are being revoked, or were `lost`: a new generation starts. Returns it, and
    /// what is owned now.
    pub fn revoke(&self, partitions: &[i32], lost: bool) -> (u64, BTreeSet<i32>) {
        let (generation, owned) = {
            let mut owned = self.owned_mut();
            let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            for &partition in partitions {
                owned.partitions.remove(&partition);
            }
            if lost {
                self.lose(&mut owned, partitions, generation);
            }
            (generation, owned.partitions.clone())
        };
        // The coordinator's answer releases held writes only once the loss it brought is
        // recorded: a held write that finds itself released reads its partitions again
        // (`pipeline::flush`), and must not find them still its own.
        self.coordinator_mut().answered();
        (generation, owned)
    }

    /// The revoke of `partitions` in `generation` was answered with some of what was polled of
    /// them not durable (its drain missed the deadline): their next owner reads that again from
    /// the last commit, so flushes still under way leave it out, as for a loss. Else a flush
    /// held up past the deadline (a sink outage across a scale-out) went on to write it —
    /// billing outcomes and occurrences beside the new owner's.
    pub fn abandon(&self, partitions: &[i32], generation: u64) {
        self.lose(&mut self.owned_mut(), partitions, generation);
    }

    /// The member stops on an error, its partitions not drained: a generation starts in which
    /// every partition it owns is abandoned, so flushes still under way (blocking tasks, which
    /// outlive the pipeline until the process exits) write nothing more of what was polled
    /// before. It is read again from the last commit, by this member's restart or another.
    pub fn abandon_all(&self) {
        let mut owned = self.owned_mut();
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let partitions: Vec<i32> = owned.partitions.iter().copied().collect();
        self.lose(&mut owned, &partitions, generation);
    }

    fn lose(&self, owned: &mut Owned, partitions: &[i32], generation: u64) {
        for &partition in partitions {
            let lost = owned.lost_in.entry(partition).or_default();
            *lost = (*lost).max(generation);
        }
        self.last_loss.fetch_max(generation, Ordering::AcqRel);
    }

    /// Whether `partition` was lost after `generation`: what was polled of it by then is its next
    /// owner's, who reads it again from the last commit.
    pub fn lost_since(&self, partition: i32, generation: u64) -> bool {
        if self.last_loss.load(Ordering::Acquire) <= generation {
            return false;
        }
        self.owned_mut()
            .lost_in
            .get(&partition)
            .is_some_and(|&lost| lost > generation)
    }

    /// The generation what is polled now belongs to.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn owns(&self, partition: i32) -> bool {
        self.owned_mut().partitions.contains(&partition)
    }

    pub fn owned(&self) -> BTreeSet<i32> {
        self.owned_mut().partitions.clone()
    }

    /// The generation of the last loss (0: none).
    pub fn last_loss(&self) -> u64 {
        self.last_loss.load(Ordering::Acquire)
    }

    /// librdkafka's statistics made at `at` (Unix ms): whether the group coordinator is
    /// connected (group state `up`), and for how long the group has been in its state.
    pub fn record_coordinator(&self, up: bool, state_age_ms: u64, at: u64) {
        self.coordinator_mut().record(up, state_age_ms, at);
    }

    /// Whether flushes write nothing for now: the coordinator has been out of reach for the
    /// session, and has not answered since.
    pub fn writes_held(&self) -> bool {
        self.coordinator_mut().holds(crate::health::now_ms())
    }

    fn coordinator_mut(&self) -> std::sync::MutexGuard<'_, Coordinator> {
        self.coordinator
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Each change is one call under the lock: a panic elsewhere cannot leave it half-made.
    fn owned_mut(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_revoke_starts_a_generation_and_assignments_add_to_what_is_owned() {
        let ownership = Ownership::default();
        assert_eq!(ownership.gain(&[0, 1]), [0, 1].into());
        assert_eq!(ownership.gain(&[3]), [0, 1, 3].into(), "incremental assign");
        assert_eq!(ownership.generation(), 0);
        assert_eq!(ownership.revoke(&[1], false), (1, [0, 3].into()));
        assert!(ownership.owns(0) && !ownership.owns(1));
        assert_eq!(
            ownership.revoke(&[], false),
            (2, [0, 3].into()),
            "every revoke counts"
        );
        assert_eq!(ownership.generation(), 2);
    }

    #[test]
    fn a_partition_lost_is_lost_to_what_was_polled_before_the_loss_only() {
        let ownership = Ownership::default();
        ownership.gain(&[0, 1, 2]);
        ownership.revoke(&[2], false);
        assert!(!ownership.lost_since(2, 0), "revoked, not lost");
        assert_eq!(ownership.revoke(&[0, 1], true), (2, BTreeSet::new()));
        assert!(ownership.lost_since(0, 0) && ownership.lost_since(1, 1));
        assert!(!ownership.lost_since(2, 1), "never lost");
        ownership.gain(&[0]);
        assert!(
            !ownership.lost_since(0, 2),
            "polled after it came back: this member's again"
        );
        ownership.revoke(&[0], true);
        assert!(ownership.lost_since(0, 2), "lost again");
    }

    #[test]
    fn a_revoke_answered_before_its_drain_ended_is_a_loss_to_what_was_polled_before_it() {
        let ownership = Ownership::default();
        ownership.gain(&[0, 1]);
        let (generation, _) = ownership.revoke(&[0], false);
        assert!(!ownership.lost_since(0, generation - 1), "drained in time");
        ownership.abandon(&[0], generation);
        assert!(ownership.lost_since(0, generation - 1));
        assert!(!ownership.lost_since(1, generation - 1), "kept");
        ownership.gain(&[0]);
        assert!(
            !ownership.lost_since(0, generation),
            "polled after the revoke"
        );
        // A later loss of another partition does not move this one's back.
        ownership.revoke(&[1], true);
        ownership.abandon(&[0], generation);
        assert!(!ownership.lost_since(0, generation));
    }

    #[test]
    fn stopping_on_an_error_abandons_everything_owned_to_what_was_polled_before() {
        let ownership = Ownership::default();
        ownership.gain(&[0, 1]);
        ownership.revoke(&[1], false);
        let polled = ownership.generation();
        ownership.abandon_all();
        assert!(ownership.lost_since(0, polled), "owned: abandoned");
        assert!(
            !ownership.lost_since(1, polled),
            "revoked and drained before"
        );
        assert!(!ownership.lost_since(0, ownership.generation()));
    }
}
