//! Creates topics as Sentry creates them (each with the settings sentry-kafka-schemas declares
//! for the Sentry topic it stands for), for the demo and load runs; test tooling, not part of the
//! service. Takes the service's Kafka flags (TLS, SASL) as well.
//!
//! ```sh
//! cargo run --example topics -- --brokers 127.0.0.1:9092 ingest-replay-recordings:4 load-1-dlq:1 load-1-outcomes:1:outcomes-billing
//! ```
//! Each topic is `NAME:PARTITIONS[:SENTRY_TOPIC]`; without the third part NAME is the Sentry
//! topic (a name Sentry does not declare gets the broker's defaults).

#[path = "../tests/support/topics.rs"]
mod topics;

use anyhow::{Context, bail};
use clap::Parser;
use replay_ingest::config::KafkaArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// `NAME:PARTITIONS[:SENTRY_TOPIC]`, one or more.
    #[arg(required = true)]
    topics: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.kafka.validate()?;
    let base = cli.kafka.client_config(&[])?;
    for spec in &cli.topics {
        let mut parts = spec.splitn(3, ':');
        let (Some(name), Some(partitions)) = (parts.next(), parts.next()) else {
            bail!("{spec:?} is not NAME:PARTITIONS[:SENTRY_TOPIC]");
        };
        let partitions: i32 = partitions
            .parse()
            .with_context(|| format!("partitions in {spec:?}"))?;
        let sentry_topic = parts.next().unwrap_or(name);
        topics::create_topic_as(&base, name, partitions, sentry_topic)
            .await
            .map_err(anyhow::Error::msg)?;
    }
    Ok(())
}
