//! The integration tests: one test binary, a module per area. Tests that need the local stack
//! (Kafka, ClickHouse, the GCS emulator: `scripts/stack.sh up`) or chDB are marked ignored, so a
//! bare `cargo test` reports them as not run; `scripts/test.sh` starts the stack and runs them
//! all (`-- --include-ignored`). Every stack test holds `uses_stack()` (or `stops_stack()`, when
//! it stops or hangs a shared server) for its whole run: see `tests/support/stack.rs`.
//!
//! The chaos harness is the one other test binary (`tests/chaos.rs`): it brings up a stack of
//! its own and points its process's environment at it.

#[path = "../support/mod.rs"]
mod support;

mod broker_partition;
mod clickhouse_faults;
mod clickhouse_sink;
mod dead_letters;
mod delete;
mod end_to_end;
mod fixtures;
mod gcs_sink;
mod group_membership;
mod image;
mod inspect_cli;
mod intake_pause;
mod kafka_acls;
mod kafka_cluster;
mod kafka_pipeline;
mod log_format;
mod memory_bound;
mod modern_clickhouse;
mod module_graph;
mod never_panics;
mod pipeline_backpressure;
mod pipeline_outages;
mod produce_tool;
mod readme;
mod redrive;
mod sentry_schemas;
mod sink_outages;
mod sink_refusals;
mod startup_checks;
mod sweep;
mod trace_items;
mod transport_security;
