//! A sink that accepts every batch and stores nothing: measures the pipeline without I/O.

use super::{Entry, Progress, Sink, SinkError, Written};

pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }

    fn write(&self, _batch: &[Entry], _: &Progress) -> Result<Written, SinkError> {
        Ok(Written::default())
    }
}
