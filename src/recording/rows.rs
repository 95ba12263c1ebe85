//! ClickHouse rows for the `replays` table (SPEC §5.2): one row per click, one per tap, and one per
//! segment whose replay event this service must publish.
//!
//! All kinds share one wide row, as in the `replays` table the ecosystem queries; columns that do
//! not apply to a kind keep their defaults. `event_hash` is deterministic (SPEC §4), so a
//! redelivered segment produces identical rows and the ReplacingMergeTree collapses them.

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::ids::SegmentIds;
use super::replay_event::ReplayEvent;
use super::rrweb::{Click, Extracted, Tap};

/// What a row describes. Stored as `Enum8('segment' = 0, 'click' = 1, 'tap' = 2)`, which
/// RowBinary carries as its `u8` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RowKind {
    Segment = 0,
    Click = 1,
    Tap = 2,
}

impl Serialize for RowKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for RowKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u8::deserialize(deserializer)? {
            0 => Ok(RowKind::Segment),
            1 => Ok(RowKind::Click),
            2 => Ok(RowKind::Tap),
            other => Err(serde::de::Error::custom(format_args!("unknown row kind {other}"))),
        }
    }
}

/// One row of the `replays` table, fields in column order (RowBinary is positional).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clickhouse::Row)]
pub struct ReplayRow {
    pub kind: RowKind,
    pub project_id: u64,
    #[serde(with = "clickhouse::serde::uuid")]
    pub replay_id: Uuid,
    /// Deduplication key within `(project_id, day, replay_id)`.
    #[serde(with = "clickhouse::serde::uuid")]
    pub event_hash: Uuid,
    /// Unix seconds (ClickHouse `DateTime`).
    pub timestamp: u32,
    pub retention_days: u16,
    pub segment_id: u32,
    // Segment rows (from the replay event).
    pub replay_start_timestamp: Option<u32>,
    pub replay_type: String,
    pub platform: String,
    pub environment: String,
    pub release: String,
    pub dist: String,
    pub urls: Vec<String>,
    #[serde(with = "clickhouse::serde::uuid_vec")]
    pub error_ids: Vec<Uuid>,
    #[serde(with = "clickhouse::serde::uuid_vec")]
    pub trace_ids: Vec<Uuid>,
    pub user_id: String,
    pub user_name: String,
    pub user_email: String,
    pub ip_address: String,
    pub os_name: String,
    pub os_version: String,
    pub browser_name: String,
    pub browser_version: String,
    pub device_name: String,
    pub device_brand: String,
    pub device_family: String,
    pub device_model: String,
    pub sdk_name: String,
    pub sdk_version: String,
    pub error_sample_rate: Option<f64>,
    pub session_sample_rate: Option<f64>,
    pub tags_key: Vec<String>,
    pub tags_value: Vec<String>,
    // Click rows.
    pub click_node_id: u64,
    pub click_tag: String,
    pub click_id: String,
    pub click_class: Vec<String>,
    pub click_text: String,
    pub click_role: String,
    pub click_alt: String,
    pub click_testid: String,
    pub click_aria_label: String,
    pub click_title: String,
    pub click_component_name: String,
    pub click_selector: String,
    pub click_url: String,
    pub click_is_dead: bool,
    pub click_is_rage: bool,
    // Tap rows.
    pub tap_message: String,
    pub tap_view_class: String,
    pub tap_view_id: String,
}

impl ReplayRow {
    fn base(kind: RowKind, ids: &SegmentIds, event_hash: Uuid, timestamp: u32) -> Self {
        ReplayRow {
            kind,
            project_id: ids.project_id,
            replay_id: ids.replay_uuid,
            event_hash,
            timestamp,
            retention_days: ids.retention_days,
            segment_id: ids.segment_id,
            replay_start_timestamp: None,
            replay_type: String::new(),
            platform: String::new(),
            environment: String::new(),
            release: String::new(),
            dist: String::new(),
            urls: Vec::new(),
            error_ids: Vec::new(),
            trace_ids: Vec::new(),
            user_id: String::new(),
            user_name: String::new(),
            user_email: String::new(),
            ip_address: String::new(),
            os_name: String::new(),
            os_version: String::new(),
            browser_name: String::new(),
            browser_version: String::new(),
            device_name: String::new(),
            device_brand: String::new(),
            device_family: String::new(),
            device_model: String::new(),
            sdk_name: String::new(),
            sdk_version: String::new(),
            error_sample_rate: None,
            session_sample_rate: None,
            tags_key: Vec::new(),
            tags_value: Vec::new(),
            click_node_id: 0,
            click_tag: String::new(),
            click_id: String::new(),
            click_class: Vec::new(),
            click_text: String::new(),
            click_role: String::new(),
            click_alt: String::new(),
            click_testid: String::new(),
            click_aria_label: String::new(),
            click_title: String::new(),
            click_component_name: String::new(),
            click_selector: String::new(),
            click_url: String::new(),
            click_is_dead: false,
            click_is_rage: false,
            tap_message: String::new(),
            tap_view_class: String::new(),
            tap_view_id: String::new(),
        }
    }
}

/// UUID whose 16 bytes are the md5 of `input`.
pub fn md5_uuid(input: &str) -> Uuid {
    Uuid::from_bytes(Md5::digest(input.as_bytes()).into())
}

/// Whole seconds, clamped into `DateTime`'s range.
fn seconds(timestamp: f64) -> u32 {
    timestamp.clamp(0.0, f64::from(u32::MAX)) as u32
}

/// `md5("{replay_id}{timestamp}{node_id}")`, timestamp in whole seconds (SPEC §4).
pub fn click_event_hash(replay_id: &str, timestamp: f64, node_id: u64) -> Uuid {
    md5_uuid(&format!("{replay_id}{}{node_id}", seconds(timestamp)))
}

