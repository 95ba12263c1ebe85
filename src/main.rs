//! The `replay-ingest` command line: `consume` (the service), `produce` (load), `inspect`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rayon::prelude::*;
use rdkafka::producer::FutureProducer;
use tracing::{error, info};

use replay_ingest::config::{BlobSinkKind, ConsumeArgs, KafkaArgs, LimitArgs, producer_properties};
use replay_ingest::health::{self, Status};
use replay_ingest::inspect;
use replay_ingest::kafka::{client_config, load};
use replay_ingest::pipeline::{self, flush::Sinks};
use replay_ingest::recording::Limits;
use replay_ingest::sink::{Sink, dlq::DlqSink, filesystem::FilesystemBlobSink, null::NullSink};

#[derive(Parser)]
#[command(version, about = "Ingests session-replay recording segments.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: consume, process, buffer, flush, commit. Exits 0 after a clean drain on
    /// SIGTERM/SIGINT, non-zero when a flush cannot complete (nothing past it is committed).
    Consume(Box<ConsumeArgs>),
    /// Publish message values (fixture files) to a topic, each copy with a fresh replay id, and
    /// print a JSON summary (messages, bytes, seconds, last offset per partition).
    Produce {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[arg(long, env = "REPLAY_INGEST_TOPIC", default_value = "ingest-replay-recordings")]
        topic: String,
        /// Messages to publish, cycling through the files.
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Inspect { files, limits } = &cli.command {
        return run_inspect(files, &(*limits).into());
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Consume(args) => run_consume(*args).await,
            Command::Produce { kafka, topic, count, files } => run_produce(&kafka, &topic, count, &files).await,
            Command::Inspect { .. } => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn producer(kafka: &KafkaArgs, max_message_bytes: usize) -> anyhow::Result<FutureProducer> {
    client_config(&kafka.brokers, &producer_properties(max_message_bytes), &kafka.properties)
        .create()
        .context("creating the Kafka producer")
}

async fn run_consume(args: ConsumeArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let blobs: Box<dyn Sink> = match args.blob_sink {
        BlobSinkKind::Null => Box::new(NullSink),
        BlobSinkKind::Filesystem => Box::new(
            FilesystemBlobSink::new(&args.blob_dir)
                .with_context(|| format!("blob directory {}", args.blob_dir.display()))?,
        ),
    };
    let dlq = DlqSink::new(producer(&args.kafka, args.max_message_bytes)?, &args.dlq_topic);
    let sinks = Sinks { stages: vec![vec![blobs, Box::new(dlq)]] };

    let status = Arc::new(Status::default());
    let listener = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("binding the health endpoint on {}", args.http_listen))?;
    info!(listen = %args.http_listen, topic = %args.topic, group = %args.group_id, "starting");
    tokio::spawn(health::serve(listener, status.clone()));
    pipeline::consume(&args, sinks, status, shutdown_signal()).await?;
    info!("stopped cleanly");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

async fn run_produce(kafka: &KafkaArgs, topic: &str, count: u64, files: &[PathBuf]) -> anyhow::Result<()> {
    let values = files
        .iter()
        .map(|f| std::fs::read(f).with_context(|| format!("reading {}", f.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let max = values.iter().map(Vec::len).max().unwrap_or(0);
    let report = load::produce(&producer(kafka, max)?, topic, count, |i| load::fixture_copy(&values, i)).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
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
