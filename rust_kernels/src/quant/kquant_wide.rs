//! The multi-row K-quant kernels' AVX-512 VNNI parts (`kquant_dots` calls them for two activation
//! rows or more): `vpdpwssd` written as an instruction, and a block's integer sums on 512-bit
//! registers.
//!
//! `vpdpwssd` through `asm!`: LLVM's generic tuning rewrites the intrinsic into `vpmaddwd` +
//! `vpaddd` (each step of `fused_sums`' two accumulator chains then costs two instructions
//! instead of one); written as the instruction, it stays one.
//!
//! 512-bit sums: one zmm holds two 32-quant groups whose activations are 64 contiguous bytes of
//! the row (Q4_K/Q5_K: a chunk's low and high nibbles; Q6_K: two of a half-block's quads), so a
//! row pays one `vpmaddubsw` and one `vpdpwssd` per two groups instead of two each. They serve
//! Q6_K from 2 rows (`q6k_on_zmm`) and Q4_K/Q5_K only from 8 rows (`q45k_on_zmm`): at 4 rows the
//! latter's 256-bit sums are faster. (Where a CPU runs 512-bit operations at half rate, the zmm
//! form gains nothing.)
//!
//! Bits: i32 lane `l` of a zmm's low half sums the same products as lane `l` of the 256-bit
//! kernel's first sum, its high half those of the second, and the result is low + high per lane.
//! Integer sums are exact, so every lane equals the 256-bit kernel's and the float steps after it
//! are unchanged.

use super::blocks::BlockQ8K;
use std::arch::x86_64::*;

/// Whether `q6k_sums` runs for R activation rows (else the 256-bit sums of `kquant_dots`).
pub(super) const fn q6k_on_zmm<const VNNI: bool, const R: usize>() -> bool {
    VNNI && R > 1
}

/// Whether `q45k_sums` runs for R activation rows: from 8 rows (see the module note).
pub(super) const fn q45k_on_zmm<const VNNI: bool, const R: usize>() -> bool {
    VNNI && R >= 8
}

/// `acc + madd(a, b)` as one `vpdpwssd` on 256 bits (see the module note for why not the
/// intrinsic).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn dpwssd(mut acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(ymm_reg) acc,
        a = in(ymm_reg) a,
        b = in(ymm_reg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// `dpwssd` on 512 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dpwssd_z(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// `v` unchanged, hidden from the optimizer: a byte shuffle by a constant mask stays one `vpshufb`
/// (see `x86::opaque_i`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn opaque_z(mut v: __m512i) -> __m512i {
    std::arch::asm!("/* {v} */", v = inout(zmm_reg) v, options(pure, nomem, nostack, preserves_flags));
    v
}

