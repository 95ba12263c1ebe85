//! One rrweb custom event (`type: 5`) to the attributes and timestamp of its trace item, category
//! by category as Sentry's `as_trace_item_context` builds them (docs/outputs.md, "Breadcrumbs as
//! trace items"). Sentry reads the event as a Python dict: a missing key or a value of the wrong
//! type raises, and that one item is dropped; the conversions below follow Python's (`int()`,
//! `float()`, `str()`, `bool()`) on the JSON values they can meet.

use super::dom::{Json, Object};
use super::proto::{self, Value as Any};
use crate::recording::rrweb::{self, cut_bytes};

/// Request and response headers kept per direction; the rest are left out and counted.
pub const MAX_HEADERS: usize = 64;

/// Longest header value kept (cut on a character boundary with the marker, counted); a header
/// name longer than this is left out (counted), since a cut name would be another header.
pub const MAX_HEADER_BYTES: usize = 1024;

/// The categories that have items, and the `category` attribute of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Click,
    Tap,
    Navigation,
    ResourceFetch,
    ResourceXhr,
    ResourceScript,
    ResourceImg,
    WebVitalLcp,
    WebVitalCls,
    HydrateError,
    Mutations,
    SdkOptions,
    Memory,
}

impl Category {
    pub const ALL: [Category; 13] = [
        Category::Click,
        Category::Tap,
        Category::Navigation,
        Category::ResourceFetch,
        Category::ResourceXhr,
        Category::ResourceScript,
        Category::ResourceImg,
        Category::WebVitalLcp,
        Category::WebVitalCls,
        Category::HydrateError,
        Category::Mutations,
        Category::SdkOptions,
        Category::Memory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Click => "ui.click",
            Category::Tap => "ui.tap",
            Category::Navigation => "navigation",
            Category::ResourceFetch => "resource.fetch",
            Category::ResourceXhr => "resource.xhr",
            Category::ResourceScript => "resource.script",
            Category::ResourceImg => "resource.img",
            Category::WebVitalLcp => "web-vital.lcp",
            Category::WebVitalCls => "web-vital.cls",
            Category::HydrateError => "replay.hydrate-error",
            Category::Mutations => "replay.mutations",
            Category::SdkOptions => "sdk.options",
            Category::Memory => "memory",
        }
    }
}

/// A required field missing or of a type Sentry's conversion refuses: the item is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidField;

/// What an event became: its category and timestamp (ms since the epoch); its attributes were
/// appended to the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Built {
    pub category: Category,
    pub timestamp_ms: i64,
}

/// The latest instant a protobuf `Timestamp` (and Python's `datetime`) holds: 9999-12-31T23:59:59.999.
const MAX_MILLIS: f64 = 253_402_300_799_999.0;
/// The earliest: 0001-01-01T00:00:00 (Python raises "year 0 is out of range" before it, and
/// Sentry drops the item).
const MIN_MILLIS: f64 = -62_135_596_800_000.0;

/// Appends the event's attributes to `out` and says what it became; `Ok(None)` for the events
/// Sentry gives no item (console, multi-click, focus, navigation spans, unknown ones, …).
/// `event_ms` is the rrweb event's own timestamp, normalised to milliseconds. On an error nothing
/// is left appended. `headers_cut` counts headers left out or cut.
pub fn build(
    data: &Json,
    event_ms: u64,
    out: &mut Vec<u8>,
    headers_cut: &mut u64,
) -> Result<Option<Built>, InvalidField> {
    let start = out.len();
    let result = classify(data).map_or(Ok(None), |kind| {
        let mut attributes = Attributes { out, headers_cut };
        attributes.kind(kind, data, event_ms)
    });
    if !matches!(result, Ok(Some(_))) {
        out.truncate(start);
    }
    result
}

/// The event kinds with an item, as Sentry's `which` tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Click { is_dead: bool, is_rage: bool },
    Tap,
    Navigation,
    Request(Category),
    Resource(Category),
    WebVital(Category),
    HydrateError,
    Mutations,
    Options,
    Memory,
}

