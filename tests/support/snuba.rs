//! Snuba's replays processor (`rust_snuba/src/processors/replays.rs`), rewritten for the tests
//! from its documented behaviour: an `ingest-replay-events` message in, the rows snuba would
//! insert out, as JSON objects keyed by column — or the reason snuba would reject the message.
//! Strict where snuba is strict (required keys, types), lenient where it is lenient (unknown
//! keys, saturating timestamps), so a message this accepts is one snuba accepts.

use std::net::IpAddr;

use md5::{Digest, Md5};
use serde_json::{Map, Value, json};
use uuid::Uuid;

type Row = Map<String, Value>;

/// The rows snuba writes for one message read at `partition`/`offset`.
pub fn rows(message: &[u8], partition: u16, offset: u64) -> Result<Vec<Row>, String> {
    let envelope: Value = serde_json::from_slice(message).map_err(|e| format!("not JSON: {e}"))?;
    let envelope = envelope.as_object().ok_or("not an object")?;
    number(envelope.get("start_time"), "start_time")?.ok_or("no start_time")?;
    let replay_id = uuid(
        envelope.get("replay_id").ok_or("no replay_id")?,
        "replay_id",
    )?;
    let project_id = envelope
        .get("project_id")
        .and_then(Value::as_u64)
        .ok_or("project_id")?;
    let retention_days = envelope
        .get("retention_days")
        .and_then(Value::as_u64)
        .filter(|d| *d <= u64::from(u16::MAX))
        .ok_or("retention_days")?;
    let payload = match envelope.get("payload").ok_or("no payload")? {
        Value::Array(bytes) => {
            let bytes: Vec<u8> = bytes
                .iter()
                .map(|b| {
                    b.as_u64()
                        .and_then(|b| u8::try_from(b).ok())
                        .ok_or("payload byte")
                })
                .collect::<Result<_, _>>()?;
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("payload bytes are not JSON: {e}"))?
        }
        object @ Value::Object(_) => object.clone(),
        _ => return Err("payload is neither bytes nor an object".into()),
    };
    let payload = payload.as_object().ok_or("payload is not an object")?;
    let base = |replay_id: Uuid| {
        let mut row = default_row();
        row.insert(
            "replay_id".into(),
            json!(replay_id.hyphenated().to_string()),
        );
        row.insert("project_id".into(), json!(project_id));
        row.insert("retention_days".into(), json!(retention_days));
        row.insert("partition".into(), json!(partition));
        row.insert("offset".into(), json!(offset));
        row
    };
    match payload.get("type").and_then(Value::as_str) {
        Some("replay_actions") => item_rows(
            payload,
            "clicks",
            || base(replay_id),
            |click, row| {
                for (column, key) in [
                    ("click_alt", "alt"),
                    ("click_aria_label", "aria_label"),
                    ("click_id", "id"),
                    ("click_role", "role"),
                    ("click_tag", "tag"),
                    ("click_testid", "testid"),
                    ("click_text", "text"),
                    ("click_title", "title"),
                ] {
                    row.insert(column.into(), json!(required_string(click.get(key), key)?));
                }
                let component = optional_string(click.get("component_name"), "component_name")?;
                row.insert(
                    "click_component_name".into(),
                    json!(component.unwrap_or_default()),
                );
                row.insert(
                    "click_class".into(),
                    json!(strings(click.get("class"), "class")?.ok_or("class")?),
                );
                row.insert(
                    "click_is_dead".into(),
                    json!(small(click.get("is_dead"), "is_dead", 255)?),
                );
                row.insert(
                    "click_is_rage".into(),
                    json!(small(click.get("is_rage"), "is_rage", 255)?),
                );
                row.insert(
                    "click_node_id".into(),
                    json!(small(click.get("node_id"), "node_id", u64::from(u32::MAX))?),
                );
                Ok(())
            },
        ),
        Some("replay_tap") => item_rows(
            payload,
            "taps",
            || base(replay_id),
            |tap, row| {
                for (column, key) in [
                    ("tap_message", "message"),
                    ("tap_view_class", "view_class"),
                    ("tap_view_id", "view_id"),
                ] {
                    row.insert(column.into(), json!(required_string(tap.get(key), key)?));
                }
                Ok(())
            },
        ),
        Some("replay_event") => Ok(vec![segment_row(payload, base)?]),
        other => Err(format!("payload type {other:?}")),
    }
}

/// One row per element of the payload's `list` (clicks or taps): `fill` sets the element's own
/// columns; every element also carries its `event_hash` and `timestamp` and the payload's
/// `environment`.
fn item_rows(
    payload: &Map<String, Value>,
    list: &str,
    base: impl Fn() -> Row,
    fill: impl Fn(&Map<String, Value>, &mut Row) -> Result<(), String>,
) -> Result<Vec<Row>, String> {
    let environment =
        optional_string(payload.get("environment"), "environment")?.unwrap_or_default();
    let items = payload
        .get(list)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no {list}"))?;
    items
        .iter()
        .map(|item| {
            let item = item
                .as_object()
                .ok_or_else(|| format!("an element of {list} is not an object"))?;
            let mut row = base();
            fill(item, &mut row)?;
            let event_hash = uuid(item.get("event_hash").ok_or("no event_hash")?, "event_hash")?;
            row.insert("event_hash".into(), json!(event_hash));
            let timestamp = number(item.get("timestamp"), "timestamp")?.ok_or("no timestamp")?;
            row.insert("timestamp".into(), json!(saturate(timestamp)));
            row.insert("environment".into(), json!(environment));
            Ok(row)
        })
        .collect()
}

