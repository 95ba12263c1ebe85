//! The archive of a deleted replay, as Sentry writes it when a replay is deleted
//! (`archive_event` in Sentry's replays usecases): an `ingest-replay-events` message whose replay
//! event has `is_archived: true`, no segment, no ids or URLs, and the replay's own timestamp (a
//! query over the replay's date range aggregates `is_archived` per replay, so an archive stamped
//! "now" would not hide it). Snuba turns it into one segment row; with `--rows-sink clickhouse`
//! the same row is written directly ([`Archive::row`]).
//!
//! Two deliberate differences: the event carries an `event_hash` (Sentry leaves it out, and snuba
//! draws a random one), and its `event_id` is that hash — both derived from the replay id, so an
//! archive written again (a delete run again after a crash) is the same row, which the table
//! collapses. And `retention_days` is the replay's own (Sentry writes 90 whatever the replay's).

use serde::Serialize;
use uuid::Uuid;

use super::rows::{self, KafkaPosition, ReplayRow, md5_uuid};
use super::{InvalidRecording, SegmentIds, replay_event};

/// What an archive says of the replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Archive<'a> {
    pub project_id: u64,
    /// 32 lowercase hex characters, as the blob keys have it.
    pub replay_id: &'a str,
    pub retention_days: u16,
    /// The replay's own time, seconds since the epoch.
    pub timestamp: f64,
    /// When the archive is written, seconds since the epoch (the message's `start_time`).
    pub now: u64,
}

#[derive(Serialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    replay_id: &'a str,
    event_id: String,
    event_hash: String,
    segment_id: Option<u32>,
    trace_ids: [&'a str; 0],
    error_ids: [&'a str; 0],
    urls: [&'a str; 0],
    timestamp: f64,
    is_archived: bool,
    platform: &'static str,
}

#[derive(Serialize)]
struct Message<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    start_time: u64,
    replay_id: &'a str,
    project_id: u64,
    segment_id: Option<u32>,
    retention_days: u16,
    payload: Event<'a>,
}

impl Archive<'_> {
    /// The archive's `event_hash` (and `event_id`): the same for every archive of the replay.
    pub fn event_hash(&self) -> Uuid {
        md5_uuid(&format!("{}:archive", self.replay_id))
    }

    fn event(&self) -> Event<'_> {
        let hash = self.event_hash();
        Event {
            kind: "replay_event",
            replay_id: self.replay_id,
            event_id: hash.simple().to_string(),
            event_hash: hash.simple().to_string(),
            segment_id: None,
            trace_ids: [],
            error_ids: [],
            urls: [],
            timestamp: self.timestamp,
            is_archived: true,
            platform: "",
        }
    }

    /// The `ingest-replay-events` message, as Sentry publishes it.
    pub fn message(&self) -> Vec<u8> {
        let message = Message {
            kind: "replay_event",
            start_time: self.now,
            replay_id: self.replay_id,
            project_id: self.project_id,
            segment_id: None,
            retention_days: self.retention_days,
            payload: self.event(),
        };
        serde_json::to_vec(&message).unwrap_or_default()
    }

    /// The row snuba inserts for [`Archive::message`].
    pub fn row(&self) -> Result<ReplayRow, InvalidRecording> {
        let json = serde_json::to_vec(&self.event()).unwrap_or_default();
        let event = replay_event::parse(&json)?;
        let replay_uuid = Uuid::try_parse(self.replay_id).map_err(|e| {
            InvalidRecording::new(super::Reason::InvalidReplayId, format_args!("{e}"))
        })?;
        let ids = SegmentIds {
            replay_id: self.replay_id.to_owned(),
            replay_uuid,
            org_id: 0,
            project_id: self.project_id,
            key_id: None,
            received: self.now,
            retention_days: self.retention_days,
            segment_id: 0,
        };
        Ok(rows::segment_row(&ids, KafkaPosition::default(), &event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLAY: &str = "834f314caae54030a1b0dc52b202f24a";

    fn archive() -> Archive<'static> {
        Archive {
            project_id: 42,
            replay_id: REPLAY,
            retention_days: 30,
            timestamp: 1_796_012_448.5,
            now: 1_796_100_000,
        }
    }

    #[test]
    fn the_message_has_every_field_sentry_writes_and_the_archive_flag() {
        let message: serde_json::Value = serde_json::from_slice(&archive().message()).unwrap();
        let hash = archive().event_hash().simple().to_string();
        assert_eq!(
            message,
            serde_json::json!({
                "type": "replay_event", "start_time": 1_796_100_000u64, "replay_id": REPLAY,
                "project_id": 42, "segment_id": null, "retention_days": 30,
                "payload": {"type": "replay_event", "replay_id": REPLAY, "event_id": hash,
                    "event_hash": hash, "segment_id": null, "trace_ids": [], "error_ids": [],
                    "urls": [], "timestamp": 1_796_012_448.5, "is_archived": true, "platform": ""}
            })
        );
    }

    #[test]
    fn the_row_is_an_archived_segment_row_at_the_replays_own_time() {
        let row = archive().row().unwrap();
        assert_eq!(row.is_archived, Some(1));
        assert_eq!(row.segment_id, None);
        assert_eq!(row.timestamp, 1_796_012_448);
        assert_eq!(row.project_id, 42);
        assert_eq!(row.retention_days, 30);
        assert_eq!(row.event_hash, archive().event_hash());
        assert_eq!(row.replay_id.simple().to_string(), REPLAY);
        assert_eq!(archive().row().unwrap(), row, "the same row every time");
    }
}
