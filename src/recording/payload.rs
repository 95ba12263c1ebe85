//! The recording payload: `{"segment_id":N}\n<body>` (docs/formats.md, "The payload").
//!
//! The header is split on the first `\n`. The body is detected by its first bytes:
//! zlib (`0x78`, RFC 1950, what the JS SDK sends), gzip (`1f 8b`), zstd (`28 b5 2f fd`), or raw
//! JSON (`[`, optionally after whitespace). Every codec decompresses through a cap that fails with
//! `too_large` rather than truncating, and a stream that ends early fails with `truncated_body`.
//! zlib and gzip go through libdeflate into a per-thread [`Inflater`], and the streaming decoders
//! (zlib-rs, flate2's gzip) give the verdict on whatever libdeflate refuses; libzstd decodes zstd.

use std::borrow::Cow;
use std::io::{self, Read};

use flate2::{Decompress, FlushDecompress, Status};
use serde::{Deserialize, Serialize};
use zstd::zstd_safe::zstd_sys::ZSTD_ErrorCode;

use super::error::{InvalidRecording, Reason};
use super::{libdeflate, verify};

/// How the segment body was encoded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyEncoding {
    Zlib,
    Raw,
    Gzip,
    Zstd,
}

impl BodyEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyEncoding::Zlib => "zlib",
            BodyEncoding::Raw => "raw",
            BodyEncoding::Gzip => "gzip",
            BodyEncoding::Zstd => "zstd",
        }
    }

    /// Detects the encoding from the body's first bytes.
    pub fn detect(body: &[u8]) -> Result<Self, InvalidRecording> {
        match body {
            _ if body.starts_with(&GZIP_MAGIC) => Ok(BodyEncoding::Gzip),
            _ if body.starts_with(&ZSTD_MAGIC) => Ok(BodyEncoding::Zstd),
            [cmf, flg, ..] if zlib_header(*cmf, *flg) => Ok(BodyEncoding::Zlib),
            _ if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') => {
                Ok(BodyEncoding::Raw)
            }
            [] => Err(InvalidRecording::new(Reason::InvalidBody, "body is empty")),
            [first, ..] => Err(InvalidRecording::new(
                Reason::InvalidBody,
                format_args!("unrecognised body encoding (first byte 0x{first:02x})"),
            )),
        }
    }
}

/// What the blob of a message whose payload is `payload` (`with_video`: packed with a video)
/// may hold beyond what the message's own size accounts for, with decoding capped at `cap`.
/// A body stored re-encoded as zlib may store what it decodes to ([`decoded_bound`]): zlib
/// finds repeats only within 32 KiB where zstd finds them across its whole window (up to
/// 128 MiB), and zlib-rs's level 6 only up to 32 506 bytes back where DEFLATE (a gzip or zlib
/// body sent with a video, which is re-encoded too) reaches 32 768 — repeats 32 600 bytes apart
/// store 90 MiB for a body of 0.6 MB. Only a zlib body without a video, stored as received, and a
/// raw body, smaller re-encoded, hold nothing beyond their size.
pub fn stored_beyond_size(payload: &[u8], with_video: bool, cap: usize) -> usize {
    match body_of(payload) {
        Some(body)
            if with_video || body.starts_with(&ZSTD_MAGIC) || body.starts_with(&GZIP_MAGIC) =>
        {
            decoded_bound(payload, cap)
        }
        _ => 0,
    }
}

/// At most how many bytes `payload`'s body decodes to, decoding capped at `cap`, told from its
/// first bytes without decoding it: what a zstd frame declares (its first frame, the one
/// decoded: into a buffer of that size, never past it), DEFLATE's largest ratio for zlib and
/// gzip, the body itself when raw; `cap` when nothing says.
pub fn decoded_bound(payload: &[u8], cap: usize) -> usize {
    let Some(body) = body_of(payload) else {
        return 0;
    };
    let bound = match body {
        _ if body.starts_with(&ZSTD_MAGIC) => match zstd::zstd_safe::get_frame_content_size(body) {
            Ok(Some(size)) => usize::try_from(size).unwrap_or(usize::MAX),
            _ => cap,
        },
        _ if body.starts_with(&GZIP_MAGIC) => body.len().saturating_mul(DEFLATE_MAX_RATIO),
        [cmf, flg, ..] if zlib_header(*cmf, *flg) => body.len().saturating_mul(DEFLATE_MAX_RATIO),
        _ => body.len(),
    };
    bound.min(cap)
}

/// DEFLATE's largest expansion: a 258-byte match in at most two bits, plus block overhead.
const DEFLATE_MAX_RATIO: usize = 1032;

/// The body after the header line, if there is one.
fn body_of(payload: &[u8]) -> Option<&[u8]> {
    let newline = payload.iter().position(|&b| b == b'\n')?;
    payload.get(newline + 1..)
}

/// A zstd frame's first bytes.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A gzip member's first bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether two bytes open a zlib stream (RFC 1950): DEFLATE with a window of at most 32 KiB, and
/// a valid FCHECK. (A preset dictionary, FDICT, is refused when decoding, as zlib refuses it.)
fn zlib_header(cmf: u8, flg: u8) -> bool {
    cmf & 0x0f == 8 && cmf >> 4 <= 7 && u16::from_be_bytes([cmf, flg]).is_multiple_of(31)
}

/// A payload split into its header and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload<'a> {
    /// Blob keys and rows must agree on it, so a value that does not fit a `u32` (the row
    /// column) is rejected rather than clamped.
    pub segment_id: u32,
    pub encoding: BodyEncoding,
    /// The body exactly as received (compressed or raw).
    pub body: &'a [u8],
}

#[derive(Deserialize)]
struct Header {
    segment_id: u32,
}

/// Splits and validates the header line and detects the body encoding.
pub fn split(payload: &[u8]) -> Result<Payload<'_>, InvalidRecording> {
    let newline = payload.iter().position(|&b| b == b'\n').ok_or_else(|| {
        InvalidRecording::new(
            Reason::MissingHeader,
            "payload has no newline after the header",
        )
    })?;
    let (header, rest) = payload.split_at(newline);
    let body = rest.get(1..).unwrap_or_default();
    let header: Header = serde_json::from_slice(header).map_err(|e| {
        InvalidRecording::new(
            Reason::InvalidHeader,
            format_args!(
                "header {:?} is not {{\"segment_id\": <integer 0..=4294967295>}}: {e}",
                String::from_utf8_lossy(header.get(..64).unwrap_or(header))
            ),
        )
    })?;
    Ok(Payload {
        segment_id: header.segment_id,
        encoding: BodyEncoding::detect(body)?,
        body,
    })
}

