//! Whether the topics the service uses are still the topics its Kafka clients first knew.
//!
//! A topic deleted and created again under its name is another topic: an id of its own, offsets
//! from 0, no committed offsets (Kafka drops a deleted topic's), and leader epochs from 0 again.
//! librdkafka 2.12 keeps what it knew of the old topic's partitions when it never saw the topic
//! gone (created again within a metadata refresh), and neither group protocol's rebalance
//! clears it:
//! - **Positions.** Under the classic protocol the group's leader compares names and partition
//!   counts only: no rebalance comes, and librdkafka goes on fetching the new topic from the old
//!   one's positions (its own FIXME in `rd_kafka_topic_metadata_update`). The new topic's first
//!   messages were skipped, and the positions past them committed, without a word.
//! - **Leader epochs.** A partition's leader epoch grows with every leader change (a broker
//!   restarted, a rolling upgrade); the new topic's start at 0, and librdkafka ignores metadata
//!   whose epoch is older than the one it keeps ("ignoring outdated metadata update", at DEBUG).
//!   On a cluster whose leaders had moved, a member under KIP-848's protocol, which the broker
//!   assigned the new topic's partitions by id, asked for their start again and again ("Leader
//!   epoch is newer than broker epoch") and read nothing, live and in its group; a producer
//!   writing to a topic created again timed out for ever. Only new clients get past it.
//!
//! So a thread of its own asks the brokers for the ids of the consumed topic and of every topic
//! the sinks write (DescribeTopics, which READ or WRITE on a topic allows) as soon as the
//! service starts, then every [`EVERY`]. An id is learnt from two answers in a row, and another
//! id, answered twice in a row, stops the service: the pipeline gives everything up unflushed,
//! the start of every partition of the consumed topic it owns is committed when that topic is
//! among those created again (or answered another id once, beside a written topic's change),
//! and the next start reads the new topic from there with new clients (what it read of it
//! already is read again: at least once).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use tracing::{debug, info, warn};

use super::ownership::Ownership;

/// How often the topics' ids are asked for.
pub const EVERY: Duration = Duration::from_secs(10);

/// How often the thread looks at `stop`.
const STEP: Duration = Duration::from_millis(250);

/// How soon a round that left an id unknown is made again (doubling up to [`EVERY`]).
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

/// One topic's id as the brokers answered, or why it is not known.
pub type Answer = (String, Result<TopicId, String>);

/// A topic the service uses found deleted and created again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recreated {
    pub topic: String,
    pub was: String,
    pub now: String,
    /// The consumed topic's name.
    pub consumed: String,
    /// When the consumed topic was found changed, or answered with another id once: the
    /// partitions of it the member owned then, whose start is committed. `None`: only a topic
    /// the sinks write.
    pub owned: Option<Vec<i32>>,
}

/// What the service knows of one topic's id.
#[derive(Debug, Default)]
pub struct Watch {
    /// The id learnt: the first answered twice in a row.
    known: Option<TopicId>,
    /// Another id, answered once: only a second answer with it counts, to learn it or as a
    /// change (a broker behind on the topic's metadata may answer with the id before).
    other: Option<TopicId>,
}

/// What an answer told a [`Watch`].
#[derive(Debug, PartialEq, Eq)]
pub enum Told {
    Nothing,
    /// The id, learnt (its text).
    Learnt(String),
    /// Another id than the one learnt, answered twice in a row: the old and new ids' text.
    Changed(String, String),
}

impl Watch {
    pub fn knows(&self) -> bool {
        self.known.is_some()
    }

    /// An id learnt, and another answered since the last answer with it.
    pub fn doubts(&self) -> bool {
        self.known.is_some() && self.other.is_some()
    }

    /// The brokers said `id`. Nothing starts the watch over — not a loss of partitions, not
    /// owning none: librdkafka keeps the old topic's partitions (their leader epochs) for as long
    /// as the client lives, whatever the member owns.
    pub fn answered(&mut self, id: TopicId) -> Told {
        if self.other.as_ref() == Some(&id) {
            return match &self.known {
                None => {
                    let text = id.text.clone();
                    (self.known, self.other) = (Some(id), None);
                    Told::Learnt(text)
                }
                Some(known) => Told::Changed(known.text.clone(), id.text),
            };
        }
        if self.known.as_ref() == Some(&id) {
            self.other = None;
        } else {
            self.other = Some(id);
        }
        Told::Nothing
    }
}

/// How long the ids may stay unknown before a WARN says which topics go unwatched.
const UNWATCHED_AFTER: Duration = Duration::from_secs(60);

