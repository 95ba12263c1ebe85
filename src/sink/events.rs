//! Analytics events to Kafka (SPEC §5.3): billing outcomes, first-replay events and rage-click /
//! hydration-error occurrences, each to its configured topic as JSON, keyed so one replay's
//! events share a partition. The write returns only once every delivery is acknowledged.
//!
//! "First replay received" goes out once per project per process: projects are remembered in a
//! bounded FIFO set, and only after their event was delivered (a failed write retries it).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use futures::future::join_all;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::runtime::Handle;

use super::{Batch, Sink, SinkError, Written};
use crate::kafka::classify_producer_error;
use crate::recording::{AnalyticsEvent, EventTopic};

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

pub struct EventsSink {
    producer: FutureProducer,
    topics: EventTopics,
    seen: Mutex<SeenProjects>,
    /// The producer waits on the runtime's timers when its queue is full.
    runtime: Handle,
}

impl EventsSink {
    /// Must be created inside the async runtime the writes will use.
    pub fn new(producer: FutureProducer, topics: EventTopics, first_replay_cache: usize) -> Self {
        let seen = SeenProjects { set: HashSet::new(), order: VecDeque::new(), capacity: first_replay_cache };
        EventsSink { producer, topics, seen: Mutex::new(seen), runtime: Handle::current() }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, SeenProjects> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Sink for EventsSink {
    fn name(&self) -> &'static str {
        "events"
    }

    fn write(&self, batch: &Batch) -> Result<Written, SinkError> {
        let mut announced = Vec::new();
        let events: Vec<&AnalyticsEvent> = {
            let seen = self.seen();
            batch
                .valid()
                .flat_map(|p| p.events.iter())
                .filter(|event| match event {
                    AnalyticsEvent::FirstReplay(first)
                        if seen.contains(first.project_id) || announced.contains(&first.project_id) =>
                    {
                        false
                    }
                    AnalyticsEvent::FirstReplay(first) => {
                        announced.push(first.project_id);
                        true
                    }
                    _ => true,
                })
                .collect()
        };
        let mut written = Written::default();
        let mut deliveries = Vec::with_capacity(events.len());
        for event in events {
            let (key, value) = (event.key(), event.to_json());
            written.items += 1;
            written.bytes += value.len() as u64;
            let topic = self.topics.name(event.topic());
            let producer = &self.producer;
            deliveries.push(async move {
                let record = FutureRecord::to(topic).key(&key).payload(&value);
                producer.send(record, Duration::from_secs(30)).await
            });
        }
        for delivery in self.runtime.block_on(join_all(deliveries)) {
            delivery.map_err(|(e, _)| SinkError::new(self.name(), classify_producer_error(&e), e))?;
        }
        let mut seen = self.seen();
        for project in announced {
            seen.insert(project);
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seen_set_is_bounded_and_forgets_the_oldest_first() {
        let mut seen = SeenProjects { set: HashSet::new(), order: VecDeque::new(), capacity: 2 };
        seen.insert(1);
        seen.insert(2);
        seen.insert(2);
        seen.insert(3);
        assert!(!seen.contains(1) && seen.contains(2) && seen.contains(3));
        assert_eq!(seen.order.len(), 2);
    }
}
