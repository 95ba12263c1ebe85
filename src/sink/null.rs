//! A sink that accepts every batch and stores nothing: measures the pipeline without I/O.

use super::{Batch, Sink, SinkError, Written};

pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }

    fn write(&self, _batch: &Batch) -> Result<Written, SinkError> {
        Ok(Written::default())
    }
}
