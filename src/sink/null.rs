//! A sink that accepts every batch and stores nothing: measures the pipeline without I/O.

use super::{Entry, Sink, SinkError, Written};

pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }

    fn write(&self, _batch: &[Entry]) -> Result<Written, SinkError> {
        Ok(Written::default())
    }
}
