//! `InvalidRecording`: the one error type for bad input.
//!
//! Bad input is never retried: the message goes to the dead-letter topic with its `reason`, is
//! counted by that reason, and its offset is committed. `Reason` is a small closed set so it can be
//! used as a metric tag; `detail` is free text for humans (logs, DLQ header).

use std::fmt;

/// Why a message value was rejected. The string forms are stable: metrics, DLQ headers and
/// dashboards use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The value is not a msgpack map, or a field has the wrong msgpack type.
    InvalidMsgpack,
    /// A required field (`replay_id`, `org_id`, `project_id`, `received`, `payload`) is absent.
    MissingField,
    /// `type` is absent or not `replay_recording_not_chunked`.
    WrongType,
    /// `replay_id` is not 32 lowercase hex characters.
    InvalidReplayId,
    /// `received` is later than the last second every reader of the outputs can store
    /// ([`super::envelope::MAX_RECEIVED`]).
    InvalidReceived,
    /// The payload has no `\n` separating the JSON header from the body.
    MissingHeader,
    /// The header line is not JSON with a non-negative integer `segment_id`.
    InvalidHeader,
    /// The body is empty or corrupt (a bad compressed stream). One that decompresses but is not
    /// a JSON array of events is kept, unread (`Processed::unread_body`).
    InvalidBody,
    /// The compressed stream ends before its end marker.
    TruncatedBody,
    /// The body decompresses to more than the configured cap.
    TooLarge,
    /// `replay_event` is present but is not a JSON object of the expected shape.
    InvalidReplayEvent,
    /// Processing failed in a way only a bug can explain (it panicked): the message is
    /// dead-lettered so that ingestion goes on, and an error is logged.
    InternalError,
    /// Valid, but a sink refused its data (a row ClickHouse cannot parse, an event over the
    /// topic's size limit): dead-lettered at flush time so the rest of the batch is written.
    RejectedBySink,
}

impl Reason {
    /// Every reason. A new variant must be listed here by hand: the compiler asks for it in
    /// `as_str` only, and one left out is unknown to `redrive --reason` and to `names`.
    pub const ALL: [Reason; 13] = [
        Reason::InvalidMsgpack,
        Reason::MissingField,
        Reason::WrongType,
        Reason::InvalidReplayId,
        Reason::InvalidReceived,
        Reason::MissingHeader,
        Reason::InvalidHeader,
        Reason::InvalidBody,
        Reason::TruncatedBody,
        Reason::TooLarge,
        Reason::InvalidReplayEvent,
        Reason::InternalError,
        Reason::RejectedBySink,
    ];

    /// The reason whose string form is `name`.
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }

    pub fn names() -> Vec<&'static str> {
        Reason::ALL.iter().map(|r| r.as_str()).collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidMsgpack => "invalid_msgpack",
            Reason::MissingField => "missing_field",
            Reason::WrongType => "wrong_type",
            Reason::InvalidReplayId => "invalid_replay_id",
            Reason::InvalidReceived => "invalid_received",
            Reason::MissingHeader => "missing_header",
            Reason::InvalidHeader => "invalid_header",
            Reason::InvalidBody => "invalid_body",
            Reason::TruncatedBody => "truncated_body",
            Reason::TooLarge => "too_large",
            Reason::InvalidReplayEvent => "invalid_replay_event",
            Reason::InternalError => "internal_error",
            Reason::RejectedBySink => "rejected_by_sink",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message value that can never be processed, whatever is retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct InvalidRecording {
    pub reason: Reason,
    /// Human-readable explanation, bounded in length (it travels in a Kafka header).
    pub detail: String,
}

/// Longest `detail` kept; input-derived text (e.g. a parser error quoting the input) is cut here.
const MAX_DETAIL_BYTES: usize = 512;

impl InvalidRecording {
    pub fn new(reason: Reason, detail: impl fmt::Display) -> Self {
        let mut line = Line::default();
        // Formatting stops where the line is full (the writer's error ends it): a detail quoting
        // megabytes of input costs what it keeps, not what it quotes.
        let _ = fmt::write(&mut line, format_args!("{detail}"));
        if line.full {
            line.text.push('…');
        }
        InvalidRecording {
            reason,
            detail: line.text,
        }
    }
}

