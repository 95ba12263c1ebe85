//! Where the group goes on reading a partition from: the offset it committed, with the leader
//! epoch of the message before it, and the check, once a member is assigned the partition, that
//! the log was not cut back below that offset.
//!
//! An unclean leader election (a replica that had not copied the last messages made leader,
//! where the topic's `unclean.leader.election.enable` allows it) cuts a partition's log back,
//! below offsets the group may have committed, and producers then write new messages at those
//! offsets again. A member starting at the committed offset skipped every new message between
//! the cut and it: 16 segments never stored, on Apache Kafka (`tests/it/kafka_cluster.rs`).
//! Kafka's answer (KIP-320) is the committed leader epoch: the member asks the leader where that
//! epoch ends in its log (OffsetsForLeaderEpoch) and, where it ends below the committed offset,
//! reads from there. librdkafka 2.12 commits an epoch it is given and checks a position sought
//! with one, but starts an assignment at the committed offset unchecked. So:
//! - every commit carries the epoch of the message before its offset ([`Position`],
//!   [`position_list`]);
//! - as partitions are assigned, the member reads their committed positions with their epochs
//!   ([`committed`]), one request to the group coordinator, at most [`COMMITTED_TIMEOUT`];
//! - at a partition's first message of the assignment, at the committed offset, it seeks the
//!   partition there with the epoch ([`Unchecked`]): librdkafka asks the leader, and goes on
//!   from the committed offset or, the log cut back, from where the epoch ends. The message is
//!   dropped, and comes again.
//!
//! What this does not catch: a committed offset past the end of the cut log when the member
//! starts (nothing written back up to it yet) is out of range, and librdkafka sets the partition
//! back to the log's start (`auto.offset.reset`) before any message comes: everything the log
//! holds is read again (written twice, nothing skipped). A commit made without an epoch (by a
//! release before this check, or after the partition's offsets went back) is read unchecked,
//! as before.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

/// A partition's position: the next offset to read and the leader epoch of the message before
/// it (`None` where not known: a broker that does not say, or a partition read again after its
/// offsets went back, whose message before was not read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: Option<i32>,
}

impl Position {
    /// A position whose epoch is not known.
    pub fn at(partition: i32, offset: i64) -> Position {
        Position {
            partition,
            offset,
            leader_epoch: None,
        }
    }
}

/// `positions` of `topic` as a list to commit or seek, each with its epoch where known.
pub fn position_list(topic: &str, positions: &[Position]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for position in positions {
        // Only fails for an invalid offset, and these are real message offsets + 1.
        let _ =
            list.add_partition_offset(topic, position.partition, Offset::Offset(position.offset));
    }
    for (i, position) in positions.iter().enumerate() {
        if let Some(epoch) = position.leader_epoch {
            // SAFETY: the list is this function's own, its `cnt` elements added above in order
            // (a partition given twice is two elements); the call sets a field of element `i`.
            unsafe {
                let list = list.ptr();
                if i < (*list).cnt as usize {
                    rdsys::rd_kafka_topic_partition_set_leader_epoch((*list).elems.add(i), epoch);
                }
            }
        }
    }
    list
}

/// The positions in `list` that have an offset (a partition without a commit has none), each
/// with its epoch where the list holds one.
fn positions_in(list: &TopicPartitionList) -> Vec<Position> {
    let mut positions = Vec::new();
    // SAFETY: the list is borrowed, alive and unchanged meanwhile; its `cnt` elements are read.
    unsafe {
        let list = list.ptr();
        for i in 0..(*list).cnt.max(0) as usize {
            let element = (*list).elems.add(i);
            if (*element).offset < 0
                || (*element).err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                continue;
            }
            let epoch = rdsys::rd_kafka_topic_partition_get_leader_epoch(element);
            positions.push(Position {
                partition: (*element).partition,
                offset: (*element).offset,
                leader_epoch: (epoch >= 0).then_some(epoch),
            });
        }
    }
    positions
}

/// How long the assignment's committed positions are waited for: one request to the group
/// coordinator, which has just answered the member. Past it the partitions are read unchecked
/// (a warning says so).
pub const COMMITTED_TIMEOUT: Duration = Duration::from_secs(5);

/// The committed positions of `partitions` (as assigned) that carry an epoch, read from the
/// group coordinator.
pub fn committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &TopicPartitionList,
) -> KafkaResult<Vec<Position>> {
    let mut asked = TopicPartitionList::new();
    for element in partitions.elements() {
        asked.add_partition(element.topic(), element.partition());
    }
    let answered = consumer.committed_offsets(asked, COMMITTED_TIMEOUT)?;
    Ok(positions_in(&answered)
        .into_iter()
        .filter(|p| p.leader_epoch.is_some())
        .collect())
}