/// `md5("{replay_id}{timestamp}{view_id}")`, timestamp in whole seconds (SPEC §4).
pub fn tap_event_hash(replay_id: &str, timestamp: f64, view_id: &str) -> Uuid {
    md5_uuid(&format!("{replay_id}{}{view_id}", seconds(timestamp)))
}

/// `md5("{replay_id}:segment:{segment_id}")`: one segment row per segment.
pub fn segment_event_hash(replay_id: &str, segment_id: u32) -> Uuid {
    md5_uuid(&format!("{replay_id}:segment:{segment_id}"))
}

/// The rows of one segment: its segment row when `replay_event` is to be written, then one per
/// click and one per tap. Built when the flush writes them, not kept: each row copies strings
/// the extracted clicks already hold.
pub fn build(ids: &SegmentIds, replay_event: Option<&ReplayEvent>, extracted: &Extracted) -> Vec<ReplayRow> {
    let mut rows =
        Vec::with_capacity(usize::from(replay_event.is_some()) + extracted.clicks.len() + extracted.taps.len());
    rows.extend(replay_event.map(|event| segment_row(ids, event)));
    rows.extend(extracted.clicks.iter().map(|c| click_row(ids, c)));
    rows.extend(extracted.taps.iter().map(|t| tap_row(ids, t)));
    rows
}

pub fn click_row(ids: &SegmentIds, click: &Click) -> ReplayRow {
    let hash = click_event_hash(&ids.replay_id, click.timestamp, click.node_id);
    ReplayRow {
        click_node_id: click.node_id,
        click_tag: click.tag.clone(),
        click_id: click.id.clone(),
        click_class: click.classes.clone(),
        click_text: click.text.clone(),
        click_role: click.role.clone(),
        click_alt: click.alt.clone(),
        click_testid: click.testid.clone(),
        click_aria_label: click.aria_label.clone(),
        click_title: click.title.clone(),
        click_component_name: click.component_name.clone(),
        click_selector: click.selector.clone(),
        click_url: click.url.to_string(),
        click_is_dead: click.is_dead,
        click_is_rage: click.is_rage,
        ..ReplayRow::base(RowKind::Click, ids, hash, seconds(click.timestamp))
    }
}

pub fn tap_row(ids: &SegmentIds, tap: &Tap) -> ReplayRow {
    let hash = tap_event_hash(&ids.replay_id, tap.timestamp, &tap.view_id);
    ReplayRow {
        tap_message: tap.message.clone(),
        tap_view_class: tap.view_class.clone(),
        tap_view_id: tap.view_id.clone(),
        ..ReplayRow::base(RowKind::Tap, ids, hash, seconds(tap.timestamp))
    }
}

/// The segment row; its timestamp is the event's, else the time the edge received it.
pub fn segment_row(ids: &SegmentIds, event: &ReplayEvent) -> ReplayRow {
    let timestamp = event.timestamp.map_or(seconds(ids.received as f64), seconds);
    let (tags_key, tags_value) = event.tags.iter().cloned().unzip();
    ReplayRow {
        replay_start_timestamp: event.replay_start_timestamp.map(seconds),
        replay_type: event.replay_type.clone(),
        platform: event.platform.clone(),
        environment: event.environment.clone(),
        release: event.release.clone(),
        dist: event.dist.clone(),
        urls: event.urls.iter().map(|url| url.to_string()).collect(),
        error_ids: event.error_ids.clone(),
        trace_ids: event.trace_ids.clone(),
        user_id: event.user_id.clone(),
        user_name: event.user_name.clone(),
        user_email: event.user_email.clone(),
        ip_address: event.ip_address.clone(),
        os_name: event.os_name.clone(),
        os_version: event.os_version.clone(),
        browser_name: event.browser_name.clone(),
        browser_version: event.browser_version.clone(),
        device_name: event.device_name.clone(),
        device_brand: event.device_brand.clone(),
        device_family: event.device_family.clone(),
        device_model: event.device_model.clone(),
        sdk_name: event.sdk_name.clone(),
        sdk_version: event.sdk_version.clone(),
        error_sample_rate: event.error_sample_rate,
        session_sample_rate: event.session_sample_rate,
        tags_key,
        tags_value,
        ..ReplayRow::base(RowKind::Segment, ids, segment_event_hash(&ids.replay_id, ids.segment_id), timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLAY: &str = "6aa0d45db9b94b989501ce3be4daf802";

    #[test]
    fn click_event_hash_is_md5_of_replay_second_and_node_as_a_uuid() {
        // md5("6aa0d45db9b94b989501ce3be4daf802179601244814") computed independently.
        let expected = Uuid::from_bytes(Md5::digest(format!("{REPLAY}179601244814").as_bytes()).into());
        assert_eq!(click_event_hash(REPLAY, 1_796_012_448.69, 14), expected);
        assert_eq!(click_event_hash(REPLAY, 1_796_012_448.01, 14), expected, "sub-second part is dropped");
        assert_ne!(click_event_hash(REPLAY, 1_796_012_448.0, 15), expected);
    }

    #[test]
    fn md5_uuid_matches_a_known_digest() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(md5_uuid("").simple().to_string(), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn tap_event_hash_uses_the_view_id() {
        assert_eq!(tap_event_hash(REPLAY, 10.5, "btn"), md5_uuid(&format!("{REPLAY}10btn")));
    }

    #[test]
    fn timestamps_are_clamped_into_datetime_range() {
        assert_eq!(seconds(-5.0), 0);
        assert_eq!(seconds(1e20), u32::MAX);
        assert_eq!(seconds(f64::NAN), 0);
    }
}
