//! Rows of snuba's `replays_local` table: one per click, one per tap, and one per segment whose
//! replay event this service publishes — each exactly as snuba's replays processor would build
//! it from the message Sentry publishes on `ingest-replay-events` (`docs/outputs.md`).
//!
//! All kinds share one wide row; snuba tells them apart by their content (a segment row has a
//! `segment_id`, a click row a `click_node_id`, a tap row its `tap_*` fields), and columns that do
//! not apply keep snuba's defaults: "" for strings, 0, the nil UUID, `-1.0` for the sample rates
//! of click and tap rows, NULL for `segment_id`, `title` and the addresses. `event_hash` is
//! deterministic, so a redelivered segment produces identical rows, which the
//! ReplacingMergeTree collapses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::ids::SegmentIds;
use super::replay_event::ReplayEvent;
use super::rrweb::{Click, Extracted, Tap};

/// Where the message sat in Kafka: snuba stores it in every row (`partition`, `offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KafkaPosition {
    pub partition: i32,
    pub offset: i64,
}

/// One row of `replays_local`: the columns snuba's processor writes, in table order (RowBinary is
/// positional). Materialized columns and `url` (never written) are left to the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clickhouse::Row)]
pub struct ReplayRow {
    #[serde(with = "clickhouse::serde::uuid")]
    pub replay_id: Uuid,
    #[serde(with = "clickhouse::serde::uuid")]
    pub debug_id: Uuid,
    #[serde(with = "clickhouse::serde::uuid")]
    pub info_id: Uuid,
    #[serde(with = "clickhouse::serde::uuid")]
    pub warning_id: Uuid,
    #[serde(with = "clickhouse::serde::uuid")]
    pub error_id: Uuid,
    #[serde(with = "clickhouse::serde::uuid")]
    pub fatal_id: Uuid,
    pub replay_type: Option<String>,
    pub error_sample_rate: Option<f64>,
    pub session_sample_rate: Option<f64>,
    /// Deduplication key within `(project_id, day, replay_id)`.
    #[serde(with = "clickhouse::serde::uuid")]
    pub event_hash: Uuid,
    /// Set on segment rows only (NULL above 65 535, as snuba stores it).
    pub segment_id: Option<u16>,
    #[serde(with = "clickhouse::serde::uuid_vec")]
    pub trace_ids: Vec<Uuid>,
    pub title: Option<String>,
    pub urls: Vec<String>,
    pub segment_names: Vec<String>,
    pub is_archived: Option<u8>,
    #[serde(with = "clickhouse::serde::uuid_vec")]
    pub error_ids: Vec<Uuid>,
    pub project_id: u64,
    /// Unix seconds (ClickHouse `DateTime`).
    pub timestamp: u32,
    pub replay_start_timestamp: Option<u32>,
    pub platform: String,
    /// Shared by a segment's click and tap rows: a replay event's environment is not cut (Relay
    /// bounds it; a producer writing to the topic directly need not), and a copy per row made up
    /// to 41 of it per segment.
    pub environment: Option<Arc<str>>,
    pub release: Option<String>,
    pub dist: Option<String>,
    #[serde(with = "ipv4_column")]
    pub ip_address_v4: Option<Ipv4Addr>,
    pub ip_address_v6: Option<Ipv6Addr>,
    pub user: Option<String>,
    pub user_id: Option<String>,
    pub user_name: Option<String>,
    pub user_email: Option<String>,
    pub user_geo_city: String,
    pub user_geo_country_code: String,
    pub user_geo_region: String,
    pub user_geo_subdivision: String,
    pub viewed_by_id: u64,
    pub os_name: Option<String>,
    pub os_version: Option<String>,
    pub browser_name: Option<String>,
    pub browser_version: Option<String>,
    pub device_name: Option<String>,
    pub device_brand: Option<String>,
    pub device_family: Option<String>,
    pub device_model: Option<String>,
    pub ota_updates_channel: String,
    pub ota_updates_runtime_version: String,
    pub ota_updates_update_id: String,
    pub sdk_name: Option<String>,
    pub sdk_version: Option<String>,
    #[serde(rename = "tags.key")]
    pub tags_key: Vec<String>,
    #[serde(rename = "tags.value")]
    pub tags_value: Vec<String>,
    pub click_node_id: u32,
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
    pub click_is_dead: u8,
    pub click_is_rage: u8,
    pub tap_message: String,
    pub tap_view_class: String,
    pub tap_view_id: String,
    pub retention_days: u16,
    pub partition: u16,
    pub offset: u64,
}

