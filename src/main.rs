//! The `replay-ingest` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use rayon::prelude::*;

use replay_ingest::inspect;
use replay_ingest::recording::{DEFAULT_MAX_DECOMPRESSED_BYTES, Limits, RowLimits};

#[derive(Parser)]
#[command(version, about = "Ingests session-replay recording segments.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print, one JSON line per file, what the service extracts from raw Kafka message values
    /// (msgpack). Invalid messages are reported with their reason; the exit code is non-zero only
    /// when a file cannot be read.
    Inspect {
        /// Files holding one raw message value each.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

/// Per-message processing limits.
#[derive(Args, Clone, Copy)]
struct LimitArgs {
    /// Largest decompressed segment body, in bytes. Larger bodies are rejected as `too_large`
    /// (never truncated). Bounds the memory one message can take while it is processed.
    #[arg(long, env = "REPLAY_INGEST_MAX_DECOMPRESSED_BYTES", default_value_t = DEFAULT_MAX_DECOMPRESSED_BYTES)]
    max_decompressed_bytes: usize,
    /// Most click rows written per segment; further clicks are counted but not stored.
    #[arg(long, env = "REPLAY_INGEST_MAX_CLICKS_PER_SEGMENT", default_value_t = RowLimits::default().max_clicks)]
    max_clicks_per_segment: usize,
    /// Most tap rows written per segment.
    #[arg(long, env = "REPLAY_INGEST_MAX_TAPS_PER_SEGMENT", default_value_t = RowLimits::default().max_taps)]
    max_taps_per_segment: usize,
}

impl From<LimitArgs> for Limits {
    fn from(args: LimitArgs) -> Self {
        Limits {
            max_decompressed_bytes: args.max_decompressed_bytes,
            rows: RowLimits { max_clicks: args.max_clicks_per_segment, max_taps: args.max_taps_per_segment },
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Inspect { files, limits } => run_inspect(&files, &limits.into()),
    }
}

fn run_inspect(files: &[PathBuf], limits: &Limits) -> ExitCode {
    // Files are processed in parallel; lines are printed in argument order.
    let lines: Vec<Result<String, String>> = files
        .par_iter()
        .map(|path| {
            let name = path.display().to_string();
            std::fs::read(path).map(|value| inspect::inspect(&name, &value, limits)).map_err(|e| format!("{name}: {e}"))
        })
        .collect();
    let mut stdout = std::io::stdout().lock();
    let mut unreadable = false;
    for line in lines {
        match line {
            Ok(line) => {
                if writeln!(stdout, "{line}").is_err() {
                    return ExitCode::FAILURE;
                }
            }
            Err(error) => {
                eprintln!("replay-ingest inspect: cannot read {error}");
                unreadable = true;
            }
        }
    }
    if unreadable { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
