//! Publishes message values (fixture files) to a topic, as the edge relay would, each copy with
//! a fresh `replay_id`, and prints a JSON summary (messages, bytes, seconds, last offset per
//! partition). For the demo and load runs (`scripts/demo.sh`, `scripts/load.sh`); test tooling,
//! not part of the service. Takes the service's Kafka flags (TLS, SASL) as well.
//!
//! ```sh
//! cargo run --release --example produce -- --brokers 127.0.0.1:9092 --topic T --count 1000 fixtures/segments/*.msgpack
//! ```

#[path = "../tests/support/load.rs"]
mod load;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use replay_ingest::config::{KafkaArgs, producer_properties};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(
        long,
        env = "REPLAY_INGEST_TOPIC",
        default_value = "ingest-replay-recordings"
    )]
    topic: String,
    /// Messages to publish, cycling through the files.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Messages per second, spread evenly; unset: as fast as the broker takes them.
    #[arg(long)]
    rate: Option<u64>,
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.kafka.validate()?;
    let values = cli
        .files
        .iter()
        .map(|f| std::fs::read(f).with_context(|| format!("reading {}", f.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let largest = values.iter().map(Vec::len).max().unwrap_or(0);
    let producer: rdkafka::producer::FutureProducer = cli
        .kafka
        .client_config(&producer_properties(largest, Duration::from_secs(30)))?
        .create()
        .context("creating the Kafka producer")?;
    let report = load::produce(&producer, &cli.topic, cli.count, cli.rate, |i| {
        (load::fixture_copy(&values, i), None)
    })
    .await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