/// `Nullable(IPv4)`: a `UInt32` in RowBinary, the dotted address in JSON (as snuba writes it).
mod ipv4_column {
    use std::net::Ipv4Addr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        ip: &Option<Ipv4Addr>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match ip {
            Some(ip) if serializer.is_human_readable() => serializer.serialize_some(ip),
            Some(ip) => serializer.serialize_some(&u32::from(*ip)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Ipv4Addr>, D::Error> {
        if deserializer.is_human_readable() {
            Option::<Ipv4Addr>::deserialize(deserializer)
        } else {
            Ok(Option::<u32>::deserialize(deserializer)?.map(Ipv4Addr::from))
        }
    }
}

/// `Some("")`: snuba writes an empty string, not NULL, into these nullable columns.
fn empty() -> Option<String> {
    Some(String::new())
}

impl ReplayRow {
    /// A row with snuba's defaults, as its processor builds a click, tap or event row.
    fn base(ids: &SegmentIds, at: KafkaPosition, event_hash: Uuid, timestamp: u32) -> Self {
        ReplayRow {
            replay_id: ids.replay_uuid,
            debug_id: Uuid::nil(),
            info_id: Uuid::nil(),
            warning_id: Uuid::nil(),
            error_id: Uuid::nil(),
            fatal_id: Uuid::nil(),
            replay_type: empty(),
            error_sample_rate: Some(-1.0),
            session_sample_rate: Some(-1.0),
            event_hash,
            segment_id: None,
            trace_ids: Vec::new(),
            title: None,
            urls: Vec::new(),
            segment_names: Vec::new(),
            is_archived: Some(0),
            error_ids: Vec::new(),
            project_id: ids.project_id,
            timestamp,
            replay_start_timestamp: None,
            platform: String::new(),
            environment: Some(Arc::from("")),
            release: empty(),
            dist: empty(),
            ip_address_v4: None,
            ip_address_v6: None,
            user: empty(),
            user_id: empty(),
            user_name: empty(),
            user_email: empty(),
            user_geo_city: String::new(),
            user_geo_country_code: String::new(),
            user_geo_region: String::new(),
            user_geo_subdivision: String::new(),
            viewed_by_id: 0,
            os_name: empty(),
            os_version: empty(),
            browser_name: empty(),
            browser_version: empty(),
            device_name: empty(),
            device_brand: empty(),
            device_family: empty(),
            device_model: empty(),
            ota_updates_channel: String::new(),
            ota_updates_runtime_version: String::new(),
            ota_updates_update_id: String::new(),
            sdk_name: empty(),
            sdk_version: empty(),
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
            click_is_dead: 0,
            click_is_rage: 0,
            tap_message: String::new(),
            tap_view_class: String::new(),
            tap_view_id: String::new(),
            retention_days: ids.retention_days,
            partition: u16::try_from(at.partition).unwrap_or_default(),
            offset: u64::try_from(at.offset).unwrap_or_default(),
        }
    }

    /// Whether this is a segment row (snuba's way of telling: only those have a `segment_id`,
    /// unless the event's own id was above 65 535).
    pub fn is_segment(&self) -> bool {
        self.segment_id.is_some()
    }
}

/// UUID whose 16 bytes are the md5 of `input`.
pub fn md5_uuid(input: &str) -> Uuid {
    Uuid::from_bytes(Md5::digest(input.as_bytes()).into())
}

/// Whole seconds, clamped into `DateTime`'s range.
pub fn seconds(timestamp: f64) -> u32 {
    timestamp.clamp(0.0, f64::from(u32::MAX)) as u32
}

/// Whole seconds as Sentry puts them in an id: Python's `int()` of the float, truncated toward
/// zero and not clamped (the row's column is; the hash keeps what was sent, `-1` or `5000000000`).
fn id_seconds(timestamp: f64) -> i128 {
    timestamp.trunc() as i128
}

/// `md5("{replay_id}{timestamp}{node_id}")`, timestamp in whole seconds (docs/formats.md, "What a segment yields").
pub fn click_event_hash(replay_id: &str, timestamp: f64, node_id: u64) -> Uuid {
    md5_uuid(&format!("{replay_id}{}{node_id}", id_seconds(timestamp)))
}

/// `md5("{replay_id}{timestamp}{view_id}")`, timestamp in whole seconds (docs/formats.md, "What a segment yields").
pub fn tap_event_hash(replay_id: &str, timestamp: f64, view_id: &str) -> Uuid {
    md5_uuid(&format!("{replay_id}{}{view_id}", id_seconds(timestamp)))
}

/// A segment row's `event_hash` as snuba computes it: the 16 bytes of the md5 of the segment
/// id's decimal digits.
pub fn segment_event_hash(segment_id: u32) -> Uuid {
    md5_uuid(&segment_id.to_string())
}

/// The rows of one segment: its segment row when `replay_event` is to be written, then one per
/// click and one per tap. Built when the flush writes them, not kept: each row copies strings
/// the extracted clicks already hold. Click and tap rows carry the replay event's environment,
/// as Sentry's click and tap messages do.
pub fn build(
    ids: &SegmentIds,
    at: KafkaPosition,
    replay_event: Option<&ReplayEvent>,
    publish_replay_event: bool,
    extracted: &Extracted,
) -> Vec<ReplayRow> {
    let environment: Arc<str> =
        Arc::from(replay_event.map(|e| e.environment()).unwrap_or_default());
    let segment = replay_event.filter(|_| publish_replay_event);
    let mut rows = Vec::with_capacity(
        usize::from(segment.is_some()) + extracted.clicks.len() + extracted.taps.len(),
    );
    rows.extend(segment.map(|event| segment_row(ids, at, event)));
    rows.extend(
        extracted
            .clicks
            .iter()
            .map(|c| click_row(ids, at, &environment, c)),
    );
    rows.extend(
        extracted
            .taps
            .iter()
            .map(|t| tap_row(ids, at, &environment, t)),
    );
    rows
}

pub fn click_row(
    ids: &SegmentIds,
    at: KafkaPosition,
    environment: &Arc<str>,
    click: &Click,
) -> ReplayRow {
    let hash = click_event_hash(&ids.replay_id, click.timestamp, click.node_id);
    ReplayRow {
        environment: Some(environment.clone()),
        click_node_id: u32::try_from(click.node_id).unwrap_or(u32::MAX),
        click_tag: click.tag.as_str().to_owned(),
        click_id: click.id.as_str().to_owned(),
        click_class: click
            .classes
            .iter()
            .map(|class| class.as_str().to_owned())
            .collect(),
        click_text: click.text.as_str().to_owned(),
        click_role: click.role.as_str().to_owned(),
        click_alt: click.alt.as_str().to_owned(),
        click_testid: click.testid.as_str().to_owned(),
        click_aria_label: click.aria_label.as_str().to_owned(),
        click_title: click.title.as_str().to_owned(),
        click_component_name: click.component_name.as_str().to_owned(),
        click_is_dead: u8::from(click.is_dead),
        click_is_rage: u8::from(click.is_rage),
        ..ReplayRow::base(ids, at, hash, seconds(click.timestamp))
    }
}

pub fn tap_row(
    ids: &SegmentIds,
    at: KafkaPosition,
    environment: &Arc<str>,
    tap: &Tap,
) -> ReplayRow {
    let hash = tap_event_hash(&ids.replay_id, tap.timestamp, &tap.view_id);
    ReplayRow {
        environment: Some(environment.clone()),
        tap_message: tap.message.as_str().to_owned(),
        tap_view_class: tap.view_class.as_str().to_owned(),
        tap_view_id: tap.view_id.as_str().to_owned(),
        ..ReplayRow::base(ids, at, hash, seconds(tap.timestamp))
    }
}

/// The segment row, as snuba maps the replay event: its own `replay_id` and `segment_id` when
/// it has them (the recording's otherwise), `title` from the last `transaction` tag, the user's
/// address split by family, `user` the first of id, username, email and address that is present,
/// sample rates `-1.0` when absent. Its timestamp is the event's, else the time the edge
/// received the segment.
pub fn segment_row(ids: &SegmentIds, at: KafkaPosition, event: &ReplayEvent) -> ReplayRow {
    let timestamp = event
        .timestamp
        .map_or(seconds(ids.received as f64), seconds);
    // A missing `segment_id` leaves the column NULL, as in snuba; the hash, which snuba would
    // randomise, comes from the recording's segment id so that a redelivery collapses.
    let hash = event
        .event_hash
        .unwrap_or_else(|| segment_event_hash(event.segment_id.unwrap_or(ids.segment_id)));
    let ip = (event.ip_address()).and_then(|ip| ip.parse::<IpAddr>().ok());
    let (ip_address_v4, ip_address_v6) = match ip {
        Some(IpAddr::V4(v4)) => (Some(v4), None),
        Some(IpAddr::V6(v6)) => (None, Some(v6)),
        None => (None, None),
    };
    let user = (event.user_id())
        .or(event.user_name())
        .or(event.user_email())
        .map(str::to_owned)
        .or_else(|| ip.map(|ip| ip.to_string()))
        .unwrap_or_default();
    let (tags_key, tags_value) = (event.tags.iter())
        .map(|(key, value)| (key.as_str().to_owned(), value.as_str().to_owned()))
        .unzip();
    ReplayRow {
        replay_id: event.replay_id.unwrap_or(ids.replay_uuid),
        replay_type: Some(event.replay_type().to_owned()),
        error_sample_rate: Some(event.error_sample_rate.unwrap_or(-1.0)),
        session_sample_rate: Some(event.session_sample_rate.unwrap_or(-1.0)),
        segment_id: event.segment_id.and_then(|id| u16::try_from(id).ok()),
        trace_ids: event.trace_ids.clone(),
        title: event.title().map(str::to_owned),
        urls: event.urls.iter().map(|url| url.to_string()).collect(),
        segment_names: event
            .segment_names
            .iter()
            .map(|name| name.as_str().to_owned())
            .collect(),
        is_archived: Some(u8::from(event.is_archived)),
        error_ids: event.error_ids.clone(),
        replay_start_timestamp: event.replay_start_timestamp.map(seconds),
        platform: event.platform().to_owned(),
        environment: Some(Arc::from(event.environment())),
        release: Some(event.release().to_owned()),
        dist: Some(event.dist().to_owned()),
        ip_address_v4,
        ip_address_v6,
        user: Some(user),
        user_id: Some(event.user_id().unwrap_or_default().to_owned()),
        user_name: Some(event.user_name().unwrap_or_default().to_owned()),
        user_email: Some(event.user_email().unwrap_or_default().to_owned()),
        user_geo_city: event.geo_city().to_owned(),
        user_geo_country_code: event.geo_country_code().to_owned(),
        user_geo_region: event.geo_region().to_owned(),
        user_geo_subdivision: event.geo_subdivision().to_owned(),
        os_name: Some(event.os_name().to_owned()),
        os_version: Some(event.os_version().to_owned()),
        browser_name: Some(event.browser_name().to_owned()),
        browser_version: Some(event.browser_version().to_owned()),
        device_name: Some(event.device_name().to_owned()),
        device_brand: Some(event.device_brand().to_owned()),
        device_family: Some(event.device_family().to_owned()),
        device_model: Some(event.device_model().to_owned()),
        ota_updates_channel: event.ota_updates_channel().to_owned(),
        ota_updates_runtime_version: event.ota_updates_runtime_version().to_owned(),
        ota_updates_update_id: event.ota_updates_update_id().to_owned(),
        sdk_name: Some(event.sdk_name().to_owned()),
        sdk_version: Some(event.sdk_version().to_owned()),
        tags_key,
        tags_value,
        ..ReplayRow::base(ids, at, hash, timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLAY: &str = "6aa0d45db9b94b989501ce3be4daf802";

    #[test]
    fn click_event_hash_is_md5_of_replay_second_and_node_as_a_uuid() {
        // md5("6aa0d45db9b94b989501ce3be4daf802179601244814") computed independently.
        let expected =
            Uuid::from_bytes(Md5::digest(format!("{REPLAY}179601244814").as_bytes()).into());
        assert_eq!(click_event_hash(REPLAY, 1_796_012_448.69, 14), expected);
        assert_eq!(
            click_event_hash(REPLAY, 1_796_012_448.01, 14),
            expected,
            "sub-second part is dropped"
        );
        assert_ne!(click_event_hash(REPLAY, 1_796_012_448.0, 15), expected);
    }

    #[test]
    fn md5_uuid_matches_a_known_digest() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(
            md5_uuid("").simple().to_string(),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
    }

    #[test]
    fn tap_event_hash_uses_the_view_id() {
        assert_eq!(
            tap_event_hash(REPLAY, 10.5, "btn"),
            md5_uuid(&format!("{REPLAY}10btn"))
        );
    }

    /// Outside the column's range the hash keeps Python's `int()` of the timestamp, as Sentry's
    /// does: truncated toward zero, not clamped.
    #[test]
    fn event_hashes_take_the_timestamp_as_sent_not_the_columns_clamped_value() {
        for (timestamp, digits) in [
            (-1.5, "-1"),
            (-0.5, "0"),
            (5e9, "5000000000"),
            (1e20, "100000000000000000000"),
        ] {
            assert_eq!(
                click_event_hash(REPLAY, timestamp, 3),
                md5_uuid(&format!("{REPLAY}{digits}3")),
                "{timestamp}"
            );
            assert_eq!(
                tap_event_hash(REPLAY, timestamp, "v"),
                md5_uuid(&format!("{REPLAY}{digits}v")),
                "{timestamp}"
            );
        }
    }

    /// Identifiers of the examples in snuba's compatibility notes: replay `834f314c…`, project 1,
    /// 90 days.
    fn example_ids() -> SegmentIds {
        let replay_id = "834f314caae54030a1b0dc52b202f24a";
        SegmentIds {
            replay_id: replay_id.into(),
            replay_uuid: Uuid::try_parse(replay_id).unwrap(),
            segment_id: 0,
            retention_days: 90,
            project_id: 1,
            ..SegmentIds::for_tests(0)
        }
    }

    const AT: KafkaPosition = KafkaPosition {
        partition: 0,
        offset: 1,
    };

    fn json(row: &ReplayRow) -> serde_json::Value {
        serde_json::to_value(row).unwrap()
    }

    /// The row snuba's processor writes for the replay event Sentry publishes (documented output
    /// of the processor for this exact event).
    #[test]
    fn a_segment_row_is_what_snuba_writes_for_the_published_replay_event() {
        let event = crate::recording::replay_event::parse(
            br#"{"type":"replay_event","replay_id":"834f314caae54030a1b0dc52b202f24a","replay_type":"session","segment_id":0,"event_id":"834f314caae54030a1b0dc52b202f24a","timestamp":1702848658.558,"replay_start_timestamp":1702848650.12,"urls":["https://example.com/signup"],"error_ids":[],"trace_ids":["2cd798d70f9346089026d2014a826629"],"contexts":{"browser":{"name":"Chrome","version":"120.0.0","type":"browser"},"os":{"name":"Mac OS X","version":"10.15.7","type":"os"},"device":{"family":"Mac","brand":"Apple","model":"Mac","type":"device"},"replay":{"error_sample_rate":1.0,"session_sample_rate":0.1,"type":"replay"}},"platform":"javascript","release":"frontend@1.2.3","dist":null,"environment":"production","tags":[["transaction","/signup"],["browser","Chrome 120"],["foo",null]],"user":{"id":42,"email":"a@example.com","ip_address":"2001:db8::1","geo":{"country_code":"US","city":"Austin"}},"sdk":{"name":"sentry.javascript.react","version":"7.91.0"}}"#,
        )
        .unwrap();
        let expected: serde_json::Value = serde_json::from_str(r#"{"browser_name":"Chrome","browser_version":"120.0.0","click_alt":"","click_aria_label":"","click_class":[],"click_component_name":"","click_id":"","click_is_dead":0,"click_is_rage":0,"click_node_id":0,"click_role":"","click_tag":"","click_testid":"","click_text":"","click_title":"","debug_id":"00000000-0000-0000-0000-000000000000","device_brand":"Apple","device_family":"Mac","device_model":"Mac","device_name":"","dist":"","environment":"production","error_id":"00000000-0000-0000-0000-000000000000","error_ids":[],"error_sample_rate":1.0,"event_hash":"cfcd2084-95d5-65ef-66e7-dff9f98764da","fatal_id":"00000000-0000-0000-0000-000000000000","info_id":"00000000-0000-0000-0000-000000000000","ip_address_v4":null,"ip_address_v6":"2001:db8::1","is_archived":0,"offset":1,"os_name":"Mac OS X","os_version":"10.15.7","ota_updates_channel":"","ota_updates_runtime_version":"","ota_updates_update_id":"","partition":0,"platform":"javascript","project_id":1,"release":"frontend@1.2.3","replay_id":"834f314c-aae5-4030-a1b0-dc52b202f24a","replay_start_timestamp":1702848650,"replay_type":"session","retention_days":90,"sdk_name":"sentry.javascript.react","sdk_version":"7.91.0","segment_id":0,"session_sample_rate":0.1,"tags.key":["browser","foo"],"tags.value":["Chrome 120",""],"tap_message":"","tap_view_class":"","tap_view_id":"","timestamp":1702848658,"title":"/signup","trace_ids":["2cd798d7-0f93-4608-9026-d2014a826629"],"urls":["https://example.com/signup"],"segment_names":[],"user_email":"a@example.com","user_id":"42","user_name":"","user":"42","user_geo_city":"Austin","user_geo_country_code":"US","user_geo_region":"","user_geo_subdivision":"","viewed_by_id":0,"warning_id":"00000000-0000-0000-0000-000000000000"}"#).unwrap();
        assert_eq!(json(&segment_row(&example_ids(), AT, &event)), expected);
    }

    /// The row snuba writes for Sentry's click message with this click.
    #[test]
    fn a_click_row_is_what_snuba_writes_for_the_published_click() {
        let click = Click::example();
        let expected: serde_json::Value = serde_json::from_str(r#"{"browser_name":"","browser_version":"","click_alt":"","click_aria_label":"","click_class":["btn","primary"],"click_component_name":"SignUpForm","click_id":"submit","click_is_dead":1,"click_is_rage":1,"click_node_id":59,"click_role":"button","click_tag":"button","click_testid":"","click_text":"Submit","click_title":"","debug_id":"00000000-0000-0000-0000-000000000000","device_brand":"","device_family":"","device_model":"","device_name":"","dist":"","environment":"production","error_id":"00000000-0000-0000-0000-000000000000","error_ids":[],"error_sample_rate":-1.0,"event_hash":"b7b845ec-03c1-7023-2ebf-18bd11f9f69a","fatal_id":"00000000-0000-0000-0000-000000000000","info_id":"00000000-0000-0000-0000-000000000000","ip_address_v4":null,"ip_address_v6":null,"is_archived":0,"offset":1,"os_name":"","os_version":"","ota_updates_channel":"","ota_updates_runtime_version":"","ota_updates_update_id":"","partition":0,"platform":"","project_id":1,"release":"","replay_id":"834f314c-aae5-4030-a1b0-dc52b202f24a","replay_start_timestamp":null,"replay_type":"","retention_days":90,"sdk_name":"","sdk_version":"","segment_id":null,"session_sample_rate":-1.0,"tags.key":[],"tags.value":[],"tap_message":"","tap_view_class":"","tap_view_id":"","timestamp":1702848658,"title":null,"trace_ids":[],"urls":[],"segment_names":[],"user_email":"","user_id":"","user_name":"","user":"","user_geo_city":"","user_geo_country_code":"","user_geo_region":"","user_geo_subdivision":"","viewed_by_id":0,"warning_id":"00000000-0000-0000-0000-000000000000"}"#).unwrap();
        assert_eq!(
            json(&click_row(&example_ids(), AT, &"production".into(), &click)),
            expected
        );
    }

    /// A segment's click and tap rows share the replay event's environment: a long one (Relay
    /// bounds it; a producer writing to the topic directly need not) was copied into each row,
    /// up to 41 copies per segment.
    #[test]
    fn the_rows_of_a_segment_share_one_environment() {
        let environment = "e".repeat(1 << 20);
        let event = crate::recording::replay_event::parse(
            format!(r#"{{"segment_id":0,"environment":"{environment}"}}"#).as_bytes(),
        )
        .unwrap();
        let click = |n: u32| {
            format!(
                r#"{{"type":5,"timestamp":1702848658000,"data":{{"tag":"breadcrumb","payload":{{"timestamp":1702848658.{n},"type":"default","category":"ui.click","message":"div > button","data":{{"nodeId":{n},"node":{{"id":{n},"tagName":"button","textContent":"Go","attributes":{{}}}}}}}}}}}}"#
            )
        };
        let events = format!("[{}]", (1..=20).map(click).collect::<Vec<_>>().join(","));
        let extracted =
            crate::recording::rrweb::extract(events.as_bytes(), Default::default()).unwrap();
        assert_eq!(extracted.clicks.len(), 20);
        let rows = build(&example_ids(), AT, Some(&event), true, &extracted);
        assert_eq!(rows.len(), 21);
        let shared = rows[1].environment.as_ref().unwrap();
        assert_eq!(shared.len(), environment.len());
        assert!(
            rows[2..]
                .iter()
                .all(|row| Arc::ptr_eq(row.environment.as_ref().unwrap(), shared)),
            "one environment for the click rows"
        );
    }

    #[test]
    fn segment_ids_above_u16_are_null_and_users_fall_back_in_snubas_order() {
        let event = |doc: &str| crate::recording::replay_event::parse(doc.as_bytes()).unwrap();
        let row = segment_row(
            &example_ids(),
            AT,
            &event(r#"{"segment_id":70000,"user":{"ip_address":"10.0.0.1"}}"#),
        );
        assert_eq!(row.segment_id, None);
        assert_eq!(
            row.event_hash.hyphenated().to_string(),
            "3078a255-aee8-6ecc-4ac1-eb36b69af2f0"
        );
        assert_eq!(
            (row.ip_address_v4, row.user.as_deref()),
            (Some(Ipv4Addr::new(10, 0, 0, 1)), Some("10.0.0.1"))
        );
        assert_eq!((row.error_sample_rate, row.title), (Some(-1.0), None));
        let row = segment_row(
            &example_ids(),
            AT,
            &event(r#"{"user":{"id":"","username":"ada"}}"#),
        );
        assert_eq!(
            row.user.as_deref(),
            Some(""),
            "a present but empty id still wins"
        );
        let row = segment_row(
            &example_ids(),
            AT,
            &event(r#"{"user":{"username":"ada","email":"a@b"}}"#),
        );
        assert_eq!(row.user.as_deref(), Some("ada"));
    }

    #[test]
    fn timestamps_are_clamped_into_datetime_range() {
        assert_eq!(seconds(-5.0), 0);
        assert_eq!(seconds(1e20), u32::MAX);
        assert_eq!(seconds(f64::NAN), 0);
    }
}
