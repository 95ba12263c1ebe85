//! The wire shapes of the custom events extraction reads (rrweb `data` of breadcrumbs and
//! performance spans, Meta `href`): borrowed from the segment's JSON, every field optional, so a
//! malformed event is skipped rather than failing the segment.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::recording::json::{Num, Text, parse};

#[derive(Deserialize)]
pub(super) struct CustomData<'a> {
    #[serde(borrow, default)]
    pub(super) tag: Text<'a>,
    #[serde(borrow)]
    pub(super) payload: Option<&'a RawValue>,
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
    #[serde(borrow)]
    pub(super) data: Option<&'a RawValue>,
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
    #[serde(borrow)]
    pub(super) node: Option<Node<'a>>,
    #[serde(borrow, default)]
    pub(super) url: Text<'a>,
    #[serde(default)]
    pub(super) time_after_click_ms: Num,
    /// Older SDKs send the lower-case spelling; the camel-case one wins when both are there.
    #[serde(default, rename = "timeafterclickms")]
    pub(super) time_after_click_ms_lower: Num,
    #[serde(borrow, default)]
    pub(super) end_reason: Text<'a>,
    #[serde(default)]
    pub(super) click_count: Num,
    #[serde(default, rename = "clickcount")]
    pub(super) click_count_lower: Num,
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
    #[serde(borrow, default)]
    pub(super) attributes: Attributes<'a>,
}

/// The node attributes the SDK reports. The test id has three spellings (the SDK renames
/// `data-testid` to `testId`; pages also use `data-test-id`); a node may carry several.
#[derive(Deserialize, Default)]
pub(super) struct Attributes<'a> {
    #[serde(borrow, default)]
    pub(super) id: Text<'a>,
    #[serde(borrow, default)]
    pub(super) class: Text<'a>,
    #[serde(borrow, default)]
    pub(super) role: Text<'a>,
    #[serde(borrow, default)]
    pub(super) alt: Text<'a>,
    #[serde(borrow, default, rename = "aria-label")]
    pub(super) aria_label: Text<'a>,
    #[serde(borrow, default)]
    pub(super) title: Text<'a>,
    #[serde(borrow, default, rename = "testId")]
    pub(super) test_id: Text<'a>,
    #[serde(borrow, default, rename = "data-testid")]
    pub(super) data_testid: Text<'a>,
    #[serde(borrow, default, rename = "data-test-id")]
    pub(super) data_test_id: Text<'a>,
    #[serde(borrow, default, rename = "data-sentry-component")]
    pub(super) component_name: Text<'a>,
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
    pub(super) request: Option<BodySize>,
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

/// Parses optional `data`; absent data is the default, present but malformed is `None`.
pub(super) fn parse_data<'a, T: Deserialize<'a> + Default>(
    data: &Option<&'a RawValue>,
) -> Option<T> {
    match data {
        None => Some(T::default()),
        Some(raw) => parse(raw.get()),
    }
}

#[derive(Deserialize)]
pub(super) struct UrlHref<'a> {
    #[serde(borrow, default)]
    pub(super) href: Text<'a>,
}
