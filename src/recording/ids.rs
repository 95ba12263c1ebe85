//! Who a segment belongs to: the identifiers every output of one message carries (blob key, rows,
//! events). Owned, so a processed message no longer borrows the Kafka message it came from.

use uuid::Uuid;

use super::heap::heap_size;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIds {
    /// 32 lowercase hex characters, as received (blob keys and events use this form).
    pub replay_id: String,
    /// The same id as a UUID (ClickHouse columns).
    pub replay_uuid: Uuid,
    pub org_id: u64,
    pub project_id: u64,
    /// DSN key id; reported in billing outcomes.
    pub key_id: Option<u64>,
    /// Unix seconds when the edge received the segment.
    pub received: u64,
    /// Days the blob and rows are kept.
    pub retention_days: u16,
    /// From the payload header; a larger value is rejected as `invalid_header`.
    pub segment_id: u32,
}

heap_size!(SegmentIds { replay_id });

#[cfg(test)]
impl SegmentIds {
    /// Identifiers for unit tests: replay `6aa0d45d…`, org 1, project 2, 30 days.
    pub(crate) fn for_tests(segment_id: u32) -> Self {
        SegmentIds {
            replay_id: "6aa0d45db9b94b989501ce3be4daf802".into(),
            replay_uuid: Uuid::nil(),
            org_id: 1,
            project_id: 2,
            key_id: None,
            received: 3,
            retention_days: 30,
            segment_id,
        }
    }
}
