//! Breadcrumbs as EAP trace items (docs/outputs.md, "Breadcrumbs as trace items"): one
//! `TraceItem` per click, tap, navigation, request, resource, web vital, hydration error,
//! mutation burst, SDK-options event and memory sample, for the `snuba-items` topic, built while
//! the segment is processed (the extraction pass offers each custom event to a [`Collector`]).
//!
//! Where this differs from Sentry, on purpose:
//! - **sampling is deterministic**: an event's item is produced when a hash of (replay id,
//!   segment id, event index) falls under the rollout, so a redelivered segment samples the same
//!   events (Sentry draws a random number per event);
//! - **`item_id` is that hash** (16 bytes of the MD5 of `{replay_id}:{segment_id}:{index}`), so a
//!   redelivered segment overwrites its items rather than duplicating them (Sentry: a random UUID);
//! - **timestamps are UTC** instants from the epoch (Sentry goes through a naive local datetime);
//! - **bounded**: headers are capped in count and bytes, an item over [`MAX_ITEM_BYTES`] is left
//!   out, and a segment's items stay within a byte budget beside its cost bound; everything left
//!   out is counted by reason;
//! - items Snuba would refuse (a trace id that is not a UUID) are not produced, and are counted.

mod build;
mod dom;
pub mod proto;

use md5::{Digest, Md5};

pub use build::{Category, MAX_HEADER_BYTES, MAX_HEADERS};

use super::heap::HeapSize;

/// The largest item kept: far under the topic's `max.message.bytes` (10 000 000), which no
/// replay breadcrumb comes near unless crafted.
pub const MAX_ITEM_BYTES: usize = 1024 * 1024;

/// Bytes a segment's items may take beyond a quarter of its decoded input: with the rest of what
/// it holds, within the cost bound (2 × the input + 1 MiB), and their building within the peak
/// bound (3 × the input + …), whatever the input.
pub const BUDGET_SLACK_BYTES: usize = 256 * 1024;

/// Bytes one event's data may take read as a tree beyond half the segment's decoded input: with
/// the vectors' growth, the tree stays within the input and 2 MiB, inside the peak bound. A real
/// request span with a 150 KB JSON body (the SDK's largest) reads in well under it.
const TREE_SLACK_BYTES: usize = 1024 * 1024;

/// The most an item's fields other than its attributes and trace id take (`proto::item`): two
/// ids of up to 10 varint bytes, the item id, the type, two timestamps, two sample rates, the
/// retention, the tags and lengths.
const ITEM_OVERHEAD_BYTES: usize = 104;

/// The share of rrweb events whose item is produced, in parts per billion (so that [`Limits`]
/// stays `Eq`). Off by default, as in Sentry.
///
/// [`Limits`]: super::Limits
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rollout(u32);

const PARTS: u32 = 1_000_000_000;

impl Rollout {
    pub const OFF: Rollout = Rollout(0);
    pub const ALL: Rollout = Rollout(PARTS);

    /// `share` in `[0.0, 1.0]`; `None` outside it.
    pub fn new(share: f64) -> Option<Rollout> {
        (0.0..=1.0)
            .contains(&share)
            .then(|| Rollout((share * f64::from(PARTS)).round() as u32))
    }

    pub fn is_off(self) -> bool {
        self.0 == 0
    }

    /// Whether the event whose hash is `hash` is sampled.
    fn samples(self, hash: &[u8; 16]) -> bool {
        let mut head = [0; 8];
        head.copy_from_slice(&hash[..8]);
        u64::from_le_bytes(head) % u64::from(PARTS) < u64::from(self.0)
    }
}

/// Why an item was not produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A required field missing or of the wrong type (Sentry drops these too).
    InvalidField,
    /// The replay's trace id is not a UUID: Snuba's consumer would refuse the item.
    InvalidTraceId,
    /// The segment's items already filled their budget.
    OverBudget,
    /// The item alone is larger than [`MAX_ITEM_BYTES`].
    TooLarge,
    /// The event's data hold more values than [`Collector`] reads (whether or not it would have
    /// made an item): reading them all would outgrow the peak bound.
    TooManyValues,
}

impl Dropped {
    pub const ALL: [Dropped; 5] = [
        Dropped::InvalidField,
        Dropped::InvalidTraceId,
        Dropped::OverBudget,
        Dropped::TooLarge,
        Dropped::TooManyValues,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::InvalidField => "invalid_field",
            Dropped::InvalidTraceId => "invalid_trace_id",
            Dropped::OverBudget => "over_budget",
            Dropped::TooLarge => "too_large",
            Dropped::TooManyValues => "too_many_values",
        }
    }
}

