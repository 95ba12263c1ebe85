//! Issue Platform occurrences: what Sentry's occurrence consumer (`ingest-occurrences`) reads to
//! open or update a "Rage Click" (group type 5002) or "Hydration Error" (5003) issue. Built as
//! Sentry builds them (`docs/outputs.md`, "Issue occurrences"):
//!
//! - only for a segment that carried a replay event, and only for projects the operator enabled
//!   ([`IssueGates`]; Sentry's project options `sentry:replay_rage_click_issues` and
//!   `sentry:replay_hydration_error_issues`, both on by default);
//! - a rage click needs the breadcrumb's own page URL; every hydration-error breadcrumb counts;
//! - fingerprint: the rage click's CSS selector, or `"1"` (one hydration issue per project); the
//!   Kafka key is `"{fingerprint}-{project_id}"`;
//! - an attached event made of the replay event's environment, platform, tags, contexts, user,
//!   release, SDK and dist, passed through as sent.
//!
//! Where Sentry draws random ids, these are derived from the replay, segment and position, so a
//! redelivered segment produces the same occurrences. A segment whose replay event has no
//! `platform` produces none (Sentry fails on it); tags or contexts that are not an object or a
//! list of pairs are left out (Sentry fails on those too). A segment produces at most
//! [`MAX_HYDRATION_ISSUES`] hydration-error occurrences (rage clicks are already capped by the
//! extraction) and at most [`MAX_OCCURRENCE_BYTES`] in all: each copies the replay event's tags
//! and contexts, and a small message must not fan out into megabytes.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use indexmap::IndexMap;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::ids::SegmentIds;
use super::json::{RawJson, default_for};
use super::replay_event::{MAX_TAGS, ReplayEvent};
use super::rows::md5_uuid;
use super::rrweb::{Click, Extracted, HydrationError};

/// Sentry's `ReplayRageClickType.type_id`.
pub const RAGE_CLICK_TYPE: u32 = 5002;
/// Sentry's `ReplayHydrationErrorType.type_id`.
pub const HYDRATION_ERROR_TYPE: u32 = 5003;
/// Sentry's `MAX_CULPRIT_LENGTH`, in characters.
pub const MAX_CULPRIT_CHARS: usize = 200;
/// Hydration-error occurrences per segment (Sentry sends one per breadcrumb). They all join one
/// issue per project, so past the first few they only inflate its event count.
pub const MAX_HYDRATION_ISSUES: usize = 20;
/// Occurrence bytes one segment may produce; later ones are left out.
pub const MAX_OCCURRENCE_BYTES: usize = 1024 * 1024;

const HYDRATION_SUBTITLE: &str =
    "Hydration failed - the server rendered HTML didn't match the client.";
/// Latest instant Python's `datetime` can show: 9999-12-31T23:59:59.
const MAX_DATETIME_SECONDS: f64 = 253_402_300_799.0;

/// Which projects get one kind of issue: `off`, `all`, or a comma-separated list of project ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProjectFilter {
    Off,
    #[default]
    All,
    Only(BTreeSet<u64>),
}

impl ProjectFilter {
    pub fn allows(&self, project_id: u64) -> bool {
        match self {
            ProjectFilter::Off => false,
            ProjectFilter::All => true,
            ProjectFilter::Only(projects) => projects.contains(&project_id),
        }
    }
}

impl FromStr for ProjectFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(ProjectFilter::Off),
            "all" => Ok(ProjectFilter::All),
            list => {
                let ids = list
                    .split(',')
                    .map(|id| {
                        id.trim()
                            .parse::<u64>()
                            .map_err(|_| format!("{id:?} is not a project id"))
                    })
                    .collect::<Result<BTreeSet<u64>, String>>()?;
                Ok(ProjectFilter::Only(ids))
            }
        }
    }
}

impl fmt::Display for ProjectFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProjectFilter::Off => f.write_str("off"),
            ProjectFilter::All => f.write_str("all"),
            ProjectFilter::Only(ids) => {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                f.write_str(&ids.join(","))
            }
        }
    }
}

/// The per-project switches of both issue kinds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IssueGates {
    pub rage_clicks: ProjectFilter,
    pub hydration_errors: ProjectFilter,
}

/// The two kinds of replay issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueKind {
    RageClick,
    HydrationError,
}

