//! The work itself, for the load run's CPU ratio: `recording::process` on one thread over COUNT
//! messages of the same mix the load run produced (the files in turn, as `produce` sends them),
//! with the service's allocator. Half the messages are only processed, as the service with null
//! sinks does; the other half also have their rows and events built, as real sinks do in a flush
//! (and criterion's `process` does). The halves alternate in chunks of a few milliseconds, so that
//! both see the machine at the same speed. Prints one JSON line: messages, and the CPU µs per
//! message of each (after one untimed pass over the files).
//!
//! With `--vs-libdeflate`, `process` against inflating the same bodies alone with libdeflate (the
//! floor), interleaved: ROUNDS rounds, each timing passes of both, in alternating order. Each
//! round's ratio sees the machine at one speed, where two criterion benchmarks run seconds apart
//! do not. Prints the ratio's median and quartiles, and both rates in MiB/s of decompressed JSON.
//!
//! With `--held`, what holding results until a flush costs: `process` over runs of 2 × HOLD
//! messages, each result freed at once against results kept HOLD at a time and then freed, as the
//! buffer keeps them (its default is 1 000 messages; one more buffer is held while it flushes).
//! [`HELD_PAIRS`] pairs of runs, in alternating order. Prints the held/at-once ratio's median and
//! quartiles, and page faults per message each way.
//!
//! Breadcrumbs become trace items at the service's rollout, `REPLAY_INGEST_TRACE_ITEMS_ROLLOUT`
//! (off when unset).
//!
//! Usage: process_cpu COUNT FILE…
//!        process_cpu --vs-libdeflate ROUNDS FILE…
//!        process_cpu --held HOLD FILE…

use replay_ingest::recording::{self, Inflater, Limits, envelope, payload};

/// Passes over the files per side of a round: about 20 ms each on the recorded mix.
const PASSES_PER_ROUND: usize = 8;

/// CPU seconds a chunk of one half lasts, about (whole passes over the files).
const CHUNK_SECONDS: f64 = 0.02;

/// Pairs of runs `--held` times.
const HELD_PAIRS: usize = 30;

/// The service's allocator (src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).filter(|a| a.starts_with("--")).cloned();
    let args = args.get(usize::from(mode.is_some())..).unwrap_or_default();
    let Some((count, files)) = args.get(1).zip(args.get(2..).filter(|f| !f.is_empty())) else {
        eprintln!(
            "usage: process_cpu COUNT FILE… | process_cpu --vs-libdeflate ROUNDS FILE… | process_cpu --held HOLD FILE…"
        );
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("COUNT (ROUNDS) is a number");
    // As the service holds a message: a blob stored as received shares it.
    let values: Vec<bytes::Bytes> = files
        .iter()
        .map(|f| {
            std::fs::read(f)
                .unwrap_or_else(|e| panic!("reading {f}: {e}"))
                .into()
        })
        .collect();
    let limits = Limits {
        trace_items: std::env::var("REPLAY_INGEST_TRACE_ITEMS_ROLLOUT")
            .map(|share| {
                share
                    .parse()
                    .ok()
                    .and_then(recording::Rollout::new)
                    .expect("REPLAY_INGEST_TRACE_ITEMS_ROLLOUT is a share from 0.0 to 1.0")
            })
            .unwrap_or(recording::Rollout::OFF),
        ..Limits::default()
    };
    let mut inflater = Inflater::default();
    let mut process = |value: &bytes::Bytes, outputs: bool| {
        if let Ok(processed) = recording::process_with(value, &limits, &mut inflater) {
            if outputs {
                std::hint::black_box((
                    processed.rows(Default::default()),
                    processed.events(&Default::default()),
                ));
            }
            std::hint::black_box(processed);
        }
    };
    let start = cpu_seconds();
    values.iter().for_each(|v| process(v, true));
    let pass_seconds = cpu_seconds() - start;
    match mode.as_deref() {
        Some("--vs-libdeflate") => return vs_libdeflate(count, &values, |v| process(v, true)),
        Some("--held") => return held(count, &values, &limits, &mut inflater),
        Some(other) => panic!("unknown mode {other}"),
        None => {}
    }
    // [only processed, with outputs]: CPU seconds and messages.
    let (mut seconds, mut messages) = ([0.0; 2], [0usize; 2]);
    let mut sent = values.iter().cycle();
    let chunk = (values.len() * ((CHUNK_SECONDS / pass_seconds.max(1e-6)) as usize).max(1))
        .min(count.div_ceil(2))
        .max(1);
    for i in 0..count.div_ceil(chunk) {
        let (side, n) = (i % 2, chunk.min(count - i * chunk));
        let start = cpu_seconds();
        sent.by_ref()
            .take(n)
            .for_each(|value| process(value, side == 1));
        seconds[side] += cpu_seconds() - start;
        messages[side] += n;
    }
    let us = |side: usize| seconds[side] / messages[side].max(1) as f64 * 1e6;
    println!(
        "{{\"messages\":{count},\"process_us\":{:.3},\"with_outputs_us\":{:.3}}}",
        us(0),
        us(1)
    );
}