/// Items left out, by reason (in [`Dropped::ALL`]'s order), and headers left out or cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub dropped: [u64; Dropped::ALL.len()],
    pub headers_cut: u64,
}

impl Counts {
    fn drop(&mut self, reason: Dropped, items: u64) {
        let slot = Dropped::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        if let Some(count) = self.dropped.get_mut(slot) {
            *count += items;
        }
    }

    /// `(reason, items)` for each reason with any.
    pub fn dropped(&self) -> impl Iterator<Item = (Dropped, u64)> + '_ {
        Dropped::ALL
            .into_iter()
            .zip(self.dropped)
            .filter(|(_, n)| *n > 0)
    }
}

/// An event's item before the segment's context is known: its own attributes sit in the
/// collector's buffer up to `end`.
#[derive(Debug)]
struct Draft {
    item_id: [u8; 16],
    category: Category,
    timestamp_ms: i64,
    end: usize,
}

/// Gathers the items of one segment during the extraction pass.
#[derive(Debug)]
pub struct Collector {
    rollout: Rollout,
    replay_id: String,
    segment_id: u32,
    attributes: Vec<u8>,
    drafts: Vec<Draft>,
    budget: usize,
    /// The most values of one event's data read to build its item ([`dom::parse`]).
    max_values: usize,
    counts: Counts,
}

/// The most a segment's items may hold, its decoded input being `input_bytes`.
pub fn budget(input_bytes: usize) -> usize {
    input_bytes / 4 + BUDGET_SLACK_BYTES
}

impl Collector {
    /// A collector for the segment, unless the rollout is off. `input_bytes` (the decoded input)
    /// sets the budget.
    pub fn new(
        rollout: Rollout,
        replay_id: &str,
        segment_id: u32,
        input_bytes: usize,
    ) -> Option<Collector> {
        (!rollout.is_off()).then(|| Collector {
            rollout,
            replay_id: replay_id.to_owned(),
            segment_id,
            attributes: Vec::new(),
            drafts: Vec::new(),
            budget: budget(input_bytes),
            max_values: (input_bytes / 2 + TREE_SLACK_BYTES) / dom::BYTES_PER_VALUE,
            counts: Counts::default(),
        })
    }

    /// The custom event at `index` of the array, with its rrweb timestamp (`event_ms`,
    /// normalised to milliseconds) and its `data` as JSON text.
    pub fn offer(&mut self, index: u32, event_ms: u64, data: &str) {
        // The hash decides the sample; with every event sampled, it is only needed (as the item
        // id) for the events that become items.
        let hash = (self.rollout != Rollout::ALL).then(|| self.item_id(index));
        if hash
            .as_ref()
            .is_some_and(|hash| !self.rollout.samples(hash))
        {
            return;
        }
        // Nested past what the scanner reads (and past serde_json's recursion limit): counted,
        // as Sentry's parser fails on it (it was left out without a count).
        if crate::recording::scan::too_deep(data) {
            self.counts.drop(Dropped::InvalidField, 1);
            return;
        }
        // An event serde_json refuses for lone surrogates only is read with them marked (Python
        // reads them); its item is left out only if an attribute holds one, where Sentry's
        // protobuf encoding fails.
        let parsed = dom::parse(data, self.max_values);
        let marked = match parsed {
            Err(dom::Unread::Invalid) => dom::without_lone_surrogates(data),
            _ => None,
        };
        let parsed = match &marked {
            Some(marked) => dom::parse(marked, self.max_values),
            None => parsed,
        };
        let data = match parsed {
            Ok(data) => data,
            Err(dom::Unread::Invalid) => {
                self.counts.drop(Dropped::InvalidField, 1);
                return;
            }
            Err(dom::Unread::TooMany) => {
                self.counts.drop(Dropped::TooManyValues, 1);
                return;
            }
        };
        let start = self.attributes.len();
        let built = build::build(
            &data,
            event_ms,
            &mut self.attributes,
            &mut self.counts.headers_cut,
        );
        let built = match built {
            Ok(Some(built)) => built,
            Ok(None) => return,
            Err(build::InvalidField) => {
                self.counts.drop(Dropped::InvalidField, 1);
                return;
            }
        };
        let own = self.attributes.len() - start;
        let lone = dom::LONE_SURROGATE.as_bytes();
        let own_attributes = self.attributes.get(start..).unwrap_or_default();
        let reason = if marked.is_some() && own_attributes.windows(lone.len()).any(|w| w == lone) {
            Some(Dropped::InvalidField)
        } else if own + ITEM_OVERHEAD_BYTES > MAX_ITEM_BYTES {
            Some(Dropped::TooLarge)
        } else if self.attributes.len() + (self.drafts.len() + 1) * ITEM_OVERHEAD_BYTES
            > self.budget
        {
            Some(Dropped::OverBudget)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.attributes.truncate(start);
            self.counts.drop(reason, 1);
            return;
        }
        self.drafts.push(Draft {
            item_id: hash.unwrap_or_else(|| self.item_id(index)),
            category: built.category,
            timestamp_ms: built.timestamp_ms,
            end: self.attributes.len(),
        });
    }

