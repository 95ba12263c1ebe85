//! Baseline for the Kafka sinks' ceiling: a bare producer that publishes COUNT records — the
//! analytics events, outcomes and occurrences the service builds from the recorded fixtures,
//! cycled — to `PREFIX-outcomes`, `PREFIX-analytics` and `PREFIX-issues`, with the service's
//! producer settings (`config::producer_properties`: acks=all, linger 5 ms) and the service's
//! delivery window (every record sent, awaited in windows of `DELIVERY_WINDOW_BYTES`), and
//! nothing else. With BATCH > 0, records are also awaited every BATCH records, as a flush awaits
//! its own: the ceiling at the service's flush size. Prints one JSON line: records, bytes,
//! seconds, records per second.
//!
//! With `--trace-items`, the records are the EAP trace items the fixtures make at rollout 1.0
//! (every breadcrumb an item), without a key, to `PREFIX-items`: the trace-items sink's ceiling.
//!
//! Usage: bare_produce [--trace-items] BROKERS PREFIX COUNT BATCH FILE...

use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use replay_ingest::config::producer_properties;
use replay_ingest::recording::{self, EventTopic, Limits, Rollout};
use replay_ingest::sink::publish::DELIVERY_WINDOW_BYTES;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace_items = args.get(1).is_some_and(|a| a == "--trace-items");
    let args = args.get(usize::from(trace_items)..).unwrap_or_default();
    let [_, brokers, prefix, count, batch, files @ ..] = args else {
        eprintln!("usage: bare_produce [--trace-items] BROKERS PREFIX COUNT BATCH FILE...");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("COUNT is a number");
    let batch: usize = batch.parse().expect("BATCH is a number");
    let limits = Limits {
        trace_items: if trace_items {
            Rollout::new(1.0).expect("a share")
        } else {
            Rollout::OFF
        },
        ..Limits::default()
    };
    let processed = files
        .iter()
        .filter_map(|f| recording::process(&std::fs::read(f).ok()?, &limits).ok());
    let records: Vec<(String, Option<String>, Vec<u8>)> = if trace_items {
        processed
            .filter_map(|p| p.trace_items)
            .flat_map(|items| {
                items
                    .iter()
                    .map(|(_, bytes)| (format!("{prefix}-items"), None, bytes.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    } else {
        processed
            .flat_map(|p| p.events(&Default::default()))
            .map(|event| {
                let topic = match event.topic() {
                    EventTopic::Outcomes => format!("{prefix}-outcomes"),
                    EventTopic::Analytics => format!("{prefix}-analytics"),
                    EventTopic::Issues => format!("{prefix}-issues"),
                };
                let key = event.key();
                (topic, key, event.into_json().expect("an event serialises"))
            })
            .collect()
    };
    assert!(!records.is_empty(), "no records among the files");
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in producer_properties(15_000_000, Duration::from_secs(30)) {
        config.set(key, value);
    }
    let producer: FutureProducer = config.create().expect("producer");

    let start = Instant::now();
    let (mut bytes, mut window, mut window_bytes) = (0usize, Vec::new(), 0usize);
    for (n, (topic, key, value)) in records.iter().cycle().take(count).enumerate() {
        let mut record = FutureRecord::to(topic).payload(value);
        if let Some(key) = key {
            record = record.key(key);
        }
        window.push(producer.send(record, Duration::from_secs(30)));
        window_bytes += value.len();
        bytes += value.len();
        if window_bytes >= DELIVERY_WINDOW_BYTES || (batch > 0 && (n + 1) % batch == 0) {
            for delivery in join_all(window.drain(..)).await {
                delivery.expect("delivered");
            }
            window_bytes = 0;
        }
    }
    for delivery in join_all(window).await {
        delivery.expect("delivered");
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"records\":{count},\"bytes\":{bytes},\"seconds\":{seconds:.3},\"per_second\":{:.0}}}",
        count as f64 / seconds
    );
}
