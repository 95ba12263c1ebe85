//! Analytics events published to Kafka (SPEC §5.3), built but not sent.
//!
//! - `Outcome` (`outcomes-billing`): the billing outcome for segment 0 exactly as Sentry sends
//!   it — accepted (0), category replay (7), quantity 1, `reason` null, the edge's receive time
//!   as `%Y-%m-%dT%H:%M:%S.%fZ`, fields in Sentry's order, no message key.
//! - `FirstReplay` (analytics topic): candidate "first replay received" per project; the sink
//!   deduplicates it per project with a bounded cache.
//! - `RageClick`, `HydrationError` (issues topic): occurrences to turn into issues.
//!
//! Every event carries a deterministic key so redelivery produces identical messages. Events are
//! built when the flush publishes them, not kept with the buffered segment. A segment yields at
//! most `max_clicks` rage-click and `MAX_HYDRATION_ISSUES` hydration-error events, so a small
//! message cannot fan out into megabytes of events.

use serde::Serialize;
use std::time::{Duration, UNIX_EPOCH};

use super::ids::SegmentIds;
use super::rows::{click_event_hash, md5_uuid};
use super::rrweb::Extracted;

/// Hydration-error events per segment. Sentry groups every hydration error of a project into one
/// issue, so occurrences past the first few add nothing a reader keeps.
pub const MAX_HYDRATION_ISSUES: usize = 20;

/// Outcome code for an accepted event.
pub const OUTCOME_ACCEPTED: u8 = 0;
/// Data category code for a replay.
pub const CATEGORY_REPLAY: u8 = 7;

/// Which configured topic an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventTopic {
    Outcomes,
    Analytics,
    Issues,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnalyticsEvent {
    Outcome(Outcome),
    FirstReplay(FirstReplay),
    RageClick(RageClick),
    HydrationError(Hydration),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The message's `received`, as Sentry's encoder writes a datetime (microseconds, `Z`).
    pub timestamp: String,
    pub org_id: u64,
    pub project_id: u64,
    pub key_id: Option<u64>,
    pub outcome: u8,
    pub reason: Option<String>,
    /// The replay id.
    pub event_id: String,
    pub category: u8,
    pub quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FirstReplay {
    pub org_id: u64,
    pub project_id: u64,
    pub replay_id: String,
    /// Unix seconds the edge received segment 0.
    pub received: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RageClick {
    /// Deterministic occurrence id (the click's `event_hash`).
    pub occurrence_id: String,
    pub org_id: u64,
    pub project_id: u64,
    pub replay_id: String,
    pub segment_id: u32,
    /// Seconds since the epoch.
    pub timestamp: f64,
    pub selector: String,
    pub tag: String,
    pub text: String,
    pub component_name: String,
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hydration {
    pub occurrence_id: String,
    pub org_id: u64,
    pub project_id: u64,
    pub replay_id: String,
    pub segment_id: u32,
    pub timestamp_ms: u64,
    pub url: Option<String>,
}

impl EventTopic {
    pub fn as_str(self) -> &'static str {
        match self {
            EventTopic::Outcomes => "outcomes",
            EventTopic::Analytics => "analytics",
            EventTopic::Issues => "issues",
        }
    }
}

impl AnalyticsEvent {
    /// The event's `type`, e.g. `rage_click`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnalyticsEvent::Outcome(_) => "outcome",
            AnalyticsEvent::FirstReplay(_) => "first_replay",
            AnalyticsEvent::RageClick(_) => "rage_click",
            AnalyticsEvent::HydrationError(_) => "hydration_error",
        }
    }

    pub fn topic(&self) -> EventTopic {
        match self {
            AnalyticsEvent::Outcome(_) => EventTopic::Outcomes,
            AnalyticsEvent::FirstReplay(_) => EventTopic::Analytics,
            AnalyticsEvent::RageClick(_) | AnalyticsEvent::HydrationError(_) => EventTopic::Issues,
        }
    }

    /// Kafka message key: keeps one replay's events on one partition. Outcomes have none, as
    /// Sentry sends them.
    pub fn key(&self) -> Option<String> {
        match self {
            AnalyticsEvent::Outcome(_) => None,
            AnalyticsEvent::FirstReplay(f) => Some(f.project_id.to_string()),
            AnalyticsEvent::RageClick(r) => Some(r.replay_id.clone()),
            AnalyticsEvent::HydrationError(h) => Some(h.replay_id.clone()),
        }
    }

    /// JSON message value. The outcome keeps the outcomes schema (no `type` field).
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            AnalyticsEvent::Outcome(o) => serde_json::to_vec(o),
            other => serde_json::to_vec(other),
        }
    }
}

