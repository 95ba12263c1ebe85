//! Analytics events published to Kafka (SPEC §5.3), built but not sent.
//!
//! - `Outcome` (outcomes topic): billing outcome for segment 0 — accepted, category replay,
//!   quantity 1. Numeric codes follow the outcomes schema: outcome 0 = accepted, category 7 = replay.
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
    /// RFC 3339, from the message's `received`.
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

    /// Kafka message key: keeps one replay's events on one partition.
    pub fn key(&self) -> String {
        match self {
            AnalyticsEvent::Outcome(o) => o.event_id.clone(),
            AnalyticsEvent::FirstReplay(f) => f.project_id.to_string(),
            AnalyticsEvent::RageClick(r) => r.replay_id.clone(),
            AnalyticsEvent::HydrationError(h) => h.replay_id.clone(),
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

fn rfc3339(unix_seconds: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix_seconds)).to_string()
}

/// The events one segment produces.
pub fn build(ids: &SegmentIds, extracted: &Extracted) -> Vec<AnalyticsEvent> {
    let mut events = Vec::new();
    if ids.segment_id == 0 {
        events.push(AnalyticsEvent::Outcome(Outcome {
            timestamp: rfc3339(ids.received),
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
    fn outcome_timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(1_796_012_448), "2026-11-30T04:20:48Z");
    }
}
