//! What this member owns, as the rebalance callbacks leave it: its partitions, and the revoke
//! generation, which every revocation moves on and every polled message is tagged with. The
//! callbacks are the one place that changes it; the polling thread reads it (to drop what it
//! holds of a partition given up, and to tag what it polls). `/status` shows a copy, recorded on
//! each change.
//!
//! The pipeline keeps its own record of revocations (`pipeline::revocations`): which generation
//! each partition was last revoked in, updated when the pipeline has handled that revoke, in its
//! own task and without a lock.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Ownership {
    partitions: Mutex<BTreeSet<i32>>,
    generation: AtomicU64,
}

impl Ownership {
    /// `partitions` were assigned (a rebalance may add to the ones owned); returns what is owned
    /// now.
    pub fn gain(&self, partitions: &[i32]) -> BTreeSet<i32> {
        let mut owned = self.owned_mut();
        owned.extend(partitions);
        owned.clone()
    }

    /// `partitions` are being revoked: a new generation starts. Returns it, and what is owned
    /// now.
    pub fn revoke(&self, partitions: &[i32]) -> (u64, BTreeSet<i32>) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let mut owned = self.owned_mut();
        for partition in partitions {
            owned.remove(partition);
        }
        (generation, owned.clone())
    }

    /// The generation what is polled now belongs to.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn owns(&self, partition: i32) -> bool {
        self.owned_mut().contains(&partition)
    }

    /// Each change is one call under the lock: a panic elsewhere cannot leave it half-made.
    fn owned_mut(&self) -> std::sync::MutexGuard<'_, BTreeSet<i32>> {
        self.partitions
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
        assert_eq!(ownership.revoke(&[1]), (1, [0, 3].into()));
        assert!(ownership.owns(0) && !ownership.owns(1));
        assert_eq!(
            ownership.revoke(&[]),
            (2, [0, 3].into()),
            "every revoke counts"
        );
        assert_eq!(ownership.generation(), 2);
    }
}
