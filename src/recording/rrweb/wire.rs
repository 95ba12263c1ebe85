//! The wire shapes of the custom events extraction reads (rrweb `data` of breadcrumbs and
//! performance spans, Meta `href`): borrowed from the segment's JSON, every field optional, so a
//! malformed event is skipped rather than failing the segment.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::recording::json::{Num, Py, Text, object, parse};
use crate::recording::scan::Scanner;

#[derive(Deserialize)]
struct CustomData<'a> {
    #[serde(borrow, default)]
    tag: Text<'a>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
}

/// A custom event's `data` — `{"tag": …, "payload": …}` — as its tag and the payload's raw text
/// (`None` for an absent or `null` payload); `None` when it is not such an object.
///
/// The payload is **not validated** here: whoever reads it parses it with a validating parser
/// (the tag's typed parse, or [`valid_json`]), so its bytes are parsed once instead of twice.
/// The structural scanner reads what the SDK sends (exactly those two keys, a plain tag);
/// anything it would judge differently from serde_json — an escape or control character in the
/// tag, a tag that is not a string, another or a repeated key, a syntax error — is left to
/// serde_json's parse, so the outcome is always serde_json's.
pub(super) fn custom_data(data: &str) -> Option<(Text<'_>, Option<&str>)> {
    scan_custom_data(data).unwrap_or_else(|| {
        let custom = parse::<CustomData>(data)?;
        Some((custom.tag, custom.payload.map(RawValue::get)))
    })
}

/// [`custom_data`] by the scanner: `None` when serde_json must decide.
fn scan_custom_data(data: &str) -> Option<Option<(Text<'_>, Option<&str>)>> {
    let mut scanner = Scanner::new(data);
    scanner.begin_object().ok()?;
    let (mut tag, mut payload, mut first) = (None, None, true);
    while let Some(key) = scanner.next_key(first).ok()? {
        first = false;
        let value = scanner.value().ok()?;
        match key {
            "tag" if tag.is_none() => {
                let text = value.strip_prefix('"')?.strip_suffix('"')?;
                if text.bytes().any(|b| b == b'\\' || b < 0x20) {
                    return None;
                }
                tag = Some(text);
            }
            "payload" if payload.is_none() => payload = Some(value),
            _ => return None,
        }
    }
    scanner.end().ok()?;
    let tag = Text(tag.map(Cow::Borrowed));
    Some(Some((tag, payload.filter(|p| *p != "null"))))
}

/// Whether `json` is valid JSON (of any shape), by serde_json's validating parse.
pub(super) fn valid_json(json: &str) -> bool {
    parse::<serde::de::IgnoredAny>(json).is_some()
}

#[derive(Deserialize)]
pub(super) struct Breadcrumb<'a> {
    #[serde(borrow, default)]
    pub(super) category: Text<'a>,
    #[serde(borrow, default)]
    pub(super) message: Text<'a>,
    #[serde(default)]
    pub(super) timestamp: Num,
    #[serde(borrow, default)]
    pub(super) level: Text<'a>,
    /// `None` only when absent: a `null` is kept, for [`parse_data`] to refuse as Sentry does
    /// (`payload.get("data", {})` is `None`, whose `.get` raises: the breadcrumb is dropped).
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) data: Option<&'a RawValue>,
}

/// A field's raw value whenever it is there, `null` included (an `Option` reads a `null` as
/// absent).
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<&'a RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Span<'a> {
    #[serde(borrow, default)]
    pub(super) op: Text<'a>,
    #[serde(borrow, default)]
    pub(super) description: Text<'a>,
    #[serde(default)]
    pub(super) start_timestamp: Num,
    #[serde(borrow)]
    pub(super) data: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ClickData<'a> {
    /// Sentry takes a node only when it is an object (`isinstance(node, dict)`).
    #[serde(borrow, default, deserialize_with = "object")]
    pub(super) node: Option<Node<'a>>,
    #[serde(borrow, default)]
    pub(super) url: Text<'a>,
    #[serde(borrow, default)]
    pub(super) time_after_click_ms: Py<'a>,
    /// Older SDKs send the lower-case spelling, read when the camel-case one is not truthy (as
    /// Sentry reads them: `a or b`).
    #[serde(borrow, default, rename = "timeafterclickms")]
    pub(super) time_after_click_ms_lower: Py<'a>,
    #[serde(borrow, default)]
    pub(super) end_reason: Text<'a>,
    #[serde(borrow, default)]
    pub(super) click_count: Py<'a>,
    #[serde(borrow, default, rename = "clickcount")]
    pub(super) click_count_lower: Py<'a>,
    #[serde(default)]
    pub(super) node_id: Num,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Node<'a> {
    #[serde(default)]
    pub(super) id: Num,
    #[serde(borrow, default)]
    pub(super) tag_name: Text<'a>,
    #[serde(borrow, default)]
    pub(super) text_content: Text<'a>,
    /// Absent is none (Sentry's `node.get("attributes", {})`); `None` when they are there and
    /// not an object, on which Sentry's `.get` raises and the click is dropped.
    #[serde(borrow, default = "no_attributes", deserialize_with = "object")]
    pub(super) attributes: Option<Attributes<'a>>,
}

