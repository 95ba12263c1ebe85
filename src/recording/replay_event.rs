//! The optional `replay_event`: a JSON object the SDK sends with each segment (SPEC §2).
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
//! them (`urls`, `error_ids`, `trace_ids`: 100 entries) and tags to `MAX_TAGS` pairs, so what is
//! kept is at most the document's size plus a small constant.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use uuid::Uuid;

use super::error::{InvalidRecording, Reason};
use super::heap::heap_size;
use super::json::{Num, Object, Text, TextList, default_for};
use super::rrweb::Url;
use super::scan;

/// Entries kept of `urls`, `error_ids` and `trace_ids`: Relay's own limit.
pub const MAX_LIST_ENTRIES: usize = 100;

/// Tag pairs kept.
pub const MAX_TAGS: usize = 1000;

/// The replay event's fields this service stores, owned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayEvent {
    /// Seconds since the epoch.
    pub timestamp: Option<f64>,
    pub replay_start_timestamp: Option<f64>,
    /// Shared with the segment's visited URLs.
    pub urls: Vec<Url>,
    /// Ids that are not UUIDs are dropped.
    pub error_ids: Vec<Uuid>,
    pub trace_ids: Vec<Uuid>,
    pub replay_type: String,
    pub platform: String,
    pub environment: String,
    pub release: String,
    pub dist: String,
    pub sdk_name: String,
    pub sdk_version: String,
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
    pub error_sample_rate: Option<f64>,
    pub session_sample_rate: Option<f64>,
    /// Tag pairs in the order sent.
    pub tags: Vec<(String, String)>,
    /// List entries and tags left out by the limits above.
    pub dropped_items: u64,
}

heap_size!(ReplayEvent {
    urls,
    error_ids,
    trace_ids,
    replay_type,
    platform,
    environment,
    release,
    dist,
    sdk_name,
    sdk_version,
    user_id,
    user_name,
    user_email,
    ip_address,
    os_name,
    os_version,
    browser_name,
    browser_version,
    device_name,
    device_brand,
    device_family,
    device_model,
    tags,
});

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    timestamp: Num,
    #[serde(default)]
    replay_start_timestamp: Num,
    #[serde(borrow, default)]
    urls: TextList<'a>,
    #[serde(borrow, default)]
    error_ids: TextList<'a>,
    #[serde(borrow, default)]
    trace_ids: TextList<'a>,
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
    id: Text<'a>,
    #[serde(borrow, default)]
    username: Text<'a>,
    #[serde(borrow, default)]
    email: Text<'a>,
    #[serde(borrow, default)]
    ip_address: Text<'a>,
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
}

/// `tags` as an object `{k: v}` or as relay's array of pairs `[[k, v], …]`: the first
/// `MAX_TAGS` pairs, and how many more were sent.
#[derive(Default)]
struct Tags<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>, u64);

impl<'a> Tags<'a> {
    fn push(&mut self, pair: (Cow<'a, str>, Cow<'a, str>)) {
        if self.0.len() < MAX_TAGS {
            self.0.push(pair);
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
                    if let Some(pair) = k.zip(v) {
                        tags.push(pair);
                    }
                }
                Ok(tags)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut tags = Tags::default();
                while let Some(TextList(pair, _)) = seq.next_element::<TextList<'de>>()? {
                    if let Ok([k, v]) = <[Cow<'de, str>; 2]>::try_from(pair)
                        && !k.is_empty()
                    {
                        tags.push((k, v));
                    }
                }
                Ok(tags)
            }
            default_for!(str, numbers, bool, null);
        }
        d.deserialize_any(TagsVisitor)
    }
}

