//! Whether the consumed topic is still the topic the member's partitions came from.
//!
//! A topic deleted and created again under its name is another topic: an id of its own, offsets
//! from 0, and no committed offsets (Kafka drops a deleted topic's). Under the consumer group
//! protocol of KIP-848 the broker revokes the old topic's partitions and assigns the new one's,
//! read from their start. Under the classic protocol the group's leader compares names and
//! partition counts only: a topic created again with as many partitions before the member's
//! metadata showed it gone (refreshed every 30 s) changes nothing it sees, no rebalance comes,
//! and librdkafka 2.12 goes on fetching the new topic from the old one's positions (its own
//! FIXME in `rd_kafka_topic_metadata_update`). The new topic's first messages were skipped, and
//! the positions past them committed, without a word.
//!
//! So a thread of its own asks the brokers for the topic's id (DescribeTopics, which READ on the
//! topic allows) as soon as the member owns partitions, then every [`EVERY`]. An id that changed while the member owned partitions, with
//! no revoke in between, stops the member: the pipeline gives everything up unflushed, the start
//! of every partition it owns is committed, and the next start reads the new topic from there
//! (what it read of it already is read again: at least once).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use tracing::{debug, warn};

use super::ownership::Ownership;

/// How often the topic's id is asked for.
pub const EVERY: Duration = Duration::from_secs(10);

/// How often the thread looks at whether the member owns partitions, and at `stop`.
const STEP: Duration = Duration::from_millis(250);

/// Longest an answer is waited for; a round without one is skipped.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A topic's id, as the brokers give it (a UUID), with its base64 form for the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicId {
    bits: (i64, i64),
    pub text: String,
}

/// The consumed topic found deleted and created again under the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recreated {
    pub topic: String,
    pub was: String,
    pub now: String,
}

/// What the member knows of its topic's id.
#[derive(Debug, Default)]
pub struct Watch {
    /// The id last seen, and the generation of the member's partitions it was seen in.
    known: Option<(TopicId, u64)>,
}

impl Watch {
    pub fn knows(&self) -> bool {
        self.known.is_some()
    }

    /// The member owns no partition: nothing to compare the next id with.
    pub fn forget(&mut self) {
        self.known = None;
    }

    /// The brokers said `id`; the member's partitions were of generation `asked_in` when it was
    /// asked for and `answered_in` when the answer came. `Some` when the topic changed under
    /// partitions the member owned throughout.
    pub fn answered(
        &mut self,
        id: TopicId,
        asked_in: u64,
        answered_in: u64,
    ) -> Option<(String, String)> {
        if asked_in != answered_in {
            // A revoke came meanwhile: which topic the answer describes is not known.
            self.known = None;
            return None;
        }
        match self.known.take() {
            Some((known, generation)) if generation == answered_in && known != id => {
                Some((known.text, id.text))
            }
            _ => {
                self.known = Some((id, answered_in));
                None
            }
        }
    }
}

/// Starts the thread that asks for `topic`'s id (at once when the member owns partitions and the
/// id is not known, then every [`EVERY`]) while `consumer` lives and `stop`
/// is not set, and calls `recreated` (once, then ends) when the topic changed under partitions
/// the member owned throughout. The thread holds the consumer only while it asks, and ends
/// within [`STEP`] of `stop`: the consumer's last handle must be dropped where it is closed
/// (dropped here after a close, rust-rdkafka logs an ERROR).
pub fn watch<C: ConsumerContext + 'static>(
    consumer: Weak<BaseConsumer<C>>,
    topic: String,
    ownership: Arc<Ownership>,
    stop: Arc<AtomicBool>,
    recreated: impl FnOnce(Recreated) + Send + 'static,
) -> Option<thread::JoinHandle<()>> {
    let run = move || {
        let mut watch = Watch::default();
        let (mut failing, mut asked_at) = (false, None::<Instant>);
        while !stop.load(Ordering::Acquire) {
            thread::sleep(STEP);
            if !ownership.owns_any() {
                watch.forget();
                continue;
            }
            // Learnt as soon as the member owns partitions, then asked every `EVERY`.
            if watch.knows() && asked_at.is_some_and(|at| at.elapsed() < EVERY) {
                continue;
            }
            asked_at = Some(Instant::now());
            let asked_in = ownership.generation();
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            let answer = topic_id(&consumer, &topic, TIMEOUT, &stop);
            drop(consumer);
            match answer {
                Ok(id) => {
                    failing = false;
                    if let Some((was, now)) = watch.answered(id, asked_in, ownership.generation()) {
                        recreated(Recreated { topic, was, now });
                        return;
                    }
                }
                // The topic deleted and not there yet, or the brokers out of reach: the next
                // round asks again.
                Err(error) if !failing => {
                    failing = true;
                    debug!(%error, %topic, "the consumed topic's id not known this round");
                }
                Err(_) => {}
            }
        }
    };
    thread::Builder::new()
        .name("kafka-topic-id".into())
        .spawn(run)
        .inspect_err(|error| warn!(%error, "cannot start the watch on the consumed topic's id: a topic deleted and created again under the member is not noticed"))
        .ok()
}