/// Sentry's `which`: any missing key or wrong type on the way is an event of unknown kind (no item,
/// not an error).
fn classify(data: &Json) -> Option<Kind> {
    let tag = data.get("tag")?.as_str()?;
    if tag == "options" {
        return Some(Kind::Options);
    }
    let payload = data.get("payload")?;
    match tag {
        "breadcrumb" => match payload.get("category")?.as_str()? {
            "ui.click" => Some(Kind::Click {
                is_dead: false,
                is_rage: false,
            }),
            "ui.slowClickDetected" => slow_click(payload.get("data")?),
            "ui.tap" => Some(Kind::Tap),
            "navigation" => Some(Kind::Navigation),
            "replay.hydrate-error" => Some(Kind::HydrateError),
            "replay.mutations" => Some(Kind::Mutations),
            _ => None,
        },
        "performanceSpan" => match payload.get("op")?.as_str()? {
            op if op.starts_with("navigation") => None,
            "resource.fetch" => Some(Kind::Request(Category::ResourceFetch)),
            "resource.xhr" => Some(Kind::Request(Category::ResourceXhr)),
            "resource.script" => Some(Kind::Resource(Category::ResourceScript)),
            "resource.img" => Some(Kind::Resource(Category::ResourceImg)),
            "web-vital" => match payload.get("description")?.as_str()? {
                "largest-contentful-paint" => Some(Kind::WebVital(Category::WebVitalLcp)),
                "cumulative-layout-shift" => Some(Kind::WebVital(Category::WebVitalCls)),
                _ => None,
            },
            "memory" => Some(Kind::Memory),
            _ => None,
        },
        _ => None,
    }
}

/// A slow click's kind, as rows and occurrences take it too ([`rrweb::slow_click`]).
fn slow_click(data: &Json) -> Option<Kind> {
    let data = data.as_object()?;
    // `data.get(a, 0) or data.get(b, 0)`, compared with a number: anything else (null, a
    // string) raises and the event is unknown.
    let number = |a: &str, b: &str| match data.get(a).filter(|v| truthy(v)).or(data.get(b)) {
        None => Some(0.0),
        Some(v) => number_of(v),
    };
    let (is_dead, is_rage) = rrweb::slow_click(
        data.get("endReason").and_then(Json::as_str),
        data.get("node")
            .and_then(|n| n.get("tagName"))
            .and_then(Json::as_str),
        || number("timeAfterClickMs", "timeafterclickms"),
        || number("clickCount", "clickcount"),
    )?;
    Some(Kind::Click { is_dead, is_rage })
}

struct Attributes<'a> {
    out: &'a mut Vec<u8>,
    headers_cut: &'a mut u64,
}

