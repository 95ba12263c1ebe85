//! Analytics events to Kafka: billing outcomes, first-replay events and Issue Platform
//! occurrences, each to its configured topic as JSON with the key Sentry gives it. The write
//! returns only once every delivery is acknowledged.
//!
//! A message's events go out all or none, as far as the topics' limits are known. This is the
//! one sink whose outputs a re-drive must not write twice (a billing outcome would count twice),
//! so part of a message delivered before the rest is refused is what it avoids: an event over its
//! topic's `max.message.bytes` (read from the brokers, [`TopicLimits`]) refuses its message
//! before any of them is sent. Left to the broker: topics whose limit could not be read, records
//! batched together over a limit below the producer's `batch.size`, and a refusal for anything
//! but size.
//!
//! "First replay received" goes out once per project per process: projects are remembered in a
//! bounded FIFO set, and only after their event was delivered (a failed write retries it). Two
//! flushes in flight at once (`--max-flushes-in-flight` above 1) can each send it: an extra
//! analytics event.

use clap::Args;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kafka::producer::Producer;

use super::publish::{LIMITS_MAX_AGE, Publisher, Record, TopicLimits, over_limit};
use super::{Built, Entry, Outcome, Piece, Progress, Retry, Sink, SinkError, Writing, Written};
use crate::metrics;
use crate::recording::occurrence::IssueKind;
use crate::recording::{AnalyticsEvent, EventTopic, IssueGates, ProjectFilter};

/// Analytics event topics.
#[derive(Args, Debug, Clone)]
pub struct EventsArgs {
    /// Billing outcomes (segment 0 of every replay): Sentry sends accepted outcomes to
    /// `outcomes-billing`.
    #[arg(
        long,
        env = "REPLAY_INGEST_OUTCOMES_TOPIC",
        default_value = "outcomes-billing"
    )]
    pub outcomes_topic: String,
    /// "First replay received" per project.
    #[arg(
        long,
        env = "REPLAY_INGEST_ANALYTICS_TOPIC",
        default_value = "replay-analytics"
    )]
    pub analytics_topic: String,
    /// Issue Platform occurrences for rage clicks and hydration errors (Sentry's occurrence
    /// consumer reads `ingest-occurrences`).
    #[arg(
        long,
        env = "REPLAY_INGEST_ISSUES_TOPIC",
        default_value = "ingest-occurrences"
    )]
    pub issues_topic: String,
    /// Projects whose rage clicks become issues: `off`, `all`, or project ids (`1,42`). Sentry's
    /// project option `sentry:replay_rage_click_issues`, on by default.
    #[arg(long, env = "REPLAY_INGEST_RAGE_CLICK_ISSUES", default_value = "all")]
    pub rage_click_issues: ProjectFilter,
    /// Projects whose hydration errors become issues: `off`, `all`, or project ids. Sentry's
    /// project option `sentry:replay_hydration_error_issues`, on by default.
    #[arg(
        long,
        env = "REPLAY_INGEST_HYDRATION_ERROR_ISSUES",
        default_value = "all"
    )]
    pub hydration_error_issues: ProjectFilter,
    /// Projects remembered as already announced; older ones may be announced again. At least 1:
    /// none remembered would announce every replay of every project.
    #[arg(
        long,
        env = "REPLAY_INGEST_FIRST_REPLAY_CACHE_SIZE",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000_000),
        default_value_t = 100_000
    )]
    pub first_replay_cache_size: usize,
}

impl EventsArgs {
    pub fn topics(&self) -> EventTopics {
        EventTopics {
            outcomes: self.outcomes_topic.clone(),
            analytics: self.analytics_topic.clone(),
            issues: self.issues_topic.clone(),
        }
    }

