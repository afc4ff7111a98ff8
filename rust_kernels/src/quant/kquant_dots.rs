//! The K-quant dot products on x86-64 (Q4_K, Q5_K, Q6_K against Q8_K activation rows), written
//! and compiled as `int_dots`' (see its module note): one weight row against R activation rows,
//! every output in llama.cpp's one-row operation order. With AVX-512 VNNI and several rows, a
//! block's integer sums come from `kquant_wide`.

use super::blocks::BlockQ8K;
use super::kquant_wide as wide;
use super::x86::{compiled_twice, f16_at, hsum_ps, load, opaque, opaque_i, opaque_x, read_u32};
use std::arch::x86_64::*;

/// Whether the 256-bit Q4_K/Q5_K sums add each i16 product pair into their running i32 sum with
/// one `vpdpwssd` (VNNI, two rows or more; `kquant_wide::dpwssd`; from 8 rows `kquant_wide` takes
/// the whole block) or with madd + add (AVX2, and one row). The fused form waits for its accumulator (several cycles a step, an add one), so it keeps
/// two chains per row and pays only where several rows' chains interleave; AVX2's adds take one
/// cycle and one chain keeps the accumulators within 16 registers.
const fn fused_sums<const VNNI: bool, const R: usize>() -> bool {
    VNNI && R > 1
}

/// One K-quant block's float step for one row: `acc + (dw * yd) * f32(integer sum)`. Values in and
/// out, so the accumulators stay in registers.
#[inline(always)]
unsafe fn add_block(acc: __m256, dw: __m256, yd: &f32, sumi: __m256i) -> __m256 {
    let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(yd));
    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc)
}

/// The four 32-quant groups of a Q6_K half-block as unsigned 6-bit values: low nibbles from `a`
/// and `c` (32 bytes each), the high 2-bit planes from `h`; `m4` = 0x0f bytes, `m3` = 0x03 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_quads(a: __m256i, c: __m256i, h: __m256i, m4: __m256i, m3: __m256i) -> [__m256i; 4] {
    [
        _mm256_or_si256(
            _mm256_and_si256(a, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(c, m4),
            _mm256_slli_epi16::<2>(_mm256_and_si256(h, _mm256_slli_epi16::<2>(m3))),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
            _mm256_and_si256(h, _mm256_slli_epi16::<4>(m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
            _mm256_srli_epi16::<2>(_mm256_and_si256(h, _mm256_slli_epi16::<6>(m3))),
        ),
    ]
}

/// The 8 six-bit scales (low 128 bits) and 8 six-bit mins (high 128 bits) of a Q4_K/Q5_K block as
/// i16 lanes, from the 12 packed bytes at `p` (llama.cpp's `utmp` shuffle; same values as
/// `kquants::scales_mins`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k_scales_mins(p: *const u8) -> __m256i {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (read_u32(p), read_u32(p.add(4)), read_u32(p.add(8)));
    let sc_lo = u0 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    _mm256_cvtepu8_epi16(_mm_set_epi32(
        m_hi as i32,
        m_lo as i32,
        sc_hi as i32,
        sc_lo as i32,
    ))
}

/// Shuffle mask that broadcasts i16 lane `k` (0..8) of a 128-bit half to all its lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast16_mask(k: usize) -> __m256i {
    let lo = (2 * k) as i16;
    _mm256_set1_epi16(lo | ((lo + 1) << 8))
}

/// Bit `b` (0..8) of every byte of `qh`, moved to bit 4 (the 5th bit of a Q5_K quant).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_to_4(qh: __m256i, b: usize) -> __m256i {
    let m = _mm256_and_si256(qh, _mm256_set1_epi8((1u8 << b) as i8));
    match b {
        0 => _mm256_slli_epi16::<4>(m),
        1 => _mm256_slli_epi16::<3>(m),
        2 => _mm256_slli_epi16::<2>(m),
        3 => _mm256_slli_epi16::<1>(m),
        4 => m,
        5 => _mm256_srli_epi16::<1>(m),
        6 => _mm256_srli_epi16::<2>(m),
        _ => _mm256_srli_epi16::<3>(m),
    }
}

