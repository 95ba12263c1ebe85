//! The two checks every byte of a decoded zlib body needs, in one pass: its Adler-32 (compared
//! with the stream's trailer by `payload.rs`) and whether it is UTF-8.
//!
//! Apart, each is a pass over the whole output (libdeflate's Adler-32, then simdutf8): together
//! about 10 % of `process` on the recorded mix (5 % in one pass), most of it on the 7.4 MB full
//! snapshot, which the decoder has just pushed out of the core's own caches. With AVX-512 VNNI
//! they share each 64-byte load: the Adler sums take two `vpdpbusd`, and an OR of the blocks tells
//! whether a 4 KiB chunk holds any byte above 0x7F. Only runs of such chunks are then validated as
//! UTF-8, right after they were summed, while they are still in the cache; ASCII needs nothing
//! more. Without AVX-512 VNNI (or off x86_64) the two checks run one after the other.

/// What one pass over the bytes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub adler32: u32,
    pub utf8: bool,
}

/// Adler-32's modulus.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MOD: u64 = 65521;

/// The Adler-32 of `bytes` and whether they are UTF-8.
pub fn adler32_utf8(bytes: &[u8]) -> Verified {
    #[cfg(target_arch = "x86_64")]
    if vnni_available() {
        return fused(bytes);
    }
    Verified {
        adler32: adler32(bytes),
        utf8: simdutf8::basic::from_utf8(bytes).is_ok(),
    }
}

/// The Adler-32 of `bytes` (libdeflate's, vectorised for the CPU it runs on).
pub fn adler32(bytes: &[u8]) -> u32 {
    // SAFETY: `bytes` is readable for its length.
    unsafe { libdeflate_sys::libdeflate_adler32(1, bytes.as_ptr().cast(), bytes.len()) }
}

/// Bytes summed per call of the vector loop: small enough that no 32-bit lane can overflow
/// (see `chunk_avx512`), large enough that the call and the reduction are noise.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const CHUNK: usize = 4096;

/// A run of non-ASCII chunks is validated once it is this long, so that its start is still in
/// the cache when it is read again.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const RUN: usize = 64 << 10;

#[cfg(target_arch = "x86_64")]
fn vnni_available() -> bool {
    use std::arch::is_x86_feature_detected;
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// The running sums of Adler-32, each below [`MOD`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Sums {
    s1: u64,
    s2: u64,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Sums {
    const START: Sums = Sums { s1: 1, s2: 0 };

    fn scalar(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.s1 += u64::from(byte);
            self.s2 += self.s1;
        }
        self.s1 %= MOD;
        self.s2 %= MOD;
    }

    fn value(self) -> u32 {
        // Both below 65521: the result fits.
        (self.s2 << 16 | self.s1) as u32
    }
}

/// The vector pass with UTF-8 validated run by run. A run of non-ASCII chunks starts right after
/// an ASCII chunk (or at the start) and ends right before one (or at the end), so its edges are
/// ASCII bytes and no character crosses them; a run validated before it ends (past [`RUN`]) is
/// cut at the start of a character. UTF-8 strings joined are UTF-8, so valid runs make a valid
/// whole, and a character split by none of the cuts is seen whole by one validation.
#[cfg(target_arch = "x86_64")]
fn fused(bytes: &[u8]) -> Verified {
    let mut sums = Sums::START;
    let mut utf8 = true;
    let mut run: Option<usize> = None;
    let valid = |run: &[u8]| simdutf8::basic::from_utf8(run).is_ok();
    for (index, chunk) in bytes.chunks(CHUNK).enumerate() {
        let start = index * CHUNK;
        // SAFETY: the features `chunk_avx512` is compiled for were detected on this CPU.
        let ascii = unsafe { chunk_avx512(&mut sums, chunk) };
        match (ascii, run) {
            (false, None) => run = Some(start),
            (true, Some(from)) => {
                utf8 &= valid(bytes.get(from..start).unwrap_or_default());
                run = None;
            }
            (false, Some(from)) if start - from >= RUN => {
                let cut = char_start(bytes, start);
                utf8 &= valid(bytes.get(from..cut).unwrap_or_default());
                run = Some(cut);
            }
            _ => {}
        }
    }
    if let Some(from) = run {
        utf8 &= valid(bytes.get(from..).unwrap_or_default());
    }
    Verified {
        adler32: sums.value(),
        utf8,
    }
}

