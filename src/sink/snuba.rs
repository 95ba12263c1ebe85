//! Rows through snuba (`--rows-sink snuba`): each segment's rows as the `ingest-replay-events`
//! messages Sentry publishes (`recording::snuba`), for an existing snuba replays consumer to
//! insert. The write returns once every message is acknowledged. A message the topic refuses
//! (over its `max.message.bytes`) is a rejection: the flush dead-letters that segment and
//! publishes the rest.

use crate::kafka::producer::Producer;

use super::publish::{Publisher, Record};
use super::{Built, Entry, Outcome, Piece, Progress, Retry, Sink, SinkError, Writing};
use crate::recording::snuba;

pub struct SnubaSink {
    publisher: Publisher,
    topic: String,
}

impl SnubaSink {
    pub fn new(producer: Producer, topic: impl Into<String>) -> Self {
        SnubaSink {
            publisher: Publisher::new(producer, "snuba"),
            topic: topic.into(),
        }
    }
}

impl Sink for SnubaSink {
    fn name(&self) -> &'static str {
        "snuba"
    }

    fn topics(&self) -> Vec<String> {
        vec![self.topic.clone()]
    }

    fn write<'a>(&'a self, batch: &'a [Entry], progress: &'a Progress) -> Writing<'a> {
        let records = batch.iter().flat_map(|entry| {
            let Outcome::Valid(processed) = &entry.outcome else {
                return Vec::new();
            };
            match snuba::messages(processed) {
                Ok(messages) => (0..)
                    .zip(messages)
                    .map(|(n, value)| {
                        Ok(Record {
                            piece: Piece::of(entry, n),
                            topic: &self.topic,
                            key: None,
                            value,
                        })
                    })
                    .collect(),
                Err(e) => vec![Err(SinkError::from_error(self.name(), Retry::Rejected, e))],
            }
        });
        Box::pin(self.publisher.publish(records, progress))
    }

    fn writes_for(&self, entry: &Entry) -> bool {
        matches!(&entry.outcome, Outcome::Valid(p) if p.has_rows())
    }
}

/// Rows published on `topic` for snuba. Its health check: the topic exists.
pub fn build(
    producer: &rdkafka::ClientConfig,
    topic: &str,
    timeout: std::time::Duration,
) -> Result<Built, SinkError> {
    let sink = SnubaSink::new(super::publish::producer(producer, "snuba")?, topic);
    let check = super::publish::topics_check(producer, vec![topic.to_owned()], timeout);
    // Its outage shows under its own name, as its writes' do.
    let what = sink.name();
    Ok(Built::checked(sink, what, "the Kafka topics", check))
}
