//! The `replay-ingest` command line: `consume` (the service), `migrate`, `inspect`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use rayon::prelude::*;
use tracing::{error, info, warn};

use replay_ingest::config::{ClickHouseArgs, ConsumeArgs, LimitArgs};
use replay_ingest::health::{self, Status};
use replay_ingest::inspect;
use replay_ingest::logs::{self, LogFormat};
use replay_ingest::pipeline;
use replay_ingest::recording::Limits;
use replay_ingest::sink::clickhouse;

/// Rust's allocations go to mimalloc. Results are allocated on the processing threads and freed
/// on a flush's thread: glibc frees another thread's chunk under that arena's lock, and the flush
/// threads waited on it about once every six small segments (a futex sleep and a wake-up each).
/// mimalloc hands a foreign free to the owning page without a lock: small segments on two threads
/// cost 1.33–1.50× the work instead of 1.62–1.90× (three A/B pairs). Built without transparent huge
/// pages (the `no_thp` feature): with them, memory is held in 2 MiB pages, and a soak's RSS
/// wandered between 64 and 89 MiB where glibc's stayed at 34–36.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Two glibc malloc arenas at most, for what the C libraries allocate (librdkafka's fetch and
/// produce buffers, on its own threads and on the flushes'). glibc gives threads arenas of their
/// own, up to eight per core, and seldom returns what an arena freed: with the flushes' blocking
/// threads coming and going between load and idle, RSS grew about 2 MiB every other load phase
/// for the first hour (36 → 56 MiB) when every allocation was glibc's; with two arenas it stayed
/// flat. Called before any thread starts, so every thread shares them.
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// How long an idle thread of the blocking pool (flushes, commits) waits for work before it exits
/// (tokio's default: 10 s). A thread that exits hands the pages its allocations used back to
/// mimalloc, which returns them to the OS only on a later allocation: a soak's RSS fell 4–6 MiB
/// at the start of every load phase and climbed back (±14 % over the run), and every load phase
/// started new threads. Kept through an idle spell of a few minutes, the flushes' threads and
/// their memory stay as they were.
const BLOCKING_THREAD_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(600);

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

#[derive(Subcommand)]
enum Command {
    /// Run the service: consume, process, buffer, flush, commit. Exits 0 after a clean drain on
    /// SIGTERM/SIGINT, non-zero when a flush cannot complete (nothing past it is committed).
    Consume(Box<ConsumeArgs>),
    /// Check `consume`'s configuration (its flags and `REPLAY_INGEST_*` variables) as `consume`
    /// does before it connects to anything, then exit: 0 when it would start, 1 naming what it
    /// refuses. For deployments (the chart's values, rendered) before a rollout.
    CheckConfig(Box<ConsumeArgs>),
    /// Create the ClickHouse table for the server's version if it does not exist, check that the
    /// table (new or not) has every column the service writes, of its type, then exit: 1 naming
    /// the columns that differ. An existing table is never altered.
    Migrate(ClickHouseArgs),
    /// Print, one JSON line per file, what the service extracts from raw Kafka message values
    /// (msgpack), with the default event settings. Invalid messages are reported with their
    /// reason; the exit code is non-zero when a file cannot be read (or is larger than
    /// `--max-message-bytes`: no such message reaches the service) or stdout is closed.
    Inspect {
        /// Files holding one raw message value each.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        limits: LimitArgs,
        /// Largest message accepted upstream, bytes (as `consume`'s): a larger file is not read.
        #[arg(
            long,
            env = "REPLAY_INGEST_MAX_MESSAGE_BYTES",
            default_value_t = 15_000_000
        )]
        max_message_bytes: u64,
        /// Threads that process the files (0 = one per CPU), as `consume`'s: run in a pod, the
        /// deployment's, not one per core of the node.
        #[arg(long, env = "REPLAY_INGEST_PROCESSING_THREADS", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1024), default_value_t = 0)]
        processing_threads: usize,
    },
    /// Delete replays — every blob of them, any oversized dead-letter copy of their messages, and
    /// their rows (an archive as Sentry writes one, which hides them; with ClickHouse, the rows
    /// deleted too). Safe to run again after a crash: a second run finds nothing left to delete
    /// (through snuba it publishes the archive again, given the replay's time: the first run
    /// printed it). Exits 1 naming what is left, with the lines to run again on; 3 when only
    /// the time of a replay, given, can finish it.
    Delete(Box<replay_ingest::tools::delete::DeleteArgs>),
    /// Remove the filesystem blob store's blobs older than the retention their key carries
    /// (`{retention_days}/…`), and the directories that leaves empty; prints a summary. Exits
    /// non-zero, after it, when anything could not be read or removed.
    Sweep(replay_ingest::tools::sweep::SweepArgs),
    /// Put dead letters back on the input topic (their original value and key), filtered by
    /// reason and time, at a bounded rate; as a consumer group of its own, so a second run goes on
    /// where the first stopped. Prints counts by reason. Exits 1 stopped with letters left (the
    /// next run goes on), 3 having gone through its letters (all, or its --limit) when some can
    /// never be re-driven.
    Redrive(Box<replay_ingest::tools::redrive::RedriveArgs>),
}