/// A detail as written: one line (parser errors quote the input over several), each run of
/// whitespace one space, at most [`MAX_DETAIL_BYTES`] bytes.
#[derive(Default)]
struct Line {
    text: String,
    /// Whitespace was written since the last character kept.
    space: bool,
    /// Something was left out.
    full: bool,
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Full for good: a `Display` that writes on after a refused piece adds nothing more.
        if self.full {
            return Err(fmt::Error);
        }
        for c in s.chars() {
            if c.is_whitespace() {
                self.space = !self.text.is_empty();
                continue;
            }
            let space = usize::from(std::mem::take(&mut self.space));
            if self.text.len() + space + c.len_utf8() > MAX_DETAIL_BYTES {
                self.full = true;
                return Err(fmt::Error);
            }
            if space == 1 {
                self.text.push(' ');
            }
            self.text.push(c);
        }
        Ok(())
    }
}

/// Cuts `text` to at most `max` bytes (at a character boundary) and marks the cut with `…`.
pub fn shorten(text: &mut String, max: usize) {
    if text.len() > max {
        text.truncate(text.floor_char_boundary(max));
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_strings_are_unique_snake_case() {
        let names: std::collections::BTreeSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for name in names {
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn long_details_are_cut_on_a_char_boundary() {
        let err = InvalidRecording::new(Reason::InvalidBody, "é".repeat(1000));
        assert!(err.detail.len() <= MAX_DETAIL_BYTES + '…'.len_utf8());
        assert!(err.detail.ends_with('…'));
        assert_eq!(err.to_string().split(':').next(), Some("invalid_body"));
    }

    #[test]
    fn details_are_a_single_line() {
        let err =
            InvalidRecording::new(Reason::InvalidBody, "EOF at line 1\n\n\t\"urls\": [\n\t..^");
        assert_eq!(err.detail, "EOF at line 1 \"urls\": [ ..^");
    }

    #[test]
    fn a_detail_quoting_megabytes_is_formatted_only_as_far_as_it_is_kept() {
        /// Writes `n` bytes of whitespace-separated text, counting what it was let write.
        struct Huge(usize, std::cell::Cell<usize>);
        impl fmt::Display for Huge {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for _ in 0..self.0 / 2 {
                    f.write_str("a ")?;
                    self.1.set(self.1.get() + 2);
                }
                Ok(())
            }
        }
        let huge = Huge(10 << 20, Default::default());

        let err = InvalidRecording::new(Reason::InvalidMsgpack, &huge);
        assert!(err.detail.len() <= MAX_DETAIL_BYTES + '…'.len_utf8());
        assert!(err.detail.starts_with("a a a") && err.detail.ends_with("a…"));
        assert!(
            huge.1.get() <= MAX_DETAIL_BYTES + 2,
            "wrote {}",
            huge.1.get()
        );
        // Exactly full is not cut; leading and trailing whitespace is dropped.
        let exact = "x".repeat(MAX_DETAIL_BYTES);
        assert_eq!(
            InvalidRecording::new(Reason::InvalidBody, &exact).detail,
            exact
        );
        assert_eq!(
            InvalidRecording::new(Reason::InvalidBody, " \n a  b \t").detail,
            "a b"
        );
    }

    #[test]
    fn nothing_is_kept_after_the_cut_from_a_display_that_writes_on() {
        /// Ignores its writer's errors, and writes a short piece after long ones: the cut comes
        /// at 510 bytes (a 3-byte character does not fit), where one more byte would.
        struct WritesOn;
        impl fmt::Display for WritesOn {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for _ in 0..300 {
                    let _ = f.write_str("€");
                }
                f.write_str("x")
            }
        }
        let err = InvalidRecording::new(Reason::InvalidBody, WritesOn);
        assert_eq!(err.detail, format!("{}…", "€".repeat(170)));
    }
}