/// One occurrence, serialized: the Kafka key and value Sentry's producer would send.
#[derive(Debug, Clone, PartialEq)]
pub struct Occurrence {
    pub kind: IssueKind,
    pub key: String,
    pub value: Vec<u8>,
}

/// Whether a segment can produce any occurrence, so its replay event must be kept for it.
pub fn possible(extracted: &Extracted) -> bool {
    !extracted.hydration_errors.is_empty() || extracted.rage_clicks().any(|c| !c.url.is_empty())
}

/// The occurrences of one segment. `raw` is the replay event as sent; `event` the same, parsed.
pub fn build(
    ids: &SegmentIds,
    extracted: &Extracted,
    raw: &RawJson,
    event: &ReplayEvent,
    gates: &IssueGates,
) -> Vec<Occurrence> {
    let rage = gates.rage_clicks.allows(ids.project_id);
    let hydration = gates.hydration_errors.allows(ids.project_id);
    if !(rage || hydration) {
        return Vec::new();
    }
    let Ok(attached) = serde_json::from_str::<Attached<'_>>(raw.get().get()) else {
        return Vec::new();
    };
    let Some(platform) = attached.platform.0 else {
        return Vec::new();
    };
    let trace_id = event.trace_ids.first().map(|id| id.simple().to_string());
    let context = Context {
        ids,
        attached: &attached,
        platform,
        trace_id: trace_id.as_deref(),
    };
    let rage_clicks = extracted
        .rage_clicks()
        .filter(|_| rage)
        .filter(|c| !c.url.is_empty());
    let hydration_errors = extracted
        .hydration_errors
        .iter()
        .filter(|_| hydration)
        .take(MAX_HYDRATION_ISSUES);
    // In Sentry's order (`emit_replay_events`): hydration errors first, so that the byte cap
    // leaves out rage clicks before them.
    let candidates = hydration_errors
        .enumerate()
        .map(|(i, error)| context.hydration_error(i, error))
        .chain(
            rage_clicks
                .enumerate()
                .map(|(i, click)| context.rage_click(i, click)),
        );
    let mut occurrences = Vec::new();
    let mut bytes = 0;
    for occurrence in candidates.flatten() {
        bytes += occurrence.value.len();
        if bytes > MAX_OCCURRENCE_BYTES {
            break;
        }
        occurrences.push(occurrence);
    }
    occurrences
}

/// What the attached event takes from the replay event, borrowed from it.
#[derive(Deserialize)]
struct Attached<'a> {
    #[serde(borrow, default)]
    environment: Present<'a>,
    #[serde(borrow, default)]
    platform: Present<'a>,
    #[serde(borrow, default)]
    tags: Pairs<'a>,
    #[serde(borrow, default)]
    contexts: Pairs<'a>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default)]
    release: Option<&'a RawValue>,
    #[serde(borrow, default)]
    sdk: Option<&'a RawValue>,
    #[serde(borrow, default)]
    dist: Option<&'a RawValue>,
}

/// A field's value as sent, `null` included; `None` only when the field is absent.
#[derive(Default)]
struct Present<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Present<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&RawValue>::deserialize(d).map(|raw| Present(Some(raw)))
    }
}

/// An object's entries, or a list of `[key, value]` pairs (Relay's tags), in order; the first
/// `MAX_TAGS`. Anything else, and any malformed pair, is nothing.
#[derive(Default)]
struct Pairs<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Pairs<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object or a list of pairs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some((key, value)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    if pairs.len() < MAX_TAGS {
                        pairs.push((key, value));
                    }
                }
                Ok(Pairs(pairs))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(element) = seq.next_element::<&'de RawValue>()? {
                    let pair =
                        serde_json::from_str::<(Cow<'de, str>, &'de RawValue)>(element.get());
                    if let (Ok(pair), true) = (pair, pairs.len() < MAX_TAGS) {
                        pairs.push(pair);
                    }
                }
                Ok(Pairs(pairs))
            }
            default_for!(str, numbers, bool, null);
        }
        d.deserialize_any(PairsVisitor)
    }
}

/// Keys in insertion order; setting an existing key replaces its value in place (Python's
/// `dict.update`).
#[derive(Serialize)]
#[serde(transparent)]
struct Dict<'a>(IndexMap<Cow<'a, str>, Cow<'a, RawValue>>);