/// The flag and variable of a secret given on the command line, if one is (the flags exist for
/// the variables' sake: clap reads a variable through its flag).
fn secret_on_the_command_line(matches: &ArgMatches) -> Option<(&'static str, &'static str)> {
    let (_, command) = matches.subcommand()?;
    [
        (
            "kafka_sasl_password",
            "--kafka-sasl-password",
            "REPLAY_INGEST_KAFKA_SASL_PASSWORD",
        ),
        (
            "clickhouse_password",
            "--clickhouse-password",
            "REPLAY_INGEST_CLICKHOUSE_PASSWORD",
        ),
    ]
    .into_iter()
    .find(|(id, _, _)| {
        command.ids().any(|known| known == id)
            && command.value_source(id) == Some(ValueSource::CommandLine)
    })
    .map(|(_, flag, variable)| (flag, variable))
}

/// A refused command line: clap's message, and which variable gave the value when one did (the
/// chart sets each `config.KEY` as `REPLAY_INGEST_KEY`, and a pod's operator knows it by that
/// name, not by the flag's); one JSON line with `REPLAY_INGEST_LOG_FORMAT=json`, as the service's
/// other errors are. Help and version go out as clap prints them.
fn refused(error: clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        error.exit();
    }
    let mut message = error.render().to_string().trim_end().to_owned();
    if let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) {
        let long = arg.split_whitespace().next().unwrap_or_default();
        let command = Cli::command();
        let variable = std::iter::once(&command)
            .chain(command.get_subcommands())
            .flat_map(|c| c.get_arguments())
            .find(|a| a.get_long().is_some_and(|l| long == format!("--{l}")))
            .and_then(|a| a.get_env())
            .and_then(|env| env.to_str())
            .filter(|env| std::env::var_os(env).is_some());
        if let Some(variable) = variable {
            let key = variable.trim_start_matches("REPLAY_INGEST_");
            let first = message.find('\n').unwrap_or(message.len());
            message.insert_str(
                first,
                &format!("\n  (the value came from {variable}: config.{key} in the chart)"),
            );
        }
    }
    let json = std::env::var("REPLAY_INGEST_LOG_FORMAT").is_ok_and(|f| f == "json");
    if json {
        logs::init(LogFormat::Json);
        error!("{message}");
    } else {
        eprintln!("{message}");
    }
    ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2))
}