/// Reusable decompression state for one processing thread: libdeflate's decompressor, an output
/// buffer kept between messages (up to [`RETAINED_OUTPUT_BYTES`]) and the expansion ratio recent
/// bodies had, which sizes the first attempt.
pub struct Inflater {
    decompressor: libdeflate::Decompressor,
    /// Its capacity is what is kept between messages; its contents are the last output.
    out: Vec<u8>,
    /// Typical decompressed / compressed size of recent zlib and gzip bodies, at most
    /// [`MAX_LEARNED_EXPANSION`].
    expansion: usize,
}

/// Output buffer an [`Inflater`] keeps after a message: bigger ones are freed, so that one large
/// segment does not pin its size in every processing thread.
pub const RETAINED_OUTPUT_BYTES: usize = 8 << 20;

/// Expansion assumed before any body was seen: segments typically compress 5–20×.
const INITIAL_EXPANSION: usize = 8;

/// Bound on the learned expansion: a bomb that inflates 1000× must not make every later message
/// start with a buffer 1000× its size.
const MAX_LEARNED_EXPANSION: usize = 32;

/// Smallest first attempt.
const MIN_ATTEMPT_BYTES: usize = 16 << 10;

impl Default for Inflater {
    fn default() -> Self {
        Inflater {
            decompressor: libdeflate::Decompressor::default(),
            out: Vec::new(),
            expansion: INITIAL_EXPANSION,
        }
    }
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("out", &self.out.capacity())
            .field("expansion", &self.expansion)
            .finish()
    }
}

/// What a caller needs checked besides the stream itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// The bytes.
    Bytes,
    /// Text: whether the bytes are UTF-8 too, found in the zlib checksum's pass when it can be.
    Text,
}

impl Inflater {
    /// Frees the output buffer if it grew past [`RETAINED_OUTPUT_BYTES`].
    pub fn release(&mut self) {
        if self.out.capacity() > RETAINED_OUTPUT_BYTES {
            self.out = Vec::new();
        }
    }

    /// Bytes the output buffer holds between messages.
    pub fn retained_bytes(&self) -> usize {
        self.out.capacity()
    }

    /// zlib and gzip in one call into the whole buffer (libdeflate is ~3× faster than a streaming
    /// inflate). The buffer starts at the learned expansion (or the reused buffer's size, if
    /// larger) and doubles on "insufficient space", never past `cap`. A body libdeflate refuses
    /// — bad data (it reports corrupt and truncated streams alike, and a zlib checksum that does
    /// not match) or more than `cap` bytes (a corrupt stream can overflow before libdeflate
    /// reaches its damage) — is decoded again by the streaming decoder, whose verdict and message
    /// are reported: `truncated_body`, `too_large` and `invalid_body` stay exact. Only invalid
    /// bodies pay that second pass. With [`Want::Text`], a zlib body also says whether it is
    /// UTF-8 (`Some`); `None` leaves that to the caller.
    fn inflate<'a>(
        &'a mut self,
        payload: &Payload<'a>,
        cap: usize,
        want: Want,
    ) -> Result<(Cow<'a, [u8]>, Option<bool>), InvalidRecording> {
        let input = payload.body;
        // The learned expansion with half again as headroom — which never pushes a buffer that
        // would be kept past what is kept (it would be freed and allocated again each time) —
        // and never more than 4× the body plus what a thread retains anyway: a crafted stream
        // that inflates to nothing cannot make it allocate much more than a streaming decoder.
        let expected = input.len().saturating_mul(self.expansion);
        let guess = match expected.saturating_add(expected / 2) {
            guess if expected <= RETAINED_OUTPUT_BYTES => guess.min(RETAINED_OUTPUT_BYTES),
            guess => guess,
        };
        let first = guess.min(
            input
                .len()
                .saturating_mul(4)
                .saturating_add(RETAINED_OUTPUT_BYTES),
        );
        let mut size = first
            .max(MIN_ATTEMPT_BYTES)
            .max(self.out.capacity())
            .min(cap);
        loop {
            if self.out.capacity() < size {
                // A fresh allocation, not a resize: nothing to copy, nothing zeroed (libdeflate
                // writes what it returns), and the OS hands large ones out as untouched pages, so
                // only what libdeflate writes becomes resident. The old one goes first: never two
                // at once.
                self.out = Vec::new();
                self.out = Vec::with_capacity(size);
            }
            let result = match payload.encoding {
                BodyEncoding::Gzip => self
                    .decompressor
                    .gzip(input, &mut self.out, size)
                    .map(|()| None),
                _ => zlib(&mut self.decompressor, input, &mut self.out, size, want),
            };
            match result {
                Ok(utf8) => {
                    let observed = self.out.len() / input.len().max(1) + 1;
                    self.expansion =
                        ((self.expansion * 3 + observed) / 4).clamp(1, MAX_LEARNED_EXPANSION);
                    return Ok((Cow::Borrowed(self.out.as_slice()), utf8));
                }
                // Doubling: at most twice the work of one pass, and a buffer at most twice the output.
                Err(libdeflate::Error::InsufficientSpace) if size < cap => {
                    size = size.saturating_mul(2).min(cap)
                }
                // Over the cap, or bad: the streaming decoder decides (a corrupt stream can
                // overflow a buffer before libdeflate reaches the damage it would report). Its
                // output is needed only if it accepts the stream: the verdict goes through a
                // small chunk, libdeflate's buffer freed first, so that a bomb, or a body whose
                // checksum fails after 100 MiB, never holds a second buffer of the cap's size.
                Err(libdeflate::Error::InsufficientSpace | libdeflate::Error::BadData) => {
                    self.out = Vec::new();
                    return streaming(payload, cap, Output::Discard)
                        .and_then(|_| streaming(payload, cap, Output::Keep))
                        .map(|out| (Cow::Owned(out), None));
                }
            }
        }
    }
}

