//! Creating topics as Sentry creates them: each with the settings sentry-kafka-schemas declares
//! for it (3.0.2, `topics/<name>.yaml`, `topic_creation_config`), so that the broker enforces the
//! same limits (`max.message.bytes`) as in production. For the tests and, through
//! `examples/topics.rs`, the demo and load runs. Test tooling: not part of the service.

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

/// The `topic_creation_config` of the Sentry topic `sentry_topic` (empty for a topic Sentry does
/// not declare, such as this service's dead-letter topic: the broker's defaults, 1 MiB).
pub fn sentry_topic_config(sentry_topic: &str) -> &'static [(&'static str, &'static str)] {
    match sentry_topic {
        "ingest-replay-recordings" => &[
            ("compression.type", "lz4"),
            ("retention.ms", "86400000"),
            ("max.message.bytes", "15000000"),
        ],
        "ingest-replay-events" => &[
            ("compression.type", "lz4"),
            ("message.timestamp.type", "LogAppendTime"),
            ("max.message.bytes", "10000000"),
            ("retention.ms", "86400000"),
        ],
        "outcomes-billing" => &[
            ("compression.type", "lz4"),
            ("retention.ms", "86400000"),
            ("segment.bytes", "262144000"),
        ],
        "ingest-occurrences" => &[("compression.type", "lz4"), ("retention.ms", "86400000")],
        "snuba-items" => &[
            ("compression.type", "lz4"),
            ("retention.ms", "86400000"),
            ("max.message.bytes", "10000000"),
            ("message.timestamp.type", "LogAppendTime"),
        ],
        _ => &[],
    }
}

/// Creates `name` with `partitions` partitions (one replica) and the settings of `sentry_topic`.
pub async fn create_topic_as(
    base: &ClientConfig,
    name: &str,
    partitions: i32,
    sentry_topic: &str,
) -> Result<(), String> {
    create_replicated_topic_as(base, name, (partitions, 1), sentry_topic).await
}

/// [`create_topic_as`] with `replicas` replicas of each partition (a cluster's brokers).
pub async fn create_replicated_topic_as(
    base: &ClientConfig,
    name: &str,
    (partitions, replicas): (i32, i32),
    sentry_topic: &str,
) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        base.create().map_err(|e| format!("admin client: {e}"))?;
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replicas));
    for (key, value) in sentry_topic_config(sentry_topic) {
        topic = topic.set(key, value);
    }
    let results = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .map_err(|e| format!("create_topics: {e}"))?;
    for result in results {
        result.map_err(|(topic, code)| format!("creating {topic}: {code:?}"))?;
    }
    Ok(())
}
