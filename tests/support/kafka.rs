//! The shared broker: topics, producers, consumers reading back what the service wrote, and
//! the group's commits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use load::Produced;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::*;

pub fn brokers() -> String {
    std::env::var("REPLAY_INGEST_TEST_BROKERS")
        .expect("REPLAY_INGEST_TEST_BROKERS is not set: start the local stack with `scripts/stack.sh up` and source its stack.env (scripts/test.sh does both)")
}

/// A name no other test (or earlier run against the same broker) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &load::random_replay_id()[..12])
}

/// Headers as any producer may write them: names of any bytes, not only UTF-8 (rust-rdkafka's
/// `Header` takes a `&str`), added through librdkafka.
pub fn raw_headers(headers: &[(&[u8], &[u8])]) -> rdkafka::message::OwnedHeaders {
    use rdkafka::bindings as rd;
    let owned = rdkafka::message::OwnedHeaders::new();
    // `as_borrowed` is librdkafka's headers behind a reference: the pointer back to them.
    let native = std::ptr::from_ref(owned.as_borrowed())
        .cast::<rd::rd_kafka_headers_t>()
        .cast_mut();
    for (name, value) in headers {
        // SAFETY: `native` is the headers `owned` holds, alive until it drops; librdkafka copies
        // the name and the value.
        let error = unsafe {
            rd::rd_kafka_header_add(
                native,
                name.as_ptr().cast(),
                name.len() as isize,
                value.as_ptr().cast(),
                value.len() as isize,
            )
        };
        assert_eq!(error, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    owned
}

/// A client configuration for the local stack's broker.
pub fn kafka() -> ClientConfig {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .clone()
}

/// Deletes the records of `partition` before `offset`, as retention would: the partition then
/// starts at `offset`.
pub async fn delete_records_before(topic: &str, partition: i32, offset: i64) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        kafka().create().unwrap();
    let mut before = TopicPartitionList::new();
    before
        .add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    let deleted = admin
        .delete_records(&before, &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap();
    for element in deleted.elements() {
        element.error().unwrap();
    }
}

pub async fn create_topic(name: &str, partitions: i32) {
    create_topic_on(&kafka(), name, partitions).await
}

/// Deletes `name` on the stack's broker, as an operator would. The brokers finish the deletion
/// after they answer: the name is free a moment later ([`create_topic_again`]).
pub async fn delete_topic(name: &str) {
    delete_topic_on(&kafka(), name).await;
}

/// [`delete_topic`] on the cluster `base` points at.
pub async fn delete_topic_on(base: &ClientConfig, name: &str) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        base.create().unwrap();
    for deleted in admin
        .delete_topics(&[name], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap()
    {
        deleted.unwrap();
    }
}

/// `create_topic` of a name a deletion may still hold: tried again until the brokers let it go
/// (60 s at most).
pub async fn create_topic_again(name: &str, partitions: i32) {
    create_topic_again_on(&kafka(), name, (partitions, 1)).await;
}

/// [`create_topic_again`] on the cluster `base` points at, `layout` its partitions and replicas.
pub async fn create_topic_again_on(base: &ClientConfig, name: &str, layout: (i32, i32)) {
    let start = Instant::now();
    while let Err(e) =
        topics::create_replicated_topic_as(base, name, layout, stands_for(name)).await
    {
        assert!(start.elapsed() < Duration::from_secs(60), "{e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Sentry topic a test's topic stands for, by the prefix `unique` gave its name.
pub fn stands_for(name: &str) -> &'static str {
    match name.rsplit_once('-').map_or(name, |(prefix, _)| prefix) {
        "rec" => "ingest-replay-recordings",
        "replay-events" => "ingest-replay-events",
        "outcomes" => "outcomes-billing",
        "issues" => "ingest-occurrences",
        "items" => "snuba-items",
        _ => "",
    }
}

/// `create_topic` on the cluster `base` points at, with the settings Sentry gives the topic it
/// stands for, so the broker enforces production's limits (`topics::sentry_topic_config`).
pub async fn create_topic_on(base: &ClientConfig, name: &str, partitions: i32) {
    topics::create_topic_as(base, name, partitions, stands_for(name))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Sets `topic`'s `max.message.bytes` to `bytes` while the cluster runs, as an operator would,
/// and waits until the brokers report it. The request replaces the topic's whole configuration,
/// so it carries the Sentry settings `create_topic` gave it.
pub async fn set_topic_limit(topic: &str, bytes: usize) {
    set_topic_limit_on(&kafka(), topic, bytes).await
}

/// `set_topic_limit` on the cluster `base` points at.
pub async fn set_topic_limit_on(base: &ClientConfig, topic: &str, bytes: usize) {
    set_topic_config_on(base, topic, "max.message.bytes", &bytes.to_string()).await
}

/// Sets `topic`'s `key` to `value` while the cluster runs, as an operator would, and waits until
/// the brokers report it. The request replaces the topic's whole configuration, so it carries
/// the Sentry settings `create_topic` gave it.
pub async fn set_topic_config_on(base: &ClientConfig, topic: &str, key: &str, value: &str) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        base.create().unwrap();
    let mut config =
        rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(topic));
    for (key, value) in topics::sentry_topic_config(stands_for(topic)) {
        config = config.set(key, value);
    }
    config = config.set(key, value);
    let altered = admin
        .alter_configs(&[config], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap();
    for result in altered {
        result.unwrap_or_else(|e| panic!("altering {topic}: {e:?}"));
    }
    // rust-rdkafka reports every resource of an alteration as done: the value read back is what
    // tells.
    let described = || async {
        let topic = rdkafka::admin::ResourceSpecifier::Topic(topic);
        let read = admin
            .describe_configs([&topic], &rdkafka::admin::AdminOptions::new())
            .await
            .unwrap();
        read.into_iter()
            .filter_map(Result::ok)
            .find_map(|c| c.get(key)?.value.clone())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while described().await.as_deref() != Some(value) {
        assert!(Instant::now() < deadline, "{topic}'s {key} stays unchanged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn producer() -> FutureProducer {
    producer_on(&kafka())
}

/// A producer on `base` that takes messages as large as production's: rust-rdkafka's for test
/// data, or the service's own for a sink under test.
pub fn producer_on<P: rdkafka::config::FromClientConfig>(base: &ClientConfig) -> P {
    // Idempotent: a batch whose answer a leader's crash lost is not written twice by the retry.
    base.clone()
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.max.bytes", "16000000")
        .create()
        .expect("producer")
}

/// Copies `numbers` of the values cycling through `files` (`load::fixture_copy`), each keyed
/// with its number ([`test_key`]), to produce in order.
pub fn keyed_copies(files: &[Vec<u8>], numbers: std::ops::Range<u64>) -> Vec<(Vec<u8>, Vec<u8>)> {
    numbers
        .map(|i| (super::load::fixture_copy(files, i), test_key(i)))
        .collect()
}

/// The key test runs give copy `i`: every message has a distinct one, so the dead-letter copy's
/// key can be checked.
pub fn test_key(i: u64) -> Vec<u8> {
    format!("key-{i}-{}", &load::random_replay_id()[..8]).into_bytes()
}

/// Produces `count` fixture copies, each with its own key; returns the delivery report and every
/// message's fate.
pub async fn produce_fixtures(
    topic: &str,
    fixtures: &[Vec<u8>],
    count: u64,
) -> (Produced, Vec<Sent>) {
    let copies: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
        .map(|i| (load::fixture_copy(fixtures, i), test_key(i)))
        .collect();
    produce_values(topic, copies).await
}

/// Produces `(value, key)` pairs in order; returns the delivery report and every message's fate.
pub async fn produce_values(
    topic: &str,
    messages: Vec<(Vec<u8>, Vec<u8>)>,
) -> (Produced, Vec<Sent>) {
    produce_values_with(&producer(), topic, messages).await
}

/// `produce_values` through `producer`.
pub async fn produce_values_with(
    producer: &FutureProducer,
    topic: &str,
    messages: Vec<(Vec<u8>, Vec<u8>)>,
) -> (Produced, Vec<Sent>) {
    let report = load::produce(producer, topic, messages.len() as u64, None, |i| {
        let (value, key) = &messages[i as usize];
        (value.clone(), Some(key.clone()))
    })
    .await
    .expect("produce");
    // Deliveries come back in production order.
    let sent = report
        .deliveries
        .iter()
        .zip(messages)
        .map(|(&(partition, offset), (value, key))| Sent {
            partition,
            offset,
            expected: expected_for(&value),
            original: Original::new(Some(key), &value),
            value,
        })
        .collect();
    (report, sent)
}

/// Offsets the group has committed, per partition.
pub fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    committed_on(&kafka(), group, topic, partitions)
}

/// `committed` on the cluster `base` points at.
pub fn committed_on(
    base: &ClientConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    // Right after a broker restart or hang the group's coordinator can be unknown for a while
    // (`NotCoordinator`, `CoordinatorLoadInProgress`; 6.3 s seen once, after a hang past the
    // broker's fencing on a loaded machine): asked again for up to 15 s, not taken for an answer.
    let mut attempts = 0;
    let committed = loop {
        match consumer.committed_offsets(list.clone(), Duration::from_secs(10)) {
            Ok(committed) => break committed,
            Err(e) if attempts < 60 => {
                attempts += 1;
                eprintln!("committed offsets of {group}: {e}; asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("committed offsets of {group}: {e}"),
        }
    };
    committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Each partition's high watermark (the next offset to be written), for partitions with
/// anything in them.
pub fn high_watermarks(topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    high_watermarks_on(&kafka(), topic, partitions)
}

/// `high_watermarks` on the cluster `base` points at.
pub fn high_watermarks_on(base: &ClientConfig, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = base.create().expect("consumer");
    (0..partitions)
        .filter_map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (high > 0).then_some((p, high))
        })
        .collect()
}

/// `last delivered offset + 1` per partition: where the committed offsets must end up.
pub fn expected_commits(report: &Produced) -> BTreeMap<i32, i64> {
    report
        .last_offsets
        .iter()
        .map(|(&p, &o)| (p, o + 1))
        .collect()
}

/// One message read back from a topic.
pub struct Received {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// Messages on `topic`, read from the start until at least `count` arrived, every partition was
/// read to where it ended when the read began, and then nothing more came for a second (so
/// duplicates are seen too).
pub fn read_messages(topic: &str, count: usize, timeout: Duration) -> Vec<Received> {
    read_messages_on(&kafka(), topic, count, timeout)
}

/// Every message on `topic` (of `partitions`), as many as its high watermarks say: a copy too
/// many is seen without waiting out a deadline for a message that should not be there (a fresh
/// reader's join on a loaded machine could take that deadline, and the test saw too few).
pub fn read_all(topic: &str, partitions: i32) -> Vec<Received> {
    read_all_on(&kafka(), topic, partitions)
}

/// [`read_all`] on the cluster `base` points at.
pub fn read_all_on(base: &ClientConfig, topic: &str, partitions: i32) -> Vec<Received> {
    let on_topic = high_watermarks_on(base, topic, partitions)
        .values()
        .sum::<i64>() as usize;
    let read = read_messages_on(base, topic, on_topic, Duration::from_secs(60));
    assert_eq!(read.len(), on_topic, "every message on {topic} read back");
    read
}

/// The values (UTF-8) of every message on `topic` ([`read_all`]), sorted.
pub fn all_values(topic: &str, partitions: i32) -> Vec<String> {
    let mut values: Vec<String> = read_all(topic, partitions)
        .into_iter()
        .map(|m| String::from_utf8(m.value).unwrap())
        .collect();
    values.sort();
    values
}

/// `read_messages` from the cluster `base` points at.
pub fn read_messages_on(
    base: &ClientConfig,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Vec<Received> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribe");
    // Where each partition ends now: `count` can be reached early on a topic holding duplicates
    // (at least once), and a pause of a second in the fetches must not cut the read short of
    // the end. (A topic not there yet has no ends: the poll below says so.)
    let mut ends: BTreeMap<i32, i64> = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .ok()
        .and_then(|m| Some(m.topics().first()?.partitions().len() as i32))
        .map_or_else(BTreeMap::new, |partitions| {
            (0..partitions)
                .filter_map(|p| {
                    let (_, end) = consumer
                        .fetch_watermarks(topic, p, Duration::from_secs(10))
                        .ok()?;
                    (end > 0).then_some((p, end))
                })
                .collect()
        });
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut last_seen = Instant::now();
    while Instant::now() < deadline
        && (out.len() < count || !ends.is_empty() || last_seen.elapsed() < Duration::from_secs(1))
    {
        let m = match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => m,
            // A topic that does not exist reads as empty otherwise, and "nothing arrived" would
            // hold for a misspelt name. (Transient errors pass: the broker may be restarting.)
            Some(Err(error))
                if matches!(
                    error.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic
                    )
                ) =>
            {
                panic!("reading {topic}: {error}")
            }
            _ => continue,
        };
        last_seen = Instant::now();
        if ends
            .get(&m.partition())
            .is_some_and(|&end| m.offset() + 1 >= end)
        {
            ends.remove(&m.partition());
        }
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Received {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    out
}

/// Dead-lettered messages as `(original partition, original offset, reason)`, in the order the
/// DLQ holds them (duplicates included). Checks each against the message it copies (`originals`,
/// by partition and offset of `source_topic`): the same key and value bytes (or, for a value too
/// large for the DLQ, a pointer with its length), the `original_*` headers and a detail.
pub fn read_dlq(
    topic: &str,
    source_topic: &str,
    originals: &BTreeMap<(i32, i64), Original>,
    count: usize,
    timeout: Duration,
) -> Vec<(i32, i64, String)> {
    check_dead_letters(
        read_messages(topic, count, timeout),
        source_topic,
        originals,
    )
}

/// Every message of `sent` (on `topic`, of so many partitions) stored in `blob_dir` or on `dlq`,
/// and `group` committed to the end of every partition. Dead letters are at least once: one a
/// kill interrupted may be there twice.
pub async fn everything_landed(
    base: &ClientConfig,
    sent: &[Sent],
    (topic, partitions): (&str, i32),
    dlq: &str,
    group: &str,
    blob_dir: &std::path::Path,
) {
    let (blobs, dead) = outcomes(sent);
    wait_for("every blob", Duration::from_secs(120), || {
        blobs_under(blob_dir) == blobs
    })
    .await;
    let end = high_watermarks_on(base, topic, partitions);
    assert_eq!(end.values().sum::<i64>(), sent.len() as i64);
    wait_for(
        "the group commits to the end",
        Duration::from_secs(60),
        || committed_on(base, group, topic, partitions) == end,
    )
    .await;
    let letters = read_messages_on(base, dlq, dead.len(), Duration::from_secs(30));
    let letters = check_dead_letters(letters, topic, &originals(sent));
    assert_eq!(
        letters
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>(),
        dead
    );
}

/// Where the messages keyed `keys` sit in `partitions` of `topic`, read through `base` from each
/// partition's start to its end: every copy found, as `(key, partition, offset)`.
///
/// A producer's delivery report does not always say where a message is. A failed delivery may
/// have landed all the same (a record in flight when its timeout came), and an idempotent
/// producer reports a delivery without its offset (-1) when the broker answers a retry with
/// DUPLICATE_SEQUENCE_NUMBER: the first send landed, its acknowledgement was lost to a broker
/// kill (librdkafka's rdkafka_request.c; a chaos run in CI failed on such a message). Those are
/// looked up here, by key, once production has stopped.
pub fn find_by_key(
    base: &ClientConfig,
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
    keys: &std::collections::BTreeSet<&[u8]>,
) -> Vec<(Vec<u8>, i32, i64)> {
    if keys.is_empty() {
        return Vec::new();
    }
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", unique("lookup"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("the lookup's consumer");
    let (mut ends, mut assignment) = (BTreeMap::new(), TopicPartitionList::new());
    for partition in partitions {
        let (_, end) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(30))
            .expect("the partition's end");
        if end > 0 {
            ends.insert(partition, end);
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).expect("assign");
    let (mut found, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(120));
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{topic} not read to its end: {ends:?}"
        );
        let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        if let Some(key) = message.key().filter(|key| keys.contains(key)) {
            found.push((key.to_vec(), message.partition(), message.offset()));
        }
        if ends
            .get(&message.partition())
            .is_some_and(|&end| message.offset() + 1 >= end)
        {
            ends.remove(&message.partition());
        }
    }
    found
}

/// Produces copies of `fixtures` (each with a key of its own) to `topic` through `base` in the
/// background, `per_round` of them every `every`, numbered from `from` on, until `producing`
/// turns false; returns every message's fate, with the offsets a delivery report left out
/// looked up ([`find_by_key`]).
pub fn steady_load(
    base: &ClientConfig,
    topic: &str,
    fixtures: Vec<Vec<u8>>,
    (from, per_round, every): (u64, u64, Duration),
    producing: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sent>> {
    let (producer, topic, base) = (
        producer_on::<FutureProducer>(base),
        topic.to_owned(),
        base.clone(),
    );
    tokio::spawn(async move {
        let mut sent = Vec::new();
        let mut i = from;
        while producing.load(std::sync::atomic::Ordering::SeqCst) {
            let round = (i..i + per_round)
                .map(|i| (load::fixture_copy(&fixtures, i), test_key(i)))
                .collect();
            i += per_round;
            sent.extend(produce_values_with(&producer, &topic, round).await.1);
            tokio::time::sleep(every).await;
        }
        let unknown: Vec<&Sent> = sent.iter().filter(|s| s.offset < 0).collect();
        let keys = unknown
            .iter()
            .filter_map(|s| s.original.key.as_deref())
            .collect();
        let partitions: std::collections::BTreeSet<i32> =
            unknown.iter().map(|s| s.partition).collect();
        let found = tokio::task::block_in_place(|| find_by_key(&base, &topic, partitions, &keys));
        for s in sent.iter_mut().filter(|s| s.offset < 0) {
            let mut at = found
                .iter()
                .filter(|(key, partition, _)| {
                    Some(key.as_slice()) == s.original.key.as_deref() && *partition == s.partition
                })
                .map(|&(_, _, offset)| offset);
            s.offset = at.next().unwrap_or_else(|| {
                panic!("a delivery reported without its offset is not on {topic}")
            });
            assert_eq!(at.next(), None, "an idempotent send landed once");
        }
        sent
    })
}