/// A zlib stream (RFC 1950) as libdeflate checks it — a two-byte header (DEFLATE, a window of at
/// most 32 KiB, no preset dictionary, a valid FCHECK), the raw stream, the big-endian Adler-32 of
/// the output; bytes after the trailer are ignored — into `out`, in at most `limit` bytes. The
/// checksum is computed here rather than by libdeflate so that, for text, the UTF-8 check shares
/// its pass over the output (`verify.rs`).
fn zlib(
    decompressor: &mut libdeflate::Decompressor,
    input: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
    want: Want,
) -> Result<Option<bool>, libdeflate::Error> {
    let bad = libdeflate::Error::BadData;
    let (&[cmf, flg], rest) = input.split_first_chunk::<2>().ok_or(bad)?;
    let stream = rest
        .len()
        .checked_sub(4)
        .and_then(|n| rest.get(..n))
        .ok_or(bad)?;
    if !zlib_header(cmf, flg) || flg & 0x20 != 0 {
        return Err(bad);
    }
    let used = decompressor.deflate(stream, out, limit)?;
    let trailer = rest
        .get(used..)
        .and_then(<[u8]>::first_chunk::<4>)
        .map(|t| u32::from_be_bytes(*t))
        .ok_or(bad)?;
    let (adler32, utf8) = match want {
        Want::Bytes => (verify::adler32(out), None),
        Want::Text => {
            let verified = verify::adler32_utf8(out);
            (verified.adler32, Some(verified.utf8))
        }
    };
    if adler32 == trailer {
        Ok(utf8)
    } else {
        Err(bad)
    }
}

/// Decompresses the body, failing once it exceeds `cap` bytes. Raw JSON is the body itself; zlib
/// and gzip decode into `inflater`'s buffer; zstd into a new one.
pub fn decompress<'a>(
    payload: &Payload<'a>,
    cap: usize,
    inflater: &'a mut Inflater,
) -> Result<Cow<'a, [u8]>, InvalidRecording> {
    decoded(payload, cap, inflater, Want::Bytes).map(|(bytes, _)| bytes)
}

/// A decompressed body, and whether it is UTF-8 (for a zlib body, found in the checksum's pass
/// over the output).
#[derive(Debug)]
pub struct Decoded<'a> {
    bytes: Cow<'a, [u8]>,
    utf8: bool,
}

impl Decoded<'_> {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The body as text: the rrweb JSON. `Err` says where it is not UTF-8.
    pub fn text(&self) -> Result<&str, String> {
        if self.utf8 {
            // SAFETY: `utf8` is set only when the bytes were found to be UTF-8 (by
            // `verify::adler32_utf8` or simdutf8), and they are never changed after.
            return Ok(unsafe { std::str::from_utf8_unchecked(&self.bytes) });
        }
        let at = simdutf8::compat::from_utf8(&self.bytes)
            .err()
            .map_or(0, |e| e.valid_up_to());
        Err(format!("body is not valid UTF-8 (byte {at})"))
    }
}

/// [`decompress`], and the result checked to be UTF-8. For a zlib body, the UTF-8 check and the
/// checksum's share one pass over the output.
pub fn decode<'a>(
    payload: &Payload<'a>,
    cap: usize,
    inflater: &'a mut Inflater,
) -> Result<Decoded<'a>, InvalidRecording> {
    let (bytes, utf8) = decoded(payload, cap, inflater, Want::Text)?;
    let utf8 = utf8.unwrap_or_else(|| simdutf8::basic::from_utf8(&bytes).is_ok());
    Ok(Decoded { bytes, utf8 })
}

fn decoded<'a>(
    payload: &Payload<'a>,
    cap: usize,
    inflater: &'a mut Inflater,
    want: Want,
) -> Result<(Cow<'a, [u8]>, Option<bool>), InvalidRecording> {
    match payload.encoding {
        BodyEncoding::Raw if payload.body.len() > cap => Err(too_large(cap)),
        BodyEncoding::Raw => Ok((Cow::Borrowed(payload.body), None)),
        BodyEncoding::Zlib | BodyEncoding::Gzip => inflater.inflate(payload, cap, want),
        BodyEncoding::Zstd => {
            streaming(payload, cap, Output::Keep).map(|out| (Cow::Owned(out), None))
        }
    }
}

/// The streaming decoders: zstd, and the reference verdict on zlib and gzip bodies libdeflate
/// calls bad (truncated or corrupt, and why).
fn streaming(
    payload: &Payload<'_>,
    cap: usize,
    output: Output,
) -> Result<Vec<u8>, InvalidRecording> {
    match payload.encoding {
        BodyEncoding::Zlib => inflate_zlib(payload.body, cap, output),
        BodyEncoding::Gzip => read_capped(
            flate2::read::GzDecoder::new(payload.body),
            initial_capacity(payload.body.len(), cap),
            cap,
            output,
        )
        .map(|(out, _)| out),
        BodyEncoding::Zstd => match output {
            Output::Keep => zstd_whole(payload.body, cap),
            Output::Discard => zstd_counted(payload.body, cap).map(|_| Vec::new()),
        },
        BodyEncoding::Raw => Ok(payload.body.to_vec()),
    }
}

/// The largest window (history) libzstd may hold while counting a zstd frame that does not
/// declare its size: 2^23 bytes, 8 MiB, what the format asks every decoder to support and what
/// zstd's levels up to 19 use. A frame that asks for more (levels 20–22, `--long`) and does not
/// declare its size is `invalid_body`; one that declares its size decodes in one pass into its
/// output, which is its own history, whatever window it asks for.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// libzstd's largest window exponent on a 64-bit target: what its streaming decoder is allowed
/// counting a frame that declares its size within the cap (for a verdict: it then holds no more
/// window than that size).
const ZSTD_ANY_WINDOW_LOG: u32 = 31;

/// The most libzstd's decoder holds, its context included, while counting a frame through
/// [`zstd_count`]: the largest window it admits, two blocks of 128 KiB, its input buffer and its
/// tables, rounded up (8.5 MiB measured).
pub const ZSTD_COUNTING_BYTES: usize = (1 << ZSTD_WINDOW_LOG_MAX) + (1 << 20);

/// The most libzstd's context holds while decoding a frame in one pass (no window: about 100
/// KiB measured), rounded up.
pub const ZSTD_CONTEXT_BYTES: usize = 1 << 20;

/// The most a processing thread holds decoding one body, decoding capped at `cap`: its output,
/// up to the cap. A zstd body's output is a buffer of its own, beside the thread's kept inflate
/// buffer (up to [`RETAINED_OUTPUT_BYTES`]) and libzstd's context; counting a zstd frame first,
/// libzstd's window stands in for the output, and is freed before the output is allocated.
/// (A zlib or gzip body's output is the kept buffer itself.) The memory bound counts it per
/// processing thread (`Config::memory_bound`).
pub fn decoding_bytes(cap: usize) -> usize {
    RETAINED_OUTPUT_BYTES.saturating_add(
        cap.saturating_add(ZSTD_CONTEXT_BYTES)
            .max(ZSTD_COUNTING_BYTES),
    )
}