impl Attributes<'_> {
    fn put(&mut self, key: &str, value: Any<'_>) {
        proto::attribute(self.out, key, value);
    }

    fn category(&mut self, category: Category) {
        self.put("category", Any::Str(category.as_str()));
    }

    fn kind(
        &mut self,
        kind: Kind,
        data: &Json,
        event_ms: u64,
    ) -> Result<Option<Built>, InvalidField> {
        let payload = || field(data, "payload");
        let built = |category, timestamp_ms| {
            Ok(Some(Built {
                category,
                timestamp_ms,
            }))
        };
        match kind {
            Kind::Click { is_dead, is_rage } => {
                let payload = payload()?;
                let click = field(payload, "data")?;
                // Without a node there is no item (and no error).
                let Some(node) = click.get("node") else {
                    return Ok(None);
                };
                self.click(payload, node, is_dead, is_rage)?;
                built(Category::Click, seconds(field(payload, "timestamp")?)?)
            }
            Kind::Tap => {
                let payload = data.get("payload").unwrap_or(&Json::Null);
                let tap_data = field(payload, "data")?;
                self.category(Category::Tap);
                self.put("message", Any::Str(string(field(payload, "message")?)?));
                self.put("view_id", Any::Str(string(field(tap_data, "view.id")?)?));
                self.put(
                    "view_class",
                    Any::Str(string(field(tap_data, "view.class")?)?),
                );
                built(Category::Tap, seconds(field(payload, "timestamp")?)?)
            }
            Kind::Navigation => {
                let payload = payload()?;
                self.category(Category::Navigation);
                let nav = optional_object(payload, "data")?;
                for key in ["from", "to"] {
                    if let Some(value) = nav.and_then(|n| n.get(key)) {
                        self.put(key, Any::Str(string(value)?));
                    }
                }
                built(Category::Navigation, seconds(field(payload, "timestamp")?)?)
            }
            Kind::Request(category) => {
                let payload = payload()?;
                self.request(payload, category)?;
                built(category, seconds(field(payload, "startTimestamp")?)?)
            }
            Kind::Resource(category) => {
                let payload = payload()?;
                self.category(category);
                self.put("url", Any::Str(string(field(payload, "description")?)?));
                self.put("duration", Any::Double(duration(payload)?));
                let resource = optional_object(payload, "data")?;
                for key in ["size", "statusCode", "decodedBodySize", "encodedBodySize"] {
                    if let Some(value) = resource.and_then(|r| r.get(key)) {
                        self.put(key, Any::Int(int(value)?));
                    }
                }
                built(category, seconds(field(payload, "startTimestamp")?)?)
            }
            Kind::WebVital(category) => {
                let payload = payload()?;
                let vital = field(payload, "data")?;
                self.category(category);
                self.put("duration", Any::Double(duration(payload)?));
                self.put("rating", Any::Str(string(field(vital, "rating")?)?));
                self.put("size", Any::Double(float(field(vital, "size")?)?));
                self.put("value", Any::Double(float(field(vital, "value")?)?));
                built(category, seconds(field(payload, "startTimestamp")?)?)
            }
            Kind::HydrateError => {
                let payload = payload()?;
                self.category(Category::HydrateError);
                let url = match optional_object(payload, "data")?.and_then(|d| d.get("url")) {
                    Some(url) => string(url)?,
                    None => "",
                };
                self.put("url", Any::Str(url));
                built(
                    Category::HydrateError,
                    seconds(field(payload, "timestamp")?)?,
                )
            }
            Kind::Mutations => {
                let payload = payload()?;
                self.category(Category::Mutations);
                let count = int(field(field(payload, "data")?, "count")?)?;
                self.put("count", Any::Int(count));
                // The SDK sends this rrweb event's timestamp in seconds (the breadcrumb's), as
                // Sentry reads it; normalised here like every other event timestamp.
                built(Category::Mutations, event_millis(event_ms)?)
            }
            Kind::Options => {
                self.category(Category::SdkOptions);
                let options = optional_object(data, "payload")?;
                const FLAGS: [&str; 10] = [
                    "shouldRecordCanvas",
                    "useCompressionOption",
                    "blockAllMedia",
                    "maskAllText",
                    "maskAllInputs",
                    "useCompression",
                    "networkDetailHasUrls",
                    "networkCaptureBodies",
                    "networkRequestHasHeaders",
                    "networkResponseHasHeaders",
                ];
                for key in FLAGS {
                    if let Some(value) = options.and_then(|o| o.get(key)) {
                        self.put(key, Any::Bool(truthy(value)));
                    }
                }
                for key in ["sessionSampleRate", "errorSampleRate"] {
                    if let Some(value) = options.and_then(|o| o.get(key)) {
                        self.put(key, Any::Double(float(value)?));
                    }
                }
                built(Category::SdkOptions, event_millis(event_ms)?)
            }
            Kind::Memory => {
                let payload = payload()?;
                let memory = field(field(payload, "data")?, "memory")?;
                self.category(Category::Memory);
                for key in ["jsHeapSizeLimit", "totalJSHeapSize", "usedJSHeapSize"] {
                    self.put(key, Any::Int(int(field(memory, key)?)?));
                }
                let end = float(field(payload, "endTimestamp")?)?;
                self.put("endTimestamp", Any::Double(end));
                self.put("duration", Any::Double(duration(payload)?));
                built(
                    Category::Memory,
                    seconds(field(payload, "startTimestamp")?)?,
                )
            }
        }
    }

    fn click(
        &mut self,
        payload: &Json,
        node: &Json,
        is_dead: bool,
        is_rage: bool,
    ) -> Result<(), InvalidField> {
        let attributes = optional_object(node, "attributes")?;
        self.put("node_id", Any::Int(int(field(node, "id")?)?));
        self.put("tag", Any::Str(string(field(node, "tagName")?)?));
        let text = string(field(node, "textContent")?)?;
        self.put("text", Any::Str(first_chars(text, 1024)));
        self.put("is_dead", Any::Bool(is_dead));
        self.put("is_rage", Any::Bool(is_rage));
        self.put("selector", Any::Str(string(field(payload, "message")?)?));
        self.category(Category::Click);
        const OPTIONAL: [(&str, &str); 7] = [
            ("alt", "alt"),
            ("aria-label", "aria_label"),
            ("class", "class"),
            ("data-sentry-component", "component_name"),
            ("id", "id"),
            ("role", "role"),
            ("title", "title"),
        ];
        for (sent, name) in OPTIONAL {
            if let Some(value) = attributes.and_then(|a| a.get(sent)) {
                self.put(name, Any::Str(string(value)?));
            }
        }
        // The first of them that is truthy, if it is a string.
        let testid = ["testId", "data-testid", "data-test-id"]
            .into_iter()
            .filter_map(|key| attributes.and_then(|a| a.get(key)))
            .find(|id| truthy(id))
            .and_then(Json::as_str);
        if let Some(testid) = testid {
            self.put("testid", Any::Str(testid));
        }
        if let Some(url) = payload.get("url") {
            self.put("url", Any::Str(string(url)?));
        }
        Ok(())
    }

    fn request(&mut self, payload: &Json, category: Category) -> Result<(), InvalidField> {
        let request = field(payload, "data")?;
        self.category(category);
        self.put("url", Any::Str(string(field(payload, "description")?)?));
        let method = python_str(field(request, "method")?);
        self.put("method", Any::Str(&method));
        self.put("duration", Any::Double(duration(payload)?));
        if let Some(status) = request.get("statusCode") {
            self.put("statusCode", Any::Int(int(status)?));
        }
        for direction in ["request", "response"] {
            // `data.get(direction, {}).get("headers", {}).items()`: either present but not an
            // object raises.
            let headers = match request.get(direction) {
                None => None,
                Some(d) if d.as_object().is_none() => return Err(InvalidField),
                Some(d) => optional_object(d, "headers")?,
            };
            if let Some(headers) = headers {
                self.headers(direction, headers);
            }
        }
        for (name, body_key) in [
            ("request_size", "requestBodySize"),
            ("response_size", "responseBodySize"),
        ] {
            let direction = &name[..name.len() - "_size".len()];
            let size = match request.get(body_key) {
                Some(size) => int(size).ok(),
                None => request
                    .get(direction)
                    .and_then(|d| d.get("size"))
                    .and_then(|s| int(s).ok()),
            };
            if let Some(size) = size.filter(|&s| s != 0) {
                self.put(name, Any::Int(size));
            }
        }
        Ok(())
    }

    /// `{direction}.headers.{name}` for each header, as `str(value)`, within the caps.
    fn headers(&mut self, direction: &str, headers: &Object<'_>) {
        let mut kept = 0;
        for (name, value) in headers.entries() {
            if kept == MAX_HEADERS || name.len() > MAX_HEADER_BYTES {
                *self.headers_cut += 1;
                continue;
            }
            kept += 1;
            let text = python_str(value);
            let (text, cut) = cut_bytes(&text, MAX_HEADER_BYTES);
            *self.headers_cut += u64::from(cut);
            let key = format!("{direction}.headers.{name}");
            self.put(&key, Any::Str(&text));
        }
    }
}

