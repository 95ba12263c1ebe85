//! Crafted messages, each at most 15 MB on the wire, built to
//! amplify memory or time — one value referenced many times, deep nesting, huge arrays of tiny
//! events, many distinct URLs, many clicks/taps/navigations/requests, huge replay-event lists,
//! long count keys, a padded zlib stream, an out-of-range segment id, 10 MiB header fields.
//! Generated, not committed (80 MB): `tests/it/memory_bound.rs` asserts the cost bound and the outcome of each;
//! `cargo run --release --example make_hostile_fixtures -- DIR` writes them as files, which
//! `scripts/hostile-rss.sh` feeds to `replay-ingest inspect` for peak RSS and time.

use std::io::Write;

use flate2::Compression;
use flate2::write::ZlibEncoder;
use serde::Serialize;

/// One crafted message value.
pub struct Hostile {
    pub name: &'static str,
    pub value: Vec<u8>,
    /// `None`: valid (processed within the cost bound); else the rejection reason.
    pub invalid_reason: Option<&'static str>,
}

const REPLAY_ID: &str = "0badc0de0badc0de0badc0de0badc0de";
const TS: u64 = 1_796_012_448_000;
const MIB: usize = 1024 * 1024;

#[derive(Serialize)]
struct Message<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    replay_id: &'a str,
    org_id: u64,
    project_id: u64,
    received: u64,
    retention_days: u16,
    #[serde(with = "serde_bytes")]
    payload: &'a [u8],
    #[serde(with = "serde_bytes")]
    replay_event: Option<&'a [u8]>,
    #[serde(with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    replay_video: Option<&'a [u8]>,
    relay_snuba_publish_disabled: bool,
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A message value around a body (compressed or raw JSON) and an optional replay event.
pub fn message(segment_header: &str, body: &[u8], replay_event: Option<&[u8]>) -> Vec<u8> {
    value(
        &[segment_header.as_bytes(), b"\n", body].concat(),
        replay_event,
    )
}

/// A message value around a body and a video (as mobile SDKs send), without a replay event.
fn with_video(segment_header: &str, body: &[u8], video: &[u8]) -> Vec<u8> {
    let payload = [segment_header.as_bytes(), b"\n", body].concat();
    rmp_serde::to_vec_named(&Message {
        replay_video: Some(video),
        ..message_of(&payload, None)
    })
    .unwrap()
}

/// A valid message value around an arbitrary payload (header line included).
pub fn value(payload: &[u8], replay_event: Option<&[u8]>) -> Vec<u8> {
    rmp_serde::to_vec_named(&message_of(payload, replay_event)).unwrap()
}

fn message_of<'a>(payload: &'a [u8], replay_event: Option<&'a [u8]>) -> Message<'a> {
    Message {
        kind: "replay_recording_not_chunked",
        replay_id: REPLAY_ID,
        org_id: 1,
        project_id: 2,
        received: TS / 1000,
        retention_days: 30,
        payload,
        replay_event,
        replay_video: None,
        relay_snuba_publish_disabled: true,
    }
}

fn events(events: impl IntoIterator<Item = String>) -> Vec<u8> {
    let mut out = b"[".to_vec();
    for (i, event) in events.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(event.as_bytes());
    }
    out.push(b']');
    out
}

fn meta(href: &str) -> String {
    format!(r#"{{"type":4,"timestamp":{TS},"data":{{"href":"{href}","width":1,"height":1}}}}"#)
}

fn breadcrumb(category: &str, extra: &str) -> String {
    format!(
        r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"breadcrumb","payload":{{"timestamp":1796012448.5,"type":"default","category":"{category}"{extra}}}}}}}"#
    )
}

fn span(op: &str, description: &str, data: &str) -> String {
    format!(
        r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"performanceSpan","payload":{{"op":"{op}","description":"{description}","startTimestamp":1796012448.5,"endTimestamp":1796012449.0,"data":{data}}}}}}}"#
    )
}

