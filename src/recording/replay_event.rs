//! The optional `replay_event`: a JSON object the SDK sends with each segment (docs/formats.md, "The message").
//!
//! ```text
//! {"type":"replay_event","replay_id":"…","segment_id":0,"timestamp":1796012453.996,
//!  "replay_start_timestamp":1796012448.3,"urls":[…],"error_ids":[…],"trace_ids":[…],
//!  "replay_type":"session","platform":"javascript","environment":"…","release":"…",
//!  "sdk":{"name":"sentry.javascript.browser","version":"11.12.0"},"user":{…},
//!  "contexts":{"browser":{…},"os":{…},"device":{…},"replay":{…}},"tags":{…} or [[k,v],…]}
//! ```
//! Fields are read leniently (a wrong-typed field becomes empty); only a document that is not a
//! JSON object, or nests deeper than `scan::MAX_NESTING`, is invalid. Lists are cut as Relay cuts
//! them (`urls`, `error_ids`, `trace_ids`: 100 entries), `segment_names` to 100 too (Relay and
//! snuba keep them all: a bound of this service's) and tags to `MAX_TAGS` pairs, so what is kept
//! is at most the document's size plus a small constant.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use compact_str::CompactString;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use uuid::Uuid;

use super::error::{InvalidRecording, Reason};
use super::heap::heap_size;
use super::json::{Flag, Id, Num, Object, Text, TextList, default_for};
use super::rrweb::Url;
use super::scan;

/// Entries kept of `urls`, `error_ids` and `trace_ids`: Relay's own limit.
pub const MAX_LIST_ENTRIES: usize = 100;

/// Tag pairs kept.
pub const MAX_TAGS: usize = 1000;

/// The replay event's fields this service stores, owned. Absent and wrong-typed fields are
/// `None` or empty; the segment row maps them as snuba maps the published event (`rows.rs`).
/// Its texts are read through methods (`platform()`, `user_id()`, …), which `text_fields!`
/// declares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayEvent {
    /// The event's own `replay_id`, when it is a UUID.
    pub replay_id: Option<Uuid>,
    /// The event's own `segment_id`, when it is a non-negative integer that fits 32 bits.
    pub segment_id: Option<u32>,
    /// An explicit `event_hash`, when it is a UUID.
    pub event_hash: Option<Uuid>,
    /// Seconds since the epoch.
    pub timestamp: Option<f64>,
    pub replay_start_timestamp: Option<f64>,
    /// Shared with the segment's visited URLs.
    pub urls: Vec<Url>,
    pub segment_names: Vec<CompactString>,
    /// Ids that are not UUIDs are dropped.
    pub error_ids: Vec<Uuid>,
    pub trace_ids: Vec<Uuid>,
    /// How many entries `trace_ids` held as sent, UUIDs, other strings or not strings at all
    /// (which trace id the replay's EAP items get depends on it); a lone empty string counts
    /// none (Sentry's `"" or replay_id`).
    pub trace_ids_sent: usize,
    pub is_archived: bool,
    pub error_sample_rate: Option<f64>,
    pub session_sample_rate: Option<f64>,
    /// Every tag pair but `transaction` (the title), in the order sent; a null value is "".
    pub tags: Vec<(CompactString, CompactString)>,
    /// List entries and tags left out by the limits above.
    pub dropped_items: u64,
    texts: Texts,
}

heap_size!(ReplayEvent {
    urls,
    segment_names,
    error_ids,
    trace_ids,
    tags,
    texts,
});