fn main() -> ExitCode {
    cap_malloc_arenas();
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(error) => return refused(error),
    };
    if let Some((flag, variable)) = secret_on_the_command_line(&matches) {
        eprintln!(
            "error: {flag} on the command line shows in `ps` and in the pod's spec: set {variable} (from a Secret) or {flag}-file instead"
        );
        return ExitCode::from(2);
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Inspect {
        files,
        limits,
        max_message_bytes,
        processing_threads,
    } = &cli.command
    {
        let threads = replay_ingest::pipeline::processing_threads(*processing_threads);
        return run_inspect(files, &limits.limits(false), *max_message_bytes, threads);
    }
    if let Command::CheckConfig(args) = &cli.command {
        let checked = args.validate().map_err(anyhow::Error::from).and_then(|()| {
            replay_ingest::metrics::check(&args.metrics.settings()).map_err(anyhow::Error::from)
        });
        return match checked {
            Ok(()) => {
                let bound = args.memory_bound();
                println!(
                    "the configuration is valid: consume would start with it, and hold up to {} MiB besides its baseline (memory_bound_bytes={bound})",
                    bound >> 20
                );
                // What consume warns of at its start, seen before a rollout too (a password
                // sent in the clear passed this check silently).
                for risk in args.risks() {
                    println!("warning: {risk}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("the configuration is refused: {e}");
                ExitCode::FAILURE
            }
        };
    }
    logs::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A panic on this thread (the pipeline's loop, a first startup check: a bug, which the
    // panic hook logs) ends the run like an error: unwinding out of here dropped the runtime,
    // whose blocking pool then waited without a bound for every task on it (a commit, an
    // upload, a consumer's close), past the grace period, the probes already gone.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
        match cli.command {
            Command::Consume(args) => run_consume(*args).await,
            Command::Migrate(args) => {
                args.validate().map_err(anyhow::Error::msg)?;
                // Migrations are DDL: ten minutes as a whole, not a write attempt's deadline.
                let config =
                    args.config(std::time::Duration::from_secs(600)).context("reading --clickhouse-password-file")?;
                let features = clickhouse::migrate(&config)
                    .await
                    .map_err(|e| clickhouse::setup_error(&e, &config))
                    .context("migrating ClickHouse")?;
                // `CREATE … IF NOT EXISTS` leaves an older table as it is: said "ready" here, it
                // was refused by the service's own check at its start.
                clickhouse::check_columns(&config).await?;
                info!(?features, database = %config.database, table = %config.table, "ClickHouse table ready");
                Ok(())
            }
            Command::Delete(args) => replay_ingest::tools::delete::run(&args, &mut std::io::stdout()).await,
            Command::Sweep(args) => run_sweep(args).await,
            Command::Redrive(args) => {
                replay_ingest::tools::redrive::run(&args, &mut std::io::stdout()).await
            }
            Command::Inspect { .. } | Command::CheckConfig(_) => Ok(()),
        }
    })
    }));
    // Work still running now (a flush retrying against a sink that is down, a consumer close
    // stuck on an unreachable broker) must not hold up the exit: everything durable has been
    // committed already, and the drain deadline, which the chart's grace period counts on, is
    // spent.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    replay_ingest::logs::tell_held_back(true);
    let Ok(result) = result else {
        // As Rust's own exit code for a panic on the main thread.
        return ExitCode::from(101);
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{}", said_once(&e));
            match e.downcast_ref::<replay_ingest::tools::LeftForGood>() {
                Some(_) => ExitCode::from(replay_ingest::tools::EXIT_LEFT_FOR_GOOD),
                None => ExitCode::FAILURE,
            }
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

async fn run_sweep(args: replay_ingest::tools::sweep::SweepArgs) -> anyhow::Result<()> {
    use replay_ingest::tools::sweep;
    // `sweep --dry-run | head` ends as any Unix tool's listing does, by SIGPIPE, not with a
    // panic on the closed pipe (Rust ignores the signal). The sweep writes to no socket.
    // SAFETY: resetting a signal's disposition to its default, before any thread writes.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let list = args.dry_run && !args.summary_only;
    let summary = tokio::task::spawn_blocking(move || {
        // A dry run lists what it would remove; a real one (millions of files) only sums up.
        sweep::sweep(
            &args.blob_dir,
            std::time::SystemTime::now(),
            args.dry_run,
            args.pace,
            |path| {
                if list {
                    println!("would remove {}", path.display());
                }
            },
        )
    })
    .await?;
    println!("{summary}");
    if !summary.errors.is_empty() {
        anyhow::bail!("sweep errors:\n  {}", summary.errors_said().join("\n  "));
    }
    Ok(())
}

/// Sweeps the filesystem store every `interval` while the service runs (on the blocking pool).
fn spawn_sweeper(
    dir: PathBuf,
    interval: std::time::Duration,
    pace: replay_ingest::config::SweepPace,
) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        // A sweep longer than the interval is followed by the next one an interval later, not at
        // once.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let dir = dir.clone();
            let started = std::time::Instant::now();
            let swept = tokio::task::spawn_blocking(move || {
                replay_ingest::tools::sweep::sweep(
                    &dir,
                    std::time::SystemTime::now(),
                    false,
                    pace,
                    |_| {},
                )
            })
            .await;
            let took = started.elapsed();
            match swept {
                Ok(summary) => {
                    replay_ingest::metrics::swept(
                        summary.removed,
                        summary.bytes,
                        summary.error_count(),
                        took,
                    );
                    if summary.errors.is_empty() {
                        info!(
                            removed = summary.removed,
                            bytes = summary.bytes,
                            scanned = summary.scanned,
                            left_alone = summary.left_alone,
                            took_ms = took.as_millis() as u64,
                            "blob store swept"
                        );
                    } else {
                        warn!(removed = summary.removed, expired = summary.expired, errors = ?summary.errors_said(), "blob store swept, with errors");
                    }
                }
                Err(e) => {
                    replay_ingest::metrics::sweep_failed();
                    warn!(error = %e, "the sweep did not finish");
                }
            }
        }
    });
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
    // The signal handlers before anything else: a stop asked for during startup is a clean exit,
    // not the default action's death by signal.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    // Probes first: a startup check waiting for a sink shows in `/status` and stays live.
    let status = Arc::new(Status::default());
    status.watch_credentials(args.kafka.credential_files());
    let listener = health::listen(args.http_listen)
        .with_context(|| format!("binding the health endpoint on {}", args.http_listen))?;
    // As Go's runtime does at start: the soft limit (often 1 024 in containers) is a default, not
    // a budget, and running out of descriptors fails every sink request at once.
    match health::raise_fd_limit() {
        Ok((soft, hard)) => info!(soft, hard, "file descriptor limit"),
        Err(error) => warn!(%error, "could not raise the file descriptor limit"),
    }
    info!(listen = %args.http_listen, topic = %args.topic, group = %args.group_id, "starting");
    for risk in args.risks() {
        warn!("{risk}");
    }
    let (bound_mib, limit_mib) = (
        args.memory_bound() >> 20,
        health::container_memory_limit().map(|limit| limit >> 20),
    );
    // The baseline (code, clients; 77–183 MiB measured) needs what the bound leaves.
    if limit_mib.is_some_and(|limit| bound_mib * 100 >= limit * 85) {
        warn!(
            bound_mib,
            limit_mib,
            "the configuration may hold more memory than the container's limit leaves beside the baseline (85 %): large segments can get the process OOM-killed; lower --buffer-max-bytes, --prefetch-kbytes or --processing-threads (each thread holds up to --max-decompressed-bytes), or raise the limit"
        );
    } else {
        info!(
            bound_mib,
            limit_mib, "memory the configuration may hold, besides the baseline"
        );
    }
    tokio::spawn(health::serve(listener, status.clone()));
    tokio::spawn(health::measure_outages(status.clone()));
    if args.sweep_interval_s > 0 {
        let interval = std::time::Duration::from_secs(args.sweep_interval_s);
        spawn_sweeper(args.blobs.blob_dir.clone(), interval, args.sweep_pace);
    }
    let (sinks, gates) = tokio::select! {
        sinks = replay_ingest::service::sinks(args, &status) => sinks?,
        () = &mut shutdown => {
            info!("stopped before the sinks were built");
            return Ok(());
        }
    };
    // A configuration error a check in the background finds once its destination answers (a
    // consumed topic or a dead-letter topic missing, a bucket refused): the service drains and
    // stops with it. Nothing of the consumed topic was consumed then (it stayed ready, in its
    // group, consuming nothing); a flush that writes to a sink whose check failed fails with
    // the error, nothing of it committed.
    let mut failed = None;
    let stop = async {
        tokio::select! {
            () = &mut shutdown => {}
            error = gates.failure() => failed = Some(error),
        }
    };
    pipeline::consume(args.pipeline_settings()?, sinks, status.clone(), stop).await?;
    if let Some(error) = failed {
        return Err(error.into());
    }
    let done = status.snapshot();
    info!(
        consumed = done.consumed,
        flushed = done.flushed,
        "stopped cleanly"
    );
    Ok(())
}