    pub fn issue_gates(&self) -> IssueGates {
        IssueGates {
            rage_clicks: self.rage_click_issues.clone(),
            hydration_errors: self.hydration_error_issues.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EventTopics {
    pub outcomes: String,
    pub analytics: String,
    pub issues: String,
}

impl EventTopics {
    fn name(&self, topic: EventTopic) -> &str {
        match topic {
            EventTopic::Outcomes => &self.outcomes,
            EventTopic::Analytics => &self.analytics,
            EventTopic::Issues => &self.issues,
        }
    }
}

/// Projects already announced, at most `capacity`, oldest forgotten first.
struct SeenProjects {
    set: HashSet<u64>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl SeenProjects {
    fn contains(&self, project: u64) -> bool {
        self.set.contains(&project)
    }

    fn insert(&mut self, project: u64) {
        if self.capacity == 0 || !self.set.insert(project) {
            return;
        }
        self.order.push_back(project);
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }
}

/// How old the limits may be when they have refused a message: older ones are read again, and
/// the batch passed over again if they changed.
const LIMITS_RECHECK_AGE: Duration = Duration::from_secs(1);

pub struct EventsSink {
    publisher: Publisher,
    /// Each topic's `max.message.bytes`, checked before any of a message's events is sent.
    limits: Arc<TopicLimits>,
    topics: EventTopics,
    issues: IssueGates,
    seen: Mutex<SeenProjects>,
}

impl EventsSink {
    pub fn new(
        producer: Producer,
        limits: Arc<TopicLimits>,
        topics: EventTopics,
        issues: IssueGates,
        first_replay_cache: usize,
    ) -> Self {
        let seen = SeenProjects {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity: first_replay_cache,
        };
        EventsSink {
            publisher: Publisher::new(producer, "events"),
            limits,
            topics,
            issues,
            seen: Mutex::new(seen),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, SeenProjects> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Sink for EventsSink {
    fn name(&self) -> &'static str {
        "events"
    }

    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        Box::pin(self.publish_events(batch, progress))
    }

    fn topics(&self) -> Vec<String> {
        let EventTopics {
            outcomes,
            analytics,
            issues,
        } = &self.topics;
        vec![outcomes.clone(), analytics.clone(), issues.clone()]
    }
}

/// What one pass over a batch published, and what it left out.
struct Pass {
    published: Result<Written, SinkError>,
    /// Projects whose first replay this pass announced (or found delivered before).
    announced: Vec<u64>,
    rage_clicks: u64,
    hydration_errors: u64,
    /// The topic and size of each event that refused its message under the topic's limit.
    over: Vec<(String, usize)>,
}

impl EventsSink {
    async fn publish_events<'a>(
        &'a self,
        batch: &'a [Entry],
        progress: &'a Progress<'_>,
    ) -> Result<Written, SinkError> {
        self.limits.refresh(LIMITS_MAX_AGE).await;
        // The read of the limits ended (it may take the sink's timeout): progress.
        progress.stepped();
        let mut pass = self.pass(batch, progress, &self.limits.current()).await;
        // A refusal on limits: they are read again unless read within the last second, and if
        // the topic now takes what was refused (an operator raised its limit before re-driving,
        // say), the batch is passed over once more; what the first pass delivered is not sent
        // again.
        if !pass.over.is_empty() {
            self.limits.refresh(LIMITS_RECHECK_AGE).await;
            let limits = self.limits.current();
            if pass
                .over
                .iter()
                .any(|(topic, size)| limits.get(topic).is_some_and(|l| size <= l))
            {
                pass = self.pass(batch, progress, &limits).await;
            }
        }
        let written = pass.published?;
        metrics::occurrences_published(pass.rage_clicks, pass.hydration_errors);
        let mut seen = self.seen();
        for project in pass.announced {
            seen.insert(project);
        }
        Ok(written)
    }

    /// Publishes the events of `batch` under `limits`.
    async fn pass(
        &self,
        batch: &[Entry],
        progress: &Progress<'_>,
        limits: &HashMap<String, usize>,
    ) -> Pass {
        let mut announced = Vec::new();
        let (mut rage_clicks, mut hydration_errors) = (0, 0);
        let mut over = Vec::new();
        let records = batch.iter().flat_map(|entry| {
            let events = match &entry.outcome {
                Outcome::Valid(processed) => processed.events(&self.issues),
                Outcome::Invalid(_) => Vec::new(),
            };
            // Numbered before any is left out, so that a retry names each event the same.
            let records: Result<Vec<Record>, SinkError> = (0..)
                .zip(events)
                .filter(|(_, event)| match event {
                    AnalyticsEvent::FirstReplay(first) => {
                        let new = !self.seen().contains(first.project_id)
                            && !announced.contains(&first.project_id);
                        if new {
                            announced.push(first.project_id);
                        }
                        new
                    }
                    AnalyticsEvent::Occurrence(o) => {
                        match o.kind {
                            IssueKind::RageClick => rage_clicks += 1,
                            IssueKind::HydrationError => hydration_errors += 1,
                        }
                        true
                    }
                    _ => true,
                })
                .map(|(n, event)| self.record(Piece::of(entry, n), event))
                .collect();
            let refused = records
                .as_ref()
                .ok()
                .and_then(|records| self.over_limits(records, limits, progress, &mut over));
            match (records, refused) {
                (Ok(records), None) => records.into_iter().map(Ok).collect(),
                (Err(refused), _) | (_, Some(refused)) => vec![Err(refused)],
            }
        });
        let published = self.publisher.publish(records, progress).await;
        Pass {
            published,
            announced,
            rage_clicks,
            hydration_errors,
            over,
        }
    }

    /// A message's events go out all or none: any its topic would refuse under `limits` refuses
    /// the message before one is sent, so that its re-drive sends none of them twice (each such
    /// event noted in `over`). Unless an earlier attempt delivered some (a limit lowered since):
    /// the rest go out then, and the broker decides.
    fn over_limits(
        &self,
        records: &[Record],
        limits: &HashMap<String, usize>,
        progress: &Progress<'_>,
        over: &mut Vec<(String, usize)>,
    ) -> Option<SinkError> {
        if records.iter().any(|r| progress.is_stored(r.piece)) {
            return None;
        }
        let mut refused = None;
        for record in records {
            if let Some((size, limit)) = over_limit(limits, record) {
                over.push((record.topic.to_owned(), size));
                refused.get_or_insert_with(|| {
                    SinkError::new(
                        self.name(),
                        Retry::Rejected,
                        format_args!(
                            "an event of {size} bytes (with the broker's framing) is over the max.message.bytes of {} ({limit}); none of the message's events was sent",
                            record.topic
                        ),
                    )
                });
            }
        }
        refused
    }

    /// The record of `event`, the `piece` of its message.
    fn record(&self, piece: Piece, event: AnalyticsEvent) -> Result<Record<'_>, SinkError> {
        let (topic, key) = (self.topics.name(event.topic()), event.key());
        let value = event
            .into_json()
            .map_err(|e| SinkError::from_error(self.name(), Retry::Rejected, e))?;
        Ok(Record {
            piece,
            topic,
            key,
            value,
        })
    }
}

/// Outcomes, analytics events and issue occurrences on `topics`. Its health check: the topics
/// exist.
pub fn build(
    producer: &rdkafka::ClientConfig,
    topics: EventTopics,
    issues: IssueGates,
    first_replay_cache: usize,
    timeout: std::time::Duration,
) -> Result<Built, SinkError> {
    let names = vec![
        topics.outcomes.clone(),
        topics.analytics.clone(),
        topics.issues.clone(),
    ];
    let limits = Arc::new(TopicLimits::new(producer, names.clone(), timeout));
    let sink = EventsSink::new(
        super::publish::producer(producer, "events")?,
        limits.clone(),
        topics,
        issues,
        first_replay_cache,
    );
    // The limits are read once the topics are found, so that the first flush finds them read.
    let mut exist = super::publish::topics_check(producer, names, timeout);
    let check: super::Check = Box::new(move || {
        let (exist, limits) = (exist(), limits.clone());
        Box::pin(async move {
            exist.await?;
            limits.refresh(Duration::ZERO).await;
            Ok(())
        })
    });
    // Its outage shows under its own name, as its writes' do.
    let what = sink.name();
    Ok(Built::checked(sink, what, "the Kafka topics", check))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{self, Limits};
    use crate::sink::{Batch, Outcome};

    /// A sink on topics `o`, `a` and `i` whose producer reaches no broker: each delivery times
    /// out after 200 ms, never sent.
    fn unconnected_sink() -> EventsSink {
        let config = crate::kafka::producer::unreachable(200);
        let topics = EventTopics {
            outcomes: "o".into(),
            analytics: "a".into(),
            issues: "i".into(),
        };
        let limits = TopicLimits::new(&config, vec![], Duration::from_millis(200));
        EventsSink::new(
            config.create().unwrap(),
            Arc::new(limits),
            topics,
            IssueGates::default(),
            16,
        )
    }

    #[tokio::test]
    async fn a_message_with_an_event_over_its_topics_limit_is_refused_whole_unless_part_was_delivered()
     {
        let sink = unconnected_sink();
        let status = crate::health::Status::default();
        let progress = Progress::new("events", &status);
        let record = |index, topic, bytes| Record {
            piece: Piece {
                partition: 0,
                offset: 7,
                index,
            },
            topic,
            key: None,
            value: vec![b'x'; bytes],
        };
        let message = [
            record(0, "o", 100),
            record(1, "i", 5000),
            record(2, "i", 6000),
        ];
        let limits = HashMap::from([("o".to_owned(), 1000), ("i".to_owned(), 2000)]);
        let mut over = Vec::new();
        let refused = sink.over_limits(&message, &limits, &progress, &mut over);
        assert_eq!(refused.map(|e| e.retry), Some(Retry::Rejected));
        assert_eq!(over, [("i".to_owned(), 5080), ("i".to_owned(), 6080)]);
        let unknown = HashMap::from([("o".to_owned(), 1000)]);
        assert!(
            sink.over_limits(&message, &unknown, &progress, &mut Vec::new())
                .is_none(),
            "a topic whose limit is not known is left to the broker"
        );
        progress.stored(message[0].piece);
        assert!(
            sink.over_limits(&message, &limits, &progress, &mut Vec::new())
                .is_none(),
            "part delivered: the rest goes out"
        );
    }

    /// A write whose deliveries fail (no broker listens; each delivery times out after 200 ms,
    /// never sent) leaves the project unannounced, so that the flush's retry sends the event.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_first_replay_event_that_was_not_delivered_is_not_marked_as_sent() {
        let sink = unconnected_sink();
        let segment_0 =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/segments"))
                .unwrap()
                .filter_map(|f| {
                    recording::process(
                        &std::fs::read(f.unwrap().path()).unwrap(),
                        &Limits::default(),
                    )
                    .ok()
                })
                .find(|p| p.ids.segment_id == 0)
                .unwrap();
        let project = segment_0.ids.project_id;
        let batch = Batch {
            entries: vec![Entry {
                partition: 0,
                offset: 0,
                outcome: Outcome::Valid(Box::new(segment_0)),
            }],
        };
        let status = crate::health::Status::default();
        let result = sink.write(&batch, &Progress::new("events", &status)).await;
        assert_eq!(result.unwrap_err().retry, Retry::Retryable);
        assert!(
            !sink.seen().contains(project),
            "announced although never delivered"
        );
    }

    #[test]
    fn the_seen_set_is_bounded_and_forgets_the_oldest_first() {
        let mut seen = SeenProjects {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity: 2,
        };
        seen.insert(1);
        seen.insert(2);
        seen.insert(2);
        seen.insert(3);
        assert!(!seen.contains(1) && seen.contains(2) && seen.contains(3));
        assert_eq!(seen.order.len(), 2);
    }
}
