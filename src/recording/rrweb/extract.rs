//! The extraction pass: one scan over the JSON array, classifying each event
//! (docs/formats.md, "rrweb events").

use std::collections::HashSet;
use std::sync::Arc;

use compact_str::CompactString;

use super::model::*;
use super::wire::*;
use super::{MAX_LIST_BYTES, MAX_LIST_ITEMS, MAX_TEXT_BYTES, MAX_URL_BYTES, RowLimits};
use crate::recording::json::{Num, parse};
use crate::recording::scan::{self, Scanner, SyntaxError};
use crate::recording::trace_items::Collector;

/// Scans a JSON array of rrweb events. Fails only when the body is not a JSON array (or not UTF-8);
/// a malformed element is counted in `invalid_events`.
pub fn extract(json: &[u8], limits: RowLimits) -> Result<Extracted, SyntaxError> {
    // The fast check first; the one that says where only for the (invalid) bodies that fail it.
    let json = simdutf8::basic::from_utf8(json).or_else(|_| {
        simdutf8::compat::from_utf8(json).map_err(|e| SyntaxError {
            offset: e.valid_up_to(),
            expected: "valid UTF-8",
        })
    })?;
    extract_with(json, limits, None)
}

/// [`extract`] of text already known to be UTF-8 (`payload::decode` checks it while it checks
/// the zlib stream), offering every custom event (with its index in the array) to `items`.
pub fn extract_with(
    json: &str,
    limits: RowLimits,
    mut items: Option<&mut Collector>,
) -> Result<Extracted, SyntaxError> {
    let mut extractor = Extractor {
        out: Extracted::default(),
        limits,
        current_url: None,
        seen_urls: HashSet::new(),
        list_bytes: 0,
    };
    let mut scanner = Scanner::new(json);
    scanner.begin_array()?;
    let mut first = true;
    let mut index = 0u32;
    while scanner.next_element(first)? {
        first = false;
        let at = index;
        index = index.saturating_add(1);
        if !scanner.at_object() {
            scanner.value()?;
            extractor.out.invalid_events += 1;
            continue;
        }
        let (mut kind, mut timestamp, mut data) = (None, None, None);
        scanner.begin_object()?;
        let mut first_key = true;
        while let Some(key) = scanner.next_key(first_key)? {
            first_key = false;
            let value = scanner.value()?;
            match key {
                "type" => kind = Some(value),
                "timestamp" => timestamp = Some(value),
                "data" => data = Some(value),
                _ => {}
            }
        }
        let (kind, timestamp) = (number(kind), number(timestamp));
        extractor.event(kind, timestamp, data);
        if let (Some(items), Some(5.0), Some(ms), Some(data)) = (
            items.as_deref_mut(),
            kind,
            timestamp.and_then(to_millis),
            data,
        ) {
            items.offer(at, ms, data);
        }
    }
    scanner.end()?;
    extractor.out.shrink();
    Ok(extractor.out)
}

