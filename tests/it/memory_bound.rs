//! The cost bound, measured: a counting global allocator tracks, per thread, the bytes `process`
//! leaves allocated (what a buffered segment holds) and the peak while it runs, with every output
//! on (replay events kept, every breadcrumb a trace item). For every
//! recorded fixture, every hostile message and arbitrary event lists:
//! - `memory_bytes()` tells the truth: at least what is held, at most 1.25 × that + 64 bytes;
//! - what is held is within the cost bound, 2 × the decoded input + 1 MiB;
//! - the peak while processing stays within 5 × the message + 3 × the decoded input + 8 MiB.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use proptest::prelude::*;
use replay_ingest::pipeline::window;
use replay_ingest::recording::{self, IssueGates, Limits, Processed};

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            add(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            add(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Counted as a new block first, then the old one freed: the peak includes both.
            add(new_size as isize);
            add(-(layout.size() as isize));
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What processing one value left allocated, and the peak above the starting point.
struct Measured {
    result: Result<Box<Processed>, recording::InvalidRecording>,
    held: usize,
    peak: usize,
}

/// The configuration that holds the most: replay events kept to be republished, every
/// breadcrumb an EAP trace item, and as many click and tap rows as may be configured.
fn measured_limits() -> Limits {
    Limits {
        republish_replay_event: true,
        trace_items: replay_ingest::recording::Rollout::ALL,
        rows: recording::RowLimits {
            max_clicks: recording::MAX_ROWS_PER_SEGMENT,
            max_taps: recording::MAX_ROWS_PER_SEGMENT,
        },
        ..Limits::default()
    }
}

fn measure(value: &[u8]) -> Measured {
    let limits = measured_limits();
    // Once unmeasured: lazily initialised statics are not the segment's.
    drop(recording::process(value, &limits));
    // The message's own buffer exists before processing (the consumer's record), as in the
    // service, and is not part of the peak; a blob may share it, and then it is part of what the
    // segment holds: what dropping the record's handle does not free.
    let value = bytes::Bytes::copy_from_slice(value);
    let len = value.len() as isize;
    let start = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let result =
        recording::process_with(&value, &limits, &mut recording::Inflater::default()).map(Box::new);
    let peak = PEAK.with(Cell::get) - start;
    let before_drop = LIVE.with(Cell::get);
    drop(value);
    let freed = before_drop - LIVE.with(Cell::get);
    let held = before_drop - start + (len - freed);
    Measured {
        result,
        held: held.max(0) as usize,
        peak: peak.max(0) as usize,
    }
}

/// The accounting and bound assertions, for a valid message; returns it.
fn assert_bounded(name: &str, value: &[u8]) -> Box<Processed> {
    let m = measure(value);
    let p = m.result.unwrap_or_else(|e| panic!("{name}: {e}"));
    let estimate = p.memory_bytes();
    assert!(
        estimate >= m.held,
        "{name}: memory_bytes {estimate} < {} actually held",
        m.held
    );
    assert!(
        estimate as f64 <= 1.25 * m.held as f64 + 64.0,
        "{name}: memory_bytes {estimate} overstates {} actually held",
        m.held
    );
    assert!(
        m.held <= p.cost_bound(),
        "{name}: holds {} > bound {} (input {})",
        m.held,
        p.cost_bound(),
        p.input_bytes
    );
    // What the processing window reserved for it before it was processed covers what it holds,
    // with trace items on (their budget reserved) and off (the default: nothing for them).
    let reserved = window::reservation(value, &measured_limits());
    assert!(
        estimate <= reserved,
        "{name}: memory_bytes {estimate} > the {reserved} bytes reserved for it"
    );
    let off = Limits {
        republish_replay_event: true,
        ..Limits::default()
    };
    if let Ok(without) = recording::process(value, &off) {
        let (held, reserved) = (without.memory_bytes(), window::reservation(value, &off));
        assert!(
            held <= reserved,
            "{name}, no trace items: memory_bytes {held} > the {reserved} bytes reserved for it"
        );
    }
    // The decompression buffer starts at most at 4 × the compressed size + 8 MiB (what a thread
    // retains anyway) and doubles up to at most twice the output.
    let peak_bound = 5 * value.len() + 3 * p.input_bytes + 8 * 1024 * 1024;
    assert!(
        m.peak <= peak_bound,
        "{name}: peak {} > {peak_bound}",
        m.peak
    );
    p
}

#[test]
fn every_fixture_is_accounted_exactly_and_within_the_bound() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut valid = 0;
    for dir in ["segments", "synthetic"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let value = std::fs::read(&path).unwrap();
            if recording::process(&value, &Limits::default()).is_ok() {
                assert_bounded(&path.display().to_string(), &value);
                valid += 1;
            }
        }
    }
    assert!(valid >= 18, "only {valid} valid fixtures");
}