/// Declares the replay event's text fields: [`TextField`], and a method reading each: `&str`
/// for a `text` (empty when absent), `Option<&str>` for an `optional` one (whose absence the rows
/// keep).
macro_rules! text_fields {
    (
        text: $($(#[$text_doc:meta])* $text:ident),+;
        optional: $($(#[$optional_doc:meta])* $optional:ident),+;
    ) => {
        /// A text field of the replay event.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum TextField {
            $($text,)+
            $($optional,)+
        }

        impl TextField {
            const ALL: &[TextField] = &[$(TextField::$text,)+ $(TextField::$optional,)+];
        }

        impl ReplayEvent {
            $(
                $(#[$text_doc])*
                pub fn $text(&self) -> &str {
                    self.texts.get(TextField::$text).unwrap_or_default()
                }
            )+
            $(
                $(#[$optional_doc])*
                pub fn $optional(&self) -> Option<&str> {
                    self.texts.get(TextField::$optional)
                }
            )+
        }
    };
}

text_fields! {
    text: replay_type, platform, environment, release, dist, sdk_name, sdk_version, geo_city,
        geo_country_code, geo_region, geo_subdivision, os_name, os_version, browser_name,
        browser_version, device_name, device_brand, device_family, device_model,
        ota_updates_channel, ota_updates_runtime_version, ota_updates_update_id;
    optional:
        /// `user.id` as sent (a string, or an integer's digits).
        user_id, user_name, user_email,
        /// `user.ip_address` as sent; parsed when the row is built.
        ip_address,
        /// The value of the last `transaction` tag (`None` when there is none, or it is null).
        title;
}

/// Text fields the event holds.
const TEXT_FIELDS: usize = TextField::ALL.len();

// One bit of `Texts::present` per field.
const _: () = assert!(TEXT_FIELDS <= u32::BITS as usize);

/// The event's texts in one allocation, instead of one (or an inline string of 24 bytes) each:
/// a buffered segment's replay event took 896 bytes, most of them empty strings.
#[derive(Debug, Clone, Default, PartialEq)]
struct Texts {
    /// Every present field's text, in [`TextField`] order.
    joined: Box<str>,
    /// Where each field's text ends in `joined`; it starts where the one before ends.
    ends: [u32; TEXT_FIELDS],
    /// A bit per field that is present.
    present: u32,
}

heap_size!(Texts { joined });

impl Texts {
    /// `values` in [`TextField`] order.
    fn new(values: &[Option<&str>; TEXT_FIELDS]) -> Texts {
        let mut joined = String::with_capacity(values.iter().flatten().map(|v| v.len()).sum());
        let (mut ends, mut present) = ([0; TEXT_FIELDS], 0);
        for (i, (value, end)) in values.iter().zip(&mut ends).enumerate() {
            if let Some(value) = value {
                joined.push_str(value);
                present |= 1 << i;
            }
            // A replay event is part of one Kafka message, far below 4 GiB.
            *end = u32::try_from(joined.len()).unwrap_or(u32::MAX);
        }
        Texts {
            joined: joined.into_boxed_str(),
            ends,
            present,
        }
    }

    fn get(&self, field: TextField) -> Option<&str> {
        let i = field as usize;
        if self.present & 1 << i == 0 {
            return None;
        }
        let start = i.checked_sub(1).and_then(|before| self.ends.get(before));
        let (start, end) = (start.copied().unwrap_or(0), *self.ends.get(i)?);
        self.joined.get(start as usize..end as usize)
    }

    fn values(&self) -> [Option<&str>; TEXT_FIELDS] {
        std::array::from_fn(|i| TextField::ALL.get(i).and_then(|&field| self.get(field)))
    }
}

impl ReplayEvent {
    /// Sets one text field (absent with `None`).
    pub fn set_text(&mut self, field: TextField, value: Option<&str>) {
        let mut values = self.texts.values();
        if let Some(slot) = values.get_mut(field as usize) {
            *slot = value;
        }
        self.texts = Texts::new(&values);
    }
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    replay_id: Text<'a>,
    #[serde(default)]
    segment_id: Num,
    #[serde(borrow, default)]
    event_hash: Text<'a>,
    #[serde(default)]
    timestamp: Num,
    #[serde(default)]
    replay_start_timestamp: Num,
    #[serde(borrow, default)]
    urls: TextList<'a>,
    #[serde(borrow, default)]
    segment_names: TextList<'a>,
    #[serde(borrow, default)]
    error_ids: TextList<'a>,
    #[serde(borrow, default)]
    trace_ids: TextList<'a>,
    #[serde(default)]
    is_archived: Flag,
    #[serde(borrow, default)]
    replay_type: Text<'a>,
    #[serde(borrow, default)]
    platform: Text<'a>,
    #[serde(borrow, default)]
    environment: Text<'a>,
    #[serde(borrow, default)]
    release: Text<'a>,
    #[serde(borrow, default)]
    dist: Text<'a>,
    #[serde(borrow, default)]
    sdk: Object<NameVersion<'a>>,
    #[serde(borrow, default)]
    user: Object<User<'a>>,
    #[serde(borrow, default)]
    contexts: Object<Contexts<'a>>,
    #[serde(borrow, default)]
    tags: Tags<'a>,
}

#[derive(Deserialize, Default)]
struct NameVersion<'a> {
    #[serde(borrow, default)]
    name: Text<'a>,
    #[serde(borrow, default)]
    version: Text<'a>,
}

#[derive(Deserialize, Default)]
struct User<'a> {
    #[serde(borrow, default)]
    id: Id<'a>,
    #[serde(borrow, default)]
    username: Text<'a>,
    #[serde(borrow, default)]
    email: Text<'a>,
    #[serde(borrow, default)]
    ip_address: Text<'a>,
    #[serde(borrow, default)]
    geo: Object<Geo<'a>>,
}

#[derive(Deserialize, Default)]
struct Geo<'a> {
    #[serde(borrow, default)]
    city: Text<'a>,
    #[serde(borrow, default)]
    country_code: Text<'a>,
    #[serde(borrow, default)]
    region: Text<'a>,
    #[serde(borrow, default)]
    subdivision: Text<'a>,
}

#[derive(Deserialize, Default)]
struct OtaUpdates<'a> {
    #[serde(borrow, default)]
    channel: Text<'a>,
    #[serde(borrow, default)]
    runtime_version: Text<'a>,
    #[serde(borrow, default)]
    update_id: Text<'a>,
}

#[derive(Deserialize, Default)]
struct Device<'a> {
    #[serde(borrow, default)]
    name: Text<'a>,
    #[serde(borrow, default)]
    brand: Text<'a>,
    #[serde(borrow, default)]
    family: Text<'a>,
    #[serde(borrow, default)]
    model: Text<'a>,
}