impl<'a> Dict<'a> {
    fn new(entries: impl IntoIterator<Item = (&'a str, Box<RawValue>)>) -> Self {
        Dict(
            entries
                .into_iter()
                .map(|(k, v)| (Cow::Borrowed(k), Cow::Owned(v)))
                .collect(),
        )
    }

    fn update(mut self, pairs: &'a Pairs<'a>) -> Self {
        for (key, value) in &pairs.0 {
            self.0
                .insert(Cow::Borrowed(key.as_ref()), Cow::Borrowed(*value));
        }
        self
    }
}

fn raw(value: impl Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(&value).unwrap_or_else(|_| null())
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

#[derive(Serialize)]
struct Payload<'a> {
    id: String,
    project_id: u64,
    event_id: &'a str,
    fingerprint: [&'a str; 1],
    issue_title: &'static str,
    subtitle: &'a str,
    resource_id: Option<()>,
    evidence_data: Evidence<'a>,
    evidence_display: Vec<Display<'a>>,
    #[serde(rename = "type")]
    type_id: u32,
    detection_time: f64,
    level: &'static str,
    culprit: &'a str,
    initial_issue_priority: Option<()>,
    assignee: Option<()>,
    payload_type: &'static str,
    event: Event<'a>,
}

#[derive(Serialize, Default)]
struct Evidence<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<Node<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    component_name: Option<&'a str>,
}

#[derive(Serialize)]
struct Node<'a> {
    id: u64,
    #[serde(rename = "tagName")]
    tag_name: &'a str,
    attributes: Attributes<'a>,
    #[serde(rename = "textContent")]
    text_content: &'a str,
}

#[derive(Serialize)]
struct Attributes<'a> {
    id: &'a str,
    class: String,
    #[serde(rename = "aria-label")]
    aria_label: &'a str,
    role: &'a str,
    alt: &'a str,
    #[serde(rename = "data-testid")]
    testid: &'a str,
    title: &'a str,
    #[serde(rename = "data-sentry-component")]
    component_name: &'a str,
}

#[derive(Serialize)]
struct Display<'a> {
    name: &'static str,
    value: Cow<'a, str>,
    important: bool,
}

#[derive(Serialize)]
struct Event<'a> {
    id: &'a str,
    environment: Cow<'a, RawValue>,
    platform: &'a RawValue,
    project_id: u64,
    received: &'a str,
    tags: Dict<'a>,
    timestamp: &'a str,
    contexts: Dict<'a>,
    level: &'static str,
    user: Option<&'a RawValue>,
    release: Option<&'a RawValue>,
    sdk: Option<&'a RawValue>,
    dist: Option<&'a RawValue>,
    event_id: &'a str,
}

/// What every occurrence of one segment shares.
struct Context<'a> {
    ids: &'a SegmentIds,
    attached: &'a Attached<'a>,
    platform: &'a RawValue,
    trace_id: Option<&'a str>,
}

