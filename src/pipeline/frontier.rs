//! The commit frontier: per partition, the offset below which every message's outputs are
//! durable. Messages are tracked in arrival order (offsets increase within a partition); flushes
//! may complete in any order; the frontier only moves over a contiguous run of completed offsets.

use std::collections::{BTreeMap, VecDeque};

use crate::kafka::position::Position;

#[derive(Debug, Default)]
struct Partition {
    /// Tracked offsets in arrival order, with the leader epoch each was written in and whether
    /// it is durable.
    pending: VecDeque<Tracked>,
    /// Next offset to commit (last contiguous durable offset + 1) and the leader epoch of the
    /// message before it, if it moved since reported.
    advanced: Option<(i64, Option<i32>)>,
    /// The last offset tracked, durable or not.
    last: Option<i64>,
}

/// An offset at or below one already tracked in the same partition and assignment: the log was
/// cut back or the position reset (librdkafka seeks by itself on a detected truncation or an
/// out-of-range position). Offsets would no longer increase, which the frontier relies on: a
/// completion would miss its slot and the partition would never commit again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WentBack {
    pub partition: i32,
    pub last: i64,
    pub offset: i64,
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    offset: i64,
    leader_epoch: Option<i32>,
    durable: bool,
}

#[derive(Debug, Default)]
pub struct Frontier {
    partitions: BTreeMap<i32, Partition>,
}

impl Frontier {
    /// A message entered the buffer, written in `leader_epoch`. An offset that does not
    /// increase starts the partition over when nothing of it is pending, and is refused,
    /// untracked, when something is: a flush in flight would complete offsets that now mean
    /// other messages. Starting over, the partition's next commit is the offset itself, with no
    /// epoch (the message before it was not read): what moved and is not committed yet is
    /// dropped, and a commit past it already under way (or failed, and reported again) is
    /// overtaken — the log may hold other messages there now, read again and not durable.
    /// `Ok(Some(last))` says it started over after `last`.
    pub fn track(
        &mut self,
        partition: i32,
        offset: i64,
        leader_epoch: Option<i32>,
    ) -> Result<Option<i64>, WentBack> {
        let p = self.partitions.entry(partition).or_default();
        let mut restarted = None;
        if let Some(last) = p.last.filter(|&last| offset <= last) {
            if !p.pending.is_empty() {
                return Err(WentBack {
                    partition,
                    last,
                    offset,
                });
            }
            p.advanced = Some((offset, None));
            restarted = Some(last);
        }
        p.last = Some(offset);
        p.pending.push_back(Tracked {
            offset,
            leader_epoch,
            durable: false,
        });
        Ok(restarted)
    }

    /// A message's outputs are durable.
    pub fn complete(&mut self, partition: i32, offset: i64) {
        let Some(p) = self.partitions.get_mut(&partition) else {
            return;
        };
        if let Ok(i) = p.pending.binary_search_by_key(&offset, |t| t.offset)
            && let Some(slot) = p.pending.get_mut(i)
        {
            slot.durable = true;
        }
        while let Some(&Tracked {
            offset,
            leader_epoch,
            durable: true,
        }) = p.pending.front()
        {
            p.pending.pop_front();
            p.advanced = Some((offset + 1, leader_epoch));
        }
    }

    /// The position of every partition whose frontier moved since the last call.
    pub fn take_advanced(&mut self) -> Vec<Position> {
        self.partitions
            .iter_mut()
            .filter_map(|(&partition, p)| {
                p.advanced.take().map(|(offset, leader_epoch)| Position {
                    partition,
                    offset,
                    leader_epoch,
                })
            })
            .collect()
    }

    /// A commit of `positions` failed (a rebalance moved the group's generation on, the
    /// coordinator was away): they are reported again by the next `take_advanced`, unless the
    /// partition moved further since, was forgotten (revoked), or started over below the
    /// position (it may hold messages read again and not durable).
    pub fn uncommitted(&mut self, positions: &[Position]) {
        for position in positions {
            let Some(p) = self.partitions.get_mut(&position.partition) else {
                continue;
            };
            // Everything below the offset is durable, as tracked now.
            let durable_below = p.pending.front().map(|t| t.offset);
            let durable_below = durable_below.or(p.last.map(|last| last + 1));
            if durable_below.is_some_and(|below| position.offset <= below) {
                let failed = (position.offset, position.leader_epoch);
                p.advanced = Some(
                    p.advanced
                        .filter(|later| later.0 > failed.0)
                        .unwrap_or(failed),
                );
            }
        }
    }

