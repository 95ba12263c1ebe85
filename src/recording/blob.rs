//! The segment blob stored in GCS (docs/formats.md, "The blob"; docs/outputs.md, "Blobs").
//!
//! Key: `{retention_days}/{project_id}/{replay_id}/{segment_id}` — deterministic, so rewriting a
//! redelivered segment is idempotent. Bytes: always a zlib stream.
//! - no video, zlib body: the body exactly as received (no recompression), sharing the message's
//!   buffer rather than copied out of it — unless the stream is larger than the JSON it holds
//!   (a crafted stream: padding, empty blocks; or JSON of a few dozen bytes, which zlib's own
//!   framing outweighs: `[]` is 10 bytes of zlib), which is stored as zlib of the JSON
//!   instead, so a blob never outweighs its content;
//! - no video, raw/gzip/zstd body: zlib of the rrweb JSON;
//! - video present: zlib of `0x01 | u32 BE video length | video | rrweb JSON`; a video field
//!   present but empty is no video, as in Sentry (`if message["replay_video"]:`).

use std::io::{self, Write};

use flate2::Compression;
use flate2::write::ZlibEncoder;

use super::heap::HeapSize;
use super::payload::{BodyEncoding, Payload};

/// Pack marker: rrweb JSON only.
const PACK_RRWEB: u8 = 0x00;
/// Pack marker: video followed by rrweb JSON.
const PACK_VIDEO: u8 = 0x01;

/// One object to upload. `bytes` is reference-counted: uploads and retries share it, no copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub key: String,
    pub bytes: bytes::Bytes,
    /// Bytes of the buffer `bytes` keeps alive: the whole message when it is a slice of it.
    held: usize,
}

impl HeapSize for Blob {
    fn heap_size(&self) -> usize {
        self.key.heap_size() + self.held
    }
}

/// A blob shares the message's buffer when what else the message holds (envelope, replay event)
/// is at most this share of the body: past it the body is copied out, so that a buffered segment
/// never holds much more than its blob (a small segment's replay event is about its body's size,
/// and copying a small body costs next to nothing; a large body's copy cost 2 % of `process`).
pub const SHARED_REST_DIVISOR: usize = 8;

/// What sharing a buffer adds: `bytes` moves a `Vec`'s buffer under a reference count (its
/// pointer, capacity and count) the first time it is shared.
const SHARED_HEADER_BYTES: usize = 3 * std::mem::size_of::<usize>();

pub fn key(retention_days: u16, project_id: u64, replay_id: &str, segment_id: u32) -> String {
    format!("{retention_days}/{project_id}/{replay_id}/{segment_id}")
}

/// Builds the blob from the received payload and its decompressed JSON. `message` is the value
/// the payload was read from: a body stored as received is a slice of it (if the rest of the
/// message is small, [`SHARED_REST_DIVISOR`]); anything else is one exactly-sized allocation.
/// Fails only if compressing into memory fails, which it cannot.
pub fn build(
    key: String,
    payload: &Payload<'_>,
    json: &[u8],
    video: Option<&[u8]>,
    message: &bytes::Bytes,
) -> io::Result<Blob> {
    let stored = match video.filter(|video| !video.is_empty()) {
        None if payload.encoding == BodyEncoding::Zlib && payload.body.len() <= json.len() => {
            let within = message.as_ptr_range().start <= payload.body.as_ptr_range().start
                && payload.body.as_ptr_range().end <= message.as_ptr_range().end;
            let rest = message.len().saturating_sub(payload.body.len());
            if within && rest <= payload.body.len() / SHARED_REST_DIVISOR {
                return Ok(Blob {
                    key,
                    bytes: message.slice_ref(payload.body),
                    held: message.len() + SHARED_HEADER_BYTES,
                });
            }
            payload.body.to_vec()
        }
        None => zlib(&[json])?,
        Some(video) => {
            let len = u32::try_from(video.len()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "video longer than 4 GiB")
            })?;
            zlib(&[&[PACK_VIDEO], &len.to_be_bytes(), video, json])?
        }
    };
    let bytes = bytes::Bytes::from(stored.into_boxed_slice());
    Ok(Blob {
        key,
        held: bytes.len(),
        bytes,
    })
}

fn zlib(parts: &[&[u8]]) -> io::Result<Vec<u8>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut encoder = ZlibEncoder::new(Vec::with_capacity(total / 4 + 64), Compression::default());
    for part in parts {
        encoder.write_all(part)?;
    }
    encoder.finish()
}

