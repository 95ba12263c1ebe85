//! A sink that accepts every batch and stores nothing: measures the pipeline without I/O.

use super::{Entry, Progress, Sink, Writing, Written};

pub struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }

    fn write<'a>(&'a self, _batch: &'a [Entry], _: &'a Progress) -> Writing<'a> {
        Box::pin(std::future::ready(Ok(Written::default())))
    }
}
