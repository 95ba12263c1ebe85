//! What extraction yields for one segment: counts, click and tap rows, requests, navigations,
//! and the caps that bound them (see the parent module).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use compact_str::CompactString;
use serde::Serialize;

use super::{MAX_DISTINCT_KEYS, MAX_KEY_BYTES, MAX_LIST_ITEMS, TRUNCATION_MARKER};
use crate::recording::heap::{HeapSize, heap_size};

/// A URL shared by every output that refers to it.
pub type Url = Arc<str>;

const EVENT_TYPES: [&str; 7] = [
    "DomContentLoaded",
    "Load",
    "FullSnapshot",
    "IncrementalSnapshot",
    "Meta",
    "Custom",
    "Plugin",
];
const INCREMENTAL_SOURCES: [&str; 17] = [
    "Mutation",
    "MouseMove",
    "MouseInteraction",
    "Scroll",
    "ViewportResize",
    "Input",
    "TouchMove",
    "MediaInteraction",
    "StyleSheetRule",
    "CanvasMutation",
    "Font",
    "Log",
    "Drag",
    "StyleDeclaration",
    "Selection",
    "AdoptedStyleSheet",
    "CustomElement",
];
const UNKNOWN: &str = "Unknown";

/// The keys the browser and mobile SDKs send most (custom event tags, breadcrumb categories,
/// console levels, span ops), sorted: a count under one of them holds this text, not a copy.
/// Counts are a quarter of a small segment's allocations otherwise.
const KNOWN_KEYS: [&str; 46] = [
    "assert",
    "breadcrumb",
    "console",
    "debug",
    "error",
    "fetch",
    "info",
    "largest-contentful-paint",
    "log",
    "memory",
    "navigation",
    "navigation.back_forward",
    "navigation.navigate",
    "navigation.push",
    "navigation.reload",
    "none",
    "options",
    "other",
    "paint",
    "performanceSpan",
    "replay.hydrate-error",
    "replay.mutations",
    "resource.css",
    "resource.fetch",
    "resource.img",
    "resource.link",
    "resource.other",
    "resource.script",
    "resource.xhr",
    "sentry.event",
    "sentry.transaction",
    "trace",
    "ui.blur",
    "ui.click",
    "ui.focus",
    "ui.input",
    "ui.keyDown",
    "ui.multiClick",
    "ui.slowClickDetected",
    "ui.tap",
    "video",
    "warn",
    "warning",
    "web-vital",
    "xhr",
    "zoom",
];

/// `key` as one of [`KNOWN_KEYS`], or a copy.
fn count_key(key: &str) -> Cow<'static, str> {
    match KNOWN_KEYS
        .binary_search(&key)
        .ok()
        .and_then(|i| KNOWN_KEYS.get(i))
    {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(key.to_owned()),
    }
}

/// Counts by a key taken from the input, with a bounded number of distinct keys of bounded length.
/// Kept sorted by key (serialised as a map in that order).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts(Vec<(Cow<'static, str>, u64)>);

impl Counts {
    /// Counts `key` (cut to `MAX_KEY_BYTES`); returns whether it had to be cut.
    pub fn add(&mut self, key: &str) -> bool {
        let (key, cut) = cut_bytes(key, MAX_KEY_BYTES);
        let key: &str = &key;
        let slot = match self.0.binary_search_by(|(k, _)| (**k).cmp(key)) {
            Ok(i) => Some(i),
            Err(i) if self.0.len() < MAX_DISTINCT_KEYS => {
                self.0.insert(i, (count_key(key), 0));
                Some(i)
            }
            Err(_) => None,
        };
        let slot =
            slot.unwrap_or_else(
                || match self.0.binary_search_by(|(k, _)| (**k).cmp("other")) {
                    Ok(i) => i,
                    Err(i) => {
                        self.0.insert(i, (count_key("other"), 0));
                        i
                    }
                },
            );
        if let Some((_, n)) = self.0.get_mut(slot) {
            *n += 1;
        }
        cut
    }