fn segment_row(event: &Map<String, Value>, base: impl Fn(Uuid) -> Row) -> Result<Row, String> {
    let replay_id = uuid(
        event.get("replay_id").ok_or("no payload replay_id")?,
        "replay_id",
    )?;
    let timestamp = number(event.get("timestamp"), "timestamp")?.ok_or("no payload timestamp")?;
    let mut row = base(replay_id);
    let segment_id = match event.get("segment_id") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|s| *s <= u64::from(u32::MAX))
                .ok_or("segment_id")?,
        ),
    };
    let event_hash = match event.get("event_hash") {
        Some(v) if !v.is_null() => uuid(v, "event_hash")?,
        _ => {
            let segment_id =
                segment_id.ok_or("no segment_id: snuba would draw a random event_hash")?;
            Uuid::from_bytes(Md5::digest(segment_id.to_string().as_bytes()).into())
        }
    };
    row.insert(
        "event_hash".into(),
        json!(event_hash.hyphenated().to_string()),
    );
    row.insert(
        "segment_id".into(),
        json!(segment_id.filter(|s| *s <= 65_535)),
    );
    let tags = match event.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(pairs)) => pairs
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(k), v]) => {
                    Ok((k.clone(), optional_string(Some(v), "tag value")?))
                }
                _ => Err(format!("tag {pair} is not a [string, string|null] pair")),
            })
            .collect::<Result<_, String>>()?,
        Some(other) => return Err(format!("tags {other} are not a list of pairs")),
    };
    let title = tags
        .iter()
        .rfind(|(k, _)| k == "transaction")
        .map(|(_, v)| v.clone());
    row.insert("title".into(), json!(title.flatten()));
    let rest: Vec<_> = tags
        .into_iter()
        .filter(|(k, _)| k != "transaction")
        .collect();
    row.insert(
        "tags.key".into(),
        json!(rest.iter().map(|(k, _)| k).collect::<Vec<_>>()),
    );
    row.insert(
        "tags.value".into(),
        json!(
            rest.iter()
                .map(|(_, v)| v.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        ),
    );

    let user = object(event.get("user"), "user")?;
    let user_id = match user.and_then(|u| u.get("id")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(n) => Some(
            n.as_u64()
                .ok_or("user.id is a negative or fractional number")?
                .to_string(),
        ),
    };
    let user_field = |key: &str| optional_string(user.and_then(|u| u.get(key)), key);
    let (username, email) = (user_field("username")?, user_field("email")?);
    let ip = user_field("ip_address")?.and_then(|ip| ip.parse::<IpAddr>().ok());
    let (v4, v6) = match ip {
        Some(IpAddr::V4(v4)) => (Some(v4.to_string()), None),
        Some(IpAddr::V6(v6)) => (None, Some(v6.to_string())),
        None => (None, None),
    };
    let shown = user_id
        .clone()
        .or(username.clone())
        .or(email.clone())
        .or(v4.clone())
        .or(v6.clone());
    row.insert("user".into(), json!(shown.unwrap_or_default()));
    row.insert("user_id".into(), json!(user_id.unwrap_or_default()));
    row.insert("user_name".into(), json!(username.unwrap_or_default()));
    row.insert("user_email".into(), json!(email.unwrap_or_default()));
    row.insert("ip_address_v4".into(), json!(v4));
    row.insert("ip_address_v6".into(), json!(v6));
    let geo = object(user.and_then(|u| u.get("geo")), "user.geo")?;
    for key in ["city", "country_code", "region", "subdivision"] {
        let value = optional_string(geo.and_then(|g| g.get(key)), key)?;
        row.insert(format!("user_geo_{key}"), json!(value.unwrap_or_default()));
    }

    let contexts = object(event.get("contexts"), "contexts")?;
    let context = |name: &str| object(contexts.and_then(|c| c.get(name)), name);
    let replay = context("replay")?;
    for key in ["error_sample_rate", "session_sample_rate"] {
        let rate = number(replay.and_then(|r| r.get(key)), key)?;
        row.insert(key.into(), json!(rate.unwrap_or(-1.0)));
    }
    for (name, keys) in [
        ("browser", &["name", "version"][..]),
        ("os", &["name", "version"]),
        ("device", &["brand", "family", "model", "name"]),
        ("ota_updates", &["channel", "runtime_version", "update_id"]),
    ] {
        let context = context(name)?;
        for key in keys {
            let value = optional_string(context.and_then(|c| c.get(*key)), key)?;
            row.insert(format!("{name}_{key}"), json!(value.unwrap_or_default()));
        }
    }
    let sdk = object(event.get("sdk"), "sdk")?;
    for key in ["name", "version"] {
        row.insert(
            format!("sdk_{key}"),
            json!(optional_string(sdk.and_then(|s| s.get(key)), key)?.unwrap_or_default()),
        );
    }
    for key in ["platform", "environment", "release", "dist", "replay_type"] {
        row.insert(
            key.into(),
            json!(optional_string(event.get(key), key)?.unwrap_or_default()),
        );
    }
    let archived = match event.get("is_archived") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("is_archived {other} is not a bool")),
    };
    row.insert("is_archived".into(), json!(u8::from(archived)));
    row.insert("timestamp".into(), json!(saturate(timestamp)));
    let start = number(
        event.get("replay_start_timestamp"),
        "replay_start_timestamp",
    )?;
    row.insert("replay_start_timestamp".into(), json!(start.map(saturate)));
    for key in ["trace_ids", "error_ids"] {
        let ids = strings(event.get(key), key)?.unwrap_or_default();
        let ids: Vec<String> = ids
            .iter()
            .map(|id| {
                Uuid::try_parse(id)
                    .map(|u| u.hyphenated().to_string())
                    .map_err(|_| format!("{key}: {id}"))
            })
            .collect::<Result<_, _>>()?;
        row.insert(key.into(), json!(ids));
    }
    for key in ["urls", "segment_names"] {
        row.insert(
            key.into(),
            json!(strings(event.get(key), key)?.unwrap_or_default()),
        );
    }
    Ok(row)
}