fn no_attributes<'a>() -> Option<Attributes<'a>> {
    Some(Attributes::default())
}

/// The node attributes the SDK reports. The test id has three spellings (the SDK renames
/// `data-testid` to `testId`; pages also use `data-test-id`); a node may carry several. The six
/// Sentry slices (`attributes.get("alt", "")[:64]`) are [`Py`], so that a click can tell a value
/// that is there and not a string (Sentry's parser raises on it) from one that is absent.
#[derive(Deserialize, Default)]
pub(super) struct Attributes<'a> {
    #[serde(borrow, default)]
    pub(super) id: Py<'a>,
    #[serde(borrow, default)]
    pub(super) class: Text<'a>,
    #[serde(borrow, default)]
    pub(super) role: Py<'a>,
    #[serde(borrow, default)]
    pub(super) alt: Py<'a>,
    #[serde(borrow, default, rename = "aria-label")]
    pub(super) aria_label: Py<'a>,
    #[serde(borrow, default)]
    pub(super) title: Py<'a>,
    #[serde(borrow, default, rename = "testId")]
    pub(super) test_id: Py<'a>,
    #[serde(borrow, default, rename = "data-testid")]
    pub(super) data_testid: Py<'a>,
    #[serde(borrow, default, rename = "data-test-id")]
    pub(super) data_test_id: Py<'a>,
    #[serde(borrow, default, rename = "data-sentry-component")]
    pub(super) component_name: Py<'a>,
}

impl Attributes<'_> {
    /// Whether Sentry's click parser takes these attributes: each it slices is absent or a
    /// string. Anything else there — `null`, a number, a boolean, an object — raises, and Sentry
    /// drops the click. An array slices without raising, and snuba then refuses every click of
    /// the segment (it reads each as a string): here only that click is left out. `class` and
    /// the test ids are read leniently there as here.
    pub(super) fn sliceable(&self) -> bool {
        [
            &self.id,
            &self.role,
            &self.alt,
            &self.aria_label,
            &self.title,
            &self.component_name,
        ]
        .into_iter()
        .all(|value| matches!(value, Py::Absent | Py::Str(_)))
    }
}

#[derive(Deserialize, Default)]
pub(super) struct TapData<'a> {
    #[serde(borrow, default, rename = "view.class")]
    pub(super) view_class: Text<'a>,
    #[serde(borrow, default, rename = "view.id")]
    pub(super) view_id: Text<'a>,
}

#[derive(Deserialize, Default)]
pub(super) struct NavigationData<'a> {
    #[serde(borrow, default)]
    pub(super) from: Text<'a>,
    #[serde(borrow, default)]
    pub(super) to: Text<'a>,
}

#[derive(Deserialize, Default)]
pub(super) struct UrlData<'a> {
    #[serde(borrow, default)]
    pub(super) url: Text<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RequestData<'a> {
    #[serde(borrow, default)]
    pub(super) method: Text<'a>,
    #[serde(default)]
    pub(super) status_code: Num,
    #[serde(default)]
    pub(super) request_body_size: Num,
    #[serde(default)]
    pub(super) response_body_size: Num,
    /// Read only when an object (Sentry's `data["request"]["size"]` raises on anything else,
    /// and that size is `None`).
    #[serde(default, deserialize_with = "object")]
    pub(super) request: Option<BodySize>,
    #[serde(default, deserialize_with = "object")]
    pub(super) response: Option<BodySize>,
}

/// `data.request` / `data.response`: only the size; bodies and headers are skipped.
#[derive(Deserialize, Default)]
pub(super) struct BodySize {
    #[serde(default)]
    pub(super) size: Num,
}

#[derive(Deserialize, Default)]
pub(super) struct VitalData<'a> {
    #[serde(default)]
    pub(super) value: Num,
    #[serde(borrow, default)]
    pub(super) rating: Text<'a>,
}

/// Parses optional `data`; absent data is the default, present but malformed — or not an
/// object, on which Sentry's `.get` raises — is `None`.
pub(super) fn parse_data<'a, T: Deserialize<'a> + Default>(
    data: &Option<&'a RawValue>,
) -> Option<T> {
    match data {
        None => Some(T::default()),
        Some(raw) if raw.get().starts_with('{') => parse(raw.get()),
        Some(_) => None,
    }
}