/// `%Y-%m-%dT%H:%M:%S.%fZ`: how Sentry's JSON encoder writes a UTC datetime.
fn sentry_datetime(unix_seconds: u64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_secs(unix_seconds)).to_string()
}

/// The events one segment produces.
pub fn build(ids: &SegmentIds, extracted: &Extracted) -> Vec<AnalyticsEvent> {
    let mut events = Vec::new();
    if ids.segment_id == 0 {
        events.push(AnalyticsEvent::Outcome(Outcome {
            timestamp: sentry_datetime(ids.received),
            org_id: ids.org_id,
            project_id: ids.project_id,
            key_id: ids.key_id,
            outcome: OUTCOME_ACCEPTED,
            reason: None,
            event_id: ids.replay_id.clone(),
            category: CATEGORY_REPLAY,
            quantity: 1,
        }));
        events.push(AnalyticsEvent::FirstReplay(FirstReplay {
            org_id: ids.org_id,
            project_id: ids.project_id,
            replay_id: ids.replay_id.clone(),
            received: ids.received,
        }));
    }
    for click in extracted.rage_clicks() {
        events.push(AnalyticsEvent::RageClick(RageClick {
            occurrence_id: click_event_hash(&ids.replay_id, click.timestamp, click.node_id).simple().to_string(),
            org_id: ids.org_id,
            project_id: ids.project_id,
            replay_id: ids.replay_id.clone(),
            segment_id: ids.segment_id,
            timestamp: click.timestamp,
            selector: click.selector.clone(),
            tag: click.tag.clone(),
            text: click.text.clone(),
            component_name: click.component_name.clone(),
            url: click.url.to_string(),
        }));
    }
    for error in extracted.hydration_errors.iter().take(MAX_HYDRATION_ISSUES) {
        let occurrence_id = md5_uuid(&format!("{}:hydration:{}", ids.replay_id, error.timestamp_ms));
        events.push(AnalyticsEvent::HydrationError(Hydration {
            occurrence_id: occurrence_id.simple().to_string(),
            org_id: ids.org_id,
            project_id: ids.project_id,
            replay_id: ids.replay_id.clone(),
            segment_id: ids.segment_id,
            timestamp_ms: error.timestamp_ms,
            url: error.url.as_deref().map(str::to_owned),
        }));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::super::rrweb::HydrationError;
    use super::*;

    #[test]
    fn hydration_error_events_stop_at_their_per_segment_cap() {
        let ids = SegmentIds::for_tests(1);
        let extracted = Extracted {
            hydration_errors: (0..100).map(|i| HydrationError { timestamp_ms: i, url: None }).collect(),
            ..Extracted::default()
        };
        assert_eq!(build(&ids, &extracted).len(), MAX_HYDRATION_ISSUES);
    }

    #[test]
    fn the_billing_outcome_is_byte_for_byte_what_sentry_sends() {
        let ids = SegmentIds {
            replay_id: "834f314caae54030a1b0dc52b202f24a".into(),
            org_id: 1,
            project_id: 1,
            key_id: Some(17),
            received: 1_702_848_658,
            ..SegmentIds::for_tests(0)
        };
        let outcome = build(&ids, &Extracted::default()).into_iter().find(|e| e.kind() == "outcome").unwrap();
        assert_eq!(
            String::from_utf8(outcome.to_json().unwrap()).unwrap(),
            r#"{"timestamp":"2023-12-17T21:30:58.000000Z","org_id":1,"project_id":1,"key_id":17,"outcome":0,"reason":null,"event_id":"834f314caae54030a1b0dc52b202f24a","category":7,"quantity":1}"#
        );
        assert_eq!(outcome.key(), None, "no key, as Sentry publishes it");
    }
}