/// Every column's default, as snuba's `ReplayRow::default()` plus the `-1.0` sample rates every
/// branch sets when it has none.
fn default_row() -> Row {
    const DEFAULTS: &str = r#"{"browser_name":"","browser_version":"","click_alt":"","click_aria_label":"","click_class":[],"click_component_name":"","click_id":"","click_is_dead":0,"click_is_rage":0,"click_node_id":0,"click_role":"","click_tag":"","click_testid":"","click_text":"","click_title":"","debug_id":"00000000-0000-0000-0000-000000000000","device_brand":"","device_family":"","device_model":"","device_name":"","dist":"","environment":"","error_id":"00000000-0000-0000-0000-000000000000","error_ids":[],"error_sample_rate":-1.0,"event_hash":"00000000-0000-0000-0000-000000000000","fatal_id":"00000000-0000-0000-0000-000000000000","info_id":"00000000-0000-0000-0000-000000000000","ip_address_v4":null,"ip_address_v6":null,"is_archived":0,"offset":0,"os_name":"","os_version":"","ota_updates_channel":"","ota_updates_runtime_version":"","ota_updates_update_id":"","partition":0,"platform":"","project_id":0,"release":"","replay_id":"00000000-0000-0000-0000-000000000000","replay_start_timestamp":null,"replay_type":"","retention_days":0,"sdk_name":"","sdk_version":"","segment_id":null,"session_sample_rate":-1.0,"tags.key":[],"tags.value":[],"tap_message":"","tap_view_class":"","tap_view_id":"","timestamp":0,"title":null,"trace_ids":[],"urls":[],"segment_names":[],"user_email":"","user_id":"","user_name":"","user":"","user_geo_city":"","user_geo_country_code":"","user_geo_region":"","user_geo_subdivision":"","viewed_by_id":0,"warning_id":"00000000-0000-0000-0000-000000000000"}"#;
    serde_json::from_str(DEFAULTS).unwrap()
}

/// Rust's `f64 as u32`: truncated, saturating, NaN → 0.
fn saturate(seconds: f64) -> u32 {
    seconds as u32
}

fn uuid(value: &Value, what: &str) -> Result<Uuid, String> {
    value
        .as_str()
        .and_then(|s| Uuid::try_parse(s).ok())
        .ok_or_else(|| format!("{what} {value} is not a UUID"))
}

fn number(value: Option<&Value>, what: &str) -> Result<Option<f64>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("{what} {v} is not a number")),
    }
}

fn small(value: Option<&Value>, what: &str, max: u64) -> Result<u64, String> {
    value
        .and_then(Value::as_u64)
        .filter(|n| *n <= max)
        .ok_or_else(|| format!("{what} {value:?} is not an integer ≤ {max}"))
}

fn required_string(value: Option<&Value>, what: &str) -> Result<String, String> {
    value
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("{what} {value:?} is not a string"))
}

fn optional_string(value: Option<&Value>, what: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{what} {other} is not a string")),
    }
}

fn strings(value: Option<&Value>, what: &str) -> Result<Option<Vec<String>>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| required_string(Some(i), what))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(other) => Err(format!("{what} {other} is not a list of strings")),
    }
}

fn object<'a>(
    value: Option<&'a Value>,
    what: &str,
) -> Result<Option<&'a Map<String, Value>>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(other) => Err(format!("{what} {other} is not an object")),
    }
}
