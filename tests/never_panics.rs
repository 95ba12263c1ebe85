//! Property tests over the decode entry point: whatever the bytes, `process` returns — it never
//! panics, and rejects with a classified reason.

#[path = "common/hostile.rs"]
#[allow(dead_code)]
mod hostile;

use proptest::prelude::*;
use replay_ingest::recording::{self, Limits};

fn limits() -> Limits {
    Limits { max_decompressed_bytes: 1 << 20, ..Limits::default() }
}

fn seed_fixtures() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    [
        "segments/interactions-0",
        "segments/rage-click-1",
        "segments/network-0",
        "synthetic/mobile-taps-video",
        "synthetic/raw-json-body",
    ]
    .iter()
    .map(|name| std::fs::read(dir.join(format!("{name}.msgpack"))).unwrap())
    .collect()
}

/// JSON-ish text built from rrweb-like fragments, to reach deep into the extractor.
fn rrweb_like() -> impl Strategy<Value = String> {
    let fragment = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"type\"",
        "\"data\"",
        "\"timestamp\"",
        "\"tag\"",
        "\"breadcrumb\"",
        "\"payload\"",
        "\"category\"",
        "\"ui.click\"",
        "\"ui.slowClickDetected\"",
        "\"node\"",
        "\"id\"",
        "5",
        "3",
        "-1",
        "1.5e3",
        "1796012448690",
        "null",
        "true",
        "\"performanceSpan\"",
        "\"op\"",
        "\"resource.fetch\"",
        "\"source\"",
        "\"\\u00e9\\\"\"",
        "\"attributes\"",
        "\"tagName\"",
        "\"a\"",
        "\"clickCount\"",
    ]);
    prop::collection::vec(fragment, 0..80).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = recording::process(&bytes, &limits());
    }

    #[test]
    fn arbitrary_payloads_in_a_valid_envelope_never_panic(payload in prop::collection::vec(any::<u8>(), 0..2048)) {
        let result = recording::process(&hostile::value(&payload, None), &limits());
        prop_assert!(result.is_ok() || !result.unwrap_err().detail.is_empty());
    }

    #[test]
    fn rrweb_like_bodies_never_panic(body in rrweb_like()) {
        let payload = format!("{{\"segment_id\":1}}\n[{body}]");
        let _ = recording::process(&hostile::value(payload.as_bytes(), None), &limits());
    }

    #[test]
    fn corrupted_real_messages_never_panic(
        which in 0usize..5,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut value = seed_fixtures().swap_remove(which);
        for (at, byte) in flips {
            let i = at.index(value.len());
            value[i] ^= byte | 1;
        }
        let _ = recording::process(&value, &limits());
        let _ = recording::process(&value[..cut.index(value.len())], &limits());
    }
}