/// The integer sums of one Q4_K (`HIGH` false) or Q5_K block at `bp` against block `i` of each
/// row of `ys` on 256-bit registers, before the float step. `sm`: the block's scales and mins
/// (`q45k_scales_mins`).
#[inline(always)]
unsafe fn q45k_sums<const HIGH: bool, const R: usize, const VNNI: bool>(
    bp: *const u8,
    sm: __m256i,
    ys: [&[BlockQ8K]; R],
    i: usize,
) -> [__m256i; R] {
    let qs_at = if HIGH { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0F);
    let scales = _mm256_permute2x128_si256::<0x00>(sm, sm);
    let qh = if HIGH {
        load(bp.add(16))
    } else {
        _mm256_setzero_si256()
    };
    // Fused: two integer sums per row (low and high nibble halves), see `fused_sums`.
    let mut sumi = [_mm256_setzero_si256(); R];
    let mut sumi_hi = [_mm256_setzero_si256(); R];
    for c in 0..4 {
        let raw = load(bp.add(qs_at + 32 * c));
        let mut lo = _mm256_and_si256(raw, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
        if HIGH {
            lo = _mm256_or_si256(lo, bit_to_4(qh, 2 * c));
            hi = _mm256_or_si256(hi, bit_to_4(qh, 2 * c + 1));
        }
        let s_lo = _mm256_shuffle_epi8(scales, opaque_i(bcast16_mask(2 * c)));
        let s_hi = _mm256_shuffle_epi8(scales, opaque_i(bcast16_mask(2 * c + 1)));
        for r in 0..R {
            let y = (ys[r].get_unchecked(i).qs.as_ptr() as *const u8).add(64 * c);
            let plo = _mm256_maddubs_epi16(lo, load(y));
            let phi = _mm256_maddubs_epi16(hi, load(y.add(32)));
            if fused_sums::<VNNI, R>() {
                sumi[r] = wide::dpwssd(sumi[r], plo, s_lo);
                sumi_hi[r] = wide::dpwssd(sumi_hi[r], phi, s_hi);
            } else {
                let both =
                    _mm256_add_epi32(_mm256_madd_epi16(plo, s_lo), _mm256_madd_epi16(phi, s_hi));
                sumi[r] = _mm256_add_epi32(sumi[r], both);
            }
        }
    }
    fused_total::<VNNI, R>(sumi, sumi_hi)
}

/// A block's integer sums: the two chains added where they are fused (`fused_sums`).
#[inline(always)]
unsafe fn fused_total<const VNNI: bool, const R: usize>(
    sumi: [__m256i; R],
    sumi_hi: [__m256i; R],
) -> [__m256i; R] {
    if fused_sums::<VNNI, R>() {
        std::array::from_fn(|r| _mm256_add_epi32(sumi[r], sumi_hi[r]))
    } else {
        sumi
    }
}

/// Q4_K and Q5_K, one weight row against R activation rows (R = 1 for one row alone). They share
/// everything but the 5th bit (`HIGH`) and how llama.cpp accumulates the mins term (kept identical
/// here): Q4_K in 4 float lanes, Q5_K in one fused scalar sum. Every output keeps llama.cpp's
/// one-row operation order (the integer lane sums are exact, so sharing loads across rows changes
/// no bit). Each row's scale products (`dw * yd`, `-yd * dminw`) are vector products of two
/// broadcasts (the same IEEE products as the scalar ones, without a scalar-to-vector move per
/// row), the mins use the activations' precomputed sub-block sums (`psums`, equal to llama.cpp's
/// `hadd` of `bsums`), and the accumulators never leave the function (no spill per block for a
/// closure to read).
#[inline(always)]
unsafe fn q45k_rows<const HIGH: bool, const R: usize, const VNNI: bool>(
    w: &[u8],
    ys: [&[BlockQ8K]; R],
) -> [f32; R] {
    let bytes = if HIGH { 176 } else { 144 };
    let nb = ys[0].len();
    assert!(w.len() >= nb * bytes && ys.iter().all(|y| y.len() == nb));
    let sign = _mm_set1_ps(-0.0);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins4 = [_mm_setzero_ps(); R];
    let mut mins1 = [0.0f32; R];
    // The mins term first, in a pass of its own: interleaved with the quants below, its R
    // accumulators and the R float accumulators did not fit in registers beside the integer sums.
    for i in 0..nb {
        let sm = q45k_scales_mins(w.as_ptr().add(i * bytes + 4));
        let mins8 = _mm256_extracti128_si256::<1>(sm);
        let dminw = _mm_set1_ps(f16_at(w, i * bytes + 2));
        for r in 0..R {
            let yb = ys[r].get_unchecked(i);
            let prod = _mm_madd_epi16(mins8, _mm_loadu_si128(yb.psums.as_ptr() as *const __m128i));
            let neg_dmin = _mm_mul_ps(_mm_xor_ps(_mm_broadcast_ss(&yb.d), sign), dminw);
            if HIGH {
                let total = _mm_hadd_epi32(_mm_hadd_epi32(prod, prod), prod);
                mins1[r] =
                    _mm_cvtss_f32(neg_dmin).mul_add(_mm_cvtsi128_si32(total) as f32, mins1[r]);
            } else {
                mins4[r] = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(prod), mins4[r]);
            }
        }
    }
    for i in 0..nb {
        let bp = w.as_ptr().add(i * bytes);
        let sm = q45k_scales_mins(bp.add(4));
        let sums = if wide::q45k_on_zmm::<VNNI, R>() {
            wide::q45k_sums::<HIGH, R>(bp, sm, ys, i)
        } else {
            q45k_sums::<HIGH, R, VNNI>(bp, sm, ys, i)
        };
        let dw = opaque(_mm256_set1_ps(f16_at(w, i * bytes)));
        for r in 0..R {
            acc[r] = add_block(acc[r], dw, &ys[r].get_unchecked(i).d, sums[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let mut m = [0.0f32; 4];
        _mm_storeu_ps(m.as_mut_ptr(), mins4[r]);
        out[r] = hsum_ps(acc[r])
            + if HIGH {
                mins1[r]
            } else {
                (m[0] + m[2]) + (m[1] + m[3])
            };
    }
    out
}

/// The integer sums of one Q6_K block at `bp` against block `i` of each row of `ys` on 256-bit
/// registers (madd + add: AVX2, and one row; several rows on VNNI take `kquant_wide::q6k_sums`),
/// from `start` (the -32 offset through the block sums).
#[inline(always)]
unsafe fn q6k_sums<const R: usize>(
    bp: *const u8,
    ys: [&[BlockQ8K]; R],
    i: usize,
    start: [__m256i; R],
) -> [__m256i; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let sc8 = _mm_loadu_si128(bp.add(192) as *const __m128i);
    let mut sumi = start;
    for n in 0..2 {
        let a = load(bp.add(64 * n));
        let c = load(bp.add(64 * n + 32));
        let h = load(bp.add(128 + 32 * n));
        let quads = q6k_quads(a, c, h, m4, m3);
        for (j, q) in quads.iter().enumerate() {
            let k = 8 * n + 2 * j;
            let pick = _mm_set_epi64x(
                (0x0101_0101_0101_0101u64 * (k as u64 + 1)) as i64,
                (0x0101_0101_0101_0101u64 * k as u64) as i64,
            );
            // one `vpshufb` for one or two rows; from 4 rows LLVM's own shuffles are faster
            let pick = if R <= 2 { opaque_x(pick) } else { pick };
            let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
            for r in 0..R {
                let y = (ys[r].get_unchecked(i).qs.as_ptr() as *const u8).add(128 * n + 32 * j);
                let p = _mm256_maddubs_epi16(*q, load(y));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sv));
            }
        }
    }
    sumi
}

/// Q6_K, one weight row against R activation rows (R = 1 for one row alone): llama.cpp's one-row
/// operations per output, with each row's scale product as a vector product of two broadcasts and
/// the accumulators kept in the function (see `dot_q45k_rows`).
#[inline(always)]
unsafe fn q6k_rows<const R: usize, const VNNI: bool>(w: &[u8], ys: [&[BlockQ8K]; R]) -> [f32; R] {
    let nb = ys[0].len();
    assert!(w.len() >= nb * 210 && ys.iter().all(|y| y.len() == nb));
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let bp = w.as_ptr().add(i * 210);
        let sc8 = _mm_loadu_si128(bp.add(192) as *const __m128i);
        // The -32 offset through the Q8_K block sums, per lane as llama.cpp subtracts it:
        // lane k starts at -32 * (scale[2k] * bsum[2k] + scale[2k+1] * bsum[2k+1]).
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let start: [__m256i; R] = std::array::from_fn(|r| {
            let bs = load(ys[r].get_unchecked(i).bsums.as_ptr() as *const u8);
            _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs)),
            )
        });
        let sums = if wide::q6k_on_zmm::<VNNI, R>() {
            wide::q6k_sums::<R>(bp, ys, i, start)
        } else {
            q6k_sums::<R>(bp, ys, i, start)
        };
        let dw = opaque(_mm256_set1_ps(f16_at(w, i * 210 + 208)));
        for r in 0..R {
            let yd = &ys[r].get_unchecked(i).d;
            acc[r] = add_block(acc[r], dw, yd, sums[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
    out
}

compiled_twice!(
    dot_q4k_rows,
    dot_q4k_rows_avx2,
    dot_q4k_rows_vnni,
    |w, ys: [&[BlockQ8K]; R]| q45k_rows::<false, R, VNNI>(w, ys)
);
compiled_twice!(
    dot_q5k_rows,
    dot_q5k_rows_avx2,
    dot_q5k_rows_vnni,
    |w, ys: [&[BlockQ8K]; R]| q45k_rows::<true, R, VNNI>(w, ys)
);
compiled_twice!(
    dot_q6k_rows,
    dot_q6k_rows_avx2,
    dot_q6k_rows_vnni,
    |w, ys: [&[BlockQ8K]; R]| q6k_rows::<R, VNNI>(w, ys)
);