/// Starts the thread that asks for the ids of `consumed` and of `written` (at once, then every
/// [`EVERY`]; sooner while one is not known) while `consumer` lives and `stop` is not set, and
/// calls `recreated` (once, then ends) when one changed. The thread holds the consumer only
/// while it asks, and ends within [`STEP`] of `stop`: the consumer's last handle must be dropped
/// where it is closed (dropped here after a close, rust-rdkafka logs an ERROR).
pub fn watch<C: ConsumerContext + 'static>(
    consumer: Weak<BaseConsumer<C>>,
    consumed: String,
    written: Vec<String>,
    ownership: Arc<Ownership>,
    stop: Arc<AtomicBool>,
    recreated: impl FnOnce(Recreated) + Send + 'static,
) -> Option<thread::JoinHandle<()>> {
    // A name librdkafka would refuse fails the whole request: left out.
    let mut topics: Vec<String> = std::iter::once(consumed.clone())
        .chain(written)
        .filter(|t| !t.is_empty() && !t.contains('\0'))
        .collect();
    topics.sort_unstable();
    topics.dedup();
    let run = move || {
        let mut watches: BTreeMap<String, Watch> = topics
            .iter()
            .map(|t| (t.clone(), Watch::default()))
            .collect();
        let (mut failing, mut asked_at, mut next) = (false, None::<Instant>, Duration::ZERO);
        let (started, mut warned) = (Instant::now(), false);
        while !stop.load(Ordering::Acquire) {
            if asked_at.is_some_and(|at: Instant| at.elapsed() < next) {
                thread::sleep(STEP);
                continue;
            }
            asked_at = Some(Instant::now());
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            let answers = topic_ids(&consumer, &topics, TIMEOUT, &stop);
            drop(consumer);
            let (mut unknown, mut changed) = (Vec::new(), Vec::new());
            for (topic, answer) in answers {
                let Some(watch) = watches.get_mut(&topic) else {
                    continue;
                };
                match answer.map(|id| watch.answered(id)) {
                    Ok(Told::Nothing) => {}
                    Ok(Told::Learnt(id)) => {
                        info!(%topic, %id, "a topic's id, watched: the topic deleted and created again under this process stops it");
                    }
                    Ok(Told::Changed(was, now)) => changed.push((topic, was, now)),
                    // The topic deleted and not there yet, not to be described, or the brokers
                    // out of reach: asked again.
                    Err(error) => unknown.push(format!("{topic}: {error}")),
                }
            }
            // Every answer of the round read first: the consumed topic, created again with a
            // written one, may come after it in the answer, or be one answer short of counting.
            if !changed.is_empty() {
                let consumed_changed = changed.iter().any(|(t, ..)| *t == consumed)
                    || watches.get(&consumed).is_some_and(Watch::doubts);
                let at = changed.iter().position(|(t, ..)| *t == consumed);
                let (topic, was, now) = changed.swap_remove(at.unwrap_or(0));
                recreated(Recreated {
                    topic,
                    was,
                    now,
                    consumed,
                    owned: consumed_changed.then(|| ownership.owned().into_iter().collect()),
                });
                return;
            }
            // Until every id is known, soon (in a second, doubling up to `EVERY`): one first
            // learnt after the topic was created again would be the new topic's.
            let unlearnt: Vec<&String> = watches
                .iter()
                .filter(|(_, w)| !w.knows())
                .map(|(t, _)| t)
                .collect();
            next = match (unlearnt.is_empty(), failing) {
                (true, _) => EVERY,
                (false, false) => FIRST_RETRY,
                (false, true) => (next * 2).min(EVERY),
            };
            if !unknown.is_empty() && !failing {
                debug!(?unknown, "topic ids not known this round");
            }
            failing = !unknown.is_empty();
            if !unlearnt.is_empty() && !warned && started.elapsed() >= UNWATCHED_AFTER {
                warned = true;
                warn!(topics = ?unlearnt, last = ?unknown, "these topics' ids are not known after a minute (DESCRIBE refused on them? a broker before Kafka 2.8?): one of them deleted and created again under the service would not be noticed; asked again every 10 s");
            }
        }
    };
    thread::Builder::new()
        .name("kafka-topic-id".into())
        .spawn(run)
        .inspect_err(|error| warn!(%error, "cannot start the watch on the topics' ids: a topic deleted and created again under the service is not noticed"))
        .ok()
}