/// `value[key]`: a missing key, or `value` not an object, raises.
fn field<'v>(value: &'v Json<'v>, key: &str) -> Result<&'v Json<'v>, InvalidField> {
    value
        .as_object()
        .and_then(|o| o.get(key))
        .ok_or(InvalidField)
}

/// `value.get(key, {})` used as a dict: absent is empty; present but not an object raises where
/// it is then read (here at once).
fn optional_object<'v>(
    value: &'v Json<'v>,
    key: &str,
) -> Result<Option<&'v Object<'v>>, InvalidField> {
    match value.as_object().and_then(|o| o.get(key)) {
        None => Ok(None),
        Some(Json::Object(map)) => Ok(Some(map)),
        Some(_) => Err(InvalidField),
    }
}

/// Sentry's `as_string_strict`.
fn string<'v>(value: &'v Json<'_>) -> Result<&'v str, InvalidField> {
    value.as_str().ok_or(InvalidField)
}

/// Python's `int()` of a JSON value: integers, floats toward zero, booleans, integer strings.
fn int(value: &Json<'_>) -> Result<i64, InvalidField> {
    match value {
        Json::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite() && f.abs() < 9.2e18)
                    .map(|f| f as i64)
            })
            .ok_or(InvalidField),
        Json::Bool(b) => Ok(i64::from(*b)),
        // `trim`, not `str.strip()`'s set: Python's `int()` and `float()` of an ASCII string
        // strip only ASCII whitespace, so `int("\x1c5")` raises, as this refuses it.
        Json::Str(s) => s.trim().parse().map_err(|_| InvalidField),
        _ => Err(InvalidField),
    }
}