#[derive(Deserialize, Default)]
struct ReplayContext {
    #[serde(default)]
    error_sample_rate: Num,
    #[serde(default)]
    session_sample_rate: Num,
}

#[derive(Deserialize, Default)]
struct Contexts<'a> {
    #[serde(borrow, default)]
    browser: Object<NameVersion<'a>>,
    #[serde(borrow, default)]
    os: Object<NameVersion<'a>>,
    #[serde(borrow, default)]
    device: Object<Device<'a>>,
    #[serde(default)]
    replay: Object<ReplayContext>,
    #[serde(borrow, default)]
    ota_updates: Object<OtaUpdates<'a>>,
}

/// One tag: its key and its value (`None` when null or not a string).
type Tag<'a> = (Cow<'a, str>, Option<Cow<'a, str>>);

/// `tags` as Relay's array of pairs `[[k, v], …]` or as an object `{k: v}`: the first
/// `MAX_TAGS` pairs, and how many more were sent.
#[derive(Default)]
struct Tags<'a>(Vec<Tag<'a>>, u64);

impl<'a> Tags<'a> {
    fn push(&mut self, tag: Tag<'a>) {
        if self.0.len() < MAX_TAGS {
            self.0.push(tag);
        } else {
            self.1 += 1;
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Tags<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TagsVisitor;
        impl<'de> Visitor<'de> for TagsVisitor {
            type Value = Tags<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("tags")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut tags = Tags::default();
                while let Some((Text(k), Text(v))) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    if let Some(k) = k {
                        tags.push((k, v));
                    }
                }
                Ok(tags)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut tags = Tags::default();
                while let Some(Pair(pair)) = seq.next_element::<Pair<'de>>()? {
                    if let Some(tag) = pair {
                        tags.push(tag);
                    }
                }
                Ok(tags)
            }
            default_for!(str, numbers, bool, null);
        }
        d.deserialize_any(TagsVisitor)
    }
}

/// One element of a tag array: `[key, value]` with a string key, else nothing. Elements past
/// the second are consumed, not kept.
#[derive(Default)]
struct Pair<'a>(Option<Tag<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Pair<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairVisitor;
        impl<'de> Visitor<'de> for PairVisitor {
            type Value = Pair<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tag pair")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let key = seq.next_element::<Text<'de>>()?.and_then(|Text(k)| k);
                let value = seq.next_element::<Text<'de>>()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Pair(key.zip(value).map(|(k, Text(v))| (k, v))))
            }
            default_for!(str, numbers, bool, null, map);
        }
        d.deserialize_any(PairVisitor)
    }
}

/// The first `MAX_LIST_ENTRIES` strings of a list, and how many were left out.
fn first_entries<'a>(list: TextList<'a>) -> (impl Iterator<Item = Cow<'a, str>>, u64) {
    let dropped = list.1.0 + list.0.len().saturating_sub(MAX_LIST_ENTRIES) as u64;
    (list.0.into_iter().take(MAX_LIST_ENTRIES), dropped)
}