/// Each of `topics`' ids (or why it is not known), asked of the brokers through `consumer`'s
/// client in one DescribeTopics, waiting at most `wait` for the answer, and no longer once `stop`
/// is set. The answer is a Metadata response, which librdkafka also takes into the consumer's
/// own view of the topics (as its own refresh would: creating nothing, starting no rebalance).
pub fn topic_ids<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[String],
    wait: Duration,
    stop: &AtomicBool,
) -> Vec<Answer> {
    let unanswered = |why: &str| {
        topics
            .iter()
            .map(|t| (t.clone(), Err(why.to_owned())))
            .collect()
    };
    let Ok(names) = topics
        .iter()
        .map(|t| CString::new(t.as_str()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return unanswered("a topic name holds a NUL byte");
    };
    let client = consumer.client().native_ptr();
    let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: every object made here (the collection, the options, the queue, the event) is this
    // call's own and destroyed before it returns; the client lives as long as `consumer`, the
    // names as long as the call. What the result points to (descriptions, the ids and their
    // text) lives as long as the event, and is copied before the event is destroyed.
    unsafe {
        let mut pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let collection =
            rdsys::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
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
        rdsys::rd_kafka_DescribeTopics(client, collection, options, queue);
        // In steps, so that a member stopping does not wait for the answer. An answer that comes
        // after the queue is destroyed is dropped by librdkafka.
        let asked = Instant::now();
        let mut event: *mut rdsys::rd_kafka_event_t = std::ptr::null_mut();
        while event.is_null() && !stop.load(Ordering::Acquire) && asked.elapsed() < wait + STEP {
            event = rdsys::rd_kafka_queue_poll(queue, STEP.as_millis() as i32);
        }
        let answers = if event.is_null() {
            unanswered("no answer in time")
        } else {
            let answers = described(event).unwrap_or_else(|why| unanswered(&why));
            rdsys::rd_kafka_event_destroy(event);
            answers
        };
        rdsys::rd_kafka_queue_destroy(queue);
        rdsys::rd_kafka_AdminOptions_destroy(options);
        rdsys::rd_kafka_TopicCollection_destroy(collection);
        answers
    }
}

/// Each topic's id in a DescribeTopics answer (or why it has none); `Err` when the whole
/// request failed.
///
/// # Safety
/// `event` is a live event of librdkafka's.
unsafe fn described(event: *mut rdsys::rd_kafka_event_t) -> Result<Vec<Answer>, String> {
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
        if descriptions.is_null() {
            return Err("no descriptions".to_owned());
        }
        let mut answers = Vec::with_capacity(count);
        for &description in std::slice::from_raw_parts(descriptions, count) {
            if description.is_null() {
                continue;
            }
            let name = text(rdsys::rd_kafka_TopicDescription_name(description));
            let error = rdsys::rd_kafka_TopicDescription_error(description);
            if !error.is_null()
                && rdsys::rd_kafka_error_code(error)
                    != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                answers.push((name, Err(text(rdsys::rd_kafka_error_string(error)))));
                continue;
            }
            let id = rdsys::rd_kafka_TopicDescription_topic_id(description);
            let bits = (!id.is_null()).then(|| {
                (
                    rdsys::rd_kafka_Uuid_most_significant_bits(id),
                    rdsys::rd_kafka_Uuid_least_significant_bits(id),
                )
            });
            answers.push(match bits {
                None | Some((0, 0)) => (
                    name,
                    Err("no topic id (a broker before Kafka 2.8)".to_owned()),
                ),
                Some(bits) => (
                    name,
                    Ok(TopicId {
                        bits,
                        text: text(rdsys::rd_kafka_Uuid_base64str(id)),
                    }),
                ),
            });
        }
        Ok(answers)
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

    fn changed(was: i64, now: i64) -> Told {
        Told::Changed(format!("id{was}"), format!("id{now}"))
    }

    fn learnt(watch: &mut Watch, n: i64) {
        assert_eq!(watch.answered(id(n)), Told::Nothing);
        assert_eq!(watch.answered(id(n)), Told::Learnt(format!("id{n}")));
    }

    #[test]
    fn an_id_is_learnt_from_two_answers_in_a_row() {
        let mut watch = Watch::default();
        assert_eq!(watch.answered(id(1)), Told::Nothing);
        assert_eq!(
            watch.answered(id(2)),
            Told::Nothing,
            "a broker behind answered another"
        );
        assert!(!watch.knows());
        assert_eq!(watch.answered(id(2)), Told::Learnt("id2".into()));
        assert!(watch.knows());
    }

    #[test]
    fn another_id_answered_twice_in_a_row_is_a_recreated_topic() {
        let mut watch = Watch::default();
        learnt(&mut watch, 1);
        assert_eq!(watch.answered(id(1)), Told::Nothing, "the same id");
        assert_eq!(watch.answered(id(2)), Told::Nothing, "another, once");
        assert!(watch.doubts());
        assert_eq!(watch.answered(id(2)), changed(1, 2));
    }

    #[test]
    fn an_old_id_from_a_broker_behind_is_not_a_change() {
        let mut watch = Watch::default();
        learnt(&mut watch, 1);
        assert_eq!(watch.answered(id(2)), Told::Nothing);
        assert_eq!(watch.answered(id(1)), Told::Nothing, "the known id again");
        assert!(!watch.doubts());
        assert_eq!(
            watch.answered(id(2)),
            Told::Nothing,
            "the other id needs two in a row"
        );
        assert_eq!(watch.answered(id(2)), changed(1, 2));
    }

    #[test]
    fn the_id_learnt_is_the_one_compared_with() {
        let mut watch = Watch::default();
        learnt(&mut watch, 1);
        watch.answered(id(2));
        assert_eq!(
            watch.answered(id(3)),
            Told::Nothing,
            "another other: once again"
        );
        assert_eq!(watch.answered(id(3)), changed(1, 3));
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
