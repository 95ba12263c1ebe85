//! Writes `fixtures/synthetic/*.msgpack`: hostile and unusual message values derived from a real
//! recorded segment (`fixtures/segments/dead-click-0.msgpack`), plus a mobile segment with taps and
//! video that the browser SDK cannot record.
//!
//! Run: `cargo run --example make_synthetic_fixtures` (deterministic; commit the output).

use std::io::Write;
use std::path::Path;

use flate2::Compression;
use flate2::write::{GzEncoder, ZlibEncoder};
use replay_ingest::recording::{envelope, payload};
use serde::Serialize;

#[derive(Serialize, Clone)]
struct Message {
    #[serde(rename = "type")]
    kind: String,
    replay_id: String,
    key_id: Option<u64>,
    org_id: u64,
    project_id: u64,
    received: u64,
    retention_days: u16,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    #[serde(with = "serde_bytes")]
    replay_event: Option<Vec<u8>>,
    #[serde(with = "serde_bytes")]
    replay_video: Option<Vec<u8>>,
    version: i64,
    relay_snuba_publish_disabled: bool,
}

impl Message {
    fn with_payload(&self, header: &str, body: &[u8]) -> Message {
        Message {
            payload: [header.as_bytes(), b"\n", body].concat(),
            ..self.clone()
        }
    }
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(Vec::new(), Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let out = root.join("synthetic");
    std::fs::create_dir_all(&out).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(out.join(format!("{name}.msgpack")), bytes).unwrap();
        println!("wrote {name}.msgpack ({} bytes)", bytes.len());
    };
    let encode = |m: &Message| rmp_serde::to_vec_named(m).unwrap();

    let real = std::fs::read(root.join("segments/dead-click-0.msgpack")).unwrap();
    let env = envelope::decode(&real).unwrap();
    let split = payload::split(env.payload).unwrap();
    let mut inflater = payload::Inflater::default();
    let json = payload::decompress(&split, 1 << 30, &mut inflater)
        .unwrap()
        .into_owned();
    let base = Message {
        kind: "replay_recording_not_chunked".into(),
        replay_id: env.replay_id.into(),
        key_id: env.key_id,
        org_id: env.org_id,
        project_id: env.project_id,
        received: env.received,
        retention_days: env.retention_days,
        payload: env.payload.to_vec(),
        replay_event: env.replay_event.map(<[u8]>::to_vec),
        replay_video: None,
        version: 0,
        relay_snuba_publish_disabled: true,
    };
    let header = "{\"segment_id\":0}";

    // Invalid envelopes.
    let full = encode(&base);
    write("bad-msgpack", &full[..full.len() / 3]);
    write("not-a-map", &rmp_serde::to_vec(&base).unwrap());
    write(
        "wrong-type",
        &encode(&Message {
            kind: "replay_recording".into(),
            ..base.clone()
        }),
    );
    write(
        "bad-replay-id",
        &encode(&Message {
            replay_id: "d9923410-7707-4a45-2fb7-80b1bacaf6d0".into(),
            ..base.clone()
        }),
    );
    write(
        "invalid-replay-event",
        &encode(&Message {
            replay_event: Some(b"{\"urls\": [".to_vec()),
            ..base.clone()
        }),
    );

    // Invalid payloads.
    write(
        "missing-header",
        &encode(&Message {
            payload: b"[{\"type\":0,\"data\":{},\"timestamp\":1}]".to_vec(),
            ..base.clone()
        }),
    );
    write(
        "malformed-header",
        &encode(&base.with_payload("{\"segment_id\":\"zero\"}", &zlib(&json))),
    );
    let mut corrupt = zlib(&json);
    let mid = corrupt.len() / 2;
    corrupt[mid..mid + 8].copy_from_slice(b"\xff\x00\xff\x00\xff\x00\xff\x00");
    write(
        "corrupt-zlib",
        &encode(&base.with_payload(header, &corrupt)),
    );
    let compressed = zlib(&json);
    write(
        "truncated-zlib",
        &encode(&base.with_payload(header, &compressed[..compressed.len() * 2 / 3])),
    );
    // 101 MiB of JSON whitespace inside an array: over the 100 MiB default cap, ~100 KiB on the wire.
    let mut bomb = vec![b' '; 101 << 20];
    bomb[0] = b'[';
    *bomb.last_mut().unwrap() = b']';
    write(
        "zlib-bomb",
        &encode(&base.with_payload(header, &zlib(&bomb))),
    );
    write(
        "body-not-an-array",
        &encode(&base.with_payload(header, &zlib(b"{\"type\":2}"))),
    );

