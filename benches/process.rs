//! Per-message throughput of the recording core on the recorded fixture mix, in MB/s of
//! decompressed rrweb JSON on one core, next to baselines on the same data:
//! - `inflate_only`: streaming zlib-rs decompression alone (the decoder before libdeflate);
//! - `libdeflate_only`: libdeflate whole-buffer decompression alone into a reused buffer — the
//!   floor any implementation pays, and the decoder `process` uses;
//! - `sonic_lazy`: libdeflate + UTF-8 check + sonic-rs's lazy iterators walking the same
//!   structure the scanner walks (each event's keys, `type` read, the rest skipped) — the
//!   off-the-shelf alternative to the hand-written scanner, doing less than `process`;
//! - `inflate_sonic_value`: decompression + a full sonic-rs DOM parse;
//! - `inflate_serde_json_value`: decompression + a full `serde_json::Value` parse;
//! - `process`: the whole per-message work (msgpack, header, inflate, UTF-8 check, rrweb scan,
//!   blob, and the rows and events the flush builds from the result).
//!
//! Run: `cargo bench --bench process`.

use std::hint::black_box;
use std::path::Path;

use std::io::Read;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use replay_ingest::recording::{self, Inflater, Limits, Rollout, envelope, payload};

/// The service's allocator (src/main.rs): the work is measured as the service does it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Fixture {
    /// As the service holds a message: a blob stored as received shares it.
    value: bytes::Bytes,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/segments");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| Fixture {
            value: std::fs::read(p).unwrap().into(),
        })
        .collect()
}

fn body(value: &[u8]) -> &[u8] {
    payload::split(envelope::decode(value).unwrap().payload)
        .unwrap()
        .body
}

/// The streaming zlib-rs decoder, as `process` used before libdeflate.
fn inflate(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(body(value))
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn bench(c: &mut Criterion) {
    let fixtures = fixtures();
    let json_bytes: u64 = fixtures
        .iter()
        .map(|f| inflate(&f.value).len() as u64)
        .sum();
    let limits = Limits::default();

    let mut group = c.benchmark_group("fixture_mix");
    group.throughput(Throughput::Bytes(json_bytes));
    group.sample_size(30);
    group.bench_function("inflate_only", |b| {
        b.iter(|| {
            for f in &fixtures {
                black_box(inflate(&f.value));
            }
        })
    });
    let mut out = vec![0u8; 64 << 20];
    let mut libdeflate = libdeflater::Decompressor::new();
    group.bench_function("libdeflate_only", |b| {
        b.iter(|| {
            for f in &fixtures {
                black_box(
                    libdeflate
                        .zlib_decompress(body(&f.value), &mut out)
                        .unwrap(),
                );
            }
        })
    });
    group.bench_function("sonic_lazy", |b| {
        b.iter(|| {
            let mut types = 0u64;
            for f in &fixtures {
                let len = libdeflate
                    .zlib_decompress(body(&f.value), &mut out)
                    .unwrap();
                let json = simdutf8::basic::from_utf8(&out[..len]).unwrap();
                for event in sonic_rs::to_array_iter(json) {
                    for pair in sonic_rs::to_object_iter(event.unwrap().as_raw_str()) {
                        let (key, value) = pair.unwrap();
                        if key.as_ref() == "type" {
                            types += value.as_raw_str().len() as u64;
                        }
                    }
                }
            }
            black_box(types)
        })
    });
    group.bench_function("inflate_sonic_value", |b| {
        b.iter(|| {
            for f in &fixtures {
                let json = inflate(&f.value);
                black_box(sonic_rs::from_slice::<sonic_rs::Value>(&json).unwrap());
            }
        })
    });
    group.bench_function("inflate_serde_json_value", |b| {
        b.iter(|| {
            for f in &fixtures {
                let json = inflate(&f.value);
                black_box(serde_json::from_slice::<serde_json::Value>(&json).unwrap());
            }
        })
    });
    let mut inflater = Inflater::default();
    // `process` with the EAP trace items off (the default) and with every breadcrumb an item.
    let with_items = Limits {
        trace_items: Rollout::ALL,
        ..limits
    };
    for (name, limits) in [("process", &limits), ("process_trace_items", &with_items)] {
        group.bench_function(name, |b| {
            b.iter(|| process_all(fixtures.iter(), limits, &mut inflater))
        });
    }
    group.finish();

    // Small segments (under 64 KiB on the wire: most of real traffic) are dominated by per-message
    // costs, not by bytes: reported per message.
    let small: Vec<&Fixture> = fixtures
        .iter()
        .filter(|f| f.value.len() < 64 * 1024)
        .collect();
    let mut group = c.benchmark_group("small_segments");
    group.throughput(Throughput::Elements(small.len() as u64));
    group.sample_size(30);
    for (name, limits) in [("process", &limits), ("process_trace_items", &with_items)] {
        group.bench_function(name, |b| {
            b.iter(|| process_all(small.iter().copied(), limits, &mut inflater))
        });
    }
    group.finish();
}

/// Processes every fixture and builds its rows and events, as the pipeline and the sinks do.
fn process_all<'a>(
    fixtures: impl Iterator<Item = &'a Fixture>,
    limits: &Limits,
    inflater: &mut Inflater,
) {
    for f in fixtures {
        let processed = recording::process_with(&f.value, limits, inflater).unwrap();
        black_box((
            processed.rows(Default::default()),
            processed.events(&Default::default()),
            processed,
        ));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