/// `--vs-libdeflate`: `rounds` interleaved rounds of `process` and libdeflate alone.
fn vs_libdeflate(rounds: usize, values: &[bytes::Bytes], mut process: impl FnMut(&bytes::Bytes)) {
    let bodies: Vec<&[u8]> = values
        .iter()
        .map(|v| {
            let envelope = envelope::decode(v).expect("a recording envelope");
            payload::split(envelope.payload).expect("a payload").body
        })
        .collect();
    let mut decompressor = libdeflater::Decompressor::new();
    let mut out = vec![0u8; 64 << 20];
    let mut inflate = || {
        bodies
            .iter()
            .map(|body| {
                decompressor
                    .zlib_decompress(body, &mut out)
                    .expect("a zlib body")
            })
            .sum::<usize>()
    };
    let json_bytes = inflate() as f64;
    let timed = |side: &mut dyn FnMut()| {
        let start = cpu_seconds();
        (0..PASSES_PER_ROUND).for_each(|_| side());
        cpu_seconds() - start
    };
    let (mut ratios, mut inflate_s, mut process_s) = (Vec::new(), 0.0, 0.0);
    for round in 0..rounds {
        let mut inflating = || {
            std::hint::black_box(inflate());
        };
        let mut processing = || values.iter().for_each(&mut process);
        let (i, p) = if round % 2 == 0 {
            let i = timed(&mut inflating);
            (i, timed(&mut processing))
        } else {
            let p = timed(&mut processing);
            (timed(&mut inflating), p)
        };
        ratios.push(i / p);
        (inflate_s, process_s) = (inflate_s + i, process_s + p);
    }
    let mib_s =
        |seconds: f64| json_bytes * (rounds * PASSES_PER_ROUND) as f64 / seconds / 2f64.powi(20);
    println!(
        "{{\"rounds\":{rounds},{},\"process_mib_s\":{:.0},\"libdeflate_mib_s\":{:.0}}}",
        quartiles(ratios),
        mib_s(process_s),
        mib_s(inflate_s)
    );
}

/// `--held`: `process` freeing each result at once against holding `hold` results at a time.
fn held(hold: usize, values: &[bytes::Bytes], limits: &Limits, inflater: &mut Inflater) {
    let messages = 2 * hold.max(1);
    // CPU seconds and page faults of one run.
    let mut run = |held: bool| {
        let (start, faults) = (cpu_seconds(), page_faults());
        let mut kept = Vec::with_capacity(hold);
        for value in values.iter().cycle().take(messages) {
            if let Ok(processed) = recording::process_with(value, limits, inflater) {
                if held {
                    kept.push(processed);
                    if kept.len() >= hold {
                        kept.clear();
                    }
                } else {
                    std::hint::black_box(processed);
                }
            }
        }
        drop(kept);
        (cpu_seconds() - start, page_faults() - faults)
    };
    let (mut ratios, mut faults) = (Vec::new(), [0; 2]);
    for pair in 0..HELD_PAIRS {
        let (at_once, held) = if pair % 2 == 0 {
            let at_once = run(false);
            (at_once, run(true))
        } else {
            let held = run(true);
            (run(false), held)
        };
        ratios.push(held.0 / at_once.0);
        faults[0] += at_once.1;
        faults[1] += held.1;
    }
    let per_message = |f: i64| f as f64 / (HELD_PAIRS * messages) as f64;
    println!(
        "{{\"hold\":{hold},{},\"faults_per_message_at_once\":{:.3},\"faults_per_message_held\":{:.3}}}",
        quartiles(ratios),
        per_message(faults[0]),
        per_message(faults[1])
    );
}

/// The median and quartiles of `ratios`, as JSON members.
fn quartiles(mut ratios: Vec<f64>) -> String {
    ratios.sort_by(f64::total_cmp);
    let quantile = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    format!(
        "\"ratio_median\":{:.3},\"ratio_p25\":{:.3},\"ratio_p75\":{:.3}",
        quantile(0.5),
        quantile(0.25),
        quantile(0.75)
    )
}

/// Minor page faults of this process so far.
fn page_faults() -> i64 {
    rusage().ru_minflt
}

/// User + system CPU of this process, to the microsecond.
fn cpu_seconds() -> f64 {
    let usage = rusage();
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn rusage() -> libc::rusage {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    }
}