/// `at`, moved back over at most three continuation bytes: where the character that byte `at`
/// belongs to starts. (Four or more in a row are invalid wherever the cut falls.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn char_start(bytes: &[u8], mut at: usize) -> usize {
    for _ in 0..3 {
        match bytes.get(at) {
            Some(0x80..=0xbf) if at > 0 => at -= 1,
            _ => break,
        }
    }
    at
}

/// Adds `chunk` (at most [`CHUNK`] bytes) to `sums`; whether it is all ASCII.
///
/// Four 64-byte blocks per step, each with its own accumulators (a `vpdpbusd` waits for the one
/// before it on the same register). Per 32-bit lane, over at most 64 blocks: `s1` sums at most
/// 16 × 4 bytes of 255 (16 320), `before` at most 16 of those (261 120), `s2` at most 16 × 4
/// bytes × 64 × 255 (4.2 M); the lane totals (16 lanes) stay far below 2^31.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn chunk_avx512(sums: &mut Sums, chunk: &[u8]) -> bool {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_movepi8_mask,
        _mm512_or_si512, _mm512_reduce_add_epi32, _mm512_set1_epi8, _mm512_setzero_si512,
    };
    const GROUP: usize = 4 * 64;
    // Byte i of a block weighs 64 - i in `s2`.
    const WEIGHTS: [i8; 64] = {
        let mut w = [0i8; 64];
        let mut i = 0;
        while i < 64 {
            #[allow(clippy::indexing_slicing)] // i < 64: a constant, checked at compile time
            {
                w[i] = (64 - i) as i8;
            }
            i += 1;
        }
        w
    };
    // SAFETY: `WEIGHTS` is 64 readable bytes.
    let weights = unsafe { _mm512_loadu_si512(WEIGHTS.as_ptr().cast()) };
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    // Per stream: the byte sums, the weighted sums, and the byte sums of the groups before.
    let mut streams = [[zero; 3]; 4];
    let mut high = zero;
    let groups = chunk.chunks_exact(GROUP);
    let rest = groups.remainder();
    let summed = chunk.len() - rest.len();
    for group in groups {
        for (k, [s1, s2, before]) in streams.iter_mut().enumerate() {
            // SAFETY: `group` is 256 readable bytes; block `k` (< 4) is its bytes 64k..64k+64.
            let block = unsafe { _mm512_loadu_si512(group.as_ptr().add(64 * k).cast()) };
            high = _mm512_or_si512(high, block);
            *before = _mm512_add_epi32(*before, *s1);
            *s2 = _mm512_dpbusd_epi32(*s2, block, weights);
            *s1 = _mm512_dpbusd_epi32(*s1, block, ones);
        }
    }
    let s1 = streams.map(|[s1, _, _]| s1);
    let s2 = streams.map(|[_, s2, _]| s2);
    let before = streams.map(|[_, _, before]| before);
    let total = |v: [__m512i; 4]| v.map(|v| _mm512_reduce_add_epi32(v) as u32 as u64);
    let (s1, s2, before) = (total(s1), total(s2), total(before));
    // Group j adds 64 × (4 P + 3 a + 2 b + c) + the weighted sums, where P is what the groups
    // before it summed and a, b, c its first three blocks' sums: `before` holds the P of each
    // stream, group by group.
    let [a, b, c, _] = s1;
    let chunk_s1: u64 = s1.iter().sum();
    let chunk_s2 =
        256 * before.iter().sum::<u64>() + 64 * (3 * a + 2 * b + c) + s2.iter().sum::<u64>();
    sums.s2 = (sums.s2 + sums.s1 * summed as u64 + chunk_s2) % MOD;
    sums.s1 = (sums.s1 + chunk_s1) % MOD;
    sums.scalar(rest);
    _mm512_movepi8_mask(high) == 0 && rest.is_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Adler-32 from its definition.
    fn reference_adler(bytes: &[u8]) -> u32 {
        let mut sums = Sums::START;
        sums.scalar(bytes);
        sums.value()
    }

    #[test]
    fn the_checks_match_their_definitions_at_every_length_around_the_block_edges() {
        let text = "{\"text\":\"caf\u{e9} \u{2014} \u{1f600}\",\"n\":[1,2]}".repeat(400);
        let binary: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 255) as u8).collect();
        let saturated = vec![0xffu8; 3 * CHUNK + 100];
        for bytes in [text.as_bytes(), &binary, &saturated] {
            for len in (0..300).chain([4095, 4096, 4097, 8191, 8192, 8193, bytes.len()]) {
                let bytes = &bytes[..len.min(bytes.len())];
                let verified = adler32_utf8(bytes);
                assert_eq!(verified.adler32, reference_adler(bytes), "{len}");
                assert_eq!(verified.adler32, adler32(bytes), "{len}");
                assert_eq!(verified.utf8, std::str::from_utf8(bytes).is_ok(), "{len}");
            }
        }
    }

    #[test]
    fn a_character_across_a_chunk_edge_is_valid_and_a_broken_one_is_not() {
        let euro = "\u{20ac}".as_bytes();
        for offset in 0..4 {
            // ASCII chunks around one that holds the character across its edge.
            let mut bytes = vec![b'a'; CHUNK - offset];
            bytes.extend_from_slice(euro);
            bytes.resize(3 * CHUNK, b'b');
            assert!(adler32_utf8(&bytes).utf8, "{offset}");
            // The character cut short by an ASCII byte.
            let mut broken = bytes.clone();
            broken[CHUNK - offset + 2] = b'c';
            assert!(!adler32_utf8(&broken).utf8, "{offset}");
            // A stray continuation byte alone in an otherwise ASCII chunk.
            let mut stray = vec![b'a'; 3 * CHUNK];
            stray[CHUNK + offset] = 0x80;
            assert!(!adler32_utf8(&stray).utf8, "{offset}");
        }
    }

    #[test]
    fn a_long_non_ascii_run_is_cut_at_character_starts() {
        // Three-byte characters throughout, far past `RUN`: every cut lands inside one and must
        // move back to its start.
        let long = "\u{20ac}".repeat(3 * RUN);
        assert!(adler32_utf8(long.as_bytes()).utf8);
        let mut broken = long.into_bytes();
        // A character's second byte, past the first cut, made ASCII.
        broken[3 * (RUN / 3 + 100) + 1] = b'A';
        assert!(!adler32_utf8(&broken).utf8);
        // Five continuation bytes in a row across a cut.
        let mut run = "\u{20ac}".repeat(2 * RUN).into_bytes();
        run[RUN - 2..RUN + 3].fill(0x80);
        assert!(!adler32_utf8(&run).utf8);
    }

    proptest! {
        #[test]
        fn the_fused_pass_agrees_with_libdeflate_and_std(
            parts in proptest::collection::vec(
                prop_oneof![
                    "[ -~]{0,3000}".prop_map(String::into_bytes),
                    "\\PC{0,300}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..300),
                ],
                0..12,
            ),
        ) {
            let bytes = parts.concat();
            let verified = adler32_utf8(&bytes);
            prop_assert_eq!(verified.adler32, adler32(&bytes));
            prop_assert_eq!(verified.adler32, reference_adler(&bytes));
            prop_assert_eq!(verified.utf8, std::str::from_utf8(&bytes).is_ok());
        }
    }
}
