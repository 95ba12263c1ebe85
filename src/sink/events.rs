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

use super::{Entries, Entry, Retry, Sink, SinkError, Written};
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

    fn write(&self, batch: &[Entry]) -> Result<Written, SinkError> {
        let mut announced = Vec::new();
        let mut written = Written::default();
        let mut window = Vec::new();
        let mut window_bytes = 0;
        for processed in batch.valid() {
            for event in processed.events() {
                if let AnalyticsEvent::FirstReplay(first) = &event {
                    if self.seen().contains(first.project_id) || announced.contains(&first.project_id) {
                        continue;
                    }
                    announced.push(first.project_id);
                }
                let value = event.to_json().map_err(|e| SinkError::new(self.name(), Retry::Fatal, e))?;
                written.items += 1;
                written.bytes += value.len() as u64;
                window_bytes += value.len();
                let (topic, key) = (self.topics.name(event.topic()), event.key());
                let producer = &self.producer;
                window.push(async move {
                    let record = FutureRecord::<String, _>::to(topic).payload(&value);
                    let record = match &key {
                        Some(key) => record.key(key),
                        None => record,
                    };
                    producer.send(record, Duration::from_secs(30)).await
                });
                // Built events are held until delivered: await them in windows, not all at once.
                if window_bytes >= DELIVERY_WINDOW_BYTES {
                    self.deliver(std::mem::take(&mut window))?;
                    window_bytes = 0;
                }
            }
        }
        self.deliver(window)?;
        let mut seen = self.seen();
        for project in announced {
            seen.insert(project);
        }
        Ok(written)
    }
}

/// Bytes of event values awaiting delivery at once within one write.
const DELIVERY_WINDOW_BYTES: usize = 8 * 1024 * 1024;

impl EventsSink {
    /// Waits for every delivery; the first failure is the write's error.
    fn deliver<F, T>(&self, deliveries: Vec<F>) -> Result<(), SinkError>
    where
        F: std::future::Future<Output = Result<T, (rdkafka::error::KafkaError, rdkafka::message::OwnedMessage)>>,
    {
        for delivery in self.runtime.block_on(join_all(deliveries)) {
            delivery.map_err(|(e, _)| SinkError::new("events", classify_producer_error(&e), e))?;
        }
        Ok(())
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
