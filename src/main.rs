//! The `replay-ingest` command line: `consume` (the service), `migrate`, `inspect`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rayon::prelude::*;
use rdkafka::producer::FutureProducer;
use tracing::{error, info, warn};

use replay_ingest::config::{
    BlobSinkKind, ClickHouseArgs, ConsumeArgs, EventsSinkKind, KafkaArgs, LimitArgs, RowsSinkKind,
    producer_properties,
};
use replay_ingest::health::{self, Status};
use replay_ingest::inspect;
use replay_ingest::kafka::refetch::Refetcher;
use replay_ingest::pipeline::{self, flush::Sinks};
use replay_ingest::recording::Limits;
use replay_ingest::sink::clickhouse::{self, ClickHouseSink};
use replay_ingest::sink::dlq::{DlqSink, RejectedToDlq};
use replay_ingest::sink::events::{EventTopics, EventsSink};
use replay_ingest::sink::gcs::{GcsConfig, GcsSink};
use replay_ingest::sink::publish;
use replay_ingest::sink::snuba::SnubaSink;
use replay_ingest::sink::{
    ObjectStore, Retry, Sink, SinkError, filesystem::FilesystemBlobSink, null::NullSink,
};
use replay_ingest::startup::{self, Gated};

#[derive(Parser)]
#[command(version, about = "Ingests session-replay recording segments.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as `text` (for people) or `json` (one object per line, for log pipelines:
    /// `timestamp`, `level`, `target`, `message` and the event's fields at the top level).
    #[arg(long, global = true, env = "REPLAY_INGEST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
fn init_logs(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: consume, process, buffer, flush, commit. Exits 0 after a clean drain on
    /// SIGTERM/SIGINT, non-zero when a flush cannot complete (nothing past it is committed).
    Consume(Box<ConsumeArgs>),
    /// Create or migrate the ClickHouse table for the server's version, then exit.
    Migrate(ClickHouseArgs),
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
        return run_inspect(files, &limits.limits(false));
    }
    init_logs(cli.log_format);
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
            Command::Migrate(args) => {
                args.validate()?;
                // Migrations are DDL: no write-attempt deadline applies.
                let config =
                    args.config(std::time::Duration::from_secs(600)).context("reading --clickhouse-password-file")?;
                let features = clickhouse::migrate(&config)
                    .await
                    .map_err(|e| clickhouse::setup_error(&e, &config))
                    .context("migrating ClickHouse")?;
                info!(?features, database = %config.database, table = %config.table, "ClickHouse table ready");
                Ok(())
            }
            Command::Inspect { .. } => Ok(()),
        }
    });
    // Work still running now (a flush retrying against a sink that is down, a consumer close
    // stuck on an unreachable broker) must not hold up the exit: everything durable has been
    // committed already, and the drain deadline, which the chart's grace period counts on, is
    // spent.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{}", said_once(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each cause only if the text so far does not already say it (a
/// sink's message often repeats its client's error, which is also its source).
fn said_once(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let said = cause.to_string();
        if !text.contains(&said) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&said);
        }
    }
    text
}

fn producer(
    kafka: &KafkaArgs,
    max_message_bytes: usize,
    timeout: std::time::Duration,
) -> anyhow::Result<FutureProducer> {
    kafka
        .client_config(&producer_properties(max_message_bytes, timeout))?
        .create()
        .context("creating the Kafka producer")
}