impl Context<'_> {
    fn rage_click(&self, index: usize, click: &Click) -> Option<Occurrence> {
        let classes = click.classes.join(" ");
        let node = Node {
            id: click.node_id,
            tag_name: &click.tag,
            attributes: Attributes {
                id: &click.id,
                class: classes,
                aria_label: &click.aria_label,
                role: &click.role,
                alt: &click.alt,
                testid: &click.testid,
                title: &click.title,
                component_name: &click.component_name,
            },
            text_content: &click.text,
        };
        let selector = click.selector.as_str();
        let component = (!click.component_name.is_empty()).then_some(click.component_name.as_str());
        let mut display = vec![Display {
            name: "Clicked Element",
            value: clicked_element(&node).into(),
            important: false,
        }];
        display.push(Display {
            name: "Selector Path",
            value: selector.into(),
            important: component.is_none(),
        });
        if let Some(component) = component {
            display.push(Display {
                name: "React Component Name",
                value: component.into(),
                important: true,
            });
        }
        let evidence = Evidence {
            node: Some(node),
            selector: Some(selector),
            component_name: component,
        };
        let seen = Seen {
            kind: IssueKind::RageClick,
            index,
            fingerprint: selector,
            title: "Rage Click",
            subtitle: selector,
            // Sentry reports the click at its whole second.
            detection_time: click.timestamp.trunc(),
            url: Some(&click.url),
        };
        self.occurrence(seen, evidence, display)
    }

    fn hydration_error(&self, index: usize, error: &HydrationError) -> Option<Occurrence> {
        let seen = Seen {
            kind: IssueKind::HydrationError,
            index,
            fingerprint: "1",
            title: "Hydration Error",
            subtitle: HYDRATION_SUBTITLE,
            // Sentry's round trip through a datetime: to the microsecond.
            detection_time: python_datetime_timestamp(error.timestamp),
            url: error.url.as_deref(),
        };
        self.occurrence(seen, Evidence::default(), Vec::new())
    }

    fn occurrence(
        &self,
        seen: Seen<'_>,
        evidence: Evidence<'_>,
        display: Vec<Display<'_>>,
    ) -> Option<Occurrence> {
        let ids = self.ids;
        let at = python_isoformat(seen.detection_time)?;
        let name = |part: &str| {
            md5_uuid(&format!(
                "{}:{}:{:?}:{}:{part}",
                ids.replay_id, ids.segment_id, seen.kind, seen.index
            ))
            .simple()
            .to_string()
        };
        let event_id = name("event");
        let url = seen.url.unwrap_or_default();
        let culprit = url
            .char_indices()
            .nth(MAX_CULPRIT_CHARS)
            .map_or(url, |(end, _)| &url[..end]);
        let tags = Dict::new([("replayId", raw(&ids.replay_id)), ("url", raw(seen.url))])
            .update(&self.attached.tags);
        let mut contexts = vec![(
            "replay",
            raw(ReplayContext {
                replay_id: &ids.replay_id,
            }),
        )];
        contexts.extend(
            self.trace_id
                .map(|trace_id| ("trace", raw(TraceContext { trace_id }))),
        );
        let event = Event {
            id: &event_id,
            environment: self
                .attached
                .environment
                .0
                .map_or_else(|| Cow::Owned(raw("production")), Cow::Borrowed),
            platform: self.platform,
            project_id: ids.project_id,
            received: &at,
            tags,
            timestamp: &at,
            contexts: Dict::new(contexts).update(&self.attached.contexts),
            level: "error",
            user: self.attached.user,
            release: self.attached.release,
            sdk: self.attached.sdk,
            dist: self.attached.dist,
            event_id: &event_id,
        };
        let payload = Payload {
            id: name("occurrence"),
            project_id: ids.project_id,
            event_id: &event_id,
            fingerprint: [seen.fingerprint],
            issue_title: seen.title,
            subtitle: seen.subtitle,
            resource_id: None,
            evidence_data: evidence,
            evidence_display: display,
            type_id: match seen.kind {
                IssueKind::RageClick => RAGE_CLICK_TYPE,
                IssueKind::HydrationError => HYDRATION_ERROR_TYPE,
            },
            detection_time: seen.detection_time,
            level: "error",
            culprit,
            initial_issue_priority: None,
            assignee: None,
            payload_type: "occurrence",
            event,
        };
        let value = serde_json::to_vec(&payload).ok()?;
        Some(Occurrence {
            kind: seen.kind,
            key: format!("{}-{}", seen.fingerprint, ids.project_id),
            value,
        })
    }
}

/// What one occurrence reports.
struct Seen<'a> {
    kind: IssueKind,
    /// Position among this segment's occurrences of its kind.
    index: usize,
    fingerprint: &'a str,
    title: &'static str,
    subtitle: &'a str,
    detection_time: f64,
    url: Option<&'a str>,
}

#[derive(Serialize)]
struct ReplayContext<'a> {
    replay_id: &'a str,
}

#[derive(Serialize)]
struct TraceContext<'a> {
    trace_id: &'a str,
}

/// The element as Sentry shows it: tag, `#id`, `.classes`, then each attribute in brackets, all
/// eight always present (empty ones render empty).
fn clicked_element(node: &Node<'_>) -> String {
    let a = &node.attributes;
    let mut out = node.tag_name.to_owned();
    let _ = write!(out, "#{}", python_strip(a.id));
    let _ = write!(
        out,
        ".{}",
        python_strip(&a.class)
            .split(' ')
            .collect::<Vec<_>>()
            .join(".")
    );
    for (name, value) in [
        ("aria", a.aria_label),
        ("role", a.role),
        ("alt", a.alt),
        ("data-test-id", a.testid),
        ("title", a.title),
        ("data-sentry-component", a.component_name),
    ] {
        let _ = write!(out, "[{name}=\"{}\"]", python_strip(value));
    }
    out
}

