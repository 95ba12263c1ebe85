//! Analytics events to Kafka: billing outcomes, first-replay events and Issue Platform
//! occurrences, each to its configured topic as JSON with the key Sentry gives it. The write
//! returns only once every delivery is acknowledged.
//!
//! A message's events go out all or none. The last stage of a flush, this sink is the only one
//! that could be refused part of a message after the rest of it was delivered, and a re-drive
//! would then publish the delivered part again (a billing outcome counted twice). An event over
//! its topic's `max.message.bytes` (read from the brokers, [`TopicLimits`]) refuses its message
//! before any of them is sent.
//!
//! "First replay received" goes out once per project per process: projects are remembered in a
//! bounded FIFO set, and only after their event was delivered (a failed write retries it).

use clap::Args;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kafka::producer::Producer;

use super::publish::{Publisher, Record, TopicLimits, over_limit};
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
    /// Projects remembered as already announced; older ones may be announced again.
    #[arg(
        long,
        env = "REPLAY_INGEST_FIRST_REPLAY_CACHE_SIZE",
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

/// How old the topics' limits may be when a write starts: a limit changed at run time is taken up
/// within this.
const LIMITS_MAX_AGE: Duration = Duration::from_secs(300);

/// How old the limits may be when they refuse a message: older ones are read again first.
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
}

impl EventsSink {
    async fn publish_events<'a>(
        &'a self,
        batch: &'a [Entry],
        progress: &'a Progress<'_>,
    ) -> Result<Written, SinkError> {
        self.limits.refresh(LIMITS_MAX_AGE).await;
        let limits = self.limits.current();
        let mut announced = Vec::new();
        let (mut rage_clicks, mut hydration_errors) = (0, 0);
        // The topic and size of each event that refused its message for the topic's limit.
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
            // A message's events go out all or none: one its topic would refuse refuses the
            // message before any is sent, so that its re-drive sends none of them twice. Unless
            // an earlier attempt delivered some (a limit lowered since): the rest go out then.
            let refused = records.as_ref().ok().and_then(|records| {
                if records.iter().any(|r| progress.is_stored(r.piece)) {
                    return None;
                }
                let (record, (size, limit)) = records
                    .iter()
                    .find_map(|r| Some((r, over_limit(&limits, r)?)))?;
                over.push((record.topic, size));
                Some(SinkError::new(
                    self.name(),
                    Retry::Rejected,
                    format_args!(
                        "an event of {size} bytes (with the broker's framing) is over the max.message.bytes of {} ({limit}); none of the message's events was sent",
                        record.topic
                    ),
                ))
            });
            match (records, refused) {
                (Ok(records), None) => records.into_iter().map(Ok).collect(),
                (Err(refused), _) | (_, Some(refused)) => vec![Err(refused)],
            }
        });
        let published = self.publisher.publish(records, progress).await;
        // A refusal on limits read a while ago: read them again, and if the topic now takes what
        // was refused (an operator raised it, say, before re-driving), the flush retries.
        if !over.is_empty() && self.limits.refresh(LIMITS_RECHECK_AGE).await {
            let limits = self.limits.current();
            if over
                .iter()
                .any(|(topic, size)| limits.get(*topic).is_none_or(|limit| size <= limit))
            {
                return Err(SinkError::new(
                    self.name(),
                    Retry::Retryable,
                    "a topic's max.message.bytes changed since it was read: the events are sent again",
                ));
            }
        }
        let written = published?;
        metrics::occurrences_published(rage_clicks, hydration_errors);
        let mut seen = self.seen();
        for project in announced {
            seen.insert(project);
        }
        Ok(written)
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

    /// A write whose deliveries fail (no broker listens; each delivery times out after 200 ms,
    /// never sent) leaves the project unannounced, so that the flush's retry sends the event.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_first_replay_event_that_was_not_delivered_is_not_marked_as_sent() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", closed.to_string())
            .set("message.timeout.ms", "200")
            .clone();
        let topics = EventTopics {
            outcomes: "o".into(),
            analytics: "a".into(),
            issues: "i".into(),
        };
        let limits = Arc::new(TopicLimits::new(
            &config,
            vec![],
            Duration::from_millis(200),
        ));
        let sink = EventsSink::new(
            config.create().unwrap(),
            limits,
            topics,
            IssueGates::default(),
            16,
        );
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