/// The first zstd frame of `body` decoded into one buffer of its size, in one pass (the output
/// is the history, so libzstd holds no window beside it): a frame that declares its size, as
/// one-shot encoders write it, is refused past the cap before anything is decoded; one that does
/// not (a streaming encoder's) is counted through a small chunk first. (Decoded straight into a
/// growing buffer, a bomb held up to twice the cap while it doubled; decoded by the streaming
/// decoder, a frame held up to 128 MiB of window beside its output.)
fn zstd_whole(body: &[u8], cap: usize) -> Result<Vec<u8>, InvalidRecording> {
    let size = match zstd::zstd_safe::get_frame_content_size(body) {
        Ok(Some(size)) if size > cap as u64 => return Err(too_large(cap)),
        Ok(Some(size)) => size as usize,
        // Not declared, or no frame header: the decoder says why. Its window is freed before
        // the output is allocated.
        _ => zstd_count(body, cap, ZSTD_WINDOW_LOG_MAX)?,
    };
    zstd_one_pass(body, size, cap, &mut zstd::zstd_safe::DCtx::create())
}

/// How many bytes the first zstd frame of `body` decodes to, as [`zstd_whole`] would decode it,
/// without keeping them: a frame that declares its size over the cap is `too_large` at once; one
/// that declares it within the cap is counted with whatever window it asks for (libzstd then
/// holds at most that size of it), one that does not with a window of at most 8 MiB.
fn zstd_counted(body: &[u8], cap: usize) -> Result<usize, InvalidRecording> {
    match zstd::zstd_safe::get_frame_content_size(body) {
        Ok(Some(size)) if size > cap as u64 => Err(too_large(cap)),
        Ok(Some(_)) => zstd_count(body, cap, ZSTD_ANY_WINDOW_LOG),
        _ => zstd_count(body, cap, ZSTD_WINDOW_LOG_MAX),
    }
}

/// The first zstd frame of `body`, which decodes to `size` bytes, decoded in one pass by
/// `decoder`. A frame that goes past `size` is corrupt (libzstd says the output is too small);
/// any other failure gets the streaming decoder's verdict, which tells a frame cut short from a
/// damaged one (the one-pass decoder, and the walk over the frame's blocks before it, call a
/// block header damaged to claim more than the body holds "source size wrong", as they call a
/// frame cut short).
fn zstd_one_pass(
    body: &[u8],
    size: usize,
    cap: usize,
    decoder: &mut zstd::zstd_safe::DCtx<'_>,
) -> Result<Vec<u8>, InvalidRecording> {
    let failed = |code| {
        zstd_counted(body, cap)
            .err()
            .unwrap_or_else(|| zstd_failure(Reason::InvalidBody, code))
    };
    let frame = match zstd::zstd_safe::find_frame_compressed_size(body) {
        Ok(len) => body.get(..len).unwrap_or(body),
        Err(code) => return Err(failed(code)),
    };
    // Never past that size: the processing window reserved for it (`stored_beyond_size`).
    let mut out = Vec::with_capacity(size);
    match decoder.decompress(&mut out, frame) {
        Ok(_) => Ok(out),
        Err(code) if error_code(code) == ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall => {
            Err(InvalidRecording::new(
                Reason::InvalidBody,
                format_args!("zstd: the frame decodes past the {size} bytes it declares"),
            ))
        }
        Err(code) => {
            drop(out);
            Err(failed(code))
        }
    }
}

/// How many bytes the first zstd frame of `body` decodes to, decoded through one small chunk
/// with libzstd's window at most 2^`window_log_max`; `too_large` past `cap`.
fn zstd_count(body: &[u8], cap: usize, window_log_max: u32) -> Result<usize, InvalidRecording> {
    zstd_count_with(
        body,
        cap,
        window_log_max,
        &mut zstd::zstd_safe::DCtx::create(),
    )
}

/// [`zstd_count`] with `decoder`.
fn zstd_count_with(
    body: &[u8],
    cap: usize,
    window_log_max: u32,
    decoder: &mut zstd::zstd_safe::DCtx<'_>,
) -> Result<usize, InvalidRecording> {
    use zstd::zstd_safe::{DParameter, InBuffer, OutBuffer};
    decoder
        .set_parameter(DParameter::WindowLogMax(window_log_max))
        .map_err(zstd_error)?;
    let mut chunk = vec![0u8; DISCARD_CHUNK_BYTES];
    let mut input = InBuffer::around(body);
    let mut total = 0usize;
    loop {
        let mut output = OutBuffer::around(chunk.as_mut_slice());
        let left = decoder
            .decompress_stream(&mut output, &mut input)
            .map_err(|code| match error_code(code) {
                ZSTD_ErrorCode::ZSTD_error_frameParameter_windowTooLarge => InvalidRecording::new(
                    Reason::InvalidBody,
                    format_args!(
                        "zstd: the frame does not declare its size and asks for a window over {} MiB (or for one larger than libzstd decodes)",
                        (1u64 << window_log_max) >> 20
                    ),
                ),
                _ => zstd_error(code),
            })?;
        let written = output.pos();
        total = total.saturating_add(written);
        if total > cap {
            return Err(too_large(cap));
        }
        if left == 0 {
            return Ok(total);
        }
        // Nothing more to read and libzstd had room to write: the frame ends early.
        if input.pos() == body.len() && written < chunk.len() {
            return Err(InvalidRecording::new(
                Reason::TruncatedBody,
                "zstd: stream ends early",
            ));
        }
    }
}

/// Which of libzstd's errors `code` is.
fn error_code(code: usize) -> ZSTD_ErrorCode {
    // SAFETY: a pure function of its argument, defined for any value.
    unsafe { zstd::zstd_safe::zstd_sys::ZSTD_getErrorCode(code) }
}

/// libzstd's error `code` as the recording's: a frame cut short is `truncated_body`, anything
/// else `invalid_body`, with libzstd's own words.
fn zstd_error(code: usize) -> InvalidRecording {
    let reason = match error_code(code) {
        ZSTD_ErrorCode::ZSTD_error_srcSize_wrong => Reason::TruncatedBody,
        _ => Reason::InvalidBody,
    };
    zstd_failure(reason, code)
}

/// libzstd's error `code`, in its own words, as `reason`.
fn zstd_failure(reason: Reason, code: usize) -> InvalidRecording {
    InvalidRecording::new(
        reason,
        format_args!("zstd: {}", zstd::zstd_safe::get_error_name(code)),
    )
}

/// What a streaming decoder does with its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Returned.
    Keep,
    /// Only counted, through one small chunk: for a verdict (an empty `Vec` on success).
    Discard,
}