    /// The MD5 of `{replay_id}:{segment_id}:{index}` (written without an allocation: this runs
    /// for every custom event).
    fn item_id(&self, index: u32) -> [u8; 16] {
        use std::io::Write;
        let mut suffix = [0u8; 24];
        let mut cursor = std::io::Cursor::new(&mut suffix[..]);
        let _ = write!(cursor, ":{}:{index}", self.segment_id);
        let end = cursor.position() as usize;
        let mut md5 = Md5::new();
        md5.update(self.replay_id.as_bytes());
        md5.update(suffix.get(..end).unwrap_or_default());
        md5.finalize().into()
    }

    /// The segment's items, each a whole `TraceItem` message.
    pub fn finish(self, context: &Context<'_>) -> TraceItems {
        let mut counts = self.counts;
        let mut items = TraceItems {
            bytes: Vec::new(),
            items: Vec::new(),
            counts: Counts::default(),
        };
        let Some(trace_id) = context.trace_id else {
            counts.drop(Dropped::InvalidTraceId, self.drafts.len() as u64);
            items.counts = counts;
            return items;
        };
        let mut common = Vec::new();
        proto::attribute(&mut common, "replay_id", proto::Value::Str(&self.replay_id));
        let segment_id = proto::Value::Int(i64::from(self.segment_id));
        proto::attribute(&mut common, "segment_id", segment_id);
        for (key, value) in context.user {
            proto::attribute(&mut common, key, proto::Value::Str(value));
        }
        // Which drafts fit, at most how large each is: the buffer is reserved once, so that
        // building the items never holds two copies of a growing one.
        let mut start = 0;
        let mut total = 0;
        let mut kept = Vec::with_capacity(self.drafts.len());
        for draft in &self.drafts {
            let own = self.attributes.get(start..draft.end).unwrap_or_default();
            start = draft.end;
            let size = own.len() + common.len() + ITEM_OVERHEAD_BYTES + trace_id.len();
            if size > MAX_ITEM_BYTES {
                counts.drop(Dropped::TooLarge, 1);
            } else if total + size > self.budget {
                counts.drop(Dropped::OverBudget, 1);
            } else {
                total += size;
                kept.push((draft, own));
            }
        }
        items.bytes.reserve_exact(total);
        items.items.reserve_exact(kept.len());
        for (draft, own) in kept {
            let header = proto::Header {
                organization_id: context.organization_id,
                project_id: context.project_id,
                trace_id,
                item_id: draft.item_id,
                timestamp: proto::Timestamp::from_millis(draft.timestamp_ms),
                retention_days: context.retention_days,
                received: proto::Timestamp::from_millis(context.received_seconds * 1000),
            };
            proto::item(&mut items.bytes, &header, &[own, &common]);
            items.items.push((items.bytes.len(), draft.category));
        }
        // Reserved as an upper bound, not shrunk: shrinking would copy the whole buffer (and the
        // capacity left over is counted in the segment's memory).
        items.counts = counts;
        items
    }
}

/// What every item of a segment shares.
pub struct Context<'a> {
    pub organization_id: u64,
    pub project_id: u64,
    /// `None`: the trace id Sentry would use is not a UUID.
    pub trace_id: Option<&'a str>,
    pub retention_days: u32,
    /// When the edge received the segment (whole seconds, as Sentry keeps it).
    pub received_seconds: i64,
    /// The user's attributes present in the replay event, by attribute name.
    pub user: &'a [(&'static str, &'a str)],
}

/// A segment's trace items, encoded, in event order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceItems {
    bytes: Vec<u8>,
    /// Where each item ends in `bytes`, and its category.
    items: Vec<(usize, Category)>,
    pub counts: Counts,
}

