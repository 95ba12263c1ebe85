//! A structural JSON scanner for the hot path: walks the rrweb event array and each event's
//! top-level keys, and skips everything else — full snapshots, mutations — at memory speed.
//!
//! What is checked where:
//! - the array and each event object (`[`, `{`, keys, `:`, `,`, `}`, `]`, scalar tokens): full
//!   JSON syntax; a violation is a syntax error and fails the segment;
//! - a skipped container value (an event's `data`): *structure* only — strings are terminated
//!   (escapes honoured) and brackets balance. Its tokens are not re-validated one by one: that is
//!   what makes the scan several times faster than a validating parse, and the zlib stream's
//!   Adler-32 already guards the bytes against corruption. Values this service reads (custom
//!   events, Meta) are parsed again with a validating parser.
//!
//! Containers are skipped 64 bytes at a time: per block, bitmasks of quotes, backslashes and
//! brackets, escaped quotes removed (nothing to do in a block without a backslash), in-string bytes
//! found with a prefix XOR, and the bracket depth tracked by popcount — close by close only in a
//! block where the container may end. The masks come from the widest vector unit available:
//! AVX-512BW or AVX2, with carry-less multiplication and `popcnt`, when the CPU has them (detected
//! at run time), SSE2 otherwise on x86_64, NEON on aarch64, a byte loop elsewhere. Every
//! implementation is checked against the byte loop.

use std::fmt;

/// Where and why the input is not (structurally) JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub offset: usize,
    pub expected: &'static str,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {} at byte {}", self.expected, self.offset)
    }
}

const BLOCK: usize = 64;

/// Bitmasks over one 64-byte block: bit `i` describes byte `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Masks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
}

/// `{` and `[` (and `}` and `]`) differ only in bit 0x20.
const OPEN_FOLDED: u8 = b'{';
const CLOSE_FOLDED: u8 = b'}';

#[cfg_attr(any(target_arch = "x86_64", target_arch = "aarch64"), allow(dead_code))]
fn masks_scalar(block: &[u8; BLOCK]) -> Masks {
    let mut m = Masks {
        quote: 0,
        backslash: 0,
        open: 0,
        close: 0,
    };
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'{' | b'[' => m.open |= bit,
            b'}' | b']' => m.close |= bit,
            _ => {}
        }
    }
    m
}

/// The baseline masks: SSE2 is part of x86_64.
#[cfg(target_arch = "x86_64")]
fn masks(block: &[u8; BLOCK]) -> Masks {
    // SAFETY: SSE2 is part of the x86_64 baseline: every x86_64 CPU has it.
    unsafe { masks_sse2(block) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn masks_sse2(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let quote = _mm_set1_epi8(b'"' as i8);
    let backslash = _mm_set1_epi8(b'\\' as i8);
    let fold = _mm_set1_epi8(0x20);
    let open = _mm_set1_epi8(OPEN_FOLDED as i8);
    let close = _mm_set1_epi8(CLOSE_FOLDED as i8);
    let mut m = Masks {
        quote: 0,
        backslash: 0,
        open: 0,
        close: 0,
    };
    for (lane, chunk) in block.chunks_exact(16).enumerate() {
        // SAFETY: `chunk` is exactly 16 readable bytes; `loadu` has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>()) };
        let folded = _mm_or_si128(v, fold);
        let shift = lane * 16;
        m.quote |= u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(v, quote)) as u16) << shift;
        m.backslash |= u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(v, backslash)) as u16) << shift;
        m.open |= u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(folded, open)) as u16) << shift;
        m.close |= u64::from(_mm_movemask_epi8(_mm_cmpeq_epi8(folded, close)) as u16) << shift;
    }
    m
}

