//! Revoke generations: what this member may still commit. Each revocation starts a generation;
//! every polled message, processed entry, flush and commit carries the one it started in. For a
//! partition revoked in a later generation, it is no longer ours (its next owner reads it
//! again); for the partitions this member kept, nothing changes (incremental rebalancing).

use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Revocations {
    /// The current generation (one per revoke).
    current: u64,
    /// Partition → the generation its last revoke started.
    revoked: HashMap<i32, u64>,
}

impl Revocations {
    /// The generation work started now belongs to.
    pub fn current(&self) -> u64 {
        self.current
    }

    /// `partitions` were revoked in `generation` (and their drain is over).
    pub fn revoked(&mut self, partitions: &[i32], generation: u64) {
        self.current = self.current.max(generation);
        for &partition in partitions {
            // A give-up answered late (after a later loss of the same partition) does not
            // make what was polled between the two current again.
            let revoked = self.revoked.entry(partition).or_default();
            *revoked = (*revoked).max(generation);
        }
    }

    /// Whether something of `partition` from `generation` predates the partition's last revoke.
    pub fn is_stale(&self, partition: i32, generation: u64) -> bool {
        self.revoked
            .get(&partition)
            .is_some_and(|&revoked| generation < revoked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_predates_a_partitions_revoke_is_stale() {
        let mut r = Revocations::default();
        assert!(!r.is_stale(0, 0));
        r.revoked(&[0], 1);
        assert_eq!(r.current(), 1);
        assert!(r.is_stale(0, 0), "polled before partition 0 was revoked");
        assert!(!r.is_stale(0, 1), "polled after it came back");
        assert!(!r.is_stale(1, 0), "partition 1 was kept");
        r.revoked(&[1], 2);
        assert!(
            r.is_stale(1, 1) && !r.is_stale(0, 1),
            "each partition has its own revoke"
        );
        r.revoked(&[0], 3);
        r.revoked(&[0], 1);
        assert!(
            r.is_stale(0, 2),
            "a late, older revoke does not make partition 0's messages current again"
        );
        assert_eq!(
            r.current(),
            3,
            "a late, older revoke does not move the generation back"
        );
    }
}
