//! Shared helpers for tests against the real local broker that `scripts/stack.sh up` starts
//! (`REPLAY_INGEST_TEST_BROKERS`). Every test makes its own topics and consumer group.

pub mod acl;
pub mod cluster;
pub mod fixtures;
pub mod hostile;
pub mod kafka;
pub mod load;
pub mod metadata;
pub mod proxy;
pub mod relay;
pub mod secure_broker;
pub mod service;
pub mod sinks;
pub mod snuba;
pub mod stack;
pub mod statsd;
pub mod tls;
pub mod topics;

pub use fixtures::*;
pub use kafka::*;
pub use service::*;
pub use sinks::*;
pub use stack::*;
pub use statsd::*;
