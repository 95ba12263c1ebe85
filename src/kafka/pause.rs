//! Which partitions intake's pause holds (see `kafka::consumer`).
//!
//! A partition is paused only once it has delivered a message in its assignment: before that,
//! librdkafka 2.12 may still be looking up where it begins (a partition without a commit starts
//! where `auto.offset.reset` says, found with a ListOffsets request). A pause and resume
//! meanwhile make that answer outdated, and the resume, finding no position to go on from,
//! starts a second lookup beside it. The outdated answer arms a retry of the lookup
//! (`rd_kafka_toppar_handle_Offset` → `rd_kafka_toppar_offset_retry`) that the second answer
//! does not disarm: it fires once the partition is being read, and sets it back to the log's
//! start (reproduced on Apache Kafka, `tests/it/intake_pause.rs`). The member read the partition
//! a second time from there: its blobs, rows and billing outcomes again. Pausing a partition
//! that has delivered a message pins where it goes on to the message after that one, so its
//! resume never starts a lookup.
//!
//! So while intake is paused a partition that has delivered nothing yet goes on fetching, and is
//! paused as soon as its first message comes — and set back to that message, which it delivers
//! again once intake resumes, so that the polling thread holds no more than before.

use std::collections::BTreeSet;

/// Intake's pause over the assigned partitions, and which of them it holds paused in librdkafka.
/// Each change is applied through a closure that asks librdkafka (given the partitions to pause
/// or resume); when that fails nothing changes here, and the caller tries again later.
#[derive(Debug, Default)]
pub struct IntakePause {
    on: bool,
    paused: BTreeSet<i32>,
}

impl IntakePause {
    /// Intake pauses: `placed`, the assigned partitions that have delivered a message in their
    /// assignment, are paused through `apply`.
    pub fn pause<E>(
        &mut self,
        placed: impl IntoIterator<Item = i32>,
        apply: impl FnOnce(&[i32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let placed: Vec<i32> = placed.into_iter().collect();
        apply(&placed)?;
        self.on = true;
        self.paused.extend(placed);
        Ok(())
    }

    /// Intake resumes: every partition it paused is resumed through `apply`.
    pub fn resume<E>(&mut self, apply: impl FnOnce(&[i32]) -> Result<(), E>) -> Result<(), E> {
        let paused: Vec<i32> = self.paused.iter().copied().collect();
        apply(&paused)?;
        self.on = false;
        self.paused.clear();
        Ok(())
    }

    /// A message of `partition` was delivered: while intake is paused, the partition is paused
    /// through `apply` if it is not yet. `true`: it was, now.
    pub fn delivered<E>(
        &mut self,
        partition: i32,
        apply: impl FnOnce(&[i32]) -> Result<(), E>,
    ) -> Result<bool, E> {
        if !self.on || self.paused.contains(&partition) {
            return Ok(false);
        }
        apply(&[partition])?;
        self.paused.insert(partition);
        Ok(true)
    }

    /// `partitions` leave the assignment: those paused are resumed through `apply` — librdkafka
    /// keeps a partition's pause flag, so one given up paused would come back paused — and
    /// forgotten, whatever `apply` says (the caller reports a failure).
    pub fn revoked<E>(
        &mut self,
        partitions: &[i32],
        apply: impl FnOnce(&[i32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let paused: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| self.paused.remove(p))
            .collect();
        if paused.is_empty() {
            return Ok(());
        }
        apply(&paused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what each call asked librdkafka, answering `Err` while `fail` is set.
    #[derive(Default)]
    struct Calls {
        asked: Vec<Vec<i32>>,
        fail: bool,
    }

    impl Calls {
        fn apply(&mut self) -> impl FnOnce(&[i32]) -> Result<(), ()> + '_ {
            |partitions| {
                self.asked.push(partitions.to_vec());
                if self.fail { Err(()) } else { Ok(()) }
            }
        }
    }

    #[test]
    fn only_partitions_that_delivered_a_message_pause_and_the_others_pause_at_their_first() {
        let (mut pause, mut calls) = (IntakePause::default(), Calls::default());
        // Partitions 0–2 assigned; 1 and 2 delivered a message, 0 is still looking up its start.
        pause.pause([1, 2], calls.apply()).unwrap();
        // A message of a paused partition (fetched before its pause) asks nothing more.
        assert!(!pause.delivered(1, calls.apply()).unwrap());
        assert!(pause.delivered(0, calls.apply()).unwrap());
        assert!(!pause.delivered(0, calls.apply()).unwrap());
        pause.resume(calls.apply()).unwrap();
        // While intake runs, a message pauses nothing.
        assert!(!pause.delivered(3, calls.apply()).unwrap());
        assert_eq!(calls.asked, [vec![1, 2], vec![0], vec![0, 1, 2]]);
    }

    #[test]
    fn a_failed_call_changes_nothing_so_that_it_is_tried_again() {
        let (mut pause, mut calls) = (IntakePause::default(), Calls::default());
        calls.fail = true;
        assert!(pause.pause([1], calls.apply()).is_err());
        calls.fail = false;
        // Intake did not pause: a message pauses nothing.
        assert!(!pause.delivered(3, calls.apply()).unwrap());
        pause.pause([1], calls.apply()).unwrap();
        calls.fail = true;
        assert!(pause.delivered(2, calls.apply()).is_err());
        assert!(pause.resume(calls.apply()).is_err());
        calls.fail = false;
        // Intake is still paused: partition 2's next message pauses it.
        assert!(pause.delivered(2, calls.apply()).unwrap());
        pause.resume(calls.apply()).unwrap();
        assert_eq!(
            calls.asked,
            [vec![1], vec![1], vec![2], vec![1], vec![2], vec![1, 2]]
        );
    }

    #[test]
    fn partitions_given_up_are_resumed_if_paused_and_forgotten() {
        let (mut pause, mut calls) = (IntakePause::default(), Calls::default());
        pause.pause([0, 1], calls.apply()).unwrap();
        pause.revoked(&[1, 2], calls.apply()).unwrap();
        // Nothing of these was paused: librdkafka is not asked.
        pause.revoked(&[2, 3], calls.apply()).unwrap();
        // Given up even when the resume fails: the partition is no longer this member's.
        calls.fail = true;
        assert!(pause.revoked(&[0], calls.apply()).is_err());
        calls.fail = false;
        // Partition 1 came back and delivered a message: intake is still paused, so it pauses.
        assert!(pause.delivered(1, calls.apply()).unwrap());
        pause.resume(calls.apply()).unwrap();
        assert_eq!(
            calls.asked,
            [vec![0, 1], vec![1], vec![0], vec![1], vec![1]]
        );
    }
}