/// The features the AVX2 skip is compiled for, all present on every AVX2 CPU (Haswell, Zen and
/// later) but checked one by one — once: every container skip asks.
#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    use std::arch::is_x86_feature_detected;
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("popcnt")
            && is_x86_feature_detected!("bmi1")
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn masks_avx2(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_or_si256,
        _mm256_set1_epi8,
    };
    let (lo, hi) = block.split_at(32);
    // SAFETY: both halves are exactly 32 readable bytes; `loadu` has no alignment requirement.
    let (lo, hi) = unsafe {
        (
            _mm256_loadu_si256(lo.as_ptr().cast::<__m256i>()),
            _mm256_loadu_si256(hi.as_ptr().cast::<__m256i>()),
        )
    };
    let fold = _mm256_set1_epi8(0x20);
    let (lo_folded, hi_folded) = (_mm256_or_si256(lo, fold), _mm256_or_si256(hi, fold));
    let mask = |lo: __m256i, hi: __m256i, byte: u8| {
        let byte = _mm256_set1_epi8(byte as i8);
        let lo = u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, byte)) as u32);
        let hi = u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, byte)) as u32);
        lo | hi << 32
    };
    Masks {
        quote: mask(lo, hi, b'"'),
        backslash: mask(lo, hi, b'\\'),
        open: mask(lo_folded, hi_folded, OPEN_FOLDED),
        close: mask(lo_folded, hi_folded, CLOSE_FOLDED),
    }
}

/// The AVX-512 skip's features: AVX-512BW compares 64 bytes into a mask in one instruction.
#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| avx2_available() && std::arch::is_x86_feature_detected!("avx512bw"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw")]
fn masks_avx512(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::{
        _mm512_cmpeq_epi8_mask, _mm512_loadu_si512, _mm512_or_si512, _mm512_set1_epi8,
    };
    // SAFETY: `block` is exactly 64 readable bytes; `loadu` has no alignment requirement.
    let v = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
    let folded = _mm512_or_si512(v, _mm512_set1_epi8(0x20));
    Masks {
        quote: _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(b'"' as i8)),
        backslash: _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(b'\\' as i8)),
        open: _mm512_cmpeq_epi8_mask(folded, _mm512_set1_epi8(OPEN_FOLDED as i8)),
        close: _mm512_cmpeq_epi8_mask(folded, _mm512_set1_epi8(CLOSE_FOLDED as i8)),
    }
}

/// [`prefix_xor`] in one carry-less multiplication by all ones.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq")]
fn prefix_xor_clmul(x: u64) -> u64 {
    use std::arch::x86_64::{
        _mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_set_epi64x, _mm_set1_epi8,
    };
    _mm_cvtsi128_si64(_mm_clmulepi64_si128(
        _mm_set_epi64x(0, x as i64),
        _mm_set1_epi8(-1),
        0,
    )) as u64
}