    pub fn get(&self, key: &str) -> u64 {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .and_then(|i| self.0.get(i))
            .map_or(0, |(_, n)| *n)
    }

    /// Distinct keys held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, n)| (&**k, n)))
    }
}

/// `text` cut to at most `max` bytes on a character boundary, the marker included; and whether it
/// was cut.
pub fn cut_bytes(text: &str, max: usize) -> (Cow<'_, str>, bool) {
    if text.len() <= max {
        return (Cow::Borrowed(text), false);
    }
    let mut end = max.saturating_sub(TRUNCATION_MARKER.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (
        Cow::Owned(format!(
            "{}{TRUNCATION_MARKER}",
            text.get(..end).unwrap_or_default()
        )),
        true,
    )
}

/// Counts by a fixed set of names (rrweb enums); serialised as a name → count map without zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedCounts<const N: usize> {
    names: &'static [&'static str; N],
    counts: [u64; N],
    unknown: u64,
}

impl<const N: usize> NamedCounts<N> {
    const fn new(names: &'static [&'static str; N]) -> Self {
        NamedCounts {
            names,
            counts: [0; N],
            unknown: 0,
        }
    }

    pub(super) fn add(&mut self, index: u64) {
        match usize::try_from(index)
            .ok()
            .and_then(|i| self.counts.get_mut(i))
        {
            Some(n) => *n += 1,
            None => self.unknown += 1,
        }
    }

    /// Count for a name, e.g. `get("FullSnapshot")`.
    pub fn get(&self, name: &str) -> u64 {
        if name == UNKNOWN {
            return self.unknown;
        }
        self.names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| self.counts.get(i))
            .copied()
            .unwrap_or(0)
    }
}

impl<const N: usize> Serialize for NamedCounts<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (name, count) in self.names.iter().zip(self.counts).filter(|(_, c)| *c > 0) {
            map.serialize_entry(name, &count)?;
        }
        if self.unknown > 0 {
            map.serialize_entry(UNKNOWN, &self.unknown)?;
        }
        map.end()
    }
}

/// A click, slow click, dead click or rage click on a DOM node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Click {
    /// Seconds since the epoch, as sent by the SDK.
    pub timestamp: f64,
    pub node_id: u64,
    /// Element tag name (≤ 32 chars).
    pub tag: CompactString,
    /// `id` attribute (≤ 64 chars).
    pub id: CompactString,
    /// First 10 classes of the `class` attribute, each at most `MAX_TEXT_BYTES`.
    pub classes: Vec<CompactString>,
    /// Visible text (≤ 1024 chars).
    pub text: CompactString,
    pub role: CompactString,
    pub alt: CompactString,
    pub aria_label: CompactString,
    pub title: CompactString,
    pub testid: CompactString,
    /// `data-sentry-component`, the framework component name.
    pub component_name: CompactString,
    /// CSS selector of the node (`payload.message`), at most `MAX_TEXT_BYTES`.
    pub selector: CompactString,
    /// Page the click happened on: the breadcrumb's own `url` (shared with the visited URLs, not
    /// copied), empty when it has none. Sentry reports a rage click as an issue only with one.
    pub url: Url,
    pub is_dead: bool,
    pub is_rage: bool,
}

#[cfg(test)]
impl Click {
    /// The rage click of the examples in Sentry's and snuba's documentation: `button#submit` with
    /// classes `btn primary`, component `SignUpForm`, on `https://example.com/signup`.
    pub(crate) fn example() -> Click {
        Click {
            timestamp: 1_702_848_658.9,
            node_id: 59,
            tag: "button".into(),
            id: "submit".into(),
            classes: vec!["btn".into(), "primary".into()],
            text: "Submit".into(),
            role: "button".into(),
            alt: CompactString::default(),
            aria_label: CompactString::default(),
            title: CompactString::default(),
            testid: CompactString::default(),
            component_name: "SignUpForm".into(),
            selector: "button#submit".into(),
            url: "https://example.com/signup".into(),
            is_dead: true,
            is_rage: true,
        }
    }
}

