//! The service assembled from its flags: the sinks of every flush stage, each behind its
//! destination's startup check, and the consumed topic's check beside them. The binary runs it;
//! tests that run the pipeline in their own process build the same sinks with it.

use std::sync::Arc;

use anyhow::Context;
use tracing::{info, warn};

use crate::config::{BlobSinkKind, ConsumeArgs, EventsSinkKind, RowsSinkKind, producer_properties};
use crate::health::Status;
use crate::kafka::refetch::Refetcher;
use crate::pipeline::flush::Sinks;
use crate::sink::dlq::{self, RejectedToDlq};
use crate::sink::null::NullSink;
use crate::sink::{Built, clickhouse, events, filesystem, gcs, publish, snuba, trace_items};
use crate::startup;

/// The flush stages, one after the other: blobs (and dead letters) first, so no row or event ever
/// points at a missing blob; then rows and EAP trace items together; then events. A message a
/// stage refuses is written by no later stage and re-driven whole, so a re-drive writes again what
/// came before the refusal: blobs, rows and trace items harmlessly (the same key, a row that
/// collapses with its first copy, an item under the same `item_id`), events not (a billing outcome
/// counts twice). Events come last, so that no other sink's refusal follows them, and the events
/// sink refuses a message over a topic's limit before sending any of its events (`events.rs`:
/// what it leaves to the broker). In turn, rows
/// and events add their times to a flush's instead of overlapping; both are small beside the
/// blobs' (`architecture.md`). Metrics follow the flush. Each sink module builds its sink with its
/// destination's health check (`sink::Built`); `startup` runs the checks. Beside the sinks: the
/// consumed topic's check, which no sink waits on.
pub async fn sinks(
    args: &ConsumeArgs,
    status: &Arc<Status>,
) -> anyhow::Result<(Sinks, startup::Gates)> {
    let timeout = args.sink_timeout();
    let kafka = args
        .kafka
        .client_config(&producer_properties(args.max_message_bytes, timeout))?;
    // The consumed topic must exist too (the dead-letter sink reads rejected messages again).
    // No sink writes there, so a later check's configuration error stops the pipeline itself.
    let consumed_topic = startup::check(
        "kafka",
        status,
        publish::topics_check(&kafka, vec![args.topic.clone()], timeout),
    )
    .await
    .context("checking the consumed topic")?;
    // The blob store also keeps dead letters too large for their topic.
    let (blobs, store) = match args.blobs.blob_sink {
        BlobSinkKind::Gcs => {
            let config = args.blobs.gcs_config(timeout)?;
            let (built, store) = startup::beating(status, gcs::build(&config)).await?;
            (built, Some(store))
        }
        BlobSinkKind::Filesystem => {
            let (built, store) = filesystem::build(&args.blobs.blob_dir)?;
            (built, Some(store))
        }
        BlobSinkKind::Null => (Built::unchecked(NullSink), None),
    };
    let (dlq, dead_letters) = dlq::build(
        &kafka,
        &args.dlq_topic,
        args.dlq_max_message_bytes,
        store,
        timeout,
    )?;
    let rows = match args.rows.rows_sink {
        RowsSinkKind::Clickhouse => {
            let config = args
                .rows
                .clickhouse
                .config(timeout)
                .context("reading --clickhouse-password-file")?;
            clickhouse::build(config, args.migrate_on_start)
        }
        RowsSinkKind::Snuba => snuba::build(&kafka, &args.rows.replay_events_topic, timeout)?,
        RowsSinkKind::Null => Built::unchecked(NullSink),
    };
    let events = match args.events_sink {
        EventsSinkKind::Kafka => {
            info!(
                topic = %args.events.issues_topic,
                rage_click_issues = %args.events.rage_click_issues,
                hydration_error_issues = %args.events.hydration_error_issues,
                "issue occurrences for these projects"
            );
            events::build(
                &kafka,
                args.events.topics(),
                args.events.issue_gates(),
                args.events.first_replay_cache_size,
                timeout,
            )?
        }
        EventsSinkKind::Null => Built::unchecked(NullSink),
    };
    // Messages a sink rejects are read again from the consumed topic and dead-lettered.
    let rejections = RejectedToDlq {
        dlq: dead_letters,
        source: Refetcher::new(
            args.kafka
                .client_config(&args.shared_consumer_properties())?,
            &args.topic,
            // The member's own group: the principal's READ on it covers the coordinator lookup
            // librdkafka makes for any consumer with a group (a group of its own would need an
            // ACL of its own, and logs GroupAuthorizationFailed without one).
            &args.group_id,
        )
        .context("creating the Kafka consumer that re-reads rejected messages")?,
        source_topic: args.topic.clone(),
        timeout,
    };
    let trace_items = trace_items::build(&args.trace_items, &kafka, timeout)?;
    let mut stages = Vec::new();
    if args.blobs.blob_sink == BlobSinkKind::Gcs {
        warn_of_unexpired_blobs(args.blobs.gcs_config(timeout)?);
    }
    let idempotent = std::iter::once(rows).chain(trace_items).collect();
    let mut gates = startup::Gates::default();
    gates.push("the consumed topic", consumed_topic);
    for stage in [vec![blobs, dlq], idempotent, vec![events]] {
        let mut gated = Vec::new();
        for built in stage {
            gated.push(startup::gated(built, status, &mut gates).await?);
        }
        stages.push(gated);
    }
    Ok((Sinks::dead_lettering(stages, Box::new(rejections)), gates))
}

/// Warns, once at startup, of each retention prefix in the bucket whose blobs its lifecycle rules
/// do not delete at their retention (kept past it, or deleted before); never fails the start.
fn warn_of_unexpired_blobs(config: crate::sink::gcs::GcsConfig) {
    use crate::sink::gcs_json::Gap;
    tokio::spawn(async move {
        let gaps = match crate::sink::gcs_json::GcsStore::new(&config).await {
            Ok(store) => store.lifecycle_gaps().await,
            Err(e) => Err(e),
        };
        match gaps {
            Ok(gaps) => {
                for gap in gaps {
                    match gap {
                        Gap::Late { retention } => {
                            warn!(bucket = %config.bucket, prefix = %format!("{retention}/"), "no lifecycle rule deletes this prefix's blobs after {retention} days: they are kept past their retention (docs/operations.md, \"Retention\")")
                        }
                        Gap::Early { retention, age } => {
                            warn!(bucket = %config.bucket, prefix = %format!("{retention}/"), "a lifecycle rule deletes this prefix's blobs after {age} days, before their {retention}-day retention: recordings go while their rows are still listed (docs/operations.md, \"Retention\")")
                        }
                    }
                }
            }
            Err(error) => {
                warn!(bucket = %config.bucket, %error, "could not read the bucket's lifecycle rules")
            }
        }
    });
}
