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
use tracing::{debug, info, warn};

use super::ownership::Ownership;

/// How often the topic's id is asked for.
pub const EVERY: Duration = Duration::from_secs(10);

/// How often the thread looks at whether the member owns partitions, and at `stop`.
const STEP: Duration = Duration::from_millis(250);

/// How soon a first ask that failed is made again (doubling up to [`EVERY`]).
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Longest an answer is waited for; a round without one is skipped.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A topic's id, as the brokers give it (a UUID), with its base64 form for the logs.
#[derive(Debug, Clone)]
pub struct TopicId {
    bits: (i64, i64),
    pub text: String,
}

impl PartialEq for TopicId {
    fn eq(&self, other: &Self) -> bool {
        self.bits == other.bits
    }
}

/// The consumed topic found deleted and created again under the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recreated {
    pub topic: String,
    pub was: String,
    pub now: String,
    /// The partitions the member owned when it found out.
    pub partitions: Vec<i32>,
}

/// What the member knows of its topic's id.
#[derive(Debug, Default)]
pub struct Watch {
    /// The id last seen, and the member's last loss (`Ownership::last_loss`) when it was seen.
    known: Option<(TopicId, u64)>,
    /// Another id, answered once: only a second answer with it counts (a broker behind on the
    /// topic's metadata may answer with the id before).
    other: Option<TopicId>,
}

impl Watch {
    pub fn knows(&self) -> bool {
        self.known.is_some()
    }

    /// The member owns no partition: nothing to compare the next id with.
    pub fn forget(&mut self) {
        *self = Watch::default();
    }

    /// The brokers said `id`, the member's last loss being `loss` throughout. `Some((was, now))`
    /// when a second answer confirms another id, with no loss since the first was seen. A loss
    /// (the partitions taken from the member, the classic protocol's way with a topic it saw
    /// deleted) starts over: what the member owns after it begins at the group's commits, which
    /// Kafka dropped with the deleted topic. A plain revoke does not: with the classic protocol
    /// its drain commits the old topic's positions on the new one, and the partitions' next
    /// owner would begin there.
    pub fn answered(&mut self, id: TopicId, loss: u64) -> Option<(String, String)> {
        let Some((known, _)) = self.known.as_ref().filter(|(_, at)| *at == loss) else {
            *self = Watch {
                known: Some((id, loss)),
                other: None,
            };
            return None;
        };
        if *known == id {
            self.other = None;
            return None;
        }
        if self.other.as_ref() == Some(&id) {
            return Some((known.text.clone(), id.text));
        }
        self.other = Some(id);
        None
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
        let (mut failing, mut asked_at, mut next) = (false, None::<Instant>, EVERY);
        while !stop.load(Ordering::Acquire) {
            thread::sleep(STEP);
            let owned = ownership.owned();
            if owned.is_empty() {
                watch.forget();
                asked_at = None;
                continue;
            }
            // Asked as soon as the member owns partitions, then every `EVERY`.
            if asked_at.is_some_and(|at| at.elapsed() < next) {
                continue;
            }
            asked_at = Some(Instant::now());
            let loss = ownership.last_loss();
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            let answer = topic_id(&consumer, &topic, TIMEOUT, &stop);
            drop(consumer);
            match answer {
                // A loss meanwhile: which partitions the answer speaks for is not known.
                Ok(_) if ownership.last_loss() != loss => {
                    watch.forget();
                    next = FIRST_RETRY;
                }
                Ok(id) => {
                    (failing, next) = (false, EVERY);
                    let (learning, text) = (!watch.knows(), id.text.clone());
                    if let Some((was, now)) = watch.answered(id, loss) {
                        let partitions = owned.into_iter().collect();
                        recreated(Recreated {
                            topic,
                            was,
                            now,
                            partitions,
                        });
                        return;
                    }
                    if learning && watch.knows() {
                        info!(%topic, id = %text, "the consumed topic's id, watched: a topic deleted and created again under this member stops it");
                    }
                }
                // The topic deleted and not there yet, or the brokers out of reach: asked again.
                // Until an id is known, soon (in a second, doubling up to `EVERY`): one first
                // learnt after the topic was created again would be the new topic's.
                Err(error) => {
                    next = match (watch.knows(), failing) {
                        (true, _) => EVERY,
                        (false, false) => FIRST_RETRY,
                        (false, true) => (next * 2).min(EVERY),
                    };
                    if !failing {
                        failing = true;
                        debug!(%error, %topic, "the consumed topic's id not known this round");
                    }
                }
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
/// most `wait` for the answer, and no longer once `stop` is set. The answer is a Metadata
/// response, which librdkafka also takes into the consumer's own view of the topic (as its own
/// refresh would: creating nothing, starting no rebalance).
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
        if description.is_null() {
            return Err("no description".to_owned());
        }
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

    fn changed(was: i64, now: i64) -> Option<(String, String)> {
        Some((format!("id{was}"), format!("id{now}")))
    }

    #[test]
    fn another_id_answered_twice_with_no_loss_between_is_a_recreated_topic() {
        let mut watch = Watch::default();
        assert_eq!(watch.answered(id(1), 0), None, "the first id is learnt");
        assert_eq!(watch.answered(id(1), 0), None, "the same id");
        assert_eq!(watch.answered(id(2), 0), None, "another, once");
        assert_eq!(watch.answered(id(2), 0), changed(1, 2));
    }

    #[test]
    fn an_old_id_from_a_broker_behind_is_not_a_change() {
        let mut watch = Watch::default();
        watch.answered(id(1), 0);
        assert_eq!(watch.answered(id(2), 0), None);
        assert_eq!(watch.answered(id(1), 0), None, "the known id again");
        assert_eq!(
            watch.answered(id(2), 0),
            None,
            "the other id needs two in a row"
        );
        assert_eq!(watch.answered(id(2), 0), changed(1, 2));
    }

    #[test]
    fn a_loss_or_owning_nothing_starts_over_and_a_revoke_does_not() {
        let mut watch = Watch::default();
        watch.answered(id(1), 0);
        // Lost (the classic protocol's way with a topic it saw deleted): what the member owns
        // next begins at the group's commits, which the deletion dropped.
        assert_eq!(watch.answered(id(2), 3), None);
        assert_eq!(watch.answered(id(2), 3), None, "learnt afresh");
        watch.forget();
        assert_eq!(watch.answered(id(3), 3), None);
        assert_eq!(watch.answered(id(3), 3), None, "learnt afresh");
        // A plain revoke leaves the loss where it was: still compared.
        assert_eq!(watch.answered(id(4), 3), None);
        assert_eq!(watch.answered(id(4), 3), changed(3, 4));
    }

    #[test]
    fn ids_compare_by_their_bits_alone() {
        let unnamed = TopicId {
            bits: (1, 1),
            text: String::new(),
        };
        assert_eq!(unnamed, id(1));
    }
}