/// A raw scalar as a number; strings, literals and containers are not numbers.
fn number(raw: Option<&str>) -> Option<f64> {
    raw.and_then(|r| r.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

// ---------------------------------------------------------------------------------------------
// Classifying events
// ---------------------------------------------------------------------------------------------

/// rrweb `timestamp` is milliseconds; SDK spans and some custom events carry seconds. Anything
/// below 10^11 (a date in 1973 as ms, in 5138 as s) is taken as seconds.
fn to_millis(timestamp: f64) -> Option<u64> {
    let ms = if timestamp < 1e11 {
        timestamp * 1000.0
    } else {
        timestamp
    };
    (ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

/// The first `max_chars` characters (Python's `s[:max_chars]`, as Sentry cuts click fields), and
/// whether anything was cut.
fn truncate(s: &str, max_chars: usize) -> (CompactString, bool) {
    match s.char_indices().nth(max_chars) {
        Some((end, _)) => (s.get(..end).unwrap_or(s).into(), true),
        None => (s.into(), false),
    }
}

/// Pushes onto a list unless it is full; the caller has admitted the item against the budget.
fn push_bounded<T>(list: &mut Vec<T>, item: T, dropped: &mut u64) {
    if list.len() < MAX_LIST_ITEMS {
        list.push(item);
    } else {
        *dropped += 1;
    }
}

struct Extractor {
    out: Extracted,
    limits: RowLimits,
    /// The page the recording is on, from the last Meta event or navigation span seen.
    current_url: Option<Url>,
    /// `out.urls` as a set: deduplication in constant time per URL.
    seen_urls: HashSet<Url>,
    /// Bytes admitted into the lists so far (items and their text), against `MAX_LIST_BYTES`.
    list_bytes: usize,
}

/// What Sentry makes of a slow click (`which()` in its event parser; docs/formats.md, "Custom
/// events"): `(is_dead, is_rage)`. Dead when it ended in a timeout on a link, button or input
/// (`tag_name`, as sent) after 7 s or more; rage when dead with five clicks or more; else an
/// ordinary click. `after_ms` and `clicks` are read only where Sentry reads them, each the
/// camel-case spelling or, when that is not truthy, the lower-case one; `None` from either is a
/// value Python cannot compare with a number (a string, `null`): the event is of no kind, and
/// makes no click.
pub fn slow_click(
    end_reason: Option<&str>,
    tag_name: Option<&str>,
    after_ms: impl FnOnce() -> Option<f64>,
    clicks: impl FnOnce() -> Option<f64>,
) -> Option<(bool, bool)> {
    let on_target = matches!(tag_name, Some("a" | "button" | "input"));
    if !(end_reason == Some("timeout") && on_target && after_ms()? >= 7000.0) {
        return Some((false, false));
    }
    Some((true, clicks()? >= 5.0))
}

impl Extractor {
    /// `text` cut to `max` bytes with the marker; cuts are counted.
    fn capped(&mut self, text: &str, max: usize) -> CompactString {
        let (kept, cut) = cut_bytes(text, max);
        self.out.truncated_values += u64::from(cut);
        kept.into()
    }

    /// Sentry's `s[:max_chars]` for a click column; cuts are counted.
    fn column(&mut self, text: Option<&str>, max_chars: usize) -> CompactString {
        let (kept, cut) = truncate(text.unwrap_or_default(), max_chars);
        self.out.truncated_values += u64::from(cut);
        kept
    }

    /// A URL cut to `MAX_URL_BYTES`: the page's own allocation when it is the current page, or
    /// the visited list's when it is listed (a page visited again, back and forth, allocated
    /// anew at every visit).
    fn url(&mut self, text: &str) -> Url {
        let (kept, cut) = cut_bytes(text, MAX_URL_BYTES);
        self.out.truncated_values += u64::from(cut);
        match &self.current_url {
            Some(current) if **current == *kept => current.clone(),
            _ => match self.seen_urls.get(kept.as_ref()) {
                Some(seen) => seen.clone(),
                None => Arc::from(kept.as_ref()),
            },
        }
    }

    /// Whether a list item of `size` bytes plus `text` bytes fits the segment's list budget;
    /// counted as dropped when it does not.
    fn admit<T>(&mut self, text: usize) -> bool {
        let bytes = std::mem::size_of::<T>() + text;
        if self.list_bytes + bytes > MAX_LIST_BYTES {
            self.out.dropped_items += 1;
            return false;
        }
        self.list_bytes += bytes;
        true
    }

    /// Counts `key` in one of the input-keyed maps.
    fn count(&mut self, map: fn(&mut Extracted) -> &mut Counts, key: &str) {
        let cut = map(&mut self.out).add(key);
        self.out.truncated_values += u64::from(cut);
    }

    /// The page the recording is now on; listed among the visited URLs once.
    fn visit(&mut self, href: &str) -> Url {
        let url = self.url(href);
        self.current_url = Some(url.clone());
        if !url.is_empty() && !self.seen_urls.contains(&url) {
            if self.out.urls.len() < MAX_LIST_ITEMS && self.admit::<Url>(url.len()) {
                self.seen_urls.insert(url.clone());
                self.out.urls.push(url.clone());
            } else if self.out.urls.len() >= MAX_LIST_ITEMS {
                self.out.dropped_items += 1;
            }
        }
        url
    }

    fn event(&mut self, kind: Option<f64>, timestamp: Option<f64>, data: Option<&str>) {
        let (Some(kind), Some(ts_ms)) = (Num(kind).as_u64(), timestamp.and_then(to_millis)) else {
            self.out.invalid_events += 1;
            return;
        };
        let valid = match kind {
            3 => self.incremental(data),
            // These are parsed recursively: a value nested too deep would overflow the stack.
            4 | 5 if data.is_some_and(scan::too_deep) => false,
            4 => self.meta(data),
            5 => self.custom(data, ts_ms),
            _ => true,
        };
        if !valid {
            self.out.invalid_events += 1;
            return;
        }
        self.out.events += 1;
        self.out.events_by_type.add(kind);
        let out = &mut self.out;
        out.first_timestamp_ms = Some(out.first_timestamp_ms.map_or(ts_ms, |t| t.min(ts_ms)));
        out.last_timestamp_ms = Some(out.last_timestamp_ms.map_or(ts_ms, |t| t.max(ts_ms)));
    }

    fn incremental(&mut self, data: Option<&str>) -> bool {
        // `source` is the first key rrweb writes: the scan stops there, before the mutation.
        match data
            .and_then(|d| scan::field(d, "source"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            Some(source) => {
                self.out.incremental_by_source.add(source);
                true
            }
            None => false,
        }
    }

    fn meta(&mut self, data: Option<&str>) -> bool {
        let Some(data) = data.and_then(parse::<UrlHref>) else {
            return false;
        };
        if let Some(href) = data.href.as_str() {
            self.visit(href);
        }
        true
    }

    fn custom(&mut self, data: Option<&str>, ts_ms: u64) -> bool {
        let Some((tag, payload)) = data.and_then(custom_data) else {
            return false;
        };
        let Some(tag) = tag.as_str() else {
            return false;
        };
        // The payload is validated here, once: by the typed parse of the tags read, or as JSON.
        let valid = match tag {
            "breadcrumb" => payload
                .and_then(parse::<Breadcrumb>)
                .is_some_and(|b| self.breadcrumb(b, ts_ms)),
            "performanceSpan" => payload
                .and_then(parse::<Span>)
                .is_some_and(|s| self.span(s, ts_ms)),
            _ => payload.is_none_or(valid_json),
        };
        // Only events that are kept are counted: a skipped one counts as invalid, not by tag.
        if valid {
            self.count(|o| &mut o.custom_by_tag, tag);
        }
        valid
    }

    fn breadcrumb(&mut self, crumb: Breadcrumb<'_>, event_ms: u64) -> bool {
        let Some(category) = crumb.category.as_str() else {
            return false;
        };
        self.count(|o| &mut o.breadcrumbs_by_category, category);
        let ts_seconds = crumb.timestamp.0.unwrap_or(event_ms as f64 / 1000.0);
        let ts_ms = to_millis(ts_seconds).unwrap_or(event_ms);
        let message = crumb.message.as_str().unwrap_or_default();
        // Sentry reads a click's, a tap's and a hydration error's own timestamp (and a click's
        // message) as required fields: without them the entry raises and is left out.
        let own_timestamp = crumb.timestamp.0.is_some();
        match category {
            "ui.click" | "ui.slowClickDetected" => match parse_data::<ClickData>(&crumb.data) {
                Some(data) => {
                    if let (Some(selector), true) = (crumb.message.as_str(), own_timestamp) {
                        self.click(
                            selector,
                            data,
                            ts_seconds,
                            category == "ui.slowClickDetected",
                        );
                    }
                    true
                }
                None => false,
            },
            "ui.multiClick" => match parse_data::<ClickData>(&crumb.data) {
                Some(data) => {
                    let node_id = data
                        .node
                        .as_ref()
                        .and_then(|n| n.id.as_u64())
                        .or(data.node_id.as_u64());
                    let click_count = data.click_count.as_u64().unwrap_or(0);
                    if self.admit::<MultiClick>(message.len().min(MAX_TEXT_BYTES)) {
                        let selector = self.capped(message, MAX_TEXT_BYTES);
                        let item = MultiClick {
                            timestamp_ms: ts_ms,
                            node_id,
                            selector,
                            click_count,
                        };
                        push_bounded(
                            &mut self.out.multi_clicks,
                            item,
                            &mut self.out.dropped_items,
                        );
                    }
                    true
                }
                None => false,
            },
            "ui.tap" => match parse_data::<TapData>(&crumb.data) {
                Some(data) => {
                    if own_timestamp && self.out.taps.len() < self.limits.max_taps {
                        let tap = Tap {
                            timestamp: ts_seconds,
                            message: self.capped(message, MAX_TEXT_BYTES),
                            view_class: self.capped(
                                data.view_class.as_str().unwrap_or_default(),
                                MAX_TEXT_BYTES,
                            ),
                            view_id: self
                                .capped(data.view_id.as_str().unwrap_or_default(), MAX_TEXT_BYTES),
                        };
                        self.out.taps.push(tap);
                    }
                    true
                }
                None => false,
            },
            "navigation" => match parse_data::<NavigationData>(&crumb.data) {
                Some(data) => {
                    if let Some(to) = data.to.as_str() {
                        let from = data.from.as_str();
                        let text = to.len().min(MAX_URL_BYTES)
                            + from.map_or(0, |f| f.len().min(MAX_URL_BYTES));
                        if self.admit::<Navigation>(text) {
                            let item = Navigation {
                                timestamp_ms: ts_ms,
                                op: category.into(),
                                from: from.map(|f| self.url(f)),
                                to: self.url(to),
                            };
                            push_bounded(
                                &mut self.out.navigations,
                                item,
                                &mut self.out.dropped_items,
                            );
                        }
                    }
                    true
                }
                None => false,
            },
            "console" => {
                self.count(|o| &mut o.console, crumb.level.as_str().unwrap_or("none"));
                true
            }
            "replay.hydrate-error" => match parse_data::<UrlData>(&crumb.data) {
                Some(data) => {
                    let own = data.url.as_str();
                    if own_timestamp
                        && self
                            .admit::<HydrationError>(own.map_or(0, |u| u.len().min(MAX_URL_BYTES)))
                    {
                        let url = own.map(|url| self.url(url));
                        let item = HydrationError {
                            timestamp: ts_seconds,
                            url,
                        };
                        push_bounded(
                            &mut self.out.hydration_errors,
                            item,
                            &mut self.out.dropped_items,
                        );
                    }
                    true
                }
                None => false,
            },
            _ => true,
        }
    }

    /// A click row while there is room for one (`RowLimits::max_clicks`, as many as Sentry
    /// publishes per segment); past that, rage clicks are still kept (as many again) for their
    /// issue reports.
    fn click(&mut self, selector: &str, data: ClickData<'_>, timestamp: f64, slow: bool) {
        let Some(node) = data.node else { return };
        let Some(node_id) = node.id.as_u64() else {
            return;
        };
        // Required by Sentry too (`node["tagName"]`, `node["textContent"]`, and attributes it
        // can slice).
        let (Some(tag_name), Some(_)) = (node.tag_name.as_str(), node.text_content.as_str()) else {
            return;
        };
        let Some(attrs) = node.attributes.as_ref().filter(|a| a.sliceable()) else {
            return;
        };
        let kind = if slow {
            slow_click(
                data.end_reason.as_str(),
                Some(tag_name),
                || {
                    (data.time_after_click_ms)
                        .or(&data.time_after_click_ms_lower)
                        .number_or_zero()
                },
                || {
                    (data.click_count)
                        .or(&data.click_count_lower)
                        .number_or_zero()
                },
            )
        } else {
            Some((false, false))
        };
        let Some((is_dead, is_rage)) = kind else {
            return;
        };
        // As sent, as Sentry stores and tests it (rrweb sends it lower-case already).
        let (tag, cut) = truncate(tag_name, 32);
        let row = self.out.clicks.len() < self.limits.max_clicks;
        let late_rage = is_rage && self.out.late_rage_clicks.len() < self.limits.max_clicks;
        if !(row || late_rage) {
            return;
        }
        self.out.truncated_values += u64::from(cut);
        // The first truthy of the three, if it is a string.
        let testid = [&attrs.test_id, &attrs.data_testid, &attrs.data_test_id]
            .into_iter()
            .find(|t| t.truthy())
            .and_then(|t| t.as_str());
        let classes: Vec<CompactString> = attrs
            .class
            .as_str()
            .unwrap_or_default()
            // On single spaces, as Sentry splits it: other whitespace stays in the class.
            .split(' ')
            .filter(|class| !class.is_empty())
            .take(10)
            .map(|class| self.capped(class, MAX_TEXT_BYTES))
            .collect();
        let url = data
            .url
            .as_str()
            .map_or_else(|| Arc::from(""), |url| self.url(url));
        let click = Click {
            timestamp,
            node_id,
            tag,
            id: self.column(attrs.id.as_str(), 64),
            classes,
            text: self.column(node.text_content.as_str(), 1024),
            role: self.column(attrs.role.as_str(), 32),
            alt: self.column(attrs.alt.as_str(), 64),
            aria_label: self.column(attrs.aria_label.as_str(), 64),
            title: self.column(attrs.title.as_str(), 64),
            testid: self.column(testid, 64),
            component_name: self.column(attrs.component_name.as_str(), 64),
            selector: self.capped(selector, MAX_TEXT_BYTES),
            url,
            is_dead,
            is_rage,
        };
        if row {
            self.out.clicks.push(click);
        } else {
            self.out.late_rage_clicks.push(click);
        }
    }

    fn span(&mut self, span: Span<'_>, event_ms: u64) -> bool {
        let Some(op) = span.op.as_str() else {
            return false;
        };
        self.count(|o| &mut o.spans_by_op, op);
        let ts_ms = span
            .start_timestamp
            .0
            .and_then(to_millis)
            .unwrap_or(event_ms);
        let description = span.description.as_str().unwrap_or_default();
        if op.starts_with("navigation.") {
            let to = self.visit(description);
            // The URL's bytes count too unless the visited list holds it (its list was full).
            let own_url = if self.seen_urls.contains(&to) {
                0
            } else {
                to.len()
            };
            if self.admit::<Navigation>(op.len().min(MAX_TEXT_BYTES) + own_url) {
                let item = Navigation {
                    timestamp_ms: ts_ms,
                    op: self.capped(op, MAX_TEXT_BYTES),
                    from: None,
                    to,
                };
                push_bounded(&mut self.out.navigations, item, &mut self.out.dropped_items);
            }
            return true;
        }
        match op {
            "resource.fetch" | "resource.xhr" => {
                let Some(data) = parse_data::<RequestData>(&span.data) else {
                    return false;
                };
                let size = |direct: Num, nested: &Option<BodySize>| {
                    direct
                        .as_u64()
                        .or_else(|| nested.as_ref().and_then(|n| n.size.as_u64()))
                };
                let method = data.method.as_str();
                let text = description.len().min(MAX_URL_BYTES)
                    + method.map_or(0, |m| m.len().min(MAX_TEXT_BYTES));
                if self.admit::<Request>(text + op.len()) {
                    let item = Request {
                        timestamp_ms: ts_ms,
                        op: op.into(),
                        url: self.url(description),
                        method: method.map(|m| self.capped(m, MAX_TEXT_BYTES)),
                        status_code: data.status_code.as_u64(),
                        request_size: size(data.request_body_size, &data.request),
                        response_size: size(data.response_body_size, &data.response),
                    };
                    push_bounded(&mut self.out.requests, item, &mut self.out.dropped_items);
                }
                true
            }
            "web-vital" => {
                let Some(data) = parse_data::<VitalData>(&span.data) else {
                    return false;
                };
                let rating = data.rating.as_str();
                let text = description.len().min(MAX_TEXT_BYTES)
                    + rating.map_or(0, |r| r.len().min(MAX_TEXT_BYTES));
                if self.admit::<WebVital>(text) {
                    let item = WebVital {
                        timestamp_ms: ts_ms,
                        name: self.capped(description, MAX_TEXT_BYTES),
                        value: data.value.0,
                        rating: rating.map(|r| self.capped(r, MAX_TEXT_BYTES)),
                    };
                    push_bounded(&mut self.out.web_vitals, item, &mut self.out.dropped_items);
                }
                true
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_DISTINCT_KEYS, MAX_KEY_BYTES, TRUNCATION_MARKER};
    use super::*;

    const TS: u64 = 1_796_012_448_000;

    fn extract_events(events: &[String]) -> Extracted {
        extract(
            format!("[{}]", events.join(",")).as_bytes(),
            RowLimits::default(),
        )
        .unwrap()
    }

    fn breadcrumb(category: &str, extra: &str) -> String {
        format!(
            r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"breadcrumb","payload":{{"timestamp":1796012448.69,"type":"default","category":"{category}"{extra}}}}}}}"#
        )
    }

    fn span(op: &str, description: &str, data: &str) -> String {
        format!(
            r#"{{"type":5,"timestamp":1796012448.5,"data":{{"tag":"performanceSpan","payload":{{"op":"{op}","description":"{description}","startTimestamp":1796012448.5,"endTimestamp":1796012449.0,"data":{data}}}}}}}"#
        )
    }

    fn slow_click(tag: &str, end_reason: &str, after_ms: u32, count: u32) -> String {
        breadcrumb(
            "ui.slowClickDetected",
            &format!(
                r#","message":"body > {tag}","data":{{"node":{{"id":14,"tagName":"{tag}","textContent":"Save","attributes":{{}}}},"url":"https://shop/","timeAfterClickMs":{after_ms},"endReason":"{end_reason}","clickCount":{count}}}"#
            ),
        )
    }

    fn click_with_node(node: &str) -> String {
        breadcrumb(
            "ui.click",
            &format!(r#","message":"div > button","data":{{"nodeId":3,"node":{node}}}"#),
        )
    }

    /// What Sentry's parser reads as required (`node["tagName"]`, `node["textContent"]`,
    /// `payload["message"]`, `int(payload["timestamp"])`) leaves the entry out when missing, as
    /// Sentry's raises and leaves it out; a full click after twenty such still gets its row.
    #[test]
    fn clicks_taps_and_hydration_errors_without_sentrys_required_fields_are_left_out() {
        let full = click_with_node(r#"{"id":3,"tagName":"button","textContent":"Buy"}"#);
        let without_timestamp = |event: &str| event.replace(r#""timestamp":1796012448.69,"#, "");
        let mut events: Vec<String> = [
            click_with_node(r#"{"id":3}"#),
            click_with_node(r#"{"id":3,"tagName":"button"}"#),
            click_with_node(r#"{"id":3,"textContent":"Buy"}"#),
            click_with_node(r#"{"id":3,"tagName":7,"textContent":"Buy"}"#),
            full.replace(r#""message":"div > button","#, ""),
            without_timestamp(&full),
            without_timestamp(&slow_click("button", "timeout", 7000, 5)),
        ]
        .into_iter()
        .cycle()
        .take(21)
        .collect();
        events.push(full.clone());
        events.push(without_timestamp(&breadcrumb(
            "ui.tap",
            r#","message":"t","data":{"view.id":"v"}"#,
        )));
        events.push(without_timestamp(&breadcrumb(
            "replay.hydrate-error",
            r#","data":{}"#,
        )));
        let x = extract_events(&events);
        assert_eq!(x.clicks.len(), 1, "{:?}", x.clicks);
        assert_eq!(
            (x.clicks[0].tag.as_str(), x.clicks[0].text.as_ref()),
            ("button", "Buy")
        );
        assert!(x.late_rage_clicks.is_empty());
        assert!(x.taps.is_empty() && x.hydration_errors.is_empty());
        assert_eq!(x.invalid_events, 0, "well-formed events, only not written");
        // The same tap and hydration error with their timestamps are kept.
        let x = extract_events(&[
            breadcrumb("ui.tap", r#","message":"t","data":{"view.id":"v"}"#),
            breadcrumb("replay.hydrate-error", r#","data":{}"#),
        ]);
        assert_eq!((x.taps.len(), x.hydration_errors.len()), (1, 1));
    }

    /// Sentry slices six attributes (`attributes.get("alt", "")[:64]`): one that is there and
    /// not a string raises, and its parser drops the click — no row, no rage-click issue. The
    /// class and the test ids it reads leniently: a click with those not strings keeps its row.
    #[test]
    fn a_click_with_an_attribute_sentry_cannot_slice_is_left_out() {
        let with = |attributes: &str| {
            click_with_node(&format!(
                r#"{{"id":3,"tagName":"button","textContent":"Buy","attributes":{attributes}}}"#
            ))
        };
        for name in [
            "id",
            "role",
            "alt",
            "aria-label",
            "title",
            "data-sentry-component",
        ] {
            for value in ["null", "7", "true", "[\"a\"]", "{}"] {
                let x = extract_events(&[with(&format!(r#"{{"{name}":{value}}}"#))]);
                assert!(x.clicks.is_empty(), "{name}: {value}");
            }
            let x = extract_events(&[with(&format!(r#"{{"{name}":"o\u006b"}}"#))]);
            assert_eq!(x.clicks.len(), 1, "{name} as a string, escaped");
        }
        let x = extract_events(&[
            with(r#"{"class":7,"data-testid":false,"testId":null,"data-test-id":[1]}"#),
            slow_click("button", "timeout", 7000, 5)
                .replace(r#""attributes":{}"#, r#""attributes":{"title":null}"#),
        ]);
        assert_eq!(x.clicks.len(), 1, "{:?}", x.clicks);
        assert_eq!(x.clicks[0].classes.len(), 0);
        assert_eq!(x.clicks[0].testid.as_str(), "");
        assert_eq!(x.invalid_events, 0, "well-formed events, only not written");
        // Past the rows' limit, a rage click kept for its issue is dropped the same way.
        let rage = |title: &str| {
            slow_click("button", "timeout", 7000, 5).replace(
                r#""attributes":{}"#,
                &format!(r#""attributes":{{"title":{title}}}"#),
            )
        };
        let mut events = vec![with("{}"); 20];
        events.extend([rage("null"), rage(r#""x""#)]);
        let x = extract_events(&events);
        assert_eq!((x.clicks.len(), x.late_rage_clicks.len()), (20, 1));
        assert_eq!(x.late_rage_clicks[0].title.as_str(), "x");
    }

    /// What Sentry reads with `.get` or checks with `isinstance(x, dict)` must be an object: a
    /// click's `data`, its node and the node's attributes (a `null` too), a request span's
    /// `request` and `response`. A serde-derived struct would take an array, its elements as the
    /// fields in order.
    #[test]
    fn arrays_where_sentry_reads_objects_are_not_taken_for_them() {
        let click = |data: &str| {
            breadcrumb(
                "ui.click",
                &format!(r#","message":"div > button","data":{data}"#),
            )
        };
        let node = r#"{"id":3,"tagName":"button","textContent":"Buy"}"#;
        let x = extract_events(&[
            click(&format!("[{node}]")),
            click(r#"{"node":[3,"button","Buy"]}"#),
            click(r#"{"node":{"id":3,"tagName":"button","textContent":"Buy","attributes":[]}}"#),
            click(r#"{"node":{"id":3,"tagName":"button","textContent":"Buy","attributes":null}}"#),
            click(r#"{"node":{"id":3,"tagName":"button","textContent":"Buy","attributes":"x"}}"#),
        ]);
        assert!(x.clicks.is_empty(), "{:?}", x.clicks);
        assert_eq!(x.invalid_events, 1, "the click whose data is an array");
        let x = extract_events(&[
            click(&format!(r#"{{"node":{node}}}"#)),
            click(&format!(r#"{{"node":{node},"attributes":[]}}"#)),
            click(&format!("  {{ \"node\" : {node} }}")),
        ]);
        assert_eq!(
            x.clicks.len(),
            3,
            "no attributes is none; an object with spaces is one"
        );
        let x = extract_events(&[
            span(
                "resource.fetch",
                "/api/a",
                r#"{"request":[5],"response":{"size":7}}"#,
            ),
            span(
                "resource.xhr",
                "/api/b",
                r#"{"request":"x","response":{"size":9}}"#,
            ),
        ]);
        let sizes: Vec<_> = x
            .requests
            .iter()
            .map(|r| (r.request_size, r.response_size))
            .collect();
        assert_eq!(sizes, [(None, Some(7)), (None, Some(9))]);
    }

    #[test]
    fn events_are_counted_by_type_and_incremental_source() {
        let x = extract_events(&[
            format!(
                r#"{{"type":2,"data":{{"node":{{"type":0,"childNodes":[]}}}},"timestamp":{TS}}}"#
            ),
            format!(r#"{{"type":3,"data":{{"source":0,"adds":[]}},"timestamp":{TS}}}"#),
            format!(r#"{{"type":3,"data":{{"source":1,"positions":[]}},"timestamp":{TS}}}"#),
            format!(r#"{{"type":3,"data":{{"source":1,"positions":[]}},"timestamp":{TS}}}"#),
            format!(r#"{{"type":9,"data":{{}},"timestamp":{TS}}}"#),
        ]);
        assert_eq!(x.events, 5);
        assert_eq!(
            (
                x.events_by_type.get("FullSnapshot"),
                x.events_by_type.get("IncrementalSnapshot")
            ),
            (1, 3)
        );
        assert_eq!(x.events_by_type.get("Unknown"), 1);
        assert_eq!(
            (
                x.incremental_by_source.get("Mutation"),
                x.incremental_by_source.get("MouseMove")
            ),
            (1, 2)
        );
    }

    #[test]
    fn data_before_type_is_classified_the_same() {
        let x = extract_events(&[format!(
            r#"{{"data":{{"source":3}},"timestamp":{TS},"type":3}}"#
        )]);
        assert_eq!(x.incremental_by_source.get("Scroll"), 1);
    }

    #[test]
    fn the_test_id_is_the_first_non_empty_of_its_three_spellings_and_several_do_not_lose_the_click()
    {
        let testid = |attributes: &str| {
            let x = extract_events(&[click_with_node(&format!(
                r#"{{"id":3,"tagName":"a","textContent":"","attributes":{attributes}}}"#
            ))]);
            assert_eq!(x.invalid_events, 0, "{attributes}");
            x.clicks[0].testid.clone()
        };
        assert_eq!(
            testid(r#"{"testId":"a","data-testid":"b","data-test-id":"c"}"#),
            "a"
        );
        assert_eq!(testid(r#"{"testId":"","data-testid":"b"}"#), "b");
        assert_eq!(testid(r#"{"data-test-id":"c"}"#), "c");
        assert_eq!(testid(r#"{"testId":7}"#), "");
        // The first truthy one is taken, and it is not a string: none (Sentry's `_get_testid`).
        assert_eq!(testid(r#"{"testId":5,"data-testid":"x"}"#), "");
        assert_eq!(testid(r#"{"testId":0,"data-testid":"x"}"#), "x");
    }

    #[test]
    fn lower_case_slow_click_fields_count_too() {
        let crumb = breadcrumb(
            "ui.slowClickDetected",
            r#","message":"a","data":{"node":{"id":1,"tagName":"a","textContent":""},"timeafterclickms":7000,"endReason":"timeout","clickcount":5}"#,
        );
        let x = extract_events(&[crumb]);
        assert!(x.clicks[0].is_dead && x.clicks[0].is_rage);
    }

    #[test]
    fn rage_clicks_past_the_click_rows_limit_are_kept_for_their_reports() {
        let mut events: Vec<String> = (0..25)
            .map(|_| click_with_node(r#"{"id":3,"tagName":"a","textContent":""}"#))
            .collect();
        events.insert(22, slow_click("button", "timeout", 7000, 5));
        let x = extract_events(&events);
        assert_eq!(
            x.clicks.len(),
            RowLimits::default().max_clicks,
            "rows stop at Sentry's 20"
        );
        assert_eq!((x.late_rage_clicks.len(), x.rage_clicks().count()), (1, 1));
        let many: Vec<String> = (0..100)
            .map(|_| slow_click("button", "timeout", 7000, 5))
            .collect();
        assert_eq!(
            extract_events(&many).rage_clicks().count(),
            2 * RowLimits::default().max_clicks
        );
    }

    #[test]
    fn the_tag_is_kept_and_tested_as_sent_and_classes_split_on_single_spaces() {
        // Sentry's `tagName in ("a", "button", "input")` is case-sensitive: an upper-case tag
        // (from a producer other than rrweb, which lower-cases it) is an ordinary click.
        let x = extract_events(&[slow_click("BUTTON", "timeout", 9000, 6)]);
        let click = &x.clicks[0];
        assert_eq!(
            (click.tag.as_str(), click.is_dead, click.is_rage),
            ("BUTTON", false, false)
        );
        let x = extract_events(&[slow_click("button", "timeout", 9000, 6)]);
        assert!(x.clicks[0].is_rage);
        let x = extract_events(&[click_with_node(
            r#"{"id":3,"tagName":"div","textContent":"","attributes":{"class":"btn\n  primary\tx  "}}"#,
        )]);
        assert_eq!(x.clicks[0].classes, ["btn\n", "primary\tx"]);
    }

    #[test]
    fn a_ui_click_is_a_click_row_that_is_neither_dead_nor_rage() {
        let x = extract_events(&[click_with_node(
            r#"{"id":3,"tagName":"BUTTON","textContent":"Buy","attributes":{"id":"buy","class":"btn  primary","role":"button","alt":"a","aria-label":"Buy now","title":"t","testId":"buy-btn","data-sentry-component":"BuyButton"}}"#,
        )]);
        let click = &x.clicks[0];
        assert_eq!(
            (click.node_id, click.tag.as_str(), click.id.as_str()),
            (3, "BUTTON", "buy"),
            "the tag as sent"
        );
        assert_eq!(click.classes, ["btn", "primary"]);
        assert_eq!(
            (click.text.as_str(), click.role.as_str(), click.alt.as_str()),
            ("Buy", "button", "a")
        );
        assert_eq!(
            (click.aria_label.as_str(), click.title.as_str()),
            ("Buy now", "t")
        );
        assert_eq!(
            (click.testid.as_str(), click.component_name.as_str()),
            ("buy-btn", "BuyButton")
        );
        assert_eq!(
            (click.selector.as_str(), click.timestamp),
            ("div > button", 1_796_012_448.69)
        );
        assert!(!click.is_dead && !click.is_rage);
    }

    #[test]
    fn data_testid_is_accepted_as_well_as_the_sdks_test_id() {
        let x = extract_events(&[click_with_node(
            r#"{"id":3,"tagName":"a","textContent":"","attributes":{"data-testid":"nav"}}"#,
        )]);
        assert_eq!(x.clicks[0].testid, "nav");
    }

    #[test]
    fn a_slow_click_on_a_button_after_seven_seconds_is_dead() {
        let click = &extract_events(&[slow_click("button", "timeout", 7000, 1)]).clicks[0];
        assert!(click.is_dead && !click.is_rage);
        assert_eq!(&*click.url, "https://shop/");
    }

    #[test]
    fn rage_click_needs_five_clicks_and_a_timeout() {
        assert!(extract_events(&[slow_click("a", "timeout", 7000, 5)]).clicks[0].is_rage);
        assert!(!extract_events(&[slow_click("a", "timeout", 7000, 4)]).clicks[0].is_rage);
        let not_timeout = &extract_events(&[slow_click("a", "mutation", 7000, 9)]).clicks[0];
        assert!(!not_timeout.is_rage && !not_timeout.is_dead);
    }

    #[test]
    fn a_slow_click_is_dead_only_on_links_buttons_and_inputs() {
        for tag in ["a", "button", "input"] {
            assert!(
                extract_events(&[slow_click(tag, "timeout", 7000, 1)]).clicks[0].is_dead,
                "{tag}"
            );
        }
        let div = &extract_events(&[slow_click("div", "timeout", 9000, 9)]).clicks[0];
        assert!(
            !div.is_dead && !div.is_rage,
            "a slow click on a div is only slow"
        );
    }

    #[test]
    fn a_slow_click_under_seven_seconds_is_not_dead() {
        let click = &extract_events(&[slow_click("button", "timeout", 6999, 6)]).clicks[0];
        assert!(!click.is_dead && !click.is_rage);
    }

    #[test]
    fn clicks_without_a_node_or_with_a_negative_id_are_skipped() {
        let x = extract_events(&[
            breadcrumb("ui.click", r#","data":{"nodeId":3}"#),
            click_with_node(r#"{"id":-1,"tagName":"button","textContent":""}"#),
        ]);
        assert!(x.clicks.is_empty());
        assert_eq!(
            (x.events, x.invalid_events),
            (2, 0),
            "the breadcrumbs themselves are well-formed"
        );
    }

    #[test]
    fn click_fields_are_truncated_to_their_column_limits() {
        let long = "x".repeat(2000);
        let classes = (0..15)
            .map(|i| format!("c{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let node = format!(
            r#"{{"id":1,"tagName":"{long}","textContent":"{long}","attributes":{{"id":"{long}","class":"{classes}","role":"{long}","alt":"{long}","aria-label":"{long}","title":"{long}","testId":"{long}","data-sentry-component":"{long}"}}}}"#
        );
        let c = &extract_events(&[click_with_node(&node)]).clicks[0];
        assert_eq!(
            (c.tag.len(), c.id.len(), c.text.len(), c.role.len()),
            (32, 64, 1024, 32)
        );
        for field in [
            &c.alt,
            &c.aria_label,
            &c.title,
            &c.testid,
            &c.component_name,
        ] {
            assert_eq!(field.len(), 64);
        }
        assert_eq!(c.classes.len(), 10);
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("ééé", 2), ("éé".into(), true));
        assert_eq!(truncate("ab", 5), ("ab".into(), false));
    }

    #[test]
    fn at_most_the_configured_number_of_clicks_and_taps_are_kept() {
        let clicks: Vec<String> = (0..25)
            .map(|_| click_with_node(r#"{"id":1,"tagName":"a","textContent":""}"#))
            .collect();
        let taps: Vec<String> = (0..25)
            .map(|_| breadcrumb("ui.tap", r#","message":"t","data":{"view.id":"v"}"#))
            .collect();
        let x = extract_events(&[clicks, taps].concat());
        assert_eq!((x.clicks.len(), x.taps.len()), (20, 20));
        let json = format!(
            "[{}]",
            vec![click_with_node(r#"{"id":1,"tagName":"a","textContent":""}"#); 5].join(",")
        );
        assert_eq!(
            extract(
                json.as_bytes(),
                RowLimits {
                    max_clicks: 3,
                    max_taps: 0
                }
            )
            .unwrap()
            .clicks
            .len(),
            3
        );
    }

    #[test]
    fn taps_keep_message_view_class_and_view_id() {
        let x = extract_events(&[breadcrumb(
            "ui.tap",
            r#","message":"Checkout","data":{"view.class":"android.widget.Button","view.id":"checkout"}"#,
        )]);
        assert_eq!(
            x.taps,
            [Tap {
                timestamp: 1_796_012_448.69,
                message: "Checkout".into(),
                view_class: "android.widget.Button".into(),
                view_id: "checkout".into()
            }]
        );
    }

    #[test]
    fn multi_clicks_keep_their_click_count() {
        let x = extract_events(&[breadcrumb(
            "ui.multiClick",
            r#","message":"button#add","data":{"node":{"id":21,"tagName":"button","textContent":""},"clickCount":4,"metric":true}"#,
        )]);
        assert_eq!(x.multi_clicks[0].click_count, 4);
        assert_eq!(x.multi_clicks[0].node_id, Some(21));
        assert!(x.clicks.is_empty(), "a multi-click is not a click row");
    }

    #[test]
    fn fetch_and_xhr_spans_become_requests_with_sizes_from_either_field() {
        let x = extract_events(&[
            span(
                "resource.fetch",
                "/api/a",
                r#"{"method":"POST","statusCode":201,"requestBodySize":10,"responseBodySize":20}"#,
            ),
            span(
                "resource.xhr",
                "/api/b",
                r#"{"method":"GET","statusCode":200,"request":{"size":5,"body":"…"},"response":{"size":323,"headers":{}}}"#,
            ),
            span(
                "resource.fetch",
                "/api/c",
                r#"{"method":"GET","statusCode":404}"#,
            ),
            span("resource.script", "/app.js", r#"{"size":1}"#),
        ]);
        let sizes: Vec<_> = x
            .requests
            .iter()
            .map(|r| (&*r.url, r.request_size, r.response_size))
            .collect();
        assert_eq!(
            sizes,
            [
                ("/api/a", Some(10), Some(20)),
                ("/api/b", Some(5), Some(323)),
                ("/api/c", None, None)
            ]
        );
        assert_eq!(
            (x.requests[0].method.as_deref(), x.requests[0].status_code),
            (Some("POST"), Some(201))
        );
        assert_eq!(x.spans_by_op.get("resource.script"), 1);
    }

    #[test]
    fn console_breadcrumbs_are_counted_by_level_as_sent() {
        let x = extract_events(&[
            breadcrumb("console", r#","level":"warning""#),
            breadcrumb("console", r#","level":"warning""#),
            breadcrumb("console", r#","level":"error""#),
            breadcrumb("console", r#","level":"Fatal""#),
        ]);
        assert_eq!(
            (
                x.console.get("warning"),
                x.console.get("error"),
                x.console.get("Fatal")
            ),
            (2, 1, 1)
        );
    }

    #[test]
    fn navigation_spans_and_breadcrumbs_are_navigations_and_span_urls_are_visited() {
        let x = extract_events(&[
            format!(
                r#"{{"type":4,"data":{{"href":"https://shop/","width":1,"height":1}},"timestamp":{TS}}}"#
            ),
            span("navigation.push", "https://shop/cart", "{}"),
            breadcrumb("navigation", r#","data":{"from":"/","to":"/cart"}"#),
            span("navigation.navigate", "https://shop/", "{}"),
        ]);
        let navs: Vec<_> = x
            .navigations
            .iter()
            .map(|n| (n.op.as_str(), n.from.as_deref(), &*n.to))
            .collect();
        assert_eq!(
            navs,
            [
                ("navigation.push", None, "https://shop/cart"),
                ("navigation", Some("/"), "/cart"),
                ("navigation.navigate", None, "https://shop/")
            ]
        );
        assert_eq!(
            x.urls,
            [Url::from("https://shop/"), Url::from("https://shop/cart")],
            "deduplicated, first-seen order"
        );
    }

    #[test]
    fn a_click_without_its_own_url_has_none_even_on_a_known_page() {
        let x = extract_events(&[
            format!(r#"{{"type":4,"data":{{"href":"https://shop/p/1"}},"timestamp":{TS}}}"#),
            click_with_node(r#"{"id":1,"tagName":"a","textContent":""}"#),
            breadcrumb("replay.hydrate-error", r#","data":{}"#),
        ]);
        assert_eq!(&*x.clicks[0].url, "");
        assert_eq!(x.hydration_errors[0].url, None);
    }

    #[test]
    fn a_breadcrumb_whose_data_is_null_is_dropped_as_sentry_drops_it() {
        let tap = r#","message":"Buy","data":{"view.id":"buy","view.class":"Button"}"#;
        for (category, kept) in [
            ("ui.tap", tap),
            ("replay.hydrate-error", r#","data":{"url":"https://shop/"}"#),
        ] {
            let null = r#","message":"Buy","data":null"#;
            let absent = r#","message":"Buy""#;
            let x = extract_events(&[
                breadcrumb(category, kept),
                breadcrumb(category, null),
                breadcrumb(category, absent),
            ]);
            // `payload.get("data", {})`: absent is empty, `null` raises.
            let found = x.taps.len() + x.hydration_errors.len();
            assert_eq!(
                found, 2,
                "{category}: the one with data and the one without"
            );
        }
    }

    #[test]
    fn hydration_errors_are_collected_with_their_url() {
        let x = extract_events(&[breadcrumb(
            "replay.hydrate-error",
            r#","data":{"url":"https://shop/"}"#,
        )]);
        assert_eq!(
            x.hydration_errors,
            [HydrationError {
                timestamp: 1_796_012_448.69,
                url: Some("https://shop/".into())
            }]
        );
    }

    #[test]
    fn web_vitals_keep_name_value_and_rating() {
        let x = extract_events(&[span(
            "web-vital",
            "largest-contentful-paint",
            r#"{"value":208,"rating":"good","nodeIds":[11]}"#,
        )]);
        assert_eq!(x.web_vitals[0].name, "largest-contentful-paint");
        assert_eq!(
            (x.web_vitals[0].value, x.web_vitals[0].rating.as_deref()),
            (Some(208.0), Some("good"))
        );
    }

    #[test]
    fn timestamps_in_seconds_and_milliseconds_are_normalised_to_milliseconds() {
        let x = extract_events(&[
            format!(r#"{{"type":0,"data":{{}},"timestamp":{}}}"#, TS + 5000),
            span("memory", "memory", "{}"),
        ]);
        assert_eq!(
            (x.first_timestamp_ms, x.last_timestamp_ms),
            (Some(1_796_012_448_500), Some(TS + 5000))
        );
    }

    #[test]
    fn a_malformed_event_is_counted_and_skipped_without_failing_the_segment() {
        let x = extract_events(&[
            "7".into(),
            "[1,2]".into(),
            r#"{"type":"2","timestamp":1}"#.into(),
            r#"{"type":2}"#.into(),
            r#"{"type":3,"data":{"positions":[]},"timestamp":1}"#.into(),
            r#"{"type":5,"timestamp":1,"data":{"tag":"breadcrumb","payload":{"category":["ui.click"]}}}"#.into(),
            r#"{"type":5,"timestamp":1,"data":"not an object"}"#.into(),
            format!(r#"{{"type":1,"data":{{}},"timestamp":{TS}}}"#),
        ]);
        assert_eq!((x.events, x.invalid_events), (1, 7));
    }

    #[test]
    fn a_body_that_is_not_a_json_array_fails() {
        for body in [
            &b"{}"[..],
            b"[{\"type\":1",
            b"[] trailing",
            b"\"x\"",
            b"[\"\xff\"]",
        ] {
            assert!(
                extract(body, RowLimits::default()).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_url_past_its_cap_is_cut_on_a_char_boundary_with_a_marker_and_counted() {
        let href = format!("https://shop/{}", "é".repeat(MAX_URL_BYTES));
        let x = extract_events(&[format!(
            r#"{{"type":4,"data":{{"href":"{href}"}},"timestamp":{TS}}}"#
        )]);
        assert!(x.urls[0].len() <= MAX_URL_BYTES && x.urls[0].ends_with(TRUNCATION_MARKER));
        assert!(href.starts_with(x.urls[0].trim_end_matches(TRUNCATION_MARKER)));
        assert_eq!(x.truncated_values, 1);
    }

    #[test]
    fn the_page_url_is_shared_by_every_click_and_hydration_error_that_refers_to_it() {
        let mut events = vec![format!(
            r#"{{"type":4,"data":{{"href":"https://shop/p/1"}},"timestamp":{TS}}}"#
        )];
        let click = r#","message":"a","data":{"node":{"id":1,"tagName":"a","textContent":""},"url":"https://shop/p/1"}"#;
        events.extend((0..5).map(|_| breadcrumb("ui.click", click)));
        events.extend((0..5).map(|_| {
            breadcrumb(
                "replay.hydrate-error",
                r#","data":{"url":"https://shop/p/1"}"#,
            )
        }));
        let x = extract_events(&events);
        let page = &x.urls[0];
        assert!(x.clicks.iter().all(|c| Arc::ptr_eq(&c.url, page)));
        assert!(
            x.hydration_errors
                .iter()
                .all(|h| h.url.as_ref().is_some_and(|u| Arc::ptr_eq(u, page)))
        );
        assert_eq!(
            Arc::strong_count(page),
            11,
            "one allocation, eleven holders"
        );
    }

    #[test]
    fn pages_visited_again_share_one_allocation_and_the_budget_holds() {
        let (a, b) = ("a".repeat(8000), "b".repeat(8000));
        let events: Vec<String> = (0..1000)
            .map(|i| span("navigation.push", if i % 2 == 0 { &a } else { &b }, "{}"))
            .collect();
        let x = extract_events(&events);
        assert_eq!(x.urls.len(), 2);
        assert_eq!(
            (x.navigations.len(), x.dropped_items),
            (1000, 0),
            "shared, every visit fits the budget"
        );
        assert!(
            x.navigations
                .iter()
                .all(|n| x.urls.iter().any(|u| Arc::ptr_eq(u, &n.to))),
            "every navigation holds a listed URL's allocation"
        );
        // Past the visited list: distinct long URLs are counted where they are held.
        let events: Vec<String> = (0..2000)
            .map(|i| span("navigation.push", &format!("{i}{a}"), "{}"))
            .collect();
        let x = extract_events(&events);
        assert!(!x.navigations.is_empty());
        assert_eq!(
            (x.navigations.len() + x.urls.len()) as u64 + x.dropped_items,
            2 * 2000,
            "each visit and each URL kept or counted"
        );
        let held: usize = x.navigations.iter().map(|n| n.to.len()).sum::<usize>()
            + x.urls.iter().map(|u| u.len()).sum::<usize>();
        assert!(held <= 2 * MAX_LIST_BYTES, "{held} bytes of URLs held");
    }

    #[test]
    fn lists_stop_at_their_byte_budget_and_count_what_they_leave_out() {
        let url = "u".repeat(4000);
        let events: Vec<String> = (0..400)
            .map(|i| span("resource.fetch", &format!("{url}{i}"), "{}"))
            .collect();
        let x = extract_events(&events);
        let kept = x.requests.len();
        assert!(
            kept < 400 && kept * 4000 <= MAX_LIST_BYTES,
            "{kept} requests kept"
        );
        assert_eq!(kept as u64 + x.dropped_items, 400);
    }

    #[test]
    fn count_keys_are_cut_to_their_cap() {
        let long = "c".repeat(10 * MAX_KEY_BYTES);
        let x = extract_events(&[breadcrumb(&long, "")]);
        assert_eq!(x.breadcrumbs_by_category.len(), 1);
        assert_eq!(
            x.breadcrumbs_by_category
                .get(&cut_bytes(&long, MAX_KEY_BYTES).0),
            1
        );
        assert_eq!(x.truncated_values, 1);
    }

    #[test]
    fn events_nested_deeper_than_the_parsers_allow_are_skipped_not_parsed() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let x = extract_events(&[
            format!(r#"{{"type":4,"data":{{"href":{deep}}},"timestamp":{TS}}}"#),
            breadcrumb("ui.click", &format!(r#","data":{{"node":{deep}}}"#)),
            format!(r#"{{"type":2,"data":{{"node":{deep}}},"timestamp":{TS}}}"#),
            breadcrumb("ui.click", r#","data":{"node":[[[[[[[[1]]]]]]]]}"#),
        ]);
        assert_eq!(
            (x.events, x.invalid_events),
            (2, 2),
            "snapshots are never parsed; shallow nesting is fine"
        );
    }

    #[test]
    fn the_depth_limit_holds_exactly_whether_the_kind_comes_before_the_data_or_after() {
        // The data object is one level: 127 arrays in it make 128, the most a parser may take.
        let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        for (arrays, valid) in [(127, 1), (128, 0)] {
            let data = format!(r#"{{"href":{}}}"#, nested(arrays));
            let x = extract_events(&[
                format!(r#"{{"type":4,"timestamp":{TS},"data":{data}}}"#),
                format!(r#"{{"data":{data},"timestamp":{TS},"type":4}}"#),
            ]);
            assert_eq!(
                (x.events, x.invalid_events),
                (2 * valid, 2 - 2 * valid),
                "{arrays}"
            );
        }
    }

    #[test]
    fn input_keyed_counts_are_bounded() {
        let events: Vec<String> = (0..MAX_DISTINCT_KEYS + 10)
            .map(|i| breadcrumb(&format!("cat.{i}"), ""))
            .collect();
        let x = extract_events(&events);
        assert_eq!(x.breadcrumbs_by_category.len(), MAX_DISTINCT_KEYS + 1);
        assert_eq!(x.breadcrumbs_by_category.get("other"), 10);
    }
}
