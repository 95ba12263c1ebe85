//! The recording payload: `{"segment_id":N}\n<body>` (SPEC §3).
//!
//! The header is split on the first `\n`. The body is detected by its first bytes:
//! zlib (`0x78`, RFC 1950, what the JS SDK sends), gzip (`1f 8b`), zstd (`28 b5 2f fd`), or raw
//! JSON (`[`, optionally after whitespace). Every codec decompresses through a cap that fails with
//! `too_large` rather than truncating, and a stream that ends early fails with `truncated_body`.

use std::io::{self, Read};

use flate2::{Decompress, FlushDecompress, Status};
use serde::{Deserialize, Serialize};

use super::error::{InvalidRecording, Reason};

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
            [0x1f, 0x8b, ..] => Ok(BodyEncoding::Gzip),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Ok(BodyEncoding::Zstd),
            // CMF byte: deflate with a window of at most 32 KiB, and a valid FCHECK.
            [cmf, flg, ..]
                if cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0 =>
            {
                Ok(BodyEncoding::Zlib)
            }
            _ if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') => Ok(BodyEncoding::Raw),
            [] => Err(InvalidRecording::new(Reason::InvalidBody, "body is empty")),
            [first, ..] => Err(InvalidRecording::new(
                Reason::InvalidBody,
                format_args!("unrecognised body encoding (first byte 0x{first:02x})"),
            )),
        }
    }
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
    let newline = payload
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| InvalidRecording::new(Reason::MissingHeader, "payload has no newline after the header"))?;
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
    Ok(Payload { segment_id: header.segment_id, encoding: BodyEncoding::detect(body)?, body })
}

/// Decompresses (or, for raw JSON, copies) the body, failing once it exceeds `cap` bytes.
pub fn decompress(payload: &Payload<'_>, cap: usize) -> Result<Vec<u8>, InvalidRecording> {
    match payload.encoding {
        BodyEncoding::Raw if payload.body.len() > cap => Err(too_large(cap)),
        BodyEncoding::Raw => Ok(payload.body.to_vec()),
        BodyEncoding::Zlib => inflate_zlib(payload.body, cap),
        BodyEncoding::Gzip => read_capped(flate2::read::GzDecoder::new(payload.body), payload.body.len(), cap),
        BodyEncoding::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(payload.body)
                .map_err(|e| InvalidRecording::new(Reason::InvalidBody, format_args!("zstd: {e}")))?;
            read_capped(decoder.single_frame(), payload.body.len(), cap)
        }
    }
}

/// Initial output allocation: segments typically compress 5–20×; the buffer grows geometrically
/// from there. 4× bounds what a crafted stream that inflates to nothing (padding, empty blocks)
/// makes us allocate up front to 4 × its own size.
fn initial_capacity(compressed: usize, cap: usize) -> usize {
    compressed.saturating_mul(4).clamp(4096, cap.max(1))
}

fn too_large(cap: usize) -> InvalidRecording {
    InvalidRecording::new(Reason::TooLarge, format_args!("body decompresses to more than {cap} bytes"))
}

/// zlib through flate2's low-level API: it reports whether the stream reached its end marker,
/// which a `Read` adapter does not.
fn inflate_zlib(input: &[u8], cap: usize) -> Result<Vec<u8>, InvalidRecording> {
    let mut inflater = Decompress::new(true);
    let mut out = Vec::with_capacity(initial_capacity(input.len(), cap));
    loop {
        if out.len() == out.capacity() {
            // Grow geometrically, up to one byte past the cap so that overflow is detected.
            let room = cap.saturating_add(1).saturating_sub(out.len());
            out.reserve_exact(out.len().max(4096).min(room).max(1));
        }
        let (in_before, out_before) = (inflater.total_in(), out.len());
        let rest = input.get(usize::try_from(in_before).unwrap_or(usize::MAX)..).unwrap_or_default();
        let status = inflater
            .decompress_vec(rest, &mut out, FlushDecompress::None)
            .map_err(|e| InvalidRecording::new(Reason::InvalidBody, format_args!("zlib: {e}")))?;
        if out.len() > cap {
            return Err(too_large(cap));
        }
        if status == Status::StreamEnd {
            return Ok(out);
        }
        let stalled = inflater.total_in() == in_before && out.len() == out_before;
        if out.len() < out.capacity() && (rest.is_empty() || stalled) {
            return Err(InvalidRecording::new(
                Reason::TruncatedBody,
                format_args!("zlib stream of {} bytes ends without its end marker", input.len()),
            ));
        }
    }
}