/// Low half `lo`, high half `hi`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}
/// The 32 bytes at `p` in both halves.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn twice(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
}
/// Lane `l` of the low half + lane `l` of the high half.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}
/// The 64 activation bytes of block `y` from byte `at` of its quants.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn act64(y: &BlockQ8K, at: usize) -> __m512i {
    _mm512_loadu_si512(y.qs.as_ptr().add(at) as *const __m512i)
}
/// The integer sums of one Q4_K (`HIGH` false) or Q5_K block at `bp` against block `i` of each
/// row of `ys`, before the float step: lane `l` as the 256-bit kernel's two fused sums added.
/// `sm` holds the block's 8 scales as i16 in its low 128 bits (`q45k_scales_mins`).
#[inline(always)]
pub(super) unsafe fn q45k_sums<const HIGH: bool, const R: usize>(
    bp: *const u8,
    sm: __m256i,
    ys: [&[BlockQ8K]; R],
    i: usize,
) -> [__m256i; R] {
    let qs_at = if HIGH { 48 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0F);
    // The 8 scales in every 128-bit lane, for the in-lane word broadcasts below.
    let scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sm));
    // Low half: the low nibbles as they are; high half: shifted down by 4.
    let nibble_shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    let qh = if HIGH {
        twice(bp.add(16))
    } else {
        _mm512_setzero_si512()
    };
    let mut sumi = [_mm512_setzero_si512(); R];
    for c in 0..4 {
        let raw = twice(bp.add(qs_at + 32 * c));
        let mut q = _mm512_and_si512(_mm512_srlv_epi64(raw, nibble_shift), m4);
        if HIGH {
            // Bits 2c (low half) and 2c + 1 (high half) of every qh byte, moved to bit 4.
            let t = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32));
            let bit = _mm512_and_si512(t, join(_mm256_set1_epi8(1), _mm256_set1_epi8(2)));
            q = _mm512_or_si512(
                q,
                _mm512_sllv_epi64(bit, _mm512_set_epi64(3, 3, 3, 3, 4, 4, 4, 4)),
            );
        }
        // Scale 2c in the low half's words, 2c + 1 in the high half's.
        let word = |k: i16| _mm256_set1_epi16((2 * k) | ((2 * k + 1) << 8));
        let s = _mm512_shuffle_epi8(
            scales,
            opaque_z(join(word(2 * c as i16), word(2 * c as i16 + 1))),
        );
        for r in 0..R {
            let p = _mm512_maddubs_epi16(q, act64(ys[r].get_unchecked(i), 64 * c));
            sumi[r] = dpwssd_z(sumi[r], p, s);
        }
    }
    std::array::from_fn(|r| fold(sumi[r]))
}
/// The integer sums of one Q6_K block at `bp` against block `i` of each row of `ys`, starting
/// from `start` (the -32 offset through the block sums): lane `l` as the 256-bit kernel's two
/// fused sums added.
#[inline(always)]
pub(super) unsafe fn q6k_sums<const R: usize>(
    bp: *const u8,
    ys: [&[BlockQ8K]; R],
    i: usize,
    start: [__m256i; R],
) -> [__m256i; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let sc8 = _mm256_broadcastsi128_si256(_mm_loadu_si128(bp.add(192) as *const __m128i));
    let mut sumi: [__m512i; R] = std::array::from_fn(|r| _mm512_zextsi256_si512(start[r]));
    for n in 0..2 {
        // Quads 0 and 1 (low nibbles of a and c), then 2 and 3 (their high nibbles), each with
        // its 2-bit plane of h moved to bits 4-5 (per half: h bits 0-1 / 2-3, then 4-5 / 6-7).
        let ac = join(
            _mm256_loadu_si256(bp.add(64 * n) as *const __m256i),
            _mm256_loadu_si256(bp.add(64 * n + 32) as *const __m256i),
        );
        let h = twice(bp.add(128 + 32 * n));
        let q01 = _mm512_or_si512(
            _mm512_and_si512(ac, m4),
            _mm512_sllv_epi64(
                _mm512_and_si512(h, join(_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x0C))),
                _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4),
            ),
        );
        let q23 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ac), m4),
            _mm512_srlv_epi64(
                _mm512_and_si512(
                    h,
                    join(_mm256_set1_epi8(0x30), _mm256_set1_epi8(0xC0u8 as i8)),
                ),
                _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
            ),
        );
        for (pair, q) in [q01, q23].into_iter().enumerate() {
            // Scales k .. k + 3, one per 128-bit lane, as i16 words.
            let k = (8 * n + 4 * pair) as u64;
            let bytes = |k: u64| (0x0101_0101_0101_0101u64 * k) as i64;
            let pick = _mm256_set_epi64x(bytes(k + 3), bytes(k + 2), bytes(k + 1), bytes(k));
            let s = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc8, pick));
            for r in 0..R {
                let p = _mm512_maddubs_epi16(q, act64(ys[r].get_unchecked(i), 128 * n + 64 * pair));
                sumi[r] = dpwssd_z(sumi[r], p, s);
            }
        }
    }
    std::array::from_fn(|r| fold(sumi[r]))
}