#[test]
fn hostile_messages_are_processed_within_the_bound_or_rejected() {
    for message in crate::support::hostile::all() {
        let name = message.name;
        match message.invalid_reason {
            Some(reason) => {
                let m = measure(&message.value);
                let error = m.result.err().unwrap_or_else(|| panic!("{name}: accepted"));
                assert_eq!(error.reason.as_str(), reason, "{name}: {}", error.detail);
                // Each is refused before its body is read: its error costs what the error keeps,
                // whatever the message quotes (a 10 MiB type became a 132 MB error).
                assert!(m.peak <= 1 << 20, "{name}: peak {}", m.peak);
            }
            None => {
                let p = assert_bounded(name, &message.value);
                check_hostile_outcome(name, &p);
            }
        }
    }
}

/// What each hostile message must come to, beyond the bound.
fn check_hostile_outcome(name: &str, p: &Processed) {
    let x = &p.extracted;
    match name {
        "href-x-hydration-errors" => {
            assert_eq!(x.hydration_errors.len(), 1000);
            let page = x.urls[0].clone();
            assert!(
                page.len() <= 8 * 1024 && page.ends_with('…'),
                "the 5 MiB URL is cut with a marker"
            );
            assert!(
                x.hydration_errors.iter().all(|h| h.url.is_none()),
                "only a breadcrumb's own url is its url"
            );
            let events = p.events(&IssueGates::default());
            assert_eq!(
                events.len(),
                2 + recording::occurrence::MAX_HYDRATION_ISSUES
            );
        }
        "href-x-clicks" => {
            let most = recording::MAX_ROWS_PER_SEGMENT;
            assert_eq!(
                (x.clicks.len(), p.rows(Default::default()).len()),
                (most, most + 1)
            );
            assert!(x.clicks.iter().all(|c| c.url.is_empty()));
            assert_eq!(
                p.events(&IssueGates::default()).len(),
                2,
                "no rage-click issue without the click's own url"
            );
        }
        "many-long-clicks-and-taps" => {
            let most = recording::MAX_ROWS_PER_SEGMENT;
            assert_eq!((x.clicks.len(), x.taps.len()), (most, most));
        }
        "long-click-fields" => {
            let c = &x.clicks[0];
            assert!(
                c.selector.len() <= 1024
                    && c.url.len() <= 8 * 1024
                    && c.text.chars().count() == 1024
            );
            assert!(c.classes.iter().all(|class| class.len() <= 1024) && c.classes.len() == 10);
            assert!(x.truncated_values >= 20 * 13);
        }
        "deep-nesting-events" => assert_eq!((x.events, x.invalid_events), (2, 4)),
        "custom-events-of-tiny-values" => {
            let items = p.trace_items.as_ref().expect("items on");
            let unread = items.counts.dropped().collect::<Vec<_>>();
            assert_eq!(
                unread,
                [(recording::trace_items::Dropped::TooManyValues, 2)],
                "both events left unread, counted"
            );
        }
        "tiny-events" => assert_eq!(x.events, 1_500_000),
        "many-distinct-urls" => {
            let listed = x.urls.len() as u64;
            assert!(
                listed * 7000 <= recording::rrweb::MAX_LIST_BYTES as u64,
                "{listed} URLs listed"
            );
            assert_eq!((listed + x.dropped_items, x.truncated_values), (10_000, 0));
        }
        "many-interactions" => {
            let most = recording::MAX_ROWS_PER_SEGMENT;
            assert_eq!((x.clicks.len(), x.taps.len()), (most, most));
            assert!(x.dropped_items > 0);
            assert!(
                x.navigations.len() <= 1000
                    && x.requests.len() <= 1000
                    && x.multi_clicks.len() <= 1000
            );
        }
        "replay-event-huge-lists" => {
            let event = p.replay_event.as_ref().unwrap();
            assert_eq!(
                (
                    event.urls.len(),
                    event.error_ids.len(),
                    event.trace_ids.len()
                ),
                (100, 100, 100)
            );
            assert_eq!(event.tags.len(), recording::replay_event::MAX_TAGS);
            assert!(event.dropped_items >= 199_900 + 2 * 99_900 + 299_000);
        }
        "long-count-keys" => {
            for counts in [
                &x.breadcrumbs_by_category,
                &x.spans_by_op,
                &x.custom_by_tag,
                &x.console,
            ] {
                assert!(counts.len() <= recording::rrweb::MAX_DISTINCT_KEYS + 1);
            }
            assert!(x.truncated_values >= 4 * 70);
        }
        "zlib-padding" => assert!(p.blob.bytes.len() < 64, "the padding is not stored"),
        // Reserved by the message's size alone, 2.4 MB against a blob of 7.8.
        "far-repeats-gzip" | "far-repeats-zlib-with-video" => assert!(
            p.blob.bytes.len() > 5 << 20,
            "stored re-encoded, the blob is megabytes: {}",
            p.blob.bytes.len()
        ),
        other => panic!("no expectations for hostile message {other}"),
    }
}

