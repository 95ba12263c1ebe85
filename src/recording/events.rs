//! Analytics events published to Kafka, built when the flush publishes them, not kept with the
//! buffered segment.
//!
//! - `Outcome` (`outcomes-billing`): the billing outcome for segment 0 exactly as Sentry sends
//!   it — accepted (0), category replay (7), quantity 1, `reason` null, the edge's receive time
//!   as `%Y-%m-%dT%H:%M:%S.%fZ`, fields in Sentry's order, no message key.
//! - `FirstReplay` (analytics topic): candidate "first replay received" per project; the sink
//!   deduplicates it per project with a bounded cache.
//! - `Occurrence` (`ingest-occurrences`): Issue Platform occurrences for rage clicks and
//!   hydration errors (`occurrence.rs`).
//!
//! Every event is deterministic, so redelivery produces identical messages.

use serde::Serialize;
use std::time::{Duration, UNIX_EPOCH};

use super::Processed;
use super::occurrence::{self, IssueGates, IssueKind, Occurrence};

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
    /// Already serialized; never serialized through this enum.
    #[serde(skip)]
    Occurrence(Occurrence),
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
            AnalyticsEvent::Occurrence(o) => match o.kind {
                IssueKind::RageClick => "rage_click",
                IssueKind::HydrationError => "hydration_error",
            },
        }
    }

    pub fn topic(&self) -> EventTopic {
        match self {
            AnalyticsEvent::Outcome(_) => EventTopic::Outcomes,
            AnalyticsEvent::FirstReplay(_) => EventTopic::Analytics,
            AnalyticsEvent::Occurrence(_) => EventTopic::Issues,
        }
    }

    /// Kafka message key, as Sentry keys it: none for outcomes, `{fingerprint}-{project_id}` for
    /// occurrences; the project for first-replay events.
    pub fn key(&self) -> Option<String> {
        match self {
            AnalyticsEvent::Outcome(_) => None,
            AnalyticsEvent::FirstReplay(f) => Some(f.project_id.to_string()),
            AnalyticsEvent::Occurrence(o) => Some(o.key.clone()),
        }
    }

    /// JSON message value. The outcome keeps the outcomes schema (no `type` field).
    pub fn into_json(self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            AnalyticsEvent::Outcome(o) => serde_json::to_vec(&o),
            AnalyticsEvent::Occurrence(o) => Ok(o.value),
            other => serde_json::to_vec(&other),
        }
    }
}

/// `%Y-%m-%dT%H:%M:%S.%fZ`: how Sentry's JSON encoder writes a UTC datetime.
fn sentry_datetime(unix_seconds: u64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_secs(unix_seconds)).to_string()
}

/// The events one segment produces; occurrences only for the projects `gates` enables.
pub fn build(processed: &Processed, gates: &IssueGates) -> Vec<AnalyticsEvent> {
    let ids = &processed.ids;
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
    if let (Some(raw), Some(event)) = (&processed.replay_event_json, &processed.replay_event) {
        let occurrences = occurrence::build(ids, &processed.extracted, raw, event, gates);
        events.extend(occurrences.into_iter().map(AnalyticsEvent::Occurrence));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::super::envelope::tests::TestMessage;
    use super::super::{Limits, process};
    use super::*;

    const HYDRATION: &str = r#"{"type":5,"timestamp":1702848661250,"data":{"tag":"breadcrumb","payload":{"timestamp":1702848661.25,"category":"replay.hydrate-error","data":{"url":"https://e/"}}}}"#;

    fn processed(segment_id: u32, replay_event: Option<&str>) -> Processed {
        let body = format!("{{\"segment_id\":{segment_id}}}\n[{HYDRATION}]");
        let message = TestMessage {
            replay_id: "834f314caae54030a1b0dc52b202f24a".into(),
            key_id: Some(17),
            project_id: 1,
            received: 1_702_848_658,
            replay_event: replay_event.map(|e| e.as_bytes().to_vec()),
            ..TestMessage::new(body.into_bytes())
        };
        process(&message.encode(), &Limits::default()).unwrap()
    }

    #[test]
    fn the_billing_outcome_is_byte_for_byte_what_sentry_sends() {
        let p = processed(0, None);
        let outcome = build(&p, &IssueGates::default())
            .into_iter()
            .find(|e| e.kind() == "outcome")
            .unwrap();
        assert_eq!(outcome.key(), None, "no key, as Sentry publishes it");
        assert_eq!(
            String::from_utf8(outcome.into_json().unwrap()).unwrap(),
            r#"{"timestamp":"2023-12-17T21:30:58.000000Z","org_id":1,"project_id":1,"key_id":17,"outcome":0,"reason":null,"event_id":"834f314caae54030a1b0dc52b202f24a","category":7,"quantity":1}"#
        );
    }

    #[test]
    fn occurrences_need_the_replay_event_and_only_segment_zero_has_an_outcome() {
        let kinds = |p: &Processed| {
            build(p, &IssueGates::default())
                .iter()
                .map(AnalyticsEvent::kind)
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(&processed(0, None)), ["outcome", "first_replay"]);
        let event = r#"{"replay_id":"834f314caae54030a1b0dc52b202f24a","platform":"javascript"}"#;
        let p = processed(1, Some(event));
        assert_eq!(kinds(&p), ["hydration_error"]);
        let occurrence = build(&p, &IssueGates::default()).remove(0);
        assert_eq!(
            (occurrence.topic(), occurrence.key()),
            (EventTopic::Issues, Some("1-1".to_owned()))
        );
    }
}