/// The flush stages: blobs (and dead letters) first, so no row or event ever points at a missing
/// blob; then rows and events in parallel. Metrics follow the flush.
/// Each destination is checked before the service joins the group; the writes to one that does
/// not answer yet wait for its check (`startup`).
async fn sinks(args: &ConsumeArgs, status: &Arc<Status>) -> anyhow::Result<Sinks> {
    // The blob store also keeps dead letters too large for their topic.
    let (blobs, overflow): (Box<dyn Sink>, Option<Arc<dyn ObjectStore>>) = match args.blob_sink {
        BlobSinkKind::Gcs => {
            let bucket = args
                .gcs
                .gcs_bucket
                .clone()
                .context("--gcs-bucket is required with --blob-sink gcs")?;
            let config = GcsConfig {
                bucket,
                endpoint: args.gcs.gcs_endpoint.clone(),
                anonymous: args.gcs.gcs_anonymous,
                concurrency: args.gcs.gcs_upload_concurrency,
                timeout: args.sink_timeout(),
            };
            let gcs = Arc::new(
                GcsSink::new(&config)
                    .await
                    .context("creating the GCS client")?,
            );
            let checked = gcs.clone();
            let gate = startup::check("gcs", status, move || {
                let gcs = checked.clone();
                async move { gcs.check().await }
            })
            .await
            .context("checking the GCS bucket")?;
            (
                Box::new(Gated {
                    gate,
                    sink: gcs.clone(),
                }),
                Some(gcs),
            )
        }
        BlobSinkKind::Filesystem => {
            let files = Arc::new(
                FilesystemBlobSink::new(&args.blob_dir)
                    .with_context(|| format!("blob directory {}", args.blob_dir.display()))?,
            );
            (Box::new(files.clone()), Some(files))
        }
        BlobSinkKind::Null => (Box::new(NullSink), None),
    };
    let dlq_producer = producer(&args.kafka, args.max_message_bytes, args.sink_timeout())?;
    let mut topics = vec![args.topic.clone(), args.dlq_topic.clone()];
    if args.events_sink == EventsSinkKind::Kafka {
        topics.extend(
            [
                &args.events.outcomes_topic,
                &args.events.analytics_topic,
                &args.events.issues_topic,
            ]
            .map(Clone::clone),
        );
    }
    if args.rows_sink == RowsSinkKind::Snuba {
        topics.push(args.replay_events_topic.clone());
    }
    let check_config = args.kafka.client_config(&producer_properties(
        args.max_message_bytes,
        args.sink_timeout(),
    ))?;
    let timeout = args.sink_timeout();
    let kafka = startup::check("kafka", status, move || {
        let (config, topics) = (check_config.clone(), topics.clone());
        async move {
            tokio::task::spawn_blocking(move || publish::check_topics(&config, &topics, timeout))
                .await
                .unwrap_or_else(|e| Err(SinkError::new("kafka", Retry::Fatal, e)))
        }
    })
    .await
    .context("checking the Kafka topics")?;
    let dlq = DlqSink::new(
        dlq_producer,
        &args.dlq_topic,
        args.dlq_max_message_bytes,
        overflow,
    );
    let rows: Box<dyn Sink> = match args.rows_sink {
        RowsSinkKind::Clickhouse => {
            let config = args
                .clickhouse
                .config(args.sink_timeout())
                .context("reading --clickhouse-password-file")?;
            let (checked, migrate) = (config.clone(), args.migrate_on_start);
            let gate = startup::check("clickhouse", status, move || {
                let config = checked.clone();
                async move {
                    if migrate {
                        let features = clickhouse::migrate(&config)
                            .await
                            .map_err(|e| clickhouse::setup_error(&e, &config))?;
                        info!(?features, table = %config.table, "ClickHouse table ready");
                    }
                    clickhouse::check_table(&config).await
                }
            })
            .await
            .context("checking the ClickHouse table")?;
            Box::new(Gated {
                gate,
                sink: ClickHouseSink::new(&config),
            })
        }
        RowsSinkKind::Snuba => Box::new(Gated {
            gate: kafka.clone(),
            sink: SnubaSink::new(
                producer(&args.kafka, args.max_message_bytes, args.sink_timeout())?,
                &args.replay_events_topic,
            ),
        }),
        RowsSinkKind::Null => Box::new(NullSink),
    };
    let events: Box<dyn Sink> = match args.events_sink {
        EventsSinkKind::Kafka => {
            let topics = EventTopics {
                outcomes: args.events.outcomes_topic.clone(),
                analytics: args.events.analytics_topic.clone(),
                issues: args.events.issues_topic.clone(),
            };
            info!(
                topic = %topics.issues,
                rage_click_issues = %args.events.rage_click_issues,
                hydration_error_issues = %args.events.hydration_error_issues,
                "issue occurrences for these projects"
            );
            Box::new(Gated {
                gate: kafka.clone(),
                sink: EventsSink::new(
                    producer(&args.kafka, args.max_message_bytes, args.sink_timeout())?,
                    topics,
                    args.events.issue_gates(),
                    args.events.first_replay_cache_size,
                ),
            })
        }
        EventsSinkKind::Null => Box::new(NullSink),
    };
    // Messages a sink rejects are read again from the consumed topic and dead-lettered.
    let rejections = RejectedToDlq {
        dlq: dlq.clone(),
        source: Refetcher::new(
            args.kafka
                .client_config(&args.shared_consumer_properties())?,
            &args.topic,
            &format!("{}-refetch", args.group_id),
        )
        .context("creating the Kafka consumer that re-reads rejected messages")?,
        source_topic: args.topic.clone(),
        timeout: args.sink_timeout(),
    };
    Ok(Sinks {
        stages: vec![
            vec![
                blobs,
                Box::new(Gated {
                    gate: kafka,
                    sink: dlq.clone(),
                }),
            ],
            vec![rows, events],
        ],
        rejections: Some(Box::new(rejections)),
    })
}