/// The chunk [`Output::Discard`] decodes through.
const DISCARD_CHUNK_BYTES: usize = 64 << 10;

/// Initial output allocation of the streaming decoders: segments typically compress 5–20×; the
/// buffer grows geometrically from there. 4× bounds what a crafted stream that inflates to
/// nothing (padding, empty blocks) makes us allocate up front to 4 × its own size.
fn initial_capacity(compressed: usize, cap: usize) -> usize {
    compressed.saturating_mul(4).max(4096).min(cap.max(1))
}

fn too_large(cap: usize) -> InvalidRecording {
    InvalidRecording::new(
        Reason::TooLarge,
        format_args!("body decompresses to more than {cap} bytes"),
    )
}

/// zlib through flate2's low-level API: it reports whether the stream reached its end marker,
/// which a `Read` adapter does not.
fn inflate_zlib(input: &[u8], cap: usize, output: Output) -> Result<Vec<u8>, InvalidRecording> {
    let mut inflater = Decompress::new(true);
    let mut out = Vec::with_capacity(match output {
        Output::Keep => initial_capacity(input.len(), cap),
        Output::Discard => DISCARD_CHUNK_BYTES.min(cap.saturating_add(1)),
    });
    // Bytes decoded before `out` (discarded chunks).
    let mut discarded = 0usize;
    loop {
        if out.len() == out.capacity() {
            match output {
                Output::Keep => {
                    // Grow geometrically, up to one byte past the cap so that overflow is detected.
                    let room = cap.saturating_add(1).saturating_sub(out.len());
                    out.reserve_exact(out.len().max(4096).min(room).max(1));
                }
                Output::Discard => {
                    discarded += out.len();
                    out.clear();
                    // Never decode past one byte over the cap, as `Keep` does: what lies beyond
                    // (damage included) must not change the verdict.
                    let room = cap.saturating_add(1).saturating_sub(discarded);
                    if room < out.capacity() {
                        out = Vec::with_capacity(room.max(1));
                    }
                }
            }
        }
        let (in_before, out_before) = (inflater.total_in(), out.len());
        let rest = input
            .get(usize::try_from(in_before).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        // zlib-rs often says only "repeated call with bad state": where it broke is what helps.
        let status = match inflater.decompress_vec(rest, &mut out, FlushDecompress::None) {
            Ok(status) => status,
            Err(e) => {
                return Err(InvalidRecording::new(
                    Reason::InvalidBody,
                    format_args!(
                        "zlib: corrupt stream at byte {} of {} ({} bytes decoded before it): {e}",
                        inflater.total_in(),
                        input.len(),
                        discarded + out.len()
                    ),
                ));
            }
        };
        if discarded + out.len() > cap {
            return Err(too_large(cap));
        }
        if status == Status::StreamEnd {
            return Ok(if output == Output::Keep {
                out
            } else {
                Vec::new()
            });
        }
        let stalled = inflater.total_in() == in_before && out.len() == out_before;
        if out.len() < out.capacity() && (rest.is_empty() || stalled) {
            return Err(InvalidRecording::new(
                Reason::TruncatedBody,
                format_args!(
                    "zlib stream of {} bytes ends without its end marker",
                    input.len()
                ),
            ));
        }
    }
}

/// Reads a decoder to its end, failing past `cap`, into a buffer of `capacity` to begin with:
/// what it kept, and how long the output was. Decoders here report a stream that ends early as
/// `UnexpectedEof`.
fn read_capped(
    decoder: impl Read,
    capacity: usize,
    cap: usize,
    output: Output,
) -> Result<(Vec<u8>, usize), InvalidRecording> {
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    let mut decoder = decoder.take(limit);
    let mut out = Vec::new();
    let read = match output {
        Output::Keep => {
            out.reserve_exact(capacity);
            decoder.read_to_end(&mut out)
        }
        Output::Discard => io::copy(&mut decoder, &mut io::sink())
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let read = read.map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => InvalidRecording::new(
            Reason::TruncatedBody,
            format_args!("stream ends early: {e}"),
        ),
        _ => InvalidRecording::new(Reason::InvalidBody, e),
    })?;
    if read > cap {
        return Err(too_large(cap));
    }
    Ok((out, read))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    const JSON: &[u8] =
        br#"[{"type":4,"data":{"href":"https://example.com/"},"timestamp":1700000000000}]"#;

    pub(crate) fn zlib(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn with_header(body: &[u8]) -> Vec<u8> {
        [b"{\"segment_id\":3}\n".as_slice(), body].concat()
    }

    /// Decompresses with a fresh inflater.
    fn decode(payload: &Payload<'_>, cap: usize) -> Result<Vec<u8>, InvalidRecording> {
        decompress(payload, cap, &mut Inflater::default()).map(Cow::into_owned)
    }

    fn roundtrip(body: Vec<u8>, encoding: BodyEncoding) {
        let payload = with_header(&body);
        let split = split(&payload).unwrap();
        assert_eq!((split.segment_id, split.encoding), (3, encoding));
        assert_eq!(decode(&split, 1 << 20).unwrap(), JSON);
    }

    #[test]
    fn every_supported_encoding_decodes_to_the_same_json() {
        roundtrip(zlib(JSON), BodyEncoding::Zlib);
        roundtrip(gzip(JSON), BodyEncoding::Gzip);
        roundtrip(zstd::encode_all(JSON, 3).unwrap(), BodyEncoding::Zstd);
        roundtrip(JSON.to_vec(), BodyEncoding::Raw);
    }

    /// A zstd frame that declares its size (a one-shot encoder's) and one that does not (a
    /// streaming encoder's) decode into a buffer of exactly their size, whole, up to the cap
    /// itself; past it, either is `too_large`.
    #[test]
    fn zstd_frames_decode_into_a_buffer_of_their_size_with_or_without_a_declared_one() {
        let data = JSON.repeat(50);
        let declared = zstd::bulk::compress(&data, 3).unwrap();
        let undeclared = {
            use std::io::Write;
            let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            encoder.include_contentsize(false).unwrap();
            encoder.write_all(&data).unwrap();
            encoder.finish().unwrap()
        };
        let size = |body: &[u8]| zstd::zstd_safe::get_frame_content_size(body).ok().flatten();
        assert_eq!(size(&declared), Some(data.len() as u64));
        assert_eq!(size(&undeclared), None);
        for body in [&declared, &undeclared] {
            let decoded = zstd_whole(body, data.len()).unwrap();
            assert_eq!(decoded, data);
            assert_eq!(
                decoded.capacity(),
                data.len(),
                "one buffer of the output's size"
            );
            let refused = zstd_whole(body, data.len() - 1).unwrap_err();
            assert_eq!(refused.reason, Reason::TooLarge);
        }
    }

    /// 18 MiB whose second half repeats the first, 9 MiB back: zstd finds the repeat only with
    /// a window over 8 MiB.
    fn far_repeat() -> Vec<u8> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let half: Vec<u8> = (0..9 << 20)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                b'a' + (state >> 59) as u8 % 26
            })
            .collect();
        half.repeat(2)
    }

    /// `data` compressed with a window of 2^`window_log`, its size declared or not.
    fn zstd_with_window(data: &[u8], window_log: u32, declared: bool) -> Vec<u8> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.window_log(window_log).unwrap();
        encoder.long_distance_matching(true).unwrap();
        encoder.include_contentsize(declared).unwrap();
        if declared {
            encoder
                .set_pledged_src_size(Some(data.len() as u64))
                .unwrap();
        }
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// `frame` (one that does not declare its size and has a window descriptor) rewritten to
    /// declare `size` in a 4-byte field, its window unchanged: what no encoder that knows the
    /// size writes (libzstd shrinks the window to the size), but a frame may.
    fn declaring(frame: &[u8], size: u32) -> Vec<u8> {
        let descriptor = frame[4];
        assert_eq!(
            descriptor & 0xe3,
            0,
            "no size, single segment or dictionary"
        );
        let mut out = frame[..4].to_vec();
        out.push(descriptor | 0x80);
        out.push(frame[5]);
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&frame[6..]);
        out
    }

    /// libzstd's memory is bounded: a frame that declares its size decodes in one pass into its
    /// output, its context holding no window whatever the frame asks for (the streaming decoder
    /// held up to 128 MiB beside the output); one that does not is counted with a window of at
    /// most 8 MiB, and refused when it asks for more.
    #[test]
    fn zstd_decoding_holds_no_window_or_at_most_8_mib_of_one() {
        let data = far_repeat();
        let undeclared = zstd_with_window(&data, 27, false);
        assert!(
            undeclared.len() < data.len() * 2 / 5,
            "precondition: the repeat 9 MiB back was found ({} bytes for {})",
            undeclared.len(),
            data.len()
        );
        // Declaring its size, the same frame asks for a window of 128 MiB.
        let large = declaring(&undeclared, data.len() as u32);
        let decoder = &mut zstd::zstd_safe::DCtx::create();
        assert_eq!(
            zstd_one_pass(&large, data.len(), 20 << 20, decoder).unwrap(),
            data
        );
        assert!(
            decoder.sizeof() < ZSTD_CONTEXT_BYTES,
            "libzstd held {} bytes decoding in one pass",
            decoder.sizeof()
        );
        assert_eq!(zstd_whole(&large, 20 << 20).unwrap(), data);
        // Counted for a verdict, it is read as it is decoded: whatever window, within its size.
        assert_eq!(zstd_counted(&large, 20 << 20).unwrap(), data.len());

        let within = zstd_with_window(&data, ZSTD_WINDOW_LOG_MAX, false);
        let decoder = &mut zstd::zstd_safe::DCtx::create();
        assert_eq!(
            zstd_count_with(&within, 20 << 20, ZSTD_WINDOW_LOG_MAX, decoder).unwrap(),
            data.len()
        );
        assert!(
            decoder.sizeof() > 1 << ZSTD_WINDOW_LOG_MAX,
            "precondition: counting held the window ({} bytes)",
            decoder.sizeof()
        );
        assert!(
            decoder.sizeof() <= ZSTD_COUNTING_BYTES,
            "libzstd held {} bytes counting, over the {ZSTD_COUNTING_BYTES} the bound counts",
            decoder.sizeof()
        );
        assert_eq!(zstd_whole(&within, 20 << 20).unwrap(), data);

        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zstd,
            body: &undeclared,
        };
        let error = decode(&payload, 20 << 20).map(|out| out.len()).unwrap_err();
        assert_eq!(error.reason, Reason::InvalidBody);
        assert!(
            error.detail.starts_with(
                "zstd: the frame does not declare its size and asks for a window over 8 MiB"
            ),
            "{}",
            error.detail
        );
    }

    /// A zstd frame cut short is `truncated_body` and a damaged one `invalid_body`, whether it
    /// declares its size or not: a block header damaged to claim more than the body holds is
    /// damage, not a cut (the walk over the frame's blocks calls both "source size wrong").
    #[test]
    fn zstd_frames_cut_short_are_truncated_and_damaged_ones_invalid() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let declared = zstd::bulk::compress(&data, 3).unwrap();
        let undeclared = zstd_with_window(&data, 20, false);
        for (name, body) in [("declared", &declared), ("undeclared", &undeclared)] {
            let verdict = |body: &[u8]| {
                let payload = Payload {
                    segment_id: 0,
                    encoding: BodyEncoding::Zstd,
                    body,
                };
                decode(&payload, 10 << 20).map(|out| out.len()).unwrap_err()
            };
            assert_eq!(
                verdict(&body[..body.len() / 2]).reason,
                Reason::TruncatedBody,
                "{name}"
            );
            // The first block's header follows the frame header (magic, descriptor, window
            // descriptor unless single-segment, dictionary id, content size): a 3-byte
            // little-endian field, its size in bits 3 and up. The largest size it can claim,
            // past the body.
            let descriptor = body[4];
            let single_segment = descriptor & 0x20 != 0;
            let size_field = match descriptor >> 6 {
                0 => usize::from(single_segment),
                flag => 1 << flag,
            };
            let dictionary = [0, 1, 2, 4][usize::from(descriptor & 3)];
            let header = 5 + usize::from(!single_segment) + dictionary + size_field;
            assert_eq!(header, if name == "declared" { 9 } else { 6 });
            let mut damaged = body.clone();
            damaged[header] |= 0xf8;
            damaged[header + 1] = 0xff;
            damaged[header + 2] = 0xff;
            let error = verdict(&damaged);
            assert_eq!(
                error.reason,
                Reason::InvalidBody,
                "{name}: {}",
                error.detail
            );
        }
    }

    #[test]
    fn decoded_text_is_utf8_or_says_where_not_whatever_the_codec() {
        let text = "[{\"type\":5,\"data\":{\"payload\":\"caf\u{e9} \u{1f600}\"}}]".repeat(300);
        let mut invalid = text.clone().into_bytes();
        let at = invalid.len() - 40;
        invalid[at] = 0xff;
        let encode = |encoding, data: &[u8]| match encoding {
            BodyEncoding::Zlib => zlib(data),
            BodyEncoding::Gzip => gzip(data),
            BodyEncoding::Zstd => zstd::encode_all(data, 3).unwrap(),
            BodyEncoding::Raw => data.to_vec(),
        };
        for encoding in [
            BodyEncoding::Zlib,
            BodyEncoding::Gzip,
            BodyEncoding::Zstd,
            BodyEncoding::Raw,
        ] {
            let body = encode(encoding, text.as_bytes());
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: &body,
            };
            let mut inflater = Inflater::default();
            let decoded = super::decode(&payload, 1 << 20, &mut inflater).unwrap();
            assert_eq!(decoded.text(), Ok(text.as_str()), "{encoding:?}");
            let body = encode(encoding, &invalid);
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: &body,
            };
            let mut inflater = Inflater::default();
            let decoded = super::decode(&payload, 1 << 20, &mut inflater).unwrap();
            assert_eq!(
                decoded.text(),
                Err(format!("body is not valid UTF-8 (byte {at})")),
                "{encoding:?}"
            );
            // The bytes themselves decode: only text is refused.
            assert_eq!(decoded.bytes(), invalid.as_slice(), "{encoding:?}");
        }
    }

    #[test]
    fn the_zlib_container_is_checked_as_libdeflate_checks_it() {
        let body = zlib(JSON);
        let check = |body: &[u8]| {
            let payload = Payload {
                segment_id: 0,
                encoding: BodyEncoding::Zlib,
                body,
            };
            super::decode(&payload, 1 << 20, &mut Inflater::default())
                .map(|decoded| decoded.text().map(str::to_owned))
        };
        // Bytes after the trailer are ignored.
        assert_eq!(
            check(&[body.as_slice(), b"trailing"].concat()).unwrap(),
            Ok(std::str::from_utf8(JSON).unwrap().to_owned())
        );
        // A wrong checksum: the streaming decoder's verdict.
        let mut wrong = body.clone();
        *wrong.last_mut().unwrap() ^= 1;
        let error = check(&wrong).unwrap_err();
        assert_eq!(error.reason, Reason::InvalidBody);
        assert!(error.detail.starts_with("zlib: "), "{}", error.detail);
        // A preset dictionary (FDICT): refused, as zlib refuses it without the dictionary.
        let mut fdict = body.clone();
        fdict[1] = (fdict[1] & 0xc0) | 0x20;
        fdict[1] |= ((31 - u16::from_be_bytes([fdict[0], fdict[1]]) % 31) % 31) as u8;
        assert_eq!(u16::from_be_bytes([fdict[0], fdict[1]]) % 31, 0);
        assert_eq!(check(&fdict).unwrap_err().reason, Reason::InvalidBody);
        // Too short for a header and a trailer.
        for len in 0..6 {
            assert!(check(&body[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn the_header_is_split_on_the_first_newline_only() {
        let payload = b"{\"segment_id\":0}\n[\n]\n";
        let split = split(payload).unwrap();
        assert_eq!(split.body, b"[\n]\n");
    }

    #[test]
    fn the_largest_segment_id_is_u32_max() {
        assert_eq!(
            split(b"{\"segment_id\":4294967295}\n[]")
                .unwrap()
                .segment_id,
            u32::MAX
        );
    }

    #[test]
    fn a_payload_without_newline_has_no_header() {
        assert_eq!(
            split(b"{\"segment_id\":0}").unwrap_err().reason,
            Reason::MissingHeader
        );
    }

    #[test]
    fn the_header_needs_a_non_negative_integer_segment_id() {
        for header in [
            "{}",
            "{\"segment_id\":-1}",
            "{\"segment_id\":4294967296}",
            "{\"segment_id\":\"1\"}",
            "{\"segment_id\":1.5}",
            "garbage",
            "",
        ] {
            let payload = format!("{header}\n[]");
            assert_eq!(
                split(payload.as_bytes()).unwrap_err().reason,
                Reason::InvalidHeader,
                "{header}"
            );
        }
    }

    #[test]
    fn an_unknown_body_encoding_is_invalid() {
        assert_eq!(
            split(b"{\"segment_id\":0}\nhello").unwrap_err().reason,
            Reason::InvalidBody
        );
        assert_eq!(
            split(b"{\"segment_id\":0}\n").unwrap_err().reason,
            Reason::InvalidBody
        );
    }

    #[test]
    fn truncated_streams_are_reported_as_truncated_for_every_codec() {
        let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for (encoding, compressed) in [
            (BodyEncoding::Zlib, zlib(&big)),
            (BodyEncoding::Gzip, gzip(&big)),
            (
                BodyEncoding::Zstd,
                zstd::encode_all(big.as_slice(), 3).unwrap(),
            ),
        ] {
            let cut = &compressed[..compressed.len() / 2];
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: cut,
            };
            assert_eq!(
                decode(&payload, 10 << 20).unwrap_err().reason,
                Reason::TruncatedBody,
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn an_unbounded_cap_still_grows_the_output_geometrically() {
        let big = vec![b'x'; 4 << 20];
        let compressed = zlib(&big);
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &compressed,
        };
        assert_eq!(decode(&payload, usize::MAX).unwrap().len(), big.len());
    }

    #[test]
    fn corrupt_zlib_is_invalid_body() {
        let mut compressed = zlib(JSON);
        let mid = compressed.len() / 2;
        compressed[mid] ^= 0xff;
        compressed[mid + 1] ^= 0x55;
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &compressed,
        };
        let reason = decode(&payload, 1 << 20).unwrap_err().reason;
        assert!(
            matches!(reason, Reason::InvalidBody | Reason::TruncatedBody),
            "{reason:?}"
        );
    }

    #[test]
    fn output_over_the_cap_is_too_large_for_every_codec_and_never_truncated() {
        let zeros = vec![b' '; 1 << 20];
        for (encoding, compressed) in [
            (BodyEncoding::Zlib, zlib(&zeros)),
            (BodyEncoding::Gzip, gzip(&zeros)),
            (
                BodyEncoding::Zstd,
                zstd::encode_all(zeros.as_slice(), 3).unwrap(),
            ),
            (BodyEncoding::Raw, zeros.clone()),
        ] {
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: &compressed,
            };
            assert_eq!(
                decode(&payload, (1 << 20) - 1).unwrap_err().reason,
                Reason::TooLarge,
                "{encoding:?}"
            );
            assert_eq!(
                decode(&payload, 1 << 20).unwrap().len(),
                1 << 20,
                "{encoding:?} exactly at the cap"
            );
        }
    }

    fn gzip_or_zlib(encoding: BodyEncoding, data: &[u8]) -> Vec<u8> {
        if encoding == BodyEncoding::Gzip {
            gzip(data)
        } else {
            zlib(data)
        }
    }

    #[test]
    fn one_inflater_decodes_bodies_of_any_size_in_turn_and_keeps_a_bounded_buffer() {
        let mut inflater = Inflater::default();
        // Small, then far larger than the learned expansion predicts (grown in several
        // attempts), then small again in the reused buffer.
        for len in [100, 3 << 20, 10 << 20, 50] {
            for encoding in [BodyEncoding::Zlib, BodyEncoding::Gzip] {
                let data: Vec<u8> = (0..len).map(|i| b"aaaaaaaab{}[]\\"[i % 14]).collect();
                let body = gzip_or_zlib(encoding, &data);
                let payload = Payload {
                    segment_id: 0,
                    encoding,
                    body: &body,
                };
                let out = decompress(&payload, 64 << 20, &mut inflater).unwrap();
                assert!(
                    matches!(out, Cow::Borrowed(_)),
                    "{encoding:?} {len}: decoded in place"
                );
                assert_eq!(out, data.as_slice(), "{encoding:?} {len}");
                inflater.release();
                assert!(inflater.retained_bytes() <= RETAINED_OUTPUT_BYTES, "{len}");
            }
        }
        assert!(inflater.expansion <= MAX_LEARNED_EXPANSION);
    }

    #[test]
    fn the_cap_is_exact_whatever_the_first_attempt_and_the_buffer_never_outgrows_it() {
        let data = vec![b'x'; 300_000];
        for encoding in [BodyEncoding::Zlib, BodyEncoding::Gzip] {
            let body = gzip_or_zlib(encoding, &data);
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: &body,
            };
            for (cap, ok) in [
                (299_999, false),
                (300_000, true),
                (17_000, false),
                (1, false),
            ] {
                let mut inflater = Inflater::default();
                let result = decompress(&payload, cap, &mut inflater).map(|out| out.len());
                match ok {
                    true => assert_eq!(result.unwrap(), data.len(), "{encoding:?} cap {cap}"),
                    false => assert_eq!(
                        result.unwrap_err().reason,
                        Reason::TooLarge,
                        "{encoding:?} cap {cap}"
                    ),
                }
                assert!(
                    inflater.retained_bytes() <= cap.max(MIN_ATTEMPT_BYTES.min(cap)),
                    "{encoding:?} cap {cap}"
                );
            }
        }
    }

    #[test]
    fn a_bomb_does_not_teach_the_inflater_to_over_allocate() {
        let mut inflater = Inflater::default();
        let bomb = zlib(&vec![b' '; 8 << 20]);
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &bomb,
        };
        assert_eq!(
            decompress(&payload, 64 << 20, &mut inflater).unwrap().len(),
            8 << 20
        );
        assert_eq!(inflater.expansion, MAX_LEARNED_EXPANSION);
        inflater.release();
        let small = zlib(JSON);
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &small,
        };
        assert_eq!(decompress(&payload, 64 << 20, &mut inflater).unwrap(), JSON);
        assert!(inflater.retained_bytes() <= RETAINED_OUTPUT_BYTES);
    }

    #[test]
    fn invalid_streams_get_the_streaming_decoders_verdict_and_message() {
        let big: Vec<u8> = (0..50_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for encoding in [BodyEncoding::Zlib, BodyEncoding::Gzip] {
            let body = gzip_or_zlib(encoding, &big);
            let cut = &body[..body.len() / 2];
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: cut,
            };
            assert_eq!(
                decode(&payload, 10 << 20).unwrap_err(),
                streaming(&payload, 10 << 20, Output::Keep).unwrap_err()
            );
        }
        let mut corrupt = zlib(&big);
        let mid = corrupt.len() / 2;
        corrupt[mid..mid + 8].fill(0xff);
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &corrupt,
        };
        let error = decode(&payload, 10 << 20).unwrap_err();
        assert_eq!(error.reason, Reason::InvalidBody);
        // Where it broke, for whoever reads the dead letter.
        assert!(
            error.detail.starts_with("zlib: corrupt stream at byte "),
            "{}",
            error.detail
        );
        assert!(
            error.detail.contains(&format!(" of {} (", corrupt.len())),
            "{}",
            error.detail
        );
    }

    proptest::proptest! {
        /// libdeflate (whole buffer) and the streaming decoders agree on every body: the same
        /// bytes, or the same reason, whatever the cap, truncation or damage — except that
        /// libdeflate may accept a damaged stream whose checksum still holds, and then yields
        /// exactly the original data.
        #[test]
        fn the_fast_path_agrees_with_the_streaming_decoders(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4000),
            repeat in 1usize..40,
            gzip_body in proptest::prelude::any::<bool>(),
            cut in proptest::option::of(0usize..2000),
            flip in proptest::option::of((0usize..2000, 1u8..=255)),
            cap in 0usize..200_000,
        ) {
            let data = data.repeat(repeat);
            let encoding = if gzip_body { BodyEncoding::Gzip } else { BodyEncoding::Zlib };
            let mut body = gzip_or_zlib(encoding, &data);
            if let Some(cut) = cut {
                body.truncate(cut);
            }
            if let Some((at, mask)) = flip {
                let len = body.len();
                if let Some(byte) = body.get_mut(at % len.max(1)) {
                    *byte ^= mask;
                }
            }
            let payload = Payload { segment_id: 0, encoding, body: &body };
            let fast = decode(&payload, cap);
            let reference = streaming(&payload, cap, Output::Keep);
            let verdict = streaming(&payload, cap, Output::Discard);
            proptest::prop_assert_eq!(verdict.map(|_| ()).map_err(|e| e.reason), reference.as_ref().map(|_| ()).map_err(|e| e.reason));
            match (fast, reference) {
                (Ok(fast), Ok(reference)) => proptest::prop_assert_eq!(fast, reference),
                (Err(fast), Err(reference)) => proptest::prop_assert_eq!(fast.reason, reference.reason),
                // libdeflate tolerates a few malformations zlib refuses (an unused code in an
                // incomplete Huffman table); it still checks the checksum, so what it accepts
                // is the data that was compressed.
                (Ok(fast), Err(_)) => proptest::prop_assert_eq!(fast, data),
                (fast, reference) => proptest::prop_assert!(false, "fast {:?} vs streaming {:?}", fast.map(|o| o.len()), reference.map(|o| o.len())),
            }
        }
    }
}