/// The rrweb JSON a stored blob holds (the inverse of [`bytes`]), inflated to at most `cap`
/// bytes: for the operator tools, which read a replay's time from its first segment.
pub fn rrweb_json(stored: &[u8], cap: usize) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut packed = Vec::new();
    flate2::read::ZlibDecoder::new(stored)
        .take(cap as u64 + 1)
        .read_to_end(&mut packed)?;
    if packed.len() > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "blob larger than the cap",
        ));
    }
    let json = match packed.first() {
        Some(&PACK_RRWEB) => packed.get(1..),
        Some(&PACK_VIDEO) => {
            let len = packed
                .get(1..5)
                .and_then(|l| <[u8; 4]>::try_from(l).ok())
                .map(u32::from_be_bytes);
            len.and_then(|len| packed.get(5 + len as usize..))
        }
        _ => Some(&packed[..]),
    };
    json.map(<[u8]>::to_vec)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "truncated video pack"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The stored bytes, built apart from any message (so always an allocation of their own).
    fn bytes(payload: &Payload<'_>, json: &[u8], video: Option<&[u8]>) -> io::Result<bytes::Bytes> {
        build(String::new(), payload, json, video, &bytes::Bytes::new()).map(|blob| blob.bytes)
    }

    #[test]
    fn a_body_stored_as_received_shares_the_message_unless_the_rest_is_large() {
        // An 800-byte body: up to 100 bytes of the rest of the message are shared with it.
        let body = [&b"\x78\x9c"[..], &[b'z'; 798]].concat();
        let json = vec![b' '; 1000];
        for (rest, shared) in [(0, true), (100, true), (101, false), (5000, false)] {
            let message = bytes::Bytes::from([vec![b'e'; rest], body.to_vec()].concat());
            let payload = Payload {
                segment_id: 0,
                encoding: BodyEncoding::Zlib,
                body: &message[rest..],
            };
            let blob = build("k".into(), &payload, &json, None, &message).unwrap();
            assert_eq!(blob.bytes, &body[..], "{rest}");
            assert_eq!(
                blob.bytes.as_ptr() == payload.body.as_ptr(),
                shared,
                "{rest}"
            );
            // What it keeps alive is what it counts.
            let held = if shared {
                message.len() + SHARED_HEADER_BYTES
            } else {
                body.len()
            };
            assert_eq!(
                blob.heap_size(),
                "k".to_owned().heap_size() + held,
                "{rest}"
            );
        }
    }

    #[test]
    fn the_json_is_read_back_from_every_stored_form() {
        let zlib_body = zlib(&[JSON]).unwrap();
        let payload = |encoding, body| Payload {
            segment_id: 0,
            encoding,
            body,
        };
        for (video, body) in [
            (None, &zlib_body[..]),
            (Some(&b"VIDEO"[..]), b"x"),
            (Some(&b""[..]), &zlib_body[..]),
        ] {
            let stored = bytes(&payload(BodyEncoding::Zlib, body), JSON, video).unwrap();
            assert_eq!(rrweb_json(&stored, 1 << 20).unwrap(), JSON, "{video:?}");
        }
        // Sentry's pack without a video (and this service's blobs of an empty video before).
        let packed = zlib(&[&[PACK_RRWEB], JSON]).unwrap();
        assert_eq!(rrweb_json(&packed, 1 << 20).unwrap(), JSON);
        let stored = bytes(&payload(BodyEncoding::Raw, b"ignored"), JSON, None).unwrap();
        assert!(rrweb_json(&stored, 4).is_err(), "over the cap");
    }

    fn inflate(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    const JSON: &[u8] = b"[{\"type\":0,\"data\":{},\"timestamp\":1}]";

    #[test]
    fn the_key_is_retention_project_replay_segment() {
        assert_eq!(
            key(90, 42, "6aa0d45db9b94b989501ce3be4daf802", 3),
            "90/42/6aa0d45db9b94b989501ce3be4daf802/3"
        );
    }

    #[test]
    fn a_zlib_body_is_stored_exactly_as_received() {
        let body = b"\x78\x9c not recompressed";
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body,
        };
        assert_eq!(bytes(&payload, JSON, None).unwrap(), &body[..]);
    }

    #[test]
    fn a_zlib_body_larger_than_its_json_is_stored_as_zlib_of_the_json() {
        let body = vec![0x78; JSON.len() + 1];
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &body,
        };
        assert_eq!(inflate(&bytes(&payload, JSON, None).unwrap()), JSON);
    }

    #[test]
    fn other_bodies_are_stored_as_zlib_of_the_json() {
        for encoding in [BodyEncoding::Raw, BodyEncoding::Gzip, BodyEncoding::Zstd] {
            let payload = Payload {
                segment_id: 0,
                encoding,
                body: b"ignored",
            };
            assert_eq!(
                inflate(&bytes(&payload, JSON, None).unwrap()),
                JSON,
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn video_is_packed_with_its_big_endian_length_before_the_json() {
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: b"x",
        };
        let packed = inflate(&bytes(&payload, JSON, Some(b"VIDEO")).unwrap());
        assert_eq!(packed, [&[0x01, 0, 0, 0, 5][..], b"VIDEO", JSON].concat());
    }

    /// An empty video field is no video, as in Sentry: the zlib body is stored as received (it
    /// was packed as `0x00 | JSON` and recompressed, which Sentry's ingest never writes).
    #[test]
    fn an_empty_video_is_none_and_the_body_is_stored_as_received() {
        let body = zlib(&[JSON]).unwrap();
        let payload = Payload {
            segment_id: 0,
            encoding: BodyEncoding::Zlib,
            body: &body,
        };
        assert_eq!(bytes(&payload, JSON, Some(b"")).unwrap(), body);
    }
}