/// The baseline masks: NEON is part of aarch64.
#[cfg(target_arch = "aarch64")]
fn masks(block: &[u8; BLOCK]) -> Masks {
    // SAFETY: NEON is part of the aarch64 baseline: every aarch64 CPU has it.
    unsafe { masks_neon(block) }
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn masks_neon(block: &[u8; BLOCK]) -> Masks {
    use std::arch::aarch64::{
        uint8x16_t, vandq_u8, vceqq_u8, vdupq_n_u8, vgetq_lane_u64, vld1q_u8, vorrq_u8, vpaddq_u8,
        vreinterpretq_u64_u8,
    };
    // SAFETY: `block` is 64 readable bytes, four loads of 16.
    let v: [uint8x16_t; 4] =
        std::array::from_fn(|i| unsafe { vld1q_u8(block.as_ptr().add(16 * i)) });
    let fold = vdupq_n_u8(0x20);
    let folded = v.map(|v| vorrq_u8(v, fold));
    // Bit `i % 8` of each byte, so that three pairwise additions pack 64 comparison results
    // into one u64 (the usual NEON stand-in for x86's movemask).
    let weights: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `weights` is 16 readable bytes.
    let weights = unsafe { vld1q_u8(weights.as_ptr()) };
    let mask = |v: &[uint8x16_t; 4], byte: u8| {
        let byte = vdupq_n_u8(byte);
        let [a, b, c, d] = v.map(|v| vandq_u8(vceqq_u8(v, byte), weights));
        let packed = vpaddq_u8(vpaddq_u8(a, b), vpaddq_u8(c, d));
        vgetq_lane_u64::<0>(vreinterpretq_u64_u8(vpaddq_u8(packed, packed)))
    };
    Masks {
        quote: mask(&v, b'"'),
        backslash: mask(&v, b'\\'),
        open: mask(&folded, OPEN_FOLDED),
        close: mask(&folded, CLOSE_FOLDED),
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn masks(block: &[u8; BLOCK]) -> Masks {
    masks_scalar(block)
}

/// Bits of characters escaped by a preceding odd run of backslashes; `carry` is 1 when the
/// previous block ended in such a run. Most blocks have no backslash and carry none: they return
/// at once (the skip runs 1.4× faster on a large DOM than with the arithmetic on every block).
#[inline(always)]
fn escaped(backslash: u64, carry: &mut u64) -> u64 {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    if backslash | *carry == 0 {
        return 0;
    }
    let backslash = backslash & !*carry;
    let follows_escape = (backslash << 1) | *carry;
    let odd_starts = backslash & !EVEN & !follows_escape;
    let (even_run_ends, overflow) = odd_starts.overflowing_add(backslash);
    *carry = u64::from(overflow);
    (EVEN ^ (even_run_ends << 1)) & follows_escape
}

/// Bit `i` set when an odd number of bits `0..=i` are set: the bytes inside a string (opening
/// quote included, closing quote excluded).
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// Deepest nesting a value handed to a recursive parser may have. Parsers recurse once per
/// level; a crafted `[[[[…` a million levels deep would overflow the thread's stack, which aborts
/// the process (no unwinding). 128 is serde_json's own limit; SDK payloads nest under 10.
pub const MAX_NESTING: u64 = 128;

/// Whether the JSON value `value` starts with (as [`Scanner::value`] returns it, or a document
/// without leading whitespace) nests objects and arrays more than [`MAX_NESTING`] levels deep. Asked only of the values handed to a recursive parser:
/// a value short enough cannot be that deep; a longer one gets a bound from a skip that tracks
/// depth (at SIMD speed), and the exact byte loop only if the bound is too high.
pub fn too_deep(value: &str) -> bool {
    let bytes = value.as_bytes();
    // Every level takes an opening and a closing bracket.
    if bytes.len() <= 2 * MAX_NESTING as usize || !matches!(bytes.first(), Some(b'{' | b'[')) {
        return false;
    }
    skip_container::<true>(bytes, 0).map_or(true, |(_, bound)| bound > MAX_NESTING)
        && nesting_exceeds(bytes, MAX_NESTING)
}

/// Skips the container (`{…}` or `[…]`) opening at `json[start]`; returns the offset just past
/// it and, with `DEPTH`, an upper bound of its nesting depth (at most 64 levels above the true
/// depth; [`nesting_exceeds`] is exact). Without `DEPTH` the bound is 0: the scan's hot path
/// does not pay for it.
fn skip_container<const DEPTH: bool>(
    json: &[u8],
    start: usize,
) -> Result<(usize, u64), SyntaxError> {
    #[cfg(target_arch = "x86_64")]
    if avx512_available() {
        // SAFETY: every feature `skip_avx512` is compiled for was detected on this CPU.
        return unsafe { skip_avx512::<DEPTH>(json, start) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_available() {
        // SAFETY: every feature `skip_avx2` is compiled for was detected on this CPU.
        return unsafe { skip_avx2::<DEPTH>(json, start) };
    }
    skip_blocks::<DEPTH>(json, start, masks, prefix_xor)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,pclmulqdq,popcnt,bmi1")]
fn skip_avx2<const DEPTH: bool>(json: &[u8], start: usize) -> Result<(usize, u64), SyntaxError> {
    skip_blocks::<DEPTH>(
        json,
        start,
        |block| masks_avx2(block),
        |x| prefix_xor_clmul(x),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw,avx2,pclmulqdq,popcnt,bmi1")]
fn skip_avx512<const DEPTH: bool>(json: &[u8], start: usize) -> Result<(usize, u64), SyntaxError> {
    skip_blocks::<DEPTH>(
        json,
        start,
        |block| masks_avx512(block),
        |x| prefix_xor_clmul(x),
    )
}

/// The block loop, generic over how masks and prefix XORs are computed; inlined into each
/// caller, so that the AVX2 caller's target features apply to all of it.
#[inline(always)]
fn skip_blocks<const DEPTH: bool>(
    json: &[u8],
    start: usize,
    masks: impl Fn(&[u8; BLOCK]) -> Masks,
    prefix_xor: impl Fn(u64) -> u64,
) -> Result<(usize, u64), SyntaxError> {
    let mut state = SkipState {
        depth: 0,
        deepest: 0,
        escape_carry: 0,
        string_carry: 0,
    };
    let mut pos = start;
    while let Some(block) = json
        .get(pos..pos.saturating_add(BLOCK))
        .and_then(|b| <&[u8; BLOCK]>::try_from(b).ok())
    {
        if let Some(end) = state.block::<DEPTH>(masks(block), &prefix_xor) {
            return Ok((pos + end, state.deepest));
        }
        pos += BLOCK;
    }
    let rest = json.get(pos..).unwrap_or_default();
    if !rest.is_empty() {
        let mut padded = [b' '; BLOCK];
        padded
            .get_mut(..rest.len())
            .unwrap_or_default()
            .copy_from_slice(rest);
        if let Some(end) = state.block::<DEPTH>(masks(&padded), &prefix_xor) {
            return Ok((pos + end, state.deepest));
        }
    }
    Err(SyntaxError {
        offset: json.len(),
        expected: "the end of an object or array",
    })
}

/// What one block of a skip hands to the next.
struct SkipState {
    depth: u64,
    deepest: u64,
    escape_carry: u64,
    string_carry: u64,
}

impl SkipState {
    /// Takes one block's masks; `Some(i)` when the container ends just before byte `i` of it.
    #[inline(always)]
    fn block<const DEPTH: bool>(
        &mut self,
        m: Masks,
        prefix_xor: impl Fn(u64) -> u64,
    ) -> Option<usize> {
        let quotes = m.quote & !escaped(m.backslash, &mut self.escape_carry);
        let in_string = prefix_xor(quotes) ^ self.string_carry;
        self.string_carry = ((in_string as i64) >> 63) as u64;
        let open = m.open & !in_string;
        let close = m.close & !in_string;
        let (opens, closes) = (u64::from(open.count_ones()), u64::from(close.count_ones()));
        if DEPTH {
            // It cannot nest deeper than every open first.
            self.deepest = self.deepest.max(self.depth + opens);
        }
        if self.depth <= closes {
            // It may end here: at the first close where the closes so far match the depth
            // before the block plus the opens before that close. (Close by close, a branch
            // that is almost never taken: no misprediction per bracket.)
            let (mut rest, mut closed) = (close, 0u64);
            while rest != 0 {
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                closed += 1;
                let opens_before = u64::from((open & ((1u64 << bit) - 1)).count_ones());
                if self.depth + opens_before == closed {
                    return Some(bit as usize + 1);
                }
            }
        }
        // Never below zero: had it reached zero, the loop above returned.
        self.depth = self.depth + opens - closes;
        None
    }
}

/// A cursor over JSON text with full syntax checks for the parts it walks.
pub struct Scanner<'a> {
    json: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(json: &'a str) -> Self {
        Scanner { json, pos: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.json.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn error<T>(&self, expected: &'static str) -> Result<T, SyntaxError> {
        Err(SyntaxError {
            offset: self.pos,
            expected,
        })
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.pos += 1;
        }
    }

    fn slice(&self, start: usize) -> &'a str {
        self.json.get(start..self.pos).unwrap_or_default()
    }

    /// Consumes `byte` after optional whitespace.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        if self.peek() == Some(byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Ensures nothing but whitespace is left.
    pub fn end(&mut self) -> Result<(), SyntaxError> {
        self.skip_ws();
        if self.pos == self.json.len() {
            Ok(())
        } else {
            self.error("the end of the input")
        }
    }

    /// A string's raw contents (escapes left as is), validating its escapes.
    fn string(&mut self) -> Result<&'a str, SyntaxError> {
        if self.peek() != Some(b'"') {
            return self.error("a string");
        }
        let start = self.pos + 1;
        let mut i = start;
        loop {
            let rest = self.bytes().get(i..).unwrap_or_default();
            let Some(at) = quote_or_backslash(rest) else {
                self.pos = self.json.len();
                return self.error("the end of a string");
            };
            i += at;
            if self.bytes().get(i) == Some(&b'"') {
                self.pos = i + 1;
                return Ok(self.json.get(start..i).unwrap_or_default());
            }
            match self.bytes().get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                Some(b'u')
                    if self
                        .bytes()
                        .get(i + 2..i + 6)
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                {
                    i += 6
                }
                _ => {
                    self.pos = i;
                    return self.error("a valid escape sequence");
                }
            }
        }
    }

    /// A number or literal token, validated.
    fn scalar(&mut self) -> Result<&'a str, SyntaxError> {
        let start = self.pos;
        while matches!(
            self.peek(),
            Some(b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-' | b'.')
        ) {
            self.pos += 1;
        }
        let token = self.slice(start);
        let valid = matches!(token, "true" | "false" | "null") || is_json_number(token);
        if valid {
            Ok(token)
        } else {
            self.pos = start;
            self.error("a JSON value")
        }
    }

    /// Skips one value (after whitespace) and returns its raw text.
    pub fn value(&mut self) -> Result<&'a str, SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        match self.peek() {
            Some(b'{' | b'[') => {
                self.pos = skip_container::<false>(self.bytes(), start)?.0;
                Ok(self.slice(start))
            }
            Some(b'"') => {
                self.string()?;
                Ok(self.slice(start))
            }
            Some(_) => self.scalar(),
            None => self.error("a JSON value"),
        }
    }

    /// Enters an array; then call `next_element` until it returns `false`.
    pub fn begin_array(&mut self) -> Result<(), SyntaxError> {
        if self.eat(b'[') {
            Ok(())
        } else {
            self.error("'['")
        }
    }

    /// Moves to the next element of the current array; `false` after its `]`.
    pub fn next_element(&mut self, first: bool) -> Result<bool, SyntaxError> {
        if self.eat(b']') {
            return Ok(false);
        }
        if !first && !self.eat(b',') {
            return self.error("',' or ']'");
        }
        self.skip_ws();
        if self.peek().is_none() {
            self.error("an array element")
        } else {
            Ok(true)
        }
    }

    /// Whether the next value (after whitespace) is an object.
    pub fn at_object(&mut self) -> bool {
        self.skip_ws();
        self.peek() == Some(b'{')
    }

    /// Enters an object; then call `next_key` until it returns `None`.
    pub fn begin_object(&mut self) -> Result<(), SyntaxError> {
        if self.eat(b'{') {
            Ok(())
        } else {
            self.error("'{'")
        }
    }

    /// The next key (raw) of the current object, with the `:` consumed; `None` after its `}`.
    pub fn next_key(&mut self, first: bool) -> Result<Option<&'a str>, SyntaxError> {
        if self.eat(b'}') {
            return Ok(None);
        }
        if !first && !self.eat(b',') {
            return self.error("',' or '}'");
        }
        self.skip_ws();
        let key = self.string()?;
        if !self.eat(b':') {
            return self.error("':'");
        }
        Ok(Some(key))
    }
}

/// Words a string is searched a word at a time before [`memchr::memchr2`] takes over: keys and
/// most values rrweb events carry end within them, and for those the word loop is cheaper than
/// memchr's dispatch to its vector code.
const SHORT_STRING_WORDS: usize = 4;

/// The offset of the first `"` or `\` in `bytes`.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // The high bit of each byte of `word` equal to `byte`, and possibly of bytes above the first
    // such one (a borrow); the lowest bit set is always exact.
    let equal = |word: u64, byte: u8| {
        let x = word ^ (ONES * u64::from(byte));
        x.wrapping_sub(ONES) & !x & HIGHS
    };
    let mut words = bytes.chunks_exact(8);
    for (n, word) in words.by_ref().take(SHORT_STRING_WORDS).enumerate() {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let found = equal(word, b'"') | equal(word, b'\\');
        if found != 0 {
            return Some(n * 8 + (found.trailing_zeros() / 8) as usize);
        }
    }
    let searched = (bytes.len() - words.remainder().len()).min(SHORT_STRING_WORDS * 8);
    let rest = bytes.get(searched..).unwrap_or_default();
    memchr::memchr2(b'"', b'\\', rest).map(|at| searched + at)
}

/// Whether `json` nests objects and arrays more than `limit` levels deep (brackets inside
/// strings do not count). A byte loop: for small values, or after a cheap bound was exceeded.
pub fn nesting_exceeds(json: &[u8], limit: u64) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0u64, false, false);
    for &byte in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// RFC 8259 number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn is_json_number(token: &str) -> bool {
    let b = token.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// The raw value of `key` in the object `json`, scanning only until it is found. `None` when
