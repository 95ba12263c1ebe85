//! Publishes message values (fixture files) to a topic, as the edge relay would — for the tests
//! and, through `examples/produce.rs`, the demo and load runs. Test tooling: not part of the
//! service. Each copy gets a fresh random `replay_id` so every
//! produced segment is distinct; values that are not msgpack maps with a `replay_id` (hostile
//! fixtures) are sent unchanged.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::RngExt;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde::Serialize;

use replay_ingest::recording::envelope::is_replay_id;

/// Deliveries awaited at once; bounds the producer's memory on large runs.
const WINDOW: usize = 5_000;

/// How often a paced run publishes.
const PACING_STEP: Duration = Duration::from_millis(20);

/// What a produce run delivered.
#[derive(Debug, Default, Serialize)]
pub struct Produced {
    pub messages: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Partition → offset of the last message delivered there (the highest reported: a
    /// delivery can be reported without its offset, as -1; see `kafka::find_by_key`).
    pub last_offsets: BTreeMap<i32, i64>,
    /// Where every message landed, `(partition, offset)`, in production order (the offset -1
    /// when the delivery report left it out).
    #[serde(skip)]
    pub deliveries: Vec<(i32, i64)>,
}

/// `value` with its `replay_id` replaced, when it is a msgpack map with a valid one (an invalid
/// id stays, so a hostile fixture stays hostile) — in the envelope and, as the edge would have
/// it, wherever the replay event repeats it.
pub fn with_replay_id(value: &[u8], replay_id: &str) -> Option<Vec<u8>> {
    let mut decoded = rmpv::decode::read_value(&mut &value[..]).ok()?;
    let map = match &mut decoded {
        rmpv::Value::Map(map) => map,
        _ => return None,
    };
    let slot = map
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("replay_id"))?;
    let old = slot.1.as_str().filter(|id| is_replay_id(id))?.to_owned();
    slot.1 = rmpv::Value::from(replay_id);
    if let Some((_, rmpv::Value::Binary(event))) = map
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("replay_event"))
    {
        *event = replace_all(event, old.as_bytes(), replay_id.as_bytes());
    }
    let mut out = Vec::with_capacity(value.len());
    rmpv::encode::write_value(&mut out, &decoded).ok()?;
    Some(out)
}

/// `haystack` with every `from` replaced by `to`.
fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = memchr::memmem::find(rest, from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

pub fn random_replay_id() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// Copy `i` of the values cycling through `files`, with a fresh replay id where it has one.
pub fn fixture_copy(files: &[Vec<u8>], i: u64) -> Vec<u8> {
    let Some(original) = files.get((i % files.len().max(1) as u64) as usize) else {
        return Vec::new();
    };
    with_replay_id(original, &random_replay_id()).unwrap_or_else(|| original.clone())
}

/// Publishes `count` messages made by `message(i)` (the value and an optional key), awaiting
/// every delivery — as fast as the broker takes them, or `rate` a second, spread evenly in steps
/// of [`PACING_STEP`].
pub async fn produce(
    producer: &FutureProducer,
    topic: &str,
    count: u64,
    rate: Option<u64>,
    message: impl Fn(u64) -> (Vec<u8>, Option<Vec<u8>>),
) -> Result<Produced, KafkaError> {
    let mut report = Produced::default();
    let start = Instant::now();
    let per_step = rate.map_or(WINDOW as u64, |rate| {
        (rate * PACING_STEP.as_millis() as u64 / 1000).clamp(1, WINDOW as u64)
    });
    let mut sent = 0u64;
    while sent < count {
        let window = (count - sent).min(per_step);
        let mut pending = Vec::with_capacity(window as usize);
        for i in sent..sent + window {
            let (value, key) = message(i);
            report.bytes += value.len() as u64;
            pending.push(async move {
                let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(&value);
                if let Some(key) = &key {
                    record = record.key(key);
                }
                producer.send(record, Duration::from_secs(30)).await
            });
        }
        for delivery in join_all(pending).await {
            let delivered = delivery.map_err(|(e, _)| e)?;
            report.messages += 1;
            let last = report
                .last_offsets
                .entry(delivered.partition)
                .or_insert(delivered.offset);
            *last = (*last).max(delivered.offset);
            report
                .deliveries
                .push((delivered.partition, delivered.offset));
        }
        sent += window;
        if let Some(rate) = rate.filter(|&r| r > 0) {
            tokio::time::sleep_until(
                (start + Duration::from_secs_f64(sent as f64 / rate as f64)).into(),
            )
            .await;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}