    /// Whether some partition's frontier moved and is not committed: what `take_advanced` would
    /// return.
    pub fn has_advanced(&self) -> bool {
        self.partitions.values().any(|p| p.advanced.is_some())
    }

    /// Messages the frontier holds back: not yet durable, or durable behind one that is not.
    pub fn pending(&self) -> usize {
        self.partitions.values().map(|p| p.pending.len()).sum()
    }

    /// Forgets revoked partitions: what is still pending there is their next owner's.
    pub fn forget(&mut self, partitions: &[i32]) {
        for partition in partitions {
            self.partitions.remove(partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(partition, offset)` of each position.
    fn offsets(positions: Vec<Position>) -> Vec<(i32, i64)> {
        positions.iter().map(|p| (p.partition, p.offset)).collect()
    }

    /// `(partition, offset)` pairs as positions without epochs.
    fn at(pairs: &[(i32, i64)]) -> Vec<Position> {
        pairs
            .iter()
            .map(|&(partition, offset)| Position {
                partition,
                offset,
                leader_epoch: None,
            })
            .collect()
    }

    #[test]
    fn a_failed_commit_is_reported_again_unless_overtaken_or_revoked() {
        let mut f = Frontier::default();
        for (partition, offset) in [(0, 5), (1, 9)] {
            f.track(partition, offset, None).unwrap();
            f.complete(partition, offset);
        }
        let failed = f.take_advanced();
        assert_eq!(offsets(failed.clone()), [(0, 6), (1, 10)]);
        f.track(0, 6, None).unwrap();
        f.complete(0, 6);
        f.forget(&[1]);
        f.uncommitted(&failed);
        assert_eq!(
            offsets(f.take_advanced()),
            [(0, 7)],
            "partition 0 moved on; partition 1 is someone else's"
        );
        f.uncommitted(&at(&[(0, 7)]));
        assert_eq!(offsets(f.take_advanced()), [(0, 7)]);
        assert!(offsets(f.take_advanced()).is_empty());
    }

    #[test]
    fn an_offset_that_does_not_increase_is_refused_while_pending_and_starts_over_after() {
        let mut f = Frontier::default();
        for offset in [10, 11, 12] {
            f.track(0, offset, None).unwrap();
        }
        f.track(1, 3, None).unwrap();
        let back = WentBack {
            partition: 0,
            last: 12,
            offset: 0,
        };
        assert_eq!(f.track(0, 0, None), Err(back), "10..=12 are pending");
        assert_eq!(f.track(0, 12, None), Err(WentBack { offset: 12, ..back }));
        for offset in [10, 11, 12] {
            f.complete(0, offset);
        }
        assert_eq!(f.pending(), 1, "partition 1's");
        // With nothing pending it starts over, dropping what moved and was not committed.
        assert!(f.has_advanced());
        assert_eq!(f.track(0, 11, None), Ok(Some(12)));
        assert_eq!(
            offsets(f.take_advanced()),
            [(0, 11)],
            "13 is not committed over the messages read again; 11 is, over a commit of 13 \
             already under way"
        );
        f.complete(0, 11);
        assert_eq!(offsets(f.take_advanced()), [(0, 12)]);
        assert_eq!(f.track(0, 12, None), Ok(None));
    }

    #[test]
    fn a_failed_commit_from_before_a_start_over_is_not_reported_again() {
        let mut f = Frontier::default();
        for offset in [10, 11, 12] {
            f.track(0, offset, None).unwrap();
            f.complete(0, offset);
        }
        let in_flight = f.take_advanced();
        assert_eq!(offsets(in_flight.clone()), [(0, 13)]);
        // The log was cut back: 11 and 12 are other messages now, read again.
        assert_eq!(f.track(0, 11, None), Ok(Some(12)));
        f.track(0, 12, None).unwrap();
        f.track(0, 13, None).unwrap();
        f.complete(0, 11);
        f.uncommitted(&in_flight);
        assert_eq!(
            offsets(f.take_advanced()),
            [(0, 12)],
            "the new 12 is not durable: 13 would skip it"
        );
        f.complete(0, 12);
        assert_eq!(offsets(f.take_advanced()), [(0, 13)]);
        f.uncommitted(&in_flight);
        assert_eq!(
            offsets(f.take_advanced()),
            [(0, 13)],
            "reported again once everything below it is durable"
        );
    }

    #[test]
    fn commits_only_up_to_the_first_message_not_yet_durable() {
        let mut f = Frontier::default();
        for offset in 10..15 {
            f.track(0, offset, None).unwrap();
        }
        f.complete(0, 12);
        f.complete(0, 13);
        assert_eq!(
            offsets(f.take_advanced()),
            [],
            "10 and 11 are not durable yet"
        );
        f.complete(0, 10);
        assert_eq!(offsets(f.take_advanced()), [(0, 11)]);
        f.complete(0, 11);
        assert_eq!(
            offsets(f.take_advanced()),
            [(0, 14)],
            "11, 12, 13 done: next to read is 14"
        );
        assert_eq!(f.pending(), 1);
        assert_eq!(offsets(f.take_advanced()), [], "reported once");
    }

    #[test]
    fn partitions_advance_independently() {
        let mut f = Frontier::default();
        f.track(0, 5, None).unwrap();
        f.track(1, 7, None).unwrap();
        f.track(0, 6, None).unwrap();
        f.complete(1, 7);
        f.complete(0, 6);
        assert_eq!(offsets(f.take_advanced()), [(1, 8)]);
        f.complete(0, 5);
        assert_eq!(offsets(f.take_advanced()), [(0, 7)]);
    }

    #[test]
    fn gaps_between_offsets_do_not_block_the_frontier() {
        let mut f = Frontier::default();
        f.track(0, 100, None).unwrap();
        f.track(0, 250, None).unwrap();
        f.complete(0, 100);
        f.complete(0, 250);
        assert_eq!(offsets(f.take_advanced()), [(0, 251)]);
    }

    #[test]
    fn unknown_completions_are_ignored_and_a_revoked_partition_is_forgotten_alone() {
        let mut f = Frontier::default();
        f.complete(3, 1);
        f.track(0, 1, None).unwrap();
        f.track(1, 7, None).unwrap();
        f.forget(&[0]);
        assert_eq!(f.pending(), 1);
        f.complete(0, 1);
        f.complete(1, 7);
        assert_eq!(
            offsets(f.take_advanced()),
            vec![(1, 8)],
            "only the kept partition commits"
        );
    }

    #[test]
    fn a_position_carries_the_epoch_of_the_message_before_it_and_none_after_a_start_over() {
        let mut f = Frontier::default();
        f.track(0, 10, Some(3)).unwrap();
        f.track(0, 11, Some(4)).unwrap();
        f.complete(0, 10);
        let first = f.take_advanced();
        assert_eq!(
            first,
            at(&[(0, 11)])
                .iter()
                .map(|p| Position {
                    leader_epoch: Some(3),
                    ..*p
                })
                .collect::<Vec<_>>()
        );
        f.complete(0, 11);
        let second = f.take_advanced();
        assert_eq!(second[0].leader_epoch, Some(4));
        // A failed commit reported again keeps its epoch; an older one does not overtake it.
        f.uncommitted(&second);
        f.uncommitted(&first);
        assert_eq!(f.take_advanced(), second);
        // Read again from 5 (the log cut back): the message before it was not read.
        assert_eq!(f.track(0, 5, Some(6)), Ok(Some(11)));
        assert_eq!(f.take_advanced(), at(&[(0, 5)]));
        f.complete(0, 5);
        assert_eq!(f.take_advanced()[0].leader_epoch, Some(6));
    }
}