/// A rage click (slow click that timed out after 5 clicks) on a node; `url` omitted when empty.
fn rage_click(node: u64, selector: &str, class: &str, text: &str, url: &str) -> String {
    let url = if url.is_empty() {
        String::new()
    } else {
        format!(r#","url":"{url}""#)
    };
    breadcrumb(
        "ui.slowClickDetected",
        &format!(
            r#","message":"{selector}","data":{{"node":{{"id":{node},"tagName":"button","textContent":"{text}","attributes":{{"class":"{class}"}}}}{url},"timeAfterClickMs":7000,"endReason":"timeout","clickCount":5}}"#
        ),
    )
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Every hostile message, with the outcome it must have.
pub fn all() -> Vec<Hostile> {
    let mut all = Vec::new();
    let mut write = |name: &'static str, value: Vec<u8>, expected: Option<&'static str>| {
        assert!(value.len() <= 15_000_000, "{name}: {} bytes", value.len());
        all.push(Hostile {
            name,
            value,
            invalid_reason: expected,
        });
    };
    let header = r#"{"segment_id":0}"#;
    let replay_event =
        br#"{"type":"replay_event","timestamp":1796012449.0,"urls":[],"platform":"javascript"}"#;

    // The reported outage: a 5 MiB page URL that 1 000 hydration errors refer to.
    let href = format!("https://example.com/{}", "h".repeat(5 * MIB));
    let body = events(
        std::iter::once(meta(&href))
            .chain((0..1000).map(|_| breadcrumb("replay.hydrate-error", r#","data":{}"#))),
    );
    write(
        "href-x-hydration-errors",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // The same URL behind 1 000 rage clicks without their own url (20 become rows and events).
    let body = events(
        std::iter::once(meta(&href))
            .chain((0..1000).map(|i| rage_click(i, "button.buy", "btn primary", "Buy", ""))),
    );
    write(
        "href-x-clicks",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // 20 rage clicks whose selector, class names, text and url are 1 MiB each.
    let long = "x".repeat(MIB);
    let class = vec!["c".repeat(MIB / 10); 10].join(" ");
    let body =
        events((0..20).map(|i| rage_click(i, &long, &class, &long, &format!("https://e/{long}"))));
    write(
        "long-click-fields",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // 300 rage clicks and 300 taps, every field 16 KiB (past its cap) and each url its own: rows
    // up to the largest click and tap limits accepted, every field at its cap.
    let long = "x".repeat(16 << 10);
    let class = vec!["c".repeat(1 << 10); 16].join(" ");
    let tap = format!(r#","message":"{long}","data":{{"view.class":"{long}","view.id":"{long}"}}"#);
    let body = events((0..300).flat_map(|i| {
        [
            rage_click(i, &long, &class, &long, &format!("https://e/{i}/{long}")),
            breadcrumb("ui.tap", &tap),
        ]
    }));
    write(
        "many-long-clicks-and-taps",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // Repeats 32 600 bytes apart: within DEFLATE's 32 KiB window, which libdeflate searches
    // whole, and past the 32 506 bytes zlib-rs's level 6 looks back. Stored re-encoded — a gzip
    // body, and a zlib body sent with a video (packed with it) — the blob is 13 MB of random
    // letters for a message of 0.1 MB.
    let json = far_repeats(32_600, 400);
    let mut compressor = libdeflater::Compressor::new(libdeflater::CompressionLvl::best());
    let mut encoded = |gzip: bool| {
        let mut body = vec![0; compressor.zlib_compress_bound(json.len()) + 32];
        let len = match gzip {
            true => compressor.gzip_compress(json.as_bytes(), &mut body),
            false => compressor.zlib_compress(json.as_bytes(), &mut body),
        };
        body.truncate(len.unwrap());
        body
    };
    let (gzip, zlib_body) = (encoded(true), encoded(false));
    write("far-repeats-gzip", message(header, &gzip, None), None);
    write(
        "far-repeats-zlib-with-video",
        with_video(header, &zlib_body, b"\x00"),
        None,
    );

    // A million levels of nesting where the parsers recurse: Meta data, breadcrumb data and
    // category, span data. Each event is skipped; the segment is valid.
    let deep = nested(1_000_000);
    let body = events([
        format!(r#"{{"type":4,"timestamp":{TS},"data":{{"href":{deep}}}}}"#),
        breadcrumb("ui.click", &format!(r#","data":{{"node":{deep}}}"#)),
        format!(
            r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"breadcrumb","payload":{{"category":{deep}}}}}}}"#
        ),
        span("resource.fetch", "/api", &deep),
        format!(r#"{{"type":2,"timestamp":{TS},"data":{{"node":{deep}}}}}"#),
        meta("https://example.com/ok"),
    ]);
    write(
        "deep-nesting-events",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // The replay event nested a million levels deep: invalid_replay_event.
    let deep_event = format!(r#"{{"urls":{deep}}}"#);
    write(
        "deep-nesting-replay-event",
        message(header, &zlib(b"[]"), Some(deep_event.as_bytes())),
        Some("invalid_replay_event"),
    );

    // 1.5 million tiny incremental events (87 MB of JSON).
    let body = events((0..1_500_000).map(|i| {
        format!(
            r#"{{"type":3,"timestamp":{},"data":{{"source":1}}}}"#,
            TS + i
        )
    }));
    write(
        "tiny-events",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // 10 000 distinct 7 KiB page URLs sharing their first 7 000 bytes: deduplication must stay
    // linear, and the list within its byte budget.
    let prefix = format!("https://example.com/{}", "p".repeat(7000));
    let body = events((0..10_000).map(|i| meta(&format!("{prefix}/{i}"))));
    write(
        "many-distinct-urls",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // 15 000 of every interaction the extractor keeps, each with a 1 KiB url.
    let url = format!("https://example.com/{}", "u".repeat(1024));
    let body = events((0..15_000).flat_map(|i| {
        [
            rage_click(i, "a.link", "x y", "t", &url),
            breadcrumb(
                "ui.tap",
                r#","message":"Checkout","data":{"view.class":"Button","view.id":"checkout"}"#,
            ),
            breadcrumb(
                "ui.multiClick",
                r#","message":"button#add","data":{"node":{"id":1},"clickCount":4}"#,
            ),
            breadcrumb(
                "navigation",
                &format!(r#","data":{{"from":"{url}","to":"{url}/{i}"}}"#),
            ),
            span(
                "resource.fetch",
                &format!("{url}/api/{i}"),
                r#"{"method":"GET","statusCode":200}"#,
            ),
            span(
                "web-vital",
                "largest-contentful-paint",
                r#"{"value":2.5,"rating":"good"}"#,
            ),
            breadcrumb(
                "replay.hydrate-error",
                &format!(r#","data":{{"url":"{url}/{i}"}}"#),
            ),
            breadcrumb("console", r#","level":"error""#),
        ]
    }));
    write(
        "many-interactions",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // A replay event with 200 000 urls, 100 000 error and trace ids and 300 000 tags.
    let uuid = "2f045a65095a407da962d4ca1e905a53";
    let replay_event_huge = format!(
        r#"{{"type":"replay_event","urls":[{}],"error_ids":[{}],"trace_ids":[{}],"tags":{{{}}}}}"#,
        (0..200_000)
            .map(|i| format!(r#""/{i}""#))
            .collect::<Vec<_>>()
            .join(","),
        vec![format!(r#""{uuid}""#); 100_000].join(","),
        vec![format!(r#""{uuid}""#); 100_000].join(","),
        (0..300_000)
            .map(|i| format!(r#""k{i}":"v""#))
            .collect::<Vec<_>>()
            .join(","),
    );
    write(
        "replay-event-huge-lists",
        message(header, &zlib(b"[]"), Some(replay_event_huge.as_bytes())),
        None,
    );

    // 70 distinct 128 KiB breadcrumb categories, span ops, custom tags and console levels.
    let key = |i: usize| format!("{i}{}", "k".repeat(128 * 1024));
    let body = events((0..70).flat_map(|i| {
        [
            breadcrumb(&key(i), ""),
            span(&key(i), "d", "{}"),
            format!(
                r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"{}","payload":{{}}}}}}"#,
                key(i)
            ),
            breadcrumb("console", &format!(r#","level":"{}""#, key(i))),
        ]
    }));
    write(
        "long-count-keys",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // Custom events whose data hold millions of tiny values: a console breadcrumb (no item) and
    // a request span (an item, its body never in it). Read whole as a tree to build items, each
    // 2-byte value took 32 bytes or more: 16–30 times the event.
    let zeros = vec!["0"; 2 * MIB].join(",");
    let body = events([
        breadcrumb("console", &format!(r#","data":{{"arguments":[{zeros}]}}"#)),
        span(
            "resource.fetch",
            "https://example.com/api",
            &format!(r#"{{"method":"POST","statusCode":200,"response":{{"body":[{zeros}]}}}}"#),
        ),
    ]);
    write(
        "custom-events-of-tiny-values",
        message(header, &zlib(&body), Some(replay_event)),
        None,
    );

    // A zlib stream padded with 2 million empty stored blocks around a 2-byte JSON body: 10 MB
    // on the wire for nothing; the blob must not keep the padding.
    let mut padded = vec![0x78, 0x01];
    for _ in 0..2_000_000 {
        padded.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
    }
    padded.extend_from_slice(&[0x01, 0x02, 0x00, 0xfd, 0xff, b'[', b']']);
    padded.extend_from_slice(&adler32(b"[]").to_be_bytes());
    write("zlib-padding", message(header, &padded, None), None);

    // A segment id past u32: rows store a u32, so blob key and row could disagree.
    write(
        "segment-id-overflow",
        message(r#"{"segment_id":4294967296}"#, &zlib(b"[]"), None),
        Some("invalid_header"),
    );

    // A segment 0 received in year 10000, and at the largest u64: its billing outcome's
    // timestamp overflowed and panicked the flush, crash-looping every member that took it.
    for (name, received) in [
        ("received-year-10000", 253_402_300_800),
        ("received-u64-max", u64::MAX),
    ] {
        let value = message(header, &zlib(b"[]"), Some(replay_event));
        let value = with_field(&value, "received", received.into());
        write(name, value, Some("invalid_received"));
    }

    // Header fields of 10 MiB: control characters where a number or the type goes, a byte
    // string where the replay id goes, a space between every character of the type. A wrong
    // type or replay id was quoted whole in its error, escaped (5 bytes a character) or split
    // at every space: 132 MB for a 10 MB message.
    let control = "\u{1}".repeat(10 * MIB);
    let spaced = "a ".repeat(5 * MIB);
    let valid = message(header, &zlib(b"[]"), None);
    for (name, field, sent, reason) in [
        (
            "org-id-of-control-characters",
            "org_id",
            control.as_str().into(),
            "invalid_msgpack",
        ),
        (
            "type-of-control-characters",
            "type",
            control.as_str().into(),
            "wrong_type",
        ),
        (
            "type-spaced-out",
            "type",
            spaced.as_str().into(),
            "wrong_type",
        ),
        (
            "replay-id-of-control-characters",
            "replay_id",
            control.as_str().into(),
            "invalid_replay_id",
        ),
        (
            "replay-id-as-bytes",
            "replay_id",
            rmpv::Value::Binary(vec![0xff; 10 * MIB]),
            "invalid_msgpack",
        ),
    ] {
        write(name, with_field(&valid, field, sent), Some(reason));
    }
    all
}

/// `value` (a message map) with field `name` replaced by `sent`.
pub fn with_field(value: &[u8], name: &str, sent: rmpv::Value) -> Vec<u8> {
    let rmpv::Value::Map(mut map) = rmpv::decode::read_value(&mut &value[..]).unwrap() else {
        unreachable!("a message is a map")
    };
    for (key, field) in map.iter_mut() {
        if key.as_str() == Some(name) {
            *field = sent.clone();
        }
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(map)).unwrap();
    out
}

/// A JSON array of `count` events, each with its comma `unit` bytes long and the same random
/// letters.
pub fn far_repeats(unit: usize, count: usize) -> String {
    let event = |random: &str| {
        format!(r#"{{"type":5,"timestamp":{TS},"data":{{"tag":"x","payload":"{random}"}}}}"#)
    };
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let random: String = (0..unit - event("").len() - 1)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            char::from(b'a' + (state >> 59) as u8 % 26)
        })
        .collect();
    format!("[{}]", vec![event(&random); count].join(","))
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}