async fn run_consume(args: ConsumeArgs) -> anyhow::Result<()> {
    args.validate()?;
    let exporter = replay_ingest::metrics::install(&args.metrics.settings())
        .context("starting the DogStatsD exporter")?;
    let result = serve(&args).await;
    // Whether the service stopped cleanly or not, what it counted last is sent before it exits.
    exporter.flush_before_exit().await;
    result
}

async fn serve(args: &ConsumeArgs) -> anyhow::Result<()> {
    // Probes first: a startup check waiting for a sink shows in `/status` and stays live.
    let status = Arc::new(Status::default());
    let listener = health::listen(args.http_listen)
        .with_context(|| format!("binding the health endpoint on {}", args.http_listen))?;
    // As Go's runtime does at start: the soft limit (often 1 024 in containers) is a default, not
    // a budget, and running out of descriptors fails every sink request at once.
    match health::raise_fd_limit() {
        Ok((soft, hard)) => info!(soft, hard, "file descriptor limit"),
        Err(error) => warn!(%error, "could not raise the file descriptor limit"),
    }
    info!(listen = %args.http_listen, topic = %args.topic, group = %args.group_id, "starting");
    tokio::spawn(health::serve(listener, status.clone()));
    let sinks = sinks(args, &status).await?;
    pipeline::consume(
        args.pipeline_settings()?,
        sinks,
        status.clone(),
        shutdown_signal(),
    )
    .await?;
    info!(
        consumed = status.consumed.load(Ordering::Relaxed),
        flushed = status.flushed.load(Ordering::Relaxed),
        "stopped cleanly"
    );
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

fn run_inspect(files: &[PathBuf], limits: &Limits) -> ExitCode {
    // Files are processed in parallel; lines are printed in argument order. Processing threads
    // get the stack processing needs (the global pool is configured once, here).
    let _ = rayon::ThreadPoolBuilder::new()
        .stack_size(replay_ingest::recording::PROCESSING_STACK_BYTES)
        .build_global();
    let lines: Vec<Result<String, String>> = files
        .par_iter()
        .map(|path| {
            let name = path.display().to_string();
            std::fs::read(path)
                .map(|value| inspect::inspect(&name, &value, limits))
                .map_err(|e| format!("{name}: {e}"))
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
    if unreadable {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