/// Reads a decoder to its end, failing past `cap`. Decoders here report a stream that ends early
/// as `UnexpectedEof`.
fn read_capped(decoder: impl Read, compressed: usize, cap: usize) -> Result<Vec<u8>, InvalidRecording> {
    let mut out = Vec::with_capacity(initial_capacity(compressed, cap));
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    decoder.take(limit).read_to_end(&mut out).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            InvalidRecording::new(Reason::TruncatedBody, format_args!("stream ends early: {e}"))
        }
        _ => InvalidRecording::new(Reason::InvalidBody, e),
    })?;
    if out.len() > cap {
        return Err(too_large(cap));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const JSON: &[u8] = br#"[{"type":4,"data":{"href":"https://example.com/"},"timestamp":1700000000000}]"#;

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

    fn roundtrip(body: Vec<u8>, encoding: BodyEncoding) {
        let payload = with_header(&body);
        let split = split(&payload).unwrap();
        assert_eq!((split.segment_id, split.encoding), (3, encoding));
        assert_eq!(decompress(&split, 1 << 20).unwrap(), JSON);
    }

    #[test]
    fn every_supported_encoding_decodes_to_the_same_json() {
        roundtrip(zlib(JSON), BodyEncoding::Zlib);
        roundtrip(gzip(JSON), BodyEncoding::Gzip);
        roundtrip(zstd::encode_all(JSON, 3).unwrap(), BodyEncoding::Zstd);
        roundtrip(JSON.to_vec(), BodyEncoding::Raw);
    }

    #[test]
    fn the_header_is_split_on_the_first_newline_only() {
        let payload = b"{\"segment_id\":0}\n[\n]\n";
        let split = split(payload).unwrap();
        assert_eq!(split.body, b"[\n]\n");
    }

    #[test]
    fn the_largest_segment_id_is_u32_max() {
        assert_eq!(split(b"{\"segment_id\":4294967295}\n[]").unwrap().segment_id, u32::MAX);
    }

    #[test]
    fn a_payload_without_newline_has_no_header() {
        assert_eq!(split(b"{\"segment_id\":0}").unwrap_err().reason, Reason::MissingHeader);
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
            assert_eq!(split(payload.as_bytes()).unwrap_err().reason, Reason::InvalidHeader, "{header}");
        }
    }

    #[test]
    fn an_unknown_body_encoding_is_invalid() {
        assert_eq!(split(b"{\"segment_id\":0}\nhello").unwrap_err().reason, Reason::InvalidBody);
        assert_eq!(split(b"{\"segment_id\":0}\n").unwrap_err().reason, Reason::InvalidBody);
    }

    #[test]
    fn truncated_streams_are_reported_as_truncated_for_every_codec() {
        let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for (encoding, compressed) in [
            (BodyEncoding::Zlib, zlib(&big)),
            (BodyEncoding::Gzip, gzip(&big)),
            (BodyEncoding::Zstd, zstd::encode_all(big.as_slice(), 3).unwrap()),
        ] {
            let cut = &compressed[..compressed.len() / 2];
            let payload = Payload { segment_id: 0, encoding, body: cut };
            assert_eq!(decompress(&payload, 10 << 20).unwrap_err().reason, Reason::TruncatedBody, "{encoding:?}");
        }
    }

    #[test]
    fn an_unbounded_cap_still_grows_the_output_geometrically() {
        let big = vec![b'x'; 4 << 20];
        let compressed = zlib(&big);
        let payload = Payload { segment_id: 0, encoding: BodyEncoding::Zlib, body: &compressed };
        assert_eq!(decompress(&payload, usize::MAX).unwrap().len(), big.len());
    }

    #[test]
    fn corrupt_zlib_is_invalid_body() {
        let mut compressed = zlib(JSON);
        let mid = compressed.len() / 2;
        compressed[mid] ^= 0xff;
        compressed[mid + 1] ^= 0x55;
        let payload = Payload { segment_id: 0, encoding: BodyEncoding::Zlib, body: &compressed };
        let reason = decompress(&payload, 1 << 20).unwrap_err().reason;
        assert!(matches!(reason, Reason::InvalidBody | Reason::TruncatedBody), "{reason:?}");
    }

    #[test]
    fn output_over_the_cap_is_too_large_for_every_codec_and_never_truncated() {
        let zeros = vec![b' '; 1 << 20];
        for (encoding, compressed) in [
            (BodyEncoding::Zlib, zlib(&zeros)),
            (BodyEncoding::Gzip, gzip(&zeros)),
            (BodyEncoding::Zstd, zstd::encode_all(zeros.as_slice(), 3).unwrap()),
            (BodyEncoding::Raw, zeros.clone()),
        ] {
            let payload = Payload { segment_id: 0, encoding, body: &compressed };
            assert_eq!(decompress(&payload, (1 << 20) - 1).unwrap_err().reason, Reason::TooLarge, "{encoding:?}");
            assert_eq!(decompress(&payload, 1 << 20).unwrap().len(), 1 << 20, "{encoding:?} exactly at the cap");
        }
    }
}