#[derive(Deserialize)]
pub(super) struct UrlHref<'a> {
    #[serde(borrow, default)]
    pub(super) href: Text<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What extraction concludes from a custom event's `data`: the tag it is counted under when
    /// it is valid (a string tag, the payload read by the tag's typed parse or checked as JSON).
    type Outcome = Option<String>;

    fn payload_valid(tag: Option<&str>, payload: Option<&str>, checked: bool) -> bool {
        match tag {
            Some("breadcrumb") => payload.and_then(parse::<Breadcrumb>).is_some(),
            Some("performanceSpan") => payload.and_then(parse::<Span>).is_some(),
            _ => checked || payload.is_none_or(valid_json),
        }
    }

    fn now(data: &str) -> Outcome {
        let (tag, payload) = custom_data(data)?;
        let tag = tag.as_str()?;
        payload_valid(Some(tag), payload, false).then(|| tag.to_owned())
    }

    /// serde_json parsing the whole `data`, as extraction did before the scanner read it.
    fn serde_json_reading_all(data: &str) -> Outcome {
        let custom = parse::<CustomData>(data)?;
        let tag = custom.tag.as_str()?;
        payload_valid(Some(tag), custom.payload.map(RawValue::get), true).then(|| tag.to_owned())
    }

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn what_the_sdk_sends_is_read_by_the_scanner() {
        let data = r#"{"tag":"breadcrumb","payload":{"category":"ui.click","message":"a"}}"#;
        assert!(scan_custom_data(data).is_some_and(|r| r.is_some()));
        assert_eq!(now(data).as_deref(), Some("breadcrumb"));
    }

    #[test]
    fn odd_data_gets_the_outcome_serde_json_gives() {
        let cases = [
            r#"{"tag":"breadcrumb","payload":{"category":"ui.click"}}"#.to_owned(),
            r#"{"payload":{"category":"x"},"tag":"breadcrumb"}"#.into(),
            r#"{"tag":"bread\u0063rumb","payload":{"category":"x"}}"#.into(),
            r#"{"t\u0061g":"breadcrumb","payload":{"category":"x"}}"#.into(),
            "{\"tag\":\"a\tb\",\"payload\":1}".into(),
            r#"{"tag":"breadcrumb","tag":"x","payload":{}}"#.into(),
            r#"{"tag":"options","payload":{"a":tru}}"#.into(),
            r#"{"tag":"options","payload":{"a":"x"},"payload":1}"#.into(),
            r#"{"tag":"options","payload":null}"#.into(),
            r#"{"tag":"options"}"#.into(),
            r#"{"tag":7,"payload":{}}"#.into(),
            r#"{"tag":null}"#.into(),
            r#"{"tag":"options","payload":{},"extra":[1,2]}"#.into(),
            r#"{"tag":"options","payload":1e400}"#.into(),
            r#"{"tag":"breadcrumb","payload":"text"}"#.into(),
            r#"{"tag":"options","payload":"a\u12"}"#.into(),
            "{\"tag\":\"options\",\"payload\":\"a\u{1}b\"}".into(),
            r#"{"tag":"options","payload":{"a":1},}"#.into(),
            r#"{"tag":"options" "payload":1}"#.into(),
            r#"[]"#.into(),
            r#"{}"#.into(),
            format!(r#"{{"tag":"options","payload":{}}}"#, nested(126)),
            format!(r#"{{"tag":"options","payload":{}}}"#, nested(127)),
            format!(r#"{{"tag":"options","payload":{}}}"#, nested(128)),
        ];
        for data in &cases {
            assert_eq!(now(data), serde_json_reading_all(data), "{data}");
        }
    }

    fn fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#""tag":"breadcrumb""#.to_owned()),
            Just(r#""tag":"performanceSpan""#.to_owned()),
            Just(r#""tag":"options""#.to_owned()),
            Just(r#""tag":"x\"y""#.to_owned()),
            Just(r#""tag":1"#.to_owned()),
            Just(r#""payload":{"category":"ui.click","data":{"nodeId":3}}"#.to_owned()),
            Just(r#""payload":{"op":"navigation.navigate","description":"/"}"#.to_owned()),
            Just(r#""payload":{"a":[1,{"b":"}"}]}"#.to_owned()),
            Just(r#""payload":{"a":nul}"#.to_owned()),
            Just(r#""payload":null"#.to_owned()),
            Just(r#""payload":"s""#.to_owned()),
            Just(r#""other":{}"#.to_owned()),
            "[ -~]{0,12}".prop_map(|s| format!(r#""payload":{{"k":"{s}"}}"#)),
        ]
    }

    proptest! {
        #[test]
        fn the_scanner_and_serde_json_agree_on_every_custom_event(
            fragments in prop::collection::vec(fragment(), 0..4),
            space in "[ \n]{0,2}",
        ) {
            let data = format!("{{{space}{}{space}}}", fragments.join(&format!(",{space}")));
            prop_assert_eq!(now(&data), serde_json_reading_all(&data), "{}", data);
        }
    }
}