fn string(text: Text<'_>) -> String {
    text.0.map(Cow::into_owned).unwrap_or_default()
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
        return Err(InvalidRecording::new(Reason::InvalidReplayEvent, "replay_event is not a JSON object"));
    }
    let json = simdutf8::basic::from_utf8(json)
        .map_err(|_| InvalidRecording::new(Reason::InvalidReplayEvent, "replay_event is not valid UTF-8"))?;
    // The parser recurses per level: a deeper document would overflow the stack.
    if scan::nesting_exceeds(json.as_bytes(), scan::MAX_NESTING) {
        return Err(InvalidRecording::new(
            Reason::InvalidReplayEvent,
            format_args!("replay_event nests deeper than {} levels", scan::MAX_NESTING),
        ));
    }
    let wire: Wire<'_> = sonic_rs::from_str(json).map_err(|e| {
        InvalidRecording::new(Reason::InvalidReplayEvent, format_args!("replay_event is not a JSON object: {e}"))
    })?;
    let contexts = wire.contexts.0;
    let (urls, mut dropped_items) = first_entries(wire.urls);
    let urls = urls.map(|url| Arc::from(url.as_ref())).collect();
    let error_ids = uuids(wire.error_ids, &mut dropped_items);
    let trace_ids = uuids(wire.trace_ids, &mut dropped_items);
    dropped_items += wire.tags.1;
    let mut tags: Vec<(String, String)> =
        wire.tags.0.into_iter().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    tags.shrink_to_fit();
    Ok(ReplayEvent {
        timestamp: wire.timestamp.0,
        replay_start_timestamp: wire.replay_start_timestamp.0,
        urls,
        error_ids,
        trace_ids,
        replay_type: string(wire.replay_type),
        platform: string(wire.platform),
        environment: string(wire.environment),
        release: string(wire.release),
        dist: string(wire.dist),
        sdk_name: string(wire.sdk.0.name),
        sdk_version: string(wire.sdk.0.version),
        user_id: string(wire.user.0.id),
        user_name: string(wire.user.0.username),
        user_email: string(wire.user.0.email),
        ip_address: string(wire.user.0.ip_address),
        os_name: string(contexts.os.0.name),
        os_version: string(contexts.os.0.version),
        browser_name: string(contexts.browser.0.name),
        browser_version: string(contexts.browser.0.version),
        device_name: string(contexts.device.0.name),
        device_brand: string(contexts.device.0.brand),
        device_family: string(contexts.device.0.family),
        device_model: string(contexts.device.0.model),
        error_sample_rate: contexts.replay.0.error_sample_rate.0,
        session_sample_rate: contexts.replay.0.session_sample_rate.0,
        tags,
        dropped_items,
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
        assert_eq!(event.urls, [Url::from("https://a/"), Url::from("https://b/")]);
        assert_eq!(event.error_ids.len(), 1, "non-UUID ids are dropped");
        assert_eq!((event.sdk_name.as_str(), event.sdk_version.as_str()), ("sentry.javascript.browser", "11.12.0"));
        assert_eq!((event.user_id.as_str(), event.ip_address.as_str()), ("42", "127.0.0.1"));
        assert_eq!((event.browser_name.as_str(), event.os_name.as_str()), ("Chrome", "Linux"));
        assert_eq!((event.session_sample_rate, event.error_sample_rate), (Some(1.0), Some(0.5)));
        assert_eq!(event.tags, [("plan".to_owned(), "pro".to_owned())]);
    }

    #[test]
    fn relay_style_tag_pairs_are_read() {
        let event = parse(br#"{"tags":[["a","1"],["b","2"],["broken"]]}"#).unwrap();
        assert_eq!(event.tags, [("a".into(), "1".into()), ("b".into(), "2".into())]);
    }

    #[test]
    fn wrong_typed_fields_become_empty_instead_of_failing() {
        let event = parse(br#"{"urls":"x","sdk":5,"user":[1],"contexts":{"os":"linux"},"timestamp":"now"}"#).unwrap();
        assert_eq!(event, ReplayEvent::default());
    }

    #[test]
    fn lists_are_cut_as_relay_cuts_them_and_tags_to_their_cap() {
        let urls: Vec<String> = (0..150).map(|i| format!(r#""/{i}""#)).collect();
        let tags: Vec<String> = (0..MAX_TAGS + 5).map(|i| format!(r#"["k{i}","v"]"#)).collect();
        let doc = format!(r#"{{"urls":[{}],"tags":[{}]}}"#, urls.join(","), tags.join(","));
        let event = parse(doc.as_bytes()).unwrap();
        assert_eq!((event.urls.len(), event.tags.len()), (MAX_LIST_ENTRIES, MAX_TAGS));
        assert_eq!(event.dropped_items, 50 + 5);
    }

    #[test]
    fn a_document_nested_deeper_than_the_parser_allows_is_invalid() {
        let deep = format!(r#"{{"user":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(parse(deep.as_bytes()).unwrap_err().reason, Reason::InvalidReplayEvent);
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
        for doc in [&b"[1]"[..], b"not json", b"", b"{\"urls\":[", b"{\"release\":\"\xc3\"}"] {
            assert_eq!(parse(doc).unwrap_err().reason, Reason::InvalidReplayEvent);
        }
    }
}