/// The assignment's committed positions not yet checked against the log, and those sought to be
/// checked whose first message has not come yet.
#[derive(Debug, Default)]
pub struct Unchecked {
    committed: HashMap<i32, Position>,
    /// Partition → the committed offset it was sought to.
    sought: HashMap<i32, i64>,
}

/// What a partition's message means for the check of its committed position.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing to check: read it.
    Read,
    /// The partition's first message of the assignment, at its committed position: seek the
    /// partition there, with the epoch, and drop the message ([`Unchecked::sought`] once the
    /// seek is made).
    Seek(Position),
    /// The first message after the check, below the committed offset: the log no longer holds
    /// the committed position (cut back there, or the leader did not know the epoch and the
    /// partition was set back to its start). Read it.
    CutBack { committed: i64 },
    /// The partition's first message of the assignment, elsewhere than the committed position
    /// read: a commit came in between (its previous owner's last), or librdkafka reset the
    /// position (one past the log's end, to its start). Read it, unchecked.
    Elsewhere { committed: i64 },
}

impl Unchecked {
    /// Partitions were assigned, committed at `positions`.
    pub fn assigned(&mut self, positions: Vec<Position>) {
        for position in positions {
            self.sought.remove(&position.partition);
            self.committed.insert(position.partition, position);
        }
    }

    /// `partitions` leave the assignment.
    pub fn revoked(&mut self, partitions: &[i32]) {
        for partition in partitions {
            self.committed.remove(partition);
            self.sought.remove(partition);
        }
    }

    /// A message of `partition` at `offset` came.
    pub fn check(&mut self, partition: i32, offset: i64) -> Check {
        if self.committed.is_empty() && self.sought.is_empty() {
            return Check::Read;
        }
        if let Some(committed) = self.sought.remove(&partition) {
            return match offset < committed {
                true => Check::CutBack { committed },
                false => Check::Read,
            };
        }
        match self.committed.remove(&partition) {
            Some(position) if position.offset == offset => Check::Seek(position),
            Some(position) => Check::Elsewhere {
                committed: position.offset,
            },
            None => Check::Read,
        }
    }

    /// The partition was sought to `position` to be checked.
    pub fn sought(&mut self, position: Position) {
        self.sought.insert(position.partition, position.offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(partition: i32, offset: i64, epoch: i32) -> Position {
        Position {
            leader_epoch: Some(epoch),
            ..Position::at(partition, offset)
        }
    }

    #[test]
    fn a_list_carries_each_epoch_and_reads_back_as_given() {
        let positions = [epoch(0, 32, 4), Position::at(1, 7), epoch(2, 0, 0)];
        let list = position_list("t", &positions);
        assert_eq!(positions_in(&list), positions);
    }

    #[test]
    fn the_first_message_at_the_committed_offset_is_sought_and_the_next_tells_a_cut() {
        let mut unchecked = Unchecked::default();
        assert_eq!(unchecked.check(0, 5), Check::Read, "nothing assigned");
        unchecked.assigned(vec![epoch(0, 32, 4), epoch(1, 10, 4)]);
        assert_eq!(unchecked.check(0, 32), Check::Seek(epoch(0, 32, 4)));
        unchecked.sought(epoch(0, 32, 4));
        assert_eq!(
            unchecked.check(0, 16),
            Check::CutBack { committed: 32 },
            "came back below the committed offset"
        );
        assert_eq!(unchecked.check(0, 17), Check::Read, "told once");
        // Partition 1 starts elsewhere than its committed position: read, not sought.
        assert_eq!(unchecked.check(1, 12), Check::Elsewhere { committed: 10 });
        assert_eq!(unchecked.check(1, 10), Check::Read, "checked once");
    }

    #[test]
    fn a_check_that_comes_back_at_the_committed_offset_is_no_cut_and_revoked_ones_are_forgotten() {
        let mut unchecked = Unchecked::default();
        unchecked.assigned(vec![epoch(0, 32, 4), epoch(1, 10, 4)]);
        assert!(matches!(unchecked.check(0, 32), Check::Seek(_)));
        unchecked.sought(epoch(0, 32, 4));
        assert_eq!(unchecked.check(0, 32), Check::Read);
        unchecked.revoked(&[1]);
        assert_eq!(unchecked.check(1, 10), Check::Read, "no longer owned");
        // Assigned again: checked again.
        unchecked.assigned(vec![epoch(1, 10, 5)]);
        assert_eq!(unchecked.check(1, 10), Check::Seek(epoch(1, 10, 5)));
    }
}