/// `s` as Python's `str.strip()` leaves it: without the whitespace at either end, which for
/// Python also takes in U+001C–U+001F (the information separators) that Rust's `trim` keeps.
fn python_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// `timestamp` as Python's `datetime.fromtimestamp` keeps it: whole seconds, and microseconds
/// rounded half to even.
fn python_datetime(timestamp: f64) -> (f64, f64) {
    let seconds = timestamp.floor();
    let micros = ((timestamp - seconds) * 1e6).round_ties_even();
    if micros >= 1e6 {
        (seconds + 1.0, 0.0)
    } else {
        (seconds, micros)
    }
}

/// `datetime.fromtimestamp(timestamp, UTC).timestamp()`: the time to the microsecond, as a float
/// (whole microseconds below 2^53 divide exactly as Python divides them).
fn python_datetime_timestamp(timestamp: f64) -> f64 {
    let (seconds, micros) = python_datetime(timestamp);
    (seconds * 1e6 + micros) / 1e6
}

/// `datetime.fromtimestamp(t, UTC).isoformat()`: `2023-12-17T21:30:58+00:00`, with `.ffffff`
/// when there are microseconds. `None` outside what a Python datetime can hold.
fn python_isoformat(timestamp: f64) -> Option<String> {
    if !(0.0..=MAX_DATETIME_SECONDS).contains(&timestamp) {
        return None;
    }
    let (seconds, micros) = python_datetime(timestamp);
    let at = UNIX_EPOCH + Duration::from_secs(seconds as u64);
    let mut text = humantime::format_rfc3339_seconds(at).to_string();
    text.pop(); // the `Z`
    if micros > 0.0 {
        let _ = write!(text, ".{:06}", micros as u32);
    }
    text.push_str("+00:00");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::super::replay_event;
    use super::*;

    const REPLAY: &str = "834f314caae54030a1b0dc52b202f24a";

    /// A hydration error's `detection_time` is its time as Sentry's datetime keeps it (the
    /// values Python prints for `datetime.fromtimestamp(t, UTC).timestamp()`); it was the raw
    /// float, different from the seventh decimal on.
    #[test]
    fn detection_time_is_rounded_to_the_microsecond_as_python_does() {
        for (sent, python) in [
            (1_702_848_661.251_234_5, 1_702_848_661.251_235),
            (1_702_848_661.25, 1_702_848_661.25),
            (1_702_848_661.999_999_5, 1_702_848_662.0),
            (1_702_848_661.000_000_5, 1_702_848_661.0),
            // Exactly 7812.5 µs (a binary fraction): half to even, not half up.
            (1_702_848_661.007_812_5, 1_702_848_661.007_812),
        ] {
            assert_eq!(python_datetime_timestamp(sent), python, "{sent}");
        }
    }

    fn ids() -> SegmentIds {
        SegmentIds {
            replay_id: REPLAY.into(),
            project_id: 1,
            ..SegmentIds::for_tests(3)
        }
    }

    fn event_json(tags: &str) -> String {
        format!(
            r#"{{"type":"replay_event","replay_id":"{REPLAY}","segment_id":3,"timestamp":1702848658.558,"trace_ids":["2cd798d70f9346089026d2014a826629"],"contexts":{{"browser":{{"name":"Chrome","version":"120.0.0","type":"browser"}},"os":{{"name":"Mac OS X","version":"10.15.7","type":"os"}}}},"platform":"javascript","release":"frontend@1.2.3","dist":null,"environment":"production","tags":{tags},"user":{{"id":"42","email":"a@example.com","ip_address":"203.0.113.9"}},"sdk":{{"name":"sentry.javascript.react","version":"7.91.0"}}}}"#
        )
    }

    fn rage_click() -> Click {
        Click {
            selector: "button#submit.btn.primary".into(),
            ..Click::example()
        }
    }

    fn occurrences(extracted: &Extracted, raw: &str, gates: &IssueGates) -> Vec<Occurrence> {
        let json = RawJson::parse(raw.as_bytes()).unwrap();
        build(
            &ids(),
            extracted,
            &json,
            &replay_event::parse(raw.as_bytes()).unwrap(),
            gates,
        )
    }

    /// The occurrence as text, with its two generated ids replaced by the example's.
    fn with_example_ids(occurrence: &Occurrence, id: &str, event_id: &str) -> String {
        let value: serde_json::Value = serde_json::from_slice(&occurrence.value).unwrap();
        let text = String::from_utf8(occurrence.value.clone()).unwrap();
        let (ours, our_event) = (
            value["id"].as_str().unwrap(),
            value["event_id"].as_str().unwrap(),
        );
        assert_eq!(ours.len(), 32, "an id Sentry's consumer parses as a UUID");
        text.replace(ours, id).replace(our_event, event_id)
    }

    #[test]
    fn a_rage_click_is_byte_for_byte_sentrys_occurrence() {
        let extracted = Extracted {
            clicks: vec![rage_click()],
            ..Extracted::default()
        };
        let raw = event_json(r#"[["transaction","/signup"]]"#);
        let found = occurrences(&extracted, &raw, &IssueGates::default());
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].kind, found[0].key.as_str()),
            (IssueKind::RageClick, "button#submit.btn.primary-1")
        );
        let expected = r#"{"id":"0e1d2c3b4a5968778695a4b3c2d1e0f9","project_id":1,"event_id":"9f2c1e0a5b7d4c3e8a1b2c3d4e5f6071","fingerprint":["button#submit.btn.primary"],"issue_title":"Rage Click","subtitle":"button#submit.btn.primary","resource_id":null,"evidence_data":{"node":{"id":59,"tagName":"button","attributes":{"id":"submit","class":"btn primary","aria-label":"","role":"button","alt":"","data-testid":"","title":"","data-sentry-component":"SignUpForm"},"textContent":"Submit"},"selector":"button#submit.btn.primary","component_name":"SignUpForm"},"evidence_display":[{"name":"Clicked Element","value":"button#submit.btn.primary[aria=\"\"][role=\"button\"][alt=\"\"][data-test-id=\"\"][title=\"\"][data-sentry-component=\"SignUpForm\"]","important":false},{"name":"Selector Path","value":"button#submit.btn.primary","important":false},{"name":"React Component Name","value":"SignUpForm","important":true}],"type":5002,"detection_time":1702848658.0,"level":"error","culprit":"https://example.com/signup","initial_issue_priority":null,"assignee":null,"payload_type":"occurrence","event":{"id":"9f2c1e0a5b7d4c3e8a1b2c3d4e5f6071","environment":"production","platform":"javascript","project_id":1,"received":"2023-12-17T21:30:58+00:00","tags":{"replayId":"834f314caae54030a1b0dc52b202f24a","url":"https://example.com/signup","transaction":"/signup"},"timestamp":"2023-12-17T21:30:58+00:00","contexts":{"replay":{"replay_id":"834f314caae54030a1b0dc52b202f24a"},"trace":{"trace_id":"2cd798d70f9346089026d2014a826629"},"browser":{"name":"Chrome","version":"120.0.0","type":"browser"},"os":{"name":"Mac OS X","version":"10.15.7","type":"os"}},"level":"error","user":{"id":"42","email":"a@example.com","ip_address":"203.0.113.9"},"release":"frontend@1.2.3","sdk":{"name":"sentry.javascript.react","version":"7.91.0"},"dist":null,"event_id":"9f2c1e0a5b7d4c3e8a1b2c3d4e5f6071"}}"#;
        assert_eq!(
            with_example_ids(
                &found[0],
                "0e1d2c3b4a5968778695a4b3c2d1e0f9",
                "9f2c1e0a5b7d4c3e8a1b2c3d4e5f6071"
            ),
            expected
        );
        assert_eq!(
            occurrences(&extracted, &raw, &IssueGates::default()),
            found,
            "the same segment, the same bytes"
        );
    }

    #[test]
    fn a_hydration_error_is_sentrys_occurrence_and_without_a_url_has_an_empty_culprit() {
        let error = |url: Option<&str>| HydrationError {
            timestamp: 1_702_848_661.25,
            url: url.map(Into::into),
        };
        let extracted = Extracted {
            hydration_errors: vec![error(Some("https://example.com/signup")), error(None)],
            ..Extracted::default()
        };
        let found = occurrences(
            &extracted,
            &event_json(r#"[["transaction","/signup"]]"#),
            &IssueGates::default(),
        );
        assert_eq!(found.len(), 2);
        assert_eq!(
            (found[0].kind, found[0].key.as_str()),
            (IssueKind::HydrationError, "1-1")
        );
        let expected = r#"{"id":"71c3e5a7b9d14f2688aa0b1c2d3e4f50","project_id":1,"event_id":"5b8a2f0e9c7d4e6fa1b2c3d4e5f60718","fingerprint":["1"],"issue_title":"Hydration Error","subtitle":"Hydration failed - the server rendered HTML didn't match the client.","resource_id":null,"evidence_data":{},"evidence_display":[],"type":5003,"detection_time":1702848661.25,"level":"error","culprit":"https://example.com/signup","initial_issue_priority":null,"assignee":null,"payload_type":"occurrence","event":{"id":"5b8a2f0e9c7d4e6fa1b2c3d4e5f60718","environment":"production","platform":"javascript","project_id":1,"received":"2023-12-17T21:31:01.250000+00:00","tags":{"replayId":"834f314caae54030a1b0dc52b202f24a","url":"https://example.com/signup","transaction":"/signup"},"timestamp":"2023-12-17T21:31:01.250000+00:00","contexts":{"replay":{"replay_id":"834f314caae54030a1b0dc52b202f24a"},"trace":{"trace_id":"2cd798d70f9346089026d2014a826629"},"browser":{"name":"Chrome","version":"120.0.0","type":"browser"},"os":{"name":"Mac OS X","version":"10.15.7","type":"os"}},"level":"error","user":{"id":"42","email":"a@example.com","ip_address":"203.0.113.9"},"release":"frontend@1.2.3","sdk":{"name":"sentry.javascript.react","version":"7.91.0"},"dist":null,"event_id":"5b8a2f0e9c7d4e6fa1b2c3d4e5f60718"}}"#;
        assert_eq!(
            with_example_ids(
                &found[0],
                "71c3e5a7b9d14f2688aa0b1c2d3e4f50",
                "5b8a2f0e9c7d4e6fa1b2c3d4e5f60718"
            ),
            expected
        );
        let without: serde_json::Value = serde_json::from_slice(&found[1].value).unwrap();
        assert_eq!(without["culprit"], "");
        assert_eq!(
            without["event"]["tags"],
            serde_json::json!({"replayId": REPLAY, "url": null, "transaction": "/signup"})
        );
        assert_ne!(
            without["id"],
            serde_json::from_slice::<serde_json::Value>(&found[0].value).unwrap()["id"]
        );
    }

    #[test]
    fn replay_tags_and_contexts_override_the_generated_ones_in_place() {
        let extracted = Extracted {
            clicks: vec![rage_click()],
            ..Extracted::default()
        };
        let raw = event_json(r#"{"url":"/mine","replayId":"x","z":"1"}"#).replace(
            r#""contexts":{"#,
            r#""contexts":{"trace":{"trace_id":"own"},"#,
        );
        let found = occurrences(&extracted, &raw, &IssueGates::default());
        let text = String::from_utf8(found[0].value.clone()).unwrap();
        assert!(
            text.contains(r#""tags":{"replayId":"x","url":"/mine","z":"1"}"#),
            "{text}"
        );
        assert!(text.contains(r#""contexts":{"replay":{"replay_id":"834f314caae54030a1b0dc52b202f24a"},"trace":{"trace_id":"own"},"browser""#), "{text}");
    }

    #[test]
    fn occurrences_follow_the_project_switches_and_sentrys_conditions() {
        let mut no_url = rage_click();
        no_url.url = "".into();
        let plain = Click {
            is_rage: false,
            is_dead: false,
            ..rage_click()
        };
        let error = HydrationError {
            timestamp: 1_702_848_661.0,
            url: None,
        };
        let extracted = Extracted {
            clicks: vec![rage_click(), no_url, plain],
            hydration_errors: vec![error],
            ..Extracted::default()
        };
        let raw = event_json("[]");
        let kinds = |gates: IssueGates| -> Vec<IssueKind> {
            occurrences(&extracted, &raw, &gates)
                .iter()
                .map(|o| o.kind)
                .collect()
        };
        let only = |ids: &str| ids.parse::<ProjectFilter>().unwrap();
        assert_eq!(
            kinds(IssueGates::default()),
            [IssueKind::HydrationError, IssueKind::RageClick],
            "in Sentry's order"
        );
        assert_eq!(
            kinds(IssueGates {
                rage_clicks: only("off"),
                ..IssueGates::default()
            }),
            [IssueKind::HydrationError]
        );
        assert_eq!(
            kinds(IssueGates {
                rage_clicks: only("7, 1"),
                hydration_errors: only("2")
            }),
            [IssueKind::RageClick]
        );
        assert!(
            kinds(IssueGates {
                rage_clicks: only("off"),
                hydration_errors: only("off")
            })
            .is_empty()
        );
        let no_platform = raw.replace(r#""platform":"javascript","#, "");
        assert!(
            occurrences(&extracted, &no_platform, &IssueGates::default()).is_empty(),
            "Sentry fails without one"
        );
        let null_environment =
            raw.replace(r#""environment":"production""#, r#""environment":null"#);
        let found = occurrences(&extracted, &null_environment, &IssueGates::default());
        assert!(String::from_utf8_lossy(&found[0].value).contains(r#""environment":null"#));
        let no_environment = raw.replace(r#""environment":"production","#, "");
        let found = occurrences(&extracted, &no_environment, &IssueGates::default());
        assert!(String::from_utf8_lossy(&found[0].value).contains(r#""environment":"production""#));
    }

    #[test]
    fn project_filters_parse_and_print_back() {
        for text in ["off", "all", "1,42"] {
            assert_eq!(text.parse::<ProjectFilter>().unwrap().to_string(), text);
        }
        assert_eq!(
            " 42 , 1 ".parse::<ProjectFilter>().unwrap().to_string(),
            "1,42"
        );
        assert!(
            "1,x"
                .parse::<ProjectFilter>()
                .unwrap_err()
                .contains("\"x\"")
        );
        assert!("".parse::<ProjectFilter>().is_err());
    }

    #[test]
    fn a_segment_s_occurrences_stop_at_their_byte_budget() {
        let clicks: Vec<Click> = (0..20).map(|_| rage_click()).collect();
        let extracted = Extracted {
            clicks,
            ..Extracted::default()
        };
        let big_tags = format!(r#"[["big","{}"]]"#, "x".repeat(200_000));
        let found = occurrences(&extracted, &event_json(&big_tags), &IssueGates::default());
        assert_eq!(found.len(), MAX_OCCURRENCE_BYTES / 200_000);
        assert!(found.iter().map(|o| o.value.len()).sum::<usize>() <= MAX_OCCURRENCE_BYTES);
    }

    /// Python's `str.strip()` also takes U+001C–U+001F off the ends, which `trim` keeps; the
    /// expected values are what Python 3.11 prints for the same attributes.
    #[test]
    fn the_clicked_element_strips_attributes_as_python_does() {
        let attributes = Attributes {
            id: "\u{1c} submit\u{a0}",
            class: "\u{1f}btn primary\u{2003}".into(),
            aria_label: "\u{1d}\u{1e}",
            role: "\u{85}button\u{3000}",
            alt: "",
            testid: "\u{1c}t\u{1c}id\u{1c}",
            title: "\u{7}bell",
            component_name: " Form ",
        };
        let node = Node {
            id: 1,
            tag_name: "button",
            attributes,
            text_content: "",
        };
        assert_eq!(
            clicked_element(&node),
            "button#submit.btn.primary[aria=\"\"][role=\"button\"][alt=\"\"][data-test-id=\"t\u{1c}id\"][title=\"\u{7}bell\"][data-sentry-component=\"Form\"]"
        );
    }

    #[test]
    fn isoformat_is_pythons() {
        assert_eq!(
            python_isoformat(1_702_848_658.0).unwrap(),
            "2023-12-17T21:30:58+00:00"
        );
        assert_eq!(
            python_isoformat(1_702_848_661.25).unwrap(),
            "2023-12-17T21:31:01.250000+00:00"
        );
        assert_eq!(
            python_isoformat(0.000_000_4),
            Some("1970-01-01T00:00:00+00:00".into())
        );
        assert_eq!(python_isoformat(-1.0), None);
        assert_eq!(python_isoformat(f64::NAN), None);
    }
}