/// A tap on a mobile view (`ui.tap`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tap {
    /// Seconds since the epoch.
    pub timestamp: f64,
    pub message: CompactString,
    pub view_class: CompactString,
    pub view_id: CompactString,
}

/// A `ui.multiClick` breadcrumb: several quick clicks on one node that did react.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MultiClick {
    pub timestamp_ms: u64,
    pub node_id: Option<u64>,
    pub selector: CompactString,
    pub click_count: u64,
}

/// A navigation: a `navigation.*` performance span or a `navigation` breadcrumb.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Navigation {
    pub timestamp_ms: u64,
    /// Span op (`navigation.navigate`, `navigation.push`, …) or `navigation` for a breadcrumb.
    pub op: CompactString,
    pub from: Option<Url>,
    /// For a span, the same allocation as the page URL it moves to.
    pub to: Url,
}

/// A `resource.fetch` / `resource.xhr` span. Absent sizes are `None`, never 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub timestamp_ms: u64,
    pub op: CompactString,
    pub url: Url,
    pub method: Option<CompactString>,
    pub status_code: Option<u64>,
    pub request_size: Option<u64>,
    pub response_size: Option<u64>,
}

/// A `replay.hydrate-error` breadcrumb.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HydrationError {
    /// Seconds since the epoch, as sent.
    pub timestamp: f64,
    /// The breadcrumb's own `url` (shared with the visited URLs, not copied).
    pub url: Option<Url>,
}

/// A `web-vital` span (LCP, CLS, INP, …).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebVital {
    pub timestamp_ms: u64,
    /// The span description, e.g. `largest-contentful-paint`.
    pub name: CompactString,
    pub value: Option<f64>,
    pub rating: Option<CompactString>,
}

/// Everything extracted from one segment's events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Extracted {
    /// Well-formed events.
    pub events: u64,
    /// Events skipped because they were malformed.
    pub invalid_events: u64,
    pub events_by_type: NamedCounts<7>,
    pub incremental_by_source: NamedCounts<17>,
    pub custom_by_tag: Counts,
    pub breadcrumbs_by_category: Counts,
    pub spans_by_op: Counts,
    /// Click rows, at most `RowLimits::max_clicks`.
    pub clicks: Vec<Click>,
    /// Rage clicks past the click rows' limit (at most as many again): no rows, but issue
    /// reports.
    pub late_rage_clicks: Vec<Click>,
    /// Tap rows, at most `RowLimits::max_taps`.
    pub taps: Vec<Tap>,
    pub multi_clicks: Vec<MultiClick>,
    pub navigations: Vec<Navigation>,
    pub requests: Vec<Request>,
    /// Console breadcrumbs by `level`, exactly as sent.
    pub console: Counts,
    pub hydration_errors: Vec<HydrationError>,
    pub web_vitals: Vec<WebVital>,
    /// Pages visited: Meta `href`s and navigation span URLs, first-seen order, no duplicates.
    pub urls: Vec<Url>,
    pub first_timestamp_ms: Option<u64>,
    pub last_timestamp_ms: Option<u64>,
    /// Values cut to a cap (this module's or Sentry's column limits).
    pub truncated_values: u64,
    /// List items left out because a list or the segment's list budget was full.
    pub dropped_items: u64,
}