/// `json` is not an object or lacks the key.
pub fn field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let mut scanner = Scanner::new(json);
    scanner.begin_object().ok()?;
    let mut first = true;
    while let Some(k) = scanner.next_key(first).ok()? {
        first = false;
        let value = scanner.value().ok()?;
        if k == key {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn skip(json: &str) -> Result<&str, SyntaxError> {
        Scanner::new(json).value()
    }

    #[test]
    fn containers_end_at_their_matching_bracket_whatever_the_strings_hold() {
        for json in [
            r#"{}"#,
            r#"[1,[2,[3]],{"a":"]}"}]"#,
            r#"{"a":"\"}","b":"\\","c":"\\\"]"}"#,
            r#"{"css":".x{color:red}[data-a]{}","t":"\\\\\\\""}"#,
        ] {
            let padded = format!("{json} ,[9]");
            assert_eq!(skip(&padded).unwrap(), json);
        }
    }

    #[test]
    fn containers_spanning_many_blocks_and_escapes_across_block_edges_are_skipped() {
        for pad in 0..130 {
            let text = format!("{}\\\\\\\"]{}", "x".repeat(pad), "y".repeat(pad % 7));
            let json = format!(r#"[{{"a":"{text}","b":[{{"c":"}}"}}]}}, "{text}"]"#);
            assert_eq!(skip(&format!("{json}]]")).unwrap(), json, "pad {pad}");
        }
    }

    #[test]
    fn unbalanced_or_unterminated_containers_are_errors() {
        for json in ["[", "{\"a\":[1,2}", "[\"]", "{\"a\":\"\\\"}", "[[[]]"] {
            assert!(skip(json).is_err(), "{json}");
        }
    }

    #[test]
    fn scalars_are_validated() {
        for ok in [
            "0",
            "-0.5",
            "1e9",
            "1796012448.69",
            "true",
            "null",
            "\"a\\u00e9\"",
        ] {
            assert_eq!(skip(ok).unwrap(), ok);
        }
        for bad in [
            "01", "1.", "+1", "tru", "nul", "\"\\x\"", "\"open", "-", "1e", ".5",
        ] {
            assert!(skip(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_finds_a_key_without_scanning_past_it() {
        assert_eq!(field(r#"{"source":0,"adds":[{"x":"#, "source"), Some("0"));
        assert_eq!(
            field(r#"{"a":{"source":1},"source":2}"#, "source"),
            Some("2")
        );
        assert_eq!(field(r#"[{"source":1}]"#, "source"), None);
        assert_eq!(field(r#"{"a":1}"#, "source"), None);
    }

    #[test]
    fn object_and_array_walks_check_punctuation() {
        let mut s = Scanner::new(r#"[{"a" 1}]"#);
        s.begin_array().unwrap();
        assert!(s.next_element(true).unwrap());
        s.begin_object().unwrap();
        assert!(s.next_key(true).is_err());
        let mut s = Scanner::new("[1 2]");
        s.begin_array().unwrap();
        assert!(s.next_element(true).unwrap());
        s.value().unwrap();
        assert!(s.next_element(false).is_err());
    }

    #[test]
    fn nesting_counts_brackets_outside_strings_only() {
        assert!(!nesting_exceeds(br#"[[{"a":"[[[[\"[[["}]]"#, 3));
        assert!(nesting_exceeds(br#"[[{"a":[]}]]"#, 3));
        assert!(!nesting_exceeds(br#"[[{"a":[]}]]"#, 4));
        let deep = format!("{}{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
        assert!(nesting_exceeds(deep.as_bytes(), MAX_NESTING));
        let mut s = Scanner::new(&deep);
        let value = s.value().unwrap();
        assert!(too_deep(value), "a million levels are skipped, and flagged");
    }

    /// The depth of a JSON value: scalars 0, each container one more than its deepest child.
    fn depth(value: &serde_json::Value) -> u64 {
        match value {
            serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        /// The skip's bound never under-reports, and the exact check agrees with the true depth.
        #[test]
        fn the_depth_bound_is_never_below_the_true_depth(value in json_value(), limit in 0u64..8) {
            let text = serde_json::to_string(&value).unwrap();
            if text.starts_with(['[', '{']) {
                let (end, bound) = skip_container::<true>(text.as_bytes(), 0).unwrap();
                prop_assert_eq!(end, text.len());
                prop_assert!(bound >= depth(&value));
            }
            prop_assert_eq!(nesting_exceeds(text.as_bytes(), limit), depth(&value) > limit);
        }

        /// `too_deep` is exact at the limit, whatever the padding around the levels.
        #[test]
        fn too_deep_is_exact_at_the_limit(levels in 120usize..136, pad in 0usize..300, strings in any::<bool>()) {
            let filler = if strings { format!("\"{}\",", "[{".repeat(pad / 2)) } else { " ".repeat(pad) };
            let text = format!("{}{filler}0{}", "[".repeat(levels), "]".repeat(levels));
            prop_assert_eq!(too_deep(&text), levels as u64 > MAX_NESTING);
        }

        #[test]
        fn simd_and_scalar_masks_agree(bytes in prop::collection::vec(
            prop::sample::select(vec![b'"', b'\\', b'{', b'}', b'[', b']', b'a', b' ', 0x5b, 0x7b, 0xff, 0x00]),
            BLOCK,
        )) {
            let block: [u8; BLOCK] = bytes.try_into().unwrap();
            prop_assert_eq!(masks(&block), masks_scalar(&block));
            #[cfg(target_arch = "x86_64")]
            if avx2_available() {
                // SAFETY: detected on this CPU.
                prop_assert_eq!(unsafe { masks_avx2(&block) }, masks_scalar(&block));
            }
            #[cfg(target_arch = "x86_64")]
            if avx512_available() {
                // SAFETY: detected on this CPU.
                prop_assert_eq!(unsafe { masks_avx512(&block) }, masks_scalar(&block));
            }
        }

        /// The word loop finds what memchr finds, wherever in or past the short words it is.
        #[test]
        fn a_strings_end_is_found_as_memchr_finds_it(bytes in prop::collection::vec(
            prop::sample::select(vec![b'"', b'\\', b'a', b'"' ^ 0x80, b'\\' ^ 0x80, 0x01, 0x00, 0xff]),
            0..80,
        ), plain in 0usize..80) {
            let mut text = vec![b'x'; plain.min(bytes.len())];
            text.extend_from_slice(&bytes);
            prop_assert_eq!(quote_or_backslash(&text), memchr::memchr2(b'"', b'\\', &text));
        }

        #[test]
        fn every_prefix_xor_agrees(x in any::<u64>()) {
            let reference = (0..64).fold((0u64, false), |(bits, odd), i| {
                let odd = odd ^ (x >> i & 1 == 1);
                (bits | u64::from(odd) << i, odd)
            }).0;
            prop_assert_eq!(prefix_xor(x), reference);
            #[cfg(target_arch = "x86_64")]
            if avx2_available() {
                // SAFETY: detected on this CPU.
                prop_assert_eq!(unsafe { prefix_xor_clmul(x) }, reference);
            }
        }

        /// Every skip implementation ends at the same byte with the same depth bound (or fails
        /// alike) as the byte-loop reference, on text full of brackets, quotes and escapes that
        /// spans several blocks.
        #[test]
        fn every_skip_implementation_agrees_with_the_byte_loop(
            text in "[\\[\\]{}\"\\\\a ]{0,400}",
            open in prop::sample::select(vec!["[", "{"]),
        ) {
            let text = format!("{open}{text}");
            let reference = skip_blocks::<true>(text.as_bytes(), 0, masks_scalar, prefix_xor);
            prop_assert_eq!(skip_blocks::<true>(text.as_bytes(), 0, masks, prefix_xor), reference.clone());
            prop_assert_eq!(skip_container::<true>(text.as_bytes(), 0), reference.clone());
            let end = reference.clone().map(|(end, _)| (end, 0));
            prop_assert_eq!(skip_container::<false>(text.as_bytes(), 0), end.clone());
            #[cfg(target_arch = "x86_64")]
            if avx2_available() {
                // SAFETY: detected on this CPU.
                prop_assert_eq!(unsafe { skip_avx2::<true>(text.as_bytes(), 0) }, reference.clone());
                prop_assert_eq!(unsafe { skip_avx2::<false>(text.as_bytes(), 0) }, end.clone());
            }
            #[cfg(target_arch = "x86_64")]
            if avx512_available() {
                // SAFETY: detected on this CPU.
                prop_assert_eq!(unsafe { skip_avx512::<true>(text.as_bytes(), 0) }, reference);
                prop_assert_eq!(unsafe { skip_avx512::<false>(text.as_bytes(), 0) }, end);
            }
        }

        /// On valid JSON the skip ends exactly where a validating parser says the value ends.
        #[test]
        fn skipping_agrees_with_serde_json_on_valid_json(value in json_value(), tail in "[ ,\\]}]{0,3}") {
            let text = serde_json::to_string(&value).unwrap();
            let input = format!("{text}{tail}");
            prop_assert_eq!(skip(&input).unwrap(), text.as_str());
        }

        /// On arbitrary text the scanner returns (never panics) and, when it accepts a container,
        /// the accepted text has as many closing as opening brackets outside strings, the first
        /// closing last (`balanced`).
        #[test]
        fn arbitrary_text_never_panics(text in "[\\[\\]{}\"\\\\a:, 0-9]{0,300}") {
            if let Ok(accepted) = skip(&text)
                && accepted.starts_with(['[', '{'])
            {
                prop_assert!(balanced(accepted), "accepted unbalanced {accepted:?}");
            }
            let _ = field(&text, "a");
        }
    }

    /// Reference check of what the skip guarantees: outside strings, closing brackets never
    /// outnumber opening ones before the end and match them exactly at the end, where the first
    /// bracket closes. A quote after an odd run of backslashes does not open or close a string,
    /// wherever it stands, as in the skip's block masks. Bracket kinds are not paired and a
    /// backslash outside a string is not refused: `{[}]` and `{\"}` are token-level errors,
    /// which the skip leaves to the validating parsers that read a value.
    fn balanced(text: &str) -> bool {
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for (i, c) in text.char_indices() {
            let quote_escaped = escaped;
            escaped = c == '\\' && !escaped;
            if c == '"' && !quote_escaped {
                in_string = !in_string;
            }
            if in_string {
                continue;
            }
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => {
                    depth = match depth.checked_sub(1) {
                        Some(d) => d,
                        None => return false,
                    };
                    if depth == 0 && i + 1 != text.len() {
                        return false;
                    }
                }
                _ => {}
            }
        }
        depth == 0 && !in_string
    }

    #[test]
    fn the_reference_bracket_check_tells_balanced_from_unbalanced() {
        for ok in ["[]", r#"{"a":"]\"}"}"#, "[[{}],{}]", "{[}]", r#"{\"}"#] {
            assert!(balanced(ok), "{ok}");
        }
        for bad in ["[[]", "[]]", r#"["]"#, "[] []", r#"{"a":"\"}"#] {
            assert!(!balanced(bad), "{bad}");
        }
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z\"\\\\\\[\\]{}é\u{1F600} ]{0,80}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 200, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z\"\\\\]{0,6}", inner, 0..8)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
