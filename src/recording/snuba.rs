//! The rows of a segment as `ingest-replay-events` messages, the way Sentry publishes them for
//! snuba's replays consumer to insert (`--rows-sink snuba`; `docs/outputs.md`):
//!
//! - the replay event, when this service owns the segment row (`relay_snuba_publish_disabled`):
//!   `{"start_time","replay_id","project_id","retention_days","payload":<the replay event as sent>}`;
//! - the segment's clicks as one `replay_actions` message, its taps as one `replay_tap` message,
//!   each in an envelope with `"type":"replay_event"`.
//!
//! Snuba's processor turns these into exactly the rows `rows::build` writes directly (a test maps
//! every fixture's messages through snuba's mapping and compares). Two deliberate differences
//! from Sentry: the clicks' and taps' `start_time` is the edge's receive time, not the publish
//! time, so a redelivered segment publishes identical bytes; and `timestamp` and `node_id` are
//! clamped to what snuba's columns hold (snuba clamps timestamps itself and would reject a
//! `node_id` past 32 bits). Messages carry no key, as Sentry's do.

use compact_str::CompactString;
use serde::Serialize;
use serde_json::value::RawValue;

use super::Processed;
use super::rows::{click_event_hash, seconds, tap_event_hash};
use super::rrweb::{Click, Tap};

/// The inner `type` of a click message.
pub const CLICKS: &str = "replay_actions";
/// The inner `type` of a tap message.
pub const TAPS: &str = "replay_tap";

/// The `ingest-replay-events` messages of one segment, serialized, in the order of its rows.
pub fn messages(p: &Processed) -> Result<Vec<Vec<u8>>, serde_json::Error> {
    let ids = &p.ids;
    let mut messages = Vec::new();
    if p.writes_segment_row
        && let Some(raw) = &p.replay_event_json
    {
        let payload = raw.get();
        messages.push(serde_json::to_vec(&SegmentEnvelope {
            start_time: ids.received,
            replay_id: &ids.replay_id,
            project_id: ids.project_id,
            retention_days: ids.retention_days,
            payload,
        })?);
    }
    let environment = p.replay_event.as_ref().map_or("", |e| e.environment());
    // One message per kind of item: the items in an envelope, with `"type":"replay_event"`.
    let mut publish = |items: Items<'_>| -> Result<(), serde_json::Error> {
        messages.push(serde_json::to_vec(&Envelope {
            project_id: ids.project_id,
            replay_id: &ids.replay_id,
            retention_days: ids.retention_days,
            start_time: ids.received as f64,
            kind: "replay_event",
            payload: Inner {
                environment,
                replay_id: &ids.replay_id,
                items,
            },
        })?);
        Ok(())
    };
    let (clicks, taps) = (&p.extracted.clicks, &p.extracted.taps);
    if !clicks.is_empty() {
        publish(Items::Clicks {
            clicks: clicks
                .iter()
                .map(|c| ClickItem::new(&ids.replay_id, c))
                .collect(),
        })?;
    }
    if !taps.is_empty() {
        publish(Items::Taps {
            taps: taps
                .iter()
                .map(|t| TapItem::new(&ids.replay_id, t))
                .collect(),
        })?;
    }
    Ok(messages)
}

#[derive(Serialize)]
struct SegmentEnvelope<'a> {
    start_time: u64,
    replay_id: &'a str,
    project_id: u64,
    retention_days: u16,
    payload: &'a RawValue,
}

#[derive(Serialize)]
struct Envelope<'a> {
    project_id: u64,
    replay_id: &'a str,
    retention_days: u16,
    start_time: f64,
    #[serde(rename = "type")]
    kind: &'static str,
    payload: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    environment: &'a str,
    replay_id: &'a str,
    #[serde(flatten)]
    items: Items<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum Items<'a> {
    #[serde(rename = "replay_actions")]
    Clicks { clicks: Vec<ClickItem<'a>> },
    #[serde(rename = "replay_tap")]
    Taps { taps: Vec<TapItem<'a>> },
}

#[derive(Serialize)]
struct ClickItem<'a> {
    alt: &'a str,
    aria_label: &'a str,
    class: &'a [CompactString],
    component_name: &'a str,
    event_hash: String,
    id: &'a str,
    is_dead: u8,
    is_rage: u8,
    node_id: u32,
    role: &'a str,
    tag: &'a str,
    testid: &'a str,
    text: &'a str,
    timestamp: u32,
    title: &'a str,
}

impl<'a> ClickItem<'a> {
    fn new(replay_id: &str, c: &'a Click) -> Self {
        ClickItem {
            alt: &c.alt,
            aria_label: &c.aria_label,
            class: &c.classes,
            component_name: &c.component_name,
            event_hash: click_event_hash(replay_id, c.timestamp, c.node_id)
                .hyphenated()
                .to_string(),
            id: &c.id,
            is_dead: u8::from(c.is_dead),
            is_rage: u8::from(c.is_rage),
            node_id: u32::try_from(c.node_id).unwrap_or(u32::MAX),
            role: &c.role,
            tag: &c.tag,
            testid: &c.testid,
            text: &c.text,
            timestamp: seconds(c.timestamp),
            title: &c.title,
        }
    }
}

#[derive(Serialize)]
struct TapItem<'a> {
    message: &'a str,
    view_id: &'a str,
    view_class: &'a str,
    timestamp: u32,
    event_hash: String,
}

impl<'a> TapItem<'a> {
    fn new(replay_id: &str, t: &'a Tap) -> Self {
        TapItem {
            message: &t.message,
            view_id: &t.view_id,
            view_class: &t.view_class,
            timestamp: seconds(t.timestamp),
            event_hash: tap_event_hash(replay_id, t.timestamp, &t.view_id)
                .hyphenated()
                .to_string(),
        }
    }
}