/// `topic`'s id, asked of the brokers through `consumer`'s client (DescribeTopics), waiting at
/// most `wait` for the answer, and no longer once `stop` is set.
pub fn topic_id<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<TopicId, String> {
    let name = CString::new(topic).map_err(|e| e.to_string())?;
    let client = consumer.client().native_ptr();
    let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: every object made here (the collection, the options, the queue, the event) is this
    // call's own and destroyed before it returns; the client lives as long as `consumer`. What
    // the result points to (descriptions, the id and its text) lives as long as the event, and
    // is copied before the event is destroyed.
    unsafe {
        let names = [name.as_ptr()];
        let topics = rdsys::rd_kafka_TopicCollection_of_topic_names(names.as_ptr().cast_mut(), 1);
        let options = rdsys::rd_kafka_AdminOptions_new(
            client,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as std::ffi::c_char; 256];
        rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options,
            wait_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let queue = rdsys::rd_kafka_queue_new(client);
        rdsys::rd_kafka_DescribeTopics(client, topics, options, queue);
        // In steps, so that a member stopping does not wait for the answer. An answer that comes
        // after the queue is destroyed is dropped by librdkafka.
        let asked = Instant::now();
        let mut event: *mut rdsys::rd_kafka_event_t = std::ptr::null_mut();
        while event.is_null() && !stop.load(Ordering::Acquire) && asked.elapsed() < wait + STEP {
            event = rdsys::rd_kafka_queue_poll(queue, STEP.as_millis() as i32);
        }
        let answer = if event.is_null() {
            Err("no answer in time".to_owned())
        } else {
            let answer = described(event);
            rdsys::rd_kafka_event_destroy(event);
            answer
        };
        rdsys::rd_kafka_queue_destroy(queue);
        rdsys::rd_kafka_AdminOptions_destroy(options);
        rdsys::rd_kafka_TopicCollection_destroy(topics);
        answer
    }
}

/// The id in a DescribeTopics answer of one topic.
///
/// # Safety
/// `event` is a live event of librdkafka's.
unsafe fn described(event: *mut rdsys::rd_kafka_event_t) -> Result<TopicId, String> {
    let text = |s: *const std::ffi::c_char| {
        if s.is_null() {
            String::new()
        } else {
            // SAFETY: librdkafka's strings are NUL-terminated and live as long as the event.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: the event is live (the caller's word); what it points to lives as long.
    unsafe {
        if rdsys::rd_kafka_event_error(event)
            != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            return Err(text(rdsys::rd_kafka_event_error_string(event)));
        }
        let result = rdsys::rd_kafka_event_DescribeTopics_result(event);
        if result.is_null() {
            return Err("not a DescribeTopics answer".to_owned());
        }
        let mut count = 0;
        let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        if descriptions.is_null() || count != 1 {
            return Err(format!("{count} topics described"));
        }
        let description = *descriptions;
        let error = rdsys::rd_kafka_TopicDescription_error(description);
        if !error.is_null()
            && rdsys::rd_kafka_error_code(error)
                != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            return Err(text(rdsys::rd_kafka_error_string(error)));
        }
        let id = rdsys::rd_kafka_TopicDescription_topic_id(description);
        if id.is_null() {
            return Err("no topic id".to_owned());
        }
        let bits = (
            rdsys::rd_kafka_Uuid_most_significant_bits(id),
            rdsys::rd_kafka_Uuid_least_significant_bits(id),
        );
        if bits == (0, 0) {
            return Err("no topic id (a broker before Kafka 2.8)".to_owned());
        }
        Ok(TopicId {
            bits,
            text: text(rdsys::rd_kafka_Uuid_base64str(id)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: i64) -> TopicId {
        TopicId {
            bits: (n, n),
            text: format!("id{n}"),
        }
    }

    #[test]
    fn a_changed_id_under_the_same_partitions_is_a_recreated_topic() {
        let mut watch = Watch::default();
        assert_eq!(watch.answered(id(1), 3, 3), None, "the first id is learnt");
        assert_eq!(watch.answered(id(1), 3, 3), None, "the same id");
        assert_eq!(
            watch.answered(id(2), 3, 3),
            Some(("id1".to_owned(), "id2".to_owned()))
        );
    }

    #[test]
    fn an_id_changed_across_a_revoke_is_learnt_not_reported() {
        let mut watch = Watch::default();
        watch.answered(id(1), 3, 3);
        // Revoked and assigned again (KIP-848's way with a topic created again, or the classic
        // protocol's once its metadata showed the topic gone): the partitions are the new
        // topic's, read from their start.
        assert_eq!(watch.answered(id(2), 4, 4), None);
        assert_eq!(watch.answered(id(2), 4, 4), None);
        // A revoke while the answer was awaited: the answer is not compared, nor kept.
        assert_eq!(watch.answered(id(3), 4, 5), None);
        assert_eq!(watch.answered(id(3), 5, 5), None, "learnt afresh");
        assert_eq!(
            watch.answered(id(4), 5, 5),
            Some(("id3".to_owned(), "id4".to_owned()))
        );
    }

    #[test]
    fn owning_nothing_forgets_the_id() {
        let mut watch = Watch::default();
        watch.answered(id(1), 3, 3);
        watch.forget();
        assert_eq!(watch.answered(id(2), 3, 3), None);
    }
}
