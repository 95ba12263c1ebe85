//! Baseline for the load run: a bare rdkafka consumer that reads `--count` messages from the
//! start of a topic and does nothing with them. Prints one JSON line: messages, bytes, seconds
//! and the CPU seconds the process spent (every thread, librdkafka's included), both counted from
//! the first message; and the same between the 10th and 90th percent of the messages (steady
//! state, without the fetch ramp-up and the tail).
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
    let (mut start, mut p10, mut p90) = (None, None, None);
    while messages < count {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            start.get_or_insert_with(|| (Instant::now(), cpu_seconds()));
            messages += 1;
            bytes += m.payload().map_or(0, |p| p.len() as u64);
            if messages == count / 10 {
                p10 = Some((Instant::now(), cpu_seconds(), messages));
            } else if messages == count * 9 / 10 {
                p90 = Some((Instant::now(), cpu_seconds(), messages));
            }
        }
    }
    let (seconds, cpu_seconds) = start.map_or((0.0, 0.0), |(s, cpu)| {
        (s.elapsed().as_secs_f64(), cpu_seconds() - cpu)
    });
    let (steady_messages, steady_seconds, steady_cpu_seconds) = match (p10, p90) {
        (Some((t1, c1, m1)), Some((t2, c2, m2))) => (m2 - m1, (t2 - t1).as_secs_f64(), c2 - c1),
        _ => (messages, seconds, cpu_seconds),
    };
    println!(
        "{{\"messages\":{messages},\"bytes\":{bytes},\"seconds\":{seconds},\"cpu_seconds\":{cpu_seconds},\
         \"steady_messages\":{steady_messages},\"steady_seconds\":{steady_seconds},\"steady_cpu_seconds\":{steady_cpu_seconds}}}"
    );
}

/// User + system CPU time of this process so far, from `/proc/self/stat` (Linux; clock ticks of
/// 1/100 s, the kernel's fixed `USER_HZ`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start at field 3; utime and stime are
    // fields 14 and 15.
    let after_name = &stat[stat.rfind(')').expect("stat has a command name") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}