impl Default for Extracted {
    fn default() -> Self {
        Extracted {
            events: 0,
            invalid_events: 0,
            events_by_type: NamedCounts::new(&EVENT_TYPES),
            incremental_by_source: NamedCounts::new(&INCREMENTAL_SOURCES),
            custom_by_tag: Counts::default(),
            breadcrumbs_by_category: Counts::default(),
            spans_by_op: Counts::default(),
            clicks: Vec::new(),
            late_rage_clicks: Vec::new(),
            taps: Vec::new(),
            multi_clicks: Vec::new(),
            navigations: Vec::new(),
            requests: Vec::new(),
            console: Counts::default(),
            hydration_errors: Vec::new(),
            web_vitals: Vec::new(),
            urls: Vec::new(),
            first_timestamp_ms: None,
            last_timestamp_ms: None,
            truncated_values: 0,
            dropped_items: 0,
        }
    }
}

impl Extracted {
    /// Appends the URLs not already listed (the replay event's), up to `MAX_LIST_ITEMS`.
    pub fn add_urls<'a>(&mut self, urls: impl IntoIterator<Item = &'a Url>) {
        let mut seen: HashSet<Url> = self.urls.iter().cloned().collect();
        for url in urls {
            if url.is_empty() || seen.contains(url) {
                continue;
            }
            if self.urls.len() >= MAX_LIST_ITEMS {
                self.dropped_items += 1;
                continue;
            }
            seen.insert(url.clone());
            self.urls.push(url.clone());
        }
        self.urls.shrink_to_fit();
    }

    /// Gives back the spare capacity of every list, so what is held is what is counted.
    pub(super) fn shrink(&mut self) {
        self.custom_by_tag.shrink();
        self.breadcrumbs_by_category.shrink();
        self.spans_by_op.shrink();
        self.console.shrink();
        self.clicks.shrink_to_fit();
        self.late_rage_clicks.shrink_to_fit();
        self.taps.shrink_to_fit();
        self.multi_clicks.shrink_to_fit();
        self.navigations.shrink_to_fit();
        self.requests.shrink_to_fit();
        self.hydration_errors.shrink_to_fit();
        self.web_vitals.shrink_to_fit();
        self.urls.shrink_to_fit();
    }

    /// Every rage click of the segment, those past the click rows' limit included.
    pub fn rage_clicks(&self) -> impl Iterator<Item = &Click> {
        self.clicks
            .iter()
            .filter(|c| c.is_rage)
            .chain(&self.late_rage_clicks)
    }
}

impl HeapSize for Counts {
    fn heap_size(&self) -> usize {
        self.0.heap_size()
    }
}

heap_size!(Click {
    tag,
    id,
    classes,
    text,
    role,
    alt,
    aria_label,
    title,
    testid,
    component_name,
    selector,
    url
});
heap_size!(Tap {
    message,
    view_class,
    view_id
});
heap_size!(MultiClick { selector });
heap_size!(Navigation { op, from, to });
heap_size!(Request { op, url, method });
heap_size!(HydrationError { url });
heap_size!(WebVital { name, rating });
heap_size!(Extracted {
    custom_by_tag,
    breadcrumbs_by_category,
    spans_by_op,
    clicks,
    late_rage_clicks,
    taps,
    multi_clicks,
    navigations,
    requests,
    console,
    hydration_errors,
    web_vitals,
    urls,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_are_sorted_so_that_the_search_finds_them() {
        assert!(KNOWN_KEYS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_known_key_is_counted_without_a_copy_and_any_other_with_one() {
        let mut counts = Counts::default();
        counts.add("ui.click");
        counts.add("ui.click");
        counts.add("custom.category");
        assert_eq!(counts.get("ui.click"), 2);
        assert_eq!(counts.get("custom.category"), 1);
        let copies: Vec<&str> = counts
            .0
            .iter()
            .filter_map(|(k, _)| matches!(k, Cow::Owned(_)).then_some(&**k))
            .collect();
        assert_eq!(copies, ["custom.category"]);
        let slots = counts.0.capacity() * std::mem::size_of::<(Cow<'static, str>, u64)>();
        assert_eq!(counts.heap_size(), slots + "custom.category".len());
        assert_eq!(
            serde_json::to_string(&counts).unwrap(),
            r#"{"custom.category":1,"ui.click":2}"#
        );
    }
}
