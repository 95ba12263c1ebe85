//! Breadcrumbs as EAP trace items, from the recorded fixtures: every item decodes as the
//! `snuba-items` topic's schema says (`sentry_protos.snuba.v1.TraceItem`, with the bindings
//! Snuba's consumer uses), one golden item per category, Snuba's consumer constraints, sampling
//! and item ids stable across a redelivery, none with the rollout off, and a crafted segment of a
//! million breadcrumbs within the cost bound. And through the running service and the broker:
//! with the rollout at 1.0 every item lands on the topic byte for byte, with 0.0 none.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use prost::Message;
use replay_ingest::recording::trace_items::{Category, Dropped};
use replay_ingest::recording::{self, Limits, Processed, Rollout};
use sentry_protos::snuba::v1::TraceItem;
use sentry_protos::snuba::v1::any_value::Value as Any;
use serde_json::{Value, json};

use crate::support::*;

fn limits(rollout: Rollout) -> Limits {
    Limits {
        trace_items: rollout,
        ..Limits::default()
    }
}

/// Every recorded and synthetic fixture that processes and whose events are read (a body left unread has no items), processed with `rollout`.
fn processed(rollout: Rollout) -> BTreeMap<String, Processed> {
    let mut out = BTreeMap::new();
    for dir in ["segments", "synthetic"] {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(fixture_dir().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        paths.sort();
        for path in paths {
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            match recording::process(&std::fs::read(&path).unwrap(), &limits(rollout)) {
                Ok(p) if p.unread_body.is_none() => {
                    out.insert(name, p);
                }
                Ok(p) => assert!(p.trace_items.is_none(), "{name}: unread, so no items"),
                Err(_) => {}
            }
        }
    }
    out
}

/// An item as a JSON document: every field, attributes sorted by name.
fn as_json(item: &TraceItem) -> Value {
    let attributes: BTreeMap<&str, Value> = item
        .attributes
        .iter()
        .map(|(k, v)| {
            let value = match v.value.clone().unwrap() {
                Any::StringValue(s) => json!({ "string": s }),
                Any::BoolValue(b) => json!({ "bool": b }),
                Any::IntValue(i) => json!({ "int": i }),
                Any::DoubleValue(d) => json!({ "double": d }),
                other => panic!("{k}: a value kind replay items never use: {other:?}"),
            };
            (k.as_str(), value)
        })
        .collect();
    let ts = |t: Option<(i64, i32)>| {
        let (seconds, nanos) = t.unwrap();
        json!({ "seconds": seconds, "nanos": nanos })
    };
    json!({
        "organization_id": item.organization_id,
        "project_id": item.project_id,
        "trace_id": item.trace_id,
        "item_id": hex::encode(&item.item_id),
        "item_type": item.item_type,
        "timestamp": ts(item.timestamp.as_ref().map(|t| (t.seconds, t.nanos))),
        "received": ts(item.received.as_ref().map(|t| (t.seconds, t.nanos))),
        "retention_days": item.retention_days,
        "client_sample_rate": item.client_sample_rate,
        "server_sample_rate": item.server_sample_rate,
        "downsampled_retention_days": item.downsampled_retention_days,
        "has_outcomes": item.outcomes.is_some(),
        "attributes": attributes,
    })
}

fn decode(bytes: &[u8]) -> TraceItem {
    TraceItem::decode(bytes).expect("a TraceItem")
}

#[test]
fn the_topic_schema_is_the_trace_item_protobuf_and_its_example_decodes_with_the_same_bindings() {
    let schema = sentry_kafka_schemas::get_schema("snuba-items", None).unwrap();
    assert_eq!(
        schema.schema_type,
        sentry_kafka_schemas::SchemaType::Protobuf
    );
    assert_eq!(
        schema.raw_schema(),
        "sentry_protos.snuba.v1.trace_item_pb2.TraceItem"
    );
    assert!(!schema.examples().is_empty());
    for example in schema.examples() {
        decode(example.payload());
    }
}

#[test]
fn one_golden_item_per_category_from_the_recorded_fixtures() {
    let mut first: BTreeMap<Category, (String, Value)> = BTreeMap::new();
    for (name, p) in processed(Rollout::ALL) {
        for (category, bytes) in p.trace_items.as_ref().unwrap().iter() {
            first
                .entry(category)
                .or_insert_with(|| (name.clone(), as_json(&decode(bytes))));
        }
    }
    assert_eq!(
        first.keys().copied().collect::<Vec<_>>(),
        Category::ALL.to_vec(),
        "every category has an item in the fixtures"
    );
    for (category, (fixture, item)) in first {
        assert_eq!(
            item["attributes"]["category"]["string"],
            category.as_str(),
            "{fixture}"
        );
        insta::assert_json_snapshot!(format!("trace_item__{}", category.as_str()), item);
    }
}

#[test]
fn every_item_meets_snubas_consumer_constraints_and_carries_the_segment() {
    let mut items = 0;
    for (name, p) in processed(Rollout::ALL) {
        let trace_items = p.trace_items.as_ref().unwrap();
        assert_eq!(trace_items.counts.dropped().count(), 0, "{name}");
        for (_, bytes) in trace_items.iter() {
            let item = decode(bytes);
            assert!(
                uuid::Uuid::parse_str(&item.trace_id).is_ok(),
                "{name}: trace id"
            );
            assert!(item.item_id.len() >= 16, "{name}: item id");
            assert_eq!(item.item_type, 6);
            assert_eq!(item.organization_id, p.ids.org_id);
            assert_eq!(item.project_id, p.ids.project_id);
            assert_eq!(item.retention_days, u32::from(p.ids.retention_days));
            assert_eq!(item.received.unwrap().seconds as u64, p.ids.received);
            let replay_id = &item.attributes["replay_id"];
            assert_eq!(
                replay_id.value,
                Some(Any::StringValue(p.ids.replay_id.clone()))
            );
            assert_eq!(
                item.attributes["segment_id"].value,
                Some(Any::IntValue(i64::from(p.ids.segment_id)))
            );
            // A recorded breadcrumb's instant lies within a day of its segment's arrival.
            let seconds = item.timestamp.unwrap().seconds;
            assert!(
                (seconds - p.ids.received as i64).abs() < 86_400,
                "{name}: {seconds} vs received {}",
                p.ids.received
            );
            items += 1;
        }
    }
    assert!(items > 50, "{items} items");
}

#[test]
fn a_redelivered_segment_samples_the_same_events_and_builds_the_same_bytes() {
    let tenth = Rollout::new(0.1).unwrap();
    let (all, again) = (processed(Rollout::ALL), processed(Rollout::ALL));
    let (sampled, sampled_again) = (processed(tenth), processed(tenth));
    let ids = |p: &Processed| -> Vec<Vec<u8>> {
        let items = p.trace_items.as_ref().unwrap();
        items.iter().map(|(_, b)| decode(b).item_id).collect()
    };
    let (mut total, mut kept) = (0, 0);
    for (name, p) in &all {
        let bytes = |p: &Processed| -> Vec<Vec<u8>> {
            let items = p.trace_items.as_ref().unwrap();
            items.iter().map(|(_, b)| b.to_vec()).collect()
        };
        assert_eq!(bytes(p), bytes(&again[name]), "{name}: byte for byte");
        assert_eq!(ids(&sampled[name]), ids(&sampled_again[name]), "{name}");
        let every = ids(p);
        assert!(
            ids(&sampled[name]).iter().all(|id| every.contains(id)),
            "{name}: a sample of the same items"
        );
        total += every.len();
        kept += ids(&sampled[name]).len();
    }
    // Neither all nor none (the sample is a hash: the same every run).
    assert!(
        kept * 20 > total && kept < total / 4,
        "about a tenth sampled: {kept} of {total}"
    );
}

#[test]
fn with_the_rollout_off_nothing_is_built() {
    let processed = processed(Rollout::OFF);
    assert!(!processed.is_empty(), "the fixtures are read");
    for (name, p) in processed {
        assert!(p.trace_items.is_none(), "{name}");
    }
}

/// The first valid fixture with a replay event, rebuilt with `events` as its rrweb body and
/// `trace_ids` in its replay event.
fn segment_with(events: &str, trace_ids: Value) -> Vec<u8> {
    segment_with_event(events, json!({ "trace_ids": trace_ids }))
}

/// The same, with `fields` set in its replay event.
fn segment_with_event(events: &str, replay_event: Value) -> Vec<u8> {
    let value = std::fs::read(fixture_dir().join("segments/console-1.msgpack")).unwrap();
    let mut decoded = rmpv::decode::read_value(&mut &value[..]).unwrap();
    let rmpv::Value::Map(fields) = &mut decoded else {
        panic!("a fixture is a msgpack map");
    };
    for (key, field) in fields.iter_mut() {
        match key.as_str() {
            Some("payload") => {
                let mut payload = b"{\"segment_id\":1}\n".to_vec();
                payload.extend_from_slice(events.as_bytes());
                *field = rmpv::Value::Binary(payload);
            }
            Some("replay_event") => {
                let mut event: Value = serde_json::from_slice(field.as_slice().unwrap()).unwrap();
                for (key, value) in replay_event.as_object().unwrap() {
                    event[key] = value.clone();
                }
                *field = rmpv::Value::Binary(serde_json::to_vec(&event).unwrap());
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &decoded).unwrap();
    out
}

const TAP: &str = r#"{"type":5,"timestamp":1796012448000,"data":{"tag":"breadcrumb","payload":{"category":"ui.tap","timestamp":1796012448.5,"message":"Buy","data":{"view.id":"buy","view.class":"Button"}}}}"#;

#[test]
fn the_trace_id_is_the_one_trace_id_when_there_is_one_and_a_bad_one_drops_the_items() {
    let body = format!("[{TAP}]");
    let one = "4bf92f3577b34da6a3ce929d0e0e4736";
    let run = |trace_ids: Value| {
        let p = recording::process(&segment_with(&body, trace_ids), &limits(Rollout::ALL)).unwrap();
        let items = p.trace_items.unwrap();
        let ids: Vec<String> = items.iter().map(|(_, b)| decode(b).trace_id).collect();
        (ids, items.counts, p.ids.replay_id)
    };
    let (ids, _, _) = run(json!([one]));
    assert_eq!(ids, [one]);
    let (ids, _, replay_id) = run(json!([one, "0af7651916cd43dd8448eb211c80319c"]));
    assert_eq!(
        ids,
        std::slice::from_ref(&replay_id),
        "two trace ids: the replay id"
    );
    let (ids, _, _) = run(json!([]));
    assert_eq!(ids, std::slice::from_ref(&replay_id), "none: the replay id");
    let (ids, _, _) = run(json!([""]));
    assert_eq!(
        ids,
        [replay_id],
        "an empty one: the replay id (`\"\" or replay_id`)"
    );
    let (ids, counts, _) = run(json!(["not-a-uuid"]));
    assert!(ids.is_empty(), "Snuba would refuse it");
    assert_eq!(
        counts.dropped().collect::<Vec<_>>(),
        [(Dropped::InvalidTraceId, 1)]
    );
    // `len(trace_ids)` counts what is not a string (Relay leaves a null where it blanked one).
    let (ids, _, replay_id) = run(json!([null, one]));
    assert_eq!(ids, [replay_id], "two entries: the replay id");
    let (ids, counts, _) = run(json!([null]));
    assert!(ids.is_empty(), "one entry, `str(None)`: no UUID");
    assert_eq!(
        counts.dropped().collect::<Vec<_>>(),
        [(Dropped::InvalidTraceId, 1)]
    );
}

#[test]
fn a_required_field_of_the_wrong_type_drops_that_item_only() {
    let bad = TAP.replace(r#""message":"Buy""#, r#""message":5"#);
    let body = format!("[{TAP},{bad},{TAP}]");
    let p = recording::process(&segment_with(&body, json!([])), &limits(Rollout::ALL)).unwrap();
    let items = p.trace_items.unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(
        items.counts.dropped().collect::<Vec<_>>(),
        [(Dropped::InvalidField, 1)]
    );
    assert_eq!(
        p.extracted.taps.len(),
        3,
        "the segment's rows are unaffected"
    );
}

#[test]
fn a_million_breadcrumbs_stay_within_the_cost_bound_and_what_is_left_out_is_counted() {
    // 94 bytes each: the million fit the 100 MiB decompression cap.
    let crumb = r#"{"type":5,"timestamp":1,"data":{"tag":"breadcrumb","payload":{"category":"navigation","timestamp":1}}}"#;
    let mut body = String::with_capacity(crumb.len() * 1_000_001);
    body.push('[');
    for i in 0..1_000_000 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(crumb);
    }
    body.push(']');
    let p = recording::process(&segment_with(&body, json!([])), &limits(Rollout::ALL)).unwrap();
    let items = p.trace_items.as_ref().unwrap();
    let over = items
        .counts
        .dropped()
        .find(|(r, _)| *r == Dropped::OverBudget)
        .map_or(0, |(_, n)| n);
    assert_eq!(
        items.len() as u64 + over,
        1_000_000,
        "every one built or counted"
    );
    assert!(over > 0 && items.len() > 10_000);
    assert!(
        p.memory_bytes() <= p.cost_bound(),
        "{} held, bound {}",
        p.memory_bytes(),
        p.cost_bound()
    );
}

#[test]
fn the_users_attributes_present_in_the_replay_event_are_on_every_item() {
    let body = format!("[{TAP}]");
    let user = json!({ "user": { "id": 17, "email": "ada@example.com", "username": "ada",
        "ip_address": "192.0.2.7", "geo": { "city": "London", "country_code": "GB", "region": "" } } });
    let empty = json!({ "user": { "id": "", "email": "", "username": "", "ip_address": "",
        "geo": { "city": "", "country_code": "", "region": "", "subdivision": "" } } });
    let p = recording::process(
        &segment_with_event(&format!("[{TAP}]"), empty),
        &limits(Rollout::ALL),
    )
    .unwrap();
    let item = decode(p.trace_items.unwrap().iter().next().unwrap().1);
    assert!(
        !item.attributes.keys().any(|k| k.starts_with("user_")),
        "Sentry sets an attribute only for a value that is not empty: {:?}",
        item.attributes.keys().collect::<Vec<_>>()
    );
    let p = recording::process(&segment_with_event(&body, user), &limits(Rollout::ALL)).unwrap();
    let item = decode(p.trace_items.unwrap().iter().next().unwrap().1);
    let attribute = |k: &str| item.attributes.get(k).and_then(|v| v.value.clone());
    let text = |s: &str| Some(Any::StringValue(s.into()));
    assert_eq!(attribute("user_id"), text("17"));
    assert_eq!(attribute("user_email"), text("ada@example.com"));
    assert_eq!(attribute("user_name"), text("ada"));
    assert_eq!(attribute("user_ip"), text("192.0.2.7"));
    assert_eq!(attribute("user_geo_city"), text("London"));
    assert_eq!(attribute("user_geo_country_code"), text("GB"));
    assert_eq!(
        attribute("user_geo_region"),
        None,
        "empty: left out, as Sentry does"
    );
    assert_eq!(attribute("user_geo_subdivision"), None, "absent: left out");
}

/// What [`through_the_service`] returns: the items expected from the produced messages, the
/// messages on the items' topic and on the dead-letter topic, and the counters sent.
struct Run {
    expected: Vec<Vec<u8>>,
    landed: Vec<Vec<u8>>,
    dead_letters: usize,
    /// Of the produced messages, those the core rejects.
    invalid: usize,
    counters: BTreeMap<String, f64>,
}

/// Runs the service over every fixture and `extra` with `rollout`, items to a topic of their own
/// (taking records up to `limit` bytes, if given).
async fn through_the_service(rollout: &str, limit: Option<usize>, extra: &[Vec<u8>]) -> Run {
    let names = Names::create().await;
    let items_topic = unique("items");
    create_topic(&items_topic, 1).await;
    if let Some(limit) = limit {
        set_topic_limit(&items_topic, limit).await;
    }
    let statsd = Statsd::bind();
    let fixtures: Vec<Vec<u8>> = all_fixtures().into_iter().chain(extra.to_vec()).collect();
    let (report, sent) = produce_fixtures(&names.topic, &fixtures, fixtures.len() as u64).await;
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = names
        .args(statsd.port(), dir.path())
        .into_iter()
        .chain(
            [
                "--trace-items-rollout",
                rollout,
                "--trace-items-topic",
                &items_topic,
            ]
            .map(String::from),
        )
        .collect();
    let service = Service::start(&args);
    let target = expected_commits(&report);
    wait_for("everything committed", Duration::from_secs(120), || {
        service.committed() == target
    })
    .await;
    assert_eq!(service.terminate(), Some(0));
    let share: f64 = rollout.parse().unwrap();
    let expected: Vec<Vec<u8>> = sent
        .iter()
        .filter_map(|s| recording::process(&s.value, &limits(Rollout::new(share).unwrap())).ok())
        .flat_map(|p| {
            let items = p
                .trace_items
                .map(|t| t.iter().map(|(_, b)| b.to_vec()).collect());
            items.unwrap_or_else(Vec::new)
        })
        .collect();
    // Everything was durable before it committed: what the topic holds now is all there is.
    let on_topic = high_watermarks(&items_topic, 1)
        .get(&0)
        .map_or(0, |&n| n as usize);
    let read = match on_topic {
        0 => Vec::new(),
        n => read_messages(&items_topic, n, Duration::from_secs(20)),
    };
    assert_eq!(read.len(), on_topic, "every message on the topic read");
    assert!(read.iter().all(|m| m.key.is_none() && m.headers.is_empty()));
    Run {
        expected,
        landed: read.into_iter().map(|m| m.value).collect(),
        dead_letters: high_watermarks(&names.dlq, 1).values().sum::<i64>() as usize,
        invalid: sent
            .iter()
            .filter(|s| recording::process(&s.value, &Limits::default()).is_err())
            .count(),
        counters: statsd.read().counters,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_rollout_at_one_every_item_lands_on_its_topic_byte_for_byte() {
    let _stack = uses_stack().await;
    let Run {
        mut expected,
        mut landed,
        counters,
        ..
    } = through_the_service("1.0", None, &[]).await;
    assert!(expected.len() > 50, "{} items", expected.len());
    for value in &landed {
        decode(value);
    }
    expected.sort();
    landed.sort();
    // At least once: a delivery retried after a timeout may land twice, with the same bytes.
    landed.dedup();
    assert_eq!(landed, expected);
    let built = |category: Category| {
        let key = format!(
            "replay_ingest.trace_items.built|category:{}",
            category.as_str()
        );
        counters.get(&key).copied().unwrap_or(0.0)
    };
    let counted: f64 = Category::ALL.into_iter().map(built).sum();
    assert_eq!(
        counted,
        expected.len() as f64,
        "trace_items.built by category"
    );
    assert!(
        Category::ALL.into_iter().all(|c| built(c) > 0.0),
        "{counters:?}"
    );
    assert_eq!(
        counters["replay_ingest.flush.items|sink:trace_items"],
        expected.len() as f64,
        "every item counted delivered"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn with_the_rollout_at_zero_no_item_is_written() {
    let _stack = uses_stack().await;
    let Run {
        expected,
        landed,
        counters,
        ..
    } = through_the_service("0", None, &[]).await;
    assert!(!counters.keys().any(|k| k.contains("trace_items")));
    assert!(expected.is_empty());
    assert!(landed.is_empty(), "{} items on the topic", landed.len());
}

/// Items over the topic's `max.message.bytes` are left out, counted, and the rest written: the
/// broker refused them, and the whole segment — blob, rows, billing outcome — was dead-lettered
/// for an optional, sampled output. The topic takes 1 000 000 bytes (librdkafka's batches are as
/// large: a smaller limit refuses batches of items that each fit), and one breadcrumb's item is
/// larger, under the 1 MiB an item may have.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local stack: scripts/test.sh starts it and runs every test"]
async fn items_over_the_topics_limit_are_left_out_and_their_segments_written() {
    let _stack = uses_stack().await;
    use replay_ingest::sink::publish::RECORD_OVERHEAD_BYTES;
    const LIMIT: usize = 1_000_000;
    let long = TAP.replace(
        r#""message":"Buy""#,
        &format!(r#""message":"{}""#, "m".repeat(LIMIT)),
    );
    // A segment large enough for the item's budget (a quarter of the segment, and some): a
    // snapshot of 3 MB beside it.
    let snapshot = format!(
        r#"{{"type":2,"timestamp":1796012448000,"data":{{"text":"{}"}}}}"#,
        "s".repeat(3 * LIMIT)
    );
    let segment = segment_with(&format!("[{snapshot},{long},{TAP}]"), json!([]));
    let Run {
        expected,
        mut landed,
        dead_letters,
        invalid,
        counters,
    } = through_the_service("1.0", Some(LIMIT), &[segment]).await;
    let (mut fitting, over): (Vec<Vec<u8>>, Vec<Vec<u8>>) = expected
        .into_iter()
        .partition(|item| item.len() + RECORD_OVERHEAD_BYTES <= LIMIT);
    assert_eq!(over.len(), 1, "the long breadcrumb's item");
    assert!(fitting.len() > 50, "{} items fit", fitting.len());
    fitting.sort();
    landed.sort();
    landed.dedup();
    assert_eq!(landed, fitting, "the items that fit, byte for byte");
    // Counted once, whatever the attempts of the write.
    assert_eq!(
        counters.get("replay_ingest.trace_items.dropped|reason:over_topic_limit"),
        Some(&1.0),
        "{counters:?}"
    );
    assert!(invalid > 0);
    assert_eq!(
        dead_letters, invalid,
        "only the invalid messages dead-lettered"
    );
}