/// JSON string contents: short or long, ASCII or not, sometimes with escapes.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z/.#:]{0,12}",
        "[a-zé€😀\\\\\"]{0,40}".prop_map(|s| s.replace('\\', "\\\\").replace('"', "\\\"")),
        (1usize..10_000).prop_map(|n| "u".repeat(n)),
    ]
}

/// One rrweb event of a kind the extractor keeps something of.
fn event() -> impl Strategy<Value = String> {
    let ts = 1_796_012_448_000u64;
    let crumb = move |category: &str, extra: String| {
        format!(
            r#"{{"type":5,"timestamp":{ts},"data":{{"tag":"breadcrumb","payload":{{"timestamp":1796012448.5,"category":"{category}"{extra}}}}}}}"#
        )
    };
    let span = move |op: String, description: String, data: &str| {
        format!(
            r#"{{"type":5,"timestamp":{ts},"data":{{"tag":"performanceSpan","payload":{{"op":"{op}","description":"{description}","startTimestamp":1796012448.5,"data":{data}}}}}}}"#
        )
    };
    prop_oneof![
        text().prop_map(move |href| format!(r#"{{"type":4,"timestamp":{ts},"data":{{"href":"{href}"}}}}"#)),
        (text(), text(), text(), any::<bool>(), 0u64..50).prop_map(move |(selector, class, url, has_url, node)| {
            let url = if has_url { format!(r#","url":"{url}""#) } else { String::new() };
            crumb(
                "ui.slowClickDetected",
                format!(
                    r#","message":"{selector}","data":{{"node":{{"id":{node},"tagName":"a","textContent":"{class}","attributes":{{"class":"{class} b c"}}}}{url},"timeAfterClickMs":7000,"endReason":"timeout","clickCount":6}}"#
                ),
            )
        }),
        (text(), text()).prop_map(move |(message, view)| crumb(
            "ui.tap",
            format!(r#","message":"{message}","data":{{"view.id":"{view}","view.class":"{view}"}}"#)
        )),
        text().prop_map(move |selector| crumb("ui.multiClick", format!(r#","message":"{selector}","data":{{"clickCount":3}}"#))),
        (text(), text()).prop_map(move |(from, to)| crumb("navigation", format!(r#","data":{{"from":"{from}","to":"{to}"}}"#))),
        prop::option::of(text()).prop_map(move |url| crumb(
            "replay.hydrate-error",
            url.map_or(String::new(), |u| format!(r#","data":{{"url":"{u}"}}"#))
        )),
        text().prop_map(move |level| crumb("console", format!(r#","level":"{level}""#))),
        text().prop_map(move |category| crumb(&category, String::new())),
        text().prop_map(move |url| span("navigation.push".into(), url, "{}")),
        (text(), text()).prop_map(move |(op, url)| span(format!("resource.{op}"), url, r#"{"method":"GET"}"#)),
        text().prop_map(move |url| span("resource.fetch".into(), url, r#"{"method":"POST","statusCode":200}"#)),
        (text(), text()).prop_map(move |(name, rating)| span("web-vital".into(), name, &format!(r#"{{"rating":"{rating}"}}"#))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Arbitrary event lists never exceed the bound, and the accounting stays exact.
    #[test]
    fn arbitrary_event_lists_stay_within_the_bound(
        events in prop::collection::vec(event(), 0..200),
        repeat in 1usize..10,
        urls in prop::collection::vec(text(), 0..50),
    ) {
        // Repeating the list multiplies references to the same pages and selectors.
        let body = format!("[{}]", vec![events.join(","); repeat].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(","));
        let replay_event = format!(r#"{{"urls":[{}],"tags":{{"a":"b"}}}}"#, urls.iter().map(|u| format!(r#""{u}""#)).collect::<Vec<_>>().join(","));
        assert_bounded("arbitrary", &crate::support::hostile::message(r#"{"segment_id":0}"#, body.as_bytes(), Some(replay_event.as_bytes())));
    }
}

#[test]
fn a_decompression_bomb_holds_at_most_one_output_buffer_of_the_caps_size() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/synthetic/zlib-bomb.msgpack");
    let m = measure(&std::fs::read(path).unwrap());
    assert_eq!(m.result.unwrap_err().reason, recording::Reason::TooLarge);
    let cap = recording::DEFAULT_MAX_DECOMPRESSED_BYTES;
    assert!(
        m.peak <= cap + cap / 2,
        "peak {} for a cap of {cap}",
        m.peak
    );
}

/// A zstd body whose repeats lie further apart than zlib's 32 KiB window: a 256 KiB string of
/// random characters, forty times. Stored re-encoded as zlib, its blob is about forty times what
/// the message weighs, and the processing window reserves for it what its frame declares it
/// decodes to, or the cap when the frame declares nothing (it reserved by size alone, a
/// fraction of what it held: a few dozen such messages in flight held gigabytes).
#[test]
fn a_zstd_body_of_far_repeats_is_reserved_for_what_it_decodes_to() {
    use std::io::Write;
    let json = crate::support::hostile::far_repeats(256 << 10, 40);
    for declared in [true, false] {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.include_contentsize(declared).unwrap();
        if declared {
            encoder
                .set_pledged_src_size(Some(json.len() as u64))
                .unwrap();
        }
        encoder.write_all(json.as_bytes()).unwrap();
        let body = encoder.finish().unwrap();
        let value = crate::support::hostile::message(r#"{"segment_id":0}"#, &body, None);
        let processed = assert_bounded(&format!("far repeats, declared: {declared}"), &value);
        assert!(
            processed.memory_bytes() > 10 * value.len(),
            "precondition: the blob is many times the message ({} bytes for {})",
            processed.memory_bytes(),
            value.len()
        );
        // An unknown key nested deeper than the window's quick look follows (the message still
        // processes): it reserves the worst case, not the size alone (which it did).
        let nested = with_nested_key(&value, 40);
        assert!(recording::process(&nested, &Limits::default()).is_ok());
        assert_bounded(
            &format!("far repeats behind a nested key, declared: {declared}"),
            &nested,
        );
    }
}

/// `value` (a msgpack fixmap) with one more key, `x`, holding `depth` nested one-element arrays.
fn with_nested_key(value: &[u8], depth: usize) -> Vec<u8> {
    let (&marker, rest) = value.split_first().unwrap();
    assert!(
        (0x80..0x8f).contains(&marker),
        "a fixmap with room for a key"
    );
    let mut nested = vec![marker + 1];
    nested.extend_from_slice(rest);
    nested.extend_from_slice(&[0xa1, b'x']);
    nested.extend(std::iter::repeat_n(0x91, depth));
    nested.push(0xc0);
    nested
}

/// A zstd bomb (200 MiB of spaces in a few KB) is refused holding at most one buffer of the
/// cap's size, whether its frame declares its size (refused before any decoding) or not (counted
/// through a small chunk first): decoded straight into a growing buffer, it held up to twice the
/// cap while the buffer doubled. (libzstd's decoder is not counted here: the unit test
/// `zstd_decoding_holds_no_window_or_at_most_8_mib_of_one` bounds it.)
#[test]
fn a_zstd_bomb_holds_at_most_one_output_buffer_of_the_caps_size() {
    use std::io::Write;
    let spaces = vec![b' '; 1 << 20];
    for declared in [true, false] {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        if declared {
            encoder.set_pledged_src_size(Some(200 << 20)).unwrap();
        }
        encoder.include_contentsize(declared).unwrap();
        (0..200).for_each(|_| encoder.write_all(&spaces).unwrap());
        let body = encoder.finish().unwrap();
        let value = crate::support::hostile::message(r#"{"segment_id":0}"#, &body, None);
        let m = measure(&value);
        assert_eq!(
            m.result.err().map(|e| e.reason),
            Some(recording::Reason::TooLarge),
            "declared: {declared}"
        );
        let cap = recording::DEFAULT_MAX_DECOMPRESSED_BYTES;
        assert!(
            m.peak <= cap + cap / 2,
            "declared: {declared}: peak {} for a cap of {cap}",
            m.peak
        );
    }
}

/// A body that decodes to 90 MiB and then fails its check — a zlib stream whose Adler-32 is off
/// by one bit, a gzip stream whose CRC is — is refused holding at most one buffer of its output:
/// libdeflate's is freed before the streaming decoder gives its verdict (it held both, about
/// twice the cap per processing thread, for a message refused anyway).
#[test]
fn a_body_whose_check_fails_after_decoding_holds_one_output_buffer() {
    use std::io::Write;
    let spaces = vec![b' '; 1 << 20];
    let zlib = {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        (0..90).for_each(|_| encoder.write_all(&spaces).unwrap());
        encoder.finish().unwrap()
    };
    let gzip = {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        (0..90).for_each(|_| encoder.write_all(&spaces).unwrap());
        encoder.finish().unwrap()
    };
    drop(spaces);
    // The zlib trailer's last byte; the gzip trailer's CRC-32 comes before its 4-byte length.
    for (name, mut body, check) in [("zlib", zlib, 1), ("gzip", gzip, 5)] {
        let at = body.len() - check;
        body[at] ^= 1;
        let value = crate::support::hostile::message(r#"{"segment_id":0}"#, &body, None);
        let m = measure(&value);
        let reason = m.result.err().map(|e| e.reason);
        assert_eq!(reason, Some(recording::Reason::InvalidBody), "{name}");
        let output = 90 << 20;
        assert!(
            m.peak <= output + output / 2,
            "{name}: peak {} for an output of {output}",
            m.peak
        );
    }
}
