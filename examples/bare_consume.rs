//! Baseline for the load run: a bare rdkafka consumer that reads `--count` messages from the
//! start of a topic and does nothing with them. Prints one JSON line: messages, bytes, seconds.
//!
//! Usage: bare_consume BROKERS TOPIC COUNT

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, topic, count] = args.as_slice() else {
        eprintln!("usage: bare_consume BROKERS TOPIC COUNT");
        std::process::exit(2);
    };
    let count: u64 = count.parse().expect("COUNT is a number");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bare-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "33554432")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut start = None;
    while messages < count {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            start.get_or_insert_with(Instant::now);
            messages += 1;
            bytes += m.payload().map_or(0, |p| p.len() as u64);
        }
    }
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    println!("{{\"messages\":{messages},\"bytes\":{bytes},\"seconds\":{seconds}}}");
}