fn uuids(list: TextList<'_>, dropped: &mut u64) -> Vec<Uuid> {
    let (ids, left_out) = first_entries(list);
    *dropped += left_out;
    ids.filter_map(|id| Uuid::try_parse(&id).ok()).collect()
}

/// Parses the replay event document.
pub fn parse(json: &[u8]) -> Result<ReplayEvent, InvalidRecording> {
    // A derived struct would also accept a positional array.
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(InvalidRecording::new(
            Reason::InvalidReplayEvent,
            "replay_event is not a JSON object",
        ));
    }
    let json = simdutf8::basic::from_utf8(json).map_err(|_| {
        InvalidRecording::new(
            Reason::InvalidReplayEvent,
            "replay_event is not valid UTF-8",
        )
    })?;
    // The parser recurses per level: a deeper document would overflow the stack. It reads one
    // value (anything after it is an error before it is parsed), so that value is what counts.
    if scan::too_deep(json.trim_start()) {
        return Err(InvalidRecording::new(
            Reason::InvalidReplayEvent,
            format_args!(
                "replay_event nests deeper than {} levels",
                scan::MAX_NESTING
            ),
        ));
    }
    let wire: Wire<'_> = serde_json::from_str(json).map_err(|e| {
        InvalidRecording::new(
            Reason::InvalidReplayEvent,
            format_args!("replay_event is not a JSON object: {e}"),
        )
    })?;
    let contexts = wire.contexts.0;
    let user = wire.user.0;
    let geo = user.geo.0;
    let ota = contexts.ota_updates.0;
    let (urls, mut dropped_items) = first_entries(wire.urls);
    let urls = urls.map(|url| Arc::from(url.as_ref())).collect();
    let (segment_names, left_out) = first_entries(wire.segment_names);
    dropped_items += left_out;
    let segment_names = segment_names.map(CompactString::from).collect();
    let error_ids = uuids(wire.error_ids, &mut dropped_items);
    let trace_ids_sent = match (&wire.trace_ids.0[..], wire.trace_ids.1.0, wire.trace_ids.2) {
        ([lone], 0, 0) if lone.is_empty() => 0,
        // Entries that are not strings count too, as `len(trace_ids)` counts them: one beside a
        // trace id makes two, and the items get the replay id.
        (sent, skipped, others) => sent.len() + (skipped + others) as usize,
    };
    let trace_ids = uuids(wire.trace_ids, &mut dropped_items);
    dropped_items += wire.tags.1;
    // As snuba maps them: every `transaction` tag leaves the list, the last one is the title.
    let (mut title, mut tags) = (None, Vec::new());
    for (key, value) in wire.tags.0 {
        if key == "transaction" {
            title = value;
        } else {
            tags.push((
                CompactString::from(key),
                value.map(CompactString::from).unwrap_or_default(),
            ));
        }
    }
    tags.shrink_to_fit();
    let mut texts = [None; TEXT_FIELDS];
    for (field, text) in [
        (TextField::replay_type, wire.replay_type.0.as_deref()),
        (TextField::platform, wire.platform.0.as_deref()),
        (TextField::environment, wire.environment.0.as_deref()),
        (TextField::release, wire.release.0.as_deref()),
        (TextField::dist, wire.dist.0.as_deref()),
        (TextField::sdk_name, wire.sdk.0.name.0.as_deref()),
        (TextField::sdk_version, wire.sdk.0.version.0.as_deref()),
        (TextField::user_id, user.id.0.as_deref()),
        (TextField::user_name, user.username.0.as_deref()),
        (TextField::user_email, user.email.0.as_deref()),
        (TextField::ip_address, user.ip_address.0.as_deref()),
        (TextField::geo_city, geo.city.0.as_deref()),
        (TextField::geo_country_code, geo.country_code.0.as_deref()),
        (TextField::geo_region, geo.region.0.as_deref()),
        (TextField::geo_subdivision, geo.subdivision.0.as_deref()),
        (TextField::os_name, contexts.os.0.name.0.as_deref()),
        (TextField::os_version, contexts.os.0.version.0.as_deref()),
        (
            TextField::browser_name,
            contexts.browser.0.name.0.as_deref(),
        ),
        (
            TextField::browser_version,
            contexts.browser.0.version.0.as_deref(),
        ),
        (TextField::device_name, contexts.device.0.name.0.as_deref()),
        (
            TextField::device_brand,
            contexts.device.0.brand.0.as_deref(),
        ),
        (
            TextField::device_family,
            contexts.device.0.family.0.as_deref(),
        ),
        (
            TextField::device_model,
            contexts.device.0.model.0.as_deref(),
        ),
        (TextField::ota_updates_channel, ota.channel.0.as_deref()),
        (
            TextField::ota_updates_runtime_version,
            ota.runtime_version.0.as_deref(),
        ),
        (TextField::ota_updates_update_id, ota.update_id.0.as_deref()),
        (TextField::title, title.as_deref()),
    ] {
        if let Some(slot) = texts.get_mut(field as usize) {
            *slot = text;
        }
    }
    Ok(ReplayEvent {
        replay_id: wire
            .replay_id
            .as_str()
            .and_then(|id| Uuid::try_parse(id).ok()),
        segment_id: wire
            .segment_id
            .as_u64()
            .and_then(|id| u32::try_from(id).ok()),
        event_hash: wire
            .event_hash
            .as_str()
            .and_then(|hash| Uuid::try_parse(hash).ok()),
        timestamp: wire.timestamp.0,
        replay_start_timestamp: wire.replay_start_timestamp.0,
        urls,
        segment_names,
        error_ids,
        trace_ids,
        trace_ids_sent,
        is_archived: wire.is_archived.0,
        error_sample_rate: contexts.replay.0.error_sample_rate.0,
        session_sample_rate: contexts.replay.0.session_sample_rate.0,
        tags,
        dropped_items,
        texts: Texts::new(&texts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_the_segment_row_needs() {
        let event = parse(
            br#"{"type":"replay_event","timestamp":1796012453.5,"replay_start_timestamp":1796012448,
            "urls":["https://a/","https://b/"],"error_ids":["2f045a65095a407da962d4ca1e905a53","nope"],
            "trace_ids":[],"replay_type":"session","platform":"javascript","environment":"prod",
            "sdk":{"name":"sentry.javascript.browser","version":"11.12.0"},
            "user":{"id":"42","email":"ada@example.com","ip_address":"127.0.0.1"},
            "contexts":{"browser":{"name":"Chrome","version":"156"},"os":{"name":"Linux"},
                        "replay":{"session_sample_rate":1,"error_sample_rate":0.5}},
            "tags":{"plan":"pro","n":3}}"#,
        )
        .unwrap();
        assert_eq!(event.timestamp, Some(1_796_012_453.5));
        assert_eq!(
            event.urls,
            [Url::from("https://a/"), Url::from("https://b/")]
        );
        assert_eq!(event.error_ids.len(), 1, "non-UUID ids are dropped");
        assert_eq!(
            (event.sdk_name(), event.sdk_version()),
            ("sentry.javascript.browser", "11.12.0")
        );
        assert_eq!(
            (event.user_id(), event.ip_address()),
            (Some("42"), Some("127.0.0.1"))
        );
        assert_eq!((event.browser_name(), event.os_name()), ("Chrome", "Linux"));
        assert_eq!(
            (event.session_sample_rate, event.error_sample_rate),
            (Some(1.0), Some(0.5))
        );
        // A value that is not a string counts as null: "" (Relay only ever sends strings).
        assert_eq!(
            event.tags,
            [
                ("plan".into(), "pro".into()),
                ("n".into(), CompactString::default())
            ]
        );
    }

    #[test]
    fn relay_style_tag_pairs_are_read_and_the_last_transaction_is_the_title() {
        let event = parse(
            br#"{"tags":[["transaction","/a"],["a","1"],["b",null],["broken"],["transaction","/b"],[1,"x"],["c","3","extra"]]}"#,
        )
        .unwrap();
        let tags: Vec<(&str, &str)> = event
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(tags, [("a", "1"), ("b", ""), ("c", "3")]);
        assert_eq!(event.title(), Some("/b"));
        let null_title = parse(br#"{"tags":[["transaction","/a"],["transaction",null]]}"#).unwrap();
        assert_eq!((null_title.title(), null_title.tags.len()), (None, 0));
    }

    #[test]
    fn texts_share_one_allocation_and_an_absent_field_differs_from_an_empty_one() {
        let mut event = parse(
            br#"{"platform":"javascript","user":{"id":"","username":"ada"},"release":"x@1.2.3 \u00e9",
            "tags":[["transaction","/a"]]}"#,
        )
        .unwrap();
        assert_eq!(
            (event.platform(), event.release(), event.environment()),
            ("javascript", "x@1.2.3 é", "")
        );
        assert_eq!(
            (event.user_id(), event.user_name(), event.user_email()),
            (Some(""), Some("ada"), None)
        );
        assert_eq!(event.title(), Some("/a"));
        let before = event.clone();
        event.set_text(TextField::ip_address, Some("192.0.2.7"));
        assert_eq!(event.ip_address(), Some("192.0.2.7"));
        event.set_text(TextField::ip_address, None);
        assert_eq!(event, before, "every other text kept, in place");
        use crate::recording::heap::HeapSize;
        assert_eq!(
            event.texts.heap_size(),
            "javascript".len() + "ada".len() + "x@1.2.3 é".len() + "/a".len()
        );
    }

    #[test]
    fn ids_user_geo_and_ota_fields_are_read() {
        let event = parse(
            br#"{"replay_id":"834f314caae54030a1b0dc52b202f24a","segment_id":70000,"event_hash":"nope",
            "is_archived":true,"segment_names":["checkout"],
            "user":{"id":42,"username":"ada","geo":{"city":"Austin","country_code":"US"}},
            "contexts":{"ota_updates":{"channel":"prod","runtime_version":"1","update_id":"u"}}}"#,
        )
        .unwrap();
        assert_eq!(
            event.replay_id.unwrap().simple().to_string(),
            "834f314caae54030a1b0dc52b202f24a"
        );
        assert_eq!(
            (event.segment_id, event.event_hash, event.is_archived),
            (Some(70_000), None, true)
        );
        assert_eq!(
            (event.user_id(), event.user_name()),
            (Some("42"), Some("ada"))
        );
        assert_eq!((event.user_email(), event.ip_address()), (None, None));
        assert_eq!(
            (event.geo_city(), event.geo_country_code()),
            ("Austin", "US")
        );
        assert_eq!(event.ota_updates_channel(), "prod");
        assert_eq!(event.segment_names, ["checkout"]);
    }

    #[test]
    fn wrong_typed_fields_become_empty_instead_of_failing() {
        let event = parse(
            br#"{"urls":"x","sdk":5,"user":[1],"contexts":{"os":"linux"},"timestamp":"now"}"#,
        )
        .unwrap();
        assert_eq!(event, ReplayEvent::default());
    }

    #[test]
    fn lists_are_cut_as_relay_cuts_them_and_tags_to_their_cap() {
        let urls: Vec<String> = (0..150).map(|i| format!(r#""/{i}""#)).collect();
        let tags: Vec<String> = (0..MAX_TAGS + 5)
            .map(|i| format!(r#"["k{i}","v"]"#))
            .collect();
        let doc = format!(
            r#"{{"urls":[{}],"tags":[{}]}}"#,
            urls.join(","),
            tags.join(",")
        );
        let event = parse(doc.as_bytes()).unwrap();
        assert_eq!(
            (event.urls.len(), event.tags.len()),
            (MAX_LIST_ENTRIES, MAX_TAGS)
        );
        assert_eq!(event.dropped_items, 50 + 5);
    }

    #[test]
    fn a_document_nested_deeper_than_the_parser_allows_is_invalid() {
        let deep = format!(r#"{{"user":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(
            parse(deep.as_bytes()).unwrap_err().reason,
            Reason::InvalidReplayEvent
        );
        // Leading whitespace, an unterminated document, or depth after the document: all refused
        // without recursing (a stack overflow here would abort the test binary).
        let deep_open = format!(r#"{{"user":{}"#, "[".repeat(100_000));
        let deep_after = format!(
            r#"{{"user":1}} {}{}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        for doc in [format!(" \n\t{deep}"), deep_open, deep_after] {
            let error = parse(doc.as_bytes()).unwrap_err();
            assert_eq!(error.reason, Reason::InvalidReplayEvent, "{}", error.detail);
        }
        // Just within the limit: parsed, on a thread with the stack processing threads get
        // (unoptimised test builds use far more stack per level than release builds).
        let shallow = format!(r#"{{"user":{}{}}}"#, "[".repeat(127), "]".repeat(127));
        let parsed = std::thread::Builder::new()
            .stack_size(crate::recording::PROCESSING_STACK_BYTES)
            .spawn(move || parse(shallow.as_bytes()).is_ok())
            .unwrap();
        assert!(parsed.join().unwrap());
    }

    #[test]
    fn a_document_that_is_not_an_object_is_invalid() {
        for doc in [
            &b"[1]"[..],
            b"not json",
            b"",
            b"{\"urls\":[",
            b"{\"release\":\"\xc3\"}",
        ] {
            assert_eq!(parse(doc).unwrap_err().reason, Reason::InvalidReplayEvent);
        }
    }
}