    // Valid, unusual encodings of the same segment.
    write("raw-json-body", &encode(&base.with_payload(header, &json)));
    write(
        "gzip-body",
        &encode(&base.with_payload(header, &gzip(&json))),
    );
    write(
        "zstd-body",
        &encode(&base.with_payload(header, &zstd::encode_all(json.as_slice(), 3).unwrap())),
    );

    // Valid segment with malformed events among good ones: each is skipped and counted.
    let text = String::from_utf8(json.clone()).unwrap();
    let malformed = [
        "42",
        "\"not an event\"",
        "{\"type\":\"three\",\"timestamp\":1796012440000,\"data\":{}}",
        "{\"type\":3,\"data\":{\"positions\":[]},\"timestamp\":1796012440000}",
        "{\"type\":5,\"timestamp\":1796012440000,\"data\":{\"tag\":\"breadcrumb\",\"payload\":{\"category\":7}}}",
        "{\"type\":4,\"data\":{\"href\":\"https://example.com/\"}}",
    ];
    let mixed = format!("[{},{}", malformed.join(","), &text[1..]);
    write(
        "malformed-events",
        &encode(&base.with_payload(header, &zlib(mixed.as_bytes()))),
    );

    // A mobile segment: taps, a video, no DOM.
    let mobile_events = br#"[
{"type":4,"data":{"href":"MainActivity","width":1080,"height":2400},"timestamp":1796012500000},
{"type":5,"timestamp":1796012501000,"data":{"tag":"breadcrumb","payload":{"timestamp":1796012501.25,"type":"default","category":"ui.tap","message":"Checkout button","data":{"view.class":"android.widget.Button","view.id":"checkout_button"}}}},
{"type":5,"timestamp":1796012502000,"data":{"tag":"breadcrumb","payload":{"timestamp":1796012502.5,"type":"default","category":"ui.tap","message":"Back","data":{"view.class":"android.widget.ImageButton","view.id":"back"}}}},
{"type":5,"timestamp":1796012503000,"data":{"tag":"breadcrumb","payload":{"timestamp":1796012503.0,"type":"default","category":"navigation","data":{"from":"MainActivity","to":"CartActivity"}}}},
{"type":5,"timestamp":1796012503500,"data":{"tag":"breadcrumb","payload":{"timestamp":1796012503.5,"type":"default","category":"device.orientation","data":{"position":"landscape"}}}},
{"type":5,"timestamp":1796012504000,"data":{"tag":"video","payload":{"segmentId":0,"size":4096,"duration":5000,"encoding":"h264","container":"mp4","height":2400,"width":1080,"frameCount":5,"frameRate":1}}}
]"#;
    let mobile = Message {
        replay_id: "5b0e3f8f0a5e4d0f9f4c7e5a1d2c3b4a".into(),
        replay_event: Some(
            br#"{"type":"replay_event","replay_id":"5b0e3f8f0a5e4d0f9f4c7e5a1d2c3b4a","segment_id":0,"timestamp":1796012504.0,"replay_start_timestamp":1796012500.0,"urls":["MainActivity"],"error_ids":[],"trace_ids":["8f2e1d0c9b8a4f7e6d5c4b3a29181716"],"replay_type":"session","platform":"android","environment":"production","release":"shop@2.3.1","sdk":{"name":"sentry.java.android","version":"8.1.0"},"user":{"id":"u-1"},"contexts":{"os":{"name":"Android","version":"15"},"device":{"name":"Pixel 9","brand":"google","family":"Pixel","model":"Pixel 9"}},"tags":[["plan","pro"]]}"#
                .to_vec(),
        ),
        replay_video: Some((0..4096u32).map(|i| (i % 251) as u8).collect()),
        ..base.with_payload(header, &zlib(mobile_events))
    };
    write("mobile-taps-video", &encode(&mobile));
}
