//! The work itself, for the load run's CPU ratio: `recording::process` on one thread over COUNT
//! messages of the same mix the load run produced (the files in turn, as `produce` sends them),
//! building each one's rows and events and dropping it, with the service's allocator. Measured
//! right beside the service's run, so that both see the machine at the same speed. Prints one
//! JSON line: messages and the CPU seconds they took (after one untimed pass over the files).
//!
//! Usage: process_cpu COUNT FILE…

use replay_ingest::recording::{self, Inflater, Limits};

/// The service's allocator (src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some((count, files)) = args.get(1).zip(args.get(2..).filter(|f| !f.is_empty())) else {
        eprintln!("usage: process_cpu COUNT FILE…");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("COUNT is a number");
    let values: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).unwrap_or_else(|e| panic!("reading {f}: {e}")))
        .collect();
    let (limits, mut inflater) = (Limits::default(), Inflater::default());
    let mut process = |value: &[u8]| {
        if let Ok(processed) = recording::process_with(value, &limits, &mut inflater) {
            std::hint::black_box((
                processed.rows(Default::default()),
                processed.events(&Default::default()),
                processed,
            ));
        }
    };
    values.iter().for_each(|v| process(v));
    let start = cpu_seconds();
    for value in values.iter().cycle().take(count) {
        process(value);
    }
    println!(
        "{{\"messages\":{count},\"cpu_seconds\":{}}}",
        cpu_seconds() - start
    );
}

/// User + system CPU of this process, to the microsecond.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