impl TraceItems {
    /// Each item's category and `TraceItem` bytes.
    pub fn iter(&self) -> impl Iterator<Item = (Category, &[u8])> {
        let starts = std::iter::once(0).chain(self.items.iter().map(|(end, _)| *end));
        starts.zip(&self.items).map(|(start, &(end, category))| {
            (category, self.bytes.get(start..end).unwrap_or_default())
        })
    }

    /// How many items of each category, for the categories with any.
    pub fn by_category(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.into_iter().filter_map(|category| {
            let n = self.items.iter().filter(|(_, c)| *c == category).count() as u64;
            (n > 0).then_some((category, n))
        })
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl HeapSize for TraceItems {
    fn heap_size(&self) -> usize {
        self.bytes.capacity() + self.items.capacity() * std::mem::size_of::<(usize, Category)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollout_takes_shares_from_zero_to_one_only() {
        assert_eq!(Rollout::new(0.0), Some(Rollout::OFF));
        assert_eq!(Rollout::new(1.0), Some(Rollout::ALL));
        assert!(Rollout::new(1.01).is_none() && Rollout::new(-0.1).is_none());
        assert!(Rollout::new(f64::NAN).is_none());
        assert!(Collector::new(Rollout::OFF, "r", 0, 0).is_none());
    }

    /// A custom event nested past what the scanner reads is counted as dropped (it was left
    /// out before it reached the collector, without a count).
    #[test]
    fn an_event_nested_too_deep_is_counted_as_dropped() {
        use crate::recording::rrweb::{RowLimits, extract_with};
        let mut collector = Collector::new(Rollout::ALL, &"a".repeat(32), 0, 1 << 20).unwrap();
        let levels = crate::recording::scan::MAX_NESTING as usize + 1;
        let events = format!(
            r#"[{{"type":5,"timestamp":1700000000000,"data":{{"tag":"breadcrumb","payload":{{"category":"navigation","data":{}0{}}}}}}}]"#,
            "[".repeat(levels),
            "]".repeat(levels)
        );
        extract_with(&events, RowLimits::default(), Some(&mut collector)).unwrap();
        assert!(collector.drafts.is_empty());
        assert_eq!(
            collector.counts.dropped().collect::<Vec<_>>(),
            [(Dropped::InvalidField, 1)]
        );
    }

    #[test]
    fn a_lone_surrogate_drops_an_item_only_when_an_attribute_holds_it() {
        let mut collector = Collector::new(Rollout::ALL, &"a".repeat(32), 0, 1 << 20).unwrap();
        // A request whose captured body was cut through an emoji: the body is no attribute.
        let request = r#"{"tag":"performanceSpan","payload":{"op":"resource.fetch","description":"https://example.com/api","startTimestamp":1700000000.5,"endTimestamp":1700000001.0,"data":{"method":"GET","statusCode":200,"response":{"body":"cut \ud83d"}}}}"#;
        // A tap whose message, an attribute, holds one.
        let tap = r#"{"tag":"breadcrumb","payload":{"category":"ui.tap","timestamp":1700000000.5,"message":"cut \ud83d","data":{"view.id":"a","view.class":"b"}}}"#;
        collector.offer(0, 1_700_000_000_000, request);
        assert_eq!(
            (collector.drafts.len(), collector.counts.dropped),
            (1, [0; 5])
        );
        collector.offer(1, 1_700_000_000_000, tap);
        assert_eq!(collector.drafts.len(), 1);
        assert_eq!(
            collector.counts.dropped().collect::<Vec<_>>(),
            [(Dropped::InvalidField, 1)]
        );
        let end = collector.drafts[0].end;
        assert_eq!(
            collector.attributes.len(),
            end,
            "the tap left nothing behind"
        );
    }

    #[test]
    fn sampling_is_a_function_of_the_event_and_near_the_rollout() {
        let collector = |rollout| Collector::new(rollout, "a".repeat(32).as_str(), 3, 0).unwrap();
        let tenth = collector(Rollout::new(0.1).unwrap());
        let sampled: Vec<u32> = (0..10_000)
            .filter(|&i| tenth.rollout.samples(&tenth.item_id(i)))
            .collect();
        assert!((900..1100).contains(&sampled.len()), "{}", sampled.len());
        let again = collector(Rollout::new(0.1).unwrap());
        assert!(
            sampled
                .iter()
                .all(|&i| again.rollout.samples(&again.item_id(i)))
        );
        assert_ne!(tenth.item_id(1), tenth.item_id(2));
        let other_segment = Collector::new(Rollout::ALL, "a".repeat(32).as_str(), 4, 0).unwrap();
        assert_ne!(tenth.item_id(1), other_segment.item_id(1));
    }
}