/// Resolves on SIGTERM or SIGINT, whose handlers it installs when called (not when first polled).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            () = received(&mut terminate) => {}
            () = received(&mut interrupt) => {}
        }
        // A second one (Ctrl-C again while the drain waits on an outage) is someone who will
        // not wait: the process exits at once, without the rest of the drain. It was ignored,
        // and the drain, the close and the last metrics took their whole time.
        tokio::spawn(async move {
            tokio::select! {
                () = received(&mut terminate) => {}
                () = received(&mut interrupt) => {}
            }
            error!(
                "a second stop signal: exiting at once, without the rest of the drain; what was not committed is read again at the next start"
            );
            replay_ingest::logs::tell_held_back(true);
            std::process::exit(1);
        });
    }
}

/// The next signal `signal` delivers; never, if its handler could not be installed.
async fn received(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

fn run_inspect(
    files: &[PathBuf],
    limits: &Limits,
    max_message_bytes: u64,
    threads: usize,
) -> ExitCode {
    // Files are processed in parallel, a few per thread at a time (memory: a window of messages,
    // however many files); lines are printed in argument order. Processing threads get the stack
    // processing needs (the global pool is configured once, here).
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .stack_size(replay_ingest::recording::PROCESSING_STACK_BYTES)
        .build_global();
    // A pipe or a device says it holds nothing: what is read is bounded, not only what a file
    // says it holds.
    let read = |path: &PathBuf| {
        let name = path.display().to_string();
        let failed = |e: std::io::Error| format!("{name}: {e}");
        let too_large = |size: String| {
            format!(
                "{name}: {size} bytes, larger than --max-message-bytes ({max_message_bytes}): no such message reaches the service"
            )
        };
        let file = std::fs::File::open(path).map_err(failed)?;
        let size = file.metadata().map_err(failed)?.len();
        if size > max_message_bytes {
            return Err(too_large(size.to_string()));
        }
        let mut value = Vec::with_capacity(size as usize);
        file.take(max_message_bytes.saturating_add(1))
            .read_to_end(&mut value)
            .map_err(failed)?;
        if value.len() as u64 > max_message_bytes {
            return Err(too_large(format!("more than {max_message_bytes}")));
        }
        Ok(inspect::inspect(&name, value.into(), limits))
    };
    let mut stdout = std::io::stdout().lock();
    let mut unreadable = false;
    for window in files.chunks(4 * rayon::current_num_threads()) {
        let lines: Vec<Result<String, String>> = window.par_iter().map(read).collect();
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
    }
    if unreadable {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