/// Python's `float()` of a JSON value: numbers, booleans, numeric strings.
fn float(value: &Json<'_>) -> Result<f64, InvalidField> {
    match value {
        Json::Str(s) => s.trim().parse().map_err(|_| InvalidField),
        other => number_of(other).ok_or(InvalidField),
    }
}

/// A number or a boolean as a float (what Python compares and adds without raising).
fn number_of(value: &Json<'_>) -> Option<f64> {
    match value {
        Json::Number(n) => n.as_f64(),
        Json::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// Python's truthiness.
fn truthy(value: &Json<'_>) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Json::Str(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// Python's `str()` of a JSON value, for the values Sentry passes through it (a method, a header):
/// strings as they are, `True`/`False`/`None`, numbers as JSON writes them, containers as JSON.
fn python_str(value: &Json<'_>) -> String {
    match value {
        Json::Str(s) => s.to_string(),
        Json::Bool(true) => "True".to_owned(),
        Json::Bool(false) => "False".to_owned(),
        Json::Null => "None".to_owned(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// `float(end) - float(start)` of a span.
fn duration(payload: &Json<'_>) -> Result<f64, InvalidField> {
    Ok(float(field(payload, "endTimestamp")?)? - float(field(payload, "startTimestamp")?)?)
}

/// A timestamp in seconds (`float()`), truncated to milliseconds as Sentry does; an instant no
/// `datetime` holds raises.
fn seconds(value: &Json<'_>) -> Result<i64, InvalidField> {
    let ms = (float(value)? * 1000.0).trunc();
    if !ms.is_finite() || !(MIN_MILLIS..=MAX_MILLIS).contains(&ms) {
        return Err(InvalidField);
    }
    Ok(ms as i64)
}

/// The rrweb event's own timestamp (milliseconds), within what a `datetime` holds as
/// [`seconds`] checks: Sentry raises past year 9999 and drops the item (one in year 33658, or
/// wrapped negative past `i64::MAX`, went out).
fn event_millis(event_ms: u64) -> Result<i64, InvalidField> {
    i64::try_from(event_ms)
        .ok()
        .filter(|ms| (*ms as f64) <= MAX_MILLIS)
        .ok_or(InvalidField)
}

/// Python's `s[:n]`.
fn first_chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(end, _)| &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// `f` of the value as the builder reads it: parsed from the value's text.
    fn read<R>(value: &Value, f: impl FnOnce(&Json<'_>) -> R) -> R {
        let text = value.to_string();
        f(&super::super::dom::parse(&text, usize::MAX - 1).unwrap())
    }

    fn built(data: Value) -> (Result<Option<Built>, InvalidField>, Vec<u8>, u64) {
        let (mut out, mut cut) = (Vec::new(), 0);
        let result = read(&data, |data| {
            build(data, 1_700_000_000_000, &mut out, &mut cut)
        });
        (result, out, cut)
    }

    #[test]
    fn an_event_timestamp_no_datetime_holds_gives_no_item() {
        let options = json!({"tag": "options", "payload": {}});
        let mutations = json!({"tag": "breadcrumb", "payload": {"category": "replay.mutations",
            "data": {"count": 3}}});
        for data in [options, mutations] {
            for (event_ms, ok) in [
                (253_402_300_799_999, true),
                (1_000_000_000_000_000, false),
                (u64::MAX, false),
            ] {
                let (mut out, mut cut) = (Vec::new(), 0);
                let result = read(&data, |data| build(data, event_ms, &mut out, &mut cut));
                assert_eq!(result.is_ok(), ok, "{data} at {event_ms}: {result:?}");
                assert_eq!(out.is_empty(), !ok, "nothing left behind");
            }
        }
    }

    #[test]
    fn a_breadcrumb_timestamp_before_year_1_gives_no_item() {
        for (seconds, ok) in [
            (-62_135_596_800.0, true),
            (-62_135_596_801.0, false),
            (-1e11, false),
            (-2.5e14, false),
        ] {
            let data = json!({"tag": "breadcrumb", "payload": {"category": "ui.tap",
                "timestamp": seconds, "message": "m", "data": {"view.id": "a", "view.class": "b"}}});
            let (result, out, _) = built(data);
            assert_eq!(result.is_ok(), ok, "{seconds}: {result:?}");
            assert_eq!(out.is_empty(), !ok, "nothing left behind");
        }
    }

    #[test]
    fn a_required_field_of_the_wrong_type_is_an_error_and_leaves_nothing_behind() {
        let data = json!({"tag": "breadcrumb", "payload": {"category": "ui.tap",
            "timestamp": 1.5, "message": 7, "data": {"view.id": "a", "view.class": "b"}}});
        let (result, out, _) = built(data);
        assert_eq!(result, Err(InvalidField));
        assert!(out.is_empty());
    }

    #[test]
    fn events_sentry_gives_no_item_are_none_not_errors() {
        for data in [
            json!({"tag": "breadcrumb", "payload": {"category": "console", "level": "log"}}),
            json!({"tag": "breadcrumb", "payload": {"category": "ui.multiClick"}}),
            json!({"tag": "performanceSpan", "payload": {"op": "navigation.navigate"}}),
            json!({"tag": "performanceSpan", "payload": {"op": "web-vital",
                "description": "interaction-to-next-paint"}}),
            json!({"tag": "breadcrumb"}),
            json!({"tag": 3}),
        ] {
            assert_eq!(built(data.clone()).0, Ok(None), "{data}");
        }
    }

    #[test]
    fn a_slow_click_is_dead_on_the_tag_as_sent_and_rage_from_five_clicks() {
        let slow = |tag: &str, clicks: u32| {
            json!({"tag": "breadcrumb", "payload": {"category": "ui.slowClickDetected",
                "data": {"endReason": "timeout", "timeAfterClickMs": 7000, "clickCount": clicks,
                         "node": {"tagName": tag}}}})
        };
        assert_eq!(
            read(&slow("button", 5), classify),
            Some(Kind::Click {
                is_dead: true,
                is_rage: true
            })
        );
        assert_eq!(
            read(&slow("a", 1), classify),
            Some(Kind::Click {
                is_dead: true,
                is_rage: false
            })
        );
        assert_eq!(
            read(&slow("BUTTON", 9), classify),
            Some(Kind::Click {
                is_dead: false,
                is_rage: false
            }),
            "Sentry compares the tag name as sent"
        );
        let with = |data: serde_json::Value| {
            let event = json!({"tag": "breadcrumb", "payload": {"category": "ui.slowClickDetected",
                "data": data}});
            read(&event, classify)
        };
        let slow = Some(Kind::Click {
            is_dead: false,
            is_rage: false,
        });
        assert_eq!(
            with(json!({"endReason": "mutation", "timeAfterClickMs": "7000",
                "node": {"tagName": "a"}})),
            slow,
            "the timeout is compared only for a timed-out click on a target"
        );
        assert_eq!(
            with(json!({"endReason": "timeout", "timeAfterClickMs": "7000",
                "node": {"tagName": "a"}})),
            None,
            "a string compared with a number raises"
        );
        assert_eq!(
            with(
                json!({"endReason": "timeout", "timeAfterClickMs": 0, "timeafterclickms": null,
                "node": {"tagName": "a"}})
            ),
            None,
            "`0 or None` is None, which raises"
        );
        assert_eq!(
            with(
                json!({"endReason": "timeout", "timeAfterClickMs": 0, "timeafterclickms": 8000,
                "node": {"tagName": "a"}})
            ),
            Some(Kind::Click {
                is_dead: true,
                is_rage: false
            })
        );
    }

    /// A span's timestamps as the JS SDK writes them (`timeOrigin + performance.now()`, 17
    /// significant digits) are read as Python reads them, correctly rounded: a parse one bit
    /// off put one span in about 30 000 on the next millisecond.
    #[test]
    fn a_span_timestamp_of_seventeen_digits_is_read_as_python_reads_it() {
        // int(float(s) * 1000), in Python.
        for (start, ms) in [
            ("1796176279.3209999", 1_796_176_279_320),
            ("1728330908.9919999", 1_728_330_908_991),
            ("1796223506.4819999", 1_796_223_506_481),
        ] {
            let text = format!(
                r#"{{"tag":"performanceSpan","payload":{{"op":"resource.fetch","description":"https://a/","startTimestamp":{start},"endTimestamp":{start},"data":{{"method":"GET"}}}}}}"#
            );
            let data = super::super::dom::parse(&text, usize::MAX - 1).unwrap();
            let (mut out, mut cut) = (Vec::new(), 0);
            let built = build(&data, 1_700_000_000_000, &mut out, &mut cut);
            assert_eq!(built.unwrap().unwrap().timestamp_ms, ms, "{start}");
        }
    }

    #[test]
    fn headers_past_their_caps_are_cut_and_counted() {
        let mut headers = serde_json::Map::new();
        for i in 0..70 {
            headers.insert(format!("h{i:02}"), json!("v"));
        }
        headers.insert("h00".into(), json!("x".repeat(5000)));
        let data = json!({"tag": "performanceSpan", "payload": {"op": "resource.fetch",
            "description": "https://a/", "startTimestamp": 1.0, "endTimestamp": 2.0,
            "data": {"method": "GET", "request": {"headers": headers}}}});
        let (result, out, cut) = built(data);
        assert_eq!(result.unwrap().unwrap().category, Category::ResourceFetch);
        assert_eq!(cut, 6 + 1, "six past the count, one value cut");
        assert!(out.len() < 64 * 1100 + 500);
    }

    #[test]
    fn a_request_or_headers_present_but_not_an_object_drops_the_item() {
        let fetch = |data: Value| {
            json!({"tag": "performanceSpan", "payload": {"op": "resource.fetch",
                "description": "https://a/", "startTimestamp": 1.0, "endTimestamp": 2.0,
                "data": data}})
        };
        for data in [
            json!({"method": "GET", "request": null}),
            json!({"method": "GET", "response": {"headers": ["a"]}}),
        ] {
            assert_eq!(built(fetch(data.clone())).0, Err(InvalidField), "{data}");
        }
        let (result, _, _) = built(fetch(json!({"method": "GET", "response": {"size": 3}})));
        assert_eq!(result.unwrap().unwrap().category, Category::ResourceFetch);
    }

    #[test]
    fn the_test_id_is_the_first_truthy_one_and_only_if_it_is_text() {
        let click = |attributes: Value| {
            json!({"tag": "breadcrumb", "payload": {"category": "ui.click", "timestamp": 1.5,
                "message": "div > a", "data": {"node": {"id": 1, "tagName": "a",
                "textContent": "", "attributes": attributes}}}})
        };
        let testid = |attributes: Value| {
            let (result, out, _) = built(click(attributes));
            result.unwrap().unwrap();
            let at = out.windows(6).position(|w| w == b"testid")?;
            Some(out[at + 6..].contains(&b'x'))
        };
        assert_eq!(
            testid(json!({"testId": "", "data-testid": "x"})),
            Some(true)
        );
        assert_eq!(
            testid(json!({"testId": 5, "data-testid": "x"})),
            None,
            "Sentry's `5 or …` is 5, not text: no test id"
        );
    }

    #[test]
    fn python_conversions() {
        assert_eq!(read(&json!(3.9), int), Ok(3));
        assert_eq!(read(&json!(-3.9), int), Ok(-3));
        assert_eq!(read(&json!(" 12 "), int), Ok(12));
        assert_eq!(read(&json!("1.5"), int), Err(InvalidField));
        assert_eq!(read(&json!(true), int), Ok(1));
        assert_eq!(read(&json!(null), int), Err(InvalidField));
        assert_eq!(read(&json!("2.5"), float), Ok(2.5));
        assert_eq!(read(&json!(null), python_str), "None");
        assert_eq!(read(&json!(false), python_str), "False");
        assert!(read(&json!("false"), truthy));
        assert!(!read(&json!(0), truthy));
        assert_eq!(first_chars("héllo", 2), "hé");
        assert_eq!(read(&json!(1.2345), seconds), Ok(1234));
        assert_eq!(read(&json!(1e20), seconds), Err(InvalidField));
    }
}
