//! libdeflate's whole-buffer decoders, called directly rather than through a wrapper crate, for
//! two things a wrapper does not give: decoding into a buffer's spare capacity (no zeroing of a
//! buffer that is about to be overwritten), and raw DEFLATE that reports how much input it used —
//! so that the zlib container (header, Adler-32 trailer) is handled in `payload.rs`, where the
//! trailer's check shares its pass over the output with the UTF-8 check (`verify.rs`).

use std::ffi::c_void;
use std::ptr::NonNull;

use libdeflate_sys::{
    libdeflate_alloc_decompressor, libdeflate_decompressor, libdeflate_deflate_decompress_ex,
    libdeflate_free_decompressor, libdeflate_gzip_decompress_ex, libdeflate_result,
    libdeflate_result_LIBDEFLATE_INSUFFICIENT_SPACE as INSUFFICIENT_SPACE,
    libdeflate_result_LIBDEFLATE_SUCCESS as SUCCESS,
};

/// Why a decoder stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The output did not fit the buffer's capacity.
    InsufficientSpace,
    /// Not a valid stream (corrupt or truncated: libdeflate does not tell them apart), or, for
    /// gzip, a wrong CRC-32 or length in its trailer.
    BadData,
}

/// One libdeflate decompressor: its Huffman tables are reused from stream to stream.
pub struct Decompressor(NonNull<libdeflate_decompressor>);

// SAFETY: a decompressor is plain heap memory with no tie to the thread that made it; `&mut self`
// on every call keeps it to one thread at a time.
unsafe impl Send for Decompressor {}

impl Default for Decompressor {
    fn default() -> Self {
        // SAFETY: no preconditions; it returns null only when allocation fails.
        let raw = unsafe { libdeflate_alloc_decompressor() };
        match NonNull::new(raw) {
            Some(raw) => Decompressor(raw),
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; 32 << 10]>()),
        }
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: allocated by `libdeflate_alloc_decompressor`, freed once.
        unsafe { libdeflate_free_decompressor(self.0.as_ptr()) }
    }
}

impl Decompressor {
    /// Decodes the raw DEFLATE stream at the start of `input` into `out`, replacing its contents,
    /// in at most `limit` bytes (and `out`'s capacity); returns how many input bytes the stream
    /// took (what follows is the caller's: a zlib trailer).
    pub fn deflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<usize, Error> {
        self.decode(libdeflate_deflate_decompress_ex, input, out, limit)
    }

    /// Decodes the gzip member at the start of `input` (its CRC-32 and length checked) into
    /// `out`, replacing its contents, in at most `limit` bytes (and `out`'s capacity).
    pub fn gzip(&mut self, input: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<(), Error> {
        self.decode(libdeflate_gzip_decompress_ex, input, out, limit)
            .map(|_| ())
    }

    /// One libdeflate call on `out`'s spare capacity; sets `out`'s length to what it wrote and
    /// returns the input it took. libdeflate writes only below the length it reports, so nothing
    /// uninitialised becomes part of `out`.
    fn decode(
        &mut self,
        decoder: Decoder,
        input: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<usize, Error> {
        out.clear();
        let avail = out.capacity().min(limit);
        let (mut consumed, mut written) = (0usize, 0usize);
        // SAFETY: `input` is readable for its length, `out` writable for `avail` bytes (its
        // capacity), and both counts are written through valid pointers.
        let result = unsafe {
            decoder(
                self.0.as_ptr(),
                input.as_ptr().cast(),
                input.len(),
                out.as_mut_ptr().cast(),
                avail,
                &mut consumed,
                &mut written,
            )
        };
        match result {
            SUCCESS => {
                // SAFETY: libdeflate reported `written` (at most `avail`, within the capacity)
                // bytes written from the start of the buffer.
                unsafe { out.set_len(written.min(avail)) };
                Ok(consumed)
            }
            INSUFFICIENT_SPACE => Err(Error::InsufficientSpace),
            _ => Err(Error::BadData),
        }
    }
}

/// The shape of libdeflate's `*_decompress_ex` functions.
type Decoder = unsafe extern "C" fn(
    *mut libdeflate_decompressor,
    *const c_void,
    usize,
    *mut c_void,
    usize,
    *mut usize,
    *mut usize,
) -> libdeflate_result;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut enc =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn a_raw_stream_decodes_and_reports_the_input_it_took() {
        let data = b"{\"a\":[1,2,3]}".repeat(100);
        let mut stream = raw_deflate(&data);
        let len = stream.len();
        stream.extend_from_slice(b"TRAILER");
        let mut out = Vec::with_capacity(data.len());
        let mut d = Decompressor::default();
        assert_eq!(d.deflate(&stream, &mut out, data.len()), Ok(len));
        assert_eq!(out, data);
        // Reused: the old contents are replaced, not appended to.
        assert_eq!(d.deflate(&stream, &mut out, usize::MAX), Ok(len));
        assert_eq!(out, data);
    }

    #[test]
    fn too_small_a_buffer_and_bad_data_are_told_apart() {
        let data = vec![b'x'; 10_000];
        let stream = raw_deflate(&data);
        let mut d = Decompressor::default();
        let mut out = Vec::with_capacity(20_000);
        assert_eq!(
            d.deflate(&stream, &mut out, 9_999),
            Err(Error::InsufficientSpace),
            "the limit, not the capacity, bounds the output"
        );
        assert!(out.is_empty());
        assert_eq!(
            d.deflate(&[0xff; 64], &mut out, 20_000),
            Err(Error::BadData)
        );
        assert_eq!(d.gzip(&stream, &mut out, 20_000), Err(Error::BadData));
    }
}
